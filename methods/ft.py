"""ft: recovery by fine-tuning on the task loss (VAR's next-scale cross-entropy, teacher forcing).

Used after a weights method ("40% sparse, 1-epoch FT" in EVAR Tab. 2). One epoch = one pass over
the bench's training split (``Context.epoch_size`` images: ImageNet-1k train in the paper world,
the tinyshapes train split of the tiny world). AdamW with linear warm-up then cosine decay, class
dropout 0.1 as in VAR training, gradient clipping at 2.0; the VQVAE is frozen.
"""
import math

import torch
from tqdm.auto import tqdm

from bench.method import Method
from bench.registry import METHODS


@METHODS.register("ft")
class FineTune(Method):
    name, kind = "ft", "recovery"
    deviations = ("fine-tuning hyper-parameters (AdamW, lr, batch) are varbench's; the paper does not give them for the 1-epoch FT column",)

    def apply(self, gen, ctx):
        if ctx.data is None or ctx.epoch_size <= 0:
            raise ValueError("ft needs training data: the bench provides none (Context.data / epoch_size)")
        n = int(round(self.epochs * ctx.epoch_size))
        steps = math.ceil(n / self.batch)
        if steps == 0:   # epochs=0: the identity setting
            ctx.notes.append("ft: 0 steps (epochs=0)")
            return gen
        labels, tokens = ctx.data(ctx.epoch_size, "train")
        var = gen.var.train()
        opt = torch.optim.AdamW([p for p in var.parameters() if p.requires_grad], lr=self.lr,
                                betas=(0.9, 0.95), weight_decay=self.wd)
        g = torch.Generator().manual_seed(ctx.seed)
        # a fresh permutation of the training split for every epoch
        order = torch.cat([torch.randperm(ctx.epoch_size, generator=g) for _ in range(math.ceil(self.epochs) or 1)])
        warm = max(1, steps // 20)
        bar = tqdm(range(steps), desc=f"ft {self.epochs:g} epoch(s)", disable=not ctx.progress, leave=False)
        for step in bar:
            lr = self.lr * min(1.0, (step + 1) / warm) * 0.5 * (1 + math.cos(math.pi * step / steps))
            for pg in opt.param_groups:
                pg["lr"] = lr
            idx = order[step * self.batch:(step + 1) * self.batch]
            loss = gen.loss(labels[idx], [t[idx] for t in tokens])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(var.parameters(), 2.0)
            opt.step()
            bar.set_postfix(ce=f"{loss.item():.3f}")
        var.eval()
        ctx.notes.append(f"ft: {steps} steps of batch {self.batch} ({self.epochs:g} epoch(s) of {ctx.epoch_size} images)")
        return gen
