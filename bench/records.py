"""Run records: one JSON file per run, the only thing tables, plots and the leaderboard read.

This docstring is the schema's documentation. Change the schema only together with
``SCHEMA_VERSION`` and a migration in ``MIGRATIONS``.

Schema version 2
----------------
A record is one JSON object::

    {
      "schema": 2,                      # int, this module's SCHEMA_VERSION when written
      "run_id": "3f9c0a1b2c4d5e6f",     # RunSpec.key(): 16 hex digits of sha256(key fields of spec)
      "spec": {                         # everything that changes the numbers (all part of the key) ...
        "world": "tiny",                # "tiny" | "paper"
        "model": "tiny-var",            # registered model name
        "ckpt": {"tiny_vqvae.safetensors": "ab12…", "tiny_var.safetensors": "cd34…"},
                                        # sha256 of every weights file loaded (null: unknown, legacy)
        "methods": ["magnitude:norm=l2,schedule=uniform,scope=coupled,sparsity=0.4", "ft:batch=64,epochs=1.0,lr=0.0005,wd=0.05"],
                                        # the RESOLVED chain: every parameter, defaults filled in; [] = dense
        "method_versions": {"ft": 1, "magnitude": 1},   # each method's YAML `version:` (null: legacy)
        "bench": "shapes-c2i",          # registered bench name
        "protocol": {"version": 1, "files": {"feature_cnn.safetensors": "…"}},  # bench identity (null: legacy)
                                        # (+ "fidelity": true when compared with the original's images)
        "n": 600,                       # number of generated images
        "seed": 0,                      # base seed
        "sampling": {"cfg": 2.0, "top_k": 50, "top_p": 0.9, "more_smooth": false},  # as sampled
        "requested": {"methods": ["magnitude:sparsity=0.4", "ft"], "sampling": {}}
                                        # ... except this: what was asked (not in the key; used to
                                        # tell whether the same request would resolve differently today)
      },
      "metrics": {                      # metric name (bench.metrics.catalog) -> measurement
        "fid": {"value": 12.3, "stderr": 0.4 | null, "n": 1000, ...extra keys allowed}   # finite numbers
                                        # latency records' "latency_ms" adds "group" (the measurement run,
                                        # 16 hex) and "timed_with" (the run_ids alternated in it): tables
                                        # take speed-ups only between records of one group; their
                                        # "peak_mem_mb" (protocol version ≥ 2) adds "weights_mb" and
                                        # "working_mb" (value = their sum: one configuration as if alone)
      },
      "cost": {"params": 1234567, "flops": 5.6e9, "latency_ms_per_image": 12.0, ...},
      "env": {
        "torch": "2.4.1", "python": "3.11.7", "platform": "Linux-…",
        "device": "cpu" | "NVIDIA H200",
        "git_commit": "40 hex" | "unknown", "git_dirty": true | false | null,
        "versions": {"varbench": "…", "torch": "…", "torch-fidelity": "…", "numpy": "…"}  # null if absent
      },
      "timings": {"load_s": 1.2, "methods_s": 3.4, "sample_s": 30.0, "metrics_s": 5.0, "total_s": 40.0},
                                        # (+ "original_s": sampling/reading the original's images, fidelity runs;
                                        # not part of total_s)
      "notes": ["deviation from the paper's method, one sentence each", ...],
      "created": "2026-05-09T07:35:25+00:00"   # ISO 8601, UTC
    }

Schema 1 (before record keys covered defaults, versions and checkpoints) is upgraded on read: its
``methods`` become its ``requested`` methods, ``ckpt``/``method_versions``/``protocol`` are null,
and ``run_id`` is recomputed. Such a record never matches a new key, so it is never reused, and
``varbench runs --stale`` lists it.

Where a record lives
--------------------
``RunSpec.path(root)`` = ``<root>/<world>/<model>/<bench>/<key>.json`` (``root``: ``--results``,
else ``$VARBENCH_RESULTS``, else ``./results``). A runner reuses the record at that path; a changed
method default or version, checkpoint file or bench protocol gives another key, hence a rerun.
Specs are built (resolved, checked, identified) by ``bench.plan.make_spec``; the method-spec grammar
is ``bench.spec``.

Writing and reading
-------------------
``write_record`` is atomic: it writes a temporary file in the target's folder, flushes and fsyncs
it, then ``os.replace``-s it onto the target. A process killed mid-write leaves the old file (or
none) at the target, never a partial one; at worst a hidden ``.<name>.*.tmp`` file stays behind.
Files get the user's usual permissions (``0666 & ~umask``). ``read_record`` upgrades older schema
versions through ``MIGRATIONS`` and validates the record (finite metric values, a string git
commit, a run_id that matches the spec); a future version, corrupt JSON or a malformed record raises
``RecordError`` naming the file.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import platform
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from bench.defaults import WORLDS
from bench.io import atomic_write_text, git_commit, git_dirty
from bench.resources import results_root
from bench.spec import canonical_method

SCHEMA_VERSION = 2

VERSIONED_PACKAGES = ("varbench", "torch", "torch-fidelity", "numpy")

_KEY_FIELDS = ("world", "model", "ckpt", "methods", "method_versions", "bench", "protocol", "n", "seed", "sampling")
_SPEC_KEYS = _KEY_FIELDS + ("requested",)
_RECORD_KEYS = ("schema", "run_id", "spec", "metrics", "cost", "env", "timings", "notes", "created")


class RecordError(ValueError):
    """A record that cannot be used: corrupt JSON, malformed, or an unsupported schema version."""


# --------------------------------------------------------------------------------------------------
# RunSpec


def _canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """What one run is: model (and its checkpoint files) + resolved method chain on a bench with n
    images, a seed and sampling settings. Build it with ``bench.plan.make_spec``, which resolves and
    checks everything; this class only stores, validates types and hashes.

    ``key()`` covers every field except ``requested``.
    """

    world: str
    model: str
    methods: Tuple[str, ...]
    bench: str
    n: int
    seed: int
    sampling: Dict[str, Any] = dataclasses.field(default_factory=dict)
    ckpt: Optional[Dict[str, str]] = None
    method_versions: Optional[Dict[str, int]] = None
    protocol: Optional[Dict[str, Any]] = None
    requested: Optional[Dict[str, Any]] = None

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
        methods = tuple(self.methods)
        if not all(isinstance(m, str) for m in methods):
            raise ValueError(f"RunSpec.methods must be strings, got {methods!r}")
        object.__setattr__(self, "methods", tuple(canonical_method(m) for m in methods))
        for field in ("sampling", "ckpt", "method_versions", "protocol", "requested"):
            v = getattr(self, field)
            if field == "sampling":
                v = dict(v or {})
            elif v is not None:
                if not isinstance(v, Mapping):
                    raise ValueError(f"RunSpec.{field} must be an object or null, got {type(v).__name__}")
                v = json.loads(_canonical_json(dict(v))) if _json_ok(v) else None
                if v is None:
                    raise ValueError(f"RunSpec.{field} must be JSON-serialisable")
            object.__setattr__(self, field, v)
        if not _json_ok(self.sampling):
            raise ValueError("RunSpec.sampling must be JSON-serialisable (finite numbers)")

    def __hash__(self) -> int:  # the dict fields are not hashable: hash the key instead
        return hash(self.key())

    def __eq__(self, other) -> bool:
        return isinstance(other, RunSpec) and self.to_dict() == other.to_dict()

    def key_dict(self) -> Dict[str, Any]:
        return {"world": self.world, "model": self.model, "ckpt": self.ckpt, "methods": list(self.methods),
                "method_versions": self.method_versions, "bench": self.bench, "protocol": self.protocol,
                "n": self.n, "seed": self.seed, "sampling": dict(self.sampling)}

    def to_dict(self) -> Dict[str, Any]:
        return {**self.key_dict(), "requested": self.requested}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RunSpec":
        """From ``to_dict()`` output or a record's ``spec``."""
        if not isinstance(d, Mapping):
            raise ValueError(f"bad run spec: expected an object, got {type(d).__name__}")
        unknown = set(d) - set(_SPEC_KEYS)
        missing = [k for k in _SPEC_KEYS if k not in d]
        if unknown or missing:
            raise ValueError(f"bad run spec: missing {missing}, unknown {sorted(unknown)}")
        if not isinstance(d["methods"], (list, tuple)):
            raise ValueError(f"bad run spec: methods must be a list, got {d['methods']!r}")
        return cls(world=d["world"], model=d["model"], methods=tuple(d["methods"]), bench=d["bench"],
                   n=d["n"], seed=d["seed"], sampling=d.get("sampling") or {}, ckpt=d["ckpt"],
                   method_versions=d["method_versions"], protocol=d["protocol"], requested=d["requested"])

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> "RunSpec":
        return cls.from_dict(record["spec"])

    def key(self, ignore: Sequence[str] = ()) -> str:
        """16 hex digits of sha256 over the canonical JSON of the key fields (``ignore``: leave some out,
        e.g. ``("ckpt",)`` to match records when the checkpoint files are not on this machine)."""
        d = {k: v for k, v in self.key_dict().items() if k not in ignore}
        return hashlib.sha256(_canonical_json(d).encode()).hexdigest()[:16]

    def path(self, root: str | os.PathLike | None = None) -> Path:
        return results_root(root) / self.world / self.model / self.bench / f"{self.key()}.json"

    def label(self) -> str:
        """Short human description, e.g. ``tiny-var magnitude:sparsity=0.4 + ft @ shapes-c2i n=600 s0``
        (the chain as requested when known, else as resolved)."""
        chain = list((self.requested or {}).get("methods") or []) if self.requested else list(self.methods)
        return f"{self.model} {' + '.join(chain) or 'dense'} @ {self.bench} n={self.n} s{self.seed}"


