"""GenEval's scoring rules, detector-agnostic: from per-class detections to a verdict per image, and
from verdicts to the task and overall scores.

The rules are those of djghosh13/geneval ``evaluation/evaluate_images.py`` and
``evaluation/summary_scores.py`` (also the copies in FoundationVision/Infinity and FastVAR, which
differ only in accepting ``.jpg`` samples):

- Detections (``keep_detections``): per class, boxes sorted by score (highest first), those scoring
  above ``threshold`` kept (``counting_threshold`` for counting prompts), at most ``max_objects`` per
  class, then greedy IoU suppression only when ``max_overlap`` < 1 (IoU with the +1-pixel box
  convention). A class without a kept box is absent.
- Verdict (``evaluate``): include clauses are ANDed, exclude clauses ORed. An include clause takes the
  ``count`` most confident objects of its class and fails if there are fewer; if it names a colour, the
  colour classifier must give that colour to at least ``count`` of them; if it names a position
  ``[relation, i]`` (checked only when the clause has matched so far), include clause i must have
  matched and every found object must hold the relation to every object clause i found. An exclude
  clause fails the image when its class has ``count`` or more kept objects (this is what makes
  counting exact: "two clocks" excludes three).
- Relation (``relative_position``): the centre offset of A from B, each axis shrunk towards 0 by
  ``position_threshold`` × (the two boxes' extents on that axis) and divided by the offset's length;
  "left of" if the x component < −0.5, "right of" if > 0.5, "above" if y < −0.5, "below" if > 0.5
  (image y grows downwards); no relation when both shrunk components are below 1e-3.
- Scores (``summary``): the accuracy of each task over its images, the overall score = the unweighted
  mean over tasks, the fraction of correct images, and of correct prompts (a prompt is correct when
  any of its images is).

Reasons are the official strings, so a verdict can be compared line by line with the official
evaluator's ``results.jsonl`` (``read_results`` reads one; ``varbench geneval import`` scores it).

The colour check needs a classifier: a callable ``colours(objects, classname) -> [colour, …]`` for
the image under evaluation (official: open_clip ViT-L-14 zero-shot over ``COLORS`` on masked crops,
``bench.metrics.geneval_detectors``; the tiny world: the exact colour of the pixels under the mask).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np

# ``--options`` defaults of the official evaluator; one table for the API and the CLI
DEFAULTS = dict(threshold=0.3, counting_threshold=0.9, max_objects=16, max_overlap=1.0, position_threshold=0.1)
# their valid ranges (closed; None: unbounded). The official evaluator takes any number, but detection
# scores and IoUs lie in [0, 1]: a threshold outside it keeps every box or none (every score 0, without
# a word); position_threshold is a fraction of the two boxes' extents, a margin, not more than them
RANGES = dict(threshold=(0.0, 1.0), counting_threshold=(0.0, 1.0), max_objects=(1, None), max_overlap=(0.0, 1.0),
              position_threshold=(0.0, 1.0))
COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
TAGS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
RELATIONS = ("left of", "right of", "above", "below")

Obj = Tuple[np.ndarray, Optional[np.ndarray]]   # (box [x1, y1, x2, y2, score], mask bool [H, W] or None)
Colours = Callable[[Sequence[Obj], str], List[str]]


def _options(options: Optional[Mapping]) -> dict:
    opts = dict(DEFAULTS)
    for k, v in (options or {}).items():
        if k not in DEFAULTS:
            from bench.registry import did_you_mean
            raise ValueError(f"unknown GenEval option {k!r}{did_you_mean(k, DEFAULTS)} (options: {', '.join(DEFAULTS)})")
        opts[k] = _option(k, v)
    return opts


def _option(key: str, value):
    """``value`` (a string from the CLI, or a number) as option ``key``'s type, checked against its range."""
    kind, (lo, hi) = type(DEFAULTS[key]), RANGES[key]
    try:
        x = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        x = math.nan
    if kind is int:    # "2.5" is refused, not truncated to 2
        x = int(x) if x.is_integer() else math.nan
    if not lo <= x or (hi is not None and x > hi):      # NaN fails lo <= x
        want = f"a whole number ≥ {lo}" if kind is int else f"a number in [{lo:g}, {hi:g}]"
        raise ValueError(f"GenEval option {key}={value}: expected {want} (the official default is {DEFAULTS[key]})")
    return x


