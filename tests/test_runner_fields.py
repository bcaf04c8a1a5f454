"""What `bench.runner` writes into a record besides the metrics, and what it refuses before any work: the
timings and cost fields under a controlled clock, the original model's time kept out of the run's own, reuse and
--force, records of a newer schema, checkpoints that changed, the latency bench's dispatch, the sharded path in one
process (bench.shard's collective steps faked), the streaming sample-and-featurise loop, the latency bench's
prepared generator and the weight-free accounting of Core ML specs."""
import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch

from bench import runner
from bench.benches.shapes_c2i import ShapesC2I
from bench.models.generator import Generator
from bench.plan import make_spec
from bench.records import SCHEMA_VERSION, RecordError, read_record
from bench.registry import MODELS
from bench.tiny.assets import ASSETS

pytestmark = pytest.mark.skipif(not (ASSETS / "tiny_var.safetensors").is_file(),
                                reason="tiny-world checkpoints not built (make tiny-models)")

LOAD, METHOD, BATCH, CHUNK, SCORE = 1000.0, 100.0, 10.0, 1.0, 7.0


class Clock:
    """runner's ``time``: it moves only where a test says the work is (model loads, methods, batches, ...),
    so every timing of a run is an exact sum of these steps."""

    def __init__(self):
        self.now = 5000.0   # not 0: a clock reading added where it should be subtracted must show
        self.seeds, self.data = [], []   # the global seed at each model load; what each method chain could read

    def perf_counter(self):
        return self.now


