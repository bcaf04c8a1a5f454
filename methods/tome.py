"""tome: token merging for dense generation (tomesd, Bolya & Hoffman 2023, after ToMe, Bolya et al.
ICLR 2023), training-free, kind ``tokens`` — the baseline of FastVAR's Table 3.

tomesd's ``bipartite_soft_matching_random2d`` and its block patch, applied at the late scales of a
VAR (the hook point FastVAR uses):
  * the h×w map is cut into sx×sy = 2×2 windows; in each window one token, drawn at random
    (``use_rand``; else the top-left one), is a *destination*, all others (and the border rows /
    columns of a map that 2 does not divide) are *sources*;
  * the metric is the residual stream x before the sub-layer; each source is matched to its most
    cosine-similar destination, and the r = int(N·ratio) sources with the highest similarity (at
    most all sources) are merged into their destination by averaging (``scatter_reduce`` "mean",
    the destination included);
  * the sub-layer runs on the unmerged sources + destinations; **unmerge** copies each
    destination's output back to the sources merged into it.
  Merging wraps self-attention only by default (tomesd: ``merge_attn=True, merge_mlp=False``;
  ``ffn=true`` also wraps the FFN); the KV cache then holds the merged tokens. As tomesd's
  ``compute_merge``, one merge per block is computed from the block's input and serves both
  sub-layers (``ffn=true`` reuses the attention's merge).
  As tomesd, an odd batch takes the top-left destinations (tomesd assumes a CFG batch of pairs).

Deviations: tomesd draws its windows' destinations from a generator copied once from the global RNG
(at the first merge after ``apply_patch``) and keeps drawing from it; here the policy owns a
generator seeded with ``seed`` at every sampling call (the draws never touch the sampler's RNG, and a
run repeats). Scales: the last ``scales`` of the model (tomesd merges at the UNet's highest
resolution, ``max_downsample=1``).
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import torch

from bench.method import TokenMethod
from bench.models.policy import TokenPolicy
from bench.registry import METHODS


def random2d_matching(metric_BNC: torch.Tensor, h: int, w: int, r: int, sx: int = 2, sy: int = 2,
                      rng: Optional[torch.Generator] = None) -> Tuple[Callable, Callable, torch.Tensor]:
    """(merge, unmerge, positions) for an h×w map: one destination per sx×sy window, the r most
    similar sources merged into their best destination (cosine similarity of ``metric``); positions
    [B, N − r]: where each merged token sits (an unmerged source's own, a destination's own)."""
    B, N, _ = metric_BNC.shape
    dev = metric_BNC.device
    hs, ws = h // sy, w // sx
    # the window layout is small and data-independent: built on the CPU (also for meta tensors)
    cell = (torch.zeros(hs, ws, dtype=torch.long) if rng is None
            else torch.randint(sy * sx, (hs, ws), generator=rng, device=rng.device).cpu())
    rows = torch.arange(hs)[:, None] * sy + cell // sx
    cols = torch.arange(ws)[None, :] * sx + cell % sx
    is_dst = torch.zeros(h, w, dtype=torch.bool)
    is_dst[rows, cols] = True
    dst_N = is_dst.flatten().nonzero().flatten().to(dev)       # positions of the destinations
    src_N = (~is_dst.flatten()).nonzero().flatten().to(dev)     # ... and of the sources
    r = min(r, len(src_N))

    m = metric_BNC / metric_BNC.norm(dim=-1, keepdim=True)
    sim_BSD = m[:, src_N] @ m[:, dst_N].transpose(1, 2)
    best_BS, best_dst_BS = sim_BSD.max(dim=-1)
    order_BS = best_BS.argsort(dim=-1, descending=True)
    unm_Bu, merged_Br = order_BS[:, r:], order_BS[:, :r]     # indices into the sources
    into_Br = best_dst_BS.gather(1, merged_Br)               # ... the destination each merged source joins

    def pick(x_BNC, idx):
        return x_BNC.gather(1, idx.unsqueeze(-1).expand(-1, -1, x_BNC.shape[-1]))

    def merge(x_BNC: torch.Tensor) -> torch.Tensor:
        src, dst = x_BNC[:, src_N], x_BNC[:, dst_N]
        dst = dst.scatter_reduce(1, into_Br.unsqueeze(-1).expand(-1, -1, x_BNC.shape[-1]), pick(src, merged_Br),
                                 reduce="mean")
        return torch.cat((pick(src, unm_Bu), dst), dim=1)

    def unmerge(y_BnC: torch.Tensor) -> torch.Tensor:
        C, u = y_BnC.shape[-1], unm_Bu.shape[1]
        unm, dst = y_BnC[:, :u], y_BnC[:, u:]
        out = y_BnC.new_empty(B, N, C)
        out[:, dst_N] = dst
        src_pos = src_N.expand(B, -1)
        out.scatter_(1, src_pos.gather(1, unm_Bu).unsqueeze(-1).expand(-1, -1, C), unm)
        out.scatter_(1, src_pos.gather(1, merged_Br).unsqueeze(-1).expand(-1, -1, C), pick(dst, into_Br))
        return out

    positions_Bn = torch.cat((src_N.expand(B, -1).gather(1, unm_Bu), dst_N.expand(B, -1)), dim=1)
    return merge, unmerge, positions_Bn


class ToMePolicy(TokenPolicy):
    name = "tome"

    def __init__(self, ratio_by_scale: Dict[int, float], kinds=("attn",), use_rand: bool = True, seed: int = 0):
        self.ratio, self.kinds, self.use_rand, self.seed = dict(ratio_by_scale), frozenset(kinds), use_rand, seed
        self.hw: Tuple[int, int] = (0, 0)
        self.rng: Optional[torch.Generator] = None
        self.block_merge: Dict[int, tuple] = {}   # block -> its merge at this scale, made at its attention

    def begin(self, batch: int, patch_nums) -> None:
        self.rng = None

    def begin_scale(self, si: int, pn) -> None:
        self.hw = tuple(pn) if isinstance(pn, (tuple, list)) else (pn, pn)
        self.block_merge = {}

    def sublayer(self, si, kind, block_idx, h_BLC, fn, x_BLC=None):
        ratio = self.ratio.get(si, 0.0)
        if ratio == 0.0 or kind not in self.kinds:
            return fn(h_BLC)
        if kind == "attn" or block_idx not in self.block_merge:
            # tomesd: the merge is computed once per block, from its input, before the attention; an odd
            # batch draws no random destinations; weight-free accounting (meta) needs shapes only
            B, L = h_BLC.shape[:2]
            draw = self.use_rand and B % 2 == 0 and h_BLC.device.type != "meta"
            if draw and self.rng is None:
                self.rng = torch.Generator(device=h_BLC.device).manual_seed(self.seed)
            self.block_merge[block_idx] = random2d_matching(x_BLC if x_BLC is not None else h_BLC, *self.hw,
                                                            int(L * ratio), rng=self.rng if draw else None)
        merge, unmerge, pos_Bn = self.block_merge[block_idx]
        return unmerge(fn(merge(h_BLC), keep_Bl=pos_Bn))


@METHODS.register("tome")
class ToMe(TokenMethod):
    name = "tome"
    deviations = (
        "tomesd's random destinations come from a policy-owned generator seeded at every sampling call (tomesd: "
        "one copy of the global RNG, made at its first merge); applied at the last `scales` scales of the VAR; "
        "with RoPE (Infinity, HART) a merged token rotates at its destination's position",
    )

    def apply(self, gen, ctx):
        _, _, hws = self.target(gen)
        K = len(hws)
        if self.scales >= K:
            raise ValueError(f"tome: scales={self.scales} but the model has {K} scales; the first must stay unmerged")
        ratio_by_scale = {si: self.ratio for si in range(K - self.scales, K)}
        kinds = ("attn", "ffn") if self.ffn else ("attn",)
        gen.token_policy = ToMePolicy(ratio_by_scale, kinds, self.use_rand, self.seed)
        ctx.notes.append(f"tome: ratio {self.ratio:g} at {', '.join(f'{hws[si][0]}×{hws[si][1]}' for si in ratio_by_scale)}, "
                         f"merging {' and '.join(kinds)}")
        return gen
