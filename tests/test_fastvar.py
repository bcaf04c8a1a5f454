"""FastVAR (methods/fastvar.py): PTS + CTR checked by hand on one block, the identity setting, the
schedules, scale skipping, weight-free FLOPs by formula, and the errors."""
import re

import pytest
import torch
import torch.nn.functional as F

from bench.accounting import sampling_flops
from bench.models.var import VAR
from methods.fastvar import FastVARPolicy, parse_drop, parse_layers, pts_score
from tests.conftest import SMALL_VAR, randomize_
from tests.test_token_methods import _apply

pytestmark = pytest.mark.usefixtures("one_thread")


def _fastvar(gen, spec="fastvar"):
    return _apply(gen, spec)


@torch.no_grad()
def test_one_block_by_hand():
    """A block at the cache scale (3×3, dense) then at a pruned scale (4×4, half dropped), through the
    policy, against the computation written out step by step: scores on the residual stream before
    each sub-layer, recomputed for the FFN, per batch row; attention over the cached keys plus the
    kept tokens' keys only; pruned positions take the cache scale's output, area-resized."""
    var = randomize_(VAR(SMALL_VAR), 5).eval()
    blk = var.blocks[0]
    g = torch.Generator().manual_seed(0)
    B, C = 2, var.C
    cond = torch.randn(B, C, generator=g)
    x0 = torch.randn(B, 9, C, generator=g)
    spread = torch.linspace(0.9, 1.1, 16)
    x1 = 0.02 * torch.randn(B, 16, C, generator=g) * torch.stack((spread, spread.flip(0))).unsqueeze(-1)
    # (rows differ; small, so that the attention update reorders the FFN's scores)

    policy = FastVARPolicy({1: 0.5}, cache_si=0, blocks=[0])
    policy.begin(B, (3, 4))
    blk.attn.kv_caching(True, max_len=25)
    policy.begin_scale(0, 3)
    y0 = blk(x0, cond, None, policy.route(0))
    policy.begin_scale(1, 4)
    y1 = blk(x1, cond, None, policy.route(1))
    assert blk.attn.kv_len == 9 + 8, "only the kept tokens' keys and values join the KV cache"
    blk.attn.kv_caching(False)

    # ---- by hand
    gamma1, gamma2, scale1, scale2, shift1, shift2 = blk.ada_lin(cond).view(B, 1, 6, C).unbind(2)
    ln = lambda t: F.layer_norm(t, (C,), eps=SMALL_VAR.norm_eps)  # noqa: E731
    at = blk.attn
    H, c = at.H, at.c

    def qkv(h):
        w = at.mat_qkv.weight
        q = h @ w[:H * c].T + at.q_bias
        k = h @ w[H * c:2 * H * c].T
        v = h @ w[2 * H * c:].T + at.v_bias
        return [t.view(B, -1, H, c).transpose(1, 2) for t in (q, k, v)]

    def attend(q, k, v):
        if at.l2_norm:   # VAR's cosine attention with a learned per-head temperature
            q = F.normalize(q, dim=-1) * at.scale_mul_1H11.clamp_max(at.max_scale_mul).exp()
            k = F.normalize(k, dim=-1)
        p = torch.softmax(q @ k.transpose(-1, -2) * at.scale, dim=-1)
        return at.proj((p @ v).transpose(1, 2).reshape(B, -1, H * c))

    def top(x, n):   # PTS, written independently: distance to the map's mean, largest n
        return torch.topk(((x - x.mean(1, keepdim=True)) ** 2).sum(-1), n, dim=1).indices

    def resize(t, hw_from, hw_to):   # area interpolation = adaptive average pooling
        return F.adaptive_avg_pool2d(t.transpose(1, 2).reshape(B, C, *hw_from), hw_to).flatten(2).transpose(1, 2)

    def take(t, idx):
        return torch.stack([t[b, idx[b]] for b in range(B)])

    q0, k0, v0 = qkv(ln(x0) * (1 + scale1) + shift1)
    a0 = attend(q0, k0, v0)
    x0a = x0 + gamma1 * a0
    f0 = blk.ffn(ln(x0a) * (1 + scale2) + shift2)
    torch.testing.assert_close(y0, x0a + gamma2 * f0, rtol=1e-5, atol=1e-5)

    keep = top(x1, 8)
    q1, k1, v1 = qkv(take(ln(x1) * (1 + scale1) + shift1, keep))
    a1 = attend(q1, torch.cat((k0, k1), 2), torch.cat((v0, v1), 2))
    full_a = resize(a0, (3, 3), (4, 4)).clone()
    for b in range(B):
        full_a[b, keep[b]] = a1[b]
    x1a = x1 + gamma1 * full_a
    keep_f = top(x1a, 8)                                   # scored again, on the updated stream
    f1 = blk.ffn(take(ln(x1a) * (1 + scale2) + shift2, keep_f))
    full_f = resize(f0, (3, 3), (4, 4)).clone()
    for b in range(B):
        full_f[b, keep_f[b]] = f1[b]
    torch.testing.assert_close(y1, x1a + gamma2 * full_f, rtol=1e-5, atol=1e-5)
    assert not torch.equal(keep[0].sort().values, keep[1].sort().values), "rows chose alike: per-row not tested"
    assert not torch.equal(keep.sort(1).values, keep_f.sort(1).values), "FFN chose as attention: re-scoring not tested"


