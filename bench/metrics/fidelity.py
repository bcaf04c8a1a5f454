"""FID, IS, KID and precision/recall from in-memory uint8 images, with bootstrap error bars.

Protocol (one place, torch-fidelity conventions):

1. **Features once.** Generated and reference images (uint8 ``[N,3,H,W]`` tensors, no PNG round
   trip) go through a torch-fidelity feature extractor once: ``tinyshapes-cnn`` in the tiny world
   (``'pool'`` features, ``'logits_unbiased'`` for IS) or ``inception-v3-compat`` in the paper world
   (``'2048'`` and ``'logits_unbiased'``, see :mod:`bench.metrics.paper`).
2. **Metrics on features**, computed by torch-fidelity's own functions (not reimplemented):

   - FID: ``fid_features_to_statistics`` (mean, ``np.cov``) and ``fid_statistics_to_metric``
     (trace of the matrix square root via eigenvalues). A reference may also be given as
     precomputed ``mu``/``sigma`` (the ADM reference batches carry them).
   - IS: ``isc_features_to_metric`` on ``logits_unbiased``: ``splits`` chunks, ``exp(mean KL)``
     per chunk, the mean over chunks (torch-fidelity shuffles first with ``seed``; ADM does not).
   - KID: ``kid_features_to_metric``: cubic polynomial kernel, unbiased MMD², mean over
     ``kid_subsets`` random subsets of ``min(kid_subset_size, N_fake, N_ref)`` samples.
   - Precision/recall (Kynkäänniemi et al., ADM protocol): ``prc_features_to_metric`` with
     neighbourhood 3 **on the same features as FID** (torch-fidelity's own default would be VGG16).
     Each sample's radius is the distance to its 3rd nearest *other* sample of its own set;
     precision = fraction of generated samples inside some reference ball, recall = fraction of
     reference samples inside some generated ball.
3. **Error bars**: ``bootstrap`` resamples of the *generated* feature rows (with replacement,
   ``numpy.random.default_rng(seed)``); ``stderr`` is the standard deviation (ddof=1) of the metric
   over the resamples; ``value`` is the metric on all generated samples. The reference set is
   fixed. Resampling repeats rows, which biases KID (duplicate pairs) and recall (duplicates shrink
   the generated radii) within each resample; the spread is still the sampling error we want.

Everything returns plain floats; :func:`evaluate` returns the record-ready dict
``{name: {"value", "stderr", "n", "higher_is_better", "error"}}``.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset
from torch_fidelity.metric_fid import fid_features_to_statistics, fid_statistics_to_metric
from torch_fidelity.metric_isc import isc_features_to_metric
from torch_fidelity.metric_kid import KEY_METRIC_KID_MEAN, KEY_METRIC_KID_STD, kid_features_to_metric
from torch_fidelity.metric_prc import KEY_METRIC_PRECISION, KEY_METRIC_RECALL, prc_features_to_metric
from torch_fidelity.registry import FEATURE_EXTRACTORS_REGISTRY
from torch_fidelity.utils import create_feature_extractor, get_featuresdict_from_dataset

from bench.metrics import features as _features  # registers 'tinyshapes-cnn' with torch-fidelity
from bench.registry import METRICS

DEFAULT_EXTRACTOR = _features.EXTRACTOR_NAME
DEFAULT_METRICS = ("fid", "is", "kid", "precision", "recall")
HIGHER_IS_BETTER = {name: METRICS.get(name).higher_is_better for name in DEFAULT_METRICS}  # from the catalog

FeatureSet = Dict[str, Any]  # {"features": Tensor[N,D] | None, "logits": Tensor[N,K] | None, "mu", "sigma"}


# ---------------------------------------------------------------------------------------------------
# Feature extraction (torch-fidelity extractors on in-memory tensors)
# ---------------------------------------------------------------------------------------------------

class _TensorImages(Dataset):
    """uint8 [N,3,H,W] tensor as the Dataset torch-fidelity's batch loop expects."""

    def __init__(self, images_N3HW: torch.Tensor):
        self.images_N3HW = images_N3HW

    def __len__(self) -> int:
        return len(self.images_N3HW)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.images_N3HW[i].contiguous()


