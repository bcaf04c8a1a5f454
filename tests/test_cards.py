"""Model cards and configs, torch-free: the official sizes (VAR: width 64·depth, head dim 64; Infinity-2B:
head dim 128, FFN 8192, 16 pool heads), pruned per-block sizes, Infinity's scale schedules per aspect
ratio, image sizes, where each card's files are looked for and what a missing file's error says."""
import hashlib
import json

import pytest

from bench import defaults
from bench.checkpoint import CheckpointError, CheckpointNotFound
from bench.models.configs import (
    INFINITY_RATIO_HWS,
    BSQConfig,
    InfinityConfig,
    TextConfig,
    VARConfig,
    VQVAEConfig,
    infinity_schedule,
)
from bench.registry import MODELS

VAR_URL = "https://huggingface.co/FoundationVision/var/resolve/main/"
INF_URL = "https://huggingface.co/FoundationVision/Infinity/resolve/main/"
ONE_M = INFINITY_RATIO_HWS[1.0]


@pytest.mark.parametrize("depth", [16, 20, 24, 30])
def test_official_var_sizes(depth):
    cfg = VARConfig.official(depth)
    assert (cfg.depth, cfg.width, cfg.num_heads, cfg.hd) == (depth, 64 * depth, depth, 64)
    assert [cfg.block_heads(i) for i in (0, depth - 1)] == [depth, depth]
    assert cfg.block_ffn(depth - 1) == 256 * depth and cfg.L == 680   # 1² + 2² + … + 16²
    assert MODELS.get(f"var-d{depth}").var_cfg == cfg
    assert VARConfig.official(depth, num_classes=10).num_classes == 10


def test_pruned_var_blocks_keep_their_own_sizes():
    cfg = VARConfig.official(16).replace(heads=(16, 12, 8) + (16,) * 13, ffn_hidden=(4096, 100) + (4096,) * 14,
                                         head_dim=64)
    assert [cfg.block_heads(i) for i in range(3)] == [16, 12, 8] and [cfg.block_ffn(i) for i in range(3)] == [4096, 100, 4096]
    assert cfg.hd == 64 and VARConfig(width=1000, num_heads=10, head_dim=48).hd == 48
    assert VARConfig(width=768, num_heads=12).hd == 64 and VARConfig(width=10, mlp_ratio=2.5).block_ffn(0) == 25
    assert VARConfig(patch_nums=(1, 2, 4)).L == 21


def test_replace_makes_a_new_config():
    a = VARConfig.official(16)
    b = a.replace(depth=2)
    assert (a.depth, b.depth, b.width) == (16, 2, 1024) and b is not a
    i = InfinityConfig.infinity_2b()
    assert i.replace(depth=2).depth == 2 and i.depth == 32


def test_configs_as_dicts():
    d = VARConfig.official(16).to_dict()
    assert d["width"] == 1024 and d["patch_nums"] == (1, 2, 3, 4, 5, 6, 8, 10, 13, 16) and d["heads"] is None
    assert VARConfig(**d) == VARConfig.official(16) and len(d) == 16
    assert VQVAEConfig().to_dict() == {
        "vocab_size": 4096, "z_channels": 32, "ch": 160, "ch_mult": (1, 1, 2, 2, 4), "num_res_blocks": 2,
        "using_sa": True, "using_mid_sa": True, "dropout": 0.0, "beta": 0.25, "quant_conv_ks": 3, "quant_resi": 0.5,
        "share_quant_resi": 4, "patch_nums": (1, 2, 3, 4, 5, 6, 8, 10, 13, 16)}
    assert BSQConfig().to_dict() == {"codebook_dim": 32, "base_ch": 128, "ch_mult": (1, 2, 4, 4, 4),
                                     "num_res_blocks": 2, "patch_size": 16}
    assert TextConfig().to_dict() == {"vocab": ("<pad>",), "max_len": 8, "width": 128, "depth": 2, "heads": 4,
                                      "out_channels": 128, "conv_kernel": 0}
    inf = InfinityConfig.infinity_2b().to_dict()
    assert InfinityConfig(**inf) == InfinityConfig.infinity_2b() and inf["scale_schedule"] == ONE_M


def test_infinity_2b_sizes():
    cfg = InfinityConfig.infinity_2b()
    assert (cfg.depth, cfg.width, cfg.num_heads, cfg.hd, cfg.ffn_hidden, cfg.pool_heads) == (32, 2048, 16, 128, 8192, 16)
    assert cfg.L == sum(h * w for h, w in ONE_M) == 10521 and cfg.image_size == (1024, 1024)
    assert InfinityConfig.infinity_2b(block_chunks=1).block_chunks == 1
    # the official rounding of the FFN to a multiple of 256, and the pool's heads for a wide model (C > 4096)
    assert InfinityConfig(width=200, mlp_ratio=4.0).ffn_hidden == 768 and InfinityConfig(width=100).ffn_hidden == 512
    assert InfinityConfig(width=1313).ffn_hidden == 21 * 256          # 5252 / 256 = 20.52: rounded to the nearest
    assert InfinityConfig(width=4096).pool_heads == 16 and InfinityConfig(width=4097).pool_heads == 32
    assert InfinityConfig(scale_schedule=((1, 1), (3, 5)), vae_stride=8).image_size == (24, 40)
    assert InfinityConfig(scale_schedule=((1, 1), (3, 5))).L == 16


