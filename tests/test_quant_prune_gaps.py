"""Gaps left by the mutation run: the quantiser's training pass, the φ sharing modes, pruning a
subset of layers / a float64 model, and the exact magnitude scores."""
import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bench.method import build_method
from bench.models.var import VAR
from bench.models.vqvae import VQVAE, MultiScaleQuantizer, VQVAEConfig, phi_index_map
from bench.prune import n_keep, prune_by_scores
from tests.conftest import SMALL_VAE, SMALL_VAR, randomize_


# ---------------------------------------------------------------- official φ selection (VAR models/quant.py)
def official_phi_index(n_phi: int, n_scales: int):
    """``PhiPartiallyShared`` / ``PhiNonShared``: float64 numpy argmin of |ticks − si/(SN−1)|."""
    K = n_phi
    ticks = np.linspace(1 / 3 / K, 1 - 1 / 3 / K, K) if K == 4 else np.linspace(1 / 2 / K, 1 - 1 / 2 / K, K)
    return tuple(int(np.argmin(np.abs(ticks - si / (n_scales - 1))).item()) for si in range(n_scales))


def _quantizer(seed: int = 3):
    return randomize_(MultiScaleQuantizer(SMALL_VAE), seed).train()


def _latent(seed: int = 4, B: int = 2):
    g = torch.Generator().manual_seed(seed)
    pn = SMALL_VAE.patch_nums[-1]
    return torch.randn(B, SMALL_VAE.z_channels, pn, pn, generator=g) * 0.1


def _reference_forward(q, f):
    """The official ``VectorQuantizer2.forward`` (using_znorm=False), written out independently."""
    B, C, H, W = f.shape
    SN = len(q.patch_nums)
    phis = q.quant_resi.qresi_ls
    phi_of = official_phi_index(len(phis), SN)
    E = q.embedding.weight
    f_no_grad = f.detach()
    f_rest, f_hat = f_no_grad.clone(), torch.zeros_like(f_no_grad)
    loss, hits = 0.0, torch.zeros(q.vocab_size)
    for si, pn in enumerate(q.patch_nums):
        z = F.interpolate(f_rest, size=(pn, pn), mode="area") if si != SN - 1 else f_rest
        z_NC = z.permute(0, 2, 3, 1).reshape(-1, C).double()
        idx = (z_NC[:, None, :] - E.detach().double()[None]).square().sum(-1).argmin(1)
        hits += torch.bincount(idx, minlength=q.vocab_size).float()
        h = E[idx].view(B, pn, pn, C).permute(0, 3, 1, 2)
        if si != SN - 1:
            h = F.interpolate(h, size=(H, W), mode="bicubic")
        h = phis[phi_of[si]](h)
        f_hat = f_hat + h
        f_rest = f_rest - h.detach()
        loss = loss + F.mse_loss(f_hat.detach(), f) * q.beta + F.mse_loss(f_hat, f_no_grad)
    return (f_hat.detach() - f_no_grad) + f, loss / SN, hits


def _grads(q, f):
    return [f.grad.clone()] + [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in q.parameters()]


# ---------------------------------------------------------------- 1. MultiScaleQuantizer.forward
def test_training_forward_value_equals_the_no_grad_reconstruction_and_reference():
    q, f = _quantizer(), _latent()
    f_hat, loss, hits = q(f)
    with torch.no_grad():
        fhats = q.f_to_idx(f, to_fhat=True)
        idx = q.f_to_idx(f)
        ref_fhat, ref_loss, ref_hits = _reference_forward(q, f)
    assert f_hat.shape == f.shape and f_hat.dtype == torch.float32
    assert torch.allclose(f_hat, fhats[-1], atol=1e-6)
    assert torch.allclose(f_hat, ref_fhat, atol=1e-6)
    # the forward's tokens are the tokeniser's, which are the official area-downsampled nearest codes
    assert torch.equal(hits, torch.bincount(torch.cat([t.flatten() for t in idx]), minlength=q.vocab_size).float())
    assert torch.equal(hits, ref_hits)
    B = f.shape[0]
    assert int(hits.sum()) == B * sum(pn * pn for pn in SMALL_VAE.patch_nums)
    assert loss.ndim == 0 and torch.allclose(loss, ref_loss, rtol=1e-5, atol=1e-9)


