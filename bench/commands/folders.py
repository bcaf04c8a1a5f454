"""``varbench geneval`` and ``mjhq``: image folders in the official layouts (generate, score, import)."""
from __future__ import annotations

import json
import sys

from bench.commands.common import device_for, prompt_models, sampling_overrides, takes_prompts


def _geneval_print(metrics: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(metrics, indent=1))
        return
    for k, v in metrics.items():
        print(f"{k:28s} {v:.4f}")


def _given(path: str, what: str, example: str) -> str:
    """``path`` unless it is empty: "" would be the current folder (images written among the user's files) or
    no file at all (results silently not written)."""
    if not path.strip():
        raise ValueError(f'{what} is an empty path (""): give one, e.g. {example}')
    return path


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
    """(generator, sampling settings) of ``--model`` (default: the bench's) for the images of the folder
    ``args.out``: the model, its settings, the device and the folder are checked before anything is made
    or loaded (a wrong flag leaves no empty folder behind)."""
    from bench.defaults import model_sampling
    from bench.registry import MODELS
    card = MODELS.get(args.model or bench.model)
    if not takes_prompts(card):
        raise ValueError(f"--model {card.name} is not a text-to-image model ({', '.join(prompt_models())})")
    sampling = model_sampling(card.sampling, sampling_overrides(args), card.name)
    device = device_for(args, card.world)
    from bench.io import check_writable_dir
    check_writable_dir(args.out, "output folder")   # not empty, not a file, writable
    return card(args.ckpt_dir, device=device).eval(), sampling


def cmd_geneval_import(args) -> int:
    from bench.metrics.geneval import read_results, summary
    _geneval_print(summary(read_results(_given(args.results_jsonl, "the results file", "results.jsonl"))), args.json)
    return 0


def cmd_geneval_score(args) -> int:
    """Score a folder with the bench's detector. A folder that lacks some of the bench's prompts or images
    is scored as it is, as the official evaluator scores whatever is there (a part of a folder is a fair
    first look, and a folder of other prompts may be meant), with a warning of what is missing and of the
    tasks the overall score then leaves out: a number that looks complete never passes unremarked."""
    from bench.benches.geneval import IMAGES_PER_PROMPT, missing_of, score_folder
    from bench.metrics.geneval import summary
    bench = _geneval_bench(args.bench)
    _given(args.folder, "the image folder", "geneval_images")
    if args.out is not None:
        from bench.io import check_writable_file
        check_writable_file(args.out, "--out", "results.jsonl")
    bad = [o for o in args.options if "=" not in o]
    if bad:
        raise ValueError(f"--options {' '.join(bad)}: give KEY=VALUE, e.g. --options threshold=0.3")
    opts = dict(o.split("=", 1) for o in args.options)
    df = score_folder(args.folder, bench.detector(), options=opts, progress=not args.quiet)
    short = missing_of(df, bench.rows(), IMAGES_PER_PROMPT)
    if short:
        print(f"varbench: warning: {args.folder} is not a complete {bench.name} folder: {short}; scored as it is "
              f"(`varbench geneval generate {args.folder} --bench {bench.name}` adds what is missing)", file=sys.stderr)
    if args.out is not None:
        from bench.io import atomic_write_text
        atomic_write_text(args.out, df.to_json(orient="records", lines=True))
    _geneval_print(summary(df), args.json)
    return 0


def cmd_geneval_generate(args) -> int:
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


def cmd_mjhq_generate(args) -> int:
    from bench.benches.mjhq import generate_folder
    bench = _mjhq_bench(args.bench)
    n = bench.check_n(args.n if args.n is not None else bench.default_n)
    bench.preflight()
    gen, sampling = _folder_generator(args, bench)
    done = generate_folder(gen, bench, args.out, n, args.seed, sampling, progress=not args.quiet)
    print(f"{args.out}: {done} image(s) generated now, {n - done} already there; score it with "
          f"`varbench mjhq score {args.out} --bench {bench.name} --n {n}`")
    return 0


def cmd_mjhq_score(args) -> int:
    from bench.benches.mjhq import score_folder
    from bench.runner import sample_features
    bench = _mjhq_bench(args.bench)
    n = bench.check_n(args.n if args.n is not None else bench.default_n)
    bench.preflight()
    _given(args.folder, "the image folder", "mjhq_images")
    metrics = score_folder(bench, args.folder, n, sample_features, progress=not args.quiet)
    if args.json:
        print(json.dumps(metrics, indent=1))
    else:
        for k, v in metrics.items():
            print(f"{k:28s} {v['value']:.4f}")
    return 0
