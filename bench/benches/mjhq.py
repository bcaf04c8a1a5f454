"""MJHQ-30K: FID per prompt category and overall, and CLIP score, of one image per prompt.

``mjhq30k`` (paper world): MJHQ-30K's ``meta_data.json`` (10 categories × 3,000 prompts, the captions
of the dataset's Midjourney images); n/10 prompts of every category (file order within a category;
the default n is all 30,000), one image per prompt, prompt i sampled alone with seed
``seed·1000003 + i`` (FastVAR's scripts sample one prompt at a time, but seed them otherwise: its HART
script gives every prompt the same ``g_seed``, its Infinity script draws one random seed per run, which
cannot be repeated; a per-prompt seed from the run seed is varbench's choice). Scores as FastVAR's
``mjhq30k_fid_clip.py``: clean-fid mode ``clean`` features (``bench.metrics.mjhq``) of the generated
images against the category's 3,000 reference images (``<MJHQ>/<category>/<id>.jpg``, all of them
whatever n is), per category (``fid_<category>``), over all images (``fid``, clean-fid's recursive
two-folder call on the roots) and their mean over categories (``fid_mean``); ``clip_score``: 100 ·
the mean CLIP ViT-L/14 cosine of each image with its prompt (``bench.metrics.clip_score``). Files:
``VARBENCH_MJHQ_DIR`` (meta_data.json + the unzipped images), ``VARBENCH_CLEANFID_INCEPTION``
(clean-fid's ``inception-2015-12-05.pt``; default /tmp, clean-fid's own place) and
``VARBENCH_CLIP_WEIGHTS``; nothing is downloaded.

``shapes-mjhq`` (tiny world): the same protocol over shapes-scenes. Its six prompt categories are the
scene grammar's six task types (single_object, two_object, counting, colors, position, color_attr); its
"dataset" is the first 3,000 scenes of the scene generator's ``ref`` split (500 per category: scene i
has task i mod 6), each with the prompt it was drawn from, so a category's prompts are the captions
of its reference images exactly as in MJHQ. Scores: FID in the ``tinyshapes-cnn`` feature space
(the tiny world's Inception; it takes the 64×64 scenes as they are) per category, overall and their
mean. No CLIP score: the tiny world has no image–text model.

Folders (``generate_folder`` / ``score_folder``, ``varbench mjhq generate|score``): FastVAR's layout,
``<out>/<category>/<id>.png`` (``.jpg`` read too), one image per prompt with the runner's seed of its
index; generation skips images already there (a stopped run resumes); scoring reads the chosen
prompts' images (a missing one is an error naming it), so a folder made by FastVAR's own scripts
with the same ids can be scored by this bench's protocol.

With the ``fidelity`` setting (``bench.originals``) both add FID* per category, overall and their mean
(``fid_star_<category>``, ``fid_star``, ``fid_star_mean``; LazyVAR defines FID* in words only and gives
no code: varbench reads its table's "FID*" as the overall one and its per-category average as the
mean), PSNR and SSIM.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Tuple

from bench.benches.base import Bench
from bench.benches.shapes_c2i import TinyFeatureBench
from bench.metrics.mjhq import MJHQ_CATEGORIES, MJHQ_PER_CATEGORY, SHAPES_CATEGORIES
from bench.registry import BENCHES

SHAPES_PER_CATEGORY = 500
SHAPES_SPLIT = "ref"


class _MJHQBench(Bench):
    """Conditions are prompts, category-major: the first n/K prompts of each of the K categories."""

    kind = "images"
    conditions = "prompts"
    batch_size = 1                     # one prompt per batch: each prompt's seed is its own
    categories: Tuple[str, ...] = ()
    _table = None                      # the prompt table, read on first use

    @classmethod
    def check_n(cls, n) -> int:
        K, full = len(cls.categories), cls.default_n
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0 or n % K or n > full:
            raise ValueError(f"--n {n!r}: {cls.name} takes one image per prompt, the same number from each of its "
                             f"{K} categories: a positive multiple of {K} up to {full} (the default)")
        return n

    def prompt_table(self):
        """DataFrame [id, category, prompt] of every prompt, file (or generator) order."""
        raise NotImplementedError

    def chosen(self, n: int):
        """The first n/K prompts of each category (the prompt table is read once per bench)."""
        from bench.metrics.mjhq import select
        if self._table is None:
            self._table = self.prompt_table()
        return select(self._table, self.check_n(n) // len(self.categories), self.categories)

    def labels(self, n: int) -> List[str]:   # type: ignore[override]
        return list(self.chosen(n)["prompt"])

    def label_categories(self, n: int) -> List[str]:
        """The category of each of the n images (category-major, n/K each)."""
        return [c for c in self.categories for _ in range(n // len(self.categories))]

    def reference(self) -> Tuple[object, List[str]]:
        """(reference feature rows [M, D], their categories)."""
        raise NotImplementedError

    def score(self, feats, labels, seed=0, progress=True) -> Dict[str, dict]:
        from bench.metrics.mjhq import category_fids
        n = len(labels)
        if list(labels) != self.labels(n):
            raise ValueError(f"{self.name}: the images' prompts are not this bench's prompts in order")
        ref, ref_cats = self.reference()
        return category_fids(feats["features"], self.label_categories(n), ref, ref_cats, self.categories)

    def fidelity_metrics(self, feats, original, labels) -> Dict[str, dict]:
        from bench.metrics.mjhq import category_fids
        cats = self.label_categories(len(labels))
        return category_fids(feats["features"], cats, original["features"], cats, self.categories, prefix="fid_star")


# ---------------------------------------------------------------------------------------- folders
def image_path(folder, category: str, image_id: str) -> Path:
    return Path(folder) / category / f"{image_id}.png"


def _existing(folder, category: str, image_id: str):
    for ext in ("png", "jpg"):
        p = Path(folder) / category / f"{image_id}.{ext}"
        if p.is_file():
            return p
    return None


def generate_folder(gen, bench: "_MJHQBench", folder, n: int, seed: int, sampling: dict, progress: bool = True) -> int:
    """Sample the bench's first n prompts (category-major) into ``folder``, one image per prompt with the
    runner's seed of its index, skipping images already there. Returns the number sampled now."""
    from tqdm.auto import tqdm

    from bench.io import save_png
    chosen = bench.chosen(n)
    todo = [i for i, r in enumerate(chosen.itertuples()) if _existing(folder, r.category, r.id) is None]
    for i in tqdm(todo, desc="mjhq samples", disable=not progress):
        r = chosen.iloc[i]
        img = gen.generate([r["prompt"]], seed=bench.batch_seed(seed, i), **sampling)[0]
        save_png(image_path(folder, r["category"], r["id"]), img)
    return len(todo)


