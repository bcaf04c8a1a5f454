"""Sharded runs (bench/shard.py): the merged images (and feature rows) are the single-process run's,
bit for bit, for any number of ranks; an interrupted run resumes without making finished batches
or feature chunks again; and a real
2-rank torchrun (gloo, CPU) writes the record a 1-process run writes, metrics equal exactly."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from bench import shard
from bench.benches.shapes_c2i import ShapesC2I
from bench.plan import make_spec
from bench.records import read_record
from bench.registry import MODELS
from bench.runner import run, sample
from bench.tiny.assets import ASSETS

KEY = "0123456789abcdef"
SAMPLING = {"cfg": 2.0}


class CountingGen:
    """Stands in for a Generator: images a function of (seed, labels) only, every call counted."""

    def __init__(self):
        self.seeds = []

    def generate(self, labels, seed, **sampling):
        self.seeds.append(seed)
        g = torch.Generator().manual_seed(seed)
        noise = torch.randint(0, 256, (len(labels), 3, 4, 4), generator=g, dtype=torch.uint8)
        return noise + labels.to(torch.uint8).view(-1, 1, 1, 1)


def sharded(gen, bench, labels, seed, folder, world):
    """Every rank of a ``world``-rank launch in turn (the listing happens before any rank writes,
    as the barrier guarantees), then rank 0's merge."""
    total = shard.n_batches(len(labels), bench.batch_size)
    done = shard.finished(folder, KEY, total)
    for r in range(world):
        shard.generate(gen, bench, labels, seed, SAMPLING, folder, KEY, shard.assign(total, done, r, world))
    return shard.merge(folder, KEY, labels, bench, seed)


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_sharded_images_are_the_single_process_images(tmp_path, world):
    bench = ShapesC2I()
    labels = bench.labels(564)                       # 12 batches, the last one short (14 images)
    one = sample(CountingGen(), bench, labels, 7, SAMPLING, progress=False)
    gen = CountingGen()
    merged = sharded(gen, bench, labels, 7, tmp_path / "s", world)
    assert merged.dtype == torch.uint8 and torch.equal(merged, one)
    assert sorted(gen.seeds) == [bench.batch_seed(7, b) for b in range(12)]     # each batch made once


def test_a_fresh_run_deals_batches_round_robin():
    assert shard.assign(7, set(), 0, 3) == [0, 3, 6]
    assert shard.assign(7, set(), 2, 3) == [2, 5]
    assert shard.assign(7, {0, 3}, 0, 2) == [1, 4, 6]      # a resume deals what is missing


