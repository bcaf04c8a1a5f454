"""StepVAR and ToMe (methods/stepvar.py, methods/tome.py): their pieces against written-out
computations, the identity settings on sampled images, and what each changes in a sampling run."""
import math
import re

import pytest
import torch

from bench.accounting import sampling_flops
from bench.method import Context, apply_chain
from methods.stepvar import StepVARPolicy, structure_score, texture_score, unit_rank
from methods.tome import ToMePolicy, random2d_matching

pytestmark = pytest.mark.usefixtures("one_thread")


def _apply(gen, spec):
    ctx = Context(progress=False)
    return apply_chain(gen, [spec], ctx), ctx


@pytest.mark.parametrize("spec", ["stepvar:drop=0", "stepvar:drop=0/0,score=random", "tome:ratio=0",
                                  "tome:ratio=0,ffn=true"])
def test_identity_settings_sample_the_dense_images(small_gen, spec):
    labels = torch.tensor([0, 4])
    ref = small_gen.generate(labels, seed=7, cfg=1.5)
    assert torch.equal(_apply(small_gen, spec)[0].generate(labels, seed=7, cfg=1.5), ref)


@pytest.mark.parametrize("spec", ["stepvar", "stepvar:score=hpf", "stepvar:score=pca", "stepvar:score=random",
                                  "stepvar:restore=linear", "stepvar:filter=sobel", "tome", "tome:ffn=true"])
def test_only_the_late_scales_change(small_gen, spec):
    labels = torch.tensor([1, 2])
    K = len(small_gen.patch_nums)
    ref, got = {}, {}
    small_gen.sample_tokens(labels, seed=2, logits_hook=lambda si, lg: ref.__setitem__(si, lg.clone()))
    dense_flops = sampling_flops(small_gen)
    gen, ctx = _apply(small_gen, spec)
    gen.sample_tokens(labels, seed=2, logits_hook=lambda si, lg: got.__setitem__(si, lg.clone()))
    for si in range(K - 2):
        assert torch.equal(got[si], ref[si]), f"{spec}: scale {si} changed"
    assert got[K - 1].shape == ref[K - 1].shape and not torch.allclose(got[K - 1], ref[K - 1])
    assert ctx.notes and spec.split(":")[0] in ctx.notes[0]
    assert sampling_flops(gen) < dense_flops


# ------------------------------------------------------------------------------------- StepVAR
def test_texture_score_is_the_laplacian_energy_by_hand():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, 5, generator=g)
    got = texture_score(x).view(2, 4, 5)
    pad = torch.nn.functional.pad(x, (1, 1, 1, 1), mode="replicate")
    want = torch.zeros(2, 4, 5)
    for i in range(4):
        for j in range(5):
            lap = pad[:, :, i, j + 1] + pad[:, :, i + 2, j + 1] + pad[:, :, i + 1, j] + pad[:, :, i + 1, j + 2] \
                - 4 * pad[:, :, i + 1, j + 1]
            want[:, i, j] = lap.square().sum(1)
    torch.testing.assert_close(got, want)
    flat = torch.zeros(1, 3, 4, 4)
    assert texture_score(flat).abs().max() == 0 and texture_score(flat, "sobel").abs().max() == 0


@pytest.mark.parametrize("scale", [1.0, 1e-3])          # small maps: eigenvalues well below 1
@pytest.mark.parametrize("L,C", [(6, 10), (12, 4)])   # both eigenproblems (Gram and covariance)
def test_structure_score_is_the_pca_projection_by_svd(L, C, scale):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, L, C, generator=g, dtype=torch.float64) * scale
    for k in (1, 2):
        xc = x - x.mean(1, keepdim=True)
        U, S, _ = torch.linalg.svd(xc, full_matrices=False)
        want = (U[..., :k] * S[:, None, :k]).square().sum(-1)
        torch.testing.assert_close(structure_score(x, k), want)


def test_unit_rank():
    assert unit_rank(torch.tensor([[3.0, 1.0, 2.0]])).tolist() == [[1.0, 0.0, 0.5]]
    assert unit_rank(torch.tensor([[5.0]])).tolist() == [[0.0]]          # one token: rank 0, not 0/0
    # ties rank in index order; 64+ values are long enough for an unstable CPU sort to reorder them
    tied = torch.tensor([[1.0, 0.0] * 40])
    want = torch.cat([torch.arange(40.0) + 40, torch.arange(40.0)], 0).view(2, 40).t().reshape(1, 80) / 79
    assert torch.equal(unit_rank(tied), want)


