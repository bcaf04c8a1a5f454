"""The latency bench's numbers as users read them: the bootstrap CI of the median by hand, and the
comparison report in full (header, columns, Core ML op counts, per-scale times, the pass-cost model and
the FLOPs-ratio criterion) for two fixed sets of records whose ratios are worked out below."""
from types import SimpleNamespace

import numpy as np
import pytest

from bench.latency import BOOTSTRAP, report, summarize


def test_the_ci_is_the_2_5_and_97_5_percentiles_of_bootstrapped_medians():
    t = [0.5, 0.1, 0.3, 0.2, 0.4, 0.9, 0.35, 0.123456789] + list(np.random.default_rng(0).random(22))
    s = summarize(t, seed=11)
    ms = np.asarray(t) * 1e3
    rng = np.random.default_rng(11)
    medians = np.median(ms[rng.integers(0, len(ms), size=(BOOTSTRAP, len(ms)))], axis=1)
    assert s["ci95"] == [float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))]
    assert s["ci95"] != summarize(t, seed=12)["ci95"]
    assert s["stderr"] is None and s["times_ms"][:8] == [500.0, 100.0, 300.0, 200.0, 400.0, 900.0, 350.0, 123.457]
    assert set(s) == {"value", "stderr", "n", "iqr", "p90", "ci95", "min", "max", "times_ms"}
    with pytest.raises(ValueError, match=r"^need ≥ 3 finite times, got \[0\.1, 0\.2\]$"):
        summarize([0.1, 0.2])


def _rec(per_scale, flops, passes, total, params=10, mem=(1.0, 0.8, 0.2), iqr=0.25, times=None, **cost):
    lat = {"value": total, "iqr": iqr * total, "p90": 1.1 * total, "ci95": [0.9 * total, 1.2 * total],
           **({"times_ms": times} if times else {})}
    metrics = {"latency_ms": lat, "images_per_s": {"value": 1e3 / total}}
    if mem:
        metrics["peak_mem_mb"] = {"value": mem[0], "weights_mb": mem[1], "working_mb": mem[2]}
    return {"metrics": metrics, "timings": {"coreml_load_s": 1.5} if "ops_cpu" in cost else {},
            "cost": {"params": params, "flops": sum(flops), "per_scale_ms": per_scale, "decode_ms": 1.0,
                     "scale_flops": flops, "scale_passes": passes, **cost}}


F_S = [0.1e9, 1e9, 2e9, 4e9, 8e9]