def test_training_loss_is_beta_plus_one_times_mean_over_scales_mse():
    q, f = _quantizer(), _latent(5)
    _, loss, _ = q(f)
    with torch.no_grad():
        fhats = q.f_to_idx(f, to_fhat=True)
    mses = torch.stack([F.mse_loss(fh, f) for fh in fhats])
    assert q.beta == 0.25
    expected = (q.beta + 1) * mses.mean()   # official: summed over scales, then × 1/SN
    assert torch.allclose(loss, expected, rtol=1e-5, atol=1e-9)
    assert not torch.allclose(loss, expected * len(fhats), rtol=1e-3)   # not the sum


def test_training_loss_gradients_follow_the_detach_pattern():
    """β·mse(f_hat.detach(), f) reaches only the encoder side; mse(f_hat, f.detach()) only the codebook/φ."""
    q, f0 = _quantizer(), _latent(6)
    f = f0.clone().requires_grad_(True)
    _, loss, _ = q(f)
    loss.backward()
    got = _grads(q, f)
    q.zero_grad(set_to_none=True)
    f_ref = f0.clone().requires_grad_(True)
    _, ref_loss, _ = _reference_forward(q, f_ref)
    ref_loss.backward()
    want = _grads(q, f_ref)
    for g, w in zip(got, want):
        assert torch.allclose(g, w, rtol=1e-4, atol=1e-9)
    # closed form of the input gradient: d/df Σ_k β·mean((f − f̂_k)²)/SN
    with torch.no_grad():
        fhats = q.f_to_idx(f0, to_fhat=True)
    n = f0.numel()
    closed = sum(q.beta * 2 * (f0 - fh) / n for fh in fhats) / len(fhats)
    assert torch.allclose(got[0], closed, rtol=1e-4, atol=1e-10)
    assert q.embedding.weight.grad.abs().sum() > 0


def test_straight_through_gradient_is_the_identity():
    q, f0 = _quantizer(), _latent(7)
    f = f0.clone().requires_grad_(True)
    f_hat, _, _ = q(f)
    g = torch.randn_like(f0)
    f_hat.backward(g)
    assert torch.equal(f.grad, g)
    for name, p in q.named_parameters():   # nothing flows into the codebook or φ through f_hat
        assert p.grad is None or p.grad.abs().sum() == 0, name


def test_downsampling_of_the_residual_is_area():
    q, f = _quantizer(), _latent(8)
    with torch.no_grad():
        idx = q.f_to_idx(f)
        E = q.embedding.weight
        C = f.shape[1]
        # scale 0: residual = f itself; scale 1: f − (f̂ after scale 0); both area-downsampled
        fhat0 = q.f_to_idx(f, to_fhat=True)[0]
        for si, rest in ((0, f), (1, f - fhat0)):
            pn = SMALL_VAE.patch_nums[si]
            z = F.interpolate(rest, size=(pn, pn), mode="area").permute(0, 2, 3, 1).reshape(-1, C)
            want = torch.cdist(z.double(), E.double()).argmin(1).view(f.shape[0], -1)
            assert torch.equal(idx[si], want)
        # area of a 1×1 target is the plain mean
        assert torch.allclose(F.interpolate(f, size=(1, 1), mode="area"), f.mean((2, 3), keepdim=True))
        _, _, hits = q.train()(f)
        z0 = f.mean((2, 3))
        first = torch.cdist(z0.double(), E.double()).argmin(1)
        assert (hits[first] >= 1).all()


# ---------------------------------------------------------------- 2. φ sharing modes
@pytest.mark.parametrize("n_phi,n_scales", [(4, 10), (4, 5), (4, 7), (4, 11), (4, 15), (2, 10), (3, 10), (3, 7),
                                            (3, 11), (5, 10), (6, 5), (6, 7), (6, 10), (10, 10), (5, 5)])
