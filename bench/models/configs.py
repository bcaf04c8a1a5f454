"""Model configs as plain data (no torch): model cards, records and the renderer read them without
importing the model code. ``bench.models.var`` and ``bench.models.vqvae`` build modules from them."""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Optional, Tuple


@dataclass(frozen=True)
class VARConfig:
    depth: int = 16
    width: int = 1024                       # C; official: 64·depth
    num_heads: int = 16                     # official: depth (head dim 64)
    mlp_ratio: float = 4.0
    num_classes: int = 1000
    vocab_size: int = 4096                  # V (from the VQVAE)
    Cvae: int = 32
    patch_nums: Tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8, 10, 13, 16)
    attn_l2_norm: bool = True
    shared_aln: bool = False
    norm_eps: float = 1e-6
    cond_drop_rate: float = 0.1
    drop_path_rate: float = 0.0             # official: 0.1·depth/24 when training
    # Per-block sizes of physically pruned models; None = the dense sizes above.
    heads: Optional[Tuple[int, ...]] = None
    ffn_hidden: Optional[Tuple[int, ...]] = None
    head_dim: Optional[int] = None          # default width // num_heads

    @classmethod
    def official(cls, depth: int, **kw) -> "VARConfig":
        return cls(depth=depth, width=64 * depth, num_heads=depth, **kw)

    def block_heads(self, i: int) -> int:
        return self.heads[i] if self.heads is not None else self.num_heads

    def block_ffn(self, i: int) -> int:
        return self.ffn_hidden[i] if self.ffn_hidden is not None else round(self.width * self.mlp_ratio)

    @property
    def hd(self) -> int:
        return self.head_dim or self.width // self.num_heads

    @property
    def L(self) -> int:
        return sum(pn * pn for pn in self.patch_nums)

    def replace(self, **kw) -> "VARConfig":
        return replace(self, **kw)

    def to_dict(self) -> dict:
        return asdict(self)



@dataclass(frozen=True)
class VQVAEConfig:
    vocab_size: int = 4096
    z_channels: int = 32          # Cvae
    ch: int = 160
    ch_mult: Tuple[int, ...] = (1, 1, 2, 2, 4)
    num_res_blocks: int = 2
    using_sa: bool = True
    using_mid_sa: bool = True
    dropout: float = 0.0
    beta: float = 0.25            # commitment weight
    quant_conv_ks: int = 3
    quant_resi: float = 0.5       # φ(x) = (1-0.5)·x + 0.5·conv3x3(x)
    share_quant_resi: int = 4     # 0: one φ per scale, 1: one φ for all, n>1: n partially shared φ
    patch_nums: Tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8, 10, 13, 16)

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- Infinity (text-to-image, bitwise)
# Scale schedules of FoundationVision/Infinity (``infinity/utils/dynamic_resolution.py``): per aspect
# ratio h/w, the (h, w) token grid of each of the 13 scales of the '1M' (1024²-class) schedule; the
# '0.06M', '0.25M' and '0.60M' schedules are its first 7, 10 and 12 scales. The VAE stride is 16.
INFINITY_RATIO_HWS = {
    1.000: ((1, 1), (2, 2), (4, 4), (6, 6), (8, 8), (12, 12), (16, 16), (20, 20), (24, 24), (32, 32), (40, 40), (48, 48), (64, 64)),
    1.250: ((1, 1), (2, 2), (3, 3), (5, 4), (10, 8), (15, 12), (20, 16), (25, 20), (30, 24), (35, 28), (45, 36), (55, 44), (70, 56)),
    1.333: ((1, 1), (2, 2), (4, 3), (8, 6), (12, 9), (16, 12), (20, 15), (24, 18), (28, 21), (36, 27), (48, 36), (60, 45), (72, 54)),
    1.500: ((1, 1), (2, 2), (3, 2), (6, 4), (9, 6), (15, 10), (21, 14), (27, 18), (33, 22), (39, 26), (48, 32), (63, 42), (78, 52)),
    1.750: ((1, 1), (2, 2), (3, 3), (7, 4), (11, 6), (14, 8), (21, 12), (28, 16), (35, 20), (42, 24), (56, 32), (70, 40), (84, 48)),
    2.000: ((1, 1), (2, 2), (4, 2), (6, 3), (10, 5), (16, 8), (22, 11), (30, 15), (38, 19), (46, 23), (60, 30), (74, 37), (90, 45)),
    2.500: ((1, 1), (2, 2), (5, 2), (10, 4), (15, 6), (20, 8), (25, 10), (30, 12), (40, 16), (50, 20), (65, 26), (80, 32), (100, 40)),
    3.000: ((1, 1), (2, 2), (6, 2), (9, 3), (15, 5), (21, 7), (27, 9), (36, 12), (45, 15), (54, 18), (72, 24), (90, 30), (111, 37)),
}
# inverse ratios (w > h) transpose the grids; official key int(1/ratio·1000)/1000
for _r, _hws in list(INFINITY_RATIO_HWS.items()):
    if _r != 1.0:
        INFINITY_RATIO_HWS[int(1 / _r * 1000) / 1000] = tuple((w, h) for h, w in _hws)
