"""taylor, llm-pruner and oba against brute force on a float64 2-block model: first-order terms by
central differences of the loss along a unit's weights, second-order terms by mixed central
differences, element gradients by finite differences; pruning removes the lowest scores exactly;
scoring leaves the model as it was."""
import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from bench.importance import PRUNABLE, prunable, unit_sums
from bench.method import Context
from bench.models.generator import Generator
from bench.models.var import VAR
from bench.models.vqvae import VQVAE
from bench.registry import METHODS
from tests.conftest import SMALL_VAE, SMALL_VAR, randomize_


def _teacher_loss(gen, labels, tokens):
    """``gen.loss`` without the float32 casts of ``VAR.forward``/``get_logits`` (float64 differences)."""
    var = gen.var
    B = labels.shape[0]
    cond_BD = var.cond(labels)
    sos_B1C = cond_BD.unsqueeze(1).expand(B, var.first_l, -1) + var.pos_start.expand(B, -1, -1)
    x_in = gen.vae.quantize.idx_to_var_input(tokens).to(cond_BD.dtype)
    x_BLC = torch.cat((sos_B1C, var.word_embed(x_in)), dim=1) + var.lvl_pos()
    x_BLC = var.run_blocks(x_BLC, cond_BD, var.attn_bias_for_masking.to(cond_BD.dtype))
    logits_BLV = var.head(var.head_nm(x_BLC, cond_BD))
    return F.cross_entropy(logits_BLV.flatten(0, 1), torch.cat(tokens, dim=1).flatten())


def _data(gen, n, seed=5):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(gen.var.num_classes, (n,), generator=g)
    return labels, [torch.randint(gen.var.V, (n, pn * pn), generator=g) for pn in gen.patch_nums]


def _ctx(data):
    return Context(progress=False, data=lambda n, split: (data[0][:n], [t[:n] for t in data[1]]))


def _batches(data, batch):
    labels, tokens = data
    return [(labels[i:i + batch], [t[i:i + batch] for t in tokens]) for i in range(0, len(labels), batch)]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def gen64(small_gen):
    data = _data(small_gen, 2)
    with torch.no_grad():   # the test's loss is the model's loss
        assert abs(_teacher_loss(small_gen, *data).item() - small_gen.loss(*data).item()) < 1e-5
    gen = small_gen.double()
    gen.loss = lambda labels, tokens: _teacher_loss(gen, labels, tokens)
    return gen


def _head_mask(gen, i, h):
    """Ones on head h of block i: its q, k, v rows, q/v bias entries and proj columns (index arithmetic)."""
    mask = [{k: torch.zeros_like(p) for k, p in d.items()} for d in prunable(gen)]
    attn = gen.var.blocks[i].attn
    HC, c, m = attn.H * attn.c, attn.c, mask[i]
    for chunk in range(3):
        m["attn.mat_qkv.weight"][chunk * HC + h * c: chunk * HC + (h + 1) * c] = 1
    m["attn.q_bias"][h * c:(h + 1) * c] = 1
    m["attn.v_bias"][h * c:(h + 1) * c] = 1
    m["attn.proj.weight"][:, h * c:(h + 1) * c] = 1
    return mask


def _channel_mask(gen, i, j):
    mask = [{k: torch.zeros_like(p) for k, p in d.items()} for d in prunable(gen)]
    mask[i]["ffn.fc1.weight"][j] = 1
    mask[i]["ffn.fc1.bias"][j] = 1
    mask[i]["ffn.fc2.weight"][:, j] = 1
    return mask


UNITS = [("head", 0, 0), ("head", 0, 1), ("head", 1, 0), ("head", 1, 1),
         ("channel", 0, 3), ("channel", 0, 200), ("channel", 1, 17), ("channel", 1, 511)]


def _mask(gen, kind, i, j):
    return (_head_mask if kind == "head" else _channel_mask)(gen, i, j)


def _times_theta(gen, mask):
    return [{k: m[k] * p[k].detach() for k in m} for m, p in zip(mask, prunable(gen))]


@torch.no_grad()
def _loss_at(gen, batch, steps):
    """The loss with the prunable weights moved by Σ t·direction over (t, direction) in ``steps``."""
    params = prunable(gen)
    saved = [{k: p.clone() for k, p in d.items()} for d in params]
    for t, direction in steps:
        for d, v in zip(params, direction):
            for k in d:
                d[k].add_(v[k], alpha=t)
    loss = gen.loss(*batch).item()
    for d, s in zip(params, saved):
        for k in d:
            d[k].copy_(s[k])
    return loss


