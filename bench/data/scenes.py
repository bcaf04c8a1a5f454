"""shapes-scenes: the tiny world's procedurally generated text-to-image scenes and their prompts.

Each 64×64 image holds 1–4 tinyshapes objects (the same four shape masks, colours, shading and 4×
supersampled anti-aliasing as ``bench.data.tinyshapes``) described by a prompt from a small grammar
that covers GenEval's six task types over the tinyshapes vocabulary:

=============  =======================================  =======================================
task           prompt                                   scene
=============  =======================================  =======================================
single_object  "a red circle"                           one object
colors         "a blue cross"                           one object (same form; the point is the colour)
two_object     "a red circle and a blue square"         two objects of different classes
color_attr     "a red circle and a green square"        two objects, distinct shapes *and* colours
counting       "three green triangles"                  2–4 objects of one class
position       "a red circle left of a blue square"     two objects of different classes whose
                                                        box centres satisfy the relation
=============  =======================================  =======================================

A scene holds exactly the objects its prompt names (no distractors). Every scene has a structured
``SceneSpec`` (task, objects, relation) and a ``GroundTruth`` (per object: class, tight pixel box,
pixel mask = supersampled coverage ≥ 0.5), so a rule-based detector (``bench.data.scenes_detect``)
can score generated images GenEval-style and be tested exactly against the truth.

Layout. Object half-extents are 7–12 px (learnable at 64×64; the smallest object, a r=7 triangle,
still covers ~88 px). Objects are placed by rejection sampling of their axis-aligned boxes: boxes
stay ``BORDER`` px inside the frame and ``MIN_GAP`` px apart, so objects never touch and connected
components are exact even after a mild blur. If a scene does not fit (four large objects), all its
sizes shrink by 7 % and it is laid out again, so counting scenes of four objects are on average a
little smaller. Position scenes put the two box centres at least ``LAYOUT_MARGIN``·size apart on the
relation's axis (twice the checker's margin, ``POSITION_MARGIN``) and at most ``LAYOUT_ORTHO``·size
apart on the other axis, so every scene satisfies its relation, and no other, with a clear margin.

Background. Unlike tinyshapes' muted but saturated gradients (a (0.7, 0.25, 0.25) background is
reddish), the background here is a *low-saturation* gradient: grey levels 0.30–0.70 with a tint of
at most ±0.03 per channel, plus band-limited grey noise (equal on all channels, as tinyshapes' noise).
Foreground colours have a colour strength (channel minus the mean of the other two) of ≥ 0.3 after
jitter and shading, the background at most 0.05, so "which colour is this pixel, or is it
background" is unambiguous and linear in coverage: the detector recovers anti-aliased masks exactly.

Determinism. Nothing is stored. The scene of index i of a split (task, spec, sizes, positions,
rotation) comes from its own ``random.Random`` seeded by (split, i) and using only ``random()``,
whose stream Python guarantees across versions; its appearance (background, colour jitter, noise)
comes from a torch generator per chunk of ``CHUNK`` indices, drawn in fixed-size arrays. So the
first k scenes of a split never depend on how many are asked for. Splits are seeds: ``train``,
``val``, ``ref``, ``calib``, ``eval``.

Training task mix: the task of index i is ``TASKS[i mod 6]`` (uniform over the six task types in
every prefix); within a task the classes are uniform, counting draws N uniformly from 2–4 and
position draws the relation uniformly. Objects per scene: 1 (1/3 of scenes), 2 (1/2 + counting's
share: 5/9 in all), 3 (1/18), 4 (1/18).
"""
from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from bench.models.generator import to_uint8
from bench.models.text import WordTokenizer
from bench.tiny.configs import COLOURS, SCENE_TASKS, SHAPES, T2I_VOCAB

IMAGE_SIZE = 64
SUPERSAMPLE = 4          # anti-aliasing: coverage of each pixel from 4×4 samples
CHUNK = 256              # appearance draws per chunk of indices (prefix-stable)
SPLIT_SEEDS = {"train": 5_000_011, "val": 6_000_011, "ref": 7_000_003, "calib": 8_000_009, "eval": 9_000_011}

