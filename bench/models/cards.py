"""Registered models: a torch-free :class:`ModelCard` per name says what the model is, which files hold
its weights and how it samples by default. Building and loading (torch) is in ``bench.models.zoo``.

Paper world: the official FoundationVision/VAR checkpoints (``var_d{16,20,24,30}.pth`` with the
shared ``vae_ch160v4096z32.pth``), 256×256, patch_nums 1…16, read from ``--ckpt-dir`` /
``$VARBENCH_CKPT_DIR``; a missing file is an error naming its official source. Tiny world:
``tiny-var``, shipped in ``assets/tiny/`` and checked against its manifest's sha256.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional

from bench import defaults
from bench.checkpoint import check_manifest, ckpt_dir, locate_all, sha256
from bench.models.configs import VARConfig, VQVAEConfig
from bench.registry import MODELS

VAR_SOURCE = "https://huggingface.co/FoundationVision/var/resolve/main/"
TINY_SOURCE = "`make tiny-models` (retrains the tiny world from scratch; recipe in bench/recipes/tiny.py)"


@dataclass(frozen=True)
class ModelCard:
    name: str
    var_cfg: VARConfig
    vae_cfg: VQVAEConfig
    var_file: str
    vae_file: str
    source: str = VAR_SOURCE           # a URL prefix (paper world) or how to make the files (tiny world)
    world: str = "paper"
    sampling: dict = field(default_factory=lambda: dict(defaults.SAMPLING))

    @property
    def image_size(self) -> int:
        return self.vae_cfg.patch_nums[-1] * 2 ** (len(self.vae_cfg.ch_mult) - 1)

    def folder(self, ckpt_dir_: Optional[str | os.PathLike] = None) -> Path:
        """Where the files are: ``--ckpt-dir``, else (tiny) the shipped assets or (paper) the default folder."""
        if ckpt_dir_:
            return Path(ckpt_dir_)
        if self.world == "tiny":
            from bench.resources import tiny_assets_dir
            return tiny_assets_dir()
        return ckpt_dir(None)

    def files(self, ckpt_dir_: Optional[str | os.PathLike] = None) -> Dict[str, Path]:
        """``{filename: path}`` of the weights (VQVAE first); every missing file is listed in one error."""
        src = (lambda f: self.source + f) if self.world == "paper" else (lambda f: self.source)
        return locate_all([(f, src(f)) for f in (self.vae_file, self.var_file)], self.folder(ckpt_dir_))

    def identity(self, ckpt_dir_: Optional[str | os.PathLike] = None) -> Dict[str, str]:
        """``{filename: sha256}`` of the files that will be loaded: part of every record's key. Tiny-world
        files are checked against the manifest shipped beside them."""
        check = check_manifest if self.world == "tiny" else sha256
        return {name: check(path) for name, path in self.files(ckpt_dir_).items()}

    def build(self, var_cfg: Optional[VARConfig] = None, device="cpu"):
        """Randomly initialised generator (``device='meta'`` builds it without memory, for accounting)."""
        from bench.models.zoo import build
        return build(self, var_cfg, device)

    def __call__(self, ckpt_dir=None, device="cpu"):
        """The generator with its checkpoints loaded (strict)."""
        from bench.models.zoo import load
        return load(self, ckpt_dir, device)


def _official(depth: int) -> ModelCard:
    return ModelCard(name=f"var-d{depth}", var_cfg=VARConfig.official(depth), vae_cfg=VQVAEConfig(),
                     var_file=f"var_d{depth}.pth", vae_file="vae_ch160v4096z32.pth")


for _d in (16, 20, 24, 30):
    MODELS.register(f"var-d{_d}", _official(_d))


def _tiny_var() -> ModelCard:
    from bench.tiny import configs
    return ModelCard(name="tiny-var", var_cfg=configs.TINY_VAR, vae_cfg=configs.TINY_VAE,
                     var_file="tiny_var.safetensors", vae_file="tiny_vqvae.safetensors",
                     source=TINY_SOURCE, world="tiny", sampling=dict(defaults.TINY_SAMPLING))


MODELS.register("tiny-var", _tiny_var())
