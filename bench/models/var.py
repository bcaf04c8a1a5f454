"""The VAR transformer (FoundationVision/VAR ``models/var.py``, ``basic_var.py``), config-driven.

Module names and ``state_dict`` keys equal the official ``var_d{16,20,24,30}.pth`` so those files
load with ``strict=True``. Two generalisations keep the same keys but allow physically pruned models:
each block may have its own head count (``heads``) and FFN width (``ffn_hidden``). The VQVAE is not a
submodule (as official: it is not in ``var_d*.pth``); ``bench.models.generator`` pairs the two.

Shapes are named in variables: B batch, L tokens, C width, H heads, c head dim, V vocabulary.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench.models.configs import VARConfig  # noqa: F401  (re-exported: the config is torch-free)

# route(kind, block_idx, h_BLC, fn, x_BLC) -> out_BLC: the per-scale token-policy hook (bench/models/policy.py);
# x_BLC is the residual stream before the sub-layer (what token scores such as FastVAR's read).
Route = Optional[Callable[..., torch.Tensor]]   # (kind, block_idx, h_BLC, fn, x_BLC) -> out_BLC


class SelfAttention(nn.Module):
    def __init__(self, C: int, H: int, c: int, l2_norm: bool):
        super().__init__()
        self.H, self.c, self.l2_norm = H, c, l2_norm
        if l2_norm:
            # Cosine attention with a learned per-head temperature (init 4, clamped at 100): VAR's
            # "Attn. Norm." ablation; it stabilises fp16 training (VAR issue #38).
            self.scale = 1.0
            self.scale_mul_1H11 = nn.Parameter(torch.full((1, H, 1, 1), 4.0).log())
            self.max_scale_mul = math.log(100)
        else:
            self.scale = 0.25 / math.sqrt(c)
        self.mat_qkv = nn.Linear(C, 3 * H * c, bias=False)
        self.q_bias, self.v_bias = nn.Parameter(torch.zeros(H * c)), nn.Parameter(torch.zeros(H * c))
        self.register_buffer("zero_k_bias", torch.zeros(H * c))   # k has no bias (persistent: in the ckpt)
        self.proj = nn.Linear(H * c, C)
        self.kv_k = self.kv_v = None
        self.kv_len, self.caching = 0, False
        self.kv_full = 0                      # the most tokens a generation may cache (0: concatenate)
        self.kv_used: Optional[int] = None   # tokens the last in-place generation cached

    def kv_caching(self, enable: bool, max_len: int = 0) -> None:
        """Next-scale inference: keys and values of earlier scales are kept. With ``max_len`` the cache
        is one buffer filled in place (no re-concatenation at every scale), as long as the last
        generation cached (a token policy caches only the tokens it computed, so its memory saving is
        kept), at most ``max_len``; a generation that caches more grows it once, to ``max_len``."""
        if not enable and self.caching and self.kv_full:
            self.kv_used = self.kv_len   # what this generation cached: the next one's buffer length
        self.caching, self.kv_k, self.kv_v, self.kv_len = enable, None, None, 0
        self.kv_full = max_len if enable else 0

    def _cache(self, k_BHlc, v_BHlc):
        """Append this scale's keys/values; returns everything cached so far."""
        B, H, l, c = k_BHlc.shape
        if self.kv_full:
            end = self.kv_len + l
            if self.kv_k is None or self.kv_k.shape[0] != B:
                n = max(min(self.kv_full, self.kv_used or self.kv_full), end)   # the last generation's length
                self.kv_k = k_BHlc.new_empty(B, H, n, c)
                self.kv_v = v_BHlc.new_empty(B, H, n, c)
            elif end > self.kv_k.shape[2]:   # more than the last generation cached: grow once
                grown = max(self.kv_full, end)
                self.kv_k = torch.cat((self.kv_k[:, :, :self.kv_len], self.kv_k.new_empty(B, H, grown - self.kv_len, c)), 2)
                self.kv_v = torch.cat((self.kv_v[:, :, :self.kv_len], self.kv_v.new_empty(B, H, grown - self.kv_len, c)), 2)
            self.kv_k[:, :, self.kv_len:end] = k_BHlc
            self.kv_v[:, :, self.kv_len:end] = v_BHlc
            self.kv_len = end
            return self.kv_k[:, :, :end], self.kv_v[:, :, :end]
        if self.kv_k is not None:
            k_BHlc = torch.cat((self.kv_k, k_BHlc), dim=2)
            v_BHlc = torch.cat((self.kv_v, v_BHlc), dim=2)
        self.kv_k, self.kv_v = k_BHlc, v_BHlc
        return k_BHlc, v_BHlc

    def forward(self, x_BLC: torch.Tensor, attn_bias: Optional[torch.Tensor], rope=None) -> torch.Tensor:
        """``rope``: a callable applied to (q, k) after the cosine normalisation (Infinity's 2-D RoPE;
        VAR has none)."""
        B, L, _ = x_BLC.shape
        bias = torch.cat((self.q_bias, self.zero_k_bias, self.v_bias))
        qkv = F.linear(x_BLC, self.mat_qkv.weight, bias).view(B, L, 3, self.H, self.c)
        q_BHLc, k_BHLc, v_BHLc = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        if self.l2_norm:
            scale_mul = self.scale_mul_1H11.clamp_max(self.max_scale_mul).exp()
            q_BHLc = F.normalize(q_BHLc, dim=-1).mul(scale_mul)
            k_BHLc = F.normalize(k_BHLc, dim=-1)
        if rope is not None:
            q_BHLc, k_BHLc = rope(q_BHLc, k_BHLc)
        if self.caching:  # next-scale inference: queries of this scale see all earlier scales
            k_BHLc, v_BHLc = self._cache(k_BHLc, v_BHLc)
        mask = None if attn_bias is None else attn_bias.to(q_BHLc.dtype)
        o_BHLc = F.scaled_dot_product_attention(q_BHLc, k_BHLc, v_BHLc, attn_mask=mask, scale=self.scale)
        return self.proj(o_BHLc.transpose(1, 2).reshape(B, L, self.H * self.c))


