"""HART (mit-han-lab/hart, text-to-image) configs as plain data — no torch, so cards, records and the
renderer can read them without importing the model code. ``bench.models.hart`` (transformer and
residual diffusion head) and ``bench.models.hart_vae`` (hybrid tokenizer) build modules from them.

Field names are the official Hugging Face config names (``HARTForT2IConfig`` in
``hart/modules/models/transformer/configuration.py``, ``HARTAutoEncoderConfig`` in
``hart/modules/models/autoencoder/configuration.py``), so a checkpoint's ``llm/config.json`` and
``tokenizer/config.json`` map onto them one to one (:meth:`HARTConfig.from_pretrained_dir`).

The real hart-0.7b-1024px config files were not available when this was written: :meth:`HARTConfig.hart_0_7b`
is a documented guess, good for weight-free accounting only. Loading real weights always goes through
``from_pretrained_dir``, which refuses a config file that lacks any flag listed in ``LLM_REQUIRED`` /
``TOKENIZER_REQUIRED`` (naming all of them at once) instead of silently falling back to a guess.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Dict, Tuple

# Scale schedule of the 1024px model (64×64 latent, 14 scales) as HART's paper and README describe it.
# UNVERIFIED against the real llm/config.json.
PATCH_NUMS_1024 = (1, 2, 3, 4, 5, 7, 9, 12, 16, 21, 27, 36, 48, 64)


class HARTConfigError(ValueError):
    """A config file that cannot describe a HART model varbench can build (missing or unsupported flags)."""


@dataclass(frozen=True)
class HARTTokenizerConfig:
    """The hybrid tokenizer (official ``HARTAutoEncoder`` with ``quantizer_type='var_hybrid'``).

    Defaults are the official ``HARTAutoEncoderConfig`` defaults except ``quantizer_type`` (the HART
    tokenizer is the hybrid one). ``v_patch_nums`` only sizes the codebook-usage buffer
    ``quantize.ema_vocab_hit_SV``; generation uses the transformer's ``patch_nums``."""
    vocab_size: int = 4096
    z_channels: int = 32                         # Cvae
    ch: int = 160
    ch_mult: Tuple[int, ...] = (1, 1, 2, 2, 4)   # 16× downsampling
    dropout: float = 0.0
    beta: float = 0.25
    using_znorm: bool = False
    quant_conv_ks: int = 3
    quant_resi: float = 0.5
    share_quant_resi: int = 4
    default_qresi_counts: int = 0
    v_patch_nums: Tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8, 10, 13, 16)
    quantizer_type: str = "var_hybrid"
    double_decoder: bool = False

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)

    def problems(self) -> list:
        """Flags varbench cannot honour (the official code has them, the released model does not need them)."""
        out = []
        if self.quantizer_type != "var_hybrid":
            out.append(f"quantizer_type={self.quantizer_type!r} (only the hybrid 'var_hybrid' tokenizer)")
        if self.using_znorm:
            out.append("using_znorm=True (cosine codebook lookup)")
        if self.share_quant_resi == 0 and self.default_qresi_counts not in (0, len(self.v_patch_nums)):
            out.append(f"default_qresi_counts={self.default_qresi_counts} with share_quant_resi=0")
        if self.ch % 32 or any((self.ch * m) % 32 for m in self.ch_mult):
            out.append(f"ch={self.ch}, ch_mult={self.ch_mult}: the official GroupNorm needs multiples of 32")
        return out

    def replace(self, **kw) -> "HARTTokenizerConfig":
        return replace(self, **kw)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class HARTConfig:
    """The HART transformer with its residual diffusion head (official ``HARTForT2I``).

    Defaults are :meth:`hart_0_7b`'s guess, not the official ``HARTForT2IConfig`` defaults (those
    describe a gpt2-style 16-block VAR, not the released model)."""
    context_token: int = 300          # max_token_length of the Qwen2 prompt; the whole prompt is scale 0
    context_dim: int = 1536           # Qwen2-VL-1.5B-Instruct hidden size
    depth: int = 24
    embed_dim: int = 1536             # C (= D, the condition width)
    num_heads: int = 24
    mlp_ratio: float = 4.0
    norm_eps: float = 1e-6
    shared_aln: bool = True
    disable_aln: bool = True          # with shared_aln: PixArt-style ``scale_shift_table`` per block
    attn_l2_norm: bool = False
    patch_nums: Tuple[int, ...] = PATCH_NUMS_1024
    mlp_type: str = "llama"
    attn_type: str = "llama"
    sep_aln_pooling_mode: str = "max"
    use_timestep_embed: bool = False
    use_cross_attn: bool = False
    use_context_norm: bool = False
    context_norm_scale: float = 1.0   # accepted and ignored, as official (the fused RMSNorm ignores it)
    diff_width: int = 1024
    diff_depth: int = 6
    num_sampling_steps: str = "8"
    sampler: str = "iddpm"
    tokenizer: HARTTokenizerConfig = field(default_factory=HARTTokenizerConfig)

    # ------------------------------------------------------------ presets
    @classmethod
    def hart_0_7b(cls) -> "HARTConfig":
        """Best guess for mit-han-lab/hart-0.7b-1024px — for weight-free accounting only.

        Known: text encoder Qwen2-VL-1.5B-Instruct (context_dim 1536), max_token_length 300
        (``sample.py``), residual diffusion MLP of width 1024 and depth 6 with 8 iDDPM steps
        (``HARTForT2IConfig`` defaults; the paper's 37M-parameter head), tokenizer = official
        ``HARTAutoEncoderConfig`` defaults (vocabulary 4096, Cvae 32, ch 160), 1024² images.
        Guessed: depth 24, embed_dim 1536, 24 heads, llama attention (2-D RoPE) and llama MLP,
        ``disable_aln=True`` + ``shared_aln=True`` (a [6, C] table per block instead of a 6C×C AdaLN
        linear), no context norm, patch_nums ``PATCH_NUMS_1024``. With these flags the transformer
        has 0.73 B parameters including the diffusion head, which matches the paper's 732M; the same
        width with per-block AdaLN linears would be 1.07 B."""
        return cls()

    @classmethod
    def small_for_tests(cls, **kw) -> "HARTConfig":
        """A few-hundred-thousand-parameter model with the official structure (tests, examples)."""
        tok = HARTTokenizerConfig(vocab_size=600, z_channels=8, ch=32, ch_mult=(1, 1),
                                  v_patch_nums=(1, 2, 3, 4, 5, 6, 7, 8))
        base = dict(context_token=6, context_dim=32, depth=2, embed_dim=64, num_heads=4,
                    patch_nums=(1, 2, 3, 4, 5, 6, 7, 8), diff_width=64, diff_depth=2, tokenizer=tok)
        return cls(**(base | kw))

    # ------------------------------------------------------------ derived sizes
    @property
    def hd(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def Cvae(self) -> int:
        return self.tokenizer.z_channels

    @property
    def L(self) -> int:
        """Image tokens of all scales (the 1×1 scale included)."""
        return sum(pn * pn for pn in self.patch_nums)

    @property
    def seq_len(self) -> int:
        """Transformer sequence in teacher forcing: the context replaces the 1×1 scale."""
        return self.context_token + self.L - 1

    @property
    def ffn_hidden(self) -> int:
        if self.mlp_type == "llama":   # official: 2/3 of the ratio, rounded up to a multiple of 256
            return int(self.embed_dim * self.mlp_ratio * 2 / 3 + 255) // 256 * 256
        return round(self.embed_dim * self.mlp_ratio)

    @property
    def image_size(self) -> int:
        return self.patch_nums[-1] * self.tokenizer.downsample

    def problems(self) -> list:
        """Flags the official code accepts but varbench does not implement (each with why)."""
        out = []
        if self.attn_type != "llama":
            out.append(f"attn_type={self.attn_type!r} (only 'llama': RoPE attention; 'gpt2' uses absolute positions)")
        if self.mlp_type not in ("llama", "gpt2"):
            out.append(f"mlp_type={self.mlp_type!r}")
        if self.use_cross_attn:
            out.append("use_cross_attn=True (the official cross-attention needs xformers)")
        if self.use_timestep_embed:
            out.append("use_timestep_embed=True (level embedding by a timestep MLP)")
        if self.sep_aln_pooling_mode not in ("max", "avg"):
            out.append(f"sep_aln_pooling_mode={self.sep_aln_pooling_mode!r}")
        if self.sampler != "iddpm":
            out.append(f"sampler={self.sampler!r} (only 'iddpm')")
        if self.embed_dim % self.num_heads or self.hd % 4:
            out.append(f"embed_dim={self.embed_dim}, num_heads={self.num_heads}: 2-D RoPE needs a head dim divisible by 4")
        if self.context_token < 1 or len(self.patch_nums) < 2:
            out.append("context_token >= 1 and at least two scales are needed")
        if tuple(self.patch_nums)[0] != 1:
            out.append(f"patch_nums={self.patch_nums}: the first scale must be 1×1 (it is the last context token)")
        return out + self.tokenizer.problems()

    def check(self) -> "HARTConfig":
        bad = self.problems()
        if bad:
            raise HARTConfigError("unsupported HART config:\n  " + "\n  ".join(bad))
        return self

    def replace(self, **kw) -> "HARTConfig":
        return replace(self, **kw)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "HARTConfig":
        """Inverse of :meth:`to_dict` (lists back to tuples)."""
        tup = lambda v: tuple(v) if isinstance(v, list) else v   # noqa: E731
        tok = HARTTokenizerConfig(**{k: tup(v) for k, v in d.get("tokenizer", {}).items()})
        return cls(**{k: tup(v) for k, v in d.items() if k != "tokenizer"}, tokenizer=tok)

    # ------------------------------------------------------------ official config files
    @classmethod
    def from_pretrained_dir(cls, path) -> "HARTConfig":
        """Config of an official checkpoint folder: ``<path>/llm/config.json`` and the tokenizer's
        ``config.json`` (``vae_path`` when the llm config names an existing folder, else
        ``<path>/tokenizer``, as official ``HARTForT2I``). ``path`` may also be the ``llm`` folder itself (the official
        ``--model_path``). One :class:`HARTConfigError` names every missing flag of both files."""
        path = Path(path)
        llm_dir = path / "llm" if (path / "llm" / "config.json").is_file() else path
        llm_file = llm_dir / "config.json"
        llm = _read_json(llm_file)
        # official: ``vae_path`` if set, else the ``tokenizer`` folder beside ``llm``; a vae_path that
        # does not exist here (e.g. a path from the training machine) falls back to the sibling folder
        vae_path = llm.get("vae_path")
        tok_dir = llm_dir.parent / "tokenizer"
        if vae_path and (Path(vae_path) / "config.json").is_file():
            tok_dir = Path(vae_path)
        tok_file = tok_dir / "config.json"
        tok = _read_json(tok_file)
        missing = [f"{llm_file}: missing {', '.join(k for k in LLM_REQUIRED if k not in llm)}"] \
            if any(k not in llm for k in LLM_REQUIRED) else []
        if any(k not in tok for k in TOKENIZER_REQUIRED):
            missing.append(f"{tok_file}: missing {', '.join(k for k in TOKENIZER_REQUIRED if k not in tok)}")
        if missing:
            raise HARTConfigError("HART config incomplete (varbench does not guess architecture flags):\n  "
                                  + "\n  ".join(missing))
        for file, d, want in ((llm_file, llm, ("hart_transformer_t2i",)),
                              (tok_file, tok, ("hart_autoencoder", "hart_autoencoder_with_disc"))):
            if "model_type" in d and d["model_type"] not in want:
                raise HARTConfigError(f"{file}: model_type {d['model_type']!r}, expected one of {want}")
        tcfg = HARTTokenizerConfig(**_pick(HARTTokenizerConfig, tok))
        return cls(**_pick(cls, llm), tokenizer=tcfg).check()


# Flags that must be in the files (they decide shapes or the computation). Flags missing from this
# list have official defaults that the official loader (Hugging Face) also fills in silently:
# use_context_norm (False), context_norm_scale (1.0); tokenizer dropout, beta, using_znorm (False),
# default_qresi_counts (0), double_decoder (False).
LLM_REQUIRED = ("context_token", "context_dim", "depth", "embed_dim", "num_heads", "mlp_ratio", "norm_eps",
                "shared_aln", "disable_aln", "attn_l2_norm", "patch_nums", "mlp_type", "attn_type",
                "sep_aln_pooling_mode", "use_timestep_embed", "use_cross_attn", "diff_width", "diff_depth",
                "num_sampling_steps", "sampler")
TOKENIZER_REQUIRED = ("vocab_size", "z_channels", "ch", "ch_mult", "quant_conv_ks", "quant_resi",
                      "share_quant_resi", "v_patch_nums", "quantizer_type")


def _read_json(file: Path) -> dict:
    if not file.is_file():
        raise FileNotFoundError(f"HART config {file} not found (expected an official checkpoint folder with "
                                f"llm/config.json and tokenizer/config.json)")
    return json.loads(file.read_text(encoding="utf-8"))


def _pick(cls, d: dict) -> dict:
    names = {f.name for f in fields(cls)} - {"tokenizer"}
    out = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in names}
    if "num_sampling_steps" in out:
        out["num_sampling_steps"] = str(out["num_sampling_steps"])
    return out


