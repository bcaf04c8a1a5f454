"""Gaps in the sampling-loop tests found by mutation testing (bench/models/generator.py, policy.py).

- ``more_smooth``: the Gumbel-softmax temperature ``tau = max(0.27·(1 − 0.95·ratio), 0.005)`` and
  the logit scaling ``logits·(1 + ratio)`` (official ``VAR.autoregressive_infer_cfg``) are checked
  exactly on every scale, and the whole smoothed f_hat against an independent re-run of the loop.
- Token-policy callbacks: order and arguments of ``begin`` / ``begin_scale`` / ``end_scale`` /
  ``route``; the default ``select`` → gather → fn → ``restore`` (zero scatter) by value.
- ``seed=None``, the top-p ``<=`` boundary, the no-op filter defaults, the model/VQVAE agreement check.
"""
import pytest
import torch

import bench.models.generator as generator_mod
from bench.models.generator import Generator, gumbel_softmax_rng, top_k_top_p_filter_
from bench.models.policy import TokenPolicy
from bench.models.vqvae import VQVAE, VQVAEConfig
from tests.conftest import SMALL_VAE, official_loop

LABELS = torch.tensor([1, 3])
CFG, TOP_K, TOP_P = 2.0, 20, 0.9


def _official_tau(ratio: float) -> float:
    return max(0.27 * (1 - 0.95 * ratio), 0.005)


def _gumbel_softmax_ref(logits: torch.Tensor, tau: float, g: torch.Generator) -> torch.Tensor:
    """Independent soft Gumbel-softmax: G = −log(E), E ~ Exp(1), softmax((logits + G)/tau) on the last dim."""
    e = torch.empty(logits.shape, dtype=logits.dtype).exponential_(1.0, generator=g)
    y = (logits - e.log()) / tau
    y = y - y.max(dim=-1, keepdim=True).values
    return y.exp() / y.exp().sum(dim=-1, keepdim=True)


# ---------------------------------------------------------------- 1. more_smooth
def test_gumbel_softmax_rng_matches_an_independent_implementation():
    logits = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(5)) * 2
    logits[0, 0, :3] = -torch.inf   # filtered entries stay at zero probability
    for tau in (1.0, 0.27, 0.0135):
        got = gumbel_softmax_rng(logits, tau, torch.Generator().manual_seed(11))
        ref = _gumbel_softmax_ref(logits, tau, torch.Generator().manual_seed(11))
        torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(got.sum(-1), torch.ones(2, 3))
        assert torch.all(got[0, 0, :3] == 0)
    # tau matters (not e.g. ignored or multiplied): a hotter softmax is flatter
    a = gumbel_softmax_rng(logits, 5.0, torch.Generator().manual_seed(1))
    b = gumbel_softmax_rng(logits, 0.05, torch.Generator().manual_seed(1))
    assert a.max() < b.max()


def test_more_smooth_tau_and_logit_scaling_are_official(small_gen, monkeypatch):
    """Every scale's Gumbel-softmax gets tau = max(0.27(1−0.95r), 0.005) and the filtered CFG logits ·(1+r)."""
    K = len(small_gen.patch_nums)
    raw, seen = {}, []
    real = generator_mod.gumbel_softmax_rng

    def spy(logits, tau, rng):
        seen.append((logits.clone(), tau))
        return real(logits, tau, rng)

    monkeypatch.setattr(generator_mod, "gumbel_softmax_rng", spy)
    small_gen.sample_tokens(LABELS, seed=7, cfg=CFG, top_k=TOP_K, top_p=TOP_P, more_smooth=True,
                            logits_hook=lambda si, lg: raw.__setitem__(si, lg.clone()))
    assert len(seen) == K
    B = LABELS.shape[0]
    for si, (logits, tau) in enumerate(seen):
        ratio = si / (K - 1)
        assert tau == pytest.approx(_official_tau(ratio), rel=1e-12, abs=0)
        t = CFG * ratio
        exp = top_k_top_p_filter_((1 + t) * raw[si][:B] - t * raw[si][B:], TOP_K, TOP_P) * (1 + ratio)
        assert torch.equal(torch.isinf(logits), torch.isinf(exp))
        fin = torch.isfinite(exp)
        torch.testing.assert_close(logits[fin], exp[fin], atol=1e-5, rtol=1e-5)
    # spot values, so the formula above is not vacuous: 0.27 at r=0, 0.27·0.05 at r=1
    assert seen[0][1] == pytest.approx(0.27) and seen[-1][1] == pytest.approx(0.0135)


