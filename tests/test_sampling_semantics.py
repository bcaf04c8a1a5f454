"""What the sampling loop computes, checked against independent recomputations.

- CFG: with ``top_k=1`` every sampled token is the argmax of ``(1+t)·cond − t·uncond`` over the
  *teacher-forced* logits, ``t = cfg·si/(K−1)``; the alternatives (no ramp, conditional or
  unconditional logits alone) are shown to be distinguishable on the same tokens, so a wrong
  ramp cannot pass.
- Filtering: top-k first, then top-p on the renormalised top-k (a hand-made case where the order
  matters, and every sampled token of a real run lies in the independently filtered set).
- Seeds: the runner gives batch ``b`` of a run with seed ``s`` the seed ``s·1000003 + b``; a batch's
  images do not depend on how many batches are sampled, but they DO depend on the batch size.
- ``more_smooth`` and the uint8 conversion (``x·255 + 0.5``, clamped, truncated).
"""
import pytest
import torch

from bench.benches.base import Bench
from bench.models.generator import sample_top_k_top_p, to_uint8, top_k_top_p_filter_
from bench.runner import sample


def _teacher_logits(gen, labels, tokens):
    """Per scale: (conditional, unconditional) teacher-forced logits of the given token pyramid."""
    with torch.no_grad():
        cond = gen.forward_teacher(labels, tokens)
        uncond = gen.forward_teacher(torch.full_like(labels, gen.var.num_classes), tokens)
    return [(cond[:, bg:ed], uncond[:, bg:ed]) for bg, ed in gen.var.begin_ends]


def _is_argmax(logits_BlV, tokens_Bl, tol=1e-4):
    """Every token reaches the row maximum (up to the KV-cache vs teacher-forcing float noise)."""
    picked = logits_BlV.gather(-1, tokens_Bl[..., None]).squeeze(-1)
    return bool((picked >= logits_BlV.amax(-1) - tol).all())


def _clearly_not_argmax(logits_BlV, tokens_Bl, margin=1e-3):
    picked = logits_BlV.gather(-1, tokens_Bl[..., None]).squeeze(-1)
    return bool((picked < logits_BlV.amax(-1) - margin).any())


@pytest.mark.parametrize("cfg", [1.5, 3.0])
def test_top_k_1_samples_the_argmax_of_the_linear_cfg_ramp(small_gen, cfg):
    labels = torch.tensor([0, 3, 4, 1])
    tokens, _ = small_gen.sample_tokens(labels, seed=0, cfg=cfg, top_k=1, top_p=0.96)
    per_scale = _teacher_logits(small_gen, labels, tokens)
    K = len(small_gen.patch_nums)

    def guided(t_of_si):
        return [(1 + t_of_si(si)) * c - t_of_si(si) * u for si, (c, u) in enumerate(per_scale)]

    for si, g in enumerate(guided(lambda si: cfg * si / (K - 1))):
        assert _is_argmax(g, tokens[si]), f"scale {si}: token is not the argmax of the CFG-ramped logits"
        top2 = g.topk(2, dim=-1).values
        clear = top2[..., 0] - top2[..., 1] > 1e-4   # no near-tie: the argmax itself must be sampled
        assert clear.float().mean() > 0.9 and torch.equal(g.argmax(-1)[clear], tokens[si][clear]), si
    # the same tokens are NOT consistent with the usual mistakes, so each of them would fail above
    alternatives = {"constant t = cfg": guided(lambda si: cfg),
                    "conditional logits only": [c for c, _ in per_scale],
                    "unconditional logits only": [u for _, u in per_scale],
                    "ramp over K instead of K-1": guided(lambda si: cfg * si / K)}
    for name, logits in alternatives.items():
        assert any(_clearly_not_argmax(g, tokens[si]) for si, g in enumerate(logits)), name


def test_different_labels_give_different_samples(small_gen):
    kw = dict(seed=3, cfg=1.5, top_k=20, top_p=0.9)
    a = small_gen.generate(torch.tensor([0, 0]), **kw)
    b = small_gen.generate(torch.tensor([1, 1]), **kw)
    for i in range(2):
        assert not torch.equal(a[i], b[i]), i
    assert not torch.equal(a[0], a[1])   # same label, different draws within the batch
    # greedy sampling depends on the label too (not only on the random draws)
    ta, _ = small_gen.sample_tokens(torch.tensor([0]), seed=0, top_k=1)
    tb, _ = small_gen.sample_tokens(torch.tensor([2]), seed=0, top_k=1)
    assert any(not torch.equal(x, y) for x, y in zip(ta, tb))


