"""The latency bench: one full generation timed end to end, as a record.

Protocol (``bench.benches.latency.LatencyBench``, protocol version 3): the generator with its method chain installed
generates ``batch`` class-conditional images (labels 0, 1, … mod the class count) — text-to-image
models: images of the first ``batch`` prompts of the world's GenEval bench (``shapes-geneval``,
``geneval``), the text encoder included in the time — every scale, CFG on (the model's sampling
defaults), VQVAE decode and uint8 conversion included, ``warmup`` untimed
generations first. Then ``reps`` timed generations; with several configurations (``--method`` given
more than once) the configurations are alternated within each repetition, in an order rotated
every repetition, so that a drift in the machine's speed hits all of them alike. CPU threads are set
(``torch.set_num_threads``) and recorded; CUDA is timed with events after ``synchronize``.

Statistics of the ``reps`` times: median, IQR, p90 and a 95 % bootstrap CI of the median (2000
resamples, seeded). ``latency_ms`` = median time of one generation of ``batch`` images (batch 1: the
latency of one image); ``images_per_s`` = batch / median (throughput at that batch). Peak memory
(protocol version 2), per configuration as if it ran alone: ``peak_mem_mb`` = its generator's weights
(parameters and buffers, text encoder and tokenizer included) + the peak working memory of one extra,
untimed generation: the most that the generation itself allocated and held at once (CPU: from PyTorch's
allocator events under ``torch.profiler``; CUDA: the caching allocator's peak above its start,
``working_mb`` says why), with ``weights_mb`` and ``working_mb`` beside it. Version 1 recorded a process-wide figure, the same for every configuration
of a run (all generators are loaded together, and on the CPU glibc keeps the largest generation's heap).
Per-scale breakdown (protocol version 3): the timed generations themselves read the clock when each
scale's logits are ready and when sampling ends (CPU: ``perf_counter``; CUDA: events in stream order,
read after the generation, so no synchronisation is added); ``scale_ms[i]`` is the median over the
timed generations of the time from the previous scale's logits (scale 0: from the start) and includes
the previous scale's sampling and VQVAE step; ``last_step_ms`` is the median of the last scale's own
sampling and VQVAE step (after its logits); ``decode_ms`` is the median VQVAE decode and uint8
conversion: the three add up to a generation. Version 2 took the breakdown from three separate generations per configuration after the
timed ones, one configuration after another: not alternated, so a drift in the machine's speed (20 %
within a minute, measured on 2 CPU cores) entered the ratios between configurations. The record's
cost holds beside them each scale's FLOPs attributed the same way (``scale_flops``,
``bench.accounting.model_cost``) and whether it starts a pass through the block stack
(``scale_passes``: LazyVAR decodes a group of scales in one pass).

Pass-cost model (printed, not recorded): the FLOPs ratio assumes time ∝ FLOPs, which fails where a
scale that runs the blocks costs a fixed time whatever its tokens (reading every block's weights, the
per-op overhead of small matrices, the scale's sampling step; var-d16 at batch 1 on 2 CPU cores: 87 ms,
of which reading the blocks' 0.81 GB of fp32 weights at the 23 GB/s a sum over memory reaches there is
about 35 ms). The report fits
t_s = a + b·F_s to the first configuration's scales 1…K−1 and predicts each configuration with the same
weights from its own per-scale FLOPs and passes; measured time over predicted time near 1 says a
method's gathers, scoring and restores cost nothing beyond the FLOPs it keeps. It then prints each
configuration's scales speed-up as a share of its FLOPs ratio (the criterion: ≥ 0.85) and the fixed
costs per pass at which the model would meet that criterion (``pass_cost_span``): a method with fewer
passes than the first configuration (LazyVAR) meets it only below some fixed cost, so a bound under
what reading the weights alone takes says the criterion cannot hold on that machine at that batch,
however little the method wastes.

``compile``: each block's sub-layers (attention, cross-attention, FFN) are wrapped by
``torch.compile`` (static shapes) before the warm-up; norms, modulation and token policies stay
eager (``install_compile`` says why). Dynamo keeps one cache per code object, so the entries of
every configuration in a run (each sub-layer at each scale's shapes, and again once the KV cache
exists) count against one recompile limit, past which it would run the rest eagerly without saying
so in the result: the limit is lifted for the measurement and hitting it is an error. The warm-up
goes on (at most ``COMPILE_SETTLE`` generations more) until a generation compiles nothing new, so
no timed generation compiles; ``compile_s`` is the warm-up's time over that many settled
generations and ``compile_graphs`` the graphs compiled in it (graphs shared with a configuration
warmed up earlier are not compiled again); graphs compiled during the timed generations (none
expected) are recorded as ``compile_graphs_timed``, with a warning printed when there are any.
``cuda_graphs`` (CUDA only; class-conditional VAR models without a token method): each scale's blocks
and head are replayed as a CUDA graph (``bench.models.graphs``), captured in the first warm-up
generation and checked there against the eager pass; the record's cost holds ``graphs_capture_s``,
``graphs_count``, ``graphs_max_abs_diff`` (that check's largest |Δ logits|) and ``graphs_held_mb``
(what the graphs hold: their static inputs and KV buffers and their memory pool's segments, counted in
the peak memory as ``graphs_mb``: a replay allocates nothing, so the working memory holds only the
eager steps). A capture empties PyTorch's cache of free blocks, so after every configuration's
warm-up each runs one more untimed generation before the timed ones.
Records: ``bench = "latency"``, the setting (device, batch, threads, compile, CUDA graphs, warmup) in
the protocol, ``n`` = reps.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import sys
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

BOOTSTRAP = 2000
# a token method's scales speed-up should reach (1 − FLOPS_TOL) × its FLOPs ratio: it wastes little of what it prunes
FLOPS_TOL = 0.15


# ------------------------------------------------------------------------------------------ statistics
def summarize(times_s: Sequence[float], seed: int = 0) -> Dict[str, float]:
    """Median, IQR, p90 and a 95 % bootstrap CI of the median, in milliseconds."""
    t = np.asarray(times_s, dtype=np.float64) * 1e3
    if t.size < 3 or not np.all(np.isfinite(t)):
        raise ValueError(f"need ≥ 3 finite times, got {list(times_s)}")
    q1, med, q3, p90 = np.percentile(t, [25, 50, 75, 90])
    rng = np.random.default_rng(seed)
    boot = np.median(t[rng.integers(0, t.size, size=(BOOTSTRAP, t.size))], axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"value": float(med), "stderr": None, "n": int(t.size), "iqr": float(q3 - q1), "p90": float(p90),
            "ci95": [float(lo), float(hi)], "min": float(t.min()), "max": float(t.max()),
            "times_ms": [round(float(x), 3) for x in t]}


NOISY_IQR = 0.10   # IQR/median above which a configuration's times are flagged (torch.utils.benchmark's warning)


def speedup_ci(base_ms: Sequence[float], ms: Sequence[float], seed: int = 0) -> Tuple[float, float]:
    """95 % bootstrap CI of the ratio of medians median(base) / median(this): each configuration's times
    resampled on their own, ``BOOTSTRAP`` times."""
    a, b = np.asarray(base_ms, dtype=np.float64), np.asarray(ms, dtype=np.float64)
    rng = np.random.default_rng(seed)
    med_a = np.median(a[rng.integers(0, a.size, size=(BOOTSTRAP, a.size))], axis=1)
    med_b = np.median(b[rng.integers(0, b.size, size=(BOOTSTRAP, b.size))], axis=1)
    lo, hi = np.percentile(med_a / med_b, [2.5, 97.5])
    return float(lo), float(hi)


# ------------------------------------------------------------------------------------------ memory
def weights_mb(gen, device: str = "cpu") -> Optional[float]:
    """MiB held on ``device`` (cpu, cuda) by a torch generator's parameters and buffers (transformer,
    tokenizer, text encoder), each storage once (tied or shared weights are held once); None for other
    generators (Core ML)."""
    import torch
    if not isinstance(gen, torch.nn.Module):
        return None
    held = {}
    for t in list(gen.parameters()) + list(gen.buffers()):
        s = t.untyped_storage()
        if s.device.type == device.split(":")[0]:
            held[s.data_ptr()] = s.nbytes()
    return sum(held.values()) / 2 ** 20


@contextlib.contextmanager
def _quiet_fd2():
    """The profiler's C++ side (kineto) logs its start and stop, and a CPU-only machine's failed CUDA
    probe, straight to file descriptor 2: not for the user. Python's own stderr is flushed first."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def working_mb(fn: Callable[[], object], device: str = "cpu") -> float:
    """Peak MiB that ``fn`` allocates on ``device`` (cpu, cuda) and holds at once.

    CPU: from PyTorch's allocator events under ``torch.profiler`` (``profile_memory``): each allocation
    is added, and subtracted when freed, but only if made inside ``fn`` — freeing tensors made before it
    (a token method's state from the previous generation) does not lower the peak, as it would not exist
    in a first generation. CUDA: the caching allocator's own peak above what was allocated at the start
    (``max_memory_allocated`` after ``reset_peak_memory_stats``), so a tensor made before ``fn`` and
    freed inside it lowers the figure by at most its size. The profiler's events are not used there:
    on an H200 (torch 2.11) they summed to 3,612 MiB for one var-d16 generation whose allocator peak was
    241 MiB above its start. Memory that libraries allocate outside PyTorch's allocator (oneDNN scratch,
    cuBLAS workspaces) is not seen by either."""
    import torch
    if device.startswith("cuda"):
        dev = torch.device(device)
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        start = torch.cuda.memory_allocated(dev)
        fn()
        torch.cuda.synchronize(dev)
        return (torch.cuda.max_memory_allocated(dev) - start) / 2 ** 20
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile
    with _quiet_fd2(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        stack.extend(e.children)
        if e.tag == _EventType.Allocation and str(e.extra_fields.device).split(":")[0] == "cpu":
            events.append((e.start_time_ns, e.extra_fields.ptr, e.extra_fields.alloc_size))
    events.sort(key=lambda ev: ev[0])   # stable: events of one instant keep the tree's order
    mine: Dict[int, int] = {}
    live = peak = 0
    for _, ptr, nbytes in events:
        if nbytes > 0:
            mine[ptr] = nbytes
            live += nbytes
            peak = max(peak, live)
        elif ptr in mine:
            live -= mine.pop(ptr)
    return peak / 2 ** 20


def peak_memory(cfg: "Config", timer: "Timer", seed: int) -> Optional[Dict[str, object]]:
    """One configuration's peak memory as if it ran alone: its weights + the peak working memory of one
    untimed generation. A single-process comparison holds every configuration's generator at once, so a
    process-wide figure (CUDA ``max_memory_allocated`` since the process started, the CPU's resident
    high-water mark, which glibc's kept heap pins at the largest generation's) would be the same for every
    configuration."""
    device = "cuda" if timer.cuda else "cpu"
    weights = weights_mb(cfg.gen, device)
    if weights is None:
        return None
    import torch
    with torch.no_grad():
        work = working_mb(lambda: timed_generation(cfg, timer, seed), device)
    source = "CUDA max_memory_allocated above its start" if timer.cuda else "PyTorch allocator events"
    out = {"value": weights + work, "weights_mb": weights, "working_mb": work,
           "kind": f"weights + peak working memory of one generation ({source})"}
    if cfg.graphs is not None:   # a replay allocates nothing: the graphs' memory was reserved at capture
        out["graphs_mb"] = cfg.graphs["graphs_held_mb"]
        out["value"] += out["graphs_mb"]
        out["kind"] = (f"weights + what the CUDA graphs hold + peak working memory of one "
                       f"generation ({source})")
    return out


# ------------------------------------------------------------------------------------------ timing
class Timer:
    """Clock for one device: ``perf_counter`` on the CPU; on CUDA, events recorded in stream order and read
    after one synchronize at the end, so that reading the clock at every scale adds no synchronisation."""

    def __init__(self, device: str):
        import torch
        self.cuda = device.startswith("cuda")
        self.torch = torch

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def mark(self):
        if self.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, marks: Sequence) -> List[float]:
        """Seconds between consecutive marks (waits for the last one on CUDA)."""
        if self.cuda:
            marks[-1].synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in zip(marks, marks[1:])]
        return [b - a for a, b in zip(marks, marks[1:])]