def test_an_interrupted_run_resumes_without_remaking_finished_batches(tmp_path):
    bench, folder = ShapesC2I(), tmp_path / "s"
    labels = bench.labels(564)
    one = sample(CountingGen(), bench, labels, 3, SAMPLING, progress=False)
    # the first launch (2 ranks) was killed: rank 1 finished its batches, rank 0 none; one file of
    # rank 0 was cut short mid-write (not atomic: e.g. copied), one belongs to another run
    shard.generate(CountingGen(), bench, labels, 3, SAMPLING, folder, KEY, shard.assign(12, set(), 1, 2))
    shard.batch_path(folder, 0).write_bytes(b"PK\x03\x04 truncated")
    shard.write_batch(folder, "fedcba9876543210", 2, bench.batch_size, labels[100:150], 0,
                      torch.zeros(50, 3, 4, 4, dtype=torch.uint8))
    kept = {b: os.stat(shard.batch_path(folder, b)) for b in (1, 3, 5, 7, 9, 11)}
    assert shard.finished(folder, KEY, 12) == set(kept)

    gen = CountingGen()                                # resumed on 3 ranks
    merged = sharded(gen, bench, labels, 3, folder, 3)
    assert sorted(gen.seeds) == [bench.batch_seed(3, b) for b in (0, 2, 4, 6, 8, 10)]
    for b, st in kept.items():
        now = os.stat(shard.batch_path(folder, b))
        assert (now.st_ino, now.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
    assert torch.equal(merged, one)


def test_merge_refuses_a_shard_of_another_run_or_a_missing_one(tmp_path):
    bench, folder = ShapesC2I(), tmp_path / "s"
    labels = bench.labels(96)                          # 2 batches
    shard.generate(CountingGen(), bench, labels, 0, SAMPLING, folder, KEY, [0, 1])
    with pytest.raises(shard.ShardError, match="seed do not match"):
        shard.merge(folder, KEY, labels, bench, seed=1)
    shard.batch_path(folder, 1).unlink()
    with pytest.raises(shard.ShardError, match="batch-000001.npz is missing"):
        shard.merge(folder, KEY, labels, bench, seed=0)
    with np.load(shard.batch_path(folder, 0)) as f:     # what a shard holds
        assert sorted(f.files) == ["batch", "images", "indices", "key", "labels", "seed"]
        assert f["indices"].tolist() == list(range(50)) and str(f["key"]) == KEY


@pytest.mark.parametrize("field", ["key", "batch", "indices", "labels", "seed", "images", "images-dtype", "seed+labels"])
def test_merge_names_each_field_of_a_shard_that_does_not_belong_to_the_run(tmp_path, field):
    bench, folder = ShapesC2I(), tmp_path / "s"
    labels = bench.labels(96)                          # 2 batches: 50 + 46
    shard.generate(CountingGen(), bench, labels, 0, SAMPLING, folder, KEY, [0, 1])
    assert shard.merge(folder, KEY, labels, bench, seed=0).shape[0] == 96
    path = shard.batch_path(folder, 1)
    with np.load(path) as f:
        got = {k: f[k] for k in f.files}
    bad = {"key": np.array("another-run"), "batch": np.array(0), "indices": got["indices"] + 1,
           "labels": (got["labels"] + 1) % 12, "seed": got["seed"] + 1, "images": got["images"][:-1],
           "images-dtype": got["images"].astype(np.float32)}
    names = [f.split("-")[0] for f in field.split("+")]
    for f, name in zip(field.split("+"), names):
        got[name] = bad[f]
    name = ", ".join(names)
    with open(path, "wb") as fh:
        np.savez(fh, **got)
    with pytest.raises(shard.ShardError) as e:
        shard.merge(folder, KEY, labels, bench, seed=0)
    assert str(e.value) == f"{path}: {name} do not match run {KEY}; delete {folder} and rerun"
    assert shard.merge(folder, KEY, labels, bench, seed=0, batches=range(1)).shape[0] == 50   # batch 0 is fine


def test_merge_features_checks_each_chunk_it_concatenates(tmp_path):
    folder = tmp_path / "s"
    rows = [{"features": torch.full((2, 3), float(j)), "logits": torch.full((2, 1), -float(j))} for j in range(3)]
    for j, r in enumerate(rows):
        shard.write_features(folder, KEY, j, r)
    merged = shard.merge_features(folder, KEY, 3)
    assert torch.equal(merged["features"], torch.cat([r["features"] for r in rows]))      # chunk order
    assert torch.equal(merged["logits"], torch.cat([r["logits"] for r in rows])) and set(merged) == {"features", "logits"}
    path = shard.features_path(folder, 1)
    shard.write_features(folder, "another-run", 1, rows[1])
    with pytest.raises(shard.ShardError) as e:
        shard.merge_features(folder, KEY, 3)
    assert str(e.value) == f"{path} does not belong to chunk 1 of run {KEY}; delete {folder} and rerun"
    path.write_bytes(shard.features_path(folder, 2).read_bytes())        # chunk 2's file under chunk 1's name
    with pytest.raises(shard.ShardError, match="does not belong to chunk 1 of run"):
        shard.merge_features(folder, KEY, 3)
    path.unlink()
    with pytest.raises(shard.ShardError) as e:
        shard.merge_features(folder, KEY, 3)
    assert str(e.value) == f"{path} is missing after every rank finished; rerun the same command to make it"


class BatchSensitiveBench:
    """Rows that depend on the batch they are computed in (batches of 2, as a network's kernels may):
    only chunks aligned at multiples of 2 reproduce one pass over all images. Sampling batches of 3, so
    feature chunks (4) straddle the batch files."""
    feature_chunk, batch_size = 4, 3
    batch_seed = staticmethod(ShapesC2I.batch_seed)

    def features(self, images, progress=False):
        x = images.float().mean((1, 2, 3))
        return {"features": torch.cat([b + 1e-3 * b.mean() for b in x.split(2)]).unsqueeze(1)}

    def score(self, feats, labels, seed=0, progress=True):
        return feats                                   # the merged rows themselves, to compare


class Spec:
    seed = 0

    @staticmethod
    def key():
        return KEY


@pytest.mark.parametrize("world", [1, 2, 3])
def test_feature_chunks_dealt_over_ranks_equal_one_pass(tmp_path, monkeypatch, world):
    bench, record = BatchSensitiveBench(), tmp_path / f"{KEY}.json"
    folder = shard.shard_dir(record)
    images = torch.randint(0, 256, (11, 3, 2, 2), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    labels = torch.zeros(11, dtype=torch.long)
    for b in range(4):                                 # the sampled batches, as the ranks wrote them
        shard.write_batch(folder, KEY, b, 3, labels[3 * b:3 * b + 3], bench.batch_seed(0, b), images[3 * b:3 * b + 3])
    one = bench.features(images)
    monkeypatch.setattr(shard, "_barrier", lambda: None)
    monkeypatch.setattr(shard, "world_size", lambda: world)
    # chunk 1 of an earlier, interrupted launch is on disk: it is kept, not made again
    shard.write_features(folder, KEY, 1, bench.features(images[4:8]))
    kept = os.stat(shard.features_path(folder, 1))
    listed = shard.finished(folder, KEY, 3, shard.features_path)
    assert listed == {1}
    monkeypatch.setattr(shard, "finished", lambda *a, **k: set(listed))     # what every rank listed
    read = []
    real_merge = shard.merge
    monkeypatch.setattr(shard, "merge", lambda *a, **k: read.append(list(k.get("batches") or a[5])) or real_merge(*a, **k))
    for r in reversed(range(world)):                   # rank 0 last: it merges after the others wrote
        monkeypatch.setattr(shard, "rank", lambda r=r: r)
        merged, cost = shard.evaluate(bench, labels, Spec, record, progress=False)
        assert (merged is None) == (r != 0)
    assert cost == {"shard_feature_chunks_reused": 1}
    assert torch.equal(merged["features"], one["features"])         # same rows, same order
    assert sorted(read) == [[0, 1], [2, 3]]            # chunks 0 (images 0-3) and 2 (8-10): only their batches
    now = os.stat(shard.features_path(folder, 1))
    assert (now.st_ino, now.st_mtime_ns) == (kept.st_ino, kept.st_mtime_ns)
    # the alignment is what makes it exact: chunks of 3 cut the batches of 2 and change the rows
    assert not torch.equal(torch.cat([bench.features(c)["features"] for c in images.split(3)]), one["features"])


def test_a_plain_process_is_not_sharded(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not shard.active() and shard.rank() == 0 and shard.setup("cpu") == "cpu"
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not shard.active()
    assert not torch.distributed.is_initialized()


def test_a_chain_is_split_into_what_rank_0_hands_over_and_what_every_rank_applies():
    from bench.method import split_for_ranks
    assert split_for_ranks([]) == ([], [])
    assert split_for_ranks(["dense"]) == ([], [])
    handed, per_rank = split_for_ranks(["magnitude:sparsity=0.25", "fastvar"])
    assert [s.split(":")[0] for s in handed] == ["magnitude"] and [s.split(":")[0] for s in per_rank] == ["fastvar"]
    handed, per_rank = split_for_ranks(["lazyvar"])
    assert handed == [] and [s.split(":")[0] for s in per_rank] == ["lazyvar"]
    # a weight method after the token method: everything up to it is rank 0's
    handed, per_rank = split_for_ranks(["evar:sparsity=0.3", "fastvar", "ft"])
    assert [s.split(":")[0] for s in handed] == ["evar", "fastvar", "ft"] and per_rank == []


class _Spec:
    def __init__(self, key):
        self._key = key

    def key(self):
        return self._key


def _as_rank(monkeypatch, r):
    monkeypatch.setattr(shard, "rank", lambda: r)
    monkeypatch.setattr(shard, "_barrier", lambda: None)


def test_rank_0_makes_the_model_once_and_the_other_ranks_load_it(tmp_path, monkeypatch):
    record = tmp_path / "run.json"
    made = []

    def make():
        made.append(1)
        return torch.nn.Linear(3, 2), ["magnitude: a note"]

    def must_not_make():
        raise AssertionError("this rank must load rank 0's model, not make its own")

    _as_rank(monkeypatch, 0)
    gen0, notes0, reused0 = shard.handoff(make, _Spec(KEY), record, "cpu")
    assert made == [1] and reused0 is False and notes0 == ["magnitude: a note"]
    assert shard.model_path(shard.shard_dir(record)).is_file()

    _as_rank(monkeypatch, 1)
    gen1, notes1, reused1 = shard.handoff(must_not_make, _Spec(KEY), record, "cpu")
    assert reused1 is None and notes1 == notes0
    assert all(torch.equal(a, b) for a, b in zip(gen0.state_dict().values(), gen1.state_dict().values()))

    # a relaunch: rank 0 finds its file and does not apply the methods again
    _as_rank(monkeypatch, 0)
    gen2, _, reused2 = shard.handoff(must_not_make, _Spec(KEY), record, "cpu")
    assert reused2 is True and torch.equal(gen2.weight, gen0.weight)
    # another run's file: rank 0 makes its own; a rank > 0 that finds none of its run's says so
    made.clear()
    assert shard.handoff(make, _Spec("f" * 16), record, "cpu")[2] is False and made == [1]
    _as_rank(monkeypatch, 1)
    with pytest.raises(shard.ShardError, match="model.pt is missing or not run"):
        shard.handoff(must_not_make, _Spec(KEY), record, "cpu")
    # a file that cannot be read: rank 0 makes it again, another rank reports the reading error itself
    shard.model_path(shard.shard_dir(record)).write_bytes(b"not a torch file")
    with pytest.raises(Exception) as err:
        shard.handoff(must_not_make, _Spec(KEY), record, "cpu")
    assert not isinstance(err.value, (shard.ShardError, AssertionError))
    _as_rank(monkeypatch, 0)
    made.clear()
    assert shard.handoff(make, _Spec(KEY), record, "cpu")[2] is False and made == [1]


def test_under_torchrun_rank_0_alone_times_and_the_others_return_its_records(tmp_path, monkeypatch):
    from bench.records import find_record, make_record, write_record
    monkeypatch.setattr(shard, "setup", lambda device: device)
    spec = make_spec("tiny-var", [], bench="latency", n=3)

    def time_it():
        write_record(spec.path(tmp_path), make_record(spec, {"latency_ms": 1.0}, {}, {}))
        return [find_record(spec, tmp_path)]

    def must_not_time():
        raise AssertionError("only rank 0 times")

    _as_rank(monkeypatch, 1)
    with pytest.raises(shard.ShardError, match="is not there"):
        shard.rank_zero_only(must_not_time, [spec], tmp_path, "cpu")
    _as_rank(monkeypatch, 0)
    [rec] = shard.rank_zero_only(time_it, [spec], tmp_path, "cpu")
    _as_rank(monkeypatch, 1)
    assert shard.rank_zero_only(must_not_time, [spec], tmp_path, "cpu") == [rec]


# --------------------------------------------------------------------------------------------------
# a real torchrun launch: 2 gloo ranks on the CPU against one process

needs_tiny = pytest.mark.skipif(not (ASSETS / "tiny_var.safetensors").is_file(),
                                reason="tiny-world checkpoints not built (make tiny-models)")
N = 300     # 6 batches (rank 0: 0, 2, 4; rank 1: 1, 3, 5) and 2 feature chunks of 256 (rank 0: 0; rank 1: 1)


def torchrun(results, cwd, *more, command=("run", "--n", str(N))):
    """``--`` after ``bench``: torchrun's parser would read varbench's ``--n`` as an ambiguous
    abbreviation of its own options (--nnodes, --nproc-per-node, ...)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "bench", "--", *command, "--model", "tiny-var", "--results", str(results), "--quiet", *more]
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-4000:]
    return out


@needs_tiny
@pytest.mark.slow
def test_two_torchrun_ranks_write_the_one_process_record_and_resume(tmp_path):
    spec = make_spec("tiny-var", [], n=N)
    one = run(spec, root=tmp_path / "one", progress=False)

    out = torchrun(tmp_path / "two", tmp_path)
    two = read_record(spec.path(tmp_path / "two"))
    assert out.stdout.count('"run_id"') == 1                       # one rank prints
    assert two["run_id"] == one["run_id"] and two["spec"] == one["spec"]
    assert two["metrics"] == one["metrics"]                        # exactly, every value and stderr
    assert {k: two["cost"][k] for k in ("params", "flops")} == {k: one["cost"][k] for k in ("params", "flops")}
    assert two["cost"]["sample_ranks"] == 2 and two["cost"]["shard_batches_reused"] == 0
    assert two["cost"]["shard_feature_chunks_reused"] == 0
    assert not shard.shard_dir(spec.path(tmp_path / "two")).exists()

    # interrupted after rank 1 wrote batch 1: the relaunch makes batch 0 only
    root = tmp_path / "resumed"
    gen = MODELS.get("tiny-var")(device="cpu").eval()
    bench = ShapesC2I()
    shard.generate(gen, bench, bench.labels(N), spec.seed, spec.sampling, shard.shard_dir(spec.path(root)),
                   spec.key(), [1])
    torchrun(root, tmp_path)
    resumed = read_record(spec.path(root))
    assert resumed["cost"]["shard_batches_reused"] == 1
    assert resumed["metrics"] == one["metrics"] and resumed["run_id"] == one["run_id"]


def _descendants(pid: int) -> list:
    """Every process below ``pid`` (from /proc: children's parent ids), deepest last."""
    parents = {}
    for stat in os.listdir("/proc"):
        if stat.isdigit():
            try:
                fields = open(f"/proc/{stat}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents.setdefault(int(fields[1]), []).append(int(stat))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


@needs_tiny
@pytest.mark.slow
def test_a_killed_torchrun_launch_resumes_from_its_finished_shards(tmp_path):
    """A real interruption: the launch is killed (SIGKILL to every process) as soon as its first
    batch is on disk; the same command then finishes without making the finished batches again,
    and the record is the uninterrupted one's."""
    import signal
    import time

    spec = make_spec("tiny-var", [], n=N)
    root = tmp_path / "killed"
    folder = shard.shard_dir(spec.path(root))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "bench", "--", "run", "--model", "tiny-var", "--n", str(N), "--results", str(root), "--quiet"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not list(folder.glob("batch-*.npz")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    for pid in [proc.pid, *_descendants(proc.pid)]:  # torchrun's workers run in sessions of their own
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    time.sleep(0.5)
    survivors = {p.name: os.stat(p) for p in folder.glob("batch-*.npz")}
    assert 1 <= len(survivors) < shard.n_batches(N, 50), "the launch was not killed mid-way"
    assert not spec.path(root).exists()

    torchrun(root, tmp_path)
    resumed = read_record(spec.path(root))
    assert resumed["cost"]["shard_batches_reused"] == len(survivors)
    one = run(spec, root=tmp_path / "one", progress=False)
    assert resumed["metrics"] == one["metrics"] and resumed["run_id"] == one["run_id"]


@needs_tiny
@pytest.mark.slow
def test_two_torchrun_ranks_share_rank_0s_pruned_model_and_resume_it(tmp_path):
    """A chain with a weight method: rank 0 prunes, the other rank loads its model; the record equals
    the single-process one; a relaunch that finds model.pt does not prune again."""
    chain = "magnitude:sparsity=0.25 + fastvar"
    spec = make_spec("tiny-var", chain, n=N)
    one = run(spec, root=tmp_path / "one", progress=False)
    torchrun(tmp_path / "two", tmp_path, "--method", chain)
    two = read_record(spec.path(tmp_path / "two"))
    assert two["run_id"] == one["run_id"] and two["metrics"] == one["metrics"]
    assert two["cost"]["shard_model_reused"] is False and two["cost"]["params"] == one["cost"]["params"]
    assert two["notes"] == one["notes"]

    # interrupted after rank 0 handed the model over: the relaunch loads it
    from bench.method import Context, apply_chain, split_for_ranks
    root = tmp_path / "resumed"
    handed, _ = split_for_ranks(spec.methods)
    torch.manual_seed(spec.seed)
    ctx = Context(seed=spec.seed, progress=False)
    gen = apply_chain(MODELS.get("tiny-var")(device="cpu").eval(), handed, ctx)
    shard.save_model(shard.shard_dir(spec.path(root)), spec.key(), gen, ctx.notes)
    torchrun(root, tmp_path, "--method", chain)
    resumed = read_record(spec.path(root))
    assert resumed["cost"]["shard_model_reused"] is True and resumed["metrics"] == one["metrics"]


@needs_tiny
@pytest.mark.slow
def test_under_torchrun_the_latency_bench_is_timed_by_rank_0_alone(tmp_path):
    out = torchrun(tmp_path / "r", tmp_path, "--reps", "3", "--warmup", "1", "--threads", "1",
                   command=("latency",))
    records = list((tmp_path / "r").rglob("*.json"))
    assert len(records) == 1, records
    assert out.stdout.count("record: ") == 1            # one report, from rank 0
    assert read_record(records[0])["metrics"]["latency_ms"]["n"] == 3
