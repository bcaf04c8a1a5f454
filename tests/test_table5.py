"""EVAR Table 5 (Core ML compute units): rows are latency-bench settings; on Linux nothing runs and
the cells stay empty with the reason; records made on a Mac fill them; --weight-free fills the
package op count."""
import json

import pytest

from bench.cli import main
from bench.plan import table_cells
from bench.records import make_record, write_record
from bench.render import load_spec
from bench.tiny.assets import ASSETS

pytestmark = pytest.mark.skipif(not (ASSETS / "tiny_var.safetensors").is_file(), reason="no tiny assets")


def _table(capsys, tmp_path, *extra):
    rc = main(["table", "evar-table5", "--results", str(tmp_path / "r"), "--out", str(tmp_path / "o"),
               "--format", "json", *extra])
    cap = capsys.readouterr()
    return rc, json.loads(cap.out), cap.err


def test_rows_are_compute_unit_settings_of_the_latency_bench():
    spec = load_spec("evar-table5")
    cells = table_cells(spec, "tiny")
    assert [c.spec.protocol["compute_units"] for c in cells] == ["CPU_AND_NE", "ALL", "CPU_AND_GPU"]
    assert all(c.spec.bench == "latency" and c.spec.protocol["device"] == "coreml" for c in cells)
    assert len({c.spec.key() for c in cells}) == 3 and all(c.spec.methods[0].startswith("evar:") for c in cells)


def test_on_linux_nothing_runs_and_cells_stay_empty(capsys, tmp_path, monkeypatch):
    import platform
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    # a CPU latency record of the same request (chain, reps) is another setting, not a stale Core ML record
    import dataclasses

    from bench.benches.latency import LatencyBench
    cpu = dataclasses.replace(table_cells(load_spec("evar-table5"), "tiny")[0].spec,
                              protocol=LatencyBench(device="cpu", threads=1).identity())
    write_record(cpu.path(tmp_path / "r"), make_record(cpu, {"latency_ms": 5.0}, {}, {}))
    rc, out, err = _table(capsys, tmp_path)
    assert rc == 0 and err.count("need macOS") == 3
    for row in out["rows"]:
        assert all(c["ours"] is None for c in row["cells"].values())
        assert row["cells"]["latency"]["paper"] in (1090, 494, 277)
    assert any("need macOS" in f for f in out["general_footnotes"])
    assert not any("stale" in f["text"] for f in out["footnotes"])


def test_records_from_a_mac_fill_the_cells(capsys, tmp_path):
    spec = load_spec("evar-table5")
    for i, c in enumerate(table_cells(spec, "tiny")):
        rec = make_record(c.spec, {"latency_ms": {"value": 100.0 + i, "iqr": 2.0}, "images_per_s": 10.0,
                                   "peak_mem_mb": 10.0},
                          {"ops_cpu": 10 * i, "ops_gpu": 5, "ops_npu": 7, "package_ops": 22}, {"total_s": 1.0})
        write_record(c.spec.path(tmp_path / "r"), rec)
    rc, out, _ = _table(capsys, tmp_path, "--no-run")
    assert rc == 0
    got = [(r["label"], r["cells"]["latency"]["ours"], r["cells"]["cpu"]["ours"], r["cells"]["pkg"]["ours"])
           for r in out["rows"]]
    assert got == [("CPU + NPU", 100.0, 0, 22), ("All (CPU + GPU + NPU)", 101.0, 10, 22), ("CPU + GPU", 102.0, 20, 22)]


@pytest.mark.slow
def test_weight_free_fills_the_package_op_count(capsys, tmp_path):
    rc, out, _ = _table(capsys, tmp_path, "--weight-free")
    assert rc == 0
    pkg = {r["cells"]["pkg"]["ours"] for r in out["rows"]}
    assert len(pkg) == 1 and pkg.pop() > 1000                    # one package, counted once for all three rows
    assert all(r["cells"]["latency"]["ours"] is None for r in out["rows"])
