"""Method interface, parameter checking, structured pruning and fine-tuning on a small model."""
import re

import pytest
import torch

from bench.method import Context, apply_chain, build_method
from bench.models.zoo import load_var
from bench.registry import UnknownNameError


def _zero_head_and_channels(gen, block, head, channels):
    attn, c = gen.var.blocks[block].attn, gen.var.blocks[block].attn.c
    dims = torch.arange(head * c, (head + 1) * c)
    HC = attn.H * c
    with torch.no_grad():
        for off in (0, HC, 2 * HC):
            attn.mat_qkv.weight[dims + off] = 0
        attn.proj.weight[:, dims] = 0
        attn.q_bias[dims] = 0
        attn.v_bias[dims] = 0
        gen.var.blocks[block].ffn.fc1.weight[channels] = 0
        gen.var.blocks[block].ffn.fc1.bias[channels] = 0
        gen.var.blocks[block].ffn.fc2.weight[:, channels] = 0


def test_magnitude_removes_the_smallest_units_exactly(small_gen):
    labels = torch.tensor([0, 3])
    # make head 1 and channels 0..255 of every block contribute nothing: pruning them must not change
    # the teacher-forced logits, and magnitude must pick exactly those units at 50% sparsity
    for b in range(len(small_gen.var.blocks)):
        _zero_head_and_channels(small_gen, b, head=1, channels=torch.arange(256))
    tokens, _ = small_gen.sample_tokens(labels, seed=0)
    with torch.no_grad():
        before = small_gen.forward_teacher(labels, tokens)
    params_before = sum(p.numel() for p in small_gen.var.parameters())
    pruned = build_method("magnitude:sparsity=0.5").apply(small_gen, Context())
    with torch.no_grad():
        after = pruned.forward_teacher(labels, tokens)
    assert torch.allclose(before, after, atol=1e-5)
    assert pruned.var.cfg.heads == (1, 1) and pruned.var.cfg.ffn_hidden == (256, 256)
    C, c = 128, 64
    removed = 2 * (4 * C * c + 2 * c + 1 + 256 * (2 * C + 1))   # per block: head (qkv rows, proj cols, biases, scale) + channels
    assert params_before - sum(p.numel() for p in pruned.var.parameters()) == removed


def test_pruned_model_saves_and_loads_strictly(small_gen, tmp_path):
    pruned = build_method("magnitude:sparsity=0.4,norm=l1,scope=out").apply(small_gen, Context())
    torch.save(pruned.var.state_dict(), tmp_path / "pruned.pth")
    loaded = load_var(tmp_path / "pruned.pth", small_gen.var.cfg.replace(heads=None, ffn_hidden=None))
    assert loaded.cfg.heads == pruned.var.cfg.heads and loaded.cfg.ffn_hidden == pruned.var.cfg.ffn_hidden
    imgs = pruned.generate(torch.tensor([1, 2]), seed=0)
    assert imgs.shape == (2, 3, 32, 32)


def test_method_parameters_are_checked():
    with pytest.raises(ValueError, match=r"sparsity=1.5 out of range \[0.0, 0.9\]"):
        build_method("magnitude:sparsity=1.5")
    with pytest.raises(ValueError, match="did you mean 'sparsity'"):
        build_method("magnitude:sparsty=0.4")
    with pytest.raises(ValueError, match=re.escape("magnitude: parameter norm='l3' must be one of l1, l2")):
        build_method("magnitude:norm=l3")
    with pytest.raises(ValueError, match=re.escape(
            "stepvar: parameter score='hpff' must be one of both, hpf, pca, random; did you mean 'hpf'?")):
        build_method("stepvar:score=hpff")
    with pytest.raises(ValueError, match=re.escape(
            "method 'magnitude' has no parameter 'zzz'. Parameters: sparsity, norm, scope, schedule")):
        build_method("magnitude:zzz=1")
    with pytest.raises(UnknownNameError, match="did you mean 'magnitude'"):
        build_method("magnitud:sparsity=0.4")


def test_chain_collects_deviation_notes(small_gen):
    ctx = Context()
    apply_chain(small_gen, ["dense", "magnitude:sparsity=0.2"], ctx)
    assert any(n.startswith("magnitude:") for n in ctx.notes)


