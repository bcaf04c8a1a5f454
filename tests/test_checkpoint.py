"""Official-format state_dicts load strictly; bad checkpoints give one clear error."""
import pytest
import torch

from bench.checkpoint import CheckpointError, CheckpointMismatch, CheckpointNotFound, read_state_dict
from bench.models.var import VAR, VARConfig
from bench.models.vqvae import VQVAE
from bench.models.zoo import load_generator, load_var
from bench.registry import MODELS
from tests.conftest import SMALL_VAE, SMALL_VAR, randomize_


def _official_keys(depth: int):
    """Keys and shapes of the official var_d{depth}.pth (FoundationVision/VAR's checkpoints), written out."""
    C, L, V = 64 * depth, 680, 4096
    keys = {"pos_start": (1, 1, C), "pos_1LC": (1, L, C), "lvl_1L": (1, L), "attn_bias_for_masking": (1, 1, L, L),
            "word_embed.weight": (C, 32), "word_embed.bias": (C,), "class_emb.weight": (1001, C),
            "lvl_embed.weight": (10, C), "head_nm.ada_lin.1.weight": (2 * C, C), "head_nm.ada_lin.1.bias": (2 * C,),
            "head.weight": (V, C), "head.bias": (V,)}
    for i in range(depth):
        b = f"blocks.{i}."
        keys.update({b + "attn.scale_mul_1H11": (1, depth, 1, 1), b + "attn.q_bias": (C,), b + "attn.v_bias": (C,),
                     b + "attn.zero_k_bias": (C,), b + "attn.mat_qkv.weight": (3 * C, C),
                     b + "attn.proj.weight": (C, C), b + "attn.proj.bias": (C,),
                     b + "ffn.fc1.weight": (4 * C, C), b + "ffn.fc1.bias": (4 * C,),
                     b + "ffn.fc2.weight": (C, 4 * C), b + "ffn.fc2.bias": (C,),
                     b + "ada_lin.1.weight": (6 * C, C), b + "ada_lin.1.bias": (6 * C,)})
    return keys


@pytest.mark.parametrize("depth", [16, 20, 24, 30])
def test_official_key_layout(depth):
    with torch.device("meta"):
        sd = VAR(VARConfig.official(depth)).state_dict()
    assert {k: tuple(v.shape) for k, v in sd.items()} == _official_keys(depth)
    assert sd["lvl_1L"].dtype == torch.int64


def test_official_file_sizes_match_our_state_dict():
    """The official LFS sizes (reference §1.7) are (params + buffers)·4 B + ~300 B pickle overhead per key."""
    for depth, size in ((20, 2_405_720_018), (16, 1_243_124_698)):
        with torch.device("meta"):
            sd = VAR(VARConfig.official(depth)).state_dict()
        payload = sum(v.numel() * v.element_size() for v in sd.values())
        overhead = (size - payload) / len(sd)
        assert 150 < overhead < 450, (depth, overhead)


def test_official_vae_key_layout():
    with torch.device("meta"):
        sd = VQVAE().state_dict()
    assert sd["quantize.embedding.weight"].shape == (4096, 32)
    assert sd["quantize.ema_vocab_hit_SV"].shape == (10, 4096)
    for k in range(4):
        assert sd[f"quantize.quant_resi.qresi_ls.{k}.weight"].shape == (32, 32, 3, 3)
    assert "encoder.down.4.attn.1.qkv.weight" in sd and "decoder.up.4.attn.2.proj_out.weight" in sd
    assert "encoder.down.3.downsample.conv.weight" in sd and "decoder.up.1.upsample.conv.weight" in sd
    assert "encoder.down.0.block.0.nin_shortcut.weight" not in sd   # Identity where in == out
    assert "encoder.down.2.block.0.nin_shortcut.weight" in sd


def test_strict_round_trip(tmp_path):
    var, vae = randomize_(VAR(SMALL_VAR), 3), randomize_(VQVAE(SMALL_VAE), 4)
    torch.save(var.state_dict(), tmp_path / "var.pth")
    torch.save(vae.state_dict(), tmp_path / "vae.pth")

    class Card:
        var_cfg, vae_cfg, name = SMALL_VAR, SMALL_VAE, "small"
    gen = load_generator(tmp_path / "var.pth", tmp_path / "vae.pth", Card)
    for k, v in var.state_dict().items():
        assert torch.equal(gen.var.state_dict()[k], v), k
    for k, v in vae.state_dict().items():
        assert torch.equal(gen.vae.state_dict()[k], v), k


def test_attn_l2_norm_detected_from_checkpoint(tmp_path):
    var = VAR(SMALL_VAR.replace(attn_l2_norm=False))
    torch.save(var.state_dict(), tmp_path / "v.pth")
    loaded = load_var(tmp_path / "v.pth", SMALL_VAR)   # card says True; the file says otherwise
    assert loaded.cfg.attn_l2_norm is False and not hasattr(loaded.blocks[0].attn, "scale_mul_1H11")


def test_pruned_sizes_detected_from_checkpoint(tmp_path):
    cfg = SMALL_VAR.replace(heads=(1, 2), ffn_hidden=(96, 512))
    torch.save(VAR(cfg).state_dict(), tmp_path / "p.pth")
    loaded = load_var(tmp_path / "p.pth", SMALL_VAR)
    assert loaded.cfg.heads == (1, 2) and loaded.cfg.ffn_hidden == (96, 512)


