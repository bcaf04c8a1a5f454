"""The recovery trainer shared by ``ft``, ``kd`` and ``psad``, and the per-scale losses of distillation.

``train`` is one loop for every recovery method: one epoch = ``ctx.epoch_size`` images of the bench's
training split, a fresh seeded permutation per epoch, AdamW (β = 0.9, 0.95; weight decay on the weight
matrices only, as official VAR and EVAR-code: ``param_groups``), linear warm-up over the first 5% of the
steps then cosine decay, gradient clipping at 2.0, the transformer in train mode (class dropout as in
VAR training, and its stochastic depth: ``drop_path_while_training``, 0.1·depth/24 as official VAR and
EVAR-code train) and the VQVAE frozen. Only the per-step loss differs between methods: it
is a callable ``loss(labels_B, tokens, t) -> (loss, stats)`` with ``t`` = step / steps, the fraction of
training done (PSAD's gates are functions of it), and ``stats`` the floats shown on the progress bar.

Per-scale losses split VAR's [B, L, V] logits by ``var.begin_ends`` (scale i = tokens
begin_i … end_i − 1, n_i = pn_i² of them). Reductions, chosen to match EVAR's Eq. (PSAD) and
EVAR-code's ``F.kl_div(..., reduction='batchmean')`` on one scale's [B, n_i, V] slice:

  * ``token_kl``   [B, L]  KL(p_T ‖ p_S) = Σ_v p_T (log p_T − log p_S), p = softmax(z / τ), per token;
  * ``scale_kl``   [K]     per image the SUM over the scale's n_i tokens, averaged over the batch
                           (w_i = C / n_i in the paper cancels exactly this token count);
  * ``scale_ce_sum`` [K]   the same reduction of the token cross-entropy;
  * ``scale_ce``   [K]     the per-scale MEAN token cross-entropy (a diagnostic).

Class dropout under distillation (``forward_pair``): the labels are dropped to the null class once per
step and the SAME labels go to the student and the teacher, so a dropped image teaches the student the
teacher's unconditional prediction (what classifier-free guidance uses). The student's own dropout is
switched off for that forward so that labels are not dropped twice. (Official VAR drops labels inside
every forward, so EVAR-code's teacher and student draw independent masks; varbench's teacher is in
eval mode and would never drop.)
"""
from __future__ import annotations

import contextlib
import copy
import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from bench.models.generator import Generator

# What the distillation methods' footnotes say about their optimisation (kd, psad).
RECIPE = ("optimisation is varbench's ft recipe (AdamW at the lr and batch given, default 5e-4 at 64; warm-up "
          "then cosine; the epochs are the table's), not the paper's 8-GPU run; the teacher sees the student's "
          "dropped labels (same class dropout)")
# What every recovery method's footnote says about this trainer (ft, kd and psad list it).
TRAINER_DEVIATIONS = (
    "training images are tokenised once with the evaluation centre crop (EVAR-code's trainer takes a random "
    "crop per epoch); weight decay, gradient clipping, stochastic depth and betas as official VAR training",
)

# loss(labels_B, tokens, t) -> (scalar loss, {name: float}) ; t in [0, 1): fraction of training done
StepLoss = Callable[[torch.Tensor, List[torch.Tensor], float], Tuple[torch.Tensor, Dict[str, float]]]


# Official VAR's trainer and EVAR-code's (``utils/lr_control.filter_params`` with these ``nowd_keys``): no
# weight decay on 1-D parameters, biases, and parameters whose name holds one of these.
NO_WD_KEYS = ("cls_token", "start_token", "task_token", "cfg_uncond", "pos_embed", "pos_1LC", "pos_start", "start_pos",
              "lvl_embed", "gamma", "beta", "ada_gss", "moe_bias", "scale_mul")


