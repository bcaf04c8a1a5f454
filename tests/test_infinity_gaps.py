"""What the Infinity golden comparison (tests/test_official_infinity.py) cannot see, found by the
mutation run (tests/mutation/run.py --models): the initialisation a from-scratch model (tiny-t2i)
starts from, the text pool's head rule, the block-chunk layout, the training-time prompt drop, and
the text keys/values computed once per generation."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from bench.models.bsq import BSQVAE
from bench.models.infinity import CrossAttention, Infinity, TextAttentivePool
from bench.models.t2i import T2IGenerator
from tests.test_t2i import SMALL, SMALL_VAE, TEXT, _text, build_small_gen


@pytest.fixture(scope="module")
def small_gen():
    return build_small_gen()   # this module's own copy: its tests change the model's mode and config


def _std_ratio(t: torch.Tensor, want: float) -> float:
    return t.float().std().item() / want


def test_fresh_model_is_initialised_as_official():
    torch.manual_seed(0)
    cfg = SMALL.replace(depth=4, block_chunks=1, width=128, num_heads=4, text_channels=256, text_maxlen=16)
    m = Infinity(cfg)
    C, Ct5 = cfg.width, cfg.text_channels
    # the null prompt: trunc-normal std 1.2 from its own seed 0, divided by √Ct5, whatever the global seed
    want = torch.nn.init.trunc_normal_(torch.empty(16, Ct5), std=1.2, generator=torch.Generator().manual_seed(0))
    assert torch.equal(m.cfg_uncond.data, want / Ct5 ** 0.5)
    std = math.sqrt(1 / C / 3)
    for name, t in (("pos_start", m.pos_start), ("lvl_embed", m.lvl_embed.weight)):   # trunc-normal, mean 0
        tol = 0.15 if t.numel() < 1000 else 0.06
        assert abs(_std_ratio(t, std) - 1) < tol and abs(t.mean().item()) < 3 * std / t.numel() ** 0.5, name
    pool = CrossAttention(1024, 64, 8, for_attn_pool=True)   # the pool's query: the same scale, at width 1024
    assert abs(_std_ratio(pool.mat_q, math.sqrt(1 / 1024 / 3)) - 1) < 0.06
    # the drop-path rate grows linearly over the blocks (training only)
    rates = [getattr(b.drop_path, "p", 0.0) for b in Infinity(cfg.replace(drop_path_rate=0.3)).block_list]
    assert rates == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert all(not b.ca.cache_text and b.ca._kv is None for b in m.block_list)   # text caching is a sampling mode
    gss = torch.cat([b.ada_gss.flatten() for b in m.block_list])   # randn / √C
    assert 0.96 < _std_ratio(gss, 1 / math.sqrt(C)) < 1.04


def test_text_pool_heads_follow_the_official_width_rule():
    with torch.device("meta"):
        assert TextAttentivePool(SMALL.replace(text_channels=256)).ca.H == 2   # 128 per head up to width 4096
        wide = SMALL.replace(width=4160, num_heads=65, text_channels=192)
        assert TextAttentivePool(wide).ca.H == 3                             # 64 per head above
        assert TextAttentivePool(SMALL.replace(width=4096, num_heads=64, text_channels=256)).ca.H == 2
        with pytest.raises(ValueError, match=r"\(128, official rule\)"):   # 4096 itself is still 128 per head
            TextAttentivePool(SMALL.replace(width=4096, num_heads=64, text_channels=192))
        for cfg, rule in ((SMALL.replace(text_channels=192), 128), (wide.replace(text_channels=160), 64)):
            with pytest.raises(ValueError) as e:
                TextAttentivePool(cfg)
            assert str(e.value) == (f"text_channels {cfg.text_channels} must be a multiple of the pool's head dim "
                                    f"({rule}, official rule)")
    pool = CrossAttention(64, 32, 4, for_attn_pool=True)
    assert pool.mat_q.shape == (1, 4, 16)


def test_block_chunks_layout_and_refusal():
    m = Infinity(SMALL.replace(depth=4, block_chunks=2))
    assert [b.block_idx for b in m.block_list] == [0, 1, 2, 3]
    assert {k.split(".module.")[0] for k in m.state_dict() if k.startswith("block_chunks")} == \
        {"block_chunks.0", "block_chunks.1"}
    assert "blocks.0.sa.mat_qkv.weight" in Infinity(SMALL.replace(depth=2, block_chunks=1)).state_dict()
    with pytest.raises(ValueError) as e:
        m.null_text(torch.ones(1, SMALL.text_maxlen + 1, dtype=torch.bool))
    assert str(e.value) == f"text length {SMALL.text_maxlen + 1} exceeds the null prompt's {SMALL.text_maxlen} rows"
    with pytest.raises(ValueError) as e:
        Infinity(SMALL.replace(depth=3, block_chunks=2))
    assert str(e.value) == "depth 3 is not a multiple of block_chunks 2"


def _teacher_inputs(gen, B=2):
    feats, mask = _text(gen)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(B, gen.infinity.cfg.L - 1, gen.infinity.d, generator=g)
    return feats, mask, x


def test_training_drops_prompts_to_the_null_prompt_at_the_configured_rate(small_gen, monkeypatch):
    inf = small_gen.infinity
    feats, mask, x = _teacher_inputs(small_gen)
    with torch.no_grad():
        cond = inf(feats, mask, x)
        null = inf(inf.null_text(mask), mask, x)
        try:
            inf.train()
            monkeypatch.setattr(inf, "cfg", inf.cfg.replace(cond_drop_rate=1.0))
            assert torch.equal(inf(feats, mask, x), null)   # every prompt dropped
            monkeypatch.setattr(inf, "cfg", inf.cfg.replace(cond_drop_rate=0.5))
            torch.manual_seed(0)
            drop = torch.rand(2) < 0.5
            assert drop.tolist() == [True, False], "pick a seed that drops one row of two"
            torch.manual_seed(0)
            got = inf(feats, mask, x)
            assert torch.equal(got[0], null[0]) and torch.equal(got[1], cond[1])
        finally:
            inf.eval()
        assert torch.equal(inf(feats, mask, x), cond)   # never in eval mode


def test_text_keys_and_values_are_computed_once_per_generation(small_gen, monkeypatch):
    inf = small_gen.infinity
    feats, mask = _text(small_gen)
    computed = []
    orig = CrossAttention.text_kv

    def counting(self, kv, m):   # computed: the keys/values returned are not the cached ones
        before = self._kv
        out = orig(self, kv, m)
        computed.append(before is None or out[0] is not before[1][0])
        return out

    monkeypatch.setattr(CrossAttention, "text_kv", counting)
    bits1, _ = small_gen.sample_bits(feats, mask, seed=0)
    n_blocks, n_scales = len(inf.block_list), len(small_gen.schedule)
    # the text pool (the start token's condition) reads the text once, uncached; each block's
    # cross-attention reads it at every scale and computes it at the first
    assert len(computed) == n_blocks * n_scales + 1 and sum(computed) == n_blocks + 1
    computed.clear()
    bits2, _ = small_gen.sample_bits(feats, mask, seed=0, cache_text_kv=False)
    assert sum(computed) == n_blocks * n_scales + 1   # the official loop: every scale
    assert all(torch.equal(a, b) for a, b in zip(bits1, bits2))
    computed.clear()
    other = _text(small_gen, ("a blue square", "a red circle"))
    bits3, _ = small_gen.sample_bits(*other, seed=0)   # a new generation does not reuse the last text
    assert sum(computed) == n_blocks + 1 and not all(torch.equal(a, b) for a, b in zip(bits1, bits3))
    assert all(not b.ca.cache_text and b.ca._kv is None for b in inf.block_list)   # caching ends with the generation


def test_bsq_group_norm_rule_and_patch_levels():
    from bench.models.bsq import Normalize, _levels
    assert Normalize(64).norm.num_groups == 32 and Normalize(48).norm.num_groups == 24
    assert Normalize(96).norm.num_groups == 32 and Normalize(64).norm.eps == 1e-6
    with pytest.raises(ValueError) as e:
        Normalize(40)
    assert str(e.value) == "BSQ VAE channel count 40 is not a multiple of 32 or 24 (official GroupNorm rule)"
    cfg = dataclasses.replace(SMALL_VAE, ch_mult=(1, 1, 2))   # three levels: patch 2, 4 or 8
    assert [_levels(dataclasses.replace(cfg, patch_size=p)) for p in (2, 4, 8)] == [1, 2, 3]
    for p in (1, 3, 16):
        with pytest.raises(ValueError) as e:
            _levels(dataclasses.replace(cfg, patch_size=p))
        assert str(e.value) == f"patch_size {p} must be 2^k with 1 ≤ k ≤ len(ch_mult)=3"


def test_text_pool_with_several_heads_by_hand():
    """The pooled condition with 4 heads (the small test models have one): each head's learned query
    attends over the valid text tokens; heads concatenated, then the output projection."""
    torch.manual_seed(1)
    pool = CrossAttention(64, 32, 4, for_attn_pool=True)
    with torch.no_grad():
        for p in pool.parameters():
            p.normal_(0, 0.3)
    kv = torch.randn(2, 5, 32)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    got = pool(None, kv, mask)
    W = pool.mat_kv.weight
    for b in range(2):
        n = int(mask[b].sum())
        k, v = (kv[b, :n] @ W[:64].T), (kv[b, :n] @ W[64:].T + pool.v_bias)
        heads = []
        for h in range(4):
            q = pool.mat_q[0, h]
            a = torch.softmax(k[:, h * 16:(h + 1) * 16] @ q / 4.0, dim=0)
            heads.append(a @ v[:, h * 16:(h + 1) * 16])
        want = pool.proj(torch.cat(heads))
        torch.testing.assert_close(got[b, 0], want, rtol=1e-5, atol=1e-5)


def test_official_files_extra_buffers_are_dropped_and_nothing_else():
    from bench.checkpoint import CheckpointMismatch, load_strict
    from bench.models.infinity import adapt_state_dict
    m = Infinity(SMALL)
    sd = dict(m.state_dict())
    extra = {k: torch.zeros(1) for k in ("lvl_1L", "attn_bias_for_masking", "Infinity_visible_kvlen",
                                         "Infinity_invisible_qlen")}
    adapted = adapt_state_dict({**sd, **extra})
    assert adapted.keys() == sd.keys() and all(adapted[k] is sd[k] for k in sd)
    load_strict(Infinity(SMALL), adapted, "official-layout Infinity state_dict")
    with pytest.raises(CheckpointMismatch) as e:
        load_strict(Infinity(SMALL), {**sd, **extra}, "unadapted")
    assert all(k in str(e.value) for k in extra)


def test_bsq_vae_with_growing_channels_keeps_its_shapes():
    """Every small config elsewhere has ch_mult (1, 1): here the widths grow (32 → 64), so each level's
    blocks must start from the previous level's width, in the encoder and the decoder."""
    cfg = dataclasses.replace(SMALL_VAE, ch_mult=(1, 2), num_res_blocks=2, patch_size=2)
    vae = BSQVAE(cfg)
    enc = vae.encoder
    widths = [(b.conv1.conv.in_channels, b.conv2.conv.out_channels) for lvl in enc.down for b in lvl.block]
    assert widths == [(32, 32), (32, 32), (32, 64), (64, 64)]
    img = torch.rand(1, 3, 8, 8) * 2 - 1
    with torch.no_grad():
        z = vae.encoder(img)
        assert z.shape == (1, cfg.codebook_dim, 4, 4)
        assert vae.decode(z).shape == (1, 3, 8, 8)
    assert vae.decoder.conv_in.conv.out_channels == 64


