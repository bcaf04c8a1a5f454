"""Which rank of a launch this process is (torchrun's environment), without importing torch.

A plain process is rank 0 of 1. Under ``torchrun --nproc-per-node N`` (N > 1) every process reads its
``RANK`` of ``WORLD_SIZE``; ``bench.shard`` builds the process group and the sharded runs on these.
Kept apart from ``bench.shard`` so that the commands that only plan or render (``varbench sweep
--dry-run`` / ``--emit-commands``) can tell rank 0 from the others without loading torch.
"""
from __future__ import annotations

import os


def world_size() -> int:
    """Ranks of this launch (torchrun's ``WORLD_SIZE``; 1 for a plain process)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0")) if active() else 0


def active() -> bool:
    """True when launched by torchrun with more than one rank."""
    return world_size() > 1