TASKS = SCENE_TASKS
COLOUR_NAMES = tuple(COLOURS)
NUMBERS = ("one", "two", "three", "four")   # the vocabulary's counts; the grammar's counting uses 2–4
COUNTS = (2, 3, 4)
PLURALS = {"circle": "circles", "square": "squares", "triangle": "triangles", "cross": "crosses"}
RELATIONS = ("left of", "right of", "above", "below")

# layout, in pixels of a 64×64 frame (scaled for other sizes)
HALF_EXTENT = (7.0, 12.0)    # object half-extent r (the tinyshapes masks: square 0.85 r, triangle, cross arms 0.32 r)
MIN_GAP = 4.0                # between the boxes of two objects
BORDER = 2.0                 # between a box and the frame
TRIANGLE_ROTATION = 0.35     # radians, ± (tinyshapes' triangle rotation)
POSITION_MARGIN = 0.1        # checker: "A left of B" ⇔ cx(A) < cx(B) − 0.1·size (GenEval-style)
LAYOUT_MARGIN = 0.2          # layout: position scenes separate the centres by ≥ 0.2·size on the axis …
LAYOUT_ORTHO = 0.05          # … and by ≤ 0.05·size on the other axis
SHRINK = 0.93                # sizes shrink by this factor when a scene does not fit
MAX_OBJECTS = 4

# appearance
BG_GREY = (0.30, 0.70)
BG_TINT = 0.03
BG_NOISE, FG_NOISE = 0.06, 0.04
NOISE_GRID = 16              # band-limited noise: a 16×16 grid upsampled bicubically (a 4 px period at 64)

# tokenizer (bench.models.text.WordTokenizer): pad is 0; a prompt is lower-cased and split on whitespace.
# The vocabulary is the tiny world's config (tiny-t2i's text encoder reads the same list).
VOCAB = list(T2I_VOCAB)
assert VOCAB == ["<pad>", "a", "and", "of", "left", "right", "above", "below", *NUMBERS, *COLOUR_NAMES,
                 *SHAPES, *(PLURALS[s] for s in SHAPES)], "the grammar's words and the tiny vocabulary disagree"
WORD_IDS = {w: i for i, w in enumerate(VOCAB)}
PAD_ID = 0
MAX_PROMPT_WORDS = 8         # "a red circle left of a blue square"


# ---------------------------------------------------------------------------------------- the grammar
@dataclass(frozen=True)
class SceneObject:
    shape: str
    colour: str


@dataclass(frozen=True)
class SceneSpec:
    """A prompt's structure: its task, its objects (in prompt order; counting repeats one object N
    times) and, for position prompts, the relation "objects[0] <relation> objects[1]"."""
    task: str
    objects: Tuple[SceneObject, ...]
    relation: Optional[str] = None

    def __post_init__(self):
        object.__setattr__(self, "objects", tuple(self.objects))
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; tasks are {', '.join(TASKS)}")
        for o in self.objects:
            if o.shape not in SHAPES or o.colour not in COLOURS:
                raise ValueError(f"unknown object {o.colour} {o.shape}; shapes {SHAPES}, colours {COLOUR_NAMES}")
        k, cls = len(self.objects), {(o.shape, o.colour) for o in self.objects}
        if (self.relation is not None) != (self.task == "position"):
            raise ValueError(f"a relation belongs to position prompts only (task {self.task!r}, relation {self.relation!r})")
        if self.relation is not None and self.relation not in RELATIONS:
            raise ValueError(f"unknown relation {self.relation!r}; relations are {', '.join(RELATIONS)}")
        ok = {"single_object": k == 1, "colors": k == 1,
              "two_object": k == 2 and len(cls) == 2, "position": k == 2 and len(cls) == 2,
              "color_attr": k == 2 and len({o.shape for o in self.objects}) == 2
              and len({o.colour for o in self.objects}) == 2,
              "counting": k in COUNTS and len(cls) == 1}[self.task]
        if not ok:
            raise ValueError(f"objects {[f'{o.colour} {o.shape}' for o in self.objects]} do not fit task {self.task!r}")

    @property
    def count(self) -> int:
        return len(self.objects)

    @property
    def prompt(self) -> str:
        o = self.objects
        if self.task in ("single_object", "colors"):
            return f"a {o[0].colour} {o[0].shape}"
        if self.task == "counting":
            return f"{NUMBERS[len(o) - 1]} {o[0].colour} {PLURALS[o[0].shape]}"
        joint = "and" if self.task in ("two_object", "color_attr") else self.relation
        return f"a {o[0].colour} {o[0].shape} {joint} a {o[1].colour} {o[1].shape}"


