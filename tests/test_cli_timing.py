"""`varbench latency` as a command: what it passes to the latency bench (chains, setting, sampling,
checkpoints, compute units), what it prints, and its refusals; the timing itself faked (the bench's
own tests time real generations)."""
import pytest

from tests.conftest import cli as _out


class _Spec:
    def __init__(self, chain, cu):
        self.chain, self.cu = chain, cu

    def path(self, root):
        return f"{root}/{self.chain}@{self.cu}.json"


@pytest.fixture
def fake_latency(monkeypatch):
    import bench.benches.latency
    import bench.latency
    seen = {"specs": []}

    def latency_specs(model, chains, reps, seed, setting, world, ckpt_dir, random_weights, sampling):
        seen["specs"].append(dict(model=model, chains=chains, reps=reps, seed=seed, setting=setting, world=world,
                                  ckpt_dir=ckpt_dir, random_weights=random_weights, sampling=sampling))
        return [_Spec(c, setting.get("compute_units")) for c in chains]

    def run_latency(specs, root, ckpt_dir, force, progress):
        seen["run"] = dict(n=len(specs), root=root, ckpt_dir=ckpt_dir, force=force, progress=progress)
        return [f"record {i}" for i in range(len(specs))]

    def report(specs, records, labels):
        seen["report"] = (len(specs), records, labels)
        return "REPORT"
    monkeypatch.setattr(bench.latency, "latency_specs", latency_specs)
    monkeypatch.setattr(bench.latency, "run_latency", run_latency)
    monkeypatch.setattr(bench.latency, "report", report)
    monkeypatch.setattr(bench.benches.latency, "available_cpus", lambda: 2)
    return seen


def test_latency_passes_the_setting_and_prints_the_report_and_the_records(tmp_path, capsys, fake_latency):
    r = _out(capsys, ["latency", "--model", "tiny-var", "--method", "dense", "--method", "magnitude:sparsity=0.4",
                      "--reps", "5", "--seed", "2", "--batch", "3", "--threads", "2", "--warmup", "4", "--cfg", "3",
                      "--results", str(tmp_path), "--random-weights", "--force"])
    (s,) = fake_latency["specs"]
    assert s == dict(model="tiny-var", chains=["dense", "magnitude:sparsity=0.4"], reps=5, seed=2,
                     setting=dict(device="cpu", batch=3, threads=2, compile=False, warmup=4), world="tiny",
                     ckpt_dir=None, random_weights=True, sampling={"cfg": 3.0})
    assert fake_latency["run"] == dict(n=2, root=str(tmp_path), ckpt_dir=None, force=True, progress=True)
    assert fake_latency["report"] == (2, ["record 0", "record 1"], ["dense", "magnitude:sparsity=0.4"])
    assert r.out == f"REPORT\nrecord: {tmp_path}/dense@None.json\nrecord: {tmp_path}/magnitude:sparsity=0.4@None.json\n"
    assert r.err == ""
    _out(capsys, ["latency", "--model", "tiny-var", "--quiet", "--compile"])
    (s,) = fake_latency["specs"][1:]
    assert s["chains"] == ["dense"] and s["setting"]["compile"] is True and s["random_weights"] is False
    assert s["sampling"] == {} and fake_latency["run"]["progress"] is False and fake_latency["run"]["force"] is False


def test_latency_warns_about_more_threads_than_cpus(capsys, fake_latency):
    r = _out(capsys, ["latency", "--model", "tiny-var", "--threads", "3", "--quiet"])
    assert r.err == ("varbench: warning: --threads 3 is more than the 2 CPUs this process may use: the threads will "
                     "share cores and the timings measure that contention (the default is 2)\n")
    assert _out(capsys, ["latency", "--model", "tiny-var", "--threads", "2", "--quiet"]).err == ""