# --------------------------------------------------------------------------------------- filtering

def test_top_k_is_applied_before_top_p():
    """p = [0.4, 0.3, 0.2, 0.1], top_k=3, top_p=0.75. Top-k first keeps {0,1,2} renormalised to
    [4/9, 3/9, 2/9]; dropping the ascending prefix with mass ≤ 0.25 removes token 2 → {0, 1}.
    Top-p first would drop only token 3 (mass 0.1) and keep {0, 1, 2}."""
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log().view(1, 1, 4)
    out = top_k_top_p_filter_(logits.clone(), top_k=3, top_p=0.75)
    assert torch.isfinite(out).view(-1).tolist() == [True, True, False, False]
    assert torch.equal(out.view(-1)[:2], logits.view(-1)[:2])   # kept logits are untouched
    # each filter alone
    assert torch.isfinite(top_k_top_p_filter_(logits.clone(), 3, 0.0)).view(-1).tolist() == [True, True, True, False]
    assert torch.isfinite(top_k_top_p_filter_(logits.clone(), 0, 0.75)).view(-1).tolist() == [True, True, True, False]
    assert torch.isfinite(top_k_top_p_filter_(logits.clone(), 0, 0.65)).view(-1).tolist() == [True, True, False, False]
    # top_p keeps the most likely token even when it alone exceeds the mass
    one = torch.tensor([10.0, 0.0, 0.0]).view(1, 1, 3)
    assert torch.isfinite(top_k_top_p_filter_(one.clone(), 0, 0.5)).view(-1).tolist() == [True, False, False]


def test_sampled_frequencies_follow_the_filtered_distribution():
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log().view(1, 1, 4).expand(1, 20000, 4).contiguous()
    rng = torch.Generator().manual_seed(0)
    idx = sample_top_k_top_p(logits.clone(), top_k=3, top_p=0.75, rng=rng)
    freq = torch.bincount(idx.flatten(), minlength=4).double() / idx.numel()
    assert freq[2:].sum() == 0
    assert freq[0].item() == pytest.approx(4 / 7, abs=0.015)   # renormalised over the kept {0, 1}


def _allowed(row_V, top_k, top_p):
    """Independent reference: the top_k most likely tokens, then the shortest prefix of them (most
    likely first) whose renormalised mass reaches top_p."""
    vals, order = row_V.sort(descending=True)
    p = vals[:top_k].softmax(0)
    before = p.cumsum(0) - p          # mass of the strictly more likely kept tokens
    return set(order[:top_k][before < top_p].tolist())


def test_every_sampled_token_lies_in_the_top_k_top_p_set(small_gen):
    labels, cfg, top_k, top_p = torch.tensor([0, 2, 4, 1]), 1.5, 5, 0.5
    tokens, _ = small_gen.sample_tokens(labels, seed=11, cfg=cfg, top_k=top_k, top_p=top_p)
    K, n_tokens, restricted = len(small_gen.patch_nums), 0, 0
    for si, (c, u) in enumerate(_teacher_logits(small_gen, labels, tokens)):
        t = cfg * si / (K - 1)
        g = (1 + t) * c - t * u
        for b in range(len(labels)):
            for j in range(g.shape[1]):
                tok = tokens[si][b, j].item()
                assert tok in _allowed(g[b, j], top_k, top_p + 1e-4), (si, b, j)
                n_tokens += 1
                restricted += len(_allowed(g[b, j], top_k, top_p)) < top_k
    assert n_tokens == len(labels) * sum(pn * pn for pn in small_gen.patch_nums)
    # the nucleus is a real restriction here: usually smaller than the top-k set
    assert restricted > n_tokens // 2


# --------------------------------------------------------------------------------------- seeds

class _Bench(Bench):
    name, num_classes = "test", 5

    def __init__(self, batch_size):
        self.batch_size = batch_size


SAMPLING = dict(cfg=1.5, top_k=20, top_p=0.9)


def test_batch_seed_formula_and_distinct_per_batch():
    assert Bench.batch_seed(7, 3) == 7 * 1_000_003 + 3
    seeds = {Bench.batch_seed(s, b) for s in range(5) for b in range(100)}
    assert len(seeds) == 500


