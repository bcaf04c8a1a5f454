"""OBS structured pruning (``bench.obs``), streaming calibration (``bench.calib``) and the two methods
built on them, ``evar`` and ``slimgpt``: brute-force checks of the OBS algebra, the Hessian forms,
the counts, and end-to-end properties of the pruned models."""
import copy
import dataclasses

import pytest
import torch

from bench.calib import Hessian, Stream, block0_inputs, decay_weights, scale_weights
from bench.method import Context
from bench.models.generator import Generator
from bench.models.var import VAR, VARConfig, sizes_in
from bench.models.vqvae import VQVAE
from bench.obs import dgs_sizes, n_pruned, prune_channels, prune_heads, struct_prune
from bench.prune import block_sparsities
from bench.registry import METHODS
from tests.conftest import SMALL_VAE, SMALL_VAR, randomize_

pytestmark = pytest.mark.usefixtures("one_thread")


def _data(gen, n, seed=1):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(gen.var.num_classes, (n,), generator=g)
    return labels, [torch.randint(gen.var.V, (n, pn * pn), generator=g) for pn in gen.patch_nums]


def _ctx(gen):
    return Context(progress=False, data=lambda n, split: _data(gen, n))


def _logits(gen, seed=3):
    labels, tokens = _data(gen, 3, seed)
    with torch.no_grad():
        return gen.eval().forward_teacher(labels, tokens)


def _spd(D, n=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n or 3 * D, D, generator=g, dtype=torch.float64)
    return X.T @ X / len(X)


def _ls_optimum(W, H, removed):
    """Brute force: argmin over W' with W'_:,removed = 0 of tr((W − W') H (W − W')ᵀ), and that error."""
    rest = torch.tensor([p for p in range(W.shape[1]) if p not in set(removed.tolist())])
    Wc = torch.zeros_like(W)
    Wc[:, rest] = torch.linalg.solve(H[rest][:, rest], (W @ H)[:, rest].T).T
    E = W - Wc
    return Wc, float(torch.trace(E @ H @ E.T))


# ---------------------------------------------------------------------------------------- struct_prune
def test_single_column_is_the_exact_obs_optimum():
    g = torch.Generator().manual_seed(0)
    W, H = torch.randn(6, 10, generator=g, dtype=torch.float64), _spd(10)
    cols, Wc = struct_prune(W, H, 1, headsize=1, percdamp=0.0)
    errors = [_ls_optimum(W, H, torch.tensor([p]))[1] for p in range(10)]
    p = int(cols[0])
    assert len(cols) == 1 and p == min(range(10), key=errors.__getitem__)
    Hinv = torch.linalg.inv(H)
    closed = W - W[:, p:p + 1] @ Hinv[p:p + 1] / Hinv[p, p]         # W − W_:,p (H⁻¹)_p,: / (H⁻¹)_pp
    assert torch.allclose(Wc, closed, atol=1e-10) and torch.allclose(Wc, _ls_optimum(W, H, cols)[0], atol=1e-10)
    assert errors[p] == pytest.approx(float((W[:, p] ** 2).sum() / Hinv[p, p]), rel=1e-9)


