"""``varbench run`` (one record), ``sweep`` (a grid of runs) and ``runs`` (the records as a table)."""
from __future__ import annotations

import json
import sys

from bench.commands.common import age, device_for, load_records, sampling_overrides


def cmd_run(args) -> int:
    from bench.plan import make_spec
    from bench.registry import BENCHES

    if args.bench and BENCHES.get(args.bench).kind != "images":
        raise ValueError(f"--bench {args.bench} is not an image bench: run it with `varbench {args.bench}`")
    spec = make_spec(args.model, args.method, bench=args.bench, n=args.n, seed=args.seed, world=args.world,
                     sampling=sampling_overrides(args), ckpt_dir=args.ckpt_dir,
                     bench_args={"fidelity": True} if args.fidelity else None)
    from bench.runner import run

    rec = run(spec, root=args.results, force=args.force, ckpt_dir=args.ckpt_dir, progress=not args.quiet,
              device=device_for(args, spec.world))
    from bench.shard import rank
    if rank() != 0:                     # torchrun: every rank returns the record; one prints it
        return 0
    print(json.dumps({"run_id": rec["run_id"], "path": str(spec.path(args.results)),
                      "methods": rec["spec"]["methods"],
                      "metrics": {k: v["value"] for k, v in rec["metrics"].items()},
                      "params": rec["cost"].get("params")}, indent=1))
    return 0


def cmd_sweep(args) -> int:
    """Expand a sweep file (bench/sweep.py), list the cells, then run the unfinished ones or emit their
    command lines. Under torchrun every rank walks the same cells and each run is sharded."""
    import pandas as pd

    from bench import sweep
    from bench.io import atomic_write_text, check_writable_dir, check_writable_file

    plan_only = args.dry_run or args.emit_commands is not None
    if args.emit_commands is not None:
        check_writable_file(args.emit_commands, "--emit-commands", "commands.txt")
    if not plan_only and args.device is not None:   # checked even when every cell is done (emitted lines may
        device_for(args, "tiny")                     # run elsewhere: their --device is not checked here)
    grid = sweep.load(args.spec, world=args.world)
    specs, repeats = sweep.expand(grid, ckpt_dir=args.ckpt_dir, need_ckpt=not plan_only)
    done = sweep.finished(specs, args.results)
    todo = [s for s, d in zip(specs, done) if not d]
    from bench.launch import rank  # torch-free: planning a sweep loads no torch
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
            device=device_for(args, spec.world))
    if main_rank:
        print(f"ran {len(todo)} cell(s); records under {root}", file=sys.stderr)
    return 0


def cmd_runs(args) -> int:
    import pandas as pd

    from bench.leaderboard import records_frame
    from bench.resources import results_root

    root = results_root(args.results)
    if root.exists() and not root.is_dir():
        raise ValueError(f"--results {root} is a file, not a folder of records")
    full = records_frame(load_records(root, args.world), ckpt_dir=args.ckpt_dir)   # the leaderboard's frame
    df = pd.DataFrame()
    if len(full):
        now = pd.Timestamp.now(tz="UTC")
        shown = [m for m in ("fid", "is", "class_acc", "geneval", "fid_star", "latency_ms") if m in full]
        setting = ["setting"] if full["setting"].astype(bool).any() else []   # e.g. fidelity=True, latency's device
        df = full[["run_id", "world", "model", "bench", "label", *setting, "n", "seed", *shown]].rename(
            columns={"label": "methods"})
        df[shown] = df[shown].round(4)
        df["age"] = [age((now - pd.Timestamp(c)).total_seconds()) for c in full["created"]]
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
            print(df.drop(columns=["path"]).to_string(index=False, na_rep=""))   # a metric a bench has not: blank
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
