"""What the folder commands (`varbench geneval` / `mjhq` generate, score, import) do with bad input:
out-of-range options, incomplete folders, damaged metadata and images, empty paths and a file where a
folder belongs (or the other way round). Each is refused (or, for an incomplete folder, warned about)
with a message naming the thing and saying what to do, before any work and without a traceback."""
import json
import os
from pathlib import Path

import pandas as pd
import pytest
import torch

from bench.benches import geneval as gb
from bench.benches import mjhq as mb
from bench.metrics import geneval as ge
from tests.conftest import cli

RANGE = "a number in [0, 1]"
WHOLE = "a whole number ≥ 1"


class Fake:
    """A text-to-image generator stand-in: noise images (large enough that a cut PNG is a truncated one)."""

    def __init__(self):
        self.calls = 0

    def generate(self, prompts, seed=0, **kw):
        self.calls += 1
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, 256, (len(prompts), 3, 32, 32), generator=g, dtype=torch.uint8)


def _cut(path: Path) -> None:
    """Truncate an image file as a killed copy would."""
    path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])


# ---------------------------------------------------------------------------------------- options
@pytest.mark.parametrize("key, value, want", [
    ("threshold", "-5", RANGE), ("threshold", "abc", RANGE), ("threshold", "inf", RANGE), ("threshold", None, RANGE),
    ("counting_threshold", "7", RANGE), ("position_threshold", "nan", RANGE), ("max_overlap", 1.5, RANGE),
    ("max_objects", "-3", WHOLE), ("max_objects", "0", WHOLE), ("max_objects", "2.5", WHOLE),
    ("max_objects", 2.5, WHOLE), ("max_objects", True, WHOLE)])
def test_geneval_options_are_refused_outside_their_range_by_name(key, value, want):
    with pytest.raises(ValueError) as e:
        ge._options({key: value})
    assert str(e.value) == f"GenEval option {key}={value}: expected {want} (the official default is {ge.DEFAULTS[key]})"


def test_geneval_options_in_range_keep_their_types_and_edges():
    opts = ge._options({"threshold": "0", "counting_threshold": "1", "max_objects": "2", "max_overlap": 0.5,
                        "position_threshold": "1e-1"})
    assert opts == {"threshold": 0.0, "counting_threshold": 1.0, "max_objects": 2, "max_overlap": 0.5,
                    "position_threshold": 0.1}
    assert type(opts["max_objects"]) is int and ge._options({"max_objects": 3.0})["max_objects"] == 3


def test_geneval_score_refuses_bad_options_before_reading_the_folder(tmp_path, capsys):
    r = cli(capsys, ["geneval", "score", str(tmp_path / "nowhere"), "--options", "threshold=-5"], rc=2)
    assert r.err == "varbench: error: GenEval option threshold=-5: expected a number in [0, 1] (the official default is 0.3)\n"
    r = cli(capsys, ["geneval", "score", str(tmp_path), "--options", "max_objects=-3", "counting_threshold=7"], rc=2)
    assert r.err == "varbench: error: GenEval option max_objects=-3: expected a whole number ≥ 1 (the official default is 16)\n"


# ---------------------------------------------------------------------------------------- incomplete folders
def _frame(rows, counts, spell=json.dumps):
    """A results frame of a folder holding ``counts[i]`` images of prompt i (its metadata spelt by ``spell``)."""
    return pd.DataFrame([{"filename": str(Path("f") / f"{i:05d}" / "samples" / f"{k:04d}.png"), "tag": rows[i]["tag"],
                          "metadata": spell(rows[i]), "correct": True}
                         for i, c in enumerate(counts) for k in range(c)])


