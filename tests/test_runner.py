"""End to end on the shipped tiny world: a run writes one record, a rerun reuses it, tables render."""
import json
import time

import pytest

from bench.cli import main
from bench.records import read_record
from bench.runner import make_spec, run
from bench.tiny.assets import ASSETS

pytestmark = pytest.mark.skipif(not (ASSETS / "tiny_var.safetensors").is_file(),
                                reason="tiny-world checkpoints not built (make tiny-models)")


def test_run_writes_a_record_and_reuses_it(tmp_path):
    spec = make_spec("tiny-var", ["magnitude:sparsity=0.4"], n=24)
    rec = run(spec, root=tmp_path, progress=False)
    path = spec.path(tmp_path)
    assert path.is_file() and read_record(path)["run_id"] == rec["run_id"] == spec.key()
    assert {"fid", "is", "precision", "recall", "class_acc"} <= set(rec["metrics"])
    assert rec["metrics"]["fid"]["stderr"] is not None
    dense = run(make_spec("tiny-var", [], n=24), root=tmp_path, progress=False)
    assert rec["cost"]["params"] < dense["cost"]["params"] and rec["cost"]["flops"] < dense["cost"]["flops"]
    assert any(n.startswith("magnitude:") for n in rec["notes"])
    t = time.perf_counter()
    again = run(spec, root=tmp_path, progress=False)
    assert again == rec and time.perf_counter() - t < 2.0


def test_same_seed_same_metrics(tmp_path):
    a = run(make_spec("tiny-var", [], n=24, seed=3), root=tmp_path / "a", progress=False)
    b = run(make_spec("tiny-var", [], n=24, seed=3), root=tmp_path / "b", progress=False)
    assert a["metrics"] == b["metrics"]


def test_world_mismatch_is_an_error():
    with pytest.raises(ValueError, match="world mismatch"):
        make_spec("tiny-var", [], bench="imagenet256")


def test_table_command_renders_records_and_says_why_rows_are_empty(tmp_path, capsys):
    run(make_spec("tiny-var", [], n=24), root=tmp_path / "r", progress=False)
    assert main(["table", "evar-table2", "--n", "24", "--results", str(tmp_path / "r"), "--out",
                 str(tmp_path / "out"), "--quiet", "--no-run"]) == 0
    md = capsys.readouterr().out
    assert "180.82" in md and "Magnitude" in md            # paper numbers beside ours
    assert "not implemented in varbench yet" in md          # SlimGPT & co. until their issues land
    js = json.loads((tmp_path / "out" / "tiny" / "evar-table2.json").read_text())
    assert js and (tmp_path / "out" / "tiny" / "evar-table2.tex").is_file()


def test_unknown_table_name(capsys):
    assert main(["table", "evar-tabel2", "--no-run"]) == 2
    assert "did you mean 'evar-table2'" in capsys.readouterr().err
