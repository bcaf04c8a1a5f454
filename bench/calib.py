"""Streaming block-by-block calibration for layer-wise (OBS) pruning, and the Hessian accumulator.

Layer-wise pruning (SlimGPT, EVAR) prunes block i on the inputs it sees *after* blocks 0..i−1 have
been pruned. ``Stream`` rebuilds those inputs batch by batch: the teacher-forced block-0 input of a
batch (exactly as ``VAR.forward`` builds it: start tokens = class embedding + ``pos_start``, the
other scales = ``word_embed`` of the VQVAE's next-scale inputs, + ``lvl_pos``; the condition is the
TRUE class, eval mode, no label dropout), run through the (already pruned) blocks 0..i−1 under the
block-causal mask, then through block i with forward pre-hooks on the layers whose inputs are
wanted. No activation is kept between calls (only the VQVAE's small [n, L−1, Cvae] teacher-forcing
inputs): memory is O(batch) and the cost is O(depth²) block passes
(EVAR's "memory-efficient streaming pipeline"; EVAR-code, like SlimGPT, keeps the current block's
activations of every calibration image instead).

``Hessian`` accumulates H_DD = E[x xᵀ] of one linear layer's inputs x ∈ R^D in one of two forms:

* flat (``weights=None``; SlimGPT / EVAR-code, ``calib=concat``): H = (2/N) Σ_t x_t x_tᵀ over all N
  tokens of all scales. (SlimGPT's N counts sequences, not tokens: a constant factor L, which changes
  neither OBS scores' order, nor the relative damping, nor the compensation.)
* per scale (``weights`` = w_0..w_{K−1}; EVAR's Pyramid-Aware Hessian, paper Sec. 3 "Pyramid-Aware
  OBS"): H = Σ_i (w_i / N_i) X_iᵀ X_i, with X_i the N_i tokens of scale i. Every image contributes
  exactly pn_i² tokens to scale i, so N_i = n_images·pn_i² and one D×D sum suffices:
  H = (1/n_images) Σ_images Σ_i (w_i / pn_i²) X_iᵀX_i. A one-hot w is the single-scale Hessian
  (``calib=first|fifth|last``); scales with w_i = 0 are not even multiplied.

The damping λI of the paper's H_pa is added by the pruner (``bench.obs``), not here.

Precision: every batch's Gram matrix is computed in float32 and summed into a float64 accumulator,
normalised once at the end (no running mean is needed in float64; SlimGPT keeps a float32 running
mean).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from tqdm.auto import tqdm

from bench.models.generator import Generator

CALIB_MODES = ("first", "fifth", "last", "concat", "pyramid")
DECAYS = ("linear", "exp", "none")
SINGLE_SCALE = {"first": 0, "fifth": 4, "last": -1}    # EVAR Tab. 3: scale index used alone


def decay_weights(K: int, decay: str = "linear") -> List[float]:
    """Per-scale weights w_0..w_{K−1} of the pyramid Hessian (coarse scales weigh more).

    ``linear``: 2.0 → 0.2 in equal steps (for K = 10 exactly EVAR-code's PSAD ``scale_weights``
    2.0, 1.8, …, 0.2, the only per-scale decay the authors published). ``exp``: geometric between the
    same end points, w_i = 2.0·0.1^(i/(K−1)). ``none``: w_i = 1 (token-count normalisation only)."""
    if decay not in DECAYS:
        raise ValueError(f"unknown decay {decay!r}; expected one of {DECAYS}")
    if decay == "none" or K == 1:
        return [1.0 if decay == "none" else 2.0] * K
    t = [i / (K - 1) for i in range(K)]
    if decay == "linear":
        return [2.0 - 1.8 * ti for ti in t]
    return [2.0 * 0.1 ** ti for ti in t]


def scale_weights(calib: str, K: int, decay: str = "linear") -> Optional[List[float]]:
    """The ``Hessian`` weights of a calibration mode: None (flat) for ``concat``, one-hot for a single
    scale, ``decay_weights`` for ``pyramid``."""
    if calib == "concat":
        return None
    if calib == "pyramid":
        return decay_weights(K, decay)
    if calib not in SINGLE_SCALE:
        raise ValueError(f"unknown calibration mode {calib!r}; expected one of {CALIB_MODES}")
    k = SINGLE_SCALE[calib] % K
    if calib == "fifth" and K < 5:
        raise ValueError(f"calib=fifth needs at least 5 scales, the model has {K}")
    return [1.0 if i == k else 0.0 for i in range(K)]


class Hessian:
    """Accumulates H_DD of a layer's inputs x_BLD (token positions split by ``begin_ends``).

    Both forms are one weighted Gram matrix per batch, Σ_t c_t x_t x_tᵀ with a per-position
    coefficient c_t (flat: 2; per scale: w_i / pn_i² for the tokens of scale i), computed as X̃ᵀX̃ with
    X̃ = √c ⊙ X in a single matmul; positions with c_t = 0 are left out before the product."""

    def __init__(self, dim: int, begin_ends: Sequence[Tuple[int, int]], weights: Optional[Sequence[float]] = None,
                 device=None):
        if weights is not None and (len(weights) != len(begin_ends) or min(weights) < 0):
            raise ValueError(f"need {len(begin_ends)} non-negative scale weights, got {weights}")
        self.flat = weights is None
        coef_L = torch.cat([torch.full((e - b,), 2.0 if self.flat else float(w) / (e - b))
                            for (b, e), w in zip(begin_ends, weights or [0.0] * len(begin_ends))])
        self.pos_l = coef_L.nonzero().flatten().to(device)      # positions that count
        self.sqrt_coef_l1 = coef_L[coef_L != 0].sqrt().view(-1, 1).to(device)
        self.L = len(coef_L)
        self.sum_DD = torch.zeros(dim, dim, dtype=torch.float64, device=device)
        self.n_images = self.n_tokens = 0

    @torch.no_grad()
    def add(self, x_BLD: torch.Tensor) -> None:
        B, L, D = x_BLD.shape
        if L != self.L:
            raise ValueError(f"inputs have {L} positions, the pyramid has {self.L}")
        x_BlD = x_BLD.detach().float()
        if len(self.pos_l) != L:
            x_BlD = x_BlD[:, self.pos_l]
        x_ND = (x_BlD * self.sqrt_coef_l1).reshape(-1, D)
        self.sum_DD += (x_ND.T @ x_ND).double()
        self.n_images += B
        self.n_tokens += B * L

    @property
    def H(self) -> torch.Tensor:
        """H_DD in float64: (2/N) Σ x xᵀ (flat) or Σ_i (w_i / N_i) X_iᵀX_i, N_i = n_images·pn_i²."""
        if self.n_images == 0:
            raise ValueError("no calibration data was added")
        return self.sum_DD / (self.n_tokens if self.flat else self.n_images)


@torch.no_grad()
def block0_inputs(gen: Generator, labels_B: torch.Tensor, tokens: Sequence[torch.Tensor],
                  x_BLCv: Optional[torch.Tensor] = None):
    """(x_BLC, cond_BD): the first block's teacher-forced input as ``VAR.forward`` builds it, with the
    true class (no label dropout). ``x_BLCv``: the VQVAE's next-scale inputs of ``tokens`` if known."""
    var = gen.var
    B = labels_B.shape[0]
    cond_BD = var.cond(labels_B)
    sos_BlC = cond_BD.unsqueeze(1).expand(B, var.first_l, -1) + var.pos_start.expand(B, -1, -1)
    if x_BLCv is None:
        x_BLCv = gen.vae.quantize.idx_to_var_input(tokens)
    x_BLC = torch.cat((sos_BlC, var.word_embed(x_BLCv.float())), dim=1) + var.lvl_pos()
    return x_BLC, cond_BD


