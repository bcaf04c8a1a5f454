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
from typing import TYPE_CHECKING, Dict, Iterable, Mapping, Optional, Sequence, Tuple

if TYPE_CHECKING:  # torch is imported only by the functions that read or load tensors
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
    """The path of one checkpoint file; see ``locate_all``."""
    return locate_all([(filename, source)], folder)[filename]


def locate_all(files: Iterable[Tuple[str, str]], folder: Optional[str | os.PathLike],
               put: Optional[str] = None) -> Dict[str, Path]:
    """``{filename: path}`` of (filename, source) pairs in the checkpoint folder; one
    :class:`CheckpointNotFound` lists every missing file with where to get it (and ``put``: where it
    goes, as ``not_found``)."""
    d = ckpt_dir(folder)
    found, missing = {}, []
    for filename, source in files:
        path = d / filename
        if path.is_file():
            found[filename] = path
        else:
            missing.append(f"{filename}: get it from {source}")
    if missing:
        raise not_found(d, missing, put)
    return found


def not_found(folder: Path, missing: Sequence[str], put: Optional[str] = None) -> CheckpointNotFound:
    """The error for missing checkpoint files: one line each (``"name: get it from …"``), then where to put
    them (``put``; default: in ``folder``, or --ckpt-dir / VARBENCH_CKPT_DIR at the folder that has them)."""
    if Path(folder).is_file():   # --ckpt-dir given a checkpoint file instead of its folder
        return CheckpointNotFound(f"the checkpoint folder {folder} is a file: point --ckpt-dir / VARBENCH_CKPT_DIR at "
                                  f"the folder that holds the checkpoints (e.g. {Path(folder).parent})")
    put = put or (f"Put them in {folder} (or point --ckpt-dir / VARBENCH_CKPT_DIR at the folder that has them).")
    return CheckpointNotFound(f"{len(missing)} checkpoint file(s) not found in {folder}:\n"
                              + "".join(f"  {m}\n" for m in missing) + f"  {put} varbench never downloads at run time.")


def read_state_dict(path: str | os.PathLike, entry: Optional[str] = None) -> Dict[str, torch.Tensor]:
    """A plain state_dict from a ``.pth``/``.pt`` (torch.load, weights only) or ``.safetensors`` file.
    ``entry``: the key of the state_dict inside a checkpoint dict (e.g. ``"vae"`` in Infinity's VAE
    file) when the file has it; a ``"state_dict"`` wrapper is always unwrapped."""
    import torch

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
            f"file ({type(e).__name__}: {_first_line(e)}). Re-download or re-create it."
        ) from None
    for wrapper in (entry, "state_dict"):
        if wrapper and isinstance(sd, Mapping) and isinstance(sd.get(wrapper), Mapping):
            sd = sd[wrapper]
    if not isinstance(sd, Mapping) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"{path} holds a {type(sd).__name__}, not a state_dict of tensors")
    return dict(sd)


def _first_line(e: Exception) -> str:
    """The reason in a loader's error, without torch.load's advice to retry with weights_only=False (which
    would run whatever code the file pickles, and cannot read a truncated or foreign file either)."""
    text = str(e)
    marker = "WeightsUnpickler error:"   # torch.load(weights_only=True): the reason follows its advice
    if marker in text:
        text = text.split(marker, 1)[1]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0].split(". ", 1)[0].rstrip(".") if lines else ""


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


def load_built(build, sd: Mapping[str, "torch.Tensor"], what: str, device="cpu", requires_grad: bool = False):
    """``build()`` on the meta device (no memory), ``sd`` loaded strictly into it — after the model's
    own ``adapt_state_dict`` if it has one (official lenient loaders' key fixes) — with floating
    tensors upcast to fp32 (the tiny world stores fp16), moved to ``device`` in eval mode."""
    import torch
    with torch.device("meta"):
        model = build()
    if hasattr(model, "adapt_state_dict"):
        sd = model.adapt_state_dict(sd)   # outside the meta context: constants it adds are real
    sd = {k: v.float() if v.is_floating_point() else v for k, v in sd.items()}
    load_strict(model, sd, what, assign=True)
    return model.to(device).eval().requires_grad_(requires_grad)


_SHA_CACHE: Dict[Tuple[str, int, int], str] = {}


def sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file; cached per process by (path, size, mtime) so record keys stay cheap."""
    st = os.stat(path)
    key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
    if key not in _SHA_CACHE:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(chunk):
                h.update(block)
        _SHA_CACHE[key] = h.hexdigest()
    return _SHA_CACHE[key]


# The make target that retrains a manifest entry (the class-conditional tiny world otherwise).
RETRAIN = {"tiny-bsq": "make tiny-t2i", "tiny-t2i": "make tiny-t2i", "tiny-t2i-text": "make tiny-t2i"}


def check_manifest(path: str | os.PathLike, manifest: Optional[str | os.PathLike] = None) -> str:
    """sha256 of ``path``, checked against the ``manifest.json`` beside it (if there is one and it lists
    the file). A file changed since it was shipped or trained is an error, not a silent new result."""
    import json

    path = Path(path)
    digest = sha256(path)
    manifest = Path(manifest) if manifest else path.parent / "manifest.json"
    if not manifest.is_file():
        return digest
    try:
        entries = json.loads(manifest.read_text(encoding="utf-8")).get("models", {})
    except (ValueError, AttributeError) as e:
        raise CheckpointError(f"{manifest} is not a readable manifest ({e})") from None
    for name, entry in entries.items():
        if isinstance(entry, dict) and entry.get("file") == path.name and entry.get("sha256") not in (None, digest):
            raise CheckpointError(
                f"{path} does not match {manifest} ({name}: sha256 {digest[:12]}…, manifest says "
                f"{entry['sha256'][:12]}…). Restore the shipped file (git checkout -- {path.name}) or retrain "
                f"it with `{RETRAIN.get(name, 'make tiny-models')}`, which rewrites the manifest.")
    return digest
