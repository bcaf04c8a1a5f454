"""``varbench`` command line (DESIGN.md §5). Every subcommand explains itself with --help."""
from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

from bench.registry import REGISTRIES, UnknownNameError


def _cmd_list(args) -> int:
    reg = REGISTRIES[args.kind]
    for name in reg.names():
        print(name)
    return 0


def _human(n: float) -> str:
    for unit, div in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


def _cmd_info(args) -> int:
    from bench.accounting import info
    from bench.registry import MODELS

    card = MODELS.get(args.model)
    gen = card.build(device="meta")
    out = info(gen, name=args.model, image_size=card.image_size)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{out['model']}: depth {out['depth']}, width {out['width']}, {out['image_size']}px, "
          f"cosine attention {'on' if out['attn_l2_norm'] else 'off'}")
    print(f"  transformer parameters  {out['params']:,}")
    print(f"  tokenizer parameters    {out['tokenizer_params']:,}")
    print(f"  FLOPs / image (CFG)     {_human(out['flops'])}  ({out['flops']:,})")
    print(f"  FLOPs / image (no CFG)  {_human(out['flops_no_cfg'])}  ({out['flops_no_cfg']:,})")
    print(f"  VQVAE decode FLOPs      {_human(out['tokenizer_decode_flops'])}")
    print(f"  tokens per scale        {out['tokens_per_scale']}  (L = {out['total_tokens']})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="varbench",
        description="Reproducibility benchmark for compressing and accelerating next-scale VAR generators.",
        epilog="Examples:  varbench list models   |   varbench info var-d16 --json   |   make table2")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    sp = sub.add_parser("list", help="list registered models, methods, benches or tables")
    sp.add_argument("kind", choices=sorted(REGISTRIES), help="what to list")
    sp.set_defaults(func=_cmd_list)

    sp = sub.add_parser("info", help="exact parameter count, FLOPs per image and tokens per scale (no weights needed)",
                        description="Weight-free accounting on the meta device: exact transformer and tokenizer "
                                    "parameter counts, FLOPs to sample one image with and without the CFG doubling "
                                    "(torch.utils.flop_counter), and the token count of every scale.")
    sp.add_argument("model", help="registered model name (see `varbench list models`)")
    sp.add_argument("--json", action="store_true", help="print one JSON object (keys: DESIGN.md §5)")
    sp.set_defaults(func=_cmd_info)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UnknownNameError as e:
        print(f"varbench: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
