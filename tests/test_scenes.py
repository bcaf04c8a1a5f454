"""shapes-scenes (bench/data/scenes.py) and its detector (bench/data/scenes_detect.py): the data is
deterministic in (split, index) and prefix-stable, every grammar prompt tokenizes, the detector
recovers the ground truth exactly, check() accepts every scene for its own spec and rejects altered
specs, the detector tolerates a mild blur, and datasets/shapes-scenes.yaml agrees with the module."""
import hashlib
import itertools
from pathlib import Path
from types import SimpleNamespace

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
    with pytest.raises(ValueError, match=r"^unknown split 'test'; splits are train, val, ref, calib, eval$"):
        scenes.generate(4, "test")
    with pytest.raises(ValueError, match="^n and start must be ≥ 0, got n=-1, start=0$"):
        scenes.generate(-1)
    with pytest.raises(ValueError, match="^n and start must be ≥ 0, got n=4, start=-1$"):
        scenes.generate(4, start=-1)
    with pytest.raises(ValueError, match=r"^size must be ≥ 32 \(objects are 7–12 px at 64\), got 31$"):
        scenes.generate(4, size=31)
    empty = scenes.generate(0, "eval", start=5, size=32)
    assert empty[0].shape == (0, 3, 32, 32) and empty[0].dtype == torch.uint8 and empty[1:] == ([], [], [])


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
    assert not det.check(three, [obj("circle", "red", b) for b in boxes[:3]] + [obj("circle", "green", boxes[3])])
    with pytest.raises(ValueError, match="^unknown task 'x'$"):
        det.check(SimpleNamespace(task="x", objects=()), [])


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


def test_hull_area_is_the_convex_hull_of_the_pixel_squares():
    """_hull_area against scipy's ConvexHull of every corner of every mask pixel, on random blobs, and
    on masks worked out by hand (solidity = area / hull area is the cross's feature)."""
    from scipy.spatial import ConvexHull
    rng = np.random.default_rng(0)
    for _ in range(40):
        mask = ndimage.binary_dilation(rng.random((14, 17)) > 0.93, iterations=int(rng.integers(0, 3)))
        if not mask.any():
            continue
        ys, xs = np.nonzero(mask)
        corners = np.concatenate([np.stack([xs + dx, ys + dy], 1) for dx in (0, 1) for dy in (0, 1)])
        assert det._hull_area(mask) == pytest.approx(ConvexHull(corners).volume, abs=1e-9)
    assert det._hull_area(np.ones((3, 5), bool)) == 15.0
    assert det._hull_area(np.eye(4, dtype=bool)) == 7.0       # the band between the diagonals' pixel corners
    assert det._hull_area(np.zeros((4, 4), bool)) == 0.0
    one = np.zeros((4, 4), bool)
    one[2, 1] = True
    assert det._hull_area(one) == 1.0


def test_shape_features_of_masks_worked_out_by_hand():
    """(fill, solidity, symmetry, corners) of masks placed off the origin of a larger frame. Corner patches
    are round(0.2·h) × round(0.2·w) pixels, at least 1.
    A 10×10 staircase (row i holds 10 − i pixels): area 55 of a 100 box; its hull runs (0,0), (10,0), (10,1),
    (1,10), (0,10): 60.5 − 2·0.5 = 59.5; turned 180° it meets itself in one pixel per row, their union is the
    box; 2×2 patches: 4/4, 3/4, 3/4, 0/4.
    A 5×10 block without its top-right and bottom-right pixels: 48/50; hull 50 − 2·0.5; 46/50; 1×2 patches:
    1, 1/2, 1, 1/2.
    A 12×7 block without its top-right pixel: 83/84; hull 84 − 0.5; 82/84; 2×1 patches: 1, 1/2, 1, 1.
    Bars 2 pixels thin: patches of one pixel, not of none."""
    stair = np.zeros((16, 16), bool)
    for i in range(10):
        stair[3 + i, 2:12 - i] = True
    assert det.shape_features(stair) == pytest.approx((0.55, 55 / 59.5, 0.1, 0.625))
    block = np.zeros((9, 14), bool)
    block[2:7, 1:11] = True
    block[[2, 6], 10] = False
    assert det.shape_features(block) == pytest.approx((0.96, 48 / 49, 0.92, 0.75))
    tall = np.zeros((16, 10), bool)
    tall[2:14, 1:8] = True
    tall[2, 7] = False
    assert det.shape_features(tall) == pytest.approx((83 / 84, 83 / 83.5, 82 / 84, 0.875))
    bar = np.zeros((5, 12), bool)
    bar[1:3, 1:11] = True
    assert det.shape_features(bar) == (1.0, 1.0, 1.0, 1.0) == det.shape_features(bar.T.copy())


