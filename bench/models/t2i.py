"""A text-to-image Infinity generator: text encoder + Infinity transformer + BSQ VAE, and the sampling
loop of the official ``Infinity.autoregressive_infer_cfg`` (FoundationVision/Infinity, with the
settings of ``tools/run_infinity.py``: ``cfg_insertion_layer=0``, i.e. guidance on the logits).

Per scale k (schedule (h_k, w_k), K scales): the blocks run on this scale's tokens with the KV cache
and RoPE at this scale's positions; logits are divided by τ, guided with a *constant* scale
cfg·cond + (1 − cfg)·uncond (not VAR's ramp), viewed as [B, h_k·w_k·d, 2] and each bit drawn by one
multinomial call after top-k/top-p filtering (top-k is a no-op for 2 classes; top-p drops the minor
class when its probability is ≤ 1 − p). Codes ±1/√d are trilinearly upsampled and summed on the final
grid; the next scale's input is that sum trilinearly resized (the training quantiser uses area). The
image is the decoded sum, (x+1)/2·255 **truncated** to uint8 (official; VAR rounds) in RGB (official
writes BGR for cv2).

Deviations: one seed seeds one ``torch.Generator`` for the whole batch, as official ``g_seed``; prompts
in a batch are padded to the longest and masked (official packs them: same values). Precision: varbench
samples in fp32, with the cross-attention's inputs and output rounded to bf16 as official flash-attention
does (``InfinityConfig.ca_bf16``); official inference (``tools/run_infinity.py``, ``--bf16 1``, the
evaluation scripts' default) casts the blocks to bf16 and samples under bf16 autocast, so on a GPU its
times are those of bf16 kernels and its images differ from these by bf16 rounding.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench.defaults import INFINITY_SAMPLING
from bench.models.bsq import BSQVAE, _resize
from bench.models.generator import sample_top_k_top_p
from bench.models.heap import reuse_heap
from bench.models.infinity import Infinity, rope2d_table
from bench.models.policy import TokenPolicy, enter_group, run_group, scatter_kept


class TextEncoder(nn.Module):
    """Prompts → (features [B, T, Ct5] float, mask [B, T] bool). Subclasses: ``T5TextEncoder`` (paper
    world, ``bench.models.text``), ``TinyTextEncoder`` (tiny world)."""

    def encode(self, prompts: Sequence[str]) -> Tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError


class PromptGenerator(nn.Module):
    """What the prompt-conditioned generators share (``T2IGenerator`` here, ``HARTGenerator``): prompts
    through ``text_encoder`` to features on the model's device, and ``generate`` = ``sample_tokens`` then
    ``decode_uint8``. Subclasses give ``device``, ``sample_tokens`` and ``decode_uint8``; prompts may
    also be given as ``(feats, mask)`` features."""
    text_encoder: Optional[nn.Module]
    name: str

    def encode_prompts(self, prompts: Sequence[str]) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.text_encoder is None:
            raise RuntimeError(f"{self.name or 'this generator'} has no text encoder: pass text features "
                               f"(feats, mask) instead of prompts, or load the model with its text encoder")
        feats, mask = self.text_encoder.encode(list(prompts))
        return feats.to(self.device), mask.to(self.device)

    def features(self, prompts) -> Tuple[torch.Tensor, torch.Tensor]:
        """(feats, mask) of a list of prompts, or the features themselves when given."""
        return self.encode_prompts(prompts) if _is_prompt_list(prompts) else prompts

    @torch.no_grad()
    def generate(self, prompts, seed: Optional[int] = 0, **sampling) -> torch.Tensor:
        """Images uint8 [B, 3, H, W] for a list of prompts, or for ``(feats, mask)`` text features."""
        with reuse_heap(self.device.type == "cpu"):
            _, latent = self.sample_tokens(prompts, seed, **sampling)
            return self.decode_uint8(latent)


class T2IGenerator(PromptGenerator):
    family = "infinity"   # the model family token methods key their official schedules on

    def __init__(self, infinity: Infinity, vae: BSQVAE, text_encoder: Optional[TextEncoder] = None, name: str = "",
                 token_policy: Optional[TokenPolicy] = None):
        super().__init__()
        if infinity.d != vae.d:
            raise ValueError(f"transformer and VAE disagree: {infinity.d} vs {vae.d} bits per token")
        self.infinity, self.vae, self.text_encoder, self.name = infinity, vae, text_encoder, name
        self.token_policy = token_policy or TokenPolicy()

    @property
    def device(self) -> torch.device:
        return self.infinity.pos_start.device

    @property
    def schedule(self) -> Tuple[Tuple[int, int], ...]:
        return tuple(self.infinity.cfg.scale_schedule)

    @property
    def blocks(self):
        """The transformer blocks, in order (token methods' layer ranges index them)."""
        return self.infinity.block_list

    @property
    def scales_hw(self):
        """(h, w) of every scale's token map."""
        return self.schedule

    # ------------------------------------------------------------------ sampling
    @torch.no_grad()
    def sample_bits(self, feats_BTC: torch.Tensor, mask_BT: torch.Tensor, seed: Optional[int] = 0,
                    cfg: float = INFINITY_SAMPLING["cfg"], tau: float = INFINITY_SAMPLING["tau"],
                    top_k: int = INFINITY_SAMPLING["top_k"], top_p: float = INFINITY_SAMPLING["top_p"],
                    schedule: Optional[Sequence[Tuple[int, int]]] = None, rope_grid: Optional[Tuple[int, int]] = None,
                    logits_hook: Optional[Callable[[int, torch.Tensor], None]] = None, cache_text_kv: bool = True,
                    gt_leak: int = 0, gt_bits: Optional[Sequence[torch.Tensor]] = None):
        """(bits per scale [B, h·w, d] int64, the summed latent [B, d, H, W]). ``cfg == 1`` runs the
        conditional batch alone (official); ``logits_hook(si, logits)`` sees the raw logits (after τ,
        before guidance; [cond; uncond] when guided). ``cache_text_kv=False`` recomputes the text's
        cross-attention keys/values at every scale as the official loop does (same values; FLOP
        accounting counts that loop). ``gt_leak`` = m > 0 (official ``gt_leak`` / ``gt_ls_Bl``): the
        first m scales take ``gt_bits`` (per scale [B, h·w, d], e.g. the VAE's bits of real images)
        instead of their samples, which are still drawn (the random stream is that of m = 0) — how
        much quality the later scales lose on a true prefix."""
        inf, vae = self.infinity, self.vae
        schedule = tuple(tuple(s) for s in (schedule or self.schedule))
        gt_leak = _check_leak(gt_leak, gt_bits, schedule, feats_BTC.shape[0], inf.d)
        rope_grid = tuple(rope_grid or inf.cfg.rope_grid)
        feats_BTC, mask_BT = feats_BTC.to(self.device), mask_BT.to(self.device)
        B, K, d = feats_BTC.shape[0], len(schedule), inf.d
        rng = None
        if seed is not None:
            rng = torch.Generator(device=self.device)
            rng.manual_seed(int(seed))
        guided = cfg != 1
        if guided:
            feats_BTC = torch.cat((feats_BTC, inf.null_text(mask_BT)))
            mask_BT = torch.cat((mask_BT, mask_BT))
        cond_BD, text = inf.encode_text(feats_BTC, mask_BT)
        gss = inf.ada_gss(cond_BD)
        cs_2Lh = rope2d_table(inf.cfg.hd, schedule, rope_grid, inf.cfg.rope_theta).to(self.device)
        first_BLC = cond_BD.unsqueeze(1) + inf.pos_start.expand(cond_BD.shape[0], 1, -1)
        Hf, Wf = schedule[-1]
        starts = [0]
        for h, w in schedule:
            starts.append(starts[-1] + h * w)
        summed = None   # official ``summed_codes = 0; summed_codes += …``: the first sum keeps its layout
        policy, bits, cached = self.token_policy, [], 0
        policy.begin(B, schedule)
        inf.kv_caching(True, max_len=starts[-1], text=cache_text_kv)
        try:
            for group in policy.groups(K):
                if policy.skip(group[0]):
                    break   # summed already holds every earlier scale at the full latent size
                # every scale of a group starts from the codes summed before the group (for a group of
                # one: the official next-scale input, the sum trilinearly resized)
                xs = []
                for si in group:
                    if si == 0:
                        x_BLC = first_BLC
                    else:
                        nxt = F.interpolate(summed, size=(1, *schedule[si]), mode="trilinear")
                        x_BLC = inf.word_embed(nxt.squeeze(2).flatten(2).transpose(1, 2))
                        if guided:
                            x_BLC = x_BLC.repeat(2, 1, 1)
                    xs.append(x_BLC + inf.lvl_embed.weight[si])   # level embedding, once, before the first block
                xs, keeps = enter_group(policy, group, xs, [schedule[si] for si in group])
                if len(group) == 1:   # this scale's slice of the table (a shortened scale: at its tokens' positions)
                    si = group[0]
                    rope = inf.rope_fn(cs_2Lh[:, starts[si]:starts[si + 1]])
                    rope = rope if keeps[0] is None else rope.at(keeps[0])
                else:   # every token of the group at its own scale's position
                    rows = xs[0].shape[0]
                    pos_Bl = torch.cat([starts[si] + (torch.arange(x.shape[1], device=self.device).expand(rows, -1)
                                                      if k is None else k) for si, x, k in zip(group, xs, keeps)], dim=1)
                    rope = inf.rope_fn(cs_2Lh).at(pos_Bl)
                route = policy.route(group[0])
                outs = run_group(xs, cached, lambda x, bias, rope=rope, route=route: inf.run_blocks(x, gss, text, bias, rope, route))
                cached += sum(x.shape[1] for x in xs)
                for si, x_BLC in zip(group, outs):
                    h, w = schedule[si]
                    keep_Bl = policy.residual_keep(si)
                    if keep_Bl is None:
                        x_BLC = policy.exit_scale(si, x_BLC)
                    policy.end_scale(si, x_BLC)
                    l = x_BLC.shape[1]
                    logits_BlV = inf.get_logits(x_BLC, cond_BD).mul(1 / tau)
                    if logits_hook is not None:
                        logits_hook(si, logits_BlV)
                    if guided:   # constant guidance on the logits (cfg_insertion_layer=0)
                        logits_BlV = cfg * logits_BlV[:B] + (1 - cfg) * logits_BlV[B:]
                    bits_Bld = sample_top_k_top_p(logits_BlV.reshape(B, l * d, 2), top_k, top_p, rng).view(B, l, d)
                    if si < gt_leak:   # sampled, then replaced, as the official loop does
                        gt_Bld = gt_bits[si].to(bits_Bld)
                        bits_Bld = gt_Bld if keep_Bl is None else gt_Bld.gather(1, keep_Bl.unsqueeze(-1).expand(-1, -1, d))
                    if keep_Bl is None:
                        codes = vae.lfq.bits_to_codes(bits_Bld.view(B, h, w, d))
                    else:   # pruned positions: zero residual (codes 0), bits -1
                        codes_Bld = vae.lfq.bits_to_codes(bits_Bld.view(B, 1, l, d)).flatten(2).transpose(1, 2)
                        codes = scatter_kept(keep_Bl, codes_Bld, h * w).transpose(1, 2).reshape(B, d, 1, h, w)
                        bits_Bld = scatter_kept(keep_Bl, bits_Bld, h * w, -1)
                    bits.append(bits_Bld)
                    up = _resize(codes, (Hf, Wf), "trilinear") if si != K - 1 else codes
                    summed = up + 0 if summed is None else summed.add_(up)
                    policy.observe(si, summed)
        finally:
            inf.kv_caching(False)
            policy.end()
        return bits, summed.squeeze(2)

    def sample_tokens(self, prompts, seed: Optional[int] = 0, logits_hook=None, **sampling):
        """(bits per scale, summed latent) of prompts (or ``(feats, mask)``): the text encoder, then
        ``sample_bits`` (the counterpart of the class-conditional ``Generator.sample_tokens``)."""
        feats, mask = self.features(prompts)
        return self.sample_bits(feats, mask, seed, logits_hook=logits_hook, **sampling)

    def decode_uint8(self, latent: torch.Tensor) -> torch.Tensor:
        """The BSQ VAE decode of a sampled latent as uint8 images (the last step of ``generate``)."""
        return to_uint8_trunc(self.vae.decode(latent))

    # ------------------------------------------------------------------ teacher forcing
    def forward_teacher(self, feats_BTC, mask_BT, bits: Sequence[torch.Tensor], x_BLd=None,
                        schedule: Optional[Sequence[Tuple[int, int]]] = None) -> torch.Tensor:
        """Logits [B, L, 2d] of a bit pyramid under teacher forcing; the input is made from the bits as
        the official trainer makes it (``BSQVAE.bits_to_var_input``) unless given (``x_BLd``, e.g. from
        ``BSQVAE.requantize`` with bitwise self-correction). ``schedule``: the model's own (default) or
        a prefix of it (the first scales only, as a coarse-first curriculum trains them)."""
        schedule = self._prefix(schedule)
        x = self.vae.bits_to_var_input(bits, schedule) if x_BLd is None else x_BLd
        return self.infinity(feats_BTC, mask_BT, x, schedule)

    def _prefix(self, schedule) -> Tuple[Tuple[int, int], ...]:
        if schedule is None:
            return self.schedule
        schedule = tuple(tuple(hw) for hw in schedule)
        if not schedule or schedule != self.schedule[:len(schedule)]:
            raise ValueError(f"schedule {schedule} is not a non-empty prefix of the model's {self.schedule}")
        return schedule

    def token_ce(self, feats_BTC, mask_BT, bits: Sequence[torch.Tensor], x_BLd=None,
                 schedule: Optional[Sequence[Tuple[int, int]]] = None) -> torch.Tensor:
        """Cross-entropy of every token [B, L] under teacher forcing, averaged over its bits."""
        logits_BLd2 = self.forward_teacher(feats_BTC, mask_BT, bits, x_BLd, schedule)
        B, L = logits_BLd2.shape[:2]
        return F.cross_entropy(logits_BLd2.reshape(-1, 2), torch.cat(bits, dim=1).reshape(-1),
                               reduction="none").view(B, L, -1).mean(dim=-1)

    def loss(self, feats_BTC, mask_BT, bits: Sequence[torch.Tensor], x_BLd=None,
             reweight_by_scale: bool = False, weight_BL: Optional[torch.Tensor] = None,
             schedule: Optional[Sequence[Tuple[int, int]]] = None) -> torch.Tensor:
        """Infinity's bit-label loss: the cross-entropy of every bit, averaged over a token's bits
        (``bitloss_type='mean'``), then over tokens — uniformly (1/L), or with
        ``reweight_by_scale`` (the official ``scripts/train.sh`` sets ``--reweight_loss_by_scale 1``) a
        token of scale k weighs √(h_K·w_K)/√(h_k·w_k), normalised to sum 1, so that coarse scales are not
        drowned by the many tokens of fine ones — then over the batch. ``weight_BL`` (not in the
        official trainer; the tiny recipe's ``background_weight``): per-token weights that multiply
        those, the loss then being Σ w·ce / Σ w over the whole batch. ``schedule``: a prefix of the
        model's schedule (default: all of it; ``forward_teacher``), the loss then over its tokens only."""
        schedule = self._prefix(schedule)
        ce_BL = self.token_ce(feats_BTC, mask_BT, bits, x_BLd, schedule)
        L = ce_BL.shape[1]
        if not reweight_by_scale and weight_BL is None:
            return ce_BL.mean()
        w_L = torch.ones(L)
        if reweight_by_scale:
            side_K = (self.schedule[-1][0] * self.schedule[-1][1]) ** 0.5
            w_L = torch.cat([torch.full((h * w,), side_K / (h * w) ** 0.5) for h, w in schedule])[:L]
        w_L = (w_L / w_L.sum()).to(ce_BL)
        if weight_BL is None:
            return ce_BL.mul(w_L).sum(dim=-1).mean()
        w_BL = weight_BL.to(ce_BL) * w_L
        return ce_BL.mul(w_BL).sum() / w_BL.sum()


def _check_leak(gt_leak: int, gt_bits, schedule, B: int, d: int) -> int:
    """``gt_leak`` as an int in 0…K, with ``gt_bits`` of the right shapes for its scales."""
    K = len(schedule)
    if isinstance(gt_leak, bool) or not isinstance(gt_leak, int) or not 0 <= gt_leak <= K:
        raise ValueError(f"gt_leak must be an integer in 0…{K} (the number of scales), got {gt_leak!r}")
    if gt_leak and (gt_bits is None or len(gt_bits) < gt_leak):
        have = "none" if gt_bits is None else len(gt_bits)
        raise ValueError(f"gt_leak={gt_leak} needs gt_bits for its first {gt_leak} scale(s); got {have}")
    for si in range(gt_leak):
        want = (B, schedule[si][0] * schedule[si][1], d)
        if tuple(gt_bits[si].shape) != want:
            raise ValueError(f"gt_bits[{si}] must have shape {list(want)} (batch, h·w, bits) for scale "
                             f"{schedule[si]}, got {list(gt_bits[si].shape)}")
    return gt_leak


def _is_prompt_list(x) -> bool:
    return isinstance(x, (list, tuple)) and all(isinstance(p, str) for p in x)


def to_uint8_trunc(img_B3HW_pm1: torch.Tensor) -> torch.Tensor:
    """[-1, 1] → uint8 as official Infinity: (x+1)/2·255, truncated."""
    return img_B3HW_pm1.add(1).div_(2).mul_(255).to(torch.uint8)
