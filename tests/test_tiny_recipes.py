"""The `make tiny-models` recipes run end to end (a few steps each), write a complete manifest, pin
their thread counts, and are reproducible bit for bit: a second run, started from another thread
count, writes byte-identical checkpoints (and the same curves and held-out figures)."""
import json

import pytest
import torch

from bench.checkpoint import sha256
from bench.recipes import tiny as train

FILES = ("tiny_vqvae.safetensors", "feature_cnn.safetensors", "tiny_var.safetensors")


def test_recipe_thread_counts():
    """The counts the shipped checkpoints reproduce with (see the manifest and bench/recipes/tiny.py)."""
    assert train.VAE_RECIPE["threads"] == train.VAR_RECIPE["threads"] == 2
    assert train.CNN_RECIPE["threads"] == 1
    # every stage is also pinned to one SIMD level (every CPU library torch uses), in a child process
    assert train.CNN_RECIPE["isa"] == train.VAE_RECIPE["isa"] == train.VAR_RECIPE["isa"] == train.EVAL_ISA == "avx2"
    assert train.ISA_ENV["avx2"] == {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


@pytest.fixture
def few_steps(monkeypatch):
    # Every stage pinned to 1 thread here: on a shared 2-core machine, 2-thread OpenMP regions stall
    # whenever another process holds a core. Run b, started from 2 threads, still proves the pinning.
    monkeypatch.setattr(train, "VAE_RECIPE", {**train.VAE_RECIPE, "steps": 3, "batch": 8, "pool": 64, "restart_every": 2,
                                              "threads": 1})
    monkeypatch.setattr(train, "VAR_RECIPE", {**train.VAR_RECIPE, "steps": 3, "batch": 8, "pool": 64, "warmup": 1,
                                              "threads": 1})
    monkeypatch.setattr(train, "CNN_RECIPE", {**train.CNN_RECIPE, "epochs": 1, "pool": 64, "batch": 32})
    monkeypatch.setattr(train, "EVAL_THREADS", 1)
    monkeypatch.setattr(train, "VAE_VAL", 32)
    monkeypatch.setattr(train, "CNN_VAL", 64)


def _run(out, caller_threads: int, stages=train.STAGES) -> dict:
    """A run of ``stages`` started from ``caller_threads``; returns the sha256 of each checkpoint."""
    prev = torch.get_num_threads()
    torch.set_num_threads(caller_threads)
    try:
        train.run(out, stages, progress=False, eval_per_class=2)
        assert torch.get_num_threads() == caller_threads, "run() must restore the caller's thread count"
    finally:
        torch.set_num_threads(prev)
    return {f: sha256(out / f) for f in FILES}


def test_recipes_smoke_and_reproducible(tmp_path, few_steps):
    a, b = tmp_path / "a", tmp_path / "b"
    hashes = _run(a, caller_threads=1)
    manifest = json.loads((a / "manifest.json").read_text())
    assert set(manifest["models"]) == {"tiny-vqvae", "feature-cnn", "tiny-var"}
    recipes = {"tiny-vqvae": train.VAE_RECIPE, "feature-cnn": train.CNN_RECIPE, "tiny-var": train.VAR_RECIPE}
    for name, entry in manifest["models"].items():
        assert entry["sha256"] == hashes[entry["file"]] and (a / entry["file"]).stat().st_size == entry["bytes"]
        assert entry["recipe"] == recipes[name] and entry["recipe"]["seed"] == 0 and entry["curve"]
        assert entry["threads"] == recipes[name]["threads"], f"{name}: thread count not recorded"
        assert entry["cpu_capability"], f"{name}: SIMD level not recorded"
    for name, entry in manifest["models"].items():
        assert entry["isa"] == "avx2" and entry["isa_env"] == train.ISA_ENV["avx2"] \
            and entry["cpu_capability"] == "AVX2", f"{name}: the stage did not run in the ISA-pinned child"
    q = manifest["models"]["tiny-var"]["quality"]
    assert q["isa"] == "avx2" and q["cpu_capability"] == "AVX2", "the quality measurement did not run pinned"
    assert {"class_acc", "precision", "recall", "fid", "bars"} <= set(q) and q["threads"] == train.EVAL_THREADS
    assert "val_psnr_db" in manifest["models"]["tiny-vqvae"]["quality"]
    assert manifest["git_commit"]
    assert not (a / "tiny_var.snapshot.safetensors").exists()
    assert not [p.name for p in a.iterdir() if p.name.startswith(".")], "temporary files left behind"

    # The training stages again, from another caller thread count: the pinned recipes give the same bytes.
    assert _run(b, caller_threads=2, stages=("vqvae", "cnn", "var")) == hashes
    manifest_b = json.loads((b / "manifest.json").read_text())
    strip = lambda e: {k: v for k, v in e.items() if k not in ("train_seconds", "quality")}  # noqa: E731
    for name, entry in manifest["models"].items():
        assert strip(manifest_b["models"][name]) == strip(entry), f"{name}: curves differ between runs"
    for name in ("tiny-vqvae", "feature-cnn"):
        assert manifest_b["models"][name]["quality"] == manifest["models"][name]["quality"]


def test_consecutive_stages_of_one_simd_level_share_a_child(tmp_path, monkeypatch):
    """One child process per run of stages pinned to the same level, in stage order."""
    calls = []
    monkeypatch.setattr(train, "_run_pinned", lambda isa, out, jobs: calls.append((isa, [s for s, _ in jobs])))
    train.run(tmp_path, progress=False)
    assert calls == [("avx2", ["vqvae", "cnn", "var", "eval"])]
    calls.clear()
    monkeypatch.setitem(train.ISA_ENV, "avx512", {"ATEN_CPU_CAPABILITY": "avx512"})
    monkeypatch.setattr(train, "CNN_RECIPE", {**train.CNN_RECIPE, "isa": "avx512"})
    train.run(tmp_path, ("vqvae", "cnn", "var"), progress=False)
    assert calls == [("avx2", ["vqvae"]), ("avx512", ["cnn"]), ("avx2", ["var"])]


def test_no_isa_pin_trains_natively_and_says_so(tmp_path, few_steps):
    """``--no-isa-pin``: the stage runs in this process with the machine's own kernels, and its entry
    records ``isa: None`` (not the recipe's pin it did not run under) and the level torch reports."""
    train.run(tmp_path, ("vqvae",), progress=False, isa_pin=False)
    entry = json.loads((tmp_path / "manifest.json").read_text())["models"]["tiny-vqvae"]
    assert entry["isa"] is None and entry["recipe"]["isa"] is None and "isa_env" not in entry
    assert entry["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert train.VAE_RECIPE["isa"] == "avx2", "the recipe's pin must be restored after the stage"


def test_train_tiny_refuses_what_it_could_not_finish_before_training(tmp_path, capsys, monkeypatch):
    """An empty stage list, a file as --out and a stage whose inputs are neither there nor made before it
    are refused up front (``run`` would fail the test if reached)."""
    monkeypatch.setattr(train, "run", lambda *a, **k: pytest.fail("training started"))
    (tmp_path / "f").write_text("")
    out = tmp_path / "o"
    for argv, msg in [(["--stages", ""], "--stages is empty; choose from vqvae, cnn, var, eval (all of them by default)"),
                      (["--stages", "vqvae,bsq"], "error: unknown stage(s) ['bsq']; choose from vqvae, cnn, var, eval\n"),
                      (["--stages", ","], "--stages is empty"),
                      (["--out", str(tmp_path / "f")], f"--out '{tmp_path / 'f'}': give a folder"),
                      (["--out", str(out), "--stages", "var"],
                       f"stage var reads {out / 'tiny_vqvae.safetensors'}: it is not there; add stage(s) vqvae "
                       f"(--stages vqvae,var), or give --out the folder that has it"),
                      (["--out", str(out), "--stages", "eval,var"],   # trained in STAGES order: var before eval
                       f"stage var reads {out / 'tiny_vqvae.safetensors'}; stage eval reads "
                       f"{out / 'feature_cnn.safetensors'}: they are not there; add stage(s) vqvae,cnn "
                       f"(--stages vqvae,cnn,var,eval), or give --out the folder that has them")]:
        with pytest.raises(SystemExit) as e:
            train.main(argv)
        assert e.value.code == 2 and msg in capsys.readouterr().err
    assert not out.exists()
    ran = []
    monkeypatch.setattr(train, "run", lambda out, stages, **k: ran.append(stages))
    assert train.main(["--out", str(out), "--stages", "vqvae,var"]) == 0           # made by an earlier stage
    out.mkdir()
    (out / "tiny_vqvae.safetensors").write_bytes(b"")
    assert train.main(["--out", str(out), "--stages", "var"]) == 0                 # or already there
    assert ran == [["vqvae", "var"], ["var"]]


def test_pinned_threads_restores():
    prev = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with train.pinned_threads(1) as n:
            assert n == 1 == torch.get_num_threads()
        assert torch.get_num_threads() == 2
        with pytest.raises(RuntimeError):
            with train.pinned_threads(1):
                raise RuntimeError("stage failed")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(prev)


def test_canonical_safetensors_metadata_order(tmp_path):
    """safetensors writes metadata in hash order; after canonicalising, equal contents give equal bytes."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save

    from bench.io import atomic_write_bytes, canonical_safetensors

    tensors = {"b": torch.arange(6.0).reshape(2, 3), "a": torch.ones(3, dtype=torch.int64)}
    meta = {k: str(i) for i, k in enumerate("zyxwvutsrq")}
    paths = [tmp_path / f"{i}.safetensors" for i in range(3)]
    for p in paths:
        atomic_write_bytes(p, canonical_safetensors(save(tensors, metadata=meta)))
    assert len({sha256(p) for p in paths}) == 1
    with safe_open(str(paths[0]), framework="pt") as f:
        assert f.metadata() == meta
    loaded = load_file(str(paths[0]))
    assert all(torch.equal(loaded[k], v) for k, v in tensors.items())
    header = paths[0].read_bytes()[8:200].decode(errors="ignore")
    assert header.startswith('{"__metadata__":{"q":"9","r":"8"')


def test_tiny_t2i_recipe_runs_pinned_to_its_isa_and_records_it():
    """With ``--isa-pin`` the text-to-image recipe re-executes itself under ISA_ENV (torch reads it at
    start-up): the child sees the AVX2 kernels and the manifest fields say so; an unpinned process (the
    default) records ``isa: None``."""
    import json
    import os
    import subprocess
    import sys

    from bench.recipes import tiny_t2i
    assert tiny_t2i.ISA == "avx2"
    code = "import json; from bench.recipes.tiny_t2i import _numerics; print(json.dumps(_numerics(1)))"
    env = {k: v for k, v in os.environ.items() if k not in train.ISA_ENV["avx2"]}
    pinned = json.loads(subprocess.run([sys.executable, "-c", code], env={**env, **train.ISA_ENV["avx2"]},
                                       check=True, capture_output=True, text=True).stdout)
    assert pinned["isa"] == "avx2" and pinned["isa_env"] == train.ISA_ENV["avx2"] and pinned["cpu_capability"] == "AVX2"
    native = json.loads(subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                                       text=True).stdout)
    assert native["isa"] is None and "isa_env" not in native
    # a bad stage is refused before any child process is started
    with pytest.raises(SystemExit):
        tiny_t2i.main(["--stages", "bsq,vqvae"])


@pytest.mark.slow
def test_tiny_t2i_training_loop_records_its_curves():
    """Two steps of the tiny-t2i training loop (random VAE, a small pool): the loss curve and one
    quality-curve point with the bars, the prompt-sensitivity deltas, the sampled layout agreement and
    the cross-attention focus, one value per scale each (about 40 s: the probes build their val scenes)."""
    from bench.models.bsq import BSQVAE
    from bench.recipes import tiny_t2i
    from bench.tiny import configs
    torch.manual_seed(0)
    recipe = dict(tiny_t2i.T2I_RECIPE, steps=2, pool=256, eval_every=2, eval_per_task=2)
    _, _, info = tiny_t2i.train_t2i(BSQVAE(configs.TINY_BSQ).eval(), recipe, progress=False)
    assert [c["step"] for c in info["curve"]] == [0, 1]
    (point,) = info["quality_curve"]
    assert point["step"] == 2 and set(tiny_t2i.BARS) <= set(point)
    K = len(configs.T2I_SCHEDULE)
    assert all(len(d) == K for d in point["prompt_sensitivity"].values()) and len(point["layout_agreement"]) == K
    focus = point["attention_focus"]
    assert len(focus["own_colour"]) == len(focus["own_shape"]) == K and len(focus["key_norm"]) == configs.TINY_T2I.depth


@pytest.mark.parametrize("args, msg", [(["--device", "tpu"], "cpu or cuda"), (["--device", "mps"], "cpu or cuda"),
                                       (["--steps", "0"], "≥ 1"), (["--device", "cuda", "--isa-pin"], None),
                                       (["--background-weight", "0"], "(0, 1]"), (["--background-weight", "1.5"], "(0, 1]"),
                                       (["--eval-every", "-1"], "≥ 0"), (["--time-budget", "0"], "> 0 seconds"),
                                       (["--batch", "0"], "--batch must be ≥ 1, got 0"),
                                       (["--lr", "0"], "--lr must be a finite number > 0, got 0.0"),
                                       (["--lr", "inf"], "--lr must be a finite number > 0"),
                                       (["--text-pretrain", "-1"], "--text-pretrain must be ≥ 0 steps, got -1"),
                                       (["--layout-weight", "-0.5"], "--layout-weight must be a finite number ≥ 0"),
                                       (["--layout-weight", "nan"], "--layout-weight must be a finite number ≥ 0"),
                                       (["--coarse-first", "-1"], "--coarse-first must be ≥ 0 steps, got -1"),
                                       (["--coarse-scales", "6"], "--coarse-scales must be in 1…5"),
                                       (["--coarse-first", "100", "--time-budget", "60"], "do not go together"),
                                       (["--reweight-by-scale", "2"], "invalid choice: 2"),
                                       (["--recipe", "fast"], "argument --recipe: invalid choice: 'fast' (choose from")])
def test_tiny_t2i_refuses_bad_options_before_training(args, msg, capsys, monkeypatch):
    """Wrong devices and step counts are refused with the range, before any data is made or file written
    (``run`` would fail the test if reached)."""
    from bench.recipes import tiny_t2i
    monkeypatch.setattr(tiny_t2i, "run", lambda *a, **k: pytest.fail("training started"))
    if msg is None:   # cuda: refused where no GPU is visible; with one, --isa-pin is what is refused
        msg = "isa-pin" if torch.cuda.is_available() else "no CUDA device"
    with pytest.raises(SystemExit):
        tiny_t2i.main(args)
    assert msg in capsys.readouterr().err


@pytest.mark.parametrize("stages, have, msg", [
    ("eval", [], "stage eval reads {d}/tiny_bsq.safetensors, {d}/tiny_t2i.safetensors, {d}/tiny_t2i_text.safetensors: "
                 "they are not there; add stage(s) bsq,t2i (--stages bsq,t2i,eval), or give --out the folder that "
                 "has them"),
    ("t2i,eval", [], "stage t2i reads {d}/tiny_bsq.safetensors: it is not there; add stage(s) bsq "
                     "(--stages bsq,t2i,eval), or give --out the folder that has it"),
    ("eval", ["bsq", "t2i"], "stage eval reads {d}/tiny_t2i_text.safetensors: it is not there; add stage(s) t2i "
                             "(--stages t2i,eval)"),
    (",", [], "--stages is empty; choose from bsq, t2i, eval")])
def test_tiny_t2i_refuses_stages_whose_inputs_are_missing(stages, have, msg, tmp_path, capsys, monkeypatch):
    """A stage that reads a file neither in --out nor made by an earlier requested stage is refused before
    any training, naming every missing file once and the --stages that would make it."""
    from bench.recipes import tiny_t2i
    monkeypatch.setattr(tiny_t2i, "run", lambda *a, **k: pytest.fail("training started"))
    for key in have:
        (tmp_path / tiny_t2i.FILES[key]).touch()
    with pytest.raises(SystemExit):
        tiny_t2i.main(["--out", str(tmp_path), "--stages", stages])
    err = capsys.readouterr().err
    assert msg.format(d=tmp_path) in err and err.count("tiny_bsq.safetensors") <= 1


def test_tiny_t2i_refuses_a_file_as_out(tmp_path, capsys, monkeypatch):
    from bench.recipes import tiny_t2i
    monkeypatch.setattr(tiny_t2i, "run", lambda *a, **k: pytest.fail("training started"))
    f = tmp_path / "x.txt"
    f.write_text("keep")
    for out in (str(f), " "):
        with pytest.raises(SystemExit):
            tiny_t2i.main(["--out", out])
        assert "give a folder for the checkpoints" in capsys.readouterr().err
    assert f.read_text() == "keep"
    assert train.missing_inputs(tmp_path, tiny_t2i.STAGES, tiny_t2i.STAGES, tiny_t2i.STAGE_NEEDS, tiny_t2i.STAGE_MAKES,
                                tiny_t2i.FILES) is None   # each stage makes the next one's inputs


def test_tiny_t2i_passes_steps_and_device_to_the_run(monkeypatch, tmp_path):
    from bench.recipes import tiny_t2i
    seen = {}
    monkeypatch.setattr(tiny_t2i, "run", lambda out, stages, progress, device, t2i_recipe, recipe_name: seen.update(
        out=out, stages=stages, device=device, recipe=t2i_recipe, name=recipe_name))
    (tmp_path / tiny_t2i.FILES["bsq"]).touch()   # stage t2i reads the VAE from --out (checked before training)
    assert tiny_t2i.main(["--out", str(tmp_path), "--stages", "t2i", "--steps", "12", "--device", "cpu"]) == 0
    assert seen["recipe"] == {**tiny_t2i.T2I_RECIPE, "steps": 12} and seen["device"] == "cpu"
    assert seen["stages"] == ["t2i"] and tiny_t2i.T2I_RECIPE["steps"] == 6000
    tiny_t2i.main(["--out", str(tmp_path), "--background-weight", "0.25"])
    assert seen["recipe"] == {**tiny_t2i.T2I_RECIPE, "background_weight": 0.25}
    assert "background_weight" not in tiny_t2i.T2I_RECIPE
    tiny_t2i.main(["--out", str(tmp_path), "--eval-every", "0", "--steps", "30000"])   # a long run, no curve
    assert seen["recipe"] == {**tiny_t2i.T2I_RECIPE, "eval_every": 0, "steps": 30000}
    tiny_t2i.main(["--out", str(tmp_path), "--time-budget", "360", "--steps", "100000"])
    assert seen["recipe"] == {**tiny_t2i.T2I_RECIPE, "time_budget_s": 360.0, "steps": 100000}
    tiny_t2i.main(["--out", str(tmp_path), "--batch", "192", "--time-budget", "300"])
    assert seen["recipe"] == {**tiny_t2i.T2I_RECIPE, "batch": 192, "time_budget_s": 300.0}
    assert tiny_t2i.T2I_RECIPE["batch"] == 48
    tiny_t2i.main(["--out", str(tmp_path), "--lr", "3.75e-4"])
    assert seen["recipe"] == {**tiny_t2i.T2I_RECIPE, "lr": 3.75e-4} and tiny_t2i.T2I_RECIPE["lr"] == 1.5e-3
    tiny_t2i.main(["--out", str(tmp_path), "--text-pretrain", "500", "--layout-weight", "0.5"])
    assert seen["recipe"] == {**tiny_t2i.T2I_RECIPE, "text_pretrain": 500, "layout_weight": 0.5}
    tiny_t2i.main(["--out", str(tmp_path), "--coarse-first", "500", "--coarse-scales", "2", "--reweight-by-scale", "1"])
    assert seen["recipe"] == {**tiny_t2i.T2I_RECIPE, "coarse_first": 500, "coarse_scales": 2, "reweight_by_scale": 1}
    tiny_t2i.main(["--out", str(tmp_path)])
    assert seen["recipe"] is tiny_t2i.T2I_RECIPE and seen["stages"] == list(tiny_t2i.STAGES) and seen["name"] == "cpu"
    tiny_t2i.main(["--out", str(tmp_path), "--recipe", "gpu", "--device", "cpu"])   # the shipped files' recipe
    assert seen["recipe"] is tiny_t2i.T2I_GPU_RECIPE and seen["name"] == "gpu"
    assert seen["recipe"] == {**tiny_t2i.T2I_RECIPE, "steps": 3200, "batch": 192, "eval_every": 4000,
                              "background_weight": 0.25}
    tiny_t2i.main(["--out", str(tmp_path), "--recipe", "gpu", "--steps", "100"])
    assert seen["recipe"] == {**tiny_t2i.T2I_GPU_RECIPE, "steps": 100} and seen["name"] == "gpu"


def test_tiny_t2i_background_weight_reaches_the_loss():
    """``background_weight`` (absent: 1) weighs the tokens without an object in the recipe's loss: the
    first step's recorded loss is the object-weighted one (computed here from the same rows), and
    with the option at 1 the recipe's loss is the plain mean."""
    from bench.models.bsq import BSQVAE
    from bench.recipes import tiny_t2i
    from bench.tiny import configs
    torch.manual_seed(0)
    vae = BSQVAE(configs.TINY_BSQ).eval()
    base = dict(tiny_t2i.T2I_RECIPE, steps=1, pool=64, batch=6, eval_every=0)
    _, _, plain = tiny_t2i.train_t2i(vae, base, progress=False)
    _, _, again = tiny_t2i.train_t2i(vae, dict(base, background_weight=1.0), progress=False)
    _, _, weighted = tiny_t2i.train_t2i(vae, dict(base, background_weight=0.25), progress=False)
    assert again["curve"] == plain["curve"]
    assert weighted["curve"][0]["loss"] != plain["curve"][0]["loss"]
    # the same first step by hand: the recipe's rows, its init, the weighted loss
    from bench.data import scenes
    from bench.models.infinity import Infinity
    from bench.models.t2i import T2IGenerator
    from bench.models.text import TinyTextEncoder
    torch.manual_seed(0)
    imgs, prompts, _, truths = scenes.generate(64, "train")
    ids, mask = scenes.tokenize(prompts, configs.T2I_MAX_WORDS)
    z = tiny_t2i.latents(vae, imgs, progress=False)
    inf, text = Infinity(configs.TINY_T2I), TinyTextEncoder(configs.TINY_TEXT)
    tiny_t2i.init_t2i_weights(inf, text)
    g = torch.Generator().manual_seed(base["seed"] + 1)
    idx = torch.randint(64, (base["batch"],), generator=g)
    flip_p = int(torch.randint(0, round(100 * base["bsc_strength"]) + 1, (1,), generator=g)) * 0.01
    labels, x = vae.requantize(z[idx], configs.T2I_SCHEDULE, flip_p, g)
    with torch.no_grad():
        ce = T2IGenerator(inf, vae, text).train().token_ce(text(ids[idx], mask[idx]), mask[idx], labels, x)
    w = torch.where(scenes.object_tokens(truths, configs.T2I_SCHEDULE)[idx], 1.0, 0.25)
    assert weighted["curve"][0]["loss"] == pytest.approx((ce * w).sum().item() / w.sum().item(), abs=2e-5)


def test_tiny_t2i_time_budget_fixes_the_steps_inside_the_warm_up(monkeypatch):
    """``time_budget_s``: the first BUDGET_PROBE steps are timed, then the step count is fixed (at most the
    recipe's steps, at least the probe) while the learning rate is still warming up, so a budgeted run
    is the plain run of the steps it chose: same weights."""
    from bench.models.bsq import BSQVAE
    from bench.recipes import tiny_t2i
    from bench.tiny import configs
    monkeypatch.setattr(tiny_t2i, "BUDGET_PROBE", 2)
    torch.manual_seed(0)
    vae = BSQVAE(configs.TINY_BSQ).eval()
    base = dict(tiny_t2i.T2I_RECIPE, steps=3, pool=64, batch=4, eval_every=0, warmup=2)
    runs = {}
    for name, extra in (("tiny", dict(time_budget_s=1e-9)), ("ample", dict(time_budget_s=1e9)),
                        ("some", dict(steps=8, time_budget_s=1.25)), ("two", dict(steps=2)), ("three", {}),
                        ("four", dict(steps=4))):
        torch.manual_seed(1)
        with monkeypatch.context() as m:
            if name == "some":   # a clock that moves 0.5 s per reading: 0.25 s per step, 1.25 s → 5 → 4 steps (of 2)
                clock = iter(range(10 ** 6))
                m.setattr(tiny_t2i.time, "perf_counter", lambda c=clock: next(c) * 0.5)
            inf, _, info = tiny_t2i.train_t2i(vae, dict(base, **extra), progress=False)
        runs[name] = (info["steps"], inf.state_dict())
    assert [runs[k][0] for k in ("tiny", "ample", "some", "two", "three", "four")] == [2, 3, 4, 2, 3, 4]
    for budgeted, plain in (("tiny", "two"), ("ample", "three"), ("some", "four")):
        assert all(torch.equal(v, runs[plain][1][k]) for k, v in runs[budgeted][1].items()), budgeted
    with pytest.raises(ValueError, match="warm-up of ≥ 2 steps"):
        tiny_t2i.train_t2i(vae, dict(base, warmup=1, time_budget_s=10.0), progress=False)
