"""The latency bench: statistics, alternation, records, staleness, and bad input."""
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.benches.latency import LatencyBench
from bench.cli import main
from bench.latency import Config, Timer, measure, summarize, timed_generation, weights_mb, working_mb
from bench.records import read_record
from bench.tiny.assets import ASSETS
from tests.test_cli_inputs import err_of

HAVE_TINY = (ASSETS / "tiny_var.safetensors").is_file()
pytestmark = pytest.mark.usefixtures("one_thread")


def test_summary_statistics_match_numpy_and_the_ci_brackets_the_median():
    t = [0.5, 0.1, 0.3, 0.2, 0.4, 0.9, 0.35]
    s = summarize(t, seed=3)
    ms = np.array(t) * 1e3
    assert s["value"] == pytest.approx(np.median(ms)) and s["n"] == 7
    assert s["iqr"] == pytest.approx(np.percentile(ms, 75) - np.percentile(ms, 25))
    assert s["p90"] == pytest.approx(np.percentile(ms, 90))
    assert s["min"] == 100 and s["max"] == 900
    lo, hi = s["ci95"]
    assert min(ms) <= lo <= s["value"] <= hi <= max(ms)
    assert summarize(t, seed=3) == s                   # seeded bootstrap
    assert summarize([1.0, 1.0, 1.0])["ci95"] == [1000.0, 1000.0]
    with pytest.raises(ValueError, match="≥ 3"):
        summarize([0.1, 0.2])
    with pytest.raises(ValueError, match="finite"):
        summarize([0.1, float("nan"), 0.2])


def test_protocol_carries_the_setting_and_round_trips():
    b = LatencyBench(device="cuda:1", batch=4, threads=2, compile=True, warmup=3)
    p = b.identity()
    assert p == {"version": 3, "device": "cuda", "batch": 4, "threads": None, "compile": True, "warmup": 3,
                 "compile_scope": "sublayers"}
    assert "compile_scope" not in LatencyBench(batch=2).identity()   # uncompiled records keep their keys
    assert LatencyBench(**LatencyBench.args_from_protocol(LatencyBench(batch=2, threads=3).identity())).identity() \
        == LatencyBench(batch=2, threads=3).identity()
    for kw, msg in ((dict(batch=0), "--batch 0"), (dict(warmup=0), "--warmup 0"), (dict(threads=0), "--threads 0")):
        with pytest.raises(ValueError, match=msg):
            LatencyBench(**kw)
    assert LatencyBench.args_from_protocol(p) == {"device": "cuda", "batch": 4, "compile": True, "warmup": 3}
    assert LatencyBench.args_from_protocol(None) == {}
    coreml = LatencyBench(device="coreml", compute_units="CPU_ONLY", precision="fp32", threads=1)
    args = LatencyBench.args_from_protocol(coreml.identity())
    assert args == {"device": "coreml", "batch": 1, "compile": False, "warmup": 2, "compute_units": "CPU_ONLY",
                    "precision": "fp32"}
    assert LatencyBench(**args).identity() == coreml.identity()
    with pytest.raises(ValueError) as e:
        LatencyBench.check_n(2)
    assert str(e.value) == "--reps 2: at least 3 timed generations are needed for a median and an IQR"


