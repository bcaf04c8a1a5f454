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
from typing import Dict, Optional, Tuple

from bench import defaults
from bench.checkpoint import check_manifest, ckpt_dir, locate_all, sha256
from bench.models.configs import BSQConfig, InfinityConfig, TextConfig, VARConfig, VQVAEConfig
from bench.registry import MODELS

VAR_SOURCE = "https://huggingface.co/FoundationVision/var/resolve/main/"
TINY_SOURCE = ("`varbench train-tiny` (`make tiny-models` in a checkout; retrains the tiny world from scratch; "
               "recipe in bench/recipes/tiny.py)")


def tiny_put(folder, one: bool = False, ckpt_flag: bool = True) -> str:
    """Where missing tiny-world files go (``one``: a single file): the tiny folder is ``--ckpt-dir``
    (``ckpt_flag``: where the command takes it), else ``$VARBENCH_TINY_DIR``, else the files shipped with
    varbench (``$VARBENCH_CKPT_DIR`` is the paper world's)."""
    import os
    it = "it" if one else "them"
    flags = "--ckpt-dir or VARBENCH_TINY_DIR" if ckpt_flag else "VARBENCH_TINY_DIR"
    if os.environ.get("VARBENCH_TINY_DIR"):
        rest = f"or unset VARBENCH_TINY_DIR to use the one{'' if one else 's'} shipped with varbench"
    else:
        rest = f"or reinstall varbench (the package ships {it} in assets/tiny)"
    return f"Put {it} in {folder}, point {flags} at the folder that has {it}, {rest}."


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

    @property
    def scales_hw(self) -> Tuple[Tuple[int, int], ...]:
        """(h, w) of each scale's token map, coarse to fine (without building the model)."""
        return tuple((pn, pn) for pn in self.var_cfg.patch_nums)

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
        folder = self.folder(ckpt_dir_)
        return locate_all([(f, src(f)) for f in (self.vae_file, self.var_file)], folder,
                          tiny_put(folder) if self.world == "tiny" else None)

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


# ---------------------------------------------------------------- text-to-image (Infinity class)
INFINITY_SOURCE = "https://huggingface.co/FoundationVision/Infinity/resolve/main/"
T5_FOLDER = "flan-t5-xl"
TINY_T2I_SOURCE = ("`python -m bench.recipes.tiny_t2i` (`make tiny-t2i` in a checkout; retrains tiny-t2i from "
                   "scratch; recipe in bench/recipes/tiny_t2i.py)")


@dataclass(frozen=True)
class T2ICard:
    """A text-to-image Infinity-class model: transformer + BSQ VAE files and a text encoder (a folder
    with Flan-T5-XL in the paper world, a shipped file in the tiny world)."""
    name: str
    inf_cfg: InfinityConfig
    vae_cfg: BSQConfig
    inf_file: str
    vae_file: str
    text_file: str                        # a folder (paper: Flan-T5-XL) or a file (tiny)
    source: str = INFINITY_SOURCE
    world: str = "paper"
    sampling: dict = field(default_factory=dict)
    vae_source_name: Optional[str] = None   # the file's name at the source, when it differs
    text_cfg: Optional[TextConfig] = None

    kind = "t2i"

    @property
    def image_size(self) -> int:
        return self.inf_cfg.image_size[0]

    @property
    def scales_hw(self) -> Tuple[Tuple[int, int], ...]:
        return tuple((h, w) for h, w in self.inf_cfg.scale_schedule)

    def folder(self, ckpt_dir_: Optional[str | os.PathLike] = None) -> Path:
        return ModelCard.folder(self, ckpt_dir_)

    def files(self, ckpt_dir_: Optional[str | os.PathLike] = None) -> Dict[str, Path]:
        """``{name: path}`` of the VAE and transformer weights (the text encoder is checked on load)."""
        if self.world == "tiny":
            pairs = [(f, self.source) for f in (self.vae_file, self.inf_file, self.text_file)]
        else:
            vae_src = self.source + (self.vae_source_name or self.vae_file)
            if self.vae_source_name:
                vae_src += f" (saved as {self.vae_file})"
            pairs = [(self.vae_file, vae_src), (self.inf_file, self.source + self.inf_file)]
        folder = self.folder(ckpt_dir_)
        return locate_all(pairs, folder, tiny_put(folder) if self.world == "tiny" else None)

    def identity(self, ckpt_dir_: Optional[str | os.PathLike] = None) -> Dict[str, str]:
        check = check_manifest if self.world == "tiny" else sha256
        return {name: check(path) for name, path in self.files(ckpt_dir_).items()}

    def build(self, device="cpu", text: bool = True):
        """Randomly initialised generator (``device='meta'``: no memory, for accounting)."""
        from bench.models.zoo import build_t2i
        return build_t2i(self, device, text)

    def __call__(self, ckpt_dir=None, device="cpu"):
        from bench.models.zoo import load_t2i
        return load_t2i(self, ckpt_dir, device)


