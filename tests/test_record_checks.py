"""What a run spec, a record and the sampling settings must hold: every refusal with its message, and the
normalisations run keys depend on (a spec built from equal values has one key, whatever their spelling,
order or container)."""
import math

import pytest

from bench import defaults as D
from bench.records import SCHEMA_VERSION, RecordError, RunSpec, make_record, validate_record

BASE = dict(world="tiny", model="tiny-var", methods=("magnitude:sparsity=0.4",), bench="shapes-c2i", n=24, seed=0)


def spec(**kw):
    return RunSpec(**{**BASE, **kw})


def good_record(**kw):
    return make_record(spec(**kw), {"fid": 1.0}, {"params": 10}, {"generate_s": 0.5}, notes=["a"])


# --- RunSpec ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("change, message", [
    ({"world": "moon"}, "unknown world 'moon'; expected one of tiny, paper"),
    ({"model": ""}, "RunSpec.model must be a non-empty string, got ''"),
    ({"model": None}, "RunSpec.model must be a non-empty string, got None"),
    ({"bench": 3}, "RunSpec.bench must be a non-empty string, got 3"),
    ({"n": -1}, "RunSpec.n must be a non-negative int, got -1"),
    ({"n": True}, "RunSpec.n must be a non-negative int, got True"),
    ({"n": 2.0}, "RunSpec.n must be a non-negative int, got 2.0"),
    ({"seed": "0"}, "RunSpec.seed must be a non-negative int, got '0'"),
    ({"seed": -5}, "RunSpec.seed must be a non-negative int, got -5"),
    ({"methods": ("magnitude", 3)}, "RunSpec.methods must be strings, got ('magnitude', 3)"),
    ({"ckpt": "ab" * 32}, "RunSpec.ckpt must be an object or null, got str"),
    ({"protocol": [1]}, "RunSpec.protocol must be an object or null, got list"),
    ({"method_versions": {"magnitude": object()}}, "RunSpec.method_versions must be JSON-serialisable"),
    ({"requested": {"x": math.inf}}, "RunSpec.requested must be JSON-serialisable"),
    ({"protocol": {"x": math.nan}}, "RunSpec.protocol must be JSON-serialisable"),
    ({"sampling": {"cfg": math.nan}}, "RunSpec.sampling must be JSON-serialisable (finite numbers)"),
    ({"sampling": {"cfg": object()}}, "RunSpec.sampling must be JSON-serialisable (finite numbers)"),
])
def test_a_run_spec_refuses_what_cannot_be_keyed(change, message):
    with pytest.raises(ValueError) as e:
        spec(**change)
    assert str(e.value) == message


def test_a_run_spec_stores_normalised_copies():
    assert spec(n=0, seed=0).n == 0                                      # the bounds are inclusive
    s = spec(methods=["magnitude: sparsity=0.40"], sampling=None)
    assert s.methods == ("magnitude:sparsity=0.4",) and s.sampling == {}
    protocol, sampling = {"b": (1, 2), "a": {"y": 1, "x": 2}}, {"cfg": 1.5}
    s = spec(protocol=protocol, sampling=sampling, ckpt={"w.bin": "cd" * 32}, requested={"methods": ("m",)})
    assert s.protocol == {"a": {"x": 2, "y": 1}, "b": [1, 2]} and list(s.protocol) == ["a", "b"]
    assert s.requested == {"methods": ["m"]}
    protocol["a"]["x"], sampling["cfg"] = 99, 9.0                      # later edits of the inputs change nothing
    assert s.protocol["a"]["x"] == 2 and s.sampling == {"cfg": 1.5}
    assert spec(protocol={"b": (1, 2), "a": {"x": 2, "y": 1}}).key() == spec(protocol={"a": {"y": 1, "x": 2}, "b": [1, 2]}).key()


def test_keys_of_non_ascii_settings_are_pinned():
    # ASCII-escaped canonical JSON: a key must not depend on how a platform writes text
    assert spec(protocol={"prompts": "café ☕"}).key() == PINNED_NON_ASCII


