"""Run records: one JSON file per run, the only thing tables, plots and the leaderboard read.

This docstring is the schema's documentation. Change the schema only together with
``SCHEMA_VERSION`` and a migration in ``MIGRATIONS``.

Schema version 1
----------------
A record is one JSON object::

    {
      "schema": 1,                      # int, this module's SCHEMA_VERSION when written
      "run_id": "3f9c0a1b2c4d5e6f",     # RunSpec.key(): 16 hex digits of sha256(spec JSON)
      "spec": {
        "world": "tiny",                # "tiny" | "paper"
        "model": "tiny-var",            # registered model name
        "ckpt_sha256": "ab12…" | null,  # checkpoint the model was loaded from (not part of the key)
        "methods": ["magnitude:sparsity=0.4", "ft:epochs=1"],   # applied in order; [] = dense
        "bench": "shapes-c2i",          # registered bench name
        "n": 1000,                      # number of generated images
        "seed": 0,                      # base seed
        "sampling": {"cfg": 1.5, ...}   # sampling keyword arguments ({} = the model's defaults)
      },
      "metrics": {                      # metric name -> measurement
        "fid": {"value": 12.3, "stderr": 0.4 | null, "n": 1000, ...extra keys allowed}
      },
      "cost": {"params": 1234567, "flops": 5.6e9, "latency_ms": 12.0, ...},   # numbers
      "env": {
        "torch": "2.4.1", "python": "3.11.7", "platform": "Linux-…",
        "device": "cpu" | "NVIDIA H200",
        "git_commit": "40 hex" | "unknown", "git_dirty": true | false | null,
        "versions": {"torch": "…", "torch-fidelity": "…", "numpy": "…"}  # null if absent
      },
      "timings": {"apply_s": 1.2, "generate_s": 30.0, "evaluate_s": 5.0, ...},
      "notes": ["deviation from the paper's method, one sentence each", ...],
      "created": "2026-05-09T07:35:25+00:00"   # ISO 8601, UTC
    }

Where a record lives
--------------------
``RunSpec.path(root)`` = ``<root>/<world>/<model>/<bench>/<key>.json`` (``root`` defaults to
``results``). The key covers world, model, methods, bench, n, seed and sampling; not the checkpoint
hash, the environment or the time. A runner skips a spec whose record exists (``find_record``).

Method specs
------------
A method spec is ``name`` or ``name:key=value,key=value``. ``canonical_method`` sorts the
parameters, strips spaces and writes numbers one way (``0.40`` -> ``0.4``, ``1e-3`` -> ``0.001``)
so that equal chains hash equally. ``dense`` (no parameters) is the empty chain and is dropped.

Writing and reading
-------------------
``write_record`` is atomic: it writes a temporary file in the target's folder, flushes and fsyncs
it, then ``os.replace``-s it onto the target. A process killed mid-write leaves the old file (or
none) at the target, never a partial one; at worst a hidden ``.<name>.*.tmp`` file stays behind.
``read_record`` validates the record and upgrades older schema versions through ``MIGRATIONS``;
a future version, corrupt JSON or a malformed record raises ``RecordError`` naming the file.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple

from bench.defaults import WORLDS

SCHEMA_VERSION = 1

# from_version -> function(record) -> record of version from_version + 1. read_record applies them
# in sequence. Version 1 is the first version, so nothing needs upgrading yet.
MIGRATIONS: Dict[int, Callable[[dict], dict]] = {}

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ROOT = "results"
VERSIONED_PACKAGES = ("torch", "torch-fidelity", "numpy")

_SPEC_KEYS = ("world", "model", "methods", "bench", "n", "seed", "sampling")
_RECORD_KEYS = ("schema", "run_id", "spec", "metrics", "cost", "env", "timings", "notes", "created")


class RecordError(ValueError):
    """A record that cannot be used: corrupt JSON, malformed, or an unsupported schema version."""


# --------------------------------------------------------------------------------------------------
# method specs


def _canonical_value(v: str) -> str:
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
        raise ValueError(f"a method spec must be a non-empty string, got {spec!r}")
    name, _, rest = spec.strip().partition(":")
    name = name.strip()
    if not name or any(c in name for c in "=, "):
        raise ValueError(f"bad method spec {spec!r}: expected 'name' or 'name:key=value,...'")
    params: Dict[str, str] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key or not value.strip():
            raise ValueError(f"bad parameter {item!r} in method spec {spec!r}: expected key=value")
        if key in params:
            raise ValueError(f"parameter {key!r} given twice in method spec {spec!r}")
        params[key] = _canonical_value(value)
    return name, params


def format_method(name: str, params: Mapping[str, Any]) -> str:
    """Inverse of ``parse_method``, with the parameters sorted by key."""
    if not params:
        return name
    return name + ":" + ",".join(f"{k}={_canonical_value(str(params[k]))}" for k in sorted(params))


def canonical_method(spec: str) -> str:
    """One spelling per method spec (sorted parameters, normalised numbers, no spaces)."""
    return format_method(*parse_method(spec))


def canonical_methods(methods: Iterable[str] | str) -> Tuple[str, ...]:
    """A chain of method specs, canonical, with plain ``dense`` dropped. A string is split on ``+``."""
    if isinstance(methods, str):
        methods = methods.split("+")
    out = []
    for m in methods:
        c = canonical_method(m)
        if c != "dense":
            out.append(c)
    return tuple(out)


# --------------------------------------------------------------------------------------------------
# RunSpec


def _canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """What one run is: model + method chain on a bench with n images, a seed and sampling options.

    Equal specs (after canonicalising the method chain; the order of ``sampling`` keys does not
    matter) have equal ``key()`` and hence the same record path.
    """

    world: str
    model: str
    methods: Tuple[str, ...]
    bench: str
    n: int
    seed: int
    sampling: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.world not in WORLDS:
            raise ValueError(f"unknown world {self.world!r}; expected one of {', '.join(WORLDS)}")
        for field in ("model", "bench"):
            if not isinstance(getattr(self, field), str) or not getattr(self, field):
                raise ValueError(f"RunSpec.{field} must be a non-empty string, got {getattr(self, field)!r}")
        for field in ("n", "seed"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"RunSpec.{field} must be a non-negative int, got {v!r}")
        object.__setattr__(self, "methods", canonical_methods(self.methods))
        sampling = dict(self.sampling or {})
        try:
            _canonical_json(sampling)
        except (TypeError, ValueError) as e:
            raise ValueError(f"RunSpec.sampling must be JSON-serialisable: {e}") from None
        object.__setattr__(self, "sampling", sampling)

    def __hash__(self) -> int:  # sampling is a dict, so hash the key instead of the fields
        return hash(self.key())

    def to_dict(self) -> Dict[str, Any]:
        return {"world": self.world, "model": self.model, "methods": list(self.methods),
                "bench": self.bench, "n": self.n, "seed": self.seed, "sampling": dict(self.sampling)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RunSpec":
        """From ``to_dict()`` output or a record's ``spec`` (whose ``ckpt_sha256`` is ignored)."""
        unknown = set(d) - set(_SPEC_KEYS) - {"ckpt_sha256"}
        missing = [k for k in _SPEC_KEYS if k not in d and k != "sampling"]
        if unknown or missing:
            raise ValueError(f"bad run spec: missing {missing}, unknown {sorted(unknown)}")
        return cls(world=d["world"], model=d["model"], methods=tuple(d["methods"]), bench=d["bench"],
                   n=d["n"], seed=d["seed"], sampling=d.get("sampling") or {})

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> "RunSpec":
        return cls.from_dict(record["spec"])

    def key(self) -> str:
        """16 hex digits of sha256 over the canonical JSON of ``to_dict()``."""
        return hashlib.sha256(_canonical_json(self.to_dict()).encode()).hexdigest()[:16]

    def path(self, root: str | os.PathLike = DEFAULT_ROOT) -> Path:
        return Path(root) / self.world / self.model / self.bench / f"{self.key()}.json"

    def label(self) -> str:
        """Short human description, e.g. ``tiny-var magnitude:sparsity=0.4 + ft:epochs=1 @ shapes-c2i n=1000 s0``."""
        chain = " + ".join(self.methods) or "dense"
        extra = f" {_canonical_json(self.sampling)}" if self.sampling else ""
        return f"{self.model} {chain} @ {self.bench} n={self.n} s{self.seed}{extra}"