def score_folder(bench: "_MJHQBench", folder, n: int, stream, progress: bool = True) -> Dict[str, dict]:
    """The bench's metrics of a folder's images of its first n prompts, featurised chunk by chunk as a
    run's are: ``stream`` is the runner's sample-and-featurise loop (``bench.runner.sample_features``,
    passed in as ``bench.originals`` gets it: a bench may not import the runner), here with every batch
    read from the folder."""
    import torch

    from bench.io import read_image
    if not Path(folder).exists():
        raise FileNotFoundError(f"MJHQ image folder {folder} not found (`varbench mjhq generate {folder}` writes it)")
    if not Path(folder).is_dir():
        raise FileNotFoundError(f"{folder} is not a folder")
    chosen = bench.chosen(n)
    paths = [_existing(folder, r.category, r.id) for r in chosen.itertuples()]
    missing = [str(image_path(folder, r.category, r.id)) for r, p in zip(chosen.itertuples(), paths) if p is None]
    if missing:
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise FileNotFoundError(f"{folder}: missing {', '.join(missing[:3])}{more}; generate them "
                                f"(`varbench mjhq generate` resumes where it stopped)")
    prompts = list(chosen["prompt"])
    remedy = (f"delete it and generate it again (`varbench mjhq generate {folder} --bench {bench.name} --n {n}` "
              f"redoes the missing images)")
    read = lambda lo, hi: torch.stack([read_image(p, remedy) for p in paths[lo:hi]])   # noqa: E731
    feats, _, _ = stream(None, bench, prompts, 0, {}, cached=read, progress=progress, desc="mjhq features")
    return bench.score(feats, prompts, progress=progress)


