"""The method-spec grammar and parameter resolution. Torch-free: records, tables and ``varbench list``
use it without importing any model or method code.

A method spec is ``name`` or ``name:key=value,...`` (``magnitude:sparsity=0.4``); a chain is specs
joined by ``+`` and applied left to right (``magnitude:sparsity=0.4 + ft:epochs=1``). Each method
declares its parameters in ``methods/<file>.yaml`` — one table of defaults, types, ranges and help,
shared by the Python API, the CLI and the record keys::

    name: magnitude
    kind: weights            # weights | tokens | recovery
    version: 1               # bump whenever the method's behaviour changes: old records go stale
    summary: "..."
    identity: {sparsity: 0.0}    # the setting that leaves the model unchanged (tested)
    params:
      sparsity: {default: 0.4, type: float, min: 0.0, max: 0.9, help: "..."}

*Resolving* a spec fills in every default and writes every value one way, so that
``magnitude``, ``magnitude:sparsity=0.40`` and ``magnitude:norm=l2,scope=coupled,sparsity=0.4``
are the same resolved spec (and hence the same record). ``dense`` resolves to the empty chain.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Mapping, Sequence, Tuple

from bench.registry import did_you_mean

KINDS = ("weights", "tokens", "recovery")
_BOOL = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


class SpecError(ValueError):
    """A method spec or chain that cannot be used; the message says what to write instead."""


# --------------------------------------------------------------------------------------------------
# grammar


def _canonical_value(v: str) -> str:
    """Numbers written one way (``0.40`` -> ``0.4``, ``1e-3`` -> ``0.001``); other text stripped."""
    v = v.strip()
    try:
        return str(int(v))
    except ValueError:
        pass
    try:
        f = float(v)
    except ValueError:
        return v
    return repr(f) if math.isfinite(f) else v


def parse_method(spec: str) -> Tuple[str, Dict[str, str]]:
    """``"evar:sparsity=0.4,calib=pyramid"`` -> ``("evar", {"sparsity": "0.4", "calib": "pyramid"})``."""
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError(f"a method spec must be a non-empty string, got {spec!r}")
    name, _, rest = spec.strip().partition(":")
    name = name.strip()
    if not name or any(c in name for c in "=, +"):
        raise SpecError(f"bad method spec {spec!r}: expected 'name' or 'name:key=value,...'")
    params: Dict[str, str] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key or not value.strip():
            raise SpecError(f"bad parameter {item!r} in method spec {spec!r}: expected key=value")
        if key in params:
            raise SpecError(f"parameter {key!r} given twice in method spec {spec!r}")
        params[key] = _canonical_value(value)
    return name, params


def _text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return _canonical_value(str(v))


def format_method(name: str, params: Mapping[str, Any]) -> str:
    """Inverse of ``parse_method``, with the parameters sorted by key."""
    if not params:
        return name
    return name + ":" + ",".join(f"{k}={_text(params[k])}" for k in sorted(params))


def canonical_method(spec: str) -> str:
    """One spelling per spec as typed (sorted parameters, normalised numbers, no spaces); no defaults."""
    return format_method(*parse_method(spec))


def parse_chain(text: str | Sequence[str] | None) -> List[str]:
    """``"magnitude:sparsity=0.4 + ft:epochs=1"`` -> ``["magnitude:sparsity=0.4", "ft:epochs=1"]``.

    ``None`` or an empty list means dense (no methods). An empty or blank string, or an empty item (``"+"``,
    ``"a + + b"``), is an error: write ``dense`` for the unmodified model.
    """
    if text is None or (not isinstance(text, str) and len(text) == 0):
        return []
    items = list(text) if not isinstance(text, str) else text.split("+")
    stripped = [m.strip() if isinstance(m, str) else m for m in items]
    if not stripped or any(not isinstance(m, str) or not m for m in stripped):
        raise SpecError(f"empty method in chain {text!r}: join method specs with '+', "
                        f"e.g. 'magnitude:sparsity=0.4 + ft'; write 'dense' for the unmodified model")
    for m in stripped:
        parse_method(m)
    return stripped


# --------------------------------------------------------------------------------------------------
# declarations (methods/<file>.yaml, read through the registry: no method code is imported)


def _declaration(name: str) -> dict:
    from bench.registry import METHODS
    return METHODS.meta(name)


def _convert(name: str, key: str, d: Mapping[str, Any], raw: Any) -> Any:
    kind = d.get("type", "str")
    try:
        if kind == "float":
            val = float(raw)
            if not math.isfinite(val):
                raise ValueError
        elif kind == "int":
            if isinstance(raw, float) and not raw.is_integer():
                raise ValueError
            val = int(str(raw)) if not isinstance(raw, (int, float)) else int(raw)
        elif kind == "bool":
            val = raw if isinstance(raw, bool) else _BOOL[str(raw).strip().lower()]
        else:
            val = str(raw)
    except (TypeError, ValueError, KeyError):
        what = {"float": "a finite number", "int": "an integer", "bool": "true or false (or yes/no, 1/0)"}.get(kind, kind)
        raise SpecError(f"{name}: parameter {key}={raw!r} is not {what}{_range_text(d)}") from None
    return val


def _range_text(d: Mapping[str, Any]) -> str:
    lo, hi, choices = d.get("min"), d.get("max"), d.get("choices")
    if choices is not None:
        return f" (one of {', '.join(map(str, choices))})"
    if lo is not None or hi is not None:
        return f" (range [{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}])"
    return ""


def resolve_params(name: str, given: Mapping[str, Any]) -> Dict[str, Any]:
    """Defaults from the method's YAML overridden by ``given``; types converted, ranges checked."""
    decl = _declaration(name).get("params") or {}
    for k in given:
        if k not in decl:
            raise SpecError(f"method {name!r} has no parameter {k!r}{did_you_mean(k, decl) or '.'} "
                            f"Parameters: {', '.join(decl) or '(none)'}")
    out: Dict[str, Any] = {}
    for key, d in decl.items():
        raw = given.get(key, d.get("default"))
        if raw is None:
            out[key] = None
            continue
        val = _convert(name, key, d, raw)
        lo, hi, choices = d.get("min"), d.get("max"), d.get("choices")
        if (lo is not None and val < lo) or (hi is not None and val > hi):
            raise SpecError(f"{name}: parameter {key}={val} out of range "
                            f"[{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]")
        if choices is not None and val not in choices:
            raise SpecError(f"{name}: parameter {key}={val!r} must be one of {', '.join(map(str, choices))}"
                            f"{did_you_mean(val, choices)}")
        out[key] = val
    return out


