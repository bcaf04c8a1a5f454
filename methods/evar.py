"""evar: EVAR's training-free structured pruning, Pyramid-Aware OBS (EVAR, ECCV 2026, Sec. 3; code
aden9460/EVAR-code ``model_Edging`` + ``OBS.struct_prune``).

What it does, block by block (layer-wise, on the inputs that the already pruned blocks produce):

1. Calibration (``bench.calib``): ``n_calib`` real images, tokenised by the model's VQVAE, fed with
   teacher forcing (all scales at once under the block-causal mask), batch by batch through blocks
   0..i−1 (already pruned). Hooks on ``attn.proj`` and ``ffn.fc2`` of block i collect both inputs'
   Hessians in ONE pass over the still dense block (as EVAR-code: fc2's Hessian predates the pruning
   of the heads; SlimGPT re-collects it).
2. The Hessian (``calib=pyramid``, the paper's Eq. for H_pa):
       H_pa = Σ_i (w_i / n_i) X^(i)ᵀ X^(i) + λI,
   n_i the scale-i tokens seen, w_i a decay weight favouring coarse scales, λ = percdamp·mean(diag H).
   Ablations (EVAR Tab. 3): ``first|fifth|last`` use the tokens of scale 0, 4 or K−1 only (the full
   pyramid is still run: later scales need earlier ones as context), ``concat`` the flat
   H = (2/N) Σ x xᵀ over all tokens, which is what EVAR-code accumulates up to a constant factor
   (its N counts calibration sequences, not tokens: no effect on scores, damping or compensation).
3. Heads: ``bench.obs.struct_prune`` on ``proj`` with headsize = head dim, as EVAR-code (its
   ``OBS.struct_prune`` is SlimGPT's): score(u) = Σ_{p∈u} ‖W_:,p‖² / d_p² with d the diagonal of the
   Cholesky factor of u's diagonal block of H⁻¹ (grouped Cholesky), one head per iteration, H reduced
   and re-inverted between heads, and the compensation of the remaining ``proj`` columns applied
   column by column through the Cholesky factor. The paper writes the one-shot form, score(u) =
   Σ_{p∈u} ‖W_:,p‖² / (H⁻¹)_pp and Δ = Σ_p W_:,p (H⁻¹)_p,: / (H⁻¹)_pp; the code is followed (a
   deviation from the paper's equations, listed below). The compensated ``proj`` is written, then the
   heads are removed physically (their q/k/v rows, biases and ``scale_mul`` entries go without
   compensation, as official).
4. FFN: ``struct_prune`` on ``fc2`` with headsize 1 and Dynamic Group Size batches (the paper's
   "dynamic grouped pruning ... progressively decreasing group sizes"), then ``fc1`` rows / ``fc2``
   columns removed.
5. The next block is calibrated through the pruned one.

Counts: round(H·s) heads and round(F·s) channels per block, Python round (VAR-d16 at 40%: 6 of 16
heads, 1638 of 4096 channels); ``schedule=log`` gives per-block s (``bench.prune.block_sparsities``).

Pyramid weights: the paper says only that w_i "assigns higher relative significance to early coarse
scales". Default ``decay=linear``: w_i from 2.0 (scale 0) to 0.2 (last scale) in equal steps, the only
per-scale decay the authors published (EVAR-code's PSAD scale weights 2.0, 1.8, …, 0.2 for VAR's 10
scales). ``decay=exp``: geometric between the same end points, w_i = 2·0.1^(i/(K−1)); ``decay=none``:
w_i = 1 (count normalisation only). Only ratios matter: a common factor changes nothing.

Deviations from the paper / EVAR-code (also in ``deviations``, i.e. table footnotes):

* the decay weights w_i are ours (above); EVAR-code's released pruning accumulates the flat Hessian
  (our ``calib=concat``), not H_pa;
* heads are scored and compensated as EVAR-code does (step 3: grouped-Cholesky diagonal, one head per
  iteration, sequential update), not by the paper's one-shot equations; FFN channels use (H⁻¹)_pp as
  the paper writes, in EVAR-code's shrinking batches;
* calibration conditions on the true class; EVAR-code leaves label dropout on while capturing the
  block-0 inputs, so ~10% of its calibration images get the null class at random;
* Hessians are float64 sums of float32 per-batch Gram matrices and the OBS loop runs in float64
  (EVAR-code: float32 running mean, float32 OBS): only near-ties can differ;
* streaming recomputes blocks 0..i−1 per batch instead of caching all activations, and feeds images in
  batches instead of one by one: the same statistics;
* ``schedule=log`` is rescaled to the requested mean sparsity (EVAR-code: s_min + (s_max − s_min)·
  ln(1+j)/ln 32);
* the single-scale ablations run the whole teacher-forced pyramid and keep only the chosen scale's
  tokens in H (the paper does not say how the other scales' context is provided).

Not deviations: q/k/v and fc1 rows are removed without compensation, proj/fc2 biases are kept, and
PSAD fine-tuning is a separate recovery method, all as in EVAR-code.
"""
from typing import Dict, List, Tuple

