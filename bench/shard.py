"""Sharded runs: ``torchrun --nproc_per_node=N -m bench run ...`` splits a run's sampling over N ranks.

Why whole batches: the bench seeds sampling per *batch* of its single-process layout (batch ``b``
holds samples ``b·B … (b+1)·B−1`` and gets the seed ``bench.batch_seed(seed, b)``; ``B`` is the
bench's ``batch_size``), and one torch.Generator draws the tokens of a whole batch. A sample's
image therefore depends on its batch, not only on its index. Ranks split the work on those same
batches (on a fresh run rank ``r`` of ``N`` makes batches ``r, r+N, r+2N, …``), so every image is
bit-identical to the single-process run's, whatever N is, and the merged set is the same tensor.

One file per batch, ``<record path without .json>.shards/batch-<b>.npz``, written atomically
(``bench.io.atomic_write_bytes``): a file that exists is complete. It holds the run key, the batch
index, its sample indices, labels and seed, and the uint8 images. After every rank has written its
batches (barrier), the features are dealt (below): each rank reads and checks only the batch files
its feature chunks cover, and rank 0 scores the rows and writes the one record, as a single-process run would (plus
``cost.sample_ranks``, ``cost.shard_batches_reused`` and ``cost.shard_feature_chunks_reused``), then
removes the folder; the other ranks wait for the record and return it, so that several runs in one
launch (a sweep, a table) stay in step.

Resume: a run interrupted on any number of ranks is restarted with the same command (any N): every
rank lists the batches whose files exist and hold this run's key, and the batches still missing are
dealt round-robin over the ranks. Finished batches are never generated again.

Feature extraction is dealt the same way, on whole *feature chunks*. A feature network's output for
one image can depend on the batch it is computed in (kernel choice per batch shape), so the unit is
the bench's ``feature_chunk`` (``bench.benches.base``): a multiple of every batch size its networks
use, aligned at 0, so each image meets exactly the batch it meets in a single pass over all images.
After sampling, rank ``r`` extracts chunks ``r, r+N, …`` (reading only the batch files that hold
them) and writes each to ``features-<j>.npz`` (atomically, with the run key; resumed like the batches); rank 0
merges the rows in order and calls the bench's ``score``. A bench with ``feature_chunk = 0`` is
scored by rank 0 alone with its ``evaluate``.

The model (``handoff``): rank 0 loads the model and applies the chain's methods up to the last one
that is not ``per_rank`` (pruning with calibration, distillation, fine-tuning), saves the generator
(``torch.save``, atomically) as ``model.pt`` in the shard folder with the run key and the methods'
notes, and the other ranks load that file onto their device; then every rank applies the rest of the
chain (token methods: training-free and deterministic). Why not let each rank apply the whole chain
with the same seed: training and calibration on GPUs are not bit-reproducible across devices, so the
ranks could sample from slightly different models, and N ranks would repeat hours of work. A resumed
run finds ``model.pt`` and does not apply those methods again (``cost.shard_model_reused``).

Only a torchrun launch (``WORLD_SIZE`` > 1 in the environment) initialises a process group: NCCL
when the run's device is CUDA (rank's GPU: ``cuda:$LOCAL_RANK``), gloo on the CPU. A plain
``varbench run`` never touches torch.distributed. The latency bench times one process: under
torchrun rank 0 times, the other ranks wait for its records (``bench.latency.run_latency``).
"""
from __future__ import annotations

import io
import os
import shutil
import time
from datetime import timedelta
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

import numpy as np
import torch
from tqdm.auto import tqdm

from bench.io import atomic_write, atomic_write_bytes
from bench.launch import active, rank, world_size  # noqa: F401 (part of this module's API)

SHARD_SUFFIX = ".shards"
MODEL_FILE = "model.pt"
# Rank 0 waits at a barrier for the slowest rank's sampling, the others for rank 0's scoring: both can
# take hours in the paper world. torchrun stops every rank when one fails, so a long timeout never
# hides a crash.
TIMEOUT_S = float(os.environ.get("VARBENCH_SHARD_TIMEOUT_S", 12 * 3600))


class ShardError(ValueError):
    """A shard file that does not belong where it is; the message says what to delete."""


# --------------------------------------------------------------------------------------------------
# the launch


