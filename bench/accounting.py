"""Weight-free accounting: exact parameter counts and FLOPs per image, computed on the meta device.

FLOPs are counted with ``torch.utils.flop_counter.FlopCounterMode`` (2·M·N·K per matmul, attention
included) while the real sampling loop runs on meta tensors: no weights, no memory, and whatever a
token policy or a pruned model changes is counted as it runs.

Meta kernels compute only shapes, but many of them are Python reference implementations (0.2–1.6 ms
per call; Infinity-2B's count makes ~64,000 calls). The blocks of a model repeat the same ops on the
same shapes, so ``counting`` remembers each functional op's output metadata below the counter
(``MetaMemo``): the counter still sees every op, the meta kernel runs once per distinct call
(Infinity-2B: ~900 of ~34,000 functional calls).
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.flop_counter import FlopCounterMode

from bench.defaults import HART_SAMPLING, SAMPLING
from bench.models.generator import Generator


class _Unkeyed(Exception):
    """An argument the memo cannot key exactly (a real tensor, a generator, …): run the kernel."""


_PLAIN = (bool, int, float, str, torch.dtype, torch.device, torch.layout, torch.memory_format)


def _key(v):
    """A hashable key of everything a meta kernel's output depends on: tensors by metadata (no data
    exists), other arguments by type and value (``mul(x, 1)`` and ``mul(x, 1.0)`` differ in dtype)."""
    if isinstance(v, torch.Tensor):
        if v.device.type != "meta":
            raise _Unkeyed
        return (tuple(v.shape), v.stride(), v.storage_offset(), v.dtype)
    if isinstance(v, (list, tuple)):
        return (type(v), tuple(_key(x) for x in v))
    if v is None or isinstance(v, _PLAIN):
        return (type(v), v)
    raise _Unkeyed


class MetaMemo(TorchDispatchMode):
    """Below a counter: a functional op (no mutated argument, no aliased output) already called with
    the same arguments gets fresh meta tensors of the recorded shapes, strides and dtypes without
    its meta kernel running again. In-place and view ops, and calls on non-meta tensors, always run."""

    def __init__(self):
        super().__init__()
        self.memo: dict = {}   # one count's calls (the default dtype, which factory ops read, is fixed)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema = func._schema
        if schema.is_mutable or any(r.alias_info is not None for r in schema.returns):
            return func(*args, **kwargs)
        try:
            key = (func, _key(args), _key(tuple(sorted(kwargs.items()))))
        except _Unkeyed:
            return func(*args, **kwargs)
        hit = self.memo.get(key)
        if hit is None:
            out = func(*args, **kwargs)
            leaves, spec = tree_flatten(out)
            if all(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in leaves):
                self.memo[key] = ([(tuple(t.shape), t.stride(), t.storage_offset(), t.dtype) for t in leaves], spec)
            return out
        metas, spec = hit
        return tree_unflatten([torch.empty_strided(shape, stride, dtype=dtype, device="meta").as_strided(shape, stride, off)
                               for shape, stride, off, dtype in metas], spec)


@contextlib.contextmanager
def counting() -> Iterator[FlopCounterMode]:
    """A ``FlopCounterMode`` over the memo (the counter sees every op; the memo spares repeated meta
    kernels)."""
    fc = FlopCounterMode(display=False)
    with MetaMemo(), fc:
        yield fc


def count_params(module: torch.nn.Module) -> int:
    """Learnable parameters (buffers such as the attention mask are not parameters)."""
    return sum(p.numel() for p in module.parameters())


def _meta_copy(gen: Generator) -> Generator:
    if gen.device.type == "meta":
        return gen
    with torch.device("meta"):
        return Generator(type(gen.var)(gen.var.cfg), type(gen.vae)(gen.vae.cfg), name=gen.name,
                         token_policy=gen.token_policy)


def sampling_flops(gen: Generator, cfg: Optional[float] = SAMPLING["cfg"], top_k: int = SAMPLING["top_k"],
                   top_p: float = SAMPLING["top_p"], more_smooth: bool = False) -> int:
    """Transformer FLOPs (blocks, head, embeddings, and the VQVAE's φ convolutions that update f̂ at each
    scale: 47 MFLOPs on var-d16, 0.008 %) to sample one image; ``cfg=None`` = no CFG doubling.
    (Sampling keywords as the record's ``sampling``; only ``cfg`` changes the count.) Counted on the
    official loop, AdaLN recomputed at every scale (varbench's sampler computes it once: 0.62 % fewer
    FLOPs on var-d16 with CFG, 597.06 G against 600.76 G), so counts compare with the papers'."""
    return _per_scale_flops(gen, cfg, top_k, top_p)[0]


def _per_scale_flops(gen: Generator, cfg: Optional[float], top_k: int, top_p: float):
    """(total, FLOPs per sampled scale): each scale's share is what ran since the previous scale's logits
    (its input embedding, the block stack when it starts a pass, its head), the attribution of the
    latency bench's per-scale times."""
    g = _meta_copy(gen)
    marks = []
    with counting() as fc:
        g.sample_tokens(torch.zeros(1, dtype=torch.long, device="meta"), seed=None, cfg=cfg, top_k=top_k,
                        top_p=top_p, cache_adaln=False, logits_hook=lambda si, _: marks.append(fc.get_total_flops()))
    return int(fc.get_total_flops()), _shares(marks)


def decode_flops(gen: Generator) -> int:
    """VQVAE decoder FLOPs for one image (post_quant_conv + decoder)."""
    g = _meta_copy(gen)
    pn = g.patch_nums[-1]
    with counting() as fc, torch.no_grad():
        g.vae.fhat_to_img(torch.zeros(1, g.vae.Cvae, pn, pn, device="meta"))
    return int(fc.get_total_flops())


def kv_cache_values(attns, rows: int) -> Optional[int]:
    """Keys and values (every head, ``rows`` batch rows: 2 with CFG) that the in-place KV caches of these
    attention modules held at the end of their last generation (``SelfAttention.kv_used``): with a
    token method, only the tokens it computed. Bytes = values × the element size (bf16: 2). None before
    any generation."""
    used = [a.kv_used for a in attns]
    if any(u is None for u in used):
        return None
    return sum(2 * rows * u * a.H * a.c for u, a in zip(used, attns))


def info(gen: Generator, name: str = "", image_size: Optional[int] = None) -> dict:
    """The ``varbench info --json`` object (its keys are a contract: docs/architecture.md)."""
    cfg = gen.var.cfg
    return {
        "model": name or gen.name,
        "params": count_params(gen.var),
        "tokenizer_params": count_params(gen.vae),
        "flops": sampling_flops(gen),
        "kv_cache_values": kv_cache_values([b.attn for b in gen.var.blocks], rows=2),   # of the CFG count above
        "flops_no_cfg": sampling_flops(gen, cfg=None),
        "tokenizer_decode_flops": decode_flops(gen),
        "tokens_per_scale": [pn * pn for pn in gen.patch_nums],
        "patch_nums": list(gen.patch_nums),
        "total_tokens": gen.var.L,
        "image_size": image_size,
        "depth": cfg.depth,
        "width": cfg.width,
        "heads": [cfg.block_heads(i) for i in range(cfg.depth)],
        "ffn_hidden": [cfg.block_ffn(i) for i in range(cfg.depth)],
        "attn_l2_norm": cfg.attn_l2_norm,
        "vocab_size": cfg.vocab_size,
    }


# ---------------------------------------------------------------- text-to-image generators
TEXT_TOKENS = 32   # prompt length (text-encoder tokens) of the weight-free FLOP count: a typical prompt


def t2i_sampling_flops(gen, text_tokens: int = TEXT_TOKENS, cfg: Optional[float] = 4.0, by_op: bool = False):
    """Transformer FLOPs (text projections, blocks, head) to sample one image with a prompt of
    ``text_tokens`` tokens; ``cfg`` None or 1 = the conditional batch alone. ``by_op``: a dict
    {aten op: FLOPs} instead (matrix products vs attention)."""
    fc, _ = _t2i_count(gen, text_tokens, cfg)
    if by_op:
        counts = fc.get_flop_counts().get("Global", {})
        return {str(op).split(".")[1] if "." in str(op) else str(op): int(n) for op, n in counts.items()}
    return int(fc.get_total_flops())


def _t2i_count(gen, text_tokens: int, cfg: Optional[float]):
    """(the flop counter after one sampling of a ``text_tokens`` prompt, FLOPs per sampled scale as
    ``_per_scale_flops`` attributes them)."""
    from bench.models.t2i import T2IGenerator
    with torch.device("meta"):
        g = gen if gen.device.type == "meta" else T2IGenerator(type(gen.infinity)(gen.infinity.cfg),
                                                                  type(gen.vae)(gen.vae.cfg), name=gen.name,
                                                                  token_policy=gen.token_policy)
    Ct5 = g.infinity.cfg.text_channels
    feats = torch.zeros(1, text_tokens, Ct5, device="meta")
    mask = torch.ones(1, text_tokens, dtype=torch.bool, device="meta")
    marks = []
    with counting() as fc:
        g.sample_bits(feats, mask, seed=None, cfg=1.0 if cfg is None else cfg, tau=1.0, top_k=0, top_p=0.0,
                      cache_text_kv=False,   # the official loop (text K/V per scale), as the papers count
                      logits_hook=lambda si, _: marks.append(fc.get_total_flops()))
    return fc, _shares(marks)


def _shares(marks) -> list:
    """Per-scale FLOPs from the running totals read at each scale's logits."""
    return [int(b - a) for a, b in zip([0] + marks, marks)]


def t2i_decode_flops(gen) -> int:
    from bench.models.bsq import BSQVAE
    with torch.device("meta"):
        vae = BSQVAE(gen.vae.cfg)
    H, W = gen.infinity.cfg.scale_schedule[-1]
    with counting() as fc, torch.no_grad():
        vae.decode(torch.zeros(1, vae.d, H, W, device="meta"))
    return int(fc.get_total_flops())


def model_cost(gen, sampling: dict, per_scale: bool = False) -> dict:
    """A run record's model costs: params, tokenizer_params, flops and flops_no_cfg per image (and, for
    text-to-image generators, text_encoder_params and the prompt length of the FLOP count: ``TEXT_TOKENS``
    or the model's longest prompt if shorter). ``per_scale`` (the latency bench's breakdown) adds, from the
    same count: ``scale_flops``, the FLOPs of each sampled scale as ``_per_scale_flops`` attributes them,
    and ``scale_passes``, whether it starts a pass through the block stack (false for the later scales
    of a group that LazyVAR decodes in one pass; trailing skipped scales are not listed)."""
    from bench.models.hart_t2i import HARTGenerator
    from bench.models.t2i import T2IGenerator
    if isinstance(gen, HARTGenerator):   # always the [cond; uncond] batch, the full padded context
        text = gen.text_encoder
        fc, scales = _hart_count(gen, sampling.get("cfg", HART_SAMPLING["cfg"]))
        out = {"params": count_params(gen.hart), "tokenizer_params": count_params(gen.tokenizer),
               "text_encoder_params": None if text is None else count_params(text),
               "text_tokens": gen.hart.cfg.context_token, "flops": int(fc.get_total_flops()), "flops_no_cfg": None}
    elif isinstance(gen, T2IGenerator):
        T = min(TEXT_TOKENS, gen.infinity.cfg.text_maxlen)
        text = gen.text_encoder
        fc, scales = _t2i_count(gen, T, sampling.get("cfg"))
        out = {"params": count_params(gen.infinity), "tokenizer_params": count_params(gen.vae),
               "text_encoder_params": None if text is None else count_params(text), "text_tokens": T,
               "flops": int(fc.get_total_flops()), "flops_no_cfg": t2i_sampling_flops(gen, T, cfg=None)}
    else:
        flops, scales = _per_scale_flops(gen, **{k: sampling.get(k, SAMPLING[k]) for k in ("cfg", "top_k", "top_p")})
        out = {"params": count_params(gen.var), "tokenizer_params": count_params(gen.vae),
               "flops": flops, "flops_no_cfg": sampling_flops(gen, **{**sampling, "cfg": None})}
    if per_scale:
        out.update(scale_flops=scales, scale_passes=pass_starts(gen.token_policy, len(gen.scales_hw))[:len(scales)])
    return out


def pass_starts(policy, n_scales: int) -> list:
    """For every scale the policy samples, in order: whether it starts a pass through the block stack."""
    out = []
    for group in policy.groups(n_scales):
        if policy.skip(group[0]):
            break
        out += [True] + [False] * (len(group) - 1)
    return out


def t2i_info(gen, card, text_tokens: int = TEXT_TOKENS) -> dict:
    """``varbench info --json`` of a text-to-image model (same contract keys as ``info``)."""
    from bench.models.text import t5_encoder_params
    cfg = gen.infinity.cfg
    if gen.text_encoder is not None:
        text_params = count_params(gen.text_encoder)
    else:
        text_params = t5_encoder_params()
    cfg_scale = card.sampling.get("cfg", 4.0)
    return {
        "model": card.name,
        "params": count_params(gen.infinity),
        "tokenizer_params": count_params(gen.vae),
        "text_encoder_params": text_params,
        "flops": t2i_sampling_flops(gen, text_tokens, cfg=cfg_scale),
        "kv_cache_values": kv_cache_values([b.sa for b in gen.infinity.block_list], rows=2),   # of the count above
        "flops_no_cfg": t2i_sampling_flops(gen, text_tokens, cfg=None),
        "flops_by_op": t2i_sampling_flops(gen, text_tokens, cfg=cfg_scale, by_op=True),
        "tokenizer_decode_flops": t2i_decode_flops(gen),
        "text_tokens": text_tokens,
        "tokens_per_scale": [h * w for h, w in cfg.scale_schedule],
        "scale_schedule": [list(s) for s in cfg.scale_schedule],
        "total_tokens": cfg.L,
        "image_size": card.image_size,
        "depth": cfg.depth,
        "width": cfg.width,
        "heads": [cfg.num_heads] * cfg.depth,
        "ffn_hidden": [cfg.ffn_hidden] * cfg.depth,
        "bits_per_token": cfg.codebook_dim,
        "sampling": dict(card.sampling),
    }


def _hart_count(gen, cfg_scale: float):
    """(the flop counter after one HART sampling with the full context, FLOPs per sampled scale) on a
    meta-device copy that runs ``gen``'s token policy. ``more_smooth`` off: the Gumbel mixing is a
    visualisation option, not part of the model's sampling cost."""
    from bench.models.hart import HART
    hart = gen.hart
    if hart.word_embed.weight.device.type != "meta":
        with torch.device("meta"):
            copy = HART(hart.cfg, type(gen.tokenizer)(hart.cfg.tokenizer))
        copy.token_policy, hart = hart.token_policy, copy
    cfg = hart.cfg
    ctx = torch.zeros(1, cfg.context_token, cfg.context_dim, device="meta")
    mask = torch.ones(1, cfg.context_token, dtype=torch.long, device="meta")
    marks = []
    with counting() as fc:
        hart.sample_tokens(ctx, mask, seed=None, cfg=cfg_scale, more_smooth=False,
                           logits_hook=lambda si, _: marks.append(fc.get_total_flops()))
    return fc, _shares(marks)


def hart_info(card, model=None, chain: Sequence[str] = ()) -> dict:
    """``varbench info --json`` of HART: transformer (with its residual diffusion head), tokenizer and
    text model parameters; FLOPs of one image with the full 300-token context (official: the prompt is
    padded to ``context_token`` and every position is processed). ``model``: the meta-device generator
    with a token method's policy installed (``chain`` names it; FLOPs are counted as the policy runs);
    default: the dense generator built from the card."""
    from bench.models.text import qwen2_params
    cfg = card.config()
    model = card.build("meta", cfg) if model is None else model
    with torch.device("meta"):
        with counting() as fc, torch.no_grad():
            model.tokenizer.fhat_to_img(torch.zeros(1, cfg.Cvae, cfg.patch_nums[-1], cfg.patch_nums[-1]))
    return {
        "model": card.name,
        "params": count_params(model.hart),
        "diffusion_head_params": count_params(model.hart.diffloss),
        "tokenizer_params": count_params(model.tokenizer),
        "text_encoder_params": qwen2_params(),
        "text_encoder": "Qwen2-1.5B config (assumed for Qwen2-VL-1.5B-Instruct, whose config is not verified)",
        "config_source": "checkpoint folder" if (card.folder() / "llm" / "config.json").is_file()
        else "documented guess (bench.models.hart_config.HARTConfig.hart_0_7b)",
        "flops": int(_hart_count(model, card.sampling["cfg"])[0].get_total_flops()),
        "flops_no_cfg": None,   # HART always runs the [cond; uncond] batch (official sampler)
        "tokenizer_decode_flops": int(fc.get_total_flops()),
        "text_tokens": cfg.context_token,
        "tokens_per_scale": [pn * pn for pn in cfg.patch_nums],
        "total_tokens": cfg.L,
        "image_size": cfg.image_size,
        "depth": cfg.depth,
        "width": cfg.embed_dim,
        "sampling": dict(card.sampling),
        **({"methods": list(chain)} if chain else {}),
    }
