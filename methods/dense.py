"""dense: the unmodified model (the reference row of every table)."""
from bench.method import Method
from bench.registry import METHODS


@METHODS.register("dense")
class Dense(Method):
    name, kind = "dense", "weights"

    def apply(self, gen, ctx):
        return gen
