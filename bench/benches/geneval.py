"""GenEval: compositional text-to-image prompts scored by an object detector (djghosh13/geneval).

``geneval`` (paper world): the official ``evaluation_metadata.jsonl`` (553 prompts over six tasks,
shipped in ``datasets/geneval/`` with its MIT licence), 4 images per prompt, each prompt's images one
batch seeded by ``seed·1000003 + i`` for prompt i (a deviation: the official ``generation/diffusers_
generate.py`` calls ``seed_everything(42)`` before every prompt, so every prompt starts from the same
seed; Infinity's ``infer4eval.py`` does the same and draws the 4 images one at a time from the global RNG;
FastVAR's HART script gives all 4 the same ``g_seed``; here different prompts get different noise, and
a run stays reproducible from its seed; images are scored as the lossless uint8 arrays or PNGs, where
Infinity's script saves JPEG through ``cv2.imwrite``), scored by
the official rules (``bench.metrics.geneval``) over Mask2Former detections and CLIP colours
(``bench.metrics.geneval_detectors``). ``shapes-geneval`` (tiny world): the same six tasks over the
shapes-scenes vocabulary, the same rules, the exact rule-based detector.

shapes-geneval prompts (``shapes_metadata``): ``SHAPES_PER_TAG`` prompts per task from the
shapes-scenes grammar (``scenes.eval_prompts``: every distinct spec of the task in a seeded order), as
GenEval metadata whose class is the shape and colour one of the scene colours: single_object checks
the shape only (the grammar names a colour, GenEval's single_object does not check one); colors and
color_attr check colours; two_object and position use two *different* shapes (GenEval's clauses are
per class, so two objects of one shape would satisfy both clauses at once); counting excludes N+1;
position "A <relation> B" is ``[{B}, {A, position: [relation, 0]}]`` as GenEval writes it.

Folder layout (``write_prompt`` / ``scan_folder``): the official one, ``<index:05d>/metadata.jsonl``
(one JSON object) and ``<index:05d>/samples/<n:04d>.png`` (``.jpg`` read too, as the Infinity and
FastVAR forks); ``generate_folder`` writes a prompt's samples before its metadata and skips prompts
already complete, so a stopped run resumes where it stopped; scoring a folder against a prompt list
with a prompt's image missing is an error naming the file. Scoring a folder on its own (``varbench
geneval score``) takes whatever is there, as the official evaluator does, and ``missing_of`` says what
it lacks of a bench's prompts (the overall score is the mean over the tasks present). A damaged
metadata file or image is an error naming it: deleting it and generating again redoes that prompt.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from bench.benches.base import Bench
from bench.registry import BENCHES

IMAGES_PER_PROMPT = 4
SHAPES_PER_TAG = 40
SAMPLE_RE = re.compile(r"^(\d+)\.(png|jpg)$")


# ---------------------------------------------------------------------------------------- prompts
def _shapes_row(spec) -> dict:
    """GenEval metadata of a shapes-scenes spec (see the module docstring)."""
    o, tag = spec.objects, spec.task
    if tag == "single_object":
        inc = [{"class": o[0].shape, "count": 1}]
    elif tag == "colors":
        inc = [{"class": o[0].shape, "count": 1, "color": o[0].colour}]
    elif tag == "counting":
        return {"tag": tag, "include": [{"class": o[0].shape, "count": len(o)}],
                "exclude": [{"class": o[0].shape, "count": len(o) + 1}], "prompt": spec.prompt}
    elif tag == "two_object":
        inc = [{"class": o[0].shape, "count": 1}, {"class": o[1].shape, "count": 1}]
    elif tag == "color_attr":
        inc = [{"class": x.shape, "count": 1, "color": x.colour} for x in o]
    else:   # position: "o0 <relation> o1" → the reference o1 first, as GenEval's metadata
        inc = [{"class": o[1].shape, "count": 1}, {"class": o[0].shape, "count": 1, "position": [spec.relation, 0]}]
    return {"tag": tag, "include": inc, "prompt": spec.prompt}


def shapes_metadata(per_tag: int = SHAPES_PER_TAG, seed: int = 0) -> List[dict]:
    """shapes-geneval's prompts as GenEval metadata rows, tag by tag in GenEval's order."""
    from bench.data import scenes
    from bench.metrics.geneval import TAGS

    def usable(spec) -> bool:
        return spec.task not in ("two_object", "position") or spec.objects[0].shape != spec.objects[1].shape

    return [_shapes_row(s) for tag in TAGS for s in scenes.eval_prompts(tag, per_tag, seed=seed, where=usable)[1]]


def official_metadata() -> List[dict]:
    """The 553 prompts of GenEval's ``evaluation_metadata.jsonl`` (shipped in datasets/geneval/)."""
    from bench.metrics.geneval import read_metadata
    from bench.resources import resource_dir
    return read_metadata(resource_dir("datasets") / "geneval" / "evaluation_metadata.jsonl")


