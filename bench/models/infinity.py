"""The Infinity transformer (FoundationVision/Infinity ``infinity/models/infinity.py``, ``basic.py``),
config-driven: ``infinity-2b`` and the tiny world's ``tiny-t2i`` are the same class.

Module names and ``state_dict`` keys equal the official ``infinity_2b_reg.pth`` (``block_chunks.{c}.
module.{j}.{sa,ca,ffn,ca_norm,ada_gss}``, ``shared_ada_lin.1``, ``text_norm``, ``text_proj_for_sos.ca``,
``text_proj_for_ca.{0,2}``, ``cfg_uncond``, ``lvl_embed``, ``pos_start``, ``word_embed``, ``head_nm``,
``head``) so it loads with ``strict=True``; the official ``load_state_dict`` is lenient and drops
buffers the file may carry (``lvl_1L``, ``attn_bias_for_masking``, …): :func:`adapt_state_dict` does
the same before the strict check.

Every block (Infinity paper §3.2):  x += γ1·SA(LN(x)(1+s1)+b1);  x += CA(LN_affine(x), text);
x += γ2·FFN(LN(x)(1+s2)+b2), the six AdaLN vectors = ``ada_gss`` + one shared projection of the pooled
text. Self-attention is cosine attention (as VAR) with 2-D RoPE on every layer; cross-attention reads
the projected Flan-T5 features (padded tokens masked; official packs them with flash-attn varlen).
The first token is the attention-pooled text + ``pos_start``; the level embedding is added once,
before the first block. The head predicts 2 logits per bit of the d-bit BSQ code of each token.

Shapes in names: B batch, L image tokens, T text tokens, C width, H heads, c head dim, d bits.
"""
from __future__ import annotations

import math
from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench.models.configs import InfinityConfig  # noqa: F401  (re-exported: the config is torch-free)
from bench.models.var import FFN, AdaLNBeforeHead, DropPath, SelfAttention, SharedAdaLin

Route = Optional[Callable[..., torch.Tensor]]   # (kind, block_idx, h_BLC, fn, x_BLC) -> out_BLC


# ---------------------------------------------------------------- 2-D RoPE
def rope2d_table(hd: int, schedule: Sequence[Tuple[int, int]], grid: Tuple[int, int],
                 theta: float = 10000.0) -> torch.Tensor:
    """cos/sin [2, L, hd/2] for the tokens of ``schedule`` (official ``precompute_rope2d_freqs_grid``,
    ``rope2d_normalized_by_hw=2``): scale (h, w)'s token (i, j) sits at (round(i·H/h), round(j·W/w)) on
    the ``grid`` = (H, W) of the final scale; the first hd/4 rotation pairs turn with the row, the
    other hd/4 with the column, inverse frequencies θ^(−2k/(hd/2))."""
    half = hd // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, half, 2, dtype=torch.int64).float() / half))
    H, W = grid
    rows, cols = [], []
    for h, w in schedule:
        r = (torch.arange(h) * (H / h)).reshape(h, 1).expand(h, w).round().int()
        c = (torch.arange(w) * (W / w)).reshape(1, w).expand(h, w).round().int()
        rows.append(r.reshape(-1))
        cols.append(c.reshape(-1))
    r, c = torch.cat(rows).float(), torch.cat(cols).float()
    angles_Lh = torch.cat((torch.outer(r, inv_freq), torch.outer(c, inv_freq)), dim=-1)
    return torch.stack((angles_Lh.cos(), angles_Lh.sin()))


def apply_rope(q_BHLc: torch.Tensor, k_BHLc: torch.Tensor, cs_2Lh: torch.Tensor):
    """Rotate interleaved pairs (x_{2k}, x_{2k+1}) of q and k by the table's angles (official order of
    operations, fp32)."""
    cos, sin = cs_2Lh[0], cs_2Lh[1]

    def rot(x):
        x2 = x.float().reshape(*x.shape[:-1], -1, 2)
        x0, x1 = x2[..., 0], x2[..., 1]
        return torch.stack((cos * x0 - sin * x1, sin * x0 + cos * x1), dim=-1).reshape(x.shape)

    return rot(q_BHLc), rot(k_BHLc)


class Rope:
    """``rope(q, k)`` with a scale's cos/sin table [2, L, hd/2]; ``rope.at(keep_Bl)`` is the same rotation
    for a subset of the scale's tokens, per batch row (token methods: kept tokens keep their true
    positions, as FastVAR's ``apply_rotary_emb_fastvar``)."""

    def __init__(self, cs_2Lh: torch.Tensor):
        self.cs = cs_2Lh

    def __call__(self, q_BHLc, k_BHLc):
        return apply_rope(q_BHLc, k_BHLc, self.cs)

    def at(self, keep_Bl: torch.Tensor) -> "Rope":
        return Rope(self.cs[:, keep_Bl].unsqueeze(2))   # [2, B, 1, l, hd/2]: broadcast over heads