def test_missing_of_counts_what_a_folder_lacks_prompt_by_prompt():
    rows = gb.shapes_metadata(per_tag=1)                      # one prompt per task, in GenEval's order
    assert gb.missing_of(_frame(rows, [4] * 6), rows) is None
    # the official generator's spelling (other key order and spacing) is the same prompt
    assert gb.missing_of(_frame(rows, [4] * 6, lambda r: json.dumps(dict(reversed(r.items())), indent=1)), rows) is None
    assert gb.missing_of(_frame(rows, [4, 4, 4, 4, 4, 3]), rows) == \
        "missing 1 of the 24 images (1 prompt(s) with fewer than 4)"
    assert gb.missing_of(_frame(rows, [4, 4, 2, 0, 0, 0]), rows) == (
        "missing 14 of the 24 images (3 of the 6 prompts with none, 1 prompt(s) with fewer than 4); no image of the "
        "task(s) colors, position, color_attr: the overall score geneval is the mean over the 3 task(s) present only "
        "(single_object, two_object, counting)")
    # prompts are counted by index: a repeated row is two prompts, another prompt in a folder is not this one
    assert gb.missing_of(_frame(rows[:1] * 2, [4]), rows[:1] * 2) == "missing 4 of the 8 images (1 of the 2 prompts with none)"
    other = _frame([rows[1]], [4])
    assert gb.missing_of(other, rows[:1]) == (
        "missing 4 of the 4 images (1 of the 1 prompts with none); no image of the task(s) single_object: the overall "
        "score geneval is the mean over the 1 task(s) present only (two_object)")


def test_an_incomplete_folder_is_scored_as_it_is_with_a_warning(tmp_path, capsys):
    rows = gb.shapes_metadata()                               # shapes-geneval's 240 prompts
    folder = tmp_path / "g"
    for i, k in enumerate((4, 3)):                            # two single_object prompts, one image short
        gb.write_prompt(folder, i, rows[i], torch.zeros(k, 3, 8, 8, dtype=torch.uint8))
    r = cli(capsys, ["geneval", "score", str(folder), "--quiet"])
    assert r.err == (f"varbench: warning: {folder} is not a complete shapes-geneval folder: missing 953 of the 960 "
                     f"images (238 of the 240 prompts with none, 1 prompt(s) with fewer than 4); no image of the task(s) "
                     f"two_object, counting, colors, position, color_attr: the overall score geneval is the mean over "
                     f"the 1 task(s) present only (single_object); scored as it is (`varbench geneval generate {folder} "
                     f"--bench shapes-geneval` adds what is missing)\n")
    assert [line.split()[0] for line in r.out.splitlines()] == ["geneval_single_object", "geneval", "geneval_images",
                                                                "geneval_prompts"]


# ---------------------------------------------------------------------------------------- damaged files
def test_a_damaged_metadata_file_is_named_with_its_line_and_generation_redoes_it(tmp_path, capsys):
    rows = gb.shapes_metadata(per_tag=1)[:2]
    folder = tmp_path / "g"
    gb.generate_folder(Fake(), rows, folder, 0, {}, n=2, progress=False)
    meta = folder / "00001" / "metadata.jsonl"
    meta.write_text('{"tag": "single_object",\n "incl\tude": []}\n')
    told = (f"{meta}: not JSON (Invalid control character at: line 2 column 7); delete that file and generate the "
            f"folder again (`varbench geneval generate` redoes the prompts it lacks)")
    for call in (lambda: gb.scan_folder(folder), lambda: gb.generate_folder(Fake(), rows, folder, 0, {}, n=2)):
        with pytest.raises(ValueError) as e:
            call()
        assert str(e.value) == told
    assert cli(capsys, ["geneval", "score", str(folder), "--quiet"], rc=2).err == f"varbench: error: {told}\n"
    meta.write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match=rf"^{meta}: not JSON \(not UTF-8 text\); delete that file"):
        gb.scan_folder(folder)
    meta.unlink()                                             # the remedy the message gives
    assert gb.generate_folder(Fake(), rows, folder, 0, {}, n=2, progress=False) == 1
    assert [r for _, r, _ in gb.scan_folder(folder, rows, n=2)] == rows


def test_an_unreadable_geneval_image_is_named_and_generation_redoes_it(tmp_path, capsys):
    from bench.metrics.geneval_detectors import ShapesDetector
    rows = gb.shapes_metadata(per_tag=1)[:2]
    folder = tmp_path / "g"
    gb.generate_folder(Fake(), rows, folder, 0, {}, n=2, progress=False)
    bad = folder / "00001" / "samples" / "0000.png"
    _cut(bad)
    tail = ("; delete it and generate the folder again (`varbench geneval generate` redoes the prompts whose images "
            "are missing)")
    with pytest.raises(ValueError) as e:
        gb.score_folder(folder, ShapesDetector(), progress=False)
    assert str(e.value) == f"{bad}: unreadable image (image file is truncated){tail}"
    bad.write_text("not an image")
    err = cli(capsys, ["geneval", "score", str(folder), "--quiet"], rc=2).err
    assert err.startswith(f"varbench: error: {bad}: unreadable image (") and err.endswith(f"{tail}\n")
    bad.unlink()                                              # the remedy the message gives
    assert gb.generate_folder(Fake(), rows, folder, 0, {}, n=2, progress=False) == 1
    assert len(gb.score_folder(folder, ShapesDetector(), progress=False)) == 4


