"""Every registered thing is tested here without editing tests: each method at its defaults and at
its identity setting, each bench's protocol, each metric's declaration; and the engine's torch-free
paths stay torch-free."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.method import Context, apply_chain
from bench.registry import BENCHES, METHODS, METRICS, MODELS
from bench.spec import format_method, resolve_chain


def _ctx(gen, seed=0):
    """A context whose training/calibration data are random token pyramids of the generator's shapes."""
    def data(n, split):
        g = torch.Generator().manual_seed(1 if split == "calib" else 2)
        labels = torch.randint(gen.var.num_classes, (n,), generator=g)
        return labels, [torch.randint(gen.var.V, (n, pn * pn), generator=g) for pn in gen.patch_nums]
    return Context(world="tiny", seed=seed, progress=False, data=data, epoch_size=32)


def _logits(gen):
    torch.manual_seed(0)
    labels = torch.tensor([0, 1, 2])
    tokens = [torch.randint(gen.var.V, (3, pn * pn)) for pn in gen.patch_nums]
    gen.eval()
    with torch.no_grad():
        return gen.forward_teacher(labels, tokens)


@pytest.mark.parametrize("name", METHODS.names())
def test_method_declaration_is_complete(name):
    meta = METHODS.meta(name)
    assert meta["name"] == name and meta["kind"] in ("weights", "tokens", "recovery")
    assert isinstance(meta.get("version"), int) and meta.get("summary") and "identity" in meta
    for p, d in (meta.get("params") or {}).items():
        assert {"default", "type", "help"} <= set(d), f"{name}.{p}"
    cls = METHODS.get(name)
    assert cls.name == name and cls.kind == meta["kind"]
    resolve_chain([format_method(name, meta["identity"])])     # the identity setting is a valid spec


@pytest.mark.parametrize("name", METHODS.names())
def test_method_runs_at_its_defaults(name, small_gen):
    before = _logits(small_gen)
    gen = apply_chain(small_gen, [name], _ctx(small_gen))
    after = _logits(gen)
    assert after.shape == before.shape and torch.isfinite(after).all()
    imgs = gen.generate(torch.tensor([0, 1]), seed=0, cfg=1.5, top_k=10, top_p=0.9)
    assert imgs.dtype == torch.uint8 and imgs.shape[:2] == (2, 3)


@pytest.mark.parametrize("name", METHODS.names())
def test_method_identity_setting_changes_nothing(name, small_gen):
    before = _logits(small_gen)
    sizes = small_gen.var.cfg
    gen = apply_chain(small_gen, [format_method(name, METHODS.meta(name)["identity"])], _ctx(small_gen))
    assert torch.equal(_logits(gen), before)
    assert [gen.var.cfg.block_heads(i) for i in range(sizes.depth)] == [sizes.block_heads(i) for i in range(sizes.depth)]


@pytest.mark.parametrize("name", [n for n in BENCHES.names()
                                  if BENCHES.get(n).kind == "images" and BENCHES.get(n).conditions == "classes"])
def test_bench_protocol(name):   # prompt-conditioned benches: tests/test_geneval.py
    cls = BENCHES.get(name)
    b = cls()
    assert b.world in ("tiny", "paper") and b.model in MODELS and MODELS.get(b.model).world == b.world
    assert set(b.metrics) <= set(METRICS.names()) and b.version >= 1
    k = b.num_classes
    labels = b.labels(2 * k)
    assert labels.tolist() == [c for c in range(k) for _ in range(2)]            # class-major, balanced
    assert cls.check_n(b.default_n) == b.default_n and b.default_n % k == 0
    for bad in (0, -k, k + 1, 1.5):
        with pytest.raises(ValueError, match="positive multiple"):
            cls.check_n(bad)
    assert len({b.batch_seed(0, i) for i in range(5)} | {b.batch_seed(1, i) for i in range(5)}) == 10
    try:
        b.preflight()
    except FileNotFoundError as e:   # paper-world reference files are not here; the error says where to put them
        assert "never downloads" in str(e) or "VARBENCH" in str(e)
        return
    json.dumps(b.identity())
    imgs, lab = _handful(b)
    m = b.evaluate(imgs, lab, seed=0, progress=False)
    assert set(m) == set(b.metrics)
    assert all(isinstance(v["value"], float) and v["value"] == v["value"] for v in m.values())


def _handful(bench):
    from bench.data import tinyshapes
    imgs, labels = tinyshapes.generate(2 * bench.num_classes, "val")
    return imgs, labels


@pytest.mark.parametrize("name", METRICS.names())
def test_metric_declaration(name):
    m = METRICS.get(name)
    assert m.name == name and m.header and m.better in ("lower", "higher", None)
    m.format.format(1.5)


def test_rendering_and_planning_import_no_torch(tmp_path):
    from bench.plan import make_spec
    from bench.records import make_record, write_record
    spec = make_spec("tiny-var", [], n=600)
    rec = make_record(spec, {"fid": 1.5, "is": 10.0}, {"params": 1}, {})
    write_record(spec.path(tmp_path / "results"), rec)
    code = ("import sys\nfrom bench.cli import main\n"
            "rc = main(['table', 'evar-table2', '--no-run', '--results', sys.argv[1], '--out', sys.argv[2]])\n"
            "rc |= main(['list', 'methods']) | main(['list', 'tables']) | main(['runs', '--results', sys.argv[1]])\n"
            "rc |= main(['sweep', sys.argv[3], '--dry-run', '--results', sys.argv[1]])\n"
            "rc |= main(['sweep', sys.argv[3], '--emit-commands', sys.argv[2] + '/cmds.txt', '--results', sys.argv[1]])\n"
            "heavy = sorted(m for m in ('torch', 'torch_fidelity', 'numpy', 'methods.magnitude') if m in sys.modules)\n"
            "print('HEAVY', heavy)\nsys.exit(rc)\n")
    sweep_yaml = Path(__file__).resolve().parents[1] / "sweeps" / "tiny-example.yaml"
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "results"), str(tmp_path / "out"), str(sweep_yaml)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "HEAVY ['numpy']" in out.stdout or "HEAVY []" in out.stdout, out.stdout[-500:]   # pandas brings numpy
    assert "1.50 ± / 3.55" in out.stdout or "1.50 / 3.55" in out.stdout
