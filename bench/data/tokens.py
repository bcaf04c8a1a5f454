"""Token pyramids of image sets: what calibration and training data look like to a VAR model."""
from __future__ import annotations

from typing import List

import torch
from tqdm.auto import tqdm


@torch.no_grad()
def tokenize_images(vae, imgs_uint8: torch.Tensor, batch: int = 512, progress: bool = True,
                    desc: str = "tokenize") -> List[torch.Tensor]:
    """The VQVAE's multi-scale token pyramid (one [N, pn²] int64 tensor per scale) of uint8 images
    [N, 3, H, W], encoded in batches on the VQVAE's device and returned on the CPU."""
    device = next(vae.parameters()).device
    parts: List[List[torch.Tensor]] = []
    for i in tqdm(range(0, len(imgs_uint8), batch), desc=desc, disable=not progress):
        x = imgs_uint8[i:i + batch].to(device).float().div(127.5).sub(1)
        parts.append([t.cpu() for t in vae.img_to_idx(x)])
    return [torch.cat([p[si] for p in parts]) for si in range(len(parts[0]))]
