"""``varbench`` command line (DESIGN.md §5). Every subcommand explains itself with --help."""
from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

from bench.defaults import DEFAULT_WORLD, WORLDS
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
    from bench.method import Context, apply_chain, parse_chain

    chain = parse_chain(args.method)
    if chain:
        try:  # structure-only methods (e.g. magnitude) run on the meta device: sizes need no weights
            gen = apply_chain(gen, chain, Context(progress=False))
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
    print(f"{out['model']}: depth {out['depth']}, width {out['width']}, {out['image_size']}px, "
          f"cosine attention {'on' if out['attn_l2_norm'] else 'off'}")
    print(f"  transformer parameters  {out['params']:,}")
    print(f"  tokenizer parameters    {out['tokenizer_params']:,}")
    print(f"  FLOPs / image (CFG)     {_human(out['flops'])}  ({out['flops']:,})")
    print(f"  FLOPs / image (no CFG)  {_human(out['flops_no_cfg'])}  ({out['flops_no_cfg']:,})")
    print(f"  VQVAE decode FLOPs      {_human(out['tokenizer_decode_flops'])}")
    print(f"  tokens per scale        {out['tokens_per_scale']}  (L = {out['total_tokens']})")
    return 0


def _sampling_overrides(args) -> dict:
    given = {"cfg": args.cfg, "top_k": args.top_k, "top_p": args.top_p}
    return {k: v for k, v in given.items() if v is not None}


def _cmd_run(args) -> int:
    from bench.method import parse_chain
    from bench.runner import make_spec, run

    spec = make_spec(args.model, parse_chain(args.method),
                     bench=args.bench, n=args.n, seed=args.seed, world=args.world,
                     sampling=_sampling_overrides(args))
    rec = run(spec, root=args.results, force=args.force, ckpt_dir=args.ckpt_dir, progress=not args.quiet)
    print(json.dumps({"run_id": rec["run_id"], "path": str(spec.path(args.results)),
                      "metrics": {k: v["value"] for k, v in rec["metrics"].items()},
                      "params": rec["cost"].get("params")}, indent=1))
    return 0


def _cmd_table(args) -> int:
    from bench.records import find_record
    from bench.registry import BENCHES, MODELS, TABLES
    from bench.render import load_spec, render
    from bench.runner import missing_methods, run

    world = args.world or DEFAULT_WORLD
    for name in TABLES.names() if args.name == "all" else [args.name]:
        spec = load_spec(name)
        bench = BENCHES.get(spec.bench_for(world))
        model_name = spec.model.get(world)
        sampling = {**(MODELS.get(model_name).sampling if model_name else {}), **_sampling_overrides(args)}
        n = args.n or spec.n.get(world) or bench.default_n
        # rows whose chain needs a method varbench does not have yet stay empty and say why
        row_notes = {}
        for row in spec.rows:
            missing = set() if spec.skip_reason(row, world) else \
                {m for g in spec.groups for m in missing_methods(spec.chain(row, g))}
            if missing:
                row_notes[row.label] = f"not computed: method(s) {', '.join(sorted(missing))} not implemented in varbench yet"
        records = {}
        for rs in spec.runs(world, n=n, seed=args.seed, sampling=sampling):   # deduplicated across rows and groups
            if missing_methods(rs.methods):
                continue
            if args.no_run:
                rec = find_record(rs, args.results)
            else:
                print(f"[{name}] {rs.label()}", file=sys.stderr)
                rec = run(rs, root=args.results, force=args.force, ckpt_dir=args.ckpt_dir, progress=not args.quiet)
            if rec is not None:
                records[rec["run_id"]] = rec
        out = render(spec, world, records, row_notes=row_notes, out_dir=args.out,
                     formats=tuple(args.format.split(",")), n=n, seed=args.seed, sampling=sampling)
        if "md" in out:
            print(out["md"])
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
    sp.add_argument("--method", default="", help="method chain applied first, e.g. 'magnitude:sparsity=0.4' "
                    "(structural methods only: no weights are loaded)")
    sp.add_argument("--json", action="store_true", help="print one JSON object (keys: DESIGN.md §5)")
    sp.set_defaults(func=_cmd_info)

    def common(sp):
        sp.add_argument("--world", choices=WORLDS, default=None, help="tiny (default; for `run` the "
                        "model's world): shipped tiny models and generated data; paper: official checkpoints and real data")
        sp.add_argument("--seed", type=int, default=0, help="run seed (sampling batches, bootstrap, recovery)")
        sp.add_argument("--n", type=int, default=None, help="images per run (default: the bench's protocol)")
        sp.add_argument("--results", default="results", help="record folder (default: results/)")
        sp.add_argument("--ckpt-dir", default=None, help="checkpoint folder (paper world; else $VARBENCH_CKPT_DIR)")
        sp.add_argument("--force", action="store_true", help="rerun even if a record exists")
        sp.add_argument("--quiet", action="store_true", help="no progress bars")
        sp.add_argument("--cfg", type=float, default=None, help="override the model's CFG scale (paper: 1.5)")
        sp.add_argument("--top-k", type=int, default=None, help="override top-k (paper: 900)")
        sp.add_argument("--top-p", type=float, default=None, help="override top-p (paper: 0.96)")

    sp = sub.add_parser("run", help="one run: model + method chain + bench -> one JSON record",
                        description="Apply a method chain to a model, sample the bench's images, score them and "
                                    "write one record to results/<world>/<model>/<bench>/<spec-hash>.json. "
                                    "An existing record is reused unless --force.")
    sp.add_argument("--model", required=True, help="registered model (varbench list models)")
    sp.add_argument("--method", default="", help="method chain joined by '+', e.g. 'magnitude:sparsity=0.4 + ft:epochs=1'")
    sp.add_argument("--bench", default=None, help="bench (default: shapes-c2i in the tiny world, imagenet256 in the paper world)")
    common(sp)
    sp.set_defaults(func=_cmd_run)

    sp = sub.add_parser("table", help="regenerate a paper table: run missing records, then render md/tex/json",
                        description="Runs every record the table needs that is missing (methods not yet in varbench "
                                    "leave their rows empty, with the reason as a footnote), then renders "
                                    "tables/out/<world>/NAME.{md,tex,json} and prints the Markdown.")
    sp.add_argument("name", help="table name (varbench list tables) or 'all'")
    sp.add_argument("--format", default="md,tex,json", help="comma-separated output formats")
    sp.add_argument("--out", default=None, help="output base folder (default: tables/out)")
    sp.add_argument("--no-run", action="store_true", help="render from existing records only")
    common(sp)
    sp.set_defaults(func=_cmd_table)

    sp = sub.add_parser("train-tiny", help="retrain the tiny world's models from scratch (make tiny-models)",
                        add_help=False)
    sp.set_defaults(func=None)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train-tiny"]:
        from bench.recipes.tiny import main as train_main
        return train_main(argv[1:])
    args = build_parser().parse_args(argv)
    from bench.checkpoint import CheckpointError
    try:
        return args.func(args)
    except (UnknownNameError, CheckpointError, FileNotFoundError, ValueError) as e:
        # what the user can fix (names, files, arguments): one clear message, no stack trace
        print(f"varbench: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
