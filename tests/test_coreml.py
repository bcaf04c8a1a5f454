"""Core ML export: the exported per-scale functions compute what the generator computes (checked in
PyTorch: eager and traced export modules against the generator, since the Core ML runtime only
exists on macOS), the constant interpolation matrices equal F.interpolate, and a saved package has
the same op graph after pruning with smaller weights."""
import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bench.coreml import Decode, ScaleStep, example_inputs, interp_matrix, steps
from tests.conftest import make_small_gen

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
    """Call the export modules scale by scale; they share one set of states, as the package's
    functions share Core ML's state."""
    out = [mods["scale_0"](labels)] + [mods[f"scale_{si}"](labels, toks[si - 1]) for si in range(1, len(toks))]
    return out, mods["decode"](toks[-1])


def test_functions_share_one_set_of_states(small_gen):
    mods = steps(small_gen, batch=1)
    ptr = {n: b.data_ptr() for n, b in mods["scale_1"].named_buffers() if n.startswith(("k_cache", "f_hat"))}
    for m in mods.values():
        for n, b in m.named_buffers():
            if n in ptr:
                assert b.data_ptr() == ptr[n], n
    assert mods["scale_0"].k_cache_0.shape[2] % 32 == 0 >= small_gen.var.L - mods["scale_0"].k_cache_0.shape[2]


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


@pytest.fixture(scope="module")
def dense_package(one_thread, tmp_path_factory) -> Path:
    """The small generator exported once for the module's package tests (an export takes ~13 s)."""
    from bench.coreml import export
    return export(make_small_gen(), tmp_path_factory.mktemp("coreml") / "dense.mlpackage", progress=False,
                  metadata={"model": "small"})


def test_export_and_op_counts_dense_and_pruned(small_gen, dense_package, tmp_path):
    """A pruned model exports to the same op graph (per function, per op type) with smaller weights."""
    from bench.coreml import export, op_counts, weights_bytes
    dense = dense_package
    pruned = export(_pruned(small_gen), tmp_path / "pruned.mlpackage", progress=False)
    a, b = op_counts(dense), op_counts(pruned)
    K = len(small_gen.patch_nums)
    assert set(a) == {f"scale_{i}" for i in range(K)} | {"decode"}
    assert a == b
    for si in range(K):   # one fused attention op and one cache write per block and scale
        assert a[f"scale_{si}"]["scaled_dot_product_attention"] == len(small_gen.var.blocks)
        assert "softmax" not in a[f"scale_{si}"]
        assert a[f"scale_{si}"]["write_state"] == 2 * len(small_gen.var.blocks) + 1   # caches, f_hat (scale 0: cleared)
    assert a["decode"]["write_state"] == 2 * len(small_gen.var.blocks) + 1            # the caches' padding, f_hat
    assert weights_bytes(pruned) < weights_bytes(dense)
    assert json.loads((dense / "varbench.json").read_text()) == {"model": "small"}
    spec = ct.utils.load_spec(str(dense))
    names = [i.name for i in spec.mlProgram.functions["scale_1"].inputs]   # inputs, then the states
    assert names[:2] == ["label", "idx_prev"]
    states = {"k_cache_0", "v_cache_0", "k_cache_1", "v_cache_1", "f_hat"}
    assert set(names[2:]) == states
    for fn, n_inputs in [("scale_0", 1), ("decode", 1)] + [(f"scale_{si}", 2) for si in range(1, K)]:
        assert {i.name for i in spec.mlProgram.functions[fn].inputs[n_inputs:]} == states, fn   # the same states


