"""Files and provenance, one place for both: atomic writes, writable-folder checks, git metadata.

Used by records, rendered tables, the feature CNN and the training recipes. Torch-free at import.

- ``atomic_write_text`` / ``atomic_write_bytes`` / ``atomic_write``: readers see the old file or the new one, never a
  mix; a process killed mid-write leaves at worst a hidden ``.<name>.*.tmp`` file. The file gets the
  permissions a plain ``open(path, "w")`` would (``0666 & ~umask``), so a shared results folder works.
- ``save_png`` / ``read_image``: image files of sample folders (lossless PNG, written atomically; read
  back as uint8 [3, H, W] bit for bit).
- ``check_writable_dir``: fail before hours of work, not after, when an output folder cannot be used.
- ``git_commit`` / ``git_dirty``: the varbench checkout a result came from. An installed copy (``pip
  install .``, a wheel) reports the commit it was built from, which the build wrote into
  ``bench/_build_info.json`` (setup.py); ``"unknown"`` / None when neither is there (a build without git).
"""
from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import BinaryIO, Callable, Optional

PACKAGE_ROOT = Path(__file__).resolve().parent      # bench/
SOURCE_ROOT = PACKAGE_ROOT.parent                    # the checkout (or site-packages when installed)


def _umask() -> int:
    mask = os.umask(0)   # the only portable way to read it: set, then restore at once
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temporary file, fsync, ``os.replace``); folders are created."""
    return atomic_write(path, lambda fh: fh.write(data))


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> Path:
    """``write(fh)`` into a temporary file beside ``path``, then fsync and ``os.replace`` (for what is
    too large to hold twice in memory, e.g. ``torch.save`` of a whole model)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())   # mkstemp creates 0600; give the file the user's usual mode
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename itself durable; not every platform can open a directory
        dfd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return path
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
    return path


def canonical_safetensors(data: bytes) -> bytes:
    """The bytes of a safetensors file with its ``__metadata__`` keys sorted.

    safetensors writes the metadata map in hash order, which changes from call to call once there is
    more than one key, so equal weights could give files with different sha256 (and record keys
    hash the files). Sorting the keys (same header length, same values) makes the bytes a function
    of the tensors and metadata only. A header in an unexpected layout is returned unchanged, with a
    warning.
    """
    n = struct.unpack("<Q", data[:8])[0]
    raw = data[8:8 + n]
    header = json.loads(raw)
    meta = header.get("__metadata__")
    if not meta or len(meta) < 2:
        return data
    if json.dumps(header, separators=(",", ":")).encode() != raw.rstrip(b" "):
        warnings.warn("unexpected safetensors header layout; metadata order left as written", stacklevel=2)
        return data
    header = {"__metadata__": dict(sorted(meta.items())), **{k: v for k, v in header.items() if k != "__metadata__"}}
    return data[:8] + json.dumps(header, separators=(",", ":")).encode().ljust(n, b" ") + data[8 + n:]


def save_png(path: str | os.PathLike, img_3HW) -> Path:
    """A uint8 image [3, H, W] (torch or numpy) as a PNG, atomically; folders are created."""
    import numpy as np
    from PIL import Image
    arr = np.ascontiguousarray(np.asarray(img_3HW.cpu() if hasattr(img_3HW, "cpu") else img_3HW).transpose(1, 2, 0))
    return atomic_write(path, lambda fh: Image.fromarray(arr).save(fh, format="PNG"))


def read_rgb(path: str | os.PathLike, remedy: str = "delete it and make it again", exif: bool = False):
    """An image file (PNG, JPEG, …) as a uint8 numpy array [H, W, 3], RGB (``exif``: turned upright by its
    EXIF orientation first). A truncated or foreign file is a ``ValueError`` naming it and ``remedy``:
    PIL's own error names neither."""
    import numpy as np
    from PIL import Image, ImageOps
    try:
        with Image.open(path) as im:
            return np.array((ImageOps.exif_transpose(im) if exif else im).convert("RGB"))
    except OSError as e:
        raise ValueError(f"{path}: unreadable image ({e}); {remedy}") from None


