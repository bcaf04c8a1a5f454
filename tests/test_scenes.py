"""shapes-scenes (bench/data/scenes.py) and its detector (bench/data/scenes_detect.py): the data is
deterministic in (split, index) and prefix-stable, every grammar prompt tokenizes, the detector
recovers the ground truth exactly, check() accepts every scene for its own spec and rejects altered
specs, the detector tolerates a mild blur, and datasets/shapes-scenes.yaml agrees with the module."""
import hashlib
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from scipy import ndimage

from bench.data import scenes
from bench.data import scenes_detect as det
from bench.data.scenes import SceneObject, SceneSpec

CHUNK = scenes.CHUNK
N = CHUNK + 44            # 300: two chunks, the last one partial
REPO = Path(__file__).resolve().parent.parent

# sha256 of generate(64, "train"): the uint8 image bytes, then the prompts joined by newlines. Any
# change to the generator changes it; if intended, models trained on shapes-scenes must be retrained.
GOLDEN_TRAIN_64 = "b95240ea4b16966a6972b630b59c1423092a1c27226f3cbde7506b748fb4ce48"


def _digest(imgs, prompts) -> str:
    h = hashlib.sha256()
    h.update(imgs.contiguous().numpy().tobytes())
    h.update("\n".join(prompts).encode())
    return h.hexdigest()


def _same(a, b):
    """Two generate() results are identical (images, prompts, specs, truth boxes and masks)."""
    assert torch.equal(a[0], b[0]) and a[1] == b[1] and a[2] == b[2]
    for ta, tb in zip(a[3], b[3], strict=True):
        assert len(ta.objects) == len(tb.objects)
        for oa, ob in zip(ta.objects, tb.objects):
            assert (oa.shape, oa.colour, oa.box) == (ob.shape, ob.colour, ob.box)
            assert np.array_equal(oa.mask, ob.mask)


@pytest.fixture(scope="module")
def train300():
    return scenes.generate(N, "train")


@pytest.fixture(scope="module")
def eval360():
    """360 scenes (60 per task) and their detections."""
    data = scenes.generate(360, "eval")
    return data, det.detect(data[0])


# ---------------------------------------------------------------------------------------- data
def test_shapes_types_and_golden(train300):
    imgs, prompts, specs, truth = train300
    assert imgs.dtype == torch.uint8 and imgs.shape == (N, 3, 64, 64)
    assert len(prompts) == len(specs) == len(truth) == N
    assert all(isinstance(s, SceneSpec) and s.prompt == p for s, p in zip(specs, prompts))
    for t in truth:
        for o in t.objects:
            assert o.mask.dtype == bool and o.mask.shape == (64, 64)
            x0, y0, x1, y1 = o.box
            rows, cols = np.flatnonzero(o.mask.any(1)), np.flatnonzero(o.mask.any(0))
            assert (x0, y0, x1, y1) == (cols[0], rows[0], cols[-1] + 1, rows[-1] + 1)
    assert _digest(imgs[:64], prompts[:64]) == GOLDEN_TRAIN_64


def test_two_calls_identical(train300):
    _same(scenes.generate(N, "train"), train300)


@pytest.mark.parametrize("k", [1, 7, CHUNK - 1, CHUNK, CHUNK + 1])
def test_prefix_independent_of_n(train300, k):
    _same(scenes.generate(k, "train"), tuple(x[:k] for x in train300))


@pytest.mark.parametrize("start,n", [(1, 9), (CHUNK - 3, 6), (CHUNK + 7, 30), (40, 0)])
def test_start_offset(train300, start, n):
    got = scenes.generate(n, "train", start=start)
    assert got[0].shape == (n, 3, 64, 64)
    _same(got, tuple(x[start:start + n] for x in train300))


def test_splits_differ():
    data = {s: scenes.generate(12, s)[0] for s in scenes.SPLIT_SEEDS}
    for a, b in itertools.combinations(data, 2):
        assert bool((data[a] != data[b]).flatten(1).any(1).all()), f"splits {a} and {b} share images"


