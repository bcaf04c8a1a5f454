"""LazyVAR (methods/lazyvar.py): the update index and the cumulative keep indices by hand, the group
mask against the training mask, parallel group decoding against a teacher-forced pass built from the
same latent (class-conditional VAR and the Infinity family), identity settings, FLOPs, errors."""
import re

import pytest
import torch
import torch.nn.functional as F

from bench.accounting import sampling_flops, t2i_sampling_flops
from bench.models.policy import group_attn_bias
from methods.lazyvar import LazyVARPolicy, owners, select_group, update_index
from tests.test_token_methods import _apply
from tests.test_token_methods_t2i import SCHEDULE, _sample, t2i  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("one_thread")

INFINITY_GROUP = ((32, 32), (40, 40), (48, 48), (64, 64))   # Infinity-2B's group at 1024²


def test_update_index_is_one_minus_the_cosine_per_position():
    a, b = torch.randn(2, 5, 4, 3), torch.randn(2, 5, 4, 3)
    u = update_index(a, b)
    for i, j, k in [(0, 0, 0), (1, 3, 2), (0, 2, 1)]:
        va, vb = a[i, :, j, k], b[i, :, j, k]
        assert abs(u[i, j, k].item() - (1 - (va @ vb / va.norm() / vb.norm()).item())) < 1e-6
    assert torch.allclose(update_index(a.unsqueeze(2), b.unsqueeze(2)), u)   # Infinity's [B, d, 1, H, W]
    assert torch.allclose(update_index(a, 3 * a), torch.zeros(2, 4, 3), atol=1e-6)
    # a cosine: latents of small norm give the same index; a position where f̂ is zero gives 1, not NaN
    assert torch.allclose(update_index(1e-3 * a, 1e-3 * b), u, atol=1e-5)
    a[1, :, 2, 0] = 0
    u0 = update_index(a, b)
    assert u0[1, 2, 0].item() == 1.0 and torch.isfinite(u0).all()


def test_owners_tile_the_final_grid():
    for hw in [(32, 32), (40, 40), (3, 5), (64, 64)]:
        own = owners(hw, (64, 64), "cpu")
        counts = own.bincount(minlength=hw[0] * hw[1])
        assert own.numel() == 64 * 64 and (counts > 0).all()   # every token owns ≥ 1 position, each position 1 owner
    # which token: the one whose nearest-neighbour upsampling covers the position (floor(y·h/H), floor(x·w/W)),
    # on square, non-square and non-dividing grids
    for hw, HW in [((3, 5), (64, 64)), ((2, 3), (4, 6)), ((3, 4), (5, 8)), ((5, 8), (5, 8)), ((1, 1), (3, 2))]:
        ids = torch.arange(hw[0] * hw[1], dtype=torch.float32).reshape(1, 1, *hw)
        want = F.interpolate(ids, size=HW, mode="nearest").flatten().long()
        assert torch.equal(owners(hw, HW, "cpu"), want), (hw, HW)


