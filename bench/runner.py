"""Run specs → records. One run = load the model, apply the method chain, sample the bench's
images, score them, write one JSON record atomically (``bench.records``). A spec whose record
exists is reused (``force=True`` reruns it). Specs come from ``bench.plan.make_spec``.
Launched by torchrun (``WORLD_SIZE`` > 1), sampling is split over the ranks by ``bench.shard``
(same images, same record); a plain process never touches torch.distributed.

Everything that can be checked before the work is checked first: the record folder is writable,
the bench's reference files exist, an existing record is not of a newer schema.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Dict

import torch
from tqdm.auto import tqdm

from bench import shard
from bench.accounting import model_cost
from bench.io import check_writable_dir
from bench.method import Context, apply_chain, split_for_ranks
from bench.records import SCHEMA_VERSION, RecordError, RunSpec, find_record, make_record, write_record
from bench.registry import BENCHES, MODELS


@torch.no_grad()
def sample(gen, bench, labels: torch.Tensor, seed: int, sampling: dict, progress: bool = True,
           desc: str = "sample") -> torch.Tensor:
    """The bench's images: batches of ``bench.batch_size`` in label order, one seed per batch."""
    batches = range(0, len(labels), bench.batch_size)
    return torch.cat([gen.generate(labels[s:s + bench.batch_size], seed=bench.batch_seed(seed, bi), **sampling).cpu()
                      for bi, s in enumerate(tqdm(batches, desc=desc, disable=not progress))])


# Training/calibration data of a bench, tokenised by the model's VQVAE, kept across the runs of one
# process (a table's runs): e.g. Table 2's six 1-epoch FT runs share one tokenised train split (20 s
# each on 2 CPU cores otherwise). Keyed by everything that decides the tensors; methods only read them.
_DATA_CACHE: Dict[tuple, tuple] = {}
_DATA_CACHE_SIZE = 4


def cached_data(spec: RunSpec, bench, vae, n: int, split: str):
    key = (spec.world, spec.model, tuple(sorted((spec.ckpt or {}).items())), spec.bench,
           json.dumps(spec.protocol, sort_keys=True), int(n), split)
    if key not in _DATA_CACHE:
        while len(_DATA_CACHE) >= _DATA_CACHE_SIZE:
            _DATA_CACHE.pop(next(iter(_DATA_CACHE)))
        _DATA_CACHE[key] = bench.data(n, split, vae)
    return _DATA_CACHE[key]


def _refuse_newer(path) -> None:
    """``--force`` must not silently replace a record written by a newer varbench."""
    if not path.is_file():
        return
    try:
        schema = json.loads(path.read_text(encoding="utf-8")).get("schema")
    except (ValueError, OSError, AttributeError):
        return   # corrupt: replacing it is what --force is for
    if isinstance(schema, int) and schema > SCHEMA_VERSION:
        raise RecordError(f"{path} is a schema-{schema} record, newer than this varbench writes ({SCHEMA_VERSION}); "
                          f"not overwriting it. Upgrade varbench, or delete the file to rerun with this version.")


def preflight(spec: RunSpec, root=None) -> None:
    """Checks that need no model: the record folder is writable and the bench's files exist."""
    path = spec.path(root)
    check_writable_dir(path.parent, "results folder")
    _refuse_newer(path)
    BENCHES.get(spec.bench)().preflight()


