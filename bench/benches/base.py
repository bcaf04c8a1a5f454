"""The bench interface: which images to generate, how to score them, and which data methods may use.

A bench fixes the protocol (conditions, seeds, sampling defaults, reference set, metrics) in its
docstring and code; the runner only asks it for ``labels(n)``, ``batch_seed`` and ``evaluate``.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch


class Bench:
    name: str = ""
    world: str = ""
    model: str = ""                 # the model this bench is run with by default
    default_n: int = 0
    batch_size: int = 50

    def labels(self, n: int) -> torch.Tensor:
        """Conditions of the n samples, class-major (n/num_classes per class, as VAR's FID protocol)."""
        k = self.num_classes
        if n % k:
            raise ValueError(f"{self.name}: n={n} must be a multiple of the {k} classes")
        return torch.arange(k).repeat_interleave(n // k)

    @staticmethod
    def batch_seed(seed: int, batch_idx: int) -> int:
        """One torch.Generator seed per sampling batch (official: ``g_seed`` per batch)."""
        return seed * 1_000_003 + batch_idx

    def evaluate(self, images_uint8: torch.Tensor, labels: torch.Tensor, seed: int = 0,
                 progress: bool = True) -> Dict[str, dict]:
        raise NotImplementedError

    def data(self, n: int, split: str, vae) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        """(labels [n], token pyramid) of n images of ``split`` ("train" or "calib"), tokenised by
        the generator's own VQVAE, for calibration and fine-tuning."""
        raise NotImplementedError(f"{self.name} provides no training/calibration data")

    epoch_size: int = 0