def test_the_report_in_full_with_the_pass_cost_model():
    """Dense scales 2…5 cost 5 ms + 2 ms/GFLOP exactly, so the fit is a = 5.0, b = 2.00, R² 1. 'group' runs
    scales 3–5 in one pass (LazyVAR-like); 'light' drops FLOPs of the last scale; 'other' has other weights
    and is left out of the model's predictions."""
    dense = _rec([0.5] + [5 + 2 * x / 1e9 for x in F_S[1:]], F_S, [True] * 5, 60.0, mem=(100.0, 80.0, 20.0),
                 times=[60.0] * 3)
    group = _rec([0.5, 7.0, 7.8, 0.1, 0.1], [0.1e9, 1e9, 1.4e9, 0, 0], [True, True, True, False, False], 20.0,
                 times=[20.0] * 3, iqr=0.1)   # 10 %: not flagged
    light = _rec([0.5, 7.0, 9.0, 13.0, 19.0], [0.1e9, 1e9, 2e9, 4e9, 7e9], [True] * 5, 58.0, last_step_ms=2.4,
                 times=[58.0] * 3, iqr=0.05)
    other = _rec([0.5, 7.0, 9.0, 13.0, 19.0], [0.1e9, 1e9, 2e9, 4e9, 7e9], [True] * 5, 30.0, params=5)
    spec = SimpleNamespace(model="m", n=3, protocol={"device": "cpu", "batch": 1, "threads": 2, "warmup": 1})
    out = report([spec] * 4, [dense, group, light, other], ["dense", "group", "light", "a-very-long-configuration-label-cut"])
    assert out.splitlines() == [
        "m · cpu · batch 1 · threads 2 · 3 timed generations per configuration, alternated, after 1 warm-up",
        "configuration                       median ms      IQR       p90     95% CI of median   img/s  peak MiB "
        " (weights + working)  speed-up FLOPs ratio",
        "dense                                    60.0     15.0      66.0         [54.0, 72.0]  16.667       100"
        "        80       20.0     1.00×       1.00×",
        "group                                    20.0      2.0      22.0         [18.0, 24.0]  50.000         1"
        "         1        0.2     3.00×       6.04×",
        "light                                    58.0      2.9      63.8         [52.2, 69.6]  17.241         1"
        "         1        0.2     1.03×       1.07×",
        "a-very-long-configuration-label-cu       30.0      7.5      33.0         [27.0, 36.0]  33.333         1"
        "         1        0.2     2.00×       1.07×",
        # constant times: each CI is the ratio itself; 'other' has no times (a record from before they were kept)
        "95 % CI of each speed-up (bootstrap of the ratio of medians, 2000 resamples): group [3.00, 3.00]×; "
        "light [1.03, 1.03]×",
        "noisy: IQR above 10% of the median for dense 25%, a-very-long-configuration-label-cu 25% (a busy machine; "
        "more --reps or a quieter moment narrows it)",
        "per-scale ms (medians over the timed generations; last = the last scale's sampling step; decode = VQVAE "
        "decode + uint8), and the scales' speed-up (last step and decode left out, as in the FLOPs ratio):",
        "  dense                            0 7 9 13 21 | decode 1 | scales 50 ms, 1.00×",
        "  group                            0 7 8 0 0 | decode 1 | scales 16 ms, 3.26×",
        "  light                            0 7 9 13 19 | last 2 | decode 1 | scales 48 ms, 1.04×",   # old records: no last
        "  a-very-long-configuration-label- 0 7 9 13 19 | decode 1 | scales 48 ms, 1.04×",
        "pass-cost model from the first configuration's scales 1…K−1: t = 5.0 ms per pass through the blocks + "
        "2.00 ms/GFLOP (R² 1.000); what each configuration would take if its passes cost what the first's do at "
        "the same FLOPs (scale 0 as measured for the first; same weights only):",
        "  dense                            predicted 51 ms, 1.00× (measured 1.00×: 1.00 of predicted time)",
        "  group                            predicted 15 ms, 3.30× (measured 3.26×: 1.01 of predicted time)",
        "  light                            predicted 49 ms, 1.04× (measured 1.04×: 1.00 of predicted time)",
        "speed-up of the scales against the FLOPs ratio (criterion: ≥ 0.85 of it), and the fixed cost per pass "
        "at which the model above would meet it (fitted here: 5.0 ms):",
        # group: (50.5/15.5) / (15.1/2.5) = 0.54; k = 0.85·6.04, bound (k·5.3 − 30.5) / (4 − 2k) = 0.5 ms
        "  group                            0.54 of its FLOPs ratio (misses the criterion); the model would meet it "
        "with ≤ 0.5 ms per pass",
        # light: (50.5/48.5) / (15.1/14.1) = 0.97; more passes' cost never hurts it (bound < 0)
        "  light                            0.97 of its FLOPs ratio (meets the criterion); the model would meet it "
        "at any fixed cost",
        "speed-up = median of the first configuration / median of this one (one run, same machine); FLOPs ratio "
        "likewise from the transformer's sampling FLOPs; peak memory = the configuration's weights + the peak "
        "working memory of one generation (as if it ran alone)"]