PINNED_NON_ASCII = "5fffcb1a385f52ee"


# --- records ------------------------------------------------------------------------------------------

def test_metrics_are_filled_in_and_must_be_finite_numbers():
    r = make_record(spec(), {"fid": {"value": 2.0, "stderr": 0.5}, "is": 3, "kid": {"value": 0.1, "n": 7}},
                    {"params": 1}, {}, notes=[5])
    assert r["metrics"] == {"fid": {"value": 2.0, "stderr": 0.5, "n": 24}, "is": {"value": 3, "stderr": None, "n": 24},
                            "kid": {"value": 0.1, "stderr": None, "n": 7}}
    assert r["notes"] == ["5"] and r["schema"] == SCHEMA_VERSION and r["run_id"] == spec().key()
    for bad in (math.nan, math.inf, None, "1.0", True):
        with pytest.raises(ValueError) as e:
            make_record(spec(), {"fid": bad}, {}, {})
        assert str(e.value) == f"metric 'fid': value must be a finite number, got {bad!r}"
    with pytest.raises(RecordError, match=r"^record: cost.flops is nan: records hold finite numbers only"):
        make_record(spec(), {"fid": 1.0}, {"flops": math.nan}, {})        # the record is checked before it is returned
    with pytest.raises(RecordError, match=r"^record: timings.per_scale\[1\] is inf"):
        make_record(spec(), {}, {}, {"per_scale": [1.0, math.inf]})


def broken(edit):
    r = good_record()
    edit(r)
    return r


@pytest.mark.parametrize("edit, message", [
    (lambda r: r.pop("notes"), "missing keys ['notes']"),
    (lambda r: [r.pop("env"), r.pop("created")], "missing keys ['env', 'created']"),
    (lambda r: r.update(schema=1), f"schema 1, expected {SCHEMA_VERSION}"),
    (lambda r: r.update(spec=[]), "'spec' must be an object, got list"),
    (lambda r: r.update(metrics=None), "'metrics' must be an object, got NoneType"),
    (lambda r: r.update(cost=3), "'cost' must be an object, got int"),
    (lambda r: r.update(env="x"), "'env' must be an object, got str"),
    (lambda r: r.update(timings=[]), "'timings' must be an object, got list"),
    (lambda r: r.update(notes="a"), "'notes' must be a list of strings"),
    (lambda r: r.update(notes=["a", 1]), "'notes' must be a list of strings"),
    (lambda r: r["spec"].pop("seed"), "bad spec: bad run spec: missing ['seed'], unknown []"),
    (lambda r: r["spec"].update(n=-1), "bad spec: RunSpec.n must be a non-negative int, got -1"),
    (lambda r: r.update(run_id="0" * 16), f"run_id '{'0' * 16}' does not match its spec (key '{spec().key()}')"),
    (lambda r: r["metrics"].update(fid=1.0), "metric 'fid' must be an object with a 'value'"),
    (lambda r: r["metrics"].update(fid={"stderr": 1.0}), "metric 'fid' must be an object with a 'value'"),
    (lambda r: r["metrics"]["fid"].update(value="1"), "metric 'fid': value must be a finite number or null, got '1'"),
    (lambda r: r["metrics"]["fid"].update(stderr=math.nan), "metrics.fid.stderr is nan: records hold finite numbers"),
    (lambda r: r["cost"].update(flops=[1.0, -math.inf]), "cost.flops[1] is -inf: records hold finite numbers"),
    (lambda r: r["env"].update(git_commit=""), "env.git_commit must be a commit hash or \"unknown\", got ''"),
    (lambda r: r["env"].pop("git_commit"), "env.git_commit must be a commit hash or \"unknown\", got None"),
    (lambda r: r.update(created="yesterday"), "'created' must be an ISO 8601 time with its UTC offset "
                                              "(e.g. \"2026-05-09T07:35:25+00:00\"), got 'yesterday'"),
    (lambda r: r.update(created="2026-05-09T07:35:25"), "'created' must be an ISO 8601 time with its UTC offset"),
    (lambda r: r.update(created=1746775000), "'created' must be an ISO 8601 time with its UTC offset"),
])
def test_a_record_that_cannot_be_used_says_why(edit, message):
    r = broken(edit)
    with pytest.raises(RecordError) as e:
        validate_record(r, where="results/x.json")
    assert str(e.value).startswith(f"results/x.json: {message}"), str(e.value)


