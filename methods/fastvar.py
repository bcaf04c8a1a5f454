"""fastvar: FastVAR's cached token pruning (Guo et al., ICCV 2025), training-free, kind ``tokens``.

At the late scales only the "pivotal" tokens run through a block's sub-layers; the others get the
sub-layer output cached at an earlier scale, resized. Behaviour of the official code
(csguoh/FastVAR, ``fastvar_utils.masked_previous_scale_cache`` and the FastVAR blocks):

* **PTS** (Pivotal Token Selection). Before each sub-layer (attention, cross-attention, FFN) of a
  pruned block, every token of the scale's h×w map is scored by its distance to the map's mean, the
  DC component — a high-frequency proxy:  s_i = ‖x_i − mean_j x_j‖²,  with x the residual stream
  *before* the sub-layer's norm / AdaLN modulation. The ``L − int(L·r)`` highest-scoring tokens are
  kept (r: the scale's drop fraction), per batch row (the CFG halves choose separately), recomputed
  before every sub-layer on the current x.
* Only the kept tokens enter the sub-layer; attention computes queries, keys and values for them
  alone, so only their keys and values join the KV cache that later scales attend to.
* **CTR** (Cached Token Restoration). At the *cache scale* (the last dense scale before pruning
  starts) every sub-layer's dense output is cached, per block and sub-layer. At a pruned scale the
  cached map is resized to h×w (``F.interpolate(mode="area")``) and the kept tokens' new outputs
  are scattered into it: pruned positions receive the cached, resized update.
* A drop fraction of 1 skips the scale altogether (Infinity's last two scales): sampling ends and
  the image is decoded from the latent accumulated so far (skips must be trailing).
* Memory (not the outputs): the official code keeps the CTR cache until the next generation;
  varbench drops it when sampling ends, like the KV cache, so that it is not held through the decode.

Schedules (``schedule=``; drop fractions of the *last* scales, the cache scale just before them):
  * ``infinity`` (official Infinity-2B code): {0.4, 0.5, 1, 1} on the last four scales (32², 40²,
    48², 64² at 1024²), cache at the fifth-last (24²), blocks 3 … depth−5 (``range(3, 28)`` of 32);
  * ``hart`` (official HART code): {0.5, 0.75} on the last two scales (48², 64²), cache at 36², all
    blocks;
  * ``var``: class-conditional VAR has no official schedule; varbench uses HART's (the same AdaLN
    backbone) relative to the scale list: {0.5, 0.75} on the last two scales, cache at the third-last,
    all blocks (var-d16: 13², 16², cache 10²; tiny-var: 6², 8², cache 5²);
  * ``auto`` (default): the model family's own.
``drop=a/b/…`` replaces the fractions (applied to the last scales, "/"-separated), ``layers=all``
or ``layers=a:b`` (Python slice of block indices) the block range.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from bench.method import TokenMethod
from bench.models.policy import TokenPolicy, put_tokens_, take_tokens
from bench.registry import METHODS
from bench.spec import SpecError

# family -> (drop fractions of the last scales, block range)
PRESETS: Dict[str, Tuple[Tuple[float, ...], str]] = {
    "infinity": ((0.4, 0.5, 1.0, 1.0), "3:-4"),
    "hart": ((0.5, 0.75), "all"),
    "var": ((0.5, 0.75), "all"),
}


def parse_fractions(key: str, text: str, example: str) -> Tuple[float, ...]:
    """``"0.5/0.75"`` -> (0.5, 0.75): '/'-separated fractions, each in [0, 1] (a per-scale schedule)."""
    try:
        values = tuple(float(v) for v in str(text).split("/"))
    except ValueError:
        raise SpecError(f"{key}={text!r} must be '/'-separated fractions, e.g. {example}") from None
    if not values or any(not 0.0 <= r <= 1.0 for r in values):
        raise SpecError(f"{key}={text!r}: every fraction must be in [0, 1]")
    return values


def pts_score(x_BLC: torch.Tensor) -> torch.Tensor:
    """PTS: ‖x_i − mean_j x_j‖² per token [B, L], the distance to the map's mean (its DC component)."""
    return (x_BLC - x_BLC.mean(dim=1, keepdim=True)).square().sum(-1)


def parse_drop(text: str) -> Tuple[float, ...]:
    drop = parse_fractions("drop", text, "0.5/0.75")
    first_skip = next((i for i, r in enumerate(drop) if r == 1.0), len(drop))
    if any(r != 1.0 for r in drop[first_skip:]):
        raise SpecError(f"drop={text!r}: a fraction of 1 skips the scale, so only trailing scales may "
                        f"have 1 (every scale after a skipped one is skipped)")
    return drop


def parse_slice(text: str) -> Tuple[Optional[int], Optional[int]]:
    """``"3:-4"`` -> (3, -4); ``":"`` ends open."""
    try:
        a, b = (int(v) if v.strip() else None for v in text.split(":"))
    except ValueError:
        raise SpecError(f"layers={text!r} must be 'all' or a slice 'a:b' of block indices, e.g. 3:-4") from None
    return a, b


def parse_layers(text: str, depth: int) -> Tuple[int, ...]:
    if text == "all":
        return tuple(range(depth))
    blocks = tuple(range(depth)[slice(*parse_slice(text))])
    if not blocks:
        raise SpecError(f"layers={text!r} selects no block of {depth}")
    return blocks


