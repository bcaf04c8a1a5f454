import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import bench.records as R
from bench.records import (
    RecordError,
    RunSpec,
    find_record,
    load_records,
    make_record,
    read_record,
    write_record,
)
from bench.spec import SpecError, canonical_method, parse_chain

FIXTURES = Path(__file__).parent / "fixtures" / "records"
REPO = Path(__file__).resolve().parent.parent


def spec(**kw):
    base = dict(world="tiny", model="tiny-var", methods=("evar:sparsity=0.4",), bench="shapes-c2i", n=1000,
                seed=0, sampling={"cfg": 1.5, "top_k": 900}, ckpt={"tiny_var.safetensors": "ab" * 32},
                method_versions={"evar": 1}, protocol={"version": 1}, requested={"methods": ["evar"], "sampling": {}})
    base.update(kw)
    return RunSpec(**base)


def record(s=None, **kw):
    return make_record(s or spec(), metrics={"fid": {"value": 12.5, "stderr": 0.3}, "is": 7.0},
                       cost={"params": 1_000_000}, timings={"generate_s": 1.0}, **kw)


# --- RunSpec -----------------------------------------------------------------------------------------

def test_key_is_stable_and_insensitive_to_sampling_order():
    a = spec(sampling={"cfg": 1.5, "top_k": 900})
    b = spec(sampling={"top_k": 900, "cfg": 1.5})
    assert a.key() == b.key() == PINNED_KEY  # pinned: a changed key orphans every record
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert re.fullmatch(r"[0-9a-f]{16}", a.key())


PINNED_KEY = "4671d4adbf106980"


def test_key_changes_with_what_is_run():
    base = spec()
    for other in (spec(n=999), spec(seed=1), spec(model="tiny-t2i"), spec(world="paper"),
                  spec(methods=("evar:sparsity=0.2",)), spec(sampling={"cfg": 2.0, "top_k": 900}),
                  spec(ckpt={"tiny_var.safetensors": "cd" * 32}), spec(ckpt=None),
                  spec(method_versions={"evar": 2}), spec(protocol={"version": 2})):
        assert other.key() != base.key()
    # what was asked is not part of the key: two requests that resolve alike share one record
    assert spec(requested={"methods": ["evar:sparsity=0.4"], "sampling": {}}).key() == base.key()
    assert base.key(("ckpt",)) == spec(ckpt=None).key(("ckpt",))
    ab = spec(methods=("evar:sparsity=0.4", "ft:epochs=1"))
    ba = spec(methods=("ft:epochs=1", "evar:sparsity=0.4"))
    assert ab.key() != ba.key()  # a chain is applied in order


def test_method_specs_are_canonical():
    assert [canonical_method(m) for m in parse_chain("evar: sparsity=0.40, calib=pyramid + ft:epochs=1")] == [
        "evar:calib=pyramid,sparsity=0.4", "ft:epochs=1"]
    assert spec(methods=["evar:sparsity=.4"]).key() == spec().key()
    with pytest.raises(SpecError, match="key=value"):
        canonical_method("evar:sparsity")
    for bad in ("", "+", "  ", "a + + b"):
        with pytest.raises(SpecError, match="empty method"):
            parse_chain(bad)


def test_spec_dict_path_and_label():
    s = spec(methods=("magnitude:sparsity=0.4", "ft:epochs=1"))
    assert RunSpec.from_dict(s.to_dict()) == s
    assert s.path("results") == Path("results/tiny/tiny-var/shapes-c2i") / f"{s.key()}.json"
    assert "evar" in s.label() and "n=1000" in s.label()
    assert "magnitude:sparsity=0.4 + ft:epochs=1" in spec(methods=s.methods, requested=None).label()
    assert "dense" in spec(methods=(), requested=None).label()
    with pytest.raises(ValueError, match="unknown world"):
        spec(world="huge")


# --- records -----------------------------------------------------------------------------------------

def test_make_record_follows_the_schema():
    rec = record(notes=["a deviation"])
    assert rec["schema"] == R.SCHEMA_VERSION and rec["run_id"] == spec().key()
    assert rec["spec"]["ckpt"] == {"tiny_var.safetensors": "ab" * 32} and rec["spec"]["methods"] == ["evar:sparsity=0.4"]
    assert rec["spec"]["method_versions"] == {"evar": 1} and rec["spec"]["requested"]["methods"] == ["evar"]
    assert rec["metrics"]["is"] == {"value": 7.0, "stderr": None, "n": 1000}
    assert rec["metrics"]["fid"]["stderr"] == 0.3
    env = rec["env"]
    assert {"torch", "python", "platform", "device", "git_commit", "versions"} <= set(env)
    assert set(env["versions"]) == {"varbench", "torch", "torch-fidelity", "numpy"}
    assert env["versions"]["varbench"]   # the package itself, installed editable or not
    assert env["git_commit"] == "unknown" or re.fullmatch(r"[0-9a-f]{40}", env["git_commit"])
    assert rec["created"].endswith("+00:00") and rec["notes"] == ["a deviation"]
    json.dumps(rec, allow_nan=False)


