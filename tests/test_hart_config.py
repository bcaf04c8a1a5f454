"""HART's configs without a model: every flag varbench refuses and why (whole messages), the derived
sizes, how a checkpoint folder's config files and weights are found. Torch-free."""
import json
import math

import pytest

from bench.checkpoint import CheckpointNotFound
from bench.models.hart_config import (
    HART_SOURCE,
    HARTConfig,
    HARTConfigError,
    HARTTokenizerConfig,
    _pick,
    checkpoint_files,
)


def test_tokenizer_problems_each_with_its_reason():
    ok = HARTConfig.small_for_tests().tokenizer
    assert ok.problems() == []
    assert ok.replace(share_quant_resi=0, default_qresi_counts=3).problems() == [
        "default_qresi_counts=3 with share_quant_resi=0"]
    # 0 and one per scale are what the official code supports without sharing
    assert ok.replace(share_quant_resi=0, default_qresi_counts=0).problems() == []
    assert ok.replace(share_quant_resi=0, default_qresi_counts=len(ok.v_patch_nums)).problems() == []
    assert ok.replace(share_quant_resi=1, default_qresi_counts=3).problems() == []   # counts only matter unshared
    assert ok.replace(ch=48).problems() == [
        "ch=48, ch_mult=(1, 1): the official GroupNorm needs multiples of 32"]
    assert ok.replace(ch=64, ch_mult=(2, 4)).problems() == []   # ch itself (the first level) and each level
    assert ok.replace(ch=32, ch_mult=(1, 1.5)).problems() == [
        "ch=32, ch_mult=(1, 1.5): the official GroupNorm needs multiples of 32"]
    assert ok.replace(quantizer_type="var", using_znorm=True, ch=40).problems() == [
        "quantizer_type='var' (only the hybrid 'var_hybrid' tokenizer)", "using_znorm=True (cosine codebook lookup)",
        "ch=40, ch_mult=(1, 1): the official GroupNorm needs multiples of 32"]


def test_transformer_problems_each_with_its_reason():
    ok = HARTConfig.small_for_tests()
    assert ok.problems() == [] and ok.check() is ok
    bad = ok.replace(attn_type="gpt2", mlp_type="moe", use_cross_attn=True, use_timestep_embed=True,
                     sep_aln_pooling_mode="first", sampler="ddim", num_heads=3, context_token=0,
                     patch_nums=(2,), tokenizer=ok.tokenizer.replace(using_znorm=True))
    assert bad.problems() == [
        "attn_type='gpt2' (only 'llama': RoPE attention; 'gpt2' uses absolute positions)",
        "mlp_type='moe'",
        "use_cross_attn=True (the official cross-attention needs xformers)",
        "use_timestep_embed=True (level embedding by a timestep MLP)",
        "sep_aln_pooling_mode='first'",
        "sampler='ddim' (only 'iddpm')",
        "embed_dim=64, num_heads=3: 2-D RoPE needs a head dim divisible by 4",
        "context_token >= 1 and at least two scales are needed",
        "patch_nums=(2,): the first scale must be 1×1 (it is the last context token)",
        "using_znorm=True (cosine codebook lookup)"]
    with pytest.raises(HARTConfigError) as e:
        bad.check()
    assert str(e.value) == "unsupported HART config:\n  " + "\n  ".join(bad.problems())


@pytest.mark.parametrize("kw, problem", [
    (dict(mlp_type="gpt2"), None), (dict(sep_aln_pooling_mode="avg"), None),
    (dict(num_heads=8), None), (dict(num_heads=16), None),                 # head dims 8 and 4
    (dict(embed_dim=72, num_heads=4), "embed_dim=72, num_heads=4: 2-D RoPE needs a head dim divisible by 4"),  # 18
    (dict(num_heads=5), "embed_dim=64, num_heads=5: 2-D RoPE needs a head dim divisible by 4"),  # not a divisor
    (dict(context_token=1), None), (dict(context_token=0), "context_token >= 1 and at least two scales are needed"),
    (dict(patch_nums=(1, 2)), None), (dict(patch_nums=(1,)), "context_token >= 1 and at least two scales are needed"),
])
def test_problem_boundaries(kw, problem):
    assert HARTConfig.small_for_tests(**kw).problems() == ([] if problem is None else [problem])


def test_llama_ffn_width_is_two_thirds_rounded_up_to_256():
    for C in range(64, 4097, 64):
        for ratio in (2.0, 4.0, 5.5):
            cfg = HARTConfig(embed_dim=C, num_heads=C // 64 or 1, mlp_ratio=ratio)
            assert cfg.ffn_hidden == 256 * math.ceil(math.floor(C * ratio * 2 / 3) / 256), (C, ratio)
            assert cfg.ffn_hidden % 256 == 0 and 0 <= cfg.ffn_hidden - C * ratio * 2 / 3 < 256
            assert cfg.replace(mlp_type="gpt2").ffn_hidden == round(C * ratio)
    assert HARTConfig.hart_0_7b().ffn_hidden == 4096
    assert HARTConfig(embed_dim=1920, num_heads=30).ffn_hidden == 5120   # 5120 exactly: not one more block


def test_pick_keeps_known_fields_as_the_dataclass_wants_them():
    d = {"depth": 3, "patch_nums": [1, 2], "num_sampling_steps": 8, "tokenizer": {"x": 1}, "flash_if_available": True}
    assert _pick(HARTConfig, d) == {"depth": 3, "patch_nums": (1, 2), "num_sampling_steps": "8"}
    assert _pick(HARTTokenizerConfig, {"ch_mult": [1, 2], "hybrid": True}) == {"ch_mult": (1, 2)}
    assert _pick(HARTConfig, {"depth": 2}) == {"depth": 2}   # no steps given: none added


def _write(root, cfg, llm_extra=None, tok_dir=None):
    llm = {k: v for k, v in cfg.to_dict().items() if k != "tokenizer"} | (llm_extra or {})
    (root / "llm").mkdir(parents=True, exist_ok=True)
    (root / "llm" / "config.json").write_text(json.dumps(llm))
    tok_dir = tok_dir or root / "tokenizer"
    tok_dir.mkdir(parents=True, exist_ok=True)
    (tok_dir / "config.json").write_text(json.dumps(cfg.tokenizer.to_dict()))


def test_the_tokenizer_config_comes_from_vae_path_when_it_exists(tmp_path):
    cfg = HARTConfig.small_for_tests()
    other = cfg.tokenizer.replace(vocab_size=700)
    _write(tmp_path, cfg, {"vae_path": str(tmp_path / "elsewhere")}, tok_dir=tmp_path / "tokenizer")
    assert HARTConfig.from_pretrained_dir(tmp_path) == cfg   # vae_path has no config: the sibling folder
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "config.json").write_text(json.dumps(other.to_dict()))
    assert HARTConfig.from_pretrained_dir(tmp_path).tokenizer == other