def _d1(gen, batch, u, t=1e-4):
    """d/dt L(θ + t·u) at 0 (central difference; float64)."""
    return (_loss_at(gen, batch, [(t, u)]) - _loss_at(gen, batch, [(-t, u)])) / (2 * t)


def _d2(gen, batch, u, v, t=4e-2):
    """∂²/∂s∂t L(θ + s·u + t·v) at 0 = uᵀHv: mixed central differences D(h) at h = t, t/2, t/4, Richardson-
    extrapolated twice (the t² and t⁴ terms cancel). The step is a trade: D's rounding error is about
    ε·L/h², its truncation error O(h²). One level at t = 1e-3 left about 1e-5 relative error on the
    small channel terms, which moved with the CPU's summation order (it failed a 1e-5 tolerance on one
    machine); two levels from t = 4e-2 leave about 5e-8."""
    f = lambda a, b: _loss_at(gen, batch, [(a, u), (b, v)])  # noqa: E731
    D = lambda h: (f(h, h) - f(h, -h) - f(-h, h) + f(-h, -h)) / (4 * h * h)  # noqa: E731
    d0, d1, d2 = D(t), D(t / 2), D(t / 4)
    r1, r2 = (4 * d1 - d0) / 3, (4 * d2 - d1) / 3       # O(t⁴)
    return (16 * r2 - r1) / 15                           # O(t⁶)


def _score(scores, kind, i, j):
    return scores[0 if kind == "head" else 1][i][j].item()


def test_taylor_square_sum_is_the_squared_directional_derivative(gen64):
    data = _data(gen64, 4)
    scores = METHODS.get("taylor")(n_calib=4, batch=2).scores(gen64, _ctx(data))
    for kind, i, j in UNITS:
        u = _times_theta(gen64, _mask(gen64, kind, i, j))
        want = sum(0.5 * _d1(gen64, b, u) ** 2 for b in _batches(data, 2))   # (Σ_S g·w)² averaged over 2 batches
        assert _score(scores, kind, i, j) == pytest.approx(want, rel=1e-6), (kind, i, j)


def _autograd(gen, batch):
    params = prunable(gen)
    flat = [p for d in params for p in d.values()]
    g = torch.autograd.grad(gen.loss(*batch), flat)
    it = iter(g)
    return [{k: next(it) for k in d} for d in params]


def test_first_order_abs_sums_equal_finite_differences(gen64):
    """Σ_S |g·w| = D(S⁺) − D(S⁻), S± the elements with g·w ≷ 0: taylor abs-sum and llm-pruner param_first."""
    data = _data(gen64, 4)
    taylor = METHODS.get("taylor")(n_calib=4, batch=2, reduce="abs-sum").scores(gen64, _ctx(data))
    llm = METHODS.get("llm-pruner")(n_calib=4, batch=3).scores(gen64, _ctx(data))
    gw = [{k: g[k] * p[k].detach() for k in g} for g, p in zip(_autograd(gen64, data), prunable(gen64))]
    for kind, i, j in UNITS:
        mask = _mask(gen64, kind, i, j)
        pos = _times_theta(gen64, [{k: m[k] * (e[k] > 0) for k in m} for m, e in zip(mask, gw)])
        neg = _times_theta(gen64, [{k: m[k] * (e[k] < 0) for k in m} for m, e in zip(mask, gw)])
        want = _d1(gen64, data, pos) - _d1(gen64, data, neg)
        assert _score(taylor, kind, i, j) == pytest.approx(want, rel=1e-6), (kind, i, j)
        assert _score(llm, kind, i, j) == pytest.approx(want, rel=1e-6), (kind, i, j)


@pytest.mark.parametrize("taylor", ["param_second", "param_mix"])
def test_llm_pruner_second_order_terms(gen64, taylor):
    """F = mean over samples of g_s² (per-sample gradients, spot-checked by finite differences)."""
    data = _data(gen64, 3)
    scores = METHODS.get("llm-pruner")(n_calib=3, batch=2, taylor=taylor).scores(gen64, _ctx(data))
    samples = _batches(data, 1)
    g_s = [_autograd(gen64, s) for s in samples]
    gen_g = torch.Generator().manual_seed(0)
    for name in PRUNABLE:   # per-sample gradient elements against central differences
        for i in range(2):
            p = prunable(gen64)[i][name]
            flat_idx = torch.randint(p.numel(), (2,), generator=gen_g)
            for idx in flat_idx.tolist():
                e = [{k: torch.zeros_like(q) for k, q in d.items()} for d in prunable(gen64)]
                e[i][name].view(-1)[idx] = 1
                assert g_s[1][i][name].view(-1)[idx].item() == pytest.approx(_d1(gen64, samples[1], e, 1e-4),
                                                                              rel=1e-5, abs=1e-10)
    g = _autograd(gen64, data)
    for kind, i, j in UNITS:
        mask, params = _mask(gen64, kind, i, j)[i], prunable(gen64)[i]
        want = 0.0
        for k in mask:
            w = params[k].detach()
            fisher = sum(gs[i][k].square() for gs in g_s) / len(g_s)
            elem = (w * fisher * w) if taylor == "param_second" else (w * g[i][k] - 0.5 * w * fisher * w)
            want += (elem.abs() * mask[k]).sum().item()
        assert _score(scores, kind, i, j) == pytest.approx(want, rel=1e-9), (kind, i, j)


