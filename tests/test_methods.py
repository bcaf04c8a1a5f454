"""Method interface, parameter checking, structured pruning and fine-tuning on a small model."""
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
    with pytest.raises(ValueError, match="must be one of"):
        build_method("magnitude:norm=l3")
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
    build_method("ft:epochs=8,lr=0.003,batch=16").apply(small_gen, ctx)
    with torch.no_grad():
        after = small_gen.loss(labels, tokens).item()
    assert after < before * 0.7
    assert not small_gen.var.training