def test_runner_batches_use_their_own_seeds_and_not_the_number_of_batches(small_gen):
    labels, bench = torch.tensor([0, 0, 3]), _Bench(batch_size=1)
    full = sample(small_gen, bench, labels, seed=7, sampling=SAMPLING, progress=False)
    assert full.shape == (3, 3, 32, 32) and full.dtype == torch.uint8
    # the first two batches are the same whether 2 or 3 batches are drawn
    assert torch.equal(sample(small_gen, bench, labels[:2], seed=7, sampling=SAMPLING, progress=False), full[:2])
    # batch b is generate(labels of b, seed=batch_seed(seed, b))
    assert torch.equal(full[2:], small_gen.generate(labels[2:], seed=Bench.batch_seed(7, 2), **SAMPLING))
    # batches 0 and 1 have the same label but different seeds, hence different images
    assert not torch.equal(full[0], full[1])
    # another run seed changes the batch
    assert not torch.equal(sample(small_gen, bench, labels[:1], seed=8, sampling=SAMPLING, progress=False), full[:1])


def test_images_depend_on_the_batch_size(small_gen):
    """Documented behaviour: one torch.Generator per ``generate`` call (as official ``g_seed``)
    draws the tokens of the whole batch, so an image depends on the batch it was sampled in — the
    same labels and run seed with batch size 4 instead of 2 give other images (deterministically:
    the batch of 4 is exactly ``generate(labels, seed=batch_seed(seed, 0))``)."""
    labels = torch.tensor([0, 1, 2, 3])
    by2 = sample(small_gen, _Bench(2), labels, seed=7, sampling=SAMPLING, progress=False)
    by4 = sample(small_gen, _Bench(4), labels, seed=7, sampling=SAMPLING, progress=False)
    assert torch.equal(by4, small_gen.generate(labels, seed=Bench.batch_seed(7, 0), **SAMPLING))
    assert not torch.equal(by2[2:], by4[2:])
    assert not torch.equal(by2[:2], by4[:2])   # even batch 0, which has the same seed in both


def test_more_smooth_changes_images_and_is_seeded(small_gen):
    """Compared on f_hat, which the images are decoded from (``generate`` = decode(f_hat))."""
    labels = torch.tensor([0, 3])

    def f_hat(seed, smooth):
        return small_gen.sample_tokens(labels, seed=seed, more_smooth=smooth)[1]

    a = f_hat(5, True)
    assert torch.equal(a, f_hat(5, True))
    assert not torch.allclose(a, f_hat(5, False), atol=1e-3)
    assert not torch.allclose(a, f_hat(6, True), atol=1e-3)


# --------------------------------------------------------------------------------------- uint8

def test_to_uint8_rounds_half_up_and_clamps():
    x = torch.tensor([0.0, 1.0, 0.5, 0.49804, 0.49, 0.002, 0.00196, 1 / 255, 254.49 / 255, 254.51 / 255,
                      -0.3, -1e-4, 1.0001, 1.5, 7.0])
    assert to_uint8(x.clone()).tolist() == [0, 255, 128, 127, 125, 1, 0, 1, 254, 255, 0, 0, 255, 255, 255]
    assert to_uint8(x.clone()).dtype == torch.uint8
    k = torch.arange(256, dtype=torch.float32)
    assert torch.equal(to_uint8(k / 255), k.to(torch.uint8))                       # exact round trip
    assert torch.equal(to_uint8((k[:-1] + 0.49) / 255), k[:-1].to(torch.uint8))   # below .5 rounds down
    assert torch.equal(to_uint8((k[:-1] + 0.51) / 255), k[1:].to(torch.uint8))    # above .5 rounds up
    # exact ties (k + 0.5 is exact in float32 here) round up, also for even k (not half-to-even)
    assert torch.equal((k[:-1] + 0.5) / 255 * 255, k[:-1] + 0.5)
    assert torch.equal(to_uint8((k[:-1] + 0.5) / 255), k[1:].to(torch.uint8))


def test_generate_maps_the_decoded_image_from_minus_one_one(small_gen):
    labels = torch.tensor([1, 4])
    _, f_hat = small_gen.sample_tokens(labels, seed=2)
    img = small_gen.vae.fhat_to_img(f_hat)
    assert img.min() < -0.05 or img.max() > 0.05   # a non-trivial image
    assert torch.equal(small_gen.generate(labels, seed=2), to_uint8((img + 1) / 2))