CLASS_PAIRS = [(s, c) for s in SHAPES for c in COLOUR_NAMES]


def all_specs(task: str) -> List[SceneSpec]:
    """Every distinct spec of a task, in a fixed order (12, 12, 132, 72, 36 and 528 of them)."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; tasks are {', '.join(TASKS)}")
    obj = [SceneObject(s, c) for s, c in CLASS_PAIRS]
    if task in ("single_object", "colors"):
        return [SceneSpec(task, (o,)) for o in obj]
    if task == "counting":
        return [SceneSpec(task, (o,) * n) for n in COUNTS for o in obj]
    pairs = [(a, b) for a, b in itertools.permutations(obj, 2)
             if task != "color_attr" or (a.shape != b.shape and a.colour != b.colour)]
    if task == "position":
        return [SceneSpec(task, p, r) for r in RELATIONS for p in pairs]
    return [SceneSpec(task, p) for p in pairs]


def _pick(rng: random.Random, seq: Sequence):
    return seq[min(int(rng.random() * len(seq)), len(seq) - 1)]


def _uniform(rng: random.Random, lo: float, hi: float) -> float:
    return lo + (hi - lo) * rng.random()


def _shuffled(rng: random.Random, seq: Sequence) -> list:
    """Fisher–Yates on ``random()`` only (``random.shuffle``'s stream is not guaranteed across versions)."""
    out = list(seq)
    for i in range(len(out) - 1, 0, -1):
        j = min(int(rng.random() * (i + 1)), i)
        out[i], out[j] = out[j], out[i]
    return out


def sample_spec(task: str, rng: random.Random) -> SceneSpec:
    """One spec of a task, uniform over its classes (counting: N uniform in 2–4)."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; tasks are {', '.join(TASKS)}")
    a = SceneObject(*_pick(rng, CLASS_PAIRS))
    if task in ("single_object", "colors"):
        return SceneSpec(task, (a,))
    if task == "counting":
        return SceneSpec(task, (a,) * _pick(rng, COUNTS))
    if task == "color_attr":
        b = SceneObject(_pick(rng, [s for s in SHAPES if s != a.shape]),
                        _pick(rng, [c for c in COLOUR_NAMES if c != a.colour]))
    else:
        b = SceneObject(*_pick(rng, [p for p in CLASS_PAIRS if p != (a.shape, a.colour)]))
    return SceneSpec(task, (a, b), _pick(rng, RELATIONS) if task == "position" else None)


def eval_prompts(task: str, n: int, seed: int = 0,
                 where: Optional[Callable[[SceneSpec], bool]] = None) -> Tuple[List[str], List[SceneSpec]]:
    """``n`` prompts and specs of one task for quality bars, deterministic in (task, n, seed): the
    task's distinct specs (``all_specs``, only those ``where`` accepts) in a seeded random order,
    reshuffled each time the list wraps, so any n covers the distinct specs as evenly as possible and
    is prefix-stable."""
    if n < 0:
        raise ValueError(f"n must be ≥ 0, got {n}")
    specs = [s for s in all_specs(task) if where is None or where(s)]
    if not specs and n:
        raise ValueError(f"no {task} spec passes the filter")
    rng = random.Random((int(seed) << 8) | TASKS.index(task))
    out: List[SceneSpec] = []
    while len(out) < n:
        out.extend(_shuffled(rng, specs))
    out = out[:n]
    return [s.prompt for s in out], out


# ---------------------------------------------------------------------------------------- tokenizer
def tokenize(prompts: Sequence[str], max_len: int = MAX_PROMPT_WORDS) -> Tuple[torch.Tensor, torch.Tensor]:
    """Word ids int64 [B, max_len] (pad id 0 after the words) and a bool mask [B, max_len] (True on
    words): tiny-t2i's tokenizer. Unknown words, empty prompts (nothing to attend to: the model's
    unconditional branch is its learned null prompt) and prompts longer than max_len are errors."""
    if isinstance(prompts, str):
        raise TypeError("tokenize takes a list of prompts, not a single string")
    if max_len < 1:
        raise ValueError(f"max_len must be ≥ 1, got {max_len}")
    return WordTokenizer(VOCAB, max_len)(prompts)


# ---------------------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class Placed:
    """An object of a scene's layout in pixels of the 64×64 frame: centre, half-extent r, rotation."""
    shape: str
    colour: str
    cx: float
    cy: float
    r: float
    rot: float


