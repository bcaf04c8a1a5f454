"""Reading checkpoints and checking them against a model, with errors that say what to do.

- a missing file → :class:`CheckpointNotFound` naming the file, its official source and the folder
  to put it in (nothing is ever downloaded at run time);
- a truncated or non-checkpoint file → :class:`CheckpointError` (not a stack trace from pickle);
- missing, unexpected or wrongly shaped tensors → one :class:`CheckpointMismatch` listing every key
  with the expected and found shapes.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Dict, Mapping, Optional

import torch

DEFAULT_CKPT_DIR = Path(os.path.expanduser("~/.cache/varbench/checkpoints"))


class CheckpointError(RuntimeError):
    pass


class CheckpointNotFound(CheckpointError, FileNotFoundError):
    pass


class CheckpointMismatch(CheckpointError):
    def __init__(self, what: str, missing: Dict[str, tuple], unexpected: Dict[str, tuple],
                 wrong_shape: Dict[str, tuple]):
        self.missing, self.unexpected, self.wrong_shape = missing, unexpected, wrong_shape
        lines = [f"{what} does not match the model: {len(missing)} missing, {len(unexpected)} unexpected, "
                 f"{len(wrong_shape)} wrongly shaped tensor(s)"]
        lines += [f"  missing     {k}: expected {list(s)}" for k, s in missing.items()]
        lines += [f"  unexpected  {k}: found {list(s)}" for k, s in unexpected.items()]
        lines += [f"  wrong shape {k}: expected {list(e)}, found {list(f)}" for k, (e, f) in wrong_shape.items()]
        super().__init__("\n".join(lines))


def ckpt_dir(explicit: Optional[str | os.PathLike] = None) -> Path:
    """Checkpoint folder: the flag, else ``$VARBENCH_CKPT_DIR``, else ~/.cache/varbench/checkpoints."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("VARBENCH_CKPT_DIR")
    return Path(env) if env else DEFAULT_CKPT_DIR


def locate(filename: str, folder: Optional[str | os.PathLike], source: str) -> Path:
    d = ckpt_dir(folder)
    path = d / filename
    if not path.is_file():
        raise CheckpointNotFound(
            f"checkpoint {filename} not found in {d}.\n"
            f"  Get it from {source}\n"
            f"  and put it in {d} (or point --ckpt-dir / VARBENCH_CKPT_DIR at the folder that has it). "
            f"varbench never downloads at run time.")
    return path


def read_state_dict(path: str | os.PathLike) -> Dict[str, torch.Tensor]:
    """A plain state_dict from a ``.pth``/``.pt`` (torch.load, weights only) or ``.safetensors`` file."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointNotFound(f"checkpoint {path} does not exist")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file
            sd = load_file(str(path), device="cpu")
        else:
            sd = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # pickle, zip and safetensors errors all mean the same thing here
        size = path.stat().st_size
        raise CheckpointError(
            f"{path} ({size:,} bytes) is not a readable checkpoint — truncated or not a PyTorch/safetensors "
            f"file ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). Re-download or re-create it."
        ) from None
    if isinstance(sd, Mapping) and "state_dict" in sd and isinstance(sd["state_dict"], Mapping):
        sd = sd["state_dict"]
    if not isinstance(sd, Mapping) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"{path} holds a {type(sd).__name__}, not a state_dict of tensors")
    return dict(sd)


def check_state_dict(model: torch.nn.Module, sd: Mapping[str, torch.Tensor], what: str = "checkpoint") -> None:
    """Raise one :class:`CheckpointMismatch` listing every missing/unexpected/wrongly shaped key."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    found = {k: tuple(v.shape) for k, v in sd.items()}
    missing = {k: s for k, s in expected.items() if k not in found}
    unexpected = {k: s for k, s in found.items() if k not in expected}
    wrong = {k: (expected[k], found[k]) for k in expected.keys() & found.keys() if expected[k] != found[k]}
    if missing or unexpected or wrong:
        raise CheckpointMismatch(what, missing, unexpected, dict(sorted(wrong.items())))


def load_strict(model: torch.nn.Module, sd: Mapping[str, torch.Tensor], what: str = "checkpoint",
                assign: bool = False) -> torch.nn.Module:
    """Strict key/shape check, then load (``assign=True`` for a model built on the meta device)."""
    check_state_dict(model, sd, what)
    model.load_state_dict(sd, strict=True, assign=assign)
    return model


def sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
