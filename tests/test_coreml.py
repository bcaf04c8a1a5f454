"""Core ML export: the exported per-scale functions compute what the generator computes (checked in
PyTorch: eager and traced export modules against the generator, since the Core ML runtime only
exists on macOS), the constant interpolation matrices equal F.interpolate, and a saved package has
the same op graph after pruning with smaller weights."""
import json

import pytest
import torch
import torch.nn.functional as F

from bench.coreml import Decode, ScaleStep, example_inputs, interp_matrix, steps

pytestmark = pytest.mark.usefixtures("one_thread")
ct = pytest.importorskip("coremltools")


@pytest.mark.parametrize("src, dst, mode", [(1, 8, "bicubic"), (3, 8, "bicubic"), (5, 16, "bicubic"),
                                            (8, 3, "area"), (16, 13, "area"), (8, 8, "area")])
def test_interpolation_matrices_are_the_interpolate_maps(src, dst, mode):
    h = torch.randn(2, 4, src, src, generator=torch.Generator().manual_seed(src))
    want = F.interpolate(h, size=(dst, dst), mode=mode)
    got = (h.flatten(2) @ interp_matrix(src, dst, mode).T).view(2, 4, dst, dst)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def _run_chain(mods, labels, toks):
    """Call the export modules scale by scale, carrying the states as Core ML would."""
    out, prev = [], None
    for si in range(len(toks)):
        m = mods[f"scale_{si}"]
        if prev is not None:
            for n, b in prev.named_buffers():
                if n.startswith(("k_cache_", "v_cache_", "f_hat")):
                    getattr(m, n).copy_(b)
        out.append(m(labels) if si == 0 else m(labels, toks[si - 1]))
        prev = m
    d = mods["decode"]
    d.f_hat.copy_(prev.f_hat)
    return out, d(toks[-1])


@torch.no_grad()
def test_export_functions_reproduce_the_generator_scale_by_scale(small_gen):
    labels = torch.tensor([2, 0])
    logits = []
    toks, f_hat = small_gen.sample_tokens(labels, seed=4, cfg=1.5, top_k=20, top_p=0.9,
                                          logits_hook=lambda si, lg: logits.append(lg.clone()))
    got, img = _run_chain(steps(small_gen, batch=2), labels, toks)
    for si, (a, b) in enumerate(zip(got, logits)):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=f"scale {si}")
    torch.testing.assert_close(img, small_gen.vae.fhat_to_img(f_hat), atol=1e-5, rtol=1e-5)
    # a wrong token at one scale changes every later scale's logits (the tokens are really used)
    bad = [t.clone() for t in toks]
    bad[1][0, 0] = (bad[1][0, 0] + 1) % small_gen.var.V
    got_bad, _ = _run_chain(steps(small_gen, batch=2), labels, bad)
    assert torch.equal(got_bad[1], got[1]) and not torch.allclose(got_bad[2], got[2])


@torch.no_grad()
def test_traced_functions_equal_eager(small_gen):
    """What ct.convert receives (the trace) computes what the eager module does."""
    for name in ("scale_0", "scale_2", "decode"):
        mod = ScaleStep(small_gen, int(name[-1]), 1) if name != "decode" else Decode(small_gen, 1)
        ex = example_inputs(small_gen, name, 1)
        ex = tuple(torch.randint_like(t, 0, small_gen.var.V) if i > 0 or name == "decode" else t
                   for i, t in enumerate(ex))
        for n, b in mod.named_buffers():
            if n.startswith(("k_cache_", "v_cache_", "f_hat")):
                b.normal_(generator=torch.Generator().manual_seed(len(n)))
        state = {n: b.clone() for n, b in mod.named_buffers()}
        eager = mod(*ex)
        for n, b in mod.named_buffers():
            b.copy_(state[n])
        traced = torch.jit.trace(mod, ex, check_trace=False)
        for n, b in mod.named_buffers():
            b.copy_(state[n])
        assert torch.equal(traced(*ex), eager)


def _pruned(gen):
    from bench.method import Context, apply_chain
    return apply_chain(gen, ["magnitude:sparsity=0.5"], Context(progress=False))


def test_export_and_op_counts_dense_and_pruned(small_gen, tmp_path):
    """A pruned model exports to the same op graph (per function, per op type) with smaller weights."""
    from bench.coreml import export, op_counts, weights_bytes
    dense = export(small_gen, tmp_path / "dense.mlpackage", progress=False, metadata={"model": "small"})
    pruned = export(_pruned(small_gen), tmp_path / "pruned.mlpackage", progress=False)
    a, b = op_counts(dense), op_counts(pruned)
    K = len(small_gen.patch_nums)
    assert set(a) == {f"scale_{i}" for i in range(K)} | {"decode"}
    assert a == b
    for si in range(K):   # one fused attention op and one cache write per block and scale
        assert a[f"scale_{si}"]["scaled_dot_product_attention"] == len(small_gen.var.blocks)
        assert "softmax" not in a[f"scale_{si}"]
        assert a[f"scale_{si}"]["write_state"] == 2 * len(small_gen.var.blocks) + (si > 0)
    assert weights_bytes(pruned) < weights_bytes(dense)
    assert json.loads((dense / "varbench.json").read_text()) == {"model": "small"}
    spec = ct.utils.load_spec(str(dense))
    names = [i.name for i in spec.mlProgram.functions["scale_1"].inputs]   # inputs, then the states
    assert names[:2] == ["label", "idx_prev"]
    assert set(names[2:]) == {"k_cache_0", "v_cache_0", "k_cache_1", "v_cache_1", "f_hat"}


def test_cli_ops_and_bad_input(small_gen, tmp_path, capsys):
    from bench.cli import main
    from bench.coreml import export
    pkg = export(small_gen, tmp_path / "m.mlpackage", progress=False)
    assert main(["coreml", "ops", str(pkg), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["weights_bytes"] > 0 and out["functions"]["scale_0"]["linear"] > 0
    assert main(["coreml", "ops", str(pkg)]) == 0
    text = capsys.readouterr().out
    assert "ops (without const)" in text and "scale_0" in text
    assert main(["coreml", "ops", str(tmp_path / "nope.mlpackage")]) == 2
    assert "no such Core ML package" in capsys.readouterr().err
    assert main(["coreml", "export", "tiny-var", "--out", str(tmp_path / "x.zip")]) == 2
    assert "must end in .mlpackage" in capsys.readouterr().err
    assert main(["coreml", "export", "tiny-vr", "--out", str(tmp_path / "x.mlpackage")]) == 2
    assert "did you mean" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_exports_tiny_var_dense_and_pruned(tmp_path, capsys):
    from bench.cli import main
    from bench.coreml import op_counts, weights_bytes
    for name, extra in (("dense", []), ("pruned", ["--method", "magnitude:sparsity=0.4"])):
        assert main(["coreml", "export", "tiny-var", "--out", str(tmp_path / f"{name}.mlpackage"), "--quiet",
                     *extra]) == 0
    assert "wrote" in capsys.readouterr().out
    assert op_counts(tmp_path / "dense.mlpackage") == op_counts(tmp_path / "pruned.mlpackage")
    assert weights_bytes(tmp_path / "pruned.mlpackage") < weights_bytes(tmp_path / "dense.mlpackage")
