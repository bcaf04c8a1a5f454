"""kd: vanilla knowledge distillation from the dense teacher, every token weighted equally (EVAR Tab. 4,
"Vanilla KD": "uniform token weighting across all scales"; Hinton et al., 2015).

Recovery (kind ``recovery``) after a weights method, e.g. ``evar:sparsity=0.4 + kd``. The teacher is the
dense model (``ctx.teacher()``, frozen, eval mode). With teacher-forced logits [B, L, V] of both models:

    L = CE + τ² · KL,   CE = mean over the B·L tokens of the student's cross-entropy (VAR's task loss),
                        KL = mean over the B·L tokens of KL(p_T ‖ p_S), p = softmax(logits / τ)

τ² keeps the soft-target gradients on the scale of the hard-target ones (Hinton et al.). This is PSAD's
paper loss (``psad``) with every gate open and the per-scale weights w_i replaced by one weight 1/L per
token: at equal per-token KL the two give the same value, so Tab. 4's KD–PSAD gap isolates PSAD's
scale balancing and curriculum.

Choices the paper does not state: the plain sum CE + τ²·KL (no α mix; EVAR-code's ``normal`` script,
``train_normal.bash``, uses 0.5·CE + 0.5·τ²·KL summed over each image's tokens), τ = 4 (EVAR-code's
temperature). Optimisation as
``ft`` (``bench.distill.train``): AdamW, warm-up + cosine, clip 2.0, one epoch = the bench's training
split, class dropout 0.1 with the teacher given the same (dropped) labels.
"""
from bench.distill import RECIPE, TRAINER_DEVIATIONS, build_teacher, forward_pair, token_terms, train
from bench.method import Method
from bench.registry import METHODS


def kd_loss(ce_BL, kl_BL, tau: float):
    """CE + τ²·KL, both token means; returns (loss, CE, τ²·KL)."""
    ce, distill = ce_BL.mean(), tau ** 2 * kl_BL.mean()
    return ce + distill, ce, distill


@METHODS.register("kd")
class KD(Method):
    name, kind = "kd", "recovery"
    deviations = (
        "vanilla KD's loss is not given in the paper: varbench uses CE + τ²·KL with token means and τ = 4 "
        "(EVAR-code's normal distillation: 0.5·CE + 0.5·τ²·KL summed over each image's tokens)",
        RECIPE,
        *TRAINER_DEVIATIONS,
    )

    def apply(self, gen, ctx):
        def make_loss():
            teacher = build_teacher(gen, ctx, "kd")

            def loss(labels_B, tokens, t):
                ce_BL, kl_BL = token_terms(*forward_pair(gen, teacher, labels_B, tokens), self.tau)
                total, ce, distill = kd_loss(ce_BL, kl_BL, self.tau)
                return total, {"ce": ce.item(), "kl": kl_BL.mean().item(), "distill": distill.item()}
            return loss

        self.history = train(gen, ctx, "kd", self.epochs, self.lr, self.batch, self.wd, make_loss)
        return gen