def _box_rel(shape: str, r: float, rot: float) -> Tuple[float, float, float, float]:
    """The shape's axis-aligned box relative to its centre (x0, y0, x1, y1), exact for the masks."""
    if shape == "square":
        return -0.85 * r, -0.85 * r, 0.85 * r, 0.85 * r
    if shape != "triangle":
        return -r, -r, r, r
    c, s = math.cos(rot), math.sin(rot)   # mask coordinates t = R(rot)·d, so d = R(rot)ᵀ·t
    xs, ys = zip(*((c * tx + s * ty, -s * tx + c * ty) for tx, ty in ((0, -r), (-r, 0.8 * r), (r, 0.8 * r))))
    return min(xs), min(ys), max(xs), max(ys)


def _apart(a, b) -> bool:
    """Boxes (x0, y0, x1, y1) at least MIN_GAP apart on some axis."""
    return a[0] >= b[2] + MIN_GAP or b[0] >= a[2] + MIN_GAP or a[1] >= b[3] + MIN_GAP or b[1] >= a[3] + MIN_GAP


def _layout(spec: SceneSpec, rng: random.Random) -> List[Placed]:
    W = float(IMAGE_SIZE)
    radii = [_uniform(rng, *HALF_EXTENT) for _ in spec.objects]
    rots = [(_uniform(rng, -1, 1) * TRIANGLE_ROTATION if o.shape == "triangle" else 0.0) for o in spec.objects]
    for _attempt in range(30):
        rel = [_box_rel(o.shape, r, a) for o, r, a in zip(spec.objects, radii, rots)]
        centres = _place_position(spec, rel, rng, W) if spec.task == "position" else _place_free(rel, rng, W)
        if centres is not None:
            return [Placed(o.shape, o.colour, cx, cy, r, a)
                    for o, (cx, cy), r, a in zip(spec.objects, centres, radii, rots)]
        radii = [max(HALF_EXTENT[0], r * SHRINK) for r in radii]
    raise RuntimeError(f"could not lay out {spec.prompt!r}")  # unreachable: minimum sizes always fit


def _place_free(rel, rng: random.Random, W: float):
    boxes, centres = [], []
    for x0, y0, x1, y1 in rel:
        for _try in range(60):
            cx = _uniform(rng, BORDER - x0, W - BORDER - x1)
            cy = _uniform(rng, BORDER - y0, W - BORDER - y1)
            box = (cx + x0, cy + y0, cx + x1, cy + y1)
            if all(_apart(box, b) for b in boxes):
                boxes.append(box)
                centres.append((cx, cy))
                break
        else:
            return None
    return centres


def _place_position(spec: SceneSpec, rel, rng: random.Random, W: float):
    """Box centres: the first object (in reading order along the axis) at least LAYOUT_MARGIN·W and
    box-apart before the second on the relation's axis, within LAYOUT_ORTHO·W on the other axis."""
    axis = 0 if spec.relation in ("left of", "right of") else 1
    order = (0, 1) if spec.relation in ("left of", "above") else (1, 0)
    lo = [b[axis] for b in rel]                 # box start relative to the centre (negative)
    hi = [b[axis + 2] for b in rel]
    half = [(h - l) / 2 for l, h in zip(lo, hi)]
    off = [(h + l) / 2 for l, h in zip(lo, hi)]  # box centre − object centre
    f, s = order
    dmin = max(LAYOUT_MARGIN * W, half[f] + half[s] + MIN_GAP)
    dmax = (W - BORDER - half[s]) - (BORDER + half[f])
    if dmin > dmax:
        return None
    d = _uniform(rng, dmin, dmax)
    pf = _uniform(rng, BORDER + half[f], W - BORDER - half[s] - d)
    prim = {f: pf, s: pf + d}                   # box centres on the axis
    o_ax = 1 - axis
    olo = [b[o_ax] for b in rel]
    ohi = [b[o_ax + 2] for b in rel]
    ohalf = [(h - l) / 2 for l, h in zip(olo, ohi)]
    ooff = [(h + l) / 2 for l, h in zip(olo, ohi)]
    for _try in range(60):
        q0 = _uniform(rng, BORDER + ohalf[0], W - BORDER - ohalf[0])
        q1 = q0 + _uniform(rng, -LAYOUT_ORTHO * W, LAYOUT_ORTHO * W)
        if BORDER + ohalf[1] <= q1 <= W - BORDER - ohalf[1]:
            break
    else:
        return None
    orth = (q0, q1)
    out = []
    for i in range(2):
        c_ax, c_or = prim[i] - off[i], orth[i] - ooff[i]
        out.append((c_ax, c_or) if axis == 0 else (c_or, c_ax))
    return out