@dataclasses.dataclass
class Config:
    """One configuration under test: a label, its generator, and its labels/sampling."""
    label: str
    gen: object
    labels: object
    sampling: dict
    compile_s: Optional[float] = None
    compile_graphs: Optional[int] = None
    graphs: Optional[dict] = None   # --cuda-graphs: capture time and memory (bench.models.graphs)


def timed_generation(cfg: Config, timer: Timer, seed: int) -> Tuple[float, List[float], float, float]:
    """One generation as ``generate`` runs it (sampling, then the decode; on the CPU the heap kept, as
    ``bench.models.heap``), with the clock read at every scale's logits and when sampling ends:
    (total s, per-scale s, last step s, decode s). Scale i runs from the previous scale's logits (scale 0:
    from the start); the last step is the last scale's own sampling and VQVAE step, after its logits."""
    import torch

    from bench.models.heap import reuse_heap
    timer.sync()
    marks = [timer.mark()]
    with torch.no_grad(), reuse_heap(not timer.cuda):
        _, f_hat = cfg.gen.sample_tokens(cfg.labels, seed=seed, logits_hook=lambda si, _: marks.append(timer.mark()),
                                         **cfg.sampling)
        scales = len(marks) - 1
        marks.append(timer.mark())
        cfg.gen.decode_uint8(f_hat)
        marks.append(timer.mark())
    s = timer.seconds(marks)
    return sum(s), s[:scales], s[scales], s[-1]


