"""Core ML export of a VAR generator, and op counts of a saved package (both work on Linux).

The package is one ML program with a function per scale, ``scale_0`` … ``scale_{K-1}``, and a
``decode`` function, all over the same states (``ct.StateType``): the key and value cache of every
block ``k_cache_{i}``/``v_cache_{i}`` [2B, H_i, L', c] (L' = the token count L rounded up to the next
multiple of 32 above it) and the latent ``f_hat`` [B, Cvae, P, P] (``init_states``). Every function
declares every state, so one state made from any function serves the whole generation; Core ML refuses
to convert a declared state that a function does not use, so ``scale_0`` clears ``f_hat`` (a new
generation) and ``decode`` clears the caches' first padding position L (never read: attention reads
[0, end_si)); those writes are in the functions' op counts and times (var-d16's decode: 32 one-position
cache writes).
Whether one ``MLState`` may be passed to the functions of one package loaded as separate ``MLModel``
objects is the Core ML runtime's to say (macOS 15); it has not been run here.
The host keeps the loop that Core ML cannot express well (seeded top-k/top-p sampling, CFG mixing):

    logits = scale_0(label)                        # class embedding, start tokens, blocks, head
    for si in 1 … K-1:
        idx = sample(cfg_mix(logits, si))           # on the host
        logits = scale_si(label, idx)               # f_hat += φ(up(embed(idx))), next input, blocks
    image = decode(sample(cfg_mix(logits, K-1)))   # f_hat += φ(embed(idx)), VQVAE decoder

Inside a function everything is fixed-shape: scale si writes its keys and values at the static
positions [begin_si, end_si) of the cache and attends over [0, end_si) with Core ML's fused
``scaled_dot_product_attention`` op (one fixed form, so op counts are stable; the model's attention
scale, 1 for cosine attention, is folded into q because that op always divides by √c), the AdaLN
vectors are computed from the label as official. The bicubic upsampling of the quantiser (Core ML has no
bicubic) and the area downsampling are constant matrices, built by applying PyTorch's own
``F.interpolate`` to a basis, so they are the same linear maps. fp16 weights and activations by
default (``precision="fp32"`` keeps fp32).

Deviations from the design it follows: the per-scale functions are traced and converted one by one
with static shapes and merged with ``coremltools.utils.save_multifunction``, which stores each
distinct weight once, rather than materialised from one bounded-shape program (the cache offsets
differ per scale, so the scales are not one program with different shapes). Token policies are not
exported (a method must change weights only).
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

PRECISIONS = ("fp16", "fp32")


def interp_matrix(src: int, dst: int, mode: str) -> torch.Tensor:
    """[dst², src²] matrix M with interpolate(h, (dst, dst), mode).flatten() == M @ h.flatten() per channel."""
    basis = torch.eye(src * src, dtype=torch.float64).view(src * src, 1, src, src)
    out = F.interpolate(basis, size=(dst, dst), mode=mode)
    return out.view(src * src, dst * dst).T.float().contiguous()


def init_states(gen, batch: int) -> Dict[str, torch.Tensor]:
    """The package's states, zeroed: every block's K/V cache [2B, H_i, L', c] and f_hat [B, Cvae, P, P].
    The cache length L' is the next multiple of 32 above the token count (stateful models with other
    state sizes have been reported to fail on the Neural Engine; at least one padding position, which
    ``decode`` writes so that it uses the caches); attention reads only [0, end_si)."""
    var, P = gen.var, gen.patch_nums[-1]
    L_pad = (var.L // 32 + 1) * 32
    out = {}
    for i, b in enumerate(var.blocks):
        out[f"k_cache_{i}"] = torch.zeros(2 * batch, b.attn.H, L_pad, b.attn.c)
        out[f"v_cache_{i}"] = torch.zeros(2 * batch, b.attn.H, L_pad, b.attn.c)
    out["f_hat"] = torch.zeros(batch, var.Cvae, P, P)
    return out


class _Export(nn.Module):
    """Shared pieces: the generator, its states, the quantiser step. ``states`` (``init_states``) may
    be shared by all functions of a package, as Core ML shares them (one copy in memory)."""

    def __init__(self, gen, batch: int, states: Optional[Dict[str, torch.Tensor]] = None):
        super().__init__()
        var, vae = gen.var, gen.vae
        self.var, self.vae, self.B = var, vae, batch
        self.K, self.P, self.L = len(gen.patch_nums), gen.patch_nums[-1], var.L
        for name, t in (states if states is not None else init_states(gen, batch)).items():
            self.register_buffer(name, t)

    def state_shapes(self) -> Dict[str, tuple]:
        """Every state, in every function (the module docstring says why)."""
        return {n: tuple(b.shape) for n, b in self.named_buffers() if n.startswith(("k_cache_", "v_cache_", "f_hat"))}

    def add_scale(self, si: int, idx_Bl: torch.Tensor, first: bool) -> None:
        """f_hat (+)= φ_si(up(embed(idx))) (official ``get_next_autoregressive_input``); ``first``
        overwrites, so no zeroing of the state is needed between generations."""
        quant, B, C = self.vae.quantize, self.B, self.var.Cvae
        h_BCl = quant.embedding(idx_Bl).transpose(1, 2)
        if si != self.K - 1:
            up = getattr(self, f"up_{si}")
            h_BCl = h_BCl @ up.T
        h_BChw = quant.quant_resi[si](h_BCl.reshape(B, C, self.P, self.P))
        if first:
            self.f_hat[:] = h_BChw
        else:
            self.f_hat.add_(h_BChw)


def _attention(attn, x_BLC, k_cache, v_cache, begin: int, end: int):
    """SelfAttention.forward with the cache written at static positions, as one fused attention op."""
    B, L, _ = x_BLC.shape
    bias = torch.cat((attn.q_bias, attn.zero_k_bias, attn.v_bias))
    qkv = F.linear(x_BLC, attn.mat_qkv.weight, bias).view(B, L, 3, attn.H, attn.c).permute(2, 0, 3, 1, 4)
    q_BHLc, k_BHLc, v_BHLc = qkv[0], qkv[1], qkv[2]
    if attn.l2_norm:
        q_BHLc = F.normalize(q_BHLc, dim=-1) * attn.scale_mul_1H11.clamp_max(attn.max_scale_mul).exp()
        k_BHLc = F.normalize(k_BHLc, dim=-1)
    k_cache[:, :, begin:end] = k_BHLc
    v_cache[:, :, begin:end] = v_BHLc
    # Core ML's fused attention op takes no scale (it divides by √c): fold the model's scale into q.
    q_BHLc = q_BHLc * (attn.scale * math.sqrt(attn.c))
    o_BHLc = F.scaled_dot_product_attention(q_BHLc, k_cache[:, :, :end], v_cache[:, :, :end])
    return attn.proj(o_BHLc.transpose(1, 2).reshape(B, L, attn.H * attn.c))


class ScaleStep(_Export):
    """Function ``scale_{si}``: (label [B], tokens of scale si−1 [B, pn²]) → logits [2B, pn², V]."""

    def __init__(self, gen, si: int, batch: int = 1, states: Optional[Dict[str, torch.Tensor]] = None):
        super().__init__(gen, batch, states)
        self.si = si
        pns = gen.patch_nums
        if si > 0:   # constants, not weights (persistent=False): scale si−1 is never the last one (decode adds it)
            self.register_buffer(f"up_{si - 1}", interp_matrix(pns[si - 1], self.P, "bicubic"), persistent=False)
            self.register_buffer("down", interp_matrix(self.P, pns[si], "area"), persistent=False)

    def forward(self, label_B: torch.Tensor, idx_Bl: Optional[torch.Tensor] = None) -> torch.Tensor:
        var, si, B = self.var, self.si, self.B
        label_B = label_B.long()
        cond_2BD = var.cond(torch.cat((label_B, torch.full_like(label_B, var.num_classes))))
        begin, end = var.begin_ends[si]
        if si == 0:
            x_BLC = var.first_tokens(cond_2BD)
            self.f_hat[:] = torch.zeros_like(self.f_hat)   # a new generation (scale 1 overwrites it anyway)
        else:
            self.add_scale(si - 1, idx_Bl.long(), first=si == 1)
            nxt_BCl = self.f_hat.reshape(B, var.Cvae, self.P * self.P) @ self.down.T
            x_BLC = var.word_embed(nxt_BCl.transpose(1, 2)) + var.lvl_pos()[:, begin:end]
            x_BLC = torch.cat((x_BLC, x_BLC))
        cond = var.shared_ada_lin(cond_2BD)
        for i, b in enumerate(var.blocks):
            ada = b.ada(cond)
            gamma1, gamma2, scale1, scale2, shift1, shift2 = ada.unbind(2)
            h = b.ln_wo_grad(x_BLC) * (scale1 + 1) + shift1
            x_BLC = x_BLC + _attention(b.attn, h, getattr(self, f"k_cache_{i}"), getattr(self, f"v_cache_{i}"),
                                       begin, end) * gamma1
            h = b.ln_wo_grad(x_BLC) * (scale2 + 1) + shift2
            x_BLC = x_BLC + b.ffn(h) * gamma2
        return var.get_logits(x_BLC, cond_2BD)


class Decode(_Export):
    """Function ``decode``: tokens of the last scale [B, P²] → image [B, 3, H, W] in [-1, 1]."""

    def forward(self, idx_Bl: torch.Tensor) -> torch.Tensor:
        L = self.L
        for i in range(len(self.var.blocks)):   # one padding position, never read: the function uses every state
            for cache in (getattr(self, f"k_cache_{i}"), getattr(self, f"v_cache_{i}")):
                cache[:, :, L:L + 1] = torch.zeros_like(cache[:, :, L:L + 1])
        self.add_scale(self.K - 1, idx_Bl.long(), first=False)
        return self.vae.fhat_to_img(self.f_hat)


def steps(gen, batch: int = 1) -> Dict[str, _Export]:
    """The export modules by function name, sharing the generator's parameters and one set of states
    (so calling them in order in PyTorch runs a generation as the package does)."""
    states = init_states(gen, batch)
    out: Dict[str, _Export] = {f"scale_{si}": ScaleStep(gen, si, batch, states) for si in range(len(gen.patch_nums))}
    out["decode"] = Decode(gen, batch, states)
    return out


def example_inputs(gen, name: str, batch: int = 1):
    pns = gen.patch_nums
    label = torch.zeros(batch, dtype=torch.int32)
    if name == "decode":
        return (torch.zeros(batch, pns[-1] ** 2, dtype=torch.int32),)
    si = int(name.split("_")[1])
    return (label,) if si == 0 else (label, torch.zeros(batch, pns[si - 1] ** 2, dtype=torch.int32))


# ------------------------------------------------------------------------------------------ conversion
class MissingDependency(ValueError):
    """A package the command needs is not installed (a user-fixable error)."""


def _ct():
    import logging
    log = logging.getLogger("coremltools")
    if sys.platform != "darwin":
        # before the import: off macOS it logs "Failed to load _MLModelAssetProxy" (no Core ML runtime
        # there, by design); on macOS that line would be a real fault, so it stays visible
        log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():   # "Torch version … has not been tested"
            warnings.simplefilter("ignore")
            import coremltools as ct
        log.setLevel(logging.ERROR)
    except ImportError:
        raise MissingDependency("Core ML export and op counts need coremltools: pip install 'coremltools>=8'") from None
    return ct


def export(gen, out: str | os.PathLike, batch: int = 1, precision: str = "fp16", progress: bool = True,
           metadata: Optional[dict] = None) -> Path:
    """Convert the generator to a multifunction ``.mlpackage`` at ``out`` (see the module docstring)."""
    import numpy as np
    from tqdm.auto import tqdm
    ct = _ct()
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: expected one of {PRECISIONS}")
    out = Path(out)
    if out.suffix != ".mlpackage":
        raise ValueError(f"--out {out}: a Core ML package path must end in .mlpackage")
    dtype = np.float16 if precision == "fp16" else np.float32
    policy = getattr(gen, "token_policy", None)
    if policy is not None and getattr(policy, "name", "identity") != "identity":
        # the package's per-scale functions run every token: exporting would silently drop the method
        raise ValueError(f"Core ML export of a token method ({policy.name}) is not supported: the package's "
                         f"per-scale functions compute every token; export the chain without it")
    gen = gen.eval().requires_grad_(False)
    tmp = Path(tempfile.mkdtemp(prefix="varbench-coreml-"))
    try:
        desc = ct.utils.MultiFunctionDescriptor()
        mods = steps(gen, batch)
        for name, mod in tqdm(mods.items(), desc="core ml functions", disable=not progress):
            ex = example_inputs(gen, name, batch)
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)   # coremltools 9 converts traces, not exports
                traced = torch.jit.trace(mod.eval(), ex, check_trace=False)
            names = ["label", "idx_prev"] if name.startswith("scale_") else ["idx_last"]
            inputs = [ct.TensorType(name=n, shape=tuple(t.shape), dtype=np.int32) for n, t in zip(names, ex)]
            states = [ct.StateType(wrapped_type=ct.TensorType(shape=s, dtype=dtype), name=n)
                      for n, s in mod.state_shapes().items()]
            # coremltools draws a progress bar per pass pipeline on stderr: kept only with progress on
            quiet = contextlib.redirect_stderr(io.StringIO()) if not progress else contextlib.nullcontext()
            with quiet:
                ml = ct.convert(traced, inputs=inputs, states=states,
                                outputs=[ct.TensorType(name="image" if name == "decode" else "logits", dtype=dtype)],
                                convert_to="mlprogram", minimum_deployment_target=ct.target.iOS18,
                                compute_precision=ct.precision.FLOAT16 if precision == "fp16" else ct.precision.FLOAT32)
            path = tmp / f"{name}.mlpackage"
            ml.save(str(path))
            desc.add_function(str(path), src_function_name="main", target_function_name=name)
        desc.default_function_name = "scale_0"
        # staged beside ``out`` (one filesystem: the renames below are atomic), an existing package set
        # aside there and removed only once the new one is in place
        out.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
        try:
            staged, old = stage / "new.mlpackage", stage / "old.mlpackage"
            with contextlib.redirect_stderr(io.StringIO()) if not progress else contextlib.nullcontext():
                ct.utils.save_multifunction(desc, str(staged))
            if metadata:
                (staged / "varbench.json").write_text(json.dumps(metadata, indent=1, sort_keys=True))
            if out.exists():
                os.replace(out, old)
            try:
                os.replace(staged, out)   # the package appears complete or not at all
            except BaseException:
                if old.exists():
                    os.replace(old, out)
                raise
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# ------------------------------------------------------------------------------------------ op counts
def _ops(block) -> List[str]:
    out = []
    for op in block.operations:
        out.append(op.type)
        for b in op.blocks:
            out += _ops(b)
    return out


def op_counts(package: str | os.PathLike) -> Dict[str, Dict[str, int]]:
    """{function: {op type: count}} of a saved package, read from its spec (no Core ML runtime)."""
    ct = _ct()
    path = Path(package)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such Core ML package")
    from google.protobuf.message import DecodeError
    try:
        spec = ct.utils.load_spec(str(path))
    except (RuntimeError, DecodeError, OSError) as e:
        # coremltools says only "valid manifest does not exist" or "wire format was corrupt"
        raise ValueError(f"{path}: not a readable Core ML package ({type(e).__name__}: {e}); "
                         f"write one with `varbench coreml export MODEL --out X.mlpackage`") from e
    if spec.WhichOneof("Type") != "mlProgram":
        raise ValueError(f"{path}: not an ML program (op counts need one)")
    out = {}
    for fname, fn in sorted(spec.mlProgram.functions.items()):
        block = fn.block_specializations[fn.opset]
        out[fname] = dict(sorted(Counter(_ops(block)).items()))
    return out


def total_ops(counts: Dict[str, Dict[str, int]]) -> int:
    """Non-const ops over all functions of ``op_counts`` output (consts are not dispatched)."""
    return sum(n for ops in counts.values() for t, n in ops.items() if t != "const")


def weights_bytes(package: str | os.PathLike) -> int:
    """Bytes of the package's weight files (what a pruned model shrinks)."""
    return sum(p.stat().st_size for p in Path(package).rglob("*") if p.is_file() and "weights" in p.parts)