# ---------------------------------------------------------------- text side
class RMSNorm(nn.Module):
    """``FastRMSNorm`` (affine): x·rsqrt(mean(x²)+eps)·w in fp32."""

    def __init__(self, C: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        xf = x.float()
        return ((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True).add_(self.eps))) * self.weight).to(x.dtype)


def packed(fn: Callable[[torch.Tensor], torch.Tensor], x_BTC: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """A per-token function applied to the valid tokens only, packed as official (``kv_compact``): the
    same GEMM shapes, hence the same fp32 rounding; padded positions come back as zeros. (On the meta
    device, for accounting, every position counts as valid.)"""
    if x_BTC.is_meta:
        return fn(x_BTC)
    out = fn(x_BTC[mask_BT])
    return out.new_zeros(*mask_BT.shape, out.shape[-1]).masked_scatter_(mask_BT.unsqueeze(-1), out)


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


class CrossAttention(nn.Module):
    """Queries from the image (or one learned query per head: the text attention pool), keys/values
    from the text; plain softmax attention, scale 1/√c (official: never cosine here)."""

    def __init__(self, C: int, kv_dim: int, H: int, for_attn_pool: bool = False, bf16: bool = False):
        super().__init__()
        self.H, self.c, self.bf16 = H, C // H, bf16
        if for_attn_pool:
            self.mat_q = nn.Parameter(torch.empty(1, H, self.c))
            nn.init.trunc_normal_(self.mat_q, std=math.sqrt(1 / C / 3))
        else:
            self.mat_q = nn.Linear(C, C, bias=True)
        self.mat_kv = nn.Linear(kv_dim, 2 * C, bias=False)
        self.v_bias = nn.Parameter(torch.zeros(C))
        self.register_buffer("zero_k_bias", torch.zeros(C))
        self.proj = nn.Linear(C, C)
        self.cache_text, self._kv = False, None

    def text_kv(self, kv_BTC: torch.Tensor, mask_BT: torch.Tensor):
        """Keys and values of the text. While sampling (``cache_text``) they are computed once per
        generation: the text is the same at every scale (official recomputes them; same values)."""
        if self.cache_text and self._kv is not None and self._kv[0] is kv_BTC:
            return self._kv[1]
        B, T, _ = kv_BTC.shape
        kv = packed(lambda x: F.linear(x, self.mat_kv.weight, torch.cat((self.zero_k_bias, self.v_bias))), kv_BTC, mask_BT)
        k_BHTc, v_BHTc = kv.view(B, T, 2, self.H, self.c).permute(2, 0, 3, 1, 4).unbind(0)
        if self.bf16:
            k_BHTc, v_BHTc = _bf16(k_BHTc), _bf16(v_BHTc)
        if self.cache_text:
            self._kv = (kv_BTC, (k_BHTc, v_BHTc))
        return k_BHTc, v_BHTc

    def forward(self, q_BLC: Optional[torch.Tensor], kv_BTC: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
        B = kv_BTC.shape[0]
        k_BHTc, v_BHTc = self.text_kv(kv_BTC, mask_BT)
        if isinstance(self.mat_q, nn.Parameter):   # attention pool: one query
            q_BHLc = self.mat_q.expand(B, -1, -1).unsqueeze(2)
        else:
            q_BHLc = self.mat_q(q_BLC).view(B, q_BLC.shape[1], self.H, self.c).transpose(1, 2)
        if self.bf16:   # official: flash-attn on bf16 copies of q, k, v (k, v above), bf16 output
            q_BHLc = _bf16(q_BHLc)
        o = F.scaled_dot_product_attention(q_BHLc, k_BHTc, v_BHTc, attn_mask=mask_BT[:, None, None, :],
                                           scale=1 / math.sqrt(self.c))
        if self.bf16:
            o = _bf16(o)
        return self.proj(o.transpose(1, 2).reshape(B, o.shape[2], self.H * self.c))


class TextAttentivePool(nn.Module):
    def __init__(self, cfg: InfinityConfig):
        super().__init__()
        if cfg.text_channels % (64 if cfg.width > 4096 else 128):
            raise ValueError(f"text_channels {cfg.text_channels} must be a multiple of the pool's head dim "
                             f"({64 if cfg.width > 4096 else 128}, official rule)")
        self.ca = CrossAttention(cfg.width, cfg.text_channels, cfg.pool_heads, for_attn_pool=True, bf16=cfg.ca_bf16)

    def forward(self, kv_BTC, mask_BT):
        return self.ca(None, kv_BTC, mask_BT).squeeze(1)


# ---------------------------------------------------------------- blocks
class CrossAttnBlock(nn.Module):
    SUBLAYERS = ("sa", "ca", "ffn")   # the sub-layers a token policy routes (and the latency bench compiles)

    def __init__(self, cfg: InfinityConfig, block_idx: int, drop_path: float):
        super().__init__()
        C = cfg.width
        self.block_idx, self.C = block_idx, C
        self.sa = SelfAttention(C, cfg.num_heads, cfg.hd, l2_norm=True)
        self.ca = CrossAttention(C, C, cfg.num_heads, bf16=cfg.ca_bf16)
        self.ffn = FFN(C, cfg.ffn_hidden)
        self.ln_wo_grad = nn.LayerNorm(C, eps=cfg.norm_eps, elementwise_affine=False)
        self.ca_norm = nn.LayerNorm(C, eps=cfg.norm_eps, elementwise_affine=True)
        self.ada_gss = nn.Parameter(torch.randn(1, 1, 6, C) / C ** 0.5)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x_BLC, gss_B16C, text, attn_bias=None, rope=None, route: Route = None):
        gamma1, gamma2, scale1, scale2, shift1, shift2 = (self.ada_gss + gss_B16C).unbind(2)
        kv_BTC, mask_BT = text
        # sub-layers as the token-policy hook calls them: on a subset, keep_Bl gives its positions
        sa = lambda h, keep_Bl=None: self.sa(h, attn_bias, rope if keep_Bl is None or rope is None else rope.at(keep_Bl))  # noqa: E731
        ca = lambda h, keep_Bl=None: self.ca(h, kv_BTC, mask_BT)  # noqa: E731
        ffn = lambda h, keep_Bl=None: self.ffn(h)  # noqa: E731
        h = self.ln_wo_grad(x_BLC.float()).mul(scale1.add(1)).add_(shift1)
        h = sa(h) if route is None else route("attn", self.block_idx, h, sa, x_BLC)
        x_BLC = x_BLC + self.drop_path(h.mul(gamma1))
        h = self.ca_norm(x_BLC)
        x_BLC = x_BLC + (ca(h) if route is None else route("ca", self.block_idx, h, ca, x_BLC)).float()
        h = self.ln_wo_grad(x_BLC.float()).mul(scale2.add(1)).add_(shift2)
        h = self.ffn(h) if route is None else route("ffn", self.block_idx, h, ffn, x_BLC)
        return x_BLC + self.drop_path(h.mul(gamma2))


class MultipleLayers(nn.Module):
    """One of the official ``block_chunks`` (keys ``block_chunks.{c}.module.{j}``)."""

    def __init__(self, blocks: Sequence[nn.Module]):
        super().__init__()
        self.module = nn.ModuleList(blocks)


# ---------------------------------------------------------------- the model
class Infinity(nn.Module):
    def __init__(self, cfg: InfinityConfig):
        super().__init__()
        self.cfg = cfg
        C, Ct5 = cfg.width, cfg.text_channels
        self.C, self.d, self.V = C, cfg.codebook_dim, 2 * cfg.codebook_dim
        init_std = math.sqrt(1 / C / 3)
        # the learned null prompt (official init: trunc-normal std 1.2 / √Ct5, seed 0)
        cfg_uncond = torch.empty(cfg.text_maxlen, Ct5)
        if not cfg_uncond.is_meta:
            nn.init.trunc_normal_(cfg_uncond, std=1.2, generator=torch.Generator(cfg_uncond.device).manual_seed(0))
        self.cfg_uncond = nn.Parameter(cfg_uncond / Ct5 ** 0.5)
        self.text_norm = RMSNorm(Ct5, cfg.norm_eps)
        self.text_proj_for_sos = TextAttentivePool(cfg)
        self.text_proj_for_ca = nn.Sequential(nn.Linear(Ct5, C), nn.GELU(approximate="tanh"), nn.Linear(C, C))
        self.pos_start = nn.Parameter(torch.empty(1, 1, C))
        self.lvl_embed = nn.Embedding(cfg.lvl_embed_size, C)
        for t in (self.pos_start, self.lvl_embed.weight):
            nn.init.trunc_normal_(t.data, mean=0, std=init_std)
        self.word_embed = nn.Linear(cfg.codebook_dim, C)
        self.shared_ada_lin = nn.Sequential(nn.SiLU(inplace=False), SharedAdaLin(C, 6 * C))
        dpr = [cfg.drop_path_rate * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]   # linear, as official
        blocks = [CrossAttnBlock(cfg, i, dpr[i]) for i in range(cfg.depth)]
        if cfg.depth % cfg.block_chunks:
            raise ValueError(f"depth {cfg.depth} is not a multiple of block_chunks {cfg.block_chunks}")
        if cfg.block_chunks == 1:
            self.blocks = nn.ModuleList(blocks)
        else:
            n = cfg.depth // cfg.block_chunks
            self.block_chunks = nn.ModuleList(MultipleLayers(blocks[i:i + n]) for i in range(0, cfg.depth, n))
        self.head_nm = AdaLNBeforeHead(C, cfg.norm_eps)
        self.head = nn.Linear(C, self.V)

    @property
    def block_list(self) -> List[CrossAttnBlock]:
        if self.cfg.block_chunks == 1:
            return list(self.blocks)
        return [b for chunk in self.block_chunks for b in chunk.module]

    # --------------------------------------------------------------- shared by both passes
    def encode_text(self, feats_BTC: torch.Tensor, mask_BT: torch.Tensor):
        """(pooled condition [B, C], cross-attention text (kv [B, T, C], mask [B, T])) from the text
        encoder's features; padded positions (mask False) are never attended."""
        kv = packed(self.text_norm, feats_BTC.float(), mask_BT)
        cond_BD = self.text_proj_for_sos(kv, mask_BT).float()
        return cond_BD, (packed(self.text_proj_for_ca, kv, mask_BT), mask_BT)

    def null_text(self, mask_BT: torch.Tensor) -> torch.Tensor:
        """The unconditional branch's features: ``cfg_uncond[:len]`` per prompt (same lengths/mask)."""
        T = mask_BT.shape[1]
        if T > self.cfg.text_maxlen:
            raise ValueError(f"text length {T} exceeds the null prompt's {self.cfg.text_maxlen} rows")
        return self.cfg_uncond[:T].unsqueeze(0).expand(mask_BT.shape[0], -1, -1)

    def ada_gss(self, cond_BD):
        return self.shared_ada_lin(cond_BD.float())

    def rope_fn(self, cs_2Lh: torch.Tensor) -> "Rope":
        return Rope(cs_2Lh)

    def run_blocks(self, x_BLC, gss, text, attn_bias=None, rope=None, route: Route = None):
        for b in self.block_list:
            x_BLC = b(x_BLC, gss, text, attn_bias, rope, route)
        return x_BLC

    def get_logits(self, x_BLC, cond_BD) -> torch.Tensor:
        return self.head(self.head_nm(x_BLC.float(), cond_BD.float()))

    def kv_caching(self, enable: bool, max_len: int = 0, text: bool = True) -> None:
        """Self-attention KV cache (``max_len``: one preallocated buffer) and, with ``text``, the
        cross-attention's text keys/values computed once per generation."""
        for b in self.block_list:
            b.sa.kv_caching(enable, max_len)
            b.ca.cache_text, b.ca._kv = enable and text, None

    # --------------------------------------------------------------- teacher forcing
    def forward(self, feats_BTC: torch.Tensor, mask_BT: torch.Tensor, x_BLd_wo_first: torch.Tensor,
                schedule: Optional[Sequence[Tuple[int, int]]] = None, rope_grid: Optional[Tuple[int, int]] = None):
        """Teacher-forced logits [B, L, 2d] under the block-causal mask. In training mode a prompt is
        replaced by the null prompt with probability ``cond_drop_rate`` (official, for CFG)."""
        schedule = tuple(schedule or self.cfg.scale_schedule)
        B = x_BLd_wo_first.shape[0]
        if self.training and self.cfg.cond_drop_rate > 0:
            drop_B11 = (torch.rand(B, 1, 1, device=feats_BTC.device) < self.cfg.cond_drop_rate)
            feats_BTC = torch.where(drop_B11, self.null_text(mask_BT), feats_BTC)
        cond_BD, text = self.encode_text(feats_BTC, mask_BT)
        gss = self.ada_gss(cond_BD)
        sos_B1C = cond_BD.unsqueeze(1) + self.pos_start.expand(B, 1, -1)
        x_BLC = torch.cat((sos_B1C, self.word_embed(x_BLd_wo_first.float())), dim=1)
        lvl_L = torch.cat([torch.full((h * w,), i, device=x_BLC.device) for i, (h, w) in enumerate(schedule)])
        x_BLC = x_BLC + self.lvl_embed(lvl_L)
        L = lvl_L.shape[0]
        attn_bias = torch.where(lvl_L[:, None] >= lvl_L[None, :], 0.0, -torch.inf).view(1, 1, L, L)
        cs = rope2d_table(self.cfg.hd, schedule, tuple(rope_grid or self.cfg.rope_grid), self.cfg.rope_theta)
        x_BLC = self.run_blocks(x_BLC, gss, text, attn_bias.to(x_BLC), self.rope_fn(cs.to(x_BLC.device)))
        return self.get_logits(x_BLC, cond_BD)


def adapt_state_dict(state_dict) -> dict:
    """As the official lenient ``load_state_dict``: drop the mask/level buffers some files carry."""
    drop = ("lvl_1L", "attn_bias_for_masking", "Infinity_visible_kvlen", "Infinity_invisible_qlen")
    return {k: v for k, v in state_dict.items() if k not in drop}
