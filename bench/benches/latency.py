"""The latency bench's declaration (torch-free): its protocol is documented and run in
``bench.latency``; ``varbench latency`` is its command. The setting (device, batch, threads, compile,
CUDA graphs, warm-up) is part of the protocol, hence of every record's key."""
from __future__ import annotations

import os
from typing import Dict, Mapping, Optional

from bench.benches.base import Bench
from bench.registry import BENCHES


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, e.g. a container's or taskset's share), not
    the machine's: more threads than these time the scheduler, not the model."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):    # macOS has no affinity masks
        return os.cpu_count() or 1


@BENCHES.register("latency")
class LatencyBench(Bench):
    """Wall-clock latency of one full generation (all scales, CFG, decode) on one device."""
    name, kind, world, version = "latency", "timing", "any", 3   # 2: peak memory per configuration; 3: per-scale breakdown from the timed generations
    conditions = "any"      # classes or prompts: whatever the model takes (bench.latency.latency_conditions)
    metrics = ("latency_ms", "images_per_s", "peak_mem_mb")
    default_n = 10          # timed generations
    num_classes = 1

    def __init__(self, device: str = "cpu", batch: int = 1, threads: Optional[int] = None, compile: bool = False,
                 warmup: int = 2, compute_units: Optional[str] = None, precision: str = "fp16",
                 cuda_graphs: bool = False):
        from bench.defaults import BATCH_MAX
        if not 1 <= batch <= BATCH_MAX:
            raise ValueError(f"--batch {batch}: must be in [1, {BATCH_MAX}]")
        if warmup < 1:
            raise ValueError(f"--warmup {warmup}: must be ≥ 1 (the first generation allocates and warms caches)")
        if threads is not None and threads < 1:
            raise ValueError(f"--threads {threads}: must be ≥ 1")
        self.device, self.batch, self.compile, self.warmup = device, batch, compile, warmup
        if device == "coreml":
            from bench.defaults import COMPUTE_UNITS
            if compute_units not in COMPUTE_UNITS:
                raise ValueError(f"--compute-units {compute_units!r}: expected one of {', '.join(COMPUTE_UNITS)}")
        elif compute_units is not None:
            raise ValueError("--compute-units applies to --device coreml only")
        if compile and device == "coreml":
            raise ValueError("--compile applies to --device cpu or cuda (torch.compile); Core ML compiles its "
                             "package itself when it loads it")
        if cuda_graphs and not device.startswith("cuda"):
            raise ValueError(f"--cuda-graphs needs --device cuda (it replays captured GPU kernels), not {device!r}")
        if cuda_graphs and compile:
            raise ValueError("--cuda-graphs and --compile: give one (each times its own way of cutting launches)")
        self.compute_units, self.precision, self.cuda_graphs = compute_units, precision, cuda_graphs
        self.threads = threads if threads is not None else available_cpus()

    def identity(self) -> Dict[str, object]:
        dev = self.device.split(":")[0]
        out = {"version": self.version, "device": dev, "batch": self.batch,
               "threads": self.threads if dev == "cpu" else None, "compile": self.compile, "warmup": self.warmup}
        if dev == "coreml":   # only Core ML runs carry these (older records keep their keys)
            out.update(compute_units=self.compute_units, precision=self.precision)
        if self.cuda_graphs:  # only graph runs carry it (older records keep their keys)
            out["cuda_graphs"] = True
        if self.compile:      # what is compiled (bench.latency.install_compile); earlier compiled records
            out["compile_scope"] = "sublayers"   # wrapped whole blocks, past dynamo's limit partly eager
        return out

    @classmethod
    def check_n(cls, n) -> int:
        if isinstance(n, bool) or not isinstance(n, int) or n < 3:
            raise ValueError(f"--reps {n!r}: at least 3 timed generations are needed for a median and an IQR")
        return n

    @classmethod
    def args_from_protocol(cls, protocol: Optional[Mapping]) -> Dict[str, object]:
        """The constructor arguments a recorded protocol was made with (to re-make its spec)."""
        p = dict(protocol or {})
        keys = ("device", "batch", "threads", "compile", "warmup", "compute_units", "precision", "cuda_graphs")
        return {k: p[k] for k in keys if p.get(k) is not None}