@lru_cache(maxsize=2)
def _shapes_reference(weights: str):
    from bench.data import scenes
    from bench.metrics.fidelity import extract_features
    imgs = scenes.generate(len(SHAPES_CATEGORIES) * SHAPES_PER_CATEGORY, SHAPES_SPLIT)[0]
    cats = [SHAPES_CATEGORIES[i % len(SHAPES_CATEGORIES)] for i in range(len(imgs))]
    return extract_features(imgs, weights_path=weights, batch_size=64)["features"], cats


@BENCHES.register("shapes-mjhq")
class ShapesMJHQ(_MJHQBench, TinyFeatureBench):
    name, world, model = "shapes-mjhq", "tiny", "tiny-t2i"
    categories = SHAPES_CATEGORIES
    default_n = len(SHAPES_CATEGORIES) * SHAPES_PER_CATEGORY
    version = 1
    metrics = ("fid", *(f"fid_{c}" for c in SHAPES_CATEGORIES), "fid_mean")
    # torch-fidelity's extractor runs in batches of 64: chunks of 256 give every image its batch
    feature_chunk = 256

    def prompt_table(self):
        import pandas as pd

        from bench.data import scenes
        n = self.default_n
        prompts = [scenes.scene(SHAPES_SPLIT, i)[0].prompt for i in range(n)]
        return pd.DataFrame({"id": [f"{SHAPES_SPLIT}-{i:05d}" for i in range(n)],
                             "category": [self.categories[i % len(self.categories)] for i in range(n)],
                             "prompt": prompts})

    def features(self, images_uint8, progress=False):
        from bench.metrics.fidelity import extract_features
        return {"features": extract_features(images_uint8, weights_path=self.feature_weights, batch_size=64,
                                             progress=progress)["features"]}

    def reference(self):
        return _shapes_reference(self.feature_weights)


@lru_cache(maxsize=2)
def _mjhq_reference(root: str, inception: str, device: str, batch: int):
    """clean-fid features of every MJHQ-30K image (category by category, file order), read 256 at a time."""
    import numpy as np
    from tqdm.auto import tqdm

    from bench.io import read_image
    from bench.metrics.mjhq import cleanfid_features, load_cleanfid_inception, read_meta
    meta = read_meta(Path(root) / "meta_data.json")
    model = load_cleanfid_inception(inception, device)
    paths, cats = [], []
    for c in MJHQ_CATEGORIES:
        for i in meta.loc[meta["category"] == c, "id"]:
            paths.append(Path(root) / c / f"{i}.jpg")
            cats.append(c)
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"MJHQ-30K images missing under {root}: {', '.join(missing[:3])}"
                                f"{f' (and {len(missing) - 3} more)' if len(missing) > 3 else ''}; unzip "
                                f"mjhq30k_imgs.zip there (<category>/<id>.jpg)")
    out = []
    for s in tqdm(range(0, len(paths), 256), desc="MJHQ-30K reference features"):
        out.append(cleanfid_features([read_image(p) for p in paths[s:s + 256]], model, batch, device))
    return np.concatenate(out), cats


