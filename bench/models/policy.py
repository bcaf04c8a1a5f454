"""Per-scale token policies: the hook that token methods (FastVAR, LazyVAR, StepVAR, ToMe) plug into.

During sampling, every block's attention and FFN sub-layer is called through
``policy.sublayer(si, kind, block_idx, h_BLC, fn, x_BLC)``: ``h_BLC`` is the sub-layer's input (after
its norm / AdaLN modulation), ``x_BLC`` the residual stream the block holds before that sub-layer
(what FastVAR scores), ``fn`` the sub-layer, whose output (before the residual gate γ) is returned.
The default splits that call into the three steps of the token-policy contract
(docs/architecture.md) — ``select`` the tokens to compute (None = all), run ``fn`` on the kept
tokens only, ``restore`` a full-length output — so a method overrides only the step it changes and
no model file is edited. Attention run on kept tokens appends only their keys and values to the KV
cache: later scales attend to what was computed. ``skip(si)`` ends sampling before scale ``si``
(trailing scales only; the image is decoded from the latent accumulated so far). ``begin`` and
``end`` bracket each sampling call; ``end`` releases what the policy held for later scales.

``fn(h_BlC, keep_Bl=...)`` runs the sub-layer on a subset of the scale's tokens; ``keep_Bl`` [B, l]
are their positions in the scale's map (models with RoPE rotate them at those positions).

A policy may instead shorten a whole scale: ``enter_scale`` returns the tokens the block stack runs
on (every block, attention and KV cache included, sees only those), with their positions in
``scale_keep`` (None: all), and ``exit_scale`` returns the full-length map the head reads (StepVAR).
Both default to the identity. The identity policy computes every token and is bit-identical to having no
policy at all (tests/test_sampling.py).

A policy may also run several scales in one pass (``groups``: LazyVAR's parallel group decoding):
every scale of a group gets its input from the latent accumulated before the group, ``begin_group``
sees those inputs, and the block stack runs on the group's tokens with ``group_attn_bias`` (the
training mask within the group, every cached key visible). ``residual_keep`` makes the loop sample
only the kept tokens and give every other position a zero residual; ``observe`` shows the policy the
accumulated latent after each scale. The loops of VAR, Infinity and HART all call these hooks.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

import torch


class TokenPolicy:
    """Identity policy. Subclasses override ``select`` / ``restore`` (and the scale callbacks)."""

    name = "identity"
    scale_keep: Optional[torch.Tensor] = None   # positions [B, l] of the tokens enter_scale kept (None: all)

    def begin(self, batch: int, patch_nums) -> None:
        """Called once per sampling call, before scale 0."""

    def end(self) -> None:
        """Called once after sampling, also when it fails (as the KV cache is dropped): release the
        generation's activations held for later scales, so that they are not held through the decode."""

    def begin_scale(self, si: int, pn: int) -> None:
        """Called before the blocks run on scale ``si`` (a ``pn × pn`` token map)."""

    def enter_scale(self, si: int, x_BLC: torch.Tensor) -> torch.Tensor:
        """The scale's input to the block stack (default: all of it)."""
        return x_BLC

    def exit_scale(self, si: int, x_BlC: torch.Tensor) -> torch.Tensor:
        """The full-length output map from the block stack's output (default: unchanged)."""
        return x_BlC

    def end_scale(self, si: int, x_BLC: torch.Tensor) -> None:
        """Called with the last block's output of scale ``si``."""

    def skip(self, si: int) -> bool:
        """True: scale ``si`` and every later one are not computed."""
        return False

    def groups(self, n_scales: int) -> Sequence[Tuple[int, ...]]:
        """The scales, in order, as groups run through the block stack together (parallel group
        decoding, LazyVAR): every scale of a group gets its input from the latent accumulated *before*
        the group and its tokens attend to the earlier scales of the group with the training mask
        (``group_attn_bias``). Default: one scale at a time."""
        return [(si,) for si in range(n_scales)]

    def begin_group(self, group: Sequence[int], xs: Sequence[torch.Tensor]) -> None:
        """Called with a group's scale indices and their inputs to the block stack (full length, after
        ``begin_scale`` of each and before their ``enter_scale``)."""

    def residual_keep(self, si: int) -> Optional[torch.Tensor]:
        """Positions [B, l] (of the scale's map) whose residual is sampled from the block stack's output
        (which then holds those tokens only, in that order); every other position gets a zero residual
        (LazyVAR). None (default): every position is sampled from the full-length ``exit_scale`` map."""
        return None

    def observe(self, si: int, latent: torch.Tensor) -> None:
        """Called with the latent accumulated after scale ``si`` was added (VAR: f_hat [B, C, H, W];
        Infinity: the summed codes [B, d, 1, H, W]); read only."""

    def select(self, si: int, kind: str, block_idx: int, h_BLC: torch.Tensor,
               x_BLC: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
        """Indices [B, l] of the tokens to compute, or None for all of them."""
        return None

    def restore(self, si: int, kind: str, block_idx: int, h_BLC: torch.Tensor, keep_Bl: torch.Tensor,
                out_BlC: torch.Tensor) -> torch.Tensor:
        """Full-length output from the kept tokens' output. Default: dropped tokens get zero update."""
        return scatter_kept(keep_Bl, out_BlC, h_BLC.shape[1])

    def sublayer(self, si: int, kind: str, block_idx: int, h_BLC: torch.Tensor,
                 fn: Callable[[torch.Tensor], torch.Tensor], x_BLC: Optional[torch.Tensor] = None) -> torch.Tensor:
        keep_Bl = self.select(si, kind, block_idx, h_BLC, x_BLC)
        if keep_Bl is None:
            return fn(h_BLC)
        h_BlC = take_tokens(h_BLC, keep_Bl)
        return self.restore(si, kind, block_idx, h_BLC, keep_Bl, fn(h_BlC, keep_Bl=keep_Bl))

    def route(self, si: int):
        """The ``route`` callable handed to the blocks for scale ``si``."""
        return lambda kind, block_idx, h, fn, x=None: self.sublayer(si, kind, block_idx, h, fn, x)


def _rows(idx_Bl: torch.Tensor, L: int) -> torch.Tensor:
    """Positions [B, l] in maps of length L -> row numbers [B·l] of the flattened [B·L, …] maps."""
    return (idx_Bl + torch.arange(idx_Bl.shape[0], device=idx_Bl.device).unsqueeze(1) * L).reshape(-1)


def take_tokens(x_BL: torch.Tensor, idx_Bl: torch.Tensor) -> torch.Tensor:
    """``x[b, idx[b, j]]`` for every row b: [B, l, …], what ``gather`` along dim 1 with the index
    expanded over the channels gives, as whole rows of the flattened map (``index_select``: one
    contiguous copy per token, 2–4× faster than that gather on a CPU at these sizes; same values)."""
    B, L, rest = x_BL.shape[0], x_BL.shape[1], x_BL.shape[2:]
    return x_BL.reshape(B * L, *rest).index_select(0, _rows(idx_Bl, L)).view(B, idx_Bl.shape[1], *rest)


def put_tokens_(base_BL: torch.Tensor, idx_Bl: torch.Tensor, src_Bl: torch.Tensor) -> torch.Tensor:
    """``base[b, idx[b, j]] = src[b, j]`` in place (``base`` contiguous; positions unique per row) and
    ``base`` returned: ``scatter_`` along dim 1, as whole rows (``index_copy_``; same values)."""
    B, L, rest = base_BL.shape[0], base_BL.shape[1], base_BL.shape[2:]
    base_BL.view(B * L, *rest).index_copy_(0, _rows(idx_Bl, L), src_Bl.reshape(-1, *rest).to(base_BL.dtype))
    return base_BL


def scatter_kept(keep_Bl: torch.Tensor, src_Bl: torch.Tensor, L: int, fill=0) -> torch.Tensor:
    """A full-length [B, L, …] tensor holding ``src`` [B, l, …] at the positions ``keep_Bl`` [B, l] and
    ``fill`` elsewhere."""
    return put_tokens_(src_Bl.new_full((src_Bl.shape[0], L, *src_Bl.shape[2:]), fill), keep_Bl, src_Bl)


def enter_group(policy: TokenPolicy, group: Sequence[int], inputs: Sequence[torch.Tensor], sizes: Sequence):
    """The policy's view of a group's full-length inputs (``begin_scale`` of each scale with its size,
    ``begin_group``, then ``enter_scale`` of each): (the tokens each scale runs, their positions or None)."""
    for si, size in zip(group, sizes):
        policy.begin_scale(si, size)
    policy.begin_group(group, inputs)
    xs, keeps = [], []
    for si, x_BLC in zip(group, inputs):
        xs.append(policy.enter_scale(si, x_BLC))
        keeps.append(policy.scale_keep)
    return xs, keeps


def run_group(xs: Sequence[torch.Tensor], cached: int, run: Callable) -> list:
    """The block stack's outputs for a group's tokens: ``run(x_BLC, attn_bias)`` once, on every scale of
    the group concatenated, under ``group_attn_bias`` (a single scale: no mask, as the plain loop; no
    token at all: nothing runs). ``cached``: how many keys the KV cache holds before the group."""
    lens = [x.shape[1] for x in xs]
    if not sum(lens):
        return list(xs)
    if len(xs) == 1:
        return [run(xs[0], None)]
    return list(run(torch.cat(list(xs), dim=1), group_attn_bias(lens, cached, xs[0])).split(lens, dim=1))


def group_attn_bias(lens: Sequence[int], prior: int, like: torch.Tensor) -> torch.Tensor:
    """Additive mask [1, 1, Σlens, prior + Σlens] for a group of scales run in one pass with the KV
    cache: every cached key (earlier scales, ``prior`` of them) is visible, and within the group a
    token sees the tokens of its own and earlier scales only (the block-causal training mask)."""
    lvl_L = torch.cat([torch.full((n,), i, device=like.device) for i, n in enumerate(lens)])
    within = torch.zeros(len(lvl_L), len(lvl_L), dtype=like.dtype, device=like.device)
    within.masked_fill_(lvl_L[:, None] < lvl_L[None, :], -torch.inf)
    seen = torch.zeros(len(lvl_L), prior, dtype=like.dtype, device=like.device)
    return torch.cat((seen, within), dim=1).view(1, 1, len(lvl_L), prior + len(lvl_L))
