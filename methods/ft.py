"""ft: recovery by fine-tuning on the task loss (VAR's next-scale cross-entropy, teacher forcing).

Used after a weights method ("40% sparse, 1-epoch FT" in EVAR Tab. 2). One epoch = one pass over
the bench's training split (``Context.epoch_size`` images: ImageNet-1k train in the paper world,
the tinyshapes train split of the tiny world). AdamW with linear warm-up then cosine decay, class
dropout 0.1 as in VAR training, gradient clipping at 2.0; the VQVAE is frozen. The loop is
``bench.distill.train``, shared with the distillation methods ``kd`` and ``psad``.
"""
from bench.distill import TRAINER_DEVIATIONS, train
from bench.method import Method
from bench.registry import METHODS


@METHODS.register("ft")
class FineTune(Method):
    name, kind = "ft", "recovery"
    deviations = ("learning rate, batch and schedule are varbench's (AdamW at the lr and batch given, default 5e-4 "
                  "at 64; warm-up over 5 % of the steps, cosine to 0); the paper names AdamW and, for Tab. 4, 40 "
                  "epochs; EVAR-code's 1-epoch FT script runs batch 320 at lr 1e-4·bs/256",
                  *TRAINER_DEVIATIONS)

    def apply(self, gen, ctx):
        def make_loss():
            def loss(labels_B, tokens, t):
                ce = gen.loss(labels_B, tokens)   # mean token CE; class dropout inside (train mode)
                return ce, {"ce": ce.item()}
            return loss
        self.history = train(gen, ctx, "ft", self.epochs, self.lr, self.batch, self.wd, make_loss)
        return gen