def test_infinity_schedules_per_aspect_ratio_and_resolution():
    assert infinity_schedule() == ONE_M and ONE_M[-1] == (64, 64) and len(ONE_M) == 13
    assert [len(infinity_schedule(1.0, pn)) for pn in ("0.06M", "0.25M", "0.60M", "1M")] == [7, 10, 12, 13]
    assert infinity_schedule(1.0, "0.06M")[-1] == (16, 16) and infinity_schedule(1.0, "0.25M")[-1] == (32, 32)
    assert infinity_schedule(2.0)[-1] == (90, 45) and infinity_schedule(0.5)[-1] == (45, 90)   # w > h: transposed
    assert infinity_schedule(1.3) == INFINITY_RATIO_HWS[1.333] and infinity_schedule(1.29) == INFINITY_RATIO_HWS[1.25]
    assert infinity_schedule(10.0) == INFINITY_RATIO_HWS[3.0] and infinity_schedule(0.01) == INFINITY_RATIO_HWS[0.333]
    assert sorted(INFINITY_RATIO_HWS) == [0.333, 0.4, 0.5, 0.571, 0.666, 0.75, 0.8, 1.0, 1.25, 1.333, 1.5, 1.75, 2.0,
                                          2.5, 3.0]
    assert INFINITY_RATIO_HWS[0.8] == tuple((w, h) for h, w in INFINITY_RATIO_HWS[1.25])


@pytest.mark.parametrize("h_div_w", [0, -1.0, float("nan")])
def test_infinity_schedule_refuses_a_ratio_that_is_not_positive(h_div_w):
    with pytest.raises(ValueError) as e:
        infinity_schedule(h_div_w)
    assert str(e.value) == f"h_div_w must be > 0, got {h_div_w}"


def test_infinity_schedule_refuses_an_unknown_resolution_class():
    with pytest.raises(ValueError) as e:
        infinity_schedule(1.0, "2M")
    assert str(e.value) == "unknown resolution class '2M'; one of 0.06M, 0.25M, 0.60M, 1M"


def test_image_sizes_and_default_sampling():
    sizes = {name: MODELS.get(name).image_size for name in ("var-d16", "var-d30", "tiny-var", "infinity-2b", "tiny-t2i",
                                                           "hart-0.7b")}
    assert sizes == {"var-d16": 256, "var-d30": 256, "tiny-var": 32, "infinity-2b": 1024, "tiny-t2i": 64,
                     "hart-0.7b": 1024}
    card = MODELS.get("var-d16")
    assert card.sampling == defaults.SAMPLING and card.sampling is not defaults.SAMPLING
    assert MODELS.get("tiny-var").sampling == defaults.TINY_SAMPLING
    assert MODELS.get("infinity-2b").sampling == defaults.INFINITY_SAMPLING
    assert MODELS.get("tiny-t2i").sampling == defaults.TINY_T2I_SAMPLING
    assert MODELS.get("hart-0.7b").sampling == defaults.HART_SAMPLING
    # the official evaluation settings (VAR README's FID protocol; Infinity scripts/eval.sh and FastVAR's
    # geneval.sh / mjhq30k_fid_clip.py: tau 1, not the tau 0.5 of the single-image demo infer.sh; HART sample.py)
    assert defaults.SAMPLING == {"cfg": 1.5, "top_k": 900, "top_p": 0.96, "more_smooth": False}
    assert defaults.INFINITY_SAMPLING == {"cfg": 4.0, "tau": 1.0, "top_k": 900, "top_p": 0.97}
    assert defaults.HART_SAMPLING == {"cfg": 4.5, "top_p": 0.0, "more_smooth": True}
    assert (card.world, MODELS.get("tiny-var").world, MODELS.get("tiny-t2i").world) == ("paper", "tiny", "tiny")


def test_where_each_card_looks_for_its_files(tmp_path, monkeypatch):
    from bench.resources import resource_dir
    monkeypatch.delenv("VARBENCH_TINY_DIR", raising=False)
    monkeypatch.setenv("VARBENCH_CKPT_DIR", str(tmp_path / "env"))
    for name in ("var-d16", "infinity-2b"):
        card = MODELS.get(name)
        assert card.folder() == tmp_path / "env" and card.folder(tmp_path / "flag") == tmp_path / "flag"
        assert card.folder(str(tmp_path)) == tmp_path
    for name in ("tiny-var", "tiny-t2i"):
        assert MODELS.get(name).folder() == resource_dir("assets/tiny") and MODELS.get(name).folder(tmp_path) == tmp_path
    hart = MODELS.get("hart-0.7b")
    assert hart.folder() == tmp_path / "env" / "hart-0.7b-1024px" and hart.folder(tmp_path) == tmp_path / "hart-0.7b-1024px"
    monkeypatch.setenv("VARBENCH_TINY_DIR", str(tmp_path / "tiny"))
    assert MODELS.get("tiny-var").folder() == tmp_path / "tiny"


