"""slimgpt: SlimGPT (Ling et al., NeurIPS 2024, arXiv 2412.18110) applied to VAR: layer-wise
structured OBS pruning with Batched Greedy Pruning and the Incremental Pruning Ratio.

Per block, sequentially (SlimGPT's ``[["self_attn.o_proj"], ["mlp.down_proj"]]``):

1. The Hessian of ``attn.proj``'s input (VAR's o_proj) is collected over the calibration images
   with every token of every scale flattened into one sequence: H = (2/N) Σ_t x_t x_tᵀ (Sec. 3.1;
   ``bench.calib`` with flat weights).
2. Heads: ``bench.obs.struct_prune`` with headsize = head dim: the grouped-Cholesky OBS error
   Σ_p ‖W_:,p‖² / diag(chol(H⁻¹_hh))_p², one head per iteration, OBS compensation of the remaining
   ``proj`` columns, H reduced and re-inverted each iteration (Batched Greedy Pruning, Sec. 3.2).
   The compensated ``proj`` is written, then the heads' q/k/v rows are removed without compensation.
3. The Hessian of ``ffn.fc2``'s input (down_proj) is collected AGAIN, through the block whose heads
   are now pruned (EVAR-code collects both in one pass over the dense block).
4. FFN channels: ``struct_prune`` with headsize 1 and Dynamic Group Size batches, then ``fc1``
   rows (VAR has no gate/up pair) removed without compensation.
5. The next block is calibrated through the pruned one.

Incremental Pruning Ratio (Sec. 3.3): ``schedule=log``, per-block sparsity ∝ ln(1 + j), block 0
unpruned, rescaled so that the mean over blocks is ``sparsity`` (``bench.prune.block_sparsities``).
The default is ``schedule=uniform`` (one sparsity for every block), as EVAR's code runs its pruners
(``--sparsity 0.2/0.4``; the log schedule only with ``--non_uniform``) and as EVAR's Table 2 heads
its columns (one sparsity each); it is a deviation from SlimGPT, whose Incremental Pruning Ratio is
``schedule=log``.
Counts: round(H·s_j) heads and round(F·s_j) channels (Python round, at least one unit kept).

Calibration size: SlimGPT calibrates on 128 C4 sequences of 2048 tokens. A VAR image is one sequence
of the pyramid's L tokens (680 for VAR-d16), so the default is 128 images: SlimGPT's sample count (a
token-matched count would be ~385 images at d16). ``n_calib=1000`` gives EVAR's calibration budget.

Deviations from SlimGPT (also in ``deviations``, i.e. table footnotes):

* ``schedule=uniform`` by default: without the Incremental Pruning Ratio (``schedule=log``);
* calibration data are class-conditional images with teacher forcing (one image = one sequence of
  all scales under the block-causal mask, true class labels), not C4 text;
* ``schedule=log`` is rescaled to the requested mean sparsity instead of SlimGPT's
  s_min + (s_max − s_min)·ln(1+j)/ln 32 (comparable to other methods at one nominal sparsity);
* H is normalised by the token count, SlimGPT's by the sequence count (a constant factor: no effect);
* float64 Hessian sums and OBS (SlimGPT: float32);
* percdamp 0.01 is SlimGPT's argparse default (its README runs 0); no LoRA recovery (use ``ft``).

Not deviations: headsize = head dim, o_proj before down_proj with re-collection in between, q/k/v
and fc1 rows removed without compensation, biases kept.
"""
from typing import Dict, List, Tuple

import torch

from bench.calib import Stream
from bench.method import StructuredPruner
from bench.obs import prune_channels, prune_heads
from bench.prune import sync_config
from bench.registry import METHODS


@METHODS.register("slimgpt")
class SlimGPT(StructuredPruner):
    name = "slimgpt"
    deviations = (
        "schedule=uniform (the default) prunes every block at the same sparsity, as EVAR's code runs its pruners, "
        "without SlimGPT's Incremental Pruning Ratio (schedule=log)",
        "calibration data are class-conditional images fed with teacher forcing (one image = one sequence of "
        "all scales, 128 images by default, true class labels) instead of 128 C4 text sequences of 2048 tokens",
        "schedule=log rescales SlimGPT's ln(1+j) schedule to the requested mean sparsity (SlimGPT: "
        "s_min + (s_max − s_min)·ln(1+j)/ln 32)",
        "the Hessian is normalised by the number of tokens, not of sequences (a constant factor: scores' order, "
        "relative damping and compensation are unchanged)",
        "Hessians summed and OBS done in float64 (SlimGPT: float32)",
        "percdamp 0.01 (SlimGPT's argparse default; its README uses 0); no LoRA fine-tune (use the ft method)",
    )

    @torch.no_grad()
    def prune(self, gen, ctx, sparsities: List[float]):
        labels, tokens = ctx.data(self.n_calib, "calib")
        stream = Stream(gen, labels, tokens, self.batch, ctx.progress, desc=self.name)
        self.pruned: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}
        for i, (block, s) in enumerate(zip(gen.var.blocks, sparsities)):
            if s == 0:
                continue
            H = stream.collect(i, {"proj": block.attn.proj}, None, stop="proj")
            heads = prune_heads(block, H["proj"], s, self.percdamp, self.compensate)
            H = stream.collect(i, {"fc2": block.ffn.fc2}, None, stop="fc2")   # re-collected: heads now pruned
            channels = prune_channels(block, H["fc2"], s, self.percdamp, self.compensate)
            self.pruned[i] = (heads, channels)
        sync_config(gen)
        ctx.notes.append(f"{self.name}: calibrated on {len(stream)} images, per-block sparsity "
                         + ",".join(f"{s:.3f}" for s in sparsities))
        return gen
