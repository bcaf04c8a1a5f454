"""Paper-world fidelity: InceptionV3 features and the ADM ImageNet 256×256 reference batch.

The VAR-family papers report ImageNet-256 FID/IS/precision/recall with OpenAI's ADM evaluator
(guided-diffusion ``evaluations/evaluator.py``): the TF-2015 Inception graph, pool3 features, FID
against the reference batch's precomputed ``mu``/``sigma``, precision/recall (k=3) against its 10 000
images ``arr_0``, IS on consecutive chunks of 5000 of the sample file. We reproduce it with
torch-fidelity's ``inception-v3-compat`` (the same TF-2015 weights and a TF1-compatible bilinear
resize) on in-memory tensors:

- :func:`resolve_inception_weights` finds ``weights-inception-2015-12-05-6726825d.pth`` locally
  (argument, ``$VARBENCH_INCEPTION_WEIGHTS``, ``$VARBENCH_CKPT_DIR``, the torch-hub cache) and
  raises a clear error otherwise. torch-fidelity downloads only when it is given *no* path, and we
  always give it one, so nothing is ever downloaded.
- :func:`read_adm_reference` reads ``VIRTUAL_imagenet256_labeled.npz`` (``arr_0``, ``mu``,
  ``sigma``; ``mu_s``/``sigma_s`` when present).
- :func:`evaluate_adm` runs :func:`bench.metrics.fidelity.evaluate` with that protocol.

IS and sample order. ADM splits the sample file in its own order, and VAR's
``create_npz_from_sample_folder`` packs the PNGs in ``glob`` order (the file system's listing, not
sorted): the classes are mixed in every chunk. varbench's samples are class-major (50 of class 0, then
class 1, …), so consecutive chunks of them would hold 100 classes each and IS could not exceed about
100 (VAR-d16 reports 274.4). The chunks are therefore taken after a fixed permutation of the samples
(torch-fidelity's ``isc_shuffle``, seeded by the run seed): class-mixed chunks as in the official file,
reproducible. ``n`` not a multiple of 5000: ``n // 5000`` equal chunks (ADM: chunks of 5000 and a
last, shorter one); the protocol's 50 000 gives 10 chunks either way.

Precision/recall: squared distances in float32 (ADM computes them in float16 first and falls back to
float32 only on overflow): only a point within rounding of a neighbourhood radius can be counted
differently. sFID (ADM's spatial features) is not computed.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Iterable, Optional

import numpy as np
import torch

from bench.metrics.fidelity import DEFAULT_METRICS, evaluate, extract_features

INCEPTION_EXTRACTOR = "inception-v3-compat"
INCEPTION_WEIGHTS_FILENAME = "weights-inception-2015-12-05-6726825d.pth"
INCEPTION_WEIGHTS_URL = ("https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/"
                         + INCEPTION_WEIGHTS_FILENAME)
ADM_REFERENCE_FILENAME = "VIRTUAL_imagenet256_labeled.npz"
ADM_REFERENCE_URL = ("https://openaipublic.blob.core.windows.net/diffusion/jul-2021/ref_batches/imagenet/256/"
                     + ADM_REFERENCE_FILENAME)
ADM_IS_SPLIT_SIZE = 5000


class PaperAssetNotFound(FileNotFoundError):
    """A paper-world weights or reference file is missing; the message says where to get and put it."""


def _torch_hub_checkpoints() -> Path:
    return Path(torch.hub.get_dir()) / "checkpoints"


def resolve_inception_weights(path: Optional[str | os.PathLike] = None) -> Path:
    """Local path of torch-fidelity's Inception weights; never downloads.

    Looked up in order: ``path`` (a file, or a folder holding the file), ``$VARBENCH_INCEPTION_WEIGHTS``
    (same), ``$VARBENCH_CKPT_DIR/<file>``, ``<torch hub dir>/checkpoints/<file>`` (where
    torch-fidelity itself would have cached it). An explicit ``path`` or env var that does not lead
    to the file is an error even if a later location has it.
    """
    def in_place(p: Path) -> Path:
        return p / INCEPTION_WEIGHTS_FILENAME if p.is_dir() else p

    explicit = path if path is not None else os.environ.get("VARBENCH_INCEPTION_WEIGHTS") or None
    if explicit is not None:
        candidates = [in_place(Path(explicit).expanduser())]
    else:
        candidates = [_torch_hub_checkpoints() / INCEPTION_WEIGHTS_FILENAME]
        if os.environ.get("VARBENCH_CKPT_DIR"):
            candidates.insert(0, Path(os.environ["VARBENCH_CKPT_DIR"]).expanduser() / INCEPTION_WEIGHTS_FILENAME)
    for c in candidates:
        if c.is_file():
            return c
    raise PaperAssetNotFound(
        f"Inception weights {INCEPTION_WEIGHTS_FILENAME} not found (looked at: {', '.join(map(str, candidates))}).\n"
        f"  Get it from {INCEPTION_WEIGHTS_URL}\n"
        f"  and put it in {_torch_hub_checkpoints()} or $VARBENCH_CKPT_DIR, or point "
        f"VARBENCH_INCEPTION_WEIGHTS (or weights_path=) at the file. varbench never downloads at run time.")


def extract_inception_features(images_uint8: torch.Tensor, weights_path: Optional[str | os.PathLike] = None,
                               batch_size: int = 64, device=None, progress: bool = False) -> Dict[str, Any]:
    """Inception pool3 (``'2048'``) features and ``'logits_unbiased'`` of uint8 ``[N,3,H,W]`` images.

    Images of any size are resized inside the network to 299×299 with TF1-style bilinear
    interpolation, as the ADM evaluator's TF graph does.
    """
    return extract_features(images_uint8, INCEPTION_EXTRACTOR, resolve_inception_weights(weights_path),
                            batch_size=batch_size, device=device, feature_layer="2048",
                            logits_layer="logits_unbiased", progress=progress)


def resolve_adm_reference(npz_path: Optional[str | os.PathLike] = None) -> Path:
    """``npz_path`` (a file or a folder holding it), else ``$VARBENCH_DATA_DIR/VIRTUAL_imagenet256_labeled.npz``."""
    if npz_path is not None:
        p = Path(npz_path).expanduser()
        p = p / ADM_REFERENCE_FILENAME if p.is_dir() else p
    elif os.environ.get("VARBENCH_DATA_DIR"):
        p = Path(os.environ["VARBENCH_DATA_DIR"]).expanduser() / ADM_REFERENCE_FILENAME
    else:
        p = None
    if p is None or not p.is_file():
        where = f"not found at {p}" if p is not None else "not found (no path given and VARBENCH_DATA_DIR is not set)"
        raise PaperAssetNotFound(
            f"ADM reference batch {ADM_REFERENCE_FILENAME} {where}.\n"
            f"  Get it from {ADM_REFERENCE_URL}\n"
            f"  (the reference batches of openai/guided-diffusion `evaluations/`), put it in the folder that "
            f"VARBENCH_DATA_DIR points at, or pass its path. varbench never downloads at run time.")
    return p


def read_adm_reference(npz_path: Optional[str | os.PathLike] = None, load_images: bool = True) -> Dict[str, Any]:
    """Read an ADM reference batch.

    Returns ``{"images": uint8 Tensor[N,3,H,W] (a view of ``arr_0``, NHWC on disk) or None,
    "mu": float64[D], "sigma": float64[D,D], "mu_s", "sigma_s" (spatial stats, or None), "path"}``.
    ``load_images=False`` skips the 10 000 images when only FID statistics are needed.
    """
    path = resolve_adm_reference(npz_path)
    with np.load(path) as npz:
        keys = set(npz.files)
        missing = {"mu", "sigma"} - keys | ({"arr_0"} - keys if load_images else set())
        if missing:
            raise ValueError(f"{path} is not an ADM reference batch: missing key(s) {sorted(missing)} "
                             f"(found {sorted(keys)})")
        out: Dict[str, Any] = {"path": path, "images": None,
                               "mu": npz["mu"].astype(np.float64), "sigma": npz["sigma"].astype(np.float64),
                               "mu_s": npz["mu_s"].astype(np.float64) if "mu_s" in keys else None,
                               "sigma_s": npz["sigma_s"].astype(np.float64) if "sigma_s" in keys else None}
        if load_images:
            arr_NHWC = npz["arr_0"]
            if arr_NHWC.dtype != np.uint8 or arr_NHWC.ndim != 4 or arr_NHWC.shape[-1] != 3:
                raise ValueError(f"{path}: arr_0 should be uint8 [N,H,W,3], got {arr_NHWC.dtype} {arr_NHWC.shape}")
            out["images"] = torch.from_numpy(arr_NHWC).permute(0, 3, 1, 2)
    if out["mu"].ndim != 1 or out["sigma"].shape != (len(out["mu"]),) * 2:
        raise ValueError(f"{path}: mu {out['mu'].shape} and sigma {out['sigma'].shape} do not fit together")
    return out


def adm_reference_features(npz_path: Optional[str | os.PathLike] = None, weights_path=None, batch_size: int = 64,
                           device=None, progress: bool = False) -> Dict[str, Any]:
    """The reference as a feature set for :func:`evaluate`: Inception features of ``arr_0`` (for P/R
    and KID) plus the file's ``mu``/``sigma`` (for FID, as the ADM evaluator does)."""
    ref = read_adm_reference(npz_path)
    fs = extract_inception_features(ref["images"], weights_path, batch_size, device, progress)
    if fs["features"].shape[1] != len(ref["mu"]):
        raise ValueError(f"reference mu has {len(ref['mu'])} dims but Inception features have {fs['features'].shape[1]}")
    return {"features": fs["features"], "logits": None, "mu": ref["mu"], "sigma": ref["sigma"]}


