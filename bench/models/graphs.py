"""Per-scale CUDA graphs of a VAR generation: each scale's blocks and head replayed as one launch.

Why: at batch 1 a GPU spends a VAR scale's time launching kernels, not running them (var-d16 on an
H200: 9.0 ms per pass through the blocks whatever its FLOPs; each pass is hundreds of small kernels). A CUDA graph
records a scale's kernel sequence once and replays it with a single launch, with the same kernels on
the same addresses, so the values are those of the eager pass: after capture every graph is replayed
once on seeded inputs and checked against the warm-up's eager pass (``ScaleGraphs._check``).

What is captured, per scale ``si``: ``VAR.run_blocks`` and ``VAR.get_logits`` on static input buffers
(the condition, the scale's input tokens). Each block's KV cache is one buffer [2B, H, L, c] bound to
the attention module before the pass, so the pass writes the scale's keys and values at
``[begin_si, end_si)`` and attends over ``[0, end_si)``: the same in-place cache, views and shapes as
the eager sampler's (``SelfAttention._cache``). Scale 0's graph also computes the AdaLN vectors from
the condition, which the later graphs read. Everything else stays eager in ``Generator.sample_tokens``:
the CFG mix, top-k/top-p and the seeded multinomial draw, the quantiser step and the next scale's
input (about 20 launches a scale), and the VQVAE decode.

Scope: the identity token policy (dense and weight-pruned models). A token method chooses which
tokens run per generation, which a fixed graph cannot follow. One set of graphs per batch size,
rebuilt when the model's tensors are replaced (``fingerprint``: addresses, shapes, strides, dtypes);
a weight edited in place is read by the graphs as it is. The logits a scale returns live in the
graph's output buffer until that scale is replayed again (the next generation).

``capture`` turns one step into a replayable one: ``cuda_capture`` records a ``torch.cuda.CUDAGraph``
(warm-up first on a side stream, as PyTorch's graph docs prescribe, and that stream captures; every
scale in one memory pool, replayed in capture order; the model must be on the current CUDA device);
``eager_capture`` replays by running the step again and copying its outputs into the first run's
tensors, the same buffer protocol without a GPU. The test suite runs the
eager protocol on the CPU (tokens equal to the eager sampler's, bit for bit); the CUDA capture is run
by ``tests/device/gpu_checks.sh`` on a GPU (CI has none).
"""
from __future__ import annotations

import contextlib
import time
import warnings
from typing import Callable, List, Sequence, Tuple

import torch

Step = Callable[[], Tuple[torch.Tensor, ...]]
Capture = Callable[[Step, object, object], Tuple[Callable[[], None], Tuple[torch.Tensor, ...]]]


def cuda_capture(step: Step, pool, stream) -> Tuple[Callable[[], None], Tuple[torch.Tensor, ...]]:
    """(replay, the step's output tensors) of a CUDA graph recorded from ``step`` on ``stream`` in
    ``pool``. A graph that recorded nothing (work sent to another device's stream) is an error: its
    replays would leave the outputs as they are."""
    graph = torch.cuda.CUDAGraph()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            outs = step()
    for w in caught:
        if "graph is empty" in str(w.message).lower():
            raise RuntimeError(f"the captured CUDA graph is empty ({w.message}): the model's tensors are not on "
                               f"the current CUDA device")
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return graph.replay, outs   # the bound method keeps the graph alive


def eager_capture(step: Step, pool=None, stream=None) -> Tuple[Callable[[], None], Tuple[torch.Tensor, ...]]:
    """The graph protocol without a GPU: (replay = run ``step`` again and copy its outputs into the first
    run's, those first outputs)."""
    outs = step()

    def replay() -> None:
        for dst, src in zip(outs, step()):
            dst.copy_(src)
    return replay, outs


def fingerprint(var, batch2: int) -> tuple:
    """What the graphs were captured on: the batch and every parameter's and buffer's address, shape,
    strides and dtype (0.50 ms a generation for var-d16's 220 tensors on a 2-core CPU, measured)."""
    return (batch2,) + tuple((t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)
                             for t in (*var.parameters(), *var.buffers()))


CHECK_ATOL = 1e-3   # |Δ logits| above which a replay is wrong, not rounded differently


def check_current_device(device) -> None:
    """Streams, capture and replay follow the current CUDA device; work for another device's tensors
    would not be recorded."""
    current = torch.device("cuda", torch.cuda.current_device())
    if torch.device(device) != current:
        raise ValueError(f"CUDA graphs: the model is on {device} but the current CUDA device is {current}: "
                         f"call torch.cuda.set_device({str(device)!r}) first")


def pool_bytes(pool, device) -> int:
    """Bytes of the CUDA segments that belong to the graph memory pool ``pool`` on ``device``."""
    index = torch.device(device).index
    return sum(seg["total_size"] for seg in torch.cuda.memory_snapshot()
               if seg.get("device") == index and tuple(seg.get("segment_pool_id", ())) == tuple(pool))