# ---------------------------------------------------------------------------------------- folders
def prompt_dir(folder, index: int) -> Path:
    return Path(folder) / f"{index:05d}"


def write_prompt(folder, index: int, row: dict, images_uint8) -> None:
    """One prompt's samples (uint8 [k, 3, H, W]) as ``samples/NNNN.png``, then its ``metadata.jsonl``."""
    from bench.io import atomic_write_text, save_png
    d = prompt_dir(folder, index)
    for n, img in enumerate(images_uint8):
        save_png(d / "samples" / f"{n:04d}.png", img)
    atomic_write_text(d / "metadata.jsonl", json.dumps(row) + "\n")


def _samples(d: Path) -> Dict[int, Path]:
    out = {}
    if (d / "samples").is_dir():
        for p in (d / "samples").iterdir():
            m = SAMPLE_RE.match(p.name)
            if m and p.is_file():
                out[int(m.group(1))] = p
    return out


def _read_prompt_meta(meta: Path):
    """The JSON object of a prompt's ``metadata.jsonl``; a damaged file is an error naming it and the place."""
    try:
        return json.loads(meta.read_text(encoding="utf-8"))
    except ValueError as e:     # JSONDecodeError, UnicodeDecodeError: neither names the file
        why = f"{e.msg}: line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else "not UTF-8 text"
        raise ValueError(f"{meta}: not JSON ({why}); delete that file and generate the folder again "
                         f"(`varbench geneval generate` redoes the prompts it lacks)") from None


def prompt_complete(folder, index: int, row: dict, n: int) -> bool:
    d = prompt_dir(folder, index)
    meta = d / "metadata.jsonl"
    if not meta.is_file():
        return False
    if _read_prompt_meta(meta) != row:
        raise ValueError(f"{meta} holds another prompt than prompt {index} of this run ({row['prompt']!r}); "
                         f"use an empty folder for each prompt set")
    return all(k in _samples(d) for k in range(n))


def scan_folder(folder, rows: Optional[Sequence[dict]] = None, n: Optional[int] = None):
    """[(index, metadata, [sample paths in order])] of a GenEval image folder (numeric subfolders). With
    ``rows`` (and ``n`` images per prompt) every prompt must be there with its images: a missing
    folder, metadata file or image is an error naming it."""
    from bench.metrics.geneval import check_metadata
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"GenEval image folder {folder} is a file, not a folder")
    if not folder.is_dir():
        raise FileNotFoundError(f"GenEval image folder {folder} not found")
    found = {}
    for d in sorted(folder.iterdir()):
        if d.is_dir() and d.name.isdigit():
            meta = d / "metadata.jsonl"
            if not meta.is_file():
                raise FileNotFoundError(f"{meta} is missing (every prompt folder holds its metadata.jsonl)")
            row = check_metadata(_read_prompt_meta(meta), str(meta))
            found[int(d.name)] = (row, [p for _, p in sorted(_samples(d).items())])
    if rows is None:
        if not found:
            raise FileNotFoundError(f"GenEval image folder {folder} holds no prompt folder (<index>/metadata.jsonl "
                                    f"and <index>/samples/NNNN.png)")
        return [(i, r, ps) for i, (r, ps) in sorted(found.items())]
    missing = []
    for i in range(len(rows)):
        if i not in found:
            missing.append(str(prompt_dir(folder, i)))
            continue
        have = _samples(prompt_dir(folder, i))
        missing += [str(prompt_dir(folder, i) / "samples" / f"{k:04d}.png") for k in range(n or 1) if k not in have]
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise FileNotFoundError(f"GenEval folder {folder} is incomplete: missing {', '.join(missing[:5])}{more}; "
                                f"generate them again (generation resumes where it stopped)")
    return [(i, found[i][0], found[i][1][:n]) for i in range(len(rows))]