def test_model_types_other_than_harts_are_refused(tmp_path):
    cfg = HARTConfig.small_for_tests()
    _write(tmp_path, cfg, {"model_type": "llama"})
    with pytest.raises(HARTConfigError) as e:
        HARTConfig.from_pretrained_dir(tmp_path)
    assert str(e.value) == f"{tmp_path / 'llm' / 'config.json'}: model_type 'llama', expected one of " \
                           f"('hart_transformer_t2i',)"
    _write(tmp_path, cfg, {"model_type": "hart_transformer_t2i"})
    tok = json.loads((tmp_path / "tokenizer" / "config.json").read_text())
    for mt, ok in (("hart_autoencoder", True), ("hart_autoencoder_with_disc", True), ("vqvae", False)):
        (tmp_path / "tokenizer" / "config.json").write_text(json.dumps(tok | {"model_type": mt}))
        if ok:
            assert HARTConfig.from_pretrained_dir(tmp_path) == cfg
        else:
            with pytest.raises(HARTConfigError, match=r"tokenizer/config.json: model_type 'vqvae', expected one of "
                                                      r"\('hart_autoencoder', 'hart_autoencoder_with_disc'\)$"):
                HARTConfig.from_pretrained_dir(tmp_path)


def test_a_missing_config_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        HARTConfig.from_pretrained_dir(tmp_path)
    assert str(e.value) == (f"HART config {tmp_path / 'config.json'} not found (expected an official checkpoint "
                            f"folder with llm/config.json and tokenizer/config.json)")
    (tmp_path / "llm").mkdir()
    (tmp_path / "llm" / "config.json").write_text(json.dumps({}))   # found, with the tokenizer's missing
    with pytest.raises(FileNotFoundError, match=f"^HART config {tmp_path / 'tokenizer' / 'config.json'} not found"):
        HARTConfig.from_pretrained_dir(tmp_path)
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "config.json").mkdir()   # a folder of that name is not the file
    with pytest.raises(FileNotFoundError, match="not found"):
        HARTConfig.from_pretrained_dir(tmp_path)


def _weights(root, llm=("model.safetensors",), tok=("model.safetensors",), configs=True):
    for sub, names in (("llm", llm), ("tokenizer", tok)):
        (root / sub).mkdir(parents=True, exist_ok=True)
        if configs:
            (root / sub / "config.json").write_text("{}")
        for n in names:
            (root / sub / n).write_bytes(b"w")


def test_checkpoint_files_from_the_folder_or_its_llm_folder(tmp_path):
    _weights(tmp_path, llm=("pytorch_model.bin", "ema_model.bin"), tok=("pytorch_model.bin",))
    want = {"llm/ema_model.bin": tmp_path / "llm" / "ema_model.bin",
            "tokenizer/pytorch_model.bin": tmp_path / "tokenizer" / "pytorch_model.bin"}
    assert checkpoint_files(tmp_path) == want
    assert checkpoint_files(str(tmp_path / "llm")) == want   # the official --model_path
    assert checkpoint_files(tmp_path, use_ema=False)["llm/pytorch_model.bin"] == tmp_path / "llm" / "pytorch_model.bin"
    # a folder that is itself called llm and holds llm/: it is the root
    nested = tmp_path / "x" / "llm"
    _weights(nested)
    assert checkpoint_files(nested) == {"llm/model.safetensors": nested / "llm" / "model.safetensors",
                                        "tokenizer/model.safetensors": nested / "tokenizer" / "model.safetensors"}


def test_checkpoint_files_lists_everything_missing(tmp_path):
    _weights(tmp_path, llm=(), tok=("model.safetensors",), configs=False)
    with pytest.raises(CheckpointNotFound) as e:
        checkpoint_files(tmp_path)
    assert str(e.value) == (
        f"3 checkpoint file(s) not found in {tmp_path}:\n"
        f"  llm/config.json: get it from {HART_SOURCE}\n"
        f"  llm/ weights (one of ema_model.bin, model.safetensors, pytorch_model.bin): get it from {HART_SOURCE}\n"
        f"  tokenizer/config.json: get it from {HART_SOURCE}\n"
        f"  Put the folder (llm/, tokenizer/) at {tmp_path} (or point --ckpt-dir / VARBENCH_CKPT_DIR at its parent). "
        f"varbench never downloads at run time.")