# ------------------------------------------------------------------------------------------ macOS: run and place
from bench.defaults import COMPUTE_UNITS  # noqa: E402

DEVICE_OF = {"MLCPUComputeDevice": "cpu", "MLGPUComputeDevice": "gpu", "MLNeuralEngineComputeDevice": "npu"}


MACOS_MIN = 15   # the package's states and per-function loading (iOS 18 / macOS 15 deployment target)


def require_macos(what: str) -> None:
    if platform.system() != "Darwin":
        raise ValueError(f"{what} runs on macOS only (the Core ML runtime is not on {platform.system()}); "
                         f"here `varbench coreml export` and `varbench coreml ops` work")
    version = platform.mac_ver()[0]
    if version and int(version.split(".")[0]) < MACOS_MIN:   # said now, not by coremltools after the export
        raise ValueError(f"{what} needs macOS {MACOS_MIN} or later (the package's states and functions target "
                         f"macOS {MACOS_MIN}); this Mac runs macOS {version}")


def check_compute_units(cu: str) -> str:
    if cu not in COMPUTE_UNITS:
        raise ValueError(f"compute units {cu!r}: expected one of {', '.join(COMPUTE_UNITS)}")
    return cu


# The only calls into the Core ML runtime (macOS); everything around them is plain Python and tested
# on Linux with these two replaced.
def _mlmodel(package, compute_units: str, function_name: str):
    ct = _ct()
    return ct.models.MLModel(str(package), compute_units=getattr(ct.ComputeUnit, compute_units),
                             function_name=function_name)


