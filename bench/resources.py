"""Where varbench's data files are: table specs and templates, dataset recipes, the shipped tiny world.

In a source checkout (``pip install -e .`` or no install) they are the top-level folders
``tables/``, ``datasets/`` and ``assets/tiny/``. A regular install (``pip install .``, a wheel)
carries copies of them as package data under ``bench/_data/`` (see ``pyproject.toml``), so the
``varbench`` command works from any folder. Torch-free.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from bench.io import PACKAGE_ROOT, SOURCE_ROOT

# name -> its path in a checkout, relative to the checkout root (package data mirrors the same path)
RESOURCES = ("tables", "tables/templates", "datasets", "assets/tiny", "figures", "sweeps")


def _is_checkout(root: Path) -> bool:
    pyproject = root / "pyproject.toml"
    return pyproject.is_file() and 'name = "varbench"' in pyproject.read_text(encoding="utf-8", errors="replace")


def resource_dir(name: str, required: bool = True) -> Optional[Path]:
    """The folder of resource ``name`` (one of ``RESOURCES``): the checkout's, else the installed copy."""
    if name not in RESOURCES:
        raise ValueError(f"unknown resource {name!r}; one of {', '.join(RESOURCES)}")
    candidates = []
    if _is_checkout(SOURCE_ROOT):
        candidates.append(SOURCE_ROOT / name)
    candidates.append(PACKAGE_ROOT / "_data" / name)
    for c in candidates:
        if c.is_dir():
            return c
    if required:
        raise FileNotFoundError(f"varbench's {name}/ folder is missing (looked in {', '.join(map(str, candidates))}); "
                                f"reinstall varbench")
    return None


def tiny_assets_dir() -> Path:
    """The tiny world's checkpoints: ``$VARBENCH_TINY_DIR`` if set, else the shipped ``assets/tiny``."""
    env = os.environ.get("VARBENCH_TINY_DIR")
    return Path(env) if env else resource_dir("assets/tiny")


def results_root(explicit: Optional[str | os.PathLike] = None) -> Path:
    """Record folder: the flag, else ``$VARBENCH_RESULTS``, else ``./results`` (the current folder)."""
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("VARBENCH_RESULTS") or "results")


def tables_out_dir(explicit: Optional[str | os.PathLike] = None) -> Path:
    """Rendered-table folder: the flag, else ``$VARBENCH_TABLES_OUT``, else ``./tables/out``."""
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("VARBENCH_TABLES_OUT") or Path("tables") / "out")


def figures_out_dir(explicit: Optional[str | os.PathLike] = None) -> Path:
    """Rendered-figure folder: the flag, else ``$VARBENCH_FIGURES_OUT``, else ``./figures/out``."""
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("VARBENCH_FIGURES_OUT") or Path("figures") / "out")
