"""The prompt-sensitivity probe of text-to-image models (``bench.recipes.t2i_probe``)."""
import pytest
import torch

from bench.data.scenes import SceneObject, SceneSpec
from bench.models.bsq import BSQVAE
from bench.models.infinity import Infinity
from bench.models.t2i import T2IGenerator
from bench.models.text import TinyTextEncoder
from bench.recipes import t2i_probe
from bench.tiny import configs


def test_altered_prompts():
    two = SceneSpec("two_object", (SceneObject("circle", "red"), SceneObject("square", "blue")))
    assert t2i_probe._altered(two, "binding") == "a red square and a blue circle"
    assert t2i_probe._altered(two, "shapes") == "a red square and a blue triangle"
    pos = SceneSpec("position", (SceneObject("cross", "green"), SceneObject("circle", "red")), "above")
    assert t2i_probe._altered(pos, "relation") == "a green cross below a red circle"
    assert t2i_probe._altered(pos, "binding") == "a green circle above a red cross"


@pytest.fixture(scope="module")
def random_gen():
    torch.manual_seed(0)
    return T2IGenerator(Infinity(configs.TINY_T2I), BSQVAE(configs.TINY_BSQ), TinyTextEncoder(configs.TINY_TEXT)).eval()


def test_a_prompt_blind_model_has_zero_sensitivity(random_gen):
    """Text features that do not depend on the prompt → every delta exactly 0; the same model reading
    its prompt → nonzero deltas (the probe can fail)."""
    out = t2i_probe.prompt_sensitivity(random_gen, n=6, pool=120)
    assert set(out) == set(t2i_probe.PROBES)
    assert all(len(p["delta"]) == len(configs.T2I_SCHEDULE) and p["scenes"] > 0 for p in out.values())
    assert any(abs(d) > 0 for p in out.values() for d in p["delta"])
    inputs = t2i_probe.probe_inputs(random_gen.vae, random_gen.schedule, n=6, pool=120)
    assert t2i_probe.prompt_sensitivity(random_gen, inputs=inputs) == out   # built once (training) = built per call
    proj = random_gen.text_encoder.proj
    saved = proj.weight.detach().clone()
    try:
        with torch.no_grad():
            proj.weight.zero_()
        blind = t2i_probe.prompt_sensitivity(random_gen, n=6, pool=120)
    finally:
        with torch.no_grad():
            proj.weight.copy_(saved)
    assert all(d == 0 for p in blind.values() for d in p["delta"])
    assert [p["ce"] for p in blind.values()] != [p["ce"] for p in out.values()]


def test_layout_agrees_on_true_and_mirrored_scenes():
    """The ground-truth scenes agree with their relation; mirrored left–right, the horizontal ones all
    disagree and the vertical ones still agree (the measure can fail, and reads the right axis)."""
    from bench.data import scenes
    imgs, _, specs, _ = scenes.generate(240, "val")
    sel = [i for i, s in enumerate(specs) if s.task == "position" and s.objects[0].colour != s.objects[1].colour]
    imgs, specs = imgs[sel], [specs[i] for i in sel]
    horizontal = [s.relation in ("left of", "right of") for s in specs]
    assert 0 < sum(horizontal) < len(specs)
    assert all(t2i_probe.layout_agrees(imgs, specs))
    assert t2i_probe.layout_agrees(imgs.flip(-1), specs) == [not h for h in horizontal]
    assert t2i_probe.layout_agrees(imgs.float().div(255), specs) == t2i_probe.layout_agrees(imgs, specs)


def test_partial_images_and_layout_agreement(random_gen):
    vae, schedule = random_gen.vae, random_gen.schedule
    z = torch.randn(2, vae.d, *schedule[-1], generator=torch.Generator().manual_seed(0))
    bits, _ = vae.requantize(z, schedule, 0.0)
    parts = t2i_probe.partial_images(vae, bits, schedule)
    assert len(parts) == len(schedule)
    with torch.no_grad():
        full = vae.decode(sum(torch.nn.functional.interpolate(vae.lfq.bits_to_codes(b.view(2, h, w, -1)),
                                                              size=(1, *schedule[-1]), mode="trilinear")
                              for b, (h, w) in zip(bits, schedule)).squeeze(2)).add(1).div(2)
    torch.testing.assert_close(parts[-1], full, rtol=0, atol=1e-5)
    assert not torch.allclose(parts[0], parts[-1])
    out = t2i_probe.layout_agreement(random_gen, dict(cfg=3.0, tau=1.0, top_k=0, top_p=0.97), n=8, pool=120)
    assert out["scenes"] > 0 and len(out["reference"]) == len(out["sampled"]) == len(schedule)
    assert all(0 <= v <= 1 for v in out["reference"] + out["sampled"])
    inputs = t2i_probe.layout_inputs(vae, schedule, n=8, pool=120)
    assert t2i_probe.layout_agreement(random_gen, dict(cfg=3.0, tau=1.0, top_k=0, top_p=0.97), inputs=inputs) == out


def _vae_bits(random_gen, B, seed=0):
    vae, schedule = random_gen.vae, random_gen.schedule
    z = torch.randn(B, vae.d, *schedule[-1], generator=torch.Generator().manual_seed(seed))
    return vae.requantize(z, schedule, 0.0)[0]