def test_what_a_valid_record_may_hold():
    validate_record(good_record())
    validate_record(broken(lambda r: r["metrics"]["fid"].update(value=None)))      # a metric left empty
    validate_record(broken(lambda r: r["env"].update(git_commit="unknown")))
    for bad in ([], "x", None):
        with pytest.raises(RecordError) as e:
            validate_record(bad)
        assert str(e.value) == f"record: expected a JSON object, got {type(bad).__name__}"


# --- sampling settings and seeds -----------------------------------------------------------------------

def test_sampling_settings_are_typed_and_their_bounds_inclusive():
    out = D.check_sampling({"cfg": 2, "top_k": 3.0, "top_p": 0, "more_smooth": True, "tau": 1e-3})
    assert out == {"cfg": 2.0, "top_k": 3, "top_p": 0.0, "more_smooth": True, "tau": 1e-3}
    assert [type(out[k]) for k in ("cfg", "top_k", "top_p")] == [float, int, float]
    assert D.check_sampling({"cfg": None}) == {"cfg": None}                 # no guidance
    assert D.check_sampling({"cfg": 100.0, "top_k": 1_000_000, "top_p": 1.0, "tau": 100.0})["top_k"] == 1_000_000
    assert D.check_sampling({}) == {}


@pytest.mark.parametrize("sampling, message", [
    ({"temp": 1.0}, "sampling: unknown sampling setting 'temp'; known: cfg, top_k, top_p, more_smooth, tau"),
    ({"more_smooth": "yes"}, "--more-smooth must be true or false, got 'yes'"),
    ({"more_smooth": 1}, "--more-smooth must be true or false, got 1"),
    ({"top_k": 2.5}, "--top-k must be a finite int in [0, 1000000], got 2.5"),
    ({"top_k": True}, "--top-k must be a finite int in [0, 1000000], got True"),
    ({"cfg": "2"}, "--cfg must be a finite float in [0.0, 100.0], got '2'"),
    ({"cfg": math.inf}, "--cfg must be a finite float in [0.0, 100.0], got inf"),
    ({"top_p": math.nan}, "--top-p must be a finite float in [0.0, 1.0], got nan"),
    ({"tau": None}, "--tau must be a finite float in [0.001, 100.0], got None"),
    ({"cfg": 100.5}, "--cfg 100.5 is out of range [0.0, 100.0]"),
    ({"cfg": -0.5}, "--cfg -0.5 is out of range [0.0, 100.0]"),
    ({"top_k": -1}, "--top-k -1 is out of range [0, 1000000]"),
    ({"top_k": 1_000_001}, "--top-k 1000001 is out of range [0, 1000000]"),
    ({"tau": 0.0}, "--tau 0.0 is out of range [0.001, 100.0]"),
])
def test_bad_sampling_settings_name_the_flag_and_its_range(sampling, message):
    with pytest.raises(ValueError) as e:
        D.check_sampling(sampling)
    assert str(e.value) == message


