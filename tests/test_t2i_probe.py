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


# ---------------------------------------------------------------------------------------- cross-attention focus
def test_object_cells():
    """A cell counts for object a when a covers ≥ the threshold of it and b none of it."""
    import numpy as np
    a, b = np.zeros((64, 64), bool), np.zeros((64, 64), bool)
    a[0:16, 0:16] = True        # four cells of the 8×8 grid, one of the 4×4 grid, a quarter of one 2×2 cell
    b[0:16, 24:40] = True       # shares the top-left 2×2 cell with a
    assert t2i_probe.object_cells(a, b, (8, 8)).tolist() == [0, 1, 8, 9]
    assert t2i_probe.object_cells(a, b, (4, 4)).tolist() == [0]
    assert t2i_probe.object_cells(a, b, (2, 2)).tolist() == []        # b is in it too
    assert t2i_probe.object_cells(a, np.zeros_like(b), (2, 2)).tolist() == [0]   # 0.25 ≥ 0.15
    assert t2i_probe.object_cells(a, np.zeros_like(b), (2, 2), cover=0.3).tolist() == []
    assert t2i_probe.object_cells(a, np.zeros_like(b), (2, 2), cover=0.25).tolist() == [0]   # the bound counts
    assert t2i_probe.object_cells(b, a, (4, 4)).tolist() == [1, 2]   # half of each of those cells


def test_cross_attention_probs_are_the_modules_own(random_gen):
    """Applied to the module's own values and output projection, the probabilities give the module's
    output; padded words get none, and each row sums to 1."""
    ca = random_gen.blocks[1].ca
    g = torch.Generator().manual_seed(0)
    B, L, T = 3, 10, configs.T2I_MAX_WORDS
    q_BLC = torch.randn(B, L, ca.H * ca.c, generator=g)
    kv_BTC = torch.randn(B, T, ca.H * ca.c, generator=g)
    mask_BT = torch.ones(B, T, dtype=torch.bool)
    mask_BT[0, 5:] = mask_BT[2, 2:] = False
    with torch.no_grad():
        p_BHLT = t2i_probe.cross_attention_probs(ca, q_BLC, kv_BTC, mask_BT)
        _, v_BHTc = ca.text_kv(kv_BTC, mask_BT)
        o = ca.proj((p_BHLT @ v_BHTc).transpose(1, 2).reshape(B, L, -1))
        want = ca(q_BLC, kv_BTC, mask_BT)
    assert p_BHLT.shape == (B, ca.H, L, T)
    torch.testing.assert_close(o, want, atol=1e-5, rtol=1e-5)
    assert (p_BHLT[0, ..., 5:] == 0).all() and (p_BHLT[2, ..., 2:] == 0).all()
    torch.testing.assert_close(p_BHLT.sum(-1), torch.ones(B, ca.H, L))
    assert p_BHLT.std() > 0.01   # not uniform: the test above can fail


def test_cross_attention_probs_round_the_queries_as_the_module_does():
    """A cross-attention with the official bf16 rounding (``ca_bf16``): the probabilities are those of
    its bf16-rounded queries and keys, which differ from unrounded queries' (so the rounding is seen)."""
    from bench.models.infinity import CrossAttention
    torch.manual_seed(1)
    ca = CrossAttention(64, 48, 4, bf16=True)
    g = torch.Generator().manual_seed(2)
    q_BLC, kv_BTC = torch.randn(2, 6, 64, generator=g), torch.randn(2, 5, 48, generator=g)
    mask_BT = torch.ones(2, 5, dtype=torch.bool)
    mask_BT[1, 3:] = False
    with torch.no_grad():
        p = t2i_probe.cross_attention_probs(ca, q_BLC, kv_BTC, mask_BT)
        k, _ = ca.text_kv(kv_BTC, mask_BT)
        q = ca.mat_q(q_BLC).view(2, 6, 4, 16).transpose(1, 2)
        hand = lambda q: ((q @ k.transpose(-1, -2)) / 4).masked_fill(~mask_BT[:, None, None], float("-inf")).softmax(-1)  # noqa: E731
        assert torch.equal(p, hand(q.to(torch.bfloat16).float()))
        assert not torch.equal(p, hand(q))


