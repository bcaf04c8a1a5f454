"""HART's hybrid tokenizer (mit-han-lab/hart ``hart/modules/models/autoencoder/hart_autoencoder.py``,
``quantize/hart_hybrid_quantize.py``, ``quantize/var_quantize_multiple_res.py``, ``networks/basic_vae.py``).

The encoder, decoder, φ convolutions and codebook are VAR's VQVAE (the official ``basic_vae.py`` and
``VectorQuantizer2`` are VAR's files), so they are imported from ``bench.models.vqvae`` and keep its
keys: ``encoder.*``, ``decoder.*``, ``quant_conv``, ``post_quant_conv``, ``quantize.embedding``,
``quantize.ema_vocab_hit_SV``, ``quantize.quant_resi.qresi_ls.{k}`` (plus ``decoder2.*`` /
``post_quant_conv2`` with ``double_decoder``; unused at inference, as official).

What is hybrid (HART §3.1): the latent is the sum of the discrete multi-scale pyramid and a continuous
residual. Coarse scales are VAR's (area-down, nearest code, bicubic-up, φ); the last scale's code is
added *without* φ, and whatever remains (``f_rest`` before that last code) is the continuous part the
transformer's diffusion head generates. φ is picked by the position si/(S−1) of a scale in the schedule
being run (the transformer's ``patch_nums``), as official; ``v_patch_nums`` of the tokenizer config only
sizes ``ema_vocab_hit_SV``.

Loading: ``adapt_state_dict`` strips the ``vae.`` prefix and drops the discriminator (``disc.*``) of a
``HARTAutoEncoderWithDisc`` file, which is how the official tokenizer folder is saved (UNVERIFIED: the
real hart-0.7b tokenizer file was not available offline), and keeps a usage buffer of another scale
count as official ``load_state_dict`` does.

Deviations: the training-only ``forward`` (which, unlike inference, applies φ at the last scale too) is
not reproduced; the official ``double_decoder`` load replaces ``decoder2`` by a copy of ``decoder``,
here ``decoder2`` keeps the loaded weights (it is never used to decode).
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench.models.configs import VQVAEConfig
from bench.models.hart_config import HARTTokenizerConfig
from bench.models.vqvae import VQVAE, Decoder, MultiScaleQuantizer, phi_index_map


def vqvae_config(cfg: HARTTokenizerConfig) -> VQVAEConfig:
    """The VAR VQVAE config with the same modules (official: num_res_blocks 2, attention on)."""
    return VQVAEConfig(vocab_size=cfg.vocab_size, z_channels=cfg.z_channels, ch=cfg.ch, ch_mult=tuple(cfg.ch_mult),
                       num_res_blocks=2, using_sa=True, using_mid_sa=True, dropout=cfg.dropout, beta=cfg.beta,
                       quant_conv_ks=cfg.quant_conv_ks, quant_resi=cfg.quant_resi,
                       share_quant_resi=cfg.share_quant_resi, patch_nums=tuple(cfg.v_patch_nums))


class HybridQuantizer(MultiScaleQuantizer):
    """Official ``HARTHybridQuantizer`` at inference: discrete scales 0…S−1 plus a continuous residual."""

    def phi(self, si: int, SN: int) -> nn.Module:
        """φ of scale si in an SN-scale schedule (official ``quant_resi[si / (SN − 1)]``)."""
        q = self.quant_resi
        if q._share == 1:
            return q.qresi
        phis = q.qresi_ls if q._share != 0 else [q._modules[str(k)] for k in range(len(q._modules))]
        return phis[phi_index_map(len(phis), SN)[si]]

    def _embed_BChw(self, idx_Bl: torch.Tensor, pn: int) -> torch.Tensor:
        return self.embedding(idx_Bl).transpose(1, 2).reshape(idx_Bl.shape[0], self.Cvae, pn, pn)

    def f_to_idx_and_residual(self, f_BChw: torch.Tensor, patch_nums: Sequence[int]) -> Tuple[List[torch.Tensor], torch.Tensor]:
        """Official ``f_to_idxBl_and_frest``: the token pyramid (every scale discrete, the last one
        included) and the residual *before* the last scale's code, [B, h·w, Cvae]. The continuous
        target of the diffusion head is that residual minus the last code's embedding."""
        B, C, H, W = f_BChw.shape
        SN = len(patch_nums)
        assert patch_nums[-1] == H == W, f"latent {H}x{W} does not match the last scale {patch_nums[-1]}"
        f_rest, idx_list = f_BChw.detach().clone(), []
        for si, pn in enumerate(patch_nums):
            z_BChw = F.interpolate(f_rest, size=(pn, pn), mode="area") if si != SN - 1 else f_rest
            idx_N = self._nearest(z_BChw.permute(0, 2, 3, 1).reshape(-1, C))
            # official interpolates the last scale too (to its own size: an identity)
            h_BChw = F.interpolate(self.embedding(idx_N.view(B, pn, pn)).permute(0, 3, 1, 2), size=(H, W),
                                   mode="bicubic").contiguous()
            if si != SN - 1:
                h_BChw = self.phi(si, SN)(h_BChw)
            else:
                residual_BLC = f_rest.permute(0, 2, 3, 1).reshape(B, H * W, C).clone()
            f_rest.sub_(h_BChw)
            idx_list.append(idx_N.view(B, pn * pn))
        return idx_list, residual_BLC

    def f_to_idx(self, f_BChw: torch.Tensor, to_fhat: bool = False) -> List[torch.Tensor]:
        """VQVAE API with HART semantics over the tokenizer's own ``v_patch_nums``: the token pyramid,
        or (``to_fhat``) a one-element list with the hybrid f_hat: the codes plus the continuous residual
        left after the last code (official: the training path's final stage adds all of ``f_rest``), so
        f_hat is f itself up to rounding."""
        idx_list, residual_BLC = self.f_to_idx_and_residual(f_BChw, self.patch_nums)
        if not to_fhat:
            return idx_list
        return [self.idx_to_fhat(idx_list, residual_BLC - self.embedding(idx_list[-1]))]

    def idx_to_var_input(self, idx_Bl_list: Sequence[torch.Tensor], patch_nums: Sequence[int] = None) -> torch.Tensor:
        """Teacher-forcing input (official ``idxBl_to_var_input``): f_hat after scales 0…S−2, each
        area-downsampled to the next scale, [B, L − 1, Cvae]."""
        pns = tuple(patch_nums or self.patch_nums)
        B, HW, SN = idx_Bl_list[0].shape[0], pns[-1], len(pns)
        f_hat = self.embedding.weight.new_zeros(B, self.Cvae, HW, HW)
        nxt = []
        for si in range(SN - 1):
            h = F.interpolate(self._embed_BChw(idx_Bl_list[si], pns[si]), size=(HW, HW), mode="bicubic")
            f_hat.add_(self.phi(si, SN)(h))
            nxt.append(F.interpolate(f_hat, size=(pns[si + 1], pns[si + 1]), mode="area").flatten(2).transpose(1, 2))
        return torch.cat(nxt, dim=1)

    def add_scale(self, si: int, f_hat: torch.Tensor, h_BChw: torch.Tensor,
                  patch_nums: Sequence[int] = None) -> torch.Tensor:
        """Inference step for a scale before the last (official ``get_next_autoregressive_input``
        without the next scale's input): f_hat += φ(bicubic-up(h)) in place."""
        pns = tuple(patch_nums or self.patch_nums)
        assert si < len(pns) - 1, "the last scale is added without φ (HART.sample_tokens does it)"
        return f_hat.add_(self.phi(si, len(pns))(F.interpolate(h_BChw, size=(pns[-1], pns[-1]), mode="bicubic")))

    def idx_to_fhat(self, idx_Bl_list: Sequence[torch.Tensor], residual_BLC: torch.Tensor = None,
                    patch_nums: Sequence[int] = None) -> torch.Tensor:
        """f_hat as generation builds it: φ(bicubic-up(code)) of scales 0…S−2, the last scale's code
        without φ, plus the continuous residual [B, h·w, Cvae] when given."""
        pns = tuple(patch_nums or self.patch_nums)
        B, HW, SN = idx_Bl_list[0].shape[0], pns[-1], len(pns)
        f_hat = self.embedding.weight.new_zeros(B, self.Cvae, HW, HW)
        for si in range(SN - 1):
            self.add_scale(si, f_hat, self._embed_BChw(idx_Bl_list[si], pns[si]), pns)
        last_BLC = self.embedding(idx_Bl_list[-1])
        if residual_BLC is not None:
            last_BLC = last_BLC + residual_BLC
        return f_hat.add_(last_BLC.transpose(1, 2).reshape(B, self.Cvae, HW, HW))


