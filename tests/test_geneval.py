"""GenEval: the scoring rules against the official evaluator, hand-computed verdicts for every task,
the shapes detector against the scene generator's ground truth, the folder layout."""
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from bench.benches import geneval as gb
from bench.metrics import geneval as ge

GOLDEN = Path(__file__).parent / "fixtures" / "official" / "geneval_golden.json"


def _objects(dets, tag, options=None):
    boxes = {c: np.array(b, dtype=np.float32).reshape(-1, 5) for c, b in dets.items()}   # mmdet gives float32
    return ge.keep_detections(boxes, None, tag, options)


def _norm(reason: str) -> str:
    """The official joins a *set* of relations ("right of and below"): its order follows string hashing."""
    return re.sub(r"found (.*?) target", lambda m: "found " + " and ".join(sorted(m.group(1).split(" and "))) + " target",
                  reason)


def test_matches_the_official_evaluator_on_900_seeded_cases():
    gold = json.loads(GOLDEN.read_text())
    assert len(gold["cases"]) == 900
    tags = {c["metadata"]["tag"] for c in gold["cases"]}
    assert tags == set(ge.TAGS)
    assert {c["correct"] for c in gold["cases"] if c["metadata"]["tag"] == "counting"} == {True, False}
    for i, case in enumerate(gold["cases"]):
        m, opts = case["metadata"], case["options"]
        objects = _objects(case["detections"], m["tag"], opts)

        def colours(objs, cls, case=case):
            return [case["colours"][f"{float(o[0][4]):.6f}"] for o in objs]
        ok, reason = ge.evaluate(objects, m, colours, opts.get("position_threshold", 0.1))
        assert ok == case["correct"], (i, m["prompt"], reason, case["reason"])
        assert _norm(reason) == _norm(case["reason"]), i
        assert {k: [b.tolist() for b, _ in v] for k, v in objects.items()} == case["details"], i


def _box(x1, y1, x2, y2, score=0.99):
    return [x1, y1, x2, y2, score]


def _eval(meta, dets, colours=None):
    objects = _objects(dets, meta["tag"])
    col = None if colours is None else (lambda objs, cls: [colours[cls][j] for j in range(len(objs))])
    return ge.evaluate(objects, meta, col)


def test_single_and_two_object_need_every_class():
    single = {"tag": "single_object", "include": [{"class": "bench", "count": 1}], "prompt": "a photo of a bench"}
    assert _eval(single, {"bench": [_box(0, 0, 10, 10)]}) == (True, "")
    assert _eval(single, {"bench": [_box(0, 0, 10, 10, 0.3)]}) == (False, "expected bench>=1, found 0")   # not > 0.3
    two = {"tag": "two_object", "include": [{"class": "bench", "count": 1}, {"class": "dog", "count": 1}],
           "prompt": "a photo of a bench and a dog"}
    assert _eval(two, {"bench": [_box(0, 0, 10, 10)], "dog": [_box(20, 0, 30, 10)]}) == (True, "")
    assert _eval(two, {"bench": [_box(0, 0, 10, 10)]}) == (False, "expected dog>=1, found 0")


def test_counting_is_exact_only_through_the_exclude_clause_and_uses_the_0_9_threshold():
    meta = {"tag": "counting", "include": [{"class": "clock", "count": 2}], "exclude": [{"class": "clock", "count": 3}],
            "prompt": "a photo of two clocks"}
    two = [_box(0, 0, 10, 10), _box(20, 0, 30, 10)]
    assert _eval(meta, {"clock": two}) == (True, "")
    assert _eval(meta, {"clock": two + [_box(40, 0, 50, 10)]}) == (False, "expected clock<3, found 3")
    assert _eval(meta, {"clock": two + [_box(40, 0, 50, 10, 0.85)]}) == (True, "")     # 0.85 < 0.9: dropped
    assert _eval(meta, {"clock": two[:1]}) == (False, "expected clock>=2, found 1")
    # the same 0.85 box counts for a non-counting prompt (threshold 0.3)
    kept = ge.keep_detections({"clock": np.array([_box(0, 0, 1, 1, 0.85)])}, None, "two_object")
    assert len(kept["clock"]) == 1


def test_colour_clauses_count_the_requested_colour_among_the_most_confident_objects():
    meta = {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "blue"}], "prompt": "a photo of a blue car"}
    assert _eval(meta, {"car": [_box(0, 0, 10, 10)]}, {"car": ["blue"]}) == (True, "")
    assert _eval(meta, {"car": [_box(0, 0, 10, 10)]}, {"car": ["red"]}) == \
        (False, "expected blue car>=1, found 0 blue; and 1 red")
    attr = {"tag": "color_attr", "include": [{"class": "car", "count": 1, "color": "red"},
                                             {"class": "cup", "count": 1, "color": "green"}],
            "prompt": "a photo of a red car and a green cup"}
    dets = {"car": [_box(0, 0, 10, 10)], "cup": [_box(20, 0, 30, 10)]}
    assert _eval(attr, dets, {"car": ["red"], "cup": ["green"]}) == (True, "")
    assert _eval(attr, dets, {"car": ["red"], "cup": ["red"]}) == (False, "expected green cup>=1, found 0 green; and 1 red")
    with pytest.raises(ValueError, match="colour classifier"):
        _eval(meta, {"car": [_box(0, 0, 10, 10)]})


