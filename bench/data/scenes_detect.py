"""An exact rule-based detector for shapes-scenes images, and GenEval-style checks of a prompt.

Pixels. A pixel's *colour strength* for colour k is s_k = p_k − (sum of the other two channels)/2:
linear in the pixel (so an anti-aliased edge pixel of coverage α over the background has
s = α·s_fg + (1−α)·s_bg), blind to grey noise and brightness of the background (whose strength is
≤ 0.05: it is low-saturation by design), and ≥ 0.3 on every foreground colour after jitter and
shading. A pixel is a candidate of the colour with the largest strength if that strength exceeds
``CANDIDATE`` (0.12, below half the weakest foreground's strength).

Objects. Candidates of one colour are grouped into 8-connected components (``scipy.ndimage.label``;
objects are ≥ 4 px apart, so components are objects). Each component's mask is refined to the pixels
of estimated coverage α ≥ ``ALPHA``, α = (s − s_bg)/(s_fg − s_bg). s_bg is a plane fitted to the
background pixels around the component (the background gradient's tint is linear). s_fg is a plane
fitted to the component's interior (pixels whose 3×3 neighbourhood is foreground, clipped pixels
left out): the shading is linear across a shape, so the plane is exact and extrapolates to the edge
pixels; with fewer than ``MIN_INTERIOR`` interior pixels, the largest strength in the 5×5
neighbourhood stands in. The ground truth is "supersampled coverage ≥ 0.5", and coverage comes in
steps of 1/16, so ``ALPHA`` = 15/32 sits halfway between the steps 7/16 and 8/16: ground-truth masks
are recovered pixel for pixel. Components whose refined mask has fewer than ``MIN_AREA`` pixels (24 at
64×64, scaled with the area; the smallest ground-truth object, a r=7 triangle, has ~88) or whose
peak strength is below ``MIN_PEAK`` are dropped: they are the specks and haze of generated images.

Noise. Ground-truth noise is grey, so its strength maps are clean (robust noise level ≈ 0.002). An
image with colour noise (a generated one) has its strength maps smoothed (Gaussian, σ = 0.8 px)
first when their noise level exceeds ``NOISE_SMOOTH``, so masks keep straight edges and corners.

Shapes. Four mask features: fill (area / box area: square ≈ 1, circle ≈ π/4, triangle and cross ≈
0.5), solidity (area / convex-hull area: the cross ≈ 0.7, the others ≥ 0.85), point symmetry (IoU of
the mask with itself turned 180° in its box: the triangle ≈ 0.4, the others ≈ 0.9–1) and corners
(fill of the four corner patches, 20 % of the box each way: square ≈ 1, triangle ≈ 0.3, circle ≈
0.1, cross 0; this one survives blur, where fill alone confuses rounded squares with circles). The
shape is the nearest prototype (ground-truth means) in this space scaled by ``FEATURE_SCALE``; the
score is the softmax weight of the chosen prototype (1 on clean shapes, lower on ambiguous blobs),
so a blurred or malformed shape degrades to its nearest shape with a low score rather than vanishing.
On 600 ground-truth scenes: 100 % classes and counts, masks pixel-exact; blur σ 0.7 + colour noise
0.02: 100 % of check(); σ 1.0 + noise 0.03: 99.3 %; σ 1.5 + noise 0.02: 95 %.

Checks (``check``), GenEval's rules over these detections:
  single_object / colors: exactly one object of the shape, and it has the colour;
  two_object / color_attr: each named object present with its colour (others may be there);
  counting: exactly N objects of the shape, all of the colour;
  position: both objects present, and every pair of them satisfies the relation on box centres with
  a margin of ``POSITION_MARGIN``·size (0.1·64 = 6.4 px): "A left of B" ⇔ cx(A) < cx(B) − margin,
  "right of" ⇔ cx(A) > cx(B) + margin, "above" ⇔ cy(A) < cy(B) − margin, "below" ⇔ cy(A) > cy(B) + margin.
Boxes are (x0, y0, x1, y1) with exclusive ends, centres (x0 + x1)/2, (y0 + y1)/2.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np
import torch
from scipy import ndimage

from bench.data.scenes import COLOUR_NAMES, IMAGE_SIZE, POSITION_MARGIN, SHAPES, SceneSpec

CANDIDATE = 0.12          # colour strength of a candidate foreground pixel
MIN_PEAK = 0.2            # a component's strongest pixel (every ground-truth object reaches ≥ 0.3)
MIN_AREA = 24             # pixels at 64×64 (scaled by (size/64)²)
CORNER = 0.2              # corner patches: 20 % of the box's width and height
NOISE_SMOOTH = 0.01       # colour-noise level (robust std of the background's strength) that turns on smoothing
SMOOTH_SIGMA = 0.8        # Gaussian smoothing (pixels) of the strength maps of noisy images
LOCAL = 5                 # neighbourhood (pixels) of the rough local foreground strength
ALPHA = 15 / 32           # coverage threshold: halfway between the ground truth's 7/16 and 8/16
MIN_INTERIOR = 6          # interior pixels needed to fit the foreground's shading plane
# prototypes of (fill, solidity, symmetry, corners) per shape (SHAPES order): ground-truth means
PROTOTYPES = np.array([[0.77, 0.94, 0.93, 0.12],    # circle
                       [1.00, 1.00, 0.99, 0.98],    # square
                       [0.52, 0.87, 0.40, 0.30],    # triangle
                       [0.55, 0.72, 0.93, 0.00]])   # cross
FEATURE_SCALE = np.array([0.06, 0.05, 0.12, 0.12])


@dataclass(frozen=True, eq=False)
class Detection:
    """One detected object: class, tight box (x0, y0, x1, y1, exclusive ends), mask (bool numpy
    [H, W]), score in (0, 1] (the shape's confidence) and the shape features (fill, solidity, symmetry, corners)."""
    shape: str
    colour: str
    box: Tuple[int, int, int, int]
    mask: np.ndarray
    score: float
    features: Tuple[float, ...] = ()


def _hull_area(mask: np.ndarray) -> float:
    """Area of the convex hull of the mask's pixel squares (monotone chain over row extremes)."""
    rows = np.flatnonzero(mask.any(1))
    pts = set()
    for y in rows:
        xs = np.flatnonzero(mask[y])
        for x in (xs[0], xs[-1] + 1):
            pts.add((float(x), float(y)))
            pts.add((float(x), float(y + 1)))
    p = sorted(pts)
    if len(p) < 3:
        return 0.0

    def half(points):
        out: List[Tuple[float, float]] = []
        for q in points:
            while len(out) >= 2 and ((out[-1][0] - out[-2][0]) * (q[1] - out[-2][1])
                                     - (out[-1][1] - out[-2][1]) * (q[0] - out[-2][0])) <= 0:
                out.pop()
            out.append(q)
        return out

    hull = half(p)[:-1] + half(p[::-1])[:-1]
    x, y = np.array(hull).T
    return 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))


