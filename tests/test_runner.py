"""End to end on the shipped tiny world: a run writes one record, a rerun reuses it, a changed method
makes it stale, tables render from records."""
import copy
import dataclasses
import json
import time

import pytest
import torch

from bench.cli import main
from bench.plan import make_spec, staleness
from bench.records import read_record
from bench.registry import METHODS
from bench.runner import run
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
    assert dense["metrics"]["class_acc"]["value"] >= 0.9        # the shipped model draws its classes
    assert rec["cost"]["params"] < dense["cost"]["params"] and rec["cost"]["flops"] < dense["cost"]["flops"]
    assert any(n.startswith("magnitude:") for n in rec["notes"])
    t = time.perf_counter()
    again = run(spec, root=tmp_path, progress=False)
    assert again == rec and time.perf_counter() - t < 2.0


def test_same_seed_same_metrics_other_seed_other_metrics(tmp_path):
    a = run(make_spec("tiny-var", [], n=12, seed=3), root=tmp_path / "a", progress=False)
    b = run(make_spec("tiny-var", [], n=12, seed=3), root=tmp_path / "b", progress=False)
    c = run(make_spec("tiny-var", [], n=12, seed=4), root=tmp_path / "c", progress=False)
    assert a["metrics"] == b["metrics"]
    assert a["metrics"]["fid"]["value"] != c["metrics"]["fid"]["value"]


def test_defaults_spelled_out_or_omitted_hash_equal():
    a = make_spec("tiny-var", "magnitude", n=24)
    b = make_spec("tiny-var", "magnitude:sparsity=0.40,norm=l2,scope=coupled", n=24)
    c = make_spec("tiny-var", ["magnitude:scope=coupled"], n=24, sampling={"cfg": 2.0})   # the tiny default cfg
    assert a.key() == b.key() == c.key() and a.requested != b.requested
    assert make_spec("tiny-var", "magnitude:sparsity=0.2", n=24).key() != a.key()
    assert make_spec("tiny-var", "dense", n=24).key() == make_spec("tiny-var", [], n=24).key()


@pytest.fixture
def magnitude_meta(monkeypatch):
    """Edit magnitude's YAML declaration in memory (as a changed methods/magnitude.yaml would)."""
    meta = copy.deepcopy(METHODS.meta("magnitude"))
    monkeypatch.setitem(METHODS._meta, "magnitude", meta)
    return meta


@pytest.mark.parametrize("change", ["version", "default"])
def test_a_changed_method_makes_its_record_stale_and_reruns(tmp_path, magnitude_meta, change, capsys):
    spec = make_spec("tiny-var", ["magnitude:sparsity=0.4"], n=12)
    old = run(spec, root=tmp_path, progress=False)
    assert not staleness(old).stale
    if change == "version":
        magnitude_meta["version"] = 2
    else:
        magnitude_meta["params"]["norm"]["default"] = "l1"
    st = staleness(old)
    assert st.stale and ("magnitude v1→v2" in st.reason if change == "version" else "norm=l1" in st.reason)
    new_spec = make_spec("tiny-var", ["magnitude:sparsity=0.4"], n=12)
    assert new_spec.key() != spec.key()
    # `varbench runs --stale` lists it; `table --no-run` does not show it and says why
    assert main(["runs", "--stale", "--results", str(tmp_path)]) == 0
    assert old["run_id"] in capsys.readouterr().out
    new = run(new_spec, root=tmp_path, progress=False)
    assert new["run_id"] == new_spec.key() != old["run_id"]
    assert not staleness(new).stale
    assert main(["runs", "--prune-stale", "--yes", "--results", str(tmp_path)]) == 0
    assert not spec.path(tmp_path).exists() and new_spec.path(tmp_path).exists()


def test_an_altered_checkpoint_is_refused(tmp_path, monkeypatch):
    import shutil
    for f in ASSETS.iterdir():
        shutil.copy(f, tmp_path / f.name)
    monkeypatch.setenv("VARBENCH_TINY_DIR", str(tmp_path))
    make_spec("tiny-var", [], n=12)     # an identical copy is fine
    with open(tmp_path / "tiny_var.safetensors", "r+b") as fh:
        fh.seek(-4, 2)
        fh.write(b"\x00\x01\x02\x03")
    from bench.checkpoint import CheckpointError
    with pytest.raises(CheckpointError, match="does not match .*manifest"):
        make_spec("tiny-var", [], n=12)
    assert main(["run", "--model", "tiny-var", "--n", "12", "--results", str(tmp_path / "r")]) == 2


def test_world_mismatch_is_an_error():
    with pytest.raises(ValueError, match="world mismatch"):
        make_spec("tiny-var", [], bench="imagenet256")


