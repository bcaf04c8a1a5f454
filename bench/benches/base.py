"""The bench interface: which images to generate, how to score them, and which data methods may use.

A bench fixes the protocol (conditions, seeds, sampling defaults, reference set, metrics) in its
docstring and code; the runner only asks it for ``labels(n)``, ``batch_seed`` and ``evaluate``.

Bench modules are imported to learn the benches' names and facts (world, classes, default n,
protocol version) without torch: they import torch, data and metrics inside their methods only.

``fidelity`` is a setting of the benches that have feature rows (``feature_chunk`` > 0): with it on, a
run is also compared with the unmodified model's outputs on the same conditions and seeds (FID*,
PSNR, SSIM: ``bench.originals``). It enters the protocol identity only when on, so records made
without it keep their keys.

``version`` is the protocol version: bump it whenever the bench's conditions, seeds, reference set
or metric code change, so that every record made under the old protocol is reported stale.
``identity()`` adds the files the scores depend on (e.g. the feature network's sha256).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    import torch


class Bench:
    name: str = ""
    kind: str = "images"            # "images": sample and score images; "timing": the latency bench
    world: str = ""
    conditions: str = "classes"     # "classes": labels(n) is a class tensor; "prompts": a list of prompts;
                                    # "any": the latency bench (it conditions on what the model takes)
    model: str = ""                 # the model this bench is run with by default
    num_classes: int = 0
    default_n: int = 0
    batch_size: int = 50
    epoch_size: int = 0             # images per "epoch" of the training split (recovery methods)
    version: int = 1                # protocol version (see the module docstring)
    metrics: Tuple[str, ...] = ()   # what evaluate() returns (names of bench.metrics.catalog)
    fidelity: bool = False          # also compare with the original model's outputs (see the module docstring)

    def __init__(self, fidelity: bool = False):
        self.fidelity = self.check_fidelity(fidelity)

    @classmethod
    def check_fidelity(cls, fidelity) -> bool:
        if not isinstance(fidelity, bool):
            raise ValueError(f"fidelity must be true or false, got {fidelity!r}")
        if fidelity and not cls.feature_chunk:
            from bench.registry import BENCHES
            fits = sorted(b for b in BENCHES.names() if BENCHES.get(b).feature_chunk)
            raise ValueError(f"bench {cls.name} has no feature rows to compare with the original model's outputs; "
                             f"benches with fidelity metrics: {', '.join(fits)}")
        return fidelity

    def labels(self, n: int) -> "torch.Tensor":
        """Conditions of the n samples, class-major (n/num_classes per class, as VAR's FID protocol)."""
        import torch

        self.check_n(n)
        return torch.arange(self.num_classes).repeat_interleave(n // self.num_classes)

    @classmethod
    def check_n(cls, n) -> int:
        from bench.defaults import N_MAX
        k = cls.num_classes
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0 or n % k or n > N_MAX:
            raise ValueError(f"--n {n!r}: {cls.name} needs a positive multiple of its {k} classes up to {N_MAX:,} "
                             f"(default {cls.default_n})")
        return n

    @staticmethod
    def batch_seed(seed: int, batch_idx: int) -> int:
        """One torch.Generator seed per sampling batch (official: ``g_seed`` per batch)."""
        return seed * 1_000_003 + batch_idx

    def identity(self) -> Dict[str, object]:
        """What the scores depend on besides the images: the protocol version and any files."""
        return {"version": self.version, **({"fidelity": True} if self.fidelity else {})}

    @classmethod
    def args_from_protocol(cls, protocol) -> Dict[str, object]:
        """Constructor arguments of the bench a recorded protocol came from (``fidelity`` where it was
        on; the latency bench keeps its device, batch, … there)."""
        return {"fidelity": True} if (protocol or {}).get("fidelity") else {}

    def preflight(self) -> None:
        """Raise now (before any sampling) if a file ``evaluate`` will need is missing."""

    def coverage_note(self, n: int) -> Optional[str]:
        """A sentence for the record (and a warning before the run) when ``n`` images cover only part of
        what the bench's headline metric averages over (GenEval's tasks); None when they cover it all."""
        return None

    # Scoring in two steps, so that a sharded run (bench.shard) can deal feature extraction over its
    # ranks: ``features`` maps images to per-image rows (the features and logits the metrics need),
    # ``score`` turns every row into metrics. ``feature_chunk`` > 0 promises that ``features`` of the
    # chunks [j·C, (j+1)·C) concatenated equals ``features`` of all images bit for bit (its network
    # batches are aligned at multiples of C, so every image meets the same batch either way);
    # 0: the bench scores images in one step (``evaluate`` only) and nothing is dealt.
    feature_chunk: int = 0

    def features(self, images_uint8: "torch.Tensor", progress: bool = False) -> Dict[str, "torch.Tensor"]:
        """Per-image rows {name: Tensor[N, …]} of these images (see ``feature_chunk``)."""
        raise NotImplementedError(f"{self.name} scores images in one step (feature_chunk = 0)")

    def score(self, feats: Dict[str, "torch.Tensor"], labels: "torch.Tensor", seed: int = 0,
              progress: bool = True) -> Dict[str, dict]:
        """Metrics from the rows ``features`` gave for all n images, in sample order."""
        raise NotImplementedError(f"{self.name} scores images in one step (feature_chunk = 0)")

    def evaluate(self, images_uint8: "torch.Tensor", labels: "torch.Tensor", seed: int = 0,
                 progress: bool = True) -> Dict[str, dict]:
        """Metrics of the n images (sample order): ``score(features(images))`` by default."""
        return self.score(self.features(images_uint8, progress), labels, seed=seed, progress=progress)

    @property
    def lpips_weights(self):
        """AlexNet's weights for LPIPS among the fidelity pairs (paper-world benches: $VARBENCH_LPIPS_ALEXNET;
        None: no LPIPS)."""
        import os
        return os.environ.get("VARBENCH_LPIPS_ALEXNET") if self.world == "paper" else None

    def fidelity_metrics(self, feats: Dict[str, "torch.Tensor"], original: Dict[str, "torch.Tensor"],
                         labels) -> Dict[str, dict]:
        """FID* of a run's feature rows against the original model's: the bench's FID between the two
        sets (its ``features`` rows)."""
        from bench.metrics.pairs import fid_star
        return {"fid_star": {"value": fid_star(feats["features"], original["features"]),
                             "n": int(len(feats["features"])), "higher_is_better": False}}

    def data(self, n: int, split: str, vae) -> Tuple["torch.Tensor", List["torch.Tensor"]]:
        """(labels [n], token pyramid) of n images of ``split`` ("train" or "calib"), tokenised by
        the generator's own VQVAE, for calibration and fine-tuning."""
        raise NotImplementedError(f"{self.name} provides no training/calibration data")
