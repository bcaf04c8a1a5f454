"""Detectors and colour classifiers behind GenEval's scoring rules (``bench.metrics.geneval``).

A detector maps one image (uint8 numpy [H, W, 3]) to per-class detections ``({class: boxes [k, 5]},
{class: masks [k] of bool [H, W]})`` — boxes (x1, y1, x2, y2, score) in pixel coordinates — and
classifies the colours of found objects: ``colours(image, objects, classname) -> [colour, …]``.

- ``ShapesDetector`` (tiny world, ``shapes-geneval``): the exact rule-based detector of shapes-scenes
  (``bench.data.scenes_detect``: connected components of colour strength, shape class by mask
  features); the class is the shape, the score the shape's confidence, the box the mask's tight
  pixel box (x2, y2 = one past the last pixel: mmdet's continuous convention). Colour: the colour the
  detector found the object in (its connected component's colour) — what GenEval's CLIP does on a
  masked crop, exact for these scenes.
- ``Mask2FormerDetector`` (paper world, ``geneval``): the official detector,
  ``mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco`` through mmdet 2.x (``init_detector`` /
  ``inference_detector``), with ``ClipColours``. mmdet 2.x needs mmcv-full 1.7 (the official
  environment is torch 1.12): varbench does not install it; without it the detector is an error that
  says how, and ``varbench geneval import`` scores the official evaluator's ``results.jsonl`` instead.
- ``ClipColours``: open_clip ViT-L-14 with QuickGELU (the OpenAI weights GenEval uses) from a local
  file, zero-shot over ``COLORS`` with the three official templates: text embeddings L2-normalised,
  averaged over templates, renormalised; each crop = the image composited over grey ``#999`` outside
  the mask, cropped to the box (PIL rounds the box), open_clip's preprocessing; logits 100·img·text;
  the argmax. It runs in fp32 where the official runs under CUDA autocast (fp16), so a crop whose two
  best colours nearly tie may be classified differently; not checked here (no weights, no GPU).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np

from bench.metrics.geneval import COLORS, Obj

Detections = Tuple[Dict[str, np.ndarray], Dict[str, List[np.ndarray]]]


class ShapesDetector:
    """The tiny world's exact detector (see the module docstring)."""

    name = "shapes-rules"

    def detect(self, image: np.ndarray) -> Detections:
        from bench.data import scenes_detect
        img = np.ascontiguousarray(np.asarray(image).transpose(2, 0, 1))          # 3, H, W uint8
        boxes: Dict[str, list] = {}
        masks: Dict[str, list] = {}
        self._colour = {}                 # id(mask) -> the detection's colour, for colours()
        for d in scenes_detect.detect(img[None])[0]:
            boxes.setdefault(d.shape, []).append([*map(float, d.box), float(d.score)])
            masks.setdefault(d.shape, []).append(d.mask)
            self._colour[id(d.mask)] = d.colour
        return {c: np.array(b, dtype=np.float64) for c, b in boxes.items()}, masks

    def colours(self, image: np.ndarray, objects: Sequence[Obj], classname: str) -> List[str]:
        """The colours the last ``detect`` found these objects in (objects are its (box, mask) pairs)."""
        try:
            return [self._colour[id(mask)] for _, mask in objects]
        except (AttributeError, KeyError):
            raise ValueError("ShapesDetector.colours takes objects of the image it last detected") from None