def test_bsq_straight_through_gradient_is_that_of_the_unit_vector_over_the_bits():
    from bench.models.bsq import BSQ
    q = BSQ(4)
    z = torch.randn(2, 4, 1, 3, 3, requires_grad=True)
    w = torch.randn(2, 4, 1, 3, 3)
    codes, bits = q.quantize(z)
    assert torch.equal(codes.detach().abs(), torch.full_like(codes, 0.5))   # ±1/√d
    assert torch.equal(bits.view(2, 3, 3, 4).permute(0, 3, 1, 2), (z > 0).long().squeeze(2))
    (codes * w).sum().backward()
    z2 = z.detach().clone().requires_grad_(True)
    (torch.nn.functional.normalize(z2, dim=1) * w).sum().backward()   # d = dim 1 of [B, d, 1, h, w]
    torch.testing.assert_close(z.grad, z2.grad)


def test_quantize_refuses_a_schedule_that_misses_the_latent_grid():
    vae = BSQVAE(SMALL_VAE)
    with pytest.raises(ValueError) as e:
        vae.quantize(torch.randn(1, SMALL_VAE.codebook_dim, 4, 4), ((1, 1), (2, 2)))
    assert str(e.value) == "the schedule's last scale (2, 2) must equal the latent grid (4, 4)"