def test_attention_focus_is_half_under_uniform_attention(random_gen):
    """Queries of zero attend uniformly: every share exactly 0.5; the random model's queries do not."""
    inputs = t2i_probe.attention_inputs(random_gen.vae, random_gen.schedule, n=6, pool=120)
    out = t2i_probe.attention_focus(random_gen, inputs=inputs)
    K, D = len(configs.T2I_SCHEDULE), len(random_gen.blocks)
    assert out["scenes"] == 6 and len(out["tokens"]) == K and len(out["key_norm"]) == D
    assert out["tokens"][0] == 0 and out["own_colour"][0] == [None] * D   # 1×1: both objects share the cell
    assert all(t > 0 for t in out["tokens"][2:])
    shares = [v for k in range(1, K) for v in out["own_colour"][k] + out["own_shape"][k] if v is not None]
    assert shares and any(v != 0.5 for v in shares)
    saved = [(b.ca.mat_q.weight.detach().clone(), b.ca.mat_q.bias.detach().clone()) for b in random_gen.blocks]
    try:
        with torch.no_grad():
            for b in random_gen.blocks:
                b.ca.mat_q.weight.zero_(), b.ca.mat_q.bias.zero_()
        flat = t2i_probe.attention_focus(random_gen, inputs=inputs)
    finally:
        with torch.no_grad():
            for b, (w, bias) in zip(random_gen.blocks, saved):
                b.ca.mat_q.weight.copy_(w), b.ca.mat_q.bias.copy_(bias)
    assert all(v == 0.5 for k in range(1, K) for v in flat["own_colour"][k] + flat["own_shape"][k])
    assert flat["key_norm"] == out["key_norm"] and all(v > 0 for v in out["key_norm"])
    assert not any(b.ca._forward_pre_hooks for b in random_gen.blocks)   # its hooks are gone
    # a model in training (here dropping every prompt) is measured in eval mode, and left training
    import dataclasses
    cfg = random_gen.infinity.cfg
    random_gen.infinity.cfg = dataclasses.replace(cfg, cond_drop_rate=1.0)
    random_gen.train()
    try:
        assert t2i_probe.attention_focus(random_gen, inputs=inputs) == out and random_gen.training
    finally:
        random_gen.eval()
        random_gen.infinity.cfg = cfg


def test_attention_inputs_name_each_objects_words():
    """The word positions are those of the object's colour and shape in its prompt, and an object's
    cells at the last scale hold its ground-truth mask."""
    vae = BSQVAE(configs.TINY_BSQ)
    prompts, bits, _, cells, words = t2i_probe.attention_inputs(vae, configs.T2I_SCHEDULE, n=5, pool=120)
    assert len(prompts) == len(cells) == len(words) == 5 and len(bits) == len(configs.T2I_SCHEDULE)
    for p, w in zip(prompts, words):
        toks = p.split()
        assert [[toks[i] for i in obj] for obj in w] == [toks[1:3], toks[5:7]]   # "a C S and a C S"
        assert toks[1] != toks[5] and toks[2] != toks[6]


def test_attention_focus_of_the_shipped_files():
    """Pinned on the shipped tiny-t2i files: at the 8×8 scale its object tokens prefer their own colour
    word in every block, and put exactly no preference on the shape words (within 0.02)."""
    from bench.models.zoo import load_t2i
    from bench.registry import MODELS
    out = t2i_probe.attention_focus(load_t2i(MODELS.get("tiny-t2i")))
    assert out["scenes"] == 120 and out["tokens"] == [0, 149, 501, 936, 1514]
    assert out["own_colour"][-1] == [0.6203, 0.8243, 0.8451, 0.8235]
    assert all(abs(v - 0.5) < 0.02 for v in out["own_shape"][-1])
    assert out["key_norm"] == [0.6837, 0.9944, 1.2601, 1.3405]


def test_main_names_a_wrong_folder_without_a_traceback(tmp_path, capsys):
    """``--dir`` that is not a folder, or a folder without the files, is one clear error (argparse's exit 2)."""
    with pytest.raises(SystemExit) as e:
        t2i_probe.main(["--dir", str(tmp_path / "nope")])
    assert e.value.code == 2 and "is not a folder: give the folder that holds the tiny-t2i files" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        t2i_probe.main(["--dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"3 checkpoint file(s) not found in {tmp_path}" in err and "Traceback" not in err