# --------------------------------------------------------------------------------------------------
# building a record


def _git(*args: str) -> Optional[str]:
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit() -> str:
    """``git rev-parse HEAD`` of the varbench checkout, or ``"unknown"`` outside a git repository."""
    return _git("rev-parse", "HEAD") or "unknown"


def _package_version(name: str) -> Optional[str]:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _default_device() -> str:
    torch = sys.modules.get("torch")  # do not import torch just to describe the machine
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.cuda.current_device())
    return "cpu"


def environment(device: Optional[str] = None) -> Dict[str, Any]:
    """The ``env`` block of a record: versions, platform, device and the git commit."""
    versions = {p: _package_version(p) for p in VERSIONED_PACKAGES}
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "torch": versions["torch"],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": device or _default_device(),
        "git_commit": git_commit(),
        "git_dirty": None if status is None else bool(status),
        "versions": versions,
    }


def _metric(name: str, m: Any, n: int) -> Dict[str, Any]:
    if isinstance(m, Mapping):
        out = dict(m)
    else:
        out = {"value": m}
    out.setdefault("stderr", None)
    out.setdefault("n", n)
    if isinstance(out["value"], bool) or not isinstance(out["value"], (int, float)):
        raise ValueError(f"metric {name!r}: value must be a number, got {out['value']!r}")
    return out


