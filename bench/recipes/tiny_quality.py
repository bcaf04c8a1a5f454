"""Quality bars of the shipped tiny world, measured after training and written into the manifest.

- tiny VQVAE: reconstruction PSNR on 512 ``val`` images (bar: ≥ 24 dB);
- feature CNN: accuracy on 2048 held-out ``val`` images (bar: ≥ 98%);
- tiny-var: at its default sampling settings, 50 samples per class — the fraction the feature CNN
  classifies as the conditioning class (bar: ≥ 90%), and precision / recall (k = 3, feature-CNN
  features) against the ``shapes-c2i`` reference set (bars: ≥ 0.5), plus FID for information.
"""
from __future__ import annotations

from pathlib import Path

from bench.tiny import configs

BARS = {"vqvae_val_psnr_db": 24.0, "cnn_val_accuracy": 0.98, "class_acc": 0.90, "precision": 0.5, "recall": 0.5}


def measure_tiny_var(out: Path, per_class: int = 50, seed: int = 0, progress: bool = True) -> dict:
    """The ``shapes-c2i`` protocol (same sampling, seeds and metrics as ``varbench run``) on the
    checkpoints in ``out``."""
    from bench.benches.shapes_c2i import ShapesC2I
    from bench.models.zoo import load_generator
    from bench.registry import MODELS
    from bench.runner import sample

    card = MODELS.get("tiny-var")
    gen = load_generator(out / card.var_file, out / card.vae_file, card).eval()
    bench = ShapesC2I(feature_weights=out / "feature_cnn.safetensors")
    labels = bench.labels(per_class * bench.num_classes)
    imgs = sample(gen, bench, labels, seed, configs.TINY_SAMPLING, progress, desc="sample tiny-var")
    m = bench.evaluate(imgs, labels, seed=seed, progress=False)
    return {"class_acc": round(m["class_acc"]["value"], 4), "precision": round(m["precision"]["value"], 4),
            "recall": round(m["recall"]["value"], 4), "fid": round(m["fid"]["value"], 3),
            "n": len(labels), "sampling": configs.TINY_SAMPLING,
            "bars": {k: BARS[k] for k in ("class_acc", "precision", "recall")}}