def _resolve_weights(extractor: str, weights_path: Optional[str | os.PathLike]) -> Optional[str]:
    """The weights file to hand to the extractor; ``None`` is allowed only for our own network.

    torch-fidelity downloads when it gets no path; varbench never does, so every other extractor
    needs a local file (Inception's is found through :func:`bench.metrics.paper.resolve_inception_weights`).
    """
    if weights_path is not None:
        return str(weights_path)
    if extractor == DEFAULT_EXTRACTOR:
        return str(_features.DEFAULT_WEIGHTS_PATH)
    if extractor == "inception-v3-compat":
        from bench.metrics.paper import resolve_inception_weights

        return str(resolve_inception_weights())
    raise ValueError(f"feature extractor {extractor!r} needs weights_path= a local weights file "
                     f"(varbench never lets torch-fidelity download weights)")


def extract_features(images_uint8: torch.Tensor, extractor: str = DEFAULT_EXTRACTOR,
                     weights_path: Optional[str | os.PathLike] = None, batch_size: int = 64,
                     device: Optional[str | torch.device] = None, feature_layer: Optional[str] = None,
                     logits_layer: Optional[str] = "auto", progress: bool = False) -> FeatureSet:
    """Run a registered torch-fidelity feature extractor over uint8 ``[N,3,H,W]`` images.

    Returns ``{"features": Tensor[N,D], "logits": Tensor[N,K] or None}`` (float32, CPU).
    ``feature_layer`` defaults to the extractor's FID layer (``'pool'`` / ``'2048'``);
    ``logits_layer='auto'`` takes ``'logits_unbiased'`` when the extractor provides it (for IS),
    ``None`` skips logits. ``device`` defaults to CUDA when available.
    """
    if not (torch.is_tensor(images_uint8) and images_uint8.dtype == torch.uint8 and images_uint8.dim() == 4
            and images_uint8.shape[1] == 3):
        raise TypeError(f"expecting uint8 images [N,3,H,W], got "
                        f"{getattr(images_uint8, 'dtype', type(images_uint8))} {tuple(getattr(images_uint8, 'shape', ()))}")
    if extractor not in FEATURE_EXTRACTORS_REGISTRY:
        raise ValueError(f"unknown torch-fidelity feature extractor {extractor!r}; "
                         f"registered: {', '.join(sorted(FEATURE_EXTRACTORS_REGISTRY))}")
    cls = FEATURE_EXTRACTORS_REGISTRY[extractor]
    feature_layer = feature_layer or cls.get_default_feature_layer_for_metric("fid")
    if logits_layer == "auto":
        logits_layer = "logits_unbiased" if "logits_unbiased" in cls.get_provided_features_list() else None
    layers = [feature_layer] + ([logits_layer] if logits_layer and logits_layer != feature_layer else [])

    device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    if len(images_uint8) == 0:
        raise ValueError("no images to extract features from")
    net = create_feature_extractor(extractor, layers, cuda=cuda, verbose=progress,
                                   feature_extractor_weights_path=_resolve_weights(extractor, weights_path))
    feats = get_featuresdict_from_dataset(_TensorImages(images_uint8), net, batch_size=batch_size, cuda=cuda,
                                          save_cpu_ram=True, verbose=progress)  # save_cpu_ram: no worker processes
    return {"features": feats[feature_layer],
            "logits": feats[logits_layer] if logits_layer else None}


# ---------------------------------------------------------------------------------------------------
# Metrics on features (torch-fidelity's functions)
# ---------------------------------------------------------------------------------------------------

def _as_2d(x, what: str) -> torch.Tensor:
    t = torch.as_tensor(x).detach().cpu()
    if t.dim() != 2 or not t.is_floating_point():
        raise ValueError(f"{what} must be a float [N,D] array, got {t.dtype} {tuple(t.shape)}")
    return t


def fid_statistics(feats_ND) -> Dict[str, np.ndarray]:
    """``{"mu": float64[D], "sigma": float64[D,D]}`` of features (torch-fidelity's estimator)."""
    return fid_features_to_statistics(_as_2d(feats_ND, "features").double())