def _compute_plan(package, compute_units: str):
    ct = _ct()
    from coremltools.models.compute_plan import MLComputePlan
    compiled = ct.models.utils.compile_model(str(package))
    return MLComputePlan.load_from_path(str(compiled), compute_units=getattr(ct.ComputeUnit, compute_units))


def _walk(block):
    for op in block.operations:
        yield op
        for b in op.blocks:
            yield from _walk(b)


def placement(package, compute_units: str) -> Dict[str, Dict[str, int]]:
    """{function: {cpu, gpu, npu, none: op count}}: each non-const op's preferred compute device in
    the compiled program under ``compute_units`` (MLComputePlan, macOS ≥ 14.4)."""
    require_macos("op placement (MLComputePlan)")
    check_compute_units(compute_units)
    plan = _compute_plan(package, compute_units)
    out = {}
    for fname, fn in sorted(plan.model_structure.program.functions.items()):
        c = Counter()
        for op in _walk(fn.block):
            if op.operator_name.split(".")[-1] == "const":
                continue
            usage = plan.get_compute_device_usage_for_mlprogram_operation(op)
            c["none" if usage is None else DEVICE_OF.get(type(usage.preferred_compute_device).__name__, "other")] += 1
        out[fname] = {k: c.get(k, 0) for k in ("cpu", "gpu", "npu", "none")} | \
            ({"other": c["other"]} if c.get("other") else {})
    return out


