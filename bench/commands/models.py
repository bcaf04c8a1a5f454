"""``varbench list``, ``info`` (weight-free accounting) and ``sample`` (a picture grid of prompts)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.commands.common import device_for, human, prompt_models, takes_prompts
from bench.registry import REGISTRIES

NEEDS_TRANSFORMERS = "(install transformers: pip install 'varbench[t2i]')"


def cmd_list(args) -> int:
    reg = REGISTRIES[args.kind]
    for name in reg.names():
        print(name)
    return 0


def cmd_info(args) -> int:
    from bench.plan import check_chain_fits, requested_chain
    from bench.registry import MODELS

    card = MODELS.get(args.model)
    chain = requested_chain(args.method)     # names and parameters checked before any model is built
    kind = getattr(card, "kind", "c2i")
    if args.text_tokens is not None and kind != "t2i":   # a flag that would change nothing must not pass silently
        takes = ", ".join(n for n in MODELS.names() if getattr(MODELS.get(n), "kind", "c2i") == "t2i")
        why = "its text context is padded to a fixed length" if kind == "hart" else "it takes class labels, not prompts"
        raise ValueError(f"--text-tokens applies to the Infinity-class models ({takes}); {card.name}: {why}")
    if kind != "c2i":   # text-to-image families: their own accounting
        from bench.spec import resolve_chain
        check_chain_fits(card.name, resolve_chain(chain))
        return _INFO_BY_KIND[kind](args, card, chain)
    from bench.accounting import info
    from bench.method import Context, apply_chain
    from bench.spec import resolve_chain

    resolve_chain(chain)
    gen = card.build(device="meta")
    if chain:
        from bench.spec import SpecError
        try:  # structure-only methods (e.g. magnitude) run on the meta device: sizes need no weights
            gen = apply_chain(gen, chain, Context(progress=False))
        except SpecError:
            raise   # a bad parameter value: its own message says what to write
        except Exception as e:
            print(f"varbench: error: cannot account for {' + '.join(chain)} without weights or data "
                  f"({type(e).__name__}: {e}); `varbench run` records params and FLOPs of the real model.",
                  file=sys.stderr)
            return 2
    out = info(gen, name=args.model, image_size=card.image_size)
    if chain:
        out["methods"] = chain
    if args.json:
        print(json.dumps(out))
        return 0
    _print_info(out, f", cosine attention {'on' if out['attn_l2_norm'] else 'off'}", [
        ("transformer parameters", f"{out['params']:,}"),
        ("tokenizer parameters", f"{out['tokenizer_params']:,}"),
        ("FLOPs / image (CFG)", f"{human(out['flops'])}  ({out['flops']:,})"),
        ("FLOPs / image (no CFG)", f"{human(out['flops_no_cfg'])}  ({out['flops_no_cfg']:,})"),
        ("VQVAE decode FLOPs", human(out['tokenizer_decode_flops'])), _kv_row(out)])
    return 0


def _kv_row(out: dict):
    kv = out["kv_cache_values"]
    return ("KV cache (CFG)", f"{kv:,} values: {kv * 2 / 1e9:.3g} GB in bf16, {kv * 4 / 1e9:.3g} GB in fp32 "
                              f"(the tokens the sampler caches)")


def _print_info(out: dict, head: str, rows) -> None:
    """The human-readable `info`: the model line (+ ``head``), one aligned line per (label, text) row,
    the tokens per scale."""
    print(f"{out['model']}: depth {out['depth']}, width {out['width']}, {out['image_size']}px{head}")
    for label, text in rows:
        print(f"  {label:<23} {text}")
    print(f"  {'tokens per scale':<23} {out['tokens_per_scale']}  (L = {out['total_tokens']})")


def _on_meta(model, chain):
    """``model`` with ``chain`` applied, on the meta device as the sampler runs it: token methods
    leave the FLOPs of the kept tokens."""
    from bench.method import Context, apply_chain
    return apply_chain(model, chain, Context(progress=False))


def _info_t2i(args, card, chain=()) -> int:
    from bench.accounting import TEXT_TOKENS, t2i_info
    if args.text_tokens is None:
        args.text_tokens = min(TEXT_TOKENS, card.inf_cfg.text_maxlen)
    if not 1 <= args.text_tokens <= card.inf_cfg.text_maxlen:
        print(f"varbench: error: --text-tokens {args.text_tokens} is out of range [1, {card.inf_cfg.text_maxlen}] "
              f"for {card.name}", file=sys.stderr)
        return 2
    gen = card.build(device="meta", text=card.world == "tiny")
    if chain:
        gen = _on_meta(gen, chain)
    out = t2i_info(gen, card, text_tokens=args.text_tokens)
    if chain:
        out["methods"] = list(chain)
    if args.json:
        print(json.dumps(out))
        return 0
    by_op = out["flops_by_op"]
    # attention runs as batched matrix products (SDPA's math on the meta device); linears are addmm/mm
    attn = sum(v for k, v in by_op.items() if "attention" in k or k == "bmm")
    tp = out["text_encoder_params"]
    _print_info(out, f", {out['bits_per_token']} bits per token, {len(out['tokens_per_scale'])} scales", [
        ("transformer parameters", f"{out['params']:,}"),
        ("tokenizer parameters", f"{out['tokenizer_params']:,}"),
        ("text encoder parameters", f"{tp:,}" if tp is not None else NEEDS_TRANSFORMERS),
        ("FLOPs / image (CFG)", f"{human(out['flops'])}  ({out['flops']:,}; attention {human(attn)}), "
                                f"prompt of {out['text_tokens']} tokens"),
        ("FLOPs / image (no CFG)", f"{human(out['flops_no_cfg'])}  ({out['flops_no_cfg']:,})"),
        ("VAE decode FLOPs", human(out['tokenizer_decode_flops'])), _kv_row(out)])
    return 0


def _info_hart(args, card, chain=()) -> int:
    from bench.accounting import hart_info
    model = _on_meta(card.build("meta", card.config()), chain) if chain else None
    out = hart_info(card, model, chain)
    if args.json:
        print(json.dumps(out))
        return 0
    tp = out["text_encoder_params"]
    _print_info(out, f" (config: {out['config_source']})", [
        ("transformer parameters", f"{out['params']:,}  (residual diffusion head {out['diffusion_head_params']:,})"),
        ("tokenizer parameters", f"{out['tokenizer_params']:,}"),
        ("text model parameters", f"{tp:,}  ({out['text_encoder']})" if tp is not None else NEEDS_TRANSFORMERS),
        ("FLOPs / image (CFG)", f"{human(out['flops'])}  ({out['flops']:,}), context of {out['text_tokens']} tokens"),
        ("tokenizer decode FLOPs", human(out['tokenizer_decode_flops']))])
    return 0


_INFO_BY_KIND = {"t2i": _info_t2i, "hart": _info_hart}
GRID_FORMATS = (".png", ".jpg", ".jpeg", ".pdf", ".svg")   # what `varbench sample --out` may write


def cmd_sample(args) -> int:
    """Images for prompts, saved as one grid (prompts under the images) and optionally one PNG each."""
    from bench.registry import MODELS
    card = MODELS.get(args.model)
    if not takes_prompts(card):
        print(f"varbench: error: `varbench sample` takes a text-to-image model ({', '.join(prompt_models())}); "
              f"{card.name} is not one", file=sys.stderr)
        return 2
    if args.n < 1 or args.n > 64:
        print(f"varbench: error: --n {args.n} is out of range [1, 64]", file=sys.stderr)
        return 2
    from bench.io import check_writable_file
    check_writable_file(args.out, "--out", "grid.png")
    if Path(args.out).suffix.lower() not in GRID_FORMATS:   # matplotlib would add .png to a bare name
        raise ValueError(f"--out {args.out}: give an image file name ending in {', '.join(GRID_FORMATS)}")
    from bench.defaults import model_sampling
    sampling = model_sampling(card.sampling, {k: v for k, v in (("cfg", args.cfg), ("tau", args.tau), ("top_k", args.top_k),
                                                                ("top_p", args.top_p)) if v is not None}, card.name)
    if getattr(card, "text_cfg", None) is not None:   # tiny: check the words before loading anything
        from bench.models.text import WordTokenizer
        WordTokenizer(card.text_cfg.vocab, card.text_cfg.max_len)(args.prompt)
    from bench.image_grid import save_grid
    world = card.world
    gen = card(args.ckpt_dir, device=device_for(args, world)).eval()
    prompts = [p for p in args.prompt for _ in range(args.n)]
    imgs = gen.generate(prompts, seed=args.seed, **sampling)
    path = save_grid(imgs, prompts, args.out, cols=args.n)
    print(f"wrote {path}: {len(prompts)} image(s) of {card.name}, seed {args.seed}, "
          + ", ".join(f"{k} {v}" for k, v in sampling.items()))
    return 0