def test_position_rule_and_its_margin():
    b = (ge.np.array(_box(40, 0, 50, 10)), None)
    # centres 65 vs 45, extents 10 + 10: |20| − 0.1·20 = 18, /20 = 0.9 > 0.5
    assert ge.relative_position((np.array(_box(60, 0, 70, 10)), None), b) == {"right of"}
    assert ge.relative_position((np.array(_box(20, 0, 30, 10)), None), b) == {"left of"}
    # offset 1 px < the margin 0.1·(10 + 10) = 2: no relation at all
    assert ge.relative_position((np.array(_box(41, 0, 51, 10)), None), b) == set()
    # diagonal (10, 10): shrunk (8, 8) / 14.14 = 0.57 on both axes → two relations (image y grows down)
    assert ge.relative_position((np.array(_box(50, 10, 60, 20)), None), b) == {"right of", "below"}
    # with no margin the 1-px offset is a relation
    assert ge.relative_position((np.array(_box(41, 0, 51, 10)), None), b, position_threshold=0.0) == {"right of"}
    meta = {"tag": "position", "include": [{"class": "teddy bear", "count": 1},
                                           {"class": "dog", "count": 1, "position": ["right of", 0]}],
            "prompt": "a photo of a dog right of a teddy bear"}
    bear = [_box(40, 0, 50, 10)]
    assert _eval(meta, {"teddy bear": bear, "dog": [_box(60, 0, 70, 10)]}) == (True, "")
    assert _eval(meta, {"teddy bear": bear, "dog": [_box(41, 0, 51, 10)]}) == \
        (False, "expected dog right of target, found  target")
    assert _eval(meta, {"dog": [_box(60, 0, 70, 10)]}) == \
        (False, "expected teddy bear>=1, found 0\nno target for dog to be right of")
    # a clause that already failed is not checked for position
    assert _eval(meta, {}) == (False, "expected teddy bear>=1, found 0\nexpected dog>=1, found 0")
    # a clause whose colour failed is not checked for position either (no official prompt has both)
    both = {"tag": "position", "include": [{"class": "teddy bear", "count": 1},
                                           {"class": "dog", "count": 1, "color": "red", "position": ["right of", 0]}],
            "prompt": "a photo of a red dog right of a teddy bear"}
    assert _eval(both, {"teddy bear": bear, "dog": [_box(20, 0, 30, 10)]}, {"dog": ["blue"]}) == \
        (False, "expected red dog>=1, found 0 red; and 1 blue")
    # the ±0.5 cut: offset (10, −6) → shrunk (8, −4)/11.66 = (0.69, −0.34): right of, not above
    assert ge.relative_position((np.array(_box(50, -6, 60, 4)), None), b) == {"right of"}


def test_keep_detections_sorts_caps_and_suppresses_only_below_overlap_one():
    boxes = {"cat": np.array([_box(0, 0, 9, 9, s) for s in (0.5, 0.9, 0.7)] + [_box(100, 100, 109, 109, 0.6)],
                             dtype=np.float32)}
    kept = ge.keep_detections(boxes)
    assert [round(float(b[4]), 2) for b, _ in kept["cat"]] == [0.9, 0.7, 0.6, 0.5]      # all kept: max_overlap 1
    nms = ge.keep_detections(boxes, options={"max_overlap": 0.5})
    assert [round(float(b[4]), 2) for b, _ in nms["cat"]] == [0.9, 0.6]
    assert len(ge.keep_detections(boxes, options={"max_objects": 2})["cat"]) == 2
    assert ge.iou(_box(0, 0, 9, 9), _box(0, 0, 9, 9)) == 1.0
    assert ge.iou(_box(0, 0, 9, 9), _box(5, 0, 14, 9)) == pytest.approx(50 / 150)     # +1-pixel convention


def test_summary_is_the_unweighted_mean_of_task_accuracies():
    rows = [("single_object", True, "a"), ("single_object", True, "a"), ("single_object", False, "b"),
            ("single_object", False, "b"), ("counting", False, "c"), ("counting", True, "c")]
    df = pd.DataFrame([{"tag": t, "correct": c, "metadata": m} for t, c, m in rows])
    s = ge.summary(df)
    assert s["geneval_single_object"] == 0.5 and s["geneval_counting"] == 0.5
    assert s["geneval"] == 0.5
    assert s["geneval_images"] == pytest.approx(3 / 6)
    assert s["geneval_prompts"] == pytest.approx(2 / 3)       # a and c have a correct image, b none
    df2 = pd.DataFrame([{"tag": "single_object", "correct": True, "metadata": "a"}] * 9 +
                       [{"tag": "counting", "correct": False, "metadata": "c"}])
    assert ge.summary(df2)["geneval"] == 0.5                   # not 0.9: tasks weigh alike
    m = gb.metrics_of(df2)
    assert m["geneval"]["value"] == 0.5 and m["geneval_counting"]["n"] == 1


def test_official_metadata_ships_and_validates():
    rows = gb.official_metadata()
    assert len(rows) == 553 == gb.GenEval.default_n // gb.IMAGES_PER_PROMPT
    counts = pd.Series([r["tag"] for r in rows]).value_counts().to_dict()
    assert counts == {"position": 100, "color_attr": 100, "two_object": 99, "colors": 94, "single_object": 80,
                      "counting": 80}


# ---------------------------------------------------------------------------------------- tiny world
def test_shapes_metadata_is_geneval_shaped():
    rows = gb.shapes_metadata()
    assert len(rows) * gb.IMAGES_PER_PROMPT == gb.ShapesGenEval.default_n
    for r in rows:
        ge.check_metadata(r)
        if r["tag"] in ("two_object", "position"):
            assert r["include"][0]["class"] != r["include"][1]["class"]
    pos = next(r for r in rows if r["tag"] == "position")
    words = pos["prompt"].split()                      # "a red circle left of a blue square"
    assert pos["include"][1]["class"] == words[2] and pos["include"][0]["class"] == words[-1]
    assert pos["include"][1]["position"][0] in pos["prompt"]
    cnt = next(r for r in rows if r["tag"] == "counting")
    assert cnt["exclude"][0]["count"] == cnt["include"][0]["count"] + 1
    assert gb.shapes_metadata() == rows                # deterministic


