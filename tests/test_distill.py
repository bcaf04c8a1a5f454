"""Distillation recovery (kd, psad) and the shared per-scale losses, against hand computations."""
import copy
import math

import pytest
import torch

from bench.distill import forward_pair, scale_ce, scale_kl, token_terms
from bench.method import Context, apply_chain, build_method
from bench.models.generator import Generator
from bench.models.var import VAR
from bench.models.vqvae import VQVAE
from methods.kd import kd_loss
from methods.psad import code_loss, gates, paper_loss, scale_weights
from tests.conftest import SMALL_VAE, SMALL_VAR, randomize_

BEGIN_ENDS = [(0, 1), (1, 5), (5, 14)]          # scales 1², 2², 3²
N_K = torch.tensor([1.0, 4.0, 9.0])


pytestmark = pytest.mark.usefixtures("one_thread")


def _logits(seed, B=2, L=14, V=7):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, L, V, generator=g) * 2, torch.randn(B, L, V, generator=g) * 2, torch.randint(V, (B, L), generator=g)


def _kl_by_hand(s_V, t_V, tau):
    """KL(teacher ‖ student) of one token, from explicit exponentials in float64."""
    es, et = [math.exp(x / tau) for x in s_V.double().tolist()], [math.exp(x / tau) for x in t_V.double().tolist()]
    ps, pt = [x / sum(es) for x in es], [x / sum(et) for x in et]
    return sum(q * math.log(q / p) for p, q in zip(ps, pt))


def _ce_by_hand(z_V, y):
    return -z_V[y].item() + math.log(sum(math.exp(x) for x in z_V.double().tolist()))


def _per_scale_by_hand(fn, B):
    """[K]: per image the sum over each scale's tokens of fn(b, l), averaged over the batch."""
    return [sum(fn(b, l) for b in range(B) for l in range(lo, hi)) / B for lo, hi in BEGIN_ENDS]


def test_gates_follow_the_paper_ramp():
    K, onset, ramp = 4, 0.6, 0.1                       # onsets t_i = 0.6·i/3 = 0, 0.2, 0.4, 0.6 (scale 0: −Δ)
    t_K = [-0.1, 0.2, 0.4, 0.6]
    assert gates(0.0, K, onset, ramp)[0] == 1          # scale 0 open from the first step
    for i, ti in enumerate(t_K):
        if ti > 0:
            assert gates(ti - 1e-3, K, onset, ramp)[i] == 0 and gates(ti, K, onset, ramp)[i] < 1e-6
        assert gates(ti + ramp + 1e-6, K, onset, ramp)[i] == 1
        for frac in (0.25, 0.5, 0.75):                 # linear inside the ramp
            if ti + frac * ramp >= 0:
                assert gates(ti + frac * ramp, K, onset, ramp)[i].item() == pytest.approx(frac, abs=1e-6)
    # continuous: no jump between nearby times; and ramp=0 is a hard step at t_i
    ts = torch.linspace(0, 0.99, 500).tolist()
    jumps = torch.stack([gates(b, K, onset, ramp) - gates(a, K, onset, ramp) for a, b in zip(ts, ts[1:])])
    assert jumps.abs().max() < 0.03 and (jumps >= 0).all()
    assert gates(0.4, K, onset, 0.0).tolist() == [1, 1, 1, 0] and gates(0.39, K, onset, 0.0).tolist() == [1, 1, 0, 0]


def test_weightings_give_the_documented_weights():
    def norm(raw):
        return [r / sum(x * n for x, n in zip(raw, N_K.tolist())) for r in raw]
    expected = {"inverse-count": [1 / 3 / n for n in (1, 4, 9)],          # C/n_i, C = 1/K
                "exp-increase": norm([1, 2, 4]), "linear-increase": norm([1, 2, 3]), "exp-decay": norm([1, 0.5, 0.25])}
    for name, w in expected.items():
        got = scale_weights(name, N_K)
        assert got.tolist() == pytest.approx(w, rel=1e-6), name
        assert (got * N_K).sum().item() == pytest.approx(1.0)            # every weighting: Σ w_i n_i = 1


def test_per_scale_kl_and_ce_equal_per_token_brute_force():
    s, t, y = _logits(0)
    for tau in (1.0, 4.0):
        want = _per_scale_by_hand(lambda b, l, tau=tau: _kl_by_hand(s[b, l], t[b, l], tau), 2)
        assert scale_kl(s, t, BEGIN_ENDS, tau).tolist() == pytest.approx(want, rel=1e-5)
    ce = _per_scale_by_hand(lambda b, l: _ce_by_hand(s[b, l], y[b, l]), 2)
    assert scale_ce(s, y, BEGIN_ENDS).tolist() == pytest.approx([c / n for c, n in zip(ce, (1, 4, 9))], rel=1e-5)


