"""The tiny world's feature network: a small CNN trained on tinyshapes, registered in torch-fidelity.

In the paper world FID, IS, KID and precision/recall are computed on InceptionV3 features
(torch-fidelity's ``inception-v3-compat``). Inception knows nothing about 32×32 procedural shapes, so
the tiny world trains its own classifier on tinyshapes and uses it exactly the way Inception is used:

- ``'pool'``: the globally average-pooled last conv layer (post-ReLU), like Inception's pool3
  (``'2048'``). FID, KID and precision/recall use it.
- ``'logits_unbiased'``: the classifier's linear layer *without* its bias, like Inception's
  ``'logits_unbiased'``. IS uses it.
- ``'logits'``: the full classifier output (with bias), for accuracy checks.

The network is registered with torch-fidelity as ``'tinyshapes-cnn'``, so it works both through
:func:`bench.metrics.fidelity.extract_features` (in-memory tensors) and through
``torch_fidelity.calculate_metrics(feature_extractor='tinyshapes-cnn', ...)`` on folders. Its weights
are read from ``feature_extractor_weights_path`` (default :data:`DEFAULT_WEIGHTS_PATH`, shipped
under ``assets/tiny/`` and rebuilt by ``make tiny-models``); nothing is read when this module is
imported.

Inputs are uint8 ``[B,3,H,W]`` tensors (torch-fidelity's convention), normalised inside the model.
The network is trained at 32×32 and, thanks to adaptive pooling, also accepts other sizes (64×64).
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch_fidelity import register_feature_extractor
from torch_fidelity.feature_extractor_base import FeatureExtractorBase
from torch_fidelity.helpers import vassert
from torch_fidelity.registry import FEATURE_EXTRACTORS_REGISTRY
from tqdm.auto import tqdm

from bench.tiny.assets import ASSETS

EXTRACTOR_NAME = "tinyshapes-cnn"
DEFAULT_WEIGHTS_PATH = ASSETS / "feature_cnn.safetensors"
FORMAT_TAG = "varbench-tinyshapes-cnn"


class WeightsNotFoundError(FileNotFoundError):
    """A feature-network weights file is missing; the message says how to get it."""


class TinyShapesCNN(nn.Module):
    """A VGG-style classifier for small RGB images: 3 stages of two 3×3 conv-BN-ReLU, 2 max-pools.

    ``width`` is the channel count of the first stage (then 2×, 4×); the pooled feature has
    ``4 * width`` dimensions (128 for the default width 32). About 0.29M parameters at width 32.
    """

    def __init__(self, num_classes: int = 16, width: int = 32):
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes}")
        self.num_classes, self.width = int(num_classes), int(width)
        w = self.width

        def stage(c_in: int, c_out: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True),
                nn.Conv2d(c_out, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True),
            )

        self.stage1 = stage(3, w)          # 32×32
        self.stage2 = stage(w, 2 * w)      # 16×16
        self.stage3 = stage(2 * w, 4 * w)  # 8×8
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4 * w, self.num_classes)

    @property
    def feature_dim(self) -> int:
        return 4 * self.width

    @staticmethod
    def normalize(x_B3HW: torch.Tensor) -> torch.Tensor:
        """uint8 [0,255] → float in [-1,1] (as torch-fidelity's Inception does: (x-128)/128)."""
        vassert(x_B3HW.dtype == torch.uint8, f"expecting uint8 images, got {x_B3HW.dtype}")
        vassert(x_B3HW.dim() == 4 and x_B3HW.shape[1] == 3, f"expecting [B,3,H,W] images, got {tuple(x_B3HW.shape)}")
        return (x_B3HW.float() - 128.0) / 128.0

    def features_from_float(self, x_B3HW: torch.Tensor) -> torch.Tensor:
        """Pooled penultimate features [B,D] of already-normalised float images."""
        h = self.stage1(x_B3HW)
        h = self.stage2(F.max_pool2d(h, 2))
        h = self.stage3(F.max_pool2d(h, 2))
        return self.pool(h).flatten(1)

    def features(self, x_uint8: torch.Tensor) -> torch.Tensor:
        """uint8 [B,3,H,W] → pooled features [B, 4·width]."""
        return self.features_from_float(self.normalize(x_uint8))

    def logits(self, x_uint8: torch.Tensor) -> torch.Tensor:
        """uint8 [B,3,H,W] → class logits [B, num_classes]."""
        return self.fc(self.features(x_uint8))

    def forward(self, x_uint8: torch.Tensor) -> torch.Tensor:
        return self.logits(x_uint8)


# ---------------------------------------------------------------------------------------------------
# Saving and loading (safetensors; the config travels in the file's metadata)
# ---------------------------------------------------------------------------------------------------

def save_feature_cnn(model: TinyShapesCNN, path: str | os.PathLike,
                     metadata: Optional[Dict[str, str]] = None) -> Path:
    """Write ``model`` to a safetensors file; ``num_classes`` and ``width`` go into its metadata.

    ``metadata`` adds string entries (e.g. the training recipe, class names as JSON). The file is
    written atomically with its metadata in a fixed order (``bench.io``): a reader never sees half a
    file, and equal weights give equal bytes.
    """
    from safetensors.torch import save

    from bench.io import atomic_write_bytes, canonical_safetensors

    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    meta.update(format=FORMAT_TAG, num_classes=str(model.num_classes), width=str(model.width))
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    return atomic_write_bytes(path, canonical_safetensors(save(tensors, metadata=meta)))


def read_feature_cnn_metadata(path: str | os.PathLike) -> Dict[str, str]:
    """The metadata dict of a saved feature CNN (raises :class:`WeightsNotFoundError` if missing)."""
    from safetensors import safe_open

    path = _existing_weights(path)
    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {})