def fid_from_statistics(stats_1: Mapping[str, np.ndarray], stats_2: Mapping[str, np.ndarray]) -> float:
    """FID between two ``{"mu", "sigma"}`` statistics (both cast to float64)."""
    s1 = {k: np.asarray(stats_1[k], dtype=np.float64) for k in ("mu", "sigma")}
    s2 = {k: np.asarray(stats_2[k], dtype=np.float64) for k in ("mu", "sigma")}
    return float(fid_statistics_to_metric(s1, s2, verbose=False)["frechet_inception_distance"])


def fid_from_features(feats1_ND, feats2_MD) -> float:
    """Fréchet distance between the Gaussians fitted to two feature sets (symmetric)."""
    return fid_from_statistics(fid_statistics(feats1_ND), fid_statistics(feats2_MD))


def isc_from_logits(logits_NK, splits: int = 10, shuffle: bool = True, seed: int = 2020) -> float:
    """Inception Score of ``logits_unbiased`` rows: mean over ``splits`` chunks of exp(E KL(p‖p̄)).

    ``splits`` is capped at N. With ``shuffle`` the rows are permuted with ``RandomState(seed)``
    first (torch-fidelity); ADM uses consecutive chunks of 5000 without shuffling.
    """
    logits_NK = _as_2d(logits_NK, "logits")
    splits = max(1, min(int(splits), len(logits_NK)))
    return float(isc_features_to_metric(logits_NK, splits=splits, shuffle=shuffle, rng_seed=seed)
                 ["inception_score_mean"])


def kid_from_features(feats1_ND, feats2_MD, subsets: int = 100, subset_size: int = 1000, seed: int = 2020,
                      return_std: bool = False):
    """Kernel Inception Distance (unbiased MMD², cubic kernel), mean over random subsets (with
    ``return_std``: ``(mean, std over the subsets)``, torch-fidelity's two outputs).

    ``subset_size`` is capped at the smaller set. When both sets are exactly one subset big, every
    subset is the same set, so one is computed instead of ``subsets`` identical ones.
    """
    f1, f2 = _as_2d(feats1_ND, "features 1"), _as_2d(feats2_MD, "features 2")
    size = min(int(subset_size), len(f1), len(f2))
    if size < 2:
        raise ValueError(f"KID needs at least 2 samples per set, got {len(f1)} and {len(f2)}")
    if len(f1) == len(f2) == size:
        subsets = 1
    out = kid_features_to_metric(f1, f2, kid_subsets=int(subsets), kid_subset_size=size, rng_seed=seed,
                                 verbose=False)
    if return_std:
        return float(out[KEY_METRIC_KID_MEAN]), float(out[KEY_METRIC_KID_STD])
    return float(out[KEY_METRIC_KID_MEAN])


def prc_from_features(real_ND, fake_MD, k: int = 3, batch_size: int = 10000) -> Dict[str, float]:
    """Improved precision and recall with neighbourhood ``k`` (ADM uses 3) → ``{"precision", "recall"}``.

    Note the argument order: **real first**, generated second (torch-fidelity's own function takes
    generated first). Distances are Euclidean in the features' own dtype.
    """
    real, fake = _as_2d(real_ND, "real features"), _as_2d(fake_MD, "generated features")
    if min(len(real), len(fake)) <= k:
        raise ValueError(f"precision/recall with k={k} needs more than {k} samples per set, "
                         f"got {len(real)} real and {len(fake)} generated")
    out = prc_features_to_metric(fake, real.to(fake.dtype), prc_neighborhood=int(k), prc_batch_size=int(batch_size),
                                 save_cpu_ram=False, verbose=False)
    return {"precision": float(out[KEY_METRIC_PRECISION]), "recall": float(out[KEY_METRIC_RECALL])}


# ---------------------------------------------------------------------------------------------------
# evaluate(): features once, all metrics, bootstrap over generated rows
# ---------------------------------------------------------------------------------------------------

