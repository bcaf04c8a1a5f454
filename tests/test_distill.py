"""Distillation recovery (kd, psad) and the shared per-scale losses, against hand computations."""
import copy
import dataclasses
import math

import pytest
import torch

from bench.distill import build_teacher, forward_pair, scale_ce, scale_kl, token_terms
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
def test_student_equal_to_teacher_has_zero_kl(spec, monkeypatch):
    monkeypatch.setattr("bench.distill.train_drop_path", lambda depth: 0.0)   # stochastic depth off: same model
    gen = _gen(drop=0.5)           # much class dropout: the teacher must see the student's dropped labels
    m = build_method(spec + ("," if ":" in spec else ":") + "lr=0,batch=16")
    m.apply(gen, _ctx(gen, gen))
    assert len(m.history) == 4 and all(h["kl"] == 0 and h["distill"] == 0 for h in m.history)
    assert all(h["ce"] > 0 for h in m.history)


def test_fine_tuning_drops_paths_as_official_var_training_and_decays_only_matrices():
    """Stochastic depth 0.1·depth/24, linear over the blocks, while training only; weight decay on the weight
    matrices, not on what official VAR exempts (1-D parameters, biases, position/level embeddings, gains)."""
    from bench.distill import drop_path_while_training, param_groups, train_drop_path
    from bench.models.var import DropPath
    gen = _gen()
    blocks = list(gen.var.blocks)
    assert train_drop_path(16) == pytest.approx(0.1 * 16 / 24) and train_drop_path(24) == pytest.approx(0.1)
    before = [type(b.drop_path) for b in blocks]
    with drop_path_while_training(blocks, 0.3):
        ps = [b.drop_path.p if isinstance(b.drop_path, DropPath) else 0.0 for b in blocks]
        assert ps == pytest.approx([0.3 * i / (len(blocks) - 1) for i in range(len(blocks))])
        assert type(blocks[0].drop_path) is torch.nn.Identity             # block 0: rate 0
    assert [type(b.drop_path) for b in blocks] == before
    with pytest.raises(RuntimeError):
        with drop_path_while_training(blocks):
            raise RuntimeError("a failed step")
    assert [type(b.drop_path) for b in blocks] == before                  # restored on error too
    decay, no_decay = param_groups(gen.var, 0.05)
    names = {id(p): n for n, p in gen.var.named_parameters()}
    d, nd = {names[id(p)] for p in decay["params"]}, {names[id(p)] for p in no_decay["params"]}
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    assert d | nd == set(names.values()) and not d & nd
    assert {"pos_1LC", "pos_start", "lvl_embed.weight", "blocks.0.attn.q_bias", "blocks.0.ffn.fc1.bias"} <= nd
    assert {"class_emb.weight", "blocks.0.attn.mat_qkv.weight", "blocks.0.ffn.fc2.weight", "head.weight",
            "word_embed.weight"} <= d
    assert all(n.endswith("bias") or "scale_mul" in n or gen.var.get_parameter(n).ndim == 1 or
               any(k in n for k in ("pos_", "lvl_embed")) for n in nd)
    gen.var.requires_grad_(False)
    assert param_groups(gen.var, 0.05) == []                              # nothing trainable: no group
    # the rules themselves, on parameters VAR's names do not separate: a 1-D weight, a 2-D bias
    other = torch.nn.Module()
    other.norm, other.lin = torch.nn.LayerNorm(4), torch.nn.Linear(4, 4, bias=False)
    other.rel_bias = torch.nn.Parameter(torch.zeros(3, 3))
    decay, no_decay = param_groups(other, 0.1)
    assert [p.shape for p in decay["params"]] == [(4, 4)]
    assert sorted(p.shape for p in no_decay["params"]) == [(3, 3), (4,), (4,)]
    # the linear rule over a deeper stack
    deep = [torch.nn.Module() for _ in range(5)]
    for b in deep:
        b.drop_path = torch.nn.Identity()
    with drop_path_while_training(deep, 0.2):
        assert [b.drop_path.p if isinstance(b.drop_path, DropPath) else 0.0 for b in deep] == \
            pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2])
    with drop_path_while_training(deep[:1], 0.2):                        # one block: block 0, rate 0
        assert type(deep[0].drop_path) is torch.nn.Identity


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


