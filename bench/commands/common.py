"""Helpers shared by the ``varbench`` commands: devices, sampling overrides, records, number formats."""
from __future__ import annotations

import argparse
import sys


def human(n: float) -> str:
    for unit, div in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


def takes_prompts(card) -> bool:
    from bench.plan import CONDITIONS
    return CONDITIONS[getattr(card, "kind", "c2i")] == "prompts"


def prompt_models() -> list:
    from bench.registry import MODELS
    return [n for n in MODELS.names() if takes_prompts(MODELS.get(n))]


def sampling_overrides(args) -> dict:
    given = {"cfg": args.cfg, "top_k": args.top_k, "top_p": args.top_p}
    return {k: v for k, v in given.items() if v is not None}


def device_for(args, world: str) -> str:
    """--device, else cuda for the paper world when there is one, else cpu (checked before any work)."""
    import torch
    dev = args.device or ("cuda" if world == "paper" and torch.cuda.is_available() else "cpu")
    try:
        d = torch.device(dev)
    except RuntimeError:
        d = None
    if d is None or d.type not in ("cpu", "cuda"):   # torch knows ~20 device types; varbench runs on two
        raise ValueError(f"--device {dev!r}: must be cpu, cuda or cuda:N")
    if d.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {dev}: CUDA is not available on this machine (use --device cpu)")
    return dev


def load_records(root, world) -> dict:
    """path -> record under ``root`` (``{}`` if the folder does not exist); unreadable files are reported."""
    from bench.records import iter_records

    def warn(path, err):
        print(f"varbench: warning: skipped unreadable record {err}", file=sys.stderr)
    return {str(p): r for p, r in iter_records(root, world, on_error=warn)} if root.is_dir() else {}


def age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def parse_seed(text: str) -> int:
    """argparse type of --seed: check_seed's range, its message without the option (argparse adds it)."""
    from bench.defaults import SEED_MAX, check_seed
    try:
        seed = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, {SEED_MAX}] (2^32 - 1), got {text!r}") from None
    try:
        return check_seed(seed)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).replace("--seed ", "")) from None