def test_latency_on_core_ml_times_each_compute_unit(capsys, fake_latency, monkeypatch):
    import bench.coreml
    asked = []
    monkeypatch.setattr(bench.coreml, "require_macos", lambda what: asked.append(what))
    r = _out(capsys, ["latency", "--model", "tiny-var", "--device", "coreml", "--method", "dense", "--method", "magnitude",
                      "--precision", "fp32", "--quiet", "--threads", "8"])
    assert asked == ["--device coreml (latency and op placement per compute unit)"]
    assert [s["setting"]["compute_units"] for s in fake_latency["specs"]] == ["CPU_AND_NE", "ALL", "CPU_AND_GPU"]
    assert all(s["setting"]["device"] == "coreml" and s["setting"]["precision"] == "fp32" for s in fake_latency["specs"])
    assert fake_latency["report"][2] == [f"{c} @ {cu}" for cu in ("CPU_AND_NE", "ALL", "CPU_AND_GPU")
                                         for c in ("dense", "magnitude")]
    assert r.err == ""                                 # the thread warning is for the CPU device only
    fake_latency["specs"].clear()
    _out(capsys, ["latency", "--model", "tiny-var", "--device", "coreml", "--compute-units", "CPU_ONLY", "--quiet"])
    assert [s["setting"]["compute_units"] for s in fake_latency["specs"]] == ["CPU_ONLY"]
    r = _out(capsys, ["latency", "--model", "tiny-var", "--device", "coreml", "--compile"], rc=2)
    assert r.err.endswith("--compile applies to PyTorch devices, not --device coreml\n")
    r = _out(capsys, ["latency", "--model", "tiny-var", "--compute-units", "ALL"], rc=2)
    assert r.err.endswith("--compute-units applies to --device coreml only\n")
    for device in ([], ["--device", "cpu"]):   # a PyTorch device times the model as loaded: refused, not ignored
        r = _out(capsys, ["latency", "--model", "tiny-var", "--precision", "fp32", *device], rc=2)
        assert r.err.endswith("--precision applies to --device coreml only (the Core ML package's precision)\n")
    assert all(s["setting"]["precision"] == "fp16" for s in fake_latency["specs"])   # Core ML's default (CPU_ONLY above)


def test_only_rank_zero_reports(capsys, fake_latency, monkeypatch):
    import bench.shard
    monkeypatch.setattr(bench.shard, "rank", lambda: 1)
    assert _out(capsys, ["latency", "--model", "tiny-var", "--quiet"]).out == ""
    assert fake_latency["run"]["n"] == 1


def test_latency_chains_are_spelled_as_requested_and_not_twice(capsys, fake_latency):
    _out(capsys, ["latency", "--model", "tiny-var", "--method", "magnitude:sparsity=0.4 + psad", "--method", "dense",
                  "--quiet"])
    assert fake_latency["specs"][0]["chains"] == ["magnitude:sparsity=0.4 + psad", "dense"]
    r = _out(capsys, ["latency", "--model", "tiny-var", "--method", "dense", "--method", "magnitude",
                      "--method", "dense", "--quiet"], rc=2)
    assert r.err == "varbench: error: --method 'dense' and --method 'dense' are the same configuration (dense): give it once\n"
    assert len(fake_latency["specs"]) == 1


def test_latency_refuses_two_spellings_of_one_configuration(capsys, monkeypatch, tmp_path):
    """Chains spelled differently that resolve alike (a default written out) would be timed twice as two rows."""
    import bench.latency
    monkeypatch.setattr(bench.latency, "run_latency", lambda *a, **k: pytest.fail("nothing may be timed"))
    r = _out(capsys, ["latency", "--model", "tiny-var", "--method", "magnitude:sparsity=0.4", "--method", "dense",
                      "--method", "magnitude", "--results", str(tmp_path), "--quiet"], rc=2)
    assert r.err == ("varbench: error: --method 'magnitude:sparsity=0.4' and --method 'magnitude' are the same "
                     "configuration (magnitude:norm=l2,schedule=uniform,scope=coupled,sparsity=0.4): give it once\n")


@pytest.mark.parametrize("argv", [["coreml", "export", "tiny-t2i", "--out", "x.mlpackage"],
                                  ["latency", "--model", "tiny-t2i", "--device", "coreml"],
                                  ["coreml", "export", "hart-0.7b", "--out", "x.mlpackage"]])
def test_core_ml_refuses_text_to_image_models_before_any_work(capsys, argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = _out(capsys, argv, rc=2)
    assert r.err == (f"varbench: error: --model {argv[2]} is a text-to-image "
                     "model; the Core ML export covers the class-conditional VAR models: tiny-var, var-d16, var-d20, "
                     "var-d24, var-d30\n")
    assert list(tmp_path.iterdir()) == []