# ------------------------------------------------------------------ the shared training loop
def _train_run(monkeypatch, epochs, epoch_size, batch, seed=3, lr=0.01, wd=0.05):
    """bench.distill.train on a loss that does not read its images: what the loop hands the loss (image
    ids, training progress t) and what the optimiser is given at each step."""
    from bench import distill
    log = {"lr": [], "ids": [], "t": [], "asked": [], "made": 0, "clip": []}

    class Recorder(torch.optim.AdamW):
        def step(self, closure=None):
            g = self.param_groups[0]
            log["lr"].append(g["lr"])
            log["opt"] = (g["betas"], g["weight_decay"])
            return super().step(closure)

    clip = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.optim, "AdamW", Recorder)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda ps, max_norm: log["clip"].append(max_norm) or clip(ps, max_norm))
    gen = _gen()
    ids = torch.arange(epoch_size)

    def data(n, split):
        log["asked"].append((n, split))
        return ids, [ids.view(-1, 1) * 10]

    def make_loss():
        log["made"] += 1

        def loss(labels_B, tokens, t):
            assert torch.equal(tokens[0].flatten(), labels_B * 10)    # an image's tokens travel with its label
            log["ids"] += labels_B.tolist()
            log["t"].append(t)
            return (gen.var.head.weight ** 2).sum(), {"step": float(len(log["t"]))}
        return loss

    ctx = Context(progress=False, seed=seed, epoch_size=epoch_size, data=data)
    gen.var.eval()
    history = distill.train(gen, ctx, "demo", epochs, lr, batch, wd, make_loss)
    return log, history, ctx, gen


def test_train_epochs_batches_progress_and_schedule(monkeypatch):
    log, history, ctx, gen = _train_run(monkeypatch, epochs=2, epoch_size=8, batch=3)
    steps = 6                                                   # ceil(2·8 / 3)
    assert log["asked"] == [(8, "train")] and log["made"] == 1 and not gen.var.training
    assert sorted(log["ids"][:8]) == list(range(8)) == sorted(log["ids"][8:16])   # each epoch: every image once
    assert log["ids"][:8] != list(range(8)) and len(log["ids"]) == 16                # shuffled; last batch of 1
    assert log["t"] == [s / steps for s in range(steps)] and history == [{"step": float(s + 1)} for s in range(steps)]
    warm = 1                                                    # max(1, steps // 20)
    assert log["lr"] == pytest.approx([0.01 * min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * s / steps))
                                       for s in range(steps)], rel=1e-12)
    assert log["opt"] == ((0.9, 0.95), 0.05) and log["clip"] == [2.0] * steps
    assert ctx.notes == ["demo: 6 steps of batch 3 (2 epoch(s) of 8 images)"]
    again, _, _, _ = _train_run(monkeypatch, epochs=2, epoch_size=8, batch=3)
    other, _, _, _ = _train_run(monkeypatch, epochs=2, epoch_size=8, batch=3, seed=4)
    assert again["ids"] == log["ids"] != other["ids"]          # the order is the context's seed's


def test_train_warms_up_over_a_twentieth_and_takes_fractional_epochs(monkeypatch):
    log, _, ctx, _ = _train_run(monkeypatch, epochs=1, epoch_size=41, batch=1)
    steps, warm = 41, 2                                         # max(1, 41 // 20)
    assert log["lr"] == pytest.approx([0.01 * min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * s / steps))
                                       for s in range(steps)], rel=1e-12)
    assert log["lr"][0] == pytest.approx(0.005)
    log, _, ctx, _ = _train_run(monkeypatch, epochs=0.5, epoch_size=8, batch=3)
    # round(0.5·8) = 4 images in ceil(4/3) = 2 steps of full batches: 6 distinct images of one permutation
    assert len(log["ids"]) == 6 and len(set(log["ids"])) == 6 and log["t"] == [0.0, 0.5]
    assert ctx.notes == ["demo: 2 steps of batch 3 (0.5 epoch(s) of 8 images)"]
    log, history, ctx, _ = _train_run(monkeypatch, epochs=1, epoch_size=1, batch=1)
    assert len(history) == 1 and log["t"] == [0.0] and log["lr"] == [0.01]     # one image, one step: full lr


