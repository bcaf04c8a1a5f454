"""magnitude: structured pruning by weight magnitude (training-free, no calibration data).

Definition used here (EVAR Tab. 2 baseline "Magnitude"): the importance of a unit is the Lp norm of
all weights that are removed with it —
  * attention head h of a block: its 3·c rows of ``mat_qkv`` (q, k, v) and its c columns of ``proj``;
  * FFN channel j: row j of ``fc1`` and column j of ``fc2``.
Default p = 2 over these coupled slices: the sum of squares of every coupled weight. Torch-Pruning's
``GroupMagnitudeImportance(p=2)`` ranks the units of a block alike: its ``group_reduction="mean"``
divides by the group's layer count and its ``normalizer="mean"`` by the block's mean score, factors
common to every unit of a block.
Sparsity is uniform over blocks: every block loses ``round(sparsity·H)`` heads and
``round(sparsity·F)`` FFN channels with the lowest norms; the model becomes physically smaller.

Variants (constructor arguments): ``norm=l1|l2``; ``scope=coupled|out`` — ``out`` scores only the
``proj``/``fc2`` columns with the chosen norm, which with ``norm=l1`` is EVAR-code's
``magnitude_prune`` (the L1 norm of each unit's ``proj``/``fc2`` input columns).
"""
import torch

from bench.method import StructuredPruner
from bench.registry import METHODS


def _norm(w: torch.Tensor, dim: int, p: int) -> torch.Tensor:
    return w.abs().sum(dim) if p == 1 else w.square().sum(dim)   # p=2: squared norm, same ranking


@METHODS.register("magnitude")
class Magnitude(StructuredPruner):
    name = "magnitude"
    deviations = ("heads and FFN channels scored by the L2 norm of all their coupled weights (qkv rows + proj "
                  "columns; fc1 row + fc2 column); EVAR-code's baseline uses L1 of proj/fc2 columns only "
                  "(variant norm=l1,scope=out)",)

    @torch.no_grad()
    def scores(self, gen, ctx=None):
        p = 1 if self.norm == "l1" else 2
        heads, channels = {}, {}
        for i, b in enumerate(gen.var.blocks):
            H, c = b.attn.H, b.attn.c
            proj_H = _norm(b.attn.proj.weight.view(-1, H, c), (0, 2), p)
            fc2_F = _norm(b.ffn.fc2.weight, 0, p)
            if self.scope == "coupled":
                qkv_H = _norm(b.attn.mat_qkv.weight.view(3, H, c, -1), (0, 2, 3), p)
                proj_H = proj_H + qkv_H
                fc2_F = fc2_F + _norm(b.ffn.fc1.weight, 1, p)
            heads[i], channels[i] = proj_H, fc2_F
        return heads, channels