@pytest.mark.parametrize("score,alpha", [("both", 0.3), ("hpf", 0.3), ("pca", 0.3), ("both", 1.0)])
def test_stepvar_scores_combine_the_two_ranks_by_alpha(score, alpha):
    """score = α·rank(texture) + (1−α)·rank(structure); a single criterion uses its rank alone."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 12, 5, generator=g)
    pol = StepVARPolicy({1: 0.5}, score=score, alpha=alpha, components=2)
    pol.begin(2, (1, (3, 4)))
    pol.begin_scale(1, (3, 4))
    tex = unit_rank(texture_score(x.transpose(1, 2).reshape(2, 5, 3, 4)))
    struct = unit_rank(structure_score(x, 2))
    want = {"both": alpha * tex + (1 - alpha) * struct, "hpf": tex, "pca": struct}[score]
    torch.testing.assert_close(pol.scores(x), want)
    keep = pol.enter_scale(1, x)
    assert keep.shape == (2, 6, 5)
    assert torch.equal(pol.scale_keep, want.argsort(dim=1, descending=True, stable=True)[:, :6])


def test_nearest_and_linear_restoration():
    """The block stack sees only the kept tokens; every pruned position then takes the output of its
    nearest kept position (linear: the inverse-distance mean of the 4 nearest); kept ones keep theirs."""
    pol = StepVARPolicy({0: 0.75}, score="hpf")
    pol.begin(1, (4,))
    pol.begin_scale(0, 4)
    x = torch.zeros(1, 16, 3)
    x[0, 5] = 1.0                                      # one bright token: the Laplacian's top scores around it
    kept_in = pol.enter_scale(0, x)
    keep = pol.scale_keep[0].tolist()
    assert len(keep) == 4 and 5 in keep and set(keep) <= {1, 4, 5, 6, 9}
    y = torch.arange(4.0).view(1, 4, 1).expand(1, 4, 2).clone()   # a distinct output per kept token
    out = pol.exit_scale(0, y)
    pos = [(i // 4, i % 4) for i in range(16)]
    for i in range(16):
        d = [((pos[i][0] - pos[k][0]) ** 2 + (pos[i][1] - pos[k][1]) ** 2) for k in keep]
        assert out[0, i, 0].item() == float(d.index(min(d))), f"position {i}"
    assert kept_in.shape == (1, 4, 3) and pol.scale_keep is None

    pol = StepVARPolicy({0: 0.75}, score="hpf", restore="linear")
    pol.begin(1, (4,))
    pol.begin_scale(0, 4)
    pol.enter_scale(0, x)
    keep = pol.scale_keep[0].tolist()
    out = pol.exit_scale(0, y)
    for j, k in enumerate(keep):
        assert out[0, k, 0].item() == float(j)          # a kept position keeps its own output
    far = max(range(16), key=lambda i: min(abs(i // 4 - k // 4) + abs(i % 4 - k % 4) for k in keep))
    assert 0.0 < out[0, far, 0].item() < 3.0 and far not in keep


@pytest.mark.parametrize("hw,keep", [(4, [5, 0, 15, 10]), ((2, 8), [3, 8, 15, 1])])
def test_linear_restoration_is_the_inverse_distance_mean_by_hand(hw, keep):
    """Four kept tokens (in score order) on a 4×4 and a 2×8 map: every pruned position is
    Σ y_j/d_j / Σ 1/d_j over all four (Euclidean distances on the h×w grid); a kept position is its own
    output."""
    w = hw[1] if isinstance(hw, tuple) else hw
    pol = StepVARPolicy({0: 0.75}, restore="linear")
    pol.begin(1, (hw,))
    pol.begin_scale(0, hw)
    score = torch.zeros(1, 16)
    score[0, keep] = torch.tensor([4.0, 3.0, 2.0, 1.0])
    pol.scores = lambda x_BLC: score
    pol.enter_scale(0, torch.randn(1, 16, 2))
    assert pol.scale_keep.tolist() == [keep]
    y = torch.randn(1, 4, 3, generator=torch.Generator().manual_seed(3))
    out = pol.exit_scale(0, y)
    for i in range(16):
        if i in keep:
            want = y[0, keep.index(i)]
        else:
            inv = [1 / math.hypot(i // w - k // w, i % w - k % w) for k in keep]
            want = sum(wt * y[0, j] for j, wt in enumerate(inv)) / sum(inv)
        torch.testing.assert_close(out[0, i], want, msg=f"position {i}")


def test_linear_restoration_breaks_ties_for_the_fourth_neighbour_by_score():
    """16 of 64 tokens kept at random on 8×8: each pruned position averages its 4 nearest by
    (distance, kept order), the kept order being the score order; the case has ties at the 4th place."""
    g = torch.Generator().manual_seed(2)
    keep = torch.randperm(64, generator=g)[:16].tolist()          # in score order
    pol = StepVARPolicy({0: 0.75}, restore="linear")
    pol.begin(1, (8,))
    pol.begin_scale(0, 8)
    score = torch.zeros(1, 64)
    score[0, keep] = torch.arange(16, 0, -1, dtype=torch.float32)
    pol.scores = lambda x_BLC: score
    pol.enter_scale(0, torch.randn(1, 64, 2))
    assert pol.scale_keep.tolist() == [keep]
    y = torch.randn(1, 16, 3, generator=g)
    out = pol.exit_scale(0, y)
    ties = 0
    for i in (i for i in range(64) if i not in keep):
        d2 = [(i // 8 - k // 8) ** 2 + (i % 8 - k % 8) ** 2 for k in keep]
        near = sorted(range(16), key=lambda j: (d2[j], j))
        ties += d2[near[3]] == d2[near[4]]
        inv = [1 / math.sqrt(d2[j]) for j in near[:4]]
        want = sum(wt * y[0, j] for j, wt in zip(near[:4], inv)) / sum(inv)
        torch.testing.assert_close(out[0, i], want, msg=f"position {i}")
    assert ties == 16, ties   # pruned positions whose 4th and 5th nearest are equally far


@pytest.mark.parametrize("score", ["both", "random"])
def test_the_kept_set_is_shared_by_the_cfg_halves_and_the_kv_cache_holds_it(small_gen, score):
    gen, _ = _apply(small_gen, f"stepvar:drop=0.5,score={score}")
    kept = {}
    orig = gen.token_policy.enter_scale

    def spy(si, x):
        out = orig(si, x)
        if gen.token_policy.scale_keep is not None:
            kept[si] = gen.token_policy.scale_keep.clone()
        return out
    gen.token_policy.enter_scale = spy
    B = 2
    gen.sample_tokens(torch.tensor([0, 1]), seed=0, cfg=1.5)
    K, L = len(gen.patch_nums), gen.patch_nums[-1] ** 2
    assert set(kept) == {K - 1} and kept[K - 1].shape == (2 * B, L // 2)
    assert torch.equal(kept[K - 1][:B], kept[K - 1][B:])
    attn = gen.var.blocks[0].attn
    appended, orig_cache = [], attn._cache
    attn._cache = lambda k, v: (appended.append(k.shape[2]), orig_cache(k, v))[1]
    gen.token_policy.enter_scale = orig
    gen.sample_tokens(torch.tensor([0]), seed=0, cfg=None)
    assert appended == [pn * pn for pn in gen.patch_nums[:-1]] + [L // 2], "the KV cache must hold the kept tokens only"


def test_stepvar_random_subsets_are_seeded_per_sampling_call_and_leave_the_global_rng_alone():
    x = torch.randn(3, 16, 4)

    def kept_sets(seed, calls=2):
        pol, out = StepVARPolicy({1: 0.5}, score="random", seed=seed), []
        for _ in range(calls):                       # one sampling call each
            pol.begin(3, (1, 4))
            pol.begin_scale(1, 4)
            pol.enter_scale(1, x)
            out.append(pol.scale_keep.clone())
            pol.exit_scale(1, torch.zeros(3, 8, 4))
        return out

    state = torch.get_rng_state()
    first, second = kept_sets(0)
    assert torch.equal(torch.get_rng_state(), state), "the draws must come from the policy's own generator"
    assert torch.equal(first, second), "every sampling call starts the seed's stream afresh"
    assert len({tuple(sorted(k.tolist())) for k in first}) == 3, "each image draws its own subset"
    torch.manual_seed(123)
    assert torch.equal(kept_sets(0, 1)[0], first)
    assert not torch.equal(kept_sets(1, 1)[0], first)


def test_stepvar_ties_keep_the_earlier_token():
    """Equal scores keep the tokens in index order (a stable sort: an unstable one reorders 64+ ties)."""
    pol = StepVARPolicy({1: 0.5})
    pol.begin(1, (1, 8))
    pol.begin_scale(1, 8)
    pol.scores = lambda x_BLC: torch.zeros(x_BLC.shape[:2])
    pol.enter_scale(1, torch.randn(1, 64, 2))
    assert pol.scale_keep.tolist() == [list(range(32))]


def test_stepvar_errors(small_gen):
    with pytest.raises(ValueError, match=re.escape("stepvar: drop=0/0/0/0/0.5 prunes 5 scales but the model has 5: the first "
                                                   "scale must stay dense")):
        _apply(small_gen, "stepvar:drop=0/0/0/0/0.5")
    with pytest.raises(ValueError, match="trailing"):
        _apply(small_gen, "stepvar:drop=1/0.5")


# ------------------------------------------------------------------------------------- ToMe
def _brute_tome(metric, x, y_fn, h, w, r, cell=None):
    """tomesd's random2d matching, one row at a time, in plain loops: window (a, b)'s destination is
    its cell[a][b]-th token in raster order (None: the top-left one)."""
    out = torch.empty_like(x)
    cell = cell if cell is not None else [[0] * (w // 2) for _ in range(h // 2)]
    for b in range(x.shape[0]):
        dst = sorted((i + cell[i // 2][j // 2] // 2) * w + j + cell[i // 2][j // 2] % 2
                     for i in range(0, h - h % 2, 2) for j in range(0, w - w % 2, 2))
        src = [p for p in range(h * w) if p not in dst]
        m = metric[b] / metric[b].norm(dim=-1, keepdim=True)
        best = [max(range(len(dst)), key=lambda d: (m[s] @ m[dst[d]]).item()) for s in src]
        sim = [(m[s] @ m[dst[best[i]]]).item() for i, s in enumerate(src)]
        merged = sorted(range(len(src)), key=lambda i: -sim[i])[:r]
        groups = {d: [dst[d]] for d in range(len(dst))}
        for i in merged:
            groups[best[i]].append(src[i])
        tokens = [x[b, src[i]] for i in range(len(src)) if i not in merged] + \
                 [torch.stack([x[b, p] for p in groups[d]]).mean(0) for d in range(len(dst))]
        y = y_fn(torch.stack(tokens).unsqueeze(0))[0]
        unmerged = [src[i] for i in range(len(src)) if i not in merged]
        for k, p in enumerate(unmerged):
            out[b, p] = y[k]
        for d in range(len(dst)):
            for p in groups[d]:
                out[b, p] = y[len(unmerged) + d]
    return out


@pytest.mark.parametrize("seed", [None, 5, 6])   # top-left destinations, then random ones
@pytest.mark.parametrize("h,w,r", [(4, 4, 6), (5, 6, 9), (4, 4, 0), (4, 6, 30)])   # r = 30: more than the sources
def test_tome_merge_unmerge_against_loops(h, w, r, seed):
    g = torch.Generator().manual_seed(3)
    N, n_dst = h * w, (h // 2) * (w // 2)
    metric, x = torch.randn(2, N, 8, generator=g), torch.randn(2, N, 5, generator=g)
    lin = torch.nn.Linear(5, 5)
    rng = None if seed is None else torch.Generator().manual_seed(seed)
    cell = None if seed is None else torch.randint(4, (h // 2, w // 2), generator=torch.Generator().manual_seed(seed)).tolist()
    merge, unmerge, pos = random2d_matching(metric, h, w, r, rng=rng)
    merged, r = merge(x), min(r, N - n_dst)     # at most every source merges
    assert merged.shape == (2, N - r, 5) and pos.shape == (2, N - r)
    n_unm = N - r - n_dst   # the unmerged sources come first, at their own positions
    torch.testing.assert_close(merged[:, :n_unm], x.gather(1, pos[:, :n_unm, None].expand(-1, -1, 5)))
    assert sorted(pos[0].tolist()) == sorted(set(pos[0].tolist())), "two merged tokens at one position"
    windows = sorted((p // w // 2, p % w // 2) for p in pos[0, n_unm:].tolist())
    assert windows == [(a, b) for a in range(h // 2) for b in range(w // 2)], "one destination per 2×2 window"
    with torch.no_grad():
        torch.testing.assert_close(unmerge(lin(merged)), _brute_tome(metric, x, lin, h, w, r, cell))
    if r == 0:
        assert torch.equal(unmerge(merge(x)), x)


def test_tome_random_destinations_are_seeded():
    metric = torch.randn(1, 16, 4, generator=torch.Generator().manual_seed(0))
    x = torch.randn(1, 16, 4)
    outs = [random2d_matching(metric, 4, 4, 8, rng=torch.Generator().manual_seed(s))[0](x) for s in (0, 0, 1)]
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])


def test_tome_policy_merges_by_the_residual_with_its_own_seeded_stream():
    """The policy merges the sub-layer's input h by the residual x's similarity, r = int(L·ratio) tokens,
    its destinations drawn from one generator per sampling call seeded with ``seed`` (never the global
    RNG); other sub-layers and unlisted scales run unmerged."""
    g = torch.Generator().manual_seed(0)
    h, x = torch.randn(2, 16, 6, generator=g), torch.randn(2, 16, 6, generator=g)
    lengths = []

    def fn(t, keep_Bl=None):
        lengths.append(t.shape[1])
        return t * 2 + 1

    pol, calls = ToMePolicy({1: 0.25}, kinds=("attn",), seed=7), []
    state = torch.get_rng_state()
    for _ in range(2):                               # two sampling calls, two sub-layers each
        pol.begin(2, (1, 4))
        pol.begin_scale(1, 4)
        calls.append([pol.sublayer(1, "attn", b, h, fn, x_BLC=x) for b in range(2)])
    assert torch.equal(torch.get_rng_state(), state), "the draws must come from the policy's own generator"
    assert lengths == [12] * 4, "r = int(16 · 0.25) = 4 tokens merged away"
    rng = torch.Generator().manual_seed(7)
    for b in range(2):
        merge, unmerge, _ = random2d_matching(x, 4, 4, 4, rng=rng)
        for out in calls:
            torch.testing.assert_close(out[b], unmerge(merge(h) * 2 + 1))
    assert not torch.equal(calls[0][0], calls[0][1]), "the stream goes on within a sampling call"
    fixed = ToMePolicy({1: 0.25}, use_rand=False)
    fixed.begin(2, (1, 4))
    fixed.begin_scale(1, 4)
    merge, unmerge, _ = random2d_matching(x, 4, 4, 4)
    torch.testing.assert_close(fixed.sublayer(1, "attn", 0, h, fn, x_BLC=x), unmerge(merge(h) * 2 + 1))
    assert not torch.equal(fixed.sublayer(1, "attn", 0, h, fn, x_BLC=x), calls[0][0])
    for si, kind in ((1, "ffn"), (0, "attn")):
        assert torch.equal(pol.sublayer(si, kind, 0, h, fn, x_BLC=x), h * 2 + 1)
    # a wide 2×8 map: 2×2 windows along its rows (destinations 0, 2, 4, 6 without draws), not along 8 rows
    wide = ToMePolicy({1: 0.25}, use_rand=False)
    wide.begin(2, (1, (2, 8)))
    wide.begin_scale(1, (2, 8))
    merge, unmerge, _ = random2d_matching(x, 2, 8, 4)
    torch.testing.assert_close(wide.sublayer(1, "attn", 0, h, fn, x_BLC=x), unmerge(merge(h) * 2 + 1))


def test_tome_ffn_reuses_the_blocks_attention_merge_and_odd_batches_take_the_top_left():
    """tomesd's compute_merge: one merge per block from its input serves attention and MLP; an odd batch
    uses no random destinations."""
    g = torch.Generator().manual_seed(1)
    h, x, x_after = (torch.randn(2, 16, 6, generator=g) for _ in range(3))
    fn = lambda t, keep_Bl=None: t * 2 + 1  # noqa: E731
    pol = ToMePolicy({1: 0.25}, kinds=("attn", "ffn"), seed=3)
    pol.begin(2, (1, 4))
    pol.begin_scale(1, 4)
    out_a = pol.sublayer(1, "attn", 0, h, fn, x_BLC=x)
    out_f = pol.sublayer(1, "ffn", 0, h, fn, x_BLC=x_after)     # the residual moved on: the merge does not
    merge, unmerge, _ = random2d_matching(x, 4, 4, 4, rng=torch.Generator().manual_seed(3))
    torch.testing.assert_close(out_a, unmerge(merge(h) * 2 + 1))
    torch.testing.assert_close(out_f, out_a)
    nxt = pol.sublayer(1, "attn", 1, h, fn, x_BLC=x)             # the next block draws anew
    rng = torch.Generator().manual_seed(3)
    random2d_matching(x, 4, 4, 4, rng=rng)
    merge, unmerge, _ = random2d_matching(x, 4, 4, 4, rng=rng)
    torch.testing.assert_close(nxt, unmerge(merge(h) * 2 + 1))
    odd = ToMePolicy({1: 0.25}, seed=3)                           # use_rand, but a batch of 1
    odd.begin(1, (1, 4))
    odd.begin_scale(1, 4)
    merge, unmerge, _ = random2d_matching(x[:1], 4, 4, 4)
    torch.testing.assert_close(odd.sublayer(1, "attn", 0, h[:1], fn, x_BLC=x[:1]), unmerge(merge(h[:1]) * 2 + 1))
    assert odd.rng is None


@pytest.mark.parametrize("spec,ratios,kinds,note", [
    ("tome", {3: 0.5, 4: 0.5}, {"attn"}, "tome: ratio 0.5 at 4×4, 8×8, merging attn"),
    ("tome:ffn=true,scales=3,ratio=0.25,use_rand=false,seed=4", {2: 0.25, 3: 0.25, 4: 0.25}, {"attn", "ffn"},
     "tome: ratio 0.25 at 3×3, 4×4, 8×8, merging attn and ffn")])
def test_tome_apply_installs_its_policy_at_the_last_scales(small_gen, spec, ratios, kinds, note):
    gen, ctx = _apply(small_gen, spec)
    pol = gen.token_policy
    assert (pol.ratio, set(pol.kinds), ctx.notes[0]) == (ratios, kinds, note)
    assert (pol.use_rand, pol.seed) == (("use_rand=false" not in spec), (4 if "seed=4" in spec else 0))


@pytest.mark.parametrize("method,note", [
    ("tome", "tome: ratio 0.5 at 4×6, 5×8, merging attn"),
    ("fastvar", "fastvar (var schedule): drop {4×6: 0.5, 5×8: 0.75}, cache at 3×4, all blocks"),
    ("lazyvar", "lazyvar (var schedule): keep {3×4: 0.2, 4×6: 0.1, 5×8: 0.05}, one group (parallel decoding), "
                "cum=on, criterion=update"),
    ("stepvar", "stepvar: drop {4×6: 0.5, 5×8: 0.75}, score=both, restore=nearest")])
def test_the_notes_name_each_scale_height_by_width_on_a_non_square_pyramid(method, note):
    """What a record's notes say of the schedule: on a pyramid of wide scales (as Infinity's and HART's
    non-square aspect ratios), each scale is written h×w, the installed policy's own scales."""
    from types import SimpleNamespace

    from bench.registry import METHODS
    gen = SimpleNamespace(family="var", blocks=[0, 1], scales_hw=[(1, 1), (1, 2), (2, 3), (3, 4), (4, 6), (5, 8)],
                          token_policy=None)
    ctx = SimpleNamespace(notes=[])
    METHODS.get(method)().apply(gen, ctx)
    assert ctx.notes == [note] and gen.token_policy.name == method