def test_batch_and_greedy_heads_reach_the_joint_optimum():
    g = torch.Generator().manual_seed(1)
    W, H = torch.randn(5, 12, generator=g, dtype=torch.float64), _spd(12, seed=1)
    cols, Wc = struct_prune(W, H, 4, headsize=1, percdamp=0.0)    # one DGS batch of 4, sequential inside
    Hinv = torch.linalg.inv(H)
    assert cols.tolist() == sorted((W ** 2 / Hinv.diag()).sum(0).topk(4, largest=False).indices.tolist())
    assert torch.allclose(Wc, _ls_optimum(W, H, cols)[0], atol=1e-10)
    # heads of 3 columns: the first head is the grouped-Cholesky argmin (a case where plain diag(H⁻¹)
    # would pick another head); two greedy iterations with H reduced in between give the least-squares
    # optimum for both heads removed
    for seed in range(100):
        g = torch.Generator().manual_seed(seed)
        W, H = torch.randn(5, 12, generator=g, dtype=torch.float64), _spd(12, 14, seed=seed)
        Hinv = torch.linalg.inv(H)
        L_hcc = torch.linalg.cholesky(torch.stack([Hinv[h:h + 3, h:h + 3] for h in range(0, 12, 3)]))
        score_h = (W.view(5, 4, 3) ** 2 / L_hcc.diagonal(dim1=-2, dim2=-1) ** 2).sum((0, 2))
        if score_h.argmin() != (W ** 2 / Hinv.diag()).sum(0).view(4, 3).sum(1).argmin():
            break
    else:
        raise AssertionError("no case separating the grouped Cholesky from diag(H⁻¹)")
    cols, Wc = struct_prune(W, H, 2, headsize=3, percdamp=0.0)
    first = int(score_h.argmin())
    assert len(cols) == 6 and set(range(3 * first, 3 * first + 3)) <= set(cols.tolist())
    assert all(c % 3 == 0 for c in cols[::3].tolist()) and torch.all(Wc[:, cols] == 0)
    assert torch.allclose(Wc, _ls_optimum(W, H, cols)[0], atol=1e-10)
    cols_nc, W_nc = struct_prune(W, H, 2, headsize=3, percdamp=0.0, compensate=False)
    keep = [p for p in range(12) if p not in cols_nc.tolist()]
    assert torch.equal(W_nc[:, keep], W[:, keep])                  # no update, only the removal


def test_dead_inputs_and_damping():
    W, H = torch.ones(2, 4, dtype=torch.float64), _spd(4)
    H[1, :] = H[:, 1] = 0
    cols, Wc = struct_prune(W, H, 1)
    assert cols.tolist() == [1] and torch.isfinite(Wc).all()
    with pytest.raises(ValueError, match="positive definite"):
        struct_prune(W, torch.ones(4, 4, dtype=torch.float64), 1, percdamp=0.0)


def test_dead_inputs_and_damping_are_prepared_as_official():
    """Dead inputs get H_pp = 1 and W_:,p = 0 *before* the damping λ = percdamp·mean(diag H) is taken,
    so struct_prune equals an undamped run on the Hessian prepared by hand."""
    g = torch.Generator().manual_seed(4)
    W, H = torch.randn(3, 8, generator=g, dtype=torch.float64), 7.0 * _spd(8, seed=4)
    H[2, :] = H[:, 2] = 0
    H[5, :] = H[:, 5] = 0
    ready_W, ready_H = W.clone(), H.clone()
    ready_W[:, [2, 5]] = 0
    ready_H[[2, 5], [2, 5]] = 1
    ready_H += 0.05 * ready_H.diag().mean() * torch.eye(8, dtype=torch.float64)
    for n, headsize in ((3, 1), (2, 2)):
        cols, Wc = struct_prune(W, H, n, headsize, percdamp=0.05)
        ref_cols, ref_W = struct_prune(ready_W, ready_H, n, headsize, percdamp=0.0)
        assert cols.tolist() == ref_cols.tolist() and torch.allclose(Wc, ref_W, rtol=0, atol=1e-12)
    # the comparison can tell: damping the prepared Hessian a second time changes the compensation
    assert not torch.allclose(struct_prune(W, H, 3, percdamp=0.05)[1], struct_prune(ready_W, ready_H, 3, percdamp=0.05)[1])


def test_struct_prune_refuses_shapes_that_do_not_fit():
    W, H = torch.ones(4, 10), torch.eye(10)
    with pytest.raises(ValueError, match=r"^W \(4, 10\), H \(10, 10\) and headsize 3 do not fit$"):
        struct_prune(W, H, 1, headsize=3)
    with pytest.raises(ValueError, match=r"^W \(4, 10\), H \(10, 9\) and headsize 1 do not fit$"):
        struct_prune(W, torch.eye(10)[:, :9], 1)
    with pytest.raises(ValueError, match=r"^the Hessian is not positive definite: more calibration data or a "
                                         r"larger percdamp is needed$"):
        struct_prune(W, -H, 1, percdamp=0.0)


