"""Text encoders of the text-to-image generators: prompts → (features [B, T, C_text], mask [B, T]).

- ``T5TextEncoder`` (paper world, Infinity): ``google/flan-t5-xl``'s encoder through ``transformers``
  (the optional extra ``pip install 'varbench[t2i]'``), read from a local folder, tokenised as
  ``tools/run_infinity.py::encode_prompt`` does (``legacy=True``, at most 512 tokens, the
  ``last_hidden_state`` of the valid tokens; padded to the longest prompt of the batch where official
  pads to 512: the valid tokens' features do not depend on it). Nothing is downloaded: a missing folder or package is
  an error naming what to put where.
- ``TinyTextEncoder`` (tiny world, ``tiny-t2i``): a word-level tokenizer over a fixed vocabulary and a
  small pre-norm transformer encoder (``torch.nn.TransformerEncoder``), trained with the model.
"""
from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn

from bench.models.configs import TextConfig
from bench.models.t2i import TextEncoder

T5_SOURCE = "https://huggingface.co/google/flan-t5-xl"
# google/flan-t5-xl's config.json (the encoder half is what Infinity uses): for weight-free accounting.
FLAN_T5_XL = dict(d_model=2048, d_ff=5120, d_kv=64, num_heads=32, num_layers=24, vocab_size=32128,
                  feed_forward_proj="gated-gelu", relative_attention_num_buckets=32,
                  relative_attention_max_distance=128, tie_word_embeddings=False)


class WordTokenizer:
    """Whitespace word tokenizer over a fixed vocabulary (id 0 = padding)."""

    def __init__(self, vocab: Sequence[str], max_len: int):
        self.vocab, self.max_len = tuple(vocab), max_len
        self.ids = {w: i for i, w in enumerate(self.vocab)}

    def __call__(self, prompts: Sequence[str]) -> Tuple[torch.Tensor, torch.Tensor]:
        """(ids int64 [B, max_len], mask bool [B, max_len]); unknown words and over-long prompts are
        errors that name the prompt (and the closest known words)."""
        ids = torch.zeros(len(prompts), self.max_len, dtype=torch.long)
        for i, p in enumerate(prompts):
            words = p.lower().split()
            if not words:
                raise ValueError(f"prompt {i} is empty: give at least one word (the unconditional branch of "
                                 f"guidance is the model's learned null prompt, not an empty prompt)")
            if len(words) > self.max_len:
                raise ValueError(f"prompt {p!r} has {len(words)} words, more than max_len={self.max_len}")
            for j, w in enumerate(words):
                if w not in self.ids or w == self.vocab[0]:
                    close = difflib.get_close_matches(w, self.vocab[1:], n=3)
                    hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
                    raise ValueError(f"unknown word {w!r} in prompt {p!r}{hint} (vocabulary: {' '.join(self.vocab[1:])})")
                ids[i, j] = self.ids[w]
        return ids, ids != 0


class TinyTextEncoder(TextEncoder):
    def __init__(self, cfg: TextConfig):
        super().__init__()
        self.cfg = cfg
        self.tokenize = WordTokenizer(cfg.vocab, cfg.max_len)
        self.embed = nn.Embedding(len(cfg.vocab), cfg.width, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(1, cfg.max_len, cfg.width) * 0.02)
        layer = nn.TransformerEncoderLayer(cfg.width, cfg.heads, 4 * cfg.width, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, cfg.depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.out_channels)

    def forward(self, ids_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids_BT) + self.pos[:, :ids_BT.shape[1]]
        h = self.encoder(h, src_key_padding_mask=~mask_BT)
        return self.proj(self.norm(h))

    def encode(self, prompts: Sequence[str]) -> Tuple[torch.Tensor, torch.Tensor]:
        ids, mask = self.tokenize(prompts)
        dev = self.proj.weight.device
        ids, mask = ids.to(dev), mask.to(dev)
        return self.forward(ids, mask), mask


def _require_transformers(what: str):
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise RuntimeError(f"{what} needs the `transformers` package: pip install 'varbench[t2i]' "
                           f"(or pip install transformers sentencepiece)") from None
    return transformers


class T5TextEncoder(TextEncoder):
    """Flan-T5-XL's encoder from a local folder (``config.json``, weights, tokenizer files)."""

    def __init__(self, folder: str | os.PathLike, device="cpu", dtype: Optional[torch.dtype] = None, max_length: int = 512):
        super().__init__()
        folder = Path(folder)
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(
                f"text encoder not found: {folder} has no config.json. Put a copy of google/flan-t5-xl "
                f"({T5_SOURCE}: config.json, the weights and the tokenizer files) in {folder}; "
                f"varbench never downloads at run time.")
        transformers = _require_transformers("the Flan-T5 text encoder")
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), legacy=True)
        dtype = dtype or (torch.float16 if torch.device(device).type == "cuda" else torch.float32)
        self.model = transformers.T5EncoderModel.from_pretrained(str(folder), torch_dtype=dtype).to(device).eval()
        self.model.requires_grad_(False)
        self.max_length = max_length

    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> Tuple[torch.Tensor, torch.Tensor]:
        tok = self.tokenizer(text=list(prompts), max_length=self.max_length, padding="longest", truncation=True,
                             return_tensors="pt")
        dev = next(self.model.parameters()).device
        ids, mask = tok.input_ids.to(dev), tok.attention_mask.to(dev)
        feats = self.model(input_ids=ids, attention_mask=mask)["last_hidden_state"].float()
        return feats, mask.bool()


def t5_encoder_params(config: dict = FLAN_T5_XL) -> Optional[int]:
    """Parameters of a T5 encoder built on the meta device from ``config`` (no weights, no download);
    None when ``transformers`` is not installed."""
    try:
        transformers = _require_transformers("counting the text encoder's parameters")
    except RuntimeError:
        return None
    with torch.device("meta"):
        model = transformers.T5EncoderModel(transformers.T5Config(**config))
    return sum(p.numel() for p in model.parameters())
