"""Pair metrics (fidelity to the original model): PSNR, SSIM against a direct computation, FID* of a
set against itself, and our FID against clean-fid's on identical feature sets."""
import numpy as np
import pytest
import torch

from bench.metrics import pairs


def _imgs(n=3, seed=0, size=16):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.uint8)


def test_psnr_per_pair_and_its_cap():
    a = _imgs()
    b = a.clone()
    b[1] = (b[1].int() + 10).clamp(0, 255).to(torch.uint8)
    p = pairs.psnr(a, b)
    assert p[0] == p[2] == pairs.PSNR_CAP                     # identical pairs: the documented cap
    mse = ((a[1].double() - b[1].double()) / 255).pow(2).mean()
    assert p[1].item() == pytest.approx(10 * np.log10(1 / mse.item()))
    with pytest.raises(ValueError, match="same shape"):
        pairs.psnr(a, b[:2])


def _ssim_direct(x, y, window=11, sigma=1.5):
    """SSIM by its definition, window by window (numpy), for one [C, H, W] pair in [0, 1]."""
    d = np.arange(window) - (window - 1) / 2
    g = np.exp(-(d / sigma) ** 2 / 2)
    w = np.outer(g, g) / np.outer(g, g).sum()
    C, H, W = x.shape
    vals = []
    for c in range(C):
        for i in range(H - window + 1):
            for j in range(W - window + 1):
                px, py = x[c, i:i + window, j:j + window], y[c, i:i + window, j:j + window]
                mx, my = (w * px).sum(), (w * py).sum()
                vx, vy = (w * px * px).sum() - mx ** 2, (w * py * py).sum() - my ** 2
                cxy = (w * px * py).sum() - mx * my
                c1, c2 = 0.01 ** 2, 0.03 ** 2
                vals.append((2 * mx * my + c1) * (2 * cxy + c2) / ((mx ** 2 + my ** 2 + c1) * (vx + vy + c2)))
    return float(np.mean(vals))


def test_ssim_equals_the_definition():
    a, b = _imgs(2, 0), _imgs(2, 1)
    b[0] = a[0] // 2 + b[0] // 2
    s = pairs.ssim(a, b)
    for k in range(2):
        assert s[k].item() == pytest.approx(_ssim_direct(a[k].numpy() / 255, b[k].numpy() / 255), abs=1e-10)
    assert torch.allclose(pairs.ssim(a, a), torch.ones(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="at least 11"):
        pairs.ssim(a[:, :, :8, :8], b[:, :, :8, :8])


def test_fid_star_of_a_set_against_itself_and_clean_fid_agreement():
    from cleanfid.fid import frechet_distance

    from bench.metrics.fidelity import fid_statistics
    g = torch.Generator().manual_seed(0)
    f1 = torch.randn(400, 16, generator=g)
    f2 = torch.randn(400, 16, generator=g) * 1.3 + 0.2
    assert abs(pairs.fid_star(f1, f1)) < 1e-6
    ours = pairs.fid_star(f1, f2)
    s1, s2 = fid_statistics(f1), fid_statistics(f2)
    theirs = frechet_distance(s1["mu"], s1["sigma"], s2["mu"], s2["sigma"])
    assert ours > 1 and ours == pytest.approx(theirs, rel=1e-6)


def test_lpips_is_torchmetrics_alex_per_pair_from_a_local_backbone(tmp_path):
    """LPIPS per pair equals torchmetrics' metric on each pair (same AlexNet file, here seeded random
    weights); the backbone is read from the given file, never downloaded; the hub folder is restored."""
    import torchvision
    from torchmetrics.image.lpip import LearnedPerceptualImagePatchSimilarity
    torch.manual_seed(0)
    w = tmp_path / pairs.ALEXNET_FILE
    torch.save(torchvision.models.alexnet(weights=None).state_dict(), w)
    hub = torch.hub.get_dir()
    a, b = _imgs(3, 0, 32), _imgs(3, 1, 32)
    b[0] = a[0]
    got = pairs.lpips(a, b, w)
    assert torch.hub.get_dir() == hub
    assert got[0].item() == pytest.approx(0.0, abs=1e-7) and (got[1:] > 0).all()
    (tmp_path / "hub" / "checkpoints").mkdir(parents=True)
    (tmp_path / "hub" / "checkpoints" / pairs.ALEXNET_FILE).symlink_to(w)
    torch.hub.set_dir(str(tmp_path / "hub"))
    try:
        ref = LearnedPerceptualImagePatchSimilarity(net_type="alex", normalize=True)
    finally:
        torch.hub.set_dir(hub)
    for i in range(3):
        ref.reset()
        ref.update(a[i:i + 1].float() / 255, b[i:i + 1].float() / 255)
        assert got[i].item() == pytest.approx(ref.compute().item(), rel=1e-5, abs=1e-7)
    with pytest.raises(FileNotFoundError, match=pairs.ALEXNET_FILE):
        pairs.lpips(a, b, tmp_path / "missing.pth")


def test_ssim_refuses_pairs_of_different_shape_and_images_smaller_than_its_window():
    a = _imgs(2, seed=1, size=11)
    assert pairs.ssim(a, a).tolist() == pytest.approx([1.0, 1.0])        # one window exactly: fine
    with pytest.raises(ValueError) as e:
        pairs.ssim(a[:, :, :10, :], a[:, :, :10, :])
    assert str(e.value) == "SSIM needs images of at least 11×11 pixels, got 10×11"
    with pytest.raises(ValueError) as e:
        pairs.ssim(a, _imgs(2, seed=1, size=12))
    assert str(e.value) == "image pairs must have the same shape: (2, 3, 11, 11) vs (2, 3, 12, 12)"
