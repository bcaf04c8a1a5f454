"""How structured pruning is applied, separate from how units are scored (Torch-Pruning style).

Units are whole attention heads (the head's q, k, v rows of ``mat_qkv`` + its columns of ``proj``
+ its biases and ``scale_mul_1H11`` entry) and FFN channels (a row of ``fc1`` + a column of
``fc2``). Removing them changes only the block's inner sizes; the residual width C and AdaLN stay,
so a pruned model keeps the official key names and loads back with ``strict=True`` (its per-block
sizes are read from the shapes, ``bench.models.var.sizes_in``).
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Union

import torch
import torch.nn as nn

from bench.models.generator import Generator
from bench.models.var import AdaLNSelfAttn

SCHEDULES = ("uniform", "log")


def n_keep(total: int, sparsity: float, minimum: int = 1) -> int:
    """Units kept when ``sparsity`` of ``total`` are removed (rounded, at least ``minimum``)."""
    return max(minimum, total - int(round(sparsity * total)))


def _rows(lin: nn.Linear, idx: torch.Tensor) -> nn.Linear:
    new = nn.Linear(lin.in_features, len(idx), bias=lin.bias is not None, device=lin.weight.device,
                    dtype=lin.weight.dtype)
    new.weight.data.copy_(lin.weight.data[idx])
    if lin.bias is not None:
        new.bias.data.copy_(lin.bias.data[idx])
    return new


def _cols(lin: nn.Linear, idx: torch.Tensor) -> nn.Linear:
    new = nn.Linear(len(idx), lin.out_features, bias=lin.bias is not None, device=lin.weight.device,
                    dtype=lin.weight.dtype)
    new.weight.data.copy_(lin.weight.data[:, idx])
    if lin.bias is not None:
        new.bias.data.copy_(lin.bias.data)
    return new


@torch.no_grad()
def keep_heads(block: AdaLNSelfAttn, heads: torch.Tensor) -> None:
    attn = block.attn
    heads = heads.sort().values
    c, HC = attn.c, attn.H * attn.c
    dims = (heads[:, None] * c + torch.arange(c, device=heads.device)).flatten()               # kept dims in [0, H·c)
    attn.mat_qkv = _rows(attn.mat_qkv, torch.cat((dims, dims + HC, dims + 2 * HC)))   # [q | k | v] layout
    attn.q_bias = nn.Parameter(attn.q_bias.data[dims].clone())
    attn.v_bias = nn.Parameter(attn.v_bias.data[dims].clone())
    attn.zero_k_bias = attn.zero_k_bias[dims].clone()
    if attn.l2_norm:
        attn.scale_mul_1H11 = nn.Parameter(attn.scale_mul_1H11.data[:, heads].clone())
    attn.proj = _cols(attn.proj, dims)
    attn.H = len(heads)


@torch.no_grad()
def keep_channels(block: AdaLNSelfAttn, channels: torch.Tensor) -> None:
    channels = channels.sort().values
    block.ffn.fc1 = _rows(block.ffn.fc1, channels)
    block.ffn.fc2 = _cols(block.ffn.fc2, channels)


def sync_config(gen: Generator) -> None:
    """Write the blocks' actual sizes back into the config (after physical pruning)."""
    blocks = gen.var.blocks
    gen.var.cfg = gen.var.cfg.replace(heads=tuple(b.attn.H for b in blocks),
                                      ffn_hidden=tuple(b.ffn.fc1.out_features for b in blocks))


def block_sparsities(depth: int, sparsity: float, schedule: str = "uniform") -> List[float]:
    """The sparsity of every block.

    ``uniform``: ``sparsity`` in every block. ``log``: SlimGPT's Incremental Pruning Ratio, a
    log-increasing schedule s_j ∝ ln(1 + j) over blocks j = 0..depth−1 (block 0 unpruned, deeper blocks
    pruned more), scaled so that the mean over blocks equals ``sparsity`` (SlimGPT fixes s_min/s_max
    instead; the mean is what makes two methods comparable at one nominal sparsity). Each s_j is
    capped at 0.95; the excess is spread over the other blocks.
    """
    if schedule == "uniform" or depth == 1:
        return [float(sparsity)] * depth
    if schedule != "log":
        raise ValueError(f"unknown sparsity schedule {schedule!r}; expected one of {SCHEDULES}")
    shape = [math.log(1 + j) for j in range(depth)]
    total, cap = sparsity * depth, 0.95
    out = [0.0] * depth
    free = list(range(depth))
    while free:   # water-filling: scale the free blocks, cap the ones that exceed the cap
        w = sum(shape[j] for j in free)
        left = total - sum(out[j] for j in range(depth) if j not in free)
        if w == 0:
            break
        over = [j for j in free if left * shape[j] / w > cap]
        if not over:
            for j in free:
                out[j] = left * shape[j] / w
            break
        for j in over:
            out[j] = cap
            free.remove(j)
    return out


def _per_block(sparsity: Union[float, Sequence[float]], depth: int) -> List[float]:
    return [float(sparsity)] * depth if isinstance(sparsity, (int, float)) else [float(s) for s in sparsity]


def prune_by_scores(gen: Generator, head_scores: Dict[int, torch.Tensor], channel_scores: Dict[int, torch.Tensor],
                    sparsity: Union[float, Sequence[float]], layers: Optional[Sequence[int]] = None) -> Generator:
    """In every block remove the ``sparsity`` fraction (one number, or one per block) of heads and of
    FFN channels with the lowest scores (higher score = more important)."""
    per_block = _per_block(sparsity, len(gen.var.blocks))
    for i in layers if layers is not None else range(len(gen.var.blocks)):
        b = gen.var.blocks[i]
        hs, cs = head_scores[i], channel_scores[i]
        keep_heads(b, hs.topk(n_keep(len(hs), per_block[i])).indices)
        keep_channels(b, cs.topk(n_keep(len(cs), per_block[i])).indices)
    sync_config(gen)
    return gen


def index_scores(gen: Generator):
    """Descending scores by position (sizes-only pruning keeps the first units)."""
    heads = {i: -torch.arange(b.attn.H, dtype=torch.float) for i, b in enumerate(gen.var.blocks)}
    channels = {i: -torch.arange(b.ffn.fc1.out_features, dtype=torch.float) for i, b in enumerate(gen.var.blocks)}
    return heads, channels