def _missing(card, folder):
    with pytest.raises(CheckpointNotFound) as e:
        card.files(folder)
    return str(e.value).splitlines()


def test_a_missing_file_says_where_to_get_it(tmp_path, monkeypatch):
    assert _missing(MODELS.get("var-d20"), tmp_path) == [
        f"2 checkpoint file(s) not found in {tmp_path}:",
        f"  vae_ch160v4096z32.pth: get it from {VAR_URL}vae_ch160v4096z32.pth",
        f"  var_d20.pth: get it from {VAR_URL}var_d20.pth",
        f"  Put them in {tmp_path} (or point --ckpt-dir / VARBENCH_CKPT_DIR at the folder that has them). varbench "
        f"never downloads at run time."]
    assert _missing(MODELS.get("infinity-2b"), tmp_path)[1:3] == [
        f"  infinity_vae_d32_reg.pth: get it from {INF_URL}infinity_vae_d32reg.pth (saved as infinity_vae_d32_reg.pth)",
        f"  infinity_2b_reg.pth: get it from {INF_URL}infinity_2b_reg.pth"]
    make = ("`varbench train-tiny` (`make tiny-models` in a checkout; retrains the tiny world from scratch; recipe "
            "in bench/recipes/tiny.py)")
    assert _missing(MODELS.get("tiny-var"), tmp_path)[1:] == [
        f"  tiny_vqvae.safetensors: get it from {make}", f"  tiny_var.safetensors: get it from {make}",
        # the tiny world's folder: --ckpt-dir or VARBENCH_TINY_DIR (VARBENCH_CKPT_DIR is the paper world's)
        f"  Put them in {tmp_path}, point --ckpt-dir or VARBENCH_TINY_DIR at the folder that has them, or reinstall "
        f"varbench (the package ships them in assets/tiny). varbench never downloads at run time."]
    monkeypatch.setenv("VARBENCH_TINY_DIR", str(tmp_path))   # a folder of one's own: unsetting it is the way back
    assert _missing(MODELS.get("tiny-var"), None)[-1] == (
        f"  Put them in {tmp_path}, point --ckpt-dir or VARBENCH_TINY_DIR at the folder that has them, or unset "
        f"VARBENCH_TINY_DIR to use the ones shipped with varbench. varbench never downloads at run time.")
    monkeypatch.delenv("VARBENCH_TINY_DIR")
    make = ("`python -m bench.recipes.tiny_t2i` (`make tiny-t2i` in a checkout; retrains tiny-t2i from scratch; "
            "recipe in bench/recipes/tiny_t2i.py)")
    assert _missing(MODELS.get("tiny-t2i"), tmp_path)[1:4] == [f"  tiny_bsq.safetensors: get it from {make}",
                                                                f"  tiny_t2i.safetensors: get it from {make}",
                                                                f"  tiny_t2i_text.safetensors: get it from {make}"]
    (tmp_path / "var_d20.pth").write_bytes(b"x")
    assert _missing(MODELS.get("var-d20"), tmp_path)[:2] == [
        f"1 checkpoint file(s) not found in {tmp_path}:", f"  vae_ch160v4096z32.pth: get it from {VAR_URL}vae_ch160v4096z32.pth"]


def test_identity_is_the_sha256_of_the_files_and_tiny_files_match_their_manifest(tmp_path):
    for name, files in (("var-d24", ("vae_ch160v4096z32.pth", "var_d24.pth")),
                        ("infinity-2b", ("infinity_vae_d32_reg.pth", "infinity_2b_reg.pth"))):
        for i, f in enumerate(files):
            (tmp_path / f).write_bytes(f"{name} {i}".encode())
        card = MODELS.get(name)
        assert list(card.files(tmp_path)) == list(files)        # the VAE first
        assert card.identity(tmp_path) == {f: hashlib.sha256(f"{name} {i}".encode()).hexdigest()
                                           for i, f in enumerate(files)}
    for name in ("tiny-var", "tiny-t2i"):
        card = MODELS.get(name)
        manifest = json.loads((card.folder() / "manifest.json").read_text())["models"]
        shipped = {e["file"]: e["sha256"] for e in manifest.values()}
        ids = card.identity()
        assert ids and ids == {f: shipped[f] for f in ids}
    tiny = MODELS.get("tiny-var")
    for f in tiny.files():
        (tmp_path / "t" / f).parent.mkdir(exist_ok=True)
        (tmp_path / "t" / f).write_bytes(b"retrained")
    (tmp_path / "t" / "manifest.json").write_text((tiny.folder() / "manifest.json").read_text())
    with pytest.raises(CheckpointError):   # a changed tiny file is an error, not a new silent key
        tiny.identity(tmp_path / "t")
    (tmp_path / "t" / "manifest.json").unlink()
    assert set(tiny.identity(tmp_path / "t").values()) == {hashlib.sha256(b"retrained").hexdigest()}
