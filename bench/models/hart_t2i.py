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

from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn

from bench.models.hart import HART
from bench.models.heap import reuse_heap
from bench.models.t2i import is_prompt_list


class HARTGenerator(nn.Module):
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

    # -------------------------------------------------------------- sampling
    def encode_prompts(self, prompts: Sequence[str]) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.text_encoder is None:
            raise RuntimeError(f"{self.name or 'this generator'} has no text model: pass (features, mask) instead of "
                               f"prompts, or load the model with its Qwen2 text model")
        feats, mask = self.text_encoder.encode(list(prompts))
        return feats.to(self.device), mask.to(self.device)

    def sample_tokens(self, prompts, seed: Optional[int] = 0, logits_hook=None, **sampling):
        """(token pyramid, f_hat) of prompts, or of ``(features, mask)`` given directly."""
        feats, mask = self.encode_prompts(prompts) if is_prompt_list(prompts) else prompts
        return self.hart.sample_tokens(feats, mask, seed, logits_hook=logits_hook, **sampling)

    def decode_uint8(self, f_hat: torch.Tensor) -> torch.Tensor:
        return self.hart.decode_uint8(f_hat)

    @torch.no_grad()
    def generate(self, prompts, seed: Optional[int] = 0, **sampling) -> torch.Tensor:
        """Images uint8 [B, 3, H, W] of a list of prompts (or of ``(features, mask)``)."""
        with reuse_heap(self.device.type == "cpu"):
            _, f_hat = self.sample_tokens(prompts, seed, **sampling)
            return self.decode_uint8(f_hat)