def run(spec: RunSpec, root=None, force: bool = False, ckpt_dir=None, progress: bool = True,
        device: str = "cpu") -> Dict:
    if BENCHES.get(spec.bench).kind == "timing":   # the latency bench times, it samples no image set
        from bench.latency import run_latency
        return run_latency([spec], root=root, ckpt_dir=ckpt_dir, force=force, progress=progress)[0]
    if spec.ckpt is None:
        raise ValueError(f"{spec.label()}: the spec has no checkpoint identity (files absent); cannot run it")
    path = spec.path(root)
    if not force:
        rec = find_record(spec, root)
        if rec is not None:
            return rec
    preflight(spec, root)
    device = shard.setup(device)        # torchrun: this rank's device, process group up; else unchanged
    timings: Dict[str, float] = {}
    t0 = time.perf_counter()
    card = MODELS.get(spec.model)
    bench = BENCHES.get(spec.bench)()
    if card.identity(ckpt_dir) != spec.ckpt:
        raise ValueError(f"{spec.label()}: the checkpoint files in {card.folder(ckpt_dir)} are not the ones "
                         f"this spec was made for; make the spec again")
    ctx = Context(world=spec.world, seed=spec.seed, progress=progress, epoch_size=bench.epoch_size,
                  teacher=lambda: card(ckpt_dir=ckpt_dir, device=device).eval())
    handed, per_rank = split_for_ranks(spec.methods)

    def dense():
        torch.manual_seed(spec.seed)
        gen = card(ckpt_dir=ckpt_dir, device=device).eval()
        timings["load_s"] = time.perf_counter() - t0
        ctx.data = lambda n, split: cached_data(spec, bench, gen.vae, n, split)
        return gen

    shard_cost: Dict[str, object] = {}
    if shard.active() and handed:       # rank 0 applies these methods once; the other ranks load its result
        gen, notes, shard_cost["shard_model_reused"] = shard.handoff(
            lambda: (apply_chain(dense(), handed, ctx), ctx.notes), spec, path, device)
        ctx.notes[:] = notes
    else:
        gen = apply_chain(dense(), handed, ctx)
    if ctx.data is None:                # a handed-over model: the per-rank methods' data from its tokenizer
        ctx.data = lambda n, split: cached_data(spec, bench, gen.vae, n, split)
    t = time.perf_counter()
    gen = apply_chain(gen, per_rank, ctx).eval()
    timings.setdefault("load_s", t - t0)   # no dense model built here: the time to load the handed one
    timings["methods_s"] = time.perf_counter() - t0 - timings["load_s"]

    labels = bench.labels(spec.n)
    t = time.perf_counter()
    if shard.active():                  # torchrun: each rank makes its batches (on disk, read back below)
        images = None
        shard_cost.update(shard.sample(gen, bench, labels, spec, path, progress))
    else:
        images = sample(gen, bench, labels, spec.seed, spec.sampling, progress, desc=f"sample {spec.label()}")
    timings["sample_s"] = time.perf_counter() - t

    t = time.perf_counter()
    if shard.active():                  # ... and its feature chunks; rank 0 scores them
        metrics, more = shard.evaluate(bench, labels, spec, path, progress)
        if metrics is None:
            return shard.wait_for_record(spec, root)
        shard_cost.update(more)
    else:
        metrics = bench.evaluate(images, labels, seed=spec.seed, progress=progress)
    timings["metrics_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - t0

    cost = {**model_cost(gen, spec.sampling),
            "images_per_s": spec.n / timings["sample_s"], "sample_batch": bench.batch_size,
            "latency_ms_per_image": 1000 * timings["sample_s"] / spec.n, "device": device}
    cost = {k: v for k, v in {**cost, **shard_cost}.items() if v is not None}
    rec = make_record(spec, metrics, cost, timings, notes=ctx.notes, device=device)
    write_record(path, rec)
    shard.finish(path)
    return rec


def prepared_generator(spec: RunSpec, device: str = "cpu", ckpt_dir=None, progress: bool = True):
    """(generator with the spec's method chain applied, its Context, {load_s, methods_s}) for benches
    that do not sample a bench's images (latency, Core ML export). Data-driven methods get the world's
    default bench's data. A spec whose ``ckpt`` is ``{RANDOM_CKPT: …}`` gets seeded random weights."""
    import dataclasses

    from bench.plan import DEFAULT_BENCH, RANDOM_CKPT
    t0 = time.perf_counter()
    card = MODELS.get(spec.model)
    random_init = RANDOM_CKPT in (spec.ckpt or {})
    if random_init:
        torch.manual_seed(spec.seed)          # the same weights for every chain of a comparison
        gen = card.build(device=device).eval()
    else:
        if card.identity(ckpt_dir) != spec.ckpt:
            raise ValueError(f"{spec.label()}: the checkpoint files changed since the spec was made")
        gen = card(ckpt_dir=ckpt_dir, device=device).eval()
    load_s = time.perf_counter() - t0
    data_bench = BENCHES.get(DEFAULT_BENCH[spec.world])()
    data_spec = dataclasses.replace(spec, bench=data_bench.name, protocol=data_bench.identity())

    def teacher():
        if random_init:
            torch.manual_seed(spec.seed)
            return card.build(device=device).eval()
        return card(ckpt_dir=ckpt_dir, device=device).eval()

    ctx = Context(world=spec.world, seed=spec.seed, progress=progress, epoch_size=data_bench.epoch_size,
                  data=lambda n, split: cached_data(data_spec, data_bench, gen.vae, n, split), teacher=teacher)
    t1 = time.perf_counter()
    gen = apply_chain(gen, spec.methods, ctx).eval().requires_grad_(False)
    return gen, ctx, {"load_s": load_s, "methods_s": time.perf_counter() - t1}


_PACKAGE_OPS: Dict[tuple, int] = {}


def package_ops(spec: RunSpec, var_cfg) -> int:
    """Non-const op count of the Core ML package of ``spec``'s model at the sizes ``var_cfg`` (seeded
    random weights: the op graph does not depend on the values). One export per sizes, batch and
    precision in a process (a table's compute-unit rows share it)."""
    import tempfile

    from bench.coreml import export, op_counts, total_ops
    p = spec.protocol or {}
    key = (spec.model, repr(var_cfg), p.get("batch", 1), p.get("precision", "fp16"))
    if key not in _PACKAGE_OPS:
        torch.manual_seed(0)
        gen = MODELS.get(spec.model).build(var_cfg=var_cfg).eval()
        with tempfile.TemporaryDirectory(prefix="varbench-ops-") as tmp:
            counts = op_counts(export(gen, Path(tmp) / "m.mlpackage", batch=p.get("batch", 1),
                                      precision=p.get("precision", "fp16"), progress=False))
        _PACKAGE_OPS[key] = total_ops(counts)
    return _PACKAGE_OPS[key]


def account(spec: RunSpec, root=None) -> Dict:
    """Weight-free accounting of ``spec`` on the meta device (no checkpoint, no data): parameter
    counts and sampling FLOPs of the model after its method chain (recovery methods change no size
    and are skipped). Writes and returns the accounting record (``bench.records.write_accounting``)."""
    from bench.records import accounting_path, write_accounting
    gen = MODELS.get(spec.model).build(device="meta")
    gen = apply_chain(gen, spec.methods, Context(world=spec.world, seed=spec.seed, progress=False))
    cost = {k: v for k, v in model_cost(gen, spec.sampling).items() if v is not None}
    if spec.bench == "latency" and (spec.protocol or {}).get("device") == "coreml":
        cost["package_ops"] = package_ops(spec, gen.var.cfg)
    write_accounting(root, spec, cost)
    return json.loads(accounting_path(root, spec).read_text())
