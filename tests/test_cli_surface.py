"""What the commands print and return, line by line: `info`'s text against its own --json, `list`,
`runs`' listing, the shared helpers' number, age, seed and device formats, the sample grid. The
commands run in-process through bench.cli.main."""
import argparse
import json

import pytest

from bench.commands import common
from tests.conftest import cli as _out


@pytest.mark.parametrize("n, text", [(0, "0"), (999, "999"), (1000, "1.00K"), (1234, "1.23K"), (999_999, "1000.00K"),
                                     (1e6, "1.00M"), (2.5e9, "2.50G"), (1e12, "1.00T"), (3e15, "3000.00T"),
                                     (-2e6, "-2.00M"), (-999, "-999")])
def test_human_numbers(n, text):
    assert common.human(n) == text


@pytest.mark.parametrize("seconds, text", [(0, "0 s"), (59.4, "59 s"), (60, "1 min"), (3599, "60 min"),
                                           (3600, "1 h"), (86399, "24 h"), (86400, "1 d"), (10 * 86400, "10 d")])
def test_age(seconds, text):
    assert common.age(seconds) == text


def test_parse_seed_is_an_argparse_type_with_the_range():
    assert common.parse_seed("0") == 0 and common.parse_seed("12") == 12
    for bad in ("-1", str(2 ** 32)):
        with pytest.raises(argparse.ArgumentTypeError, match=r"^must be an integer in \[0, 4294967295\] \(2\^32 - 1\), "
                                                            rf"got {bad}$"):   # argparse names the option itself
            common.parse_seed(bad)
    for bad in ("x", "1.5", ""):           # not an integer: the same message with the text given
        with pytest.raises(argparse.ArgumentTypeError, match=rf"^must be an integer in \[0, 4294967295\] "
                                                            rf"\(2\^32 - 1\), got {bad!r}$"):
            common.parse_seed(bad)