def _plane(values: np.ndarray, where: np.ndarray, fallback):
    """The least-squares plane a + b·x + c·y through ``values[where]``, evaluated on the whole crop
    (``fallback`` if fewer than 3 pixels)."""
    ys, xs = np.nonzero(where)
    if len(ys) < 3:
        return fallback
    A = np.stack([np.ones(len(ys)), xs, ys], 1).astype(np.float64)
    coef = np.linalg.lstsq(A, values[ys, xs].astype(np.float64), rcond=None)[0]
    gy, gx = np.mgrid[0:values.shape[0], 0:values.shape[1]]
    return (coef[0] + coef[1] * gx + coef[2] * gy).astype(np.float32)


def shape_features(mask: np.ndarray) -> Tuple[float, float, float, float]:
    """(fill, solidity, symmetry, corners) of a non-empty bool mask."""
    rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
    crop = mask[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]
    area = float(crop.sum())
    fill = area / crop.size
    solidity = area / max(_hull_area(crop), area)
    turned = crop[::-1, ::-1]
    symmetry = float((crop & turned).sum()) / float((crop | turned).sum())
    h, w = crop.shape
    ph, pw = max(1, round(CORNER * h)), max(1, round(CORNER * w))
    corners = float(crop[:ph, :pw].mean() + crop[:ph, -pw:].mean() + crop[-ph:, :pw].mean() + crop[-ph:, -pw:].mean()) / 4
    return fill, solidity, symmetry, corners


def classify_shape(features) -> Tuple[str, float]:
    """The nearest prototype's shape and its softmax weight."""
    d2 = (((np.asarray(features)[None] - PROTOTYPES) / FEATURE_SCALE) ** 2).sum(1)
    w = np.exp(-0.5 * (d2 - d2.min()))
    best = int(d2.argmin())
    return SHAPES[best], float(w[best] / w.sum())


def _as_float_images(images) -> np.ndarray:
    x = images.detach().cpu().numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
    if x.ndim == 3:
        x = x[None]
    if x.ndim != 4 or x.shape[1] != 3:
        raise ValueError(f"images must be [B, 3, H, W] or [3, H, W], got shape {tuple(x.shape)}")
    return x.astype(np.float32) / 255.0 if x.dtype == np.uint8 else x.astype(np.float32)


def noise_level(strength: np.ndarray) -> float:
    """Robust std (1.4826 · median absolute deviation) of the background pixels' colour strength
    around its 3×3 mean: ~0.002 on ground truth (its noise is grey, invisible to strength), ~0.03 for
    colour noise of std 0.02."""
    bg = strength.max(0) <= CANDIDATE
    if bg.sum() < 16:
        return 0.0
    resid = strength - ndimage.uniform_filter(strength, size=(1, 3, 3), mode="nearest")
    r = resid[:, bg]
    return float(1.4826 * np.median(np.abs(r - np.median(r, axis=1, keepdims=True))))


