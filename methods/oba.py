"""oba: Optimal Brain Apoptosis (Sun et al., ICLR 2025, arXiv 2502.17941; NEU-REAL/OBA): structured
pruning by a second-order Taylor estimate of the loss change with Hessian-vector products.

Removing all pruned parameters is δθ = θ; per parameter i the importance is

    I_i = δ · g_i·θ_i + ½ · θ_i·(Hθ)_i

with g the gradient and H the Hessian of the task loss, ``delta`` = δ = 0 by default (OBA's
``--delta 0``: the first-order term is off). The task loss is VAR's mean token cross-entropy under
teacher forcing (``gen.loss``, eval mode, true class). A unit's score (as OBA's
``HessianImportance``, ``--normalizer max``): I_i summed over the unit (a head: its q, k, v rows of
``mat_qkv``, ``q_bias``/``v_bias`` entries, c columns of ``proj``; a channel: its ``fc1`` row and bias
entry, its ``fc2`` column), averaged over the calibration batches (weighted by size), then |·|,
then divided by the largest score of its kind in its block.

Hθ here is exact: H is the Hessian with respect to the prunable weights of all blocks (``mat_qkv``,
``q_bias``, ``v_bias``, ``proj``, ``fc1`` + bias, ``fc2``) and θ the vector of those weights, Hθ one
double backward per batch (``bench.importance.batch_hvps``; attention on the math SDPA backend:
the fused CPU kernel has no double backward). It therefore contains every block of the Hessian
restricted to those weights: within a layer, between the layers of a block, between blocks, with
all of its terms (the Gauss-Newton part Jᵀ∇²ℓJ through the cross-entropy, and the curvature of
GELU, LayerNorm/AdaLN, softmax and the cosine-attention normalisation).

OBA's released code assembles Hθ instead from per-layer pieces (``oba_pruner.py`` at 91e27b2, read,
not run): a recorded, detached module-output gradient ∂L/∂y times the mixed second derivative of a
product node, namely a linear layer's x·W ("series" connectivity: upward by a backward pass through the
layer's input, downward by JVP forward propagation of the perturbation) and attention's q·kᵀ and
softmax·v ("parallel" connectivity). As read, no term carries a second derivative of the loss or of
an element-wise op (the output gradients are constants; tangents pass through GELU, softmax and
normalisations by their first derivative), so OBA omits the Gauss-Newton and activation-curvature
part of every inter-layer block, and the diagonal block of each linear layer (∂²y/∂W² = 0) is
zero apart from the q–k and attention–v coupling inside a fused qkv layer. The paper's derivation
was not re-checked here.

Applies as ``magnitude``: every block loses ``round(sparsity·H)`` heads and ``round(sparsity·F)``
channels with the lowest scores; no compensation.

Deviations from OBA (also in ``deviations``):
* Hθ by exact double backward (above) instead of OBA's series/parallel assembly;
* δθ = θ only on the prunable block weights; embeddings, AdaLN, the head and the non-unit biases get
  δθ = 0 (OBA perturbs every hooked Linear/Conv not in ``ignored_layers``);
* one shot at the target sparsity, per-block ranking; OBA prunes iteratively to a global FLOPs
  target (50 steps of 350 batches each in ``prune_imagenet.py``), fine-tuning in between;
* group reduction: sum over the unit's slices (OBA: mean over the group's layers, a constant factor
  per block), q/v biases included (OBA scores only Linear/Conv weights and biases); the max
  normalisation (OBA: max + 1e-6) changes no per-block ranking;
* calibration: ``n_calib`` teacher-forced images of the bench's calibration split, no weight update.
"""
import torch

from bench.importance import batch_hvps, calib_data, prunable, split, unit_sums, zero_scores
from bench.method import StructuredPruner
from bench.registry import METHODS


@METHODS.register("oba")
class OBA(StructuredPruner):
    name = "oba"
    deviations = (
        "Hθ by exact double backward over the prunable block weights (every Hessian block and term); "
        "OBA assembles it from series/parallel pieces that omit the loss and activation curvature",
        "δθ = θ only on the prunable block weights (embeddings, AdaLN, head: δθ = 0)",
        "one-shot pruning with per-block ranking; OBA prunes iteratively to a global FLOPs target with "
        "fine-tuning in between",
        "unit scores summed over all coupled slices, q/v biases included (OBA: mean over the group's "
        "Linear layers, a constant factor per block)",
        "calibration: n_calib teacher-forced images of the bench's calibration split (OBA: training "
        "batches between pruning steps)",
    )

    def scores(self, gen, ctx):
        params = prunable(gen)
        batches = split(calib_data(ctx, self.n_calib, self.name), self.batch, gen.device)
        blocks = gen.var.blocks
        heads, channels = zero_scores(gen)
        for w, g, h_theta in batch_hvps(gen, params, batches, ctx.progress):
            for i, (b, p) in enumerate(zip(blocks, params)):
                elem = {}
                for k, theta in p.items():
                    theta = theta.detach()
                    elem[k] = 0.5 * theta * h_theta[i][k]
                    if self.delta:
                        elem[k] = elem[k] + self.delta * g[i][k] * theta
                h_H, c_F = unit_sums(b, elem)     # signed: averaged over batches before |·| (OBA)
                heads[i] += w * h_H
                channels[i] += w * c_F
        for scores in (heads, channels):
            for i, s in scores.items():
                s = s.abs()
                scores[i] = s / s.max().clamp_min(torch.finfo(s.dtype).tiny)
        ctx.notes.append(f"oba: delta={self.delta:g}, exact Hessian-vector products from {self.n_calib} "
                         f"calibration images in {len(batches)} batch(es) of ≤{self.batch}")
        return heads, channels
