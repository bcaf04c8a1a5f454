"""MJHQ-30K's prompts and categories, FID per category, and clean-fid's features of in-memory images.

MJHQ-30K (playgroundai/MJHQ-30K) is 30,000 Midjourney images in 10 categories of 3,000, each with the
prompt it was made from. ``meta_data.json`` maps an image id to ``{"category", "prompt"}``; the
unzipped ``mjhq30k_imgs.zip`` holds ``<category>/<id>.jpg``. :func:`read_meta` reads it into a frame in
file order; :func:`select` takes the first k prompts of every category.

FID as FastVAR scores MJHQ (``mjhq30k_fid_clip.py``): clean-fid's ``compute_fid(ref/<category>,
gen/<category>)``, i.e. mode ``clean`` (PIL bicubic resize to 299 on float images, NVIDIA's TorchScript
Inception), the two folders' features fitted by Gaussians. :func:`cleanfid_features` computes exactly
clean-fid's features of images held in memory (its own resizer and batch function, test-checked
against ``cleanfid.fid.get_folder_features`` on the same images as PNG files), and
:func:`category_fids` computes, from one feature matrix per side, the FID of every category and the
overall FID (all images: clean-fid's recursive glob over both roots), with clean-fid's own
``frechet_distance``. Importing this module needs neither torch nor clean-fid: it is a leaf (the
categories) any layer may read.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Optional, Sequence

from bench.tiny.configs import SCENE_TASKS

MJHQ_CATEGORIES = ("animals", "art", "fashion", "food", "indoor", "landscape", "logo", "people", "plants", "vehicles")
MJHQ_PER_CATEGORY = 3000
SHAPES_CATEGORIES = SCENE_TASKS       # shapes-mjhq's categories: the shapes-scenes grammar's task types
INCEPTION_FILE = "inception-2015-12-05.pt"      # clean-fid's TorchScript Inception (mode "clean")


def read_meta(path, categories: Sequence[str] = MJHQ_CATEGORIES):
    """``meta_data.json`` → DataFrame [id, category, prompt] in file order (clear errors on a bad file)."""
    import pandas as pd
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: MJHQ-30K's meta_data.json (playgroundai/MJHQ-30K on the HF hub) "
                                f"goes next to the unzipped mjhq30k_imgs.zip (<category>/<id>.jpg)")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(meta, dict) or not meta:
        raise ValueError(f"{path}: expected an object {{image id: {{category, prompt}}}}, got {type(meta).__name__}")
    rows = []
    for k, v in meta.items():
        if not isinstance(v, dict) or not isinstance(v.get("category"), str) or not isinstance(v.get("prompt"), str):
            raise ValueError(f"{path}: entry {k!r} is not {{\"category\": str, \"prompt\": str}}: {v!r}")
        if v["category"] not in categories:
            raise ValueError(f"{path}: entry {k!r} has category {v['category']!r}, not one of {', '.join(categories)}")
        rows.append((k, v["category"], v["prompt"]))
    return pd.DataFrame(rows, columns=["id", "category", "prompt"])


def select(meta, per_category: int, categories: Sequence[str]):
    """The first ``per_category`` rows of every category (file order within it), category by category."""
    import pandas as pd
    parts = []
    for c in categories:
        rows = meta[meta["category"] == c]
        if len(rows) < per_category:
            raise ValueError(f"category {c} has {len(rows)} prompts, fewer than the {per_category} asked for")
        parts.append(rows.iloc[:per_category])
    return pd.concat(parts, ignore_index=True)


def category_fids(gen_feats, gen_cats: Sequence[str], ref_feats, ref_cats: Sequence[str],
                  categories: Sequence[str], prefix: str = "fid") -> Dict[str, dict]:
    """``{prefix}`` (all images), ``{prefix}_<category>`` and ``{prefix}_mean`` (the mean over categories)
    as record entries. Features [N, D] (torch or numpy) with one category name per row."""
    import numpy as np
    from cleanfid.fid import fid_from_feats
    g, r = np.asarray(gen_feats), np.asarray(ref_feats)     # their own dtype, as clean-fid gets them
    gc, rc = np.asarray(list(gen_cats)), np.asarray(list(ref_cats))
    if len(gc) != len(g) or len(rc) != len(r):
        raise ValueError(f"category_fids: {len(g)}/{len(r)} feature rows but {len(gc)}/{len(rc)} categories")

    def entry(v, n):
        return {"value": float(v), "n": int(n), "higher_is_better": False}

    out = {prefix: entry(fid_from_feats(g, r), len(g))}
    per = {}
    for c in categories:
        gi, ri = gc == c, rc == c
        if gi.sum() < 2 or ri.sum() < 2:
            raise ValueError(f"category {c}: FID needs at least 2 images on each side, got {gi.sum()} and {ri.sum()}")
        per[c] = fid_from_feats(g[gi], r[ri])
        out[f"{prefix}_{c}"] = entry(per[c], gi.sum())
    out[f"{prefix}_mean"] = entry(np.mean(list(per.values())), len(g))
    return out


# ---------------------------------------------------------------------------------------- clean-fid features
def load_cleanfid_inception(path: Optional[str] = None, device: str = "cpu"):
    """clean-fid's TorchScript Inception (``{INCEPTION_FILE}``) from a local file, as the callable clean-fid
    calls in mode ``clean``: float [B, 3, 299, 299] in [0, 255] → pool3 features [B, 2048]."""
    from cleanfid.inception_torchscript import InceptionV3W
    p = Path(path) if path else Path("/tmp") / INCEPTION_FILE
    if p.is_dir():
        p = p / INCEPTION_FILE
    if not p.is_file() or p.name != INCEPTION_FILE:
        raise FileNotFoundError(
            f"clean-fid's Inception {p} not found: download {INCEPTION_FILE} (nvlabs-fi-cdn.nvidia.com/stylegan2-ada-"
            f"pytorch/pretrained/metrics/{INCEPTION_FILE}) and give its path (VARBENCH_CLEANFID_INCEPTION), or put it "
            f"in /tmp where clean-fid looks; varbench never downloads at run time")
    return InceptionV3W(str(p.parent), download=False).to(device).eval()


def cleanfid_features(images_uint8, model, batch_size: int = 32, device: str = "cpu", mode: str = "clean"):
    """clean-fid's features (numpy [N, D]) of uint8 images [N, 3, H, W] (or a list of [3, H, W] of any sizes): its resizer per image (mode
    ``clean``: PIL bicubic on float32 channels to 299×299, no re-quantisation), ``ToTensor`` of the float
    image, its batch function. ``model`` is any callable clean-fid accepts (``custom_feat_extractor``)."""
    import numpy as np
    import torch
    from cleanfid.fid import get_batch_features
    from cleanfid.resize import build_resizer
    resize = build_resizer(mode)
    out = []
    for s in range(0, len(images_uint8), batch_size):
        batch = []
        for im in images_uint8[s:s + batch_size]:
            r = resize(np.ascontiguousarray(im.permute(1, 2, 0).cpu().numpy()))
            # clean-fid's ResizeDataset: ToTensor of the float32 image (no scaling; a uint8 one is scaled
            # by 1/255 and back by 255): the resized values as they are, CHW
            batch.append(torch.from_numpy(np.ascontiguousarray(r.transpose(2, 0, 1))).float())
        out.append(get_batch_features(torch.stack(batch), model, device))
    return np.concatenate(out) if out else np.zeros((0, 0), dtype=np.float32)
