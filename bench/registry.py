"""One registry per kind of thing: models, methods, benches, metrics, tables.

Everything is registered with a decorator where it is defined, and looked up by name here; nothing
else in varbench branches on a name. Unknown names are answered with the closest known ones::

    @MODELS.register("var-d16")
    def var_d16(**kw): ...

    MODELS.get("var-d61")   # UnknownNameError: unknown model 'var-d61'; did you mean 'var-d16'? ...
"""
from __future__ import annotations

import difflib
import importlib
import pkgutil
from typing import Any, Callable, Dict, Iterator, Optional, Tuple


class UnknownNameError(KeyError):
    """A name that no registry entry has. The message suggests the closest names and lists all."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class Registry:
    """Name → object, filled by decorators.

    ``check`` validates what is registered (a type, or a predicate with a description) so that a
    wrong kind of object fails at import time, not when a user first asks for it.
    """

    def __init__(self, kind: str, check: Optional[Tuple[Callable[[Any], bool], str]] = None):
        self.kind = kind
        self._check = check
        self._items: Dict[str, Any] = {}

    def register(self, name: str, obj: Any = None):
        """Register ``obj`` under ``name``; without ``obj`` returns a decorator."""
        if obj is None:
            return lambda o: self.register(name, o)
        if not isinstance(name, str) or not name:
            raise TypeError(f"{self.kind} names must be non-empty strings, got {name!r}")
        if name in self._items:
            raise ValueError(f"duplicate {self.kind} name {name!r}: already registered as {self._items[name]!r}")
        if self._check is not None:
            ok, what = self._check
            if not ok(obj):
                raise TypeError(f"{self.kind} {name!r} must be {what}, got {type(obj).__name__}")
        self._items[name] = obj
        return obj

    def get(self, name: str) -> Any:
        load_all()
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        known = sorted(self._items)
        close = difflib.get_close_matches(str(name), known, n=3, cutoff=0.5)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else "."
        return f"unknown {self.kind} {name!r}{hint} Known {self.kind}s: {', '.join(known) or '(none)'}"

    def names(self) -> list:
        load_all()
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        load_all()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def _is_callable(o: Any) -> bool:
    return callable(o)


MODELS = Registry("model", (_is_callable, "a callable that builds a generator"))
METHODS = Registry("method", (lambda o: isinstance(o, type), "a Method class"))
BENCHES = Registry("bench", (lambda o: isinstance(o, type), "a Bench class"))
METRICS = Registry("metric", (_is_callable, "a callable metric"))
TABLES = Registry("table", (lambda o: isinstance(o, (str, dict)) or hasattr(o, "exists"), "a table spec path"))

REGISTRIES = {"models": MODELS, "methods": METHODS, "benches": BENCHES, "metrics": METRICS, "tables": TABLES}

# Packages whose modules register things on import. Walking them (instead of importing names one by
# one) is what keeps "a method = one file in methods/" true.
_PACKAGES = ("bench.models", "bench.metrics", "bench.benches", "methods")
_loaded = False


def load_all() -> None:
    """Import every module of the registering packages once (idempotent)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for pkg_name in _PACKAGES:
        try:
            pkg = importlib.import_module(pkg_name)
        except ModuleNotFoundError as e:
            if e.name == pkg_name:
                continue
            raise
        for info in pkgutil.iter_modules(pkg.__path__, prefix=pkg_name + "."):
            importlib.import_module(info.name)
    _register_table_specs()


def _register_table_specs() -> None:
    """Each ``tables/<name>.yaml`` in the source tree is a table spec named ``<name>``."""
    from pathlib import Path

    tables_dir = Path(__file__).resolve().parent.parent / "tables"
    if not tables_dir.is_dir():
        return
    for spec in sorted(tables_dir.glob("*.yaml")):
        if spec.stem not in TABLES._items:
            TABLES.register(spec.stem, spec)
