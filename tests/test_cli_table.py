"""`varbench table` as a command: the order of its work (every cell's preflight before the first run,
latency cells timed together per setting, Core ML cells skipped off macOS), the flags it passes on,
its progress lines and refusals, and which rendering it prints. The runs are faked here; the
runner's and renderer's own tests check what they produce."""
import dataclasses
import json

import pytest

from bench.plan import table_cells, unique_specs
from bench.render import load_spec
from tests.conftest import cli as _out


@pytest.fixture
def fake_runs(monkeypatch):
    import bench.latency
    import bench.runner
    calls = []
    monkeypatch.setattr(bench.runner, "preflight", lambda spec, root: calls.append(("preflight", spec.label(), root)))
    monkeypatch.setattr(bench.runner, "run", lambda spec, **kw: calls.append(("run", spec.label(), kw)))
    monkeypatch.setattr(bench.runner, "account", lambda spec, root: calls.append(("account", spec.label(), root)))
    monkeypatch.setattr(bench.latency, "run_latency",
                        lambda specs, **kw: calls.append(("latency", [s.label() for s in specs], kw)))
    return calls


def test_table_preflights_every_cell_then_runs_and_times_the_latency_cells_together(tmp_path, capsys, fake_runs):
    root, out = tmp_path / "r", tmp_path / "o"
    r = _out(capsys, ["table", "stepvar-table1", "--results", str(root), "--out", str(out), "--n", "12", "--seed", "2",
                      "--force", "--top-k", "7"])
    runs = unique_specs(table_cells(load_spec("stepvar-table1"), "tiny", n=12, seed=2, sampling={"top_k": 7},
                                    need_ckpt=False))
    labels = [s.label() for s in runs]
    quality = [s.label() for s in runs if s.bench != "latency"]
    timed = [s.label() for s in runs if s.bench == "latency"]
    assert quality and timed and all(s.sampling["top_k"] == 7 and s.seed == 2 for s in runs)
    assert fake_runs[:len(runs)] == [("preflight", x, root) for x in labels]        # all checks before any work
    kw = dict(root=root, force=True, ckpt_dir=None, progress=True, device="cpu")
    assert fake_runs[len(runs):] == [("run", x, kw) for x in quality] + [
        ("latency", timed, dict(root=root, ckpt_dir=None, force=True, progress=True))]
    err = r.err.splitlines()
    for i, x in enumerate(labels):
        assert f"[stepvar-table1 {i + 1}/{len(runs)}] {x}" in err
    assert err.count("  timed below, alternated with the table's other configurations of this setting") == len(timed)
    assert f"[stepvar-table1] latency of {len(timed)} configurations of tiny-var, timed together" in err
    assert r.out == (out / "tiny" / "stepvar-table1.md").read_text(encoding="utf-8") + "\n"


def test_weight_free_accounts_for_every_cell_and_runs_nothing(tmp_path, capsys, fake_runs):
    root = tmp_path / "r"
    r = _out(capsys, ["table", "evar-table5", "--weight-free", "--results", str(root), "--out", str(tmp_path / "o")])
    runs = unique_specs(table_cells(load_spec("evar-table5"), "tiny", need_ckpt=False))
    assert fake_runs == [("account", s.label(), root) for s in runs]
    assert r.err.splitlines() == [f"[evar-table5 {i + 1}/{len(runs)}] weight-free accounting of {s.label()}"
                                  for i, s in enumerate(runs)]


def test_core_ml_cells_are_skipped_off_macos(tmp_path, capsys, fake_runs, monkeypatch):
    import platform
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    r = _out(capsys, ["table", "evar-table5", "--results", str(tmp_path / "r"), "--out", str(tmp_path / "o")])
    assert [c[0] for c in fake_runs] == ["preflight"] * 3
    assert r.err.count("  not run: Core ML latency and op placement need macOS (this is Linux); `--weight-free` fills "
                       "the package op counts") == 3
    fake_runs.clear()
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    _out(capsys, ["table", "evar-table5", "--results", str(tmp_path / "r"), "--out", str(tmp_path / "o")])
    assert [c[0] for c in fake_runs] == ["preflight"] * 3 + ["latency"] * 3      # one setting per compute unit