def test_ft_lowers_the_training_loss(small_gen):
    g = torch.Generator().manual_seed(0)
    n = 64
    labels = torch.randint(0, 5, (n,), generator=g)
    # a learnable target: every token of an image is its label
    tokens = [labels[:, None].expand(n, pn * pn).clone() for pn in small_gen.patch_nums]
    ctx = Context(data=lambda k, split: (labels[:k], [t[:k] for t in tokens]), epoch_size=n, progress=False)
    with torch.no_grad():
        small_gen.var.eval()
        before = small_gen.loss(labels, tokens).item()
    ft = build_method("ft:epochs=8,lr=0.003,batch=16")
    ft.apply(small_gen, ctx)
    with torch.no_grad():
        after = small_gen.loss(labels, tokens).item()
    assert after < before * 0.7
    assert not small_gen.var.training
    # what the record says about it: the step count under the method's name, the CE per step
    assert "ft: 32 steps of batch 16 (8 epoch(s) of 64 images)" in ctx.notes
    assert len(ft.history) == 32 and all(h["ce"] > 0 for h in ft.history)


# --- the returned model of a chain, order of application, and the magnitude variants -----------------

def _gen_with(num_heads=8, seed=1, **kw):
    from bench.models.generator import Generator
    from bench.models.var import VAR
    from bench.models.vqvae import VQVAE
    from tests.conftest import SMALL_VAE, SMALL_VAR, randomize_
    torch.manual_seed(0)
    var = randomize_(VAR(SMALL_VAR.replace(num_heads=num_heads, **kw)), seed)
    return Generator(var, randomize_(VQVAE(SMALL_VAE), 2), name="small").eval()


def _unit_vectors(block, kind):
    """[units, D]: every weight removed with each head (its q, k, v rows of ``mat_qkv`` in [q|k|v]
    layout, its ``proj`` columns, biases and temperature) or each FFN channel (fc1 row + bias, fc2 column)."""
    with torch.no_grad():
        if kind == "channel":
            ffn = block.ffn
            return torch.cat((ffn.fc1.weight, ffn.fc1.bias[:, None], ffn.fc2.weight.T), dim=1)
        attn = block.attn
        H, c, C = attn.H, attn.c, attn.proj.weight.shape[0]
        qkv = attn.mat_qkv.weight.view(3, H, c, -1).transpose(0, 1).reshape(H, -1)
        proj = attn.proj.weight.view(C, H, c).transpose(0, 1).reshape(H, -1)
        return torch.cat((qkv, proj, attn.q_bias.view(H, c), attn.v_bias.view(H, c),
                          attn.scale_mul_1H11.view(H, 1)), dim=1)


def _kept(dense_block, pruned_block, kind):
    """Indices of the dense block's units that the pruned block holds, in order."""
    same = (_unit_vectors(pruned_block, kind)[:, None] == _unit_vectors(dense_block, kind)[None]).all(-1)
    assert (same.sum(1) == 1).all(), f"a pruned {kind} matches no dense one, or several"
    return same.int().argmax(1).tolist()


@pytest.mark.parametrize("first,second,heads", [(0.1, 0.2, 6), (0.2, 0.1, 5)])
def test_chain_applies_left_to_right_and_returns_the_pruned_model(first, second, heads):
    """8 heads, 512 FFN channels: 0.1 then 0.2 keeps 8→7→6 heads, 0.2 then 0.1 keeps 8→6→5
    (n_keep rounds at each step); FFN 512→461→369 and 512→410→369. The chain's model equals the
    methods applied by hand, and keeps the top heads/channels of the dense magnitude scores."""
    import copy

    from methods.magnitude import Magnitude
    gen = _gen_with(num_heads=8)
    dense = copy.deepcopy(gen)
    labels = torch.tensor([0, 3])
    tokens, _ = gen.sample_tokens(labels, seed=0)
    by_hand = copy.deepcopy(gen)
    for s in (first, second):
        by_hand = build_method(f"magnitude:sparsity={s}").apply(by_hand, Context())
    out = apply_chain(gen, [f"magnitude:sparsity={first}", f"magnitude:sparsity={second}"], Context())
    assert out.var.cfg.heads == (heads, heads) and out.var.cfg.ffn_hidden == (369, 369)
    for b in out.var.blocks:
        assert b.attn.H == heads and b.attn.mat_qkv.weight.shape == (3 * heads * 16, 128)
        assert b.attn.proj.weight.shape == (128, heads * 16) and b.attn.scale_mul_1H11.shape == (1, heads, 1, 1)
        assert b.ffn.fc1.weight.shape == (369, 128) and b.ffn.fc2.weight.shape == (128, 369)
    with torch.no_grad():
        logits = out.forward_teacher(labels, tokens)
        assert torch.equal(logits, by_hand.forward_teacher(labels, tokens))
        assert not torch.allclose(logits, dense.forward_teacher(labels, tokens), atol=1e-3)
    head_scores, channel_scores = Magnitude(sparsity=first).scores(dense)
    for i, (d, p) in enumerate(zip(dense.var.blocks, out.var.blocks)):
        assert _kept(d, p, "head") == sorted(head_scores[i].topk(heads).indices.tolist())
        assert _kept(d, p, "channel") == sorted(channel_scores[i].topk(369).indices.tolist())