def test_phi_index_map_is_the_official_rule(n_phi, n_scales):
    assert phi_index_map(n_phi, n_scales) == official_phi_index(n_phi, n_scales)


def test_phi_index_map_uses_half_step_ticks_when_not_four():
    # K ≠ 4 uses linspace(1/2/K, 1−1/2/K): e.g. 3 φ over 10 scales gives scale 3 to φ0 (1/3/K would give φ1)
    assert phi_index_map(3, 10) == (0, 0, 0, 0, 1, 1, 1, 2, 2, 2)
    assert phi_index_map(6, 5) == (0, 1, 2, 4, 5)


def _vae(share: int, patch_nums=SMALL_VAE.patch_nums):
    cfg = VQVAEConfig(**{**SMALL_VAE.to_dict(), "share_quant_resi": share, "patch_nums": tuple(patch_nums)})
    return VQVAE(cfg)


@pytest.mark.parametrize("ratio", [0.0, 1e-6, -1e-6])
def test_phi_with_a_negligible_ratio_is_the_identity_without_weights(ratio):
    # official: Phi(...) if abs(quant_resi) > 1e-6 else nn.Identity()
    cfg = VQVAEConfig(**{**SMALL_VAE.to_dict(), "quant_resi": ratio})
    vae = VQVAE(cfg)
    assert not [k for k in vae.state_dict() if k.startswith("quantize.quant_resi.")]
    assert all(isinstance(m, torch.nn.Identity) for m in vae.quantize.quant_resi.qresi_ls)


def test_latent_size_mismatch_names_the_last_scale():
    q = _quantizer()
    with pytest.raises(AssertionError, match=r"latent 4x4 does not match the last scale 8$"):
        q.f_to_idx(torch.zeros(1, SMALL_VAE.z_channels, 4, 4))


def test_fully_shared_phi():
    vae = _vae(1)
    qr = vae.quantize.quant_resi
    assert all(qr[si] is qr.qresi for si in range(len(SMALL_VAE.patch_nums)))
    keys = {k for k in vae.state_dict() if k.startswith("quantize.quant_resi.")}
    assert keys == {"quantize.quant_resi.qresi.weight", "quantize.quant_resi.qresi.bias"}


@pytest.mark.parametrize("share,patch_nums", [(2, (1, 2, 3, 4, 5, 6, 8, 10, 13, 16)), (3, (1, 2, 3, 4, 5, 6, 8, 10, 13, 16)),
                                              (4, (1, 2, 3, 4, 8))])
def test_partially_shared_phi(share, patch_nums):
    vae = _vae(share, patch_nums)
    qr = vae.quantize.quant_resi
    want = official_phi_index(share, len(patch_nums))
    assert len(qr.qresi_ls) == share
    assert all(qr[si] is qr.qresi_ls[want[si]] for si in range(len(patch_nums)))
    keys = {k for k in vae.state_dict() if k.startswith("quantize.quant_resi.")}
    assert keys == {f"quantize.quant_resi.qresi_ls.{k}.{p}" for k in range(share) for p in ("weight", "bias")}


@pytest.mark.parametrize("patch_nums", [(1, 2, 3, 4, 8), (1, 2, 3, 8), (1, 2, 3, 4, 5, 6, 8, 10, 13, 16)])
def test_non_shared_phi_one_per_scale(patch_nums):
    vae = _vae(0, patch_nums)
    qr = vae.quantize.quant_resi
    phis = [qr._modules[str(k)] for k in range(len(patch_nums))]   # official PhiNonShared: a ModuleList
    want = official_phi_index(len(patch_nums), len(patch_nums))
    assert len(phis) == len(patch_nums) and len({id(p) for p in phis}) == len(patch_nums)
    assert all(qr[si] is phis[want[si]] for si in range(len(patch_nums)))


