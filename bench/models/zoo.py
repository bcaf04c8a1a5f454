"""Building and loading the generators that ``bench.models.cards`` describes (the torch side of a
model card): strict loading, with cosine attention and per-block sizes (pruned models) read from the
checkpoint itself.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from bench.checkpoint import load_strict, read_state_dict
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
    sd = read_state_dict(path)
    with torch.device("meta"):
        vae = VQVAE(cfg)
    load_strict(vae, vae.adapt_state_dict(sd), Path(path).name, assign=True)
    return vae.to(device).eval().requires_grad_(False)


def load_var(path, cfg: VARConfig, device="cpu") -> VAR:
    """Transformer weights; cosine attention and per-block sizes (pruned models) come from the file."""
    sd = read_state_dict(path)
    cfg = cfg.replace(attn_l2_norm=attn_l2_norm_in(sd))
    try:
        cfg = sizes_in(sd, cfg)
    except KeyError:
        pass  # keys missing: the strict check below lists them all
    with torch.device("meta"):
        var = VAR(cfg)
    load_strict(var, sd, Path(path).name, assign=True)
    return var.to(device).eval()


def load_generator(var_path, vae_path, card: ModelCard, device="cpu") -> Generator:
    vae = load_vae(vae_path, card.vae_cfg, device)
    var = load_var(var_path, card.var_cfg, device)
    return Generator(var, vae, name=card.name)
