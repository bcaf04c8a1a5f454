"""Infinity's bitwise tokenizer: a FLUX-style convolutional autoencoder with multi-scale binary
spherical quantisation (FoundationVision/Infinity ``infinity/models/bsq_vae/flux_vqgan.py``,
``multiscale_bsq.py``), config-driven so the tiny world uses the same class.

``state_dict`` keys equal the official ``AutoEncoder``'s (``encoder.*``, ``decoder.*`` with the
``Conv``/``Normalize`` wrappers' ``.conv`` / ``.norm`` levels, and the bit-weight buffer twice,
``quantizer.lfq.mask`` and ``quantize.lfq.mask``, as the official module aliases its quantiser). The released
file (``infinity_vae_d32reg.pth``) is a dict whose ``"vae"`` entry is read leniently by the official
``load_cnn``, which also accepts the bare FLUX layout (``X.weight`` for ``X.conv.weight``);
:meth:`BSQVAE.adapt_state_dict` accepts both layouts, then the load is strict.

BSQ (Infinity paper §3.1): at every scale the residual is area-downsampled, each position's d-vector
is L2-normalised and replaced by its sign pattern scaled to the unit sphere (codes ±1/√d: one bit per
channel, a 2^d implicit codebook), trilinearly upsampled back to the full latent grid and subtracted.
The transformer's input for scale k+1 is the running sum resized to scale k+1 with trilinear, in the
official trainer (``bitwise_self_correction.py``) as in the sampler; the quantiser's own
``var_inputs`` (area, ``MultiScaleBSQ.forward``) are reproduced by :meth:`BSQVAE.quantize` but unused
by training.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench.models.configs import BSQConfig  # noqa: F401  (re-exported: the config is torch-free)


def swish(x: torch.Tensor) -> torch.Tensor:
    """x·σ(x), written as official (``F.silu`` rounds differently in the last bit)."""
    return x * torch.sigmoid(x)


class Conv(nn.Module):
    """``Conv`` wrapper of the official code (keys ``<name>.conv.*``)."""

    def __init__(self, cin: int, cout: int, k: int, stride: int = 1, padding: int = 0):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride=stride, padding=padding)

    def forward(self, x):
        return self.conv(x)


class Normalize(nn.Module):
    """GroupNorm(32 groups, else 24 as official; eps 1e-6) behind a ``.norm`` level."""

    def __init__(self, c: int):
        super().__init__()
        groups = 32 if c % 32 == 0 else 24 if c % 24 == 0 else None
        if groups is None:
            raise ValueError(f"BSQ VAE channel count {c} is not a multiple of 32 or 24 (official GroupNorm rule)")
        self.norm = nn.GroupNorm(groups, c, eps=1e-6, affine=True)

    def forward(self, x):
        return self.norm(x)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.norm1, self.conv1 = Normalize(cin), Conv(cin, cout, 3, padding=1)
        self.norm2, self.conv2 = Normalize(cout), Conv(cout, cout, 3, padding=1)
        self.nin_shortcut = Conv(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x):
        h = self.conv1(swish(self.norm1(x)))
        h = self.conv2(swish(self.norm2(h)))
        return self.nin_shortcut(x) + h


class Downsample(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv = Conv(c, c, 3, stride=2)

    def forward(self, x):
        return self.conv(F.pad(x, (0, 1, 0, 1)))   # asymmetric pad (right/bottom), as official


class Upsample(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv = Conv(c, c, 3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2, mode="nearest"))


def _levels(cfg: BSQConfig) -> int:
    n = math.log2(cfg.patch_size)
    if n != int(n) or not 1 <= n < len(cfg.ch_mult) + 1:
        raise ValueError(f"patch_size {cfg.patch_size} must be 2^k with 1 ≤ k ≤ len(ch_mult)={len(cfg.ch_mult)}")
    return int(n)


class Encoder(nn.Module):
    def __init__(self, cfg: BSQConfig):
        super().__init__()
        ch, mult, n_down = cfg.base_ch, cfg.ch_mult, _levels(cfg)
        self.conv_in = Conv(3, ch, 3, padding=1)
        self.down = nn.ModuleList()
        cin = ch
        for i, m in enumerate(mult):
            level = nn.Module()
            level.block = nn.ModuleList()
            for _ in range(cfg.num_res_blocks):
                level.block.append(ResnetBlock(cin, ch * m))
                cin = ch * m
            if i < n_down:   # official: spatial_down iff i_level < log2(patch_size)
                level.downsample = Downsample(cin)
            self.down.append(level)
        self.mid = nn.Module()
        self.mid.block_1, self.mid.block_2 = ResnetBlock(cin, cin), ResnetBlock(cin, cin)
        self.norm_out = Normalize(cin)
        self.conv_out = Conv(cin, cfg.codebook_dim, 3, padding=1)

    def forward(self, x):
        h = self.conv_in(x)
        for level in self.down:
            for b in level.block:
                h = b(h)
            if hasattr(level, "downsample"):
                h = level.downsample(h)
        h = self.mid.block_2(self.mid.block_1(h))
        return self.conv_out(swish(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(self, cfg: BSQConfig):
        super().__init__()
        ch, mult, n_up = cfg.base_ch, cfg.ch_mult, _levels(cfg)
        cin = ch * mult[-1]
        self.conv_in = Conv(cfg.codebook_dim, cin, 3, padding=1)
        self.mid = nn.Module()
        self.mid.block_1, self.mid.block_2 = ResnetBlock(cin, cin), ResnetBlock(cin, cin)
        levels = []
        for i in reversed(range(len(mult))):
            level = nn.Module()
            level.block = nn.ModuleList()
            for _ in range(cfg.num_res_blocks + 1):
                level.block.append(ResnetBlock(cin, ch * mult[i]))
                cin = ch * mult[i]
            if 1 <= i <= n_up:   # official: spatial_up iff 1 ≤ i_level ≤ log2(patch_size)
                level.upsample = Upsample(cin)
            levels.insert(0, level)   # stored in level order (official ``self.up.insert(0, up)``)
        self.up = nn.ModuleList(levels)
        self.norm_out = Normalize(cin)
        self.conv_out = Conv(cin, 3, 3, padding=1)

    def forward(self, z):
        h = self.mid.block_2(self.mid.block_1(self.conv_in(z)))
        for level in reversed(self.up):
            for b in level.block:
                h = b(h)
            if hasattr(level, "upsample"):
                h = level.upsample(h)
        return self.conv_out(swish(self.norm_out(h)))


def _resize(x_BC1hw: torch.Tensor, hw: Tuple[int, int], mode: str) -> torch.Tensor:
    """Official resizes run on 5-D [B, d, 1, h, w] tensors ('area' down, 'trilinear' up)."""
    if tuple(x_BC1hw.shape[-2:]) == tuple(hw):
        return x_BC1hw
    return F.interpolate(x_BC1hw, size=(1, *hw), mode=mode)


class BSQ(nn.Module):
    """The bit quantiser (official ``MultiScaleBSQ.lfq``): only a constant bit-weight buffer."""

    def __init__(self, d: int):
        super().__init__()
        self.d, self.scale = d, 1 / math.sqrt(d)
        self.register_buffer("mask", 2 ** torch.arange(d - 1, -1, -1))   # persistent: in the official file

    def quantize(self, z_Bd1hw: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(codes ±1/√d [B, d, 1, h, w] with a straight-through gradient, bits int64 [B, h·w, d]).
        Memory layouts follow the official code (packed [B, n, d] rows, a permuted view out): conv
        and resize kernels round differently on other layouts, and exactness is tested bit for bit."""
        B, d, t, h, w = z_Bd1hw.shape
        z_Bnd = F.normalize(z_Bd1hw.permute(0, 2, 3, 4, 1).reshape(B, -1, d), dim=-1)   # unit vectors
        zhat = torch.where(z_Bnd > 0, self.scale, -self.scale).to(z_Bnd.dtype)
        q_Bnd = z_Bnd + (zhat - z_Bnd).detach()
        return q_Bnd.view(B, t, h, w, d).permute(0, 4, 1, 2, 3), (q_Bnd > 0).long()

    def bits_to_codes(self, bits_Bhwd: torch.Tensor) -> torch.Tensor:
        """bits [B, h, w, d] → codes [B, d, 1, h, w] (bit·2s − s, then L2-normalised as official)."""
        codes = F.normalize(bits_Bhwd.float() * (2 * self.scale) - self.scale, dim=-1)
        return codes.permute(0, 3, 1, 2).unsqueeze(2)


