"""From what a user asks to exact run specs, and back: resolution, checks, staleness. Torch-free.

``make_spec`` turns a request (model, method chain as typed, bench, n, seed, sampling overrides)
into a :class:`~bench.records.RunSpec` whose key covers everything that changes the numbers: the
resolved chain with every default filled in, each method's YAML ``version``, the sha256 of the
checkpoint files, the bench's protocol identity, n, seed and the full sampling settings.

A record is *stale* when its request, made again today, would not land on it: a method's default or
version changed, the checkpoint or the feature network changed, the bench protocol changed, or the
record predates the current key (schema 1). Stale records are never reused; ``varbench runs
--stale`` lists them and ``--prune-stale`` deletes them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from bench import defaults
from bench.checkpoint import CheckpointNotFound
from bench.records import RunSpec
from bench.registry import BENCHES, METHODS, MODELS, UnknownNameError
from bench.spec import canonical_method, chain_versions, method_kind, parse_chain, parse_method, resolve_chain

DEFAULT_BENCH = {"paper": "imagenet256", "tiny": "shapes-c2i"}
# what each model kind is conditioned on
CONDITIONS = {"c2i": "classes", "t2i": "prompts", "hart": "prompts"}


def check_chain_fits(model: str, chain: Sequence[str]) -> None:
    """Weight and recovery methods edit or train a class-conditional VAR; on the text-to-image
    families only token methods apply (refused by name before any model is built)."""
    if getattr(MODELS.get(model), "kind", "c2i") == "c2i":
        return
    other = list(dict.fromkeys(name for name in (parse_method(m)[0] for m in chain) if method_kind(name) != "tokens"))
    if other:
        raise ValueError(f"{', '.join(other)} on a text-to-image model ({model}): weight and recovery methods apply "
                         f"to the class-conditional VAR models; token methods (fastvar, lazyvar, stepvar, tome) to "
                         f"the text-to-image families too")


def requested_chain(methods: str | Sequence[str] | None) -> List[str]:
    """The chain as typed, canonical spelling, ``dense`` dropped (names checked, with suggestions)."""
    chain = [canonical_method(m) for m in parse_chain(methods)]
    for m in chain:
        METHODS.meta(parse_method(m)[0])   # UnknownNameError with "did you mean"
    return [m for m in chain if m != "dense"]


def make_spec(model: str, methods: str | Sequence[str] | None = (), bench: Optional[str] = None,
              n: Optional[int] = None, seed: int = 0, sampling: Optional[Mapping[str, Any]] = None,
              world: Optional[str] = None, ckpt_dir: Optional[str | os.PathLike] = None,
              need_ckpt: bool = True, bench_args: Optional[Mapping[str, Any]] = None) -> RunSpec:
    """A complete, checked run spec. ``sampling`` holds overrides of the model's defaults.

    ``need_ckpt=False``: if the checkpoint files are not on this machine, ``ckpt`` is left null
    (enough to look records up by everything else, e.g. to render tables from synced results).
    ``bench_args``: the bench's setting where it has one (the latency bench: device, batch, …).
    """
    card = MODELS.get(model)
    world = world or card.world
    if world not in defaults.WORLDS:
        raise ValueError(f"unknown world {world!r}; expected one of {', '.join(defaults.WORLDS)}")
    bench_name = bench or DEFAULT_BENCH[world]
    bench_cls = BENCHES.get(bench_name)
    if bench_cls.world not in (world, "any") or card.world != world:
        raise ValueError(f"world mismatch: world {world}, model {model} is {card.world}-world, "
                         f"bench {bench_name} is {bench_cls.world}-world")
    takes = CONDITIONS[getattr(card, "kind", "c2i")]
    if bench_cls.conditions not in (takes, "any"):
        fits = sorted(b for b in BENCHES.names()
                      if BENCHES.get(b).conditions == takes and BENCHES.get(b).kind == "images")
        raise ValueError(f"bench {bench_name} is conditioned on {bench_cls.conditions}, model {model} on {takes}"
                         + (f" (benches for it: {', '.join(fits)})" if fits else ""))
    requested = requested_chain(methods if methods is not None else ())
    resolved = resolve_chain(requested) if requested else ()
    check_chain_fits(model, resolved)
    n = bench_cls.check_n(n if n is not None else bench_cls.default_n)
    seed = defaults.check_seed(seed)
    overrides = defaults.check_sampling(dict(sampling or {}))
    full_sampling = defaults.model_sampling(card.sampling, overrides, model)
    try:
        ckpt = card.identity(ckpt_dir)
    except CheckpointNotFound:
        if need_ckpt:
            raise
        ckpt = None
    return RunSpec(world=world, model=model, methods=resolved, bench=bench_name, n=n, seed=seed,
                   sampling=full_sampling, ckpt=ckpt, method_versions=chain_versions(resolved),
                   protocol=bench_cls(**dict(bench_args or {})).identity(), requested={"methods": requested, "sampling": overrides})


def missing_methods(methods: Iterable[str]) -> List[str]:
    """Names in a chain that no method file provides yet."""
    return [parse_method(m)[0] for m in methods if parse_method(m)[0] not in METHODS]


# --------------------------------------------------------------------------------------------------
# staleness

RANDOM_CKPT = "random-init"   # the ckpt entry of a run on seeded random weights (no file loaded)


@dataclass
class Staleness:
    stale: bool
    reason: str = ""            # empty when current
    current: Optional[RunSpec] = None   # the spec the request resolves to today (None: cannot tell)


def _diff(old: Mapping[str, Any], new: RunSpec) -> str:
    out = []
    if old.get("method_versions") is None:
        return "made before record keys covered method defaults, versions and checkpoints (schema 1)"
    if list(old["methods"]) != list(new.methods):
        out.append(f"method parameters now resolve to {' + '.join(new.methods) or 'dense'}")
    # a method new to the chain is said by the line above; only versions of methods in both count here
    ch = [f"{k} v{old['method_versions'][k]}→v{v}" for k, v in new.method_versions.items()
          if k in old["method_versions"] and old["method_versions"][k] != v]
    if ch:
        out.append("method version " + ", ".join(ch))
    if new.ckpt is not None and old.get("ckpt") != new.ckpt:
        out.append("checkpoint files changed")
    if old.get("protocol") != new.protocol:
        out.append("bench protocol changed")
    if dict(old.get("sampling") or {}) != new.sampling:
        out.append("default sampling changed")
    return "; ".join(out) or "key changed"


def staleness(record: Mapping[str, Any], ckpt_dir: Optional[str | os.PathLike] = None) -> Staleness:
    """Whether ``record``'s request would resolve to another spec today (see the module docstring)."""
    s = record["spec"]
    req = s.get("requested") or {"methods": s["methods"], "sampling": {}}
    try:
        current = make_spec(s["model"], req.get("methods") or (), bench=s["bench"], n=s["n"], seed=s["seed"],
                            sampling=req.get("sampling") or {}, world=s["world"], ckpt_dir=ckpt_dir,
                            need_ckpt=False,
                            bench_args=BENCHES.get(s["bench"]).args_from_protocol(s.get("protocol")))
    except (UnknownNameError, ValueError, CheckpointNotFound) as e:
        return Staleness(True, f"cannot be rerun as recorded: {e}".splitlines()[0])
    # random-init latency records (``varbench latency --random-weights``) name no checkpoint file
    ignore = ("ckpt",) if current.ckpt is None or RANDOM_CKPT in (s.get("ckpt") or {}) else ()
    if RunSpec.from_dict(s).key(ignore) == current.key(ignore):
        return Staleness(False, "", current)
    return Staleness(True, _diff(s, current), current)