@BENCHES.register("mjhq30k")
class MJHQ30K(_MJHQBench):
    name, world, model = "mjhq30k", "paper", "infinity-2b"
    categories = MJHQ_CATEGORIES
    default_n = len(MJHQ_CATEGORIES) * MJHQ_PER_CATEGORY
    version = 1
    metrics = ("fid", *(f"fid_{c}" for c in MJHQ_CATEGORIES), "fid_mean", "clip_score")
    batch = 32                       # Inception and CLIP batches; chunks of 256 keep them aligned
    feature_chunk = 256

    def __init__(self, mjhq_dir=None, inception=None, clip_weights=None, device=None, fidelity: bool = False):
        import os
        super().__init__(fidelity)
        self.mjhq_dir = mjhq_dir or os.environ.get("VARBENCH_MJHQ_DIR")
        self.inception = inception or os.environ.get("VARBENCH_CLEANFID_INCEPTION")
        self.clip_weights = clip_weights or os.environ.get("VARBENCH_CLIP_WEIGHTS")
        self.device = device
        self._nets = None

    def preflight(self) -> None:
        from bench.metrics.mjhq import INCEPTION_FILE
        if not self.mjhq_dir:
            raise FileNotFoundError("mjhq30k needs MJHQ-30K: set VARBENCH_MJHQ_DIR to the folder holding meta_data.json "
                                    "and the unzipped mjhq30k_imgs.zip (<category>/<id>.jpg), from playgroundai/MJHQ-30K")
        if not (Path(self.mjhq_dir) / "meta_data.json").is_file():
            raise FileNotFoundError(f"{Path(self.mjhq_dir) / 'meta_data.json'} not found (VARBENCH_MJHQ_DIR): put "
                                    f"MJHQ-30K's meta_data.json and its unzipped images there")
        inc = Path(self.inception) if self.inception else Path("/tmp") / INCEPTION_FILE
        if not (inc / INCEPTION_FILE if inc.is_dir() else inc).is_file():
            raise FileNotFoundError(f"clean-fid's Inception {inc} not found: set VARBENCH_CLEANFID_INCEPTION to "
                                    f"{INCEPTION_FILE} (or put it in /tmp, where clean-fid looks)")
        if not self.clip_weights or not Path(self.clip_weights).is_file():
            raise FileNotFoundError(f"CLIP weights {self.clip_weights} not found: set VARBENCH_CLIP_WEIGHTS to OpenAI's "
                                    f"ViT-L-14 weights (ViT-L-14.pt, or open_clip_pytorch_model.bin of "
                                    f"timm/vit_large_patch14_clip_224.openai)")

    def _device(self) -> str:
        import torch
        return self.device or ("cuda" if torch.cuda.is_available() else "cpu")

    def nets(self):
        """(clean-fid Inception, CLIP scorer), built once per bench."""
        if self._nets is None:
            from bench.metrics.clip_score import ClipScorer
            from bench.metrics.mjhq import load_cleanfid_inception
            self.preflight()
            dev = self._device()
            self._nets = (load_cleanfid_inception(self.inception, dev),
                          ClipScorer.from_weights(self.clip_weights, dev, batch_size=self.batch))
        return self._nets

    def prompt_table(self):
        from bench.metrics.mjhq import read_meta
        self.preflight()
        return read_meta(Path(self.mjhq_dir) / "meta_data.json")

    def features(self, images_uint8, progress=False):
        import torch

        from bench.metrics.mjhq import cleanfid_features
        inception, clip = self.nets()
        return {"features": torch.from_numpy(cleanfid_features(images_uint8, inception, self.batch, self._device())),
                "clip_image": clip.image_embeddings(images_uint8)}

    def reference(self):
        return _mjhq_reference(str(self.mjhq_dir), str(self.inception or ""), self._device(), self.batch)

    def score(self, feats, labels, seed=0, progress=True) -> Dict[str, dict]:
        from bench.metrics.clip_score import clip_score_metric, cosines
        out = super().score(feats, labels, seed, progress)
        out["clip_score"] = clip_score_metric(cosines(feats["clip_image"], self.nets()[1].text_embeddings(labels)))
        return out