def _greedy_heads(W, H, n, c):
    """SlimGPT's head loop written out: score every remaining head by Σ W² / (diag of the Cholesky factor
    of its c×c block of H⁻¹)², remove the lowest, compensate all the removed columns jointly (the
    least-squares optimum), remove the head from H; repeat."""
    W, H, gone = W.clone(), H.clone(), []
    for _ in range(n):
        Hinv = torch.linalg.inv(H)
        score = [float("inf") if h in gone else
                 float((W[:, h * c:(h + 1) * c] ** 2 / torch.linalg.cholesky(Hinv[h * c:(h + 1) * c, h * c:(h + 1) * c])
                        .diagonal() ** 2).sum()) for h in range(W.shape[1] // c)]
        gone.append(min(range(len(score)), key=score.__getitem__))
        cols = torch.tensor([h * c + j for h in sorted(gone) for j in range(c)])
        W = _ls_optimum(W, H, cols)[0]
        H[cols, :] = 0
        H[:, cols] = 0
        H[cols, cols] = 1
    return sorted(gone), W


@pytest.mark.parametrize("c", [2, 3])
def test_heads_follow_the_greedy_grouped_cholesky_loop(c):
    """Three heads of five, on twelve seeds: the heads and weights of the loop written out by hand."""
    for seed in range(12):
        g = torch.Generator().manual_seed(seed)
        W, H = torch.randn(4, 5 * c, generator=g, dtype=torch.float64), _spd(5 * c, 5 * c + 2, seed=seed)
        cols, Wc = struct_prune(W, H, 3, headsize=c, percdamp=0.0)
        heads, ref_W = _greedy_heads(W, H, 3, c)
        assert cols.tolist() == [h * c + j for h in heads for j in range(c)], seed
        assert torch.allclose(Wc, ref_W, atol=1e-9), seed


def test_counts_and_dynamic_group_sizes():
    assert n_pruned(16, 0.4) == 6 and n_pruned(4096, 0.4) == 1638 and n_pruned(4096, 0.2) == 819
    assert n_pruned(5, 0.5) == 2 and n_pruned(7, 0.5) == 4          # Python round: half to even
    assert n_pruned(2, 0.9) == 1                                     # a block keeps one unit
    assert dgs_sizes(1638) == [563] + [64] * 16 + [51]               # VAR-d16 at 40% (EVAR-code)
    # larger targets: the 1024 cap, then b ← (b − 512)//2 from the uncapped b (1244 → 366; 1245 → 366)
    assert dgs_sizes(3000) == [1024, 366] + [64] * 25 + [10]
    assert dgs_sizes(3003) == [1024, 366] + [64] * 25 + [13]
    assert dgs_sizes(3840) == [1024, 576] + [64] * 35                # VAR-d30 at 50%: 7680 → 3840
    assert all(type(b) is int for b in dgs_sizes(3003)) and dgs_sizes(20) == [20]
    g = torch.Generator().manual_seed(2)
    trace = []
    cols, _ = struct_prune(torch.randn(4, 800, generator=g), _spd(800, 900).float(), 720, trace=trace)
    assert trace == dgs_sizes(720) == [104] + [64] * 9 + [40] and len(cols) == 720
    cols, _ = struct_prune(torch.randn(8, 16 * 64, generator=g), _spd(1024, 1100).float(), n_pruned(16, 0.4), 64)
    heads = sorted({c // 64 for c in cols.tolist()})
    assert len(heads) == 6 and cols.tolist() == [h * 64 + j for h in heads for j in range(64)]


@pytest.mark.parametrize("name", ["evar", "slimgpt"])
def test_counts_per_block_and_log_schedule(name):
    cfg = VARConfig(depth=2, width=128, num_heads=16, num_classes=5, vocab_size=64, Cvae=8, patch_nums=(1, 2, 3, 4, 8))
    gen = Generator(randomize_(VAR(cfg), 1), randomize_(VQVAE(SMALL_VAE), 2)).eval()
    out = METHODS.get(name)(sparsity=0.4, schedule="uniform", n_calib=16).apply(gen, _ctx(gen))
    assert out.var.cfg.heads == (10, 10) and out.var.cfg.ffn_hidden == (512 - 205,) * 2   # 16 − 6, 512 − 205
    gen = Generator(randomize_(VAR(SMALL_VAR), 1), randomize_(VQVAE(SMALL_VAE), 2)).eval()
    s = block_sparsities(2, 0.4, "log")
    assert s[0] == 0 and s[1] == pytest.approx(0.8)
    out = METHODS.get(name)(sparsity=0.4, schedule="log", n_calib=16).apply(gen, _ctx(gen))
    assert out.var.cfg.heads == (2, 1) and out.var.cfg.ffn_hidden == (512, 512 - 410)


# ------------------------------------------------------------------------------------------ Hessians
PNS = (1, 2, 3, 4, 5, 6, 8)
BEGIN_ENDS = [(sum(p * p for p in PNS[:i]), sum(p * p for p in PNS[:i + 1])) for i in range(len(PNS))]


def _accumulate(weights, xs):
    acc = Hessian(xs[0].shape[-1], BEGIN_ENDS, weights)
    for x in xs:
        acc.add(x)
    return acc.H


def _xs(seed=0, n=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(4, BEGIN_ENDS[-1][1], 6, generator=g) for _ in range(n)]


def test_pyramid_hessian_is_the_papers_formula_and_concat_its_special_case():
    xs = _xs()
    w = decay_weights(len(PNS), "linear")
    x_NLD = torch.cat(xs).double()
    ref = sum(w[i] / (len(x_NLD) * (e - b)) * x_NLD[:, b:e].flatten(0, 1).T @ x_NLD[:, b:e].flatten(0, 1)
              for i, (b, e) in enumerate(BEGIN_ENDS))                 # Σ_i (w_i / N_i) X_iᵀX_i
    assert torch.allclose(_accumulate(w, xs), ref, rtol=1e-5)
    flat = x_NLD.flatten(0, 1)
    H_cat = _accumulate(None, xs)
    assert torch.allclose(H_cat, 2 * flat.T @ flat / len(flat), rtol=1e-5)
    H_prop = _accumulate([3.0 * p * p for p in PNS], xs)                # w_i ∝ n_i: concat up to a factor
    assert torch.allclose(H_prop, H_cat * 1.5 * BEGIN_ENDS[-1][1], rtol=1e-5)
    assert not torch.allclose(_accumulate(w, xs) / ref[0, 0], H_cat / H_cat[0, 0], rtol=1e-2)


def test_single_scale_modes_use_only_their_scale():
    assert decay_weights(10, "linear") == pytest.approx([2.0, 1.8, 1.6, 1.4, 1.2, 1.0, 0.8, 0.6, 0.4, 0.2])
    assert decay_weights(4, "exp") == pytest.approx([2.0, 2 * 0.1 ** (1 / 3), 2 * 0.1 ** (2 / 3), 0.2])
    assert decay_weights(3, "none") == [1.0] * 3 and scale_weights("concat", 7) is None
    xs = _xs()
    Hs = {}
    for mode, k in (("first", 0), ("fifth", 4), ("last", 6)):
        w = scale_weights(mode, len(PNS))
        assert [i for i, wi in enumerate(w) if wi] == [k]
        b, e = BEGIN_ENDS[k]
        other = [x.clone() for x in xs]
        for x in other:            # everything outside scale k replaced: nothing changes
            x[:, :b] = torch.randn_like(x[:, :b])
            x[:, e:] = 7.0
        Hs[mode] = _accumulate(w, xs)
        assert torch.equal(_accumulate(w, other), Hs[mode])
        flat = torch.cat(xs)[:, b:e].flatten(0, 1).double()
        assert torch.allclose(Hs[mode], flat.T @ flat / len(flat), rtol=1e-5)
    assert not torch.allclose(Hs["first"], Hs["fifth"]) and not torch.allclose(Hs["fifth"], Hs["last"])
    with pytest.raises(ValueError, match="5 scales"):
        scale_weights("fifth", 4)


def test_weight_and_hessian_refusals_and_edge_cases():
    assert decay_weights(1, "linear") == decay_weights(1, "exp") == [2.0] and decay_weights(1, "none") == [1.0]
    with pytest.raises(ValueError, match=r"^unknown decay 'cosine'; expected one of \('linear', 'exp', 'none'\)$"):
        decay_weights(4, "cosine")
    with pytest.raises(ValueError, match=r"^unknown calibration mode 'middle'; expected one of \('first', 'fifth', "
                                         r"'last', 'concat', 'pyramid'\)$"):
        scale_weights("middle", 10)
    assert scale_weights("fifth", 5) == [0.0, 0.0, 0.0, 0.0, 1.0] and scale_weights("last", 3) == [0.0, 0.0, 1.0]
    with pytest.raises(ValueError, match=r"^calib=fifth needs at least 5 scales, the model has 4$"):
        scale_weights("fifth", 4)
    for bad in ([1.0, 2.0], [1.0] * 6 + [-0.1]):
        with pytest.raises(ValueError, match=r"^need 7 non-negative scale weights, got \[1\.0, "):
            Hessian(6, BEGIN_ENDS, bad)
    acc = Hessian(6, BEGIN_ENDS, [0.0] * 7)              # zero weights are allowed (a single-scale mode)
    with pytest.raises(ValueError, match=r"^no calibration data was added$"):
        _ = acc.H
    with pytest.raises(ValueError, match=rf"^inputs have 5 positions, the pyramid has {BEGIN_ENDS[-1][1]}$"):
        acc.add(torch.zeros(1, 5, 6))
    x = _xs(n=1)[0][:1].double()                           # one image is enough
    one = Hessian(6, BEGIN_ENDS)
    one.add(x)
    assert torch.allclose(one.H, 2 * x[0].T @ x[0] / BEGIN_ENDS[-1][1], rtol=1e-5)


def test_stream_reproduces_teacher_forcing_and_block_inputs(small_gen):
    labels, tokens = _data(small_gen, 6)
    x, cond = block0_inputs(small_gen, labels, tokens)
    with torch.no_grad():
        var = small_gen.var
        out = var.get_logits(var.run_blocks(x, cond, var.attn_bias_for_masking), cond)
    assert torch.allclose(out, small_gen.forward_teacher(labels, tokens), atol=1e-6)
    seen = {}
    h = small_gen.var.blocks[1].ffn.fc2.register_forward_pre_hook(lambda m, i: seen.update(x=i[0]))
    with torch.no_grad():
        small_gen.forward_teacher(labels, tokens)
    h.remove()
    w = decay_weights(len(small_gen.patch_nums))
    ref = Hessian(512, small_gen.var.begin_ends, w)
    ref.add(seen["x"])
    small_gen.var.train()          # the stream calibrates in eval mode and restores the mode
    H = Stream(small_gen, labels, tokens, batch=4).collect(1, {"fc2": small_gen.var.blocks[1].ffn.fc2}, w)["fc2"]
    assert torch.allclose(H, ref.H, rtol=0, atol=1e-5 * float(ref.H.abs().max())) and small_gen.var.training


def test_stream_calibrates_in_eval_mode_and_stops_after_the_last_wanted_input():
    """Drop path (block 1's attention branch here) would make a training-mode Hessian random: the stream
    switches to eval mode and back. With ``stop``, the rest of the block after the wanted input never
    runs; no hook is left on the layers."""
    cfg = dataclasses.replace(SMALL_VAR, drop_path_rate=0.5)
    gen = Generator(randomize_(VAR(cfg), 1), randomize_(VQVAE(SMALL_VAE), 2)).train()
    labels, tokens = _data(gen, 6)
    b1 = gen.var.blocks[1]
    fc2 = {"fc2": b1.ffn.fc2}
    H_train = Stream(gen, labels, tokens, batch=4).collect(1, fc2)["fc2"]
    assert gen.var.training
    H_eval = Stream(gen.eval(), labels, tokens, batch=4).collect(1, fc2)["fc2"]
    assert torch.equal(H_train, H_eval)
    runs = []
    h = b1.ffn.fc2.register_forward_pre_hook(lambda m, i: runs.append(1))
    Stream(gen, labels, tokens, batch=4).collect(1, {"proj": b1.attn.proj}, stop="proj")
    assert runs == [] and not b1.attn.proj._forward_pre_hooks
    Stream(gen, labels, tokens, batch=4).collect(1, {"proj": b1.attn.proj})
    h.remove()
    assert runs == [1, 1] and not b1.attn.proj._forward_pre_hooks and not b1.ffn.fc2._forward_pre_hooks


# ------------------------------------------------------------------------------------------- methods
def _captured(gen, n=16):
    """Inputs of block 0's proj and fc2 on the calibration data, flattened [N, D]."""
    labels, tokens = _data(gen, n)
    b, seen = gen.var.blocks[0], {}
    hs = [m.register_forward_pre_hook(lambda m, i, k=k: seen.update({k: i[0].flatten(0, 1).double()}))
          for k, m in (("proj", b.attn.proj), ("fc2", b.ffn.fc2))]
    with torch.no_grad():
        gen.eval().forward_teacher(labels, tokens)
    for h in hs:
        h.remove()
    return labels, tokens, seen


@pytest.mark.parametrize("layer,headsize", [("proj", 64), ("fc2", 1)])
def test_compensation_lowers_the_output_error(small_gen, layer, headsize):
    labels, tokens, X = _captured(small_gen)
    lin = small_gen.var.blocks[0].attn.proj if layer == "proj" else small_gen.var.blocks[0].ffn.fc2
    H = Stream(small_gen, labels, tokens, batch=8).collect(0, {layer: lin})[layer]
    W = lin.weight.detach().double()
    n = 1 if headsize > 1 else 200
    err = {}
    for comp in (True, False):
        _, Wc = struct_prune(W, H, n, headsize, compensate=comp)
        err[comp] = float(((W - Wc) @ X[layer].T).norm())
    assert err[True] < 0.9 * err[False]


def test_evar_writes_the_compensated_weights(small_gen):
    """Block 0 sees the dense inputs: with compensation its pruned proj and fc2 reproduce the dense
    outputs on the calibration data better than the same layers merely cut."""
    _, _, X = _captured(small_gen)
    b0 = small_gen.var.blocks[0]
    dense = {k: X[k] @ lin.weight.detach().double().T for k, lin in (("proj", b0.attn.proj), ("fc2", b0.ffn.fc2))}
    err = {}
    for comp in (True, False):
        m = METHODS.get("evar")(n_calib=16, compensate=comp)
        b = m.apply(copy.deepcopy(small_gen), _ctx(small_gen)).var.blocks[0]
        heads, channels = m.pruned[0]
        keep_h = [h for h in range(2) if h not in heads.tolist()]
        dims = [h * 64 + j for h in keep_h for j in range(64)]
        keep_c = [c for c in range(512) if c not in channels.tolist()]
        err[comp] = (float((X["proj"][:, dims] @ b.attn.proj.weight.detach().double().T - dense["proj"]).norm()),
                     float((X["fc2"][:, keep_c] @ b.ffn.fc2.weight.detach().double().T - dense["fc2"]).norm()))
    assert err[True][0] < 0.9 * err[False][0] and err[True][1] < 0.9 * err[False][1]


@pytest.mark.parametrize("name", ["evar", "slimgpt"])
def test_without_compensation_equals_zeroing_the_units(small_gen, name):
    dense, orig = copy.deepcopy(small_gen), copy.deepcopy(small_gen)
    m = METHODS.get(name)(sparsity=0.5, compensate=False, n_calib=16)
    pruned = m.apply(small_gen, _ctx(small_gen))
    assert sum(len(h) for h, _ in m.pruned.values()) >= 1 and all(len(c) for _, c in m.pruned.values())
    with torch.no_grad():
        for i, (heads, channels) in m.pruned.items():
            b = dense.var.blocks[i]
            for h in heads.tolist():
                b.attn.proj.weight[:, h * b.attn.c:(h + 1) * b.attn.c] = 0
            b.ffn.fc2.weight[:, channels] = 0
    assert torch.allclose(_logits(pruned), _logits(dense), atol=1e-5)
    comp = METHODS.get(name)(sparsity=0.5, n_calib=16).apply(orig, _ctx(orig))
    assert not torch.allclose(comp.var.blocks[-1].ffn.fc2.weight, pruned.var.blocks[-1].ffn.fc2.weight)


def test_slimgpt_recollects_fc2_after_pruning_heads_evar_does_not(small_gen, monkeypatch):
    heads_seen = []
    collect = Stream.collect

    def spy(self, i, layers, *a, **k):
        if "fc2" in layers:
            heads_seen.append(self.gen.var.blocks[i].attn.H)
        return collect(self, i, layers, *a, **k)

    monkeypatch.setattr(Stream, "collect", spy)
    METHODS.get("evar")(n_calib=8).apply(copy.deepcopy(small_gen), _ctx(small_gen))
    METHODS.get("slimgpt")(n_calib=8, schedule="uniform").apply(small_gen, _ctx(small_gen))
    assert heads_seen == [2, 2, 1, 1]


@pytest.mark.parametrize("spec", [dict(name="evar"), dict(name="evar", calib="concat", decay="exp"),
                                  dict(name="slimgpt")])
def test_pruned_model_saves_and_loads_strict(small_gen, spec):
    spec = dict(spec)
    pruned = METHODS.get(spec.pop("name"))(n_calib=16, **spec).apply(small_gen, _ctx(small_gen))
    sd = pruned.var.state_dict()
    fresh = VAR(sizes_in(sd, SMALL_VAR))
    fresh.load_state_dict(sd, strict=True)
    assert torch.equal(_logits(Generator(fresh, pruned.vae)), _logits(pruned))


@pytest.mark.parametrize("name,note", [
    ("evar", "evar: calibrated on 8 images (calib=pyramid, decay=linear, compensate=True)"),
    ("slimgpt", "slimgpt: calibrated on 8 images, per-block sparsity 0.000,0.800")])
def test_calibration_split_skipped_blocks_and_notes(small_gen, name, note):
    """The calibration images come from the ``calib`` split; a block at sparsity 0 (the log schedule's
    first) is neither calibrated nor listed as pruned; the note says what was done."""
    asked = []
    ctx = Context(progress=False, data=lambda n, split: (asked.append((n, split)), _data(small_gen, n))[1])
    m = METHODS.get(name)(sparsity=0.4, schedule="log", n_calib=8)
    m.apply(small_gen, ctx)
    assert asked == [(8, "calib")] and list(m.pruned) == [1] and ctx.notes == [note]


def test_a_block_with_no_unit_to_remove_is_left_as_it_is(small_gen):
    """round(2·0.2) = 0 heads and round(512·0.0009) = 0 channels: nothing removed, nothing returned."""
    b = small_gen.var.blocks[0]
    before = copy.deepcopy(b.state_dict())
    gone_h = prune_heads(b, torch.eye(128, dtype=torch.float64), 0.2)
    gone_c = prune_channels(b, torch.eye(512, dtype=torch.float64), 0.0009)
    assert gone_h.tolist() == [] and gone_c.tolist() == [] and gone_h.dtype == gone_c.dtype == torch.long
    after = b.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    # one unit: round(512·0.002) = 1 channel, round(2·0.5) = 1 head
    assert len(prune_channels(b, torch.eye(512, dtype=torch.float64), 0.002)) == 1 and b.ffn.fc2.in_features == 511
    assert len(prune_heads(b, torch.eye(128, dtype=torch.float64), 0.5)) == 1 and b.attn.H == 1
