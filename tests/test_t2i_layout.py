"""Layout pretraining of the tiny text encoder (``bench.recipes.t2i_layout``), its place in the recipe, and the
recipe's coarse-first curriculum."""
import pytest
import torch

from bench.models.text import TinyTextEncoder
from bench.recipes import t2i_layout
from bench.tiny import configs


def test_layout_targets_are_colour_strength_per_cell():
    """A pure red left half on grey: red's two left cells read 1.5·(1 − 0)… scaled, every other cell 0."""
    img = torch.full((1, 3, 8, 8), 128, dtype=torch.uint8)
    img[0, :, :, :4] = torch.tensor([255, 0, 0], dtype=torch.uint8).view(3, 1, 1)
    t = t2i_layout.layout_targets(img).view(3, 2, 2)
    assert t.shape == (3, 2, 2)
    # colour strength of pure red = 1.5·1 − 0.5·1 = 1; of grey 0; a left cell is all red
    assert t[0, :, 0].tolist() == pytest.approx([t2i_layout.TARGET_SCALE] * 2)
    assert t[0, :, 1].abs().max() < 1e-6 and t[1:].abs().max() < 1e-6
    # chunking does not change the result
    many = img.repeat(5, 1, 1, 1)
    assert torch.equal(t2i_layout.layout_targets(many, chunk=2), t2i_layout.layout_targets(many))


def test_mean_pool_ignores_padding():
    f = torch.tensor([[[1.0], [3.0], [100.0]]]).repeat(3, 1, 1)
    m = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])
    assert t2i_layout.mean_pool(f, m).flatten().tolist() == [2.0, 1.0, 0.0]   # an all-padding row pools to 0


def test_relation_probe_of_the_shipped_encoder():
    """The probe's value on the shipped tiny-t2i text encoder, as measured when the probe was written
    (accuracies are multiples of 1/192 here: the fit and split are deterministic)."""
    from bench.models.zoo import load_t2i
    from bench.registry import MODELS
    assert t2i_layout.relation_probe(load_t2i(MODELS.get("tiny-t2i")).text_encoder) == 0.4479


def test_relation_probe_reads_an_encoder_that_represents_the_relation():
    """A random encoder sits well below 1; the probe can also read 1 when the features carry the answer
    (the left / top colour written into the features by hand)."""
    torch.manual_seed(0)
    text = TinyTextEncoder(configs.TINY_TEXT)
    random_acc = t2i_layout.relation_probe(text)
    assert 0.0 <= random_acc < 0.9

    class Oracle(torch.nn.Module):
        def encode(self, prompts):
            from bench.data import scenes
            feats = torch.zeros(len(prompts), 8, 3)
            for i, p in enumerate(prompts):
                w = p.split()
                first = w[1] if w[3] in ("left", "above") else w[-2]
                feats[i, :, scenes.COLOUR_NAMES.index(first)] = 1
            return feats, torch.ones(len(prompts), 8, dtype=torch.bool)

    assert t2i_layout.relation_probe(Oracle()) == 1.0


def test_pretraining_lowers_the_layout_loss():
    from bench.data import scenes
    torch.manual_seed(0)
    imgs, prompts, *_ = scenes.generate(256, "train")
    ids, mask = scenes.tokenize(prompts, configs.T2I_MAX_WORDS)
    target = t2i_layout.layout_targets(imgs)
    text = TinyTextEncoder(configs.TINY_TEXT)
    head = t2i_layout.LayoutHead(configs.TINY_TEXT.out_channels)
    with torch.no_grad():
        before = head.loss(text(ids, mask), mask, target).item()
    curve = t2i_layout.pretrain_text(text, head, ids, mask, target, 60, torch.Generator().manual_seed(0), batch=64)
    with torch.no_grad():
        after = head.loss(text(ids, mask), mask, target).item()
    assert [c["step"] for c in curve] == [0, 59]
    assert after < 0.7 * before