def test_drop_zero_is_dense_exactly(small_gen):
    labels = torch.tensor([0, 3])
    ref = small_gen.generate(labels, seed=5, cfg=1.5)
    gen, _ = _fastvar(small_gen, "fastvar:drop=0/0")
    assert torch.equal(gen.generate(labels, seed=5, cfg=1.5), ref)
    gen, _ = _fastvar(small_gen, "fastvar")
    assert not torch.equal(gen.generate(labels, seed=5, cfg=1.5), ref), "the default schedule prunes nothing"


def test_only_the_pruned_scales_change(small_gen):
    labels = torch.tensor([1, 2])
    K = len(small_gen.patch_nums)
    ref, got = {}, {}
    small_gen.sample_tokens(labels, seed=2, logits_hook=lambda si, lg: ref.__setitem__(si, lg.clone()))
    gen, ctx = _fastvar(small_gen)
    gen.sample_tokens(labels, seed=2, logits_hook=lambda si, lg: got.__setitem__(si, lg.clone()))
    for si in range(K - 2):
        assert torch.equal(got[si], ref[si]), f"scale {si} is before the pruned scales but changed"
    assert not torch.allclose(got[K - 1], ref[K - 1])
    assert "var schedule" in ctx.notes[0] and "4×4: 0.5, 8×8: 0.75" in ctx.notes[0] and "cache at 3×3" in ctx.notes[0]


def test_a_skipped_scale_ends_sampling(small_gen):
    gen, _ = _fastvar(small_gen, "fastvar:drop=0.5/1")
    tokens, f_hat = gen.sample_tokens(torch.tensor([0]), seed=1)
    assert len(tokens) == len(small_gen.patch_nums) - 1 and f_hat.shape[-1] == small_gen.patch_nums[-1]
    assert gen.generate(torch.tensor([0]), seed=1).shape[-1] == 32


def _per_block_flops(var, L, n, T):
    """What one block does for one row at a scale of L tokens with n kept and T keys in all (dense)."""
    C, Hc, Fh = var.C, var.blocks[0].attn.H * var.blocks[0].attn.c, var.blocks[0].ffn.fc1.out_features
    linear = 2 * (C * 3 * Hc + Hc * C + C * Fh + Fh * C)
    dense = L * linear + 4 * Hc * L * T
    pruned = n * linear + 4 * Hc * n * (T - L + n)
    return dense - pruned


def test_weight_free_flops_saved_are_exactly_the_dropped_tokens(small_gen):
    """Counted on the meta device as the sampler runs: the saving equals, per block and CFG row, the
    dropped tokens' linear layers and their attention rows, with fewer keys for the kept ones."""
    dense = sampling_flops(small_gen)
    assert sampling_flops(_fastvar(small_gen, "fastvar:drop=0/0")[0]) == dense
    var, pns = small_gen.var, small_gen.patch_nums
    T = sum(p * p for p in pns)
    L = pns[-1] ** 2
    n = L - int(L * 0.75)
    saved = 2 * len(var.blocks) * _per_block_flops(var, L, n, T)   # 2: the CFG batch
    assert dense - sampling_flops(_fastvar(small_gen, "fastvar:drop=0/0.75")[0]) == saved
    # skipping the last scale saves all of it (and the head on its tokens): more than dropping 75 %
    assert sampling_flops(_fastvar(small_gen, "fastvar:drop=0/1")[0]) < dense - saved


def test_layers_limit_the_pruned_blocks(small_gen):
    dense = sampling_flops(small_gen)
    all_blocks = dense - sampling_flops(_fastvar(small_gen, "fastvar:drop=0/0.75")[0])
    one_block = dense - sampling_flops(_fastvar(small_gen, "fastvar:drop=0/0.75,layers=1:")[0])
    assert all_blocks == 2 * one_block > 0


def test_parsing_and_errors(small_gen):
    assert parse_drop("0.4/0.5/1/1") == (0.4, 0.5, 1.0, 1.0)
    assert parse_layers("3:-4", 32) == tuple(range(3, 28)) and parse_layers("all", 2) == (0, 1)
    for bad, msg in (("0.5/x", "separated"), ("1.5", r"\[0, 1\]"), ("1/0.5", "trailing")):
        with pytest.raises(ValueError, match=msg):
            parse_drop(bad)
    with pytest.raises(ValueError, match="selects no block"):
        parse_layers("5:", 4)
    with pytest.raises(ValueError, match=re.escape(
            "fastvar: drop=0/0/0/0/0.5 prunes 5 scales but the model has 5: at least one dense scale must come "
            "first (the cache scale)")):
        _fastvar(small_gen, "fastvar:drop=0/0/0/0/0.5")
    with pytest.raises(ValueError, match=re.escape(
            "fastvar (infinity schedule): layers='3:-4' selects no block of 2 (a model of 2 blocks and 5 scales; "
            "give layers=all or layers=a:b, or schedule=var: the last two scales, all blocks)")):
        _fastvar(small_gen, "fastvar:schedule=infinity")