def scene(split: str, index: int) -> Tuple[SceneSpec, List[Placed]]:
    """The spec and layout of scene ``index`` of a split (its task is ``TASKS[index mod 6]``)."""
    if split not in SPLIT_SEEDS:
        raise ValueError(f"unknown split {split!r}; splits are {', '.join(SPLIT_SEEDS)}")
    if not 0 <= index < 1 << 32:
        raise ValueError(f"index must be in [0, 2**32), got {index}")
    rng = random.Random((SPLIT_SEEDS[split] << 32) | index)
    spec = sample_spec(TASKS[index % len(TASKS)], rng)
    return spec, _layout(spec, rng)


# ---------------------------------------------------------------------------------------- rendering
@dataclass(frozen=True, eq=False)
class TruthObject:
    """One object's ground truth: class, tight box (x0, y0, x1, y1) in pixels with exclusive ends
    (``mask[y0:y1, x0:x1]`` holds it), and its mask (bool numpy [H, W]: supersampled coverage ≥ 0.5)."""
    shape: str
    colour: str
    box: Tuple[int, int, int, int]
    mask: np.ndarray


@dataclass(frozen=True, eq=False)
class GroundTruth:
    objects: Tuple[TruthObject, ...]


def _appearance(split: str, chunk: int) -> dict:
    """Per-index appearance draws of a chunk, in fixed-size arrays (row i ↔ index chunk·CHUNK + i)."""
    g = torch.Generator().manual_seed(SPLIT_SEEDS[split] * 7919 + chunk)
    u = lambda *s: torch.rand(*s, generator=g)  # noqa: E731
    n = CHUNK
    grey = BG_GREY[0] + (BG_GREY[1] - BG_GREY[0]) * u(n, 2, 1)
    bg = grey + BG_TINT * (2 * u(n, 2, 3) - 1)                       # two gradient ends, n, 2, 3
    return {"bg": bg, "angle": u(n) * 2 * math.pi, "noise": u(n, 1, NOISE_GRID, NOISE_GRID) - 0.5,
            "bright": 0.85 + 0.3 * u(n, MAX_OBJECTS), "jitter": 0.06 * (u(n, MAX_OBJECTS, 3) - 0.5)}


def _shape_masks(dx: torch.Tensor, dy: torch.Tensor, rr: torch.Tensor, rot: torch.Tensor, shape_id: torch.Tensor):
    """tinyshapes' masks (circle, square, triangle, cross) for objects [M] at offsets dx, dy [M, L, L]."""
    out = torch.zeros(dx.shape, dtype=torch.bool)
    for k, name in enumerate(SHAPES):
        sel = (shape_id == k).nonzero().flatten()
        if not len(sel):
            continue
        x, y, r = dx[sel], dy[sel], rr[sel, None, None]
        if name == "circle":
            m = x.square() + y.square() <= r.square()
        elif name == "square":
            m = (x.abs() <= r * 0.85) & (y.abs() <= r * 0.85)
        elif name == "triangle":
            a = rot[sel, None, None]
            tx, ty = x * a.cos() - y * a.sin(), x * a.sin() + y * a.cos()
            m = (ty <= r * 0.8) & (ty >= -r + 2 * tx.abs() * 0.9)
        else:
            arm = r * 0.32
            m = ((x.abs() <= arm) & (y.abs() <= r)) | ((y.abs() <= arm) & (x.abs() <= r))
        out[sel] = m
    return out