class HARTTokenizer(VQVAE):
    """Official ``HARTAutoEncoder`` (``quantizer_type='var_hybrid'``), inference."""

    def __init__(self, cfg: HARTTokenizerConfig = None):
        cfg = cfg or HARTTokenizerConfig()
        bad = cfg.problems()
        if bad:
            raise ValueError("unsupported HART tokenizer config: " + "; ".join(bad))
        vq = vqvae_config(cfg)
        super().__init__(vq)
        self.hart_cfg = cfg
        self.quantize = HybridQuantizer(vq)   # same keys as VAR's quantiser
        if cfg.double_decoder:
            ks = cfg.quant_conv_ks
            self.decoder2 = Decoder(vq)
            self.post_quant_conv2 = nn.Conv2d(self.Cvae, self.Cvae, ks, 1, ks // 2)

    def img_to_idx_and_residual(self, img_B3HW: torch.Tensor, patch_nums: Sequence[int]):
        """Image in [-1, 1] → (token pyramid, residual before the last code) (official
        ``img_to_idxBl_and_frest``)."""
        return self.quantize.f_to_idx_and_residual(self.quant_conv(self.encoder(img_B3HW)), patch_nums)

    def adapt_state_dict(self, state_dict) -> dict:
        sd = dict(state_dict)
        if any(k.startswith("vae.") for k in sd):   # a HARTAutoEncoderWithDisc file
            sd = {k[len("vae."):]: v for k, v in sd.items() if not k.startswith("disc.")}
        return super().adapt_state_dict(sd)


def load_tokenizer(path, cfg: HARTTokenizerConfig, device="cpu") -> HARTTokenizer:
    """Strictly loaded tokenizer from a weights file (``.safetensors``/``.bin``/``.pth``)."""
    from bench.checkpoint import load_built, read_state_dict
    return load_built(lambda: HARTTokenizer(cfg), read_state_dict(path), Path(path).name, device)
