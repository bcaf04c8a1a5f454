"""Run specs → records. One run = load the model, apply the method chain, sample the bench's
images, score them, write one JSON record atomically (``bench.records``). A spec whose record
exists is skipped (``force=True`` reruns it).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Dict, Optional

import torch
from tqdm.auto import tqdm

from bench.accounting import count_params, sampling_flops
from bench.checkpoint import sha256
from bench.method import Context, apply_chain
from bench.records import DEFAULT_ROOT, RunSpec, find_record, make_record, parse_method, write_record
from bench.registry import BENCHES, METHODS, MODELS


def make_spec(model: str, methods=(), bench: Optional[str] = None, n: Optional[int] = None, seed: int = 0,
              sampling: Optional[dict] = None, world: Optional[str] = None) -> RunSpec:
    """A complete run spec: defaults from the model card and the bench, names checked."""
    card = MODELS.get(model)
    world = world or card.world
    bench_name = bench or {"paper": "imagenet256", "tiny": "shapes-c2i"}[world]
    b = BENCHES.get(bench_name)
    if b.world != world or card.world != world:
        raise ValueError(f"world mismatch: --world {world}, model {model} is {card.world}-world, "
                         f"bench {bench_name} is {b.world}-world")
    for m in methods:
        METHODS.get(parse_method(m)[0])
    n = n if n is not None else b.default_n
    if n <= 0 or n % b.num_classes:
        raise ValueError(f"--n {n}: {bench_name} needs a positive multiple of its {b.num_classes} classes "
                         f"(default {b.default_n})")
    return RunSpec(world=world, model=model, methods=tuple(methods), bench=bench_name, n=n, seed=seed,
                   sampling={**card.sampling, **(sampling or {})})


def missing_methods(methods) -> list:
    return [parse_method(m)[0] for m in methods if parse_method(m)[0] not in METHODS]


@torch.no_grad()
def sample(gen, bench, labels: torch.Tensor, seed: int, sampling: dict, progress: bool = True,
           desc: str = "sample") -> torch.Tensor:
    """The bench's images: batches of ``bench.batch_size`` in label order, one seed per batch."""
    batches = range(0, len(labels), bench.batch_size)
    return torch.cat([gen.generate(labels[s:s + bench.batch_size], seed=bench.batch_seed(seed, bi), **sampling).cpu()
                      for bi, s in enumerate(tqdm(batches, desc=desc, disable=not progress))])


def run(spec: RunSpec, root=DEFAULT_ROOT, force: bool = False, ckpt_dir=None, progress: bool = True,
        device: str = "cpu") -> Dict:
    path = spec.path(root)
    if not force:
        rec = find_record(spec, root)
        if rec is not None:
            return rec
    timings: Dict[str, float] = {}
    t0 = time.perf_counter()
    card = MODELS.get(spec.model)
    bench = BENCHES.get(spec.bench)()
    torch.manual_seed(spec.seed)
    gen = card(ckpt_dir=ckpt_dir, device=device).eval()
    var_file = Path(ckpt_dir or card.default_dir or "") / card.var_file
    timings["load_s"] = time.perf_counter() - t0

    t = time.perf_counter()
    ctx = Context(world=spec.world, seed=spec.seed, progress=progress, epoch_size=bench.epoch_size,
                  data=lambda n, split: bench.data(n, split, gen.vae),
                  teacher=lambda: card(ckpt_dir=ckpt_dir, device=device).eval())
    gen = apply_chain(gen, spec.methods, ctx).eval()
    timings["methods_s"] = time.perf_counter() - t

    labels = bench.labels(spec.n)
    t = time.perf_counter()
    images = sample(gen, bench, labels, spec.seed, spec.sampling, progress, desc=f"sample {spec.label()}")
    timings["sample_s"] = time.perf_counter() - t

    t = time.perf_counter()
    metrics = bench.evaluate(images, labels, seed=spec.seed, progress=progress)
    timings["metrics_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - t0

    cost = {"params": count_params(gen.var), "tokenizer_params": count_params(gen.vae),
            "flops": sampling_flops(gen, cfg=spec.sampling.get("cfg", 1.5)),
            "flops_no_cfg": sampling_flops(gen, cfg=None),
            "images_per_s": spec.n / timings["sample_s"], "sample_batch": bench.batch_size,
            "latency_ms_per_image": 1000 * timings["sample_s"] / spec.n, "device": device}
    rec = make_record(spec, metrics, cost, timings, ckpt_sha256=sha256(var_file) if var_file.is_file() else None,
                      notes=ctx.notes, device=device)
    write_record(path, rec)
    return rec