def _render(layouts: List[List[Placed]], app: dict, size: int) -> Tuple[torch.Tensor, List[GroundTruth]]:
    """Images uint8 [n, 3, size, size] and ground truths of n layouts with their appearance rows.

    Objects are rendered on a window around each (supersampled coverage and shading, average-pooled)
    and composited as img = bg·(1 − Σ cov) + Σ pool(mask·shade)·colour + noise_fg·Σ cov; objects never
    share a covered pixel, so the composite is exact whatever the order."""
    n, k = len(layouts), size / IMAGE_SIZE
    # background at pixel resolution: a linear gradient between two low-saturation ends + grey noise
    ax = (torch.arange(size, dtype=torch.float32) + 0.5) / size * 2 - 1
    yy, xx = torch.meshgrid(ax, ax, indexing="ij")
    ang = app["angle"]
    t = ((xx[None] * ang.cos()[:, None, None] + yy[None] * ang.sin()[:, None, None]) * 0.5 + 0.5).clamp(0, 1)
    c0, c1 = app["bg"][:, 0, :, None, None], app["bg"][:, 1, :, None, None]
    noise = F.interpolate(app["noise"], size=(size, size), mode="bicubic", align_corners=False)   # n, 1, H, W
    bg = c0 * (1 - t[:, None]) + c1 * t[:, None] + BG_NOISE * noise

    objs = [(i, j, p) for i, lay in enumerate(layouts) for j, p in enumerate(lay)]
    HW = size * size
    cov_sum = torch.zeros(n * HW)
    fg_sum = torch.zeros(n * HW, 3)
    truths: List[List[TruthObject]] = [[] for _ in range(n)]
    if objs:
        win = 2 * math.ceil(1.3 * HALF_EXTENT[1] * k) + 2          # window side in pixels
        L = win * SUPERSAMPLE
        scene_i = torch.tensor([i for i, _, _ in objs])
        slot = torch.tensor([j for _, j, _ in objs])
        cx = torch.tensor([p.cx * k for _, _, p in objs], dtype=torch.float64)
        cy = torch.tensor([p.cy * k for _, _, p in objs], dtype=torch.float64)
        rr = torch.tensor([p.r * k for _, _, p in objs], dtype=torch.float32)
        rot = torch.tensor([p.rot for _, _, p in objs], dtype=torch.float32)
        shape_id = torch.tensor([SHAPES.index(p.shape) for _, _, p in objs])
        colour_id = torch.tensor([COLOUR_NAMES.index(p.colour) for _, _, p in objs])
        x_off = cx.floor().long() - win // 2
        y_off = cy.floor().long() - win // 2
        sub = (torch.arange(L, dtype=torch.float64) + 0.5) / SUPERSAMPLE
        dx = ((x_off[:, None] + sub[None]) - cx[:, None]).float()[:, None, :].expand(-1, L, -1)   # M, L, L
        dy = ((y_off[:, None] + sub[None]) - cy[:, None]).float()[:, :, None].expand(-1, -1, L)
        mask = _shape_masks(dx, dy, rr, rot, shape_id).float()
        shade = 1 + 0.18 * (-(dx + dy) / (2 * rr[:, None, None])).clamp(-1, 1)
        cov = F.avg_pool2d(mask[:, None], SUPERSAMPLE)[:, 0]                  # M, win, win
        lit = F.avg_pool2d((mask * shade)[:, None], SUPERSAMPLE)[:, 0]
        base = torch.tensor([COLOURS[c] for c in COLOUR_NAMES])[colour_id]   # M, 3
        fg = (base * app["bright"][scene_i, slot, None] + app["jitter"][scene_i, slot]).clamp(0, 1)

        px = x_off[:, None] + torch.arange(win)[None]                        # M, win
        py = y_off[:, None] + torch.arange(win)[None]
        inside = ((px >= 0) & (px < size))[:, None, :] & ((py >= 0) & (py < size))[:, :, None]
        flat = scene_i[:, None, None] * HW + py.clamp(0, size - 1)[:, :, None] * size + px.clamp(0, size - 1)[:, None, :]
        sel = inside.flatten()
        idx = flat.flatten()[sel]
        cov_sum.index_put_((idx,), cov.flatten()[sel], accumulate=True)
        fg_sum.index_put_((idx,), (lit[..., None] * fg[:, None, None, :]).flatten(0, 2)[sel], accumulate=True)

        covered = ((cov >= 0.5) & inside).numpy()
        xo, yo = x_off.tolist(), y_off.tolist()
        for m, (i, _, p) in enumerate(objs):
            full = np.zeros((size + 2 * win, size + 2 * win), dtype=bool)   # padded: windows may cross the frame
            full[yo[m] + win:yo[m] + 2 * win, xo[m] + win:xo[m] + 2 * win] = covered[m]
            full = full[win:win + size, win:win + size]
            rows, cols = np.flatnonzero(full.any(1)), np.flatnonzero(full.any(0))
            box = (int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1)
            truths[i].append(TruthObject(p.shape, p.colour, box, np.ascontiguousarray(full)))

    cov_img = cov_sum.view(n, 1, size, size)
    fg_img = fg_sum.view(n, size, size, 3).permute(0, 3, 1, 2)
    img = bg * (1 - cov_img) + fg_img + FG_NOISE * noise * cov_img
    return to_uint8(img.clamp(0, 1)), [GroundTruth(tuple(t)) for t in truths]