def test_no_run_names_each_missing_record_and_points_at_stale_ones(tmp_path, capsys, fake_runs):
    from bench.records import make_record, write_record
    root = tmp_path / "r"
    runs = unique_specs(table_cells(load_spec("evar-table2"), "tiny", n=24, need_ckpt=False))
    slim = next(s for s in runs if s.methods and s.methods[0].startswith("slimgpt"))
    old = dataclasses.replace(slim, method_versions={**slim.method_versions, "slimgpt": 0})
    write_record(old.path(root), make_record(old, {"fid": 1.0}, {}, {}))
    r = _out(capsys, ["table", "evar-table2", "--n", "24", "--no-run", "--results", str(root), "--out",
                      str(tmp_path / "o"), "--format", "tex"])
    assert not fake_runs
    err = r.err.splitlines()
    assert f"varbench: no record for {slim.label()} (stale records exist: `varbench runs --stale`)" in err
    assert len([e for e in err if e.startswith("varbench: no record for ")]) == len(runs)
    assert r.out == (tmp_path / "o" / "tiny" / "evar-table2.tex").read_text(encoding="utf-8") + "\n"
    r = _out(capsys, ["table", "evar-table2", "--n", "24", "--no-run", "--results", str(root), "--out",
                      str(tmp_path / "o"), "--format", "tex,md"])
    assert r.out == (tmp_path / "o" / "tiny" / "evar-table2.md").read_text(encoding="utf-8") + "\n"


def test_table_refusals_come_before_any_work(tmp_path, capsys, fake_runs):
    (tmp_path / "file").write_text("")
    for argv, msg in (
            (["--results", str(tmp_path / "file")], f"--results {tmp_path / 'file'} is a file, not a folder of records"),
            (["--no-run", "--results", str(tmp_path / "none")],
             f"no records: results folder {(tmp_path / 'none').resolve()} does not exist (run without --no-run, or "
             "point --results / VARBENCH_RESULTS at your records)"),
            (["--results", str(tmp_path), "--out", str(tmp_path / "file")],
             f"table output folder {tmp_path / 'file'}: {tmp_path / 'file'} is a file, not a folder"),
            (["--weight-free", "--no-run", "--results", str(tmp_path)],
             "--weight-free computes accounting records; it cannot be combined with --no-run")):
        r = _out(capsys, ["table", "evar-table2", "--out", str(tmp_path / "o"), *argv], rc=2)
        assert r.err.endswith(msg + "\n"), r.err
    assert not fake_runs
    r = _out(capsys, ["table", "all", "--no-run", "--results", str(tmp_path), "--out", str(tmp_path / "o"),
                      "--format", "json"])
    from bench.registry import TABLES
    assert sorted(p.stem for p in (tmp_path / "o" / "tiny").glob("*.json")) == sorted(TABLES.names())


def test_plans_need_no_checkpoints_and_runs_check_the_results_folder_first(tmp_path, capsys, fake_runs):
    (tmp_path / "file").write_text("")
    r = _out(capsys, ["table", "evar-table2", "--results", str(tmp_path / "file" / "sub"), "--out", str(tmp_path / "o")],
             rc=2)
    assert r.err == f"varbench: error: results folder {tmp_path / 'file' / 'sub'}: {tmp_path / 'file'} is a file, not a folder\n"
    assert not fake_runs
    # the paper world on a machine without its checkpoints: --no-run and --weight-free still render
    r = _out(capsys, ["table", "evar-table2", "--world", "paper", "--no-run", "--results", str(tmp_path), "--out",
                      str(tmp_path / "o"), "--format", "json"])
    assert r.out.startswith('{\n  "table": "evar-table2",\n') and "↓" in r.out      # indent 2, not ASCII-escaped
    assert json.loads(r.out)["world"] == "paper"
    _out(capsys, ["table", "evar-table2", "--world", "paper", "--weight-free", "--results", str(tmp_path), "--out",
                  str(tmp_path / "o")])
    assert fake_runs and {c[0] for c in fake_runs} == {"account"}
    fake_runs.clear()
    r = _out(capsys, ["table", "evar-table2", "--world", "paper", "--results", str(tmp_path), "--out", str(tmp_path / "o")],
             rc=2)                                                            # a run needs the checkpoint files
    assert "var_d16.pth" in r.err and not fake_runs

