"""Paths of ``bench.models.var`` the other tests leave unexercised, each against a hand-written
reference of the official VAR (``models/var.py``, ``models/basic_var.py``).

Covered: plain attention (``attn_l2_norm=False``, scale 0.25/√c), cosine attention (scale 1,
per-head temperature initialised to 4 and clamped at 100), a fresh model's KV-cache state, the
LayerNorm eps, stochastic depth (linear drop-path rule), shared AdaLN (``shared_aln=True``), label
dropout in training mode, and ``sizes_in`` on dense and pruned state dicts.
"""
import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from bench.models.generator import Generator
from bench.models.var import VAR, DropPath, sizes_in
from bench.models.vqvae import VQVAE
from tests.conftest import SMALL_VAE, SMALL_VAR, randomize_

LOG100 = math.log(100)


pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------ hand-written references
def ref_mask(patch_nums, dtype=torch.float64) -> torch.Tensor:
    """Block-causal mask: token i sees token j iff scale(j) <= scale(i)."""
    lvl = torch.cat([torch.full((pn * pn,), si) for si, pn in enumerate(patch_nums)])
    sees = lvl[None, :] <= lvl[:, None]
    return torch.zeros(sees.shape, dtype=dtype).masked_fill(~sees, -math.inf)


def ref_attention(attn: nn.Module, x_BLC: torch.Tensor, mask_LL, l2_norm: bool, c: int) -> torch.Tensor:
    B, L, _ = x_BLC.shape
    Hc = attn.q_bias.shape[0]
    H = Hc // c
    W = attn.mat_qkv.weight
    q = x_BLC @ W[:Hc].T + attn.q_bias
    k = x_BLC @ W[Hc:2 * Hc].T                     # no k bias
    v = x_BLC @ W[2 * Hc:].T + attn.v_bias

    def heads(t):
        return t.reshape(B, L, H, c).transpose(1, 2)    # B, H, L, c
    q, k, v = heads(q), heads(k), heads(v)
    if l2_norm:
        temp = attn.scale_mul_1H11.clamp(max=LOG100).exp()
        q = q / q.norm(dim=-1, keepdim=True) * temp
        k = k / k.norm(dim=-1, keepdim=True)
        scale = 1.0
    else:
        scale = 0.25 / math.sqrt(c)
    logits = q @ k.transpose(-1, -2) * scale
    if mask_LL is not None:
        logits = logits + mask_LL
    o = logits.softmax(dim=-1) @ v
    return attn.proj(o.transpose(1, 2).reshape(B, L, Hc))


def ref_ln(x, eps=1e-6):
    mu = x.mean(dim=-1, keepdim=True)
    var = (x - mu).pow(2).mean(dim=-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps)


def ref_teacher_forcing(var: VAR, cfg, label_B, x_in) -> torch.Tensor:
    """The official training forward (no label dropout, no drop path), written out."""
    B, C, first_l = label_B.shape[0], cfg.width, cfg.patch_nums[0] ** 2
    cond = var.class_emb.weight[label_B]
    sos = cond[:, None, :].expand(B, first_l, C) + var.pos_start
    x = torch.cat((sos, x_in @ var.word_embed.weight.T + var.word_embed.bias), dim=1)
    lvl = torch.cat([torch.full((pn * pn,), si) for si, pn in enumerate(cfg.patch_nums)])
    x = x + var.lvl_embed.weight[lvl][None] + var.pos_1LC
    mask = ref_mask(cfg.patch_nums, x.dtype)
    silu_cond = cond * torch.sigmoid(cond)
    if cfg.shared_aln:
        lin = var.shared_ada_lin[1]
        shared = (silu_cond @ lin.weight.T + lin.bias).view(B, 1, 6, C)
    for blk in var.blocks:
        if cfg.shared_aln:
            ada = blk.ada_gss + shared
        else:
            lin = blk.ada_lin[1]
            ada = (silu_cond @ lin.weight.T + lin.bias).view(B, 1, 6, C)
        g1, g2, s1, s2, b1, b2 = ada.unbind(2)
        h = ref_ln(x) * (1 + s1) + b1
        x = x + ref_attention(blk.attn, h, mask, cfg.attn_l2_norm, cfg.hd) * g1
        h = ref_ln(x) * (1 + s2) + b2
        x = x + blk.ffn.fc2(F.gelu(blk.ffn.fc1(h), approximate="tanh")) * g2
    lin = var.head_nm.ada_lin[1]
    scale, shift = (silu_cond @ lin.weight.T + lin.bias).view(B, 1, 2, C).unbind(2)
    return var.head(ref_ln(x) * (1 + scale) + shift)


