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
import sys
import time
from pathlib import Path
from typing import Dict

import torch
from tqdm.auto import tqdm

from bench import originals, shard
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


@torch.no_grad()
def sample_features(gen, bench, labels, seed: int, sampling: dict, cached=None, on_batch=None, on_chunk=None,
                    progress: bool = True, desc: str = "sample"):
    """The bench's images as ``sample`` makes them, turned into the bench's feature rows every
    ``bench.feature_chunk`` images as they come, so that at most one chunk of images is held (the rows
    equal ``bench.features`` of all images: see ``Bench.feature_chunk``).

    ``cached(lo, hi)``: images lo … hi − 1 already on disk, or None (then the batch is sampled);
    ``on_batch(lo, images)``: called after each sampled batch; ``on_chunk(lo, images)``: more per-image
    rows of a chunk (the fidelity pairs). Returns (feature rows, on_chunk rows, {sample_s, features_s})."""
    B, C, n = bench.batch_size, bench.feature_chunk, len(labels)
    rows: Dict[str, list] = {}
    extra: Dict[str, list] = {}
    times = {"sample_s": 0.0, "features_s": 0.0}
    buf: list = []                      # sampled batches not yet featurised (fewer than C images)
    start = 0                           # index of buf's first image

    def flush(final: bool) -> None:
        nonlocal buf, start
        if sum(len(b) for b in buf) < C and not (final and buf):
            return                      # concatenate only when a chunk is complete (no copy per batch)
        imgs = torch.cat(buf)
        while len(imgs) >= C or (final and len(imgs)):
            chunk, imgs = imgs[:C], imgs[C:]
            t = time.perf_counter()
            for k, v in bench.features(chunk).items():
                rows.setdefault(k, []).append(v)
            for k, v in (on_chunk(start, chunk) if on_chunk else {}).items():
                extra.setdefault(k, []).append(v)
            times["features_s"] += time.perf_counter() - t
            start += len(chunk)
        buf = [imgs] if len(imgs) else []

    for bi, s in enumerate(tqdm(range(0, n, B), desc=desc, disable=not progress)):
        imgs = cached(s, min(s + B, n)) if cached else None
        if imgs is None:
            t = time.perf_counter()
            imgs = gen.generate(labels[s:s + B], seed=bench.batch_seed(seed, bi), **sampling).cpu()
            times["sample_s"] += time.perf_counter() - t
            if on_batch:
                on_batch(s, imgs)
        buf.append(imgs)
        flush(False)
    flush(True)
    return ({k: torch.cat(v) for k, v in rows.items()}, {k: torch.cat(v) for k, v in extra.items()}, times)


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


def bench_of(spec: RunSpec):
    """The spec's bench with its recorded setting (e.g. ``fidelity``)."""
    cls = BENCHES.get(spec.bench)
    return cls(**cls.args_from_protocol(spec.protocol))


def preflight(spec: RunSpec, root=None) -> None:
    """Checks that need no model: the record folder is writable and the bench's files exist."""
    path = spec.path(root)
    check_writable_dir(path.parent, "results folder")
    _refuse_newer(path)
    bench_of(spec).preflight()


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
    bench = bench_of(spec)
    partial = bench.coverage_note(spec.n)   # said before any sampling, kept in the record's notes
    if partial and shard.rank() == 0:
        print(f"varbench: warning: {partial}", file=sys.stderr)
    if card.identity(ckpt_dir) != spec.ckpt:
        raise ValueError(f"{spec.label()}: the checkpoint files in {card.folder(ckpt_dir)} are not the ones "
                         f"this spec was made for; make the spec again")
    original = None
    if bench.fidelity:                  # the unmodified model's outputs first (cached), before the run's model loads
        if shard.active():
            raise ValueError(f"{spec.label()}: fidelity runs are not sharded yet; run it in one process")
        t = time.perf_counter()
        labels = bench.labels(spec.n)
        original = originals.ensure(spec, bench, labels, lambda: card(ckpt_dir=ckpt_dir, device=device).eval(),
                                    sample_features, root, progress)
        timings["original_s"] = time.perf_counter() - t
        t0 += timings["original_s"]     # load_s and total_s below are the run's own
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
    elif bench.feature_chunk:           # images → feature rows chunk by chunk (one chunk in memory)
        pairs = None
        if original is not None:
            d = originals.folder(spec, root)
            pairs = lambda lo, imgs: originals.pair_rows(d, lo, imgs, bench.lpips_weights)   # noqa: E731
        feats, pair_rows, tt = sample_features(gen, bench, labels, spec.seed, spec.sampling, on_chunk=pairs,
                                               progress=progress, desc=f"sample {spec.label()}")
    else:
        images = sample(gen, bench, labels, spec.seed, spec.sampling, progress, desc=f"sample {spec.label()}")
    timings["sample_s"] = time.perf_counter() - t

    t = time.perf_counter()
    if shard.active():                  # ... and its feature chunks; rank 0 scores them
        metrics, more = shard.evaluate(bench, labels, spec, path, progress)
        if metrics is None:
            return shard.wait_for_record(spec, root)
        shard_cost.update(more)
    elif bench.feature_chunk:
        metrics = bench.score(feats, labels, seed=spec.seed, progress=progress)
        if original is not None:
            metrics.update(bench.fidelity_metrics(feats, original, labels))
            metrics.update(originals.pair_metrics(pair_rows))
        timings["sample_s"] -= tt["features_s"]     # the feature time interleaved with sampling is metrics time
        t -= tt["features_s"]
    else:
        metrics = bench.evaluate(images, labels, seed=spec.seed, progress=progress)
    timings["metrics_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - t0

    cost = {**model_cost(gen, spec.sampling),
            "images_per_s": spec.n / timings["sample_s"], "sample_batch": bench.batch_size,
            "latency_ms_per_image": 1000 * timings["sample_s"] / spec.n, "device": device}
    cost = {k: v for k, v in {**cost, **shard_cost}.items() if v is not None}
    rec = make_record(spec, metrics, cost, timings, notes=[*ctx.notes, *([partial] if partial else [])], device=device)
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


_COSTS: Dict[tuple, tuple] = {}   # (world, model, chain, seed, sampling) -> (cost, VAR config) of a weight-free count


def account(spec: RunSpec, root=None) -> Dict:
    """Weight-free accounting of ``spec`` on the meta device (no checkpoint, no data): parameter
    counts and sampling FLOPs of the model after its method chain (recovery methods change no size
    and are skipped). Writes and returns the accounting record (``bench.records.write_accounting``)."""
    from bench.records import accounting_path, write_accounting
    key = (spec.world, spec.model, tuple(spec.methods), spec.seed, json.dumps(spec.sampling, sort_keys=True))
    if key not in _COSTS:   # a table's benches share their model's count
        gen = MODELS.get(spec.model).build(device="meta")
        gen = apply_chain(gen, spec.methods, Context(world=spec.world, seed=spec.seed, progress=False))
        _COSTS[key] = ({k: v for k, v in model_cost(gen, spec.sampling).items() if v is not None},
                       getattr(getattr(gen, "var", None), "cfg", None))
    cost, var_cfg = dict(_COSTS[key][0]), _COSTS[key][1]
    if spec.bench == "latency" and (spec.protocol or {}).get("device") == "coreml":
        cost["package_ops"] = package_ops(spec, var_cfg)
    write_accounting(root, spec, cost)
    return json.loads(accounting_path(root, spec).read_text())
