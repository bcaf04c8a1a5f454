"""The method interface: every compression/acceleration method is one file in ``methods/`` plus
one YAML of parameter defaults, registered by name and applied in sequence.

A method spec is ``name`` or ``name:key=value,...`` (``magnitude:sparsity=0.4``); a chain is a list
of specs applied left to right (``["evar:sparsity=0.4", "psad"]``). Parameters are declared in
``methods/<name>.yaml`` — one table for defaults, types, ranges and help, shared by the API and
the CLI::

    name: magnitude
    kind: weights            # weights | tokens | recovery
    summary: "..."
    params:
      sparsity: {default: 0.4, type: float, min: 0.0, max: 0.9, help: "..."}

Kinds (DESIGN.md §4): ``weights`` returns a physically smaller generator, ``tokens`` installs a
token policy, ``recovery`` fine-tunes. ``deviations`` (class attribute) lists every way the
implementation departs from its paper/official code; records carry them into table footnotes.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import yaml

from bench.models.generator import Generator
from bench.records import parse_method
from bench.registry import METHODS

METHODS_DIR = Path(__file__).resolve().parent.parent / "methods"
_TYPES = {"float": float, "int": int, "str": str, "bool": lambda v: str(v).lower() in ("1", "true", "yes")}


@dataclass
class Context:
    """What a method may use besides the generator."""
    world: str = "tiny"
    seed: int = 0
    progress: bool = True
    # calibration / training data: callable(n, split) -> (labels [n], token pyramid list of [n, pn²])
    data: Optional[Callable[[int, str], Tuple[Any, List[Any]]]] = None
    teacher: Optional[Callable[[], Generator]] = None     # the dense model, built on demand (KD)
    epoch_size: int = 0                                   # images per "epoch" of the training split
    notes: List[str] = field(default_factory=list)         # what this run did, for the record


class Method:
    name: str = ""
    kind: str = ""
    deviations: Tuple[str, ...] = ()

    def __init__(self, **params: Any):
        self.params = resolve_params(self.name, params)

    def apply(self, gen: Generator, ctx: Context) -> Generator:
        raise NotImplementedError

    def __getattr__(self, key: str) -> Any:
        params = self.__dict__.get("params", {})
        if key in params:
            return params[key]
        raise AttributeError(key)

    def __repr__(self) -> str:
        return f"{self.name}:" + ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))


def method_yaml(name: str) -> dict:
    path = METHODS_DIR / f"{name}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"method {name!r} has no parameter file {path}")
    return yaml.safe_load(path.read_text()) or {}


def resolve_params(name: str, given: Dict[str, Any]) -> Dict[str, Any]:
    """Defaults from the YAML, overridden by ``given``; types converted, ranges checked."""
    decl = method_yaml(name).get("params", {}) or {}
    unknown = [k for k in given if k not in decl]
    if unknown:
        k = unknown[0]
        close = difflib.get_close_matches(k, list(decl), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"method {name!r} has no parameter {k!r}{hint} Parameters: {', '.join(decl) or '(none)'}")
    out: Dict[str, Any] = {}
    for key, d in decl.items():
        raw = given.get(key, d.get("default"))
        try:
            val = _TYPES[d.get("type", "str")](raw) if raw is not None else None
        except (TypeError, ValueError):
            raise ValueError(f"{name}: parameter {key}={raw!r} is not a {d.get('type')}") from None
        lo, hi = d.get("min"), d.get("max")
        if val is not None and ((lo is not None and val < lo) or (hi is not None and val > hi)):
            raise ValueError(f"{name}: parameter {key}={val} out of range [{lo}, {hi}]")
        choices = d.get("choices")
        if choices is not None and val not in choices:
            raise ValueError(f"{name}: parameter {key}={val!r} must be one of {choices}")
        out[key] = val
    return out


def parse_chain(text: str) -> List[str]:
    """``"magnitude:sparsity=0.4 + ft:epochs=1"`` → ``["magnitude:sparsity=0.4", "ft:epochs=1"]``."""
    return [m.strip() for m in (text or "").split("+") if m.strip()]


def build_method(spec: str) -> Method:
    name, params = parse_method(spec)
    cls = METHODS.get(name)
    return cls(**params)


def apply_chain(gen: Generator, specs: Sequence[str], ctx: Context) -> Generator:
    for spec in specs:
        m = build_method(spec)
        gen = m.apply(gen, ctx)
        ctx.notes.extend(f"{m.name}: {d}" for d in m.deviations)
    return gen