def test_an_unreadable_mjhq_image_is_named_and_generation_redoes_it(tmp_path):
    b = mb.ShapesMJHQ()
    out = tmp_path / "m"
    assert mb.generate_folder(Fake(), b, out, 12, seed=0, sampling={}, progress=False) == 12
    r = b.chosen(12).iloc[5]
    bad = out / r["category"] / f"{r['id']}.png"
    _cut(bad)

    def stream(gen, bench, prompts, seed, sampling, cached, progress, desc):
        return {"features": cached(0, len(prompts)).float().flatten(1)}, {}, {}

    class Scoring(mb.ShapesMJHQ):
        def score(self, feats, labels, seed=0, progress=True):
            return {"images": len(feats["features"])}
    with pytest.raises(ValueError) as e:
        mb.score_folder(Scoring(), out, 12, stream, progress=False)
    assert str(e.value) == (f"{bad}: unreadable image (image file is truncated); delete it and generate it again "
                            f"(`varbench mjhq generate {out} --bench shapes-mjhq --n 12` redoes the missing images)")
    bad.unlink()                                              # the remedy the message gives
    assert mb.generate_folder(Fake(), b, out, 12, seed=0, sampling={}, progress=False) == 1
    assert mb.score_folder(Scoring(), out, 12, stream, progress=False) == {"images": 12}


# ---------------------------------------------------------------------------------------- paths
def test_folder_commands_refuse_empty_paths_and_the_wrong_kind_of_path_before_any_work(tmp_path, capsys, monkeypatch):
    from bench.registry import BENCHES
    monkeypatch.chdir(tmp_path)
    for module in (gb, mb):
        monkeypatch.setattr(module, "generate_folder", lambda *a, **k: pytest.fail("generated"))
        monkeypatch.setattr(module, "score_folder", lambda *a, **k: pytest.fail("scored"))
    monkeypatch.setattr(BENCHES.get("shapes-mjhq"), "preflight", lambda self: None)
    Path("f.json").write_text("{}")
    Path("adir").mkdir()
    empty = 'is an empty path (""): give one, e.g.'
    for argv, message in [
            (["geneval", "generate", ""], "output folder: the path is empty; give a folder"),
            (["mjhq", "generate", "", "--n", "12"], "output folder: the path is empty; give a folder"),
            (["geneval", "score", ""], f"the image folder {empty} geneval_images"),
            (["mjhq", "score", " ", "--n", "12"], f"the image folder {empty} mjhq_images"),
            (["geneval", "score", "g", "--out", ""], "--out: the path is empty; give a file name"),
            (["geneval", "import", ""], f"the results file {empty} results.jsonl"),
            (["geneval", "generate", "f.json"], "output folder f.json: f.json is a file, not a folder"),
            (["mjhq", "generate", "f.json", "--n", "12"], "output folder f.json: f.json is a file, not a folder"),
            (["geneval", "score", "g", "--out", "adir"],
             f"--out adir is a folder; give a file name (e.g. {Path('adir') / 'results.jsonl'})"),
            (["geneval", "score", "g", "--out", "f.json/r.jsonl"], "--out f.json/r.jsonl: its folder f.json: f.json is a file, not a folder"),
            (["geneval", "import", "adir"],
             "GenEval results adir is a folder, not a file: give the results file (the --outfile of "
             "evaluation/evaluate_images.py)")]:
        assert cli(capsys, argv, rc=2).err == f"varbench: error: {message}\n", argv
    assert sorted(os.listdir(tmp_path)) == ["adir", "f.json"] and not os.listdir("adir")     # nothing written
    monkeypatch.undo()
    r = cli(capsys, ["geneval", "score", str(tmp_path / "f.json")], rc=2)
    assert r.err == f"varbench: error: GenEval image folder {tmp_path / 'f.json'} is a file, not a folder\n"