class FFN(nn.Module):
    def __init__(self, C: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(C, hidden)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden, C)

    def forward(self, x_BLC):
        return self.fc2(self.act(self.fc1(x_BLC)))


class DropPath(nn.Module):
    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x_BLC):
        if not self.training or self.p == 0:
            return x_BLC
        keep_B11 = x_BLC.new_empty(x_BLC.shape[0], 1, 1).bernoulli_(1 - self.p).div_(1 - self.p)
        return x_BLC * keep_B11


class AdaLNSelfAttn(nn.Module):
    """x += γ1·Attn(LN(x)(1+s1)+b1); x += γ2·FFN(LN(x)(1+s2)+b2), (γ1,γ2,s1,s2,b1,b2) = AdaLN(cond)."""
    SUBLAYERS = ("attn", "ffn")   # the sub-layers a token policy routes (and the latency bench compiles)

    def __init__(self, cfg: VARConfig, block_idx: int, drop_path: float):
        super().__init__()
        C = cfg.width
        self.block_idx, self.C, self.shared_aln = block_idx, C, cfg.shared_aln
        self.attn = SelfAttention(C, cfg.block_heads(block_idx), cfg.hd, cfg.attn_l2_norm)
        self.ffn = FFN(C, cfg.block_ffn(block_idx))
        self.ln_wo_grad = nn.LayerNorm(C, eps=cfg.norm_eps, elementwise_affine=False)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        if cfg.shared_aln:
            self.ada_gss = nn.Parameter(torch.randn(1, 1, 6, C) / C ** 0.5)
        else:
            self.ada_lin = nn.Sequential(nn.SiLU(inplace=False), nn.Linear(C, 6 * C))

    def ada(self, cond_BD) -> torch.Tensor:
        """The six AdaLN vectors [B, 1, 6, C] of this block for a condition (shared: cond_BD is already
        the shared projection)."""
        if self.shared_aln:
            return self.ada_gss + cond_BD
        return self.ada_lin(cond_BD).view(-1, 1, 6, self.C)

    def forward(self, x_BLC, cond_BD, attn_bias, route: Route = None, ada_B16C=None):
        if ada_B16C is None:
            ada_B16C = self.ada(cond_BD)
        gamma1, gamma2, scale1, scale2, shift1, shift2 = ada_B16C.unbind(2)  # official chunk order
        # sub-layers as the token-policy hook calls them (keep_Bl: a subset's positions; VAR needs none:
        # its position embeddings were added at the input)
        attn = lambda h, keep_Bl=None: self.attn(h, attn_bias)  # noqa: E731
        ffn = lambda h, keep_Bl=None: self.ffn(h)  # noqa: E731
        h = self.ln_wo_grad(x_BLC).mul(scale1.add(1)).add_(shift1)
        h = attn(h) if route is None else route("attn", self.block_idx, h, attn, x_BLC)
        x_BLC = x_BLC + self.drop_path(h.mul(gamma1))
        h = self.ln_wo_grad(x_BLC).mul(scale2.add(1)).add_(shift2)
        h = self.ffn(h) if route is None else route("ffn", self.block_idx, h, ffn, x_BLC)
        return x_BLC + self.drop_path(h.mul(gamma2))