# world_size, rank, active: bench.launch (torch-free), imported above


def setup(device: str) -> str:
    """The device this rank runs on, with the process group up (no-op unless :func:`active`).

    ``cuda`` becomes ``cuda:$LOCAL_RANK`` (one GPU per rank); an explicit ``cuda:i`` is kept.
    """
    if not active():
        return device
    import torch.distributed as dist
    dev = torch.device(device)
    if dev.type == "cuda":
        if dev.index is None:
            dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", timeout=timedelta(seconds=TIMEOUT_S))
    return str(dev)


def _barrier() -> None:
    import torch.distributed as dist
    if dist.get_backend() == "nccl":
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


# --------------------------------------------------------------------------------------------------
# shard files


def shard_dir(record_path: str | os.PathLike) -> Path:
    """``<root>/<world>/<model>/<bench>/<key>.shards``: beside the record, named by the run key."""
    return Path(record_path).with_suffix(SHARD_SUFFIX)


def batch_path(folder: Path, b: int) -> Path:
    return Path(folder) / f"batch-{b:06d}.npz"


def features_path(folder: Path, j: int) -> Path:
    return Path(folder) / f"features-{j:06d}.npz"


def model_path(folder: Path) -> Path:
    return Path(folder) / MODEL_FILE


def n_batches(n: int, batch_size: int) -> int:
    return -(-n // batch_size)


def write_batch(folder: Path, key: str, b: int, batch_size: int, labels: torch.Tensor, seed: int,
                images: torch.Tensor) -> Path:
    """Write batch ``b``'s images atomically, with what identifies them."""
    start = b * batch_size
    buf = io.BytesIO()
    np.savez(buf, key=np.array(key), batch=np.array(b), indices=np.arange(start, start + len(images)),
             labels=labels.cpu().numpy(), seed=np.array(seed, dtype=np.int64), images=images.cpu().numpy())
    return atomic_write_bytes(batch_path(folder, b), buf.getvalue())


def _key_of(path: Path) -> Optional[str]:
    """The run key a shard file holds, or None if it cannot be read (then it is made again)."""
    try:
        with np.load(path) as f:          # lazy: reads only the key member
            return str(f["key"])
    except Exception:                     # truncated, not a zip, no key: not finished, make it again
        return None


def finished(folder: Path, key: str, total: int, path=batch_path) -> Set[int]:
    """Batches (or feature chunks, ``path=features_path``) whose shard file exists and holds run ``key``."""
    return {b for b in range(total) if path(folder, b).is_file() and _key_of(path(folder, b)) == key}


def assign(total: int, done: Set[int], rank_: int, world: int) -> List[int]:
    """The batches rank ``rank_`` of ``world`` makes: the missing ones, dealt round-robin (a fresh run:
    ``rank_, rank_ + world, …``). Which rank makes a batch does not change its images."""
    return [b for b in range(total) if b not in done][rank_::world]


@torch.no_grad()
def generate(gen, bench, labels: torch.Tensor, seed: int, sampling: dict, folder: Path, key: str,
             batches: List[int], progress: bool = False) -> None:
    """Generate and write ``batches`` of the single-process layout (batch ``b``: its labels, its seed)."""
    B = bench.batch_size
    for b in tqdm(batches, desc=f"sample (rank {rank()})", disable=not progress):
        lab = labels[b * B:(b + 1) * B]
        s = bench.batch_seed(seed, b)
        write_batch(folder, key, b, B, lab, s, gen.generate(lab, seed=s, **sampling))


def merge(folder: Path, key: str, labels: torch.Tensor, bench, seed: int, batches: Optional[range] = None) -> torch.Tensor:
    """The images of ``batches`` (default: every batch), in batch order (= sample order), after checking
    each file is the one this run expects (its key, index, samples, labels and seed)."""
    B = bench.batch_size
    out = []
    for b in (batches if batches is not None else range(n_batches(len(labels), B))):
        path = batch_path(folder, b)
        if not path.is_file():
            raise ShardError(f"{path} is missing after every rank finished; rerun the same command to make it")
        with np.load(path) as f:
            got = {k: f[k] for k in ("key", "batch", "indices", "labels", "seed", "images")}
        lab = labels[b * B:(b + 1) * B]
        want = {"key": key, "batch": b, "seed": bench.batch_seed(seed, b)}
        bad = [k for k, v in want.items() if got[k].item() != v]
        if not np.array_equal(got["indices"], np.arange(b * B, b * B + len(lab))):
            bad.append("indices")
        if not np.array_equal(got["labels"], lab.numpy()):
            bad.append("labels")
        if got["images"].dtype != np.uint8 or len(got["images"]) != len(lab):
            bad.append("images")
        if bad:
            raise ShardError(f"{path}: {', '.join(bad)} do not match run {key}; delete {folder} and rerun")
        out.append(torch.from_numpy(got["images"]))
    return torch.cat(out)


# --------------------------------------------------------------------------------------------------
# the runner's hooks


def sample(gen, bench, labels: torch.Tensor, spec, record_path, progress: bool = True) -> Dict[str, object]:
    """Sharded sampling of one run: every batch is on disk when it returns (the cost entries; only rank
    0's are recorded); then every rank calls :func:`evaluate`."""
    folder, key, world, me = shard_dir(record_path), spec.key(), world_size(), rank()
    total = n_batches(len(labels), bench.batch_size)
    folder.mkdir(parents=True, exist_ok=True)
    done = finished(folder, key, total)
    _barrier()                          # every rank listed the finished batches before any writes
    t = time.perf_counter()
    generate(gen, bench, labels, spec.seed, spec.sampling, folder, key, assign(total, done, me, world),
             progress=progress and me == 0)
    _barrier()                          # every batch is on disk
    seconds = time.perf_counter() - t
    made = len(labels) - sum(min(bench.batch_size, len(labels) - b * bench.batch_size) for b in done)
    cost = {"sample_ranks": world, "shard_batches_reused": len(done),
            # throughput of what this launch generated (None: everything was reused; left out)
            "images_per_s": made / seconds if made else None,
            "latency_ms_per_image": 1000 * seconds / made if made else None}
    return cost


def save_model(folder: Path, key: str, gen, notes: List[str]) -> Path:
    """The generator rank 0 made, for the other ranks and for a resumed run (atomic: a file that
    exists is complete)."""
    return atomic_write(model_path(folder), lambda fh: torch.save({"key": key, "gen": gen, "notes": list(notes)}, fh))


def load_model(folder: Path, key: str, device: str, unreadable_is_missing: bool = True):
    """(generator, notes) from ``model.pt`` if it exists and holds run ``key``; else None. A file that
    cannot be read counts as missing (rank 0 then makes it again) unless ``unreadable_is_missing`` is
    False (the other ranks: the error, e.g. out of memory on their device, is theirs to report)."""
    path = model_path(folder)
    if not path.is_file():
        return None
    try:   # our own file, written by rank 0 of this run (a whole module: weights_only cannot load it)
        obj = torch.load(path, map_location=device, weights_only=False)
    except Exception:
        if not unreadable_is_missing:
            raise
        return None
    if not isinstance(obj, dict) or obj.get("key") != key:
        return None
    return obj["gen"], obj["notes"]


def handoff(make, spec, record_path, device: str):
    """The generator of a sharded run (module docstring, "The model"): rank 0 calls ``make()`` →
    (generator, notes) unless ``model.pt`` already holds this run's, the other ranks load what rank 0
    saved. Returns (generator on this rank's device, notes, whether rank 0 reused an earlier launch's
    file; None on the other ranks)."""
    folder, key = shard_dir(record_path), spec.key()
    folder.mkdir(parents=True, exist_ok=True)
    if rank() == 0:
        got = load_model(folder, key, device)
        reused = got is not None
        if not reused:
            got = make()
            save_model(folder, key, *got)
        _barrier()                      # model.pt is on disk
        return (*got, reused)
    _barrier()
    got = load_model(folder, key, device, unreadable_is_missing=False)
    if got is None:
        raise ShardError(f"rank {rank()}: {model_path(folder)} is missing or not run {key}'s after rank 0 "
                         f"wrote it (is the results folder shared by every rank?)")
    return (*got, None)


def _chunk_images(folder: Path, key: str, labels: torch.Tensor, bench, seed: int, lo: int, hi: int) -> torch.Tensor:
    """Images lo … hi−1, read from the batch files that hold them (a rank reads only what it extracts)."""
    B = bench.batch_size
    b0 = lo // B
    return merge(folder, key, labels, bench, seed, range(b0, (hi - 1) // B + 1))[lo - b0 * B:hi - b0 * B]


def write_features(folder: Path, key: str, j: int, rows: Dict[str, torch.Tensor]) -> Path:
    """Feature chunk ``j``'s rows, atomically, with the run key (resume) and the chunk index."""
    buf = io.BytesIO()
    np.savez(buf, key=np.array(key), chunk=np.array(j), **{f"row_{k}": v.cpu().numpy() for k, v in rows.items()})
    return atomic_write_bytes(features_path(folder, j), buf.getvalue())


def merge_features(folder: Path, key: str, total: int) -> Dict[str, torch.Tensor]:
    """Every chunk's rows concatenated in chunk order (= sample order), each file checked."""
    parts: Dict[str, list] = {}
    for j in range(total):
        path = features_path(folder, j)
        if not path.is_file():
            raise ShardError(f"{path} is missing after every rank finished; rerun the same command to make it")
        with np.load(path) as f:
            if str(f["key"]) != key or int(f["chunk"]) != j:
                raise ShardError(f"{path} does not belong to chunk {j} of run {key}; delete {folder} and rerun")
            for name in f.files:
                if name.startswith("row_"):
                    parts.setdefault(name[4:], []).append(torch.from_numpy(f[name]))
    return {k: torch.cat(v) for k, v in parts.items()}


def evaluate(bench, labels: torch.Tensor, spec, record_path, progress: bool = True
             ) -> Tuple[Optional[Dict[str, dict]], Dict[str, object]]:
    """The run's metrics on rank 0 ((None, {}) on the others): feature chunks dealt over the ranks, each
    rank reading only the batch files its chunks need, then scored by rank 0 (module docstring); a
    bench without ``feature_chunk`` is evaluated by rank 0 alone, on every image."""
    C, me, n = int(getattr(bench, "feature_chunk", 0) or 0), rank(), len(labels)
    folder, key = shard_dir(record_path), spec.key()
    if C <= 0:
        if me != 0:
            return None, {}
        images = merge(folder, key, labels, bench, spec.seed)
        return bench.evaluate(images, labels, seed=spec.seed, progress=progress), {}
    total = n_batches(n, C)
    done = finished(folder, key, total, features_path)
    _barrier()                          # every rank listed the finished chunks before any writes
    for j in tqdm(assign(total, done, me, world_size()), desc=f"features (rank {me})", disable=not progress or me):
        images = _chunk_images(folder, key, labels, bench, spec.seed, j * C, min((j + 1) * C, n))
        write_features(folder, key, j, bench.features(images))
    _barrier()                          # every chunk is on disk
    if me != 0:
        return None, {}
    return (bench.score(merge_features(folder, key, total), labels, seed=spec.seed, progress=progress),
            {"shard_feature_chunks_reused": len(done)})


def finish(record_path) -> None:
    """Rank 0, after writing the record: drop the shards, release the other ranks."""
    if active():
        shutil.rmtree(shard_dir(record_path), ignore_errors=True)
        _barrier()


def rank_zero_only(run, specs, root, device: str):
    """Under torchrun, ``run()`` on rank 0 alone (it writes the records of ``specs``); the other ranks
    wait for it and return those records. For the latency bench: timing N processes at once on one
    machine would measure their contention, and N ranks would write the same records."""
    setup("cpu" if device == "coreml" else device)
    if rank() == 0:
        out = run()
        _barrier()                      # the records are written
        return out
    return _records_after_barrier(specs, root)


def wait_for_record(spec, root=None):
    """Ranks > 0: wait until rank 0 has written the record, and return it."""
    return _records_after_barrier([spec], root)[0]


def _records_after_barrier(specs, root):
    from bench.records import find_record
    _barrier()
    recs = [find_record(s, root) for s in specs]
    missing = [str(s.path(root)) for s, r in zip(specs, recs) if r is None]
    if missing:
        raise ShardError(f"rank {rank()}: rank 0 finished but {', '.join(missing)} is not there "
                         f"(is the results folder shared by every rank?)")
    return recs