def test_table_command_renders_records_and_says_why_rows_are_empty(tmp_path, capsys):
    dense = run(make_spec("tiny-var", [], n=24), root=tmp_path / "r", progress=False)
    assert main(["table", "evar-table2", "--n", "24", "--results", str(tmp_path / "r"), "--out",
                 str(tmp_path / "out"), "--quiet", "--no-run"]) == 0
    cap = capsys.readouterr()
    md = cap.out
    assert "180.82" in md and "Magnitude" in md            # paper numbers beside ours
    # every missing run is named on stderr (here: all but the dense one)
    assert "varbench: no record for tiny-var slimgpt:sparsity=0.4 @ shapes-c2i n=24 s0" in cap.err
    assert "no record for tiny-var dense" not in cap.err
    js = json.loads((tmp_path / "out" / "tiny" / "evar-table2.json").read_text())
    dense_row = next(r for r in js["rows"] if r["label"] == "Dense")
    assert dense_row["cells"]["tf40_fid"]["ours"] == dense["metrics"]["fid"]["value"]
    assert dense_row["cells"]["tf40_fid"]["run_id"] == dense["run_id"]
    assert (tmp_path / "out" / "tiny" / "evar-table2.tex").is_file()
    # --format json prints JSON (and writes only the .json)
    assert main(["table", "evar-table2", "--n", "24", "--results", str(tmp_path / "r"), "--out",
                 str(tmp_path / "out2"), "--no-run", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["table"] == "evar-table2"
    assert [p.name for p in (tmp_path / "out2" / "tiny").iterdir()] == ["evar-table2.json"]


def test_unknown_table_name(capsys):
    assert main(["table", "evar-tabel2", "--no-run"]) == 2
    assert "did you mean 'evar-table2'" in capsys.readouterr().err


def test_bench_data_is_tokenised_once_per_process_and_key():
    """A table's runs share the tokenised training split (cached by model, checkpoint, bench, n, split)."""
    from bench import runner

    class Counting:
        calls = 0

        def data(self, n, split, vae):
            Counting.calls += 1
            return torch.arange(n), [torch.full((n, 1), Counting.calls)]

    runner._DATA_CACHE.clear()
    spec = make_spec("tiny-var", [], n=24)
    b = Counting()
    first = runner.cached_data(spec, b, None, 8, "train")
    assert runner.cached_data(spec, b, None, 8, "train") is first and Counting.calls == 1
    runner.cached_data(spec, b, None, 8, "calib")
    runner.cached_data(spec, b, None, 16, "train")
    other = make_spec("tiny-var", [], n=24, seed=1)      # the seed does not change the data
    assert runner.cached_data(other, b, None, 8, "train") is first and Counting.calls == 3
    # the checkpoint files do
    retrained = dataclasses.replace(spec, ckpt={**spec.ckpt, "tiny_var.safetensors": "0" * 64})
    assert runner.cached_data(retrained, b, None, 8, "train") is not first and Counting.calls == 4
    for n in range(20, 20 + runner._DATA_CACHE_SIZE + 1):  # bounded
        runner.cached_data(spec, b, None, n, "train")
    assert len(runner._DATA_CACHE) == runner._DATA_CACHE_SIZE
    runner._DATA_CACHE.clear()


def test_sample_features_streams_chunks_across_batches_in_order():
    """Rows of chunks that straddle sampling batches equal the features of all images at once; a batch
    the cache holds is read, not sampled; the chunk hook sees every image once, at its index."""
    from bench.benches.base import Bench
    from bench.runner import sample, sample_features

    class Gen:
        def __init__(self):
            self.seeds = []

        def generate(self, labels, seed=0):
            self.seeds.append(seed)
            v = torch.tensor([int(x) * 7 + seed % 5 for x in labels], dtype=torch.uint8)
            return v.view(-1, 1, 1, 1).expand(-1, 3, 2, 2).contiguous()

    class B(Bench):
        batch_size, feature_chunk = 3, 4

        def features(self, imgs, progress=False):
            return {"features": imgs.float().mean((1, 2, 3))[:, None], "twice": 2 * imgs[:, 0, 0, 0].float()}

    labels = torch.arange(10)
    everything = B().features(sample(Gen(), B(), labels, 1, {}, progress=False))
    gen, seen = Gen(), []
    cached_batch = torch.full((3, 3, 2, 2), 200, dtype=torch.uint8)
    rows, extra, times = sample_features(
        gen, B(), labels, 1, {}, progress=False,
        cached=lambda lo, hi: cached_batch if lo == 3 else None,
        on_chunk=lambda lo, imgs: seen.append((lo, len(imgs))) or {"lo": torch.full((len(imgs),), lo)})
    assert gen.seeds == [B.batch_seed(1, b) for b in (0, 2, 3)]          # batch 1 came from the cache
    assert seen == [(0, 4), (4, 4), (8, 2)]
    assert extra["lo"].tolist() == [0] * 4 + [4] * 4 + [8] * 2
    want = everything["features"].clone()
    want[3:6] = 200.0
    assert torch.equal(rows["features"], want) and rows["twice"].shape == (10,)
    assert set(times) == {"sample_s", "features_s"}
