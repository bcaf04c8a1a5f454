"""CLIP score of images against their prompts, as FastVAR scores MJHQ-30K.

FastVAR (``mjhq30k_fid_clip.py``) loads OpenAI's ``clip`` ViT-L/14 with its own preprocessing, tokenises
each prompt with ``truncate=True``, L2-normalises both embeddings and averages the raw cosine over the
images; its tables show the mean ×100 (e.g. 26.35). Here the same network is built by open_clip as
``ViT-L-14-quickgelu`` (OpenAI's weights use QuickGELU; open_clip 3.x's plain ``ViT-L-14`` would use
GELU and only warn) from a local weights file, with open_clip's validation transform (resize of the
short side to 224, bicubic; centre crop; OpenAI mean/std: OpenAI's ``preprocess``), and open_clip's
tokenizer, which truncates at 77 tokens as ``clip.tokenize(..., truncate=True)`` does. The score is
``100 · mean_i cos(image_i, prompt_i)``, not clamped (torchmetrics clamps the mean at 0; DeepCache
clamps each sample; FastVAR does neither).

Runs in fp32; FastVAR runs the fp16 model ``clip.load`` gives on CUDA (a difference varbench has not
measured).
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

ARCH = "ViT-L-14-quickgelu"


def is_torchscript(path) -> bool:
    """Whether ``path`` is a TorchScript archive (OpenAI's ``clip.load`` files, e.g. ViT-L-14.pt): a zip
    whose record folder holds ``code/``."""
    import zipfile
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as z:
        return any(n.split("/")[1:2] == ["code"] for n in z.namelist())


def load_openai_clip(weights, device: str = "cpu", arch: str = ARCH):
    """(model, val preprocess, tokenizer) of OpenAI's CLIP from a local file (never downloads): a state
    dict (``open_clip_pytorch_model.bin``, safetensors) or OpenAI's TorchScript archive. The archive's
    weights are read with ``torch.jit.load`` (open_clip 3.x's loader calls ``torch.load`` with
    ``weights_only=True``, which refuses TorchScript) and loaded strictly into ``arch``, cast to fp32."""
    weights = Path(weights) if weights else None
    if weights is None or not weights.is_file():
        raise FileNotFoundError(
            f"CLIP weights {weights} not found: put OpenAI's ViT-L-14 weights there (the file ViT-L-14.pt of "
            f"openai/CLIP, or open_clip_pytorch_model.bin of timm/vit_large_patch14_clip_224.openai) and give "
            f"its path (VARBENCH_CLIP_WEIGHTS); varbench never downloads at run time")
    import logging

    import open_clip
    if not is_torchscript(weights):
        model, _, preprocess = open_clip.create_model_and_transforms(arch, pretrained=str(weights), device=device)
        return model.eval(), preprocess, open_clip.get_tokenizer(arch)
    logging.disable(logging.WARNING)   # open_clip: "No pretrained weights loaded" (they are loaded below)
    try:
        model, _, preprocess = open_clip.create_model_and_transforms(arch, pretrained=None)
    finally:
        logging.disable(logging.NOTSET)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.jit.load.* is deprecated", category=FutureWarning)
        state = torch.jit.load(str(weights), map_location="cpu").state_dict()
    for key in ("input_resolution", "context_length", "vocab_size"):   # attributes of OpenAI's archive, not weights
        state.pop(key, None)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ValueError(f"CLIP weights {weights}: not OpenAI's {arch} ({e})") from None
    return model.to(device).eval(), preprocess, open_clip.get_tokenizer(arch)


class ClipScorer:
    """Image and text embeddings of one CLIP model; ``score`` is the module docstring's formula."""

    def __init__(self, model, preprocess, tokenizer, device: str = "cpu", batch_size: int = 64):
        self.model, self.preprocess, self.tokenizer = model, preprocess, tokenizer
        self.device, self.batch_size = device, batch_size

    @classmethod
    def from_weights(cls, weights, device: str = "cpu", **kw) -> "ClipScorer":
        return cls(*load_openai_clip(weights, device), device=device, **kw)

    @torch.no_grad()
    def image_embeddings(self, images_uint8: torch.Tensor) -> torch.Tensor:
        """L2-normalised embeddings [N, D] of uint8 images [N, 3, H, W] (PIL through the preprocessing)."""
        from PIL import Image
        out = []
        for s in range(0, len(images_uint8), self.batch_size):
            x = torch.stack([self.preprocess(Image.fromarray(im.permute(1, 2, 0).numpy()))
                             for im in images_uint8[s:s + self.batch_size].cpu()])
            out.append(torch.nn.functional.normalize(self.model.encode_image(x.to(self.device)).float(), dim=-1).cpu())
        return torch.cat(out) if out else torch.zeros(0, 0)

    @torch.no_grad()
    def text_embeddings(self, prompts: Sequence[str]) -> torch.Tensor:
        out = []
        for s in range(0, len(prompts), self.batch_size):
            t = self.tokenizer(list(prompts[s:s + self.batch_size])).to(self.device)
            out.append(torch.nn.functional.normalize(self.model.encode_text(t).float(), dim=-1).cpu())
        return torch.cat(out)


def cosines(image_emb: torch.Tensor, text_emb: torch.Tensor) -> np.ndarray:
    """Per-pair cosine of L2-normalised embeddings [N]."""
    if image_emb.shape != text_emb.shape:
        raise ValueError(f"CLIP score pairs images with their prompts: {tuple(image_emb.shape)} vs "
                         f"{tuple(text_emb.shape)}")
    return (image_emb.double() * text_emb.double()).sum(-1).numpy()


def clip_score_metric(cos: np.ndarray) -> dict:
    """The record entry: 100 · mean cosine, its standard error over images (None for one image: unknown,
    not zero)."""
    cos = np.asarray(cos, dtype=np.float64)
    return {"value": float(100 * cos.mean()), "stderr": float(100 * cos.std(ddof=1) / np.sqrt(len(cos))) if len(cos) > 1 else None,
            "n": int(len(cos)), "higher_is_better": True, "error": "standard error of the mean over images"}
