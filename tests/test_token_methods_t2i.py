"""Token methods on the Infinity family: FastVAR checked by hand on one Infinity block (RoPE at the
kept positions, the cross-attention sub-layer pruned too), RoPE on a subset, and every method on a
small random Infinity generator: identity settings, late scales only, scale skipping, FLOPs."""
import pytest
import torch
import torch.nn.functional as F

from bench.accounting import t2i_sampling_flops
from bench.models.bsq import BSQVAE
from bench.models.infinity import Infinity, Rope, rope2d_table
from bench.models.t2i import T2IGenerator
from bench.models.text import TinyTextEncoder
from methods.fastvar import FastVARPolicy
from tests.test_t2i import SMALL, SMALL_VAE, TEXT, _perturbed
from tests.test_token_methods import _apply

pytestmark = pytest.mark.usefixtures("one_thread")

# test_t2i's small Infinity with five scales: enough for a cache scale before two pruned ones
SCHEDULE = ((1, 1), (2, 2), (3, 3), (4, 4), (6, 6))
CFG5 = SMALL.replace(block_chunks=1, scale_schedule=SCHEDULE, rope_grid=(6, 6))


@pytest.fixture
def t2i():
    torch.manual_seed(0)
    return T2IGenerator(_perturbed(Infinity(CFG5)), _perturbed(BSQVAE(SMALL_VAE), 1), TinyTextEncoder(TEXT)).eval()


def _sample(gen, hook=None, seed=3):
    feats, mask = gen.encode_prompts(["a red circle", "a blue square"])
    return gen.sample_bits(feats, mask, seed=seed, cfg=3.0, tau=1.0, top_k=0, top_p=0.0, logits_hook=hook)


def test_rope_on_a_subset_rotates_at_the_kept_positions():
    cs = rope2d_table(16, SCHEDULE, (6, 6))[:, -36:]
    q, k = torch.randn(2, 4, 36, 16), torch.randn(2, 4, 36, 16)
    keep = torch.stack((torch.tensor([3, 0, 35, 7]), torch.tensor([1, 2, 30, 31])))
    full_q, full_k = Rope(cs)(q, k)
    take = lambda t: torch.stack([t[b][:, keep[b]] for b in range(2)])  # noqa: E731
    sub_q, sub_k = Rope(cs).at(keep)(take(q), take(k))
    torch.testing.assert_close(sub_q, take(full_q))
    torch.testing.assert_close(sub_k, take(full_k))


@pytest.mark.parametrize("spec", ["fastvar:drop=0/0,layers=all", "stepvar:drop=0", "tome:ratio=0"])
def test_identity_settings_sample_the_dense_bits(t2i, spec):
    ref_bits, ref_sum = _sample(t2i)
    bits, summed = _sample(_apply(t2i, spec)[0])
    assert all(torch.equal(a, b) for a, b in zip(bits, ref_bits)) and torch.equal(summed, ref_sum)


@pytest.mark.parametrize("spec", ["fastvar:drop=0.5/0.75,layers=all", "stepvar", "stepvar:score=random", "tome"])
def test_only_the_late_scales_change_and_flops_drop(t2i, spec):
    ref, got = {}, {}
    _sample(t2i, lambda si, lg: ref.__setitem__(si, lg.clone()))
    dense = t2i_sampling_flops(t2i, text_tokens=4)
    gen, ctx = _apply(t2i, spec)
    _sample(gen, lambda si, lg: got.__setitem__(si, lg.clone()))
    K = len(SCHEDULE)
    for si in range(K - 2):
        assert torch.equal(got[si], ref[si]), f"{spec}: scale {si} changed"
    assert not torch.allclose(got[K - 1], ref[K - 1])
    assert t2i_sampling_flops(gen, text_tokens=4) < dense
    assert "6×6" in ctx.notes[0]


def test_fastvar_skips_trailing_scales_on_infinity(t2i):
    gen, _ = _apply(t2i, "fastvar:drop=0.5/1,layers=all")
    bits, summed = _sample(gen)
    assert len(bits) == len(SCHEDULE) - 1 and summed.shape[-2:] == (6, 6)


def test_the_infinity_preset_needs_blocks_in_its_range(t2i):
    from bench.spec import SpecError
    with pytest.raises(SpecError, match="selects no block"):   # blocks 3…depth−5 of a 2-block model
        _apply(t2i, "fastvar")


