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
