"""tinyshapes: the tiny world's procedurally generated, class-conditional image set.

Each image is one coloured shape on a background: class = shape × colour (4 × 3 = 12 classes).
Coarse scales carry the structure (which shape, which colour, where); fine scales carry the
texture (a soft background gradient, mild band-limited noise, shading on the shape, anti-aliased
edges). Size, position, rotation of the triangle, hue/brightness jitter and the background are
random. Nothing is stored: images are generated on the fly, deterministically from (split, index) in
chunks of ``CHUNK`` images, so the first k images of a split never depend on how many are asked for.

Splits are seeds: ``train``, ``val`` (model selection, PSNR), ``ref`` (the reference set of the
``shapes-c2i`` bench), ``calib`` (calibration data for pruning methods). Labels cycle through the
classes (index mod 12), so every prefix of a split is class-balanced.
"""
from __future__ import annotations

import math
from typing import Tuple

import torch
import torch.nn.functional as F

from bench.models.generator import to_uint8
from bench.tiny.configs import CLASSES, COLOURS, NUM_CLASSES, SHAPES  # noqa: F401  (the class vocabulary)

SPLIT_SEEDS = {"train": 1_000_003, "val": 2_000_003, "ref": 3_000_017, "calib": 4_000_037}
CHUNK = 256
SUPERSAMPLE = 4  # anti-aliasing: draw at 4× and average-pool


def class_name(label: int) -> str:
    return CLASSES[label]


def _chunk(split: str, chunk: int, size: int) -> Tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(SPLIT_SEEDS[split] * 7919 + chunk)
    n, S = CHUNK, size * SUPERSAMPLE
    labels = (torch.arange(chunk * CHUNK, (chunk + 1) * CHUNK) % NUM_CLASSES)
    shape_id, colour_id = labels // len(COLOURS), labels % len(COLOURS)
    u = lambda *s: torch.rand(*s, generator=g)  # noqa: E731

    # coordinates in [-1, 1], pixel centres
    ax = (torch.arange(S, dtype=torch.float32) + 0.5) / S * 2 - 1
    yy, xx = torch.meshgrid(ax, ax, indexing="ij")          # S, S

    # background: linear gradient between two muted colours at a random angle + band-limited noise
    c0, c1 = 0.25 + 0.45 * u(n, 3), 0.25 + 0.45 * u(n, 3)
    ang = u(n) * 2 * math.pi
    t = ((xx[None] * ang.cos()[:, None, None] + yy[None] * ang.sin()[:, None, None]) * 0.5 + 0.5).clamp(0, 1)
    bg = c0[:, :, None, None] * (1 - t[:, None]) + c1[:, :, None, None] * t[:, None]
    noise = F.interpolate(u(n, 1, 8, 8) - 0.5, size=(S, S), mode="bicubic", align_corners=False)
    bg = bg + 0.06 * noise

    # shape: size (half-extent) 0.28–0.55, centre kept inside the frame
    r = 0.28 + 0.27 * u(n)
    cx, cy = (u(n) * 2 - 1) * (0.95 - r), (u(n) * 2 - 1) * (0.95 - r)
    dx, dy = xx[None] - cx[:, None, None], yy[None] - cy[:, None, None]
    rr = r[:, None, None]
    circle = dx.square() + dy.square() <= rr.square()
    square = (dx.abs() <= rr * 0.85) & (dy.abs() <= rr * 0.85)
    rot = (u(n) * 2 - 1)[:, None, None] * 0.35   # small random rotation of the triangle
    tx, ty = dx * rot.cos() - dy * rot.sin(), dx * rot.sin() + dy * rot.cos()
    triangle = (ty <= rr * 0.8) & (ty >= -rr + 2 * tx.abs() * 0.9)
    arm = rr * 0.32
    cross = ((dx.abs() <= arm) & (dy.abs() <= rr)) | ((dy.abs() <= arm) & (dx.abs() <= rr))
    masks = torch.stack((circle, square, triangle, cross), 1)           # n, 4, S, S
    mask = masks.gather(1, shape_id[:, None, None, None].expand(-1, 1, S, S)).float()

    # foreground colour with hue/brightness jitter and shading (light from the top left)
    base = torch.tensor(list(COLOURS.values()))[colour_id]              # n, 3
    fg = (base * (0.85 + 0.3 * u(n, 1)) + 0.06 * (u(n, 3) - 0.5)).clamp(0, 1)
    shade = 1 + 0.18 * (-(dx + dy) / (2 * rr)).clamp(-1, 1)
    fg_img = fg[:, :, None, None] * shade[:, None] + 0.04 * noise

    img = bg * (1 - mask) + fg_img * mask
    img = F.avg_pool2d(img, SUPERSAMPLE).clamp(0, 1)
    return to_uint8(img), labels


def generate(n: int, split: str = "train", size: int = 32, start: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """Images uint8 [n, 3, size, size] and labels int64 [n] for indices start … start+n−1 of a split."""
    if split not in SPLIT_SEEDS:
        raise ValueError(f"unknown split {split!r}; splits are {', '.join(SPLIT_SEEDS)}")
    if n < 0 or start < 0:
        raise ValueError(f"n and start must be ≥ 0, got n={n}, start={start}")
    first, last = start // CHUNK, (start + n + CHUNK - 1) // CHUNK
    imgs, labels = zip(*(_chunk(split, c, size) for c in range(first, max(last, first + 1)))) if n else ((), ())
    if not n:
        return torch.zeros(0, 3, size, size, dtype=torch.uint8), torch.zeros(0, dtype=torch.long)
    off = start - first * CHUNK
    return torch.cat(imgs)[off:off + n], torch.cat(labels)[off:off + n]


def to_pm1(img_uint8: torch.Tensor) -> torch.Tensor:
    """uint8 [0, 255] → float [-1, 1] (VAR's normalisation)."""
    return img_uint8.float().div(127.5).sub(1)
