"""llm-pruner: LLM-Pruner's block-wise structured pruning (Ma, Fang & Wang, NeurIPS 2023,
horseee/LLM-Pruner ``TaylorImportance``) ported to VAR; EVAR Tab. 2 baseline "LLM-Pruner".

Element-wise importance of a weight w with gradient g of the model loss (``taylor=``):

    param_first   |w·g|
    param_second  |w·F·w|,            F = (1/N) Σ_s g_s²   (empirical Fisher ≈ Hessian diagonal)
    param_mix     |w·g − ½·w·F·w|

summed over all elements of a dependency group (LLM-Pruner: ``salience.abs().sum(...)`` per layer,
then ``group_reduction=sum`` over the group's layers). Groups here: an attention head (its q, k, v
rows of ``mat_qkv``, its ``q_bias``/``v_bias`` entries, its c columns of ``proj``) and an FFN channel
(its ``fc1`` row and bias entry, its ``fc2`` column); ``bench.importance``.

The model loss is VAR's mean token cross-entropy under teacher forcing (``gen.loss``, eval mode,
true class), the analogue of LLaMA's LM loss. g is the gradient of the mean loss over the
``n_calib`` calibration images (computed in batches of ``batch``; the result does not depend on
``batch``), as LLM-Pruner's one backward pass over its 10 examples. F (param_second/param_mix only)
averages the squared gradients of single images (``fisher_batch=1``, as ``llama3.py``'s loop over
``num_examples``; a larger ``fisher_batch`` squares per-batch gradients instead, cheaper and a
coarser Fisher). Default ``taylor=param_first`` and 10 calibration examples as LLM-Pruner's
scripts (``scripts/llama_prune.sh``, ``llama3.py``; ``hf_prune.py`` defaults to param_mix).

Applies as ``magnitude``: every block loses ``round(sparsity·H)`` heads and ``round(sparsity·F)``
channels with the lowest scores (local ranking, as LLM-Pruner's block-wise mode); no compensation.

Not reproduced: EVAR-code's ``taylor_prune_llm`` (its LLM-Pruner baseline), which differentiates a
per-block surrogate ``(layer_out**2).sum()`` and ranks input columns by output-row scores.

Deviations from LLM-Pruner (also in ``deviations``):
* every block is pruned at ``sparsity``; LLM-Pruner's scripts prune layers 4..29 of LLaMA's 32 and
  leave the first 4 and last 2 dense;
* calibration is 10 teacher-forced images (680 tokens each on VAR-d16) of the bench's calibration
  split, not 10 bookcorpus sequences of 64 tokens;
* the groups include the biases removed with them (LLaMA has none); the cosine-attention
  temperature ``scale_mul_1H11`` is removed with its head but not scored;
* no LoRA recovery (chain ``ft`` for recovery); the ``vectorize`` importance is not offered;
* EVAR-code's ``taylor_prune_llm`` (above), presumably what EVAR Tab. 2 reports, is not reproduced.
"""
from bench.importance import calib_data, fisher_diag, mean_grad, prunable, split, unit_sums
from bench.method import StructuredPruner
from bench.registry import METHODS


@METHODS.register("llm-pruner")
class LLMPruner(StructuredPruner):
    name = "llm-pruner"
    deviations = (
        "all blocks pruned at the same sparsity; LLM-Pruner's scripts keep the first 4 and last 2 of "
        "LLaMA's 32 layers dense",
        "calibration: n_calib teacher-forced images of the bench's calibration split with VAR's token "
        "cross-entropy (LLM-Pruner: 10 bookcorpus sequences of 64 tokens, LM loss)",
        "groups include the q/v and fc1 biases removed with them (LLaMA has no biases); the "
        "cosine-attention temperature scale_mul_1H11 is removed with its head but not scored",
        "no LoRA recovery step (chain ft instead); the vectorize importance is not offered",
        "EVAR-code's LLM-Pruner baseline (gradients of a per-block surrogate (out**2).sum(); output-row "
        "scores used to pick input columns) is not reproduced",
    )

    def scores(self, gen, ctx):
        params = prunable(gen)
        data = calib_data(ctx, self.n_calib, self.name)
        g = mean_grad(gen, params, split(data, self.batch, gen.device), ctx.progress)
        fisher = None
        if self.taylor != "param_first":
            fisher = fisher_diag(gen, params, split(data, self.fisher_batch, gen.device), ctx.progress)
        heads, channels = {}, {}
        for i, b in enumerate(gen.var.blocks):
            elem = {}
            for k, p in params[i].items():
                w = p.detach()
                first = w * g[i][k]
                if fisher is None:
                    elem[k] = first.abs()
                    continue
                second = w * fisher[i][k] * w
                elem[k] = second.abs() if self.taylor == "param_second" else (first - 0.5 * second).abs()
            heads[i], channels[i] = unit_sums(b, elem)
        fish = "" if fisher is None else f", Fisher from batches of {self.fisher_batch}"
        ctx.notes.append(f"llm-pruner: {self.taylor} scores from {self.n_calib} calibration images{fish}")
        return heads, channels