COMPILE_SETTLE = 6   # extra warm-up generations at most under --compile, until one compiles nothing
_COMPILE_LIMIT = 100_000


def install_compile(gen) -> None:
    """Wrap each block's sub-layers (self- and cross-attention, FFN: the block class's ``SUBLAYERS``,
    what a token policy routes) in ``torch.compile`` with static shapes; the block's glue (norms,
    modulation, residuals), any token policy and the sampling loop stay eager. Whole blocks would
    take the policy's Python into the graphs: dynamo then specialises on every block index, on the
    policy's type and state and on closures that every configuration's blocks share (one code
    object), so a run of several methods compiled ~3× the graphs and kept recompiling during the
    timed generations; sub-layers are shared by the blocks of a scale and compile once per shape."""
    for b in gen.blocks:
        for name in type(b).SUBLAYERS:
            getattr(b, name).compile(dynamic=False)


def compile_settings(on: bool):
    """Dynamo's recompile limits lifted (they are per code object, and every configuration's blocks
    share one) and hitting them made an error, so that nothing falls back to eager silently."""
    if not on:
        return contextlib.nullcontext()
    import torch._dynamo
    c = torch._dynamo.config
    names = [next((n for n in pair if hasattr(c, n)), None) for pair in   # the older torch names second
             (("recompile_limit", "cache_size_limit"), ("accumulated_recompile_limit", "accumulated_cache_size_limit"),
              ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"))]
    limit, accumulated, fail = names
    patch = {n: max(getattr(c, n), _COMPILE_LIMIT) for n in (limit, accumulated) if n}
    return c.patch(**patch, **({fail: True} if fail else {}))


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters
    return int(counters["stats"]["unique_graphs"])


def warm_up(cfg: Config, timer: Timer, warmup: int, seed: int, compile: bool) -> None:
    """``warmup`` untimed generations; under ``compile`` more (at most ``COMPILE_SETTLE``) until one
    compiles no new graph, setting ``cfg.compile_s`` (the warm-up's time over as many generations at
    the settled one's) and ``cfg.compile_graphs``."""
    if compile:
        install_compile(cfg.gen)
    graphs = compiled_graphs if compile else (lambda: 0)
    start, times = graphs(), []
    for i in range(warmup + (COMPILE_SETTLE if compile else 0)):
        g0 = graphs()
        times.append(timed_generation(cfg, timer, seed)[0])
        if i + 1 >= warmup and graphs() == g0:
            break
    else:
        print(f"warning: {cfg.label}: still compiling after {len(times)} warm-up generations; the timed ones "
              f"may include compile time (see compile_graphs_timed in its record)", file=sys.stderr)
    if compile:
        cfg.compile_s = max(sum(times) - len(times) * times[-1], 0.0)
        cfg.compile_graphs = graphs() - start
    captured = getattr(cfg.gen, "captured_graphs", None)
    if captured is not None:   # captured in the first warm-up generation
        cfg.graphs = {"graphs_capture_s": captured.capture_s, "graphs_count": len(captured.replays),
                      "graphs_held_mb": captured.held_mb, "graphs_max_abs_diff": captured.max_abs_diff}


def measure(configs: Sequence[Config], device: str, reps: int, warmup: int, seed: int = 0, compile: bool = False,
            progress: bool = True) -> Dict[str, dict]:
    """Time every configuration ``reps`` times, alternated; returns per label: stats, memory, and the
    per-scale breakdown (medians over the same timed generations)."""
    import torch
    from tqdm.auto import tqdm
    timer = Timer(device)
    timed_graphs = {c.label: 0 for c in configs}
    graphs = compiled_graphs if compile else (lambda: 0)   # dynamo is not imported for an eager run
    with torch.no_grad(), compile_settings(compile):
        for cfg in configs:
            warm_up(cfg, timer, warmup, seed, compile)
        if any(cfg.graphs for cfg in configs):   # a capture emptied the allocator's cache of the others' blocks
            for cfg in configs:
                timed_generation(cfg, timer, seed)
        runs: Dict[str, list] = {c.label: [] for c in configs}
        for r in tqdm(range(reps), desc="latency", disable=not progress):
            k = r % len(configs)
            for cfg in list(configs[k:]) + list(configs[:k]):   # rotated order
                g0 = graphs()
                runs[cfg.label].append(timed_generation(cfg, timer, seed + 1 + r))
                timed_graphs[cfg.label] += graphs() - g0
        out = {}
        for cfg in configs:
            total, scales, last, decode = zip(*runs[cfg.label])
            if timed_graphs[cfg.label]:
                print(f"warning: {cfg.label}: {timed_graphs[cfg.label]} graph(s) compiled during the timed "
                      f"generations; its times include compiling", file=sys.stderr)
            out[cfg.label] = {
                "latency_ms": summarize(total, seed),
                "peak_mem": peak_memory(cfg, timer, seed + 1),
                "breakdown": {"scale_ms": [round(float(np.median(c)) * 1e3, 3) for c in zip(*scales)],
                              "last_step_ms": round(float(np.median(last)) * 1e3, 3),
                              "decode_ms": round(float(np.median(decode)) * 1e3, 3), "n": reps},
                "compile": None if not compile else {"compile_s": cfg.compile_s, "compile_graphs": cfg.compile_graphs,
                                                     "compile_graphs_timed": timed_graphs[cfg.label]},
                "graphs": cfg.graphs,
            }
    return out


def thread_info() -> Dict[str, object]:
    import torch

    from bench.benches.latency import available_cpus
    return {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads(),
            "cpu_count": os.cpu_count(), "cpus_available": available_cpus(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")}


# ------------------------------------------------------------------------------------------ runs → records
PROMPT_BENCH = {"tiny": "shapes-geneval", "paper": "geneval"}   # text-to-image models: whose prompts are timed


def latency_conditions(spec, card, batch: int):
    """What the timed generations are conditioned on: classes 0, 1, … mod the class count, or the first
    ``batch`` prompts (cycled) of the world's GenEval bench for text-to-image models."""
    import torch

    from bench.plan import CONDITIONS
    from bench.registry import BENCHES
    if CONDITIONS[getattr(card, "kind", "c2i")] == "prompts":
        rows = BENCHES.get(PROMPT_BENCH[spec.world])().rows()
        return [rows[i % len(rows)]["prompt"] for i in range(batch)]
    return torch.arange(batch) % card.var_cfg.num_classes


def latency_specs(model: str, chains: Sequence[str], reps: int, seed: int, setting: Dict[str, object],
                  world: Optional[str] = None, ckpt_dir=None, random_weights: bool = False,
                  sampling: Optional[dict] = None):
    """One checked RunSpec per method chain (``bench = "latency"``, the setting in the protocol)."""
    from bench.plan import CONDITIONS, RANDOM_CKPT, make_spec
    from bench.registry import MODELS
    card = MODELS.get(model)
    kind = getattr(card, "kind", "c2i")
    if random_weights and CONDITIONS[kind] == "prompts" and card.world == "paper":
        raise ValueError(f"--random-weights: {model} encodes its prompts with a pretrained text model, which has no "
                         f"random stand-in here; time it with its checkpoint files (--ckpt-dir), or time tiny-t2i")
    if setting.get("device") == "coreml" and kind != "c2i":
        raise ValueError(f"--device coreml: the Core ML export covers the class-conditional VAR models; {model} is a "
                         f"{kind} model (time it with --device cpu or cuda)")
    specs = []
    for chain in chains:
        spec = make_spec(model, chain, bench="latency", n=reps, seed=seed, sampling=sampling, world=world,
                         ckpt_dir=ckpt_dir, need_ckpt=not random_weights, bench_args=setting)
        if random_weights:
            spec = dataclasses.replace(spec, ckpt={RANDOM_CKPT: f"torch.manual_seed({seed})"})
        specs.append(spec)
    return specs


def run_latency(specs, root=None, ckpt_dir=None, force: bool = False, progress: bool = True) -> List[dict]:
    """Measure the specs together (alternated) and write one record each; existing records are
    reused unless ``force`` if they were timed in one run (``timing_group``), else all specs are
    re-measured together, with the configurations of their earlier runs (``timing_partners``). Under torchrun
    rank 0 alone measures; the other ranks wait and return its records (``bench.shard.rank_zero_only``)."""
    from bench import shard
    if shard.active():
        return shard.rank_zero_only(lambda: _run_latency(specs, root, ckpt_dir, force, progress),
                                    specs, root, specs[0].protocol["device"])
    return _run_latency(specs, root, ckpt_dir, force, progress)


def _run_latency(specs, root, ckpt_dir, force: bool, progress: bool) -> List[dict]:
    import torch

    from bench.accounting import model_cost
    from bench.records import RecordError, find_record, make_record, timing_group, write_record
    from bench.registry import MODELS
    from bench.runner import preflight, prepared_generator

    def existing(spec):
        try:
            return find_record(spec, root)
        except RecordError:
            if force:
                return None   # --force overwrites an unreadable record
            raise
    found = [existing(s) for s in specs]
    if not force:
        # reused when there is nothing to compare (one spec) or all were timed in one run
        if all(r is not None for r in found) and (len(found) == 1 or (
                timing_group(found[0]) is not None and len({timing_group(r) for r in found}) == 1)):
            if progress and len(found) > 1:
                print(f"reused: {len(found)} latency records timed together in one run", file=sys.stderr)
            return found
    requested = [s.key() for s in specs]
    partners = timing_partners(specs, found, root)
    if partners and progress:
        print(f"re-timing also {len(partners)} configuration(s) timed together with these before, so that every "
              f"ratio of their records stays within one run: " + ", ".join(s.label() for s in partners), file=sys.stderr)
    specs = list(specs) + partners
    for s in specs:
        preflight(s, root)
    p = specs[0].protocol
    device, batch, threads, warmup, compile_ = p["device"], p["batch"], p["threads"], p["warmup"], p["compile"]
    if threads:
        torch.set_num_threads(int(threads))
    use_cuda_device(device)
    configs, timings, gens_cost, extra = [], {}, {}, {}
    coreml = device == "coreml"
    packages: Dict[tuple, tuple] = {}
    tmp = None
    try:
        for spec in specs:
            card = MODELS.get(spec.model)
            labels = latency_conditions(spec, card, batch)
            if coreml:   # one package per chain, run under each compute-unit setting
                from bench.coreml import CoreMLGenerator, export, op_counts, placement, total_ops
                chain = tuple(spec.methods)
                if chain not in packages:
                    import tempfile
                    tmp = tmp or Path(tempfile.mkdtemp(prefix="varbench-latency-"))
                    torch_gen, ctx, tm = prepared_generator(spec, "cpu", ckpt_dir, progress)
                    t0 = time.perf_counter()
                    pkg = export(torch_gen, tmp / f"{len(packages)}.mlpackage", batch=batch,
                                 precision=spec.protocol["precision"], progress=progress,
                                 metadata={"model": spec.model, "methods": list(chain), "ckpt": spec.ckpt})
                    packages[chain] = (pkg, torch_gen, ctx, {**tm, "export_s": time.perf_counter() - t0})
                pkg, torch_gen, ctx, tm = packages[chain]
                cu = spec.protocol["compute_units"]
                gen = CoreMLGenerator(pkg, cu, torch_gen.patch_nums, card.var_cfg.num_classes)
                timings[spec.key()] = {**tm, "coreml_load_s": gen.load_s}
                ops = placement(pkg, cu)
                counts = op_counts(pkg)
                extra[spec.key()] = {"compute_units": cu, "ops_by_function": ops, "package_ops_by_function": counts,
                                     "package_ops": total_ops(counts),
                                     **{f"ops_{d}": sum(f.get(d, 0) for f in ops.values()) for d in ("cpu", "gpu", "npu")}}
                gens_cost[spec.key()] = (torch_gen, ctx.notes)
            else:
                gen, ctx, timings[spec.key()] = prepared_generator(spec, device, ckpt_dir, progress)
                if p.get("cuda_graphs"):   # captured in the first warm-up generation
                    from bench.models.graphs import cuda_capture
                    gen.graph_capture = cuda_capture
                labels = labels.to(device) if isinstance(labels, torch.Tensor) else labels
                gens_cost[spec.key()] = (gen, ctx.notes)
            configs.append(Config(label=spec.key(), gen=gen, labels=labels, sampling=dict(spec.sampling)))
        t = time.perf_counter()
        res = measure(configs, "cpu" if coreml else device, specs[0].n, warmup, seed=specs[0].seed,
                      compile=compile_, progress=progress)
        measure_s = time.perf_counter() - t
    finally:
        if tmp is not None:
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)
    records = {}
    group = uuid.uuid4().hex[:16]   # one measurement run: only ratios within it are reported
    timed_with = sorted(s.key() for s in specs)
    if device.startswith("cuda"):
        dev_name = torch.cuda.get_device_name(torch.device(device))
    elif coreml:
        dev_name = f"Core ML ({platform.platform()}, {platform.machine()})"
    else:
        dev_name = f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    for spec in specs:
        r, (gen, notes) = res[spec.key()], gens_cost[spec.key()]
        lat = r["latency_ms"]
        metrics = {"latency_ms": {**lat, "group": group, "timed_with": timed_with},
                   "images_per_s": {"value": batch * 1e3 / lat["value"], "n": lat["n"],
                                    "ci95": [batch * 1e3 / lat["ci95"][1], batch * 1e3 / lat["ci95"][0]]},
                   **({"peak_mem_mb": {**r["peak_mem"], "n": 1}} if r["peak_mem"] else {})}
        cost = {**{k: v for k, v in model_cost(gen, spec.sampling, per_scale=True).items() if v is not None},
                "batch": batch, "device": device,
                "per_scale_ms": r["breakdown"]["scale_ms"], "last_step_ms": r["breakdown"]["last_step_ms"],
                "decode_ms": r["breakdown"]["decode_ms"],
                "breakdown_n": r["breakdown"]["n"], "threads": thread_info()}
        cost.update(r["compile"] or {})
        cost.update(r["graphs"] or {})
        cost.update(extra.get(spec.key(), {}))
        tm = {**timings[spec.key()], "measure_s": measure_s}
        tm["total_s"] = sum(tm.values())
        rec = make_record(spec, metrics, cost, tm, notes=notes, device=dev_name)
        write_record(spec.path(root), rec)
        records[spec.key()] = rec
    return [records[k] for k in requested]


def use_cuda_device(device: str) -> None:
    """``cuda:N`` becomes the current CUDA device: CUDA events, ``synchronize`` and graph capture follow
    the current device, not the model's (``cuda`` alone: the current one already)."""
    import torch
    if device.startswith("cuda") and torch.device(device).index is not None:
        torch.cuda.set_device(torch.device(device).index)


def timing_partners(specs, records, root) -> list:
    """The current configurations timed in one run with any of ``specs`` (whose records, or None, are
    ``records``) and not among them.

    A speed-up is a ratio of medians timed side by side; re-timing some configurations of an earlier
    run alone would leave the others' records paired with nothing measured beside them (a table that
    reuses both would divide times from two runs). So they are re-timed too: every run's records stay
    a closed group. Stale records (method version or request changed since) are left out."""
    from bench.plan import staleness
    from bench.records import RecordError, RunSpec, read_record, timing_group
    groups = {g for g in (timing_group(r) for r in records if r is not None) if g}
    if not groups:
        return []
    keys = {s.key() for s in specs}
    partners = []
    for folder in sorted({s.path(root).parent for s in specs}):   # <world>/<model>/latency/
        for path in sorted(folder.glob("*.json")):
            if path.name.startswith("."):
                continue   # a record being written
            try:
                rec = read_record(path)
            except RecordError:
                continue   # unreadable: nothing to keep paired (a table names it as missing)
            if rec["run_id"] not in keys and timing_group(rec) in groups and not staleness(rec).stale:
                keys.add(rec["run_id"])
                partners.append(RunSpec.from_dict(rec["spec"]))
    return partners


def report(specs, records, labels: Sequence[str]) -> str:
    """The comparison as text: one line per configuration, ratios against the first."""
    p = specs[0].protocol
    lines = [f"{specs[0].model} · {p['device']} · batch {p['batch']}"
             + (f" · threads {p['threads']}" if p.get("threads") else "")
             + (" · torch.compile" if p.get("compile") else "")
             + (" · CUDA graphs" if p.get("cuda_graphs") else "")
             + f" · {specs[0].n} timed generations per configuration, alternated, after {p['warmup']} warm-up"
             + (" (more under torch.compile until one compiles nothing)" if p.get("compile") else ""),
             f"{'configuration':34s} {'median ms':>10s} {'IQR':>8s} {'p90':>9s} {'95% CI of median':>20s} "
             f"{'img/s':>7s} {'peak MiB':>9s} {'(weights':>9s} {'+ working)':>10s} {'speed-up':>9s} {'FLOPs ratio':>11s}"]
    base = records[0]
    for lab, rec in zip(labels, records):
        m = rec["metrics"]["latency_ms"]
        speed = base["metrics"]["latency_ms"]["value"] / m["value"]
        flops = base["cost"]["flops"] / rec["cost"]["flops"]
        ci = f"[{m['ci95'][0]:.1f}, {m['ci95'][1]:.1f}]"
        mem = rec["metrics"].get("peak_mem_mb")
        mem = (f"{mem['value']:9.0f} {mem['weights_mb']:9.0f} {mem['working_mb']:10.1f}" if mem  # none: Core ML
               else f"{'–':>9s} {'':20s}")
        lines.append(f"{lab[:34]:34s} {m['value']:10.1f} {m['iqr']:8.1f} {m['p90']:9.1f} {ci:>20s} "
                     f"{rec['metrics']['images_per_s']['value']:7.3f} {mem} {speed:8.2f}× {flops:10.2f}×")
    base_times, cis = base["metrics"]["latency_ms"].get("times_ms"), []
    for lab, rec in list(zip(labels, records))[1:]:
        times = rec["metrics"]["latency_ms"].get("times_ms")
        if base_times and times:   # records from before the times were kept have none
            lo, hi = speedup_ci(base_times, times)
            cis.append(f"{lab[:34]} [{lo:.2f}, {hi:.2f}]×")
    if cis:
        lines.append("95 % CI of each speed-up (bootstrap of the ratio of medians, "
                     f"{BOOTSTRAP} resamples): " + "; ".join(cis))
    noisy = [f"{lab[:34]} {m['iqr'] / m['value']:.0%}" for lab, rec in zip(labels, records)
             for m in [rec["metrics"]["latency_ms"]] if m["iqr"] > NOISY_IQR * m["value"]]
    if noisy:
        lines.append(f"noisy: IQR above {NOISY_IQR:.0%} of the median for " + ", ".join(noisy)
                     + " (a busy machine; more --reps or a quieter moment narrows it)")
    for lab, rec in zip(labels, records):
        c = rec["cost"]
        if "ops_cpu" in c:
            lines.append(f"  {lab[:40]:40s} Core ML ops: CPU {c['ops_cpu']}  GPU {c['ops_gpu']}  NPU {c['ops_npu']}"
                         f"  (load {rec['timings'].get('coreml_load_s', 0):.2f} s)")
    lines.append("per-scale ms (medians over the timed generations; last = the last scale's sampling step; decode = "
                 "VQVAE decode + uint8), and the scales' speed-up (last step and decode left out, as in the FLOPs ratio):")
    base_scales = sum(base["cost"]["per_scale_ms"])
    for lab, rec in zip(labels, records):
        c = rec["cost"]
        scales = sum(c["per_scale_ms"])
        lines.append(f"  {lab[:32]:32s} " + " ".join(f"{x:.0f}" for x in c["per_scale_ms"])
                     + (f" | last {c['last_step_ms']:.0f}" if "last_step_ms" in c else "")
                     + f" | decode {c['decode_ms']:.0f}" + (f" | compile {c['compile_s']:.1f} s" if "compile_s" in c else "")
                     + (f", {c['compile_graphs']} graphs" if "compile_graphs" in c else "")
                     + (f" | {c['graphs_count']} CUDA graphs captured in {c['graphs_capture_s']:.1f} s, "
                        f"holding {c['graphs_held_mb']:.0f} MiB, max |Δ logits| vs eager "
                        f"{c.get('graphs_max_abs_diff', float('nan')):.2g}" if "graphs_capture_s" in c else "")
                     + (f" | scales {scales:.0f} ms, {base_scales / scales:.2f}×" if scales > 0 else ""))
    model = pass_model(base["cost"])
    if model is not None:
        a, b, r2 = model
        lines.append(f"pass-cost model from the first configuration's scales 1…K−1: t = {a:.1f} ms per pass through the "
                     f"blocks + {b:.2f} ms/GFLOP (R² {r2:.3f}); what each configuration would take if its passes "
                     f"cost what the first's do at the same FLOPs (scale 0 as measured for the first; same weights only):")
        against = []   # every other configuration against the FLOPs-ratio criterion
        for i, (lab, rec) in enumerate(zip(labels, records)):
            pred = predicted_scales_ms(rec["cost"], base["cost"], a, b)
            if pred is None or rec["cost"].get("params") != base["cost"].get("params"):
                continue   # no breakdown, or other weights (the first's fixed cost per pass need not hold)
            scales = sum(rec["cost"]["per_scale_ms"])
            lines.append(f"  {lab[:32]:32s} predicted {pred:.0f} ms, {base_scales / pred:.2f}× "
                         f"(measured {base_scales / scales:.2f}×: {scales / pred:.2f} of predicted time)")
            if i > 0:
                against.append(f"  {lab[:32]:32s} " + _criterion_text(rec["cost"], base["cost"], scales, b))
        if against:
            lines.append(f"speed-up of the scales against the FLOPs ratio (criterion: ≥ {1 - FLOPS_TOL:.2f} of it), and the "
                         f"fixed cost per pass at which the model above would meet it (fitted here: {a:.1f} ms):")
            lines += against
    lines.append("speed-up = median of the first configuration / median of this one (one run, same machine); "
                 "FLOPs ratio likewise from the transformer's sampling FLOPs; peak memory = the configuration's "
                 "weights + the peak working memory of one generation (as if it ran alone)")
    return "\n".join(lines)


def _criterion_text(cost: dict, base_cost: dict, scales_ms: float, b: float) -> str:
    """One configuration's measured share of its FLOPs ratio and the fixed costs per pass at which the
    pass-cost model would meet the criterion (``pass_cost_span``)."""
    lo, hi = pass_cost_span(cost, base_cost, b)
    flops_ratio = base_cost["flops"] / cost["flops"]
    share = sum(base_cost["per_scale_ms"]) / scales_ms / flops_ratio
    if lo > hi:
        at0 = predicted_scales_ms(base_cost, base_cost, 0.0, b) / predicted_scales_ms(cost, base_cost, 0.0, b)
        need = (f"would not meet it at any fixed cost: with none it predicts {at0:.2f}× where "
                f"{(1 - FLOPS_TOL) * flops_ratio:.2f}× is needed (scale 0, taken as measured, costs "
                f"{base_cost['per_scale_ms'][0]:.0f} ms in both)")
    else:
        # pass_cost_span's spans start at 0 or end at inf (the condition is linear in a)
        need = "would meet it " + ("at any fixed cost" if lo == 0 and hi == np.inf else
                                   f"with ≤ {hi:.1f} ms per pass" if lo == 0 else
                                   f"with ≥ {lo:.1f} ms per pass")
    return (f"{share:.2f} of its FLOPs ratio ({'meets' if share >= 1 - FLOPS_TOL else 'misses'} the criterion); "
            f"the model {need}")


def pass_model(base_cost: dict):
    """Least-squares fit t_s = a + b·F_s of the per-scale times (ms) against the per-scale FLOPs (GFLOPs)
    over scales 1…K−1 of a configuration that passes every scale through the blocks (scale 0 also holds the
    condition's setup, e.g. the text encoder): (a, b, R²), or None when the record lacks the breakdown.
    ``a`` is what a scale that runs the blocks costs whatever its tokens (weights read, per-op overhead,
    its sampling step), which the FLOPs ratio leaves out."""
    t, f = base_cost.get("per_scale_ms"), base_cost.get("scale_flops")
    if not t or not f or len(t) != len(f) or len(t) < 4 or not all(base_cost.get("scale_passes", [])):
        return None
    t_s, f_s = np.asarray(t[1:], float), np.asarray(f[1:], float) / 1e9
    b, a = np.polyfit(f_s, t_s, 1)
    resid = t_s - (a + b * f_s)
    r2 = 1 - float(resid @ resid) / float(((t_s - t_s.mean()) ** 2).sum())
    return float(a), float(b), r2


def pass_cost_span(cost: dict, base_cost: dict, b: float, tol: float = None) -> Optional[Tuple[float, float]]:
    """The fixed costs per pass a ≥ 0 (ms) at which the pass-cost model predicts this configuration's scales
    speed-up over the base at ≥ (1 − tol) × its FLOPs ratio: (lo, hi), hi possibly inf; lo > hi when none.

    Both predicted times are linear in a (T(a) = T(0) + a·passes), so the condition
    T_base(a) ≥ k·T(a), k = (1 − tol)·FLOPs ratio, reads a·(P_base − k·P) ≥ k·T(0) − T_base(0).
    With fewer passes than the base (LazyVAR) a small enough a meets it; a fixed cost above the bound
    caps the speed-up below the criterion however little the method wastes."""
    tol = FLOPS_TOL if tol is None else tol
    t_base, t = predicted_scales_ms(base_cost, base_cost, 0.0, b), predicted_scales_ms(cost, base_cost, 0.0, b)
    if t is None or t_base is None:
        return None
    k = (1 - tol) * base_cost["flops"] / cost["flops"]
    c = sum(base_cost["scale_passes"][1:]) - k * sum(cost["scale_passes"][1:])
    rhs = k * t - t_base
    if c == 0:
        return (0.0, np.inf) if rhs <= 0 else (np.inf, 0.0)
    bound = rhs / c
    return (0.0, bound) if c < 0 else (max(0.0, bound), np.inf)


def predicted_scales_ms(cost: dict, base_cost: dict, a: float, b: float) -> Optional[float]:
    """A configuration's scales time under the pass-cost model: scale 0 as the base measured it, every
    later scale b·F_s, plus a if it starts a pass (``scale_passes``)."""
    f, passes = cost.get("scale_flops"), cost.get("scale_passes")
    if not f or passes is None or len(passes) != len(f):
        return None
    return base_cost["per_scale_ms"][0] + sum(a * p + b * x / 1e9 for x, p in zip(f[1:], passes[1:]))