def _infinity_2b() -> T2ICard:

    return T2ICard(name="infinity-2b", inf_cfg=InfinityConfig.infinity_2b(), vae_cfg=BSQConfig(),
                   inf_file="infinity_2b_reg.pth", vae_file="infinity_vae_d32_reg.pth",
                   vae_source_name="infinity_vae_d32reg.pth", text_file=T5_FOLDER,
                   sampling=dict(defaults.INFINITY_SAMPLING))


def _tiny_t2i() -> T2ICard:
    from bench.tiny import configs
    return T2ICard(name="tiny-t2i", inf_cfg=configs.TINY_T2I, vae_cfg=configs.TINY_BSQ, inf_file="tiny_t2i.safetensors",
                   vae_file="tiny_bsq.safetensors", text_file="tiny_t2i_text.safetensors", text_cfg=configs.TINY_TEXT,
                   source=TINY_T2I_SOURCE, world="tiny", sampling=dict(defaults.TINY_T2I_SAMPLING))


MODELS.register("infinity-2b", _infinity_2b())
MODELS.register("tiny-t2i", _tiny_t2i())


# ---------------------------------------------------------------- HART (hybrid tokenizer + residual diffusion)
@dataclass(frozen=True)
class HARTCard:
    """HART-0.7B: an official checkpoint folder (``llm/`` + ``tokenizer/``, each with ``config.json``),
    its architecture read from those files, and the Qwen2 text model in ``<ckpt dir>/<text_model>``.
    Without the folder, a documented best-guess config serves weight-free accounting only
    (``bench.models.hart_config.HARTConfig.hart_0_7b``)."""
    name: str
    folder_name: str = "hart-0.7b-1024px"
    text_model: str = "Qwen2-VL-1.5B-Instruct"
    world: str = "paper"
    sampling: dict = field(default_factory=lambda: dict(defaults.HART_SAMPLING))

    kind = "hart"

    def folder(self, ckpt_dir_: Optional[str | os.PathLike] = None) -> Path:
        return ckpt_dir(ckpt_dir_) / self.folder_name

    def config(self, ckpt_dir_: Optional[str | os.PathLike] = None):
        """The checkpoint folder's config when it is there, else the documented guess."""
        from bench.models.hart_config import HARTConfig
        folder = self.folder(ckpt_dir_)
        return HARTConfig.from_pretrained_dir(folder) if (folder / "llm" / "config.json").is_file() else HARTConfig.hart_0_7b()

    @property
    def image_size(self) -> int:
        from bench.models.hart_config import HARTConfig
        return HARTConfig.hart_0_7b().image_size

    @property
    def scales_hw(self) -> Tuple[Tuple[int, int], ...]:
        """HART-0.7B's scales (its released config's patch_nums, as the documented guess has them)."""
        from bench.models.hart_config import HARTConfig
        return tuple((pn, pn) for pn in HARTConfig.hart_0_7b().patch_nums)

    def files(self, ckpt_dir_: Optional[str | os.PathLike] = None) -> Dict[str, Path]:
        """``{"llm/<weights>": path, "tokenizer/<weights>": path}`` (the text model is checked on load)."""
        from bench.models.hart_config import checkpoint_files
        return checkpoint_files(self.folder(ckpt_dir_))

    def identity(self, ckpt_dir_: Optional[str | os.PathLike] = None) -> Dict[str, str]:
        return {name: sha256(path) for name, path in self.files(ckpt_dir_).items()}

    def build(self, device="cpu", cfg=None):
        """The generator with random weights and no text model (``device='meta'``: accounting)."""
        import torch

        from bench.models.hart import HART
        from bench.models.hart_t2i import HARTGenerator
        from bench.models.hart_vae import HARTTokenizer
        cfg = cfg or self.config()
        with torch.device(device):
            return HARTGenerator(HART(cfg, HARTTokenizer(cfg.tokenizer)), name=self.name)

    def __call__(self, ckpt_dir=None, device="cpu"):
        """The generator of the checkpoint folder, with its Qwen2 text model (both strictly required)."""
        from bench.models.hart import load_hart
        from bench.models.hart_t2i import HARTGenerator
        self.files(ckpt_dir)                        # every missing HART file listed before anything loads,
        text = self.text_encoder(ckpt_dir, device)  # then its folder and transformers, before HART loads
        return HARTGenerator(load_hart(self.folder(ckpt_dir), device=device), text, name=self.name)

    def text_encoder(self, ckpt_dir_=None, device="cpu"):
        """HART's Qwen2 prompt encoder from ``<ckpt dir>/<text_model>`` (``transformers``, optional extra):
        ``feats, mask = enc.encode(prompts)``."""
        from bench.models.text import QwenTextEncoder
        return QwenTextEncoder(ckpt_dir(ckpt_dir_) / self.text_model, device=device)


MODELS.register("hart-0.7b", HARTCard(name="hart-0.7b"))