def test_task_mix_and_layout(train300):
    imgs, prompts, specs, truth = train300
    assert [s.task for s in specs] == [scenes.TASKS[i % 6] for i in range(N)]
    counts = {s.count for s in specs if s.task == "counting"}
    assert counts == set(scenes.COUNTS)
    assert {s.relation for s in specs if s.task == "position"} == set(scenes.RELATIONS)
    for s, t in zip(specs, truth):
        assert [(o.shape, o.colour) for o in t.objects] == [(o.shape, o.colour) for o in s.objects]
        assert 1 <= len(t.objects) <= 4
        for o in t.objects:   # box side ≈ 2·half-extent (square 1.7 r, rotated triangle up to 2.4 r)
            side = max(o.box[2] - o.box[0], o.box[3] - o.box[1])
            assert 1.7 * scenes.HALF_EXTENT[0] - 1 <= side <= 2.5 * scenes.HALF_EXTENT[1] + 1
        # objects never touch: masks dilated by 1 px (3×3) stay disjoint, so a gap of ≥ 2 px separates them
        grown = [ndimage.binary_dilation(o.mask) for o in t.objects]
        for a, b in itertools.combinations(grown, 2):
            assert not (a & b).any()


def test_background_low_saturation(train300):
    imgs, _, _, truth = train300
    x = imgs[:40].float().numpy() / 255
    for img, t in zip(x, truth):
        fg = np.zeros(img.shape[1:], bool)
        for o in t.objects:
            fg |= ndimage.binary_dilation(o.mask, iterations=2)
        strength = (1.5 * img - 0.5 * img.sum(0, keepdims=True)).max(0)
        assert strength[~fg].max() < 0.07


def test_thread_count_independent():
    prev = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = scenes.generate(20, "ref", start=CHUNK - 10)
        torch.set_num_threads(2)
        two = scenes.generate(20, "ref", start=CHUNK - 10)
    finally:
        torch.set_num_threads(prev)
    _same(one, two)


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown split"):
        scenes.generate(4, "test")
    with pytest.raises(ValueError):
        scenes.generate(-1)
    with pytest.raises(ValueError):
        scenes.generate(4, start=-1)
    with pytest.raises(ValueError, match="size"):
        scenes.generate(4, size=16)
    with pytest.raises(ValueError, match="unknown task"):
        scenes.eval_prompts("counting_objects", 4)
    red, blue = SceneObject("circle", "red"), SceneObject("square", "blue")
    with pytest.raises(ValueError, match="relation"):
        SceneSpec("two_object", (red, blue), "left of")
    with pytest.raises(ValueError, match="do not fit"):
        SceneSpec("color_attr", (red, SceneObject("circle", "blue")))
    with pytest.raises(ValueError, match="do not fit"):
        SceneSpec("counting", (red,) * 5)
    with pytest.raises(ValueError, match="unknown object"):
        SceneSpec("colors", (SceneObject("circle", "purple"),))


# ---------------------------------------------------------------------------------------- grammar
def test_every_prompt_tokenizes():
    specs = [s for t in scenes.TASKS for s in scenes.all_specs(t)]
    assert [len(scenes.all_specs(t)) for t in scenes.TASKS] == [12, 132, 36, 12, 528, 72]
    prompts = [s.prompt for s in specs]
    # colors shares single_object's prompts and color_attr's are two_object prompts; the rest are distinct
    assert len(set(prompts)) == len(specs) - 12 - 72
    assert max(len(p.split()) for p in prompts) == scenes.MAX_PROMPT_WORDS
    ids, mask = scenes.tokenize(prompts)
    assert ids.dtype == torch.int64 and ids.shape == (len(prompts), scenes.MAX_PROMPT_WORDS)
    assert mask.dtype == torch.bool and torch.equal(mask, ids != 0)
    assert set(ids.unique().tolist()) == set(range(len(scenes.VOCAB))) - {scenes.WORD_IDS["one"]}
    for p, row, m in zip(prompts, ids, mask):
        assert " ".join(scenes.VOCAB[i] for i in row[m].tolist()) == p
        assert bool(m[:len(p.split())].all()) and not bool(m[len(p.split()):].any())
    assert scenes.VOCAB[0] == "<pad>" and len(set(scenes.VOCAB)) == len(scenes.VOCAB)