def test_train_with_no_step_and_without_data(monkeypatch):
    log, history, ctx, _ = _train_run(monkeypatch, epochs=0, epoch_size=8, batch=3)
    assert history == [] and log["asked"] == [] and log["made"] == 0 and ctx.notes == ["demo: 0 steps (epochs=0)"]
    from bench.distill import train
    msg = r"^demo needs training data: the bench provides none \(Context.data / epoch_size\)$"
    for ctx in (Context(progress=False, epoch_size=8), Context(progress=False, data=lambda n, s: None, epoch_size=0)):
        with pytest.raises(ValueError, match=msg):
            train(_gen(), ctx, "demo", 1, 0.01, 3, 0.0, lambda: None)


# ------------------------------------------------------------------ teacher, paired forward, variants
def test_teacher_is_a_frozen_eval_copy_and_must_match_the_student():
    gen = _gen().train()
    ctx = Context(progress=False)
    teacher = build_teacher(gen, ctx, "kd")
    assert teacher is not gen and not teacher.training and not any(p.requires_grad for p in teacher.parameters())
    assert gen.var.training and all(p.requires_grad for p in gen.var.parameters())
    assert ctx.notes == ["kd: no teacher in the context; distilled from a copy of the incoming model"]
    given = _gen(seed=3).train()
    ctx = Context(progress=False, teacher=lambda: given)
    assert build_teacher(gen, ctx, "psad") is given and not given.training and ctx.notes == []
    assert not any(p.requires_grad for p in given.parameters())
    for other in (SMALL_VAR.replace(vocab_size=32), SMALL_VAR.replace(patch_nums=(1, 2, 4, 8))):
        wrong = Generator(VAR(other), VQVAE(dataclasses.replace(SMALL_VAE, vocab_size=other.vocab_size,
                                                                 patch_nums=other.patch_nums)))
        with pytest.raises(ValueError, match=r"^psad: teacher and student disagree on vocabulary or scales$"):
            build_teacher(gen, Context(progress=False, teacher=lambda w=wrong: w), "psad")


def test_forward_pair_drops_no_label_in_eval_mode():
    gen = _gen(drop=0.5).eval()
    seen = {}
    gen.var.class_emb.register_forward_hook(lambda mod, inp, out: seen.__setitem__("labels", inp[0].clone()))
    labels = torch.arange(64) % gen.var.num_classes
    forward_pair(gen, copy.deepcopy(gen), labels, [torch.zeros(64, pn * pn, dtype=torch.long) for pn in gen.patch_nums])
    assert torch.equal(seen["labels"], labels)


def test_psad_variants_log_their_own_loss_terms():
    """lr 0 (the student stays put): variant=code logs its task term as the plain token-mean CE; the paper
    variant's first steps open only scale 0, so its task term is scale 0's CE, not the mean."""
    teacher = _gen()
    student = _gen(seed=4)
    hist = {}
    for variant in ("code", "paper"):
        m = build_method(f"psad:variant={variant},lr=0,batch=16")
        ctx = _ctx(student, teacher, n=32)
        m.apply(student, ctx)
        hist[variant] = m.history
        assert all(set(h) == {"ce", "kl", "task", "distill"} for h in m.history)
        assert ctx.notes == ["psad: 2 steps of batch 16 (1 epoch(s) of 32 images)"]
    assert all(h["task"] == pytest.approx(h["ce"], rel=1e-6) for h in hist["code"])
    assert hist["paper"][0]["task"] != pytest.approx(hist["paper"][0]["ce"], rel=1e-3)


def test_kd_notes_and_tau_squared():
    teacher, student = _gen(), _gen(seed=4)
    ctx = _ctx(student, teacher, n=16)
    build_method("kd:lr=0,batch=16").apply(student, ctx)
    assert ctx.notes == ["kd: 1 steps of batch 16 (1 epoch(s) of 16 images)"]
    s, t, y = _logits(3)
    ce_BL, kl_BL = token_terms(s, t, y, 3.0)
    assert kd_loss(ce_BL, kl_BL, 3.0)[2].item() == pytest.approx(9 * kl_BL.mean().item(), rel=1e-6)


def test_one_scale_edge_cases():
    from methods.psad import code_scale_weights, onsets
    assert onsets(1, 0.6, 0.1).tolist() == [-0.1] and onsets(2, 0.6, 0.1).tolist() == pytest.approx([-0.1, 0.6])
    assert code_scale_weights(1).tolist() == [2.0]
    assert code_scale_weights(2).tolist() == pytest.approx([2.0, 0.2])