def read_image(path: str | os.PathLike, remedy: str = "delete it and make it again"):
    """``read_rgb`` as a uint8 torch tensor [3, H, W]."""
    import torch
    return torch.from_numpy(read_rgb(path, remedy)).permute(2, 0, 1)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """``atomic_write_bytes`` of UTF-8 text."""
    return atomic_write_bytes(path, text.encode("utf-8"))


class OutputDirError(OSError):
    """An output folder that cannot be created or written (a file in its place, read-only, ...)."""


def check_writable_dir(path: str | os.PathLike, what: str = "output folder", create: bool = True) -> Path:
    """Create ``path`` if needed and prove it writable (a probe file is created and removed). With
    ``create=False`` nothing is made: its nearest existing folder must be a folder this process may write
    (for a command that may yet fail without writing anything).

    Raises ``OutputDirError`` naming the folder and the reason; call it before the work starts. An empty
    string is refused (``Path("")`` would be the current folder, which nobody means by it).
    """
    if isinstance(path, str) and not path.strip():
        raise OutputDirError(f"{what}: the path is empty; give a folder")
    path = Path(path)
    for parent in (path, *path.parents):
        if parent.exists() and not parent.is_dir():
            raise OutputDirError(f"{what} {path}: {parent} is a file, not a folder")
        if parent.exists():
            break
    if not create:
        if not os.access(parent, os.W_OK | os.X_OK):
            raise OutputDirError(f"{what} {path} is not writable ({parent}: permission denied); choose another folder")
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".varbench-write-check.")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise OutputDirError(f"{what} {path} is not writable ({e.strerror or e}); choose another folder") from None
    return path


def check_writable_file(path: str | os.PathLike, what: str = "output file", example: str = "out") -> Path:
    """Refuse an output file path that cannot be written as a file (empty, an existing folder, under a
    file, an unwritable folder) with ``OutputDirError``, creating its folder; call it before the work."""
    if isinstance(path, str) and not path.strip():
        raise OutputDirError(f"{what}: the path is empty; give a file name")
    path = Path(path)
    if path.is_dir():
        raise OutputDirError(f"{what} {path} is a folder; give a file name (e.g. {path / example})")
    check_writable_dir(path.parent, f"{what} {path}: its folder")
    return path


def _git(*args: str) -> Optional[str]:
    try:
        out = subprocess.run(["git", *args], cwd=SOURCE_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


BUILD_INFO = PACKAGE_ROOT / "_build_info.json"   # written by setup.py's build_py into an installed copy only


def build_info() -> dict:
    """What the build of an installed copy recorded (``git_commit``, ``git_dirty``, ``built``); {} if none.

    A damaged file counts as none: provenance must never stop a run, and "unknown" is the honest answer.
    """
    try:
        info = json.loads(BUILD_INFO.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(info, dict) or not isinstance(info.get("git_commit"), str) \
            or not re.fullmatch(r"[0-9a-f]{40}", info["git_commit"]):
        return {}
    return info


def git_commit() -> str:
    """The commit of the varbench checkout; in an installed copy, the commit it was built from; else ``"unknown"``."""
    if not (SOURCE_ROOT / ".git").exists():
        # an installed copy: never the commit of whatever repository site-packages sits in
        return build_info().get("git_commit", "unknown")
    return _git("rev-parse", "HEAD") or "unknown"


def git_dirty() -> Optional[bool]:
    """True if tracked files differ from HEAD (at build time for an installed copy), None when unknown."""
    if not (SOURCE_ROOT / ".git").exists():
        dirty = build_info().get("git_dirty")
        return dirty if isinstance(dirty, bool) else None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return None if status is None else bool(status)