def evaluate_adm(fake_uint8: torch.Tensor, reference=None, metrics: Iterable[str] = DEFAULT_METRICS,
                 bootstrap: int = 10, seed: int = 0, weights_path=None, batch_size: int = 64, device=None,
                 progress: bool = False) -> Dict[str, Dict[str, Any]]:
    """ImageNet-256 metrics in the ADM protocol.

    ``fake``: uint8 images, or their :func:`extract_inception_features` (computed elsewhere, e.g. by
    the ranks of a sharded run). ``reference``: the npz path (default ``$VARBENCH_DATA_DIR/VIRTUAL_imagenet256_labeled.npz``) or
    a feature set from :func:`adm_reference_features` (extract it once, reuse it across runs).
    IS uses chunks of 5000 generated samples after a fixed permutation (the module docstring says why).
    """
    ref_fs = reference if isinstance(reference, dict) else adm_reference_features(
        reference, weights_path, batch_size, device, progress)
    weights = resolve_inception_weights(weights_path)
    n = len(fake_uint8["features"] if isinstance(fake_uint8, dict) else fake_uint8)
    return evaluate(fake_uint8, ref_fs, metrics, bootstrap, seed, extractor=INCEPTION_EXTRACTOR,
                    weights_path=weights, batch_size=batch_size, device=device,
                    isc_splits=max(1, n // ADM_IS_SPLIT_SIZE), isc_shuffle=True, kid_subset_size=1000,
                    prc_neighborhood=3, progress=progress)


__all__ = ["resolve_inception_weights", "extract_inception_features", "resolve_adm_reference", "read_adm_reference",
           "adm_reference_features", "evaluate_adm", "PaperAssetNotFound", "INCEPTION_WEIGHTS_FILENAME",
           "ADM_REFERENCE_FILENAME"]
