"""Text-to-image models (Infinity class, BSQ VAE, text encoders) beyond the golden comparison
(tests/test_official_infinity.py): strict checkpoint round trips and errors, BSQ quantisation, the
2-D RoPE against a direct computation, weight-free accounting, and the CLI's inputs."""
from __future__ import annotations

import json
import math
import re

import pytest
import torch

from bench.checkpoint import CheckpointMismatch, load_strict, read_state_dict
from bench.models.bsq import BSQVAE
from bench.models.configs import BSQConfig, InfinityConfig, TextConfig
from bench.models.infinity import Infinity, apply_rope, rope2d_table
from bench.models.t2i import T2IGenerator
from bench.models.text import TinyTextEncoder, WordTokenizer

SMALL = InfinityConfig(depth=2, width=64, num_heads=4, text_channels=128, text_maxlen=8, codebook_dim=8,
                       block_chunks=2, scale_schedule=((1, 1), (2, 2), (4, 4)), rope_grid=(4, 4), ca_bf16=False,
                       vae_stride=2)
SMALL_VAE = BSQConfig(codebook_dim=8, base_ch=32, ch_mult=(1, 1), num_res_blocks=1, patch_size=2)
TEXT = TextConfig(vocab=("<pad>", "a", "red", "blue", "circle", "square"), max_len=4, width=32, depth=1, heads=2,
                  out_channels=128)