def make_record(spec: RunSpec, metrics: Mapping[str, Any], cost: Mapping[str, Any],
                timings: Mapping[str, Any], ckpt_sha256: Optional[str] = None,
                notes: Sequence[str] = (), device: Optional[str] = None) -> Dict[str, Any]:
    """A schema-1 record for ``spec``. ``metrics`` values are numbers or ``{value, stderr, n, ...}``
    dicts (``stderr`` defaults to null, ``n`` to ``spec.n``); ``env`` and ``created`` are filled in."""
    record = {
        "schema": SCHEMA_VERSION,
        "run_id": spec.key(),
        "spec": {"world": spec.world, "model": spec.model, "ckpt_sha256": ckpt_sha256,
                 "methods": list(spec.methods), "bench": spec.bench, "n": spec.n, "seed": spec.seed,
                 "sampling": dict(spec.sampling)},
        "metrics": {name: _metric(name, m, spec.n) for name, m in metrics.items()},
        "cost": dict(cost),
        "env": environment(device),
        "timings": dict(timings),
        "notes": [str(s) for s in notes],
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    validate_record(record)
    return record


# --------------------------------------------------------------------------------------------------
# validation and migration


def validate_record(record: Any, where: str = "record") -> None:
    """Raise ``RecordError`` unless ``record`` is a well-formed record of the current schema."""
    def bad(msg: str):
        raise RecordError(f"{where}: {msg}")

    if not isinstance(record, dict):
        bad(f"expected a JSON object, got {type(record).__name__}")
    missing = [k for k in _RECORD_KEYS if k not in record]
    if missing:
        bad(f"missing keys {missing}")
    if record["schema"] != SCHEMA_VERSION:
        bad(f"schema {record['schema']!r}, expected {SCHEMA_VERSION}")
    for k in ("spec", "metrics", "cost", "env", "timings"):
        if not isinstance(record[k], dict):
            bad(f"{k!r} must be an object, got {type(record[k]).__name__}")
    if not isinstance(record["notes"], list) or not all(isinstance(s, str) for s in record["notes"]):
        bad("'notes' must be a list of strings")
    try:
        spec = RunSpec.from_dict(record["spec"])
    except (ValueError, TypeError, KeyError) as e:
        bad(f"bad spec: {e}")
    if record["run_id"] != spec.key():
        bad(f"run_id {record['run_id']!r} does not match its spec (key {spec.key()!r})")
    for name, m in record["metrics"].items():
        if not isinstance(m, dict) or "value" not in m:
            bad(f"metric {name!r} must be an object with a 'value'")
        if m["value"] is not None and (isinstance(m["value"], bool) or not isinstance(m["value"], (int, float))):
            bad(f"metric {name!r}: value must be a number or null, got {m['value']!r}")


def upgrade_record(record: dict, where: str = "record") -> dict:
    """Bring a record of an older schema up to ``SCHEMA_VERSION`` through ``MIGRATIONS``."""
    if not isinstance(record, dict):
        raise RecordError(f"{where}: expected a JSON object, got {type(record).__name__}")
    version = record.get("schema")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise RecordError(f"{where}: no valid 'schema' version (got {version!r}); not a varbench record?")
    if version > SCHEMA_VERSION:
        raise RecordError(f"{where}: schema version {version} is newer than this varbench reads "
                          f"(up to {SCHEMA_VERSION}); upgrade varbench to read it")
    while version < SCHEMA_VERSION:
        if version not in MIGRATIONS:
            raise RecordError(f"{where}: no migration from schema version {version} to {version + 1}")
        record = MIGRATIONS[version](dict(record))
        version += 1
        record["schema"] = version
    return record


# --------------------------------------------------------------------------------------------------
# files


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never a mix."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename itself durable; not every platform can open a directory
        dfd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def write_record(path: str | os.PathLike, record: Mapping[str, Any]) -> Path:
    """Validate ``record`` and write it atomically to ``path`` (folders are created)."""
    record = dict(record)
    validate_record(record, where=f"record for {path}")
    atomic_write_text(path, json.dumps(record, indent=2, allow_nan=False) + "\n")
    return Path(path)


def read_record(path: str | os.PathLike) -> Dict[str, Any]:
    """Load, upgrade and validate the record at ``path``; ``RecordError`` if it cannot be used."""
    path = Path(path)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise RecordError(f"{path}: corrupt JSON ({e}); delete the file to rerun the run") from None
    except UnicodeDecodeError as e:
        raise RecordError(f"{path}: not UTF-8 text ({e}); delete the file to rerun the run") from None
    record = upgrade_record(record, where=str(path))
    validate_record(record, where=str(path))
    return record


def find_record(spec: RunSpec, root: str | os.PathLike = DEFAULT_ROOT) -> Optional[Dict[str, Any]]:
    """The record of ``spec`` under ``root``, or None if it has not been run."""
    path = spec.path(root)
    if not path.is_file():
        return None
    record = read_record(path)
    if record["run_id"] != spec.key():
        raise RecordError(f"{path}: holds run {record['run_id']}, not {spec.key()} ({spec.label()})")
    return record


def load_records(root: str | os.PathLike = DEFAULT_ROOT, world: Optional[str] = None) -> Dict[str, Dict[str, Any]]:
    """Every record under ``root`` (or ``root/<world>``), keyed by run_id."""
    base = Path(root) / world if world else Path(root)
    records = {}
    for path in sorted(base.glob("*/*/*.json") if world else base.glob("*/*/*/*.json")):
        record = read_record(path)
        records[record["run_id"]] = record
    return records