def test_the_parsers_take_both_ends_of_the_ranges_and_name_what_they_refuse():
    """Fractions 0 and 1 are in range (0 keeps a scale dense, 1 skips it), a run of trailing 1s is
    allowed, and a 1 followed by anything else is not; a block range is 'all' or a slice whose either
    end may be blank or negative, as Python's."""
    assert parse_drop("0/1") == (0.0, 1.0) and parse_drop("1/1") == (1.0, 1.0)
    assert parse_drop("0.5") == (0.5,) and parse_drop("0.5/1/1") == (0.5, 1.0, 1.0)
    refused = {
        "": "drop='' must be '/'-separated fractions, e.g. 0.5/0.75",
        "-0.1": "drop='-0.1': every fraction must be in [0, 1]",
        "1.01": "drop='1.01': every fraction must be in [0, 1]",
        "0.5/1/0.5": "drop='0.5/1/0.5': a fraction of 1 skips the scale, so only trailing scales may have 1 "
                     "(every scale after a skipped one is skipped)",
    }
    for text, msg in refused.items():
        with pytest.raises(ValueError, match=re.escape(msg)):
            parse_drop(text)
    every = (0, 1, 2, 3, 4, 5)
    layers = {"all": every, ":": every, " : ": every, "2:": (2, 3, 4, 5), ":-1": (0, 1, 2, 3, 4), "-2:": (4, 5),
              "1:3": (1, 2)}
    for text, blocks in layers.items():
        assert parse_layers(text, 6) == blocks, text
    for text in ("3", "1:2:3", "a:b"):
        with pytest.raises(ValueError, match=re.escape(
                f"layers={text!r} must be 'all' or a slice 'a:b' of block indices, e.g. 3:-4")):
            parse_layers(text, 6)
    with pytest.raises(ValueError, match=re.escape("layers='4:2' selects no block of 6")):
        parse_layers("4:2", 6)
    # a bad value fails when the spec is built, named by the method, before any model is loaded
    from methods.fastvar import FastVAR
    with pytest.raises(ValueError, match=re.escape("fastvar: drop='1.5': every fraction must be in [0, 1]")):
        FastVAR(drop="1.5")
    with pytest.raises(ValueError, match=re.escape("fastvar: layers='x' must be 'all' or a slice")):
        FastVAR(layers="x")
    FastVAR(drop="0.4/0.5/1/1", layers="3:-4")   # and a good one passes


@torch.no_grad()
def test_ctr_on_a_non_square_pyramid_reads_each_map_as_height_by_width():
    """Infinity's and HART's wide aspect ratios: the cache scale 2×3 restored onto 4×6 puts cached token
    (y//2, x//2) at position (y, x) (area resizing by an exact factor of 2 repeats each token 2×2);
    the kept tokens keep their own outputs."""
    C = 2
    pol = FastVARPolicy({1: 0.5}, cache_si=0, blocks=[0])
    pol.begin(1, ((2, 3), (4, 6)))
    pol.begin_scale(0, (2, 3))
    cached = torch.arange(6.0).repeat_interleave(C).reshape(1, 6, C) * torch.tensor([1.0, 10.0])

    def fn(h_BLC, keep_Bl=None):
        return h_BLC

    assert torch.equal(pol.sublayer(0, "attn", 0, cached, fn), cached)
    pol.begin_scale(1, (4, 6))
    h = torch.randn(1, 24, C, generator=torch.Generator().manual_seed(0))
    out = pol.sublayer(1, "attn", 0, h, fn, x_BLC=h)
    kept = set(pts_score(h)[0].argsort(descending=True)[:12].tolist())
    for y in range(4):
        for x in range(6):
            want = h[0, y * 6 + x] if y * 6 + x in kept else cached[0, (y // 2) * 3 + x // 2]
            assert torch.equal(out[0, y * 6 + x], want), (y, x)


def test_unsupported_generators_say_why():
    from types import SimpleNamespace

    from methods.fastvar import FastVAR
    with pytest.raises(ValueError, match="not a VAR-family generator"):
        FastVAR().schedule_for(SimpleNamespace())


def test_the_ctr_cache_is_released_when_sampling_ends_also_on_error(small_gen):
    """The cache scale's outputs are dropped with the KV cache, not held through the decode."""
    gen, _ = _fastvar(small_gen)
    held = []
    K = len(small_gen.patch_nums)
    gen.sample_tokens(torch.tensor([0]), seed=1, logits_hook=lambda si, lg: held.append(len(gen.token_policy.cache)))
    assert held[K - 2] > 0 and gen.token_policy.cache == {}   # filled while sampling, empty after

    def fail(si, lg):
        if si == K - 1:
            raise RuntimeError("stop")
    with pytest.raises(RuntimeError, match="stop"):
        gen.sample_tokens(torch.tensor([0]), seed=1, logits_hook=fail)
    assert gen.token_policy.cache == {}