def test_shape_scores_are_softmax_weights_of_the_scaled_distances():
    """48 % of the way from the circle prototype to the square's: the circle, with weight
    1 / Σ_j exp(−(d²_j − d²_circle)/2) over the four prototypes (distances scaled per feature)."""
    feats = det.PROTOTYPES[0] + 0.48 * (det.PROTOTYPES[1] - det.PROTOTYPES[0])
    d2 = (((feats - det.PROTOTYPES) / det.FEATURE_SCALE) ** 2).sum(1)
    shape, score = det.classify_shape(tuple(feats))
    assert shape == "circle" and score == pytest.approx(1 / np.exp(-0.5 * (d2 - d2[0])).sum(), rel=1e-12)
    assert 0.75 < score < 0.85                                      # a blend, not a certainty
    assert det.classify_shape(det.PROTOTYPES[3]) == ("cross", pytest.approx(1.0, abs=1e-6))


def test_plane_fits_three_or_more_pixels_and_falls_back_below():
    gy, gx = np.mgrid[0:6, 0:7]
    values = (0.3 + 0.02 * gx - 0.05 * gy).astype(np.float32)
    where = np.zeros((6, 7), bool)
    where[[1, 4, 2], [0, 5, 6]] = True                               # three pixels fix the plane
    plane = det._plane(values, where, fallback=None)
    assert plane.dtype == np.float32 and plane.shape == (6, 7) and np.allclose(plane, values, atol=1e-6)
    where[2, 6] = False
    assert det._plane(values, where, fallback="fallback") == "fallback"


def test_detect_refuses_images_of_the_wrong_shape():
    for shape in [(2, 4, 8, 8), (1, 2, 3, 8, 8), (8, 8)]:
        with pytest.raises(ValueError, match=r"^images must be \[B, 3, H, W\] or \[3, H, W\], got shape "):
            det.detect(np.zeros(shape, np.uint8))
    assert det.detect(np.zeros((3, 16, 16), np.uint8)) == [[]]
    assert np.array_equal(det._as_float_images(np.full((3, 2, 2), 255, np.uint8)), np.ones((1, 3, 2, 2), np.float32))


def test_noise_level_is_the_robust_spread_of_the_background_around_its_local_mean():
    """Checkerboards of amplitude a, 3a, 5a in the three strength maps: away from the border each pixel is
    ±8a/9 from its 3×3 mean, so the channels' deviations are 8a/9, 24a/9, 40a/9 and their pooled median
    24a/9, times 1.4826. An image with too little background (< 16 pixels) has no noise level. On ground
    truth the level is far below the smoothing switch; colour noise of std 0.02 puts it above."""
    checker = np.indices((24, 24)).sum(0) % 2 * 2 - 1.0
    a = 0.01
    strength = np.stack([a * checker, 3 * a * checker, 5 * a * checker]).astype(np.float32)
    assert det.noise_level(strength) == pytest.approx(1.4826 * 24 * a / 9, rel=1e-5)
    assert det.noise_level(np.full((3, 24, 24), 0.5, np.float32)) == 0.0        # all foreground
    img = scenes.generate(1, "val")[0][0].numpy().astype(np.float32) / 255
    assert det.noise_level(det.colour_strength(img)) < 0.2 * det.NOISE_SMOOTH
    noisy = np.clip(img + np.random.default_rng(0).normal(0, 0.02, img.shape), 0, 1).astype(np.float32)
    assert det.noise_level(det.colour_strength(noisy)) > det.NOISE_SMOOTH


def _grey_with(size, patches):
    """A flat grey image (colour strength 0) with flat patches: (y, x, h, w, rgb)."""
    img = np.full((3, size, size), 0.5, np.float32)
    for y, x, h, w, rgb in patches:
        img[:, y:y + h, x:x + w] = np.asarray(rgb, np.float32)[:, None, None]
    return img


def test_detector_drops_specks_and_haze_keeps_thin_objects_and_scales_the_minimum_area():
    """A component is dropped when its refined mask is below MIN_AREA pixels (24 at 64², ×4 at 128²) or its
    peak strength is below MIN_PEAK (haze: strength 0.15 is a candidate, not an object); a 2-px-wide bar
    has no interior to fit the shading plane to and is measured against its local peak instead. Boxes are
    exact (exclusive ends), also at the image's border."""
    red, haze = (0.9, 0.3, 0.3), (0.65, 0.5, 0.5)                     # strengths 0.6 and 0.15
    found = det.detect_one(_grey_with(64, [(0, 0, 8, 8, red), (30, 30, 4, 5, red), (40, 5, 12, 12, haze),
                                           (5, 40, 15, 2, red)]))
    assert [(x.colour, x.box, int(x.mask.sum())) for x in found] == [("red", (0, 0, 8, 8), 64),
                                                                     ("red", (40, 5, 42, 20), 30)]
    assert found[0].shape == "square"
    big = det.detect_one(_grey_with(128, [(5, 5, 8, 8, red), (40, 40, 10, 10, red)]))
    assert [(x.box, int(x.mask.sum())) for x in big] == [((40, 40, 50, 50), 100)]


