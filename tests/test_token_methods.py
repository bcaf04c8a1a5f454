"""StepVAR and ToMe (methods/stepvar.py, methods/tome.py): their pieces against written-out
computations, the identity settings on sampled images, and what each changes in a sampling run."""
import pytest
import torch

from bench.accounting import sampling_flops
from bench.method import Context, apply_chain
from methods.stepvar import StepVARPolicy, structure_score, texture_score, unit_rank
from methods.tome import random2d_matching

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


@pytest.mark.parametrize("L,C", [(6, 10), (12, 4)])   # both eigenproblems (Gram and covariance)
def test_structure_score_is_the_pca_projection_by_svd(L, C):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, L, C, generator=g, dtype=torch.float64)
    for k in (1, 2):
        xc = x - x.mean(1, keepdim=True)
        U, S, _ = torch.linalg.svd(xc, full_matrices=False)
        want = (U[..., :k] * S[:, None, :k]).square().sum(-1)
        torch.testing.assert_close(structure_score(x, k), want)


def test_unit_rank():
    assert unit_rank(torch.tensor([[3.0, 1.0, 2.0]])).tolist() == [[1.0, 0.0, 0.5]]


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


def test_the_kept_set_is_shared_by_the_cfg_halves_and_the_kv_cache_holds_it(small_gen):
    gen, _ = _apply(small_gen, "stepvar:drop=0.5")
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


def test_stepvar_errors(small_gen):
    with pytest.raises(ValueError, match="first scale must stay dense"):
        _apply(small_gen, "stepvar:drop=0/0/0/0/0.5")
    with pytest.raises(ValueError, match="trailing"):
        _apply(small_gen, "stepvar:drop=1/0.5")


# ------------------------------------------------------------------------------------- ToMe
def _brute_tome(metric, x, y_fn, h, w, r):
    """tomesd's random2d matching with top-left destinations, one row at a time, in plain loops."""
    out = torch.empty_like(x)
    for b in range(x.shape[0]):
        dst = [i * w + j for i in range(0, h - h % 2, 2) for j in range(0, w - w % 2, 2)]
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


@pytest.mark.parametrize("h,w,r", [(4, 4, 6), (5, 6, 9), (4, 4, 0)])
def test_tome_merge_unmerge_against_loops(h, w, r):
    g = torch.Generator().manual_seed(3)
    N = h * w
    metric, x = torch.randn(2, N, 8, generator=g), torch.randn(2, N, 5, generator=g)
    lin = torch.nn.Linear(5, 5)
    merge, unmerge, pos = random2d_matching(metric, h, w, r)
    merged = merge(x)
    assert merged.shape == (2, N - r, 5) and pos.shape == (2, N - r)
    n_unm = N - r - (h // 2) * (w // 2)   # the unmerged sources come first, at their own positions
    torch.testing.assert_close(merged[:, :n_unm], x.gather(1, pos[:, :n_unm, None].expand(-1, -1, 5)))
    assert sorted(pos[0].tolist()) == sorted(set(pos[0].tolist())), "two merged tokens at one position"
    with torch.no_grad():
        torch.testing.assert_close(unmerge(lin(merged)), _brute_tome(metric, x, lin, h, w, r))
    if r == 0:
        assert torch.equal(unmerge(merge(x)), x)


def test_tome_random_destinations_are_seeded():
    metric = torch.randn(1, 16, 4, generator=torch.Generator().manual_seed(0))
    x = torch.randn(1, 16, 4)
    outs = [random2d_matching(metric, 4, 4, 8, rng=torch.Generator().manual_seed(s))[0](x) for s in (0, 0, 1)]
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])


def test_tome_errors(small_gen):
    with pytest.raises(ValueError, match="first must stay unmerged"):
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