INFINITY_PIXELS = {"0.06M": 7, "0.25M": 10, "0.60M": 12, "1M": 13}   # scales per resolution class


def infinity_schedule(h_div_w: float = 1.0, pn: str = "1M") -> Tuple[Tuple[int, int], ...]:
    """The (h, w) scale schedule for an aspect ratio (nearest official template, as ``argmin |h/w − t|``)
    and a resolution class."""
    if pn not in INFINITY_PIXELS:
        raise ValueError(f"unknown resolution class {pn!r}; one of {', '.join(INFINITY_PIXELS)}")
    if not h_div_w > 0:
        raise ValueError(f"h_div_w must be > 0, got {h_div_w}")
    template = min(INFINITY_RATIO_HWS, key=lambda t: abs(t - h_div_w))
    return INFINITY_RATIO_HWS[template][:INFINITY_PIXELS[pn]]


@dataclass(frozen=True)
class BSQConfig:
    """Infinity's BSQ tokenizer (``bsq_vae/flux_vqgan.py`` AutoEncoder, ``multiscale_bsq.py``)."""
    codebook_dim: int = 32            # d: bits per token (``vae_type=32``), codes ±1/√d
    base_ch: int = 128
    ch_mult: Tuple[int, ...] = (1, 2, 4, 4, 4)   # encoder and decoder
    num_res_blocks: int = 2
    patch_size: int = 16              # spatial stride: log2(patch_size) down/up-samplings

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class InfinityConfig:
    """The Infinity transformer (``infinity/models/infinity.py``) with the flags ``load_infinity`` fixes:
    shared AdaLN, cosine self-attention, 2-D RoPE in every self-attention normalised to the final grid,
    level embedding added once, bit labels (2 logits per bit)."""
    depth: int = 32
    width: int = 2048                 # C (= D, the condition width)
    num_heads: int = 16
    mlp_ratio: float = 4.0            # FFN hidden = round(C·ratio/256)·256 (official rounding)
    text_channels: int = 2048         # Ct5 (Flan-T5-XL)
    text_maxlen: int = 512            # rows of the learned null prompt ``cfg_uncond``
    codebook_dim: int = 32            # d_vae; logits per token = 2·d
    block_chunks: int = 8             # state_dict layout ``block_chunks.{c}.module.{j}`` (1: ``blocks.{i}``)
    # the default image's schedule, and the grid RoPE positions are normalised to (official: the '1M'
    # schedule's last scale of the aspect ratio, so a 256² image's 16×16 scale sits at 0, 4, …, 60)
    scale_schedule: Tuple[Tuple[int, int], ...] = INFINITY_RATIO_HWS[1.0]
    rope_grid: Tuple[int, int] = (64, 64)
    rope_theta: float = 10000.0
    lvl_embed_size: int = 15
    norm_eps: float = 1e-6
    cond_drop_rate: float = 0.1
    drop_path_rate: float = 0.0       # official 2B: 0.1 when training
    # Official cross-attention casts q and kv to bf16 for flash-attn even in an fp32 model (on the golden
    # test model, fp32 cross-attention moves the logits by up to 9.3e-3); True reproduces that rounding,
    # False keeps the cross-attention in fp32.
    ca_bf16: bool = True
    vae_stride: int = 16

    @classmethod
    def infinity_2b(cls, **kw) -> "InfinityConfig":
        return cls(depth=32, width=2048, num_heads=16, **kw)

    @property
    def hd(self) -> int:
        return self.width // self.num_heads

    @property
    def ffn_hidden(self) -> int:
        return round(self.width * self.mlp_ratio / 256) * 256

    @property
    def pool_heads(self) -> int:
        """Heads of the text attention pool (``TextAttentivePool``): Ct5 // (64 if C > 4096 else 128)."""
        return self.text_channels // (64 if self.width > 4096 else 128)

    @property
    def L(self) -> int:
        return sum(h * w for h, w in self.scale_schedule)

    @property
    def image_size(self) -> Tuple[int, int]:
        h, w = self.scale_schedule[-1]
        return h * self.vae_stride, w * self.vae_stride

    def replace(self, **kw) -> "InfinityConfig":
        return replace(self, **kw)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TextConfig:
    """The tiny world's text encoder: word vocabulary (index 0 = padding) + a small transformer."""
    vocab: Tuple[str, ...] = ("<pad>",)
    max_len: int = 8
    width: int = 128
    depth: int = 2
    heads: int = 4
    out_channels: int = 128          # = the transformer's text_channels
    conv_kernel: int = 0             # > 0: a 1-D convolution over neighbouring words before the transformer

    def to_dict(self) -> dict:
        return asdict(self)