def test_a_model_refuses_settings_its_sampler_does_not_take():
    var = {"cfg": 1.5, "top_k": 900, "top_p": 0.96, "more_smooth": False}
    assert D.model_sampling(var, {"cfg": 3}) == {**var, "cfg": 3.0}
    assert D.model_sampling(var, {}) == var
    with pytest.raises(ValueError) as e:
        D.model_sampling(var, {"tau": 0.5, "top_k": 5, "cfg": 2.0}, model="var-d16")
    assert str(e.value) == "--tau: not a sampling setting of var-d16 (it takes cfg, top_k, top_p, more_smooth)"
    with pytest.raises(ValueError) as e:
        D.model_sampling({"cfg": 4.5}, {"top_k": 5, "more_smooth": True})
    assert str(e.value) == "--top-k, --more-smooth: not a sampling setting of the model (it takes cfg)"
    with pytest.raises(ValueError, match=r"^--cfg 200 is out of range"):            # overrides are checked too
        D.model_sampling(var, {"cfg": 200})


def test_seeds():
    assert D.check_seed(0) == 0 and D.check_seed(2 ** 32 - 1) == 2 ** 32 - 1
    for bad in (-1, 2 ** 32, True, 1.0, "3", None):
        with pytest.raises(ValueError) as e:
            D.check_seed(bad)
        assert str(e.value) == f"--seed must be an integer in [0, 4294967295] (2^32 - 1), got {bad!r}"


# --- schema migration, files and lookup ----------------------------------------------------------------

def schema_1(**spec_kw):
    """A record as schema 1 wrote it: the chain as typed, sampling overrides, the transformer's sha256."""
    return {"schema": 1, "run_id": "0123456789abcdef",
            "spec": {"world": "tiny", "model": "tiny-var", "ckpt_sha256": "ef" * 32, "methods": ["magnitude:sparsity=.40"],
                     "bench": "shapes-c2i", "n": 24, "seed": 3, "sampling": {"cfg": 2.5}, **spec_kw},
            "metrics": {"fid": {"value": 1.0, "stderr": None, "n": 24}}, "cost": {}, "env": {"git_commit": "unknown"},
            "timings": {}, "created": "2025-01-01T00:00:00+00:00"}


def test_schema_1_records_keep_their_settings_and_name_their_checkpoint():
    from bench.records import upgrade_record
    rec = upgrade_record(schema_1())
    assert rec["schema"] == SCHEMA_VERSION == 2
    assert rec["spec"] == {"world": "tiny", "model": "tiny-var", "ckpt": None, "methods": ["magnitude:sparsity=0.4"],
                           "method_versions": None, "bench": "shapes-c2i", "protocol": None, "n": 24, "seed": 3,
                           "sampling": {"cfg": 2.5}, "requested": {"methods": ["magnitude:sparsity=0.4"], "sampling": {}}}
    assert rec["run_id"] == RunSpec.from_dict(rec["spec"]).key()
    assert rec["notes"] == [f"legacy record: transformer checkpoint sha256 {'ef' * 32}"]   # schema 1 had no notes
    validate_record(rec)
    old = schema_1()
    old["notes"] = ["kept"]
    assert upgrade_record(old)["notes"] == ["kept", f"legacy record: transformer checkpoint sha256 {'ef' * 32}"]
    old = schema_1(ckpt_sha256=None, sampling=None)
    old["notes"] = ["kept"]
    rec = upgrade_record(old)
    assert rec["notes"] == ["kept"] and rec["spec"]["sampling"] == {}
    del old["spec"]["sampling"]
    assert upgrade_record(old)["spec"]["sampling"] == {}


@pytest.mark.parametrize("version, message", [
    (0, "r.json: no valid 'schema' version (got 0); not a varbench record?"),
    ("2", "r.json: no valid 'schema' version (got '2'); not a varbench record?"),
    (True, "r.json: no valid 'schema' version (got True); not a varbench record?"),
    (None, "r.json: no valid 'schema' version (got None); not a varbench record?"),
    (SCHEMA_VERSION + 1, f"r.json: schema version {SCHEMA_VERSION + 1} is newer than this varbench reads "
                         f"(up to {SCHEMA_VERSION}); upgrade varbench to read it"),
])
def test_schema_versions_that_cannot_be_read(version, message):
    from bench.records import upgrade_record
    rec = schema_1()
    rec["schema"] = version
    with pytest.raises(RecordError) as e:
        upgrade_record(rec, where="r.json")
    assert str(e.value) == message
    with pytest.raises(RecordError) as e:
        upgrade_record([rec], where="r.json")
    assert str(e.value) == "r.json: expected a JSON object, got list"


