"""Run matrices: one YAML file names a grid of models × methods × benches × seeds; ``varbench sweep``
expands it into exact run specs (``bench.plan.make_spec``, so a cell's record is the one
``varbench run`` with the same request writes), skips the cells whose record exists, and runs the
rest in order, or writes one ``varbench run …`` line per unfinished cell (``--emit-commands``) for
a job array. Torch-free: expanding, listing and emitting import no model code.

Sweep file
----------
::

    world: tiny                   # optional: tiny | paper (default: each model's); --world overrides
    models: [tiny-var]            # required: registered model names
    methods:                      # optional (default [dense]): chains as `varbench run --method` takes them
      - dense
      - magnitude:sparsity=0.4
      - magnitude:sparsity=0.4 + ft:epochs=1
    benches: [shapes-c2i]         # optional (default: the world's image bench)
    seeds: [0, 1]                 # optional (default [0])
    n: 120                        # optional: images per run (default: the bench's protocol)
    sampling: {cfg: 2.0}          # optional: overrides of cfg, top_k, top_p (the `varbench run` flags)

Cells are expanded in that order (models outermost, seeds innermost); two cells that resolve to the
same run (``magnitude`` and ``magnitude:sparsity=0.4``) are one cell. Unknown keys and names are
errors that name the file and the entry, with the registry's "did you mean" suggestions.
"""
from __future__ import annotations

import itertools
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml

from bench import defaults
from bench.records import RunSpec
from bench.registry import BENCHES, MODELS, UnknownNameError, did_you_mean

KEYS = ("world", "models", "methods", "benches", "seeds", "n", "sampling")
SAMPLING_FLAGS = {"cfg": "--cfg", "top_k": "--top-k", "top_p": "--top-p"}   # what a command line can carry


class SweepError(ValueError):
    """A sweep file that cannot be expanded; the message names the file, the entry and the fix."""


@dataclass(frozen=True)
class Sweep:
    where: str                                   # the file, for messages
    models: Tuple[str, ...]
    methods: Tuple[str, ...] = ("dense",)
    benches: Tuple[Optional[str], ...] = (None,)
    seeds: Tuple[int, ...] = (0,)
    n: Optional[int] = None
    sampling: Dict[str, Any] = field(default_factory=dict)
    world: Optional[str] = None


# --------------------------------------------------------------------------------------------------
# reading and checking


def _names(value: Any, key: str, where: str) -> List[Any]:
    """A scalar or a non-empty list, as a list (a key left without a value, YAML's null, is empty)."""
    items = value if isinstance(value, list) else [] if value is None else [value]
    if not items:
        raise SweepError(f"{where}: {key} is empty; give at least one entry or leave the key out")
    return items


def _checked_name(registry, name: Any, key: str, i: int, where: str) -> str:
    if not isinstance(name, str) or name not in registry:
        raise SweepError(f"{where}: {key}[{i}]: {registry.unknown_message(str(name))}")
    return name


def _checked_chain(chain: Any, i: int, where: str) -> str:
    from bench.plan import missing_methods, requested_chain
    from bench.spec import SpecError
    text = " + ".join(chain) if isinstance(chain, list) else chain
    if not isinstance(text, str) or not text.strip():
        raise SweepError(f"{where}: methods[{i}]: expected a chain such as 'magnitude:sparsity=0.4 + ft', got {chain!r}")
    try:
        requested = requested_chain(text)
    except (UnknownNameError, SpecError) as e:
        raise SweepError(f"{where}: methods[{i}] {text!r}: {e}") from None
    missing = missing_methods(requested)
    if missing:
        raise SweepError(f"{where}: methods[{i}] {text!r}: {', '.join(missing)} has no implementation yet; "
                         f"remove it from the sweep")
    return text


def parse(data: Any, where: str = "sweep", world: Optional[str] = None) -> Sweep:
    """Check a sweep file's data (``world``: the --world override)."""
    if not isinstance(data, dict):
        raise SweepError(f"{where}: expected a mapping with keys {', '.join(KEYS)}, got {type(data).__name__}")
    for k in data:
        if k not in KEYS:
            raise SweepError(f"{where}: unknown key {k!r}{did_you_mean(k, KEYS) or '.'} Keys: {', '.join(KEYS)}")
    if "models" not in data:
        raise SweepError(f"{where}: no models; add e.g. `models: [tiny-var]` (varbench list models)")
    world = world or data.get("world")
    if world is not None and world not in defaults.WORLDS:
        raise SweepError(f"{where}: world {world!r}; expected one of {', '.join(defaults.WORLDS)}")
    models = tuple(_checked_name(MODELS, m, "models", i, where) for i, m in enumerate(_names(data["models"], "models", where)))
    methods = tuple(_checked_chain(c, i, where) for i, c in enumerate(_names(data.get("methods", "dense"), "methods", where)))
    benches: Tuple[Optional[str], ...] = (None,)
    if "benches" in data:
        benches = tuple(_checked_name(BENCHES, b, "benches", i, where) for i, b in enumerate(_names(data["benches"], "benches", where)))
        for b in benches:
            if BENCHES.get(b).kind != "images":
                raise SweepError(f"{where}: benches: {b} is not an image bench; run it with `varbench {b}`")
    seeds = []
    for i, s in enumerate(_names(data.get("seeds", 0), "seeds", where)):
        try:
            seeds.append(defaults.check_seed(s))
        except ValueError as e:
            raise SweepError(f"{where}: seeds[{i}]: {e}") from None
    n = data.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n <= 0):
        raise SweepError(f"{where}: n must be a positive integer (images per run), got {n!r}")
    sampling = data.get("sampling") or {}
    if not isinstance(sampling, dict):
        raise SweepError(f"{where}: sampling must be a mapping such as `sampling: {{cfg: 1.5}}`, got {sampling!r}")
    for k in sampling:
        if k not in SAMPLING_FLAGS:
            raise SweepError(f"{where}: sampling has no key {k!r}{did_you_mean(k, SAMPLING_FLAGS) or '.'} It may set "
                             f"{', '.join(SAMPLING_FLAGS)} (the `varbench run` flags)")
    try:
        sampling = defaults.check_sampling(sampling, where=f"{where}: sampling")
    except ValueError as e:
        raise SweepError(f"{where}: sampling: {e}") from None
    return Sweep(where=where, models=models, methods=methods, benches=benches, seeds=tuple(seeds), n=n,
                 sampling=sampling, world=world)


