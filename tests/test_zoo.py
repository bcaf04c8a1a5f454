"""Building and loading the cards' generators: the shipped tiny checkpoints load strictly, every tensor
equal to the file's (fp16 files upcast to fp32), its parts in eval mode, with the transformer trainable and the
tokenizer frozen; a card builds random generators of its own (or a given) config, on the meta device
for accounting; a changed file is refused before anything loads; HART's card reads its folder's config
files (else the documented guess) and lists its missing weights before it looks for the text model."""
import pytest
import torch

from bench.checkpoint import CheckpointError, read_state_dict
from bench.models.generator import Generator
from bench.models.t2i import T2IGenerator
from bench.registry import MODELS


def _same(module, path, entry=None):
    sd = read_state_dict(path, entry)
    own = module.state_dict()
    assert set(own) == set(sd)
    for k, v in sd.items():
        assert own[k].dtype == (torch.float32 if v.is_floating_point() else v.dtype), k
        assert torch.equal(own[k], v.to(own[k].dtype)), k


def _copy_shipped(card, folder):
    """The card's shipped files and their manifest, copied into ``folder``."""
    for name, path in card.files().items():
        (folder / name).write_bytes(path.read_bytes())
    (folder / "manifest.json").write_text((card.folder() / "manifest.json").read_text())


def test_tiny_var_loads_its_shipped_files_exactly():
    card = MODELS.get("tiny-var")
    gen = card()
    files = card.files()
    assert isinstance(gen, Generator) and gen.name == "tiny-var" and not (gen.var.training or gen.vae.training)
    _same(gen.var, files[card.var_file])
    _same(gen.vae, files[card.vae_file])
    assert all(p.requires_grad for p in gen.var.parameters()) and not any(p.requires_grad for p in gen.vae.parameters())
    assert gen.var.cfg.depth == card.var_cfg.depth and gen.var.cfg.attn_l2_norm
    assert gen.vae.V == card.vae_cfg.vocab_size


def test_tiny_t2i_loads_its_shipped_files_exactly():
    card = MODELS.get("tiny-t2i")
    gen = card()
    files = card.files()
    assert isinstance(gen, T2IGenerator) and gen.name == "tiny-t2i"
    assert not (gen.infinity.training or gen.vae.training or gen.text_encoder.training)
    _same(gen.infinity, files[card.inf_file])
    _same(gen.vae, files[card.vae_file], entry="vae")
    _same(gen.text_encoder, files[card.text_file])
    assert gen.infinity.cfg == card.inf_cfg


def test_cards_build_random_generators_of_their_config():
    card = MODELS.get("tiny-var")
    gen = card.build()
    assert isinstance(gen, Generator) and gen.name == "tiny-var" and gen.var.cfg == card.var_cfg
    assert gen.vae.V == card.vae_cfg.vocab_size and next(gen.parameters()).device.type == "cpu"
    small = card.var_cfg.replace(depth=2)
    assert len(card.build(small).var.blocks) == 2
    meta = MODELS.get("var-d16").build(device="meta")
    assert next(meta.parameters()).is_meta and len(meta.var.blocks) == 16 and meta.var.cfg.width == 1024
    t2i = MODELS.get("tiny-t2i")
    built = t2i.build()
    assert isinstance(built, T2IGenerator) and built.name == "tiny-t2i" and built.text_encoder is not None
    assert t2i.build(text=False).text_encoder is None
    big = MODELS.get("infinity-2b").build(device="meta")
    assert big.text_encoder is None and next(big.parameters()).is_meta and len(big.infinity.cfg.scale_schedule) == 13
    # a card's scales (read without building, e.g. by the figures) are its generator's
    for c, g in ((card, gen), (MODELS.get("var-d16"), meta), (t2i, built), (MODELS.get("infinity-2b"), big)):
        assert c.scales_hw == tuple(tuple(hw) for hw in g.scales_hw), c.name
    assert MODELS.get("var-d16").scales_hw[-3:] == ((10, 10), (13, 13), (16, 16))
    assert t2i.scales_hw == ((1, 1), (2, 2), (4, 4), (6, 6), (8, 8))


def test_the_hart_cards_scales_are_the_0_7b_generators(monkeypatch, tmp_path):
    monkeypatch.setenv("VARBENCH_CKPT_DIR", str(tmp_path))   # no folder: the documented 0.7B config
    card = MODELS.get("hart-0.7b")
    gen = card.build(device="meta")
    assert card.scales_hw == tuple(tuple(hw) for hw in gen.scales_hw)
    assert len(card.scales_hw) == 14 and card.scales_hw[-1] == (64, 64)


