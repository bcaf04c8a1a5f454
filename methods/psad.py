"""psad: EVAR's Progressive Scale-Aware Distillation from the dense teacher (EVAR §3, Tab. 4).

Recovery (kind ``recovery``) after a weights method, e.g. ``evar:sparsity=0.4 + psad``. The teacher is
the dense model (``ctx.teacher()``, frozen, eval mode); the student is the pruned model. K scales,
scale i has n_i = pn_i² tokens; t ∈ [0, 1) is the fraction of training done (step / steps).

variant=paper (default), EVAR's loss (the two equations of §3 "PSAD" and "Loss & Training"):

    γ̃_i(t) = min(1, max(0, (t − t_i) / Δ_i))                          soft coarse-to-fine gates
    L_total = L_task + L_PSAD,   L_PSAD = τ² Σ_i γ̃_i(t) w_i KL_i
    KL_i    = Σ_{tokens of scale i} KL(p_T ‖ p_S), p = softmax(logits / τ), averaged over the batch
    L_task  = Σ_i γ̃_i CE_i / Σ_i γ̃_i n_i      CE_i: scale i's token CE summed likewise (the CE
                                                "modulated by the scale gates": a gated token mean,
                                                the plain token-mean CE once every gate is open)

  Weightings (``weighting=``), each normalised so that Σ_i w_i n_i = 1 (one unit of weight spread over
  one image's tokens: the total of inverse-count's weights, and that of kd's token mean):
    * inverse-count (PSAD): w_i = C / n_i with C = 1/K, so every scale carries 1/K of the weight and
      L_PSAD = τ² · mean over scales of the scale's per-token KL (equal to kd's τ²·token-mean KL when
      every token has the same KL);
    * exp-increase:   w_i ∝ 2^i        (Tab. 4 "Exponential Increase": fine scales weighted more)
    * linear-increase: w_i ∝ i + 1     (Tab. 4 "Linear Increase")
    * exp-decay:      w_i ∝ 2^(−i)     (Tab. 4 "Exponential Decay": coarse scales weighted more)
  with i = 0 … K−1 from the coarsest scale; all act on the same per-scale KL sums, keep the gates and
  the gated task loss: only w_i changes between Tab. 4's PSAD rows.

  Gate schedule (the paper gives no t_i, Δ_i): Δ_i = ``ramp`` for every scale; t_i = ``onset``·i/(K−1)
  for i ≥ 1, so the finest scale starts to open at ``onset``; scale 0 is open from the first step
  (t_0 = −Δ, otherwise the first steps would have no loss at all). Defaults onset = 0.6 (EVAR-code's
  script unlocks the last scale at 60% of training, VAR's ``--pg 0.6``) and ramp = 0.1 (the spacing of
  the onsets for the tiny world's 7 scales: one scale ramps at a time). ``ramp=0`` gives hard steps.
  The forward always runs every scale: the block-causal mask makes scale i's logits independent of
  finer tokens, so a closed gate removes that scale's gradient exactly as truncating the pyramid would.

variant=code, EVAR-code's ``distill_type=scale_aware`` (VAR_train/distill, script ``train_aware.bash``):

    L = 0.7 · CE + 0.3 · τ² Σ_i s_i KL_i,   s_i linear from 2.0 (coarsest) to 0.2 (finest)

  with CE the token-mean cross-entropy, KL_i as above (``F.kl_div(..., 'batchmean')`` on scale i's
  slice), τ = 4 (the code's temperature; ``tau`` sets it), no gates; ``weighting``, ``onset`` and
  ``ramp`` are not used. For K = 10, s = 2.0, 1.8, …, 0.2 exactly as the script.

Optimisation as ``ft`` (``bench.distill.train``): AdamW, warm-up + cosine, clip 2.0, one epoch = the
bench's training split, class dropout 0.1 with the teacher given the same (dropped) labels.
"""
import torch

from bench.distill import (
    RECIPE,
    TRAINER_DEVIATIONS,
    build_teacher,
    forward_pair,
    per_scale_sum,
    scale_sizes,
    token_terms,
    train,
)
from bench.method import Method
from bench.registry import METHODS

WEIGHTINGS = ("inverse-count", "exp-increase", "linear-increase", "exp-decay")
CODE_ALPHA, CODE_BETA = 0.7, 0.3            # EVAR-code train_aware.bash: --distill_alpha / --distill_beta
CODE_FIRST, CODE_LAST = 2.0, 0.2            # EVAR-code --scale_weights_str 2.0,1.8,…,0.2
CODE_DEVIATIONS = (
    "variant=code has EVAR-code's loss (0.7·CE + 0.3·τ²·Σ s_i KL_i, s_i linear 2.0 → 0.2, τ = 4) but not its "
    "schedule: VAR's progressive training (--pg 0.6: scales unlocked over the first 60% of training) and "
    "20 epochs at batch 256 are replaced by varbench's ft recipe (AdamW, cosine, no gates)",
    "the teacher sees the student's dropped labels (in EVAR-code teacher and student drop labels independently)",
    *TRAINER_DEVIATIONS,
)