class _Stop(Exception):
    """Raised by a hook once the last wanted input is captured: the rest of the block is skipped."""


class Stream:
    """Calibration images fed block by block through the current (partly pruned) generator."""

    def __init__(self, gen: Generator, labels: torch.Tensor, tokens: Sequence[torch.Tensor], batch: int = 32,
                 progress: bool = False, desc: str = "calibrate"):
        self.gen, self.labels, self.tokens = gen, labels, list(tokens)
        self.batch, self.progress, self.desc = int(batch), progress, desc
        self._vq_in: List[torch.Tensor] = []   # per batch: the VQVAE's teacher-forcing input [B, L−1, Cvae]

    def __len__(self) -> int:
        return len(self.labels)

    @torch.no_grad()
    def block_inputs(self, i: int):
        """Yields (x_BLC, cond) per batch: block i's input and the AdaLN condition (after the shared
        AdaLN, if any) — recomputed through blocks 0..i−1 as they are now."""
        var, dev = self.gen.var, self.gen.device
        for k, s in enumerate(range(0, len(self.labels), self.batch)):
            labels_B = self.labels[s:s + self.batch].to(dev)
            if k == len(self._vq_in):   # the VQVAE's part does not change with pruning: computed once
                tokens = [t[s:s + self.batch].to(dev) for t in self.tokens]
                self._vq_in.append(self.gen.vae.quantize.idx_to_var_input(tokens))
            x_BLC, cond_BD = block0_inputs(self.gen, labels_B, (), self._vq_in[k])
            cond = var.shared_ada_lin(cond_BD)
            for b in var.blocks[:i]:
                x_BLC = b(x_BLC, cond, var.attn_bias_for_masking)
            yield x_BLC, cond

    @torch.no_grad()
    def collect(self, i: int, layers: Dict[str, nn.Module], weights: Optional[Sequence[float]] = None,
                stop: Optional[str] = None) -> Dict[str, torch.Tensor]:
        """H_DD (float64) of the inputs of each named layer of block i over all calibration images.

        ``stop``: the name of the layer after whose input nothing of block i is needed (its own
        output included), e.g. ``proj`` when only the attention is calibrated."""
        var = self.gen.var
        was_training = var.training
        var.eval()   # no dropout, no drop path: the pass is deterministic
        acc = {n: Hessian(m.in_features, var.begin_ends, weights, self.gen.device) for n, m in layers.items()}

        def hook(name):
            def fn(_module, inputs):
                acc[name].add(inputs[0])
                if name == stop:
                    raise _Stop
            return fn

        handles = [m.register_forward_pre_hook(hook(n)) for n, m in layers.items()]
        n_batches = -(-len(self.labels) // self.batch)
        try:
            for x_BLC, cond in tqdm(self.block_inputs(i), total=n_batches, disable=not self.progress, leave=False,
                                    desc=f"{self.desc} block {i} ({'+'.join(layers)})"):
                try:
                    var.blocks[i](x_BLC, cond, var.attn_bias_for_masking)
                except _Stop:
                    pass
        finally:
            for h in handles:
                h.remove()
            var.train(was_training)
        return {n: a.H for n, a in acc.items()}
