"""imagenet256: class-conditional ImageNet 256×256, the paper world's main bench (VAR / EVAR Tab. 1–4).

Protocol (VAR README, "Sampling & Zero-shot Inference"; community reproduction in VAR issue #83):
50 samples per class × 1000 classes = 50 000 images, sampled class by class in batches of 50
with one seed per batch, cfg 1.5, top-k 900, top-p 0.96, ``more_smooth=False`` (all overridable in
the run spec). Images are uint8 as saved to PNG. Metrics follow the ADM evaluator: Inception-v3
(``inception-v3-compat`` in torch-fidelity, local weights) pool features; FID against the ``mu``/
``sigma`` of ``VIRTUAL_imagenet256_labeled.npz``; precision/recall with k = 3 against its 10 000
``arr_0`` images; IS from the logits over chunks of 5000, taken after a fixed permutation of the
class-major samples (VAR's packing script lists the PNGs unsorted, so the official chunks mix the
classes; ``bench.metrics.paper``). Error bars: bootstrap over samples. Protocol version 2: version 1
took the chunks in class order, which caps IS near 100.

Training split for recovery methods: ImageNet-1k train as an ``ImageFolder`` under
``$VARBENCH_DATA_DIR/imagenet/train`` (VAR preprocessing: shorter side to 1.125·256 with LANCZOS,
centre crop 256, [-1, 1]); calibration: the ``val`` folder. A missing folder is an error naming it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict

from bench.benches.base import Bench
from bench.registry import BENCHES


def data_dir() -> Path:
    return Path(os.environ.get("VARBENCH_DATA_DIR") or Path.home() / ".cache" / "varbench" / "data")


@BENCHES.register("imagenet256")
class ImageNet256(Bench):
    name, world, model = "imagenet256", "paper", "var-d16"
    num_classes = 1000
    default_n = 50_000
    batch_size = 50
    epoch_size = 1_281_167
    bootstrap = 10
    version = 2   # 2: IS chunks mix the classes (version 1 took them in class order)
    metrics = ("fid", "is", "kid", "precision", "recall")

    def preflight(self) -> None:
        """The Inception weights and the ADM reference batch must be there before 50 000 images are sampled."""
        from bench.metrics.paper import resolve_adm_reference, resolve_inception_weights
        resolve_inception_weights()
        resolve_adm_reference()

    # Inception runs in batches of 64 (evaluate_adm's batch size); a chunk of 16 such batches, because
    # every chunk builds the network and reads its weights again (sharded runs, bench.shard)
    feature_chunk = 1024

    def features(self, images_uint8, progress=False):
        from bench.metrics.paper import extract_inception_features
        return extract_inception_features(images_uint8, batch_size=64, progress=progress)

    def score(self, feats, labels, seed=0, progress=True) -> Dict[str, dict]:
        from bench.metrics.paper import evaluate_adm
        return evaluate_adm(feats, bootstrap=self.bootstrap, seed=seed, batch_size=64, progress=progress)

    def data(self, n: int, split: str, vae):
        """(labels, token pyramid) of n ImageNet images taken at a uniform stride over the folder
        (EVAR-code's calibration sampling), tokenised by the model's own VQVAE."""
        import torch
        from torchvision.datasets import ImageFolder
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms import functional as TF
        from tqdm.auto import tqdm

        sub = "val" if split == "calib" else "train"
        folder = data_dir() / "imagenet" / sub
        if not folder.is_dir():
            raise FileNotFoundError(
                f"ImageNet {sub} folder not found: {folder}\n"
                f"  Put the ILSVRC-2012 images there in ImageFolder layout (one sub-folder per class, "
                f"n01440764/ …) or set VARBENCH_DATA_DIR. varbench never downloads data.")
        ds = ImageFolder(str(folder))
        picks = torch.linspace(0, len(ds) - 1, n).round().long().tolist()

        def load(i):
            # VAR's evaluation transform (utils/data.py, val_aug): torchvision's Resize of the shorter side to
            # round(1.125·256) = 288 with LANCZOS (the longer side truncated, as torchvision computes it), the
            # centre 256² crop, then [0, 1] → [-1, 1]
            img, label = ds[i]
            img = TF.resize(img.convert("RGB"), round(1.125 * 256), interpolation=InterpolationMode.LANCZOS)
            return TF.to_tensor(TF.center_crop(img, 256)).mul(2).sub(1), label

        labels, parts = [], []
        for b in tqdm(range(0, n, 32), desc=f"tokenise ImageNet {sub}"):
            xs, ys = zip(*(load(i) for i in picks[b:b + 32]))
            with torch.no_grad():
                parts.append(vae.img_to_idx(torch.stack(xs).to(vae.post_quant_conv.weight.device)))
            labels += ys
        return torch.tensor(labels), [torch.cat([p[si] for p in parts]).cpu() for si in range(len(parts[0]))]