def test_shapes_detector_recovers_the_generators_ground_truth():
    from bench.data import scenes
    from bench.metrics.geneval_detectors import ShapesDetector
    det = ShapesDetector()
    imgs, _, specs, truths = scenes.generate(300, "eval")
    hits = 0
    for img, truth in zip(imgs, truths):
        hwc = img.permute(1, 2, 0).numpy()
        boxes, masks = det.detect(hwc)
        got = sorted((c, col) for c, b in boxes.items()
                     for col in det.colours(hwc, [(bx, m) for bx, m in zip(b, masks[c])], c))
        want = sorted((o.shape, o.colour) for o in truth.objects)
        hits += got == want
    assert hits / len(imgs) >= 0.99, hits


def test_shapes_geneval_scores_ground_truth_scenes_correct():
    """The GenEval rules with the shapes detector on the generator's own scenes of each prompt."""
    from bench.data import scenes
    from bench.metrics.geneval_detectors import ShapesDetector
    imgs, _, specs, _ = scenes.generate(240, "eval")
    keep = [i for i, s in enumerate(specs)
            if s.task not in ("two_object", "position") or s.objects[0].shape != s.objects[1].shape]
    rows = [gb._shapes_row(specs[i]) for i in keep]
    df = gb.score_images(ShapesDetector(), [imgs[i].permute(1, 2, 0).numpy() for i in keep], rows,
                         [str(i) for i in keep])
    assert df["correct"].mean() >= 0.99, df[~df["correct"]][["prompt", "reason"]].to_string()
    assert set(df["tag"]) == set(ge.TAGS)


def test_geneval_folder_layout_resume_and_missing_images(tmp_path):
    rows = gb.shapes_metadata(per_tag=1)
    calls = []

    class Fake:
        def generate(self, prompts, seed, **kw):
            calls.append((prompts[0], seed))
            return torch.full((len(prompts), 3, 8, 8), 100, dtype=torch.uint8)
    folder = tmp_path / "g"
    assert gb.generate_folder(Fake(), rows[:3], folder, seed=7, sampling={}, n=2, progress=False) == 3
    assert [s for _, s in calls] == [7 * 1_000_003 + i for i in range(3)]          # seeded per prompt
    assert (folder / "00000" / "samples" / "0001.png").is_file()
    assert json.loads((folder / "00002" / "metadata.jsonl").read_text()) == rows[2]
    # resume: complete prompts are skipped, a prompt with a missing image is redone
    (folder / "00001" / "samples" / "0001.png").unlink()
    calls.clear()
    assert gb.generate_folder(Fake(), rows[:4], folder, seed=7, sampling={}, n=2, progress=False) == 2
    assert [s for _, s in calls] == [7 * 1_000_003 + 1, 7 * 1_000_003 + 3]
    assert len(gb.scan_folder(folder, rows[:4], n=2)) == 4
    (folder / "00003" / "samples" / "0000.png").unlink()
    with pytest.raises(FileNotFoundError, match=r"00003/samples/0000.png"):
        gb.scan_folder(folder, rows[:4], n=2)
    with pytest.raises(ValueError, match="another prompt"):
        gb.generate_folder(Fake(), rows[1:3], folder, seed=7, sampling={}, n=2, progress=False)


@pytest.mark.parametrize("name", ["shapes-geneval", "geneval"])
def test_prompt_bench_protocol(name):
    from bench.metrics.catalog import METRICS
    from bench.registry import BENCHES, MODELS
    b = BENCHES.get(name)()
    assert b.conditions == "prompts" and MODELS.get(b.model).world == b.world
    assert MODELS.get(b.model).kind == "t2i"
    assert set(b.metrics) <= set(METRICS.names()) and b.version >= 1
    assert len(b.rows()) * gb.IMAGES_PER_PROMPT == b.default_n == b.check_n(b.default_n)


def test_shapes_geneval_evaluate_in_memory():
    """The bench's evaluate (what `varbench run` calls), ground-truth scenes standing in for samples."""
    from bench.data import scenes
    imgs, _, specs, _ = scenes.generate(30, "eval")
    keep = [i for i, s in enumerate(specs)
            if s.task not in ("two_object", "position") or s.objects[0].shape != s.objects[1].shape]
    truth_rows = [gb._shapes_row(specs[i]) for i in keep]

    class OnTruth(gb.ShapesGenEval):
        default_n = gb.IMAGES_PER_PROMPT * len(truth_rows)

        def rows(self):
            return truth_rows
    b = OnTruth()
    m = b.evaluate(imgs[keep].repeat_interleave(4, dim=0), b.labels(b.default_n), progress=False)
    assert set(m) == set(b.metrics) == {"geneval", "geneval_images", "geneval_prompts", *(f"geneval_{t}" for t in ge.TAGS)}
    assert m["geneval"]["value"] == 1.0 and m["geneval_images"]["value"] == 1.0
    assert m["geneval_counting"]["n"] == 4 * sum(r["tag"] == "counting" for r in truth_rows)
    with pytest.raises(ValueError, match="prompts"):
        b.evaluate(imgs[keep].repeat_interleave(4, dim=0), list(reversed(b.labels(b.default_n))), progress=False)


def test_bench_labels_and_n():
    b = gb.ShapesGenEval()
    labels = b.labels(8)
    assert labels == [b.rows()[0]["prompt"]] * 4 + [b.rows()[1]["prompt"]] * 4
    for bad in (0, 6, b.default_n + 4, True):
        with pytest.raises(ValueError, match="4 images per prompt"):
            b.check_n(bad)
    with pytest.raises(ValueError) as e:
        b.check_n(-4)
    full = b.default_n
    assert str(e.value) == (f"--n -4: shapes-geneval takes 4 images per prompt, a positive multiple of 4 up to {full} "
                            f"(all {len(b.rows())} prompts, the default)")