def test_more_smooth_f_hat_matches_an_independent_recomputation(small_gen):
    _, f_hat = small_gen.sample_tokens(LABELS, seed=7, cfg=CFG, top_k=TOP_K, top_p=TOP_P, more_smooth=True)
    _, ref = official_loop(small_gen, LABELS, 7, CFG, TOP_K, TOP_P,
                           smooth=lambda lg, r, g: _gumbel_softmax_ref(lg * (1 + r), _official_tau(r), g))
    torch.testing.assert_close(f_hat, ref, atol=1e-5, rtol=1e-4)
    _, hard = small_gen.sample_tokens(LABELS, seed=7, cfg=CFG, top_k=TOP_K, top_p=TOP_P, more_smooth=False)
    assert (f_hat - hard).abs().max() > 1e-3   # smoothing is not a no-op here


# ---------------------------------------------------------------- 2. scale callbacks and route
class _Recorder(TokenPolicy):
    def __init__(self):
        self.events = []

    def begin(self, batch, patch_nums):
        self.events.append(("begin", batch, tuple(patch_nums)))

    def begin_scale(self, si, pn):
        self.events.append(("begin_scale", si, pn))

    def end_scale(self, si, x_BLC):
        self.events.append(("end_scale", si, x_BLC.clone()))

    def sublayer(self, si, kind, block_idx, h_BLC, fn, x_BLC=None):
        # the residual stream comes with every sub-layer call (FastVAR scores it), shaped as its input
        assert x_BLC is not None and x_BLC.shape == h_BLC.shape and not torch.equal(x_BLC, h_BLC)
        self.events.append(("sub", si, kind, block_idx))
        return super().sublayer(si, kind, block_idx, h_BLC, fn, x_BLC)


def test_policy_scale_callbacks_order_and_arguments(small_gen):
    rec = _Recorder()
    small_gen.token_policy = rec
    logits = {}
    small_gen.sample_tokens(LABELS, seed=2, cfg=CFG, top_k=TOP_K, top_p=TOP_P,
                            logits_hook=lambda si, lg: logits.__setitem__(si, lg.clone()))
    B, pns, depth = LABELS.shape[0], tuple(small_gen.patch_nums), small_gen.var.cfg.depth
    C = small_gen.var.C
    ev = rec.events
    assert ev[0] == ("begin", B, pns)
    assert sum(e[0] == "begin" for e in ev) == 1
    # per scale: begin_scale, then every sublayer of that scale, then end_scale
    i = 1
    cond = small_gen.var.cond(torch.cat((LABELS, torch.full_like(LABELS, small_gen.var.num_classes))))
    for si, pn in enumerate(pns):
        assert ev[i] == ("begin_scale", si, pn)
        i += 1
        subs = []
        while ev[i][0] == "sub":
            assert ev[i][1] == si
            subs.append((ev[i][2], ev[i][3]))
            i += 1
        assert set(subs) == {(k, b) for k in ("attn", "ffn") for b in range(depth)}
        assert len(subs) == 2 * depth
        kind, s, x = ev[i]
        assert (kind, s) == ("end_scale", si)
        assert x.shape == (2 * B, pn * pn, C)
        # end_scale sees the last block's output: the head on it gives that scale's logits
        with torch.no_grad():
            torch.testing.assert_close(small_gen.var.get_logits(x, cond), logits[si])
        i += 1
    assert i == len(ev)


