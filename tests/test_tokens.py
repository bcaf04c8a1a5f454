"""Token pyramids of image sets (calibration and training data): the VQVAE's own tokens of the images
mapped from uint8 to [-1, 1], the same whatever the batch, one [N, pn²] int64 CPU tensor per scale."""
import pytest
import torch

from bench.data import tinyshapes
from bench.data.tokens import tokenize_images
from bench.registry import MODELS


@pytest.fixture(scope="module")
def vae():
    return MODELS.get("tiny-var")().vae


def test_tokens_are_the_vqvaes_own_in_any_batching(vae, capsys):
    imgs, _ = tinyshapes.generate(7, "calib")
    want = vae.img_to_idx(imgs.float() / 127.5 - 1)
    pn = MODELS.get("tiny-var").vae_cfg.patch_nums
    for batch in (7, 3, 1, 512):
        got = tokenize_images(vae, imgs, batch=batch, progress=False)
        assert [t.shape for t in got] == [(7, p * p) for p in pn]
        assert all(g.dtype == torch.int64 and g.device.type == "cpu" and torch.equal(g, w) for g, w in zip(got, want))
    assert capsys.readouterr().err == ""                         # no progress bar when asked for none
    tokenize_images(vae, imgs[:2], batch=1, desc="pyramids")
    err = capsys.readouterr().err
    assert "pyramids" in err and "2/2" in err                   # a bar, with its label and count, by default
