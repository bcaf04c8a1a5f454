"""Layout pretraining of the tiny text encoder (tiny-t2i recipe option ``text_pretrain``, ``layout_weight``).

Why. The paper-world text encoders come pretrained (Flan-T5 for Infinity, Qwen2 for HART); the tiny
world's ``TinyTextEncoder`` starts from random weights. Trained only through the image loss, it never
learns which colour a position prompt puts first: a linear probe on its mean-pooled features reads
"the colour of the object on the left / on top" (``relation_probe``) at 0.45 on the GPU-recipe files
(chance 1/3), and the transformer never reads the relation word (``bench.recipes.t2i_probe``: flipping
it changes no scale's cross-entropy). The relation is an exclusive-or of the word order and the
relation word, the kind of feature gradient descent finds late, and position prompts are a sixth of
the rows.

What. Before the joint training, the text encoder alone learns to predict each training scene's
coarse *colour layout* from its prompt: the colour strength of the image (``scenes_detect.
colour_strength``, ≥ 0) averaged over each cell of a 2×2 grid (3 colours × 4 cells, ×4 so the
targets are about unit scale), by mean squared error through a small MLP head (``LayoutHead``) on the
mean-pooled features. The head is discarded afterwards: the shipped text encoder has the same class
and keys as before. During the joint training the same loss is added with weight ``layout_weight``
(keeping what the pretraining taught while the image loss also trains the encoder).

It is a text-only task: 1,000 steps of 256 prompts took 79 s on 2 cores, and the probe reads 1.0 after
500 of them (0.61 at initialisation). What it changes in the transformer's training is measured in
``bench.recipes.tiny_t2i`` (module docstring: text layout pretraining).
"""
from __future__ import annotations

from typing import List

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench.data import scenes
from bench.data.scenes_detect import colour_strength

GRID = 2          # the layout's cells per side: the 2×2 scale is where next-scale models commit to a layout
TARGET_SCALE = 4  # colour strength averaged over a cell is ≤ 0.25 for most cells: ×4 brings it near unit scale
PRETRAIN = dict(batch=256, lr=1e-3)


def layout_targets(imgs_uint8: torch.Tensor, grid: int = GRID, chunk: int = 4096) -> torch.Tensor:
    """[N, 3·grid·grid]: per scene, the non-negative colour strength of each colour averaged over each
    cell of a grid×grid partition of the image (×``TARGET_SCALE``)."""
    out = []
    for i in range(0, len(imgs_uint8), chunk):
        strength = colour_strength(imgs_uint8[i:i + chunk].float() / 255).clamp(min=0)
        out.append(F.adaptive_avg_pool2d(strength, grid).flatten(1) * TARGET_SCALE)
    return torch.cat(out)


def mean_pool(feats_BTC: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Mean of the valid tokens' features [B, C]."""
    m = mask_BT.unsqueeze(-1).to(feats_BTC)
    return (feats_BTC * m).sum(1) / m.sum(1).clamp(min=1)


class LayoutHead(nn.Sequential):
    """Mean-pooled text features → the prompt's expected colour layout (training only, never shipped)."""

    def __init__(self, channels: int, grid: int = GRID, hidden: int = 256):
        super().__init__(nn.Linear(channels, hidden), nn.GELU(), nn.Linear(hidden, 3 * grid * grid))

    def loss(self, feats_BTC: torch.Tensor, mask_BT: torch.Tensor, target_BD: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(self(mean_pool(feats_BTC, mask_BT)), target_BD)


def pretrain_text(text: nn.Module, head: LayoutHead, ids: torch.Tensor, mask: torch.Tensor, target: torch.Tensor,
                  steps: int, generator: torch.Generator, batch: int = PRETRAIN["batch"], lr: float = PRETRAIN["lr"],
                  progress: bool = False) -> List[dict]:
    """``steps`` AdamW steps of the layout loss on the text encoder and the head (rows drawn by
    ``generator`` on the CPU); returns the loss curve (every 100 steps and the last)."""
    from tqdm.auto import tqdm
    opt = torch.optim.AdamW(list(text.parameters()) + list(head.parameters()), lr=lr, weight_decay=0.0)
    dev, curve = target.device, []
    for step in tqdm(range(steps), desc="text layout pretraining", disable=not progress):
        idx = torch.randint(len(ids), (batch,), generator=generator).to(dev)
        loss = head.loss(text(ids[idx], mask[idx]), mask[idx], target[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            curve.append({"step": step, "loss": round(loss.item(), 5)})
    return curve


@torch.no_grad()
def relation_probe(text: nn.Module, seed: int = 0) -> float:
    """Held-out accuracy of a linear probe that reads, from the mean-pooled text features of a position
    prompt with two colours, the colour of the object on the left (left of / right of) or on top (above /
    below): fitted on half of the 384 such prompts (L-BFGS, L2 1e-3), tested on the other half. Chance is
    about 1/3; a relation the encoder does not represent stays near it."""
    specs = [s for s in scenes.all_specs("position") if s.objects[0].colour != s.objects[1].colour]
    first = [s.objects[0] if s.relation in ("left of", "above") else s.objects[1] for s in specs]
    y = torch.tensor([scenes.COLOUR_NAMES.index(o.colour) for o in first])
    was_training = text.training
    text.eval()
    feats, mask = text.encode([s.prompt for s in specs])
    text.train(was_training)
    X = mean_pool(feats.float(), mask).cpu()
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    tr, te = perm[: len(y) // 2], perm[len(y) // 2:]
    X = (X - X[tr].mean(0)) / (X[tr].std(0) + 1e-6)
    with torch.enable_grad():
        W = torch.zeros(X.shape[1], 3, requires_grad=True)
        b = torch.zeros(3, requires_grad=True)
        opt = torch.optim.LBFGS([W, b], max_iter=300)

        def closure():
            opt.zero_grad()
            loss = F.cross_entropy(X[tr] @ W + b, y[tr]) + 1e-3 * W.square().sum()
            loss.backward()
            return loss

        opt.step(closure)
    return round(((X[te] @ W + b).argmax(1) == y[te]).float().mean().item(), 4)
