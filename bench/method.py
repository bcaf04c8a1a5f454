"""The method interface: every compression/acceleration method is one file in ``methods/`` plus
one YAML of parameter defaults (the grammar and the YAML format: ``bench.spec``), registered by name
and applied in sequence.

Kinds: ``weights`` returns a physically smaller generator, ``tokens`` installs a token policy (at
most one per chain: a generator has one policy slot), ``recovery`` fine-tunes. ``deviations``
(class attribute) lists every way the implementation departs from its paper/official code; records
carry them into table footnotes.

What a method scores is separate from how it is applied (``bench.prune``); variants are
constructor arguments (YAML parameters), never new names.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from bench.models.generator import Generator
from bench.prune import block_sparsities, index_scores, prune_by_scores
from bench.registry import METHODS
from bench.spec import parse_method, resolve_chain, resolve_params


@dataclass
class Context:
    """What a method may use besides the generator."""
    world: str = "tiny"
    seed: int = 0
    progress: bool = True
    # calibration / training data: callable(n, split) -> (labels [n], token pyramid list of [n, pn²])
    data: Optional[Callable[[int, str], Tuple[Any, List[Any]]]] = None
    teacher: Optional[Callable[[], Generator]] = None     # the dense model, built on demand (KD)
    epoch_size: int = 0                                   # images per "epoch" of the training split
    notes: List[str] = field(default_factory=list)         # what this run did, for the record


class Method:
    name: str = ""
    kind: str = ""
    deviations: Tuple[str, ...] = ()
    # Under torchrun (``bench.shard``): True = cheap and deterministic given the generator (no data, no
    # training), so every rank applies it itself; False = rank 0 applies it and hands the generator to
    # the other ranks (calibration and training are not bit-reproducible across GPUs, nor worth
    # repeating N times).
    per_rank: bool = False

    def __init__(self, **params: Any):
        self.params = resolve_params(self.name, params)

    def apply(self, gen: Generator, ctx: Context) -> Generator:
        raise NotImplementedError

    def __getattr__(self, key: str) -> Any:
        params = self.__dict__.get("params", {})
        if key in params:
            return params[key]
        raise AttributeError(key)

    def __repr__(self) -> str:
        return f"{self.name}:" + ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))


def build_method(spec: str) -> Method:
    name, params = parse_method(spec)
    return METHODS.get(name)(**params)


def apply_chain(gen: Generator, specs: Sequence[str], ctx: Context) -> Generator:
    """Apply the methods of a chain left to right (resolved first: a bad spec fails before any work)."""
    for spec in resolve_chain(list(specs)) if specs else ():
        m = build_method(spec)
        if getattr(m, "kind", "") == "recovery" and gen.device.type == "meta":
            continue   # weight-free accounting: training changes no size
        gen = m.apply(gen, ctx)
        ctx.notes.extend(f"{m.name}: {d}" for d in m.deviations)
    return gen


def split_for_ranks(specs: Sequence[str]) -> Tuple[List[str], List[str]]:
    """A chain split for a sharded run: (the methods up to its last one that is not ``per_rank`` —
    rank 0 applies them and hands the generator over —, the rest, which every rank applies)."""
    chain = list(resolve_chain(list(specs))) if specs else []
    last = max((i for i, s in enumerate(chain) if not METHODS.get(parse_method(s)[0]).per_rank), default=-1)
    return chain[:last + 1], chain[last + 1:]


class TokenMethod(Method):
    """Base of the ``tokens`` methods: they install a token policy (``bench.models.policy``) in a
    VAR-family generator's sampling loop; ``target`` gives the family, blocks and scale sizes."""
    kind = "tokens"
    per_rank = True
    FAMILIES = ("var", "infinity", "hart")

    def target(self, gen) -> Tuple[str, list, Tuple[Tuple[int, int], ...]]:
        family = getattr(gen, "family", None)
        if family not in self.FAMILIES:
            raise ValueError(f"{self.name}: {type(gen).__name__} is not a VAR-family generator "
                             f"(families: {', '.join(self.FAMILIES)})")
        return family, list(gen.blocks), tuple(tuple(hw) for hw in gen.scales_hw)


class StructuredPruner(Method):
    """Base of the ``weights`` methods that remove heads and FFN channels (uniform or ``log`` schedule).

    Subclasses implement ``scores(gen, ctx) -> (head_scores, channel_scores)`` (dicts block → scores,
    higher = keep), or override ``prune(gen, ctx, sparsities)`` when pruning also changes the kept
    weights (OBS compensation). On the meta device (weight-free accounting, ``varbench info``) only the
    sizes matter: the first units are kept and no score is computed.
    """
    kind = "weights"

    def __init__(self, **params: Any):
        super().__init__(**params)
        # a note about one schedule ("schedule=NAME …") is only true when that schedule is used
        schedule = self.params.get("schedule", "uniform")
        self.deviations = tuple(d for d in type(self).deviations
                                if not d.startswith("schedule=") or d.startswith(f"schedule={schedule} "))

    def sparsities(self, gen: Generator) -> List[float]:
        return block_sparsities(len(gen.var.blocks), self.sparsity, self.params.get("schedule", "uniform"))

    def apply(self, gen: Generator, ctx: Context) -> Generator:
        per_block = self.sparsities(gen)
        if gen.device.type == "meta":
            return prune_by_scores(gen, *index_scores(gen), per_block)
        if all(s == 0 for s in per_block):
            ctx.notes.append(f"{self.name}: sparsity 0, model unchanged")
            return gen
        return self.prune(gen, ctx, per_block)

    def prune(self, gen: Generator, ctx: Context, sparsities: List[float]) -> Generator:
        heads, channels = self.scores(gen, ctx)
        return prune_by_scores(gen, heads, channels, sparsities)

    def scores(self, gen: Generator, ctx: Context) -> Tuple[Dict[int, torch.Tensor], Dict[int, torch.Tensor]]:
        raise NotImplementedError