def generate_folder(gen, rows: Sequence[dict], folder, seed: int, sampling: dict, n: int = IMAGES_PER_PROMPT,
                    progress: bool = True) -> int:
    """Sample ``n`` images of every prompt into ``folder`` (prompt i: one batch, seed ``Bench.batch_seed(seed,
    i)``), skipping prompts already complete. Returns the number of prompts generated now."""
    from tqdm.auto import tqdm
    todo = [i for i, r in enumerate(rows) if not prompt_complete(folder, i, r, n)]
    for i in tqdm(todo, desc="geneval samples", disable=not progress):
        imgs = gen.generate([rows[i]["prompt"]] * n, seed=Bench.batch_seed(seed, i), **sampling)
        write_prompt(folder, i, rows[i], imgs.cpu())
    return len(todo)


# ---------------------------------------------------------------------------------------- scoring
def score_images(detector, images, rows: Sequence[dict], filenames: Sequence[str], options=None,
                 progress: bool = False):
    """The official results frame (filename, tag, prompt, correct, reason, metadata, details) of images
    (uint8 numpy [H, W, 3] each) with their metadata rows."""
    import numpy as np
    import pandas as pd
    from tqdm.auto import tqdm

    from bench.metrics.geneval import _options, evaluate, keep_detections
    opts = _options(options)
    out = []
    for img, row, name in tqdm(list(zip(images, rows, filenames)), desc="geneval score", disable=not progress):
        img = np.asarray(img)
        boxes, masks = detector.detect(img)
        objects = keep_detections(boxes, masks, row["tag"], opts)
        ok, reason = evaluate(objects, row, lambda objs, cls, img=img: detector.colours(img, objs, cls),
                              opts["position_threshold"])
        out.append({"filename": name, "tag": row["tag"], "prompt": row["prompt"], "correct": bool(ok),
                    "reason": reason, "metadata": json.dumps(row),
                    "details": json.dumps({k: [b.tolist() for b, _ in v] for k, v in objects.items()})})
    return pd.DataFrame(out)


def score_folder(folder, detector, rows: Optional[Sequence[dict]] = None, n: Optional[int] = None, options=None,
                 progress: bool = True):
    """``score_images`` over a GenEval folder (see ``scan_folder`` for ``rows`` and ``n``). Bad options and
    unreadable images are errors naming them, raised before any image is scored."""

    from bench.metrics.geneval import _options
    options = _options(options)          # before the folder is read
    items = [(row, p) for _, row, paths in scan_folder(folder, rows, n) for p in paths]

    from bench.io import read_rgb
    remedy = ("delete it and generate the folder again (`varbench geneval generate` redoes the prompts whose "
              "images are missing)")
    load = lambda p: read_rgb(p, remedy, exif=True)  # noqa: E731
    return score_images(detector, (load(p) for _, p in items), [r for r, _ in items], [str(p) for _, p in items],
                        options, progress)


def _prompt_key(metadata: str) -> str:
    """A results row's metadata in one spelling (key order, spacing): the prompt it scores."""
    try:
        return json.dumps(json.loads(metadata), sort_keys=True)
    except ValueError:
        return metadata