class _Logged:
    """A stand-in generator that logs which configuration ran (alternation order)."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    def sample_tokens(self, labels, seed=0, logits_hook=None, **kw):
        self.log.append(self.name)
        for si in range(3):
            if logits_hook is not None:
                logits_hook(si, None)
        return [], torch.zeros(1, 1, 1, 1)

    def decode_uint8(self, f):
        return f.to(torch.uint8)


def test_working_memory_on_cuda_is_the_allocators_peak_above_its_start(monkeypatch):
    """On CUDA the figure is the caching allocator's peak over the call minus what was allocated when it
    began, the peak reset first and both read after a synchronize (the calls mocked: no GPU here)."""
    calls, mib = [], 2 ** 20
    state = {"now": 700 * mib, "peak": 900 * mib}   # a peak left over from before: must be reset

    def fn():
        calls.append("fn")
        state["peak"] = max(state["peak"], state["now"] + 96 * mib)   # 96 MiB held at the call's peak
        state["now"] += 8 * mib                                       # 8 MiB kept after it

    def reset(dev):
        calls.append(("reset", str(dev)))
        state["peak"] = state["now"]

    monkeypatch.setattr(torch.cuda, "synchronize", lambda dev=None: calls.append(("sync", str(dev))))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda dev=None: state["now"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda dev=None: state["peak"])
    assert working_mb(fn, "cuda:1") == 96.0
    assert calls == [("sync", "cuda:1"), ("reset", "cuda:1"), "fn", ("sync", "cuda:1")]


def test_working_memory_is_the_peak_of_what_a_call_allocates_and_weights_count_shared_storage_once(capfd):
    x = torch.randn(512, 512)                  # 1 MiB
    state = [torch.randn(1024, 1024)]           # 4 MiB made before the first call

    def fn():
        state.clear()                           # frees what setup or the last call made: not subtracted
        a = x @ x                               # +1 MiB
        b = torch.empty(1024, 1024)             # +4 MiB: 5 MiB held at the peak
        del a
        state.append(b)                         # kept for the next call, as a token method keeps its state
        return torch.empty(256, 1024)           # +1 MiB after a's 1 MiB was freed: still 5 at most

    assert working_mb(fn) == pytest.approx(5.0, abs=0.01)
    assert working_mb(fn) == pytest.approx(5.0, abs=0.01)   # again: frees of the last call's tensors not subtracted
    assert working_mb(lambda: None) == 0
    assert "profiler_start" not in capfd.readouterr().err.lower()   # kineto's C++ log lines kept from the user
    lin = torch.nn.Linear(256, 256)            # 256·256 + 256 floats
    tied = torch.nn.Sequential(lin, torch.nn.Linear(256, 256))
    tied[1].weight = lin.weight                # shared: held once
    assert weights_mb(lin) == pytest.approx((256 * 256 + 256) * 4 / 2 ** 20)
    assert weights_mb(tied) == pytest.approx((256 * 256 + 2 * 256) * 4 / 2 ** 20)
    assert weights_mb(tied, "cuda") == 0       # nothing held there
    assert weights_mb(object()) is None        # not a torch generator (Core ML): not measured


def test_configurations_are_alternated_in_rotated_order():
    log = []
    cfgs = [Config(c, _Logged(c, log), torch.zeros(1), {}) for c in "ABC"]
    out = measure(cfgs, "cpu", reps=4, warmup=1, progress=False)
    timed = log[3:3 + 12]                      # after one warm-up each, before the memory runs
    assert timed == list("ABC" "BCA" "CAB" "ABC")
    assert len(log) == 15                      # no other generation (a stand-in without weights: no memory run)
    assert set(out) == set("ABC")
    assert out["A"]["latency_ms"]["n"] == 4 and len(out["A"]["breakdown"]["scale_ms"]) == 3


def test_graph_runs_record_their_capture_apart(small_gen):
    """A generator with per-scale graphs (here the eager capture, the same protocol) is captured in its
    first warm-up generation; the capture's time, graph count and held memory go to the result, the
    held memory into the peak, and the timed generations replay."""
    from bench.models.graphs import eager_capture
    from tests.conftest import make_small_gen
    small_gen.graph_capture = eager_capture
    both = measure([Config("G", small_gen, torch.tensor([0, 1]), {}), Config("E", make_small_gen(), torch.tensor([0, 1]), {})],
                   "cpu", reps=3, warmup=2, progress=False)
    out = both["G"]
    assert both["E"]["graphs"] is None and "graphs_mb" not in both["E"]["peak_mem"]
    assert both["E"]["peak_mem"]["kind"] == "weights + peak working memory of one generation (PyTorch allocator events)"
    assert out["peak_mem"]["kind"] == ("weights + what the CUDA graphs hold + peak working memory of one generation "
                                       "(PyTorch allocator events)")
    g = out["graphs"]
    assert g["graphs_count"] == len(small_gen.patch_nums) and g["graphs_capture_s"] > 0
    assert g["graphs_max_abs_diff"] == 0.0
    assert g["graphs_held_mb"] == out["peak_mem"]["graphs_mb"] > 0           # the static inputs and KV buffers
    assert out["peak_mem"]["value"] == pytest.approx(out["peak_mem"]["weights_mb"] + out["peak_mem"]["working_mb"]
                                                     + g["graphs_held_mb"])
    assert len(out["breakdown"]["scale_ms"]) == len(small_gen.patch_nums)


def test_an_indexed_cuda_device_becomes_the_current_one(monkeypatch):
    from bench.latency import use_cuda_device
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    for device in ("cpu", "cuda", "cuda:1", "coreml", "cuda:0"):
        use_cuda_device(device)
    assert calls == [1, 0]


def test_after_a_capture_every_configuration_runs_once_more_before_the_timed_ones():
    """A CUDA graph capture empties the allocator's cache of the configurations warmed up before it: each
    runs one more untimed generation, after every warm-up, so no timed generation allocates afresh."""
    from types import SimpleNamespace
    log = []
    cfgs = [Config(c, _Logged(c, log), torch.zeros(1), {}) for c in "AB"]
    cfgs[1].gen.captured_graphs = SimpleNamespace(capture_s=0.1, replays=[0] * 3, held_mb=2.0, max_abs_diff=0.0)
    out = measure(cfgs, "cpu", reps=3, warmup=1, progress=False)
    assert log[:4] == list("AB" "AB") and log[4:10] == list("AB" "BA" "AB")
    assert out["A"]["graphs"] is None and out["B"]["graphs"]["graphs_count"] == 3
    log.clear()
    cfgs = [Config(c, _Logged(c, log), torch.zeros(1), {}) for c in "AB"]   # no graphs: no extra generation
    measure(cfgs, "cpu", reps=3, warmup=1, progress=False)
    assert log[:8] == list("AB" "AB" "BA" "AB")


class _FakeCuda:
    """torch.cuda's events on a fake GPU clock: an event records the clock when recorded; only
    ``synchronize`` calls are logged (a Timer must not add any before the end of a generation)."""

    def __init__(self):
        self.clock, self.syncs = 0.0, []
        cuda = self

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing
                self.t = None

            def record(self):
                self.t = cuda.clock

            def synchronize(self):
                cuda.syncs.append(("event", self.t))

            def elapsed_time(self, other):   # milliseconds, as torch.cuda.Event
                return (other.t - self.t) * 1e3

        self.Event = Event

    def synchronize(self):
        self.syncs.append(("device", self.clock))


def test_the_cuda_clock_reads_events_after_the_generation_without_synchronising_in_between():
    """On CUDA every scale's mark is an event recorded in stream order; the timer synchronises once
    before the generation and waits for the last event only, then reads the elapsed times."""
    fake = _FakeCuda()
    timer = Timer("cpu")
    timer.cuda, timer.torch = True, type("T", (), {"cuda": fake})
    log, gpu_ms = [], [0.5, 1.5, 2.5]

    class Gen(_Logged):
        def sample_tokens(self, labels, seed=0, logits_hook=None, **kw):
            for si, ms in enumerate(gpu_ms):
                fake.clock += ms / 1e3
                logits_hook(si, None)
            fake.clock += 0.25e-3
            return [], torch.zeros(1, 1, 1, 1)

        def decode_uint8(self, f):
            fake.clock += 4e-3
            return f

    total, scales, last, decode = timed_generation(Config("A", Gen("A", log), torch.zeros(1), {}), timer, seed=1)
    assert scales == pytest.approx([x / 1e3 for x in gpu_ms]) and decode == pytest.approx(4e-3)
    assert last == pytest.approx(0.25e-3)
    assert total == pytest.approx((sum(gpu_ms) + 0.25 + 4) / 1e3)
    assert fake.syncs == [("device", 0.0), ("event", pytest.approx(total))]   # before, and the last event


class _Clocked(_Logged):
    """A stand-in whose scale i takes (i + 1)·10 ms × seed × factor on a fake clock, its last sampling step
    1 ms and its decode 4 ms."""
    now = [0.0]

    def __init__(self, name, log, factor):
        super().__init__(name, log)
        self.factor = factor

    def sample_tokens(self, labels, seed=0, logits_hook=None, **kw):
        self.log.append(self.name)
        for si in range(3):
            self.now[0] += (si + 1) * 0.010 * seed * self.factor
            if logits_hook is not None:
                logits_hook(si, None)
        self.now[0] += 0.001
        return [], torch.zeros(1, 1, 1, 1)

    def decode_uint8(self, f):
        self.now[0] += 0.004
        return f.to(torch.uint8)


def test_the_breakdown_is_read_from_the_timed_generations(monkeypatch):
    """The per-scale times are the medians over the timed, alternated generations (seeds 1…4 here), not
    separate generations run one configuration after another; scales + the last sampling step + decode
    make up each timed generation."""
    monkeypatch.setattr(Timer, "mark", lambda self: _Clocked.now[0])
    log = []
    out = measure([Config("A", _Clocked("A", log, 1), torch.zeros(1), {}),
                   Config("B", _Clocked("B", log, 2), torch.zeros(1), {})], "cpu", reps=4, warmup=1, progress=False)
    for name, factor in (("A", 1), ("B", 2)):
        # median seed 2.5: scales 25, 50, 75 ms × factor; each generation 60 ms × seed × factor + 1 + 4 ms
        assert out[name]["breakdown"]["scale_ms"] == pytest.approx([25 * factor, 50 * factor, 75 * factor])
        assert out[name]["breakdown"]["decode_ms"] == pytest.approx(4.0) and out[name]["breakdown"]["n"] == 4
        assert out[name]["breakdown"]["last_step_ms"] == pytest.approx(1.0)
        assert out[name]["latency_ms"]["times_ms"] == pytest.approx([60 * s * factor + 5 for s in (1, 2, 3, 4)])


@pytest.mark.skipif(not HAVE_TINY, reason="no tiny assets")
def test_cli_compares_two_chains_writes_records_and_reuses_them(tmp_path, capsys):
    argv = ["latency", "--model", "tiny-var", "--method", "dense", "--method", "magnitude:sparsity=0.4",
            "--reps", "3", "--warmup", "1", "--threads", "1", "--quiet", "--results", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "dense" in out and "magnitude:sparsity=0.4" in out and "speed-up" in out and "1.00×" in out
    predicted = [line.split()[0] for line in out.splitlines() if " predicted " in line]
    assert "pass-cost model" in out and predicted == ["dense"]   # other weights: no prediction
    paths = sorted(tmp_path.glob("tiny/tiny-var/latency/*.json"))
    assert len(paths) == 2
    recs = [read_record(p) for p in paths]
    for r in recs:
        assert r["spec"]["bench"] == "latency" and r["spec"]["n"] == 3
        assert r["spec"]["protocol"] == {"version": 3, "device": "cpu", "batch": 1, "threads": 1,
                                         "compile": False, "warmup": 1}
        lat = r["metrics"]["latency_ms"]
        assert lat["value"] > 0 and len(lat["times_ms"]) == 3 and lat["iqr"] >= 0
        assert r["metrics"]["images_per_s"]["value"] == pytest.approx(1e3 / lat["value"])
        assert len(r["cost"]["per_scale_ms"]) == 7 and r["cost"]["decode_ms"] > 0 and r["cost"]["last_step_ms"] > 0
        assert len(r["cost"]["scale_flops"]) == 7 and r["cost"]["scale_passes"] == [True] * 7
        assert r["cost"]["threads"]["intra_op"] == 1
        assert r["cost"]["threads"]["cpus_available"] == len(os.sched_getaffinity(0))
    pruned = next(r for r in recs if r["spec"]["methods"])
    dense = next(r for r in recs if not r["spec"]["methods"])
    assert pruned["cost"]["params"] < dense["cost"]["params"]
    # memory per configuration, as if each ran alone: the pruned one holds fewer weights — 4 bytes per
    # pruned parameter, and per pruned key channel its zero key-bias buffer (4 blocks × 2 of 6 heads × 32)
    mem_p, mem_d = pruned["metrics"]["peak_mem_mb"], dense["metrics"]["peak_mem_mb"]
    assert mem_d["weights_mb"] - mem_p["weights_mb"] == pytest.approx(
        4 * (dense["cost"]["params"] - pruned["cost"]["params"] + 4 * 2 * 32) / 2 ** 20, rel=1e-9)
    for m in (mem_p, mem_d):
        assert m["working_mb"] > 0 and m["value"] == pytest.approx(m["weights_mb"] + m["working_mb"])
    created = {p.name: read_record(p)["created"] for p in paths}
    mtimes = {p.name: p.stat().st_mtime_ns for p in paths}
    assert main(argv) == 0                     # reused, not measured again
    capsys.readouterr()
    assert {p.name: p.stat().st_mtime_ns for p in paths} == mtimes and created
    assert main(["runs", "--json", "--results", str(tmp_path)]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert len(listing) == 2 and not any(r["stale"] for r in listing)
    assert main(["runs", "--results", str(tmp_path)]) == 0     # the table: latency shown, quality cells blank
    text = capsys.readouterr().out
    assert "latency_ms" in text.splitlines()[0] and "fid" not in text and "NaN" not in text
    # one measurement run = one group; timing dense again beside a new chain re-times its old partner too,
    # so that no record is left paired with a dense time from another run
    (g1,) = {r["metrics"]["latency_ms"]["group"] for r in recs}
    assert all(r["metrics"]["latency_ms"]["timed_with"] == sorted(x["run_id"] for x in recs) for r in recs)
    assert main(argv[:5] + ["--method", "fastvar"] + argv[7:]) == 0
    out = capsys.readouterr().out
    assert "fastvar" in out and "magnitude" not in out           # the report: what was asked
    now = [read_record(p) for p in sorted(tmp_path.glob("tiny/tiny-var/latency/*.json"))]
    groups = {r["metrics"]["latency_ms"]["group"] for r in now}
    assert len(now) == 3 and len(groups) == 1 and groups != {g1}
    assert main(argv) == 0                     # dense and magnitude: one group again, reused
    capsys.readouterr()
    assert [read_record(p)["metrics"]["latency_ms"]["group"] for p in paths] == [groups.pop()] * 2
    # beside a quality record the listing leaves each bench's missing metrics blank (no NaN)
    assert main(["run", "--model", "tiny-var", "--n", "12", "--quiet", "--results", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["runs", "--results", str(tmp_path)]) == 0
    head, *rows = capsys.readouterr().out.splitlines()
    assert {"fid", "latency_ms"} <= set(head.split()) and len(rows) == 4 and "NaN" not in "".join(rows)


@pytest.mark.skipif(not HAVE_TINY, reason="no tiny assets")
def test_random_weights_records_name_no_file_and_are_not_stale(tmp_path, capsys):
    argv = ["latency", "--model", "tiny-var", "--random-weights", "--reps", "3", "--warmup", "1", "--threads", "1",
            "--quiet", "--results", str(tmp_path), "--batch", "2"]
    assert main(argv) == 0
    (path,) = tmp_path.glob("tiny/tiny-var/latency/*.json")
    rec = read_record(path)
    assert rec["spec"]["ckpt"] == {"random-init": "torch.manual_seed(0)"}
    assert rec["metrics"]["images_per_s"]["value"] == pytest.approx(2e3 / rec["metrics"]["latency_ms"]["value"])
    capsys.readouterr()
    assert main(["runs", "--json", "--results", str(tmp_path)]) == 0
    assert not json.loads(capsys.readouterr().out)[0]["stale"]


@pytest.mark.parametrize("extra, msg", [
    (["--reps", "2"], "at least 3 timed generations"),
    (["--batch", "0"], "--batch 0"),
    (["--warmup", "0"], "--warmup 0"),
    (["--device", "coreml"], "macOS only"),
    (["--method", "magnitud"], "did you mean 'magnitude'"),
    (["--method", "dense", "--method", "dense"], "are the same configuration (dense): give it once"),
    (["--cuda-graphs"], "--cuda-graphs needs --device cuda (it replays captured GPU kernels), not 'cpu'"),
    (["--cuda-graphs", "--method", "magnitude:sparsity=0.4 + fastvar"], "fastvar:"),
])
@pytest.mark.skipif(not HAVE_TINY, reason="no tiny assets")
def test_bad_latency_arguments_are_one_clear_line(capsys, tmp_path, extra, msg):
    err = err_of(capsys, ["latency", "--model", "tiny-var", "--results", str(tmp_path), "--quiet", *extra])
    assert msg in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())


def test_compile_is_refused_for_core_ml():
    """A Core ML generator has no PyTorch blocks to compile (on macOS this check is what answers)."""
    with pytest.raises(ValueError, match="--compile applies to --device cpu or cuda"):
        LatencyBench(device="coreml", compile=True, compute_units="ALL")
    assert LatencyBench(device="coreml", compute_units="ALL").identity()["compile"] is False


def test_cuda_graphs_setting_is_checked_and_keyed():
    """Only graph runs carry the key (older records keep theirs); it needs CUDA and excludes --compile."""
    assert "cuda_graphs" not in LatencyBench(device="cuda").identity()
    bench = LatencyBench(device="cuda:1", cuda_graphs=True)
    assert bench.identity()["cuda_graphs"] is True
    assert LatencyBench.args_from_protocol(bench.identity())["cuda_graphs"] is True
    with pytest.raises(ValueError, match="give one"):
        LatencyBench(device="cuda", compile=True, cuda_graphs=True)
    with pytest.raises(ValueError, match="needs --device cuda"):
        LatencyBench(device="coreml", cuda_graphs=True, compute_units="ALL")


@pytest.mark.skipif(not HAVE_TINY, reason="no tiny assets")
def test_cuda_graphs_refuse_text_to_image_models_and_token_methods(capsys, tmp_path):
    err = err_of(capsys, ["latency", "--model", "tiny-t2i", "--cuda-graphs", "--results", str(tmp_path)])
    assert err == ("varbench: error: --model tiny-t2i is a text-to-image model; --cuda-graphs covers the "
                   "class-conditional VAR models: tiny-var, var-d16, var-d20, var-d24, var-d30\n")
    err = err_of(capsys, ["latency", "--model", "tiny-var", "--cuda-graphs", "--method", "dense",
                          "--method", "tome", "--results", str(tmp_path)])
    assert "is a token method" in err and "time it without --cuda-graphs" in err
    assert not any(tmp_path.iterdir())


def test_run_refuses_the_latency_bench(capsys):
    assert main(["run", "--model", "tiny-var", "--bench", "latency"]) == 2
    assert "run it with `varbench latency`" in capsys.readouterr().err


def _blocks_of_every_family():
    from bench.models.hart import HART
    from bench.models.hart_config import HARTConfig
    from bench.models.infinity import Infinity
    from tests.conftest import make_small_gen
    from tests.test_t2i import SMALL
    meta = json.loads((Path(__file__).parent / "fixtures/official/hart_golden.json").read_text())
    return {"var": list(make_small_gen().blocks), "infinity": list(Infinity(SMALL).block_list),
            "hart": list(HART(HARTConfig.from_dict(meta["varbench_config"]["a"])).blocks)}


def test_compile_wraps_the_routed_sublayers_of_every_block_and_leaves_the_block_eager():
    """Whole blocks would take a token policy's Python into the graphs (per-block specialisation,
    recompiles while timing); the sub-layers a policy routes are compiled instead, in every family."""
    from types import SimpleNamespace

    from bench.latency import install_compile
    for family, blocks in _blocks_of_every_family().items():
        install_compile(SimpleNamespace(blocks=blocks))
        for b in blocks:
            assert getattr(b, "_compiled_call_impl", None) is None, family
            compiled = {n for n, m in b.named_children() if getattr(m, "_compiled_call_impl", None) is not None}
            assert compiled == set(type(b).SUBLAYERS) and len(compiled) >= 2, (family, compiled)


def test_compile_settings_lift_dynamos_limit_and_make_hitting_it_an_error():
    """Past the recompile limit dynamo runs the rest eagerly and says so only in a log line: a
    compiled configuration would be timed partly eager. Lifted and made fatal for the measurement."""
    import torch._dynamo

    from bench.latency import compile_settings
    c = torch._dynamo.config
    before = (c.recompile_limit, c.accumulated_recompile_limit, c.fail_on_recompile_limit_hit)
    with compile_settings(True):
        assert c.recompile_limit >= 100_000 and c.accumulated_recompile_limit >= 100_000
        assert c.fail_on_recompile_limit_hit is True
    assert (c.recompile_limit, c.accumulated_recompile_limit, c.fail_on_recompile_limit_hit) == before
    with compile_settings(False):
        assert (c.recompile_limit, c.accumulated_recompile_limit, c.fail_on_recompile_limit_hit) == before


def test_the_compiled_warm_up_goes_on_until_a_generation_compiles_nothing(monkeypatch, capsys):
    import bench.latency as L
    state = {"graphs": 0, "gens": 0, "new": [], "times": []}

    def fake_generation(cfg, timer, seed):
        i = state["gens"]
        state["gens"] += 1
        state["graphs"] += state["new"][i]
        return state["times"][i], [], 0.0, 0.0

    monkeypatch.setattr(L, "timed_generation", fake_generation)
    monkeypatch.setattr(L, "compiled_graphs", lambda: state["graphs"])
    installed = []
    monkeypatch.setattr(L, "install_compile", installed.append)

    def warm(warmup, compile, new, times):
        state.update(graphs=7, gens=0, new=new, times=times)   # graphs compiled before: not this warm-up's
        cfg = Config("c", f"gen-{len(state['times'])}", None, {})
        installed.clear()
        L.warm_up(cfg, None, warmup, 0, compile)
        assert installed == ([cfg.gen] if compile else [])     # the sub-layers wrapped before the first generation
        return cfg, state["gens"]

    cfg, gens = warm(1, True, [5, 3, 0, 0], [3.0, 2.0, 0.5, 0.5])   # the second generation compiles again
    assert gens == 3 and cfg.compile_graphs == 8 and cfg.compile_s == pytest.approx(3.0 + 2.0 + 0.5 - 3 * 0.5)
    cfg, gens = warm(4, True, [5, 0, 0, 0, 0], [3.0, 0.5, 0.5, 0.5, 0.5])   # at least --warmup generations
    assert gens == 4 and cfg.compile_graphs == 5
    cfg, gens = warm(2, False, [0, 0, 0], [1.0, 1.0, 1.0])
    assert gens == 2 and cfg.compile_s is None and cfg.compile_graphs is None
    assert "warning" not in capsys.readouterr().err
    cfg, gens = warm(2, True, [2, 0, 0], [0.5, 0.6, 0.7])   # slower at the end: no negative compile time
    assert gens == 2 and cfg.compile_s == 0.0 and cfg.compile_graphs == 2
    cfg, gens = warm(1, True, [1] * 20, [1.0] * 20)   # never settles: bounded, and said
    assert gens == 1 + L.COMPILE_SETTLE
    assert capsys.readouterr().err == (f"warning: c: still compiling after {1 + L.COMPILE_SETTLE} warm-up generations; "
                                       f"the timed ones may include compile time (see compile_graphs_timed in its "
                                       f"record)\n")


def test_measure_counts_graphs_compiled_while_timed_and_says_so(monkeypatch, capsys):
    """Under --compile, graphs compiled during the timed generations are counted per configuration and
    warned about; the warm-up's compile time and graphs go to the result; peak memory is measured on its
    own seed; no progress bar when asked for none."""
    import contextlib

    import bench.latency as L
    state, seen = {"graphs": 3}, []

    def fake_generation(cfg, timer, seed):
        seen.append((cfg.label, seed))
        if cfg.label == "B" and seed == 7:
            state["graphs"] += 2                     # B compiles during its second timed generation
        return 0.01 * seed, [0.0012345, 0.002], 0.0005 * seed, 0.004

    monkeypatch.setattr(L, "timed_generation", fake_generation)
    monkeypatch.setattr(L, "compiled_graphs", lambda: state["graphs"])
    monkeypatch.setattr(L, "install_compile", lambda gen: None)
    monkeypatch.setattr(L, "compile_settings", lambda on: contextlib.nullcontext())
    monkeypatch.setattr(L, "peak_memory", lambda cfg, timer, seed: seen.append(("mem", cfg.label, seed)) or None)
    out = L.measure([Config("A", None, None, {}), Config("B", None, None, {})], "cpu", reps=3, warmup=1, seed=5,
                    compile=True, progress=False)
    assert seen == [("A", 5), ("B", 5), ("A", 6), ("B", 6), ("B", 7), ("A", 7), ("A", 8), ("B", 8),
                    ("mem", "A", 6), ("mem", "B", 6)]
    assert out["A"]["compile"] == {"compile_s": 0.0, "compile_graphs": 0, "compile_graphs_timed": 0}
    assert out["B"]["compile"] == {"compile_s": 0.0, "compile_graphs": 0, "compile_graphs_timed": 2}
    assert capsys.readouterr().err == ("warning: B: 2 graph(s) compiled during the timed generations; its times "
                                       "include compiling\n")
    assert out["A"]["latency_ms"]["times_ms"] == [60.0, 70.0, 80.0] and out["A"]["latency_ms"]["value"] == 70.0
    assert out["A"]["breakdown"] == {"scale_ms": [round(1.2345, 3), 2.0], "last_step_ms": 3.5, "decode_ms": 4.0, "n": 3}
    assert out["A"]["peak_mem"] is None and out["A"]["graphs"] is None
    out = L.measure([Config("A", None, None, {})], "cpu", reps=3, warmup=1, progress=False)   # eager: no compile entry
    assert out["A"]["compile"] is None and capsys.readouterr().err == ""


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TINY, reason="no tiny assets")
def test_compile_reports_compile_time_separately_and_never_falls_back_to_eager(tmp_path, capsys):
    """Two configurations compiled in one run share dynamo's caches: the second (a token method, more
    shapes) compiles all it needs within the warm-up (on tiny-t2i, FastVAR's whole blocks once hit the
    old limit of blocks x scales + 8 and ran the rest eagerly), the records say how many graphs, and
    no timed generation compiles. --warmup 1 still warms up until a generation compiles nothing."""
    argv = ["latency", "--model", "tiny-var", "--method", "dense", "--method", "fastvar:schedule=var", "--compile",
            "--reps", "3", "--warmup", "1", "--threads", "1", "--quiet", "--results", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert "torch.compile" in out.out and "graphs" in out.out and "warning" not in out.err
    recs = [read_record(p) for p in tmp_path.glob("tiny/tiny-var/latency/*.json")]
    assert len(recs) == 2
    for rec in recs:
        assert rec["spec"]["protocol"]["compile"] is True and rec["cost"]["compile_s"] > 0
        assert rec["cost"]["compile_graphs"] > 0 and rec["cost"]["compile_graphs_timed"] == 0


@pytest.mark.skipif(not HAVE_TINY, reason="no tiny assets")
def test_the_runner_runs_a_latency_spec_as_the_latency_bench(tmp_path):
    """A table whose bench is `latency` goes through bench.runner.run like any other."""
    from bench.latency import latency_specs
    from bench.runner import run
    (spec,) = latency_specs("tiny-var", ["dense"], 3, 0, dict(device="cpu", batch=1, threads=1, compile=False,
                                                               warmup=1))
    rec = run(spec, root=tmp_path, progress=False)
    assert rec["spec"]["bench"] == "latency" and rec["metrics"]["latency_ms"]["n"] == 3
    assert read_record(spec.path(tmp_path))["run_id"] == spec.key()


@pytest.mark.skipif(not HAVE_TINY, reason="no tiny assets")
def test_text_to_image_models_are_timed_on_the_worlds_geneval_prompts(tmp_path, capsys, monkeypatch):
    """tiny-t2i: the timed generations are conditioned on shapes-geneval's first prompts (the text encoder
    inside the time); the record carries the text-to-image costs; Core ML is refused for it."""
    from bench.benches.geneval import shapes_metadata
    from bench.latency import latency_conditions, latency_specs
    from bench.models.t2i import T2IGenerator
    from bench.registry import MODELS
    (spec,) = latency_specs("tiny-t2i", ["dense"], 3, 0, dict(device="cpu", batch=2, threads=1, compile=False,
                                                               warmup=1))
    rows = shapes_metadata()
    assert latency_conditions(spec, MODELS.get("tiny-t2i"), 2) == [rows[0]["prompt"], rows[1]["prompt"]]
    seen = []
    orig = T2IGenerator.sample_tokens

    def sample_tokens(self, prompts, seed=0, **kw):
        seen.append(list(prompts))
        return orig(self, prompts, seed=seed, **kw)
    monkeypatch.setattr(T2IGenerator, "sample_tokens", sample_tokens)
    argv = ["latency", "--model", "tiny-t2i", "--reps", "3", "--warmup", "1", "--threads", "1", "--batch", "2",
            "--quiet", "--results", str(tmp_path)]
    assert main(argv) == 0
    assert len(seen) == 1 + 3 + 1 and all(p == [rows[0]["prompt"], rows[1]["prompt"]] for p in seen)  # warm-up, timed, memory
    (path,) = tmp_path.glob("tiny/tiny-t2i/latency/*.json")
    rec = read_record(path)
    assert rec["cost"]["text_encoder_params"] > 0 and rec["cost"]["flops"] > rec["cost"]["flops_no_cfg"]
    assert len(rec["cost"]["per_scale_ms"]) == len(MODELS.get("tiny-t2i")().schedule)
    with pytest.raises(ValueError, match="class-conditional VAR models"):
        latency_specs("tiny-t2i", ["dense"], 3, 0, dict(device="coreml", batch=1, threads=None, compile=False,
                                                         warmup=1, compute_units="ALL", precision="fp16"))


def test_per_scale_costs_attribute_flops_to_scales_and_passes(small_gen):
    from bench.accounting import model_cost
    from bench.method import Context, build_method
    gen = small_gen
    dense = model_cost(gen, {"cfg": 2.0}, per_scale=True)
    K = len(gen.scales_hw)
    assert dense["scale_passes"] == [True] * K and len(dense["scale_flops"]) == K
    # every scale's share is positive and grows with its tokens; together they are the sampling FLOPs
    # but the last scale's VQVAE step after its logits (φ)
    f = dense["scale_flops"]
    assert all(b > a > 0 for a, b in zip(f, f[1:]))
    assert 0.99 * dense["flops"] < sum(f) <= dense["flops"]
    build_method("lazyvar:keep=0.5/0.5/0.5").apply(gen, Context())
    lazy = model_cost(gen, {"cfg": 2.0}, per_scale=True)
    assert lazy["scale_passes"] == [True] * (K - 2) + [False, False]
    # the group's pass is on its first scale; the others only embed and read their kept tokens' logits
    assert max(lazy["scale_flops"][-2:]) < 0.2 * lazy["scale_flops"][-3]
    assert lazy["scale_flops"][:K - 3] == f[:K - 3]


def test_pass_model_recovers_an_affine_cost_and_predicts_other_passes():
    from bench.latency import pass_model, predicted_scales_ms
    F_s = [0.1e9, 1e9, 2e9, 4e9, 8e9]
    base = {"per_scale_ms": [9.0] + [5 + 2 * x / 1e9 for x in F_s[1:]], "scale_flops": F_s,
            "scale_passes": [True] * 5}
    a, b, r2 = pass_model(base)
    assert (a, b, r2) == pytest.approx((5.0, 2.0, 1.0))
    assert predicted_scales_ms(base, base, a, b) == pytest.approx(sum(base["per_scale_ms"]))
    grouped = {"scale_flops": [0.1e9, 1e9, 3e9, 0.5e9, 0.5e9], "scale_passes": [True, True, True, False, False]}
    assert predicted_scales_ms(grouped, base, a, b) == pytest.approx(9 + (5 + 2) + (5 + 6) + 1 + 1)
    assert pass_model({**base, "scale_passes": [True, True, False, True, True]}) is None   # not all passes
    assert pass_model({"per_scale_ms": base["per_scale_ms"]}) is None                      # an older record


def test_pass_cost_span_is_where_the_predicted_speed_up_reaches_the_criterion():
    """The bound is exact: at it the predicted speed-up is (1 − tol) × the FLOPs ratio; below it more, above less."""
    from bench.latency import pass_cost_span, predicted_scales_ms
    b = 2.0
    base = {"per_scale_ms": [0.5, 0, 0, 0, 0], "scale_flops": [0.1e9, 1e9, 2e9, 4e9, 8e9],
            "scale_passes": [True] * 5, "flops": 15.1e9}
    # fewer passes (a LazyVAR-like group of the last three scales, a tenth of their FLOPs)
    grouped = {"scale_flops": [0.1e9, 1e9, 1.4e9, 0, 0], "scale_passes": [True, True, True, False, False], "flops": 2.5e9}
    lo, hi = pass_cost_span(grouped, base, b)
    assert lo == 0 and 0 < hi < np.inf

    def share(cost, a, base=base):   # predicted speed-up over the base, as a share of the FLOPs ratio
        speed = predicted_scales_ms(base, base, a, b) / predicted_scales_ms(cost, base, a, b)
        return speed / (base["flops"] / cost["flops"])
    assert share(grouped, hi) == pytest.approx(0.85)
    assert share(grouped, 0.9 * hi) > 0.85 > share(grouped, 1.1 * hi)
    # the same passes and a FLOPs ratio near 1: any fixed cost does (every pass is paid by both)
    light = {**base, "scale_flops": [0.1e9, 1e9, 2e9, 4e9, 7e9], "flops": 14.1e9}
    assert pass_cost_span(light, base, b) == (0.0, np.inf)
    # fewer passes but the FLOP-proportional time alone falls short (scale 0 caps it): none
    tiny = {"scale_flops": [0.1e9, 1e6, 0, 0, 0], "scale_passes": [True, True, False, False, False], "flops": 0.101e9}
    lo, hi = pass_cost_span(tiny, base, b)
    assert lo > hi
    assert pass_cost_span({"flops": 1e9}, base, b) is None      # an older record without the breakdown
    # fewer passes, most FLOPs saved where the model charges no time (scale 0 is taken as measured):
    # only a large enough fixed cost per pass makes the saved passes pay
    heavy = {**base, "scale_flops": [10e9, 1e9, 2e9, 4e9, 8e9], "flops": 25e9}
    fewer = {"scale_flops": [0.1e9, 1e9, 14e9, 0, 0], "scale_passes": [True, True, True, False, False], "flops": 15.1e9}
    lo, hi = pass_cost_span(fewer, heavy, b)
    assert 0 < lo < hi == np.inf
    assert share(fewer, lo, heavy) == pytest.approx(0.85)
    assert share(fewer, 0.9 * lo, heavy) < 0.85 < share(fewer, 1.1 * lo, heavy)


def test_report_prints_each_configuration_against_the_criterion():
    from types import SimpleNamespace

    from bench.latency import pass_cost_span, report
    F_s = [0.1e9, 1e9, 2e9, 4e9, 8e9]

    def rec(per_scale, flops, passes, total):
        lat = {"value": total, "iqr": 0.0, "p90": total, "ci95": [total, total]}
        return {"metrics": {"latency_ms": lat, "images_per_s": {"value": 1e3 / total}, "peak_mem_mb": {"value": 1.0, "weights_mb": 0.8, "working_mb": 0.2}},
                "cost": {"params": 10, "flops": sum(flops), "per_scale_ms": per_scale, "decode_ms": 1.0,
                         "scale_flops": flops, "scale_passes": passes}, "timings": {}}
    dense = rec([0.5] + [5 + 2 * x / 1e9 for x in F_s[1:]], F_s, [True] * 5, 60.0)
    group_flops = [0.1e9, 1e9, 1.4e9, 0, 0]
    group = rec([0.5, 7.0, 7.8, 0.1, 0.1], group_flops, [True, True, True, False, False], 20.0)
    light = rec([0.5, 7.0, 9.0, 13.0, 19.0], [0.1e9, 1e9, 2e9, 4e9, 7e9], [True] * 5, 58.0)   # 0.97 of its ratio
    spec = SimpleNamespace(model="m", n=3, protocol={"device": "cpu", "batch": 1, "threads": 2, "warmup": 1})
    out = report([spec] * 3, [dense, group, light], ["dense", "group", "light"])
    line = next(x for x in out.splitlines() if x.lstrip().startswith("group") and "FLOPs ratio (" in x)
    share = sum(dense["cost"]["per_scale_ms"]) / sum(group["cost"]["per_scale_ms"]) / (sum(F_s) / sum(group_flops))
    hi = pass_cost_span(group["cost"], dense["cost"], 2.0)[1]
    assert line.split()[1] == f"{share:.2f}" and "misses the criterion" in line and f"≤ {hi:.1f} ms per pass" in line
    line = next(x for x in out.splitlines() if x.lstrip().startswith("light") and "FLOPs ratio (" in x)
    assert line.split()[1] == "0.97" and "meets the criterion" in line and "at any fixed cost" in line
    assert "fitted here: 5.0 ms" in out and not any(x.lstrip().startswith("dense") and "FLOPs ratio (" in x
                                                     for x in out.splitlines())


@pytest.mark.parametrize("model", ["infinity-2b", "hart-0.7b"])
def test_random_weights_of_a_paper_text_to_image_model_are_refused(capsys, tmp_path, model):
    """Their prompts need the pretrained text model: refused before anything is built (it used to build
    the 2B random model, then fail with a traceback)."""
    err = err_of(capsys, ["latency", "--model", model, "--random-weights", "--results", str(tmp_path), "--quiet"])
    assert "pretrained text model" in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())


def test_more_threads_than_usable_cpus_is_warned_before_timing(monkeypatch, capsys):
    import bench.benches.latency as BL
    import bench.latency as L
    # the default: the CPUs this process may use (its affinity mask), not the machine's count
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert LatencyBench().threads == 1
    monkeypatch.undo()
    monkeypatch.setattr(BL, "available_cpus", lambda: 2)

    class Timed(Exception):
        pass

    def stop(*a, **k):
        raise Timed
    monkeypatch.setattr(L, "run_latency", stop)
    base = ["latency", "--model", "tiny-var", "--random-weights", "--quiet"]
    with pytest.raises(Timed):
        main(base + ["--threads", "3"])
    err = capsys.readouterr().err
    assert "warning: --threads 3 is more than the 2 CPUs this process may use" in err and "(the default is 2)" in err
    for ok in (["--threads", "2"], []):
        with pytest.raises(Timed):
            main(base + ok)
        assert "warning" not in capsys.readouterr().err


def test_latency_specs_refusals_checkpoints_and_class_conditions(tmp_path):
    """What latency_specs refuses (whole messages), that a run without --random-weights needs the
    checkpoint files (named) and one with them needs none, that Core ML takes a class-conditional model,
    and that batch labels cycle through the classes."""
    from bench.checkpoint import CheckpointNotFound
    from bench.latency import latency_conditions, latency_specs
    from bench.registry import MODELS
    cpu = dict(device="cpu", batch=1, threads=1, compile=False, warmup=1)
    with pytest.raises(ValueError, match=r"^--random-weights: infinity-2b encodes its prompts with a pretrained text "
                                         r"model, which has no random stand-in here; time it with its checkpoint files "
                                         r"\(--ckpt-dir\), or time tiny-t2i$"):
        latency_specs("infinity-2b", ["dense"], 3, 0, cpu, random_weights=True)
    coreml = dict(cpu, device="coreml", compute_units="ALL")
    with pytest.raises(ValueError, match=r"^--device coreml: the Core ML export covers the class-conditional VAR "
                                         r"models; tiny-t2i is a t2i model \(time it with --device cpu or cuda\)$"):
        latency_specs("tiny-t2i", ["dense"], 3, 0, coreml)
    (spec,) = latency_specs("tiny-var", ["dense"], 3, 0, coreml)
    assert spec.protocol["device"] == "coreml"
    with pytest.raises(CheckpointNotFound, match="var_d16.pth"):
        latency_specs("var-d16", ["dense"], 3, 0, cpu, ckpt_dir=tmp_path)
    (spec,) = latency_specs("var-d16", ["dense"], 3, 7, cpu, ckpt_dir=tmp_path, random_weights=True)
    assert spec.ckpt == {"random-init": "torch.manual_seed(7)"}
    assert latency_conditions(spec, MODELS.get("var-d16"), 3).tolist() == [0, 1, 2]
    assert latency_conditions(spec, MODELS.get("tiny-var"), 14).tolist() == list(range(12)) + [0, 1]


def test_weights_are_counted_on_a_numbered_device_and_the_cpu_generation_reuses_the_heap(monkeypatch):
    import contextlib

    import bench.models.heap as heap
    lin = torch.nn.Linear(64, 64)
    assert weights_mb(lin, "cpu:0") == weights_mb(lin, "cpu") == pytest.approx((64 * 64 + 64) * 4 / 2 ** 20)
    seen = []

    @contextlib.contextmanager
    def reuse(on):
        seen.append(on)
        yield
    monkeypatch.setattr(heap, "reuse_heap", reuse)

    class Gen:
        def sample_tokens(self, labels, seed=0, logits_hook=None, **kw):
            logits_hook(0, None)
            return [], torch.zeros(1, 1, 1, 1)

        def decode_uint8(self, f):
            return f
    timed_generation(Config("A", Gen(), torch.zeros(1), {}), Timer("cpu"), seed=0)
    assert seen == [True]        # on the CPU the allocator's heap is kept between generations


def test_timing_partners_are_the_current_records_timed_with_the_request(tmp_path):
    """The records of configurations timed in the same run as a requested one (same group), read once each,
    none of the requested ones; hidden files (records being written), unreadable files and other groups
    are passed over."""
    from bench.latency import latency_specs, timing_partners
    from bench.records import make_record, write_record
    setting = dict(device="cpu", batch=1, threads=1, compile=False, warmup=1)
    a, b, c, d = latency_specs("tiny-var", ["dense", "magnitude:sparsity=0.2", "magnitude:sparsity=0.4",
                                            "magnitude:sparsity=0.6"], 3, 0, setting, random_weights=True)

    def record(spec, group):
        rec = make_record(spec, {"latency_ms": {"value": 5.0, "stderr": 0.1, "group": group}}, {}, {"total_s": 1.0})
        write_record(spec.path(tmp_path), rec)
        return rec
    rec_a = record(a, "run-1")
    record(b, "run-1")
    record(c, "run-2")
    folder = a.path(tmp_path).parent
    shutil.copy(b.path(tmp_path), folder / "copy-of-b.json")            # the same run twice: one partner
    rec_d = json.loads(json.dumps(record(d, "run-1")))
    d.path(tmp_path).rename(folder / ".being-written.json")
    (folder / "0-broken.json").write_text("{not json")                 # sorts first
    assert [s.key() for s in timing_partners([a], [rec_a], tmp_path)] == [b.key()]
    assert timing_partners([a, b], [rec_a, None], tmp_path) == []
    assert timing_partners([a], [None], tmp_path) == [] and rec_d["run_id"] == d.key()


def test_available_cpus_is_the_affinity_mask_else_the_machines_count(monkeypatch):
    from bench.benches.latency import available_cpus
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 5, 6} if pid == 0 else set(range(9)), raising=False)
    assert available_cpus() == 3                # this process's mask (pid 0), not another's
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set())
    assert available_cpus() == 1
    for error in (AttributeError, OSError):     # macOS has no affinity masks; a sandbox may refuse the call
        def refuse(pid, error=error):
            raise error("no affinity")
        monkeypatch.setattr(os, "sched_getaffinity", refuse)
        assert available_cpus() == 8
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert available_cpus() == 1


def test_every_setting_refused_in_full():
    from bench.defaults import COMPUTE_UNITS
    units = ", ".join(COMPUTE_UNITS)
    for kw, msg in ((dict(batch=0), "--batch 0: must be in [1, 4096]"), (dict(batch=4097), "--batch 4097: must be in [1, 4096]"),
                    (dict(warmup=0), "--warmup 0: must be ≥ 1 (the first generation allocates and warms caches)"),
                    (dict(threads=0), "--threads 0: must be ≥ 1"),
                    (dict(device="coreml"), f"--compute-units None: expected one of {units}"),
                    (dict(device="coreml", compute_units="GPU"), f"--compute-units 'GPU': expected one of {units}"),
                    (dict(device="cpu", compute_units="ALL"), "--compute-units applies to --device coreml only"),
                    (dict(device="cuda", compute_units="ALL"), "--compute-units applies to --device coreml only"),
                    (dict(device="coreml", compute_units="ALL", compile=True),
                     "--compile applies to --device cpu or cuda (torch.compile); Core ML compiles its package itself "
                     "when it loads it")):
        with pytest.raises(ValueError) as e:
            LatencyBench(**kw)
        assert str(e.value) == msg
    b = LatencyBench(device="coreml", compute_units=COMPUTE_UNITS[0], precision="fp32", threads=1)
    assert (b.compute_units, b.precision, b.threads, b.batch, b.warmup) == (COMPUTE_UNITS[0], "fp32", 1, 1, 2)
    assert b.identity() == {"version": 3, "device": "coreml", "batch": 1, "threads": None, "compile": False,
                            "warmup": 2, "compute_units": COMPUTE_UNITS[0], "precision": "fp32"}
    assert LatencyBench(threads=2, precision="fp32").identity() == {
        "version": 3, "device": "cpu", "batch": 1, "threads": 2, "compile": False, "warmup": 2}