def test_chain_continues_with_the_model_each_method_returns(monkeypatch):
    """A method may return a new generator: the next method and the caller must get that one, not
    the (here deliberately spoiled) input."""
    import copy

    import bench.method as bm
    real_build = bm.build_method

    class Copying:
        def __init__(self, spec):
            self.inner = real_build(spec)
            self.name, self.deviations = self.inner.name, self.inner.deviations

        def apply(self, gen, ctx):
            new = self.inner.apply(copy.deepcopy(gen), ctx)
            with torch.no_grad():
                for p in gen.var.parameters():
                    p.fill_(float("nan"))
            return new

    gen = _gen_with(num_heads=8)
    labels = torch.tensor([1, 4])
    tokens, _ = gen.sample_tokens(labels, seed=0)
    by_hand = copy.deepcopy(gen)
    for s in ("magnitude:sparsity=0.1", "magnitude:sparsity=0.2"):
        by_hand = real_build(s).apply(by_hand, Context())
    monkeypatch.setattr(bm, "build_method", Copying)
    out = bm.apply_chain(gen, ["magnitude:sparsity=0.1", "magnitude:sparsity=0.2"], Context())
    assert out is not gen and out.var.cfg.heads == (6, 6)
    with torch.no_grad():
        assert torch.equal(out.forward_teacher(labels, tokens), by_hand.forward_teacher(labels, tokens))


def _hand_built_gen():
    """4 heads and 4 FFN channels per block, all weights zero except, for unit u of block b (role
    r = (u − b) mod 4):
      r=0: one output weight (proj column / fc2 column) of 3.0        L1 3,   L2² 9
      r=1: 100 output weights of 0.1                                  L1 10,  L2² 1
      r=2: one input weight (v row of mat_qkv / fc1 row) of 5.0       L1 5,   L2² 25
      r=3: 128 input weights (a k row / an fc1 row) of 0.2            L1 25.6, L2² 5.12
    so out-L1 keeps r=1, out-L2 keeps r=0, coupled-L1 keeps r=3, coupled-L2 keeps r=2.
    Biases and the per-head temperature differ per unit so that each kept unit is identifiable."""
    gen = _gen_with(num_heads=4, mlp_ratio=4 / 128)
    with torch.no_grad():
        for b, blk in enumerate(gen.var.blocks):
            attn, ffn = blk.attn, blk.ffn
            c, HC = attn.c, attn.H * attn.c
            for w in (attn.mat_qkv.weight, attn.proj.weight, ffn.fc1.weight, ffn.fc2.weight):
                w.zero_()
            attn.q_bias.copy_(torch.arange(HC) * 0.01)
            attn.v_bias.copy_(-torch.arange(HC) * 0.01)
            attn.scale_mul_1H11.copy_(torch.arange(4.0).view(1, 4, 1, 1))
            ffn.fc1.bias.copy_(torch.arange(4.0))
            for u in range(4):
                r = (u - b) % 4
                if r == 0:
                    attn.proj.weight[7, u * c + 3] = 3.0
                    ffn.fc2.weight[7, u] = 3.0
                elif r == 1:
                    attn.proj.weight[:100, u * c + 1] = 0.1
                    ffn.fc2.weight[:100, u] = 0.1
                elif r == 2:
                    attn.mat_qkv.weight[2 * HC + u * c + 5, 11] = 5.0   # a v row
                    ffn.fc1.weight[u, 11] = 5.0
                else:
                    attn.mat_qkv.weight[HC + u * c + 2, :] = 0.2          # a k row
                    ffn.fc1.weight[u, :] = 0.2
    return gen


