"""Every metric varbench reports, declared once: header, direction, format and meaning. Torch-free.

Records store metric values by these names (under ``metrics`` or, for costs, ``cost``); the renderer,
the leaderboard and ``varbench list metrics`` read the metadata from here, never from code that
computes them. A metric with a ``compute`` entry is also a callable, ``METRICS.get(name)(fake, ref,
**options) -> float``, imported on first call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from bench.metrics.mjhq import MJHQ_CATEGORIES, SHAPES_CATEGORIES
from bench.registry import METRICS

BETTER = ("lower", "higher", None)


@dataclass(frozen=True)
class MetricInfo:
    name: str
    header: str                 # column header in tables
    better: Optional[str]       # "lower" | "higher" | None (no direction, e.g. params)
    format: str                 # str.format of one value
    description: str
    compute: Optional[str] = None   # "module:attribute" of a callable computing it, if standalone

    def __post_init__(self):
        if self.better not in BETTER:
            raise ValueError(f"metric {self.name}: better must be one of {BETTER}, got {self.better!r}")

    @property
    def higher_is_better(self) -> Optional[bool]:
        return None if self.better is None else self.better == "higher"

    def __call__(self, *args: Any, **kwargs: Any) -> float:
        if self.compute is None:
            raise TypeError(f"metric {self.name!r} is computed by its bench, not on its own")
        import importlib
        module, _, attr = self.compute.partition(":")
        return getattr(importlib.import_module(module), attr)(*args, **kwargs)



for _m in (
    # fidelity (torch-fidelity over the world's feature extractor)
    MetricInfo("fid", "FID", "lower", "{:.2f}", "Fréchet distance between Gaussian fits of generated and reference features",
               "bench.metrics.fidelity:fid"),
    MetricInfo("is", "IS", "higher", "{:.2f}", "Inception Score: exp E KL(p(y|x) || p(y)) over logits_unbiased, mean over splits",
               "bench.metrics.fidelity:inception_score"),
    MetricInfo("kid", "KID", "lower", "{:.4f}", "Kernel Inception Distance: unbiased MMD² with a cubic polynomial kernel, mean over subsets",
               "bench.metrics.fidelity:kid"),
    MetricInfo("precision", "Precision", "higher", "{:.3f}", "fraction of generated samples inside the reference k=3 manifold",
               "bench.metrics.fidelity:precision"),
    MetricInfo("recall", "Recall", "higher", "{:.3f}", "fraction of reference samples inside the generated k=3 manifold",
               "bench.metrics.fidelity:recall"),
    MetricInfo("class_acc", "Class acc.", "higher", "{:.3f}",
               "fraction of samples the world's classifier assigns to their conditioning class"),
    # per prompt category (MJHQ-30K's ten, shapes-mjhq's six) and fidelity to the original model's outputs
    *(MetricInfo(f"fid_{c}", f"FID {c}", "lower", "{:.2f}", f"FID of the {c} prompts' images against that category's "
                 f"reference images") for c in (*MJHQ_CATEGORIES, *SHAPES_CATEGORIES)),
    MetricInfo("fid_mean", "FID (cat. mean)", "lower", "{:.2f}", "mean of the per-category FIDs"),
    MetricInfo("fid_star", "FID*", "lower", "{:.2f}",
               "FID between a run's images and the unmodified model's on the same conditions and seeds (all images)"),
    *(MetricInfo(f"fid_star_{c}", f"FID* {c}", "lower", "{:.2f}", f"FID* of the {c} prompts' images")
      for c in (*MJHQ_CATEGORIES, *SHAPES_CATEGORIES)),
    MetricInfo("fid_star_mean", "FID* (cat. mean)", "lower", "{:.2f}", "mean of the per-category FID*s"),
    MetricInfo("psnr", "PSNR", "higher", "{:.2f}", "PSNR (dB) of each image against the unmodified model's image "
               "for the same condition and seed, mean over pairs (identical pairs: 100 dB)"),
    MetricInfo("ssim", "SSIM", "higher", "{:.3f}", "SSIM (11×11 Gaussian window, σ 1.5) of each image against the "
               "unmodified model's, mean over pairs"),
    MetricInfo("lpips", "LPIPS", "lower", "{:.3f}", "LPIPS (AlexNet) of each image against the unmodified model's, "
               "mean over pairs"),
    MetricInfo("clip_score", "CLIP score", "higher", "{:.2f}", "100 · cosine(CLIP image, CLIP text), mean over samples"),
    MetricInfo("geneval", "GenEval", "higher", "{:.2f}", "GenEval overall score (mean over the six task types)"),
    *(MetricInfo(f"geneval_{t}", h, "higher", "{:.2f}", f"GenEval {t} accuracy: fraction of its images judged correct")
      for t, h in (("single_object", "Single obj."), ("two_object", "Two obj."), ("counting", "Counting"),
                   ("colors", "Colors"), ("position", "Position"), ("color_attr", "Color attr."))),
    MetricInfo("geneval_images", "Correct images", "higher", "{:.3f}", "GenEval: fraction of all images judged correct"),
    MetricInfo("geneval_prompts", "Correct prompts", "higher", "{:.3f}",
               "GenEval: fraction of prompts with at least one image judged correct"),
    # costs (in a record's ``cost`` block)
    MetricInfo("params", "Params", None, "{:,.0f}", "learnable parameters of the generator transformer"),
    MetricInfo("tokenizer_params", "Tokenizer params", None, "{:,.0f}", "learnable parameters of the tokenizer"),
    MetricInfo("text_encoder_params", "Text encoder params", None, "{:,.0f}",
               "learnable parameters of the text encoder (text-to-image models)"),
    MetricInfo("text_tokens", "Text tokens", None, "{:.0f}", "prompt length (text-encoder tokens) of the FLOP count"),
    MetricInfo("flops", "FLOPs", None, "{:.3g}", "transformer FLOPs to sample one image, CFG doubling included"),
    MetricInfo("flops_no_cfg", "FLOPs (no CFG)", None, "{:.3g}", "transformer FLOPs to sample one image without CFG"),
    MetricInfo("latency_ms", "Latency (ms)", "lower", "{:.1f}",
               "median wall-clock time of one full generation of the latency bench's batch (batch 1: one image)"),
    MetricInfo("peak_mem_mb", "Peak mem (MiB)", "lower", "{:.0f}",
               "peak memory of one generation as if the configuration ran alone: its weights + the peak working memory "
               "(CUDA max allocated / PyTorch's CPU allocator)"),
    MetricInfo("latency_ms_per_image", "ms / image", "lower", "{:.1f}",
               "sampling wall time of the run divided by its images (batched, this machine)"),
    MetricInfo("ops_cpu", "#CPU ops", None, "{:.0f}", "Core ML: non-const ops whose preferred device is the CPU (MLComputePlan), all functions"),
    MetricInfo("ops_gpu", "#GPU ops", None, "{:.0f}", "Core ML: non-const ops whose preferred device is the GPU (MLComputePlan), all functions"),
    MetricInfo("ops_npu", "#NPU ops", None, "{:.0f}", "Core ML: non-const ops whose preferred device is the Neural Engine, all functions"),
    MetricInfo("package_ops", "#ops (package)", None, "{:.0f}",
               "non-const ops of the exported Core ML package, all functions (read from the package; Linux too)"),
    MetricInfo("images_per_s", "Images / s", "higher", "{:.2f}",
               "throughput: images per second (a run's batched sampling, or the latency bench's batch / median)"),
):
    METRICS.register(_m.name, _m)