def param_groups(model: torch.nn.Module, wd: float) -> List[dict]:
    """AdamW groups of the trainable parameters: weight decay ``wd`` on the matrices, none on what
    official VAR training exempts (``NO_WD_KEYS``, 1-D parameters, biases)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            exempt = p.ndim == 1 or name.endswith("bias") or any(k in name for k in NO_WD_KEYS)
            (no_decay if exempt else decay).append(p)
    return [g for g in ({"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}) if g["params"]]


def train_drop_path(depth: int) -> float:
    """Official VAR training's stochastic-depth rate (``build_vae_var``: 0.1·depth/24, EVAR-code's too)."""
    return 0.1 * depth / 24


@contextlib.contextmanager
def drop_path_while_training(blocks, rate: Optional[float] = None):
    """The blocks' residual branches dropped per image with probability rate·i/(depth − 1) for block i
    (official VAR's linear rule; ``rate`` default ``train_drop_path``) while fine-tuning; inference
    modules (no drop path) restored after, also on error."""
    from bench.models.var import DropPath
    rate = train_drop_path(len(blocks)) if rate is None else rate
    saved = [b.drop_path for b in blocks]
    try:
        for i, b in enumerate(blocks):
            p = rate * i / max(len(blocks) - 1, 1)
            b.drop_path = DropPath(p) if p > 0 else torch.nn.Identity()
        yield
    finally:
        for b, m in zip(blocks, saved):
            b.drop_path = m


def train(gen: Generator, ctx, name: str, epochs: float, lr: float, batch: int, wd: float,
          make_loss: Callable[[], StepLoss]) -> List[Dict[str, float]]:
    """Fine-tune ``gen.var`` in place for ``epochs`` passes over the training split; returns each
    step's stats (empty when no step is taken). ``make_loss`` is called once, after the data are
    loaded and before the first step (it may build a teacher); never when there are 0 steps.

    Steps: ceil(round(epochs·N) / batch) for N = ``ctx.epoch_size``, over one seeded permutation of the
    split per started epoch. Every batch is full except the last of a whole epoch, so a fractional
    epoch's last batch may take up to batch − 1 images beyond round(epochs·N) from its permutation."""
    if ctx.data is None or ctx.epoch_size <= 0:
        raise ValueError(f"{name} needs training data: the bench provides none (Context.data / epoch_size)")
    n = int(round(epochs * ctx.epoch_size))
    steps = math.ceil(n / batch)
    if steps == 0:   # epochs=0: the identity setting
        ctx.notes.append(f"{name}: 0 steps (epochs=0)")
        return []
    labels, tokens = ctx.data(ctx.epoch_size, "train")
    step_loss = make_loss()
    var, dev = gen.var.train(), gen.device
    opt = torch.optim.AdamW(param_groups(var, wd), lr=lr, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(ctx.seed)
    # a fresh permutation of the training split for every epoch
    order = torch.cat([torch.randperm(ctx.epoch_size, generator=g) for _ in range(math.ceil(epochs) or 1)])
    warm = max(1, steps // 20)
    history: List[Dict[str, float]] = []
    bar = tqdm(range(steps), desc=f"{name} {epochs:g} epoch(s)", disable=not ctx.progress, leave=False)
    with drop_path_while_training(list(var.blocks)):
        for step in bar:
            cur_lr = lr * min(1.0, (step + 1) / warm) * 0.5 * (1 + math.cos(math.pi * step / steps))
            for pg in opt.param_groups:
                pg["lr"] = cur_lr
            idx = order[step * batch:(step + 1) * batch]
            # the bench's data live on the CPU; the batch goes where the model is
            loss, stats = step_loss(labels[idx].to(dev), [t[idx].to(dev) for t in tokens], step / steps)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(var.parameters(), 2.0)
            opt.step()
            history.append(stats)
            bar.set_postfix({k: f"{v:.3f}" for k, v in stats.items()})
    var.eval()
    ctx.notes.append(f"{name}: {steps} steps of batch {batch} ({epochs:g} epoch(s) of {ctx.epoch_size} images)")
    return history


# ------------------------------------------------------------------ teacher and paired forward
def build_teacher(gen: Generator, ctx, name: str) -> Generator:
    """The frozen teacher: the dense model from ``ctx.teacher()``; without one (a bare Context), a frozen
    copy of the model as it enters the method, which is the dense model only when nothing ran before."""
    if ctx.teacher is not None:
        teacher = ctx.teacher()
    else:
        teacher = copy.deepcopy(gen)
        ctx.notes.append(f"{name}: no teacher in the context; distilled from a copy of the incoming model")
    teacher = teacher.to(gen.device).eval()
    teacher.requires_grad_(False)
    if teacher.var.V != gen.var.V or tuple(teacher.patch_nums) != tuple(gen.patch_nums):
        raise ValueError(f"{name}: teacher and student disagree on vocabulary or scales")
    return teacher


def forward_pair(gen: Generator, teacher: Generator, labels_B: torch.Tensor, tokens: Sequence[torch.Tensor]):
    """(student logits [B, L, V], teacher logits [B, L, V], targets [B, L]) with one class dropout for both."""
    var = gen.var
    rate = var.cfg.cond_drop_rate if var.training else 0.0
    if rate > 0:   # the same draw var.forward would make, made once here for both models
        drop_B = torch.rand(labels_B.shape[0], device=labels_B.device) < rate
        labels_B = torch.where(drop_B, var.num_classes, labels_B)
    with torch.no_grad():
        teacher_BLV = teacher.forward_teacher(labels_B, tokens)
    cfg = var.cfg
    var.cfg = cfg.replace(cond_drop_rate=0.0)   # already dropped above: not twice
    try:
        student_BLV = gen.forward_teacher(labels_B, tokens)
    finally:
        var.cfg = cfg
    return student_BLV, teacher_BLV, torch.cat(list(tokens), dim=1)


# ------------------------------------------------------------------ per-scale losses
def scale_sizes(begin_ends: Sequence[Tuple[int, int]]) -> torch.Tensor:
    """n_i, the token count of each scale, [K] float."""
    return torch.tensor([float(e - b) for b, e in begin_ends])


def per_scale_sum(x_BL: torch.Tensor, begin_ends: Sequence[Tuple[int, int]]) -> torch.Tensor:
    """[K]: per image the sum over each scale's tokens, averaged over the batch."""
    return torch.stack([x_BL[:, b:e].sum(1).mean(0) for b, e in begin_ends])


def token_kl(student_BLV: torch.Tensor, teacher_BLV: torch.Tensor, tau: float) -> torch.Tensor:
    """[B, L]: KL(teacher ‖ student) of each token's distributions softened by temperature τ."""
    logp_s = F.log_softmax(student_BLV.float() / tau, dim=-1)
    logp_t = F.log_softmax(teacher_BLV.float() / tau, dim=-1)
    return (logp_t.exp() * (logp_t - logp_s)).sum(-1)


def token_ce(logits_BLV: torch.Tensor, target_BL: torch.Tensor) -> torch.Tensor:
    """[B, L] cross-entropy of each token."""
    B, L, V = logits_BLV.shape
    return F.cross_entropy(logits_BLV.reshape(B * L, V), target_BL.reshape(B * L), reduction="none").view(B, L)


def token_terms(student_BLV, teacher_BLV, target_BL, tau: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """(token CE [B, L] of the student, token KL(teacher ‖ student) at τ [B, L]): what every
    distillation loss here is built from."""
    return token_ce(student_BLV, target_BL), token_kl(student_BLV, teacher_BLV, tau)


def scale_kl(student_BLV, teacher_BLV, begin_ends, tau: float) -> torch.Tensor:
    """[K]: per-scale KL(teacher ‖ student) at τ, summed over the scale's tokens, batch-mean."""
    return per_scale_sum(token_kl(student_BLV, teacher_BLV, tau), begin_ends)


def scale_ce_sum(logits_BLV, target_BL, begin_ends) -> torch.Tensor:
    """[K]: per-scale token cross-entropy summed over the scale's tokens, batch-mean."""
    return per_scale_sum(token_ce(logits_BLV, target_BL), begin_ends)


def scale_ce(logits_BLV, target_BL, begin_ends) -> torch.Tensor:
    """[K]: per-scale mean token cross-entropy."""
    return scale_ce_sum(logits_BLV, target_BL, begin_ends) / scale_sizes(begin_ends).to(logits_BLV.device)