@pytest.mark.parametrize("norm,scope,role", [("l1", "out", 1), ("l2", "out", 0), ("l1", "coupled", 3),
                                             ("l2", "coupled", 2)])
def test_magnitude_norm_and_scope_choose_different_units(norm, scope, role):
    import copy
    gen = _hand_built_gen()
    dense = copy.deepcopy(gen)
    pruned = build_method(f"magnitude:sparsity=0.75,norm={norm},scope={scope}").apply(gen, Context())
    assert pruned.var.cfg.heads == (1, 1) and pruned.var.cfg.ffn_hidden == (1, 1)
    for b, (d, p) in enumerate(zip(dense.var.blocks, pruned.var.blocks)):
        expected = (role + b) % 4   # the unit of block b that has this role
        assert _kept(d, p, "head") == [expected], (norm, scope, b)
        assert _kept(d, p, "channel") == [expected], (norm, scope, b)


@pytest.mark.parametrize("name", ["evar", "slimgpt"])
def test_the_log_schedule_note_appears_only_when_the_schedule_is_log(name):
    notes = lambda spec: [d for d in build_method(spec).deviations if d.startswith("schedule=log")]  # noqa: E731
    assert notes(f"{name}:schedule=log") and not notes(f"{name}:schedule=uniform")


def test_slimgpt_says_when_it_runs_without_its_incremental_pruning_ratio():
    """SlimGPT's default (uniform) drops one of its two named components: its footnote says so, and only then."""
    notes = lambda spec: [d for d in build_method(spec).deviations if d.startswith("schedule=uniform")]  # noqa: E731
    assert notes("slimgpt") == notes("slimgpt:schedule=uniform") and len(notes("slimgpt")) == 1
    assert "Incremental Pruning Ratio" in notes("slimgpt")[0] and not notes("slimgpt:schedule=log")
    assert [d for d in build_method("slimgpt:schedule=log").deviations if not d.startswith("schedule=")] == \
        [d for d in build_method("slimgpt").deviations if not d.startswith("schedule=")]


@pytest.mark.parametrize("name", ["evar", "slimgpt", "taylor", "llm-pruner", "oba"])
def test_structured_pruners_on_meta_keep_the_first_units_and_need_no_data(small_gen, name):
    """Weight-free accounting (``varbench info``): on the meta device only the sizes matter, so no
    calibration data are read (the context has none) and the first units are kept."""
    from bench.models.generator import Generator
    with torch.device("meta"):
        meta = Generator(type(small_gen.var)(small_gen.var.cfg), type(small_gen.vae)(small_gen.vae.cfg))
    out = build_method(f"{name}:sparsity=0.5").apply(meta, Context(progress=False))
    assert out.var.cfg.heads == (1, 1) and out.var.cfg.ffn_hidden == (256, 256) and out.device.type == "meta"


@pytest.mark.parametrize("name", ["evar", "slimgpt", "taylor", "llm-pruner", "oba", "magnitude"])
def test_sparsity_zero_reads_no_data_and_says_so(small_gen, name):
    def no_data(n, split):
        raise AssertionError("sparsity 0 must not calibrate")
    ctx = Context(progress=False, data=no_data)
    out = build_method(f"{name}:sparsity=0").apply(small_gen, ctx)
    assert out is small_gen and ctx.notes == [f"{name}: sparsity 0, model unchanged"]


def test_recovery_on_meta_is_skipped_by_the_chain(small_gen):
    """Training changes no size: a chain on the meta device skips recovery methods (which would need
    training data) and their notes."""
    from bench.models.generator import Generator
    with torch.device("meta"):
        meta = Generator(type(small_gen.var)(small_gen.var.cfg), type(small_gen.vae)(small_gen.vae.cfg))
    ctx = Context(progress=False)
    out = apply_chain(meta, ["magnitude:sparsity=0.5", "ft", "kd", "psad"], ctx)
    assert out.var.cfg.heads == (1, 1) and [n.split(":")[0] for n in ctx.notes] == ["magnitude"]
    with pytest.raises(ValueError, match="ft needs training data"):
        apply_chain(small_gen, ["ft"], Context(progress=False))