def test_tokenize_errors_and_edge_cases():
    with pytest.raises(ValueError, match="did you mean 'circle'"):
        scenes.tokenize(["a red circel"])
    with pytest.raises(ValueError, match="did you mean 'triangles'"):
        scenes.tokenize(["three green triangels"])
    with pytest.raises(ValueError, match="9 words, more than max_len=8"):
        scenes.tokenize(["a red circle left of a blue square a"])
    with pytest.raises(ValueError, match="max_len"):
        scenes.tokenize(["a red circle"], max_len=2)
    with pytest.raises(TypeError):
        scenes.tokenize("a red circle")
    with pytest.raises(ValueError, match="empty"):
        scenes.tokenize(["", "a red circle"])
    ids, mask = scenes.tokenize(["A  Red circle"], max_len=4)
    assert ids[0].tolist() == [scenes.WORD_IDS[w] for w in ("a", "red", "circle")] + [0]
    assert mask[0].tolist() == [True, True, True, False]


def test_eval_prompts():
    for task in scenes.TASKS:
        distinct = scenes.all_specs(task)
        prompts, specs = scenes.eval_prompts(task, 2 * len(distinct) + 3, seed=1)
        assert all(s.task == task for s in specs) and prompts == [s.prompt for s in specs]
        assert set(specs[:len(distinct)]) == set(distinct) == set(specs[len(distinct):2 * len(distinct)])
        again = scenes.eval_prompts(task, 10, seed=1)
        assert again == (prompts[:10], specs[:10])
        assert scenes.eval_prompts(task, 10, seed=2)[1] != specs[:10]


# ---------------------------------------------------------------------------------------- detector
def _match(detections, truth):
    """Each truth object's best detection by mask IoU, and the IoU."""
    out = []
    for o in truth.objects:
        ious = [(d.mask & o.mask).sum() / (d.mask | o.mask).sum() for d in detections]
        k = int(np.argmax(ious)) if ious else -1
        out.append((detections[k] if ious else None, ious[k] if ious else 0.0))
    return out


def test_detector_recovers_truth(eval360):
    (imgs, _, specs, truth), dets = eval360
    assert {s.task for s in specs} == set(scenes.TASKS)
    exact = total = 0
    for i, (d, t) in enumerate(zip(dets, truth)):
        assert len(d) == len(t.objects), f"scene {i}: {len(d)} detections, {len(t.objects)} objects"
        matched = _match(d, t)
        assert len({id(m) for m, _ in matched}) == len(d)
        for o, (m, iou) in zip(t.objects, matched):
            assert (m.shape, m.colour) == (o.shape, o.colour), f"scene {i}: {o.colour} {o.shape} seen as {m.colour} {m.shape}"
            assert max(abs(a - b) for a, b in zip(m.box, o.box)) <= 1, f"scene {i}: box {m.box} vs {o.box}"
            assert iou >= 0.9, f"scene {i}: mask IoU {iou:.3f}"
            assert 0 < m.score <= 1
            exact += bool(np.array_equal(m.mask, o.mask))
            total += 1
    assert exact >= 0.99 * total, f"only {exact}/{total} masks exact"


def test_detect_input_forms(eval360):
    (imgs, *_), dets = eval360
    one = det.detect(imgs[3])
    flt = det.detect(imgs[3:4].float() / 255)
    for a, b in ((one[0], dets[3]), (flt[0], dets[3])):
        assert [(x.shape, x.colour, x.box) for x in a] == [(x.shape, x.colour, x.box) for x in b]
    assert det.detect(np.full((1, 3, 64, 64), 128, np.uint8)) == [[]]
    with pytest.raises(ValueError, match="images must be"):
        det.detect(imgs[0, 0])


def test_truth_and_detections_pass_own_spec(eval360):
    (_, _, specs, truth), dets = eval360
    for i, (s, t, d) in enumerate(zip(specs, truth, dets)):
        assert det.check(s, t.objects), f"scene {i}: ground truth fails its own spec {s.prompt!r}"
        assert det.check(s, d), f"scene {i}: detections fail {s.prompt!r}"
        if s.task == "position":   # the relation holds with twice the margin, and no other relation holds
            (a, b) = t.objects
            ca, cb = det._centre(a.box), det._centre(b.box)
            axis = 0 if s.relation in ("left of", "right of") else 1
            assert abs(ca[axis] - cb[axis]) >= 2 * scenes.POSITION_MARGIN * 64 - 1
            assert [r for r in scenes.RELATIONS if det.relation_holds(r, a.box, b.box)] == [s.relation]


