"""Text encoders of the text-to-image generators: prompts → (features [B, T, C_text], mask [B, T]).

- ``T5TextEncoder`` (paper world, Infinity): ``google/flan-t5-xl``'s encoder through ``transformers``
  (the optional extra ``pip install 'varbench[t2i]'``), read from a local folder, tokenised as
  ``tools/run_infinity.py::encode_prompt`` does (``legacy=True``, at most 512 tokens, the
  ``last_hidden_state`` of the valid tokens; padded to the longest prompt of the batch where official
  pads to 512: the valid tokens' features do not depend on it). Nothing is downloaded: a missing folder or package is
  an error naming what to put where.
- ``TinyTextEncoder`` (tiny world, ``tiny-t2i``): a word-level tokenizer over a fixed vocabulary and a
  small pre-norm transformer encoder (``torch.nn.TransformerEncoder``), trained with the model. With
  ``conv_kernel`` > 0 a 1-D convolution over neighbouring words is added to the embeddings before the
  transformer, so that from the first step a colour word's vector carries the shape word next to it
  (and vice versa). Why: the image tokens read the prompt by cross-attention, one text vector per
  key/value, so "a red circle and a blue square" can only be rendered right if the vector at "red"
  also says "circle". Trained jointly from scratch without it, the encoder barely learns that binding:
  linear probes on a 7,000-step model's features (432 position prompts, half to fit, half to test)
  read a colour word's own shape at 0.39–0.56 and a shape word's colour at 0.44–0.65, near chance
  (0.25 / 0.33), while each word's own identity reads at 1.0. A pretrained T5 (the paper world) comes
  with such binding; a tiny encoder trained only through the image loss has to discover it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn

from bench.models.configs import TextConfig
from bench.models.t2i import TextEncoder
from bench.registry import did_you_mean

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
                    raise ValueError(f"unknown word {w!r} in prompt {p!r}{did_you_mean(w, self.vocab[1:], n=3)} "
                                     f"(vocabulary: {' '.join(self.vocab[1:])})")
                ids[i, j] = self.ids[w]
        return ids, ids != 0


class TinyTextEncoder(TextEncoder):
    def __init__(self, cfg: TextConfig):
        super().__init__()
        self.cfg = cfg
        self.tokenize = WordTokenizer(cfg.vocab, cfg.max_len)
        self.embed = nn.Embedding(len(cfg.vocab), cfg.width, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(1, cfg.max_len, cfg.width) * 0.02)
        if cfg.conv_kernel:
            if cfg.conv_kernel % 2 == 0:
                raise ValueError(f"conv_kernel must be odd (a word and the same number of neighbours on each side), got {cfg.conv_kernel}")
            self.conv = nn.Conv1d(cfg.width, cfg.width, cfg.conv_kernel, padding=cfg.conv_kernel // 2)
        layer = nn.TransformerEncoderLayer(cfg.width, cfg.heads, 4 * cfg.width, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, cfg.depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.out_channels)

    def forward(self, ids_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids_BT) + self.pos[:, :ids_BT.shape[1]]
        if self.cfg.conv_kernel:   # each word's vector gets its neighbours' (padding zeroed first)
            h = h * mask_BT.unsqueeze(-1)
            h = h + self.conv(h.transpose(1, 2)).transpose(1, 2)
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


def _require_folder(folder: Path, what: str, source: str) -> None:
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{what} not found: {folder} has no config.json. Put a copy of {source} (config, "
                                f"weights, tokenizer files) in {folder}; varbench never downloads at run time.")


class T5TextEncoder(TextEncoder):
    """Flan-T5-XL's encoder from a local folder (``config.json``, weights, tokenizer files)."""

    def __init__(self, folder: str | os.PathLike, device="cpu", dtype: Optional[torch.dtype] = None, max_length: int = 512):
        super().__init__()
        folder = Path(folder)
        _require_folder(folder, "text encoder (google/flan-t5-xl)", T5_SOURCE)
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


# HART's text model is mit-han-lab/Qwen2-VL-1.5B-Instruct (its config is not available offline; the HART
# paper calls it Qwen2-1.5B): Qwen2-1.5B's published config, for weight-free accounting only.
QWEN2_1_5B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                  num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)


def qwen2_params(config: dict = QWEN2_1_5B) -> Optional[int]:
    """Parameters of a Qwen2 decoder (no LM head) built on the meta device; None without transformers."""
    try:
        transformers = _require_transformers("counting the text model's parameters")
    except RuntimeError:
        return None
    with torch.device("meta"):
        model = transformers.Qwen2Model(transformers.Qwen2Config(**config))
    return sum(p.numel() for p in model.parameters())


# mit-han-lab/hart ``hart/utils/constants.py::llm_system_prompt``: prepended to every prompt when
# ``use_llm_system_prompt`` (the default of its sample.py), its hidden states then cut off.
HART_SYSTEM_PROMPT = (
    'Given a user prompt, generate an "Enhanced prompt" that provides detailed visual descriptions suitable '
    'for image generation.\n\nExamples:\n- User Prompt: A cat sleeping -> A small, fluffy white cat curled up in a '
    'round shape, sleeping peacefully on a warm sunny windowsill, surrounded by pots of blooming red flowers.\n'
    '- User Prompt: A busy city street -> A bustling city street scene at dusk, featuring glowing street lamps, a '
    'diverse crowd of people in colorful clothing, and a double-decker bus passing by towering glass skyscrapers.\n\n'
    'Please generate only the enhanced description for the prompt below and DO NOT include any additional '
    'sentences. Start your response with "Enhanced Prompt:".\n\nUser Prompt:\n')
QWEN_SOURCE = "https://huggingface.co/mit-han-lab/Qwen2-VL-1.5B-Instruct"


class QwenTextEncoder(TextEncoder):
    """HART's prompt encoder (official ``hart/utils/tools.py::encode_prompts``): every prompt padded to
    ``max_length`` (300) tokens, mask = token ≠ pad, the system prompt prepended (all ones in the mask),
    the last hidden states of the prompt's positions. Returns (features, mask) for ``HART.generate``."""

    def __init__(self, folder: str | os.PathLike, device="cpu", max_length: int = 300, system_prompt: bool = True):
        super().__init__()
        folder = Path(folder)
        _require_folder(folder, "HART text model (Qwen2-VL-1.5B-Instruct)", QWEN_SOURCE)
        transformers = _require_transformers("HART's Qwen2 text model")
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
        self.model = transformers.AutoModel.from_pretrained(str(folder)).to(device).eval().requires_grad_(False)
        self.max_length, self.system_prompt = max_length, system_prompt

    def _ids(self, texts, padding):
        return [self.tokenizer(t, return_tensors="pt", padding=padding, max_length=self.max_length,
                               truncation=True).input_ids[0] for t in texts]

    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> Tuple[torch.Tensor, torch.Tensor]:
        dev = next(self.model.parameters()).device
        ids = torch.stack(self._ids(list(prompts), "max_length")).to(dev)
        mask = ids != self.tokenizer.pad_token_id
        if not self.system_prompt:
            h = self.model(ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
            return h.float(), mask
        sys_ids = self._ids([HART_SYSTEM_PROMPT], "longest")[0].to(dev).unsqueeze(0).repeat(ids.shape[0], 1)
        full_mask = torch.cat((torch.ones_like(mask)[:, :sys_ids.shape[1]], mask), dim=1)
        h = self.model(torch.cat((sys_ids, ids), dim=1), attention_mask=full_mask, output_hidden_states=True)
        return h.hidden_states[-1][:, sys_ids.shape[1]:].float(), mask