# --------------------------------------------------------------------------------------------------
# tables: which runs a table needs


@dataclass
class Cell:
    """One (row, column group) of a table: the run it needs, or why it has none."""
    row: str
    group: int
    spec: Optional[RunSpec] = None
    reason: Optional[str] = None        # why no run (method not implemented, no model in this world)


def table_cells(table, world: str, n: Optional[int] = None, seed: int = 0,
                sampling: Optional[Mapping[str, Any]] = None, ckpt_dir=None, need_ckpt: bool = True) -> List[Cell]:
    """The cells of a table spec (``bench.render.TableSpec``) for ``world``, each with its exact run spec."""
    table_n = n if n is not None else table.n.get(world)
    cells: List[Cell] = []
    for row in table.rows:
        model = table.model_for(row, world)
        for gi, group in enumerate(table.groups):
            bench_name = table.bench_for(world, group)
            own = world in group.bench   # a group with its own bench has its own n (the table's --n is not its)
            n = group.n.get(world) if own else table_n      # None: the bench's default (make_spec)
            if model is None:
                cells.append(Cell(row.label, gi, reason=table.skip_reason(row, world)))
                continue
            chain = table.chain(row, group, world)
            missing = missing_methods(chain)
            if missing:
                cells.append(Cell(row.label, gi, reason=f"not computed: method(s) {', '.join(sorted(set(missing)))} "
                                                        f"not implemented in varbench yet"))
                continue
            spec = make_spec(model, chain, bench=bench_name, n=n, seed=seed,
                             bench_args={**group.bench_args.get(world, {}), **row.bench_args},
                             sampling=sampling, world=world, ckpt_dir=ckpt_dir, need_ckpt=need_ckpt)
            cells.append(Cell(row.label, gi, spec))
    return cells


def unique_specs(cells: Iterable[Cell]) -> List[RunSpec]:
    """The distinct runs of some cells, in order (the dense row is one run for every group)."""
    out: Dict[str, RunSpec] = {}
    for c in cells:
        if c.spec is not None:
            out.setdefault(c.spec.key(), c.spec)
    return list(out.values())


def match_records(specs: Iterable[RunSpec], records: Mapping[str, Mapping[str, Any]]) -> Tuple[Dict[str, dict], Dict[str, List[dict]]]:
    """(found, stale): per spec key, its record if present, and the stale records of the same request.

    A spec without checkpoint identity (files absent here) matches on every other field. A record is
    a stale candidate for a spec when it has the same model, bench, n, seed, requested chain,
    requested sampling overrides and bench setting (the latency bench's device, compute units, …) but
    another key.
    """
    specs = list(specs)
    by_key = {r["run_id"]: r for r in records.values()}
    found: Dict[str, dict] = {}
    stale: Dict[str, List[dict]] = {}
    for sp in specs:
        rec = by_key.get(sp.key())
        if rec is None and sp.ckpt is None:
            loose = sp.key(("ckpt",))
            rec = next((r for r in records.values() if RunSpec.from_dict(r["spec"]).key(("ckpt",)) == loose), None)
        if rec is not None:
            found[sp.key()] = rec
            continue
        req = sp.requested or {}
        setting = BENCHES.get(sp.bench).args_from_protocol(sp.protocol) if sp.bench in BENCHES else {}
        for r in records.values():
            s, r_req = r["spec"], r["spec"].get("requested") or {}
            if (s["model"], s["bench"], s["n"], s["seed"], s["world"]) == (sp.model, sp.bench, sp.n, sp.seed, sp.world) \
                    and r_req.get("methods", s["methods"]) == req.get("methods") \
                    and (r_req.get("sampling") or {}) == (req.get("sampling") or {}) \
                    and (not setting or BENCHES.get(sp.bench).args_from_protocol(s.get("protocol")) == setting):
                stale.setdefault(sp.key(), []).append(r)
    return found, stale