def iou(box_a, box_b) -> float:
    """IoU of two [x1, y1, x2, y2, …] boxes with the +1-pixel convention (official ``compute_iou``)."""
    def area(b):
        return max(b[2] - b[0] + 1, 0) * max(b[3] - b[1] + 1, 0)
    inter = area([max(box_a[0], box_b[0]), max(box_a[1], box_b[1]), min(box_a[2], box_b[2]), min(box_a[3], box_b[3])])
    union = area(box_a) + area(box_b) - inter
    return inter / union if union else 0.0


def keep_detections(boxes: Mapping[str, np.ndarray], masks: Optional[Mapping[str, Sequence]] = None,
                    tag: str = "", options: Optional[Mapping] = None) -> Dict[str, List[Obj]]:
    """Per class, the detections the evaluator keeps (most confident first): ``boxes[c]`` is an array
    [k, 5] (x1, y1, x2, y2, score) and ``masks[c]`` the k masks (or None)."""
    opts = _options(options)
    thr = opts["counting_threshold"] if tag == "counting" else opts["threshold"]
    kept: Dict[str, List[Obj]] = {}
    for cls, b in boxes.items():
        b = np.asarray(b)
        if not np.issubdtype(b.dtype, np.floating):
            b = b.astype(np.float64)
        b = b.reshape(-1, 5)   # keep float32 boxes float32: 0.3 > 0.3 must stay False, as in the official code
        order = np.argsort(b[:, 4])[::-1]
        order = order[b[order, 4] > thr][:opts["max_objects"]].tolist()
        ms = None if masks is None else masks.get(cls)
        out: List[Obj] = []
        while order:
            i = order.pop(0)
            out.append((b[i], None if ms is None else ms[i]))
            if opts["max_overlap"] < 1:
                order = [j for j in order if iou(b[i], b[j]) < opts["max_overlap"]]
        if out:
            kept[cls] = out
    return kept


def relative_position(obj_a: Obj, obj_b: Obj, position_threshold: float = DEFAULTS["position_threshold"]) -> Set[str]:
    """The relations of A to B ("left of", "right of", "above", "below"; none, one or two of them)."""
    boxes = np.array([obj_a[0][:4], obj_b[0][:4]], dtype=np.float64).reshape(2, 2, 2)   # box, corner, xy
    centre_a, centre_b = boxes.mean(axis=1)
    extent_a, extent_b = np.abs(boxes[:, 1] - boxes[:, 0])
    offset = centre_a - centre_b
    shrunk = np.maximum(np.abs(offset) - position_threshold * (extent_a + extent_b), 0) * np.sign(offset)
    if np.all(np.abs(shrunk) < 1e-3):
        return set()
    dx, dy = shrunk / np.linalg.norm(offset)
    return {r for r, hit in (("left of", dx < -0.5), ("right of", dx > 0.5), ("above", dy < -0.5), ("below", dy > 0.5))
            if hit}


def evaluate(objects: Mapping[str, Sequence[Obj]], metadata: Mapping, colours: Optional[Colours] = None,
             position_threshold: float = DEFAULTS["position_threshold"]) -> Tuple[bool, str]:
    """(correct, reason) of one image: ``objects`` as ``keep_detections`` returns them, ``metadata`` one
    row of ``evaluation_metadata.jsonl``, ``colours`` the image's colour classifier (needed only when a
    clause names a colour)."""
    correct, reasons, matched_groups = True, [], []
    for req in metadata.get("include", []):
        cls, count = req["class"], req["count"]
        found = list(objects.get(cls, []))[:count]
        matched = True
        if len(found) < count:
            correct = matched = False
            reasons.append(f"expected {cls}>={count}, found {len(found)}")
        else:
            if "color" in req:
                if colours is None:
                    raise ValueError(f"prompt {metadata.get('prompt')!r} names a colour: evaluate() needs a colour classifier")
                got = colours(found, cls)
                if got.count(req["color"]) < count:
                    correct = matched = False
                    reasons.append(f"expected {req['color']} {cls}>={count}, found {got.count(req['color'])} "
                                   f"{req['color']}; and " + ", ".join(f"{got.count(c)} {c}" for c in COLORS if c in got))
            if "position" in req and matched:
                rel, target = req["position"]
                if matched_groups[target] is None:
                    correct = matched = False
                    reasons.append(f"no target for {cls} to be {rel}")
                else:
                    for obj in found:
                        for tgt in matched_groups[target]:
                            true_rels = relative_position(obj, tgt, position_threshold)
                            if rel not in true_rels:
                                correct = matched = False
                                reasons.append(f"expected {cls} {rel} target, found {' and '.join(true_rels)} target")
                                break
                        if not matched:
                            break
        matched_groups.append(found if matched else None)
    for req in metadata.get("exclude", []):
        cls = req["class"]
        if len(objects.get(cls, [])) >= req["count"]:
            correct = False
            reasons.append(f"expected {cls}<{req['count']}, found {len(objects[cls])}")
    return correct, "\n".join(reasons)


