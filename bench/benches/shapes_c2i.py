"""shapes-c2i: class-conditional generation on tinyshapes, the tiny world's stand-in for ImageNet-256.

Protocol: ``n`` samples, n/12 per class in class order (default 50 per class = 600), sampled in
batches of 50 with seed ``seed·1000003 + batch`` at the tiny model's default sampling settings
(cfg 2.0, top-k 50, top-p 0.9). Reference: the first 1200 images (100 per class) of the tinyshapes
``ref`` split. Features: the shipped ``tinyshapes-cnn`` registered in torch-fidelity (pooled layer
for FID, KID and precision/recall with k = 3; logits for IS). Error bars: bootstrap over the
generated samples (10 resamples) for FID, IS, precision and recall; KID (100 subsets) carries
torch-fidelity's std over its subsets instead (protocol version 2: bootstrapping KID was 70 % of
the evaluation time and no table shows KID; every other number is unchanged from version 1). Also
reported: ``class_acc``, the fraction of samples the
feature CNN classifies as their conditioning class.

Training split for recovery (``ft``/``kd``/``psad``): one epoch = 6144 tinyshapes ``train`` images
tokenised by the tiny VQVAE; calibration data for pruning comes from the ``calib`` split.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Dict

from bench.benches.base import Bench
from bench.registry import BENCHES
from bench.tiny import configs

REF_N = 1200


@lru_cache(maxsize=4)
def _reference_features(weights_path: str) -> dict:
    """Feature-CNN features of the reference set, extracted once per process (not once per run)."""
    from bench.data import tinyshapes
    from bench.metrics.fidelity import extract_features
    return extract_features(tinyshapes.generate(REF_N, "ref")[0], weights_path=weights_path)


class TinyFeatureBench(Bench):
    """A tiny-world bench scored by the shipped feature CNN (shapes-c2i, shapes-mjhq): its sha256 is part of
    the protocol identity, since a retrained feature network changes every score and so every record key."""

    def __init__(self, feature_weights=None, fidelity: bool = False):
        super().__init__(fidelity)
        self._feature_weights = feature_weights

    @property
    def feature_weights(self) -> str:
        """The feature CNN (default: the shipped one, read at call time so $VARBENCH_TINY_DIR counts)."""
        from bench.resources import tiny_assets_dir
        return str(self._feature_weights or tiny_assets_dir() / "feature_cnn.safetensors")

    def identity(self) -> Dict[str, object]:
        """Protocol version (+ setting) + the feature CNN's sha256, checked against its manifest."""
        from pathlib import Path

        from bench.checkpoint import check_manifest
        self.preflight()
        path = Path(self.feature_weights)
        return {**super().identity(), "files": {path.name: check_manifest(path)}}

    def preflight(self) -> None:
        from pathlib import Path
        if not Path(self.feature_weights).is_file():
            from bench.models.cards import tiny_put
            where = (tiny_put(Path(self.feature_weights).parent, one=True, ckpt_flag=False)
                     if self._feature_weights is None else "Give the path of an existing file.")
            raise FileNotFoundError(f"feature network {self.feature_weights} not found. {where} "
                                    f"`varbench train-tiny` retrains it.")


@BENCHES.register("shapes-c2i")
class ShapesC2I(TinyFeatureBench):
    name, world, model = "shapes-c2i", "tiny", "tiny-var"
    num_classes = configs.NUM_CLASSES
    default_n = 50 * configs.NUM_CLASSES
    batch_size = 50
    epoch_size = 6144
    bootstrap = 10
    bootstrap_metrics = ("fid", "is", "precision", "recall")
    version = 2
    metrics = ("fid", "is", "kid", "precision", "recall", "class_acc")

    # features: torch-fidelity's extractor in batches of 64, the CNN's class logits in batches of 256;
    # chunks of 256 (a multiple of both) give every image the same batch as one pass over all of them
    feature_chunk = 256

    def features(self, images_uint8, progress=False):
        import torch

        from bench.metrics.features import load_feature_cnn
        from bench.metrics.fidelity import extract_features
        fs = extract_features(images_uint8, weights_path=self.feature_weights, batch_size=64, progress=progress)
        cnn = load_feature_cnn(self.feature_weights).eval()
        with torch.no_grad():
            cls = torch.cat([cnn.logits(images_uint8[i:i + 256]) for i in range(0, len(images_uint8), 256)])
        return {"features": fs["features"], "logits": fs["logits"], "class_logits": cls}

    def score(self, feats, labels, seed=0, progress=True) -> Dict[str, dict]:
        from bench.metrics.fidelity import evaluate
        n = len(feats["features"])
        metrics = evaluate({"features": feats["features"], "logits": feats["logits"]},
                           _reference_features(self.feature_weights), bootstrap=self.bootstrap, seed=seed,
                           progress=progress, weights_path=self.feature_weights,
                           kid_subset_size=min(1000, n), bootstrap_metrics=self.bootstrap_metrics)
        hit = (feats["class_logits"].argmax(1) == labels).float()
        metrics["class_acc"] = {"value": hit.mean().item(), "stderr": (hit.std() / len(hit) ** 0.5).item(),
                                "n": len(hit), "higher_is_better": True,
                                "error": "binomial standard error over samples"}
        return metrics

    def data(self, n: int, split: str, vae):
        from bench.data import tinyshapes
        from bench.data.tokens import tokenize_images
        imgs, labels = tinyshapes.generate(n, "calib" if split == "calib" else "train")
        return labels, tokenize_images(vae, imgs, progress=False)