def test_mismatched_checkpoint_lists_every_bad_key(tmp_path):
    sd = VAR(SMALL_VAR).state_dict()
    del sd["head.bias"]
    sd["blocks.0.attn.extra"] = torch.zeros(3)
    sd["word_embed.weight"] = torch.zeros(128, 9)
    torch.save(sd, tmp_path / "bad.pth")
    with pytest.raises(CheckpointMismatch) as e:
        load_var(tmp_path / "bad.pth", SMALL_VAR)
    msg = str(e.value)
    assert "missing     head.bias: expected [64]" in msg
    assert "unexpected  blocks.0.attn.extra: found [3]" in msg
    assert "wrong shape word_embed.weight: expected [128, 8], found [128, 9]" in msg
    assert "1 missing, 1 unexpected, 1 wrongly shaped" in msg


def test_truncated_checkpoint_is_a_clear_error(tmp_path):
    torch.save(VAR(SMALL_VAR).state_dict(), tmp_path / "full.pth")
    data = (tmp_path / "full.pth").read_bytes()
    (tmp_path / "cut.pth").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="not a readable checkpoint — truncated"):
        read_state_dict(tmp_path / "cut.pth")


def test_non_checkpoint_file_is_a_clear_error(tmp_path):
    (tmp_path / "notes.pth").write_text("these are not weights\n")
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        read_state_dict(tmp_path / "notes.pth")


def test_missing_official_checkpoint_names_file_source_and_folder(tmp_path):
    with pytest.raises(CheckpointNotFound) as e:
        MODELS.get("var-d16")(ckpt_dir=tmp_path)
    msg = str(e.value)
    assert "vae_ch160v4096z32.pth" in msg and "not found in" in msg and str(tmp_path) in msg
    assert "huggingface.co/FoundationVision/var" in msg and "never downloads" in msg


def test_vae_from_another_schedule_keeps_our_usage_buffer(tmp_path):
    """Official behaviour: ema_vocab_hit_SV has one row per scale; a file for another schedule still loads."""
    from bench.models.vqvae import VQVAEConfig
    from bench.models.zoo import load_vae
    sd = randomize_(VQVAE(SMALL_VAE), 5).state_dict()
    torch.save(sd, tmp_path / "vae.pth")
    other = VQVAEConfig(**{**SMALL_VAE.to_dict(), "patch_nums": (1, 2, 8)})
    vae = load_vae(tmp_path / "vae.pth", other)
    assert vae.quantize.ema_vocab_hit_SV.shape == (3, 64)
    assert torch.equal(vae.quantize.embedding.weight, sd["quantize.embedding.weight"])


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_pruned_model_loads_back_with_the_same_logits(small_gen, tmp_path, suffix):
    """Save a physically pruned model (blocks of different sizes), load it through the real loader
    with the *dense* card config, and compare the loaded model's teacher-forced logits and images."""
    from bench.method import Context, build_method
    from bench.models.generator import Generator
    from bench.prune import keep_channels, sync_config

    pruned = build_method("magnitude:sparsity=0.4").apply(small_gen, Context())
    keep_channels(pruned.var.blocks[0], torch.arange(0, 307, 3))   # block 0: 103 channels, block 1: 307
    sync_config(pruned)
    assert pruned.var.cfg.heads == (1, 1) and pruned.var.cfg.ffn_hidden == (103, 307)
    sd = {k: v.contiguous() for k, v in pruned.var.state_dict().items()}
    var_path, vae_path = tmp_path / f"pruned{suffix}", tmp_path / f"vae{suffix}"
    if suffix == ".pth":
        torch.save(sd, var_path)
        torch.save(small_gen.vae.state_dict(), vae_path)
    else:
        from safetensors.torch import save_file
        save_file(sd, str(var_path))
        save_file({k: v.contiguous() for k, v in small_gen.vae.state_dict().items()}, str(vae_path))

    loaded = load_var(var_path, SMALL_VAR)
    assert loaded.cfg.heads == (1, 1) and loaded.cfg.ffn_hidden == (103, 307) and not loaded.training
    labels = torch.tensor([0, 2, 4])
    tokens, _ = pruned.sample_tokens(labels, seed=1)
    with torch.no_grad():
        want = pruned.forward_teacher(labels, tokens)
        got = Generator(loaded, small_gen.vae).forward_teacher(labels, tokens)
        assert torch.equal(got, want)
        # and it is not trivially equal: the dense model's logits differ
        dense = Generator(randomize_(VAR(SMALL_VAR), 1), small_gen.vae).eval()
        assert not torch.allclose(dense.forward_teacher(labels, tokens), want, atol=1e-3)

    class Card:
        var_cfg, vae_cfg, name = SMALL_VAR, SMALL_VAE, "small"
    gen = load_generator(var_path, vae_path, Card)
    assert torch.equal(gen.generate(labels, seed=3), pruned.generate(labels, seed=3))
    assert not torch.equal(gen.generate(labels, seed=4), pruned.generate(labels, seed=3))
