"""The commands that take prompts: `sample` (one grid of the prompts' images) and `geneval generate` /
`score` (image folders in GenEval's layout), with the folder workers faked where the command only
passes its flags on."""
import json

import pytest

from tests.conftest import cli as _out


def test_sample_generates_the_prompts_n_times_into_one_grid(tmp_path, capsys, monkeypatch):
    import torch

    import bench.image_grid
    from bench.registry import MODELS
    grids = []
    monkeypatch.setattr(bench.image_grid, "save_grid",
                        lambda imgs, caps, path, cols: grids.append((imgs, caps, path, cols)) or path)
    out = tmp_path / "g.png"
    r = _out(capsys, ["sample", "tiny-t2i", "--prompt", "a red circle", "--prompt", "a blue square", "--n", "2",
                      "--seed", "3", "--cfg", "2.5", "--top-k", "0", "--out", str(out)])
    card = MODELS.get("tiny-t2i")
    sampling = {**card.sampling, "cfg": 2.5, "top_k": 0}
    assert r.out == (f"wrote {out}: 4 image(s) of tiny-t2i, seed 3, "
                     + ", ".join(f"{k} {v}" for k, v in sampling.items()) + "\n")
    (imgs, caps, path, cols), = grids
    prompts = ["a red circle", "a red circle", "a blue square", "a blue square"]
    assert caps == prompts and str(path) == str(out) and cols == 2
    want = card(None, device="cpu").eval().generate(prompts, seed=3, **sampling)
    assert torch.equal(imgs, want)
    r = _out(capsys, ["sample", "tiny-t2i", "--prompt", "a red circle", "--n", "1", "--tau", "0.5", "--out", str(out)])
    assert f"{out}: 1 image(s) of tiny-t2i, seed 0, " in r.out and "tau 0.5" in r.out and len(grids) == 2


def test_sample_refuses_before_loading(tmp_path, capsys, monkeypatch):
    from bench.registry import MODELS
    card = type(MODELS.get("tiny-t2i"))
    monkeypatch.setattr(card, "__call__", lambda *a, **k: pytest.fail("loaded"))
    r = _out(capsys, ["sample", "tiny-var", "--prompt", "a red circle", "--out", "x.png"], rc=2)
    assert r.err == ("varbench: error: `varbench sample` takes a text-to-image model (hart-0.7b, infinity-2b, tiny-t2i); "
                     "tiny-var is not one\n")
    for n in ("0", "65"):
        r = _out(capsys, ["sample", "tiny-t2i", "--prompt", "a red circle", "--n", n, "--out", "x.png"], rc=2)
        assert r.err == f"varbench: error: --n {n} is out of range [1, 64]\n"
    r = _out(capsys, ["sample", "tiny-t2i", "--prompt", "a purple unicorn", "--out", "x.png"], rc=2)
    assert "unicorn" in r.err
    r = _out(capsys, ["sample", "tiny-t2i", "--prompt", "a red circle", "--cfg", "-1", "--out", "x.png"], rc=2)
    assert "cfg" in r.err
    # where the grid goes: a file name with an image extension, in a folder that can be written
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.png").mkdir()
    (tmp_path / "f").write_text("")
    for out, message in [("", "--out: the path is empty; give a file name"),
                         ("d.png", "--out d.png is a folder; give a file name (e.g. d.png/grid.png)"),
                         ("grid", "--out grid: give an image file name ending in .png, .jpg, .jpeg, .pdf, .svg"),
                         ("f/grid.png", "--out f/grid.png: its folder f: f is a file, not a folder")]:
        r = _out(capsys, ["sample", "tiny-t2i", "--prompt", "a red circle", "--out", out], rc=2)
        assert r.err == f"varbench: error: {message}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.png", "f"]


def test_geneval_generate_and_score_folders(tmp_path, capsys, monkeypatch):
    import pandas as pd

    import bench.benches.geneval as bg
    from bench.registry import BENCHES, MODELS
    seen = {}

    def generate_folder(gen, rows, out, seed, sampling, per_prompt, progress):
        seen["generate"] = (type(gen).__name__, len(rows), out, seed, sampling, per_prompt, progress)
        return 5
    monkeypatch.setattr(bg, "generate_folder", generate_folder)
    out = str(tmp_path / "imgs")
    r = _out(capsys, ["geneval", "generate", out, "--seed", "4", "--top-p", "0.5", "--quiet"])
    rows = BENCHES.get("shapes-geneval")().rows()
    sampling = {**MODELS.get("tiny-t2i").sampling, "top_p": 0.5}
    assert seen["generate"] == ("T2IGenerator", len(rows), out, 4, sampling, bg.IMAGES_PER_PROMPT, False)
    assert r.out == (f"{out}: 5 prompt(s) generated now, {len(rows) - 5} already there; score it with "
                     f"`varbench geneval score {out} --bench shapes-geneval`\n")
    r = _out(capsys, ["geneval", "generate", out, "--model", "tiny-var"], rc=2)
    assert "--model tiny-var is not a text-to-image model (hart-0.7b, infinity-2b, tiny-t2i)" in r.err
    for argv in (["--model", "tiny-var"], ["--cfg", "-1"], ["--device", "tpu"]):   # refused: no folder made
        r = _out(capsys, ["geneval", "generate", str(tmp_path / "never"), *argv], rc=2)
        assert not (tmp_path / "never").exists(), argv

    frame = pd.DataFrame([{"filename": "a.png", "tag": "single_object", "correct": True, "metadata": "p1"},
                          {"filename": "b.png", "tag": "colors", "correct": False, "metadata": "p2"},
                          {"filename": "c.png", "tag": "colors", "correct": True, "metadata": "p2"},
                          {"filename": "d.png", "tag": "colors", "correct": False, "metadata": "p3"}])

    def score_folder(folder, detector, options, progress):
        seen["score"] = (folder, type(detector).__name__, options, progress)
        return frame
    monkeypatch.setattr(bg, "score_folder", score_folder)
    res = tmp_path / "results.jsonl"
    r = _out(capsys, ["geneval", "score", out, "--options", "threshold=0.5", "max_objects=a=b", "--out", str(res)])
    assert seen["score"] == (out, "ShapesDetector", {"threshold": "0.5", "max_objects": "a=b"}, True)
    assert pd.read_json(res, orient="records", lines=True).to_dict("records") == frame.to_dict("records")
    assert r.out.splitlines() == ["geneval_single_object        1.0000", "geneval_colors               0.3333",
                                  "geneval                      0.6667", "geneval_images               0.5000",
                                  "geneval_prompts              0.6667"]
    raw = _out(capsys, ["geneval", "score", out, "--json", "--quiet"]).out
    assert raw.startswith('{\n "geneval_single_object": 1.0,\n')      # one-space indent
    js = json.loads(raw)
    assert js["geneval"] == pytest.approx(2 / 3) and seen["score"][2:] == ({}, False)
    r = _out(capsys, ["geneval", "score", out, "--options", "threshold=0.5", "counting", "x"], rc=2)
    assert r.err.endswith("--options counting x: give KEY=VALUE, e.g. --options threshold=0.3\n")


