"""taylor: structured pruning by first-order Taylor importance on the task loss (Molchanov et al.,
"Importance Estimation for Neural Network Pruning", CVPR 2019); EVAR Tab. 2 baseline "Taylor".

The loss change when a unit's weights W_S are removed is estimated to first order, and the paper's
group importance is its square (Molchanov et al. 2019, Sec. 3, importance of a group of parameters):

    I(S) = (Σ_{w ∈ S} g_w · w)²

with g the gradient of the task loss: here VAR's mean token cross-entropy under teacher forcing
(``gen.loss``, eval mode, true class) on ``n_calib`` calibration images. A unit S is an attention
head (its q, k, v rows of ``mat_qkv``, its ``q_bias``/``v_bias`` entries, its c columns of ``proj``)
or an FFN channel (its ``fc1`` row and bias entry, its ``fc2`` column); ``bench.importance``.
The paper computes the importance on every minibatch and averages it over minibatches: the square
is taken per batch of ``batch`` images and averaged (weighted by batch size), so the score depends
on ``batch`` (batch = n_calib gives (Σ ḡ·w)² with ḡ the full-calibration gradient).

Variant ``reduce=abs-sum``: Torch-Pruning's ``GroupTaylorImportance`` (multivariable=False),
Σ_{w ∈ S} |g_w · w| with g the gradient accumulated over all calibration batches (here: of the mean
CE over all n_calib images); TP's group mean and mean-normalisation are constant factors per block
and change no ranking.

Applies as ``magnitude``: every block loses ``round(sparsity·H)`` heads and ``round(sparsity·F)``
channels with the lowest scores (uniform, or the ``log`` schedule); no compensation.

Not reproduced: EVAR-code's Taylor baselines, which take gradients of a per-block surrogate
``(layer_out**2).sum()`` instead of the model loss and (``taylor_prune_llm``) score output rows
where input columns are pruned.

Deviations from the paper (also in ``deviations``):
* one shot at the target sparsity with per-block (local) ranking; the paper prunes iteratively
  (a few units every few minibatches, fine-tuning in between) with a global ranking;
* calibration: ``n_calib`` teacher-forced images of the bench's calibration split, no weight update
  while scoring; the paper accumulates over training minibatches during fine-tuning;
* the unit also contains the biases removed with it; ``scale_mul_1H11`` (removed with its head) is
  not scored (a log-temperature: zero is not its removal);
* EVAR-code's own Taylor baseline (above), presumably what EVAR Tab. 2 reports, is not reproduced.
"""

from bench.importance import batch_grads, calib_data, mean_grad, prunable, split, unit_sums, zero_scores
from bench.method import StructuredPruner
from bench.registry import METHODS


@METHODS.register("taylor")
class Taylor(StructuredPruner):
    name = "taylor"
    deviations = (
        "one-shot pruning with per-block ranking; Molchanov et al. prune iteratively during fine-tuning "
        "with a global ranking",
        "gradients of VAR's mean token cross-entropy on n_calib teacher-forced calibration images (true "
        "class, eval mode), no weight update while scoring",
        "units include the q/v and fc1 biases removed with them; the cosine-attention temperature "
        "scale_mul_1H11 is removed with its head but not scored",
        "reduce=square-sum: (Σ g·w)² per minibatch of `batch` images, averaged over minibatches (the "
        "paper's averaging), so scores depend on `batch`",
        "EVAR-code's Taylor baseline (gradients of a per-block surrogate (out**2).sum(), not of the model "
        "loss) is not reproduced",
    )

    def scores(self, gen, ctx):
        params = prunable(gen)
        batches = split(calib_data(ctx, self.n_calib, self.name), self.batch, gen.device)
        blocks = gen.var.blocks
        if self.reduce == "abs-sum":
            g = mean_grad(gen, params, batches, ctx.progress)
            sums = [unit_sums(b, {k: (gb[k] * p[k].detach()).abs() for k in p}) for b, p, gb in zip(blocks, params, g)]
            heads, channels = ({i: s[j] for i, s in enumerate(sums)} for j in (0, 1))
        else:
            heads, channels = zero_scores(gen)
            for w, g in batch_grads(gen, params, batches, "taylor", ctx.progress):
                for i, (b, p, gb) in enumerate(zip(blocks, params, g)):
                    h_H, c_F = unit_sums(b, {k: gb[k] * p[k].detach() for k in p})   # signed Σ g·w per unit
                    heads[i] += w * h_H.square()
                    channels[i] += w * c_F.square()
        ctx.notes.append(f"taylor: {self.reduce} scores from {self.n_calib} calibration images "
                         f"in {len(batches)} batch(es) of ≤{self.batch}")
        return heads, channels