def _altered(spec: SceneSpec):
    """Specs that a scene of ``spec`` must fail: another colour or shape, swapped colours, the
    relation reversed, a count off by one."""
    o = spec.objects
    recolour = lambda x, c: SceneObject(x.shape, c)  # noqa: E731
    other_colour = lambda x: next(c for c in scenes.COLOUR_NAMES if c != x.colour)  # noqa: E731
    other_shape = lambda x: next(s for s in scenes.SHAPES if s != x.shape)  # noqa: E731
    out = []
    if spec.task in ("single_object", "colors"):
        out += [SceneSpec(spec.task, (recolour(o[0], other_colour(o[0])),)),
                SceneSpec(spec.task, (SceneObject(other_shape(o[0]), o[0].colour),))]
    elif spec.task == "counting":
        for n in (spec.count - 1, spec.count + 1):
            if n in scenes.COUNTS:
                out.append(SceneSpec("counting", (o[0],) * n))
        out.append(SceneSpec("counting", (recolour(o[0], other_colour(o[0])),) * spec.count))
    else:
        if o[0].colour != o[1].colour and o[0].shape != o[1].shape:
            out.append(SceneSpec(spec.task, (recolour(o[0], o[1].colour), recolour(o[1], o[0].colour)), spec.relation))
        if spec.task == "position":
            reverse = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
            out.append(SceneSpec("position", o, reverse[spec.relation]))
            out.append(SceneSpec("position", (o[1], o[0]), spec.relation))
    return out


def test_check_rejects_altered_specs(eval360):
    (_, _, specs, truth), dets = eval360
    kinds = set()
    for i, (s, t, d) in enumerate(zip(specs, truth, dets)):
        for alt in _altered(s):
            kinds.add(alt.task)
            assert not det.check(alt, t.objects), f"scene {i} ({s.prompt!r}) passes {alt.prompt!r}"
            assert not det.check(alt, d), f"scene {i} detections ({s.prompt!r}) pass {alt.prompt!r}"
    assert kinds == set(scenes.TASKS)


def test_check_rules():
    def obj(shape, colour, box):
        return det.Detection(shape, colour, box, np.zeros((64, 64), bool), 1.0)
    rc, bs = SceneObject("circle", "red"), SceneObject("square", "blue")
    left, right = (4, 20, 20, 36), (40, 22, 56, 38)
    assert det.check(SceneSpec("position", (rc, bs), "left of"), [obj("circle", "red", left), obj("square", "blue", right)])
    inside, edge = (25, 20, 41, 36), (34, 20, 50, 36)   # centres 33 and 42 vs 48 − 6.4 = 41.6
    assert det.check(SceneSpec("position", (rc, bs), "left of"), [obj("circle", "red", inside), obj("square", "blue", right)])
    assert not det.check(SceneSpec("position", (rc, bs), "left of"), [obj("circle", "red", edge), obj("square", "blue", right)])
    assert not det.check(SceneSpec("position", (rc, bs), "left of"), [obj("circle", "red", left)])
    # single object: exactly one of the shape, of the colour; other shapes may be there
    single = SceneSpec("single_object", (rc,))
    assert det.check(single, [obj("circle", "red", left), obj("square", "blue", right)])
    assert not det.check(single, [obj("circle", "red", left), obj("circle", "red", right)])
    assert not det.check(single, [obj("circle", "red", left), obj("circle", "blue", right)])
    # counting: exactly N of the shape, all of the colour
    three = SceneSpec("counting", (rc,) * 3)
    boxes = [(0, 0, 10, 10), (20, 0, 30, 10), (40, 0, 50, 10), (0, 40, 10, 50)]
    assert det.check(three, [obj("circle", "red", b) for b in boxes[:3]] + [obj("square", "red", boxes[3])])
    assert not det.check(three, [obj("circle", "red", b) for b in boxes])
    assert not det.check(three, [obj("circle", "red", b) for b in boxes[:2]] + [obj("circle", "green", boxes[2])])


