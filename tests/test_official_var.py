"""varbench against golden outputs of the official FoundationVision/VAR code.

``tests/fixtures/official/var_golden.safetensors`` holds a small model (VQVAE + 2-block VAR with
cosine attention, 5 scales) with seeded weights, and what the official code computed with them: the
token pyramid of an image batch, f_hat per scale, the reconstruction, the teacher-forcing input and
logits, and seeded CFG samples (tokens and images). Here the same weights go into varbench's classes
with strict loading and every output must match: tokens exactly, floats within the tolerances below.
Both models run as the official demo runs them (eval, ``requires_grad_(False)``) and on one CPU
thread; on the machine that made the fixture that reproduces every tensor bit for bit. The bounds
leave room for other CPUs (fp32 rounding, ~1e-6); a real bug moves these outputs by ~1e-2 or more.

Regenerate the fixture with ``tests/fixtures/official/make_var_golden.py`` (see its docstring).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.checkpoint import load_strict
from bench.models.configs import VARConfig, VQVAEConfig
from bench.models.generator import Generator, to_uint8
from bench.models.var import VAR
from bench.models.vqvae import VQVAE

FIXTURE = Path(__file__).parent / "fixtures" / "official" / "var_golden.safetensors"
REGENERATE = ("regenerate it from a FoundationVision/VAR checkout: "
              "python tests/fixtures/official/make_var_golden.py --official /path/to/VAR "
              "(see tests/fixtures/official/README.md)")

# Tolerances (max abs difference, fp32).
LOGITS_ATOL = 1e-5      # logits reach ~12
LATENT_ATOL = 1e-5      # teacher-forcing input, f_hat per scale
IMAGE_ATOL = 1e-5       # reconstruction and sampled images, in [-1, 1] / [0, 1]
# more_smooth feeds logits·(1+ratio)/τ with τ down to 0.0135 through a softmax: last-bit logit
# differences grow ~100-fold before they reach the image.
SMOOTH_IMAGE_ATOL = 2e-4


def _n_samplings() -> int:
    """Sampling settings in the fixture (read from its header at collection time; 1 if it is missing,
    so the test still runs and fails with the regeneration message)."""
    if not FIXTURE.is_file():
        return 1
    from safetensors import safe_open
    with safe_open(str(FIXTURE), framework="pt") as f:
        return len(json.loads(f.metadata()["golden"])["samplings"])


@pytest.fixture(scope="module")
def golden():
    if not FIXTURE.is_file():
        pytest.fail(f"golden fixture {FIXTURE} is missing; {REGENERATE}", pytrace=False)
    from safetensors import safe_open
    from safetensors.torch import load_file
    with safe_open(str(FIXTURE), framework="pt") as f:
        meta = json.loads(f.metadata()["golden"])
    return load_file(str(FIXTURE)), meta


def _config(cls, d: dict):
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def _part(tensors: dict, prefix: str) -> dict:
    # parameters are stored as fp16 holding exactly the fp32 values the official run used
    return {k[len(prefix):]: (v.float() if v.dtype == torch.float16 else v)
            for k, v in tensors.items() if k.startswith(prefix)}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def gen(golden) -> Generator:
    tensors, meta = golden
    vae = VQVAE(_config(VQVAEConfig, meta["varbench_vqvae_config"]))
    var = VAR(_config(VARConfig, meta["varbench_var_config"]))
    load_strict(vae, _part(tensors, "vae."), "official VQVAE state_dict")
    load_strict(var, _part(tensors, "var."), "official VAR state_dict")
    # as the official demo: eval and no grad on every weight (some CPU matmul paths round differently
    # when a weight requires grad, even under no_grad)
    return Generator(var, vae, name="official-golden").eval().requires_grad_(False)


def _split(idx_BL: torch.Tensor, patch_nums) -> list:
    return list(idx_BL.split([pn * pn for pn in patch_nums], dim=1))


def _maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def test_state_dicts_round_trip(golden, gen):
    tensors, _ = golden
    for prefix, model in (("vae.", gen.vae), ("var.", gen.var)):
        want = _part(tensors, prefix)
        got = model.state_dict()
        assert got.keys() == want.keys()
        for k, v in want.items():
            assert torch.equal(got[k], v), k


def test_token_pyramid_is_identical(golden, gen):
    tensors, _ = golden
    with torch.no_grad():
        idx = gen.vae.img_to_idx(tensors["input.img_B3HW"])
    want = _split(tensors["official.idx_BL"], gen.patch_nums)
    for si, (a, b) in enumerate(zip(idx, want)):
        assert torch.equal(a, b), f"scale {si}: {(a != b).sum().item()} of {b.numel()} tokens differ"


def test_fhat_per_scale_and_reconstruction(golden, gen):
    tensors, _ = golden
    img = tensors["input.img_B3HW"]
    with torch.no_grad():
        f_BChw = gen.vae.quant_conv(gen.vae.encoder(img))
        fhats = gen.vae.quantize.f_to_idx(f_BChw, to_fhat=True)
        recon = gen.vae.reconstruct(img)
        recon_from_idx = gen.vae.idx_to_img(_split(tensors["official.idx_BL"], gen.patch_nums))
    for si, (a, b) in enumerate(zip(fhats, tensors["official.fhat_SBChw"])):
        assert _maxdiff(a, b) <= LATENT_ATOL, f"f_hat after scale {si}: max diff {_maxdiff(a, b):.3g}"
    want = tensors["official.recon_B3HW"]
    assert _maxdiff(recon, want) <= IMAGE_ATOL, f"reconstruction: max diff {_maxdiff(recon, want):.3g}"
    assert _maxdiff(recon_from_idx, want) <= IMAGE_ATOL, f"idx→img: max diff {_maxdiff(recon_from_idx, want):.3g}"


def test_teacher_forcing_input_and_logits(golden, gen):
    tensors, _ = golden
    tokens = _split(tensors["official.idx_BL"], gen.patch_nums)
    label_B = tensors["input.label_B"]   # its last label is the null class
    want_in, want_logits = tensors["official.var_input_BLCv"], tensors["official.logits_BLV"]
    with torch.no_grad():
        var_in = gen.vae.quantize.idx_to_var_input(tokens)
        logits_on_official_input = gen.var(label_B, want_in)
        logits = gen.forward_teacher(label_B, tokens)
    assert _maxdiff(var_in, want_in) <= LATENT_ATOL, f"var input: max diff {_maxdiff(var_in, want_in):.3g}"
    d = _maxdiff(logits_on_official_input, want_logits)
    assert d <= LOGITS_ATOL, f"logits on the official input: max diff {d:.3g}"
    d = _maxdiff(logits, want_logits)
    assert d <= LOGITS_ATOL, f"logits end to end: max diff {d:.3g}"


@pytest.mark.parametrize("i", range(_n_samplings()))
def test_cfg_sampling_matches_official(golden, gen, i):
    tensors, meta = golden
    s = dict(meta["samplings"][i])
    label_B = tensors["input.label_sample_B"]
    kw = dict(seed=s["g_seed"], cfg=s["cfg"], top_k=s["top_k"], top_p=s["top_p"], more_smooth=s["more_smooth"])
    tokens, f_hat = gen.sample_tokens(label_B, **kw)
    want_tokens = _split(tensors[f"sample.{i}.idx_BL"], gen.patch_nums)
    for si, (a, b) in enumerate(zip(tokens, want_tokens)):
        assert torch.equal(a, b), f"setting {s}: scale {si}: {(a != b).sum().item()} of {b.numel()} tokens differ"
    with torch.no_grad():
        img_01 = gen.vae.fhat_to_img(f_hat).add_(1).mul_(0.5)
    want_img = tensors[f"sample.{i}.img_B3HW"]
    atol = SMOOTH_IMAGE_ATOL if s["more_smooth"] else IMAGE_ATOL
    assert _maxdiff(img_01, want_img) <= atol, f"setting {s}: image max diff {_maxdiff(img_01, want_img):.3g}"

    # The public entry point gives the official image as saved to PNG: identical uint8 values, except
    # that a pixel whose official value lies within `atol` of a rounding boundary may round either way.
    got_u8, want_u8 = gen.generate(label_B, **kw), to_uint8(want_img.clone())
    x = want_img * 255 + 0.5
    near_boundary = (x - x.round()).abs() <= 255 * atol
    off = got_u8 != want_u8
    assert not (off & ~near_boundary).any(), f"setting {s}: {(off & ~near_boundary).sum().item()} uint8 pixels differ"
    assert (got_u8.int() - want_u8.int()).abs().max() <= 1, f"setting {s}: uint8 pixels differ by more than 1"