# ---------------------------------------------------------------- the official checkpoint folder's files
HART_SOURCE = "https://huggingface.co/mit-han-lab/hart-0.7b-1024px"
LLM_WEIGHTS = ("model.safetensors", "pytorch_model.bin")   # after ema_model.bin when use_ema
TOKENIZER_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def checkpoint_files(path, use_ema: bool = True) -> Dict[str, Path]:
    """``{"llm/<weights>": path, "tokenizer/<weights>": path}`` of an official checkpoint folder (or of
    its ``llm`` folder, the official ``--model_path``): the first weights file present in each, as
    :func:`load_hart` reads them. One :class:`~bench.checkpoint.CheckpointNotFound` lists everything
    missing (config files and weights) with where to get it."""
    from bench.checkpoint import not_found
    path = Path(path)
    root = path.parent if path.name == "llm" and not (path / "llm").is_dir() else path
    found, missing = {}, []
    for sub, names in (("llm", (("ema_model.bin",) if use_ema else ()) + LLM_WEIGHTS), ("tokenizer", TOKENIZER_WEIGHTS)):
        d = root / sub
        if not (d / "config.json").is_file():
            missing.append(f"{sub}/config.json: get it from {HART_SOURCE}")
        hit = next((d / n for n in names if (d / n).is_file()), None)
        if hit is None:
            missing.append(f"{sub}/ weights (one of {', '.join(names)}): get it from {HART_SOURCE}")
        else:
            found[f"{sub}/{hit.name}"] = hit
    if missing:
        raise not_found(root, missing, put=f"Put the folder (llm/, tokenizer/) at {root} (or point --ckpt-dir / "
                                            f"VARBENCH_CKPT_DIR at its parent).")
    return found