def _blurred(imgs: torch.Tensor, sigma: float, noise: float, seed: int = 0) -> torch.Tensor:
    x = ndimage.gaussian_filter(imgs.float().numpy() / 255, sigma=(0, 0, sigma, sigma), mode="nearest")
    x = x + noise * np.random.default_rng(seed).standard_normal(x.shape)
    return torch.from_numpy(np.clip(x * 255 + 0.5, 0, 255).astype(np.uint8))


def test_detector_tolerates_mild_blur(eval360):
    (imgs, _, specs, truth), _ = eval360
    dets = det.detect(_blurred(imgs, sigma=0.7, noise=0.02))
    passed = [det.check(s, d) for s, d in zip(specs, dets)]
    assert np.mean(passed) >= 0.95, f"check() passes {np.mean(passed):.1%} of blurred scenes"
    shapes = [(m.shape, m.colour) == (o.shape, o.colour) for d, t in zip(dets, truth)
              for o, (m, _) in zip(t.objects, _match(d, t)) if m is not None]
    assert np.mean(shapes) >= 0.97


# ---------------------------------------------------------------------------------------- recipe
def test_yaml_agrees_with_module():
    recipe = yaml.safe_load((REPO / "datasets" / "shapes-scenes.yaml").read_text())
    assert recipe["image_size"] == scenes.IMAGE_SIZE
    assert recipe["supersample"] == scenes.SUPERSAMPLE and recipe["chunk"] == scenes.CHUNK
    voc = recipe["vocabulary"]
    assert tuple(voc["shapes"]) == scenes.SHAPES and tuple(voc["colours"]) == scenes.COLOUR_NAMES
    assert tuple(voc["numbers"]) == scenes.NUMBERS and tuple(voc["relations"]) == scenes.RELATIONS
    assert voc["max_prompt_words"] == scenes.MAX_PROMPT_WORDS
    assert tuple(recipe["tasks"]) == scenes.TASKS
    for task, example in recipe["tasks"].items():
        assert example in {s.prompt for s in scenes.all_specs(task)}
    objs = recipe["objects"]
    assert objs["per_scene"] == [1, scenes.MAX_OBJECTS] and tuple(objs["counts"]) == scenes.COUNTS
    assert tuple(objs["half_extent_px"]) == scenes.HALF_EXTENT
    assert objs["min_gap_px"] == scenes.MIN_GAP and objs["border_px"] == scenes.BORDER
    assert objs["triangle_rotation_rad"] == scenes.TRIANGLE_ROTATION
    pos = recipe["position"]
    assert (pos["check_margin"], pos["layout_margin"], pos["layout_ortho"]) == \
        (scenes.POSITION_MARGIN, scenes.LAYOUT_MARGIN, scenes.LAYOUT_ORTHO)
    assert tuple(recipe["background"]["grey"]) == scenes.BG_GREY and recipe["background"]["tint"] == scenes.BG_TINT
    assert recipe["splits"] == scenes.SPLIT_SEEDS


def test_object_tokens_mark_the_cells_that_hold_objects(train300):
    """Per scale, a token is marked iff its cell holds a ground-truth object pixel: checked against a
    direct block reduction of the masks at every scale that divides 64 (the 6×6 cells are pooled by
    adaptive max pooling, checked by its overlapping-window definition)."""
    _, _, _, truths = train300
    schedule = ((1, 1), (2, 2), (4, 4), (6, 6), (8, 8))
    marks = scenes.object_tokens(truths[:40], schedule, chunk=16)
    assert marks.shape == (40, 121) and marks.dtype == torch.bool
    starts = np.cumsum([0] + [h * w for h, w in schedule])
    for i, t in enumerate(truths[:40]):
        union = np.any([o.mask for o in t.objects], axis=0)
        for k, (h, w) in enumerate(schedule):
            got = marks[i, starts[k]:starts[k + 1]].view(h, w).numpy()
            rows = [(a * 64 // h, -(-(a + 1) * 64 // h)) for a in range(h)]
            want = np.array([[union[r0:r1, c0:c1].any() for c0, c1 in rows] for r0, r1 in rows])
            assert (got == want).all(), (i, h)
        assert marks[i, 0] and 0 < marks[i, starts[4]:].sum() < 64
    assert scenes.object_tokens([], schedule).shape == (0, 121)
    assert torch.equal(scenes.object_tokens(truths[:40], schedule), marks)   # chunking changes nothing