def load(path: str | Path, world: Optional[str] = None) -> Sweep:
    """A sweep file by path, or a shipped one by its name (``tiny-example``) or by its path in a checkout
    (``sweeps/tiny-example.yaml``, as the docs write it) where no such file is in the current folder."""
    if not str(path).strip():
        raise SweepError("the sweep file's path is empty; give a YAML file or a shipped sweep's name")
    path = Path(path)
    if path.is_dir():
        raise SweepError(f"sweep file {path} is a folder; give a YAML file in it")
    if not path.is_file():
        from bench.resources import resource_dir
        shipped = resource_dir("sweeps", required=False)
        names = sorted(p.stem for p in shipped.glob("*.yaml")) if shipped else []
        if path.stem in names and path.suffix in ("", ".yaml") and (
                len(path.parts) == 1 or (len(path.parts) == 2 and path.parts[0] == "sweeps")):
            path = shipped / f"{path.stem}.yaml"
        else:
            raise SweepError(f"sweep file {path} not found; shipped sweeps (by name): {', '.join(names) or 'none'}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise SweepError(f"{path}: not valid YAML ({e})") from None
    except UnicodeDecodeError as e:
        raise SweepError(f"{path}: not a text file, so not a sweep's YAML ({e})") from None
    return parse(data, str(path), world)


# --------------------------------------------------------------------------------------------------
# expanding


def expand(sweep: Sweep, ckpt_dir=None, need_ckpt: bool = True) -> Tuple[List[RunSpec], int]:
    """(the distinct run specs of the grid in expansion order, how many cells repeated an earlier run).
    ``need_ckpt=False``: checkpoint files absent here leave ``ckpt`` null (listing, emitting commands)."""
    from bench.plan import make_spec
    specs: Dict[str, RunSpec] = {}
    cells = itertools.product(sweep.models, sweep.methods, sweep.benches, sweep.seeds)
    total = 0
    for model, chain, bench, seed in cells:
        total += 1
        try:
            spec = make_spec(model, chain, bench=bench, n=sweep.n, seed=seed, sampling=sweep.sampling,
                             world=sweep.world, ckpt_dir=ckpt_dir, need_ckpt=need_ckpt)
        except (UnknownNameError, ValueError) as e:
            raise SweepError(f"{sweep.where}: cell {model} {chain} @ {bench or 'default bench'} seed {seed}: {e}") from None
        specs.setdefault(spec.key(ignore=("ckpt",)) if spec.ckpt is None else spec.key(), spec)
    return list(specs.values()), total - len(specs)


def finished(specs: Sequence[RunSpec], root=None) -> List[bool]:
    """Per spec: does its record exist (same key, at ``spec.path(root)``)? A spec without checkpoint
    identity matches a record on every other field (``bench.plan.match_records``)."""
    from bench.plan import match_records
    from bench.records import load_records
    from bench.resources import results_root
    loose = [s for s in specs if s.ckpt is None]
    found: Dict[str, dict] = {}
    if loose and results_root(root).is_dir():
        found = match_records(loose, load_records(root, on_error=lambda path, err: None))[0]
    return [s.key() in found if s.ckpt is None else s.path(root).is_file() for s in specs]


def frame(specs: Sequence[RunSpec], done: Sequence[bool]):
    """The grid as a pandas frame: one row per cell, status done/todo."""
    import pandas as pd
    return pd.DataFrame([{"cell": i + 1, "model": s.model,
                          "methods": " + ".join((s.requested or {}).get("methods") or s.methods) or "dense",
                          "bench": s.bench, "n": s.n, "seed": s.seed, "world": s.world,
                          "run_id": s.key() if s.ckpt is not None else "(no ckpt here)",
                          "status": "done" if d else "todo"} for i, (s, d) in enumerate(zip(specs, done))])


def command(spec: RunSpec, root=None, ckpt_dir=None, device: Optional[str] = None) -> str:
    """The ``varbench run`` line that makes ``spec``'s record (the request as typed, so the key is the
    same; the results folder absolute, so the line works from any folder)."""
    from bench.resources import results_root
    req = spec.requested or {}
    argv = ["varbench", "run", "--model", spec.model]
    if req.get("methods"):
        argv += ["--method", " + ".join(req["methods"])]
    argv += ["--bench", spec.bench, "--n", str(spec.n), "--seed", str(spec.seed), "--world", spec.world]
    for key, value in sorted((req.get("sampling") or {}).items()):
        argv += [SAMPLING_FLAGS[key], str(value)]
    argv += ["--results", str(results_root(root).resolve())]
    if ckpt_dir:
        argv += ["--ckpt-dir", str(Path(ckpt_dir).resolve())]
    if device:
        argv += ["--device", device]
    return shlex.join(argv)