def test_an_installed_copy_reports_the_commit_its_build_recorded(tmp_path, monkeypatch):
    import bench.io as io
    site = tmp_path / "site"          # no .git here: an installed copy
    site.mkdir()
    info = site / "_build_info.json"
    monkeypatch.setattr(io, "SOURCE_ROOT", site)
    monkeypatch.setattr(io, "BUILD_INFO", info)
    assert (io.git_commit(), io.git_dirty()) == ("unknown", None)        # built without git: no stamp
    info.write_text(json.dumps({"git_commit": "a1" * 20, "git_dirty": False, "built": "2026-12-04T00:00:00+00:00"}))
    assert (io.git_commit(), io.git_dirty()) == ("a1" * 20, False)
    assert R.environment()["git_commit"] == "a1" * 20
    # a damaged stamp is no stamp: provenance never stops a run, and never invents a commit
    for bad in ("{", "[]", json.dumps({"git_commit": "HEAD"}), json.dumps({"git_commit": "A1" * 20}),
                json.dumps({"git_commit": "a1" * 19})):
        info.write_text(bad)
        assert (io.git_commit(), io.git_dirty()) == ("unknown", None), bad
    info.write_text(json.dumps({"git_commit": "a1" * 20, "git_dirty": "yes"}))
    assert (io.git_commit(), io.git_dirty()) == ("a1" * 20, None)
    # a checkout asks git, whatever a stale stamp says
    monkeypatch.setattr(io, "SOURCE_ROOT", REPO)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert io.git_commit() == head != "a1" * 20


def test_write_read_find_roundtrip(tmp_path):
    s = spec()
    assert find_record(s, tmp_path) is None
    rec = record(s)
    write_record(s.path(tmp_path), rec)
    assert read_record(s.path(tmp_path)) == rec
    assert find_record(s, tmp_path) == rec
    assert load_records(tmp_path, "tiny") == {s.key(): rec} == load_records(tmp_path)
    assert [p.name for p in s.path(tmp_path).parent.iterdir()] == [f"{s.key()}.json"]  # no temp left


def test_every_fixture_reads():
    paths = sorted(FIXTURES.glob("*.json"))
    assert paths
    for p in paths:
        rec = read_record(p)
        assert rec["schema"] == R.SCHEMA_VERSION
        assert RunSpec.from_record(rec).key() == rec["run_id"]


def _fixture():
    return json.loads((FIXTURES / "tiny-magnitude-ft-v1.json").read_text())


def test_future_schema_is_rejected(tmp_path):
    rec = _fixture()
    rec["schema"] = R.SCHEMA_VERSION + 1
    p = tmp_path / "future.json"
    p.write_text(json.dumps(rec))
    with pytest.raises(RecordError, match=rf"schema version {R.SCHEMA_VERSION + 1} is newer than this varbench reads.*upgrade"):
        read_record(p)


@pytest.mark.parametrize("text", ['{"schema": 1, "run_id": "ab', "", "\x00\x01garbage"])
def test_corrupt_json_is_rejected(tmp_path, text):
    p = tmp_path / "corrupt.json"
    p.write_text(text)
    with pytest.raises(RecordError, match="corrupt JSON"):
        read_record(p)


def test_malformed_records_are_rejected(tmp_path):
    p = tmp_path / "r.json"
    fine = record()
    nan_metric = json.loads(json.dumps(fine))
    nan_metric["metrics"]["fid"]["value"] = float("nan")
    inf_cost = json.loads(json.dumps(fine))
    inf_cost["cost"]["params"] = float("inf")
    no_commit = json.loads(json.dumps(fine))
    no_commit["env"]["git_commit"] = None
    for bad, msg in (([1, 2], "expected a JSON object"), ({"run_id": "x"}, "no valid 'schema'"),
                     ({**fine, "run_id": "0" * 16}, "does not match its spec"),
                     ({k: v for k, v in fine.items() if k != "metrics"}, "missing keys"),
                     (nan_metric, "finite"), (inf_cost, "finite"), (no_commit, "git_commit")):
        p.write_text(json.dumps(bad))
        with pytest.raises(RecordError, match=msg):
            read_record(p)


def test_schema_1_records_are_upgraded_and_never_match_a_new_key(tmp_path):
    old = _fixture()
    rec = read_record(FIXTURES / "tiny-magnitude-ft-v1.json")
    assert rec["schema"] == R.SCHEMA_VERSION == 2
    s = rec["spec"]
    assert s["methods"] == old["spec"]["methods"] and s["requested"]["methods"] == old["spec"]["methods"]
    assert s["ckpt"] is None and s["method_versions"] is None and s["protocol"] is None
    assert rec["run_id"] != old["run_id"] and rec["run_id"] == RunSpec.from_record(rec).key()
    assert any(old["spec"]["ckpt_sha256"] in n for n in rec["notes"])