@pytest.mark.parametrize("flip_p", [1.0, 0.3])
def test_bitwise_self_correction_by_hand(flip_p):
    """Infinity §3.3: each scale's labels are the quantiser's bits of the residual left by the
    *corrupted* running sum; a flipped bit's code (not the label's) enters the sum and the teacher input."""
    import torch.nn.functional as tF
    vae = BSQVAE(SMALL_VAE)
    d, sched = SMALL_VAE.codebook_dim, ((1, 1), (2, 2), (4, 4))
    z = torch.randn(2, d, 4, 4, generator=torch.Generator().manual_seed(0))
    labels, x = vae.requantize(z, sched, flip_p, torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(1)
    total, xs = torch.zeros(2, d, 1, 4, 4), []
    for si, (h, w) in enumerate(sched):
        r = tF.interpolate(z.unsqueeze(2) - total, size=(1, h, w), mode="area")
        bits = (tF.normalize(r.permute(0, 2, 3, 4, 1).reshape(2, -1, d), dim=-1) > 0).long()
        assert torch.equal(labels[si], bits), si
        flip = torch.rand(bits.shape, generator=g) < flip_p
        used = torch.where(flip, 1 - bits, bits)
        if flip_p == 1.0:
            assert torch.equal(used, 1 - bits)
        codes = tF.normalize(used.view(2, h, w, d).float() * (2 / d ** 0.5) - 1 / d ** 0.5, dim=-1)
        total = total + tF.interpolate(codes.permute(0, 3, 1, 2).unsqueeze(2), size=(1, 4, 4), mode="trilinear")
        if si < 2:
            xs.append(tF.interpolate(total, size=(1, *sched[si + 1]), mode="trilinear").squeeze(2).flatten(2).transpose(1, 2))
    torch.testing.assert_close(x, torch.cat(xs, 1))


def test_a_block_routes_its_three_sub_layers_by_name_in_order():
    block = Infinity(SMALL).block_list[0]
    seen = []

    def route(kind, idx, h, fn, x):
        seen.append((kind, idx))
        return fn(h)

    C = SMALL.width
    x = torch.randn(2, 5, C)
    text = (torch.randn(2, 3, C), torch.ones(2, 3, dtype=torch.bool))
    gss = torch.randn(2, 1, 6, C) * 0.1
    with torch.no_grad():
        assert torch.equal(block(x, gss, text, route=route), block(x, gss, text))
    assert seen == [("attn", 0), ("ca", 0), ("ffn", 0)]


# ---------------------------------------------------------------- the tiny text encoder
def test_word_tokenizer_messages_in_full():
    from bench.models.text import WordTokenizer
    tok = WordTokenizer(TEXT.vocab, 4)
    ids, mask = tok(["A Red  circle", "square a red blue"])   # case and spacing are ignored; max_len fits
    assert ids.tolist() == [[1, 2, 4, 0], [5, 1, 2, 3]] and mask.tolist() == [[True, True, True, False], [True] * 4]
    cases = [
        (["a red", "  "], "prompt 1 is empty: give at least one word (the unconditional branch of guidance is "
                          "the model's learned null prompt, not an empty prompt)"),
        (["a red circle a blue"], "prompt 'a red circle a blue' has 5 words, more than max_len=4"),
        (["a red circel"], "unknown word 'circel' in prompt 'a red circel'; did you mean 'circle'? "
                           "(vocabulary: a red blue circle square)"),
        (["a <pad>"], "unknown word '<pad>' in prompt 'a <pad>' (vocabulary: a red blue circle square)"),
    ]
    for prompts, message in cases:
        with pytest.raises(ValueError) as e:
            tok(prompts)
        assert str(e.value) == message


def test_tiny_text_encoder_by_hand_and_its_layout():
    """features = proj(norm(encoder(embed + pos, padding masked))); with a word convolution the padded
    positions are zeroed first and the convolution is added; a pre-norm GELU encoder, FFN 4× wide."""
    from bench.models.configs import TextConfig
    from bench.models.text import TinyTextEncoder
    torch.manual_seed(0)
    for k in (0, 3):
        enc = TinyTextEncoder(TextConfig(**{**TEXT.to_dict(), "conv_kernel": k})).eval()
        layer = enc.encoder.layers[0]
        assert enc.embed.padding_idx == 0 and layer.norm_first and layer.linear1.out_features == 4 * TEXT.width
        assert 0.8 < enc.pos.std().item() / 0.02 < 1.2
        ids, mask = enc.tokenize(["a red circle", "blue square"])
        with torch.no_grad():
            h = enc.embed(ids) + enc.pos
            if k:
                h = h * mask.unsqueeze(-1)
                h = h + enc.conv(h.transpose(1, 2)).transpose(1, 2)
            want = enc.proj(enc.norm(enc.encoder(h, src_key_padding_mask=~mask)))
            got, got_mask = enc.encode(["a red circle", "blue square"])
            torch.testing.assert_close(got, want)
            assert torch.equal(got_mask, mask)
            # the padding mask matters: without it the valid tokens would read the pads
            unmasked = enc.proj(enc.norm(enc.encoder(h)))
            assert not torch.allclose(got[1, :2], unmasked[1, :2])


def test_generator_pairing_and_prompts_without_a_text_encoder():
    inf = Infinity(SMALL)
    with pytest.raises(ValueError) as e:
        T2IGenerator(inf, BSQVAE(dataclasses.replace(SMALL_VAE, codebook_dim=16)))
    assert str(e.value) == "transformer and VAE disagree: 8 vs 16 bits per token"
    gen = T2IGenerator(inf, BSQVAE(SMALL_VAE), name="tiny-x")
    for g, who in ((gen, "tiny-x"), (T2IGenerator(inf, BSQVAE(SMALL_VAE)), "this generator")):
        with pytest.raises(RuntimeError) as e:
            g.encode_prompts(["a red circle"])
        assert str(e.value) == (f"{who} has no text encoder: pass text features (feats, mask) instead of prompts, "
                                f"or load the model with its text encoder")