def load_feature_cnn(path: str | os.PathLike | None = None, device: str | torch.device = "cpu") -> TinyShapesCNN:
    """Build a :class:`TinyShapesCNN` from a file written by :func:`save_feature_cnn` (eval mode)."""
    from safetensors.torch import load_file

    path = _existing_weights(path)
    meta = read_feature_cnn_metadata(path)
    if meta.get("format") != FORMAT_TAG or "num_classes" not in meta or "width" not in meta:
        raise ValueError(f"{path} is not a tinyshapes feature CNN (metadata {meta}); "
                         f"it should be written by bench.metrics.features.save_feature_cnn")
    model = TinyShapesCNN(num_classes=int(meta["num_classes"]), width=int(meta["width"]))
    model.load_state_dict(load_file(str(path), device="cpu"), strict=True)
    return model.to(device).eval().requires_grad_(False)


def _existing_weights(path: str | os.PathLike | None) -> Path:
    path = Path(path) if path is not None else DEFAULT_WEIGHTS_PATH
    if not path.is_file():
        raise WeightsNotFoundError(
            f"feature-network weights {path.name} not found at {path}.\n"
            f"  `make tiny-models` creates it (it trains the tinyshapes CNN and writes "
            f"assets/tiny/feature_cnn.safetensors); or pass feature_extractor_weights_path= a file "
            f"written by bench.metrics.features.save_feature_cnn.")
    return path


# ---------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------

def _random_shift(x_B3HW: torch.Tensor, max_shift: int, gen: torch.Generator) -> torch.Tensor:
    """Translate each image by up to ``max_shift`` pixels (edge-replicated), one offset per image."""
    B, _, H, W = x_B3HW.shape
    padded = F.pad(x_B3HW, (max_shift,) * 4, mode="replicate")
    dy = torch.randint(0, 2 * max_shift + 1, (B,), generator=gen)
    dx = torch.randint(0, 2 * max_shift + 1, (B,), generator=gen)
    return torch.stack([padded[i, :, dy[i]:dy[i] + H, dx[i]:dx[i] + W] for i in range(B)])


