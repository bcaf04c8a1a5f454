"""Exact parameter counts of the official configs and FLOPs that follow the token schedule."""
import json

import pytest
import torch

from bench.accounting import count_params, sampling_flops
from bench.cli import main
from bench.models.generator import Generator
from bench.models.var import VAR
from bench.models.vqvae import VQVAE
from bench.registry import MODELS
from tests.conftest import SMALL_VAE, SMALL_VAR


@pytest.mark.parametrize("name,params", [("var-d16", 310_283_520), ("var-d20", 600_917_136),
                                         ("var-d24", 1_033_399_360), ("var-d30", 2_010_020_356)])
def test_official_parameter_counts(name, params):
    gen = MODELS.get(name).build(device="meta")
    assert count_params(gen.var) == params
    assert count_params(gen.vae) == 108_948_355


def test_info_json_contract(capsys):
    assert main(["info", "var-d16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "var-d16" and out["params"] == 310_283_520
    assert out["tokenizer_params"] == 108_948_355
    assert out["tokens_per_scale"] == [1, 4, 9, 16, 25, 36, 64, 100, 169, 256]
    assert out["flops"] > 1.99 * out["flops_no_cfg"]
    assert 299e9 < out["flops_no_cfg"] < 302e9   # reference §5: ≈300 GFLOPs without CFG
    # keys and values of all 680 tokens, 2 CFG rows, 16 blocks of width 1024
    assert out["kv_cache_values"] == 2 * 2 * 680 * 1024 * 16


def test_kv_cache_holds_only_the_tokens_a_token_method_computes(capsys):
    """FastVAR's var schedule keeps 50 % of 13² and 25 % of 16² in every block: the rest are not cached."""
    kept = 680 - 84 - 192   # int(L·r) dropped at each pruned scale: int(169·0.5), int(256·0.75)
    assert 2 * 2 * kept * 1024 * 16 == 26_476_544
    assert main(["info", "var-d16", "--method", "fastvar"]) == 0
    assert "KV cache (CFG)          26,476,544 values: 0.053 GB in bf16, 0.106 GB in fp32" in capsys.readouterr().out


def _analytic_flops(cfg, vae_cfg, rows):
    """2·MNK for every matmul of the sampling loop, written out from the architecture."""
    C, V, Cv, pns = cfg.width, cfg.vocab_size, cfg.Cvae, cfg.patch_nums
    F, HW, total, ctx = 4 * C, pns[-1], 0, 0
    for si, pn in enumerate(pns):
        l = pn * pn
        ctx += l
        per_block = 2 * l * C * (3 * C + C + 2 * F) + 2 * 2 * l * ctx * C + 2 * C * 6 * C
        total += rows * cfg.depth * per_block
        total += rows * (2 * l * C * V + 2 * C * 2 * C)                # head + head AdaLN
        total += 2 * HW * HW * Cv * Cv * 9 * (rows // (2 if rows > 1 else 1))  # φ conv on f_hat
        if si != len(pns) - 1:
            total += (rows // (2 if rows > 1 else 1)) * 2 * pns[si + 1] ** 2 * Cv * C  # word_embed
    return total


def test_flops_follow_the_token_schedule():
    for pns in [(1, 2, 3, 4, 8), (1, 2, 4, 8), (1, 8)]:
        cfg = SMALL_VAR.replace(patch_nums=pns)
        vcfg = SMALL_VAE.__class__(**{**SMALL_VAE.to_dict(), "patch_nums": pns})
        with torch.device("meta"):
            gen = Generator(VAR(cfg), VQVAE(vcfg))
        assert sampling_flops(gen, cfg=None) == _analytic_flops(cfg, vcfg, rows=1)
        assert sampling_flops(gen, cfg=1.5) == _analytic_flops(cfg, vcfg, rows=2)


def test_more_tokens_more_flops():
    flops = []
    for pns in [(1, 8), (1, 2, 4, 8), (1, 2, 3, 4, 8), (1, 2, 3, 4, 6, 8)]:
        vcfg = SMALL_VAE.__class__(**{**SMALL_VAE.to_dict(), "patch_nums": pns})
        with torch.device("meta"):
            flops.append(sampling_flops(Generator(VAR(SMALL_VAR.replace(patch_nums=pns)), VQVAE(vcfg)), cfg=None))
    assert flops == sorted(flops) and len(set(flops)) == len(flops)


def test_info_with_a_structural_method_matches_the_paper_sizes(capsys):
    """EVAR: VAR-d16 at 40% sparsity has 230M parameters, through the CLI (every method at 20 % and 40 %:
    test_every_pruning_method_gives_the_paper_sizes_without_weights)."""
    assert main(["info", "var-d16", "--method", "magnitude:sparsity=0.4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert abs(out["params"] - 230e6) / 230e6 < 0.01
    assert out["heads"][0] == 16 - round(16 * 0.4) and out["methods"] == ["magnitude:sparsity=0.4"]


WEIGHT_METHODS = [m for m in __import__("bench.registry", fromlist=["METHODS"]).METHODS.names()
                  if m != "dense" and __import__("bench.registry", fromlist=["METHODS"]).METHODS.meta(m)["kind"] == "weights"]


@pytest.mark.parametrize("method", WEIGHT_METHODS)
def test_every_pruning_method_gives_the_paper_sizes_without_weights(method):
    """EVAR Tab. 1: VAR-d16 310M -> 270M (20%) / 230M (40%) within 1%; VAR-d24 1.0B -> 875M / 748M
    within 3% (the difference is explained in the table-1 footnote). Sizes-only pruning on the meta device."""
    from bench.method import Context, apply_chain
    for model, s, paper, tol in (("var-d16", 0.4, 230e6, 0.01), ("var-d16", 0.2, 270e6, 0.01),
                                 ("var-d24", 0.4, 748e6, 0.03), ("var-d24", 0.2, 875e6, 0.03)):
        gen = apply_chain(MODELS.get(model).build(device="meta"), [f"{method}:sparsity={s}"], Context(progress=False))
        assert abs(count_params(gen.var) - paper) / paper < tol, (model, s, count_params(gen.var))
        H = gen.var.cfg.num_heads
        assert gen.var.cfg.heads == (H - round(H * s),) * gen.var.cfg.depth


def test_log_schedule_keeps_the_mean_sparsity_without_weights():
    from bench.method import Context, apply_chain
    gen = apply_chain(MODELS.get("var-d16").build(device="meta"), ["magnitude:sparsity=0.4,schedule=log"],
                      Context(progress=False))
    heads = gen.var.cfg.heads
    assert heads[0] == 16 and list(heads) == sorted(heads, reverse=True) and heads[-1] < 16 - round(16 * 0.4)
    assert abs(count_params(gen.var) - 230e6) / 230e6 < 0.02


class _Calls(torch.utils._python_dispatch.TorchDispatchMode):
    """Below the memo: the ops whose meta kernel really runs."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_meta_memo_runs_each_distinct_kernel_once_and_rebuilds_its_outputs():
    from bench.accounting import MetaMemo
    x = torch.empty(2, 3, 4, device="meta").permute(0, 2, 1)   # non-contiguous: outputs follow its strides
    w = torch.empty(2, 4, 3, device="meta")                      # same shape, contiguous
    with _Calls() as calls, MetaMemo():
        a = [x.mul(2), torch.native_layer_norm(x, (3,), None, None, 1e-6), x.mul(2.0), x.mul(2), w.mul(2)]
        y = x.clone()
        assert y.add_(1) is y and y.add_(1) is y   # in place: always runs (and returns its own tensor)
        z = torch.empty(1, device="cpu").mul(2)   # real tensors: always run
    assert calls.ops.count("aten.mul.Tensor") == 4 and calls.ops.count("aten.native_layer_norm.default") == 1
    assert calls.ops.count("aten.add_.Tensor") == 2 and z.device.type == "cpu"
    first, again = a[0], a[3]
    assert again is not first and again.shape == first.shape and again.stride() == first.stride() == x.stride()
    assert a[4].stride() == w.stride() != x.stride()
    assert a[2].dtype == a[0].dtype == torch.float32
    out, mean, rstd = a[1]
    assert out.shape == (2, 4, 3) and mean.shape == rstd.shape == (2, 4, 1)


@pytest.mark.parametrize("chain", [[], ["fastvar"], ["lazyvar"], ["stepvar"], ["tome"], ["magnitude:sparsity=0.4"]])
def test_the_memo_changes_no_count(chain, monkeypatch):
    """Every total and per-scale share of a memoised count equals the plain counter's."""
    import contextlib

    from torch.utils.flop_counter import FlopCounterMode

    from bench import accounting
    from bench.method import Context, apply_chain
    gen = apply_chain(MODELS.get("tiny-var").build(device="meta"), chain, Context(progress=False))
    memo = accounting._per_scale_flops(gen, 1.5, 900, 0.96), accounting.decode_flops(gen)

    @contextlib.contextmanager
    def plain():
        with FlopCounterMode(display=False) as fc:
            yield fc

    monkeypatch.setattr(accounting, "counting", plain)
    assert (accounting._per_scale_flops(gen, 1.5, 900, 0.96), accounting.decode_flops(gen)) == memo