def small_var(seed: int = 1, **kw) -> VAR:
    cfg = SMALL_VAR.replace(**kw)
    return randomize_(VAR(cfg), seed).eval()


def var_input(cfg, B: int, seed: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, cfg.L - cfg.patch_nums[0] ** 2, cfg.Cvae, generator=g)


def ref_logits(var: VAR, label_B, x_in) -> torch.Tensor:
    """The reference in float64 on a copy (VAR.forward itself runs in fp32, as official)."""
    return ref_teacher_forcing(copy.deepcopy(var).double(), var.cfg, label_B, x_in.double()).float()


def close(a, b, tol=1e-9):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


# ------------------------------------------------------------------ 1. plain attention
def test_plain_attention_matches_reference_scale_quarter_over_sqrt_c():
    var = small_var(attn_l2_norm=False).double()
    attn = var.blocks[0].attn
    assert not hasattr(attn, "scale_mul_1H11")
    x = 4 * torch.randn(2, SMALL_VAR.L, SMALL_VAR.width, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    mask = ref_mask(SMALL_VAR.patch_nums)
    with torch.no_grad():
        got = attn(x, var.attn_bias_for_masking)
        want = ref_attention(attn, x, mask, l2_norm=False, c=SMALL_VAR.hd)
        # the logits are O(1), so a wrong temperature moves the output well past the tolerance
        hot = ref_attention(attn, x, mask, l2_norm=False, c=SMALL_VAR.hd // 4)
        assert (hot - want).abs().max() > 1e-3
        close(got, want)
        close(attn(x, None), ref_attention(attn, x, None, l2_norm=False, c=SMALL_VAR.hd))


def test_plain_attention_teacher_forcing_matches_reference():
    var = small_var(attn_l2_norm=False, depth=1)
    labels = torch.tensor([0, 4])
    x_in = 3 * var_input(var.cfg, 2)
    with torch.no_grad():
        close(var(labels, x_in), ref_logits(var, labels, x_in), tol=2e-5)


# ------------------------------------------------------------------ 2. cosine attention
def test_fresh_scale_mul_is_log4():
    var = VAR(SMALL_VAR)
    for blk in var.blocks:
        s = blk.attn.scale_mul_1H11
        assert isinstance(s, nn.Parameter) and s.shape == (1, SMALL_VAR.num_heads, 1, 1)
        close(s.detach().double(), torch.full_like(s, math.log(4), dtype=torch.float64), tol=1e-7)


def test_cosine_attention_matches_reference_with_clamped_head():
    var = small_var().double()
    attn = var.blocks[1].attn
    with torch.no_grad():
        attn.scale_mul_1H11[0, 0] = math.log(1000.0)   # above the clamp: acts as 100
        attn.scale_mul_1H11[0, 1] = math.log(2.5)
    x = torch.randn(2, SMALL_VAR.L, SMALL_VAR.width, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    mask = ref_mask(SMALL_VAR.patch_nums)
    with torch.no_grad():
        got = attn(x, var.attn_bias_for_masking)
        close(got, ref_attention(attn, x, mask, l2_norm=True, c=SMALL_VAR.hd))
        close(attn(x, None), ref_attention(attn, x, None, l2_norm=True, c=SMALL_VAR.hd))
        # the clamp: log(1000) and log(100) give the same attention; log(50) does not
        attn.scale_mul_1H11[0, 0] = LOG100
        close(attn(x, var.attn_bias_for_masking), got, tol=1e-12)
        attn.scale_mul_1H11[0, 0] = math.log(50.0)
        assert (attn(x, var.attn_bias_for_masking) - got).abs().max() > 1e-4


@pytest.mark.parametrize("shared_aln", [False, True])
def test_cosine_teacher_forcing_matches_reference(shared_aln):
    var = small_var(shared_aln=shared_aln)
    with torch.no_grad():
        var.blocks[0].attn.scale_mul_1H11[0, 1] = math.log(400.0)
    labels = torch.tensor([2, 5, 1])                 # 5: the null class
    x_in = var_input(var.cfg, 3)
    with torch.no_grad():
        close(var(labels, x_in), ref_logits(var, labels, x_in), tol=2e-5)


# ------------------------------------------------------------------ 3. fresh model: no KV cache
def test_fresh_model_teacher_forcing_is_repeatable():
    var = VAR(SMALL_VAR).eval()
    assert not any(b.attn.caching for b in var.blocks)
    labels = torch.tensor([1, 3])
    x_in = var_input(SMALL_VAR, 2).float()
    with torch.no_grad():
        first = var(labels, x_in)
        second = var(labels, x_in)
    torch.testing.assert_close(first, second, rtol=0, atol=0)


# ------------------------------------------------------------------ 4. LayerNorm eps
@pytest.mark.parametrize("shared_aln", [False, True])
def test_every_layernorm_uses_norm_eps(shared_aln):
    assert SMALL_VAR.norm_eps == 1e-6
    for cfg in (SMALL_VAR.replace(shared_aln=shared_aln), SMALL_VAR.replace(shared_aln=shared_aln, norm_eps=1e-3)):
        lns = [m for m in VAR(cfg).modules() if isinstance(m, nn.LayerNorm)]
        assert len(lns) == cfg.depth + 1            # one per block + the head's
        for ln in lns:
            assert ln.eps == cfg.norm_eps and not ln.elementwise_affine


# ------------------------------------------------------------------ 5. drop path
@pytest.mark.parametrize("depth", [1, 2, 4])
def test_drop_path_rates_follow_linspace(depth):
    rate = 0.3
    var = VAR(SMALL_VAR.replace(depth=depth, drop_path_rate=rate))
    dpr = [x.item() for x in torch.linspace(0, rate, depth)]      # official
    for i, blk in enumerate(var.blocks):
        if dpr[i] == 0:
            assert isinstance(blk.drop_path, nn.Identity)
        else:
            assert isinstance(blk.drop_path, DropPath)
            assert blk.drop_path.p == pytest.approx(dpr[i], abs=1e-7)
    zero = VAR(SMALL_VAR.replace(depth=depth, drop_path_rate=0.0))
    assert all(isinstance(b.drop_path, nn.Identity) for b in zero.blocks)


def test_drop_path_module_drops_whole_samples_and_rescales():
    torch.manual_seed(0)
    dp = DropPath(0.25).train()
    x = torch.ones(400, 3, 5)
    y = dp(x)
    per_sample = y.flatten(1)
    assert torch.all(per_sample == per_sample[:, :1])          # one draw per sample
    kept = per_sample[:, 0] != 0
    torch.testing.assert_close(per_sample[kept, 0], torch.full((int(kept.sum()),), 1 / 0.75))
    dropped = (per_sample[:, 0] == 0).float().mean().item()
    assert 0.15 < dropped < 0.35
    assert torch.equal(dp.eval()(x), x)


def test_drop_path_only_in_training_mode():
    cfg = dict(drop_path_rate=0.5, cond_drop_rate=0.0)
    var = small_var(**cfg)
    plain = small_var(**{**cfg, "drop_path_rate": 0.0})      # same weights, no drop path
    labels = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2])
    x_in = var_input(var.cfg, 8)
    with torch.no_grad():
        ev = var(labels, x_in)
        close(ev, plain(labels, x_in), tol=0)
        torch.manual_seed(0)
        tr = var.train()(labels, x_in)
    assert (tr - ev).abs().max() > 1e-4


# ------------------------------------------------------------------ 6. shared AdaLN
def test_shared_aln_state_dict_layout():
    cfg = SMALL_VAR.replace(shared_aln=True)
    C = cfg.width
    sd = VAR(cfg).state_dict()
    assert sd["shared_ada_lin.1.weight"].shape == (6 * C, C)
    assert sd["shared_ada_lin.1.bias"].shape == (6 * C,)
    for i in range(cfg.depth):
        assert sd[f"blocks.{i}.ada_gss"].shape == (1, 1, 6, C)
        assert not any(k.startswith(f"blocks.{i}.ada_lin") for k in sd)
    # official init of the per-block shift: randn / sqrt(C)
    gss = torch.cat([sd[f"blocks.{i}.ada_gss"].flatten() for i in range(cfg.depth)])
    assert abs(gss.std().item() * math.sqrt(C) - 1) < 0.15 and abs(gss.mean().item()) < 0.02
    dense = VAR(SMALL_VAR).state_dict()
    assert not any(k.startswith("shared_ada_lin") for k in dense)
    expected = {k for k in dense if ".ada_lin." not in k or k.startswith("head_nm.")}
    expected |= {"shared_ada_lin.1.weight", "shared_ada_lin.1.bias"} | {f"blocks.{i}.ada_gss" for i in range(cfg.depth)}
    assert set(sd) == expected


def test_shared_aln_sampling_matches_teacher_forcing():
    torch.manual_seed(0)
    var = randomize_(VAR(SMALL_VAR.replace(shared_aln=True)), 1)
    gen = Generator(var, randomize_(VQVAE(SMALL_VAE), 2), name="shared").eval()
    labels = torch.tensor([0, 4])
    seen = {}
    tokens, _ = gen.sample_tokens(labels, seed=3, cfg=1.5, top_k=10, top_p=0.9,
                                  logits_hook=lambda si, lg: seen.__setitem__(si, lg.clone()))
    with torch.no_grad():
        tf = gen.forward_teacher(labels, tokens)
        tf_null = gen.forward_teacher(torch.full_like(labels, var.num_classes), tokens)
        ref = ref_logits(var, labels, gen.vae.quantize.idx_to_var_input(tokens))
    close(tf, ref, tol=2e-5)
    for si, (bg, ed) in enumerate(var.begin_ends):
        torch.testing.assert_close(seen[si][:2], tf[:, bg:ed], rtol=0, atol=1e-5)
        torch.testing.assert_close(seen[si][2:], tf_null[:, bg:ed], rtol=0, atol=1e-5)


# ------------------------------------------------------------------ 7. label dropout
def test_label_dropout_all_in_training_mode_none_in_eval():
    labels = torch.tensor([0, 1, 2, 3])
    null = torch.full_like(labels, SMALL_VAR.num_classes)
    var = small_var(cond_drop_rate=1.0)
    x_in = var_input(var.cfg, 4)
    with torch.no_grad():
        ev, ev_null = var(labels, x_in), var(null, x_in)
        assert (ev - ev_null).abs().max() > 1e-4           # the label matters
        close(var.train()(labels, x_in), ev_null, tol=0)
        var.cfg = var.cfg.replace(cond_drop_rate=0.0)
        tr = var(labels, x_in)
        close(tr, ev, tol=0)


def test_label_dropout_rate_in_training_mode():
    B = 200
    labels = torch.arange(B) % SMALL_VAR.num_classes
    null = torch.full_like(labels, SMALL_VAR.num_classes)
    var = small_var(depth=1, cond_drop_rate=0.25)
    x_in = var_input(var.cfg, B)
    with torch.no_grad():
        ev, ev_null = var(labels, x_in), var(null, x_in)
        torch.manual_seed(0)
        tr = var.train()(labels, x_in)
    is_null = (tr - ev_null).flatten(1).abs().amax(1) == 0
    is_label = (tr - ev).flatten(1).abs().amax(1) == 0
    assert torch.all(is_null ^ is_label)
    assert 25 < int(is_null.sum()) < 80                # ~50 of 200


# ------------------------------------------------------------------ 8. sizes_in
def test_sizes_in_dense_gives_none():
    for cfg in (SMALL_VAR, SMALL_VAR.replace(attn_l2_norm=False), SMALL_VAR.replace(shared_aln=True)):
        got = sizes_in(VAR(cfg).state_dict(), cfg)
        assert got.heads is None and got.ffn_hidden is None
        assert got == cfg


def test_sizes_in_pruned_gives_per_block_sizes():
    pruned = SMALL_VAR.replace(heads=(2, 1), ffn_hidden=(512, 100), head_dim=64)
    got = sizes_in(VAR(pruned).state_dict(), SMALL_VAR)
    assert got.heads == (2, 1) and got.ffn_hidden == (512, 100)
    assert all(type(h) is int for h in got.heads + got.ffn_hidden)
    only_ffn = SMALL_VAR.replace(ffn_hidden=(512, 256))
    got = sizes_in(VAR(only_ffn).state_dict(), SMALL_VAR)
    assert got.heads is None and got.ffn_hidden == (512, 256)


def test_fresh_embeddings_follow_the_official_init():
    """VAR's own init (what `make tiny-models` trains from): class/pos/level embeddings
    trunc_normal(0, sqrt(1/3C))."""
    import math

    import torch

    from bench.models.var import VAR, VARConfig
    torch.manual_seed(0)
    var = VAR(VARConfig(depth=1, width=256, num_heads=4, num_classes=50, vocab_size=64, Cvae=8,
                        patch_nums=(1, 2, 3, 4, 5, 6, 8, 10, 13, 16)))
    want = math.sqrt(1 / 256 / 3)
    for t in (var.class_emb.weight, var.pos_1LC, var.lvl_embed.weight):
        assert abs(t.std().item() - want) < 0.1 * want and abs(t.mean().item()) < 0.1 * want


def test_official_vqvae_decoder_layout_on_the_meta_device():
    """The official ch_mult (1, 1, 2, 2, 4): the decoder starts at ch·4 channels (the tiny and golden
    configs end in 2, 2, where mult[-1] and mult[-2] coincide)."""
    import torch

    from bench.models.vqvae import VQVAE, VQVAEConfig
    with torch.device("meta"):
        vae = VQVAE(VQVAEConfig())
    sd = vae.state_dict()
    assert tuple(sd["decoder.conv_in.weight"].shape) == (640, 32, 3, 3)
    assert tuple(sd["encoder.conv_in.weight"].shape) == (160, 3, 3, 3)
    assert tuple(sd["quant_conv.weight"].shape) == (32, 32, 3, 3) and vae.downsample == 16