class CoreMLGenerator:
    """A package's functions driven by the host loop (seeded top-k/top-p and CFG as ``Generator``),
    with ``generate`` and ``sample_tokens`` so the latency bench times it like a PyTorch model."""

    def __init__(self, package, compute_units: str, patch_nums, num_classes: int):
        require_macos("Core ML inference")
        self.compute_units = check_compute_units(compute_units)
        self.patch_nums, self.num_classes = tuple(patch_nums), num_classes
        names = [f"scale_{i}" for i in range(len(self.patch_nums))] + ["decode"]
        t0 = time.perf_counter()
        self.models = {n: _mlmodel(package, compute_units, n) for n in names}
        self.load_s = time.perf_counter() - t0

    def sample_tokens(self, labels_B, seed: Optional[int] = 0, cfg: float = 1.5, top_k: int = 0, top_p: float = 0.0,
                      more_smooth: bool = False, logits_hook=None):
        import numpy as np

        from bench.models.generator import sample_top_k_top_p
        if more_smooth:
            raise ValueError("more_smooth is not exported to Core ML")
        if cfg is None:
            raise ValueError("the Core ML package is built for CFG (cfg=None is not exported)")
        B, K = labels_B.shape[0], len(self.patch_nums)
        rng = None if seed is None else torch.Generator().manual_seed(int(seed))
        state = self.models["scale_0"].make_state()
        label = labels_B.cpu().numpy().astype(np.int32)
        tokens, idx = [], None
        for si in range(K):
            feed = {"label": label} if si == 0 else {"label": label, "idx_prev": idx.numpy().astype(np.int32)}
            logits_2BlV = torch.from_numpy(np.asarray(self.models[f"scale_{si}"].predict(feed, state=state)["logits"])).float()
            if logits_hook is not None:
                logits_hook(si, logits_2BlV)
            t = cfg * si / (K - 1)
            idx = sample_top_k_top_p((1 + t) * logits_2BlV[:B] - t * logits_2BlV[B:], top_k, top_p, rng)
            tokens.append(idx)
        return tokens, (idx, state)

    def fhat_to_img(self, handle):
        import numpy as np
        idx, state = handle
        img = self.models["decode"].predict({"idx_last": idx.numpy().astype(np.int32)}, state=state)["image"]
        return torch.from_numpy(np.asarray(img)).float()

    def generate(self, labels_B, seed: Optional[int] = 0, cfg: float = 1.5, top_k: int = 0, top_p: float = 0.0,
                 more_smooth: bool = False):
        _, handle = self.sample_tokens(labels_B, seed, cfg, top_k, top_p, more_smooth)
        return self.decode_uint8(handle)

    def decode_uint8(self, handle):
        from bench.models.generator import to_uint8
        return to_uint8(self.fhat_to_img(handle).clamp_(-1, 1).add_(1).mul_(0.5))