def test_oba_equals_finite_difference_second_order(gen64):
    """I(S) = |mean_b Σ_S (δ·g·θ + ½·θ·Hθ)| / max over the block: uᵀHθ by mixed differences of the loss."""
    data, delta = _data(gen64, 4), 0.5
    heads, channels = METHODS.get("oba")(n_calib=4, batch=2, delta=delta).scores(gen64, _ctx(data))
    theta_P = _times_theta(gen64, [{k: torch.ones_like(p) for k, p in d.items()} for d in prunable(gen64)])
    raw = {}
    for kind, i, j in UNITS:
        u = _times_theta(gen64, _mask(gen64, kind, i, j))
        raw[kind, i, j] = abs(sum(0.5 * (delta * _d1(gen64, b, u) + 0.5 * _d2(gen64, b, u, theta_P))
                                  for b in _batches(data, 2)))
    for i in range(2):   # both heads are known: the max normalisation can be checked exactly
        top = max(raw["head", i, 0], raw["head", i, 1])
        for h in range(2):
            assert heads[i][h].item() == pytest.approx(raw["head", i, h] / top, rel=1e-6), (i, h)
        assert channels[i].max().item() == pytest.approx(1.0)
    # channels: the same up to the block's (unknown) max
    (a, b), (c, d) = [[key for key in raw if key[0] == "channel" and key[1] == i] for i in range(2)]
    for x, y in ((a, b), (c, d)):
        assert (_score((heads, channels), *x) / _score((heads, channels), *y)) == pytest.approx(raw[x] / raw[y], rel=1e-6)


@pytest.mark.parametrize("name", ["taylor", "llm-pruner", "oba"])
def test_scoring_restores_the_model_and_sparsity_zero_changes_nothing(small_gen, name):
    data = _data(small_gen, 4)
    frozen = small_gen.var.head.weight
    frozen.requires_grad_(False)
    before = {k: v.clone() for k, v in small_gen.state_dict().items()}
    METHODS.get(name)(n_calib=4, batch=2).scores(small_gen, _ctx(data))
    assert not small_gen.training and not small_gen.var.training
    assert all(p.grad is None for p in small_gen.parameters())
    assert all(p.requires_grad == (p is not frozen) for p in small_gen.parameters())
    assert all(torch.equal(before[k], v) for k, v in small_gen.state_dict().items())
    with torch.no_grad():
        logits = small_gen.forward_teacher(*data)
    gen = METHODS.get(name)(sparsity=0.0).apply(small_gen, _ctx(data))
    with torch.no_grad():
        assert torch.equal(gen.forward_teacher(*data), logits)


def _kept(original, pruned, block):
    """Original indices of the heads / channels a pruned block kept (matched by their proj / fc1 slices)."""
    a, p = original.var.blocks[block], pruned.var.blocks[block]
    c = a.attn.c
    cols = a.attn.proj.weight.view(-1, a.attn.H, c)
    heads = [h for h in range(a.attn.H)
             if any(torch.equal(cols[:, h], p.attn.proj.weight.view(-1, p.attn.H, c)[:, k]) for k in range(p.attn.H))]
    rows = {tuple(r.tolist()) for r in p.ffn.fc1.weight}
    channels = [j for j in range(a.ffn.fc1.out_features) if tuple(a.ffn.fc1.weight[j].tolist()) in rows]
    return heads, channels


@pytest.mark.parametrize("spec", ["taylor", "llm-pruner", "oba"])
def test_pruning_removes_exactly_the_lowest_scores(small_gen, spec):
    data = _data(small_gen, 4)
    method = METHODS.get(spec)(n_calib=4, batch=2, sparsity=0.25)
    heads, channels = method.scores(copy.deepcopy(small_gen), _ctx(data))
    pruned = method.apply(copy.deepcopy(small_gen), _ctx(data))
    for i in range(2):
        kept_h, kept_c = _kept(small_gen, pruned, i)
        assert kept_h == sorted(heads[i].topk(2).indices.tolist())          # round(0.25·2) = 0 heads removed
        assert kept_c == sorted(channels[i].topk(512 - 128).indices.tolist())
    method = METHODS.get(spec)(n_calib=4, batch=2, sparsity=0.5)
    pruned = method.apply(copy.deepcopy(small_gen), _ctx(data))
    for i in range(2):
        assert _kept(small_gen, pruned, i)[0] == [heads[i].argmax().item()]


