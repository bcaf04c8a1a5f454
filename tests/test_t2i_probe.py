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