def generate(n: int, split: str = "train", start: int = 0, size: int = IMAGE_SIZE
             ) -> Tuple[torch.Tensor, List[str], List[SceneSpec], List[GroundTruth]]:
    """Scenes start … start+n−1 of a split: images uint8 [n, 3, size, size], prompts, specs and
    ground truths. ``size`` scales the 64×64 layout (≥ 32; the detector is tested at 64)."""
    if split not in SPLIT_SEEDS:
        raise ValueError(f"unknown split {split!r}; splits are {', '.join(SPLIT_SEEDS)}")
    if n < 0 or start < 0:
        raise ValueError(f"n and start must be ≥ 0, got n={n}, start={start}")
    if size < 32:
        raise ValueError(f"size must be ≥ 32 (objects are 7–12 px at 64), got {size}")
    imgs, prompts, specs, truths = [], [], [], []
    for c in range(start // CHUNK, (start + n + CHUNK - 1) // CHUNK):
        lo, hi = max(start, c * CHUNK), min(start + n, (c + 1) * CHUNK)
        app = {key: v[lo - c * CHUNK:hi - c * CHUNK] for key, v in _appearance(split, c).items()}
        scenes = [scene(split, i) for i in range(lo, hi)]
        im, tr = _render([lay for _, lay in scenes], app, size)
        imgs.append(im)
        truths += tr
        specs += [s for s, _ in scenes]
    prompts = [s.prompt for s in specs]
    return (torch.cat(imgs) if imgs else torch.zeros(0, 3, size, size, dtype=torch.uint8)), prompts, specs, truths


def object_tokens(truths: Sequence[GroundTruth], schedule: Sequence[Tuple[int, int]], chunk: int = 4096) -> torch.Tensor:
    """Per scene, which tokens of a next-scale pyramid hold part of an object: bool [n, Σ h·w], scale by
    scale in ``schedule`` order (row-major within a scale). A token of an h×w grid holds an object when
    any pixel of its cell is in an object's ground-truth mask (max-pooled), so the 1×1 token does
    whenever the scene has an object."""
    out = []
    for lo in range(0, len(truths), chunk):
        part = truths[lo:lo + chunk]
        if not part:
            break
        size = next((o.mask.shape[0] for t in part for o in t.objects), IMAGE_SIZE)
        cov = torch.zeros(len(part), 1, size, size)
        for i, t in enumerate(part):
            for o in t.objects:
                cov[i, 0] += torch.from_numpy(o.mask)
        out.append(torch.cat([F.adaptive_max_pool2d(cov, tuple(hw)).flatten(1) > 0 for hw in schedule], dim=1))
    return torch.cat(out) if out else torch.zeros(0, sum(h * w for h, w in schedule), dtype=torch.bool)