def as_feature_set(x, extractor: str = DEFAULT_EXTRACTOR, weights_path=None, batch_size: int = 64,
                   device=None, progress: bool = False) -> FeatureSet:
    """Normalise what a caller has into a feature set.

    - uint8 ``[N,3,H,W]`` images → :func:`extract_features`;
    - float ``[N,D]`` tensor/array → features only (no logits, so no IS);
    - a mapping with any of ``features``, ``logits``, ``mu``/``sigma`` (e.g. the output of
      :func:`extract_features`, or an ADM reference) → used as is.
    """
    if isinstance(x, Mapping):
        fs = {"features": x.get("features"), "logits": x.get("logits"), "mu": x.get("mu"), "sigma": x.get("sigma")}
        if fs["features"] is not None:
            fs["features"] = _as_2d(fs["features"], "features")
        if fs["logits"] is not None:
            fs["logits"] = _as_2d(fs["logits"], "logits")
        return fs
    t = torch.as_tensor(x) if isinstance(x, np.ndarray) else x
    if torch.is_tensor(t) and t.dtype == torch.uint8 and t.dim() == 4:
        return dict(extract_features(t, extractor, weights_path, batch_size, device, progress=progress),
                    mu=None, sigma=None)
    if torch.is_tensor(t) and t.dim() == 2 and t.is_floating_point():
        return {"features": t.detach().cpu(), "logits": None, "mu": None, "sigma": None}
    raise TypeError(f"expecting uint8 images [N,3,H,W], float features [N,D] or a feature dict, got "
                    f"{type(x).__name__} {getattr(x, 'dtype', '')} {tuple(getattr(x, 'shape', ()))}")


def _compute(names: Sequence[str], fake: FeatureSet, ref: Optional[FeatureSet], ref_stats, opts) -> Dict[str, float]:
    """Every requested metric for one set of generated rows (precision and recall share one pass)."""
    out: Dict[str, float] = {}
    if "fid" in names:
        out["fid"] = fid_from_statistics(fid_statistics(fake["features"]), ref_stats)
    if "is" in names:
        out["is"] = isc_from_logits(fake["logits"], opts["isc_splits"], opts["isc_shuffle"], opts["seed"])
    if "kid" in names:
        out["kid"] = kid_from_features(fake["features"], ref["features"], opts["kid_subsets"],
                                       opts["kid_subset_size"], opts["seed"])
    if "precision" in names or "recall" in names:
        pr = prc_from_features(ref["features"], fake["features"], opts["prc_neighborhood"])
        out.update({k: v for k, v in pr.items() if k in names})
    return out


def _check_inputs(names: Sequence[str], fake: FeatureSet, ref: Optional[FeatureSet]) -> None:
    unknown = [n for n in names if n not in HIGHER_IS_BETTER]
    if unknown:
        raise ValueError(f"unknown fidelity metric(s) {unknown}; known: {', '.join(HIGHER_IS_BETTER)}")
    if any(n != "is" for n in names) and fake["features"] is None:
        raise ValueError("generated samples have no features")
    if "is" in names and fake["logits"] is None:
        raise ValueError("IS needs logits: pass images (or extract_features output) from an extractor with "
                         "'logits_unbiased'")
    needs_ref = [n for n in names if n != "is"]
    if needs_ref and ref is None:
        raise ValueError(f"{needs_ref} need a reference set")
    ref_feats = [n for n in names if n in ("kid", "precision", "recall")]
    if ref_feats and ref["features"] is None:
        raise ValueError(f"{ref_feats} need reference features, not only mu/sigma")
    if "fid" in names and ref["features"] is None and (ref["mu"] is None or ref["sigma"] is None):
        raise ValueError("FID needs reference features or mu/sigma")


