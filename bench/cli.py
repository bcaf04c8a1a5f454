"""``varbench`` command line. Every subcommand explains itself with ``--help``.

``list``, ``runs`` and ``table --no-run`` read YAML and JSON only: they import no torch and no
model or method code. Errors a user can fix (names, files, arguments) are one line on stderr and
exit status 2; Ctrl-C is exit status 130 with one line saying what was (not) written.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, List, Optional

from bench.defaults import DEFAULT_WORLD, SAMPLING, SAMPLING_PARAMS, TINY_SAMPLING, WORLDS
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
    from bench.plan import check_chain_fits, requested_chain
    from bench.registry import MODELS

    card = MODELS.get(args.model)
    chain = requested_chain(args.method)     # names and parameters checked before any model is built
    kind = getattr(card, "kind", "c2i")
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
    print(f"{out['model']}: depth {out['depth']}, width {out['width']}, {out['image_size']}px, "
          f"cosine attention {'on' if out['attn_l2_norm'] else 'off'}")
    print(f"  transformer parameters  {out['params']:,}")
    print(f"  tokenizer parameters    {out['tokenizer_params']:,}")
    print(f"  FLOPs / image (CFG)     {_human(out['flops'])}  ({out['flops']:,})")
    print(f"  FLOPs / image (no CFG)  {_human(out['flops_no_cfg'])}  ({out['flops_no_cfg']:,})")
    print(f"  VQVAE decode FLOPs      {_human(out['tokenizer_decode_flops'])}")
    print(f"  tokens per scale        {out['tokens_per_scale']}  (L = {out['total_tokens']})")
    return 0


def _info_t2i(args, card, chain=()) -> int:
    from bench.accounting import TEXT_TOKENS, t2i_info
    if args.text_tokens is None:
        args.text_tokens = min(TEXT_TOKENS, card.inf_cfg.text_maxlen)
    if not 1 <= args.text_tokens <= card.inf_cfg.text_maxlen:
        print(f"varbench: error: --text-tokens {args.text_tokens} is out of range [1, {card.inf_cfg.text_maxlen}] "
              f"for {card.name}", file=sys.stderr)
        return 2
    gen = card.build(device="meta", text=card.world == "tiny")
    if chain:   # token methods run on the meta device as the sampler does: FLOPs of the kept tokens
        from bench.method import Context, apply_chain
        gen = apply_chain(gen, chain, Context(progress=False))
    out = t2i_info(gen, card, text_tokens=args.text_tokens)
    if chain:
        out["methods"] = list(chain)
    if args.json:
        print(json.dumps(out))
        return 0
    by_op = out["flops_by_op"]
    # attention runs as batched matrix products (SDPA's math on the meta device); linears are addmm/mm
    attn = sum(v for k, v in by_op.items() if "attention" in k or k == "bmm")
    print(f"{out['model']}: depth {out['depth']}, width {out['width']}, {out['image_size']}px, "
          f"{out['bits_per_token']} bits per token, {len(out['tokens_per_scale'])} scales")
    print(f"  transformer parameters  {out['params']:,}")
    print(f"  tokenizer parameters    {out['tokenizer_params']:,}")
    tp = out["text_encoder_params"]
    print(f"  text encoder parameters {tp:,}" if tp is not None else
          "  text encoder parameters (install transformers: pip install 'varbench[t2i]')")
    print(f"  FLOPs / image (CFG)     {_human(out['flops'])}  ({out['flops']:,}; attention {_human(attn)}), "
          f"prompt of {out['text_tokens']} tokens")
    print(f"  FLOPs / image (no CFG)  {_human(out['flops_no_cfg'])}  ({out['flops_no_cfg']:,})")
    print(f"  VAE decode FLOPs        {_human(out['tokenizer_decode_flops'])}")
    print(f"  tokens per scale        {out['tokens_per_scale']}  (L = {out['total_tokens']})")
    return 0


def _info_hart(args, card, chain=()) -> int:
    from bench.accounting import hart_info
    model = None
    if chain:   # token methods run on the meta device as the sampler does: FLOPs of the kept tokens
        from bench.method import Context, apply_chain
        model = apply_chain(card.build("meta", card.config()), chain, Context(progress=False))
    out = hart_info(card, model, chain)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{out['model']}: depth {out['depth']}, width {out['width']}, {out['image_size']}px "
          f"(config: {out['config_source']})")
    print(f"  transformer parameters  {out['params']:,}  (residual diffusion head {out['diffusion_head_params']:,})")
    print(f"  tokenizer parameters    {out['tokenizer_params']:,}")
    tp = out["text_encoder_params"]
    print(f"  text model parameters   {tp:,}  ({out['text_encoder']})" if tp is not None else
          "  text model parameters   (install transformers: pip install 'varbench[t2i]')")
    print(f"  FLOPs / image (CFG)     {_human(out['flops'])}  ({out['flops']:,}), context of {out['text_tokens']} tokens")
    print(f"  tokenizer decode FLOPs  {_human(out['tokenizer_decode_flops'])}")
    print(f"  tokens per scale        {out['tokens_per_scale']}  (L = {out['total_tokens']})")
    return 0


_INFO_BY_KIND = {"t2i": _info_t2i, "hart": _info_hart}


def _cmd_sample(args) -> int:
    """Images for prompts, saved as one grid (prompts under the images) and optionally one PNG each."""
    from bench.registry import MODELS
    card = MODELS.get(args.model)
    if not _takes_prompts(card):
        print(f"varbench: error: `varbench sample` takes a text-to-image model ({', '.join(_prompt_models())}); "
              f"{card.name} is not one", file=sys.stderr)
        return 2
    if args.n < 1 or args.n > 64:
        print(f"varbench: error: --n {args.n} is out of range [1, 64]", file=sys.stderr)
        return 2
    from bench.defaults import model_sampling
    sampling = model_sampling(card.sampling, {k: v for k, v in (("cfg", args.cfg), ("tau", args.tau), ("top_k", args.top_k),
                                                                ("top_p", args.top_p)) if v is not None}, card.name)
    if getattr(card, "text_cfg", None) is not None:   # tiny: check the words before loading anything
        from bench.models.text import WordTokenizer
        WordTokenizer(card.text_cfg.vocab, card.text_cfg.max_len)(args.prompt)
    from bench.image_grid import save_grid
    world = card.world
    gen = card(args.ckpt_dir, device=_device(args, world)).eval()
    prompts = [p for p in args.prompt for _ in range(args.n)]
    imgs = gen.generate(prompts, seed=args.seed, **sampling)
    save_grid(imgs, prompts, args.out, cols=args.n)
    print(f"wrote {args.out}: {len(prompts)} image(s) of {card.name}, seed {args.seed}, "
          + ", ".join(f"{k} {v}" for k, v in sampling.items()))
    return 0


def _takes_prompts(card) -> bool:
    from bench.plan import CONDITIONS
    return CONDITIONS[getattr(card, "kind", "c2i")] == "prompts"


def _prompt_models() -> list:
    from bench.registry import MODELS
    return [n for n in MODELS.names() if _takes_prompts(MODELS.get(n))]


def _sampling_overrides(args) -> dict:
    given = {"cfg": args.cfg, "top_k": args.top_k, "top_p": args.top_p}
    return {k: v for k, v in given.items() if v is not None}


def _device(args, world: str) -> str:
    """--device, else cuda for the paper world when there is one, else cpu (checked before any work)."""
    import torch
    dev = args.device or ("cuda" if world == "paper" and torch.cuda.is_available() else "cpu")
    try:
        d = torch.device(dev)
    except RuntimeError as e:
        raise ValueError(f"--device {dev!r}: {e}") from None
    if d.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {dev}: CUDA is not available on this machine (use --device cpu)")
    return dev


def _cmd_run(args) -> int:
    from bench.plan import make_spec
    from bench.registry import BENCHES

    if args.bench and BENCHES.get(args.bench).kind != "images":
        raise ValueError(f"--bench {args.bench} is not an image bench: run it with `varbench {args.bench}`")
    spec = make_spec(args.model, args.method, bench=args.bench, n=args.n, seed=args.seed, world=args.world,
                     sampling=_sampling_overrides(args), ckpt_dir=args.ckpt_dir,
                     bench_args={"fidelity": True} if args.fidelity else None)
    from bench.runner import run

    rec = run(spec, root=args.results, force=args.force, ckpt_dir=args.ckpt_dir, progress=not args.quiet,
              device=_device(args, spec.world))
    from bench.shard import rank
    if rank() != 0:                     # torchrun: every rank returns the record; one prints it
        return 0
    print(json.dumps({"run_id": rec["run_id"], "path": str(spec.path(args.results)),
                      "methods": rec["spec"]["methods"],
                      "metrics": {k: v["value"] for k, v in rec["metrics"].items()},
                      "params": rec["cost"].get("params")}, indent=1))
    return 0


def _cmd_sweep(args) -> int:
    """Expand a sweep file (bench/sweep.py), list the cells, then run the unfinished ones or emit their
    command lines. Under torchrun every rank walks the same cells and each run is sharded."""
    import pandas as pd

    from bench import sweep
    from bench.io import atomic_write_text, check_writable_dir

    plan_only = args.dry_run or args.emit_commands is not None
    grid = sweep.load(args.spec, world=args.world)
    specs, repeats = sweep.expand(grid, ckpt_dir=args.ckpt_dir, need_ckpt=not plan_only)
    done = sweep.finished(specs, args.results)
    todo = [s for s, d in zip(specs, done) if not d]
    from bench.shard import rank
    main_rank = rank() == 0
    if main_rank:
        with pd.option_context("display.max_rows", None, "display.max_columns", None, "display.width", 200,
                               "display.max_colwidth", 60):
            print(sweep.frame(specs, done).to_string(index=False))
        print(f"{len(specs)} cells: {len(specs) - len(todo)} done, {len(todo)} to run"
              + (f" ({repeats} repeated an earlier cell's run)" if repeats else ""), file=sys.stderr)
    if args.emit_commands is not None:
        lines = [sweep.command(s, args.results, args.ckpt_dir, args.device) for s in todo]
        atomic_write_text(args.emit_commands, "".join(line + "\n" for line in lines))
        print(f"wrote {len(lines)} command(s) to {args.emit_commands} (one per line: "
              f"sed -n \"${{SLURM_ARRAY_TASK_ID}}p\" {args.emit_commands} | bash, array 1-{len(lines)})", file=sys.stderr)
    if plan_only or not todo:
        return 0
    from tqdm.auto import tqdm

    from bench.resources import results_root
    from bench.runner import preflight, run
    root = check_writable_dir(results_root(args.results), "results folder")
    for spec in todo:
        preflight(spec, root)
    bar = tqdm(todo, desc="sweep", unit="run", disable=args.quiet or not main_rank)
    for spec in bar:
        bar.set_postfix_str(spec.label())
        run(spec, root=root, ckpt_dir=args.ckpt_dir, progress=not args.quiet and main_rank,
            device=_device(args, spec.world))
    if main_rank:
        print(f"ran {len(todo)} cell(s); records under {root}", file=sys.stderr)
    return 0


def _records(root, world) -> dict:
    """path -> record under ``root`` (``{}`` if the folder does not exist); unreadable files are reported."""
    from bench.records import iter_records

    def warn(path, err):
        print(f"varbench: warning: skipped unreadable record {err}", file=sys.stderr)
    return {str(p): r for p, r in iter_records(root, world, on_error=warn)} if root.is_dir() else {}


def _cmd_table(args) -> int:
    from bench.io import check_writable_dir
    from bench.plan import match_records, table_cells, unique_specs
    from bench.registry import TABLES
    from bench.render import check_formats, load_spec, render
    from bench.resources import results_root, tables_out_dir

    world = args.world or DEFAULT_WORLD
    formats = check_formats(args.format.split(","))
    names = TABLES.names() if args.name == "all" else [args.name]
    specs = [load_spec(name) for name in names]               # every name checked before any work
    root = results_root(args.results)
    if root.exists() and not root.is_dir():
        raise ValueError(f"--results {root} is a file, not a folder of records")
    if args.no_run and not root.is_dir():
        raise ValueError(f"no records: results folder {root.resolve()} does not exist "
                         f"(run without --no-run, or point --results / VARBENCH_RESULTS at your records)")
    out_dir = check_writable_dir(tables_out_dir(args.out), "table output folder")
    if args.weight_free and args.no_run:
        raise ValueError("--weight-free computes accounting records; it cannot be combined with --no-run")
    if not args.no_run:
        check_writable_dir(root, "results folder")
    for spec in specs:
        cells = table_cells(spec, world, n=args.n, seed=args.seed, sampling=_sampling_overrides(args),
                            ckpt_dir=args.ckpt_dir, need_ckpt=not (args.no_run or args.weight_free))
        runs = unique_specs(cells)
        if args.weight_free:
            from bench.runner import account
            for i, rs in enumerate(runs):
                print(f"[{spec.name} {i + 1}/{len(runs)}] weight-free accounting of {rs.label()}", file=sys.stderr)
                account(rs, root)
        elif not args.no_run:
            import platform

            from bench.registry import BENCHES
            from bench.runner import preflight, run
            for rs in runs:
                preflight(rs, root)
            timed: Dict[str, list] = {}   # latency cells of one model and setting: timed together, alternated
            for i, rs in enumerate(runs):
                print(f"[{spec.name} {i + 1}/{len(runs)}] {rs.label()}", file=sys.stderr)
                if (rs.protocol or {}).get("device") == "coreml" and platform.system() != "Darwin":
                    print(f"  not run: Core ML latency and op placement need macOS (this is "
                          f"{platform.system()}); `--weight-free` fills the package op counts", file=sys.stderr)
                    continue
                if BENCHES.get(rs.bench).kind == "timing":
                    print("  timed below, alternated with the table's other configurations of this setting",
                          file=sys.stderr)
                    timed.setdefault(json.dumps([rs.model, rs.n, rs.seed, rs.protocol], sort_keys=True), []).append(rs)
                    continue
                run(rs, root=root, force=args.force, ckpt_dir=args.ckpt_dir, progress=not args.quiet,
                    device=_device(args, world))
            if timed:
                from bench.latency import run_latency
                for specs in timed.values():
                    # one measurement run: speed-ups are ratios of medians timed side by side
                    print(f"[{spec.name}] timing {len(specs)} configurations of {specs[0].model} together",
                          file=sys.stderr)
                    run_latency(specs, root=root, ckpt_dir=args.ckpt_dir, force=args.force, progress=not args.quiet)
        from bench.records import load_accounting
        records = {r["run_id"]: r for r in _records(root, world).values()}
        found, stale = match_records(runs, records)
        if args.no_run:
            for rs in runs:
                if rs.key() not in found:
                    why = " (stale records exist: `varbench runs --stale`)" if rs.key() in stale else ""
                    print(f"varbench: no record for {rs.label()}{why}", file=sys.stderr)
        out = render(spec, world, cells, found, stale, out_dir=out_dir, formats=formats, force=args.force,
                     accounting=load_accounting(root, world))
        if formats == ("json",):
            print(json.dumps(out["json"], indent=2, ensure_ascii=False))
        elif "md" in formats:
            print(out["md"])
        else:
            print(out["tex"])
    return 0


def _cmd_latency(args) -> int:
    from bench.plan import requested_chain
    from bench.registry import MODELS
    card = MODELS.get(args.model)
    world = args.world or card.world
    coreml = (args.device or "") == "coreml"
    if coreml:
        from bench.coreml import require_macos
        require_macos("--device coreml (latency and op placement per compute unit)")
        if args.compile:
            raise ValueError("--compile applies to PyTorch devices, not --device coreml")
    elif args.compute_units:
        raise ValueError("--compute-units applies to --device coreml only")
    device = "coreml" if coreml else _device(args, world)
    chains = [" + ".join(requested_chain(m)) or "dense" for m in (args.method or ["dense"])]
    if len(set(chains)) != len(chains):
        raise ValueError(f"--method given twice with the same chain: {chains}")
    from bench.latency import latency_specs, report, run_latency
    setting = dict(device=device, batch=args.batch, threads=args.threads, compile=args.compile, warmup=args.warmup)
    specs, labels = [], []
    for cu in ((args.compute_units or ["CPU_AND_NE", "ALL", "CPU_AND_GPU"]) if coreml else [None]):
        extra = dict(compute_units=cu, precision=args.precision) if coreml else {}
        specs += latency_specs(args.model, chains, args.reps, args.seed, {**setting, **extra}, world=world,
                               ckpt_dir=args.ckpt_dir, random_weights=args.random_weights,
                               sampling=_sampling_overrides(args))
        labels += [c + (f" @ {cu}" if cu else "") for c in chains]
    records = run_latency(specs, root=args.results, ckpt_dir=args.ckpt_dir, force=args.force,
                          progress=not args.quiet)
    from bench.shard import rank
    if rank() != 0:                     # torchrun: rank 0 timed alone and reports
        return 0
    print(report(specs, records, labels))
    for spec in specs:
        print(f"record: {spec.path(args.results)}")
    return 0


def _cmd_coreml(args) -> int:
    if args.action == "ops":
        from bench.coreml import op_counts, total_ops, weights_bytes
        counts = op_counts(args.package)
        if args.json:
            print(json.dumps({"functions": counts, "weights_bytes": weights_bytes(args.package)}))
            return 0
        total = {}
        for ops in counts.values():
            for t, n in ops.items():
                total[t] = total.get(t, 0) + n
        names = list(counts)
        print(f"{args.package}: {len(names)} functions, weights {weights_bytes(args.package) / 2 ** 20:.2f} MiB")
        print(f"{'op type':22s} {'total':>7s} " + " ".join(f"{n[:9]:>9s}" for n in names))
        for t in sorted(total, key=lambda k: (-total[k], k)):
            print(f"{t:22s} {total[t]:7d} " + " ".join(f"{counts[n].get(t, 0):9d}" for n in names))
        non_const = {n: total_ops({n: ops}) for n, ops in counts.items()}
        print(f"{'ops (without const)':22s} {total_ops(counts):7d} " + " ".join(f"{non_const[n]:9d}" for n in names))
        return 0
    # export
    from bench.plan import RANDOM_CKPT, make_spec
    out = args.out
    if not str(out).endswith(".mlpackage"):
        raise ValueError(f"--out {out}: a Core ML package path must end in .mlpackage")
    if args.batch < 1:
        raise ValueError(f"--batch {args.batch}: must be ≥ 1")
    spec = make_spec(args.model, args.method, bench="latency", n=3, seed=args.seed, world=args.world,
                     ckpt_dir=args.ckpt_dir, need_ckpt=not args.random_weights)
    if args.random_weights:
        import dataclasses
        spec = dataclasses.replace(spec, ckpt={RANDOM_CKPT: f"torch.manual_seed({args.seed})"})
    from bench.coreml import _ct, export, op_counts, total_ops, weights_bytes
    _ct()   # coremltools present, before any model work
    from bench.runner import prepared_generator
    gen, ctx, _ = prepared_generator(spec, "cpu", args.ckpt_dir, progress=not args.quiet)
    meta = {"model": spec.model, "methods": list(spec.methods), "ckpt": spec.ckpt, "batch": args.batch,
            "precision": args.precision, "patch_nums": list(gen.patch_nums), "notes": ctx.notes}
    path = export(gen, out, batch=args.batch, precision=args.precision, progress=not args.quiet, metadata=meta)
    counts = op_counts(path)
    print(f"wrote {path}: functions {', '.join(counts)}; "
          f"{total_ops(counts)} ops (without const), "
          f"weights {weights_bytes(path) / 2 ** 20:.2f} MiB ({args.precision})")
    return 0


def _cmd_figures(args) -> int:
    from bench.figures import figure_names, render
    names = figure_names() if args.names in ([], ["all"]) else args.names
    world = args.world or DEFAULT_WORLD
    failed = 0
    for name in names:
        try:
            paths = render(name, world=world, root=args.results, out=args.out)
        except ValueError as e:
            if len(names) == 1:
                raise
            print(f"varbench: {e}", file=sys.stderr)   # `all`: say which figure has no data, go on
            failed += 1
            continue
        print("wrote " + " ".join(str(p) for p in paths))
    if failed and len(names) > 1:
        print(f"varbench: {failed} of {len(names)} figures not drawn (above: the records each needs)", file=sys.stderr)
    return 2 if failed == len(names) else 0


def _cmd_leaderboard(args) -> int:
    """Records only (the loader of `varbench runs`), no torch: see bench/leaderboard.py for the rules."""
    from bench import leaderboard
    from bench.io import check_writable_dir
    from bench.resources import results_root, tables_out_dir

    world = args.world or DEFAULT_WORLD
    root = results_root(args.results)
    if root.exists() and not root.is_dir():
        raise ValueError(f"--results {root} is a file, not a folder of records")
    board = leaderboard.build(_records(root, world), world, sort=args.sort, ckpt_dir=args.ckpt_dir, root=root)
    out_dir = check_writable_dir(tables_out_dir(args.out), "leaderboard output folder")
    paths = leaderboard.write(board, out_dir)
    print(paths["md"].read_text(encoding="utf-8"), end="")
    print(f"wrote {', '.join(str(p) for p in paths.values())} ({board['records']} current records"
          + (f"; {board['stale']} stale not shown" if board["stale"] else "") + ")", file=sys.stderr)
    return 0


def _geneval_print(metrics: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(metrics, indent=1))
        return
    for k, v in metrics.items():
        print(f"{k:28s} {v:.4f}")


def _folder_bench(name: str, method: str, article: str, what: str):
    """The bench ``name`` if it has ``method`` (its folder workflow), else an error naming those that do."""
    from bench.registry import BENCHES
    cls = BENCHES.get(name)
    if not hasattr(cls, method):
        fits = [b for b in BENCHES.names() if hasattr(BENCHES.get(b), method)]
        raise ValueError(f"--bench {name} is not {article} {what} bench; {what} benches: {', '.join(fits)}")
    return cls()


def _geneval_bench(name: str):
    return _folder_bench(name, "rows", "a", "GenEval")


def _folder_generator(args, bench):
    """(generator, sampling settings) of ``--model`` (default: the bench's) for a folder's images."""
    from bench.defaults import model_sampling
    from bench.registry import MODELS
    card = MODELS.get(args.model or bench.model)
    if not _takes_prompts(card):
        raise ValueError(f"--model {card.name} is not a text-to-image model ({', '.join(_prompt_models())})")
    sampling = model_sampling(card.sampling, _sampling_overrides(args), card.name)
    return card(args.ckpt_dir, device=_device(args, card.world)).eval(), sampling


def _cmd_geneval_import(args) -> int:
    from bench.metrics.geneval import read_results, summary
    _geneval_print(summary(read_results(args.results_jsonl)), args.json)
    return 0


def _cmd_geneval_score(args) -> int:
    from bench.benches.geneval import score_folder
    from bench.metrics.geneval import summary
    bench = _geneval_bench(args.bench)
    bad = [o for o in args.options if "=" not in o]
    if bad:
        raise ValueError(f"--options {' '.join(bad)}: give KEY=VALUE, e.g. --options threshold=0.3")
    opts = dict(o.split("=", 1) for o in args.options)
    df = score_folder(args.folder, bench.detector(), options=opts, progress=not args.quiet)
    if args.out:
        from bench.io import atomic_write_text
        atomic_write_text(args.out, df.to_json(orient="records", lines=True))
    _geneval_print(summary(df), args.json)
    return 0


def _cmd_geneval_generate(args) -> int:
    from bench.benches.geneval import IMAGES_PER_PROMPT, generate_folder
    bench = _geneval_bench(args.bench)
    rows = bench.rows()
    gen, sampling = _folder_generator(args, bench)
    done = generate_folder(gen, rows, args.out, args.seed, sampling, IMAGES_PER_PROMPT, progress=not args.quiet)
    print(f"{args.out}: {done} prompt(s) generated now, {len(rows) - done} already there; "
          f"score it with `varbench geneval score {args.out} --bench {bench.name}`")
    return 0


def _mjhq_bench(name: str):
    return _folder_bench(name, "prompt_table", "an", "MJHQ")


def _cmd_mjhq_generate(args) -> int:
    from bench.benches.mjhq import generate_folder
    bench = _mjhq_bench(args.bench)
    n = bench.check_n(args.n if args.n is not None else bench.default_n)
    bench.preflight()
    gen, sampling = _folder_generator(args, bench)
    done = generate_folder(gen, bench, args.out, n, args.seed, sampling, progress=not args.quiet)
    print(f"{args.out}: {done} image(s) generated now, {n - done} already there; score it with "
          f"`varbench mjhq score {args.out} --bench {bench.name} --n {n}`")
    return 0


def _cmd_mjhq_score(args) -> int:
    from bench.benches.mjhq import score_folder
    from bench.runner import sample_features
    bench = _mjhq_bench(args.bench)
    n = bench.check_n(args.n if args.n is not None else bench.default_n)
    bench.preflight()
    metrics = score_folder(bench, args.folder, n, sample_features, progress=not args.quiet)
    if args.json:
        print(json.dumps(metrics, indent=1))
    else:
        for k, v in metrics.items():
            print(f"{k:28s} {v['value']:.4f}")
    return 0


def _cmd_runs(args) -> int:
    import pandas as pd

    from bench.leaderboard import records_frame
    from bench.resources import results_root

    root = results_root(args.results)
    if root.exists() and not root.is_dir():
        raise ValueError(f"--results {root} is a file, not a folder of records")
    full = records_frame(_records(root, args.world), ckpt_dir=args.ckpt_dir)   # the leaderboard's frame
    df = pd.DataFrame()
    if len(full):
        now = pd.Timestamp.now(tz="UTC")
        shown = [m for m in ("fid", "is", "class_acc", "geneval", "fid_star") if m in full]
        setting = ["setting"] if full["setting"].astype(bool).any() else []   # e.g. fidelity=True, latency's device
        df = full[["run_id", "world", "model", "bench", "label", *setting, "n", "seed", *shown]].rename(
            columns={"label": "methods"})
        df[shown] = df[shown].round(4)
        df["age"] = [_age((now - pd.Timestamp(c)).total_seconds()) for c in full["created"]]
        df[["stale", "why", "path"]] = full[["stale", "why", "path"]]
    if args.stale or args.prune_stale:
        df = df[df["stale"]] if len(df) else df
    if args.json:
        print(df.to_json(orient="records", indent=1))
    elif len(df) == 0:
        print(f"no {'stale ' if args.stale or args.prune_stale else ''}records under {root}")
    else:
        with pd.option_context("display.max_rows", None, "display.max_columns", None, "display.width", 200,
                               "display.max_colwidth", 60):
            print(df.drop(columns=["path"]).to_string(index=False))
    if args.prune_stale and len(df):
        if not args.yes:
            if not sys.stdin.isatty():
                raise ValueError(f"--prune-stale would delete {len(df)} record(s); confirm with --yes "
                                 f"(standard input is not a terminal)")
            answer = input(f"delete these {len(df)} stale record(s)? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                print("nothing deleted")
                return 0
        from pathlib import Path
        for p in df["path"]:
            Path(p).unlink()
        print(f"deleted {len(df)} stale record(s)")
    return 0


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def _seed(text: str) -> int:
    from bench.defaults import check_seed
    try:
        return check_seed(int(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).replace("--seed ", "")) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="varbench",
        description="Reproducibility benchmark for compressing and accelerating next-scale VAR generators.",
        epilog="Examples:  varbench list models   |   varbench info var-d16 --json   |   "
               "varbench table evar-table2   |   varbench runs --stale")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    sp = sub.add_parser("list", help="list registered models, methods, benches, metrics or tables")
    sp.add_argument("kind", choices=sorted(REGISTRIES), help="what to list")
    sp.set_defaults(func=_cmd_list)

    sp = sub.add_parser("info", help="exact parameter count, FLOPs per image and tokens per scale (no weights needed)",
                        description="Weight-free accounting on the meta device: exact transformer and tokenizer "
                                    "parameter counts, FLOPs to sample one image with and without the CFG doubling "
                                    "(torch.utils.flop_counter), and the token count of every scale.")
    sp.add_argument("model", help="registered model name (see `varbench list models`)")
    sp.add_argument("--method", default=None, help="method chain applied first, e.g. 'magnitude:sparsity=0.4' "
                    "(structural methods only: no weights are loaded)")
    sp.add_argument("--json", action="store_true", help="print one JSON object: model, params, tokenizer_params, "
                    "flops, flops_no_cfg, tokens_per_scale, ...")
    sp.add_argument("--text-tokens", type=int, default=None, metavar="T",
                    help="Infinity-class models: prompt length in text-encoder tokens for the FLOP count "
                         "(default 32, or the model's longest prompt if shorter)")
    sp.set_defaults(func=_cmd_info)

    def results(sp):
        sp.add_argument("--results", default=None, help="record folder (default: $VARBENCH_RESULTS, else ./results)")
        sp.add_argument("--ckpt-dir", default=None, help="checkpoint folder (paper world; else $VARBENCH_CKPT_DIR)")

    def sampling_flags(sp):
        for key, flag in (("cfg", "--cfg"), ("top_k", "--top-k"), ("top_p", "--top-p")):
            typ, lo, hi, what = SAMPLING_PARAMS[key]
            sp.add_argument(flag, type=typ, default=None,
                            help=f"{what}; [{lo}, {hi}] (default: the model's, paper {SAMPLING[key]}, tiny {TINY_SAMPLING[key]})")

    def common(sp):
        sp.add_argument("--world", choices=WORLDS, default=None, help="tiny (default; for `run` the "
                        "model's world): shipped tiny models and generated data; paper: official checkpoints and real data")
        sp.add_argument("--seed", type=_seed, default=0, help="run seed, 0 … 2^32-1 (sampling batches, bootstrap, recovery)")
        sp.add_argument("--n", type=int, default=None, help="images per run, a positive multiple of the bench's "
                        "classes (default: the table's or the bench's protocol)")
        results(sp)
        sp.add_argument("--force", action="store_true", help="rerun even if a record exists (table: also "
                        "replace a rendered table by an empty one)")
        sp.add_argument("--quiet", action="store_true", help="no progress bars")
        sp.add_argument("--device", default=None, help="torch device for runs, e.g. cpu, cuda, cuda:1 (default: cuda "
                        "in the paper world when available, else cpu; the tiny world's shipped numbers are CPU runs)")
        sampling_flags(sp)

    sp = sub.add_parser("sample", help="images for prompts from a text-to-image model, as a grid with the prompts",
                        description="Sample a text-to-image model (same seed, same images) and save a PNG grid: "
                                    "one row per prompt, --n samples each, the prompt under every image.")
    sp.add_argument("model", help="tiny-t2i, or infinity-2b with its checkpoints and text encoder")
    sp.add_argument("--prompt", action="append", required=True, help="a prompt (repeat for several)")
    sp.add_argument("--out", required=True, help="output PNG (the grid)")
    sp.add_argument("--n", type=int, default=4, help="samples per prompt (1–64, default 4)")
    sp.add_argument("--seed", type=_seed, default=0, help="sampling seed (one generator for the batch)")
    sp.add_argument("--cfg", type=float, default=None, help="guidance (constant across scales); default: the model's")
    sp.add_argument("--tau", type=float, default=None, help="temperature; default: the model's")
    sp.add_argument("--top-k", type=int, default=None, help="top-k per bit (2 classes: ≥ 2 is a no-op)")
    sp.add_argument("--top-p", type=float, default=None, help="top-p per bit")
    sp.add_argument("--ckpt-dir", default=None, help="checkpoint folder (paper world)")
    sp.add_argument("--device", default=None, help="cpu or cuda (default: cuda for the paper world when present)")
    sp.set_defaults(func=_cmd_sample)

    sp = sub.add_parser("run", help="one run: model + method chain + bench -> one JSON record",
                        description="Apply a method chain to a model, sample the bench's images, score them and "
                                    "write one record to <results>/<world>/<model>/<bench>/<spec-hash>.json. "
                                    "The hash covers the resolved chain (defaults filled in), each method's "
                                    "version, the checkpoint files' sha256, the bench protocol, n, seed and "
                                    "sampling. An existing record is reused unless --force. Launched as "
                                    "`torchrun --nproc_per_node=N -m bench -- run ...`, sampling is split over the "
                                    "ranks and the record is the same (docs/sharding.md).")
    sp.add_argument("--model", required=True, help="registered model (varbench list models)")
    sp.add_argument("--method", default=None, help="method chain joined by '+', e.g. 'magnitude:sparsity=0.4 + ft:epochs=1' "
                    "(default: dense, the unmodified model)")
    sp.add_argument("--bench", default=None, help="bench (default: shapes-c2i in the tiny world, imagenet256 in the paper world)")
    sp.add_argument("--fidelity", action="store_true",
                    help="also compare with the unmodified model's images on the same conditions and seeds: FID* "
                         "(per category on MJHQ benches), PSNR, SSIM. The original's images are sampled once and "
                         "cached under <results>/<world>/<model>/<bench>/_originals/ for every method")
    common(sp)
    sp.set_defaults(func=_cmd_run)

    sp = sub.add_parser("sweep", help="a grid of models × methods × benches × seeds from a YAML file: run the "
                        "cells without a record, or emit their command lines",
                        description="Expands the sweep file into exact run specs (the keys `varbench run` would "
                                    "give), lists every cell as done (its record exists) or todo, then runs the "
                                    "todo cells in order. --emit-commands writes one `varbench run ...` line per "
                                    "todo cell instead (a Slurm array: docs/sharding.md). Format: bench/sweep.py; "
                                    "example: sweeps/tiny-example.yaml.")
    sp.add_argument("spec", help="sweep file (YAML)")
    sp.add_argument("--world", choices=WORLDS, default=None, help="overrides the file's world (default: the "
                    "file's, else each model's)")
    sp.add_argument("--dry-run", action="store_true", help="list the cells and run nothing")
    sp.add_argument("--emit-commands", default=None, metavar="FILE", help="write one `varbench run ...` line per "
                    "todo cell to FILE and run nothing")
    results(sp)
    sp.add_argument("--device", default=None, help="torch device for the runs (default as `varbench run`); "
                    "also written into emitted commands")
    sp.add_argument("--quiet", action="store_true", help="no progress bars")
    sp.set_defaults(func=_cmd_sweep)

    sp = sub.add_parser("table", help="regenerate a paper table: run missing records, then render md/tex/json",
                        description="Runs every record the table needs that is missing (methods not yet in varbench "
                                    "leave their rows empty, with the reason as a footnote), then renders "
                                    "<out>/<world>/NAME.{md,tex,json} and prints it. With --no-run nothing is run "
                                    "(and no torch is imported): missing and stale records are listed on stderr.")
    sp.add_argument("name", help="table name (varbench list tables) or 'all'")
    sp.add_argument("--format", default="md,tex,json", help="comma-separated subset of md,tex,json (printed: md, "
                    "else tex, else json)")
    sp.add_argument("--out", default=None, help="output base folder (default: $VARBENCH_TABLES_OUT, else ./tables/out)")
    sp.add_argument("--no-run", action="store_true", help="render from existing records only")
    sp.add_argument("--weight-free", action="store_true",
                    help="run nothing: measure only the params/FLOPs of every cell on the meta device (no "
                         "checkpoints or data needed, any world), write them as accounting records and render; "
                         "cells with a run record keep its numbers")
    common(sp)
    sp.set_defaults(func=_cmd_table)

    sp = sub.add_parser("latency", help="time full generations (all scales, CFG, decode) of a model with method "
                        "chains, alternated; one record each",
                        description="Times one full class-conditional generation of --batch images (every scale, "
                                    "CFG on, VQVAE decode included) after --warmup untimed ones, --reps times per "
                                    "configuration. Several --method options are compared in one run, alternated "
                                    "(order rotated per repetition); ratios are ratios of medians. Prints median, "
                                    "IQR, p90, a 95% bootstrap CI of the median, images/s, peak memory, a "
                                    "per-scale breakdown and a pass-cost model (time = a per pass through the "
                                    "blocks + b per FLOP, fitted on the first configuration: what each other "
                                    "configuration would take without overhead of its own); writes one record per "
                                    "configuration "
                                    "(<results>/<world>/<model>/latency/<key>.json).")
    sp.add_argument("--model", required=True, help="registered model (varbench list models)")
    sp.add_argument("--method", action="append", default=None,
                    help="method chain to time; give it several times to compare (default: dense). "
                         "'dense' is the unmodified model")
    sp.add_argument("--device", default=None, help="cpu, cuda, cuda:N, or coreml (macOS only) (default: cuda in "
                    "the paper world when available, else cpu)")
    sp.add_argument("--batch", type=int, default=1, help="images per generation (default 1: latency of one image)")
    sp.add_argument("--reps", type=int, default=10, help="timed generations per configuration, ≥ 3 (default 10)")
    sp.add_argument("--warmup", type=int, default=2, help="untimed generations first, ≥ 1 (default 2)")
    sp.add_argument("--threads", type=int, default=None, help="CPU intra-op threads (default: all cores); recorded")
    sp.add_argument("--compile", action="store_true", help="wrap each transformer block in torch.compile "
                    "(compile time reported separately)")
    sp.add_argument("--compute-units", action="append", default=None, choices=("CPU_AND_NE", "ALL", "CPU_AND_GPU", "CPU_ONLY"),
                    help="--device coreml: Core ML compute-unit setting, repeatable (default: CPU_AND_NE, ALL, "
                         "CPU_AND_GPU, the rows of EVAR Table 5); each gets its own record with #CPU/#GPU/#NPU ops")
    sp.add_argument("--precision", choices=("fp16", "fp32"), default="fp16", help="--device coreml: package precision")
    sp.add_argument("--random-weights", action="store_true", help="seeded random weights instead of the "
                    "checkpoint (timing needs no trained weights; data-free methods only make sense)")
    sp.add_argument("--world", choices=WORLDS, default=None, help="default: the model's world")
    sp.add_argument("--seed", type=_seed, default=0, help="seed of the weights (--random-weights) and of sampling")
    sp.add_argument("--force", action="store_true", help="measure again even if records exist")
    sp.add_argument("--quiet", action="store_true", help="no progress bars")
    sampling_flags(sp)
    results(sp)
    sp.set_defaults(func=_cmd_latency)

    sp = sub.add_parser("coreml", help="export a generator as a Core ML package; count its ops (Linux or macOS)",
                        description="export: the generator (after an optional method chain) as one Core ML ML "
                                    "program with a fixed-shape function per scale (scale_0 … scale_K-1) and a "
                                    "decode function over shared states (KV caches, f_hat); sampling stays on the "
                                    "host. Conversion needs coremltools, not a Mac. ops: op counts per type and "
                                    "per function, read from a saved package (the proxy for EVAR Table 5's op "
                                    "columns).")
    csub = sp.add_subparsers(dest="action", required=True, metavar="ACTION")
    ex = csub.add_parser("export", help="convert a model (+ method chain) to X.mlpackage")
    ex.add_argument("model", help="registered model (varbench list models)")
    ex.add_argument("--method", default=None, help="method chain applied first (weights methods), e.g. "
                    "'magnitude:sparsity=0.4'")
    ex.add_argument("--out", required=True, help="package path, ending in .mlpackage (replaced if it exists)")
    ex.add_argument("--batch", type=int, default=1, help="images per generation the functions are shaped for (default 1)")
    ex.add_argument("--precision", choices=("fp16", "fp32"), default="fp16", help="weights and compute (default fp16)")
    ex.add_argument("--random-weights", action="store_true", help="seeded random weights instead of the checkpoint")
    ex.add_argument("--world", choices=WORLDS, default=None, help="default: the model's world")
    ex.add_argument("--seed", type=_seed, default=0, help="seed of the random weights and of data-driven methods")
    ex.add_argument("--quiet", action="store_true", help="no progress bars")
    ex.add_argument("--ckpt-dir", default=None, help="checkpoint folder (paper world; else $VARBENCH_CKPT_DIR)")
    ops = csub.add_parser("ops", help="count the ops of a saved package, per type and per function")
    ops.add_argument("package", help="path of an .mlpackage")
    ops.add_argument("--json", action="store_true", help="print {functions: {name: {op: count}}, weights_bytes}")
    sp.set_defaults(func=_cmd_coreml)

    sp = sub.add_parser("figures", help="render figures (speed-quality Pareto, per-scale latency, ablations) "
                        "from records",
                        description="Renders figures/<name>.yaml from the records (nothing is run) to "
                                    "<out>/<world>/<name>.{png,pdf}. Figures: "
                                    "pareto (FID vs FLOPs of every recorded chain), pareto-latency (FID vs "
                                    "measured latency), scale-latency (per-scale latency stacks), "
                                    "fid-vs-sparsity (every pruning method), calibration and recovery (EVAR "
                                    "Tables 3 and 4 as bars), token-keep-ratio (LazyVAR's keep ratio), psad-gates "
                                    "(PSAD's per-scale gates). A figure without data says which records to "
                                    "make; the others are still drawn (exit status 2 only when none is).")
    sp.add_argument("names", nargs="*", help="figure names (default: all)")
    sp.add_argument("--world", choices=WORLDS, default=None, help=f"default: {DEFAULT_WORLD}")
    sp.add_argument("--out", default=None, help="output base folder (default: $VARBENCH_FIGURES_OUT, else ./figures/out)")
    sp.add_argument("--results", default=None, help="record folder (default: $VARBENCH_RESULTS, else ./results)")
    sp.set_defaults(func=_cmd_figures)

    sp = sub.add_parser("leaderboard", help="rank every current record of a world, one table per bench "
                        "(md, tex, html, json)",
                        description="Reads the records only (nothing is run, no torch) and writes "
                                    "<out>/<world>/leaderboard.{md,tex,html,json}: one table per bench, a row "
                                    "per model + resolved method chain (+ setting, n), the bench's metrics "
                                    "(value ± stderr) and params, FLOPs and ms/image. Records that differ "
                                    "only in the seed are one row (mean; error bar: standard error over seeds); "
                                    "different n are different rows. Sorted best first by the bench's primary "
                                    "metric (FID, or latency for the latency bench), rows without it last. Stale "
                                    "records are left out and counted (`varbench runs --stale`). The HTML page "
                                    "is self-contained; click a header to sort. Rules: docs/leaderboard.md.")
    sp.add_argument("--world", choices=WORLDS, default=None, help=f"default: {DEFAULT_WORLD}")
    sp.add_argument("--sort", default=None, metavar="METRIC", help="sort every bench that has METRIC by it, "
                    "best first (a catalog metric, e.g. is, class_acc, params; default: each bench's primary metric)")
    sp.add_argument("--out", default=None, help="output base folder (default: $VARBENCH_TABLES_OUT, else ./tables/out)")
    results(sp)
    sp.set_defaults(func=_cmd_leaderboard)

    sp = sub.add_parser("runs", help="list records (spec, metrics, age, stale or not); prune stale ones",
                        description="A record is stale when its request, made again today, would give another "
                                    "key: a method's default or version changed, the checkpoint or feature "
                                    "network changed, the bench protocol changed, or it predates the current "
                                    "record schema. Stale records are never reused.")
    sp.add_argument("--world", choices=WORLDS, default=None, help="only this world")
    sp.add_argument("--stale", action="store_true", help="only stale records")
    sp.add_argument("--prune-stale", action="store_true", help="delete stale records (asks first)")
    sp.add_argument("--yes", action="store_true", help="with --prune-stale: do not ask")
    sp.add_argument("--json", action="store_true", help="print the listing as JSON records")
    results(sp)
    sp.set_defaults(func=_cmd_runs)

    sp = sub.add_parser("geneval", help="GenEval image folders: generate (resumable), score, or import the "
                        "official evaluator's results.jsonl",
                        description="GenEval's official folder layout (<index>/metadata.jsonl, samples/NNNN.png) and "
                                    "scoring rules. `varbench run --bench shapes-geneval` does all three in one record; "
                                    "these commands work on folders, e.g. to score with the official evaluator.")
    gsub = sp.add_subparsers(dest="action", required=True, metavar="ACTION")
    def folder_generate(parent, help_, tiny_bench, paper_bench, func, n_help=None):
        """A `generate` subcommand of a folder workflow (GenEval, MJHQ): the same flags for both."""
        g = parent.add_parser("generate", help=help_)
        g.add_argument("out", help="image folder")
        g.add_argument("--bench", default=tiny_bench, help=f"{tiny_bench} (default) or {paper_bench}")
        g.add_argument("--model", default=None, help="default: the bench's model (tiny-t2i, infinity-2b)")
        if n_help:
            g.add_argument("--n", type=int, default=None, help=n_help)
        g.add_argument("--seed", type=_seed, default=0, help="prompt i is seeded with seed·1000003 + i")
        g.add_argument("--ckpt-dir", default=None, help="checkpoint folder (paper world)")
        g.add_argument("--device", default=None, help="cpu or cuda")
        g.add_argument("--quiet", action="store_true")
        sampling_flags(g)
        g.set_defaults(func=func)

    folder_generate(gsub, "sample 4 images per prompt of a GenEval bench into a folder (skips prompts already "
                    "complete)", "shapes-geneval", "geneval", _cmd_geneval_generate)
    g = gsub.add_parser("score", help="score an image folder with a bench's detector; print the scores")
    g.add_argument("folder", help="image folder in GenEval's layout")
    g.add_argument("--bench", default="shapes-geneval", help="whose detector: shapes-geneval (exact shapes "
                   "detector, default) or geneval (Mask2Former + CLIP; needs mmdet)")
    g.add_argument("--options", nargs="*", default=[], metavar="KEY=VALUE",
                   help="the official evaluator's options: threshold, counting_threshold, max_objects, "
                        "max_overlap, position_threshold")
    g.add_argument("--out", default=None, help="also write the per-image results (official results.jsonl format)")
    g.add_argument("--json", action="store_true")
    g.add_argument("--quiet", action="store_true")
    g.set_defaults(func=_cmd_geneval_score)
    g = gsub.add_parser("import", help="scores of the official evaluator's results.jsonl (per task, overall)")
    g.add_argument("results_jsonl", help="output of geneval's evaluation/evaluate_images.py")
    g.add_argument("--json", action="store_true")
    g.set_defaults(func=_cmd_geneval_import)

    sp = sub.add_parser("mjhq", help="MJHQ image folders (<category>/<id>.png, FastVAR's layout): generate "
                        "(resumable) or score",
                        description="`varbench run --bench shapes-mjhq` samples and scores in one record; these "
                                    "commands work on folders, e.g. to score images made by FastVAR's own scripts "
                                    "with this bench's protocol.")
    msub = sp.add_subparsers(dest="action", required=True, metavar="ACTION")
    folder_generate(msub, "sample one image per prompt of an MJHQ bench into a folder (skips images already there)",
                    "shapes-mjhq", "mjhq30k", _cmd_mjhq_generate,
                    n_help="images: the first n/K prompts of each of the K categories (default: all)")
    g = msub.add_parser("score", help="FID per category and overall (and CLIP score, mjhq30k) of a folder")
    g.add_argument("folder", help="image folder in FastVAR's layout (<category>/<id>.png or .jpg)")
    g.add_argument("--bench", default="shapes-mjhq", help="shapes-mjhq (default) or mjhq30k")
    g.add_argument("--n", type=int, default=None, help="as for generate (default: all)")
    g.add_argument("--json", action="store_true")
    g.add_argument("--quiet", action="store_true")
    g.set_defaults(func=_cmd_mjhq_score)

    sp = sub.add_parser("train-tiny", help="retrain the tiny world's models from scratch (make tiny-models)",
                        add_help=False)
    sp.set_defaults(func=None)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:   # `torchrun -m bench -- run ...` (docs/sharding.md), where argparse keeps the "--"
        argv = argv[1:]
    try:
        if argv[:1] == ["train-tiny"]:
            from bench.recipes.tiny import main as train_main
            return train_main(argv[1:])
        args = build_parser().parse_args(argv)
        return _dispatch(args)
    except BrokenPipeError:   # `varbench ... | head`: the reader left; not an error of ours
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("varbench: interrupted; nothing partial was written (records and tables are written atomically, "
              "finished runs are kept)", file=sys.stderr)
        return 130


def _dispatch(args) -> int:
    from bench.checkpoint import CheckpointError
    from bench.io import OutputDirError
    from bench.render import EmptyRenderError
    try:
        return args.func(args)
    except (UnknownNameError, CheckpointError, FileNotFoundError, ValueError, OutputDirError, EmptyRenderError) as e:
        # what the user can fix (names, files, arguments): one clear message, no stack trace
        print(f"varbench: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