def test_non_shared_phi_key_layout_is_official():
    """Official PhiNonShared is itself an nn.ModuleList: share_quant_resi=0 keys are quantize.quant_resi.{k}.*."""
    vae = _vae(0)
    keys = {k for k in vae.state_dict() if k.startswith("quantize.quant_resi.")}
    n = len(SMALL_VAE.patch_nums)
    assert keys == {f"quantize.quant_resi.{k}.{p}" for k in range(n) for p in ("weight", "bias")}


# ---------------------------------------------------------------- 3. prune.py
@pytest.fixture
def small_var_gen():
    """Only the transformer (all that scoring and pruning touch), to keep these tests fast."""
    torch.manual_seed(0)
    return SimpleNamespace(var=randomize_(VAR(SMALL_VAR), 1).eval())


def _masked_copy(gen, block, heads_kept, channels_kept):
    """Hand-pruned reference: the removed heads' proj columns and channels' fc2 columns set to 0."""
    ref = copy.deepcopy(gen)
    b = ref.var.blocks[block]
    c, H = b.attn.c, b.attn.H
    F_ = b.ffn.fc2.in_features
    with torch.no_grad():
        for h in set(range(H)) - set(heads_kept):
            b.attn.proj.weight[:, h * c:(h + 1) * c] = 0
        drop = sorted(set(range(F_)) - set(channels_kept))
        b.ffn.fc2.weight[:, drop] = 0
    return ref


def _scores(gen, seed=0):
    g = torch.Generator().manual_seed(seed)
    hs = {i: torch.randperm(b.attn.H, generator=g).float() for i, b in enumerate(gen.var.blocks)}
    cs = {i: torch.randperm(b.ffn.fc1.out_features, generator=g).float() for i, b in enumerate(gen.var.blocks)}
    return hs, cs


def test_prune_only_the_listed_layers(small_var_gen):
    hs, cs = _scores(small_var_gen)
    H, Fh = small_var_gen.var.blocks[0].attn.H, small_var_gen.var.blocks[0].ffn.fc1.out_features
    before1 = {k: v.clone() for k, v in small_var_gen.var.blocks[1].state_dict().items()}
    pruned = prune_by_scores(small_var_gen, hs, cs, 0.5, layers=[0])
    b0, b1 = pruned.var.blocks
    assert b0.attn.H == n_keep(H, 0.5) and b0.ffn.fc1.out_features == n_keep(Fh, 0.5)
    assert b1.attn.H == H and b1.ffn.fc1.out_features == Fh
    after1 = b1.state_dict()
    assert before1.keys() == after1.keys() and all(torch.equal(before1[k], after1[k]) for k in before1)
    assert pruned.var.cfg.heads == (n_keep(H, 0.5), H)
    assert pruned.var.cfg.ffn_hidden == (n_keep(Fh, 0.5), Fh)


def test_prune_only_the_listed_layers_needs_only_their_scores(small_var_gen):
    hs, cs = _scores(small_var_gen)
    pruned = prune_by_scores(small_var_gen, {1: hs[1]}, {1: cs[1]}, 0.5, layers=[1])
    assert [b.attn.H for b in pruned.var.blocks] == [2, 1]


def test_pruning_a_double_model_keeps_float64_and_equals_the_hand_pruned_block(small_var_gen):
    small_var_gen.var.double()
    hs, cs = _scores(small_var_gen, 1)
    kept_h = {i: hs[i].topk(n_keep(len(hs[i]), 0.5)).indices.tolist() for i in hs}
    kept_c = {i: cs[i].topk(n_keep(len(cs[i]), 0.5)).indices.tolist() for i in cs}
    refs = [_masked_copy(small_var_gen, i, kept_h[i], kept_c[i]).var.blocks[i] for i in range(len(small_var_gen.var.blocks))]
    pruned = prune_by_scores(small_var_gen, hs, cs, 0.5)
    for b in pruned.var.blocks:
        for name, t in list(b.named_parameters()) + list(b.named_buffers()):
            assert t.dtype == torch.float64, name
    g = torch.Generator().manual_seed(0)
    C = small_var_gen.var.cfg.width
    x = torch.randn(2, 7, C, generator=g, dtype=torch.float64)
    cond = torch.randn(2, C, generator=g, dtype=torch.float64)
    with torch.no_grad():
        for b, ref in zip(pruned.var.blocks, refs):
            assert torch.allclose(b(x, cond, None), ref(x, cond, None), atol=1e-10)