def test_strength_maps_are_smoothed_only_above_the_colour_noise_switch(monkeypatch):
    calls = []
    gaussian = det.ndimage.gaussian_filter
    monkeypatch.setattr(det.ndimage, "gaussian_filter", lambda x, **kw: calls.append(kw) or gaussian(x, **kw))
    img = scenes.generate(1, "val")[0][0].numpy().astype(np.float32) / 255
    clean = det.detect_one(img)
    assert calls == []
    noisy = np.clip(img + np.random.default_rng(0).normal(0, 0.03, img.shape), 0, 1).astype(np.float32)
    assert [(x.shape, x.colour) for x in det.detect_one(noisy)] == [(x.shape, x.colour) for x in clean]
    assert calls == [dict(sigma=(0, det.SMOOTH_SIGMA, det.SMOOTH_SIGMA), mode="nearest")]


def test_relations_hold_strictly_beyond_the_margin():
    """A left of B ⇔ cx(A) < cx(B) − margin (margin 0.1·size, centres of exclusive-end boxes); exactly at the
    margin no relation holds. At size 10 the margin is 1 px."""
    a, b = (8, 8, 12, 12), (9, 9, 13, 13)                             # centres (10, 10) and (11, 11)
    for rel in ("left of", "right of", "above", "below"):
        assert not det.relation_holds(rel, a, b, size=10) and not det.relation_holds(rel, b, a, size=10)
    c = (9, 9, 14, 14)                                                # centre (11.5, 11.5)
    assert [det.relation_holds(r, a, c, size=10) for r in ("left of", "right of", "above", "below")] == \
        [True, False, True, False]
    assert [det.relation_holds(r, c, a, size=10) for r in ("left of", "right of", "above", "below")] == \
        [False, True, False, True]
    assert not det.relation_holds("left of", a, c, size=16)            # margin 1.6 > 1.5
    with pytest.raises(ValueError, match="^unknown relation 'near'$"):
        det.relation_holds("near", a, b)


_RED, _BLUE = SceneObject("circle", "red"), SceneObject("square", "blue")
_TASKS = "single_object, two_object, counting, colors, position, color_attr"


@pytest.mark.parametrize("make, message", [
    (lambda: SceneSpec("colour", (_RED,)), f"unknown task 'colour'; tasks are {_TASKS}"),
    (lambda: SceneSpec("colors", (SceneObject("star", "red"),)),
     "unknown object red star; shapes ('circle', 'square', 'triangle', 'cross'), colours ('red', 'green', 'blue')"),
    (lambda: SceneSpec("colors", (SceneObject("circle", "pink"),)),
     "unknown object pink circle; shapes ('circle', 'square', 'triangle', 'cross'), colours ('red', 'green', 'blue')"),
    (lambda: SceneSpec("colors", (_RED,), "left of"),
     "a relation belongs to position prompts only (task 'colors', relation 'left of')"),
    (lambda: SceneSpec("position", (_RED, _BLUE)), "a relation belongs to position prompts only (task 'position', relation None)"),
    (lambda: SceneSpec("position", (_RED, _BLUE), "near"), "unknown relation 'near'; relations are left of, right of, above, below"),
    (lambda: SceneSpec("two_object", (_RED, _RED)), "objects ['red circle', 'red circle'] do not fit task 'two_object'"),
    (lambda: SceneSpec("position", (_RED, _RED), "above"), "objects ['red circle', 'red circle'] do not fit task 'position'"),
    (lambda: SceneSpec("color_attr", (_RED, SceneObject("square", "red"))),
     "objects ['red circle', 'red square'] do not fit task 'color_attr'"),
    (lambda: SceneSpec("color_attr", (_RED, SceneObject("circle", "blue"))),
     "objects ['red circle', 'blue circle'] do not fit task 'color_attr'"),
    (lambda: SceneSpec("counting", (_RED,) * 5), "objects ['red circle', 'red circle', 'red circle', 'red circle', "
                                                 "'red circle'] do not fit task 'counting'"),
    (lambda: SceneSpec("counting", (_RED, SceneObject("circle", "blue"))),
     "objects ['red circle', 'blue circle'] do not fit task 'counting'"),
    (lambda: scenes.all_specs("x"), f"unknown task 'x'; tasks are {_TASKS}"),
    (lambda: scenes.sample_spec("x", None), f"unknown task 'x'; tasks are {_TASKS}"),
    (lambda: scenes.eval_prompts("position", -1), "n must be ≥ 0, got -1"),
    (lambda: scenes.eval_prompts("position", 3, where=lambda s: False), "no position spec passes the filter"),
    (lambda: scenes.tokenize(["a red circle"], max_len=0), "max_len must be ≥ 1, got 0"),
])
def test_specs_and_prompt_lists_refuse_what_the_grammar_cannot_say(make, message):
    with pytest.raises(ValueError) as e:
        make()
    assert str(e.value) == message