def test_migrations_run_in_sequence(monkeypatch):
    import bench.records as R
    calls = []
    monkeypatch.setattr(R, "SCHEMA_VERSION", 4)
    monkeypatch.setattr(R, "MIGRATIONS", {1: lambda r: calls.append(1) or {**r, "a": 1},
                                          2: lambda r: calls.append(2) or {**r, "b": r["a"] + 1}})
    with pytest.raises(RecordError) as e:
        R.upgrade_record({"schema": 1}, where="r.json")
    assert str(e.value) == "r.json: no migration from schema version 3 to 4" and calls == [1, 2]
    monkeypatch.setitem(R.MIGRATIONS, 3, lambda r: {**r, "c": r["b"] + 1})
    assert R.upgrade_record({"schema": 2, "a": 5}) == {"schema": 4, "a": 5, "b": 6, "c": 7}


def test_unreadable_record_files_say_what_to_do(tmp_path):
    from bench.records import read_record
    p = tmp_path / "r.json"
    p.write_bytes(b'{"schema": 2,')
    with pytest.raises(RecordError) as e:
        read_record(str(p))                                           # a str path works like a Path
    assert str(e.value).startswith(f"{p}: corrupt JSON (") and str(e.value).endswith("); delete the file to rerun the run")
    p.write_bytes(b'{"schema": "\xff\xfe"}')
    with pytest.raises(RecordError) as e:
        read_record(str(p))
    assert str(e.value).startswith(f"{p}: not UTF-8 text (") and str(e.value).endswith("); delete the file to rerun the run")
    rec = good_record()
    p.write_text(__import__("json").dumps(rec))
    assert read_record(str(p)) == rec


def test_a_record_filed_under_another_run_is_an_error(tmp_path):
    from bench.records import find_record, write_record
    s, other = spec(), spec(seed=1)
    write_record(s.path(tmp_path), make_record(other, {"fid": 1.0}, {}, {}))
    with pytest.raises(RecordError) as e:
        find_record(s, str(tmp_path))
    assert str(e.value) == f"{s.path(tmp_path)}: holds run {other.key()}, not {s.key()} ({s.label()})"
    assert find_record(spec(seed=2), tmp_path) is None


def test_a_copied_or_moved_record_is_not_counted(tmp_path):
    """A record is listed only at its spec's path: a copy beside it (`cp X.json "X copy.json"`) or a file
    moved under another model would count the run twice or somewhere else."""
    import shutil

    from bench.records import iter_records, load_records, write_record
    s = spec()
    home = s.path(tmp_path)
    write_record(home, make_record(s, {"fid": 1.0}, {}, {}))
    copy = home.with_name(f"{s.key()} copy.json")
    moved = tmp_path / "tiny" / "tiny-t2i" / "shapes-c2i" / f"{s.key()}.json"
    moved.parent.mkdir(parents=True)
    for p in (copy, moved):
        shutil.copy(home, p)
    seen = []
    assert [p for p, _ in iter_records(tmp_path, on_error=lambda p, e: seen.append((p, str(e))))] == [home]
    assert sorted(seen) == sorted((p, f"{p}: holds run {s.key()} ({s.label()}), whose record is {home}: a copied or "
                                      f"moved file? delete it") for p in (copy, moved))
    home.unlink()
    assert load_records(tmp_path, on_error=lambda p, e: None) == {}
    with pytest.raises(RecordError, match="a copied or moved file[?] delete it or move it there$"):
        load_records(tmp_path)