def test_recipe_options_reach_the_training(monkeypatch):
    """``text_pretrain`` runs the pretraining first (its curve returned) and ``layout_weight`` adds the
    layout loss to the joint steps: each changes the trained weights; absent, the run is the plain one."""
    from bench.models.bsq import BSQVAE
    from bench.recipes import tiny_t2i
    torch.manual_seed(0)
    vae = BSQVAE(configs.TINY_BSQ).eval()
    base = dict(tiny_t2i.T2I_RECIPE, steps=2, pool=64, batch=4, eval_every=0, warmup=1)
    calls = []
    real = t2i_layout.pretrain_text
    monkeypatch.setattr(t2i_layout, "pretrain_text", lambda *a, **k: calls.append(a[5]) or real(*a, **{**k, "batch": 8}))
    runs = {}
    for name, extra in (("plain", {}), ("zero", dict(text_pretrain=0, layout_weight=0.0)),
                        ("pretrain", dict(text_pretrain=3)), ("aux", dict(layout_weight=1.0))):
        inf, text, info = tiny_t2i.train_t2i(vae, dict(base, **extra), progress=False)
        runs[name] = (inf.state_dict(), text.state_dict(), info)
    assert calls == [3]
    assert runs["pretrain"][2]["text_curve"] and not runs["plain"][2]["text_curve"]

    def same(a, b):
        return all(torch.equal(v, b[k]) for k, v in a.items())
    assert same(runs["zero"][0], runs["plain"][0]) and same(runs["zero"][1], runs["plain"][1])
    assert not same(runs["pretrain"][1], runs["plain"][1])
    assert not same(runs["aux"][1], runs["plain"][1])


def test_coarse_first_trains_the_first_scales_then_all(monkeypatch):
    """``coarse_first`` = k: the first k steps' loss covers the first ``coarse_scales`` scales only (the
    schedule passed to the loss), the later steps all of them; 0 or absent is the plain run (same weights);
    a bad scale count or a time budget with it is refused before training."""
    from bench.models.bsq import BSQVAE
    from bench.models.t2i import T2IGenerator
    from bench.recipes import tiny_t2i
    torch.manual_seed(0)
    vae = BSQVAE(configs.TINY_BSQ).eval()
    base = dict(tiny_t2i.T2I_RECIPE, steps=3, pool=64, batch=4, eval_every=0, warmup=1)
    seen = []
    real = T2IGenerator.loss
    monkeypatch.setattr(T2IGenerator, "loss", lambda self, *a, **k: seen.append(len(k["schedule"])) or real(self, *a, **k))
    runs = {}
    for name, extra in (("plain", {}), ("zero", dict(coarse_first=0)), ("two", dict(coarse_first=2, coarse_scales=2)),
                        ("default", dict(coarse_first=1))):
        seen.clear()
        inf, _, _ = tiny_t2i.train_t2i(vae, dict(base, **extra), progress=False)
        runs[name] = (list(seen), inf.state_dict())
    K = len(configs.T2I_SCHEDULE)
    assert runs["plain"][0] == runs["zero"][0] == [K] * 3
    assert runs["two"][0] == [2, 2, K] and runs["default"][0] == [tiny_t2i.COARSE_SCALES, K, K]
    assert all(torch.equal(v, runs["plain"][1][k]) for k, v in runs["zero"][1].items())
    assert not all(torch.equal(v, runs["plain"][1][k]) for k, v in runs["two"][1].items())
    with pytest.raises(ValueError, match="coarse_scales must be in 1…5"):
        tiny_t2i.train_t2i(vae, dict(base, coarse_first=1, coarse_scales=0), progress=False)
    with pytest.raises(ValueError, match="give the number of steps instead"):
        tiny_t2i.train_t2i(vae, dict(base, coarse_first=1, time_budget_s=10.0, warmup=100), progress=False)