def colour_strength(img):
    """s_k = p_k − (sum of the other two channels)/2 for each colour channel k of float images [..., 3, H, W]
    (numpy or torch): 1.5·p_k − 0.5·(p_0 + p_1 + p_2)."""
    return 1.5 * img - 0.5 * (img[..., 0:1, :, :] + img[..., 1:2, :, :] + img[..., 2:3, :, :])


def detect_one(img: np.ndarray) -> List[Detection]:
    """Detections of one float image [3, H, W] in [0, 1] (ordered by colour, then label)."""
    _, H, W = img.shape
    strength = colour_strength(img)                                    # 3, H, W
    if noise_level(strength) > NOISE_SMOOTH:
        strength = ndimage.gaussian_filter(strength, sigma=(0, SMOOTH_SIGMA, SMOOTH_SIGMA), mode="nearest")
    colour = strength.argmax(0)
    peak = strength.max(0)
    cand = peak > CANDIDATE
    near_fg = ndimage.binary_dilation(cand, iterations=2)
    clipped = img.max(0) >= 254.5 / 255
    min_area = MIN_AREA * (H * W) / IMAGE_SIZE ** 2
    out: List[Detection] = []
    eight = np.ones((3, 3), dtype=bool)
    for k, name in enumerate(COLOUR_NAMES):
        labels, num = ndimage.label(cand & (colour == k), structure=eight)
        if not num:
            continue
        s = strength[k]
        for lab, sl in enumerate(ndimage.find_objects(labels), start=1):
            y0, y1 = max(sl[0].start - 4, 0), min(sl[0].stop + 4, H)
            x0, x1 = max(sl[1].start - 4, 0), min(sl[1].stop + 4, W)
            comp = labels[y0:y1, x0:x1] == lab
            sc = s[y0:y1, x0:x1]
            if sc[comp].max() < MIN_PEAK:
                continue
            s_bg = _plane(sc, ~near_fg[y0:y1, x0:x1], fallback=0.0)
            s_loc = ndimage.maximum_filter(np.where(comp, sc, -np.inf), size=LOCAL)
            rough = comp & ((sc - s_bg) >= 0.5 * (s_loc - s_bg))
            inner = ndimage.binary_erosion(rough, structure=eight) & ~clipped[y0:y1, x0:x1]
            s_fg = _plane(sc, inner, fallback=None) if inner.sum() >= MIN_INTERIOR else None
            if s_fg is None:
                s_fg = s_loc
            sub = comp & ((sc - s_bg) >= ALPHA * np.maximum(s_fg - s_bg, 1e-6))
            if sub.sum() < min_area:
                continue
            mask = np.zeros((H, W), dtype=bool)
            mask[y0:y1, x0:x1] = sub
            rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
            box = (int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1)
            feats = shape_features(mask)
            shape, score = classify_shape(feats)
            out.append(Detection(shape, name, box, mask, score, feats))
    return out


def detect(images) -> List[List[Detection]]:
    """Per image, its detections. ``images``: uint8 (0–255) or float (0–1), [B, 3, H, W] or [3, H, W],
    torch or numpy."""
    return [detect_one(x) for x in _as_float_images(images)]


# ---------------------------------------------------------------------------------------- checks
def _centre(box) -> Tuple[float, float]:
    return (box[0] + box[2]) / 2, (box[1] + box[3]) / 2


def relation_holds(relation: str, box_a, box_b, size: int = IMAGE_SIZE) -> bool:
    """GenEval-style: A <relation> B for box centres, with a margin of POSITION_MARGIN·size."""
    (ax, ay), (bx, by) = _centre(box_a), _centre(box_b)
    m = POSITION_MARGIN * size
    if relation == "left of":
        return ax < bx - m
    if relation == "right of":
        return ax > bx + m
    if relation == "above":
        return ay < by - m
    if relation == "below":
        return ay > by + m
    raise ValueError(f"unknown relation {relation!r}")


def check(spec: SceneSpec, detections: Sequence, size: int = IMAGE_SIZE) -> bool:
    """Whether the detections (``Detection``s or ground-truth objects: anything with shape, colour
    and box) satisfy the prompt's spec, by the rule of its task (see the module docstring)."""
    def of(obj, same_colour=True):
        return [d for d in detections if d.shape == obj.shape and (not same_colour or d.colour == obj.colour)]

    objs, task = spec.objects, spec.task
    if task in ("single_object", "colors"):
        found = of(objs[0], same_colour=False)
        return len(found) == 1 and found[0].colour == objs[0].colour
    if task in ("two_object", "color_attr"):
        return all(of(o) for o in objs)
    if task == "counting":
        found = of(objs[0], same_colour=False)
        return len(found) == len(objs) and all(d.colour == objs[0].colour for d in found)
    if task == "position":
        a, b = of(objs[0]), of(objs[1])
        return bool(a) and bool(b) and all(relation_holds(spec.relation, da.box, db.box, size) for da in a for db in b)
    raise ValueError(f"unknown task {task!r}")