# ---------------------------------------------------------------- 4. magnitude scores
def _set_block_weights(gen, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for b in gen.var.blocks:
            for lin in (b.attn.mat_qkv, b.attn.proj, b.ffn.fc1, b.ffn.fc2):
                lin.weight.copy_(torch.randint(-3, 4, lin.weight.shape, generator=g).float())


def _hand_scores(gen, p, scope):
    heads, channels = {}, {}
    agg = (lambda w: w.abs().sum().item()) if p == 1 else (lambda w: w.square().sum().item())
    for i, b in enumerate(gen.var.blocks):
        H, c = b.attn.H, b.attn.c
        Wq, Wp = b.attn.mat_qkv.weight, b.attn.proj.weight
        hs = []
        for h in range(H):
            s = agg(Wp[:, h * c:(h + 1) * c])
            if scope == "coupled":
                s += sum(agg(Wq[t * H * c + h * c: t * H * c + (h + 1) * c]) for t in range(3))
            hs.append(s)
        W1, W2 = b.ffn.fc1.weight, b.ffn.fc2.weight
        cs = [agg(W2[:, j]) + (agg(W1[j]) if scope == "coupled" else 0.0) for j in range(W1.shape[0])]
        heads[i], channels[i] = torch.tensor(hs, dtype=torch.float64), torch.tensor(cs, dtype=torch.float64)
    return heads, channels


@pytest.mark.parametrize("norm,scope", [("l2", "coupled"), ("l1", "coupled"), ("l2", "out"), ("l1", "out")])
def test_magnitude_scores_equal_hand_computed(small_var_gen, norm, scope):
    _set_block_weights(small_var_gen)
    heads, channels = build_method(f"magnitude:norm={norm},scope={scope}").scores(small_var_gen)
    want_h, want_c = _hand_scores(small_var_gen, 1 if norm == "l1" else 2, scope)
    for i in want_h:
        assert torch.equal(heads[i].double(), want_h[i]), (i, heads[i], want_h[i])
        assert torch.equal(channels[i].double(), want_c[i])


def test_magnitude_l2_is_squared_sum_on_constant_weights(small_var_gen):
    with torch.no_grad():
        for b in small_var_gen.var.blocks:
            H, c = b.attn.H, b.attn.c
            C = b.attn.mat_qkv.in_features
            b.attn.mat_qkv.weight.copy_(torch.full_like(b.attn.mat_qkv.weight, 2.0))
            b.attn.mat_qkv.weight.view(3, H, c, C)[1, 1] = -3.0          # k rows of head 1
            b.attn.proj.weight.copy_(torch.full_like(b.attn.proj.weight, 1.0))
            b.ffn.fc1.weight.copy_(torch.full_like(b.ffn.fc1.weight, 2.0))
            b.ffn.fc2.weight.copy_(torch.full_like(b.ffn.fc2.weight, -1.0))
            b.ffn.fc2.weight[:, 0] = 3.0
    b = small_var_gen.var.blocks[0]
    H, c, C, Fh = b.attn.H, b.attn.c, b.attn.mat_qkv.in_features, b.ffn.fc1.out_features
    heads, channels = build_method("magnitude:norm=l2").scores(small_var_gen)
    # head 0: 3 slices of c×C entries 2² + proj c×C entries 1²; head 1: k slice is (−3)²
    assert heads[0].tolist() == [3 * c * C * 4 + C * c, 2 * c * C * 4 + c * C * 9 + C * c]
    assert channels[0][0].item() == C * 4 + C * 9 and channels[0][1].item() == C * 4 + C * 1
    heads1, channels1 = build_method("magnitude:norm=l1").scores(small_var_gen)
    assert heads1[0].tolist() == [3 * c * C * 2 + C * c, 2 * c * C * 2 + c * C * 3 + C * c]
    assert channels1[0][0].item() == C * 2 + C * 3 and channels1[0][1].item() == C * 2 + C * 1
    assert len(channels[0]) == Fh


def test_pruning_keeps_the_model_device():
    """The pruned layers are built on the model's device (the meta device stands in for a GPU)."""
    gen = SimpleNamespace(var=VAR(SMALL_VAR).to("meta"))
    hs = {i: torch.tensor([0.0, 1.0]) for i in range(len(gen.var.blocks))}
    cs = {i: torch.arange(float(b.ffn.fc1.out_features)) for i, b in enumerate(gen.var.blocks)}
    prune_by_scores(gen, hs, cs, 0.5)
    for b in gen.var.blocks:
        for name, t in list(b.named_parameters()) + list(b.named_buffers()):
            assert t.device.type == "meta", name
    assert gen.var.cfg.heads == (1, 1)


# ---------------------------------------------------------------- per-block sparsity schedules
def _log_reference(depth, s, cap=0.95):
    """Independent water-filling: s_j ∝ ln(1+j) with mean s, values above the cap clipped and the
    excess redistributed over the uncapped blocks in proportion to ln(1+j), until none exceeds it."""
    import math
    w = [math.log(1 + j) for j in range(depth)]
    capped = set()
    while True:
        left = s * depth - cap * len(capped)
        tot = sum(w[j] for j in range(depth) if j not in capped)
        out = [cap if j in capped else left * w[j] / tot for j in range(depth)]
        new = {j for j in range(depth) if out[j] > cap + 1e-12}
        if not new:
            return out
        capped |= new


@pytest.mark.parametrize("depth, s", [(2, 0.4), (4, 0.3), (16, 0.4), (16, 0.8), (24, 0.9), (3, 0.6)])
def test_log_schedule_is_the_capped_log_increasing_rule(depth, s):
    from bench.prune import block_sparsities
    got = block_sparsities(depth, s, "log")
    assert got == pytest.approx(_log_reference(depth, s), abs=1e-12)
    assert sum(got) / depth == pytest.approx(s) and max(got) <= 0.95 and got[0] == 0
    assert all(a <= b + 1e-15 for a, b in zip(got, got[1:]))       # non-decreasing with depth


def test_uniform_and_single_block_schedules_and_unknown_names():
    from bench.prune import block_sparsities
    assert block_sparsities(5, 0.3) == [0.3] * 5 == block_sparsities(5, 0.3, "uniform")
    assert block_sparsities(1, 0.4, "log") == [0.4]
    assert all(isinstance(x, float) for x in block_sparsities(3, 1, "uniform"))
    with pytest.raises(ValueError, match="unknown sparsity schedule 'cubic'.*'uniform', 'log'"):
        block_sparsities(4, 0.4, "cubic")


def test_log_schedule_with_a_cap_bound_block_redistributes_the_excess():
    from bench.prune import block_sparsities
    got = block_sparsities(4, 0.6, "log")        # ln-shape alone would put block 3 above 0.95
    assert got[3] == 0.95 and got[2] < 0.95 and sum(got) == pytest.approx(2.4)
    assert got[2] / got[1] == pytest.approx(__import__("math").log(3) / __import__("math").log(2))


def test_index_scores_prefer_the_first_units(small_var_gen):
    from bench.prune import index_scores
    heads, channels = index_scores(small_var_gen)
    for i, b in enumerate(small_var_gen.var.blocks):
        assert heads[i].tolist() == [-float(h) for h in range(b.attn.H)]
        assert channels[i].shape == (b.ffn.fc1.out_features,) and channels[i][0] == 0 and channels[i][-1] < channels[i][-2]


def test_log_schedule_when_every_deeper_block_hits_the_cap():
    """Block 0 has ln(1) = 0 weight: once all others are capped there is nothing left to fill, and
    block 0 stays unpruned (the mean then falls short of the request)."""
    from bench.prune import block_sparsities
    assert block_sparsities(2, 0.6, "log") == [0.0, 0.95]
    assert block_sparsities(3, 0.9, "log") == [0.0, 0.95, 0.95]