def test_speedup_ci_is_a_bootstrap_of_the_ratio_of_medians():
    from bench.latency import speedup_ci
    assert speedup_ci([10.0] * 5, [5.0] * 5) == (2.0, 2.0)
    base, fast = [9.0, 10.0, 11.0, 10.5, 9.5], [4.0, 5.0, 6.0, 5.5, 4.5]
    lo, hi = speedup_ci(base, fast, seed=1)
    assert speedup_ci(base, fast, seed=1) == (lo, hi)   # seeded
    # the extremes: the fastest base median over the slowest other one, and the reverse (here 9/6, 11/4)
    assert 1.5 <= lo < 2.0 < hi <= 2.75
    assert speedup_ci(fast, base, seed=1) == pytest.approx((1 / hi, 1 / lo), rel=0.15)
    lo2, hi2 = speedup_ci([x * 2 - 10 for x in base], fast, seed=1)   # base spread doubled: a wider interval
    assert hi2 - lo2 > hi - lo
    # every time can be drawn (the first too): a median of 3 draws holds the outlier in 7/27 of the resamples
    assert speedup_ci([1000.0, 10.0, 10.0], [10.0] * 3) == (1.0, 100.0)
    assert speedup_ci([10.0] * 3, [1000.0, 10.0, 10.0]) == (0.01, 1.0)
    # the documented protocol: 2000 resamples of each configuration on its own, the 2.5th and 97.5th percentiles
    t_a, t_b = np.array([9.0, 10.0, 11.0, 12.0, 30.0, 8.5]), np.array([5.0, 4.0, 6.5, 5.5, 4.5, 7.0])
    rng = np.random.default_rng(3)
    ma = np.median(t_a[rng.integers(0, 6, size=(2000, 6))], axis=1)
    mb = np.median(t_b[rng.integers(0, 6, size=(2000, 6))], axis=1)
    assert speedup_ci(t_a, t_b, seed=3) == tuple(np.percentile(ma / mb, [2.5, 97.5]))


def test_the_report_of_compiled_and_core_ml_runs_without_a_breakdown_model():
    """torch.compile in the header and per configuration; Core ML's op counts and load time; no peak
    memory for Core ML; fewer than four scales: no pass-cost model."""
    compiled = _rec([1.0, 2.0, 3.0], [1e9, 2e9, 3e9], [True] * 3, 8.0, compile_s=12.34, compile_graphs=3, iqr=0.0)
    coreml = _rec([1.0, 1.0, 1.0], [1e9, 2e9, 3e9], [True] * 3, 4.0, mem=None, ops_cpu=5, ops_gpu=7, ops_npu=0,
                  iqr=0.0)
    spec = SimpleNamespace(model="tiny-var", n=5, protocol={"device": "cpu", "batch": 2, "warmup": 2, "compile": True})
    out = report([spec] * 2, [compiled, coreml], ["compiled", "coreml"]).splitlines()
    assert out[0] == ("tiny-var · cpu · batch 2 · torch.compile · 5 timed generations per configuration, alternated, "
                      "after 2 warm-up (more under torch.compile until one compiles nothing)")
    assert out[3] == ("coreml                                    4.0      0.0       4.4           [3.6, 4.8] 250.000"
                      "         –                          2.00×       1.00×")
    assert out[4] == "  coreml                                   Core ML ops: CPU 5  GPU 7  NPU 0  (load 1.50 s)"
    assert out[6] == "  compiled                         1 2 3 | decode 1 | compile 12.3 s, 3 graphs | scales 6 ms, 1.00×"
    assert out[7] == "  coreml                           1 1 1 | decode 1 | scales 3 ms, 2.00×"
    assert len(out) == 9 and out[8].startswith("speed-up = median of the first configuration")


def test_report_criterion_text_when_a_fixed_cost_helps_and_when_nothing_does():
    """b = 1 ms/GFLOP, scale 0 costs 0 ms; the base's scale 0 holds half its FLOPs (8 GFLOPs in all), the
    configuration has 2.2 GFLOPs: k = 0.85·8/2.2. With one pass after scale 0 (P = 1 < P_base / k) a fixed
    cost a ≥ (k·2.2 − 4) / (4 − k) would meet the criterion; with two passes (4 − 2k < 0) no a ≥ 0 does."""
    from bench.latency import _criterion_text
    base = {"flops": 8e9, "scale_flops": [4e9, 1e9, 1e9, 1e9, 1e9], "scale_passes": [True] * 5,
            "per_scale_ms": [0.0, 1.0, 1.0, 1.0, 1.0]}
    one = {"flops": 2.2e9, "scale_flops": [0, 1e9, 1.2e9, 0, 0], "scale_passes": [True, True, False, False, False]}
    two = dict(one, scale_passes=[True, True, True, False, False])
    k = 0.85 * 8 / 2.2
    share = "0.55 of its FLOPs ratio (misses the criterion); the model "        # (4 / 2) / (8 / 2.2)
    assert _criterion_text(one, base, 2.0, 1.0) == share + f"would meet it with ≥ {(k * 2.2 - 4) / (4 - k):.1f} ms per pass"
    assert f"{(k * 2.2 - 4) / (4 - k):.1f}" == "3.1"
    assert _criterion_text(two, base, 2.0, 1.0) == share + (
        "would not meet it at any fixed cost: with none it predicts 1.82× where 3.09× is needed (scale 0, taken as "
        "measured, costs 0 ms in both)")                                          # 4 / 2.2 and k
    assert _criterion_text(one, base, 0.55, 1.0).startswith("2.00 of its FLOPs ratio (meets the criterion)")


