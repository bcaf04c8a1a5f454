"""Sample grids: images with their prompts underneath, saved as one PNG (matplotlib, no display)."""
from __future__ import annotations

import math
import os
import textwrap
from pathlib import Path
from typing import Sequence


def save_grid(imgs_uint8, captions: Sequence[str], path: str | os.PathLike, cols: int = 4, cell_inches: float = 1.6) -> Path:
    """``imgs_uint8`` [N, 3, H, W] (torch or numpy), one caption per image; pixels drawn unsmoothed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    arr = np.asarray(imgs_uint8.cpu() if hasattr(imgs_uint8, "cpu") else imgs_uint8)
    if arr.ndim != 4 or arr.shape[1] != 3 or len(arr) != len(captions):
        raise ValueError(f"need images [N, 3, H, W] and N captions, got {arr.shape} and {len(captions)}")
    n = len(arr)
    cols = max(1, min(cols, n))
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * cell_inches, rows * (cell_inches + 0.45)), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for i, (img, cap) in enumerate(zip(arr, captions)):
        ax = axes.flat[i]
        ax.imshow(img.transpose(1, 2, 0), interpolation="nearest")
        ax.set_title("\n".join(textwrap.wrap(cap, 22)), fontsize=7, y=-0.02, va="top")
    fig.tight_layout(pad=0.3, h_pad=1.2)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