# ---------------------------------------------------------------- 3. default select / restore
class _KeepHalf(TokenPolicy):
    """Keeps a per-row, unsorted half of the tokens; records the arguments of select / restore."""

    def __init__(self):
        self.sel, self.res = [], []

    def select(self, si, kind, block_idx, h, x=None):
        B, L = h.shape[:2]
        keep = torch.stack([torch.randperm(L, generator=torch.Generator().manual_seed(100 * si + b))[:max(1, L // 2)]
                            for b in range(B)])
        self.sel.append((si, kind, block_idx, h, keep))
        return keep

    def restore(self, si, kind, block_idx, h, keep, out):
        self.res.append((si, kind, block_idx, h, keep, out.shape))
        return super().restore(si, kind, block_idx, h, keep, out)


def _manual_gather_fn_scatter(h, keep, fn):
    B, L, _ = h.shape
    kept = torch.stack([h[b, keep[b]] for b in range(B)])
    y = fn(kept)
    out = torch.zeros(B, L, y.shape[-1], dtype=y.dtype)
    for b in range(B):
        for j in range(keep.shape[1]):
            out[b, keep[b, j]] = y[b, j]
    return out


def test_default_select_restore_is_gather_fn_zero_scatter():
    torch.manual_seed(0)
    B, L, C, D = 3, 10, 6, 4
    h = torch.randn(B, L, C)
    W = torch.randn(C, D)
    fn = lambda x, keep_Bl=None: (x + x.cumsum(1)) @ W   # noqa: E731 — order-dependent, changes the channel count
    pol = _KeepHalf()
    out = pol.sublayer(2, "ffn", 1, h, fn)
    keep = pol.sel[0][4]
    assert out.shape == (B, L, D)
    torch.testing.assert_close(out, _manual_gather_fn_scatter(h, keep, fn))
    dropped = torch.ones(B, L, dtype=torch.bool)
    dropped[torch.arange(B)[:, None], keep] = False
    assert torch.all(out[dropped] == 0) and dropped.any()
    (si, kind, bi, hs, ks), (si2, kind2, bi2, hr, kr, oshape) = pol.sel[0], pol.res[0]
    assert (si, kind, bi) == (si2, kind2, bi2) == (2, "ffn", 1)
    assert hs is h and hr is h and torch.equal(ks, kr) and oshape == (B, L // 2, D)
    # the identity default computes every token
    torch.testing.assert_close(TokenPolicy().sublayer(0, "attn", 0, h, fn), fn(h))


def test_keep_half_policy_in_sampling_sees_real_scale_kind_block(small_gen):
    pol = _KeepHalf()
    small_gen.token_policy = pol
    tokens, _ = small_gen.sample_tokens(LABELS, seed=1, cfg=CFG, top_k=TOP_K, top_p=TOP_P)
    depth, pns = small_gen.var.cfg.depth, small_gen.patch_nums
    expected = [(si, k, b) for si in range(len(pns)) for b in range(depth) for k in ("attn", "ffn")]
    assert [s[:3] for s in pol.sel] == expected
    assert [r[:3] for r in pol.res] == expected
    for s, r, (si, _, _) in zip(pol.sel, pol.res, expected):
        L = pns[si] ** 2
        assert s[3].shape[:2] == (2 * LABELS.shape[0], L)
        assert r[3] is s[3] and r[4] is s[4]
        assert r[5][:2] == (2 * LABELS.shape[0], max(1, L // 2))
    assert [t.shape for t in tokens] == [(2, pn * pn) for pn in pns]


# ---------------------------------------------------------------- 4. unseeded sampling
def test_unseeded_sampling_runs_and_seed_zero_is_reproducible(small_gen):
    tokens, f_hat = small_gen.sample_tokens(LABELS, seed=None, cfg=CFG, top_k=TOP_K, top_p=TOP_P)
    assert [t.shape for t in tokens] == [(2, pn * pn) for pn in small_gen.patch_nums]
    for t in tokens:
        assert t.dtype == torch.int64 and int(t.min()) >= 0 and int(t.max()) < small_gen.var.V
    assert f_hat.shape == (2, small_gen.var.Cvae, small_gen.patch_nums[-1], small_gen.patch_nums[-1])
    assert torch.isfinite(f_hat).all()
    a = small_gen.sample_tokens(LABELS, seed=0, cfg=CFG, top_k=0, top_p=0.0)[0]
    torch.manual_seed(123)   # seed 0 must not fall back to the global RNG
    b = small_gen.sample_tokens(LABELS, seed=0, cfg=CFG, top_k=0, top_p=0.0)[0]
    assert all(torch.equal(x, y) for x, y in zip(a, b))


# ---------------------------------------------------------------- 5. top-p boundary, defaults
def test_top_p_keeps_exactly_half_of_four_equal_logits():
    # sorted cumulative mass .25, .5, .75, 1; official drops those <= 1 − top_p = 0.5 → 2 kept
    x = top_k_top_p_filter_(torch.zeros(1, 1, 4), top_k=0, top_p=0.5)
    assert int(torch.isfinite(x).sum()) == 2
    assert torch.all(x[torch.isfinite(x)] == 0)
    # top_p=0.75: drop mass <= 0.25 → 3 kept (a threshold of top_p instead of 1 − top_p keeps 1)
    assert int(torch.isfinite(top_k_top_p_filter_(torch.zeros(1, 1, 4), top_p=0.75)).sum()) == 3


def test_filter_defaults_leave_logits_unchanged():
    x = torch.randn(2, 3, 9, generator=torch.Generator().manual_seed(0))
    ref = x.clone()
    out = top_k_top_p_filter_(x)
    assert torch.equal(out, ref) and torch.equal(x, ref)


# ---------------------------------------------------------------- 6. model/VQVAE agreement
@pytest.mark.parametrize("field", ["vocab_size", "z_channels"])
def test_generator_rejects_a_vqvae_that_disagrees(small_gen, field):
    kw = {k: getattr(SMALL_VAE, k) for k in SMALL_VAE.__dataclass_fields__}
    kw[field] = kw[field] * 2
    with pytest.raises(ValueError, match="disagree"):
        Generator(small_gen.var, VQVAE(VQVAEConfig(**kw)))