class AdaLNBeforeHead(nn.Module):
    def __init__(self, C: int, eps: float):
        super().__init__()
        self.C = C
        self.ln_wo_grad = nn.LayerNorm(C, eps=eps, elementwise_affine=False)
        self.ada_lin = nn.Sequential(nn.SiLU(inplace=False), nn.Linear(C, 2 * C))

    def ada(self, cond_BD) -> torch.Tensor:
        return self.ada_lin(cond_BD).view(-1, 1, 2, self.C)

    def forward(self, x_BLC, cond_BD, ada_B12C=None):
        scale, shift = (self.ada(cond_BD) if ada_B12C is None else ada_B12C).unbind(2)
        return self.ln_wo_grad(x_BLC).mul(scale.add(1)).add_(shift)


class SharedAdaLin(nn.Linear):
    def forward(self, cond_BD):
        return super().forward(cond_BD).view(-1, 1, 6, self.weight.shape[0] // 6)


class VAR(nn.Module):
    def __init__(self, cfg: VARConfig):
        super().__init__()
        self.cfg = cfg
        C, pns = cfg.width, tuple(cfg.patch_nums)
        self.C, self.V, self.Cvae, self.num_classes = C, cfg.vocab_size, cfg.Cvae, cfg.num_classes
        self.patch_nums, self.L, self.first_l = pns, cfg.L, pns[0] ** 2
        self.begin_ends = []
        cur = 0
        for pn in pns:
            self.begin_ends.append((cur, cur + pn * pn))
            cur += pn * pn

        init_std = math.sqrt(1 / C / 3)
        self.word_embed = nn.Linear(cfg.Cvae, C)
        self.class_emb = nn.Embedding(cfg.num_classes + 1, C)   # last row: the null class for CFG
        self.pos_start = nn.Parameter(torch.empty(1, self.first_l, C))
        self.pos_1LC = nn.Parameter(torch.empty(1, self.L, C))
        self.lvl_embed = nn.Embedding(len(pns), C)
        for t in (self.class_emb.weight, self.pos_start, self.pos_1LC, self.lvl_embed.weight):
            nn.init.trunc_normal_(t.data, mean=0, std=init_std)
        self.shared_ada_lin = nn.Sequential(nn.SiLU(inplace=False), SharedAdaLin(C, 6 * C)) if cfg.shared_aln else nn.Identity()
        dpr = [cfg.drop_path_rate * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]  # linear decay rule
        self.blocks = nn.ModuleList([AdaLNSelfAttn(cfg, i, dpr[i]) for i in range(cfg.depth)])

        # Block-causal mask (training only; inference uses the KV cache): token i sees token j iff
        # scale(j) ≤ scale(i). Both buffers are persistent: they are in the official checkpoints.
        d_1L1 = torch.cat([torch.full((pn * pn,), i) for i, pn in enumerate(pns)]).view(1, self.L, 1)
        dT_11L = d_1L1.transpose(1, 2)
        self.register_buffer("lvl_1L", dT_11L[:, 0].contiguous())
        self.register_buffer("attn_bias_for_masking",
                             torch.where(d_1L1 >= dT_11L, 0.0, -torch.inf).reshape(1, 1, self.L, self.L).contiguous())
        self.head_nm = AdaLNBeforeHead(C, cfg.norm_eps)
        self.head = nn.Linear(C, cfg.vocab_size)

    # --------------------------------------------------------------- pieces shared by both passes
    def cond(self, label_B: torch.Tensor) -> torch.Tensor:
        return self.class_emb(label_B)

    def run_blocks(self, x_BLC, cond_BD, attn_bias=None, route: Route = None, ada=None):
        """All blocks. ``ada``: the AdaLN vectors of ``ada_vectors(cond_BD)``, computed once per
        generation (the condition does not change across scales; official recomputes them per scale)."""
        if ada is None:
            cond = self.shared_ada_lin(cond_BD)
            ada = [b.ada(cond) for b in self.blocks]
        for b, ada_B16C in zip(self.blocks, ada):
            x_BLC = b(x_BLC, cond_BD, attn_bias, route, ada_B16C)
        return x_BLC

    def ada_vectors(self, cond_BD):
        """(per-block AdaLN vectors, head AdaLN vectors) of a condition: what ``run_blocks`` and
        ``get_logits`` would compute from it, for reuse at every scale of a generation."""
        cond = self.shared_ada_lin(cond_BD)
        return [b.ada(cond) for b in self.blocks], self.head_nm.ada(cond_BD.float())

    def get_logits(self, x_BLC, cond_BD, head_ada=None) -> torch.Tensor:
        return self.head(self.head_nm(x_BLC.float(), cond_BD, head_ada).float()).float()

    def lvl_pos(self) -> torch.Tensor:
        return self.lvl_embed(self.lvl_1L) + self.pos_1LC   # 1, L, C

    def first_tokens(self, cond_BD) -> torch.Tensor:
        """Scale-0 input: the class embedding as start token + its position/level embeddings."""
        B = cond_BD.shape[0]
        return cond_BD.unsqueeze(1).expand(B, self.first_l, -1) + self.pos_start.expand(B, -1, -1) \
            + self.lvl_pos()[:, :self.first_l]

    def kv_caching(self, enable: bool, max_len: int = 0) -> None:
        for b in self.blocks:
            b.attn.kv_caching(enable, max_len)

    # --------------------------------------------------------------- teacher forcing (training, calibration)
    def forward(self, label_B: torch.Tensor, x_BLCv_wo_first_l: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits [B, L, V] for all scales at once under the block-causal mask.

        As official, the label is replaced by the null class with probability ``cond_drop_rate`` —
        but only in training mode (official drops also in eval; calibration needs determinism)."""
        B = label_B.shape[0]
        if self.training and self.cfg.cond_drop_rate > 0:
            drop_B = torch.rand(B, device=label_B.device) < self.cfg.cond_drop_rate
            label_B = torch.where(drop_B, self.num_classes, label_B)
        cond_BD = self.cond(label_B)
        sos_B1C = cond_BD.unsqueeze(1).expand(B, self.first_l, -1) + self.pos_start.expand(B, -1, -1)
        x_BLC = torch.cat((sos_B1C, self.word_embed(x_BLCv_wo_first_l.float())), dim=1)
        x_BLC = x_BLC + self.lvl_pos()
        x_BLC = self.run_blocks(x_BLC, cond_BD, self.attn_bias_for_masking)
        return self.get_logits(x_BLC, cond_BD)


def attn_l2_norm_in(state_dict) -> bool:
    """Official checkpoints differ in whether they use cosine attention; detect it (var-arch §1.6)."""
    return any(k.endswith("attn.scale_mul_1H11") for k in state_dict)


def sizes_in(state_dict, cfg: VARConfig) -> VARConfig:
    """Per-block head counts and FFN widths as stored (physically pruned checkpoints)."""
    heads, ffn = [], []
    for i in range(cfg.depth):
        heads.append(state_dict[f"blocks.{i}.attn.q_bias"].shape[0] // cfg.hd)
        ffn.append(state_dict[f"blocks.{i}.ffn.fc1.weight"].shape[0])
    dense_h, dense_f = [cfg.num_heads] * cfg.depth, [round(cfg.width * cfg.mlp_ratio)] * cfg.depth
    return cfg.replace(heads=None if heads == dense_h else tuple(heads), ffn_hidden=None if ffn == dense_f else tuple(ffn))
