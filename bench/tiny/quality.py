"""Quality bars of the shipped tiny world, measured after training and written into the manifest.

- tiny VQVAE: reconstruction PSNR on 512 ``val`` images (bar: ≥ 24 dB);
- feature CNN: accuracy on 2048 held-out ``val`` images (bar: ≥ 98%);
- tiny-var: at its default sampling settings, 50 samples per class — the fraction the feature CNN
  classifies as the conditioning class (bar: ≥ 90%), and precision / recall (k = 3, feature-CNN
  features) against the ``shapes-c2i`` reference set (bars: ≥ 0.5), plus FID for information.
"""
from __future__ import annotations

from pathlib import Path

import torch
from tqdm.auto import tqdm

from bench.data import tinyshapes
from bench.tiny import configs

BARS = {"vqvae_val_psnr_db": 24.0, "cnn_val_accuracy": 0.98, "class_acc": 0.90, "precision": 0.5, "recall": 0.5}


@torch.no_grad()
def measure_tiny_var(out: Path, per_class: int = 50, seed: int = 0, progress: bool = True) -> dict:
    from bench.benches.shapes_c2i import REF_N
    from bench.metrics.features import load_feature_cnn
    from bench.metrics.fidelity import evaluate
    from bench.models.zoo import load_generator
    from bench.registry import MODELS

    card = MODELS.get("tiny-var")
    gen = load_generator(out / card.var_file, out / card.vae_file, card).eval()
    labels = torch.arange(tinyshapes.NUM_CLASSES).repeat_interleave(per_class)
    imgs = torch.cat([gen.generate(labels[i:i + 50], seed=seed * 1_000_003 + i // 50, **configs.TINY_SAMPLING)
                      for i in tqdm(range(0, len(labels), 50), desc="sample tiny-var", disable=not progress)])
    cnn = load_feature_cnn(out / "feature_cnn.safetensors").eval()
    acc = (cnn.logits(imgs).argmax(1) == labels).float().mean().item()
    ref = tinyshapes.generate(REF_N, "ref")[0]
    m = evaluate(imgs, ref, metrics=("fid", "precision", "recall"), bootstrap=0, seed=seed,
                 weights_path=out / "feature_cnn.safetensors")
    return {"class_acc": round(acc, 4), "precision": round(m["precision"]["value"], 4),
            "recall": round(m["recall"]["value"], 4), "fid": round(m["fid"]["value"], 3),
            "n": len(labels), "sampling": configs.TINY_SAMPLING,
            "bars": {k: BARS[k] for k in ("class_acc", "precision", "recall")}}