def test_code_variant_loss_by_hand():
    s, t, y = _logits(1)
    kl_K = _per_scale_by_hand(lambda b, l: _kl_by_hand(s[b, l], t[b, l], 4.0), 2)
    ce = sum(_ce_by_hand(s[b, l], y[b, l]) for b in range(2) for l in range(14)) / 28
    s_K = [2.0, 1.1, 0.2]                                              # linear 2.0 → 0.2 over K = 3 scales
    want = 0.7 * ce + 0.3 * 16 * sum(w * k for w, k in zip(s_K, kl_K))
    assert code_loss(*token_terms(s, t, y, 4.0), BEGIN_ENDS, 4.0)[0].item() == pytest.approx(want, rel=1e-5)


def test_paper_loss_and_kd_loss_by_hand():
    s, t, y = _logits(2)
    tau, g_K, w_K = 2.0, torch.tensor([1.0, 0.5, 0.0]), torch.tensor([0.3, 0.2, 0.1])
    kl_K = _per_scale_by_hand(lambda b, l: _kl_by_hand(s[b, l], t[b, l], tau), 2)
    ce_K = _per_scale_by_hand(lambda b, l: _ce_by_hand(s[b, l], y[b, l]), 2)
    task = (ce_K[0] + 0.5 * ce_K[1]) / (1 + 0.5 * 4)                   # gate-weighted token mean of the CE
    want = task + tau ** 2 * (0.3 * kl_K[0] + 0.5 * 0.2 * kl_K[1])
    assert paper_loss(*token_terms(s, t, y, tau), BEGIN_ENDS, g_K, w_K, tau)[0].item() == pytest.approx(want, rel=1e-5)
    kd = sum(ce_K) / 14 + tau ** 2 * sum(kl_K) / 14                  # token means over all 14 tokens
    assert kd_loss(*token_terms(s, t, y, tau), tau)[0].item() == pytest.approx(kd, rel=1e-5)


def _gen(seed=1, drop=0.1):
    torch.manual_seed(0)
    return Generator(randomize_(VAR(SMALL_VAR.replace(cond_drop_rate=drop)), seed), randomize_(VQVAE(SMALL_VAE), 2)).eval()


def _ctx(gen, teacher, n=64):
    def data(k, split):
        g = torch.Generator().manual_seed(5)
        return torch.randint(gen.var.num_classes, (k,), generator=g), [torch.randint(gen.var.V, (k, pn * pn), generator=g) for pn in gen.patch_nums]
    return Context(progress=False, data=data, teacher=lambda: copy.deepcopy(teacher), epoch_size=n)


@pytest.mark.parametrize("spec", ["kd", "psad", "psad:variant=code"])
def test_student_equal_to_teacher_has_zero_kl(spec):
    gen = _gen(drop=0.5)           # much class dropout: the teacher must see the student's dropped labels
    m = build_method(spec + ("," if ":" in spec else ":") + "lr=0,batch=16")
    m.apply(gen, _ctx(gen, gen))
    assert len(m.history) == 4 and all(h["kl"] == 0 and h["distill"] == 0 for h in m.history)
    assert all(h["ce"] > 0 for h in m.history)


def test_forward_pair_drops_labels_once_for_both():
    gen = _gen(drop=0.5).train()
    teacher, seen = copy.deepcopy(gen).eval(), {}
    for name, model in (("student", gen), ("teacher", teacher)):
        model.var.class_emb.register_forward_hook(lambda mod, inp, out, name=name: seen.__setitem__(name, inp[0].clone()))
    labels = torch.zeros(64, dtype=torch.long)
    forward_pair(gen, teacher, labels, [torch.zeros(64, pn * pn, dtype=torch.long) for pn in gen.patch_nums])
    assert torch.equal(seen["student"], seen["teacher"])
    assert gen.var.cfg.cond_drop_rate == 0.5                           # the student's own rate is restored
    dropped = (seen["student"] == gen.var.num_classes).float().mean().item()
    assert 0.3 < dropped < 0.7                                         # dropped once at 0.5, not twice (0.75)


def _kl_to(teacher, student):
    g = torch.Generator().manual_seed(9)
    labels = torch.randint(teacher.var.num_classes, (32,), generator=g)
    tokens = [torch.randint(teacher.var.V, (32, pn * pn), generator=g) for pn in teacher.patch_nums]
    with torch.no_grad():
        return scale_kl(student.forward_teacher(labels, tokens), teacher.forward_teacher(labels, tokens),
                        student.var.begin_ends, 1.0).sum().item()


@pytest.mark.parametrize("spec", ["kd:batch=16,lr=0.002", "psad:batch=16,lr=0.002,onset=0,ramp=0"])
def test_a_few_steps_of_distillation_lower_the_kl(spec):
    teacher = _gen()
    student = copy.deepcopy(teacher)
    with torch.no_grad():
        for p in student.var.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.03)
    before = _kl_to(teacher, student)
    student = apply_chain(student, [spec], _ctx(student, teacher, n=256))
    assert _kl_to(teacher, student) < 0.8 * before     # ft (CE only) raises it here