class ClipColours:
    """GenEval's colour classifier: open_clip ViT-L-14 (QuickGELU) from a local weights file."""

    TEMPLATES = ("a photo of a {c} {classname}", "a photo of a {c}-colored {classname}", "a photo of a {c} object")

    def __init__(self, weights, device: str = "cpu", arch: str = "ViT-L-14-quickgelu", bgcolor: str = "#999",
                 batch_size: int = 16):
        import torch

        from bench.metrics.clip_score import load_openai_clip
        self.torch, self.device, self.bgcolor, self.batch_size = torch, device, bgcolor, batch_size
        self.model, self.preprocess, self.tokenizer = load_openai_clip(weights, device, arch)
        self._classifiers: Dict[str, "torch.Tensor"] = {}

    def classifier(self, classname: str):
        """[D, 10] text weights of the colours for one class (cached per class, as the official)."""
        if classname not in self._classifiers:
            torch = self.torch
            cols = []
            with torch.no_grad():
                for c in COLORS:
                    texts = [t.format(c=c, classname=classname) for t in self.TEMPLATES]
                    e = self.model.encode_text(self.tokenizer(texts).to(self.device)).float()
                    e = torch.nn.functional.normalize(e, dim=-1).mean(dim=0)
                    cols.append(e / e.norm())
            self._classifiers[classname] = torch.stack(cols, dim=1)
        return self._classifiers[classname]

    def crops(self, image: np.ndarray, objects: Sequence[Obj]):
        from PIL import Image
        img = Image.fromarray(np.asarray(image, dtype=np.uint8)).convert("RGB")
        blank = Image.new("RGB", img.size, color=self.bgcolor)
        out = []
        for box, mask in objects:
            crop = img if mask is None else Image.composite(img, blank, Image.fromarray(np.asarray(mask, dtype=bool)))
            out.append(self.preprocess(crop.crop(tuple(float(v) for v in box[:4]))))
        return out

    def colours(self, image: np.ndarray, objects: Sequence[Obj], classname: str) -> List[str]:
        torch = self.torch
        clf = self.classifier(classname)
        crops = self.crops(image, objects)
        preds = []
        with torch.no_grad():
            for i in range(0, len(crops), self.batch_size):
                x = torch.stack(crops[i:i + self.batch_size]).to(self.device)
                f = torch.nn.functional.normalize(self.model.encode_image(x).float(), dim=-1)
                preds.append((100.0 * f @ clf).argmax(1))
        return [COLORS[int(i)] for i in torch.cat(preds)] if preds else []


MASK2FORMER = "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco"


class Mask2FormerDetector:
    """The official GenEval detector through mmdet 2.x (see the module docstring)."""

    name = MASK2FORMER

    def __init__(self, model_path, clip_weights, classnames: Sequence[str], device: str = "cuda", config=None):
        try:
            import mmdet
            from mmdet.apis import inference_detector, init_detector
        except ImportError:
            raise RuntimeError(
                "the GenEval detector needs mmdet 2.x with mmcv-full 1.7 (the official environment: torch 1.12, "
                "mmcv-full==1.7.1, mmdet 2.x; see djghosh13/geneval's README), which varbench does not install. "
                "Either install them, or run the official evaluation/evaluate_images.py on the image folder and "
                "score its output with `varbench geneval import results.jsonl`") from None
        ckpt = Path(model_path) / f"{MASK2FORMER}.pth"
        if not ckpt.is_file():
            raise FileNotFoundError(f"Mask2Former checkpoint {ckpt} not found: put {MASK2FORMER}.pth there "
                                    f"(geneval's evaluation/download_models.sh fetches it from download.openmmlab.com)")
        config = config or os.path.join(os.path.dirname(mmdet.__file__), f"../configs/mask2former/{MASK2FORMER}.py")
        self._infer = inference_detector
        self.model = init_detector(config, str(ckpt), device=device)
        self.classnames = list(classnames)
        self.clip = ClipColours(clip_weights, device=device)

    def detect(self, image: np.ndarray) -> Detections:
        result = self._infer(self.model, np.ascontiguousarray(np.asarray(image)[..., ::-1]))   # mmdet reads BGR
        bbox = result[0] if isinstance(result, tuple) else result
        segm = result[1] if isinstance(result, tuple) and len(result) > 1 else None
        boxes = {c: np.asarray(bbox[i]) for i, c in enumerate(self.classnames) if len(bbox[i])}
        masks = {c: list(segm[i]) for i, c in enumerate(self.classnames) if segm is not None and len(bbox[i])}
        return boxes, masks

    def colours(self, image, objects, classname):
        return self.clip.colours(image, objects, classname)