def test_a_missing_migration_is_an_error(tmp_path, monkeypatch):
    monkeypatch.delitem(R.MIGRATIONS, 1)
    with pytest.raises(RecordError, match="no migration from schema version 1"):
        read_record(FIXTURES / "tiny-magnitude-ft-v1.json")


def test_record_files_get_the_users_umask(tmp_path):
    old = os.umask(0o022)
    try:
        p = write_record(tmp_path / "r.json", record())
        assert p.stat().st_mode & 0o777 == 0o644
        os.umask(0o002)
        p = write_record(tmp_path / "r2.json", record())
        assert p.stat().st_mode & 0o777 == 0o664
    finally:
        os.umask(old)


# --- atomic write under SIGKILL ----------------------------------------------------------------------

# The child writes a ~2 MB record through a file object that stops (and says so) after half of the
# text is on disk, so the parent can SIGKILL it in the middle of the write, deterministically.
CHILD = textwrap.dedent("""
    import os, sys, time
    import bench.records as R

    real_fdopen = os.fdopen

    class HalfThenHang:
        def __init__(self, fh):
            self.fh = fh
        def write(self, text):
            self.fh.write(text[: len(text) // 2])
            self.fh.flush()
            os.fsync(self.fh.fileno())
            print("HALF", flush=True)
            time.sleep(120)
            self.fh.write(text[len(text) // 2:])
        def __getattr__(self, name):
            return getattr(self.fh, name)
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            return self.fh.__exit__(*exc)

    os.fdopen = lambda *a, **k: HalfThenHang(real_fdopen(*a, **k))
    spec = R.RunSpec("tiny", "tiny-var", ("evar:sparsity=0.4",), "shapes-c2i", 1000, 0, {})
    big = {f"metric_{i}": {"value": float(i), "stderr": 0.5, "n": 1000} for i in range(20000)}
    R.write_record(sys.argv[1], R.make_record(spec, big, {"params": 1}, {}))
""")


@pytest.mark.parametrize("old", [False, True], ids=["no-old-file", "old-file"])
def test_sigkill_during_write_leaves_no_partial_file(tmp_path, old):
    target = R.RunSpec.from_record(record()).path(tmp_path)       # where load_records looks for it
    old_rec = None
    if old:
        old_rec = record()
        write_record(target, old_rec)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(target)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "HALF", "the child did not reach the middle of the write"
        temps = list(target.parent.glob(f".{target.name}.*.tmp"))
        assert len(temps) == 1 and temps[0].stat().st_size > 500_000  # really mid-write
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
    if old:
        assert read_record(target) == old_rec  # the old record, intact
    else:
        assert not target.exists()
    assert load_records(tmp_path, "tiny") == ({old_rec["run_id"]: old_rec} if old else {})


def test_accounting_keeps_figures_another_accounting_computed(tmp_path):
    """A Table 2 accounting (params/FLOPs) of a chain must not drop the package op count a Table 5
    accounting of the same chain wrote; a corrupt file is simply replaced."""
    import json

    from bench.records import RunSpec, accounting_path, load_accounting, write_accounting
    spec = RunSpec(world="tiny", model="tiny-var", methods=("magnitude:sparsity=0.4",), bench="shapes-c2i", n=12,
                   seed=0, method_versions={"magnitude": 1})
    write_accounting(tmp_path, spec, {"package_ops": 2048})
    write_accounting(tmp_path, spec, {"params": 10, "flops": 5.0})
    (rec,) = load_accounting(tmp_path, "tiny").values()
    assert rec["cost"] == {"package_ops": 2048, "params": 10, "flops": 5.0}
    write_accounting(tmp_path, spec, {"params": 11})
    assert json.loads(accounting_path(tmp_path, spec).read_text())["cost"]["params"] == 11
    accounting_path(tmp_path, spec).write_text("{not json")
    write_accounting(tmp_path, spec, {"params": 12})
    assert json.loads(accounting_path(tmp_path, spec).read_text())["cost"] == {"params": 12}


def test_a_run_spec_from_a_dict_refuses_what_is_not_one():
    spec = RunSpec(world="tiny", model="tiny-var", methods=("magnitude:sparsity=0.4",), bench="shapes-c2i", n=12,
                   seed=0, sampling={"cfg": 2.0}, ckpt={"f": "0"}, method_versions={}, protocol={"version": 1})
    d = spec.to_dict()
    assert RunSpec.from_dict({**d, "methods": list(d["methods"])}) == spec      # JSON lists become the tuple
    with pytest.raises(ValueError) as e:
        RunSpec.from_dict([d])
    assert str(e.value) == "bad run spec: expected an object, got list"
    with pytest.raises(ValueError) as e:
        RunSpec.from_dict({**d, "methods": "magnitude:sparsity=0.4"})
    assert str(e.value) == "bad run spec: methods must be a list, got 'magnitude:sparsity=0.4'"