def test_cli_import_and_bad_options(tmp_path, capsys):
    from bench.cli import main
    gold = json.loads(GOLDEN.read_text())["cases"]
    df = pd.DataFrame([{"filename": f"{i}.png", "tag": c["metadata"]["tag"], "prompt": c["metadata"]["prompt"],
                        "correct": c["correct"], "reason": c["reason"], "metadata": json.dumps(c["metadata"]),
                        "details": "{}"} for i, c in enumerate(gold)])
    path = tmp_path / "results.jsonl"
    df.to_json(path, orient="records", lines=True)
    assert main(["geneval", "import", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["geneval"] == pytest.approx(np.mean([df[df.tag == t].correct.mean() for t in ge.TAGS]))
    assert main(["geneval", "score", str(tmp_path), "--options", "threshold"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    assert main(["geneval", "import", str(tmp_path / "nope.jsonl")]) == 2
    capsys.readouterr()
    (tmp_path / "text.jsonl").write_text("filename,tag\n")     # a CSV by mistake: the file is named
    assert main(["geneval", "import", str(tmp_path / "text.jsonl")]) == 2
    assert f"{tmp_path / 'text.jsonl'}: not a GenEval results file (one JSON object per line)" in \
        capsys.readouterr().err
    assert main(["geneval", "score", str(tmp_path), "--bench", "shapes-c2i"]) == 2
    assert "not a GenEval bench; GenEval benches: geneval, shapes-geneval" in capsys.readouterr().err
    assert main(["geneval", "score", str(tmp_path)]) == 2
    assert "holds no prompt folder" in capsys.readouterr().err
    assert main(["geneval", "generate", str(tmp_path / "x"), "--model", "tiny-var"]) == 2
    assert "not a text-to-image model" in capsys.readouterr().err


def test_run_specs_pair_prompt_benches_with_text_to_image_models():
    from bench.plan import make_spec
    with pytest.raises(ValueError, match="conditioned on prompts, model tiny-var on classes"):
        make_spec("tiny-var", bench="shapes-geneval")
    with pytest.raises(ValueError, match=r"conditioned on classes, model tiny-t2i on prompts \(benches for it: "
                                         r"geneval, mjhq30k, shapes-geneval, shapes-mjhq\)"):
        make_spec("tiny-t2i", bench="shapes-c2i", need_ckpt=False)
    assert make_spec("hart-0.7b", bench="geneval", need_ckpt=False).ckpt is None   # HART takes prompts too
    for model, chain in (("tiny-t2i", "magnitude:sparsity=0.2"), ("hart-0.7b", "evar + psad + fastvar")):
        with pytest.raises(ValueError, match=rf"^{chain.split(':')[0].split(' ')[0]}(, psad)? on a text-to-image model \({model}\)"):
            make_spec(model, chain, bench="geneval" if model == "hart-0.7b" else "shapes-geneval", need_ckpt=False)
    assert make_spec("hart-0.7b", "fastvar", bench="geneval", need_ckpt=False).methods


def test_iou_and_detections_at_the_official_edges():
    """compute_iou's +1-pixel areas per axis, 0 for disjoint boxes and for a zero union; detections given as
    lists or as an empty array per class; suppression only of IoU ≥ max_overlap (the official ``<`` keeps)."""
    assert ge.iou(_box(0, 0, 9, 9), _box(5, 5, 14, 19)) == pytest.approx(25 / 225)    # 5·5 / (100 + 150 − 25)
    assert ge.iou(_box(0, 0, 9, 9), _box(20, 30, 29, 39)) == 0.0                       # disjoint: no negative areas
    assert ge.iou(_box(0, 0, 9, 9), _box(20, 0, 29, 9)) == 0.0 == ge.iou(_box(0, 0, 9, 9), _box(0, 20, 9, 29))
    assert ge.iou(_box(5, 5, 2, 2), _box(8, 8, 4, 4)) == 0.0                           # empty boxes: union 0
    assert ge.keep_detections({"cat": [], "dog": [_box(0, 0, 9, 9, 0.5)]}) == \
        {"dog": [(pytest.approx(np.array(_box(0, 0, 9, 9, 0.5))), None)]}
    assert ge.keep_detections({"dog": np.array([[0, 0, 9, 9, 1]])})["dog"][0][0].dtype == np.float64   # boxes as floats
    half = {"cat": np.array([_box(0, 0, 9, 9, 0.9), _box(0, 0, 9, 19, 0.8)])}        # IoU 100 / 200 = 0.5
    assert [float(b[4]) for b, _ in ge.keep_detections(half, options={"max_overlap": 0.5})["cat"]] == [0.9]
    assert [float(b[4]) for b, _ in ge.keep_detections(half, options={"max_overlap": 0.51})["cat"]] == [0.9, 0.8]
    with pytest.raises(ValueError, match=r"^unknown GenEval option 'treshold'; did you mean 'threshold'\? \(options: "
                                         r"threshold, counting_threshold, max_objects, max_overlap, position_threshold\)$"):
        ge.keep_detections(half, options={"treshold": 0.2})


def test_relative_position_ignores_offsets_below_a_thousandth():
    """The official guard: no relation when both margin-shrunk offsets are below 1e-3 (a 0.0005-px offset
    would otherwise normalise to a full "right of"); exactly 1e-3 is a relation."""
    at = lambda x: (np.array([x, 0.0, x, 0.0, 0.9]), None)      # noqa: E731  (a point box: no extent, no margin)
    assert ge.relative_position(at(0.0005), at(0.0)) == set()
    assert ge.relative_position(at(0.001), at(0.0)) == {"right of"}
    assert ge.relative_position(at(-0.001), at(0.0)) == {"left of"}


def test_relations_need_more_than_half_of_the_direction():
    """The ±0.5 cuts are strict, as the official: centres 4 px apart, extents 10 + 10 shrink the offset by
    0.1·20 = 2, so the direction's component is exactly ∓0.5: no relation (on x and on y); a margin of 0.09
    leaves 0.55: a relation."""
    a, b = np.array([0, 0, 10, 0, 0.9]), np.array([4, 0, 14, 0, 0.9])
    ay, by = a[[1, 0, 3, 2, 4]], b[[1, 0, 3, 2, 4]]          # the same boxes along y
    for p, q in [(a, b), (b, a), (ay, by), (by, ay)]:
        assert ge.relative_position((p, None), (q, None)) == set()
    got = [ge.relative_position((p, None), (q, None), position_threshold=0.09) for p, q in [(a, b), (b, a), (ay, by), (by, ay)]]
    assert got == [{"left of"}, {"right of"}, {"above"}, {"below"}]


def test_evaluate_reasons_and_clause_bookkeeping():
    """Whole reasons where several colours are found; one reason per failed position clause however many
    pairs fail; a clause whose own target failed fails the clauses that name it in turn; an exclude clause
    counts its own class."""
    two = {"tag": "colors", "include": [{"class": "car", "count": 2, "color": "green"}], "prompt": "two green cars"}
    cars = {"car": [_box(0, 0, 10, 10), _box(20, 0, 30, 10)]}
    assert _eval(two, cars, {"car": ["red", "blue"]}) == \
        (False, "expected green car>=2, found 0 green; and 1 red, 1 blue")
    with pytest.raises(ValueError, match=r"^prompt 'two green cars' names a colour: evaluate\(\) needs a colour "
                                         r"classifier$"):
        _eval(two, cars)
    pairs = {"tag": "position", "include": [{"class": "bear", "count": 2},
                                            {"class": "dog", "count": 2, "position": ["right of", 0]}], "prompt": "x"}
    left = [_box(0, 0, 10, 10), _box(0, 20, 10, 30)]
    assert _eval(pairs, {"bear": [_box(40, 0, 50, 10), _box(40, 20, 50, 30)], "dog": left}) == \
        (False, "expected dog right of target, found left of target")
    chain = {"tag": "position", "include": [{"class": "bear", "count": 1},
                                            {"class": "dog", "count": 1, "position": ["right of", 0]},
                                            {"class": "cat", "count": 1, "position": ["below", 1]}], "prompt": "x"}
    assert _eval(chain, {"dog": [_box(60, 0, 70, 10)], "cat": [_box(60, 40, 70, 50)]}) == \
        (False, "expected bear>=1, found 0\nno target for dog to be right of\nno target for cat to be below")
    other = {"tag": "single_object", "include": [{"class": "cat", "count": 1}], "exclude": [{"class": "dog", "count": 1}],
             "prompt": "x"}
    assert _eval(other, {"cat": [_box(0, 0, 10, 10)]}) == (True, "")
    assert _eval(other, {"cat": [_box(0, 0, 10, 10)], "dog": [_box(20, 0, 30, 10)]}) == (False, "expected dog<1, found 1")


@pytest.mark.parametrize("row, message", [
    ([1], "m: expected a JSON object, got list"),
    ({"tag": "colors", "include": []}, "m: missing key(s) prompt (GenEval metadata has tag, include, prompt)"),
    ({"include": []}, "m: missing key(s) tag, prompt (GenEval metadata has tag, include, prompt)"),
    ({"tag": "colour", "include": [], "prompt": "x"},
     "m: unknown tag 'colour'; tags are single_object, two_object, counting, colors, position, color_attr"),
    ({"tag": "colors", "include": [{"count": 1}], "prompt": "x"},
     "m: include[0] needs a class name and a count ≥ 1, got {'count': 1}"),
    ({"tag": "colors", "include": [{"class": "a", "count": 1}, {"class": "b", "count": "2"}], "prompt": "x"},
     "m: include[1] needs a class name and a count ≥ 1, got {'class': 'b', 'count': '2'}"),
    ({"tag": "colors", "include": [{"class": "b", "count": 0}], "prompt": "x"},
     "m: include[0] needs a class name and a count ≥ 1, got {'class': 'b', 'count': 0}"),
    ({"tag": "colors", "include": [{"class": "b", "count": 1, "color": "teal"}], "prompt": "x"},
     "m: include[0] colour 'teal' is not one of red, orange, yellow, green, blue, purple, pink, brown, black, white"),
    ({"tag": "position", "include": [{"class": "a", "count": 1}, {"class": "b", "count": 1, "position": ["near", 0]}],
      "prompt": "x"},
     "m: include[1] position ['near', 0] must be [one of ('left of', 'right of', 'above', 'below'), the index of an "
     "earlier include clause]"),
    ({"tag": "position", "include": [{"class": "a", "count": 1, "position": ["left of", 0]}], "prompt": "x"},
     "m: include[0] position ['left of', 0] must be [one of ('left of', 'right of', 'above', 'below'), the index of an "
     "earlier include clause]"),
])
def test_bad_metadata_is_named_with_its_place(row, message):
    with pytest.raises(ValueError) as e:
        ge.check_metadata(row, "m")
    assert str(e.value) == message
    good = {"tag": "position", "include": [{"class": "a", "count": 1, "color": "red"},
                                           {"class": "b", "count": 1, "position": ["below", 0]}], "prompt": "x"}
    assert ge.check_metadata(good) == good


def test_metadata_and_results_files_are_read_and_refused_with_their_names(tmp_path):
    meta = tmp_path / "evaluation_metadata.jsonl"
    with pytest.raises(FileNotFoundError) as e:
        ge.read_metadata(meta)
    assert str(e.value) == (f"GenEval metadata {meta} not found: it is prompts/evaluation_metadata.jsonl of "
                            f"https://github.com/djghosh13/geneval (553 prompts)")
    rows = [{"tag": "single_object", "include": [{"class": "cat", "count": 1}], "prompt": "a photo of a cat"},
            {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "red"}], "prompt": "a red car"}]
    meta.write_text(json.dumps(rows[0]) + "\n\n" + json.dumps(rows[1]) + "\n")
    assert ge.read_metadata(str(meta)) == rows                           # blank lines skipped, a str path taken
    meta.write_text(json.dumps(rows[0]) + "\n" + json.dumps({"tag": "colors"}) + "\n{oops\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(meta))}:2: missing key\(s\) include, prompt "):
        ge.read_metadata(meta)
    meta.write_text(json.dumps(rows[0]) + "\n{oops\n")
    with pytest.raises(ValueError) as e:
        ge.read_metadata(meta)
    assert str(e.value).startswith(f"{meta}:2: not JSON (Expecting property name") and str(e.value).endswith(")")
    results = tmp_path / "results.jsonl"
    with pytest.raises(FileNotFoundError) as e:
        ge.read_results(str(results))
    assert str(e.value) == f"GenEval results {results} not found (the --outfile of evaluation/evaluate_images.py)"
    pd.DataFrame([{"tag": "colors", "correct": True, "metadata": "{}", "reason": ""}]).to_json(
        results, orient="records", lines=True)
    df = ge.read_results(str(results))
    assert list(df.columns) == ["tag", "correct", "metadata", "reason"] and bool(df.correct[0]) is True
    pd.DataFrame([{"tag": "colors", "reason": ""}]).to_json(results, orient="records", lines=True)
    with pytest.raises(ValueError) as e:
        ge.read_results(results)
    assert str(e.value) == f"{results}: not a GenEval results file, missing column(s) correct, metadata"


def test_summary_keeps_the_tasks_in_order_of_appearance_and_refuses_nothing():
    df = pd.DataFrame([{"tag": t, "correct": c, "metadata": t} for t, c in
                       [("position", True), ("counting", False), ("position", False), ("colors", True)]])
    assert list(ge.summary(df)) == ["geneval_position", "geneval_counting", "geneval_colors", "geneval",
                                    "geneval_images", "geneval_prompts"]
    with pytest.raises(ValueError, match="^no GenEval results to summarise$"):
        ge.summary(df.iloc[:0])


def test_shapes_rows_are_genevals_clauses_of_each_task():
    """Every task's row in full: which object each clause names, its count and colour (the scorer on ground-truth
    scenes cannot see a clause that is missing or names the wrong object of two)."""
    from bench.data.scenes import SceneObject as O
    from bench.data.scenes import SceneSpec
    red_circle, blue_square = O("circle", "red"), O("square", "blue")
    rows = {task: gb._shapes_row(SceneSpec(task, objs, rel)) for task, objs, rel in [
        ("single_object", [red_circle], None), ("colors", [blue_square], None),
        ("counting", [O("cross", "green")] * 3, None), ("two_object", [red_circle, blue_square], None),
        ("color_attr", [red_circle, blue_square], None), ("position", [red_circle, blue_square], "left of")]}
    assert rows == {
        "single_object": {"tag": "single_object", "include": [{"class": "circle", "count": 1}], "prompt": "a red circle"},
        "colors": {"tag": "colors", "include": [{"class": "square", "count": 1, "color": "blue"}],
                   "prompt": "a blue square"},
        "counting": {"tag": "counting", "include": [{"class": "cross", "count": 3}],
                     "exclude": [{"class": "cross", "count": 4}], "prompt": "three green crosses"},
        "two_object": {"tag": "two_object", "include": [{"class": "circle", "count": 1}, {"class": "square", "count": 1}],
                       "prompt": "a red circle and a blue square"},
        "color_attr": {"tag": "color_attr", "include": [{"class": "circle", "count": 1, "color": "red"},
                                                        {"class": "square", "count": 1, "color": "blue"}],
                       "prompt": "a red circle and a blue square"},
        "position": {"tag": "position", "include": [{"class": "square", "count": 1},
                                                    {"class": "circle", "count": 1, "position": ["left of", 0]}],
                     "prompt": "a red circle left of a blue square"},
    }
    for row in rows.values():
        ge.check_metadata(row)


def test_scan_folder_reads_the_official_layout_and_names_what_is_missing(tmp_path):
    rows = gb.shapes_metadata(per_tag=2)[:8]
    img = torch.full((3, 4, 4), 9, dtype=torch.uint8)
    folder = tmp_path / "g"
    for i in (0, 1, 2, 10):
        gb.write_prompt(folder, i, rows[i % len(rows)], img[None].repeat(3, 1, 1, 1))
    # what is not a prompt folder or a sample is passed over: other folders, files, other names in samples/
    (folder / "notes").mkdir()
    (folder / "00011").write_text("a file, not a prompt folder")
    (folder / "00001" / "samples" / "0009.txt").write_text("")
    (folder / "00001" / "samples" / "0007.png").mkdir()
    (folder / "00002" / "samples" / "0001.png").rename(folder / "00002" / "samples" / "0001.jpg")
    found = gb.scan_folder(folder)
    assert [(i, r) for i, r, _ in found] == [(0, rows[0]), (1, rows[1]), (2, rows[2]), (10, rows[2])]
    assert found[1][2] == [folder / "00001" / "samples" / f"{k:04d}.png" for k in range(3)]
    assert found[2][2][1] == folder / "00002" / "samples" / "0001.jpg"
    # against a prompt list: every prompt in order, its first n samples; what is missing is named
    assert [ps for _, _, ps in gb.scan_folder(folder, rows[:3], n=2)] == [p[:2] for _, _, p in found[:3]]
    assert [len(ps) for _, _, ps in gb.scan_folder(folder, rows[:3])] == [3, 3, 3]     # n absent: one sample each
    with pytest.raises(FileNotFoundError) as e:
        gb.scan_folder(folder, rows[:5], n=4)
    assert str(e.value) == (f"GenEval folder {folder} is incomplete: missing {folder / '00000' / 'samples' / '0003.png'}, "
                            f"{folder / '00001' / 'samples' / '0003.png'}, {folder / '00002' / 'samples' / '0003.png'}, "
                            f"{folder / '00003'}, {folder / '00004'}; generate them again (generation resumes where "
                            f"it stopped)")
    with pytest.raises(FileNotFoundError, match=rf"{folder / '00004'} \(and 3 more\); generate"):
        gb.scan_folder(folder, rows[:8], n=4)
    with pytest.raises(FileNotFoundError, match=rf"{folder / '00004'} \(and 1 more\); generate"):   # six
        gb.scan_folder(folder, rows[:6], n=4)
    with pytest.raises(FileNotFoundError, match=rf"{folder / '00007'}; generate"):    # five: all named
        gb.scan_folder(folder, rows[:8], n=1)
    for k in range(3):
        (folder / "00001" / "samples" / f"{k:04d}.png").unlink()
    with pytest.raises(FileNotFoundError, match=r"missing [^,]*00001/samples/0000\.png, [^,]*00003; "):
        gb.scan_folder(folder, rows[:4])
    # the folder itself, an empty one, a prompt folder without its metadata
    with pytest.raises(FileNotFoundError) as e:
        gb.scan_folder(tmp_path / "nowhere")
    assert str(e.value) == f"GenEval image folder {tmp_path / 'nowhere'} not found"
    with pytest.raises(ValueError) as e:        # there, but not a folder: said so, not "not found"
        gb.scan_folder(folder / "00000" / "metadata.jsonl")
    assert str(e.value) == f"GenEval image folder {folder / '00000' / 'metadata.jsonl'} is a file, not a folder"
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError) as e:
        gb.scan_folder(tmp_path / "empty")
    assert str(e.value) == (f"GenEval image folder {tmp_path / 'empty'} holds no prompt folder (<index>/metadata.jsonl "
                            f"and <index>/samples/NNNN.png)")
    (folder / "00003").mkdir()
    with pytest.raises(FileNotFoundError) as e:
        gb.scan_folder(folder)
    assert str(e.value) == f"{folder / '00003' / 'metadata.jsonl'} is missing (every prompt folder holds its metadata.jsonl)"


def test_a_folder_of_another_prompt_set_is_refused_by_name(tmp_path):
    rows = gb.shapes_metadata(per_tag=1)
    gb.write_prompt(tmp_path, 0, rows[0], torch.zeros(1, 3, 4, 4, dtype=torch.uint8))
    assert gb.prompt_complete(tmp_path, 0, rows[0], 1) and not gb.prompt_complete(tmp_path, 0, rows[0], 2)
    assert not gb.prompt_complete(tmp_path, 1, rows[1], 1)
    with pytest.raises(ValueError) as e:
        gb.prompt_complete(tmp_path, 0, rows[1], 1)
    assert str(e.value) == (f"{tmp_path / '00000' / 'metadata.jsonl'} holds another prompt than prompt 0 of this run "
                            f"({rows[1]['prompt']!r}); use an empty folder for each prompt set")


def test_score_folder_gives_the_official_results_frame_of_the_folders_images(tmp_path):
    """Every column of the results file (what `geneval score` writes and the official summary reads) from a
    folder: ground-truth scenes saved as a prompt's samples, one of them under another prompt's row."""
    from collections import Counter

    from bench.data import scenes
    from bench.metrics.geneval_detectors import ShapesDetector
    imgs, _, specs, truths = scenes.generate(12, "eval")
    rows = [gb._shapes_row(s) for s in specs[:3]]
    rows[2] = rows[0]                                  # a square asked for, crosses drawn
    for j in range(3):
        gb.write_prompt(tmp_path, j, rows[j], imgs[j][None].repeat(2, 1, 1, 1))
    # an RGBA copy of a sample is read as RGB
    from PIL import Image
    p = tmp_path / "00001" / "samples" / "0001.png"
    Image.open(p).convert("RGBA").save(p)
    df = gb.score_folder(tmp_path, ShapesDetector(), rows, n=2, progress=False)
    assert list(df.columns) == ["filename", "tag", "prompt", "correct", "reason", "metadata", "details"]
    assert df["filename"].tolist() == [str(tmp_path / f"{j:05d}" / "samples" / f"{k:04d}.png")
                                       for j in range(3) for k in range(2)]
    assert df["tag"].tolist() == [r["tag"] for r in rows for _ in range(2)]
    assert df["prompt"].tolist() == [r["prompt"] for r in rows for _ in range(2)]
    assert [json.loads(m) for m in df["metadata"]] == [r for r in rows for _ in range(2)]
    assert df["correct"].tolist() == [True] * 4 + [False] * 2
    assert df["reason"].tolist() == [""] * 4 + ["expected square>=1, found 0"] * 2
    for j, details in zip([0, 0, 1, 1, 2, 2], df["details"]):
        found = json.loads(details)
        assert Counter({c: len(b) for c, b in found.items()}) == Counter(o.shape for o in truths[j].objects)
        assert all(len(b) == 5 and b[4] > 0.99 for bs in found.values() for b in bs)     # x0, y0, x1, y1, score
    assert df.equals(gb.score_folder(tmp_path, ShapesDetector(), progress=False))     # the folder's own rows


def test_record_metrics_carry_binomial_errors_per_task_and_the_error_of_the_mean():
    """metrics_of by hand: three tasks of 2, 4 and 3 images (accuracies 1/2, 3/4 and 1/3), four prompts; the
    tasks keep their order of appearance (GenEval's groupby(sort=False)), here not alphabetical."""
    import math
    res = pd.DataFrame({"tag": ["position"] * 2 + ["counting"] * 4 + ["colors"] * 3,
                        "correct": [False, True, True, True, False, True, False, False, True],
                        "metadata": ["c", "c", "a", "a", "b", "b", "d", "d", "d"]})
    m = gb.metrics_of(res)
    se_c, se_p, se_k = math.sqrt(0.75 * 0.25 / 4), math.sqrt(0.5 * 0.5 / 2), math.sqrt(2 / 9 / 3)
    err = "binomial standard error over images"
    assert m == {
        "geneval_colors": {"value": 1 / 3, "stderr": pytest.approx(se_k, rel=1e-12), "n": 3, "higher_is_better": True,
                           "error": err},
        "geneval_counting": {"value": 0.75, "stderr": pytest.approx(se_c, rel=1e-12), "n": 4, "higher_is_better": True,
                             "error": err},
        "geneval_position": {"value": 0.5, "stderr": pytest.approx(se_p, rel=1e-12), "n": 2, "higher_is_better": True,
                             "error": err},
        "geneval": {"value": pytest.approx((0.5 + 0.75 + 1 / 3) / 3, rel=1e-12),
                    "stderr": pytest.approx(math.sqrt(se_c ** 2 + se_p ** 2 + se_k ** 2) / 3, rel=1e-12), "n": 9,
                    "higher_is_better": True, "error": "standard error of the mean of the task accuracies"},
        "geneval_images": {"value": 5 / 9, "n": 9, "higher_is_better": True},
        "geneval_prompts": {"value": 1.0, "n": 9, "higher_is_better": True},
    }
    assert list(m) == ["geneval_position", "geneval_counting", "geneval_colors", "geneval", "geneval_images",
                       "geneval_prompts"]
    assert all(isinstance(v["n"], int) and isinstance(v.get("stderr", 0.0), float) for v in m.values())


def test_geneval_names_the_files_it_lacks_before_any_sampling(monkeypatch):
    tail = (" (the folder holding mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco.pth; OpenAI's ViT-L-14 weights file). "
            "Or generate the folder with `varbench geneval generate`, score it with the official evaluator and "
            "`varbench geneval import results.jsonl`")
    for var in ("VARBENCH_GENEVAL_DETECTOR", "VARBENCH_CLIP_WEIGHTS"):
        monkeypatch.delenv(var, raising=False)
    for kw, missing in [({}, "VARBENCH_GENEVAL_DETECTOR and VARBENCH_CLIP_WEIGHTS"),
                        ({"model_path": "m2f"}, "VARBENCH_CLIP_WEIGHTS"),
                        ({"clip_weights": "vit.pt"}, "VARBENCH_GENEVAL_DETECTOR")]:
        with pytest.raises(FileNotFoundError) as e:
            gb.GenEval(**kw).preflight()
        assert str(e.value) == f"geneval needs its detector and CLIP weights: set {missing}{tail}"
    gb.GenEval(model_path="m2f", clip_weights="vit.pt").preflight()
    monkeypatch.setenv("VARBENCH_GENEVAL_DETECTOR", "m2f")
    monkeypatch.setenv("VARBENCH_CLIP_WEIGHTS", "vit.pt")
    b = gb.GenEval()
    b.preflight()
    assert (b.model_path, b.clip_weights) == ("m2f", "vit.pt")


def test_prompt_benches_check_n_and_their_prompts():
    b = gb.ShapesGenEval()
    with pytest.raises(ValueError, match=r"--n 6: shapes-geneval takes 4 images per prompt"):
        b.labels(6)
    with pytest.raises(NotImplementedError):
        gb._GenEvalBench().rows()
    imgs = torch.zeros(4, 3, 8, 8, dtype=torch.uint8)
    with pytest.raises(ValueError) as e:
        b.evaluate(imgs, b.labels(8)[4:], progress=False)
    assert str(e.value) == "shapes-geneval: the images' prompts are not this bench's prompts in order"


def test_coverage_note_names_the_tasks_a_prefix_of_the_prompts_reaches():
    """Prompts run task by task in the metadata's order: a smaller n reaches the first tasks only, and the
    overall score is then their mean; every task reached (the last one in part) is no note."""
    from bench.registry import BENCHES
    g = BENCHES.get("geneval")()
    counts = {}
    for r in g.rows():
        counts[r["tag"]] = counts.get(r["tag"], 0) + 1
    assert list(counts) == ["single_object", "two_object", "counting", "colors", "position", "color_attr"]
    first_five = 4 * sum(list(counts.values())[:5])
    assert g.coverage_note(first_five + 4) is None and g.coverage_note(g.default_n) is None
    assert g.coverage_note(first_five) == (
        f"geneval at n = {first_five}: its first {first_five // 4} prompt(s) (in the metadata's order, task by task) "
        "cover 5 of the 6 tasks (single_object, two_object, counting, colors, position); geneval is the mean over "
        "those, not the overall score of all 6 (n = 2212)")
    assert "cover 2 of the 6 tasks (single_object, two_object)" in g.coverage_note(4 * counts["single_object"] + 4)
    with pytest.raises(ValueError, match="multiple of 4"):
        g.coverage_note(6)