@pytest.fixture
def clocked(monkeypatch):
    clock, calls = Clock(), {"load": 0, "generate": 0, "features": 0}

    class TimedCard:
        def __init__(self, card):
            self.card = card

        def __getattr__(self, name):
            return getattr(self.card, name)

        def __call__(self, **kw):
            calls["load"] += 1
            clock.seeds.append(torch.initial_seed())
            clock.now += LOAD
            return self.card(**kw)

    real_apply, real_generate = runner.apply_chain, Generator.generate
    real_features, real_score = ShapesC2I.features, ShapesC2I.score

    def apply_chain(gen, chain, ctx):
        if chain:   # data-driven methods calibrate on the bench's data, tokenised by this model's VQVAE
            clock.data.append(ctx.data(4, "calib") if ctx.data else None)
        out = real_apply(gen, chain, ctx)
        clock.now += METHOD * len(chain)
        return out

    def generate(self, *a, **kw):
        calls["generate"] += 1
        clock.now += BATCH
        return real_generate(self, *a, **kw)

    def features(self, *a, **kw):
        calls["features"] += 1
        clock.now += CHUNK
        return real_features(self, *a, **kw)

    def score(self, *a, **kw):
        clock.now += SCORE
        return real_score(self, *a, **kw)

    monkeypatch.setattr(runner, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    monkeypatch.setattr(runner, "MODELS", SimpleNamespace(get=lambda name: TimedCard(MODELS.get(name))))
    monkeypatch.setattr(runner, "apply_chain", apply_chain)
    monkeypatch.setattr(Generator, "generate", generate)
    monkeypatch.setattr(ShapesC2I, "features", features)
    monkeypatch.setattr(ShapesC2I, "score", score)
    # 12 images: 3 sampling batches of 4, 2 feature chunks (8 + 4) that straddle them
    monkeypatch.setattr(ShapesC2I, "batch_size", 4)
    monkeypatch.setattr(ShapesC2I, "feature_chunk", 8)
    return clock, calls


def test_timings_and_cost_fields_are_the_runs_own(tmp_path, clocked):
    clock, calls = clocked
    spec = make_spec("tiny-var", ["magnitude:sparsity=0.4"], n=12)
    rec = runner.run(spec, root=tmp_path, progress=False)
    assert calls == {"load": 1, "generate": 3, "features": 2}
    sample_s, metrics_s = 3 * BATCH, 2 * CHUNK + SCORE      # the feature time interleaved with sampling is metrics time
    assert rec["timings"] == {"load_s": LOAD, "methods_s": METHOD, "sample_s": sample_s, "metrics_s": metrics_s,
                              "total_s": LOAD + METHOD + sample_s + metrics_s}
    assert clock.now == 5000.0 + rec["timings"]["total_s"]
    cost = rec["cost"]
    assert cost["images_per_s"] == 12 / sample_s and cost["latency_ms_per_image"] == 1000 * sample_s / 12
    assert cost["sample_batch"] == 4 and cost["device"] == "cpu"
    assert cost["params"] > 0 and cost["flops"] > 0 and None not in cost.values()
    labels, tokens = clock.data[0]
    want_labels, want_tokens = ShapesC2I().data(4, "calib", MODELS.get("tiny-var")().vae)
    assert torch.equal(labels, want_labels) and all(torch.equal(a, b) for a, b in zip(tokens, want_tokens))
    assert read_record(spec.path(tmp_path)) == rec


def test_the_original_models_time_is_kept_out_of_the_runs_timings(tmp_path, clocked):
    clock, calls = clocked
    spec = make_spec("tiny-var", ["magnitude:sparsity=0.4"], bench="shapes-c2i", n=12, bench_args={"fidelity": True})
    rec = runner.run(spec, root=tmp_path, progress=False)
    # the original: a load, 3 batches, 2 chunks; then the run's own as without fidelity
    original_s = LOAD + 3 * BATCH + 2 * CHUNK
    assert calls == {"load": 2, "generate": 6, "features": 4}
    assert rec["timings"] == {"original_s": original_s, "load_s": LOAD, "methods_s": METHOD, "sample_s": 3 * BATCH,
                              "metrics_s": 2 * CHUNK + SCORE, "total_s": LOAD + METHOD + 3 * BATCH + 2 * CHUNK + SCORE}
    assert clock.now == 5000.0 + original_s + rec["timings"]["total_s"]
    assert {"fid_star", "psnr", "ssim", "fid"} <= set(rec["metrics"]) and rec["metrics"]["psnr"]["n"] == 12


def test_a_record_is_reused_unless_forced(tmp_path, clocked):
    _, calls = clocked
    spec = make_spec("tiny-var", [], n=12)
    first = runner.run(spec, root=tmp_path, progress=False)
    assert calls["generate"] == 3
    assert runner.run(spec, root=tmp_path, progress=False) == first and calls["generate"] == 3
    again = runner.run(spec, root=tmp_path, progress=False, force=True)
    assert calls["generate"] == 6 and again["run_id"] == first["run_id"]
    assert read_record(spec.path(tmp_path)) == again


def test_force_refuses_only_a_record_of_a_newer_schema(tmp_path, clocked):
    _, calls = clocked
    spec = make_spec("tiny-var", [], n=12)
    path = spec.path(tmp_path)
    path.parent.mkdir(parents=True)
    newer = json.dumps({"schema": SCHEMA_VERSION + 1})
    path.write_text(newer)
    with pytest.raises(RecordError) as e:
        runner.run(spec, root=tmp_path, progress=False, force=True)
    assert str(e.value) == (f"{path} is a schema-{SCHEMA_VERSION + 1} record, newer than this varbench writes "
                            f"({SCHEMA_VERSION}); not overwriting it. Upgrade varbench, or delete the file to "
                            f"rerun with this version.")
    assert path.read_text() == newer and calls["load"] == 0
    # this schema, a schema that is not a number, a corrupt file, JSON that is not an object: replaced
    for content in (json.dumps({"schema": SCHEMA_VERSION}), json.dumps({"schema": str(SCHEMA_VERSION + 1)}),
                    "{not json", "[1, 2]"):
        path.write_text(content)
        runner._refuse_newer(path)
    runner._refuse_newer(path.with_name("absent.json"))
    rec = runner.run(spec, root=tmp_path, progress=False, force=True)      # the last one, replaced by a run
    assert read_record(path) == rec


def test_nothing_is_loaded_before_the_checks(tmp_path, clocked, monkeypatch):
    _, calls = clocked
    spec = make_spec("tiny-var", [], n=12)
    with pytest.raises(ValueError) as e:
        runner.run(dataclasses.replace(spec, ckpt=None), root=tmp_path, progress=False)
    assert str(e.value) == f"{spec.label()}: the spec has no checkpoint identity (files absent); cannot run it"
    other = dataclasses.replace(spec, ckpt={"tiny_var.safetensors": "0" * 64})
    with pytest.raises(ValueError) as e:
        runner.run(other, root=tmp_path, progress=False)
    assert str(e.value) == (f"{spec.label()}: the checkpoint files in {MODELS.get('tiny-var').folder(None)} are not the "
                            f"ones this spec was made for; make the spec again")
    (tmp_path / "file").write_text("")
    from bench.io import OutputDirError
    with pytest.raises(OutputDirError, match="results folder .* is a file, not a folder"):
        runner.run(spec, root=tmp_path / "file", progress=False)

    def missing(self):
        raise FileNotFoundError("feature network gone")
    monkeypatch.setattr(ShapesC2I, "preflight", missing)       # the bench's files are checked before loading
    with pytest.raises(FileNotFoundError, match="feature network gone"):
        runner.run(spec, root=tmp_path, progress=False)
    assert calls["load"] == 0 and not list(tmp_path.rglob("*.json"))


def test_the_device_is_the_one_the_process_group_gives(tmp_path, clocked, monkeypatch):
    """Under torchrun shard.setup maps the requested device to this rank's; the model and record use that one."""
    clock, _ = clocked
    seen = []
    monkeypatch.setattr(runner.shard, "setup", lambda device: seen.append(device) or "cpu")
    torch.manual_seed(0)                # another global seed than the spec's, so that the check below can fail
    rec = runner.run(make_spec("tiny-var", [], n=12, seed=5), root=tmp_path, progress=False, device="cuda:7")
    assert seen == ["cuda:7"] and rec["cost"]["device"] == "cpu" and rec["env"]["device"] == "cpu"
    assert clock.seeds == [5]           # the model is loaded (and its methods run) under the spec's seed


def test_a_fidelity_run_is_not_sharded(tmp_path, clocked, monkeypatch):
    _, calls = clocked
    monkeypatch.setattr(runner.shard, "setup", lambda device: device)
    monkeypatch.setattr(runner.shard, "active", lambda: True)
    spec = make_spec("tiny-var", [], bench="shapes-c2i", n=12, bench_args={"fidelity": True})
    with pytest.raises(ValueError) as e:
        runner.run(spec, root=tmp_path, progress=False)
    assert str(e.value) == f"{spec.label()}: fidelity runs are not sharded yet; run it in one process"
    assert calls["load"] == 0


def test_the_latency_bench_is_timed_not_sampled(tmp_path, monkeypatch):
    import bench.latency
    seen = []
    monkeypatch.setattr(bench.latency, "run_latency", lambda specs, **kw: seen.append((specs, kw)) or ["the record"])
    spec = make_spec("tiny-var", [], bench="latency", need_ckpt=False)
    assert runner.run(spec, root=tmp_path, force=True, ckpt_dir="ck", progress=False) == "the record"
    assert seen == [([spec], {"root": tmp_path, "ckpt_dir": "ck", "force": True, "progress": False})]


def test_sample_features_streams_and_times_each_part(monkeypatch, capsys):
    """Each chunk is featurised as soon as its last image is sampled (one chunk of images held at most), and
    the times split between sampling and features; the progress bar shows only when asked for."""
    from bench.benches.base import Bench
    clock, events = Clock(), []
    monkeypatch.setattr(runner, "time", SimpleNamespace(perf_counter=clock.perf_counter))

    class Gen:
        def generate(self, labels, seed=0):
            events.append(("sample", int(labels[0])))
            clock.now += BATCH
            return torch.as_tensor(labels, dtype=torch.uint8).view(-1, 1, 1, 1).expand(-1, 3, 2, 2).contiguous()

    class B(Bench):
        batch_size, feature_chunk = 3, 6

        def features(self, imgs, progress=False):
            events.append(("features", int(imgs[0, 0, 0, 0]), len(imgs)))
            clock.now += CHUNK
            return {"features": imgs[:, 0, 0, 0].float()}

    rows, _, times = runner.sample_features(Gen(), B(), torch.arange(14), 0, {}, progress=False)
    assert events == [("sample", 0), ("sample", 3), ("features", 0, 6), ("sample", 6), ("sample", 9),
                      ("features", 6, 6), ("sample", 12), ("features", 12, 2)]
    assert rows["features"].tolist() == list(range(14))
    assert times == {"sample_s": 5 * BATCH, "features_s": 3 * CHUNK}
    assert capsys.readouterr().err == ""
    runner.sample_features(Gen(), B(), torch.arange(3), 0, {}, desc="sample tiny-var dense")
    assert "sample tiny-var dense" in capsys.readouterr().err


@pytest.mark.parametrize("case", ["rank 0", "rank 0, model reused", "rank 1"])
def test_the_sharded_path_in_one_process(tmp_path, clocked, monkeypatch, case):
    """Under torchrun (faked here: bench.shard's collective steps replaced): rank 0 applies the chain up to its last
    method that is not per-rank and hands the model over, or reuses an earlier launch's (and its notes); every rank
    applies the per-rank methods with the bench's data from the model's tokenizer; rank 0 writes the record with
    the shard cost, the others return the record rank 0 wrote."""
    clock, calls = clocked
    rank0, reused = case.startswith("rank 0"), case.endswith("reused")
    seen = {}

    def handoff(make, spec, path, device):
        if rank0 and not reused:
            gen, notes = make()
            return gen, notes, False
        gen = MODELS.get("tiny-var")().eval()          # what rank 0 saved (not pruned here: only the notes matter)
        return gen, ["magnitude: from the earlier launch"], (True if rank0 else None)

    def evaluate(bench, labels, spec, path, progress):
        seen["evaluate"] = list(labels)
        return ({"fid": {"value": 1.5, "stderr": None, "n": 12, "higher_is_better": False}}, {"shard_features_s": 2.0}) \
            if rank0 else (None, {})
    fake = SimpleNamespace(setup=lambda device: device, active=lambda: True, handoff=handoff,
                           sample=lambda gen, bench, labels, spec, path, progress: seen.update(sampled=gen) or
                           setattr(clock, "now", clock.now + 3 * BATCH) or {"shard_world": 2},
                           evaluate=evaluate, finish=lambda path: seen.update(finished=path),
                           wait_for_record=lambda spec, root: "the record rank 0 wrote")
    monkeypatch.setattr(runner, "shard", fake)
    spec = make_spec("tiny-var", ["magnitude:sparsity=0.4", "stepvar"], n=12)
    rec = runner.run(spec, root=tmp_path, progress=False)
    # the per-rank chain (stepvar) ran on every rank with the bench's data; the handed one only on a fresh rank 0
    assert len(clock.data) == (2 if rank0 and not reused else 1) and clock.data[-1] is not None
    assert torch.equal(clock.data[-1][0], ShapesC2I().data(4, "calib", seen["sampled"].vae)[0])
    assert seen["sampled"].token_policy.__class__.__name__.lower().startswith("stepvar")
    if not rank0:
        assert rec == "the record rank 0 wrote" and "finished" not in seen and not spec.path(tmp_path).exists()
        return
    assert seen["finished"] == spec.path(tmp_path) and read_record(spec.path(tmp_path)) == rec
    assert rec["metrics"]["fid"]["value"] == 1.5 and rec["timings"]["sample_s"] == 3 * BATCH
    assert rec["cost"]["shard_world"] == 2 and rec["cost"]["shard_features_s"] == 2.0
    assert rec["cost"]["shard_model_reused"] is reused
    if reused:
        assert [n for n in rec["notes"] if n.startswith("magnitude")] == ["magnitude: from the earlier launch"]
        assert any(n.startswith("stepvar") for n in rec["notes"]) and calls["load"] == 0
        assert rec["timings"]["load_s"] == 0.0 and rec["timings"]["methods_s"] == METHOD     # stepvar alone
    else:
        assert any(n.startswith("magnitude:") for n in rec["notes"]) and calls["load"] == 1
        assert rec["timings"]["load_s"] == LOAD and rec["timings"]["methods_s"] == 2 * METHOD


def test_a_bench_without_feature_rows_scores_all_images_at_once(tmp_path, monkeypatch, capsys):
    """shapes-geneval (feature_chunk 0): the run samples every image, then the bench evaluates them in one step.
    8 images reach GenEval's first task only: said before the run and kept in the record's notes."""
    from bench.benches.geneval import ShapesGenEval
    seen = []
    real = ShapesGenEval.evaluate
    monkeypatch.setattr(ShapesGenEval, "evaluate", lambda self, imgs, labels, seed=0, progress=True:
                        seen.append((imgs.shape, list(labels), seed)) or real(self, imgs, labels, seed, progress))
    spec = make_spec("tiny-t2i", [], bench="shapes-geneval", n=8, seed=2)
    rec = runner.run(spec, root=tmp_path, progress=False)
    assert seen == [((8, 3, 64, 64), ShapesGenEval().labels(8), 2)]
    assert rec["metrics"]["geneval_images"]["n"] == 8 and rec["cost"]["sample_batch"] == 4
    assert set(rec["timings"]) == {"load_s", "methods_s", "sample_s", "metrics_s", "total_s"}
    note = ("shapes-geneval at n = 8: its first 2 prompt(s) (in the metadata's order, task by task) cover 1 of the 6 "
            "tasks (single_object); geneval is the mean over those, not the overall score of all 6 (n = 960)")
    assert rec["notes"] == [note] and capsys.readouterr().err == f"varbench: warning: {note}\n"
    assert set(rec["metrics"]) & {f"geneval_{t}" for t in ("two_object", "position")} == set()


def test_prepared_generator_for_timing_and_export(clocked, monkeypatch):
    """The latency bench's and the Core ML export's model: the checkpoint's (checked against the spec) or seeded
    random weights, the method chain applied with the world's default bench's data, and its own two timings."""
    from bench.latency import latency_specs
    clock, calls = clocked
    setting = dict(device="cpu", batch=1, threads=1, compile=False, warmup=1)
    (spec,) = latency_specs("tiny-var", ["magnitude:sparsity=0.4"], 3, 0, setting)
    gen, ctx, timings = runner.prepared_generator(spec, progress=False)
    assert calls["load"] == 1 and timings == {"load_s": LOAD, "methods_s": METHOD}
    assert gen.training is False and not any(p.requires_grad for p in gen.parameters())
    labels, tokens = clock.data[-1]                   # shapes-c2i's calibration split, tokenised by this model
    want_labels, want_tokens = ShapesC2I().data(4, "calib", gen.vae)
    assert torch.equal(labels, want_labels) and all(torch.equal(a, b) for a, b in zip(tokens, want_tokens))
    assert ctx.seed == 0 and ctx.epoch_size == ShapesC2I.epoch_size and ctx.progress is False
    with pytest.raises(ValueError) as e:
        runner.prepared_generator(dataclasses.replace(spec, ckpt={"tiny_var.safetensors": "0" * 64}))
    assert str(e.value) == f"{spec.label()}: the checkpoint files changed since the spec was made"
    # seeded random weights: the same for every chain of a comparison, and for the teacher
    (rnd,) = latency_specs("tiny-var", ["dense"], 3, 7, setting, random_weights=True)
    torch.manual_seed(123)
    a, ctx_a, _ = runner.prepared_generator(rnd, progress=False)
    torch.manual_seed(456)
    b, _, _ = runner.prepared_generator(rnd, progress=False)
    sd_a, sd_b, sd_t = a.state_dict(), b.state_dict(), ctx_a.teacher().state_dict()
    assert all(torch.equal(sd_a[k], sd_b[k]) and torch.equal(sd_a[k], sd_t[k]) for k in sd_a)
    ckpt = MODELS.get("tiny-var")().state_dict()
    assert not all(torch.equal(sd_a[k], ckpt[k]) for k in sd_a)          # not the checkpoint's weights


def test_weight_free_accounting_adds_the_core_ml_packages_op_count(tmp_path, monkeypatch):
    """A Core ML latency spec's accounting also counts its package's ops, exported at the sizes of the model after
    its chain; other specs' do not; the meta-device count is made once per model and chain."""
    from bench.latency import latency_specs
    seen = []
    monkeypatch.setattr(runner, "package_ops", lambda spec, cfg: seen.append((spec, cfg)) or 4321)
    monkeypatch.setattr(runner, "_COSTS", {})
    cpu = dict(device="cpu", batch=1, threads=1, compile=False, warmup=1)
    coreml = dict(cpu, device="coreml", compute_units="ALL", threads=None)
    (on_cpu,) = latency_specs("tiny-var", ["magnitude:sparsity=0.4"], 3, 0, cpu)
    (on_ane,) = latency_specs("tiny-var", ["magnitude:sparsity=0.4"], 3, 0, coreml)
    a = runner.account(on_cpu, tmp_path)
    b = runner.account(on_ane, tmp_path)
    assert "package_ops" not in a["cost"] and b["cost"] == {**a["cost"], "package_ops": 4321}
    (spec, cfg), = seen
    assert spec == on_ane
    pruned = MODELS.get("tiny-var").build(device="meta")
    from bench.method import Context, apply_chain
    pruned = apply_chain(pruned, on_ane.methods, Context(world="tiny", seed=0, progress=False))
    assert cfg == pruned.var.cfg and cfg != MODELS.get("tiny-var").build(device="meta").var.cfg