import torch

from bench.calib import Stream, scale_weights
from bench.method import StructuredPruner
from bench.obs import prune_channels, prune_heads
from bench.prune import sync_config
from bench.registry import METHODS


@METHODS.register("evar")
class EVAR(StructuredPruner):
    name = "evar"
    deviations = (
        "pyramid decay weights are ours (the paper gives none): linear 2.0→0.2 over the scales, EVAR-code's "
        "PSAD scale weights; the released EVAR-code accumulates the flat Hessian instead (calib=concat)",
        "heads scored and compensated as EVAR-code (SlimGPT's grouped-Cholesky diagonal, one head per iteration, "
        "H re-inverted between heads, sequential update), not by the paper's one-shot score and update equations",
        "calibration uses the true class label; EVAR-code leaves label dropout on, so ~10% of calibration "
        "images get the null class at random",
        "Hessians summed in float64 (float32 per-batch Gram matrices) and OBS done in float64; EVAR-code "
        "keeps a float32 running mean and prunes in float32",
        "calibration images are fed in batches through already pruned blocks recomputed per block "
        "(streaming); EVAR-code feeds one image at a time and caches every image's activations — the "
        "statistics are the same",
        "schedule=log is SlimGPT's log-increasing per-block sparsity rescaled to the requested mean "
        "(EVAR-code: s_min + (s_max − s_min)·ln(1+j)/ln 32)",
        "calib=first|fifth|last run the whole teacher-forced pyramid and keep only that scale's tokens in the "
        "Hessian (the paper does not say how the other scales' context is provided)",
    )

    def calib_weights(self, K: int):
        return scale_weights(self.calib, K, self.decay)

    @torch.no_grad()
    def prune(self, gen, ctx, sparsities: List[float]):
        labels, tokens = ctx.data(self.n_calib, "calib")
        weights = self.calib_weights(len(gen.patch_nums))
        stream = Stream(gen, labels, tokens, self.batch, ctx.progress, desc=self.name)
        self.pruned: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}
        for i, (block, s) in enumerate(zip(gen.var.blocks, sparsities)):
            if s == 0:
                continue
            # one pass over the dense block for both Hessians (EVAR-code)
            H = stream.collect(i, {"proj": block.attn.proj, "fc2": block.ffn.fc2}, weights, stop="fc2")
            heads = prune_heads(block, H["proj"], s, self.percdamp, self.compensate)
            channels = prune_channels(block, H["fc2"], s, self.percdamp, self.compensate)
            self.pruned[i] = (heads, channels)
        sync_config(gen)
        ctx.notes.append(f"{self.name}: calibrated on {len(stream)} images (calib={self.calib}, decay={self.decay}, "
                         f"compensate={self.compensate})")
        return gen