@torch.no_grad()
def predict_logits(model: TinyShapesCNN, images_uint8: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
    """Logits [N,K] in eval mode, in batches (on the model's device; returned on CPU)."""
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    out = [model.logits(x.to(dev)).cpu() for x in images_uint8.split(batch_size)]
    model.train(was_training)
    return torch.cat(out)   # an empty batch splits into one empty chunk: [0, num_classes]


def accuracy(model: TinyShapesCNN, images_uint8: torch.Tensor, labels: torch.Tensor, batch_size: int = 256) -> float:
    """Top-1 accuracy of ``model`` on labelled uint8 images."""
    pred = predict_logits(model, images_uint8, batch_size).argmax(1)
    return float((pred == labels.cpu()).float().mean()) if len(labels) else float("nan")


def train_feature_cnn(images_uint8: torch.Tensor, labels: torch.Tensor, num_classes: int, epochs: int = 8,
                      batch_size: int = 128, lr: float = 2e-3, seed: int = 0, progress: bool = True, *,
                      width: int = 32, weight_decay: float = 5e-4, augment: bool = False, max_shift: int = 2,
                      val_images: Optional[torch.Tensor] = None, val_labels: Optional[torch.Tensor] = None,
                      device: str | torch.device = "cpu") -> Tuple[TinyShapesCNN, List[Dict[str, float]]]:
    """Train a :class:`TinyShapesCNN` classifier; returns ``(model in eval mode, history)``.

    AdamW with a cosine learning-rate schedule (one warm-up epoch fraction), cross-entropy loss.
    ``augment=True`` adds a mild random translation (±``max_shift`` px); it is off by default
    because the tinyshapes classes are exact renderings. Everything random (init, shuffling,
    augmentation) derives from ``seed``; the global RNG state is left as it was.

    ``history`` has one dict per epoch: ``epoch``, ``loss`` (mean train loss), ``train_acc``
    (running accuracy during the epoch) and, if validation data is given, ``val_acc``.
    """
    vassert(images_uint8.dtype == torch.uint8 and images_uint8.dim() == 4 and images_uint8.shape[1] == 3,
            f"expecting uint8 [N,3,H,W] images, got {images_uint8.dtype} {tuple(images_uint8.shape)}")
    labels = labels.long()
    vassert(len(labels) == len(images_uint8), "one label per image")
    vassert(int(labels.min()) >= 0 and int(labels.max()) < num_classes, f"labels must lie in [0, {num_classes})")
    N = len(images_uint8)
    steps_per_epoch = math.ceil(N / batch_size)
    total_steps = max(1, epochs * steps_per_epoch)
    warmup = max(1, steps_per_epoch // 4)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyShapesCNN(num_classes=num_classes, width=width).to(device)
    gen = torch.Generator().manual_seed(seed + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total_steps))))

    history: List[Dict[str, float]] = []
    bar = tqdm(total=total_steps, disable=not progress, desc="feature CNN", unit="step")
    for epoch in range(epochs):
        model.train()
        order = torch.randperm(N, generator=gen)
        loss_sum, correct, seen = 0.0, 0, 0
        for idx in order.split(batch_size):
            x = images_uint8[idx]
            if augment and max_shift > 0:
                x = _random_shift(x, max_shift, gen)
            y = labels[idx].to(device)
            logits = model.logits(x.to(device))
            loss = F.cross_entropy(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            loss_sum += float(loss.detach()) * len(idx)
            correct += int((logits.argmax(1) == y).sum())
            seen += len(idx)
            bar.update(1)
            bar.set_postfix(epoch=epoch + 1, loss=f"{loss_sum / seen:.3f}", acc=f"{correct / seen:.3f}")
        rec = {"epoch": epoch + 1, "loss": loss_sum / max(seen, 1), "train_acc": correct / max(seen, 1)}
        if val_images is not None and val_labels is not None:
            rec["val_acc"] = accuracy(model, val_images, val_labels)
        history.append(rec)
    bar.close()
    return model.eval().requires_grad_(False), history


# ---------------------------------------------------------------------------------------------------
# torch-fidelity feature extractor
# ---------------------------------------------------------------------------------------------------

class FeatureExtractorTinyShapesCNN(FeatureExtractorBase):
    """torch-fidelity wrapper of a trained :class:`TinyShapesCNN`.

    Provided features: ``'pool'`` (FID/KID/PRC default), ``'logits_unbiased'`` (ISC default),
    ``'logits'``. Weights come from ``feature_extractor_weights_path`` (default
    :data:`DEFAULT_WEIGHTS_PATH`); a missing file raises :class:`WeightsNotFoundError`.
    """

    def __init__(self, name: str, features_list, feature_extractor_weights_path: Optional[str] = None, **kwargs):
        super().__init__(name, features_list)
        self.net = load_feature_cnn(feature_extractor_weights_path)
        self.requires_grad_(False)
        self.eval()

    def forward(self, x: torch.Tensor):
        vassert(torch.is_tensor(x) and x.dtype == torch.uint8, "Expecting image as torch.Tensor with dtype=torch.uint8")
        vassert(x.dim() == 4 and x.shape[1] == 3, f"Input is not Bx3xHxW: {tuple(x.shape)}")
        pool_BD = self.net.features(x)
        out = {"pool": pool_BD}
        if "logits_unbiased" in self.features_list or "logits" in self.features_list:
            out["logits_unbiased"] = pool_BD @ self.net.fc.weight.T
            out["logits"] = out["logits_unbiased"] + self.net.fc.bias
        return tuple(out[name].float() for name in self.features_list)

    @staticmethod
    def get_provided_features_list():
        return "pool", "logits_unbiased", "logits"

    @staticmethod
    def get_default_feature_layer_for_metric(metric):
        return {"isc": "logits_unbiased", "fid": "pool", "kid": "pool", "prc": "pool"}[metric]

    @staticmethod
    def can_be_compiled():
        return False

    @staticmethod
    def get_dummy_input_for_compile():
        return (torch.rand([1, 3, 32, 32]) * 255).to(torch.uint8)


def register_tinyshapes_extractor() -> None:
    """Register ``'tinyshapes-cnn'`` with torch-fidelity once (safe to call again, and on reload)."""
    existing = FEATURE_EXTRACTORS_REGISTRY.get(EXTRACTOR_NAME)
    if existing is FeatureExtractorTinyShapesCNN:
        return
    if existing is None:
        register_feature_extractor(EXTRACTOR_NAME, FeatureExtractorTinyShapesCNN)
    elif existing.__module__ == __name__ and existing.__qualname__ == FeatureExtractorTinyShapesCNN.__qualname__:
        FEATURE_EXTRACTORS_REGISTRY[EXTRACTOR_NAME] = FeatureExtractorTinyShapesCNN  # this module was reloaded
    else:
        raise ValueError(f"torch-fidelity feature extractor {EXTRACTOR_NAME!r} is already registered "
                         f"by {existing.__module__}.{existing.__qualname__}")


register_tinyshapes_extractor()

__all__ = ["TinyShapesCNN", "train_feature_cnn", "save_feature_cnn", "load_feature_cnn", "read_feature_cnn_metadata",
           "predict_logits", "accuracy", "FeatureExtractorTinyShapesCNN", "register_tinyshapes_extractor",
           "WeightsNotFoundError", "DEFAULT_WEIGHTS_PATH", "EXTRACTOR_NAME"]