class ScaleGraphs:
    """The captured scales of one VAR transformer at one batch size ([cond; uncond] rows: ``batch2``)."""

    def __init__(self, var, batch2: int, capture: Capture = cuda_capture, warmup: int = 2):
        self.var, self.key = var, fingerprint(var, batch2)
        like = var.pos_1LC
        on_gpu = capture is cuda_capture
        if on_gpu:
            check_current_device(like.device)
        new = lambda *shape: torch.zeros(*shape, dtype=like.dtype, device=like.device)  # noqa: E731
        self.cond_2BD = new(batch2, var.C)
        self.x = [new(batch2, pn * pn, var.C) for pn in var.patch_nums]
        self.kv = [(new(batch2, b.attn.H, var.L, b.attn.c), new(batch2, b.attn.H, var.L, b.attn.c))
                   for b in var.blocks]
        # seeded inputs for the warm-up and the check after capture (zeros would test little)
        rng = torch.Generator(device=like.device).manual_seed(0)
        for t in (self.cond_2BD, *self.x):
            t.normal_(generator=rng)
        self.ada: Sequence[torch.Tensor] = ()
        self.head_ada = None
        # one pool for the K graphs (replayed in capture order, never at once) and a stream of their own
        # for warm-up and capture (a capture stream shared with other graphs shares its cuBLAS workspace)
        pool = torch.cuda.graph_pool_handle() if on_gpu else None
        stream = torch.cuda.Stream(device=like.device) if on_gpu else None
        t0 = time.perf_counter()
        with torch.no_grad():
            try:
                eager = self._warm_up(warmup, stream)
                self.replays: List[Callable[[], None]] = []
                self.logits: List[torch.Tensor] = []
                for si in range(len(var.patch_nums)):
                    replay, outs = capture(lambda si=si: self._step(si), pool, stream)
                    if si == 0:   # the AdaLN vectors the later scales' graphs read
                        self.ada, self.head_ada = outs[1:-1], outs[-1]
                    self.replays.append(replay)
                    self.logits.append(outs[0])
                self.max_abs_diff = self._check(eager)
            finally:
                var.kv_caching(False)
        if on_gpu:
            torch.cuda.synchronize(like.device)
        self.capture_s = time.perf_counter() - t0
        # what the graphs hold while they live: the static inputs and KV buffers, and on the GPU the
        # segments of their pool (outputs and intermediates, kept for the replays)
        static = [self.cond_2BD, *self.x, *(t for kv in self.kv for t in kv)]
        held = sum(t.numel() * t.element_size() for t in static)
        self.held_mb = (held + (pool_bytes(pool, like.device) if on_gpu else 0)) / 2 ** 20

    def matches(self, var, batch2: int) -> bool:
        return var is self.var and fingerprint(var, batch2) == self.key

    def _warm_up(self, n: int, stream) -> List[torch.Tensor]:
        """Every scale run ``n`` times before capture (cuBLAS handles, kernel choices, the allocator's
        blocks), on the capture's side stream on the GPU (``stream``; None: here). Returns the last
        run's logits of every scale: the eager pass the graphs are checked against."""
        on_gpu = stream is not None
        if on_gpu:
            stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream) if on_gpu else contextlib.nullcontext():
            for _ in range(n):
                outs = self._step(0)
                self.ada, self.head_ada = outs[1:-1], outs[-1]
                logits = [outs[0]] + [self._step(si)[0] for si in range(1, len(self.x))]   # fresh tensors: eager
        if on_gpu:
            torch.cuda.current_stream().wait_stream(stream)
        return logits

    def _check(self, eager: Sequence[torch.Tensor]) -> float:
        """Every graph replayed once, in order, on the warm-up's inputs, its outputs first set to NaN (a
        replay that records or computes nothing leaves them so): the largest |difference| from the eager
        pass's logits. More than ``CHECK_ATOL`` is an error; any difference is a warning, since the
        sampled tokens then need not be the eager sampler's."""
        for t in (*self.logits, *self.ada, self.head_ada):
            t.fill_(float("nan"))
        worst = 0.0
        for si, (replay, want) in enumerate(zip(self.replays, eager)):
            replay()
            diff = float((self.logits[si] - want).abs().max())
            if not diff <= CHECK_ATOL:
                raise RuntimeError(f"the CUDA graph of scale {si} does not reproduce the eager pass: max |Δ logits| "
                                   f"{diff:.3g} (a kernel outside the capture, or inputs not read from the static "
                                   f"buffers); run without CUDA graphs")
            worst = max(worst, diff)
        if worst:
            warnings.warn(f"the CUDA graphs' logits differ from the eager pass's by up to {worst:.3g}: the sampled "
                          f"tokens may differ from the eager sampler's", stacklevel=3)
        return worst

    def _step(self, si: int) -> Tuple[torch.Tensor, ...]:
        """Scale ``si``'s pass on the static buffers: (logits [2B, pn², V], and at scale 0 the AdaLN vectors
        of every block and of the head). Binding the cache is Python only: a graph keeps its offsets."""
        var = self.var
        begin, _ = var.begin_ends[si]
        for b, (k, v) in zip(var.blocks, self.kv):
            a = b.attn
            a.caching, a.kv_full, a.kv_k, a.kv_v, a.kv_len = True, var.L, k, v, begin
        if si == 0:
            ada, head_ada = var.ada_vectors(self.cond_2BD)
        else:
            ada, head_ada = self.ada, self.head_ada
        x_BLC = var.run_blocks(self.x[si], self.cond_2BD, None, None, ada)
        logits_BlV = var.get_logits(x_BLC, self.cond_2BD, head_ada)
        return (logits_BlV, *ada, head_ada) if si == 0 else (logits_BlV,)

    def run(self, si: int, x_BLC: torch.Tensor, cond_2BD: torch.Tensor) -> torch.Tensor:
        """Scale ``si``'s logits [2B, pn², V] for the input tokens ``x_BLC`` (scale 0: also the condition);
        the scales must run in order, 0 first, as the cache fills."""
        if si == 0:
            self.cond_2BD.copy_(cond_2BD)
        self.x[si].copy_(x_BLC)
        self.replays[si]()
        return self.logits[si]

