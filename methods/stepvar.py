"""stepvar: StepVAR's structure-texture guided token pruning (Liu et al., arXiv 2603.01757), training-free.

StepVAR has no public code: this is a re-implementation from the paper's description, and every
choice the paper leaves open is varbench's (listed below and in ``deviations``).

At each pruned (late) scale, the scale's token map is scored once, before the first block:
  * **texture** — a light high-pass filter over the h×w map, depthwise on every channel (3×3
    Laplacian [[0,1,0],[1,−4,1],[0,1,0]] by default, ``filter=sobel`` for the Sobel gradient
    magnitude), replicate padding; texture_i = ‖HPF(x)_i‖²;
  * **structure** — PCA of the scale's tokens (per image): structure_i = ‖P_k(x_i − mean)‖², the
    squared projection on the first ``components`` principal components (tokens far out along the
    map's dominant directions carry its global structure);
  * the two are combined by rank, score = α·rank(texture) + (1−α)·rank(structure), ranks scaled to
    [0, 1] (the paper says "combined ranking"; α = ``alpha``); the top ``L − int(L·drop)`` tokens
    are kept. ``score=hpf`` / ``score=pca`` use one criterion (the paper's ablations), ``score=random``
    a uniformly random subset per image (its baseline; seeded per sampling call by ``seed``).
The whole block stack then runs on the kept tokens only (attention and its KV cache included), and
**nearest-neighbour propagation** rebuilds the dense map the head reads: every pruned position takes
the output features of the nearest kept position on the h×w grid (Euclidean; ties go to the
higher-scored kept token). ``restore=linear`` (the paper's ablation "linear interpolation instead of nearest
neighbour") takes the inverse-distance-weighted mean of the 4 nearest kept positions (ties for the
4th place, as common on a grid as for the 1st, also go to the higher-scored kept tokens).

The scored map x is the block stack's input at that scale: the embedded upsampled latent plus, for
VAR, its learned position and level embeddings. Under CFG the conditional and unconditional rows
share that input, hence the kept set (``score=random`` draws one subset per image for both halves).
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from bench.method import TokenMethod
from bench.models.policy import TokenPolicy, take_tokens
from bench.registry import METHODS
from bench.spec import SpecError
from methods.fastvar import parse_drop

KERNELS = {
    "laplacian": [[[0.0, 1.0, 0.0], [1.0, -4.0, 1.0], [0.0, 1.0, 0.0]]],
    "sobel": [[[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]],     # ∂/∂x, then ∂/∂y
              [[-1.0, -2.0, -1.0], [0.0, 0.0, 0.0], [1.0, 2.0, 1.0]]],
}
LINEAR_NEIGHBOURS = 4


def texture_score(x_BChw: torch.Tensor, kind: str = "laplacian") -> torch.Tensor:
    """‖HPF(x)‖² per position [B, h·w]: each kernel of ``KERNELS[kind]`` applied depthwise, summed."""
    B, C, h, w = x_BChw.shape
    padded = F.pad(x_BChw, (1, 1, 1, 1), mode="replicate")
    total = x_BChw.new_zeros(B, h * w)
    for k in KERNELS[kind]:
        weight = torch.tensor(k, dtype=x_BChw.dtype, device=x_BChw.device).expand(C, 1, 3, 3)
        total = total + F.conv2d(padded, weight, groups=C).square().sum(1).flatten(1)
    return total


def structure_score(x_BLC: torch.Tensor, components: int) -> torch.Tensor:
    """Squared projection of each centred token on the first ``components`` principal components of
    its map [B, L]; through the smaller of the L×L Gram and C×C covariance eigenproblems."""
    xc = (x_BLC - x_BLC.mean(1, keepdim=True)).double()
    L, C = xc.shape[1:]
    k = min(components, L, C)
    if L <= C:   # Gram X Xᵀ = U Λ Uᵀ: the projections are U·√Λ
        lam, U = torch.linalg.eigh(xc @ xc.transpose(1, 2))
        proj = U[..., -k:] * lam[:, None, -k:].clamp_min(0).sqrt()
    else:        # covariance Xᵀ X = V Λ Vᵀ: the projections are X·V
        _, V = torch.linalg.eigh(xc.transpose(1, 2) @ xc)
        proj = xc @ V[..., -k:]
    return proj.square().sum(-1).to(x_BLC.dtype)


def unit_rank(score_BL: torch.Tensor) -> torch.Tensor:
    """Rank of each score within its row scaled to [0, 1] (ties in index order)."""
    L = score_BL.shape[1]
    return score_BL.argsort(dim=1, stable=True).argsort(dim=1, stable=True).to(score_BL.dtype) / max(L - 1, 1)


def grid(h: int, w: int, device=None) -> torch.Tensor:
    ys, xs = torch.meshgrid(torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij")
    return torch.stack((ys.flatten(), xs.flatten()), -1).float()


class StepVARPolicy(TokenPolicy):
    name = "stepvar"

    def __init__(self, drop_by_scale: Dict[int, float], score: str = "both", alpha: float = 0.5,
                 components: int = 2, filter: str = "laplacian", restore: str = "nearest", seed: int = 0):
        self.drop, self.score, self.alpha, self.components = dict(drop_by_scale), score, alpha, components
        self.filter, self.restore, self.seed = filter, restore, seed
        self.hw: Tuple[int, int] = (0, 0)
        self.scale_keep: Optional[torch.Tensor] = None
        self.rng: Optional[torch.Generator] = None
        self.batch = 0   # images per sampling call (begin); 0: every row is an image

    def begin(self, batch: int, patch_nums) -> None:
        self.batch, self.rng = batch, None   # the generator is created on first use, on the tensors' device

    def begin_scale(self, si: int, pn) -> None:
        self.hw = tuple(pn) if isinstance(pn, (tuple, list)) else (pn, pn)

    def skip(self, si: int) -> bool:
        return self.drop.get(si, 0.0) == 1.0

    def scores(self, x_BLC: torch.Tensor) -> torch.Tensor:
        """Higher = keep; [B, L]."""
        B, L, C = x_BLC.shape
        if self.score == "random":
            if x_BLC.device.type == "meta":   # weight-free accounting: only the shapes matter
                return x_BLC.new_empty(B, L)
            if self.rng is None:
                self.rng = torch.Generator(device=x_BLC.device).manual_seed(self.seed)
            # one draw per image: under CFG the rows are the images' conditional, then unconditional
            # halves, which share their kept set as they do under the scored criteria (same input)
            images = self.batch or B
            return torch.rand(images, L, generator=self.rng, device=x_BLC.device).repeat(B // images, 1)
        parts = []
        if self.score in ("hpf", "both"):
            tex = texture_score(x_BLC.transpose(1, 2).reshape(B, C, *self.hw), self.filter)
            parts.append((self.alpha if self.score == "both" else 1.0, unit_rank(tex)))
        if self.score in ("pca", "both"):
            parts.append((1 - self.alpha if self.score == "both" else 1.0, unit_rank(structure_score(x_BLC, self.components))))
        return sum(a * r for a, r in parts)

    def enter_scale(self, si: int, x_BLC: torch.Tensor) -> torch.Tensor:
        ratio = self.drop.get(si, 0.0)
        if ratio == 0.0:
            self.scale_keep = None
            return x_BLC
        L = x_BLC.shape[1]
        self.scale_keep = self.scores(x_BLC).argsort(dim=1, descending=True, stable=True)[:, :L - int(L * ratio)]
        return take_tokens(x_BLC, self.scale_keep)

    def exit_scale(self, si: int, x_BlC: torch.Tensor) -> torch.Tensor:
        if self.scale_keep is None:
            return x_BlC
        keep_Bl, self.scale_keep = self.scale_keep, None
        B, n, C = x_BlC.shape
        pos_L2 = grid(*self.hw, device=x_BlC.device)
        dist_BLn = torch.cdist(pos_L2.expand(B, -1, -1), pos_L2[keep_Bl])
        if self.restore == "nearest":
            src_BL = dist_BLn.argmin(-1)   # first minimum in kept (score) order: ties go to the higher-scored kept token
            return take_tokens(x_BlC, src_BL)
        k = min(LINEAR_NEIGHBOURS, n)
        # ranked by (squared distance, kept order): squared grid distances are integers, so the key is
        # exact; topk on the distances alone broke the ties (a quarter of a 64² map's positions at 25 %
        # kept) in its kernel's order
        key_BLn = dist_BLn.square().round().long() * n + torch.arange(n, device=dist_BLn.device)
        src_BLk = key_BLn.topk(k, dim=-1, largest=False).indices
        d_BLk = dist_BLn.gather(-1, src_BLk)
        w_BLk = 1.0 / d_BLk.clamp_min(1e-6)
        w_BLk = torch.where(d_BLk[..., :1] == 0, (d_BLk == 0).to(w_BLk.dtype), w_BLk)   # a kept position keeps itself
        w_BLk = (w_BLk / w_BLk.sum(-1, keepdim=True)).to(x_BlC.dtype)
        nb_BLkC = take_tokens(x_BlC, src_BLk.flatten(1)).view(B, -1, k, C)
        return (w_BLk.unsqueeze(-1) * nb_BLkC).sum(2)


@METHODS.register("stepvar")
class StepVAR(TokenMethod):
    name = "stepvar"
    deviations = (
        "re-implemented from the paper (no public code): the high-pass filter (3×3 Laplacian), the number of "
        "principal components (2), the rank combination α·rank(texture) + (1−α)·rank(structure) with α = 0.5, "
        "the scored map (the block stack's input at the scale) and the schedule (drop 0.5 / 0.75 on the last "
        "two scales) are varbench's choices",
        "the scores' form is varbench's reading: texture = ‖HPF(x)‖² summed over channels (replicate padding), "
        "structure = the squared projection of the centred token on the top principal components (per image)",
        "what is propagated is the last block's output that the head reads (each pruned position then samples "
        "its own token from the copied logits), by Euclidean grid distance with ties to the higher-scored kept "
        "token; restore=linear is read as the inverse-distance mean of the 4 nearest kept tokens",
    )

    def __init__(self, **params):
        super().__init__(**params)
        try:   # a bad value fails when the spec is built, before any model is loaded
            parse_drop(self.drop)
        except SpecError as e:
            raise SpecError(f"stepvar: {e}") from None

    def schedule_for(self, gen) -> Dict[int, float]:
        _, _, hws = self.target(gen)
        drop = parse_drop(self.drop)
        K = len(hws)
        if len(drop) >= K:
            raise ValueError(f"stepvar: drop={self.drop} prunes {len(drop)} scales but the model has {K}: "
                             f"the first scale must stay dense")
        return {K - len(drop) + i: r for i, r in enumerate(drop)}

    def apply(self, gen, ctx):
        drop_by_scale = self.schedule_for(gen)
        gen.token_policy = StepVARPolicy(drop_by_scale, self.score, self.alpha, self.components, self.filter,
                                         self.restore, self.seed)
        hws = tuple(gen.scales_hw)
        sched = ", ".join(f"{hws[si][0]}×{hws[si][1]}: {r:g}" for si, r in drop_by_scale.items())
        ctx.notes.append(f"stepvar: drop {{{sched}}}, score={self.score}, restore={self.restore}")
        return gen
