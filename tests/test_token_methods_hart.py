"""Token methods on HART (the golden fixture's small model "a": scales 1…8, depth 2): identity settings
sample the dense tokens, each method changes only its scales and lowers the FLOPs, a sub-layer run on
a shuffled subset rotates by RoPE at the tokens' own positions, and LazyVAR's group gives the logits of
a teacher-forced pass from the latent before the group."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from bench.models.policy import TokenPolicy
from tests.test_hart import _inputs, golden, models  # noqa: F401  (fixtures)
from tests.test_token_methods import _apply

pytestmark = pytest.mark.usefixtures("one_thread")
KW = dict(seed=4, cfg=4.5, more_smooth=False)


def _flops(model, tensors) -> int:
    fc = FlopCounterMode(display=False)
    with fc:
        model.sample_tokens(*_inputs(tensors), **KW)
    return fc.get_total_flops()


@pytest.mark.parametrize("spec", ["fastvar:drop=0/0", "stepvar:drop=0", "tome:ratio=0", "lazyvar:keep=1,pgd=false"])
def test_identity_settings_sample_the_dense_tokens(golden, models, spec):  # noqa: F811
    tensors, _ = golden
    ref_t, ref_f = models["a"].sample_tokens(*_inputs(tensors), **KW)
    model, _ = _apply(models["a"], spec)
    try:
        t, f = model.sample_tokens(*_inputs(tensors), **KW)
    finally:
        model.token_policy = TokenPolicy()
    assert all(torch.equal(a, b) for a, b in zip(t, ref_t)) and torch.equal(f, ref_f)


@pytest.mark.parametrize("spec", ["fastvar", "stepvar", "tome", "lazyvar", "lazyvar:pgd=false"])
def test_only_the_late_scales_change_and_flops_drop(golden, models, spec):  # noqa: F811
    """Every method's default schedule on an 8-scale HART touches only the last two scales (7², 8²)."""
    tensors, _ = golden
    ref, got = {}, {}
    models["a"].sample_tokens(*_inputs(tensors), **KW, logits_hook=lambda si, lg: ref.__setitem__(si, lg.clone()))
    dense = _flops(models["a"], tensors)
    model, ctx = _apply(models["a"], spec)
    try:
        tokens, _ = model.sample_tokens(*_inputs(tensors), **KW, logits_hook=lambda si, lg: got.__setitem__(si, lg.clone()))
        pruned = _flops(model, tensors)
    finally:
        model.token_policy = TokenPolicy()
    for si in range(6):
        assert torch.equal(got[si], ref[si]), f"{spec}: scale {si} changed"
    assert got[7].shape != ref[7].shape or not torch.allclose(got[7], ref[7])
    assert pruned < dense and spec.split(":")[0] in ctx.notes[0]
    if spec.startswith("lazyvar"):   # hart preset: 7², 8² keep 5 %, 1 %
        assert "keep {7×7: 0.05, 8×8: 0.01}" in ctx.notes[0]
        assert [(t < 0).sum().item() for t in tokens[6:]] == [2 * (49 - 2), 2 * (64 - 1)]


class _Shuffle(TokenPolicy):
    """Runs every sub-layer of scale 7 on all its tokens in a random order (then scatters them back)."""

    def select(self, si, kind, block_idx, h_BLC, x_BLC=None):
        if si != 7:
            return None
        g = torch.Generator().manual_seed(block_idx)
        return torch.stack([torch.randperm(h_BLC.shape[1], generator=g) for _ in range(h_BLC.shape[0])])


def test_a_shuffled_subset_rotates_at_its_own_positions(golden, models):  # noqa: F811
    """Attention is permutation-equivariant when each token keeps its RoPE position: running scale 7
    with its tokens shuffled (and scattered back) gives the dense logits. Rotating the shuffled tokens
    at the first positions instead would not."""
    tensors, _ = golden
    ref, got = {}, {}
    models["a"].sample_tokens(*_inputs(tensors), **KW, logits_hook=lambda si, lg: ref.__setitem__(si, lg.clone()))
    models["a"].token_policy = _Shuffle()
    try:
        models["a"].sample_tokens(*_inputs(tensors), **KW, logits_hook=lambda si, lg: got.__setitem__(si, lg.clone()))
    finally:
        models["a"].token_policy = TokenPolicy()
    torch.testing.assert_close(got[7], ref[7], atol=1e-4, rtol=1e-4)


def test_lazyvar_group_is_a_teacher_forced_pass_from_one_latent(golden, models):  # noqa: F811
    tensors, _ = golden
    model, _ = _apply(models["a"], "lazyvar:keep=1/1")
    pol, pns = model.token_policy, model.patch_nums
    assert pol.groups(len(pns))[-1] == (6, 7)
    latents, logits = {}, {}
    observe = pol.observe
    pol.observe = lambda si, lat: (latents.__setitem__(si, lat.clone()), observe(si, lat))
    try:
        model.sample_tokens(*_inputs(tensors), **KW, residual=False,
                            logits_hook=lambda si, lg: logits.__setitem__(si, lg.clone()))
    finally:
        model.token_policy = TokenPolicy()
    B = tensors["input.context_BLC"].shape[0]
    inputs = [F.interpolate(latents[min(s - 1, 5)], size=(pn, pn), mode="area").flatten(2).transpose(1, 2)
              for s, pn in enumerate(pns) if s > 0]
    teacher = model(*_inputs(tensors), torch.cat(inputs, dim=1))    # [B, 1 + Σ pn², V]
    start = 1 + sum(pn * pn for pn in pns[1:6])
    torch.testing.assert_close(torch.cat([logits[6][:B], logits[7][:B]], dim=1), teacher[:, start:], atol=2e-4, rtol=1e-4)


def test_fastvar_releases_its_cache_when_sampling_ends(golden, models):  # noqa: F811
    tensors, _ = golden
    model, _ = _apply(models["a"], "fastvar")
    sizes = []
    try:
        model.sample_tokens(*_inputs(tensors), **KW, logits_hook=lambda si, lg: sizes.append(len(model.token_policy.cache)))
        assert max(sizes) > 0 and model.token_policy.cache == {}
    finally:
        model.token_policy = TokenPolicy()