def resolve_method(spec: str) -> str:
    """The spec with every parameter filled in and typed: ``magnitude`` ->
    ``magnitude:norm=l2,scope=coupled,sparsity=0.4``."""
    name, given = parse_method(spec)
    params = resolve_params(name, given)
    return format_method(name, {k: v for k, v in params.items() if v is not None})


def method_kind(name: str) -> str:
    return _declaration(name).get("kind", "")


def method_version(name: str) -> int:
    return int(_declaration(name).get("version", 1))


def token_methods(specs: Iterable[str]) -> list:
    """The specs of ``specs`` whose method is of kind ``tokens`` (a per-scale token policy)."""
    return [s for s in specs if method_kind(parse_method(s)[0]) == "tokens"]


def resolve_chain(chain: str | Iterable[str] | None) -> Tuple[str, ...]:
    """Resolved specs of a chain, in order, with ``dense`` dropped. At most one ``tokens`` method:
    a generator has one token-policy slot, and two policies would silently replace each other."""
    specs = parse_chain(chain if isinstance(chain, str) or chain is None else list(chain))
    out = tuple(r for r in (resolve_method(s) for s in specs) if r != "dense")
    tokens = token_methods(out)
    if len(tokens) > 1:
        raise SpecError(f"chain {' + '.join(out)} has {len(tokens)} token methods ({', '.join(tokens)}); "
                        f"a generator has one token-policy slot, so a chain may hold at most one")
    return out


def chain_versions(resolved: Iterable[str]) -> Dict[str, int]:
    """``{method name: version}`` of every method in a resolved chain."""
    return {name: method_version(name) for name in sorted({parse_method(s)[0] for s in resolved})}
