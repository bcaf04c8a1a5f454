"""A VAR-family generator: the transformer, its VQVAE, and the sampling loop.

``Generator.generate`` is the official ``VAR.autoregressive_infer_cfg`` (FoundationVision/VAR
``models/var.py``) step by step: CFG on a doubled batch [cond; uncond] with the linear ramp
t = cfg·si/(K−1) (logits = (1+t)·cond − t·uncond), top-k then top-p filtering, one multinomial draw
per token from a seeded ``torch.Generator``, f_hat += φ(bicubic-up(embed(idx))), next-scale input =
area-downsampled f_hat. Images come back as uint8 [B, 3, H, W] (``x·255 + 0.5`` clamped, as saving a
PNG with torchvision does).

Deviation: one seed per call seeds one generator for the whole batch, as official (``g_seed``); the
runner derives per-batch seeds from the run seed. Precision: fp32 throughout; the official demo notebook
samples under fp16 autocast with TF32 matmuls, and the README's FID protocol names no precision.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench.defaults import SAMPLING
from bench.models.heap import reuse_heap
from bench.models.policy import TokenPolicy, enter_group, run_group, scatter_kept
from bench.models.var import VAR
from bench.models.vqvae import VQVAE


def top_k_top_p_filter_(logits_BlV: torch.Tensor, top_k: int = 0, top_p: float = 0.0) -> torch.Tensor:
    """In place: keep the top-k logits, then the smallest set whose probability mass exceeds top_p."""
    V = logits_BlV.shape[-1]
    if top_k > 0:
        kth_Bl1 = logits_BlV.topk(min(top_k, V), dim=-1, largest=True, sorted=False)[0].amin(dim=-1, keepdim=True)
        logits_BlV.masked_fill_(logits_BlV < kth_Bl1, -torch.inf)
    if top_p > 0:
        sorted_BlV, order_BlV = logits_BlV.sort(dim=-1, descending=False)
        drop_sorted = sorted_BlV.softmax(dim=-1).cumsum_(dim=-1) <= (1 - top_p)
        drop_sorted[..., -1:] = False   # always keep the most likely token
        logits_BlV.masked_fill_(drop_sorted.scatter(-1, order_BlV, drop_sorted), -torch.inf)
    return logits_BlV


def sample_top_k_top_p(logits_BlV: torch.Tensor, top_k: int, top_p: float, rng: Optional[torch.Generator]) -> torch.Tensor:
    B, l, V = logits_BlV.shape
    probs = top_k_top_p_filter_(logits_BlV, top_k, top_p).softmax(dim=-1).view(-1, V)
    return torch.multinomial(probs, num_samples=1, replacement=True, generator=rng).view(B, l)


def gumbel_softmax_rng(logits: torch.Tensor, tau: float, rng: Optional[torch.Generator]) -> torch.Tensor:
    gumbels = -torch.empty_like(logits).exponential_(generator=rng).log()
    return ((logits + gumbels) / tau).softmax(-1)


def to_uint8(img_B3HW_01: torch.Tensor) -> torch.Tensor:
    return img_B3HW_01.mul(255).add_(0.5).clamp_(0, 255).to(torch.uint8)


class Generator(nn.Module):
    family = "var"   # the model family token methods key their official schedules on

    def __init__(self, var: VAR, vae: VQVAE, name: str = "", token_policy: Optional[TokenPolicy] = None):
        super().__init__()
        if tuple(var.patch_nums) != tuple(vae.patch_nums) or var.V != vae.V or var.Cvae != vae.Cvae:
            raise ValueError(f"transformer and VQVAE disagree: patch_nums {var.patch_nums} vs {vae.patch_nums}, "
                             f"vocab {var.V} vs {vae.V}, Cvae {var.Cvae} vs {vae.Cvae}")
        self.var, self.vae, self.name = var, vae, name
        self.token_policy = token_policy or TokenPolicy()
        # CUDA graphs of the per-scale passes (bench.models.graphs): None, or how a scale is captured
        self.graph_capture = None
        self.captured_graphs = None

    @property
    def device(self) -> torch.device:
        return self.var.pos_1LC.device

    @property
    def blocks(self):
        """The transformer blocks, in order (token methods' layer ranges index them)."""
        return self.var.blocks

    @property
    def scales_hw(self):
        """(h, w) of every scale's token map."""
        return tuple((pn, pn) for pn in self.patch_nums)

    @property
    def patch_nums(self):
        return self.var.patch_nums

    # ------------------------------------------------------------------ sampling
    def scale_graphs(self, batch2: int):
        """The captured per-scale passes for ``batch2`` rows (``graph_capture`` set), captured on first
        use and again when the model's tensors were replaced; None when ``graph_capture`` is None."""
        if self.graph_capture is None:
            return None
        if type(self.token_policy) is not TokenPolicy:
            raise ValueError(f"CUDA graphs replay the plain per-scale loop; the token policy "
                             f"{self.token_policy.name!r} chooses the tokens each scale runs per generation: "
                             f"time it without CUDA graphs")
        from bench.models.graphs import ScaleGraphs
        if self.captured_graphs is None or not self.captured_graphs.matches(self.var, batch2):
            self.captured_graphs = None   # the old graphs' memory first
            self.captured_graphs = ScaleGraphs(self.var, batch2, self.graph_capture)
        return self.captured_graphs

    @torch.no_grad()
    def sample_tokens(self, labels_B: torch.Tensor, seed: Optional[int] = 0, cfg: Optional[float] = SAMPLING["cfg"],
                      top_k: int = SAMPLING["top_k"], top_p: float = SAMPLING["top_p"], more_smooth: bool = False,
                      logits_hook: Optional[Callable[[int, torch.Tensor], None]] = None, cache_adaln: bool = True):
        """Returns (token pyramid [list of B×pn² int64; -1 where a token policy gave a position a zero
        residual], f_hat). ``logits_hook(si, logits)`` sees the
        raw [cond; uncond] logits of every scale before CFG (used by tests and FID* tools; with
        ``graph_capture`` set they are the graph's output buffer, overwritten by the next generation).

        ``cfg=None`` samples without guidance on the conditional batch alone (no doubling); any number,
        0 included, runs the official doubled batch. ``cache_adaln=False`` recomputes the AdaLN vectors
        at every scale as the official loop does (same values; FLOP accounting counts that loop)."""
        var, quant = self.var, self.vae.quantize
        labels_B = labels_B.to(self.device)
        B, K = labels_B.shape[0], len(self.patch_nums)
        rng = None
        if seed is not None:
            rng = torch.Generator(device=self.device)
            rng.manual_seed(int(seed))
        guided = cfg is not None
        graphs = self.scale_graphs(2 * B if guided else B) if cache_adaln else None
        cond_2BD = var.cond(torch.cat((labels_B, torch.full_like(labels_B, var.num_classes))) if guided else labels_B)
        lvl_pos_1LC = var.lvl_pos()
        # The condition is the same at every scale: AdaLN once per generation, not once per scale
        # (with graphs: in scale 0's graph).
        blocks_ada, head_ada = var.ada_vectors(cond_2BD) if cache_adaln and graphs is None else (None, None)
        first_BLC = var.first_tokens(cond_2BD)
        f_hat = cond_2BD.new_zeros(B, var.Cvae, self.patch_nums[-1], self.patch_nums[-1])
        policy, tokens, cached = self.token_policy, [], 0
        policy.begin(B, self.patch_nums)
        if graphs is None:   # (the graphs hold buffers of their own)
            var.kv_caching(True, max_len=var.L)   # one preallocated KV buffer per block
        try:
            for group in policy.groups(K):
                if policy.skip(group[0]):
                    break   # f_hat already holds every earlier scale at the full latent size
                # every scale of a group starts from the f_hat accumulated before the group (for a
                # group of one: the official next-scale input, area-downsampled f_hat)
                xs = []
                for si in group:
                    if si == 0:
                        xs.append(first_BLC)
                        continue
                    pn = self.patch_nums[si]
                    next_BChw = F.interpolate(f_hat, size=(pn, pn), mode="area")
                    x_BLC = var.word_embed(next_BChw.flatten(2).transpose(1, 2)) + lvl_pos_1LC[:, slice(*var.begin_ends[si])]
                    xs.append(x_BLC.repeat(2, 1, 1) if guided else x_BLC)   # the CFG batch
                xs, _ = enter_group(policy, group, xs, [self.patch_nums[si] for si in group])
                if graphs is not None:   # identity policy, one scale a group: blocks and head replayed
                    outs, logits = [None], [graphs.run(group[0], xs[0], cond_2BD)]
                else:
                    route = policy.route(group[0])
                    outs = run_group(xs, cached, lambda x, bias, route=route: var.run_blocks(x, cond_2BD, bias, route, blocks_ada))
                    logits = [None] * len(outs)
                cached += sum(x.shape[1] for x in xs)
                for si, x_BLC, logits_2BlV in zip(group, outs, logits):
                    pn, ratio = self.patch_nums[si], si / (K - 1)
                    keep_Bl = policy.residual_keep(si)
                    if keep_Bl is None:
                        x_BLC = policy.exit_scale(si, x_BLC)
                    policy.end_scale(si, x_BLC)
                    if logits_2BlV is None:
                        logits_2BlV = var.get_logits(x_BLC, cond_2BD, head_ada)
                    if logits_hook is not None:
                        logits_hook(si, logits_2BlV)
                    if guided:
                        t = cfg * ratio   # CFG ramps linearly with the scale index (official)
                        logits_BlV = (1 + t) * logits_2BlV[:B] - t * logits_2BlV[B:]
                    else:
                        logits_BlV = logits_2BlV
                    idx_Bl = sample_top_k_top_p(logits_BlV, top_k, top_p, rng)
                    if not more_smooth:
                        h_BlC = quant.embedding(idx_Bl)
                    else:  # visualisation only (official: never for FID/IS)
                        tau = max(0.27 * (1 - ratio * 0.95), 0.005)
                        h_BlC = gumbel_softmax_rng(logits_BlV.mul(1 + ratio), tau, rng) @ quant.embedding.weight.unsqueeze(0)
                    if keep_Bl is not None:   # pruned positions: zero residual, token -1
                        h_BlC, idx_Bl = scatter_kept(keep_Bl, h_BlC, pn * pn), scatter_kept(keep_Bl, idx_Bl, pn * pn, -1)
                    tokens.append(idx_Bl)
                    h_BChw = h_BlC.transpose(1, 2).reshape(B, var.Cvae, pn, pn)
                    quant.add_scale(si, f_hat, h_BChw)
                    policy.observe(si, f_hat)
        finally:
            var.kv_caching(False)
            policy.end()
        return tokens, f_hat

    @torch.no_grad()
    def generate(self, labels_B: torch.Tensor, seed: Optional[int] = 0, cfg: Optional[float] = SAMPLING["cfg"],
                 top_k: int = SAMPLING["top_k"], top_p: float = SAMPLING["top_p"], more_smooth: bool = False) -> torch.Tensor:
        """Class-conditional images, uint8 [B, 3, H, W]. On the CPU, large activations are kept on the
        heap across calls (``bench.models.heap``: no page faults, the same values)."""
        with reuse_heap(self.device.type == "cpu"):
            _, f_hat = self.sample_tokens(labels_B, seed, cfg, top_k, top_p, more_smooth)
            return self.decode_uint8(f_hat)

    def decode_uint8(self, f_hat: torch.Tensor) -> torch.Tensor:
        """The VQVAE decode of a sampled f̂ as uint8 images (the last step of ``generate``)."""
        return to_uint8(self.vae.fhat_to_img(f_hat).add_(1).mul_(0.5))

    # ------------------------------------------------------------------ teacher forcing
    def forward_teacher(self, labels_B: torch.Tensor, tokens: Sequence[torch.Tensor]) -> torch.Tensor:
        """Logits [B, L, V] of the whole token pyramid under the block-causal mask."""
        return self.var(labels_B, self.vae.quantize.idx_to_var_input(tokens))

    def loss(self, labels_B: torch.Tensor, tokens: Sequence[torch.Tensor]) -> torch.Tensor:
        """Mean token cross-entropy over all scales (VAR training loss)."""
        logits_BLV = self.forward_teacher(labels_B, tokens)
        return F.cross_entropy(logits_BLV.flatten(0, 1), torch.cat(tokens, dim=1).flatten())
