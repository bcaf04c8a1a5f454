"""The unmodified model's outputs, cached once per (model, bench, seed) for the fidelity metrics.

A run whose bench setting has ``fidelity`` on (``varbench run ... --fidelity``; a table's
``bench_args: {fidelity: true}``) is compared with the *original* model — the same model, checkpoint,
bench, n, seed and sampling settings with no method — on the same conditions and seeds (image i of
both runs: the same prompt or class, the same batch seed): FID* (the bench's FID between the two
image sets' features, ScaleKV/DistriFusion's "FID w/ Orig."), and per pair PSNR and SSIM
(``bench.metrics.pairs``). The features are the bench's own: on mjhq30k clean-fid's, as ScaleKV and
DistriFusion compute it (a two-folder clean-fid FID); on imagenet256 the torch-fidelity Inception
features of its FID (TF1 bilinear resize inside the network, not clean-fid's PIL bicubic: a
difference varbench has not measured); in the tiny world the tiny feature network's.

The original's images are sampled once and kept as lossless PNGs (pairs are exact) with the bench's
feature rows of them, in ``<results>/<world>/<model>/<bench>/_originals/<key>/`` (``key``: the run key
of the original's spec; folders starting with ``_`` are not records). Every method run with the same
original reuses them. Sampling resumes batch by batch: a batch whose images are all on disk is read,
not sampled again. The folder is complete when ``done.json`` is written (after ``features.pt``).

A run of the original itself with ``fidelity`` on samples its images again and compares them with
the cache: FID* 0 and PSNR at its cap show that sampling is deterministic on this machine.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable, Dict, Optional

import torch

from bench.io import read_image, save_png
from bench.records import RunSpec

DONE = "done.json"
FEATURES = "features.pt"


def original_spec(spec: RunSpec) -> RunSpec:
    """The spec of the unmodified model on the same bench, n, seed and sampling (fidelity off)."""
    protocol = {k: v for k, v in (spec.protocol or {}).items() if k != "fidelity"}
    req = dict(spec.requested or {})
    req["methods"] = []
    return dataclasses.replace(spec, methods=(), method_versions={}, protocol=protocol, requested=req)


def folder(spec: RunSpec, root=None) -> Path:
    orig = original_spec(spec)
    return orig.path(root).parent / "_originals" / orig.key()


def image_path(d: Path, i: int) -> Path:
    return d / "images" / f"{i:06d}.png"


class CacheError(ValueError):
    """A cached file of the unmodified model that cannot be read; the message says to remake the cache."""


def _unreadable(d: Path, path: Path, e: Exception) -> CacheError:
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    return CacheError(f"{path}: the unmodified model's cached output is unreadable ({reason}); delete {d} and run "
                      f"again: it is remade from the same seeds")


def load_images(d: Path, lo: int, hi: int) -> torch.Tensor:
    """uint8 [hi − lo, 3, H, W] of cached images lo … hi − 1 (an unreadable one: a ``ValueError`` naming it)."""
    remedy = f"the unmodified model's cached output; delete {d} and run again: it is remade from the same seeds"
    return torch.stack([read_image(image_path(d, i), remedy) for i in range(lo, hi)])


def complete(d: Path, orig: RunSpec) -> bool:
    p = d / DONE
    if not p.is_file():
        return False
    try:
        return json.loads(p.read_text(encoding="utf-8")).get("run_id") == orig.key()
    except (OSError, ValueError, AttributeError):
        return False


def ensure(spec: RunSpec, bench, labels, make_generator: Callable[[], object], stream, root=None,
           progress: bool = True) -> Dict[str, torch.Tensor]:
    """The original's feature rows (sampling and caching its images first where they are missing).
    ``stream`` is the runner's sample-and-featurize loop (``bench.runner.sample_features``): this module
    hands it the batches already on disk (``cached``) and writes every batch it samples (``on_batch``)."""
    from bench.io import atomic_write_text
    orig = original_spec(spec)
    d = folder(spec, root)
    if complete(d, orig):
        try:
            return torch.load(d / FEATURES, weights_only=True)
        except Exception as e:   # truncated or overwritten: torch's zip/pickle errors
            raise _unreadable(d, d / FEATURES, e) from None
    (d / "images").mkdir(parents=True, exist_ok=True)
    atomic_write_text(d / "spec.json", json.dumps(orig.to_dict(), indent=1, sort_keys=True))

    def cached(lo: int, hi: int) -> Optional[torch.Tensor]:
        return load_images(d, lo, hi) if all(image_path(d, i).is_file() for i in range(lo, hi)) else None

    def write(lo: int, images: torch.Tensor) -> None:
        for k, img in enumerate(images):
            if not image_path(d, lo + k).is_file():
                save_png(image_path(d, lo + k), img)

    gen = None
    if any(not image_path(d, i).is_file() for i in range(len(labels))):
        gen = make_generator()
    feats = stream(gen, bench, labels, orig.seed, orig.sampling, cached=cached, on_batch=write, progress=progress,
                   desc=f"original {orig.label()}")[0]
    tmp = d / f".{FEATURES}.tmp"
    torch.save(feats, tmp)
    tmp.replace(d / FEATURES)
    atomic_write_text(d / DONE, json.dumps({"run_id": orig.key(), "n": len(labels)}))
    return feats


def pair_rows(d: Path, lo: int, images: torch.Tensor, lpips_weights=None) -> Dict[str, torch.Tensor]:
    """Per-pair PSNR and SSIM (and LPIPS, given AlexNet's weights) of images lo … lo + k − 1 against the
    cached originals."""
    from bench.metrics.pairs import lpips, psnr, ssim
    orig = load_images(d, lo, lo + len(images))
    rows = {"psnr": psnr(images, orig), "ssim": ssim(images, orig)}
    if lpips_weights:
        rows["lpips"] = lpips(images, orig, lpips_weights)
    return rows


def pair_metrics(rows: Dict[str, torch.Tensor]) -> Dict[str, dict]:
    """Record entries of the pair rows: mean over pairs, its standard error."""
    out = {}
    for k, better in (("psnr", True), ("ssim", True), ("lpips", False)):
        if k not in rows:
            continue
        v = rows[k].double()
        out[k] = {"value": float(v.mean()), "stderr": float(v.std() / len(v) ** 0.5) if len(v) > 1 else 0.0,
                  "n": int(len(v)), "higher_is_better": better,
                  "error": "standard error of the mean over image pairs"}
    return out