def evaluate(fake, ref=None, metrics: Iterable[str] = DEFAULT_METRICS, bootstrap: int = 10, seed: int = 0, *,
             extractor: str = DEFAULT_EXTRACTOR, weights_path=None, batch_size: int = 64, device=None,
             isc_splits: int = 10, isc_shuffle: bool = True, kid_subsets: int = 100, kid_subset_size: int = 1000,
             prc_neighborhood: int = 3, progress: bool = False,
             bootstrap_metrics: Optional[Iterable[str]] = None) -> Dict[str, Dict[str, Any]]:
    """Fidelity metrics of generated samples against a reference, with bootstrap standard errors.

    ``fake``: uint8 images ``[N,3,H,W]`` or a feature set (see :func:`as_feature_set`).
    ``ref``: uint8 images, float features ``[M,D]``, or a feature set (``mu``/``sigma`` there are
    used for FID instead of the reference features' statistics). Not needed for IS alone.
    Features are extracted once with ``extractor``; ``bootstrap`` resamples of the generated rows
    give ``stderr`` (``None`` when ``bootstrap=0``). ``seed`` drives the resampling, the KID subsets
    and the IS shuffle, so results are deterministic.

    ``bootstrap_metrics``: the metrics that get bootstrap errors (default: all). KID left out of it
    carries torch-fidelity's standard deviation over its random subsets as ``subset_std`` instead
    (its mean is already an average over ``kid_subsets`` subsets; bootstrapping it costs most of
    the evaluation).

    Returns ``{name: {"value": float, "stderr": float|None, "n": N, "higher_is_better": bool,
    "error": "bootstrap over generated samples, B resamples"}}``.
    """
    names = list(dict.fromkeys(metrics))
    kw = dict(extractor=extractor, weights_path=weights_path, batch_size=batch_size, device=device, progress=progress)
    fake_fs = as_feature_set(fake, **kw)
    ref_fs = as_feature_set(ref, **kw) if ref is not None else None
    _check_inputs(names, fake_fs, ref_fs)
    opts = dict(isc_splits=isc_splits, isc_shuffle=isc_shuffle, kid_subsets=kid_subsets,
                kid_subset_size=kid_subset_size, prc_neighborhood=prc_neighborhood, seed=seed)
    ref_stats = None
    if "fid" in names:
        ref_stats = ({"mu": ref_fs["mu"], "sigma": ref_fs["sigma"]} if ref_fs["mu"] is not None
                     else fid_statistics(ref_fs["features"]))

    boot_names = [m for m in names if bootstrap_metrics is None or m in set(bootstrap_metrics)]
    kid_alone = "kid" in names and "kid" not in boot_names    # one KID pass gives its mean and std
    values = _compute([m for m in names if not (kid_alone and m == "kid")], fake_fs, ref_fs, ref_stats, opts)
    extra: Dict[str, Dict[str, Any]] = {name: {} for name in names}
    if kid_alone:
        values["kid"], std = kid_from_features(fake_fs["features"], ref_fs["features"], kid_subsets,
                                               kid_subset_size, seed, return_std=True)
        extra["kid"] = {"subset_std": std, "error": f"no bootstrap; subset_std: std over {kid_subsets} random "
                                                    f"subsets (torch-fidelity)"}
    n = len(fake_fs["features"] if fake_fs["features"] is not None else fake_fs["logits"])

    rng = np.random.default_rng(seed)
    boot: Dict[str, list] = {name: [] for name in boot_names}
    for _ in range(int(bootstrap) if boot_names else 0):
        idx = torch.from_numpy(rng.integers(0, n, size=n))
        resampled = {k: (fake_fs[k][idx] if fake_fs.get(k) is not None else None) for k in ("features", "logits")}
        for name, v in _compute(boot_names, resampled, ref_fs, ref_stats, opts).items():
            boot[name].append(v)

    error = f"bootstrap over generated samples, {int(bootstrap)} resamples" if bootstrap else "none (bootstrap=0)"
    return {name: {"value": values[name],
                   "stderr": float(np.std(boot[name], ddof=1)) if len(boot.get(name, ())) > 1 else None,
                   "n": n, "higher_is_better": HIGHER_IS_BETTER[name], "error": error, **extra[name]}
            for name in names}


# ---------------------------------------------------------------------------------------------------
# Standalone metric callables (declared, with their metadata, in bench.metrics.catalog)
# ---------------------------------------------------------------------------------------------------

def _one(name: str):
    def metric(fake, ref=None, **options) -> float:
        """One fidelity metric: ``metric(fake, ref=None, **options) -> float``. ``fake``/``ref`` are
        anything :func:`evaluate` accepts; options are its keyword arguments. Benches that need error
        bars call :func:`evaluate` directly (all metrics from one feature pass)."""
        options.setdefault("bootstrap", 0)
        return evaluate(fake, ref, metrics=(name,), **options)[name]["value"]
    metric.__name__ = name
    return metric


fid, inception_score, kid, precision, recall = (_one(n) for n in DEFAULT_METRICS)

__all__ = ["extract_features", "as_feature_set", "fid_statistics", "fid_from_statistics", "fid_from_features",
           "isc_from_logits", "kid_from_features", "prc_from_features", "evaluate", "fid", "inception_score", "kid", "precision", "recall",
           "DEFAULT_EXTRACTOR", "DEFAULT_METRICS", "HIGHER_IS_BETTER"]