def test_the_groups_are_the_scales_before_one_group_and_after():
    """pgd: the scales before the group one by one, the group as one step, any later scale one by one;
    pgd=false: every scale alone (the group's tokens are still chosen together, at its first scale)."""
    hws = [(1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (6, 6)]
    assert LazyVARPolicy({3: 0.5, 4: 0.5, 5: 0.5}, hws).groups(6) == [(0,), (1,), (2,), (3, 4, 5)]
    assert LazyVARPolicy({2: 0.5, 3: 0.5}, hws).groups(6) == [(0,), (1,), (2, 3), (4,), (5,)]
    assert LazyVARPolicy({3: 0.5, 4: 0.5}, hws, pgd=False).groups(6) == [(si,) for si in range(6)]
    # scale_keep always describes the scale just entered: a dense scale after a pruned one keeps all
    pol = LazyVARPolicy({2: 0.5, 3: 0.5}, hws)
    pol.begin(1, hws)
    pol.kept = {2: torch.tensor([[0, 3]]), 3: torch.tensor([[1, 2]])}
    assert pol.enter_scale(3, torch.randn(2, 9, 4)).shape == (2, 2, 4) and pol.scale_keep.tolist() == [[1, 2]] * 2
    x = torch.randn(2, 16, 4)
    assert pol.enter_scale(4, x) is x and pol.scale_keep is None


@pytest.mark.parametrize("hws,HW,keep", [(INFINITY_GROUP, (64, 64), (0.2, 0.1, 0.05, 0.01)),
                                         (INFINITY_GROUP, (64, 64), (0.4, 0.2, 0.1, 0.02)),
                                         (((4, 4), (6, 6), (8, 8)), (8, 8), (0.2, 0.1, 0.05)),
                                         (((4, 4), (5, 5), (6, 6), (8, 8)), (8, 8), (0.2, 0.1, 0.05, 0.02))])
def test_cumulative_indices_never_assign_a_position_twice_within_a_group(hws, HW, keep):
    g = torch.Generator().manual_seed(0)
    index = torch.rand(3, *HW, generator=g)
    scores = [F.interpolate(index.unsqueeze(1), size=hw, mode="area").flatten(1) for hw in hws]
    n = [round(r * h * w) for r, (h, w) in zip(keep, hws)]

    def owned(kept, hw):   # [B, H·W] bool: the final positions the kept tokens own
        own = owners(hw, HW, "cpu").expand(3, -1)
        return torch.zeros(3, hw[0] * hw[1], dtype=torch.bool).scatter(1, kept, True).gather(1, own)

    kept = select_group(scores, hws, n, HW, cumulative=True)
    assert [k.shape for k in kept] == [(3, m) for m in n]
    assert all(torch.equal(k, k.sort(dim=1).values) and k.unique(dim=1).shape[1] == k.shape[1] for k in kept)
    cover = torch.stack([owned(k, hw) for k, hw in zip(kept, hws)]).sum(0)
    assert cover.max() == 1, "a final-grid position was kept by two scales of the group"
    # the largest scale takes its own top tokens; without cum every scale does, and they overlap
    assert torch.equal(kept[-1], scores[-1].topk(n[-1], dim=1).indices.sort(dim=1).values)
    free = select_group(scores, hws, n, HW, cumulative=False)
    assert torch.stack([owned(k, hw) for k, hw in zip(free, hws)]).sum(0).max() > 1


@pytest.mark.parametrize("hws,HW,n", [(((2, 3), (2, 4), (3, 6)), (3, 6), (3, 4, 6)),
                                      (((1, 3), (2, 3), (2, 5), (4, 5)), (4, 5), (1, 3, 5, 6))])
def test_cumulative_selection_serves_the_larger_area_first_also_between_scales_of_one_height(hws, HW, n):
    """The cumulative rule written as loops: scales by decreasing area (h·w, so that of two scales with
    one height the wider goes first), each taking its top-n tokens among those whose footprint on the
    final grid holds no position an earlier (larger) scale kept; where fewer than n are free (both
    cases here), it fills up with its best blocked tokens."""
    g = torch.Generator().manual_seed(1)
    scores = [torch.rand(2, h * w, generator=g) for h, w in hws]
    got = select_group(scores, hws, n, HW, cumulative=True)
    H, W = HW
    overflow = False
    for b in range(2):
        claimed = set()
        for j in sorted(range(len(hws)), key=lambda j: -hws[j][0] * hws[j][1]):
            (h, w), s = hws[j], scores[j][b]
            owner = {(y, x): (y * h // H) * w + x * w // W for y in range(H) for x in range(W)}
            blocked = {owner[p] for p in claimed}
            by_score = sorted(range(h * w), key=lambda t: -s[t].item())
            free = [t for t in by_score if t not in blocked]
            want = sorted((free + [t for t in by_score if t in blocked])[:n[j]])
            overflow |= len(free) < n[j]
            assert got[j][b].tolist() == want, (hws[j], b)
            claimed |= {p for p, t in owner.items() if t in want}
    assert overflow, "the case should reach the fill-up"


@pytest.mark.parametrize("cum", [True, False])
def test_equal_scores_are_kept_in_position_order(cum):
    """Ties (a piecewise-constant index) resolve to the lower position, for every scale and both rules:
    the largest scale of a flat map keeps its first n tokens, the smaller one its first free ones."""
    hws, HW = ((2, 2), (4, 4)), (4, 4)
    scores = [torch.zeros(1, 4), torch.ones(1, 16)]
    scores[1][0, 12:] = 2.0                      # four clear winners, then a tie for the fifth among 12
    small, large = select_group(scores, hws, (1, 5), HW, cumulative=cum)
    assert large.tolist() == [[0, 12, 13, 14, 15]]
    # with cum, 2×2 tokens 0 (positions 0, 1, 4, 5), 2 and 3 (positions 12-15) are blocked: 1 is free
    assert small.tolist() == ([[1]] if cum else [[0]])
    # two to keep, one free: the free one, then the first blocked one of the tie
    assert select_group(scores, hws, (2, 5), HW, cumulative=cum)[0].tolist() == [[0, 1]]
    # at Infinity's size (a flat 32², 64² group), where an unstable sort no longer keeps position order
    small, large = select_group([torch.zeros(2, 1024), torch.ones(2, 4096)], ((32, 32), (64, 64)), (10, 100),
                                (64, 64), cumulative=cum)
    assert large.tolist() == [list(range(100))] * 2
    assert small.tolist() == [list(range(32, 42)) if cum else list(range(10))] * 2   # row 0 of 32² is blocked


@pytest.mark.parametrize("cum", [True, False])
def test_the_policy_keeps_its_groups_tokens_by_the_index_on_the_final_grid(cum):
    """The policy's own selection, by hand on a non-square pyramid: n = round(keep·h·w) per scale; the
    final grid is the last scale's; with cum the smaller scale takes its top tokens among those whose
    footprint holds no position the larger one kept; without, its own top tokens."""
    hws = [(1, 1), (2, 3), (3, 4), (4, 6)]
    pol = LazyVARPolicy({2: 0.5, 3: 0.25}, hws, cum=cum)
    pol.begin(2, hws)
    g = torch.Generator().manual_seed(0)
    idx = torch.rand(2, 4, 6, generator=g)
    pol.index[1] = idx
    pol.begin_group((2, 3), xs=None)
    assert pol.kept[3].shape == (2, 6) and pol.kept[2].shape == (2, 6)   # round(.25·24), round(.5·12)
    small = F.interpolate(idx.unsqueeze(1), size=(3, 4), mode="area").flatten(1)
    for b in range(2):
        top3 = set(idx[b].flatten().argsort(descending=True)[:6].tolist())
        assert set(pol.kept[3][b].tolist()) == top3
        free = [t for t in range(12) if not cum or not any(
            (y * 3 // 4) * 4 + x * 4 // 6 == t for y, x in ((p // 6, p % 6) for p in top3))]
        want = sorted(sorted(free, key=lambda t: -small[b, t].item())[:6])
        assert pol.kept[2][b].tolist() == want
        if cum:   # the footprints on the final grid are disjoint (here they would overlap without cum)
            own = owners((3, 4), (4, 6), "cpu")
            assert not any(own[p].item() in want for p in top3)
            assert set(want) != set(small[b].argsort(descending=True)[:6].tolist())


def test_the_policy_needs_the_index_before_its_group_and_pts_keeps_none():
    hws = [(1, 1), (2, 2), (3, 3), (4, 4)]
    pol = LazyVARPolicy({1: 0.5}, hws)
    pol.begin(1, hws)
    with pytest.raises(RuntimeError, match=re.escape(
            "lazyvar: no update index before scale 1 (it needs two earlier scales)")):
        pol.begin_group((1,), xs=None)
    pts = LazyVARPolicy({2: 0.5, 3: 0.5}, hws, criterion="pts")   # ranks by each scale's input instead
    pts.begin(1, hws)
    for si in range(4):
        pts.observe(si, torch.randn(1, 3, 4, 4))
    assert pts.index == {} and pts.prev is None   # no latent held, no index computed


def test_group_mask_is_the_training_mask_of_those_scales(small_gen):
    pns, begin_ends = small_gen.patch_nums, small_gen.var.begin_ends
    full = small_gen.var.attn_bias_for_masking[0, 0]
    for first in (1, 3):
        lens = [pn * pn for pn in pns[first:]]
        start = begin_ends[first][0]
        got = group_attn_bias(lens, start, full)[0, 0]
        assert torch.equal(got, full[start:, :])


@pytest.mark.parametrize("spec", ["lazyvar:keep=1,pgd=false", "lazyvar:keep=1,pgd=false,criterion=pts"])
def test_identity_settings_sample_the_dense_images(small_gen, spec):
    labels = torch.tensor([0, 4])
    ref = small_gen.generate(labels, seed=7, cfg=1.5)
    assert torch.equal(_apply(small_gen, spec)[0].generate(labels, seed=7, cfg=1.5), ref)


def test_parallel_group_decoding_is_a_teacher_forced_pass_from_one_latent(small_gen):
    """keep=1 (no pruning): the group's logits equal the training forward whose inputs for the group's
    scales are all the latent accumulated before the group, area-downsampled."""
    gen, _ = _apply(small_gen, "lazyvar:keep=1")
    pol, pns = gen.token_policy, small_gen.patch_nums
    first = pol.first
    assert pol.groups(len(pns)) == [(0,), (1,), (2,), (3, 4)] and first == 3
    latents, logits = {}, {}
    observe = pol.observe
    pol.observe = lambda si, lat: (latents.__setitem__(si, lat.clone()), observe(si, lat))
    labels = torch.tensor([1, 3])
    tokens, _ = gen.sample_tokens(labels, seed=4, cfg=None, logits_hook=lambda si, lg: logits.__setitem__(si, lg.clone()))
    inputs = [F.interpolate(latents[min(s - 1, first - 1)], size=(pn, pn), mode="area").flatten(2).transpose(1, 2)
              for s, pn in enumerate(pns) if s > 0]
    teacher = small_gen.var(labels, torch.cat(inputs, dim=1))
    start = sum(pn * pn for pn in pns[:first])
    torch.testing.assert_close(torch.cat([logits[3], logits[4]], dim=1), teacher[:, start:], atol=2e-4, rtol=1e-4)
    assert all((t >= 0).all() for t in tokens)   # keep=1: every position sampled


def test_pruned_positions_get_no_residual_and_the_cfg_halves_share_the_kept_set(small_gen):
    gen, ctx = _apply(small_gen, "lazyvar")
    assert "keep {4×4: 0.2, 8×8: 0.1}" in ctx.notes[0] and "one group" in ctx.notes[0]
    shapes = {}
    route = gen.token_policy.route
    gen.token_policy.route = lambda si: (shapes.__setitem__(si, None), route(si))[1]
    got = {}
    tokens, _ = gen.sample_tokens(torch.tensor([0, 2]), seed=1, cfg=1.5,
                                  logits_hook=lambda si, lg: got.__setitem__(si, lg.clone()))
    n4, n8 = round(0.2 * 16), round(0.1 * 64)
    assert got[3].shape[:2] == (4, n4) and got[4].shape[:2] == (4, n8)   # [cond; uncond] rows, kept tokens only
    assert [(t < 0).sum(1).tolist() for t in tokens[3:]] == [[16 - n4] * 2, [64 - n8] * 2]
    assert set(shapes) == {0, 1, 2, 3}   # one block-stack pass for the group
    kept = gen.token_policy.kept
    assert torch.equal(tokens[4] >= 0, torch.zeros(2, 64, dtype=torch.bool).scatter(1, kept[4], True))


@pytest.mark.parametrize("spec", ["lazyvar", "lazyvar:pgd=false", "lazyvar:cum=false", "lazyvar:criterion=pts",
                                  "lazyvar:keep=0"])
def test_only_the_group_changes_and_flops_drop(small_gen, spec):
    labels = torch.tensor([1, 2])
    ref, got = {}, {}
    small_gen.sample_tokens(labels, seed=2, logits_hook=lambda si, lg: ref.__setitem__(si, lg.clone()))
    dense = sampling_flops(small_gen)
    gen, _ = _apply(small_gen, spec)
    imgs = gen.generate(labels, seed=2)
    gen.sample_tokens(labels, seed=2, logits_hook=lambda si, lg: got.__setitem__(si, lg.clone()))
    for si in range(3):
        assert torch.equal(got[si], ref[si]), f"{spec}: scale {si} changed"
    assert imgs.shape == (2, 3, 32, 32)
    assert sampling_flops(gen) < dense


def test_lazyvar_on_the_infinity_family(t2i):  # noqa: F811
    """keep=1 one scale at a time = dense bits; a group of the last two scales (4², 6²) gives the logits
    of a teacher-forced pass from the codes summed before the group; the default group (3², 4², 6²:
    at least half as wide as the last) prunes."""
    ref_bits, ref_sum = _sample(t2i)
    bits, summed = _sample(_apply(t2i, "lazyvar:keep=1,pgd=false")[0])
    assert all(torch.equal(a, b) for a, b in zip(bits, ref_bits)) and torch.equal(summed, ref_sum)

    gen, ctx = _apply(t2i, "lazyvar:keep=1/1")
    pol = gen.token_policy
    assert pol.group == (3, 4) and "4×4: 1, 6×6: 1" in ctx.notes[0]
    latents, logits = {}, {}
    observe = pol.observe
    pol.observe = lambda si, lat: (latents.__setitem__(si, lat.clone()), observe(si, lat))
    feats, mask = gen.encode_prompts(["a red circle", "a blue square"])
    gen.sample_bits(feats, mask, seed=3, cfg=1.0, tau=1.0, top_k=0, top_p=0.0,
                    logits_hook=lambda si, lg: logits.__setitem__(si, lg.clone()))
    inputs = [F.interpolate(latents[min(s - 1, 2)], size=(1, *hw), mode="trilinear").squeeze(2).flatten(2).transpose(1, 2)
              for s, hw in enumerate(SCHEDULE) if s > 0]
    teacher = gen.infinity(feats, mask, torch.cat(inputs, dim=1), SCHEDULE)
    start = sum(h * w for h, w in SCHEDULE[:3])
    torch.testing.assert_close(torch.cat([logits[3], logits[4]], dim=1), teacher[:, start:], atol=2e-4, rtol=1e-4)

    dense = t2i_sampling_flops(t2i, text_tokens=4)
    gen, ctx = _apply(t2i, "lazyvar")
    assert "keep {3×3: 0.2, 4×4: 0.1, 6×6: 0.05}" in ctx.notes[0]
    bits, _ = _sample(gen)
    assert (bits[4] < 0).any() and t2i_sampling_flops(gen, text_tokens=4) < dense


def _squares(*pns):
    return [(pn, pn) for pn in pns]


@pytest.mark.parametrize("family,hws,keep,want", [
    ("var", _squares(1, 2, 3, 4, 5, 6, 8, 10, 13, 16), "auto", {6: 0.2, 7: 0.1, 8: 0.05, 9: 0.01}),   # var-d16
    ("var", _squares(1, 2, 3, 4, 5, 6, 8), "auto", {3: 0.2, 4: 0.1, 5: 0.05, 6: 0.01}),                # tiny-var
    ("infinity", _squares(1, 2, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 64), "auto",
     {9: 0.2, 10: 0.1, 11: 0.05, 12: 0.01}),                                                           # Infinity 1024²
    ("hart", _squares(*range(1, 15)), "auto", {12: 0.05, 13: 0.01}),
    # both sides at least half the last's: 4×5 is tall enough but too narrow; the group's first ratios
    ("var", [(1, 1), (2, 2), (3, 4), (4, 5), (6, 9), (8, 12)], "auto", {4: 0.2, 5: 0.1}),
    ("var", [(1, 1), (2, 2), (3, 6), (4, 8), (8, 8)], "auto", {3: 0.2, 4: 0.1}),     # 3×6: too short
    ("var", [(1, 1), (2, 2), (6, 3), (8, 4), (8, 8)], "auto", {3: 0.2, 4: 0.1}),     # 6×3: too narrow
    ("var", [(1, 1), (2, 3), (2, 6), (3, 9), (4, 12)], "auto", {2: 0.2, 3: 0.1, 4: 0.05}),   # each side to its own
    ("var", _squares(1, 2, 3, 4, 5, 6, 8), "0.3", {3: 0.3, 4: 0.3, 5: 0.3, 6: 0.3}),   # one value: the whole group
    ("var", _squares(1, 2, 3, 4, 5, 6, 8), "0.5/0.1", {5: 0.5, 6: 0.1})])
def test_the_schedule_groups_the_scales_at_least_half_as_wide_as_the_last(family, hws, keep, want):
    from types import SimpleNamespace

    from methods.lazyvar import LazyVAR
    got, preset = LazyVAR(keep=keep).schedule_for(SimpleNamespace(family=family, blocks=[], scales_hw=hws))
    assert (got, preset) == (want, family)


def test_lazyvar_errors(small_gen):
    from types import SimpleNamespace

    from methods.lazyvar import LazyVAR
    with pytest.raises(ValueError, match=re.escape(
            "lazyvar: the var schedule has keep ratios for 4 scales but this model's group has 5: give "
            "keep=a/b/… for its last scales")):
        LazyVAR().schedule_for(SimpleNamespace(family="var", blocks=[], scales_hw=_squares(1, 2, 3, 4, 5, 6, 7, 8, 10)))
    from bench.spec import SpecError
    with pytest.raises(SpecError, match=r"in \[0, 1\]"):
        _apply(small_gen, "lazyvar:keep=0.2/1.5")
    with pytest.raises(ValueError, match=re.escape("lazyvar: keep=0.5/0.5/0.5/0.5 groups the last 4 scales but the model has 5: at least two dense "
                                                   "scales must come first (the update index needs f̂ of two scales)")):
        _apply(small_gen, "lazyvar:keep=0.5/0.5/0.5/0.5")
    with pytest.raises(SpecError):
        _apply(small_gen, "lazyvar:criterion=ptss")