def test_a_changed_tiny_file_is_refused_before_loading(tmp_path):
    card = MODELS.get("tiny-var")
    _copy_shipped(card, tmp_path)
    assert card(tmp_path).name == "tiny-var"                 # an exact copy loads
    data = bytearray((tmp_path / card.var_file).read_bytes())
    data[-1] ^= 1
    (tmp_path / card.var_file).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=card.var_file):
        card(tmp_path)


def test_the_hart_card_reads_its_folders_config_or_falls_back_to_the_documented_guess(tmp_path):
    from bench.models.hart_config import HARTConfig
    from tests.test_hart import _official_config_files
    card = MODELS.get("hart-0.7b")
    assert card.config(tmp_path) == HARTConfig.hart_0_7b()                 # no folder: the guess
    small = HARTConfig.small_for_tests()
    _official_config_files(tmp_path / "hart-0.7b-1024px", small)
    assert card.config(tmp_path) == small
    gen = card.build("meta", small)
    assert gen.name == "hart-0.7b" and gen.text_encoder is None and next(gen.parameters()).is_meta
    assert gen.hart.cfg == small and gen.tokenizer is gen.hart.tokenizer


def test_the_hart_card_builds_from_its_config_when_given_none(tmp_path, monkeypatch):
    from bench.models.hart_config import HARTConfig
    from tests.test_hart import _official_config_files
    monkeypatch.setenv("VARBENCH_CKPT_DIR", str(tmp_path))
    small = HARTConfig.small_for_tests()
    _official_config_files(tmp_path / "hart-0.7b-1024px", small)
    gen = MODELS.get("hart-0.7b").build(device="meta")
    assert gen.hart.cfg == small and next(gen.parameters()).is_meta


def test_the_hart_card_lists_its_missing_weights_before_the_text_model(tmp_path):
    from bench.checkpoint import CheckpointNotFound
    with pytest.raises(CheckpointNotFound) as e:
        MODELS.get("hart-0.7b")(tmp_path)
    assert "llm/" in str(e.value) and "Qwen2" not in str(e.value)


def test_a_changed_tiny_t2i_file_is_refused(tmp_path):
    card = MODELS.get("tiny-t2i")
    _copy_shipped(card, tmp_path)
    assert card.identity(tmp_path) == card.identity()
    (tmp_path / card.inf_file).write_bytes(b"retrained")
    with pytest.raises(CheckpointError, match=card.inf_file):
        card.identity(tmp_path)


def test_a_t2i_cards_image_size_is_its_images_height():
    from bench.models.cards import T2ICard
    from bench.models.configs import BSQConfig, InfinityConfig
    card = T2ICard(name="wide", inf_cfg=InfinityConfig(scale_schedule=((1, 1), (3, 5))), vae_cfg=BSQConfig(),
                   inf_file="i.pth", vae_file="v.pth", text_file="t")
    assert card.image_size == 48


def test_a_changed_tiny_t2i_file_is_refused_before_loading(tmp_path):
    card = MODELS.get("tiny-t2i")
    _copy_shipped(card, tmp_path)
    data = bytearray((tmp_path / card.inf_file).read_bytes())
    data[-1] ^= 1                                                    # still a loadable file, but not the shipped one
    (tmp_path / card.inf_file).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=card.inf_file):
        card(tmp_path)


def test_a_paper_world_t2i_card_loads_flan_t5_from_its_folder(tmp_path):
    from bench.models.cards import T2ICard
    tiny = MODELS.get("tiny-t2i")
    files = tiny.files()
    (tmp_path / "i.safetensors").write_bytes(files[tiny.inf_file].read_bytes())
    (tmp_path / "v.safetensors").write_bytes(files[tiny.vae_file].read_bytes())
    card = T2ICard(name="paper-t2i", inf_cfg=tiny.inf_cfg, vae_cfg=tiny.vae_cfg, inf_file="i.safetensors",
                   vae_file="v.safetensors", text_file="flan-t5-xl")
    with pytest.raises(FileNotFoundError) as e:
        card(tmp_path)
    assert str(e.value).startswith(f"text encoder (google/flan-t5-xl) not found: {tmp_path / 'flan-t5-xl'} has no "
                                   f"config.json.")