def check_metadata(row: Mapping, where: str = "metadata") -> dict:
    """One prompt's metadata, validated: a known tag, include clauses with class and count ≥ 1, colours
    of ``COLORS``, positions ``[relation, index of an earlier clause]``."""
    if not isinstance(row, Mapping):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    missing = [k for k in ("tag", "include", "prompt") if k not in row]
    if missing:
        raise ValueError(f"{where}: missing key(s) {', '.join(missing)} (GenEval metadata has tag, include, prompt)")
    if row["tag"] not in TAGS:
        raise ValueError(f"{where}: unknown tag {row['tag']!r}; tags are {', '.join(TAGS)}")
    for i, req in enumerate(row["include"]):
        if not isinstance(req.get("class"), str) or not isinstance(req.get("count"), int) or req["count"] < 1:
            raise ValueError(f"{where}: include[{i}] needs a class name and a count ≥ 1, got {req}")
        if "color" in req and req["color"] not in COLORS:
            raise ValueError(f"{where}: include[{i}] colour {req['color']!r} is not one of {', '.join(COLORS)}")
        if "position" in req:
            rel, target = req["position"]
            if rel not in RELATIONS or not (isinstance(target, int) and 0 <= target < i):
                raise ValueError(f"{where}: include[{i}] position {req['position']} must be [one of {RELATIONS}, "
                                 f"the index of an earlier include clause]")
    return dict(row)


def read_metadata(path) -> List[dict]:
    """The rows of an ``evaluation_metadata.jsonl`` (one JSON object per line), validated."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GenEval metadata {path} not found: it is prompts/evaluation_metadata.jsonl of "
                                f"https://github.com/djghosh13/geneval (553 prompts)")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(check_metadata(json.loads(line), f"{path}:{n}"))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
    return rows


def read_results(path):
    """The official evaluator's ``results.jsonl`` as a DataFrame (filename, tag, prompt, correct, reason,
    metadata, details)."""
    import pandas as pd
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"GenEval results {path} is a folder, not a file: give the results file (the --outfile of "
                         f"evaluation/evaluate_images.py)")
    if not path.is_file():
        raise FileNotFoundError(f"GenEval results {path} not found (the --outfile of evaluation/evaluate_images.py)")
    try:
        df = pd.read_json(path, orient="records", lines=True)
    except ValueError as e:     # pandas names neither the file nor the line
        raise ValueError(f"{path}: not a GenEval results file (one JSON object per line): {e}") from None
    missing = {"tag", "correct", "metadata"} - set(df.columns)
    if missing:
        raise ValueError(f"{path}: not a GenEval results file, missing column(s) {', '.join(sorted(missing))}")
    return df


def summary(results) -> Dict[str, float]:
    """Scores of a results frame (a row per image with ``tag``, ``correct`` and ``metadata``):
    ``geneval_<tag>`` the accuracy of each task (in order of first appearance, as the official
    ``groupby(sort=False)``), ``geneval`` = their unweighted mean (the overall score),
    ``geneval_images`` the fraction of correct images and ``geneval_prompts`` of correct prompts."""
    if len(results) == 0:
        raise ValueError("no GenEval results to summarise")
    per_task = results.groupby("tag", sort=False)["correct"].mean()
    out = {f"geneval_{tag}": float(acc) for tag, acc in per_task.items()}
    out["geneval"] = float(np.mean(per_task.values))
    out["geneval_images"] = float(results["correct"].mean())
    out["geneval_prompts"] = float(results.groupby("metadata")["correct"].any().mean())
    return out
