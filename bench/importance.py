"""Gradient and curvature signals of the task loss, for importance-scored structured pruning
(``taylor``, ``llm-pruner``, ``oba``).

The task loss is ``gen.loss``: the mean token cross-entropy of the teacher-forced token pyramid,
VAR's training loss, computed in eval mode (``VAR.forward`` drops class labels only in training
mode, so calibration is deterministic and uses the true class).

What is differentiated: the *prunable* weights of every block (``PRUNABLE``): the weights that are
removed with a head or an FFN channel (``bench.prune``). ``scale_mul_1H11`` is removed with its head
as well but is not scored: it is a log-temperature, so "setting it to zero" is not a removal, and
once a head's v rows and proj columns are gone its temperature no longer matters. ``proj.bias`` and
``fc2.bias`` stay in the pruned model and belong to no unit.

Conventions (each function says which it uses):

* ``batch_grads`` yields, per calibration batch, the gradient of that batch's mean CE; ``mean_grad``
  combines them weighted by batch size, i.e. the gradient of the mean CE over all calibration
  images (every image has the same L tokens), independent of the batch size.
* ``fisher_diag``: the mean over batches of the squared batch gradient (with batch 1: the empirical
  Fisher diagonal over samples, as LLM-Pruner's ``acc_grad``).
* ``batch_hvps`` yields (g, Hv) per batch with v = the prunable weights themselves (δθ = θ), Hv by
  double backward (Pearlmutter's exact Hessian-vector product). The fused attention kernel has no
  double backward (on CPU: "derivative for aten::_scaled_dot_product_flash_attention_for_cpu_backward
  is not implemented"), so ``F.scaled_dot_product_attention`` runs on its math backend there, on
  every device: the same function, composed of twice-differentiable ops.
* ``unit_sums`` reduces element-wise importances (shaped like the parameters) onto units: a head
  sums its q, k, v rows of ``mat_qkv``, its ``q_bias``/``v_bias`` entries and its c columns of
  ``proj``; an FFN channel sums its ``fc1`` row, ``fc1.bias`` entry and ``fc2`` column.

``differentiating`` sets requires_grad on exactly the prunable weights for the duration and
restores every flag afterwards; ``.grad`` is cleared and the model is left in eval mode.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Dict, Iterator, List, Sequence, Tuple

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from tqdm.auto import tqdm

from bench.models.generator import Generator

# The weights removed with a unit, as names inside a block (``AdaLNSelfAttn``).
PRUNABLE = ("attn.mat_qkv.weight", "attn.q_bias", "attn.v_bias", "attn.proj.weight",
            "ffn.fc1.weight", "ffn.fc1.bias", "ffn.fc2.weight")

Blockwise = List[Dict[str, torch.Tensor]]           # per block: name in PRUNABLE → tensor like the weight
Batch = Tuple[torch.Tensor, List[torch.Tensor]]      # (labels [B], token pyramid: list of [B, pn²])


def prunable(gen: Generator) -> Blockwise:
    return [{k: b.get_parameter(k) for k in PRUNABLE} for b in gen.var.blocks]


def _flat(blockwise: Blockwise) -> List[torch.Tensor]:
    return [t for d in blockwise for t in d.values()]


def _unflat(flat: Sequence[torch.Tensor], like: Blockwise) -> Blockwise:
    it = iter(flat)
    return [{k: next(it) for k in d} for d in like]


def calib_data(ctx, n: int, who: str) -> Batch:
    if ctx.data is None:
        raise ValueError(f"{who} needs calibration data: the bench provides none (Context.data)")
    return ctx.data(n, "calib")


def split(data: Batch, batch: int, device: torch.device) -> List[Batch]:
    """Consecutive batches of at most ``batch`` images, on ``device``."""
    labels, tokens = data
    return [(labels[i:i + batch].to(device), [t[i:i + batch].to(device) for t in tokens])
            for i in range(0, len(labels), batch)]


@contextmanager
def differentiating(gen: Generator, params: Blockwise):
    flags = [(p, p.requires_grad) for p in gen.parameters()]
    gen.eval()
    for p, _ in flags:
        p.requires_grad_(False)
    for p in _flat(params):
        p.requires_grad_(True)
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
            p.grad = None
        gen.eval()


def _bar(batches: List[Batch], desc: str, progress: bool):
    return tqdm(batches, desc=desc, disable=not progress, leave=False)


def batch_grads(gen: Generator, params: Blockwise, batches: List[Batch], desc: str = "gradients",
                progress: bool = False) -> Iterator[Tuple[float, Blockwise]]:
    """(weight = B_b / n, gradient of batch b's mean CE) for every batch; weights sum to 1."""
    n = sum(len(lab) for lab, _ in batches)
    flat = _flat(params)
    with differentiating(gen, params):
        for labels, tokens in _bar(batches, desc, progress):
            g = torch.autograd.grad(gen.loss(labels, tokens), flat)
            yield len(labels) / n, _unflat([t.detach() for t in g], params)


def mean_grad(gen: Generator, params: Blockwise, batches: List[Batch], progress: bool = False) -> Blockwise:
    """Gradient of the mean CE over all calibration images."""
    acc = [{k: torch.zeros_like(p) for k, p in d.items()} for d in params]
    for w, g in batch_grads(gen, params, batches, "gradient", progress):
        for a, gb in zip(acc, g):
            for k in a:
                a[k].add_(gb[k], alpha=w)
    return acc


def fisher_diag(gen: Generator, params: Blockwise, batches: List[Batch], progress: bool = False) -> Blockwise:
    """Mean over batches of the squared batch gradient, weighted by batch size (batch 1: per sample)."""
    acc = [{k: torch.zeros_like(p) for k, p in d.items()} for d in params]
    for w, g in batch_grads(gen, params, batches, "fisher", progress):
        for a, gb in zip(acc, g):
            for k in a:
                a[k].add_(gb[k].square(), alpha=w)
    return acc


def batch_hvps(gen: Generator, params: Blockwise, batches: List[Batch], progress: bool = False
               ) -> Iterator[Tuple[float, Blockwise, Blockwise]]:
    """(weight = B_b / n, g, Hθ) per batch: g the gradient of batch b's mean CE and Hθ its exact Hessian
    (restricted to the prunable weights) times the vector of the prunable weights themselves."""
    n = sum(len(lab) for lab, _ in batches)
    flat = _flat(params)
    theta = [p.detach() for p in flat]     # the direction: a constant, not differentiated
    with differentiating(gen, params), sdpa_kernel([SDPBackend.MATH]):
        for labels, tokens in _bar(batches, "hessian-vector products", progress):
            g = torch.autograd.grad(gen.loss(labels, tokens), flat, create_graph=True)
            g_dot_theta = sum((gi * ti).sum() for gi, ti in zip(g, theta))
            h_theta = torch.autograd.grad(g_dot_theta, flat)
            yield len(labels) / n, _unflat([t.detach() for t in g], params), _unflat(h_theta, params)


def zero_scores(gen: Generator) -> Tuple[Dict[int, torch.Tensor], Dict[int, torch.Tensor]]:
    """float64 accumulators for per-block head and channel scores (sums over calibration batches)."""
    blocks, dev = gen.var.blocks, gen.device
    return ({i: torch.zeros(b.attn.H, dtype=torch.float64, device=dev) for i, b in enumerate(blocks)},
            {i: torch.zeros(b.ffn.fc1.out_features, dtype=torch.float64, device=dev) for i, b in enumerate(blocks)})


def unit_sums(block, elem: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Element-wise importances (one tensor per name in PRUNABLE) summed onto the block's units:
    (heads [H], channels [F]), in float64 (tens of thousands of terms per head)."""
    H, c = block.attn.H, block.attn.c
    e = {k: v.double() for k, v in elem.items()}
    qkv_3HcC = e["attn.mat_qkv.weight"].view(3, H, c, -1)          # rows in [q | k | v] layout
    proj_CHc = e["attn.proj.weight"].view(-1, H, c)                # a head's c input columns
    heads_H = (qkv_3HcC.sum((0, 2, 3)) + e["attn.q_bias"].view(H, c).sum(1) + e["attn.v_bias"].view(H, c).sum(1)
               + proj_CHc.sum((0, 2)))
    channels_F = e["ffn.fc1.weight"].sum(1) + e["ffn.fc1.bias"] + e["ffn.fc2.weight"].sum(0)
    return heads_H, channels_F
