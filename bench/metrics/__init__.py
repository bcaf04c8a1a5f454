"""Fidelity metrics (FID, IS, KID, precision/recall) on in-memory images, in two worlds.

- :mod:`bench.metrics.features`: the tiny world's feature CNN (``tinyshapes-cnn``), its training and
  its torch-fidelity feature extractor;
- :mod:`bench.metrics.fidelity`: feature extraction once, metrics via torch-fidelity's functions,
  bootstrap error bars, :func:`evaluate`; registers ``fid is kid precision recall`` in
  :data:`bench.registry.METRICS`;
- :mod:`bench.metrics.paper`: InceptionV3 (``inception-v3-compat``) from local weights and the ADM
  ImageNet-256 reference batch.

Importing needs no weights file; weights are read when features are first extracted.
"""
from bench.metrics.features import TinyShapesCNN, load_feature_cnn, save_feature_cnn, train_feature_cnn
from bench.metrics.fidelity import (
    evaluate,
    extract_features,
    fid_from_features,
    isc_from_logits,
    kid_from_features,
    prc_from_features,
)

__all__ = ["TinyShapesCNN", "train_feature_cnn", "save_feature_cnn", "load_feature_cnn", "extract_features",
           "evaluate", "fid_from_features", "isc_from_logits", "kid_from_features", "prc_from_features"]