def onsets(K: int, onset: float, ramp: float) -> torch.Tensor:
    """t_i [K]: scale 0 open from the start, then evenly spaced up to ``onset`` for the finest scale."""
    i_K = torch.arange(K, dtype=torch.float64)
    t_K = onset * i_K / max(K - 1, 1)
    t_K[0] = -ramp
    return t_K


def gates(t: float, K: int, onset: float, ramp: float) -> torch.Tensor:
    """γ̃_i(t) [K] = min(1, max(0, (t − t_i) / Δ)); a hard step t ≥ t_i when Δ = 0."""
    t_K = onsets(K, onset, ramp)
    if ramp == 0:
        return (t >= t_K).to(torch.float32)
    return ((t - t_K) / ramp).clamp(0, 1).to(torch.float32)


def scale_weights(weighting: str, n_K: torch.Tensor) -> torch.Tensor:
    """w_i [K] of a weighting, normalised to Σ_i w_i n_i = 1 (inverse-count: C = 1/K)."""
    i_K = torch.arange(len(n_K), dtype=torch.float64)
    raw = {"inverse-count": 1.0 / n_K.double(), "exp-increase": 2.0 ** i_K,
           "linear-increase": i_K + 1, "exp-decay": 2.0 ** -i_K}[weighting]
    return (raw / (raw * n_K.double()).sum()).to(torch.float32)


def code_scale_weights(K: int) -> torch.Tensor:
    """s_i [K]: EVAR-code's linear decay from 2.0 to 0.2."""
    return torch.linspace(CODE_FIRST, CODE_LAST, K) if K > 1 else torch.tensor([CODE_FIRST])


def paper_loss(ce_BL, kl_BL, begin_ends, gates_K, weights_K, tau: float):
    """EVAR's L_task + L_PSAD from token CE [B, L] and token KL at τ [B, L]; returns (loss, L_task, L_PSAD)."""
    dev = ce_BL.device
    gates_K, weights_K, n_K = gates_K.to(dev), weights_K.to(dev), scale_sizes(begin_ends).to(dev)
    task = (gates_K * per_scale_sum(ce_BL, begin_ends)).sum() / (gates_K * n_K).sum()
    distill = tau ** 2 * (gates_K * weights_K * per_scale_sum(kl_BL, begin_ends)).sum()
    return task + distill, task, distill


def code_loss(ce_BL, kl_BL, begin_ends, tau: float):
    """EVAR-code's 0.7·CE + 0.3·τ²·Σ s_i KL_i; returns (loss, CE, τ²·Σ s_i KL_i)."""
    s_K = code_scale_weights(len(begin_ends)).to(ce_BL.device)
    ce = ce_BL.mean()
    distill = tau ** 2 * (s_K * per_scale_sum(kl_BL, begin_ends)).sum()
    return CODE_ALPHA * ce + CODE_BETA * distill, ce, distill


@METHODS.register("psad")
class PSAD(Method):
    name, kind = "psad", "recovery"
    deviations = (   # of the default variant=paper; variant=code has CODE_DEVIATIONS
        "PSAD's gate onsets and ramps are not given in the paper: varbench opens scale 0 from the start and "
        "scale i at onset·i/(K−1) of training with a linear ramp (defaults onset 0.6, ramp 0.1)",
        "PSAD's τ and C are not given in the paper: τ = 4 (EVAR-code's temperature), C = 1/K (the weights "
        "w_i n_i sum to 1, as a token mean); the gated task loss is the gate-weighted token mean of the CE",
        "Tab. 4's alternative weightings are unspecified: varbench uses w_i ∝ 2^i, i+1, 2^-i on the same "
        "per-scale KL sums, normalised to Σ w_i n_i = 1, with PSAD's gates kept",
        RECIPE,
        *TRAINER_DEVIATIONS,
    )

    def __init__(self, **params):
        super().__init__(**params)
        if self.variant == "code":
            self.deviations = CODE_DEVIATIONS

    def apply(self, gen, ctx):
        begin_ends = list(gen.var.begin_ends)
        K = len(begin_ends)
        weights_K = scale_weights(self.weighting, scale_sizes(begin_ends))

        def make_loss():
            teacher = build_teacher(gen, ctx, "psad")

            def loss(labels_B, tokens, t):
                ce_BL, kl_BL = token_terms(*forward_pair(gen, teacher, labels_B, tokens), self.tau)
                if self.variant == "code":
                    total, task, distill = code_loss(ce_BL, kl_BL, begin_ends, self.tau)
                else:
                    gates_K = gates(t, K, self.onset, self.ramp)
                    total, task, distill = paper_loss(ce_BL, kl_BL, begin_ends, gates_K, weights_K, self.tau)
                # ce, kl: plain token means (comparable across methods); task, distill: the loss's two terms
                return total, {"ce": ce_BL.mean().item(), "kl": kl_BL.mean().item(),
                               "task": task.item(), "distill": distill.item()}
            return loss

        self.history = train(gen, ctx, "psad", self.epochs, self.lr, self.batch, self.wd, make_loss)
        return gen