def test_tome_errors(small_gen):
    with pytest.raises(ValueError, match="^tome: scales=5 but the model has 5 scales; the first must stay unmerged$"):
        _apply(small_gen, "tome:scales=5")
    from bench.spec import SpecError
    with pytest.raises(SpecError, match="out of range"):
        _apply(small_gen, "tome:ratio=0.9")


@pytest.mark.parametrize("token_method", ["fastvar", "lazyvar", "stepvar", "tome"])
def test_composition_weights_then_recovery_then_tokens(small_gen, token_method):
    """``evar + psad + <token method>``: the pruned, distilled model samples with the policy installed;
    its FLOPs are below the pruned model's, which are below the dense model's."""
    from tests.test_registered import _ctx
    dense = sampling_flops(small_gen)
    ctx = _ctx(small_gen)
    pruned = apply_chain(small_gen, ["evar:sparsity=0.5,n_calib=8", "psad:epochs=0.5,batch=8"], ctx)
    pruned_flops = sampling_flops(pruned)
    gen = apply_chain(pruned, [token_method], ctx)
    assert gen.var.blocks[0].attn.H == 1 and gen.token_policy.name == token_method
    assert sampling_flops(gen) < pruned_flops < dense
    imgs = gen.generate(torch.tensor([0, 1]), seed=0)
    assert imgs.shape == (2, 3, 32, 32) and imgs.dtype == torch.uint8