def test_pass_model_is_a_least_squares_line_with_its_r2():
    from bench.latency import pass_model
    t = [0.5, 7.1, 8.9, 13.2, 20.8]
    cost = {"per_scale_ms": t, "scale_flops": F_S, "scale_passes": [True] * 5}
    a, b, r2 = pass_model(cost)
    x, y = np.asarray(F_S[1:]) / 1e9, np.asarray(t[1:])
    b_hand = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
    a_hand = y.mean() - b_hand * x.mean()
    r2_hand = 1 - ((y - a_hand - b_hand * x) ** 2).sum() / ((y - y.mean()) ** 2).sum()
    assert (a, b, r2) == pytest.approx((a_hand, b_hand, r2_hand), rel=1e-12) and 0.9 < r2 < 1
    assert pass_model(dict(cost, per_scale_ms=t[:4], scale_flops=F_S[:4], scale_passes=[True] * 4)) is not None
    for bad in (dict(cost, per_scale_ms=t[:3], scale_flops=F_S[:3]), dict(cost, scale_flops=F_S[:4]),
                dict(cost, scale_passes=[True, True, False, True, True]), {"per_scale_ms": t}):
        assert pass_model(bad) is None


def test_pass_cost_span_when_the_passes_balance_exactly():
    """tol 0, FLOPs ratio 2 and half the base's passes: c = 4 − 2·2 = 0, so a fixed cost changes nothing; the
    criterion holds at every a or at none, as the zero-cost prediction says."""
    from bench.latency import pass_cost_span
    base = {"flops": 8e9, "scale_flops": [0, 2e9, 2e9, 2e9, 2e9], "scale_passes": [True] * 5,
            "per_scale_ms": [0.0, 1.0, 1.0, 1.0, 1.0]}
    fast = {"flops": 4e9, "scale_flops": [0, 1e9, 1e9, 1e9, 1e9], "scale_passes": [True, True, False, True, False]}
    slow = dict(fast, scale_flops=[0, 1e9, 1e9, 1e9, 1.0001e9], flops=4e9)
    assert pass_cost_span(fast, base, 1.0, tol=0.0) == (0.0, np.inf)     # 2·4 − 8 = 0 ≤ 0
    assert pass_cost_span(slow, base, 1.0, tol=0.0) == (np.inf, 0.0)     # 2·4.0001 − 8 > 0


def test_the_report_of_a_cuda_graph_run():
    graphed = _rec([1.0, 2.0, 3.0], [1e9, 2e9, 3e9], [True] * 3, 8.0, graphs_capture_s=0.456, graphs_count=3,
                   graphs_held_mb=41.6, graphs_max_abs_diff=0.0, iqr=0.05)
    spec = SimpleNamespace(model="var-d16", n=5, protocol={"device": "cuda", "batch": 1, "warmup": 2,
                                                           "compile": False, "cuda_graphs": True})
    out = report([spec], [graphed], ["dense"]).splitlines()
    assert out[0] == ("var-d16 · cuda · batch 1 · CUDA graphs · 5 timed generations per configuration, alternated, "
                      "after 2 warm-up")
    assert out[4] == ("  dense                            1 2 3 | decode 1 | 3 CUDA graphs captured in 0.5 s, holding 42 MiB, "
                      "max |Δ logits| vs eager 0 | scales 6 ms, 1.00×")