def missing_of(results, rows: Sequence[dict], n: int = IMAGES_PER_PROMPT) -> Optional[str]:
    """What a folder's results frame lacks of the prompts ``rows`` (``n`` images each), in words, or None
    when it has them all: prompt i's images are those of ``<i:05d>/samples/`` whose metadata is
    ``rows[i]`` (by index, not by metadata: prompt sets may repeat a row). A folder is scored as it is,
    as the official evaluator does (whatever images are there); this says by how much it falls short
    and which tasks the overall score then leaves out."""
    from bench.metrics.geneval import TAGS
    keys, have = [json.dumps(r, sort_keys=True) for r in rows], [0] * len(rows)
    for name, meta in zip(results["filename"], results["metadata"]):
        d = Path(name).parent.parent.name           # <index>/samples/NNNN.png
        if d.isdigit() and int(d) < len(rows) and _prompt_key(meta) == keys[int(d)]:
            have[int(d)] += 1
    absent = [t for t in TAGS if t in {r["tag"] for r in rows} and t not in set(results["tag"])]
    short = sum(0 < k < n for k in have)
    lack_prompts, lack_images = sum(k == 0 for k in have), sum(max(n - k, 0) for k in have)
    if not lack_images and not absent:
        return None
    which = [f"{lack_prompts} of the {len(rows)} prompts with none" if lack_prompts else "",
             f"{short} prompt(s) with fewer than {n}" if short else ""]
    parts = [f"missing {lack_images} of the {n * len(rows)} images ({', '.join(w for w in which if w)})"]
    if absent:
        present = [t for t in TAGS if t in set(results["tag"])]
        parts.append(f"no image of the task(s) {', '.join(absent)}: the overall score geneval is the mean over the "
                     f"{len(present)} task(s) present only ({', '.join(present)})")
    return "; ".join(parts)


def metrics_of(results) -> Dict[str, dict]:
    """Record metrics of a results frame: ``geneval`` (overall) and ``geneval_<tag>`` with binomial
    standard errors (the overall's: of the mean of the task means), plus the image and prompt rates."""
    import numpy as np

    from bench.metrics.geneval import summary
    s = summary(results)
    out = {}
    sizes = results.groupby("tag", sort=False)["correct"].size()
    for tag, k in sizes.items():
        p = s[f"geneval_{tag}"]
        out[f"geneval_{tag}"] = {"value": p, "stderr": float(np.sqrt(p * (1 - p) / k)), "n": int(k),
                                 "higher_is_better": True, "error": "binomial standard error over images"}
    var = sum(out[f"geneval_{t}"]["stderr"] ** 2 for t in sizes.index) / len(sizes) ** 2
    out["geneval"] = {"value": s["geneval"], "stderr": float(np.sqrt(var)), "n": int(len(results)),
                      "higher_is_better": True, "error": "standard error of the mean of the task accuracies"}
    for k in ("geneval_images", "geneval_prompts"):
        out[k] = {"value": s[k], "n": int(len(results)), "higher_is_better": True}
    return out


