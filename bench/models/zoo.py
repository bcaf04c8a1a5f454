"""Building and loading the generators that ``bench.models.cards`` describes (the torch side of a
model card): strict loading, with cosine attention and per-block sizes (pruned models) read from the
checkpoint itself.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from bench.checkpoint import load_built, read_state_dict
from bench.models.cards import ModelCard
from bench.models.configs import VARConfig, VQVAEConfig
from bench.models.generator import Generator
from bench.models.var import VAR, attn_l2_norm_in, sizes_in
from bench.models.vqvae import VQVAE


def build(card: ModelCard, var_cfg: Optional[VARConfig] = None, device="cpu") -> Generator:
    """Randomly initialised generator of ``card`` (``device='meta'``: no memory, for accounting)."""
    with torch.device(device):
        return Generator(VAR(var_cfg or card.var_cfg), VQVAE(card.vae_cfg), name=card.name)


def load(card: ModelCard, ckpt_dir=None, device="cpu") -> Generator:
    """``card``'s generator with its checkpoints loaded (strict), after checking the files' identity
    (every missing file listed; tiny-world files against their manifest)."""
    card.identity(ckpt_dir)
    files = card.files(ckpt_dir)
    return load_generator(files[card.var_file], files[card.vae_file], card, device=device)


def load_vae(path, cfg: VQVAEConfig, device="cpu") -> VQVAE:
    return load_built(lambda: VQVAE(cfg), read_state_dict(path), Path(path).name, device)


def load_var(path, cfg: VARConfig, device="cpu") -> VAR:
    """Transformer weights; cosine attention and per-block sizes (pruned models) come from the file."""
    sd = read_state_dict(path)
    cfg = cfg.replace(attn_l2_norm=attn_l2_norm_in(sd))
    try:
        cfg = sizes_in(sd, cfg)
    except KeyError:
        pass  # keys missing: the strict check below lists them all
    return load_built(lambda: VAR(cfg), sd, Path(path).name, device, requires_grad=True)


def load_generator(var_path, vae_path, card: ModelCard, device="cpu") -> Generator:
    vae = load_vae(vae_path, card.vae_cfg, device)
    var = load_var(var_path, card.var_cfg, device)
    return Generator(var, vae, name=card.name)


# ---------------------------------------------------------------- text-to-image (Infinity class)
def build_t2i(card, device="cpu", text: bool = True):
    """Randomly initialised text-to-image generator of ``card`` (``device='meta'``: for accounting).
    The paper world's Flan-T5 is not built here (``text=False`` or paper world: no text encoder)."""
    from bench.models.bsq import BSQVAE
    from bench.models.infinity import Infinity
    from bench.models.t2i import T2IGenerator
    from bench.models.text import TinyTextEncoder
    with torch.device(device):
        enc = TinyTextEncoder(card.text_cfg) if text and card.text_cfg is not None else None
        return T2IGenerator(Infinity(card.inf_cfg), BSQVAE(card.vae_cfg), enc, name=card.name)


def load_bsq(path, cfg, device="cpu"):
    from bench.models.bsq import BSQVAE
    # Infinity's VAE file keeps its state_dict under "vae"
    return load_built(lambda: BSQVAE(cfg), read_state_dict(path, entry="vae"), Path(path).name, device)


def load_t2i(card, ckpt_dir=None, device="cpu"):
    """``card``'s text-to-image generator with its files loaded (strict) after checking their identity;
    the paper world's text encoder comes from ``<ckpt dir>/flan-t5-xl`` (transformers, optional)."""
    from bench.models.infinity import Infinity, adapt_state_dict
    from bench.models.t2i import T2IGenerator
    from bench.models.text import T5TextEncoder, TinyTextEncoder
    card.identity(ckpt_dir)
    files = card.files(ckpt_dir)
    vae = load_bsq(files[card.vae_file], card.vae_cfg, device)
    inf = load_built(lambda: Infinity(card.inf_cfg), adapt_state_dict(read_state_dict(files[card.inf_file])),
                     card.inf_file, device)
    if card.text_cfg is not None:
        text = load_built(lambda: TinyTextEncoder(card.text_cfg), read_state_dict(files[card.text_file]),
                          card.text_file, device)
    else:
        text = T5TextEncoder(card.folder(ckpt_dir) / card.text_file, device=device)
    return T2IGenerator(inf, vae, text, name=card.name)