def _json_ok(obj: Any) -> bool:
    try:
        _canonical_json(obj)
    except (TypeError, ValueError):
        return False
    return True


# --------------------------------------------------------------------------------------------------
# building a record


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
    return {
        "torch": versions["torch"],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": device or _default_device(),
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),
        "versions": versions,
    }


def _finite(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def _metric(name: str, m: Any, n: int) -> Dict[str, Any]:
    out = dict(m) if isinstance(m, Mapping) else {"value": m}
    out.setdefault("stderr", None)
    out.setdefault("n", n)
    if not _finite(out["value"]):
        raise ValueError(f"metric {name!r}: value must be a finite number, got {out['value']!r}")
    return out


def timing_group(record: Mapping) -> Optional[str]:
    """The measurement run a latency record was timed in (``metrics.latency_ms.group``; None: a record
    from before groups were kept, or not a latency record)."""
    lat = record.get("metrics", {}).get("latency_ms")
    return lat.get("group") if isinstance(lat, Mapping) else None


def make_record(spec: RunSpec, metrics: Mapping[str, Any], cost: Mapping[str, Any],
                timings: Mapping[str, Any], notes: Sequence[str] = (), device: Optional[str] = None) -> Dict[str, Any]:
    """A current-schema record for ``spec``. ``metrics`` values are numbers or ``{value, stderr, n, ...}``
    dicts (``stderr`` defaults to null, ``n`` to ``spec.n``); ``env`` and ``created`` are filled in."""
    record = {
        "schema": SCHEMA_VERSION,
        "run_id": spec.key(),
        "spec": spec.to_dict(),
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


def _walk_numbers(obj: Any, path: str):
    """(path, value) of every number inside a JSON-like object."""
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from _walk_numbers(v, f"{path}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _walk_numbers(v, f"{path}[{i}]")
    elif isinstance(obj, float):
        yield path, obj


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
        if m["value"] is not None and not _finite(m["value"]):
            bad(f"metric {name!r}: value must be a finite number or null, got {m['value']!r}")
    for block in ("metrics", "cost", "timings"):
        for path, v in _walk_numbers(record[block], block):
            if not math.isfinite(v):
                bad(f"{path} is {v!r}: records hold finite numbers only (JSON has no NaN/Infinity)")
    commit = record["env"].get("git_commit")
    if not isinstance(commit, str) or not commit:
        bad(f"env.git_commit must be a commit hash or \"unknown\", got {commit!r}")
    created = record["created"]
    try:   # `runs` sorts and ages records by it; the figures' tie-breaks read it
        ok = isinstance(created, str) and datetime.fromisoformat(created).tzinfo is not None
    except ValueError:
        ok = False
    if not ok:
        bad(f"'created' must be an ISO 8601 time with its UTC offset (e.g. \"2026-05-09T07:35:25+00:00\"), "
            f"got {created!r}")


def _migrate_1_to_2(record: dict) -> dict:
    """Schema 1 keyed records by the chain as typed (no defaults, versions or checkpoint identity)."""
    old = dict(record["spec"])
    methods = [canonical_method(m) for m in old.get("methods", [])]
    spec = RunSpec(world=old["world"], model=old["model"], methods=tuple(methods), bench=old["bench"],
                   n=old["n"], seed=old["seed"], sampling=old.get("sampling") or {},
                   requested={"methods": methods, "sampling": {}})
    record["spec"] = spec.to_dict()
    record["run_id"] = spec.key()
    if old.get("ckpt_sha256"):
        record["notes"] = list(record.get("notes", [])) + [f"legacy record: transformer checkpoint sha256 {old['ckpt_sha256']}"]
    return record


# from_version -> function(record) -> record of version from_version + 1. read_record applies them
# in sequence.
MIGRATIONS: Dict[int, Callable[[dict], dict]] = {1: _migrate_1_to_2}


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


def find_record(spec: RunSpec, root: str | os.PathLike | None = None) -> Optional[Dict[str, Any]]:
    """The record of ``spec`` under ``root``, or None if it has not been run."""
    path = spec.path(root)
    if not path.is_file():
        return None
    record = read_record(path)
    if record["run_id"] != spec.key():
        raise RecordError(f"{path}: holds run {record['run_id']}, not {spec.key()} ({spec.label()})")
    return record


def record_paths(root: str | os.PathLike | None = None, world: Optional[str] = None) -> list:
    """Every record file under ``root`` (or ``root/<world>``), sorted."""
    base = results_root(root)
    if world:
        base = base / world
    pattern = "*/*/*.json" if world else "*/*/*/*.json"
    return sorted(p for p in base.glob(pattern)
                  if not p.name.startswith(".") and not any(x.startswith("_") for x in p.relative_to(base).parts))


# --------------------------------------------------------------------------------------------------
# weight-free accounting records
#
# What needs no weights (parameter counts, FLOPs) is measured on the meta device for any model and
# chain (``varbench table NAME --weight-free``), so that a table's params/FLOPs columns fill even
# where checkpoints or data are absent (the paper world on a laptop). Such a record is not a run:
# it lives in ``<results>/_accounting/<world>/<model>/<key>.json``, keyed by world, model, resolved
# chain, method versions and sampling (no checkpoint, bench, n or seed), and holds only ``cost``.
# A table cell uses it for weight-free columns only when its run record is missing (footnoted).

WEIGHT_FREE_METRICS = ("params", "tokenizer_params", "text_encoder_params", "text_tokens", "flops", "flops_no_cfg",
                       "package_ops")
ACCOUNTING_KIND = "weight-free accounting"


def accounting_key(spec: "RunSpec") -> str:
    body = {"world": spec.world, "model": spec.model, "methods": list(spec.methods),
            "method_versions": spec.method_versions, "sampling": dict(spec.sampling)}
    return hashlib.sha256(_canonical_json(body).encode()).hexdigest()[:16]


def accounting_path(root: str | os.PathLike | None, spec: "RunSpec") -> Path:
    return results_root(root) / "_accounting" / spec.world / spec.model / f"{accounting_key(spec)}.json"


def write_accounting(root: str | os.PathLike | None, spec: "RunSpec", cost: Mapping[str, Any]) -> Path:
    """Write the weight-free accounting record of ``spec`` atomically, keeping figures of an existing
    one that this accounting did not compute (e.g. a Core ML package's op count)."""
    bad = sorted(k for k, v in cost.items() if k not in WEIGHT_FREE_METRICS or not _finite(v))
    if bad:
        raise ValueError(f"accounting record: only finite {', '.join(WEIGHT_FREE_METRICS)} are allowed, got {bad}")
    path = accounting_path(root, spec)
    try:
        old = json.loads(path.read_text(encoding="utf-8")).get("cost") or {}
    except (OSError, ValueError, AttributeError):
        old = {}                     # none yet, or unreadable: accounting is cheap to redo
    cost = {**{k: v for k, v in old.items() if k in WEIGHT_FREE_METRICS and _finite(v)}, **cost}
    rec = {"kind": ACCOUNTING_KIND, "key": accounting_key(spec), "world": spec.world, "model": spec.model,
           "methods": list(spec.methods), "method_versions": spec.method_versions, "sampling": dict(spec.sampling),
           "requested": spec.requested, "cost": dict(cost), "env": environment("meta"),
           "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    atomic_write_text(path, json.dumps(rec, indent=2, allow_nan=False) + "\n")
    return path


def load_accounting(root: str | os.PathLike | None = None, world: Optional[str] = None) -> Dict[str, Dict[str, Any]]:
    """Every readable accounting record under ``root`` (of ``world``), keyed by its key; a file that
    is not one (corrupt, edited) is skipped: accounting is cheap to redo."""
    base = results_root(root) / "_accounting"
    out = {}
    for path in sorted(base.glob(f"{world}/*/*.json" if world else "*/*/*.json")):
        try:
            rec = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and rec.get("kind") == ACCOUNTING_KIND and isinstance(rec.get("cost"), dict) \
                and rec.get("key") == path.stem:
            out[rec["key"]] = rec
    return out


def iter_records(root: str | os.PathLike | None = None, world: Optional[str] = None,
                 on_error: Optional[Callable[[Path, RecordError], None]] = None):
    """(path, record) of every record under ``root`` (or ``root/<world>``). ``on_error`` (if given)
    is told about unreadable files instead of raising."""
    base = results_root(root)
    for path in record_paths(root, world):
        try:
            record = read_record(path)
            # a record lives at its spec's path: a copy or a moved file would count the run twice or
            # under another model/bench
            spec = RunSpec.from_record(record)
            home = spec.path(base)
            if path.relative_to(base) != home.relative_to(base):
                raise RecordError(f"{path}: holds run {record['run_id']} ({spec.label()}), "
                                  f"whose record is {home}: a copied or moved file? delete it"
                                  + ("" if home.exists() else " or move it there"))
            yield path, record
        except RecordError as e:
            if on_error is None:
                raise
            on_error(path, e)


def load_records(root: str | os.PathLike | None = None, world: Optional[str] = None,
                 on_error: Optional[Callable[[Path, RecordError], None]] = None) -> Dict[str, Dict[str, Any]]:
    """Every record under ``root`` (or ``root/<world>``), keyed by run_id."""
    return {rec["run_id"]: rec for _, rec in iter_records(root, world, on_error)}