def test_spec_objects_are_a_tuple_and_quality_bar_prompts_are_pinned():
    """The quality bars' prompt lists are part of what a tiny-t2i number means: pinned for two seeds.
    An empty filter is no error when nothing is asked for."""
    assert SceneSpec("counting", [_RED] * 2).objects == (_RED, _RED)
    assert scenes.eval_prompts("position", 4, seed=0)[0] == [
        "a green circle left of a blue square", "a green triangle below a green cross",
        "a green triangle left of a blue circle", "a blue triangle left of a blue square"]
    assert scenes.eval_prompts("counting", 4, seed=1)[0] == ["four blue squares", "four green squares",
                                                             "two red circles", "four red squares"]
    assert scenes.eval_prompts("position", 0, where=lambda s: False) == ([], [])
    with pytest.raises(TypeError, match="^tokenize takes a list of prompts, not a single string$"):
        scenes.tokenize("a red circle")
    ids, mask = scenes.tokenize(["a", "red"], max_len=1)
    assert ids.tolist() == [[scenes.WORD_IDS["a"]], [scenes.WORD_IDS["red"]]] and mask.all()


def test_layouts_keep_their_contract_over_many_scenes():
    """Every layout, whatever retries it took: boxes inside the frame's border, pairwise MIN_GAP apart,
    sizes within HALF_EXTENT; position scenes put the first object's box centre ≥ LAYOUT_MARGIN·size
    before the second's on the relation's axis and within LAYOUT_ORTHO·size on the other."""
    W, eps = float(scenes.IMAGE_SIZE), 1e-9
    for index in range(1200):
        spec, placed = scenes.scene("eval", index)
        assert [(p.shape, p.colour) for p in placed] == [(o.shape, o.colour) for o in spec.objects]
        boxes = []
        for p in placed:
            assert scenes.HALF_EXTENT[0] <= p.r <= scenes.HALF_EXTENT[1]
            x0, y0, x1, y1 = scenes._box_rel(p.shape, p.r, p.rot)
            boxes.append((p.cx + x0, p.cy + y0, p.cx + x1, p.cy + y1))
        for b in boxes:
            assert min(b) >= scenes.BORDER - eps and max(b) <= W - scenes.BORDER + eps, (index, b)
        for a, b in itertools.combinations(boxes, 2):
            assert scenes._apart(a, b), (index, a, b)
        if spec.task == "position":
            (ax, ay), (bx, by) = [((b[0] + b[2]) / 2, (b[1] + b[3]) / 2) for b in boxes]
            along, across = {"left of": (bx - ax, by - ay), "right of": (ax - bx, ay - by),
                             "above": (by - ay, bx - ax), "below": (ay - by, ax - bx)}[spec.relation]
            assert along >= scenes.LAYOUT_MARGIN * W - eps and abs(across) <= scenes.LAYOUT_ORTHO * W + eps, index


def test_scene_indices_and_splits_are_checked():
    with pytest.raises(ValueError) as e:
        scenes.scene("test", 0)
    assert str(e.value) == f"unknown split 'test'; splits are {', '.join(scenes.SPLIT_SEEDS)}"
    for bad in (-1, 1 << 32):
        with pytest.raises(ValueError) as e:
            scenes.scene("eval", bad)
        assert str(e.value) == f"index must be in [0, 2**32), got {bad}"
    assert scenes.scene("eval", (1 << 32) - 1)[0].task == scenes.TASKS[((1 << 32) - 1) % 6]


def test_other_sizes_render_the_same_layout_scaled():
    """size scales the 64×64 layout: at 128 and at 32 every ground-truth box is within a pixel of the 64
    box scaled, and mask areas within 30 % of the scaled area (edges are re-sampled: a 7-px square at 32 gains
    a ring of pixels); same prompts."""
    base = scenes.generate(12, "eval")
    for size in (128, 32):
        other = scenes.generate(12, "eval", size=size)
        assert other[0].shape == (12, 3, size, size) and other[1] == base[1]
        f = size / 64
        for ta, tb in zip(base[3], other[3], strict=True):
            for oa, ob in zip(ta.objects, tb.objects, strict=True):
                assert (oa.shape, oa.colour) == (ob.shape, ob.colour) and ob.mask.shape == (size, size)
                assert max(abs(a * f - b) for a, b in zip(oa.box, ob.box)) <= 1, (oa.box, ob.box)
                assert 0.7 < ob.mask.sum() / (oa.mask.sum() * f * f) < 1.3
