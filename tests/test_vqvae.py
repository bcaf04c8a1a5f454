import numpy as np
import torch

from bench.models.vqvae import PHI_INDEX_4_OF_10, VQVAE, phi_index_map
from tests.conftest import SMALL_VAE, randomize_


def test_phi_map_pinned_and_equal_to_float64_numpy():
    assert PHI_INDEX_4_OF_10 == (0, 0, 1, 1, 1, 2, 2, 3, 3, 3)
    K, SN = 4, 10
    ticks = np.linspace(1 / 3 / K, 1 - 1 / 3 / K, K)
    assert tuple(int(np.argmin(np.abs(ticks - si / (SN - 1)))) for si in range(SN)) == PHI_INDEX_4_OF_10
    for SN in (5, 7, 10):   # the general rule is the same float64 argmin
        assert phi_index_map(4, SN) == tuple(int(np.argmin(np.abs(ticks - si / (SN - 1)))) for si in range(SN))


def test_token_pyramid_round_trip():
    vae = randomize_(VQVAE(SMALL_VAE), 0).eval()
    img = torch.rand(2, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        idx = vae.img_to_idx(img)
        assert [t.shape for t in idx] == [(2, pn * pn) for pn in SMALL_VAE.patch_nums]
        f = vae.quant_conv(vae.encoder(img))
        fhats = vae.quantize.f_to_idx(f, to_fhat=True)
        assert torch.allclose(vae.quantize.idx_to_fhat(idx), fhats[-1], atol=1e-5)
        assert torch.allclose(vae.idx_to_img(idx), vae.reconstruct(img), atol=1e-5)
        x = vae.quantize.idx_to_var_input(idx)
        L = sum(pn * pn for pn in SMALL_VAE.patch_nums)
        assert x.shape == (2, L - 1, SMALL_VAE.z_channels)
        # the teacher-forcing input of scale k+1 is f_hat after scale k, area-downsampled
        pn = SMALL_VAE.patch_nums[2]
        start = 1 + 4
        ref = torch.nn.functional.interpolate(fhats[1], size=(pn, pn), mode="area").flatten(2).transpose(1, 2)
        assert torch.allclose(x[:, start - 1:start - 1 + pn * pn], ref, atol=1e-5)


def test_training_forward_gives_gradients_to_encoder_decoder_codebook():
    vae = randomize_(VQVAE(SMALL_VAE), 2).train()
    rec, vq_loss, hits = vae(torch.rand(2, 3, 32, 32) * 2 - 1)
    (rec.square().mean() + vq_loss).backward()
    assert vae.encoder.conv_in.weight.grad is not None and vae.decoder.conv_out.weight.grad is not None
    assert vae.quantize.embedding.weight.grad.abs().sum() > 0
    assert int(hits.sum()) == 2 * sum(pn * pn for pn in SMALL_VAE.patch_nums)
