"""VAR's multi-scale residual VQVAE (FoundationVision/VAR ``models/vqvae.py``, ``quant.py``,
``basic_vae.py``), config-driven so the tiny world uses the same class.

Module names and ``state_dict`` keys equal the official ``vae_ch160v4096z32.pth``: ``encoder.*``,
``decoder.*``, ``quant_conv``, ``post_quant_conv``, ``quantize.embedding``,
``quantize.ema_vocab_hit_SV`` (buffer), ``quantize.quant_resi.qresi_ls.{k}``.

Residual quantisation (VAR paper, Alg. 1/2): for each scale k the residual ``f_rest`` is
area-downsampled to ``pn_k × pn_k``, quantised to its nearest codebook entry, bicubic-upsampled back
to the full latent size, passed through φ_k and added to ``f_hat``.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from bench.models.configs import VQVAEConfig  # noqa: F401  (re-exported: the config is torch-free)


# ---------------------------------------------------------------- encoder / decoder (taming/LDM style)
def _norm(c: int) -> nn.GroupNorm:
    # Official: 32 groups (all its channel counts are multiples of 32, as are the tiny configs').
    # Other widths get the largest divisor ≤ 32 instead of failing.
    return nn.GroupNorm(num_groups=max(g for g in range(1, 33) if c % g == 0), num_channels=c, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, dropout: float):
        super().__init__()
        self.norm1 = _norm(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, 1, 1)
        self.norm2 = _norm(out_channels)
        self.dropout = nn.Dropout(dropout) if dropout > 1e-6 else nn.Identity()
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1)
        self.nin_shortcut = nn.Conv2d(in_channels, out_channels, 1) if in_channels != out_channels else nn.Identity()

    def forward(self, x):
        if torch.is_grad_enabled():   # training: out of place (the recipe the tiny VQVAE was trained with)
            h = self.conv1(F.silu(self.norm1(x)))
            h = self.conv2(self.dropout(F.silu(self.norm2(h))))
            return self.nin_shortcut(x) + h
        # Inference: in-place activations and residual add, the same values, fewer fresh 40 MB
        # intermediates at 256² (each one page-faulted in: 443 k → 330 k faults per var-d16 decode).
        h = self.conv1(F.silu(self.norm1(x), inplace=True))
        h = self.conv2(self.dropout(F.silu(self.norm2(h), inplace=True)))
        return h.add_(self.nin_shortcut(x))   # = shortcut(x) + h exactly (IEEE addition commutes)


class AttnBlock(nn.Module):
    """Single-head spatial self-attention; q, k, v from one 1×1 conv (``qkv``), unlike taming."""

    def __init__(self, c: int):
        super().__init__()
        self.norm = _norm(c)
        self.qkv = nn.Conv2d(c, 3 * c, 1)
        self.proj_out = nn.Conv2d(c, c, 1)

    def forward(self, x):
        B, C, H, W = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(B, 3, C, H * W).unbind(1)
        w_BLL = torch.bmm(q.transpose(1, 2), k).mul_(C ** -0.5).softmax(dim=2)
        h_BCL = torch.bmm(v, w_BLL.transpose(1, 2))
        return x + self.proj_out(h_BCL.view(B, C, H, W))


class Downsample2x(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, 2, 0)

    def forward(self, x):
        return self.conv(F.pad(x, (0, 1, 0, 1)))  # asymmetric pad, as official


class Upsample2x(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, 1, 1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2, mode="nearest"))


def _level(blocks: List[nn.Module], attn: List[nn.Module]) -> nn.Module:
    m = nn.Module()
    m.block, m.attn = nn.ModuleList(blocks), nn.ModuleList(attn)
    return m


def _mid(c: int, dropout: float, using_mid_sa: bool) -> nn.Module:
    m = nn.Module()
    m.block_1 = ResnetBlock(c, c, dropout)
    m.attn_1 = AttnBlock(c) if using_mid_sa else nn.Identity()
    m.block_2 = ResnetBlock(c, c, dropout)
    return m


class Encoder(nn.Module):
    def __init__(self, cfg: VQVAEConfig):
        super().__init__()
        ch, mult, n = cfg.ch, cfg.ch_mult, len(cfg.ch_mult)
        self.conv_in = nn.Conv2d(3, ch, 3, 1, 1)
        self.down = nn.ModuleList()
        c_in = ch
        for lvl in range(n):
            c_out = ch * mult[lvl]
            blocks, attn = [], []
            for _ in range(cfg.num_res_blocks):
                blocks.append(ResnetBlock(c_in, c_out, cfg.dropout))
                c_in = c_out
                if lvl == n - 1 and cfg.using_sa:
                    attn.append(AttnBlock(c_in))
            level = _level(blocks, attn)
            if lvl != n - 1:
                level.downsample = Downsample2x(c_in)
            self.down.append(level)
        self.mid = _mid(c_in, cfg.dropout, cfg.using_mid_sa)
        self.norm_out = _norm(c_in)
        self.conv_out = nn.Conv2d(c_in, cfg.z_channels, 3, 1, 1)

    def forward(self, x):
        h = self.conv_in(x)
        for level in self.down:
            for i, block in enumerate(level.block):
                h = block(h)
                if len(level.attn):
                    h = level.attn[i](h)
            if hasattr(level, "downsample"):
                h = level.downsample(h)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
        return self.conv_out(F.silu(self.norm_out(h), inplace=not torch.is_grad_enabled()))


class Decoder(nn.Module):
    def __init__(self, cfg: VQVAEConfig):
        super().__init__()
        ch, mult, n = cfg.ch, cfg.ch_mult, len(cfg.ch_mult)
        c_in = ch * mult[-1]
        self.conv_in = nn.Conv2d(cfg.z_channels, c_in, 3, 1, 1)
        self.mid = _mid(c_in, cfg.dropout, cfg.using_mid_sa)
        levels = []
        for lvl in reversed(range(n)):
            c_out = ch * mult[lvl]
            blocks, attn = [], []
            for _ in range(cfg.num_res_blocks + 1):
                blocks.append(ResnetBlock(c_in, c_out, cfg.dropout))
                c_in = c_out
                if lvl == n - 1 and cfg.using_sa:
                    attn.append(AttnBlock(c_in))
            level = _level(blocks, attn)
            if lvl != 0:
                level.upsample = Upsample2x(c_in)
            levels.insert(0, level)  # stored in level order (official `self.up.insert(0, up)`)
        self.up = nn.ModuleList(levels)
        self.norm_out = _norm(c_in)
        self.conv_out = nn.Conv2d(c_in, 3, 3, 1, 1)

    def forward(self, z):
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(self.conv_in(z))))
        for level in reversed(self.up):
            for i, block in enumerate(level.block):
                h = block(h)
                if len(level.attn):
                    h = level.attn[i](h)
            if hasattr(level, "upsample"):
                h = level.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h), inplace=not torch.is_grad_enabled()))


# ---------------------------------------------------------------- φ and the residual quantiser
class Phi(nn.Conv2d):
    """φ(h) = (1 − r)·h + r·conv3x3(h), r = 0.5 (VAR §3.2: the residual refinement after upsampling)."""

    def __init__(self, c: int, ratio: float):
        super().__init__(c, c, kernel_size=3, stride=1, padding=1)
        self.resi_ratio = abs(ratio)

    def forward(self, h_BChw):
        return h_BChw.mul(1 - self.resi_ratio) + super().forward(h_BChw).mul_(self.resi_ratio)


# Which of the 4 partially shared φ each of the 10 scales uses in the official 256px model. Scales 2
# and 7 are exact ties of |tick − si/9| broken by float64 rounding in numpy, so the map is pinned here
# rather than recomputed (a float32 or symbolic argmin flips them); official VAR's numpy float64 result.
PHI_INDEX_4_OF_10 = (0, 0, 1, 1, 1, 2, 2, 3, 3, 3)


def phi_index_map(n_phi: int, n_scales: int) -> Tuple[int, ...]:
    """Scale index → φ index, as the official ``PhiPartiallyShared``/``PhiNonShared`` pick them."""
    if (n_phi, n_scales) == (4, 10):
        return PHI_INDEX_4_OF_10
    K = n_phi
    ticks = np.linspace(1 / 3 / K, 1 - 1 / 3 / K, K) if K == 4 else np.linspace(1 / 2 / K, 1 - 1 / 2 / K, K)
    return tuple(int(np.argmin(np.abs(ticks - si / (n_scales - 1)))) for si in range(n_scales))


class _PhiList(nn.Module):
    """Holds the φ convs under the official key layout and maps a scale index to its φ."""

    def __init__(self, c: int, ratio: float, share: int, n_scales: int):
        super().__init__()
        n_phi = n_scales if share == 0 else share
        self.index = (0,) * n_scales if share == 1 else phi_index_map(n_phi, n_scales)
        phis = [Phi(c, ratio) if abs(ratio) > 1e-6 else nn.Identity() for _ in range(n_phi if share != 1 else 1)]
        if share == 1:
            self.qresi = phis[0]                    # key: quant_resi.qresi.*
        elif share == 0:                            # official PhiNonShared is itself a ModuleList
            for k, phi in enumerate(phis):
                self.add_module(str(k), phi)        # key: quant_resi.{k}.*
        else:
            self.qresi_ls = nn.ModuleList(phis)     # key: quant_resi.qresi_ls.{k}.*
        self._share = share

    def __getitem__(self, si: int) -> nn.Module:
        if self._share == 1:
            return self.qresi
        if self._share == 0:
            return self._modules[str(self.index[si])]
        return self.qresi_ls[self.index[si]]


class MultiScaleQuantizer(nn.Module):
    """Official ``VectorQuantizer2`` (attribute ``quantize`` of the VQVAE)."""

    def __init__(self, cfg: VQVAEConfig):
        super().__init__()
        self.vocab_size, self.Cvae, self.beta = cfg.vocab_size, cfg.z_channels, cfg.beta
        self.patch_nums = tuple(cfg.patch_nums)
        self.quant_resi = _PhiList(cfg.z_channels, cfg.quant_resi, cfg.share_quant_resi, len(cfg.patch_nums))
        self.register_buffer("ema_vocab_hit_SV", torch.zeros(len(cfg.patch_nums), cfg.vocab_size))
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.z_channels)

    def _nearest(self, z_NC: torch.Tensor) -> torch.Tensor:
        E_VC = self.embedding.weight.detach()
        d_NV = z_NC.square().sum(1, keepdim=True) + E_VC.square().sum(1) - 2 * z_NC @ E_VC.T
        return d_NV.argmin(dim=1)

    def _up(self, h_BChw: torch.Tensor, si: int, HW: int) -> torch.Tensor:
        """Embedding map of scale si → full latent size (bicubic, except at the last scale) → φ."""
        if si != len(self.patch_nums) - 1:
            h_BChw = F.interpolate(h_BChw, size=(HW, HW), mode="bicubic")
        return self.quant_resi[si](h_BChw)

    def f_to_idx(self, f_BChw: torch.Tensor, to_fhat: bool = False) -> List[torch.Tensor]:
        """Residual quantisation of a latent into the token pyramid [B, pn²] (or the f_hat after each scale)."""
        B, C, H, W = f_BChw.shape
        assert self.patch_nums[-1] == H == W, f"latent {H}x{W} does not match the last scale {self.patch_nums[-1]}"
        f_rest, f_hat, out = f_BChw.detach().clone(), torch.zeros_like(f_BChw), []
        for si, pn in enumerate(self.patch_nums):
            z_BChw = F.interpolate(f_rest, size=(pn, pn), mode="area") if si != len(self.patch_nums) - 1 else f_rest
            idx_N = self._nearest(z_BChw.permute(0, 2, 3, 1).reshape(-1, C))
            h_BChw = self._up(self.embedding(idx_N.view(B, pn, pn)).permute(0, 3, 1, 2), si, H)
            f_hat.add_(h_BChw)
            f_rest.sub_(h_BChw)
            out.append(f_hat.clone() if to_fhat else idx_N.view(B, pn * pn))
        return out

    def idx_to_fhat(self, idx_Bl_list: Sequence[torch.Tensor]) -> torch.Tensor:
        B, HW = idx_Bl_list[0].shape[0], self.patch_nums[-1]
        f_hat = self.embedding.weight.new_zeros(B, self.Cvae, HW, HW)
        for si, (idx_Bl, pn) in enumerate(zip(idx_Bl_list, self.patch_nums)):
            f_hat = f_hat + self._up(self.embedding(idx_Bl).transpose(1, 2).reshape(B, self.Cvae, pn, pn), si, HW)
        return f_hat

    def idx_to_var_input(self, idx_Bl_list: Sequence[torch.Tensor]) -> torch.Tensor:
        """Teacher-forcing input (official ``idxBl_to_var_input``): after each scale but the last,
        the accumulated f_hat area-downsampled to the *next* scale, flattened → [B, L − 1, Cvae]."""
        B, HW = idx_Bl_list[0].shape[0], self.patch_nums[-1]
        f_hat = self.embedding.weight.new_zeros(B, self.Cvae, HW, HW)
        nxt = []
        for si in range(len(self.patch_nums) - 1):
            pn = self.patch_nums[si]
            f_hat = f_hat + self._up(self.embedding(idx_Bl_list[si]).transpose(1, 2).reshape(B, self.Cvae, pn, pn), si, HW)
            pn_next = self.patch_nums[si + 1]
            nxt.append(F.interpolate(f_hat, size=(pn_next, pn_next), mode="area").flatten(2).transpose(1, 2))
        return torch.cat(nxt, dim=1)

    def add_scale(self, si: int, f_hat: torch.Tensor, h_BChw: torch.Tensor) -> torch.Tensor:
        """f_hat += φ_si(up(h)) in place (the inference step without the next scale's input)."""
        return f_hat.add_(self._up(h_BChw, si, self.patch_nums[-1]))

    def next_input(self, si: int, f_hat: torch.Tensor, h_BChw: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Inference step (official ``get_next_autoregressive_input``): add scale si to f_hat (in
        place) and return (f_hat, f_hat area-downsampled to the next scale)."""
        self.add_scale(si, f_hat, h_BChw)
        if si == len(self.patch_nums) - 1:
            return f_hat, f_hat
        pn = self.patch_nums[si + 1]
        return f_hat, F.interpolate(f_hat, size=(pn, pn), mode="area")

    def forward(self, f_BChw: torch.Tensor):
        """Training pass: straight-through f_hat, VQ + commitment loss averaged over scales, codebook hits."""
        f = f_BChw.float()
        B, C, H, W = f.shape
        f_no_grad = f.detach()
        f_rest, f_hat = f_no_grad.clone(), torch.zeros_like(f)
        loss, hits_V = f.new_zeros(()), torch.zeros(self.vocab_size, device=f.device)
        for si, pn in enumerate(self.patch_nums):
            z = F.interpolate(f_rest, size=(pn, pn), mode="area") if si != len(self.patch_nums) - 1 else f_rest
            idx_N = self._nearest(z.permute(0, 2, 3, 1).reshape(-1, C))
            hits_V += idx_N.bincount(minlength=self.vocab_size).float()
            h = self._up(self.embedding(idx_N.view(B, pn, pn)).permute(0, 3, 1, 2), si, H)
            f_hat = f_hat + h
            f_rest = f_rest - h.detach()
            loss = loss + F.mse_loss(f_hat.detach(), f).mul(self.beta) + F.mse_loss(f_hat, f_no_grad)
        loss = loss / len(self.patch_nums)
        f_hat_st = (f_hat.detach() - f_no_grad) + f  # straight-through estimator
        return f_hat_st, loss, hits_V


# ---------------------------------------------------------------- the VQVAE
class VQVAE(nn.Module):
    def __init__(self, cfg: VQVAEConfig | None = None):
        super().__init__()
        self.cfg = cfg = cfg or VQVAEConfig()
        self.V, self.Cvae = cfg.vocab_size, cfg.z_channels
        self.downsample = 2 ** (len(cfg.ch_mult) - 1)
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.quantize = MultiScaleQuantizer(cfg)
        ks = cfg.quant_conv_ks
        self.quant_conv = nn.Conv2d(self.Cvae, self.Cvae, ks, 1, ks // 2)
        self.post_quant_conv = nn.Conv2d(self.Cvae, self.Cvae, ks, 1, ks // 2)

    @property
    def patch_nums(self) -> Tuple[int, ...]:
        return self.quantize.patch_nums

    def forward(self, img_B3HW: torch.Tensor):
        """Training: image in [-1, 1] → (reconstruction, VQ loss, codebook hits)."""
        f_hat, vq_loss, hits = self.quantize(self.quant_conv(self.encoder(img_B3HW)))
        return self.decoder(self.post_quant_conv(f_hat)), vq_loss, hits

    def fhat_to_img(self, f_hat: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.post_quant_conv(f_hat)).clamp_(-1, 1)

    def img_to_idx(self, img_B3HW: torch.Tensor) -> List[torch.Tensor]:
        """Image in [-1, 1] → token pyramid, a list of [B, pn²] int64 (coarse to fine)."""
        return self.quantize.f_to_idx(self.quant_conv(self.encoder(img_B3HW)))

    def idx_to_img(self, idx_Bl_list: Sequence[torch.Tensor]) -> torch.Tensor:
        return self.fhat_to_img(self.quantize.idx_to_fhat(idx_Bl_list))

    def reconstruct(self, img_B3HW: torch.Tensor) -> torch.Tensor:
        return self.fhat_to_img(self.quantize.f_to_idx(self.quant_conv(self.encoder(img_B3HW)), to_fhat=True)[-1])

    def adapt_state_dict(self, state_dict) -> dict:
        """As official ``VQVAE.load_state_dict``: the codebook-usage statistics buffer depends on the
        scale count, so a file made for another schedule keeps ours (zeros) instead of failing."""
        sd = dict(state_dict)
        hit, ours = sd.get("quantize.ema_vocab_hit_SV"), self.quantize.ema_vocab_hit_SV
        if hit is not None and hit.shape != ours.shape:
            sd["quantize.ema_vocab_hit_SV"] = torch.zeros(ours.shape, dtype=ours.dtype)
        return sd

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return super().load_state_dict(self.adapt_state_dict(state_dict), strict=strict, assign=assign)