def test_device_for(monkeypatch):
    import torch
    args = argparse.Namespace(device=None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert common.device_for(args, "tiny") == "cpu" and common.device_for(args, "paper") == "cpu"
    for bad in ("mps", "meta", "gpu", "cuda:x"):
        with pytest.raises(ValueError, match=rf"^--device {bad!r}: must be cpu, cuda or cuda:N$"):
            common.device_for(argparse.Namespace(device=bad), "tiny")
    with pytest.raises(ValueError, match=r"^--device cuda:1: CUDA is not available on this machine \(use --device cpu\)$"):
        common.device_for(argparse.Namespace(device="cuda:1"), "tiny")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert common.device_for(args, "paper") == "cuda" and common.device_for(args, "tiny") == "cpu"
    assert common.device_for(argparse.Namespace(device="cuda:1"), "tiny") == "cuda:1"
    assert common.device_for(argparse.Namespace(device="cpu"), "paper") == "cpu"


def test_sampling_overrides_keep_only_what_was_given():
    args = argparse.Namespace(cfg=None, top_k=0, top_p=None, tau=2.0)
    assert common.sampling_overrides(args) == {"top_k": 0}
    assert common.sampling_overrides(argparse.Namespace(cfg=1.5, top_k=None, top_p=0.9)) == {"cfg": 1.5, "top_p": 0.9}


def test_prompt_models_are_the_text_to_image_models():
    from bench.registry import MODELS
    assert common.prompt_models() == ["hart-0.7b", "infinity-2b", "tiny-t2i"]
    assert not common.takes_prompts(MODELS.get("tiny-var")) and common.takes_prompts(MODELS.get("tiny-t2i"))


def test_load_records_warns_about_unreadable_files_and_keeps_the_rest(tmp_path, capsys):
    assert common.load_records(tmp_path / "absent", "tiny") == {}
    (tmp_path / "tiny" / "tiny-var" / "shapes-c2i").mkdir(parents=True)
    (tmp_path / "tiny" / "tiny-var" / "shapes-c2i" / "broken.json").write_text("{")
    assert common.load_records(tmp_path, "tiny") == {}
    err = capsys.readouterr().err
    assert err.startswith("varbench: warning: skipped unreadable record ") and "broken.json" in err


def test_list_prints_one_name_per_line_in_registry_order(capsys):
    from bench.registry import REGISTRIES
    for kind in ("models", "methods", "benches", "metrics", "tables"):
        assert _out(capsys, ["list", kind]).out == "".join(n + "\n" for n in REGISTRIES[kind].names())


def test_save_grid(tmp_path):
    import numpy as np
    from PIL import Image

    from bench.image_grid import save_grid
    imgs = np.zeros((3, 3, 8, 8), np.uint8)
    imgs[1, 0] = 255                                    # a red middle image
    path = save_grid(imgs, ["a", "b", "c"], tmp_path / "sub" / "grid.png", cols=10, cell_inches=1.0)
    assert path == tmp_path / "sub" / "grid.png"
    w, h = Image.open(path).size
    assert (w, h) == (3 * 120, round(1.45 * 120))       # cols clamped to the 3 images, one row, 120 dpi
    arr = np.asarray(Image.open(path).convert("RGB")).astype(int)
    red = (arr[..., 0] > 200) & (arr[..., 1] < 60) & (arr[..., 2] < 60)
    cols = np.flatnonzero(red.any(0))
    assert w / 3 < cols.min() and cols.max() < 2 * w / 3   # the middle image is in the middle cell
    g2 = save_grid(imgs, ["a", "b", "c"], tmp_path / "g2.png", cols=2, cell_inches=1.5)
    w2, h2 = Image.open(g2).size
    assert (w2, h2) == (2 * 180, round(2 * 1.95 * 120))   # 2 × 2 cells of 1.5 in + 0.45 in for the caption
    assert Image.open(save_grid(imgs, ["a", "b", "c"], tmp_path / "g1.png", cols=1, cell_inches=1.0)).size == (
        120, round(3 * 1.45 * 120))                         # one column
    arr2 = np.asarray(Image.open(g2).convert("RGB"))
    assert (arr2[h2 // 2 + 5:, w2 // 2 + 5:] == 255).all()  # the fourth cell: blank, its axes off
    for bad, caps in ((imgs[:, :1], ["a", "b", "c"]), (imgs, ["a", "b"]), (imgs[0], ["a"])):
        with pytest.raises(ValueError) as e:
            save_grid(bad, caps, tmp_path / "bad.png")
        assert str(e.value) == f"need images [N, 3, H, W] and N captions, got {bad.shape} and {len(caps)}"

    import matplotlib.pyplot as plt
    open_figures = plt.get_fignums()
    nested = save_grid(imgs, ["a", "b", "c"], str(tmp_path / "x" / "y" / "g.png"))   # a str; folders made
    assert nested == tmp_path / "x" / "y" / "g.png" and nested.is_file()
    assert plt.get_fignums() == open_figures                                  # the figure is closed

    class OnDevice:                                     # a tensor on a GPU: copied to the host first
        def cpu(self):
            return imgs
    assert save_grid(OnDevice(), ["a", "b", "c"], tmp_path / "g3.png").is_file()
    assert not (tmp_path / "bad.png").exists()


def _records(root, latency=True):
    """Synthetic records written by the real writer (tests/test_leaderboard.py's helper): a dense and a
    magnitude run, a stale slimgpt run (method version 0), and a latency run with its setting; created
    2 h, 3 min, 5 s and 2 d ago."""
    import dataclasses
    from datetime import datetime, timedelta, timezone

    from bench.plan import make_spec
    from bench.records import make_record, write_record
    from tests.test_leaderboard import _write
    specs = [_write(root, "dense", {"fid": {"value": 5.123456, "stderr": 0.2}, "is": 9.0}, {"params": 1234567}),
             _write(root, "magnitude:sparsity=0.4", {"fid": 20.0}, {"params": 800000}, seed=3)]
    old = dataclasses.replace(make_spec("tiny-var", "slimgpt:sparsity=0.4", n=120, need_ckpt=False),
                              method_versions={"slimgpt": 0})
    write_record(old.path(root), make_record(old, {"fid": 0.5}, {}, {}))
    specs.append(old)
    if latency:
        specs.append(_write(root, "dense", {"latency_ms": 30.04}, {}, n=3, bench="latency",
                            bench_args={"device": "cpu", "batch": 1, "threads": 2}))
    now = datetime.now(timezone.utc)
    for spec, ago in zip(specs, (timedelta(hours=2), timedelta(minutes=3), timedelta(seconds=5), timedelta(days=2))):
        path = spec.path(root)
        rec = json.loads(path.read_text())
        rec["created"] = (now - ago).isoformat()
        path.write_text(json.dumps(rec))
    return specs


def test_runs_lists_every_record_with_its_age_and_staleness(tmp_path, capsys):
    dense, mag, old, lat = _records(tmp_path)
    rows = json.loads(_out(capsys, ["runs", "--json", "--results", str(tmp_path)]).out)
    assert [list(r) for r in rows] == [["run_id", "world", "model", "bench", "methods", "setting", "n", "seed", "fid",
                                        "is", "latency_ms", "age", "stale", "why", "path"]] * 4
    by_id = {r["run_id"]: r for r in rows}
    d, m, o, t = (by_id[s.key()] for s in (dense, mag, old, lat))
    assert (d["fid"], d["is"], d["latency_ms"], d["age"], d["n"], d["seed"]) == (5.1235, 9.0, None, "2 h", 120, 0)
    assert (m["methods"], m["seed"], m["age"], m["setting"]) == ("magnitude:sparsity=0.4", 3, "3 min", "")
    assert (o["stale"], o["why"], o["age"]) == (True, "method version slimgpt v0→v1", "5 s")
    assert not d["stale"] and d["why"] == "" and d["path"] == str(dense.path(tmp_path))
    assert (t["latency_ms"], t["fid"], t["age"], t["bench"]) == (30.04, None, "2 d", "latency")
    assert t["setting"].startswith("device=cpu, batch=1, threads=2")
    text = _out(capsys, ["runs", "--results", str(tmp_path)]).out.splitlines()
    assert text[0].split() == ["run_id", "world", "model", "bench", "methods", "setting", "n", "seed", "fid", "is",
                               "latency_ms", "age", "stale", "why"]        # the path only in --json
    assert len(text) == 5 and not any(w in line for line in text for w in ("nan", "NaN", "None", str(tmp_path)))
    line = next(x for x in text if x.startswith(dense.key()))
    assert line.split() == [dense.key(), "tiny", "tiny-var", "shapes-c2i", "dense", "120", "0", "5.1235", "9.0", "2",
                            "h", "False"]
    stale = json.loads(_out(capsys, ["runs", "--stale", "--json", "--results", str(tmp_path)]).out)
    assert [r["run_id"] for r in stale] == [old.key()]


def test_runs_shows_the_setting_column_only_when_a_record_has_one(tmp_path, capsys):
    _records(tmp_path, latency=False)
    rows = json.loads(_out(capsys, ["runs", "--json", "--results", str(tmp_path)]).out)
    assert "setting" not in rows[0] and "latency_ms" not in rows[0] and "fid" in rows[0]


def test_runs_without_records_and_with_a_file_for_a_folder(tmp_path, capsys):
    assert _out(capsys, ["runs", "--results", str(tmp_path / "none")]).out == f"no records under {tmp_path / 'none'}\n"
    assert _out(capsys, ["runs", "--stale", "--results", str(tmp_path)]).out == f"no stale records under {tmp_path}\n"
    assert _out(capsys, ["runs", "--prune-stale", "--results", str(tmp_path)]).out == \
        f"no stale records under {tmp_path}\n"
    assert json.loads(_out(capsys, ["runs", "--json", "--results", str(tmp_path)]).out) == []
    (tmp_path / "f").write_text("")
    r = _out(capsys, ["runs", "--results", str(tmp_path / "f")], rc=2)
    assert f"--results {tmp_path / 'f'} is a file, not a folder of records" in r.err


def test_prune_stale_asks_and_deletes_only_the_stale_records(tmp_path, capsys, monkeypatch):
    dense, mag, old, lat = _records(tmp_path)
    r = _out(capsys, ["runs", "--prune-stale", "--results", str(tmp_path)], rc=2)   # pytest's stdin: not a terminal
    assert "--prune-stale would delete 1 record(s); confirm with --yes (standard input is not a terminal)" in r.err
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    asked = []
    for answer in ("", "n", "no thanks"):
        monkeypatch.setattr("builtins.input", lambda q, a=answer: asked.append(q) or a)
        out = _out(capsys, ["runs", "--prune-stale", "--results", str(tmp_path)]).out
        assert out.endswith("nothing deleted\n") and old.path(tmp_path).exists()
    assert asked == ["delete these 1 stale record(s)? [y/N] "] * 3
    stale = old.path(tmp_path).read_text()
    for answer in ("y", " Yes "):
        old.path(tmp_path).write_text(stale)
        monkeypatch.setattr("builtins.input", lambda q, a=answer: a)
        out = _out(capsys, ["runs", "--prune-stale", "--results", str(tmp_path)]).out
        assert out.endswith("deleted 1 stale record(s)\n") and old.key() in out
        assert not old.path(tmp_path).exists()
    assert all(s.path(tmp_path).exists() for s in (dense, mag, lat))


COUNTS = {"scale_0": {"linear": 4, "const": 10, "add": 2}, "decode_image": {"linear": 1, "conv": 3}}


@pytest.fixture
def fake_package(monkeypatch):
    """bench.coreml's package readers faked: two functions' op counts and 3 MiB of weights."""
    import bench.coreml
    monkeypatch.setattr(bench.coreml, "op_counts", lambda p: COUNTS)
    monkeypatch.setattr(bench.coreml, "weights_bytes", lambda p: 3 * 2 ** 20)


def test_coreml_ops_table(capsys, fake_package):
    assert _out(capsys, ["coreml", "ops", "p.mlpackage"]).out.splitlines() == [
        "p.mlpackage: 2 functions, weights 3.00 MiB",
        "op type                  total   scale_0 decode_im",
        "const                       10        10         0",
        "linear                       5         4         1",
        "conv                         3         0         3",
        "add                          2         2         0",
        "ops (without const)         10         6         4"]
    assert json.loads(_out(capsys, ["coreml", "ops", "p.mlpackage", "--json"]).out) == {
        "functions": COUNTS, "weights_bytes": 3 * 2 ** 20}


def test_coreml_export_loads_exports_and_reports(tmp_path, capsys, monkeypatch, fake_package):
    import bench.coreml
    import bench.runner
    from bench.method import Context
    from bench.plan import RANDOM_CKPT
    seen = {}

    def prepared(spec, device, ckpt_dir, progress):
        seen["prepared"] = (spec, device, progress)
        ctx = Context(progress=False)
        ctx.notes.append("a note")
        return type("Gen", (), {"patch_nums": (1, 2, 3)})(), ctx, None

    def export(gen, out, batch, precision, progress, metadata):
        seen["export"] = (out, batch, precision, progress, metadata)
        return out
    monkeypatch.setattr(bench.coreml, "_ct", lambda: seen.setdefault("ct", True))
    monkeypatch.setattr(bench.runner, "prepared_generator", prepared)
    monkeypatch.setattr(bench.coreml, "export", export)
    out = str(tmp_path / "m.mlpackage")
    r = _out(capsys, ["coreml", "export", "tiny-var", "--out", out, "--random-weights", "--seed", "7", "--batch", "2",
                      "--precision", "fp32", "--method", "magnitude:sparsity=0.4"])
    assert r.out == f"wrote {out}: functions scale_0, decode_image; 10 ops (without const), weights 3.00 MiB (fp32)\n"
    spec, device, progress = seen["prepared"]
    assert (spec.model, spec.bench, spec.seed, device, progress) == ("tiny-var", "latency", 7, "cpu", True)
    assert spec.ckpt == {RANDOM_CKPT: "torch.manual_seed(7)"} and seen["ct"]
    assert seen["export"] == (out, 2, "fp32", True, {
        "model": "tiny-var", "methods": list(spec.methods), "ckpt": spec.ckpt, "batch": 2, "precision": "fp32",
        "patch_nums": [1, 2, 3], "notes": ["a note"]})
    assert spec.methods[0].startswith("magnitude:") and "sparsity=0.4" in spec.methods[0]
    seen.clear()
    _out(capsys, ["coreml", "export", "tiny-var", "--out", out, "--quiet"])
    spec, _, progress = seen["prepared"]
    assert progress is False and seen["export"][1:4] == (1, "fp16", False) and spec.methods == ()
    assert RANDOM_CKPT not in spec.ckpt and spec.ckpt                    # the shipped checkpoint's files
    assert spec.n == 3                                                  # the latency bench's smallest run
    for argv, msg in ((["--batch", "0"], "--batch 0: must be in [1, 4096]"), (["--batch", "4097"], "--batch 4097: must be in [1, 4096]"),
                      (["--out", str(tmp_path / "m.zip")],
                       f"--out {tmp_path / 'm.zip'}: a Core ML package path must end in .mlpackage")):
        seen.clear()
        r = _out(capsys, ["coreml", "export", "tiny-var", "--out", out, *argv], rc=2)
        assert r.err == f"varbench: error: {msg}\n" and not seen       # refused before loading anything
    # the paper world without its checkpoints: random weights need no file, the checkpoint does
    _out(capsys, ["coreml", "export", "var-d16", "--out", out, "--random-weights", "--quiet"])
    assert seen["prepared"][0].ckpt == {RANDOM_CKPT: "torch.manual_seed(0)"}
    seen.clear()
    r = _out(capsys, ["coreml", "export", "var-d16", "--out", out, "--quiet"], rc=2)
    assert "var_d16.pth" in r.err and not seen


def test_figures_exit_codes_say_what_was_drawn(tmp_path, capsys, monkeypatch):
    import bench.figures
    drawn = []

    def render(name, world, root, out, records):
        assert records == {}                                            # read once by the command, passed on
        if name.startswith("bad"):
            raise ValueError(f"figure {name}: no records")
        drawn.append((name, world, root, out))
        return [tmp_path / f"{name}.png", tmp_path / f"{name}.pdf"]
    def load_figure(name):
        if name not in ("a", "bad1", "bad2", "b"):
            raise bench.figures.FigureSpecError(f"unknown figure {name!r}")
        return {}
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bench.figures, "render", render)
    monkeypatch.setattr(bench.figures, "load_figure", load_figure)
    monkeypatch.setattr(bench.figures, "figure_names", lambda: ["a", "bad1", "b"])
    r = _out(capsys, ["figures", "--results", "R", "--out", "O"])
    assert r.out == f"wrote {tmp_path / 'a.png'} {tmp_path / 'a.pdf'}\nwrote {tmp_path / 'b.png'} {tmp_path / 'b.pdf'}\n"
    assert r.err == ("varbench: figure bad1: no records\n"
                     "varbench: 1 of 3 figures not drawn (above: the records each needs)\n")
    assert drawn == [("a", "tiny", "R", "O"), ("b", "tiny", "R", "O")]
    drawn.clear()
    r = _out(capsys, ["figures", "all", "--world", "paper"])
    assert [d[:2] for d in drawn] == [("a", "paper"), ("b", "paper")] and "1 of 3" in r.err
    r = _out(capsys, ["figures", "bad1", "bad2"], rc=2)                # none drawn: an error exit
    assert r.out == "" and r.err.endswith("varbench: 2 of 2 figures not drawn (above: the records each needs)\n")
    r = _out(capsys, ["figures", "bad1"], rc=2)                        # one figure: its own error, no summary
    assert r.err == "varbench: error: figure bad1: no records\n"
    r = _out(capsys, ["figures", "a", "b"])                            # all drawn: no summary
    assert r.err == "" and r.out.count("wrote ") == 2
    drawn.clear()
    r = _out(capsys, ["figures", "b"])
    assert r.err == "" and [d[0] for d in drawn] == ["b"]
    # a mistyped name or 'all' among names: nothing is drawn, an error exit
    drawn.clear()
    r = _out(capsys, ["figures", "a", "bb"], rc=2)
    assert r.err == "varbench: error: unknown figure 'bb'\n" and drawn == []
    r = _out(capsys, ["figures", "all", "a"], rc=2)
    assert r.err == "varbench: error: 'all' draws every figure: give it alone, or name the figures (all a)\n" and drawn == []
    r = _out(capsys, ["figures", "a", "a"])                            # a name given twice is drawn once
    assert [d[0] for d in drawn] == ["a"]
    (tmp_path / "F").write_text("")
    r = _out(capsys, ["figures", "a", "--out", "F"], rc=2)
    assert r.err == "varbench: error: figures output folder F/tiny: F is a file, not a folder\n"
    r = _out(capsys, ["figures", "a", "--results", "F"], rc=2)
    assert r.err == "varbench: error: --results F is a file, not a folder of records\n"


def test_metric_catalogue_entries_check_their_direction_and_compute_lazily():
    from bench.metrics.catalog import BETTER, MetricInfo
    from bench.registry import METRICS
    assert BETTER == ("lower", "higher", None)
    for better, higher in (("lower", False), ("higher", True), (None, None)):
        info = MetricInfo("m", "M", better, "{}", "d")
        assert info.better == better and info.higher_is_better is higher
    for bad in ("up", "Lower", ""):
        with pytest.raises(ValueError) as e:
            MetricInfo("m", "M", bad, "{}", "d")
        assert str(e.value) == f"metric m: better must be one of ('lower', 'higher', None), got {bad!r}"
    with pytest.raises(TypeError) as e:
        METRICS.get("class_acc")([1.0])
    assert str(e.value) == "metric 'class_acc' is computed by its bench, not on its own"
    assert MetricInfo("j", "J", None, "{}", "d", compute="os.path:join")("a", "b", "c") == "a/b/c"   # args passed on
    assert MetricInfo("k", "K", None, "{}", "d", compute="builtins:dict")(a=1) == {"a": 1}         # and keywords


def test_run_passes_the_spec_and_flags_to_the_runner_and_prints_the_record(tmp_path, capsys, monkeypatch):
    import bench.runner
    import bench.shard
    seen = {}

    def run(spec, root, force, ckpt_dir, progress, device):
        seen.update(spec=spec, root=root, force=force, ckpt_dir=ckpt_dir, progress=progress, device=device)
        return {"run_id": spec.key(), "spec": {"methods": list(spec.methods)},
                "metrics": {"fid": {"value": 3.5, "stderr": 0.1}, "is": {"value": 7.0}}, "cost": {"params": 42}}
    monkeypatch.setattr(bench.runner, "run", run)
    text = _out(capsys, ["run", "--model", "tiny-var", "--method", "magnitude:sparsity=0.4", "--n", "12",
                         "--seed", "3", "--results", str(tmp_path), "--cfg", "2.5", "--fidelity"]).out
    out = json.loads(text)
    assert text.startswith('{\n "run_id": ')               # one-space indent, keys in this order
    spec = seen["spec"]
    assert (spec.model, spec.n, spec.seed, spec.world, spec.bench) == ("tiny-var", 12, 3, "tiny", "shapes-c2i")
    assert spec.protocol["fidelity"] is True and spec.sampling["cfg"] == 2.5
    assert (seen["root"], seen["force"], seen["progress"], seen["device"]) == (str(tmp_path), False, True, "cpu")
    assert out == {"run_id": spec.key(), "path": str(spec.path(str(tmp_path))), "methods": list(spec.methods),
                   "metrics": {"fid": 3.5, "is": 7.0}, "params": 42}
    _out(capsys, ["run", "--model", "tiny-var", "--n", "12", "--results", str(tmp_path), "--force", "--quiet",
                  "--bench", "shapes-c2i"])
    assert (seen["force"], seen["progress"]) == (True, False) and "fidelity" not in seen["spec"].protocol
    assert seen["spec"].methods == () and seen["spec"].sampling["cfg"] != 2.5
    monkeypatch.setattr(bench.shard, "rank", lambda: 1)                 # torchrun: only rank 0 prints
    assert _out(capsys, ["run", "--model", "tiny-var", "--n", "12", "--results", str(tmp_path)]).out == ""
    r = _out(capsys, ["run", "--model", "tiny-var", "--bench", "latency"], rc=2)
    assert r.err.endswith("--bench latency is not an image bench: run it with `varbench latency`\n")


def test_leaderboard_prints_its_markdown_and_says_what_it_wrote(tmp_path, capsys):
    _records(tmp_path / "r")
    r = _out(capsys, ["leaderboard", "--results", str(tmp_path / "r"), "--out", str(tmp_path / "o")])
    out = tmp_path / "o" / "tiny"
    assert r.out == (out / "leaderboard.md").read_text(encoding="utf-8")
    paths = ", ".join(str(out / f"leaderboard.{f}") for f in ("md", "tex", "html", "json"))
    assert r.err == f"wrote {paths} (3 current records; 1 stale not shown)\n"
    old = _records(tmp_path / "r2")[2]
    old.path(tmp_path / "r2").unlink()                  # no stale record: no "stale not shown"
    r = _out(capsys, ["leaderboard", "--results", str(tmp_path / "r2"), "--out", str(tmp_path / "o2")])
    assert r.err.endswith("(3 current records)\n")
    (tmp_path / "f").write_text("")
    r = _out(capsys, ["leaderboard", "--results", str(tmp_path / "f")], rc=2)
    assert f"--results {tmp_path / 'f'} is a file, not a folder of records" in r.err
    r = _out(capsys, ["leaderboard", "--results", str(tmp_path / "r"), "--out", str(tmp_path / "f")], rc=2)
    assert r.err == f"varbench: error: leaderboard output folder {tmp_path / 'f'}: {tmp_path / 'f'} is a file, not a folder\n"


def test_runs_shows_the_headline_metrics_in_a_fixed_order(tmp_path, capsys):
    from tests.test_leaderboard import _write
    _write(tmp_path, "dense", {"fid_star": 1.25, "class_acc": 0.5, "is": 9.0, "fid": 5.0, "psnr": 30.0}, {})
    _write(tmp_path, "dense", {"geneval": 0.75}, {}, seed=1)
    text = _out(capsys, ["runs", "--json", "--results", str(tmp_path)]).out
    assert text.startswith('[\n {\n  "run_id":"')                 # pandas' records, one-space indent
    rows = json.loads(text)
    assert list(rows[0]) == ["run_id", "world", "model", "bench", "methods", "n", "seed", "fid", "is", "class_acc",
                             "geneval", "fid_star", "age", "stale", "why", "path"]      # psnr: not a listing column
    by_seed = {r["seed"]: r for r in rows}
    assert (by_seed[0]["class_acc"], by_seed[0]["fid_star"], by_seed[1]["geneval"]) == (0.5, 1.25, 0.75)