# ---------------------------------------------------------------------------------------- benches
class _GenEvalBench(Bench):
    """Conditions are prompts: ``labels(n)`` is the prompt list, each prompt ``IMAGES_PER_PROMPT`` times
    (one sampling batch per prompt, seeded by its index)."""

    kind = "images"
    conditions = "prompts"
    batch_size = IMAGES_PER_PROMPT
    metrics = ("geneval", *(f"geneval_{t}" for t in ("single_object", "two_object", "counting", "colors", "position",
                                                      "color_attr")), "geneval_images", "geneval_prompts")

    def rows(self) -> List[dict]:
        raise NotImplementedError

    @classmethod
    def check_n(cls, n) -> int:
        full = cls.default_n             # every prompt (a test checks it against rows())
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0 or n % IMAGES_PER_PROMPT or n > full:
            raise ValueError(f"--n {n!r}: {cls.name} takes {IMAGES_PER_PROMPT} images per prompt, a positive multiple "
                             f"of {IMAGES_PER_PROMPT} up to {full} (all {full // IMAGES_PER_PROMPT} prompts, the default)")
        return n

    def coverage_note(self, n: int) -> Optional[str]:
        """The prompts run in the metadata's order, task by task (GenEval's file and shapes-geneval alike),
        so a smaller ``n`` leaves the last tasks out and ``geneval`` is the mean over the tasks it reached."""
        rows = self.rows()
        tags = list(dict.fromkeys(r["tag"] for r in rows))
        present = list(dict.fromkeys(r["tag"] for r in rows[:self.check_n(n) // IMAGES_PER_PROMPT]))
        if len(present) == len(tags):
            return None
        return (f"{self.name} at n = {n}: its first {n // IMAGES_PER_PROMPT} prompt(s) (in the metadata's order, task by "
                f"task) cover {len(present)} of the {len(tags)} tasks ({', '.join(present)}); geneval is the mean over "
                f"those, not the overall score of all {len(tags)} (n = {self.default_n})")

    def labels(self, n: int) -> List[str]:   # type: ignore[override]
        self.check_n(n)
        return [r["prompt"] for r in self.rows()[:n // IMAGES_PER_PROMPT] for _ in range(IMAGES_PER_PROMPT)]

    def detector(self):
        raise NotImplementedError

    def evaluate(self, images_uint8, labels, seed=0, progress=True) -> Dict[str, dict]:
        n = len(images_uint8)
        rows = [r for r in self.rows()[:n // IMAGES_PER_PROMPT] for _ in range(IMAGES_PER_PROMPT)]
        if [r["prompt"] for r in rows] != list(labels):
            raise ValueError(f"{self.name}: the images' prompts are not this bench's prompts in order")
        names = [f"{i // IMAGES_PER_PROMPT:05d}/samples/{i % IMAGES_PER_PROMPT:04d}.png" for i in range(n)]
        imgs = (x.permute(1, 2, 0).numpy() for x in images_uint8)
        return metrics_of(score_images(self.detector(), imgs, rows, names, progress=progress))


@BENCHES.register("shapes-geneval")
class ShapesGenEval(_GenEvalBench):
    name, world, model = "shapes-geneval", "tiny", "tiny-t2i"
    default_n = IMAGES_PER_PROMPT * 6 * SHAPES_PER_TAG
    version = 1

    def rows(self) -> List[dict]:
        return shapes_metadata()

    def detector(self):
        from bench.metrics.geneval_detectors import ShapesDetector
        return ShapesDetector()


@BENCHES.register("geneval")
class GenEval(_GenEvalBench):
    name, world, model = "geneval", "paper", "infinity-2b"
    default_n = IMAGES_PER_PROMPT * 553
    version = 1

    def __init__(self, model_path=None, clip_weights=None):
        import os
        self.model_path = model_path or os.environ.get("VARBENCH_GENEVAL_DETECTOR")
        self.clip_weights = clip_weights or os.environ.get("VARBENCH_CLIP_WEIGHTS")

    def rows(self) -> List[dict]:
        return official_metadata()

    def preflight(self) -> None:
        missing = [v for v, x in (("VARBENCH_GENEVAL_DETECTOR", self.model_path),
                                  ("VARBENCH_CLIP_WEIGHTS", self.clip_weights)) if not x]
        if missing:
            raise FileNotFoundError(
                f"geneval needs its detector and CLIP weights: set {' and '.join(missing)} (the folder holding "
                f"mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco.pth; OpenAI's ViT-L-14 weights file). Or generate "
                f"the folder with `varbench geneval generate`, score it with the official evaluator and "
                f"`varbench geneval import results.jsonl`")

    def detector(self):
        from bench.metrics.geneval_detectors import Mask2FormerDetector
        from bench.resources import resource_dir
        self.preflight()
        names = (resource_dir("datasets") / "geneval" / "object_names.txt").read_text(encoding="utf-8").split("\n")
        return Mask2FormerDetector(self.model_path, self.clip_weights, [c.strip() for c in names if c.strip()])