@torch.no_grad()
def test_one_infinity_block_by_hand(t2i):
    """An Infinity block at the cache scale (3×3) then at a pruned scale (4×4, half dropped), through
    the policy, against the computation written out: PTS scores before each of the three sub-layers
    (self-attention, cross-attention, FFN) on the residual stream; self-attention over the cached
    keys plus the kept tokens' keys, RoPE at the kept tokens' own positions; CTR from the cache."""
    inf = t2i.infinity
    blk = inf.block_list[0]
    g = torch.Generator().manual_seed(0)
    B, C = 2, inf.cfg.width
    feats, mask = t2i.encode_prompts(["a red circle", "a blue square"])
    cond_BD, text = inf.encode_text(feats, mask)
    gss = inf.ada_gss(cond_BD)
    x0 = torch.randn(B, 9, C, generator=g)
    spread = torch.linspace(0.9, 1.1, 16)
    x1 = 0.02 * torch.randn(B, 16, C, generator=g) * torch.stack((spread, spread.flip(0))).unsqueeze(-1)
    cs = rope2d_table(inf.cfg.hd, ((3, 3), (4, 4)), (6, 6))
    cs0, cs1 = cs[:, :9], cs[:, 9:]

    policy = FastVARPolicy({1: 0.5}, cache_si=0, blocks=[0])
    policy.begin(B, ((3, 3), (4, 4)))
    blk.sa.kv_caching(True, max_len=25)
    policy.begin_scale(0, (3, 3))
    y0 = blk(x0, gss, text, None, inf.rope_fn(cs0), policy.route(0))
    policy.begin_scale(1, (4, 4))
    y1 = blk(x1, gss, text, None, inf.rope_fn(cs1), policy.route(1))
    assert blk.sa.kv_len == 9 + 8
    blk.sa.kv_caching(False)

    # ---- by hand
    gamma1, gamma2, scale1, scale2, shift1, shift2 = (blk.ada_gss + gss).unbind(2)
    ln = lambda t: F.layer_norm(t, (C,), eps=inf.cfg.norm_eps)  # noqa: E731
    sa, H = blk.sa, blk.sa.H
    c = C // H

    def rotate(t, cs_rows):   # interleaved pairs turned by the angles of the given positions
        t2 = t.reshape(*t.shape[:-1], -1, 2)
        cos, sin = cs_rows[0].unsqueeze(1), cs_rows[1].unsqueeze(1)
        return torch.stack((cos * t2[..., 0] - sin * t2[..., 1], sin * t2[..., 0] + cos * t2[..., 1]), -1).reshape(t.shape)

    def qkv(h, cs_rows):
        w = sa.mat_qkv.weight
        q = (h @ w[:H * c].T + sa.q_bias).view(B, -1, H, c).transpose(1, 2)
        k = (h @ w[H * c:2 * H * c].T).view(B, -1, H, c).transpose(1, 2)
        v = (h @ w[2 * H * c:].T + sa.v_bias).view(B, -1, H, c).transpose(1, 2)
        q = F.normalize(q, dim=-1) * sa.scale_mul_1H11.clamp_max(sa.max_scale_mul).exp()
        k = F.normalize(k, dim=-1)
        return rotate(q, cs_rows), rotate(k, cs_rows), v

    def attend(q, k, v):
        return sa.proj((torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v).transpose(1, 2).reshape(B, -1, C))

    def top(x, n):
        return torch.topk(((x - x.mean(1, keepdim=True)) ** 2).sum(-1), n, dim=1).indices

    def resize(t):
        return F.adaptive_avg_pool2d(t.transpose(1, 2).reshape(B, C, 3, 3), (4, 4)).flatten(2).transpose(1, 2)

    def take(t, idx):
        return torch.stack([t[b, idx[b]] for b in range(B)])

    def scatter(base, idx, rows):
        base = base.clone()
        for b in range(B):
            base[b, idx[b]] = rows[b]
        return base

    ca = lambda h: blk.ca(h, *text)  # noqa: E731
    rows0 = cs0.unsqueeze(1).expand(2, B, 9, -1)
    q0, k0, v0 = qkv(ln(x0) * (1 + scale1) + shift1, rows0)
    a0 = attend(q0, k0, v0)
    xa = x0 + gamma1 * a0
    c0 = ca(blk.ca_norm(xa))
    xc = xa + c0
    f0 = blk.ffn(ln(xc) * (1 + scale2) + shift2)
    torch.testing.assert_close(y0, xc + gamma2 * f0, rtol=1e-5, atol=1e-5)

    keep = top(x1, 8)
    q1, k1, v1 = qkv(take(ln(x1) * (1 + scale1) + shift1, keep), torch.stack([cs1[:, keep[b]] for b in range(B)], 1))
    x1a = x1 + gamma1 * scatter(resize(a0), keep, attend(q1, torch.cat((k0, k1), 2), torch.cat((v0, v1), 2)))
    keep_c = top(x1a, 8)
    x1c = x1a + scatter(resize(c0), keep_c, ca(take(blk.ca_norm(x1a), keep_c)))
    keep_f = top(x1c, 8)
    f1 = blk.ffn(take(ln(x1c) * (1 + scale2) + shift2, keep_f))
    torch.testing.assert_close(y1, x1c + gamma2 * scatter(resize(f0), keep_f, f1), rtol=1e-5, atol=1e-5)
    assert not torch.equal(keep.sort(1).values, keep_f.sort(1).values), "re-scoring not exercised"


def test_fastvar_releases_its_cache_when_sampling_ends(t2i):
    gen, _ = _apply(t2i, "fastvar:schedule=var")
    sizes = []
    _sample(gen, hook=lambda si, lg: sizes.append(len(gen.token_policy.cache)))
    assert max(sizes) > 0 and gen.token_policy.cache == {}
