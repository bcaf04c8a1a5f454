"""``varbench table``, ``figures`` and ``leaderboard``: everything rendered from records."""
from __future__ import annotations

import json
import sys
from typing import Dict

from bench.commands.common import device_for, load_records, sampling_overrides
from bench.defaults import DEFAULT_WORLD


def cmd_table(args) -> int:
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
        cells = table_cells(spec, world, n=args.n, seed=args.seed, sampling=sampling_overrides(args),
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
                    device=device_for(args, world))
            if timed:
                from bench.latency import run_latency
                for specs in timed.values():
                    # one measurement run: speed-ups are ratios of medians timed side by side
                    print(f"[{spec.name}] latency of {len(specs)} configurations of {specs[0].model}, "
                          f"timed together", file=sys.stderr)
                    run_latency(specs, root=root, ckpt_dir=args.ckpt_dir, force=args.force, progress=not args.quiet)
        from bench.records import load_accounting
        records = {r["run_id"]: r for r in load_records(root, world).values()}
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


def cmd_figures(args) -> int:
    from bench.figures import figure_names, load_figure, render
    from bench.io import check_writable_dir
    from bench.resources import figures_out_dir, results_root
    if "all" in args.names and len(args.names) > 1:
        raise ValueError(f"'all' draws every figure: give it alone, or name the figures ({' '.join(args.names)})")
    names = figure_names() if args.names in ([], ["all"]) else list(dict.fromkeys(args.names))
    for name in names:   # every name known (or a "did you mean") before anything is drawn
        load_figure(name)
    world = args.world or DEFAULT_WORLD
    check_writable_dir(figures_out_dir(args.out) / world, "figures output folder", create=False)   # made when drawn
    root = results_root(args.results)
    if root.exists() and not root.is_dir():
        raise ValueError(f"--results {root} is a file, not a folder of records")
    # read once for every figure, naming the unreadable records the figures leave out
    records = {r["run_id"]: r for r in load_records(root, world).values()}
    failed = 0
    for name in names:
        try:
            paths = render(name, world=world, root=args.results, out=args.out, records=records)
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


def cmd_leaderboard(args) -> int:
    """Records only (the loader of `varbench runs`), no torch: see bench/leaderboard.py for the rules."""
    from bench import leaderboard
    from bench.io import check_writable_dir
    from bench.resources import results_root, tables_out_dir

    world = args.world or DEFAULT_WORLD
    root = results_root(args.results)
    if root.exists() and not root.is_dir():
        raise ValueError(f"--results {root} is a file, not a folder of records")
    board = leaderboard.build(load_records(root, world), world, sort=args.sort, ckpt_dir=args.ckpt_dir, root=root)
    out_dir = check_writable_dir(tables_out_dir(args.out), "leaderboard output folder")
    paths = leaderboard.write(board, out_dir)
    print(paths["md"].read_text(encoding="utf-8"), end="")
    print(f"wrote {', '.join(str(p) for p in paths.values())} ({board['records']} current records"
          + (f"; {board['stale']} stale not shown" if board["stale"] else "") + ")", file=sys.stderr)
    return 0