def _perturbed(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return module


def build_small_gen() -> T2IGenerator:
    """The small seeded text-to-image generator these tests (and tests/test_infinity_gaps.py) sample."""
    torch.manual_seed(0)
    gen = T2IGenerator(_perturbed(Infinity(SMALL)), _perturbed(BSQVAE(SMALL_VAE), 1), TinyTextEncoder(TEXT))
    return gen.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def small_gen():
    return build_small_gen()


def _text(gen, prompts=("a red circle", "a blue square")):
    return gen.encode_prompts(list(prompts))


def test_infinity_state_dict_keys_are_official():
    sd = Infinity(SMALL).state_dict()
    assert "block_chunks.1.module.0.sa.mat_qkv.weight" in sd and "block_chunks.0.module.0.ca.mat_kv.weight" in sd
    for k in ("cfg_uncond", "text_norm.weight", "text_proj_for_sos.ca.mat_q", "text_proj_for_ca.2.weight",
              "shared_ada_lin.1.weight", "head_nm.ada_lin.1.weight", "lvl_embed.weight", "pos_start",
              "block_chunks.0.module.0.ada_gss", "block_chunks.0.module.0.ca_norm.bias",
              "block_chunks.0.module.0.sa.scale_mul_1H11", "block_chunks.0.module.0.sa.zero_k_bias"):
        assert k in sd, k
    assert sd["block_chunks.0.module.0.sa.scale_mul_1H11"].shape == (1, 4, 1, 1)
    assert sd["head.weight"].shape == (2 * SMALL.codebook_dim, SMALL.width)
    flat = Infinity(SMALL.replace(block_chunks=1)).state_dict()
    assert "blocks.1.sa.mat_qkv.weight" in flat and not any(k.startswith("block_chunks") for k in flat)


def test_strict_round_trip_same_logits(small_gen, tmp_path):
    from safetensors.torch import save_file
    inf, vae = small_gen.infinity, small_gen.vae
    save_file({k: v.contiguous() for k, v in inf.state_dict().items()}, str(tmp_path / "inf.safetensors"))
    with torch.device("meta"):
        inf2 = Infinity(SMALL)
    load_strict(inf2, read_state_dict(tmp_path / "inf.safetensors"), "inf", assign=True)
    feats, mask = _text(small_gen)
    _, bits, xs = vae.encode(torch.rand(2, 3, 8, 8) * 2 - 1, SMALL.scale_schedule)
    x = torch.cat(xs, 1)
    assert torch.equal(inf(feats, mask, x), inf2.eval()(feats, mask, x))
    # a different (perturbed) model gives different logits: the comparison can fail
    assert not torch.equal(inf(feats, mask, x), _perturbed(Infinity(SMALL), 5).eval()(feats, mask, x))


def test_wrong_shapes_list_every_key(small_gen):
    sd = dict(small_gen.infinity.state_dict())
    sd["head.weight"] = torch.zeros(3, 64)
    sd["block_chunks.1.module.0.ffn.fc1.weight"] = torch.zeros(7, 64)
    sd.pop("cfg_uncond")
    sd["surprise"] = torch.zeros(1)
    with torch.device("meta"):
        fresh = Infinity(SMALL)
    with pytest.raises(CheckpointMismatch) as e:
        load_strict(fresh, sd, "bad.pth", assign=True)
    msg = str(e.value)
    for k in ("head.weight", "block_chunks.1.module.0.ffn.fc1.weight", "cfg_uncond", "surprise"):
        assert k in msg
    assert "1 missing, 1 unexpected, 2 wrongly shaped" in msg


def test_bsq_vae_keys_and_flux_layout(small_gen, tmp_path):
    vae = small_gen.vae
    sd = vae.state_dict()
    assert {"quantizer.lfq.mask", "quantize.lfq.mask", "encoder.conv_in.conv.weight",
            "decoder.up.1.upsample.conv.conv.weight", "encoder.down.0.downsample.conv.conv.weight",
            "encoder.down.0.block.0.norm1.norm.weight"} <= set(sd)
    # the official file: {"vae": state_dict} with bare FLUX keys and no mask buffer
    bare = {k.replace(".conv.weight", ".weight").replace(".conv.bias", ".bias").replace(".norm.weight", ".weight")
            .replace(".norm.bias", ".bias"): v for k, v in sd.items() if "lfq.mask" not in k}
    torch.save({"vae": bare, "step": torch.tensor(3)}, tmp_path / "vae.pth")
    from bench.models.zoo import load_bsq
    loaded = load_bsq(tmp_path / "vae.pth", SMALL_VAE)
    for k, v in sd.items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_bsq_quantise_dequantise_round_trip(small_gen):
    vae, sched = small_gen.vae, SMALL.scale_schedule
    z = torch.randn(3, SMALL_VAE.codebook_dim, 4, 4)
    zq, bits, xs = vae.quantize(z, sched)
    assert [b.shape for b in bits] == [(3, h * w, 8) for h, w in sched]
    assert all(set(b.unique().tolist()) <= {0, 1} for b in bits)
    # dequantising the bits gives back the quantised latent and the teacher-forcing input
    assert torch.allclose(vae.bits_to_latent(bits, sched), zq, atol=1e-6)
    assert torch.allclose(vae.bits_to_var_input(bits, sched), torch.cat(xs, 1), atol=1e-6)
    # codes are ±1/√d and quantising a code gives back its bits
    codes = vae.lfq.bits_to_codes(bits[-1].view(3, 4, 4, 8))
    assert torch.allclose(codes.abs(), torch.full_like(codes, 1 / math.sqrt(8)))
    _, again = vae.lfq.quantize(codes)
    assert torch.equal(again, bits[-1])
    # the first scale's bits are the signs of the area-averaged latent
    assert torch.equal(bits[0].view(3, 8), (z.mean((2, 3)) > 0).long())


def test_rope_equals_direct_computation():
    hd, sched, grid = 16, ((1, 1), (2, 2), (4, 4)), (8, 8)
    cs = rope2d_table(hd, sched, grid)
    q, k = torch.randn(2, 3, 21, hd), torch.randn(2, 3, 21, hd)
    rq, rk = apply_rope(q, k, cs)
    theta = [10000.0 ** (-2 * i / (hd // 2)) for i in range(hd // 4)]
    n = 0
    for h, w in sched:
        for i in range(h):
            for j in range(w):
                r, c = round(i * grid[0] / h), round(j * grid[1] / w)   # positions on the final grid
                angles = [r * t for t in theta] + [c * t for t in theta]
                for p, a in enumerate(angles):   # pair p = dims (2p, 2p+1)
                    x0, x1 = q[..., n, 2 * p], q[..., n, 2 * p + 1]
                    assert torch.allclose(rq[..., n, 2 * p], x0 * math.cos(a) - x1 * math.sin(a), atol=1e-5)
                    assert torch.allclose(rq[..., n, 2 * p + 1], x0 * math.sin(a) + x1 * math.cos(a), atol=1e-5)
                n += 1
    assert torch.allclose(rk.norm(dim=-1), k.norm(dim=-1), atol=1e-5)   # a rotation


def test_sampling_same_seed_same_image(small_gen):
    feats, mask = _text(small_gen)
    a = small_gen.generate((feats, mask), seed=3, cfg=3.0, tau=1.0, top_k=0, top_p=0.0)
    b = small_gen.generate((feats, mask), seed=3, cfg=3.0, tau=1.0, top_k=0, top_p=0.0)
    c = small_gen.generate((feats, mask), seed=4, cfg=3.0, tau=1.0, top_k=0, top_p=0.0)
    assert a.dtype == torch.uint8 and a.shape == (2, 3, 8, 8)
    assert torch.equal(a, b) and not torch.equal(a, c)
    # prompts or their features: the same images
    assert torch.equal(small_gen.generate(["a red circle", "a blue square"], seed=3, cfg=3.0, tau=1.0, top_k=0,
                                          top_p=0.0), a)


def test_guidance_is_constant_cfg_on_logits(small_gen):
    """logits = cfg·cond + (1−cfg)·uncond after dividing by τ, at every scale (not VAR's ramp)."""
    feats, mask = _text(small_gen)
    seen = {}
    small_gen.sample_bits(feats, mask, seed=0, cfg=2.5, tau=0.5, top_k=0, top_p=0.0,
                          logits_hook=lambda si, lg: seen.setdefault(si, lg.clone()))
    assert all(v.shape[0] == 4 for v in seen.values())   # [cond; uncond]
    # with top-k 1 (argmax per bit) the sampled bits are the argmax of the guided logits
    got = {}

    def hook(si, lg):
        got[si] = (2.5 * lg[:2] + (1 - 2.5) * lg[2:]).view(2, -1, 8, 2).argmax(-1)
    bits, _ = small_gen.sample_bits(feats, mask, seed=0, cfg=2.5, tau=0.5, top_k=1, top_p=0.0, logits_hook=hook)
    for si, b in enumerate(bits):
        assert torch.equal(b, got[si])
    # the text K/V computed once per generation gives the official loop's bits and latent
    a, za = small_gen.sample_bits(feats, mask, seed=5, cfg=2.5, tau=1.0, top_k=0, top_p=0.0)
    b, zb = small_gen.sample_bits(feats, mask, seed=5, cfg=2.5, tau=1.0, top_k=0, top_p=0.0, cache_text_kv=False)
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and torch.equal(za, zb)
    nocfg, _ = small_gen.sample_bits(feats, mask, seed=0, cfg=1.0, tau=0.5, top_k=1, top_p=0.0)
    assert any(not torch.equal(x, y) for x, y in zip(nocfg, bits))


def test_null_prompt(small_gen):
    inf = small_gen.infinity
    feats, mask = _text(small_gen)
    assert torch.equal(inf.null_text(mask)[0], inf.cfg_uncond[:mask.shape[1]])
    with pytest.raises(ValueError, match="exceeds"):
        inf.null_text(torch.ones(1, 9, dtype=torch.bool))


def test_word_tokenizer_errors():
    tok = WordTokenizer(TEXT.vocab, 4)
    ids, mask = tok(["a red circle"])
    assert ids.tolist() == [[1, 2, 4, 0]] and mask.tolist() == [[True, True, True, False]]
    with pytest.raises(ValueError, match="did you mean 'circle'"):
        tok(["a red circel"])
    with pytest.raises(ValueError, match="more than max_len=4"):
        tok(["a red circle a blue"])
    with pytest.raises(ValueError, match="empty"):
        tok([""])


def test_text_encoder_word_convolution():
    """The tiny text encoder's word convolution (``conv_kernel``): a word's features do not depend on
    how much padding follows the prompt (padding is zeroed before the convolution), the weights round
    trip strictly under their own key, and an even kernel is refused."""
    torch.manual_seed(0)
    enc = TinyTextEncoder(TextConfig(**{**TEXT.to_dict(), "conv_kernel": 3})).eval()
    assert enc.state_dict()["conv.weight"].shape == (32, 32, 3)
    with torch.no_grad():
        alone, _ = enc.encode(["a red circle"])   # padded to max_len: one pad after the prompt
        ids, mask = enc.tokenize(["a red circle"])
        no_pad = enc(ids[:, :3], mask[:, :3])
    torch.testing.assert_close(alone[:, :3], no_pad, rtol=0, atol=1e-6)
    enc2 = TinyTextEncoder(enc.cfg)
    load_strict(enc2, enc.state_dict(), "text")
    torch.testing.assert_close(enc2.encode(["a blue square"])[0], enc.encode(["a blue square"])[0], rtol=0, atol=0)
    with pytest.raises(ValueError, match="conv_kernel must be odd"):
        TinyTextEncoder(TextConfig(**{**TEXT.to_dict(), "conv_kernel": 2}))


def test_bit_loss_uniform_and_reweighted_by_scale(small_gen):
    """``T2IGenerator.loss`` = the mean bitwise cross-entropy of every bit (uniform), or with
    ``reweight_by_scale`` each token of scale k weighted √(h_K·w_K / h_k·w_k), normalised; computed here
    directly from the logits."""
    feats, mask = _text(small_gen)
    z = torch.randn(2, SMALL.codebook_dim, 4, 4, generator=torch.Generator().manual_seed(4))
    bits, x = small_gen.vae.requantize(z, SMALL.scale_schedule)
    logits = small_gen.forward_teacher(feats, mask, bits, x)
    ce_BL = torch.nn.functional.cross_entropy(logits.reshape(-1, 2), torch.cat(bits, 1).reshape(-1),
                                              reduction="none").view(2, logits.shape[1], -1).mean(-1)
    torch.testing.assert_close(small_gen.loss(feats, mask, bits, x), ce_BL.mean())
    w = torch.cat([torch.full((h * w_,), 4 / math.sqrt(h * w_)) for h, w_ in SMALL.scale_schedule])
    want = (ce_BL * (w / w.sum())).sum(-1).mean()
    got = small_gen.loss(feats, mask, bits, x, reweight_by_scale=True)
    torch.testing.assert_close(got, want)
    assert not torch.allclose(got, ce_BL.mean())   # the weighting changes the value: the check can fail
    # per-token weights (the tiny recipe's background_weight): Σ w·ce / Σ w over the batch, times the scale weights
    w_BL = torch.rand(ce_BL.shape, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(small_gen.loss(feats, mask, bits, x, weight_BL=w_BL), (ce_BL * w_BL).sum() / w_BL.sum())
    torch.testing.assert_close(small_gen.loss(feats, mask, bits, x, weight_BL=torch.ones_like(ce_BL)), ce_BL.mean())
    ws_BL = w_BL * w
    torch.testing.assert_close(small_gen.loss(feats, mask, bits, x, reweight_by_scale=True, weight_BL=w_BL),
                               (ce_BL * ws_BL).sum() / ws_BL.sum())
    torch.testing.assert_close(small_gen.loss(feats, mask, bits, x, reweight_by_scale=True,
                                              weight_BL=torch.ones_like(ce_BL)), want)


def test_bit_loss_on_a_prefix_of_the_schedule(small_gen):
    """``schedule=`` a prefix (the recipe's coarse-first steps): the loss over the prefix's tokens only,
    equal to the full pass's cross-entropy of those tokens (the mask is block-causal: later scales
    cannot change earlier ones), uniform and reweighted; a schedule that is not a prefix is refused."""
    feats, mask = _text(small_gen)
    z = torch.randn(2, SMALL.codebook_dim, 4, 4, generator=torch.Generator().manual_seed(4))
    full = SMALL.scale_schedule
    bits, x = small_gen.vae.requantize(z, full)
    ce_BL = small_gen.token_ce(feats, mask, bits, x)
    pre = tuple(full[:2])
    Lp = sum(h * w for h, w in pre)
    pbits, px = small_gen.vae.requantize(z, pre)
    assert all(torch.equal(a, b) for a, b in zip(pbits, bits[:2]))
    torch.testing.assert_close(small_gen.loss(feats, mask, pbits, px, schedule=pre), ce_BL[:, :Lp].mean())
    w = torch.cat([torch.full((h * w_,), 4 / math.sqrt(h * w_)) for h, w_ in pre])
    torch.testing.assert_close(small_gen.loss(feats, mask, pbits, px, reweight_by_scale=True, schedule=pre),
                               (ce_BL[:, :Lp] * (w / w.sum())).sum(-1).mean())
    w_BL = torch.rand(2, Lp, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(small_gen.loss(feats, mask, pbits, px, weight_BL=w_BL, schedule=pre),
                               (ce_BL[:, :Lp] * w_BL).sum() / w_BL.sum())
    as_lists = [list(hw) for hw in pre]   # a schedule as lists (e.g. read from JSON) is the same prefix
    torch.testing.assert_close(small_gen.loss(feats, mask, pbits, px, schedule=as_lists), ce_BL[:, :Lp].mean())
    for bad in ((full[1],), (), ((3, 3),)):
        with pytest.raises(ValueError, match=re.escape(f"schedule {bad} is not a non-empty prefix of the model's "
                                                       f"{tuple(full)}")):
            small_gen.loss(feats, mask, pbits, px, schedule=bad)


def test_t5_folder_missing_is_a_clear_error(tmp_path):
    from bench.models.text import T5TextEncoder
    with pytest.raises(FileNotFoundError, match="flan-t5-xl"):
        T5TextEncoder(tmp_path / "nowhere")


def test_infinity_2b_files_missing_error(tmp_path):
    from bench.checkpoint import CheckpointNotFound
    from bench.registry import MODELS
    with pytest.raises(CheckpointNotFound) as e:
        MODELS.get("infinity-2b")(ckpt_dir=tmp_path)
    msg = str(e.value)
    assert "infinity_2b_reg.pth" in msg and "infinity_vae_d32_reg.pth" in msg and "infinity_vae_d32reg.pth" in msg


def test_hart_folder_missing_error(tmp_path):
    from bench.registry import MODELS
    with pytest.raises(FileNotFoundError, match="llm/"):
        MODELS.get("hart-0.7b")(ckpt_dir=tmp_path)


def test_info_json_tiny_t2i_contract():
    import contextlib
    import io

    from bench.cli import main
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["info", "tiny-t2i", "--json"]) == 0
    out = json.loads(buf.getvalue())
    for k in ("model", "params", "tokenizer_params", "text_encoder_params", "flops", "flops_no_cfg", "tokens_per_scale"):
        assert k in out
    assert out["tokens_per_scale"] == [1, 4, 16, 36, 64]
    assert out["flops"] > 1.5 * out["flops_no_cfg"]
    from bench.models.infinity import Infinity as Inf
    from bench.tiny import configs
    assert out["params"] == sum(p.numel() for p in Inf(configs.TINY_T2I).parameters())


@pytest.mark.slow
def test_info_json_infinity_2b_and_hart():
    """Weight-free accounting of the paper-world models (meta device; ~30 s on 2 cores)."""
    from bench.accounting import hart_info, t2i_info
    from bench.registry import MODELS
    card = MODELS.get("infinity-2b")
    out = t2i_info(card.build(device="meta", text=False), card)
    assert out["params"] == 2_204_564_032          # depth 32, C 2048 (var-arch notes: 2,204,564,032)
    assert out["total_tokens"] == 10521
    assert 1.95 < out["flops"] / out["flops_no_cfg"] < 2.05
    h = hart_info(MODELS.get("hart-0.7b"))
    assert h["total_tokens"] == sum(p * p for p in (1, 2, 3, 4, 5, 7, 9, 12, 16, 21, 27, 36, 48, 64))
    from bench.method import Context, apply_chain
    hart = MODELS.get("hart-0.7b")
    fast, lazy = (hart_info(hart, apply_chain(hart.build("meta", hart.config()), [m], Context(progress=False)), [m])
                  for m in ("fastvar", "lazyvar"))
    assert lazy["methods"] == ["lazyvar"] and h["flops"] > fast["flops"] and h["flops"] > lazy["flops"]
    assert lazy["params"] == h["params"]   # token methods change no weight


def test_hart_text_model_missing_error(tmp_path):
    from bench.registry import MODELS
    with pytest.raises(FileNotFoundError, match="Qwen2-VL-1.5B-Instruct"):
        MODELS.get("hart-0.7b").text_encoder(tmp_path)


def test_sample_cli_bad_inputs(capsys):
    from bench.cli import main
    assert main(["sample", "tiny-var", "--prompt", "a red circle", "--out", "x.png"]) == 2
    assert "not one" in capsys.readouterr().err
    assert main(["sample", "tiny-t2i", "--prompt", "a red circle", "--n", "0", "--out", "x.png"]) == 2
    assert "[1, 64]" in capsys.readouterr().err
