"""``varbench latency`` (timed generations, alternated) and ``coreml`` (export and op counts)."""
from __future__ import annotations

import json
import sys

from bench.commands.common import device_for, prompt_models, sampling_overrides, takes_prompts


def _check_class_conditional(name: str, what: str) -> None:
    """``what`` covers the class-conditional VAR models only (Core ML export, CUDA graphs): say so before
    any work."""
    from bench.registry import MODELS
    if takes_prompts(MODELS.get(name)):
        prompted = prompt_models()
        fits = [n for n in MODELS.names() if n not in prompted]
        raise ValueError(f"--model {name} is a text-to-image model; {what} covers the class-conditional VAR "
                         f"models: {', '.join(fits)}")


def _check_graphs(name: str, chains) -> None:
    """CUDA graphs replay the plain per-scale loop of the class-conditional VAR generator
    (bench.models.graphs): a text-to-image model or a token method is refused before any work."""
    from bench.spec import resolve_chain, token_methods
    _check_class_conditional(name, "--cuda-graphs")
    for chain in chains:
        tokens = token_methods(resolve_chain(chain))
        if tokens:
            raise ValueError(f"--cuda-graphs: {tokens[0]} is a token method, which chooses the tokens each scale runs "
                             f"per generation; a captured graph cannot follow that: time it without --cuda-graphs")


def cmd_latency(args) -> int:
    from bench.plan import requested_chain
    from bench.registry import MODELS
    from bench.spec import resolve_chain
    card = MODELS.get(args.model)
    world = args.world or card.world
    coreml = (args.device or "") == "coreml"
    if coreml:
        from bench.coreml import require_macos
        _check_class_conditional(args.model, "the Core ML export")
        require_macos("--device coreml (latency and op placement per compute unit)")
        if args.compile:
            raise ValueError("--compile applies to PyTorch devices, not --device coreml")
    elif args.compute_units:
        raise ValueError("--compute-units applies to --device coreml only")
    elif args.precision is not None:   # PyTorch devices time the model in fp32, as it is loaded
        raise ValueError("--precision applies to --device coreml only (the Core ML package's precision)")
    device = "coreml" if coreml else device_for(args, world)
    if args.cuda_graphs:
        _check_graphs(args.model, args.method or ["dense"])
    chains = [" + ".join(requested_chain(m)) or "dense" for m in (args.method or ["dense"])]
    first: dict = {}
    for chain in chains:   # the same chain twice, or spelled differently and resolved alike (a default written out)
        resolved = " + ".join(resolve_chain(chain)) or "dense"
        if resolved in first:
            raise ValueError(f"--method {first[resolved]!r} and --method {chain!r} are the same configuration "
                             f"({resolved}): give it once")
        first[resolved] = chain
    from bench.benches.latency import available_cpus
    cpus = available_cpus()
    if device == "cpu" and args.threads and args.threads > cpus:
        print(f"varbench: warning: --threads {args.threads} is more than the {cpus} CPUs this process may use: the "
              f"threads will share cores and the timings measure that contention (the default is {cpus})",
              file=sys.stderr)
    from bench.latency import latency_specs, report, run_latency
    setting = dict(device=device, batch=args.batch, threads=args.threads, compile=args.compile, warmup=args.warmup,
                   **({"cuda_graphs": True} if args.cuda_graphs else {}))
    specs, labels = [], []
    for cu in ((args.compute_units or ["CPU_AND_NE", "ALL", "CPU_AND_GPU"]) if coreml else [None]):
        extra = dict(compute_units=cu, precision=args.precision or "fp16") if coreml else {}
        specs += latency_specs(args.model, chains, args.reps, args.seed, {**setting, **extra}, world=world,
                               ckpt_dir=args.ckpt_dir, random_weights=args.random_weights,
                               sampling=sampling_overrides(args))
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


def cmd_coreml(args) -> int:
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
        w = max([22, *(len(t) for t in total)])   # e.g. scaled_dot_product_attention
        print(f"{'op type':{w}s} {'total':>7s} " + " ".join(f"{n[:9]:>9s}" for n in names))
        for t in sorted(total, key=lambda k: (-total[k], k)):
            print(f"{t:{w}s} {total[t]:7d} " + " ".join(f"{counts[n].get(t, 0):9d}" for n in names))
        non_const = {n: total_ops({n: ops}) for n, ops in counts.items()}
        print(f"{'ops (without const)':{w}s} {total_ops(counts):7d} " + " ".join(f"{non_const[n]:9d}" for n in names))
        return 0
    # export
    from bench.plan import RANDOM_CKPT, make_spec
    out = args.out
    if not str(out).endswith(".mlpackage"):
        raise ValueError(f"--out {out}: a Core ML package path must end in .mlpackage")
    from bench.defaults import BATCH_MAX
    if not 1 <= args.batch <= BATCH_MAX:
        raise ValueError(f"--batch {args.batch}: must be in [1, {BATCH_MAX}]")
    _check_class_conditional(args.model, "the Core ML export")
    from pathlib import Path

    from bench.io import check_writable_dir
    if Path(out).exists() and not Path(out).is_dir():
        raise ValueError(f"--out {out} is a file, not a Core ML package (a folder); give another path")
    check_writable_dir(Path(out).parent, f"--out {out}: its folder", create=False)   # made only on success
    spec = make_spec(args.model, args.method, bench="latency", n=3, seed=args.seed, world=args.world,
                     ckpt_dir=args.ckpt_dir, need_ckpt=not args.random_weights)
    from bench.spec import parse_method, token_methods
    tokens = token_methods(spec.methods)
    if tokens:   # before the chain runs (export() checks the generator too)
        raise ValueError(f"Core ML export of a token method ({parse_method(tokens[0])[0]}) is not supported: the package's per-scale "
                         f"functions compute every token; export the chain without it")
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
