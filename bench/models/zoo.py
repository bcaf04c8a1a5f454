"""Registered models: a :class:`ModelCard` per name says how to build and load it.

Paper world: the official FoundationVision/VAR checkpoints (``var_d{16,20,24,30}.pth`` with the
shared ``vae_ch160v4096z32.pth``), 256×256, patch_nums 1…16. Weights are read from
``--ckpt-dir`` / ``$VARBENCH_CKPT_DIR``; a missing file is an error naming its official source.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from bench import defaults
from bench.checkpoint import load_strict, locate, read_state_dict
from bench.models.generator import Generator
from bench.models.var import VAR, VARConfig, attn_l2_norm_in, sizes_in
from bench.models.vqvae import VQVAE, VQVAEConfig
from bench.registry import MODELS

VAR_SOURCE = "https://huggingface.co/FoundationVision/var/resolve/main/"


@dataclass(frozen=True)
class ModelCard:
    name: str
    var_cfg: VARConfig
    vae_cfg: VQVAEConfig
    var_file: str
    vae_file: str
    source: str = VAR_SOURCE
    world: str = "paper"
    sampling: dict = field(default_factory=lambda: dict(defaults.SAMPLING))
    default_dir: Optional[Path] = None     # where the files are when no --ckpt-dir is given (tiny world)

    @property
    def image_size(self) -> int:
        return self.vae_cfg.patch_nums[-1] * 2 ** (len(self.vae_cfg.ch_mult) - 1)

    def build(self, var_cfg: Optional[VARConfig] = None, device="cpu") -> Generator:
        """Randomly initialised generator (``device='meta'`` builds it without memory, for accounting)."""
        with torch.device(device):
            return Generator(VAR(var_cfg or self.var_cfg), VQVAE(self.vae_cfg), name=self.name)

    def __call__(self, ckpt_dir=None, device="cpu") -> Generator:
        """The generator with its checkpoints loaded (strict)."""
        folder = ckpt_dir or self.default_dir
        src = (lambda f: self.source + f) if self.world == "paper" else (lambda f: self.source)
        vae_path = locate(self.vae_file, folder, src(self.vae_file))
        var_path = locate(self.var_file, folder, src(self.var_file))
        return load_generator(var_path, vae_path, self, device=device)


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


def _official(depth: int) -> ModelCard:
    return ModelCard(name=f"var-d{depth}", var_cfg=VARConfig.official(depth), vae_cfg=VQVAEConfig(),
                     var_file=f"var_d{depth}.pth", vae_file="vae_ch160v4096z32.pth")


for _d in (16, 20, 24, 30):
    MODELS.register(f"var-d{_d}", _official(_d))


def _tiny_var() -> ModelCard:
    from bench.tiny import configs
    from bench.tiny.assets import ASSETS
    return ModelCard(name="tiny-var", var_cfg=configs.TINY_VAR, vae_cfg=configs.TINY_VAE,
                     var_file="tiny_var.safetensors", vae_file="tiny_vqvae.safetensors",
                     source="`make tiny-models` (retrains the tiny world from scratch, recipe in bench/recipes/tiny.py)",
                     world="tiny", sampling=dict(configs.TINY_SAMPLING), default_dir=ASSETS)


MODELS.register("tiny-var", _tiny_var())