class BSQVAE(nn.Module):
    def __init__(self, cfg: BSQConfig):
        super().__init__()
        self.cfg, self.d = cfg, cfg.codebook_dim
        self.encoder, self.decoder = Encoder(cfg), Decoder(cfg)
        self.quantizer = nn.Module()
        self.quantizer.lfq = BSQ(cfg.codebook_dim)
        self.quantize = self.quantizer   # official alias: the state_dict has both prefixes

    @property
    def lfq(self) -> BSQ:
        return self.quantizer.lfq

    # ------------------------------------------------------------ multi-scale quantisation
    def quantize(self, z_BdHW: torch.Tensor, schedule: Sequence[Tuple[int, int]]):
        """Residual BSQ over ``schedule`` (official ``MultiScaleBSQ.forward``). Returns (quantised sum
        [B, d, H, W], bits per scale [B, h·w, d], teacher-forcing inputs [B, h_{k+1}·w_{k+1}, d] for
        scales 1…K−1)."""
        H, W = z_BdHW.shape[-2:]
        if tuple(schedule[-1]) != (H, W):
            raise ValueError(f"the schedule's last scale {tuple(schedule[-1])} must equal the latent grid {(H, W)}")
        residual = z_BdHW.float().unsqueeze(2).contiguous()
        out, bits, var_inputs = 0.0, [], []
        for si, hw in enumerate(schedule):
            q, b = self.lfq.quantize(_resize(residual, hw, "area"))
            if tuple(hw) != (H, W):
                q = _resize(q, (H, W), "trilinear").contiguous()
            residual = residual - q.detach()
            out = out + q
            bits.append(b)
            if si != len(schedule) - 1:
                nxt = _resize(out, schedule[si + 1], "area")   # training convention: area
                var_inputs.append(nxt.squeeze(2).flatten(2).transpose(1, 2))
        return out.contiguous().squeeze(2), bits, var_inputs

    def encode(self, img_B3HW: torch.Tensor, schedule: Sequence[Tuple[int, int]]):
        """Images in [-1, 1] → (quantised latent, bits per scale, teacher-forcing inputs)."""
        return self.quantize(self.encoder(img_B3HW).float(), schedule)

    def bits_to_latent(self, bits: Sequence[torch.Tensor], schedule: Sequence[Tuple[int, int]]) -> torch.Tensor:
        """Σ_k trilinear-up(codes_k): the latent the decoder sees (official ``decode_from_indices``)."""
        H, W = schedule[-1]
        total = None
        for b, (h, w) in zip(bits, schedule):
            up = _resize(self.lfq.bits_to_codes(b.reshape(b.shape[0], h, w, self.d)), (H, W), "trilinear")
            total = up + 0 if total is None else total.add_(up)   # official ``summed_codes += …`` from 0
        return total.squeeze(2)

    def bits_to_var_input(self, bits: Sequence[torch.Tensor], schedule: Sequence[Tuple[int, int]]) -> torch.Tensor:
        """Teacher-forcing input [B, L − 1, d] from a bit pyramid: the running sum of upsampled codes
        resized to each next scale with **trilinear**, as the official trainer builds it
        (``bitwise_self_correction.flip_requant``) and the sampler feeds it — not the quantiser's
        ``area`` ``var_inputs`` (``quantize``), which the official training never uses."""
        H, W = schedule[-1]
        total, xs = None, []
        for si in range(len(schedule) - 1):
            h, w = schedule[si]
            up = _resize(self.lfq.bits_to_codes(bits[si].reshape(bits[si].shape[0], h, w, self.d)), (H, W), "trilinear")
            total = up if total is None else total + up
            xs.append(F.interpolate(total, size=(1, *schedule[si + 1]), mode="trilinear").squeeze(2).flatten(2).transpose(1, 2))
        return torch.cat(xs, dim=1)

    @torch.no_grad()
    def requantize(self, z_BdHW: torch.Tensor, schedule: Sequence[Tuple[int, int]], flip_p: float = 0.0,
                   generator: Optional[torch.Generator] = None):
        """Bitwise self-correction (Infinity §3.3; official ``flip_requant`` with ``noise_apply_requant``):
        quantise the residual scale by scale; with probability ``flip_p`` each bit is flipped and the
        *flipped* code enters the running sum, so later scales' labels correct the error. Returns
        (label bits per scale [B, h·w, d] — the quantiser's bits given the corrupted context —,
        teacher-forcing input [B, L − 1, d], trilinear as at inference)."""
        H, W = z_BdHW.shape[-2:]
        z = z_BdHW.float().unsqueeze(2)
        total, labels, xs = 0.0, [], []
        for si, hw in enumerate(schedule):
            q, b = self.lfq.quantize(_resize(z - total, hw, "area"))
            labels.append(b)
            if flip_p > 0:
                flip = torch.rand(b.shape, generator=generator, device=b.device) < flip_p
                b = torch.where(flip, 1 - b, b)
                q = self.lfq.bits_to_codes(b.view(b.shape[0], *hw, self.d))
            total = total + _resize(q, (H, W), "trilinear")
            if si != len(schedule) - 1:
                xs.append(F.interpolate(total, size=(1, *schedule[si + 1]), mode="trilinear").squeeze(2).flatten(2).transpose(1, 2))
        return labels, torch.cat(xs, dim=1)

    def decode(self, z_BdHW: torch.Tensor) -> torch.Tensor:
        """Latent → image in [-1, 1] (clamped, as official)."""
        return self.decoder(z_BdHW).clamp(-1, 1)

    # ------------------------------------------------------------ checkpoints
    def adapt_state_dict(self, state_dict) -> dict:
        """Accept both key layouts of the official file (its ``"vae"`` entry: ``read_state_dict(path,
        "vae")``): the module layout and the bare FLUX layout
        (``X.weight`` where the module has ``X.conv.weight`` / ``X.norm.weight``), as ``load_cnn`` does;
        the constant bit-weight buffer is filled in if the file lacks it."""
        sd = dict(state_dict)
        ours = set(self.state_dict())
        out = {}
        for k, v in sd.items():
            if k not in ours:
                head, _, leaf = k.rpartition(".")
                for level in ("conv", "norm"):
                    if f"{head}.{level}.{leaf}" in ours:
                        k = f"{head}.{level}.{leaf}"
                        break
            out[k] = v
        for k in ("quantizer.lfq.mask", "quantize.lfq.mask"):   # a constant: made here (the model may be on meta)
            out.setdefault(k, 2 ** torch.arange(self.d - 1, -1, -1))
        return out

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return super().load_state_dict(self.adapt_state_dict(state_dict), strict=strict, assign=assign)
