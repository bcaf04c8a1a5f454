"""``varbench`` command line. Every subcommand explains itself with ``--help``.

``list``, ``runs`` and ``table --no-run`` read YAML and JSON only: they import no torch and no
model or method code. Errors a user can fix (names, files, arguments) are one line on stderr and
exit status 2; Ctrl-C is exit status 130 with one line saying what was (not) written.
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from bench.commands.common import parse_seed
from bench.commands.folders import (
    cmd_geneval_generate,
    cmd_geneval_import,
    cmd_geneval_score,
    cmd_mjhq_generate,
    cmd_mjhq_score,
)
from bench.commands.models import cmd_info, cmd_list, cmd_sample
from bench.commands.runs import cmd_run, cmd_runs, cmd_sweep
from bench.commands.tables import cmd_figures, cmd_leaderboard, cmd_table
from bench.commands.timing import cmd_coreml, cmd_latency
from bench.defaults import DEFAULT_WORLD, SAMPLING_PARAMS, WORLDS
from bench.registry import MODELS, REGISTRIES, UnknownNameError


def _defaults_by_model(key: str) -> str:
    """Every registered model's default for a sampling setting, from its card (models that share a value
    named together), for the help texts."""
    names: dict = {}
    for name in MODELS.names():
        sampling = MODELS.get(name).sampling
        if key in sampling:
            names.setdefault(sampling[key], []).append(name)
    return ", ".join(f"{'/'.join(models)} {value}" for value, models in names.items())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="varbench",
        description="Reproducibility benchmark for compressing and accelerating next-scale VAR generators.",
        epilog="Examples:  varbench list models   |   varbench info var-d16 --json   |   "
               "varbench table evar-table2   |   varbench runs --stale")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    sp = sub.add_parser("list", help="list registered models, methods, benches, metrics or tables")
    sp.add_argument("kind", choices=sorted(REGISTRIES), help="what to list")
    sp.set_defaults(func=cmd_list)

    sp = sub.add_parser("info", help="exact parameter count, FLOPs per image, KV cache and tokens per scale (no weights needed)",
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
    sp.set_defaults(func=cmd_info)

    def results(sp):
        sp.add_argument("--results", default=None, help="record folder (default: $VARBENCH_RESULTS, else ./results)")
        sp.add_argument("--ckpt-dir", default=None, help="checkpoint folder (paper world; else $VARBENCH_CKPT_DIR)")

    def sampling_flags(sp):
        for key, flag in (("cfg", "--cfg"), ("top_k", "--top-k"), ("top_p", "--top-p")):
            typ, lo, hi, what = SAMPLING_PARAMS[key]
            sp.add_argument(flag, type=typ, default=None,
                            help=f"{what}; [{lo}, {hi}] (default: the model's: {_defaults_by_model(key)})")

    def common(sp):
        sp.add_argument("--world", choices=WORLDS, default=None, help="tiny (default; for `run` the "
                        "model's world): shipped tiny models and generated data; paper: official checkpoints and real data")
        sp.add_argument("--seed", type=parse_seed, default=0, help="run seed, 0 … 2^32-1 (sampling batches, bootstrap, recovery)")
        sp.add_argument("--n", type=int, default=None, help="images per run, a positive multiple of the bench's "
                        "unit: its classes (class-conditional benches), 4 images per prompt (GenEval benches), its "
                        "categories (MJHQ benches) (default: the table's or the bench's protocol)")
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
    sp.add_argument("model", help="tiny-t2i, or infinity-2b / hart-0.7b with their checkpoints and text models")
    sp.add_argument("--prompt", action="append", required=True, help="a prompt (repeat for several)")
    sp.add_argument("--out", required=True, help="output PNG (the grid)")
    sp.add_argument("--n", type=int, default=4, help="samples per prompt (1–64, default 4)")
    sp.add_argument("--seed", type=parse_seed, default=0, help="sampling seed (one generator for the batch)")
    sp.add_argument("--cfg", type=float, default=None, help="guidance (Infinity: constant across scales; HART: "
                    "ramped up linearly over the scales); default: the model's")
    sp.add_argument("--tau", type=float, default=None, help="temperature (Infinity family); default: the model's")
    sp.add_argument("--top-k", type=int, default=None, help="top-k per bit (Infinity family; 2 classes: ≥ 2 is a "
                    "no-op)")
    sp.add_argument("--top-p", type=float, default=None, help="top-p (per bit for the Infinity family)")
    sp.add_argument("--ckpt-dir", default=None, help="checkpoint folder (paper world)")
    sp.add_argument("--device", default=None, help="cpu or cuda (default: cuda for the paper world when present)")
    sp.set_defaults(func=cmd_sample)

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
    sp.set_defaults(func=cmd_run)

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
    sp.set_defaults(func=cmd_sweep)

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
    sp.set_defaults(func=cmd_table)

    sp = sub.add_parser("latency", help="time full generations (all scales, CFG, decode) of a model with method "
                        "chains, alternated; one record each",
                        description="Times one full generation of --batch images (every scale, CFG on, the tokenizer's "
                                    "decode included; class-conditional models: classes 0, 1, …; text-to-image "
                                    "models: the first prompts of the world's GenEval bench, text encoder "
                                    "included) after --warmup untimed ones, --reps times per "
                                    "configuration. Several --method options are compared in one run, alternated "
                                    "(order rotated per repetition); ratios are ratios of medians. Prints median, "
                                    "IQR, p90, a 95% bootstrap CI of the median, images/s, peak memory, a "
                                    "per-scale breakdown (from the timed generations) and a pass-cost model (time = a per pass through the "
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
    sp.add_argument("--threads", type=int, default=None, help="CPU intra-op threads (default: every CPU this process may use); recorded")
    sp.add_argument("--compile", action="store_true", help="wrap each block's attention and FFN in torch.compile "
                    "(static shapes; warm-up goes on until nothing new compiles; compile time and graph count "
                    "reported separately)")
    sp.add_argument("--cuda-graphs", action="store_true", help="--device cuda: replay each scale's blocks and head "
                    "as a CUDA graph captured in the warm-up (dense and weight-pruned models of the class-conditional "
                    "VAR family; sampling and decode stay eager); capture time reported separately")
    sp.add_argument("--compute-units", action="append", default=None, choices=("CPU_AND_NE", "ALL", "CPU_AND_GPU", "CPU_ONLY"),
                    help="--device coreml: Core ML compute-unit setting, repeatable (default: CPU_AND_NE, ALL, "
                         "CPU_AND_GPU, the rows of EVAR Table 5); each gets its own record with #CPU/#GPU/#NPU ops")
    sp.add_argument("--precision", choices=("fp16", "fp32"), default=None,
                    help="--device coreml: package precision (default fp16)")
    sp.add_argument("--random-weights", action="store_true", help="seeded random weights instead of the "
                    "checkpoint (timing needs no trained weights; data-free methods only make sense)")
    sp.add_argument("--world", choices=WORLDS, default=None, help="default: the model's world")
    sp.add_argument("--seed", type=parse_seed, default=0, help="seed of the weights (--random-weights) and of sampling")
    sp.add_argument("--force", action="store_true", help="measure again even if records exist")
    sp.add_argument("--quiet", action="store_true", help="no progress bars")
    sampling_flags(sp)
    results(sp)
    sp.set_defaults(func=cmd_latency)

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
    ex.add_argument("--seed", type=parse_seed, default=0, help="seed of the random weights and of data-driven methods")
    ex.add_argument("--quiet", action="store_true", help="no progress bars")
    ex.add_argument("--ckpt-dir", default=None, help="checkpoint folder (paper world; else $VARBENCH_CKPT_DIR)")
    ops = csub.add_parser("ops", help="count the ops of a saved package, per type and per function")
    ops.add_argument("package", help="path of an .mlpackage")
    ops.add_argument("--json", action="store_true", help="print {functions: {name: {op: count}}, weights_bytes}")
    sp.set_defaults(func=cmd_coreml)

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
    sp.set_defaults(func=cmd_figures)

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
    sp.set_defaults(func=cmd_leaderboard)

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
    sp.set_defaults(func=cmd_runs)

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
        g.add_argument("--model", default=None, help="default: the bench's model (tiny-t2i, infinity-2b; or hart-0.7b)")
        if n_help:
            g.add_argument("--n", type=int, default=None, help=n_help)
        g.add_argument("--seed", type=parse_seed, default=0, help="prompt i is seeded with seed·1000003 + i")
        g.add_argument("--ckpt-dir", default=None, help="checkpoint folder (paper world)")
        g.add_argument("--device", default=None, help="cpu or cuda")
        g.add_argument("--quiet", action="store_true")
        sampling_flags(g)
        g.set_defaults(func=func)

    folder_generate(gsub, "sample 4 images per prompt of a GenEval bench into a folder (skips prompts already "
                    "complete)", "shapes-geneval", "geneval", cmd_geneval_generate)
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
    g.set_defaults(func=cmd_geneval_score)
    g = gsub.add_parser("import", help="scores of the official evaluator's results.jsonl (per task, overall)")
    g.add_argument("results_jsonl", help="output of geneval's evaluation/evaluate_images.py")
    g.add_argument("--json", action="store_true")
    g.set_defaults(func=cmd_geneval_import)

    sp = sub.add_parser("mjhq", help="MJHQ image folders (<category>/<id>.png, FastVAR's layout): generate "
                        "(resumable) or score",
                        description="`varbench run --bench shapes-mjhq` samples and scores in one record; these "
                                    "commands work on folders, e.g. to score images made by FastVAR's own scripts "
                                    "with this bench's protocol.")
    msub = sp.add_subparsers(dest="action", required=True, metavar="ACTION")
    folder_generate(msub, "sample one image per prompt of an MJHQ bench into a folder (skips images already there)",
                    "shapes-mjhq", "mjhq30k", cmd_mjhq_generate,
                    n_help="images: the first n/K prompts of each of the K categories (default: all)")
    g = msub.add_parser("score", help="FID per category and overall (and CLIP score, mjhq30k) of a folder")
    g.add_argument("folder", help="image folder in FastVAR's layout (<category>/<id>.png or .jpg)")
    g.add_argument("--bench", default="shapes-mjhq", help="shapes-mjhq (default) or mjhq30k")
    g.add_argument("--n", type=int, default=None, help="as for generate (default: all)")
    g.add_argument("--json", action="store_true")
    g.add_argument("--quiet", action="store_true")
    g.set_defaults(func=cmd_mjhq_score)

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
    except OSError as e:
        if e.filename is None:   # not about a path the user gave: a real failure, with its traceback
            raise
        # a path that cannot be used as asked (a folder where a file goes, a file where a folder goes,
        # no permission): the path and the reason
        paths = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
        print(f"varbench: error: {paths}: {e.strerror or e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