def test_unit_sums_cover_every_coupled_slice(small_gen):
    """An indicator on one slice of one unit sums to the slice's size on that unit and 0 elsewhere."""
    b = small_gen.var.blocks[1]
    H, c, C, Fh = b.attn.H, b.attn.c, b.C, b.ffn.fc1.out_features
    HC = H * c
    zeros = lambda: {k: torch.zeros_like(p) for k, p in prunable(small_gen)[1].items()}  # noqa: E731
    head_slices = {("attn.mat_qkv.weight", off): C * c for off in (0, HC, 2 * HC)}
    head_slices.update({("attn.q_bias", 0): c, ("attn.v_bias", 0): c, ("attn.proj.weight", 0): C * c})
    for (name, off), size in head_slices.items():
        e = zeros()
        if name == "attn.proj.weight":
            e[name][:, c:2 * c] = 1           # head 1's columns
        else:
            e[name][off + c: off + 2 * c] = 1  # head 1's rows / entries
        heads, channels = unit_sums(b, e)
        assert heads.tolist() == [0.0, float(size)] and channels.abs().sum() == 0, name
    j = 7
    for name, size in (("ffn.fc1.weight", C), ("ffn.fc1.bias", 1), ("ffn.fc2.weight", C)):
        e = zeros()
        if name == "ffn.fc2.weight":
            e[name][:, j] = 1
        else:
            e[name][j] = 1
        heads, channels = unit_sums(b, e)
        assert heads.abs().sum() == 0 and channels[j] == size and channels.sum() == size and len(channels) == Fh, name


@pytest.mark.parametrize("name,note", [
    ("taylor", "taylor: square-sum scores from 4 calibration images in 2 batch(es) of ≤2"),
    ("llm-pruner", "llm-pruner: param_first scores from 4 calibration images"),
    ("oba", "oba: delta=0, exact Hessian-vector products from 4 calibration images in 2 batch(es) of ≤2")])
def test_calibration_split_training_mode_and_notes(name, note):
    """Scores come from the bench's ``calib`` split, are computed in eval mode whatever the model's mode
    (label dropout and drop path off), and the note says how; no data is a clear error."""
    cfg = dataclasses.replace(SMALL_VAR, cond_drop_rate=0.9, drop_path_rate=0.5)
    gen = Generator(randomize_(VAR(cfg), 1), randomize_(VQVAE(SMALL_VAE), 2)).train()
    data = _data(gen, 4)
    asked = []
    ctx = Context(progress=False, data=lambda n, split: (asked.append((n, split)), _ctx(data).data(n, split))[1])
    scores_train = METHODS.get(name)(n_calib=4, batch=2).scores(gen, ctx)
    assert asked and set(asked) == {(4, "calib")} and ctx.notes == [note]
    scores_eval = METHODS.get(name)(n_calib=4, batch=2).scores(gen.eval(), _ctx(data))
    assert all(torch.equal(a[i], b[i]) for a, b in zip(scores_train, scores_eval) for i in a)
    with pytest.raises(ValueError, match=rf"^{name} needs calibration data: the bench provides none \(Context.data\)$"):
        METHODS.get(name)(n_calib=4).scores(gen, Context(progress=False))


def test_llm_pruner_second_order_note_names_the_fisher_batches(small_gen):
    ctx = _ctx(_data(small_gen, 2))
    METHODS.get("llm-pruner")(n_calib=2, taylor="param_mix", fisher_batch=2).scores(small_gen, ctx)
    assert ctx.notes == ["llm-pruner: param_mix scores from 2 calibration images, Fisher from batches of 2"]


def test_batch_weights_are_each_batchs_share_and_grads_are_cleared(small_gen):
    from bench.importance import batch_grads, batch_hvps, split
    data = _data(small_gen, 5)
    batches = split(data, 2, small_gen.device)
    assert [len(lab) for lab, _ in batches] == [2, 2, 1]
    params = prunable(small_gen)
    w = params[0]["ffn.fc1.weight"]
    w.grad = torch.ones_like(w)
    assert [round(wb, 9) for wb, _ in batch_grads(small_gen, params, batches)] == [0.4, 0.4, 0.2]
    assert [round(wb, 9) for wb, _, _ in batch_hvps(small_gen, params, batches)] == [0.4, 0.4, 0.2]
    assert w.grad is None
