"""HART as the runner samples it: prompts in, images out (``hart-0.7b``).

``HART`` (``bench.models.hart``) samples from the Qwen2 hidden states of a prompt and their mask, as
official ``sample.py`` hands them over after ``encode_prompts``. ``HARTGenerator`` pairs it with that
prompt encoder (``bench.models.text.QwenTextEncoder``: the system prompt, padding to 300 tokens, the
last hidden states) and its hybrid tokenizer, and offers what the runner, the latency bench and the
token methods use of a text-to-image generator (``generate``, ``sample_tokens`` with a logits hook,
``decode_uint8``, ``token_policy``, ``blocks``, ``scales_hw``). Nothing is computed differently: for the
same features ``generate(prompts)`` is ``HART.generate(*encoder.encode(prompts))`` bit for bit.

The tokenizer becomes a submodule here (the official model holds it outside its module tree), so
``.to(device)`` moves the whole generator.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from bench.models.hart import HART
from bench.models.t2i import PromptGenerator


class HARTGenerator(PromptGenerator):
    family = "hart"   # the model family token methods key their official schedules on

    def __init__(self, hart: HART, text_encoder: Optional[nn.Module] = None, name: str = ""):
        super().__init__()
        self.hart, self.tokenizer, self.text_encoder, self.name = hart, hart.tokenizer, text_encoder, name

    # -------------------------------------------------------------- what the runner and methods read
    @property
    def device(self) -> torch.device:
        return self.hart.word_embed.weight.device

    @property
    def vae(self):
        """The hybrid tokenizer (the runner's name for a generator's image tokenizer)."""
        return self.tokenizer

    @property
    def blocks(self):
        return self.hart.blocks

    @property
    def scales_hw(self):
        return self.hart.scales_hw

    @property
    def token_policy(self):
        return self.hart.token_policy

    @token_policy.setter
    def token_policy(self, policy) -> None:   # token methods install their policy in the sampling loop
        self.hart.token_policy = policy

    # -------------------------------------------------------------- sampling (encode_prompts, generate: PromptGenerator)
    def sample_tokens(self, prompts, seed: Optional[int] = 0, logits_hook=None, **sampling):
        """(token pyramid, f_hat) of prompts, or of ``(features, mask)`` given directly."""
        feats, mask = self.features(prompts)
        return self.hart.sample_tokens(feats, mask, seed, logits_hook=logits_hook, **sampling)

    def decode_uint8(self, f_hat: torch.Tensor) -> torch.Tensor:
        return self.hart.decode_uint8(f_hat)