def test_record_listing_skips_hidden_files_and_underscore_folders(tmp_path):
    from bench.records import iter_records, load_records, record_paths, write_record
    a, b = spec(), spec(world="paper", model="var-d16", bench="imagenet256")
    for s in (a, b):
        write_record(s.path(tmp_path), make_record(s, {"fid": 1.0}, {}, {}))
    leftovers = [tmp_path / "tiny" / "tiny-var" / "shapes-c2i" / ".tmp-r.json", tmp_path / "_accounting" / "tiny" / "m" / "k.json",
                 tmp_path / "tiny" / "_old" / "shapes-c2i" / "x.json", tmp_path / "tiny" / "tiny-var" / "x.json"]
    for p in leftovers:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("{")
    assert record_paths(str(tmp_path)) == sorted([a.path(tmp_path), b.path(tmp_path)])
    assert record_paths(tmp_path, "tiny") == [a.path(tmp_path)]
    assert set(load_records(tmp_path)) == {a.key(), b.key()} and list(load_records(tmp_path, "paper")) == [b.key()]
    bad = a.path(tmp_path).parent / "bad.json"
    bad.write_text("[]")
    seen = []
    assert [p for p, _ in iter_records(tmp_path, "tiny", on_error=lambda p, e: seen.append((p, str(e))))] == [a.path(tmp_path)]
    assert seen == [(bad, f"{bad}: expected a JSON object, got list")]
    with pytest.raises(RecordError, match="expected a JSON object, got list"):
        list(iter_records(tmp_path, "tiny"))


def test_accounting_keys_cover_what_weight_free_figures_depend_on(tmp_path):
    from bench.records import accounting_key, load_accounting, write_accounting
    s = spec(method_versions={"magnitude": 1}, sampling={"cfg": 1.5})
    assert accounting_key(s) == PINNED_ACCOUNTING_KEY                  # a changed key orphans every accounting record
    same = spec(method_versions={"magnitude": 1}, sampling={"cfg": 1.5}, bench="shapes-mjhq", n=12, seed=4,
                ckpt={"x": "y"}, protocol={"p": 1}, requested={"methods": ["m"]})
    assert accounting_key(same) == accounting_key(s)                   # no bench, n, seed, checkpoint or request
    for other in (spec(world="paper", method_versions={"magnitude": 1}, sampling={"cfg": 1.5}),
                  spec(model="tiny-t2i", method_versions={"magnitude": 1}, sampling={"cfg": 1.5}),
                  spec(methods=("magnitude:sparsity=0.2",), method_versions={"magnitude": 1}, sampling={"cfg": 1.5}),
                  spec(method_versions={"magnitude": 2}, sampling={"cfg": 1.5}),
                  spec(method_versions={"magnitude": 1}, sampling={"cfg": 2.0})):
        assert accounting_key(other) != accounting_key(s)
    t = spec(world="paper", model="var-d16", bench="imagenet256", method_versions={"magnitude": 1})
    write_accounting(tmp_path, s, {"params": 1})
    write_accounting(tmp_path, t, {"params": 2})
    assert sorted(load_accounting(tmp_path)) == sorted([accounting_key(s), accounting_key(t)])   # every world
    assert list(load_accounting(tmp_path, "paper")) == [accounting_key(t)]
    moved = tmp_path / "_accounting" / "tiny" / "tiny-var" / "0000000000000000.json"        # key ≠ file name
    moved.write_bytes((tmp_path / "_accounting" / "tiny" / "tiny-var" / f"{accounting_key(s)}.json").read_bytes())
    (tmp_path / "_accounting" / "tiny" / "tiny-var" / "0.json").write_text("{")      # sorted first
    (tmp_path / "_accounting" / "tiny" / "tiny-var" / "x.json").write_text('{"kind": "run", "key": "x", "cost": {}}')
    assert list(load_accounting(tmp_path, "tiny")) == [accounting_key(s)]


PINNED_ACCOUNTING_KEY = "8001961b445034ac"