def test_a_failed_export_keeps_the_package_it_would_replace(small_gen, dense_package, tmp_path, monkeypatch):
    """The new package replaces an existing one only once it is complete: a failure while moving it in
    leaves the old package as it was, and a success leaves no set-aside copy."""
    import bench.coreml as cm
    out = tmp_path / "p.mlpackage"
    shutil.copytree(dense_package, out)

    real = cm.os.replace

    def broken(src, dst):
        if Path(src).name == "new.mlpackage":   # moving the new package in fails
            raise OSError("disk full")
        real(src, dst)
    monkeypatch.setattr(cm.os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        cm.export(small_gen, out, progress=False, metadata={"model": "new"})
    assert json.loads((out / "varbench.json").read_text()) == {"model": "small"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.mlpackage"]
    monkeypatch.undo()
    cm.export(small_gen, out, progress=False, metadata={"model": "new"})
    assert json.loads((out / "varbench.json").read_text()) == {"model": "new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.mlpackage"]


def test_cli_ops_and_bad_input(dense_package, tmp_path, capsys):
    from bench.cli import main
    pkg = dense_package
    assert main(["coreml", "ops", str(pkg), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["weights_bytes"] > 0 and out["functions"]["scale_0"]["linear"] > 0
    assert main(["coreml", "ops", str(pkg)]) == 0
    text = capsys.readouterr().out
    assert "ops (without const)" in text and "scale_0" in text
    assert main(["coreml", "ops", str(tmp_path / "nope.mlpackage")]) == 2
    assert "no such Core ML package" in capsys.readouterr().err
    # a folder without a manifest, and a file that is not a Core ML spec: named, no traceback
    (tmp_path / "empty.mlpackage").mkdir()
    (tmp_path / "text.mlmodel").write_text("not a model\n")
    for bad, why in [("empty.mlpackage", "Manifest.json"), ("text.mlmodel", "DecodeError")]:
        assert main(["coreml", "ops", str(tmp_path / bad)]) == 2
        err = capsys.readouterr().err
        assert f"{tmp_path / bad}: not a readable Core ML package" in err and why in err, err
        assert "varbench coreml export" in err
    assert main(["coreml", "export", "tiny-var", "--out", str(tmp_path / "x.zip")]) == 2
    assert "must end in .mlpackage" in capsys.readouterr().err
    assert main(["coreml", "export", "tiny-vr", "--out", str(tmp_path / "x.mlpackage")]) == 2
    assert "did you mean" in capsys.readouterr().err
    # refused before any model work (runner.prepared_generator would load and prune first)
    import bench.runner
    monkey = pytest.MonkeyPatch()
    monkey.setattr(bench.runner, "prepared_generator", lambda *a, **k: pytest.fail("the chain ran"))
    try:
        (tmp_path / "afile").write_text("x")
        (tmp_path / "f.mlpackage").write_text("x")
        for argv, err in [
                (["--method", "evar:sparsity=0.4 + fastvar", "--random-weights", "--out", str(tmp_path / "y.mlpackage")],
                 "varbench: error: Core ML export of a token method (fastvar) is not supported: the package's per-scale "
                 "functions compute every token; export the chain without it\n"),
                (["--out", str(tmp_path / "afile" / "y.mlpackage")],
                 f"varbench: error: --out {tmp_path / 'afile' / 'y.mlpackage'}: its folder {tmp_path / 'afile'}: "
                 f"{tmp_path / 'afile'} is a file, not a folder\n"),
                (["--out", str(tmp_path / "f.mlpackage")],
                 f"varbench: error: --out {tmp_path / 'f.mlpackage'} is a file, not a Core ML package (a folder); give "
                 f"another path\n")]:
            assert main(["coreml", "export", "tiny-var", *argv]) == 2
            assert capsys.readouterr().err == err
    finally:
        monkey.undo()


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


# ---------------------------------------------------------------- macOS paths, with the runtime faked
class _FakeState:
    def __init__(self, shapes):
        self.buffers = {n: torch.zeros(s) for n, s in shapes.items()}


class _FakeFunction:
    """Stands in for ``ct.models.MLModel(pkg, compute_units, function_name)``: runs the PyTorch export
    module of that function on the feeds, reading and writing the shared state as Core ML would."""

    def __init__(self, mods, name, calls):
        self.mods, self.name, self.calls = mods, name, calls

    def make_state(self):
        """The calling function's states only (as ``MLModel.make_state`` of one function): a host loop
        that needed another function's state would fail here."""
        self.calls.append(("make_state", self.name))
        return _FakeState(self.mods[self.name].state_shapes())

    @torch.no_grad()
    def predict(self, feed, state):
        import numpy as np
        m = self.mods[self.name]
        self.calls.append(("predict", self.name))
        missing = set(m.state_shapes()) - set(state.buffers)
        if missing:
            raise RuntimeError(f"{self.name}: the state lacks {sorted(missing)}")
        for n in m.state_shapes():
            getattr(m, n).copy_(state.buffers[n])
        args = [torch.from_numpy(np.asarray(feed[k])) for k in (("label", "idx_prev") if self.name != "decode" else ("idx_last",))
                if k in feed]
        out = m(*args)
        for n in m.state_shapes():
            state.buffers[n].copy_(getattr(m, n))
        return {"image" if self.name == "decode" else "logits": out.numpy()}


def test_coreml_generator_host_loop_equals_the_pytorch_generator(small_gen, monkeypatch):
    import bench.coreml as cm
    calls = []
    mods = steps(small_gen, batch=2)
    monkeypatch.setattr(cm.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(cm, "_mlmodel", lambda pkg, cu, fn: _FakeFunction(mods, fn, calls))
    g = cm.CoreMLGenerator("unused.mlpackage", "CPU_AND_GPU", small_gen.patch_nums, 5)
    labels = torch.tensor([1, 3])
    kw = dict(cfg=1.5, top_k=20, top_p=0.9)
    toks, _ = g.sample_tokens(labels, seed=9, **kw)
    ref, _ = small_gen.sample_tokens(labels, seed=9, **kw)
    assert all(torch.equal(a, b) for a, b in zip(toks, ref))
    calls.clear()
    img = g.generate(labels, seed=9, **kw)
    K = len(small_gen.patch_nums)
    assert calls == [("make_state", "scale_0")] + [("predict", f"scale_{i}") for i in range(K)] + [("predict", "decode")]
    want = small_gen.generate(labels, seed=9, **kw)
    assert img.dtype == torch.uint8 and (img.int() - want.int()).abs().max() <= 1
    with pytest.raises(ValueError, match="compute units 'GPU'"):
        cm.CoreMLGenerator("x", "GPU", small_gen.patch_nums, 5)
    with pytest.raises(ValueError, match="cfg=None"):
        g.sample_tokens(labels, seed=0, cfg=None)


class _Dev:
    pass


def _device(name):
    return type(name, (_Dev,), {})()


def test_placement_counts_each_non_const_op_on_its_preferred_device(monkeypatch):
    import types

    import bench.coreml as cm

    def op(name, blocks=()):
        return types.SimpleNamespace(operator_name=name, blocks=list(blocks))

    inner = types.SimpleNamespace(operations=[op("ios18.mul")])
    fn = types.SimpleNamespace(block=types.SimpleNamespace(operations=[
        op("ios18.const"), op("ios18.linear"), op("ios18.scaled_dot_product_attention"), op("ios18.gelu"),
        op("ios18.cond", [inner]), op("ios18.read_state")]))
    # decode: a const without an opset prefix (skipped too), a device the plan names that we do not know
    fn2 = types.SimpleNamespace(block=types.SimpleNamespace(operations=[op("const"), op("ios18.add"), op("ios18.sub")]))
    where = {"ios18.linear": "MLNeuralEngineComputeDevice", "ios18.scaled_dot_product_attention": "MLGPUComputeDevice",
             "ios18.gelu": "MLCPUComputeDevice", "ios18.mul": "MLNeuralEngineComputeDevice", "ios18.cond": "MLCPUComputeDevice",
             "ios18.add": "MLFutureComputeDevice", "ios18.sub": "MLCPUComputeDevice"}

    class Plan:
        model_structure = types.SimpleNamespace(program=types.SimpleNamespace(functions={"scale_0": fn, "decode": fn2}))

        def get_compute_device_usage_for_mlprogram_operation(self, o):
            assert o.operator_name not in ("ios18.const", "const")
            d = where.get(o.operator_name)
            return None if d is None else types.SimpleNamespace(preferred_compute_device=_device(d))

    asked = []
    monkeypatch.setattr(cm.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(cm, "_compute_plan", lambda pkg, cu: asked.append(cu) or Plan())
    got = cm.placement("p.mlpackage", "ALL")
    assert got == {"scale_0": {"cpu": 2, "gpu": 1, "npu": 2, "none": 1},
                   "decode": {"cpu": 1, "gpu": 0, "npu": 0, "none": 0, "other": 1}}
    assert list(got) == ["decode", "scale_0"]
    assert asked == ["ALL"]


def test_macos_only_paths_say_so_elsewhere(monkeypatch):
    import bench.coreml as cm
    monkeypatch.setattr(cm.platform, "system", lambda: "Linux")
    for call in (lambda: cm.placement("p", "ALL"), lambda: cm.CoreMLGenerator("p", "ALL", (1, 2), 5)):
        with pytest.raises(ValueError, match="macOS only .* `varbench coreml export`"):
            call()


@pytest.mark.slow
def test_latency_cli_on_coreml_with_the_runtime_faked(tmp_path, capsys, monkeypatch):
    """`varbench latency --device coreml` end to end (real export, real host loop, records), with only
    the Core ML runtime calls (MLModel, MLComputePlan) replaced by PyTorch stand-ins."""
    import types

    import bench.coreml as cm
    from bench.cli import main
    from bench.method import Context, apply_chain
    from bench.records import read_record
    from bench.registry import MODELS
    calls = []

    def fake_mlmodel(pkg, cu, fn):
        meta = json.loads((Path(pkg) / "varbench.json").read_text())
        gen = apply_chain(MODELS.get(meta["model"])(), meta["methods"], Context(progress=False))
        return _FakeFunction(steps(gen, 1), fn, calls)

    class Plan:
        def __init__(self, pkg):
            self.pkg = pkg
            fns = {n: types.SimpleNamespace(block=types.SimpleNamespace(operations=[
                types.SimpleNamespace(operator_name="ios18.linear", blocks=[])] * 3)) for n in ("scale_0", "decode")}
            self.model_structure = types.SimpleNamespace(program=types.SimpleNamespace(functions=fns))

        def get_compute_device_usage_for_mlprogram_operation(self, o):
            return types.SimpleNamespace(preferred_compute_device=_device("MLGPUComputeDevice"))

    monkeypatch.setattr(cm.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(cm, "_mlmodel", fake_mlmodel)
    monkeypatch.setattr(cm, "_compute_plan", lambda pkg, cu: Plan(pkg))
    argv = ["latency", "--model", "tiny-var", "--device", "coreml", "--compute-units", "ALL", "--compute-units",
            "CPU_AND_GPU", "--method", "dense", "--method", "magnitude:sparsity=0.4", "--reps", "3", "--warmup", "1",
            "--quiet", "--results", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "dense @ ALL" in out and "magnitude:sparsity=0.4 @ CPU_AND_GPU" in out and "GPU 6" in out
    recs = [read_record(p) for p in tmp_path.glob("tiny/tiny-var/latency/*.json")]
    assert len(recs) == 4
    for r in recs:
        p = r["spec"]["protocol"]
        assert p["device"] == "coreml" and p["compute_units"] in ("ALL", "CPU_AND_GPU") and p["precision"] == "fp16"
        assert r["cost"]["ops_gpu"] == 6 and r["cost"]["ops_cpu"] == 0 and r["metrics"]["latency_ms"]["value"] > 0
        assert "scale_0" in r["cost"]["package_ops_by_function"] and r["cost"]["package_ops"] > 100
        assert r["timings"]["export_s"] > 0


def test_export_refuses_a_token_method(small_gen, tmp_path):
    """The package computes every token: a token method would be dropped silently, so it is refused."""
    from bench.coreml import export
    from bench.method import Context, apply_chain
    gen = apply_chain(small_gen, ["fastvar"], Context(progress=False))
    with pytest.raises(ValueError, match="token method \\(fastvar\\)"):
        export(gen, tmp_path / "x.mlpackage", progress=False)
    assert not (tmp_path / "x.mlpackage").exists()


def test_a_fresh_process_prints_only_the_error_off_macos(tmp_path):
    """coremltools logs "Failed to load _MLModelAssetProxy" at import where there is no Core ML runtime
    (Linux): by design there, so the command's stderr holds the error alone."""
    import subprocess
    import sys
    if sys.platform == "darwin":
        pytest.skip("on macOS the runtime's load failure stays visible")
    out = subprocess.run([sys.executable, "-m", "bench", "coreml", "ops", str(tmp_path / "nope.mlpackage")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        f"varbench: error: {tmp_path / 'nope.mlpackage'}: no such Core ML package"], out.stderr


@pytest.mark.parametrize("L, padded", [(1, 32), (31, 32), (32, 64), (33, 64), (680, 704), (2240, 2272)])
def test_state_caches_are_padded_to_the_next_multiple_of_32_above_the_tokens(L, padded):
    from types import SimpleNamespace as NS

    from bench.coreml import init_states
    blocks = [NS(attn=NS(H=2, c=4)), NS(attn=NS(H=1, c=8))]
    gen = NS(var=NS(L=L, blocks=blocks, Cvae=3), patch_nums=(1, 5))
    states = init_states(gen, batch=2)
    assert {k: tuple(v.shape) for k, v in states.items()} == {
        "k_cache_0": (4, 2, padded, 4), "v_cache_0": (4, 2, padded, 4),
        "k_cache_1": (4, 1, padded, 8), "v_cache_1": (4, 1, padded, 8), "f_hat": (2, 3, 5, 5)}
    assert all(not v.any() for v in states.values())


def test_every_function_declares_and_uses_every_state_and_keeps_its_constants_out_of_the_weights(small_gen):
    """One state made from any function serves the whole generation, and Core ML refuses a declared state
    a function does not use: scale 0 clears f_hat, decode clears the caches' padding (never read)."""
    mods = steps(small_gen, batch=1)
    states = {f"{kv}_cache_{i}" for kv in "kv" for i in range(len(small_gen.var.blocks))} | {"f_hat"}
    for name, m in mods.items():
        assert set(m.state_shapes()) == states, name
    assert mods["decode"].state_shapes()["f_hat"] == (1, small_gen.var.Cvae, 8, 8)
    assert not any(n.startswith(("up_", "down")) for n, _ in mods["scale_0"].named_buffers())   # scale 0 resizes nothing
    for si in range(1, len(small_gen.patch_nums)):
        m = mods[f"scale_{si}"]
        assert {n for n, _ in m.named_buffers() if n.startswith(("up_", "down"))} == {f"up_{si - 1}", "down"}
        assert not any(k.startswith(("up_", "down")) for k in m.state_dict())
    L = small_gen.var.L
    with torch.no_grad():
        for t in (mods["decode"].k_cache_0, mods["decode"].f_hat):   # the modules share the state tensors
            t.fill_(7.0)
        mods["scale_0"](torch.zeros(1, dtype=torch.int32))
        assert not mods["scale_0"].f_hat.any()
        k = mods["decode"].k_cache_0
        k.fill_(7.0)
        mods["decode"](torch.zeros(1, 64, dtype=torch.int32))
        assert k.shape[2] > L and not k[:, :, L].any() and (k[:, :, :L] == 7.0).all() and (k[:, :, L + 1:] == 7.0).all()


def test_the_macos_and_compute_unit_messages_in_full(monkeypatch):
    import bench.coreml as cm
    monkeypatch.setattr(cm.platform, "system", lambda: "Linux")
    with pytest.raises(ValueError) as e:
        cm.placement("p.mlpackage", "ALL")
    assert str(e.value) == ("op placement (MLComputePlan) runs on macOS only (the Core ML runtime is not on Linux); "
                            "here `varbench coreml export` and `varbench coreml ops` work")
    monkeypatch.setattr(cm.platform, "system", lambda: "Darwin")
    cm.require_macos("anything")   # on a Mac: nothing to say
    for version, ok in (("15.0", True), ("26.1", True), ("14.6.1", False), ("", True)):   # "": not known, not refused
        monkeypatch.setattr(cm.platform, "mac_ver", lambda v=version: (v, ("", "", ""), "arm64"))
        if ok:
            cm.require_macos("anything")
        else:
            with pytest.raises(ValueError) as e:
                cm.require_macos("Core ML inference")
            assert str(e.value) == ("Core ML inference needs macOS 15 or later (the package's states and functions "
                                    "target macOS 15); this Mac runs macOS 14.6.1")
    assert set(cm.COMPUTE_UNITS) == {"CPU_AND_NE", "ALL", "CPU_AND_GPU", "CPU_ONLY"}
    with pytest.raises(ValueError) as e:
        cm.check_compute_units("GPU")
    assert str(e.value) == f"compute units 'GPU': expected one of {', '.join(cm.COMPUTE_UNITS)}"
    assert all(cm.check_compute_units(cu) == cu for cu in cm.COMPUTE_UNITS)
    with pytest.raises(ValueError, match="compute units 'GPU'"):   # checked before the runtime is asked
        cm.placement("p.mlpackage", "GPU")


def test_example_inputs_are_the_tokens_each_function_takes(small_gen):
    pns = small_gen.patch_nums
    shapes = {n: [(tuple(t.shape), t.dtype) for t in example_inputs(small_gen, n, batch=3)]
              for n in [f"scale_{si}" for si in range(len(pns))] + ["decode"]}
    i32 = torch.int32
    assert shapes["scale_0"] == [((3,), i32)]
    for si in range(1, len(pns)):
        assert shapes[f"scale_{si}"] == [((3,), i32), ((3, pns[si - 1] ** 2), i32)]
    assert shapes["decode"] == [((3, pns[-1] ** 2), i32)]
    assert all(not t.any() for t in example_inputs(small_gen, "scale_2", 2))


@torch.no_grad()
def test_a_second_generation_on_the_same_states_needs_no_reset(small_gen):
    """scale_1 overwrites f_hat instead of adding to it: the package's states are not zeroed between
    generations, and a second run must not add to the first one's latent."""
    labels = torch.tensor([1])
    toks, _ = small_gen.sample_tokens(labels, seed=2, cfg=1.5, top_k=20, top_p=0.9)
    mods = steps(small_gen, batch=1)
    first, img1 = _run_chain(mods, labels, toks)
    second, img2 = _run_chain(mods, labels, toks)
    assert all(torch.equal(a, b) for a, b in zip(first, second)) and torch.equal(img1, img2)


def test_coreml_generator_refusals_load_time_and_hook(small_gen, monkeypatch):
    import time as _time

    import bench.coreml as cm
    monkeypatch.setattr(cm.platform, "system", lambda: "Linux")
    with pytest.raises(ValueError) as e:
        cm.CoreMLGenerator("p.mlpackage", "ALL", small_gen.patch_nums, 5)
    assert str(e.value).startswith("Core ML inference runs on macOS only (the Core ML runtime is not on Linux)")
    monkeypatch.setattr(cm.platform, "system", lambda: "Darwin")
    mods, calls = steps(small_gen, batch=1), []

    def slow_load(pkg, cu, fn):
        _time.sleep(0.01)
        return _FakeFunction(mods, fn, calls)

    monkeypatch.setattr(cm, "_mlmodel", slow_load)
    g = cm.CoreMLGenerator("p.mlpackage", "ALL", small_gen.patch_nums, 5)
    K = len(small_gen.patch_nums)
    assert sorted(g.models) == sorted([f"scale_{i}" for i in range(K)] + ["decode"])
    assert 0.01 * (K + 1) <= g.load_s < 5 and g.compute_units == "ALL" and g.num_classes == 5
    labels = torch.tensor([4])
    with pytest.raises(ValueError) as e:
        g.sample_tokens(labels, more_smooth=True)
    assert str(e.value) == "more_smooth is not exported to Core ML"
    with pytest.raises(ValueError) as e:
        g.sample_tokens(labels, cfg=None)
    assert str(e.value) == "the Core ML package is built for CFG (cfg=None is not exported)"
    seen, ref = [], []
    toks, _ = g.sample_tokens(labels, seed=3, cfg=2.0, top_k=10, logits_hook=lambda si, lg: seen.append((si, lg)))
    want, _ = small_gen.sample_tokens(labels, seed=3, cfg=2.0, top_k=10, logits_hook=lambda si, lg: ref.append(lg.clone()))
    assert len(toks) == K and all(torch.equal(a, b) for a, b in zip(toks, want))
    assert [si for si, _ in seen] == list(range(K))
    for (_, a), b in zip(seen, ref):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_op_lists_descend_into_nested_blocks_and_totals_skip_consts():
    from types import SimpleNamespace as NS

    import bench.coreml as cm
    inner = NS(operations=[NS(type="mul", blocks=[]), NS(type="const", blocks=[])])
    block = NS(operations=[NS(type="const", blocks=[]), NS(type="cond", blocks=[inner, inner]),
                           NS(type="linear", blocks=[])])
    assert cm._ops(block) == ["const", "cond", "mul", "const", "mul", "const", "linear"]
    assert cm.total_ops({"a": {"const": 5, "mul": 2}, "b": {"linear": 3, "const": 1}}) == 5


def test_op_counts_refuses_what_is_not_an_ml_program_package(tmp_path):
    import bench.coreml as cm
    with pytest.raises(FileNotFoundError) as e:
        cm.op_counts(tmp_path / "none.mlpackage")
    assert str(e.value) == f"{tmp_path / 'none.mlpackage'}: no such Core ML package"
    (tmp_path / "bad.mlpackage").mkdir()
    with pytest.raises(ValueError) as e:
        cm.op_counts(tmp_path / "bad.mlpackage")
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'bad.mlpackage'}: not a readable Core ML package (") and msg.endswith(
        "); write one with `varbench coreml export MODEL --out X.mlpackage`")