def test_gt_leak_takes_the_true_prefix(random_gen):
    """gt_leak = m: the first m scales are the given bits, the later ones sampled from that context with
    the random stream of m = 0; m = K decodes to the VAE's own image (the official ``gt_leak``)."""
    prompts = ["a red circle", "two blue squares"]
    K, sampling = len(random_gen.schedule), dict(cfg=3.0, tau=1.0, top_k=0, top_p=0.97)
    gt = _vae_bits(random_gen, 2)
    free, _ = random_gen.sample_tokens(prompts, seed=3, **sampling)
    assert any(not torch.equal(f, g) for f, g in zip(free, gt))
    same, _ = random_gen.sample_tokens(prompts, seed=3, gt_leak=0, gt_bits=gt, **sampling)
    assert all(torch.equal(a, b) for a, b in zip(same, free))
    one, _ = random_gen.sample_tokens(prompts, seed=3, gt_leak=1, gt_bits=gt, **sampling)
    assert torch.equal(one[0], gt[0]) and not torch.equal(one[-1], free[-1])
    full, latent = random_gen.sample_tokens(prompts, seed=3, gt_leak=K, gt_bits=gt, **sampling)
    assert all(torch.equal(a, b) for a, b in zip(full, gt))
    parts = t2i_probe.partial_images(random_gen.vae, gt, random_gen.schedule)
    torch.testing.assert_close(random_gen.vae.decode(latent).add(1).div(2), parts[-1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("leak, bits, msg", [(-1, None, "0…5"), (6, None, "0…5"), (1.5, None, "integer"),
                                             (2, "one", "got 1"), (1, None, "got none"), (1, "wrong", r"\[2, 1, 16\]")])
def test_gt_leak_rejects_bad_input(random_gen, leak, bits, msg):
    gt = _vae_bits(random_gen, 2)
    bits = {"one": gt[:1], "wrong": [gt[1]] + gt[1:], None: None}[bits]
    with pytest.raises(ValueError, match=msg):
        random_gen.sample_tokens(["a red circle"] * 2, seed=0, gt_leak=leak, gt_bits=bits)


def test_failure_modes():
    from bench.data.scenes_detect import Detection

    def det(shape, colour, x=0):
        return Detection(shape, colour, (x, 0, x + 4, 4), None, 1.0)
    two = SceneSpec("two_object", (SceneObject("circle", "red"), SceneObject("square", "blue")))
    assert t2i_probe.failure_mode(two, [det("circle", "red"), det("square", "blue")]) == "pass"
    assert t2i_probe.failure_mode(two, [det("circle", "red")]) == "colour missing"
    assert t2i_probe.failure_mode(two, [det("circle", "red"), det("circle", "blue")]) == "shape wrong"
    three = SceneSpec("counting", (SceneObject("cross", "green"),) * 3)
    assert t2i_probe.failure_mode(three, [det("cross", "green", x) for x in (0, 20)]) == "count wrong"
    assert t2i_probe.failure_mode(three, [det("cross", "green", x) for x in (0, 20, 40)]) == "pass"
    pos = SceneSpec("position", (SceneObject("circle", "red"), SceneObject("square", "blue")), "left of")
    assert t2i_probe.failure_mode(pos, [det("circle", "red", 40), det("square", "blue", 0)]) == "relation wrong"
    assert t2i_probe.failure_mode(pos, [det("circle", "red", 0), det("square", "blue", 40)]) == "pass"


def test_prefix_quality_ends_at_the_vae_ceiling(random_gen):
    """m = K scores the VAE's reconstructions of the scenes: the same pass rate as checking them directly."""
    from bench.data.scenes_detect import check, detect
    sampling = dict(cfg=3.0, tau=1.0, top_k=0, top_p=0.97)
    inputs = t2i_probe.leak_inputs(random_gen.vae, random_gen.schedule, n=4, pool=120, tasks=("two_object",))
    out = t2i_probe.prefix_quality(random_gen, sampling, inputs=inputs)
    prompts, specs, bits = inputs["two_object"]
    rec = random_gen.decode_uint8(sum(torch.nn.functional.interpolate(
        random_gen.vae.lfq.bits_to_codes(b.view(len(specs), h, w, -1)), size=(1, *random_gen.schedule[-1]),
        mode="trilinear") for b, (h, w) in zip(bits, random_gen.schedule)).squeeze(2))
    want = sum(check(s, d) for s, d in zip(specs, detect(rec))) / len(specs)
    res = out["two_object"]
    assert res["scenes"] == 4 and len(res["passed"]) == len(random_gen.schedule) + 1
    assert res["passed"][-1] == round(want, 4)
    assert sum(res["failures"].values()) == 4


def test_gt_leak_on_a_pruned_scale_takes_the_kept_positions(random_gen):
    """A token policy that samples only some positions of a scale (LazyVAR's zero residuals): with
    gt_leak the kept positions take their true bits, the others stay unsampled (-1)."""
    from bench.models.policy import TokenPolicy

    class KeepLast8(TokenPolicy):   # scale 2 (4×4) runs and samples its last 8 positions only
        def begin(self, batch, schedule):
            self.B = batch

        def begin_scale(self, si, size):
            self.scale_keep = None

        def enter_scale(self, si, x_BLC):
            if si != 2:
                return x_BLC
            self.scale_keep = torch.arange(8, 16).expand(x_BLC.shape[0], -1)
            return x_BLC[:, 8:]

        def residual_keep(self, si):
            return torch.arange(8, 16).expand(self.B, -1) if si == 2 else None

    gt = _vae_bits(random_gen, 2, seed=1)
    K = len(random_gen.schedule)
    saved = random_gen.token_policy
    random_gen.token_policy = KeepLast8()
    try:
        bits, _ = random_gen.sample_tokens(["a red circle", "a blue cross"], seed=0, gt_leak=K, gt_bits=gt)
    finally:
        random_gen.token_policy = saved
    assert torch.equal(bits[2][:, 8:], gt[2][:, 8:]) and (bits[2][:, :8] == -1).all()
    assert all(torch.equal(bits[si], gt[si]) for si in range(K) if si != 2)