class FastVARPolicy(TokenPolicy):
    """PTS + CTR on the scales of ``drop`` (absolute scale index -> drop fraction) in ``blocks``."""

    name = "fastvar"

    def __init__(self, drop_by_scale: Dict[int, float], cache_si: int, blocks: Sequence[int]):
        self.drop, self.cache_si, self.blocks = dict(drop_by_scale), cache_si, frozenset(blocks)
        self.cache: Dict[Tuple[str, int], torch.Tensor] = {}
        self.hw: Tuple[int, int] = (0, 0)
        self.cache_hw: Tuple[int, int] = (0, 0)

    def begin(self, batch: int, patch_nums) -> None:
        self.cache = {}

    def end(self) -> None:
        self.cache = {}   # the cache scale's outputs: not held through the decode (official keeps them)

    def begin_scale(self, si: int, pn) -> None:
        self.hw = tuple(pn) if isinstance(pn, (tuple, list)) else (pn, pn)
        if si == self.cache_si:
            self.cache_hw = self.hw

    def skip(self, si: int) -> bool:
        return self.drop.get(si, 0.0) == 1.0

    def sublayer(self, si, kind, block_idx, h_BLC, fn, x_BLC=None):
        if si == self.cache_si:   # CTR: the dense output of every sub-layer at the cache scale
            out_BLC = fn(h_BLC)
            self.cache[(kind, block_idx)] = out_BLC
            return out_BLC
        ratio = self.drop.get(si, 0.0)
        if ratio == 0.0 or block_idx not in self.blocks:
            return fn(h_BLC)
        B, L, _ = h_BLC.shape
        keep_Bl = self.pivotal(x_BLC if x_BLC is not None else h_BLC, L - int(L * ratio))
        h_BlC = take_tokens(h_BLC, keep_Bl)
        out_BlC = fn(h_BlC, keep_Bl=keep_Bl)
        return self.restore_cached(kind, block_idx, keep_Bl, out_BlC, L)

    @staticmethod
    def pivotal(x_BLC: torch.Tensor, n_keep: int) -> torch.Tensor:
        """PTS: indices [B, n_keep] of the tokens farthest from the map's mean (descending score)."""
        return pts_score(x_BLC).argsort(dim=1, descending=True)[:, :n_keep]

    def restore_cached(self, kind: str, block_idx: int, keep_Bl: torch.Tensor, out_BlC: torch.Tensor,
                       L: int) -> torch.Tensor:
        """CTR: the cache-scale output area-resized to this scale, the kept tokens' outputs scattered in."""
        cached_BLC = self.cache[(kind, block_idx)]
        B, C = out_BlC.shape[0], out_BlC.shape[-1]
        (hc, wc), (h, w) = self.cache_hw, self.hw
        # as the official unmerge: the token map [B, L, C] read as a channels-last [B, C, h, w] (no copy),
        # area-resized in that layout (so the result is already [B, L', C]), the kept outputs put in place
        base_BChw = F.interpolate(cached_BLC.reshape(B, hc, wc, C).permute(0, 3, 1, 2), size=(h, w), mode="area")
        base_BLC = base_BChw.permute(0, 2, 3, 1).reshape(B, h * w, C).to(out_BlC.dtype).contiguous()
        return put_tokens_(base_BLC, keep_Bl, out_BlC)


@METHODS.register("fastvar")
class FastVAR(TokenMethod):
    name = "fastvar"
    deviations = (
        "the cache holds each sub-layer's output before its residual gate γ and the block applies γ after "
        "restoration (official: cached after γ); γ is the same AdaLN vector at every scale of a generation, "
        "so the two differ only by float rounding",
        "schedules are relative to the model's scale list (official Infinity code keys them on the widths of "
        "the 1:1 1024² schedule and prunes no other aspect ratio)",
        "class-conditional VAR has no official FastVAR schedule: its var schedule is varbench's (HART's "
        "{50 %, 75 %} on the last two scales, all blocks)",
    )

    def __init__(self, **params):
        super().__init__(**params)
        try:   # a bad value fails when the spec is built, before any model is loaded
            if self.drop != "auto":
                parse_drop(self.drop)
            if self.layers not in ("auto", "all"):
                parse_slice(self.layers)
        except SpecError as e:
            raise SpecError(f"fastvar: {e}") from None

    def schedule_for(self, gen) -> Tuple[Dict[int, float], int, Tuple[int, ...], str]:
        family, blocks, hws = self.target(gen)
        preset = family if self.schedule == "auto" else self.schedule
        drop = PRESETS[preset][0] if self.drop == "auto" else parse_drop(self.drop)
        K = len(hws)
        if len(drop) >= K:
            raise SpecError(f"fastvar: drop={self.drop} prunes {len(drop)} scales but the model has {K}: "
                             f"at least one dense scale must come first (the cache scale)")
        try:
            layer_ids = parse_layers(PRESETS[preset][1] if self.layers == "auto" else self.layers, len(blocks))
        except SpecError as e:
            raise SpecError(f"fastvar ({preset} schedule): {e} (a model of {len(blocks)} blocks and {K} scales; "
                            f"give layers=all or layers=a:b, or schedule=var: the last two scales, all blocks)") from None
        drop_by_scale = {K - len(drop) + i: r for i, r in enumerate(drop)}
        return drop_by_scale, K - len(drop) - 1, layer_ids, preset

    def apply(self, gen, ctx):
        drop_by_scale, cache_si, layer_ids, preset = self.schedule_for(gen)
        gen.token_policy = FastVARPolicy(drop_by_scale, cache_si, layer_ids)
        hws = tuple(gen.scales_hw)
        sched = ", ".join(f"{hws[si][0]}×{hws[si][1]}: {r:g}" for si, r in drop_by_scale.items())
        span = f"blocks {layer_ids[0]}–{layer_ids[-1]}" if len(layer_ids) < len(gen.blocks) else "all blocks"
        ctx.notes.append(f"fastvar ({preset} schedule): drop {{{sched}}}, cache at "
                         f"{hws[cache_si][0]}×{hws[cache_si][1]}, {span}")
        return gen
