"""Fidelity to the original model: metrics of image *pairs* (a method's output and the unmodified
model's output for the same prompt index and seed), as ScaleKV and DistriFusion report them.

- ``psnr``: per image, 10·log10(1 / MSE) on [0, 1] images, the MSE over channels and pixels
  (torchmetrics ``PeakSignalNoiseRatio(data_range=(0, 1), dim=(1, 2, 3))``, per image, then the mean).
  Identical images have an infinite PSNR; here the MSE is floored at 1e-10, so an identical pair
  scores exactly ``PSNR_CAP`` = 100 dB and a mean over pairs stays finite.
- ``ssim``: per image, the mean SSIM map (Gaussian window 11×11, σ 1.5, k1 0.01, k2 0.03: torchmetrics
  ``StructuralSimilarityIndexMeasure``'s constants) over the windows that lie inside the image,
  averaged over channels, with data range 1 for [0, 1] images. torchmetrics differs in two ways: it
  reflect-pads the image and averages the whole map, and by default infers the data range from the
  images (on a smooth 256² pair with noise: 0.2982 here, 0.2936 from torchmetrics 1.9).
- ``lpips`` (paper world, when AlexNet's weights are given): torchmetrics'
  ``LearnedPerceptualImagePatchSimilarity(net_type="alex", normalize=True)`` per pair, as ScaleKV and
  DistriFusion compute it; its linear heads ship in the torchmetrics wheel (optional extra
  ``varbench[lpips]``), the AlexNet backbone is torchvision's ``alexnet-owt-7be5be79.pth``, read from
  the given path (never downloaded).
- ``fid_star``: FID between the two image sets' features (the world's extractor): 0 up to the
  round-off of the matrix square root (~1e-6) when the method changes nothing. Pairs do not matter to it; they matter to PSNR and SSIM.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

PSNR_CAP = 100.0          # dB: an identical pair (MSE floored at 1e-10)
SSIM_WINDOW, SSIM_SIGMA, SSIM_K1, SSIM_K2 = 11, 1.5, 0.01, 0.03


def _unit(x: torch.Tensor) -> torch.Tensor:
    """uint8 [N, C, H, W] (0–255) or float in [0, 1] → float64 in [0, 1]."""
    if x.dim() != 4:
        raise ValueError(f"expected images [N, C, H, W], got shape {tuple(x.shape)}")
    return x.double() / 255.0 if x.dtype == torch.uint8 else x.double()


def _check_pairs(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(f"image pairs must have the same shape: {tuple(a.shape)} vs {tuple(b.shape)}")


def psnr(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """PSNR (dB) of each pair [N] (see the module docstring for the cap)."""
    _check_pairs(a, b)
    mse = (_unit(a) - _unit(b)).pow(2).flatten(1).mean(1)
    return 10 * torch.log10(1.0 / mse.clamp_min(1e-10))


def _gauss(window: int, sigma: float) -> torch.Tensor:
    d = torch.arange((1 - window) / 2, (1 + window) / 2, 1.0, dtype=torch.float64)
    g = torch.exp(-(d / sigma) ** 2 / 2)
    return g / g.sum()


def ssim(a: torch.Tensor, b: torch.Tensor, window: int = SSIM_WINDOW, sigma: float = SSIM_SIGMA) -> torch.Tensor:
    """Mean SSIM of each pair [N] (see the module docstring)."""
    _check_pairs(a, b)
    x, y = _unit(a), _unit(b)
    N, C, H, W = x.shape
    if min(H, W) < window:
        raise ValueError(f"SSIM needs images of at least {window}×{window} pixels, got {H}×{W}")
    g = _gauss(window, sigma)
    kv, kh = g.view(1, 1, window, 1).expand(C, 1, window, 1), g.view(1, 1, 1, window).expand(C, 1, 1, window)

    def blur(t):   # the 2-D Gaussian window as two 1-D passes (separable; valid windows only)
        return F.conv2d(F.conv2d(t, kv, groups=C), kh, groups=C)

    mx, my = blur(x), blur(y)
    vx, vy, cxy = blur(x * x) - mx ** 2, blur(y * y) - my ** 2, blur(x * y) - mx * my
    c1, c2 = SSIM_K1 ** 2, SSIM_K2 ** 2
    s = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx ** 2 + my ** 2 + c1) * (vx + vy + c2))
    return s.flatten(1).mean(1)


def fid_star(feats_method, feats_original) -> float:
    """FID between the method's and the original model's output features (any extractor's)."""
    from bench.metrics.fidelity import fid_from_features
    return fid_from_features(feats_method, feats_original)


ALEXNET_FILE = "alexnet-owt-7be5be79.pth"     # torchvision's AlexNet IMAGENET1K_V1 (LPIPS' backbone)
_LPIPS = {}


def _lpips_model(alexnet_weights):
    """torchmetrics' LPIPS (alex) whose backbone torchvision reads from ``alexnet_weights`` (the hub cache
    is pointed at a temporary folder holding a link to it, so nothing is downloaded)."""
    import tempfile
    from pathlib import Path
    p = Path(alexnet_weights)
    if not p.is_file():
        raise FileNotFoundError(f"LPIPS needs AlexNet's weights: {p} not found (torchvision's {ALEXNET_FILE}, "
                                f"download.pytorch.org/models/{ALEXNET_FILE}; VARBENCH_LPIPS_ALEXNET)")
    key = str(p.resolve())
    if key not in _LPIPS:
        try:
            from torchmetrics.image.lpip import LearnedPerceptualImagePatchSimilarity
        except ImportError:
            raise ImportError("LPIPS needs torchmetrics: pip install 'varbench[lpips]'") from None
        old = torch.hub.get_dir()
        with tempfile.TemporaryDirectory(prefix="varbench-lpips-") as tmp:
            (Path(tmp) / "checkpoints").mkdir()
            (Path(tmp) / "checkpoints" / ALEXNET_FILE).symlink_to(p.resolve())
            torch.hub.set_dir(tmp)
            try:
                _LPIPS[key] = LearnedPerceptualImagePatchSimilarity(net_type="alex", normalize=True).eval()
            finally:
                torch.hub.set_dir(old)
    return _LPIPS[key]


@torch.no_grad()
def lpips(a: torch.Tensor, b: torch.Tensor, alexnet_weights) -> torch.Tensor:
    """LPIPS (alex) of each pair [N] (see the module docstring)."""
    _check_pairs(a, b)
    m = _lpips_model(alexnet_weights)
    x, y = _unit(a).float(), _unit(b).float()
    # the metric's own network on batches of 16 pairs (per pair: no batch statistics), before its mean
    return torch.cat([m.net(x[i:i + 16], y[i:i + 16], normalize=True).reshape(-1) for i in range(0, len(x), 16)]).double()
