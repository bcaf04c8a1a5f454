"""lazyvar: LazyVAR's update-index token pruning and parallel group decoding (CVPR 2026), training-free.

LazyVAR has no public code: this is a re-implementation from the paper's description ("LazyVAR
(re-implementation from paper description)"); every choice the paper leaves open is varbench's and
is listed below and in ``deviations``.

The latent a VAR model accumulates, f̂_k = f̂_{k−1} + up(r_k) (r_k: scale k's residual prediction),
changes less and less at the late scales. LazyVAR turns that into two savings:

* **Update-index guided token pruning (UIGTP).** Per position of the final latent grid,
      UpdateIndex_k = 1 − cos⟨f̂_{k−1}, f̂_k⟩        (cosine over the latent channels; ∈ [0, 2])
  and a pruned scale k keeps the n_k = round(keep_k·h_k·w_k) tokens of highest index, the index of
  the scale *before* (update patterns persist across scales) area-downsampled to h_k×w_k. Only the
  kept tokens enter the block stack (attention and its KV cache included); the head samples them,
  and every pruned position's residual prediction is set to zero (VAR: its embedding is zero before
  the upsampling and φ; Infinity: its code is zero; the returned token/bit is −1).
* **Parallel group decoding (PGD).** The late scales i … i+p−1 run as one group: every scale of
  the group gets its input from the same f̂_{i−1} (area-downsampled for VAR, trilinearly resized
  for Infinity, as each family builds a next-scale input), pruned by UpdateIndex_{i−1}, and the
  group's tokens go through the block stack in *one* pass with the training mask (a token sees the
  cached earlier scales and the group's tokens of its own and earlier scales). The residuals are
  then sampled scale by scale and all added to f̂. The p scales cost one sequential step.
* **Cumulative keep indices.** Within a group the highest-index positions go to the largest scale
  and lower ones to smaller scales, so that no position is updated by two scales of the group: the
  paper takes, for scale i+m, the n_{i+m} tokens starting at rank cum_{i+m} of the downsampled
  index, cum_i = Σ_{k=i+1}^{i+p} n_k·(h_K·w_K)/(h_k·w_k) (K the last scale).
  varbench does this exactly: going from the largest scale of the group to the smallest, each scale
  takes its n highest-index tokens among those whose footprint on the final grid (the final
  positions it owns, floor(y·h/H), floor(x·w/W)) holds no position already kept by a larger scale.
  Equal indices (common: f̂ upsampled from a coarse scale is piecewise constant) go in position
  order, so the selection is the same on every device.
  Where the downsampled rankings agree this is the paper's rank offset; where they do not, it still
  never assigns a position twice (tested) — as long as the group has room: when fewer than n_k free
  tokens are left, the scale fills up with its highest-index blocked tokens (every row keeps n_k
  tokens, the paper's budget; keep=1 stays the identity). Measured on the tiny models (4 seeds):
  never at the default ratios, in 1 of 48 tiny-var images at keep=0.4/0.2/0.1, in every image at
  keep=0.5. ``cum=false``: every scale takes its own top n_k.

Schedules (``schedule=``): the group is the scales at least half as wide as the last one, with the
schedule's keep ratios from its first scale on:
  * ``infinity`` (the paper's Infinity-2B setting): scales 10–13 of 13 (32², 40², 48², 64²) in one
    group, keep [20 %, 10 %, 5 %, 1 %]: 13 steps become 10 (tiny-t2i: 4², 6², 8², keep 20/10/5 %);
  * ``hart``: the paper runs HART-0.7B in 13 steps of 14 but gives no keep ratios: varbench groups the
    last two scales (48², 64²) with Infinity's ratios at those widths, 5 % and 1 %;
  * ``var``: class-conditional VAR has no LazyVAR setting; varbench uses Infinity's relative to the
    scale list — var-d16: 8², 10², 13², 16²; tiny-var: 4², 5², 6², 8²; the same keep ratios;
  * ``auto`` (default): the model family's own.
``keep=a/b/…`` replaces the ratios and makes the last ``len(keep)`` scales the group (one value:
every scale of the default group; a 0 prunes the whole scale),
``pgd=false`` decodes the group's scales one by one (each pruned by the index of the scale just
before it), ``criterion=pts`` ranks by FastVAR's PTS score ‖x_i − mean(x)‖² of each scale's input
instead of the update index (the paper's "w PTS" ablation). Under CFG the conditional and
unconditional rows keep the same tokens (the index is computed on the conditional f̂; PTS on the
conditional rows' input).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from bench.method import TokenMethod
from bench.models.policy import TokenPolicy, take_tokens
from bench.registry import METHODS
from bench.spec import SpecError
from methods.fastvar import parse_fractions, pts_score

# family -> (keep ratios from the group's first scale on, group: "half" = the scales at least half as
# wide as the last, or a count of last scales)
PRESETS: Dict[str, Tuple[Tuple[float, ...], object]] = {
    "infinity": ((0.2, 0.1, 0.05, 0.01), "half"),
    "hart": ((0.05, 0.01), 2),
    "var": ((0.2, 0.1, 0.05, 0.01), "half"),
}


def parse_keep(text: str) -> Tuple[float, ...]:
    return parse_fractions("keep", text, "0.2/0.1/0.05/0.01")


def update_index(prev: torch.Tensor, cur: torch.Tensor) -> torch.Tensor:
    """1 − cos⟨f̂_{k−1}, f̂_k⟩ over the channel dim, per final-grid position: [B, H, W] (latents
    [B, C, H, W] or Infinity's [B, d, 1, H, W])."""
    if prev.dim() == 5:
        prev, cur = prev.squeeze(2), cur.squeeze(2)
    return 1 - F.cosine_similarity(prev.float(), cur.float(), dim=1, eps=1e-8)


def downsample(index_BHW: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
    """The index area-averaged onto an h×w map, flattened [B, h·w]."""
    return F.interpolate(index_BHW.unsqueeze(1), size=tuple(hw), mode="area").flatten(1)


def owners(hw: Tuple[int, int], HW: Tuple[int, int], device) -> torch.Tensor:
    """For every final-grid position (row-major, H·W), the index of the h×w token that owns it."""
    (h, w), (H, W) = hw, HW
    r = torch.arange(H, device=device) * h // H
    c = torch.arange(W, device=device) * w // W
    return (r[:, None] * w + c[None, :]).flatten()


def select_group(scores: Sequence[torch.Tensor], hws: Sequence[Tuple[int, int]], n_keep: Sequence[int],
                 HW: Tuple[int, int], cumulative: bool) -> List[torch.Tensor]:
    """Kept positions [B, n] (sorted) of every scale of a group, from per-scale scores [B, h·w] (higher:
    keep first). ``cumulative``: largest scale first, each scale among the tokens whose final-grid
    footprint no larger scale of the group kept (module docstring)."""
    B = scores[0].shape[0]
    out: List[Optional[torch.Tensor]] = [None] * len(scores)
    claimed_BN = None
    for j in sorted(range(len(scores)), key=lambda j: -hws[j][0] * hws[j][1]):
        s_Bl, n = scores[j], n_keep[j]
        own_N = owners(hws[j], HW, s_Bl.device)
        # by score, equal scores in position order: the index is piecewise constant where f̂ came from a
        # coarse upsampling, so ties are common, and topk would break them in its kernel's order
        rank_Bl = s_Bl.argsort(dim=1, descending=True, stable=True)
        if cumulative and claimed_BN is not None:
            blocked_Bl = torch.zeros_like(s_Bl, dtype=torch.bool).scatter_reduce(
                1, own_N.expand(B, -1), claimed_BN, "amax", include_self=True)
            # the free tokens first, then (only where fewer than n are free) the blocked ones, each by score
            rank_Bl = rank_Bl.gather(1, blocked_Bl.gather(1, rank_Bl).to(torch.uint8).argsort(dim=1, stable=True))
        keep_Bn = rank_Bl[:, :n].sort(dim=1).values
        out[j] = keep_Bn
        if cumulative:
            kept_Bl = torch.zeros_like(s_Bl, dtype=torch.bool).scatter(1, keep_Bn, True)
            claim_BN = kept_Bl.gather(1, own_N.expand(B, -1))
            claimed_BN = claim_BN if claimed_BN is None else claimed_BN | claim_BN
    return out


class LazyVARPolicy(TokenPolicy):
    """UIGTP on the scales of ``keep`` (absolute scale index → keep ratio), decoded as one group (pgd)
    or one by one."""

    name = "lazyvar"

    def __init__(self, keep_by_scale: Dict[int, float], hws: Sequence[Tuple[int, int]], pgd: bool = True,
                 cum: bool = True, criterion: str = "update"):
        self.keep, self.hws = dict(keep_by_scale), [tuple(hw) for hw in hws]
        self.pgd, self.cum, self.criterion = pgd, cum, criterion
        self.first = min(self.keep)
        self.group = tuple(sorted(self.keep))

    def begin(self, batch: int, patch_nums) -> None:
        self.B, self.prev, self.index, self.kept = batch, None, {}, {}
        self.scale_keep = None

    def groups(self, n_scales: int):
        if not self.pgd:
            return [(si,) for si in range(n_scales)]
        return [(si,) for si in range(self.first)] + [self.group] + \
            [(si,) for si in range(self.group[-1] + 1, n_scales)]

    def _needs_index(self, si: int) -> bool:
        """Whether scale si's update index decides a later scale's tokens (pgd: the group's)."""
        if self.criterion != "update":
            return False
        return si + 1 == self.first if self.pgd else si + 1 in self.keep

    def observe(self, si: int, latent: torch.Tensor) -> None:
        if self._needs_index(si):
            self.index[si] = update_index(self.prev, latent)
        # f̂_si is kept only while the next scale's index needs it (latent changes in place)
        self.prev = latent.clone() if self._needs_index(si + 1) else None

    def begin_group(self, group: Sequence[int], xs: Sequence[torch.Tensor]) -> None:
        pruned = [si for si in group if si in self.keep]
        if not pruned:
            return
        HW = self.hws[-1]
        if self.criterion == "pts":
            scores = [pts_score(xs[group.index(si)][:self.B].float()) for si in pruned]
        else:
            idx = self.index.get(pruned[0] - 1)
            if idx is None:
                raise RuntimeError(f"lazyvar: no update index before scale {pruned[0]} (it needs two earlier scales)")
            scores = [downsample(idx, self.hws[si]) for si in pruned]
        n_keep = [round(self.keep[si] * self.hws[si][0] * self.hws[si][1]) for si in pruned]
        for si, k in zip(pruned, select_group(scores, [self.hws[si] for si in pruned], n_keep, HW,
                                              self.cum and len(pruned) > 1)):
            self.kept[si] = k

    def enter_scale(self, si: int, x_BLC: torch.Tensor) -> torch.Tensor:
        keep_Bl = self.kept.get(si)
        if keep_Bl is None:
            self.scale_keep = None
            return x_BLC
        rows = keep_Bl.repeat(x_BLC.shape[0] // keep_Bl.shape[0], 1)   # the CFG halves keep the same tokens
        self.scale_keep = rows
        return take_tokens(x_BLC, rows)

    def residual_keep(self, si: int) -> Optional[torch.Tensor]:
        return self.kept.get(si)


@METHODS.register("lazyvar")
class LazyVAR(TokenMethod):
    name = "lazyvar"
    deviations = (
        "re-implemented from the paper (no public code): the update index is a per-position cosine over the "
        "latent channels on the final grid, area-downsampled to each scale; n_k = round(keep·h·w)",
        "cumulative keep indices are exact (a scale takes its top tokens among those whose final-grid footprint "
        "no larger scale of the group kept; equal indices in position order; a scale left with fewer free tokens "
        "than it keeps fills up with its best blocked ones) where the paper offsets ranks by cum_i",
        "schedules are relative to the model's scale list (the group: scales at least half as wide as the last); "
        "class-conditional VAR has no LazyVAR setting and uses Infinity's",
        "HART: the paper gives only its step count (13 of 14); the hart schedule (the last two scales, keep "
        "5 % / 1 %, Infinity's ratios at those widths) is varbench's",
        "VAR and HART: a pruned position's zero residual still passes φ (its bias and 3×3 neighbours) after the "
        "upsampling; the paper adds the interpolated residual without it",
    )

    def __init__(self, **params):
        super().__init__(**params)
        try:
            if self.keep != "auto":
                parse_keep(self.keep)
        except SpecError as e:
            raise SpecError(f"lazyvar: {e}") from None

    def schedule_for(self, gen) -> Tuple[Dict[int, float], str]:
        family, _, hws = self.target(gen)
        preset = family if self.schedule == "auto" else self.schedule
        K = len(hws)
        ratios, rule = PRESETS[preset]
        # the default group: the scales at least half as wide as the last (Infinity 1024²: 32²–64²)
        n_group = sum(1 for h, w in hws if 2 * h >= hws[-1][0] and 2 * w >= hws[-1][1]) if rule == "half" else rule
        if self.keep == "auto":
            keep = ratios
            if n_group > len(keep):
                raise SpecError(f"lazyvar: the {preset} schedule has keep ratios for {len(keep)} scales but "
                                 f"this model's group has {n_group}: give keep=a/b/… for its last scales")
            keep = keep[:n_group]
        else:
            keep = parse_keep(self.keep)
            if len(keep) == 1:
                keep = keep * n_group
        if len(keep) > K - 2:
            raise SpecError(f"lazyvar: keep={self.keep} groups the last {len(keep)} scales but the model has {K}: "
                             f"at least two dense scales must come first (the update index needs f̂ of two scales)")
        return {K - len(keep) + i: r for i, r in enumerate(keep)}, preset

    def apply(self, gen, ctx):
        keep_by_scale, preset = self.schedule_for(gen)
        hws = tuple(gen.scales_hw)
        gen.token_policy = LazyVARPolicy(keep_by_scale, hws, pgd=self.pgd, cum=self.cum, criterion=self.criterion)
        sched = ", ".join(f"{hws[si][0]}×{hws[si][1]}: {r:g}" for si, r in keep_by_scale.items())
        mode = "one group (parallel decoding)" if self.pgd else "one scale at a time"
        ctx.notes.append(f"lazyvar ({preset} schedule): keep {{{sched}}}, {mode}, "
                         f"cum={'on' if self.cum else 'off'}, criterion={self.criterion}")
        return gen
