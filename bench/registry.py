"""One registry per kind of thing: models, methods, benches, metrics, tables.

Names and metadata are known without importing any model or method code (and without torch):

- methods are declared by ``methods/<file>.yaml`` (name, kind, version, parameters); their code,
  ``methods/<file>.py``, is imported the first time ``METHODS.get(name)`` needs the class;
- tables are ``tables/<name>.yaml`` spec files;
- models, benches and metrics are registered by torch-free modules (``bench.models.cards``, the
  modules of ``bench.benches``, ``bench.metrics.catalog``) whose objects import torch only when
  they run.

Code registers itself with a decorator where it is defined; nothing else in varbench branches on a
name. Unknown names are answered with the closest known ones::

    @METHODS.register("magnitude")
    class Magnitude(Method): ...

    MODELS.get("var-d61")   # UnknownNameError: unknown model 'var-d61'; did you mean 'var-d16'? ...
"""
from __future__ import annotations

import difflib
import importlib
import pkgutil
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import yaml


def did_you_mean(word: Any, known, n: int = 1, cutoff: float = 0.6) -> str:
    """``"; did you mean 'a' or 'b'?"`` for the closest of ``known`` to ``word`` (difflib), or ``""``: the one
    hint every "unknown name" message of varbench uses."""
    close = difflib.get_close_matches(str(word), [str(k) for k in known], n=n, cutoff=cutoff)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


class UnknownNameError(KeyError):
    """A name that no registry entry has. The message suggests the closest names and lists all."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class Registry:
    """Name → object, filled by decorators, or declared first (name + metadata + the module that
    registers the object) and imported on first ``get``.

    ``check`` validates what is registered (a type, or a predicate with a description) so that a
    wrong kind of object fails at import time, not when a user first asks for it.
    """

    def __init__(self, kind: str, check: Optional[Tuple[Callable[[Any], bool], str]] = None):
        self.kind = kind
        self._check = check
        self._items: Dict[str, Any] = {}
        self._meta: Dict[str, dict] = {}
        self._loaders: Dict[str, str] = {}

    def declare(self, name: str, meta: Optional[dict] = None, loader: Optional[str] = None) -> None:
        """Make ``name`` known with its metadata; ``loader`` is the module whose import registers it."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"{self.kind} names must be non-empty strings, got {name!r}")
        if name in self._meta or name in self._loaders:
            raise ValueError(f"duplicate {self.kind} name {name!r}: already declared by {self._loaders.get(name)!r}")
        self._meta[name] = dict(meta or {})
        if loader:
            self._loaders[name] = loader

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

    @property
    def plural(self) -> str:
        return self.kind + ("es" if self.kind.endswith(("s", "sh", "ch", "x")) else "s")

    def _known(self, name: str) -> None:
        load_all()
        if name not in self._items and name not in self._meta:
            raise UnknownNameError(self.unknown_message(name))

    def get(self, name: str) -> Any:
        """The registered object (importing its module if it was only declared)."""
        self._known(name)
        if name not in self._items:
            loader = self._loaders.get(name)
            if loader is None:
                raise LookupError(f"{self.kind} {name!r} is declared but nothing provides it")
            importlib.import_module(loader)
            if name not in self._items:
                raise LookupError(f"{self.kind} {name!r} is declared for module {loader}, which registers no such name")
        return self._items[name]

    def meta(self, name: str) -> dict:
        """The metadata declared for ``name`` ({} if none); never imports code."""
        self._known(name)
        return self._meta.get(name, {})

    def unknown_message(self, name: str) -> str:
        known = self.names()
        hint = did_you_mean(name, known, n=3, cutoff=0.5) or "."
        return f"unknown {self.kind} {name!r}{hint} Known {self.plural}: {', '.join(known) or '(none)'}"

    def names(self) -> list:
        load_all()
        return sorted(set(self._items) | set(self._meta))

    def __contains__(self, name: str) -> bool:
        load_all()
        return name in self._items or name in self._meta

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def _is_callable(o: Any) -> bool:
    return callable(o)


MODELS = Registry("model", (_is_callable, "a model card (callable that loads a generator)"))
METHODS = Registry("method", (lambda o: isinstance(o, type), "a Method class"))
BENCHES = Registry("bench", (lambda o: isinstance(o, type), "a Bench class"))
METRICS = Registry("metric")
TABLES = Registry("table", (lambda o: isinstance(o, (str, dict)) or hasattr(o, "exists"), "a table spec path"))

REGISTRIES = {"models": MODELS, "methods": METHODS, "benches": BENCHES, "metrics": METRICS, "tables": TABLES}

# Torch-free modules that register models, metrics and benches on import. Method and table
# declarations are YAML files (below).
_MODULES = ("bench.models.cards", "bench.metrics.catalog")
_PACKAGES = ("bench.benches",)
_loaded = False


def load_all() -> None:
    """Make every name known (idempotent). Imports only torch-free declaration modules."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for mod in _MODULES:
        importlib.import_module(mod)
    for pkg_name in _PACKAGES:
        pkg = importlib.import_module(pkg_name)
        for info in pkgutil.iter_modules(pkg.__path__, prefix=pkg_name + "."):
            importlib.import_module(info.name)
    _declare_methods()
    _register_table_specs()


def methods_dir():
    """The folder of the method files and their YAMLs (the ``methods`` package)."""
    from pathlib import Path

    import methods
    return Path(methods.__file__).resolve().parent


def _declare_methods() -> None:
    """``methods/<file>.yaml`` declares the method ``name:`` whose code is ``methods/<file>.py``."""
    for path in sorted(methods_dir().glob("*.yaml")):
        meta = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        name = meta.get("name") or path.stem
        meta["file"] = str(path)
        METHODS.declare(name, meta, loader=f"methods.{path.stem}")


def _register_table_specs() -> None:
    """Each ``tables/<name>.yaml`` is a table spec named ``<name>``."""
    from bench.resources import resource_dir

    tables_dir = resource_dir("tables", required=False)
    if tables_dir is None:
        return
    for spec in sorted(tables_dir.glob("*.yaml")):
        if spec.stem not in TABLES._items:
            TABLES.register(spec.stem, spec)