def test_folder_commands_name_the_benches_that_fit(tmp_path, capsys):
    r = _out(capsys, ["geneval", "score", str(tmp_path), "--bench", "shapes-c2i"], rc=2)
    assert r.err == "varbench: error: --bench shapes-c2i is not a GenEval bench; GenEval benches: geneval, shapes-geneval\n"
    r = _out(capsys, ["mjhq", "score", str(tmp_path), "--bench", "shapes-geneval"], rc=2)
    assert r.err == "varbench: error: --bench shapes-geneval is not an MJHQ bench; MJHQ benches: mjhq30k, shapes-mjhq\n"


def test_mjhq_generate_and_score_check_the_bench_first_and_print_what_they_did(tmp_path, capsys, monkeypatch):
    import bench.benches.mjhq as bm
    from bench.registry import BENCHES
    seen = []
    monkeypatch.setattr(BENCHES.get("shapes-mjhq"), "preflight", lambda self: seen.append("preflight"))

    def generate_folder(gen, bench, out, n, seed, sampling, progress):
        seen.append(("generate", type(gen).__name__, bench.name, out, n, seed, sampling["top_k"], progress))
        return 7

    def score_folder(bench, folder, n, features, progress):
        seen.append(("score", bench.name, folder, n, features.__name__, progress))
        return {"fid": {"value": 1.23456, "stderr": 0.1}, "clip_score": {"value": 30.0}}
    monkeypatch.setattr(bm, "generate_folder", generate_folder)
    monkeypatch.setattr(bm, "score_folder", score_folder)
    out = str(tmp_path / "m")
    r = _out(capsys, ["mjhq", "generate", out, "--n", "12", "--seed", "1", "--top-k", "3"])
    assert seen == ["preflight", ("generate", "T2IGenerator", "shapes-mjhq", out, 12, 1, 3, True)]
    assert r.out == (f"{out}: 7 image(s) generated now, 5 already there; score it with "
                     f"`varbench mjhq score {out} --bench shapes-mjhq --n 12`\n")
    seen.clear()
    _out(capsys, ["mjhq", "generate", out, "--n", "12", "--quiet"])
    assert seen[1][-1] is False
    seen.clear()
    r = _out(capsys, ["mjhq", "score", out, "--n", "12"])
    assert seen == ["preflight", ("score", "shapes-mjhq", out, 12, "sample_features", True)]
    assert r.out == "fid                          1.2346\nclip_score                   30.0000\n"
    raw = _out(capsys, ["mjhq", "score", out, "--n", "12", "--json", "--quiet"]).out
    assert raw.startswith('{\n "fid": {\n  "value": 1.23456,') and seen[-1][-1] is False


def test_sample_takes_up_to_64_images_per_prompt_and_every_sampling_flag(tmp_path, capsys, monkeypatch):
    import torch

    import bench.image_grid
    from bench.registry import MODELS
    calls = []

    class Gen:
        def eval(self):
            return self

        def generate(self, prompts, seed, **sampling):
            calls.append((len(prompts), seed, sampling))
            return torch.zeros(len(prompts), 3, 4, 4, dtype=torch.uint8)
    monkeypatch.setattr(type(MODELS.get("tiny-t2i")), "__call__", lambda self, ckpt_dir, device: Gen())
    monkeypatch.setattr(bench.image_grid, "save_grid", lambda imgs, caps, path, cols: None)
    r = _out(capsys, ["sample", "tiny-t2i", "--prompt", "a red circle", "--n", "64", "--top-p", "0.5", "--top-k", "2",
                      "--cfg", "1.5", "--tau", "0.7", "--out", str(tmp_path / "g.png")])
    assert calls == [(64, 0, {**MODELS.get("tiny-t2i").sampling, "cfg": 1.5, "tau": 0.7, "top_k": 2, "top_p": 0.5})]
    assert "64 image(s) of tiny-t2i" in r.out and "top_p 0.5" in r.out
