"""Recipes that train the tiny world from scratch (``make tiny-models`` / ``varbench train-tiny``).

Three models, trained in order with fixed seeds on tinyshapes, written to ``assets/tiny/`` with a
manifest (sha256, recipe, seed, git commit, training curves, quality figures):

1. ``tiny_vqvae.safetensors`` — the VQVAE class in the tiny config. Loss: MSE + L1 reconstruction
   + VAR's VQ/commitment loss (β = 0.25). Deviation from VAR's tokenizer recipe (which adds LPIPS
   and a GAN loss): no perceptual or adversarial loss (their weights cannot be downloaded here), and
   dead codebook entries are re-seeded from encoder outputs every ``restart_every`` steps.
2. ``feature_cnn.safetensors`` — the tinyshapes classifier behind the ``tinyshapes-cnn`` feature
   extractor (FID/IS/KID/precision/recall of the tiny world).
3. ``tiny_var.safetensors`` — the VAR class in the tiny config, trained as VAR is: next-scale
   cross-entropy over the token pyramid with teacher forcing under the block-causal mask, class
   dropout 0.1 for CFG, AdamW, linear warm-up then cosine decay.

Every recipe pins its intra-op thread count (``threads``): float reductions are split across
threads, so a checkpoint is reproducible bit for bit only with the thread count it was trained
with. Each stage runs under its count, the caller's count is restored afterwards, and the stage's
manifest entry records the count in effect (``threads``). The VQVAE and tiny-var recipes run on 2
threads, the feature CNN on 1 (its convolution gradients differ with every thread count).

Every stage (and the tiny-var quality measurement) is also pinned to one SIMD level (``isa: avx2``),
so that it reproduces on any x86-64 machine with AVX2 (all since 2013), not only on the trainer's:
AVX2 and AVX-512 kernels round differently. A stage runs in a child process started with
``ATEN_CPU_CAPABILITY=avx2`` (PyTorch's own kernels), ``MKL_CBWR=AVX2`` (MKL's conditional
numerical reproducibility: the AVX2 code path on any newer CPU) and ``ONEDNN_MAX_CPU_ISA=AVX2``
(oneDNN convolutions). Each of the three changes the feature CNN's bits when left to the machine
(measured on an AVX-512 machine); the variables must be set before torch starts, hence the child
process, which receives the parent's recipes verbatim (consecutive stages pinned to one level share
a child; each seeds itself and pins its threads, so the bytes are the same). The manifest records
``isa``, the variables (``isa_env``) and the level torch reports (``cpu_capability``).
``--no-isa-pin`` trains with the machine's own kernels (faster on AVX-512; the entry then says
``isa: null``, and the files reproduce only on machines of the same level).
"""
from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from bench.data import tinyshapes
from bench.data.tokens import tokenize_images
from bench.io import git_commit
from bench.models.generator import Generator, to_uint8
from bench.models.var import VAR
from bench.models.vqvae import VQVAE
from bench.tiny import configs

# ``threads`` only selects the thread count a stage runs under (see ``pinned_threads``); the
# training functions never read it.
VAE_RECIPE = dict(seed=0, steps=1500, batch=64, lr=2e-3, warmup=100, pool=16384, restart_every=100, l1=0.5,
                  threads=2, isa="avx2")
VAR_RECIPE = dict(seed=0, steps=3000, batch=64, lr=2e-3, wd=0.05, warmup=150, pool=24576, threads=2, isa="avx2")
CNN_RECIPE = dict(seed=0, epochs=6, batch=128, lr=2e-3, pool=12288, threads=1, isa="avx2")
# The environment that pins every CPU library torch uses to one SIMD level (see the module docstring).
ISA_ENV = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}}
EVAL_THREADS = 2  # the tiny-var quality measurement (sampling + metrics) runs under this count
EVAL_ISA = "avx2"  # ... and SIMD level, so that the manifest's quality figures reproduce too
VAE_VAL, CNN_VAL = 512, 2048  # held-out ``val`` images for the VQVAE's PSNR and the CNN's accuracy


@contextlib.contextmanager
def pinned_threads(n: int) -> Iterator[int]:
    """Run the body with exactly ``n`` intra-op threads; the previous count is restored after."""
    prev = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(prev)


def _lr(step: int, total: int, base: float, warmup: int) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    return base * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def psnr(a_uint8: torch.Tensor, b_uint8: torch.Tensor) -> float:
    mse = (a_uint8.float() - b_uint8.float()).square().mean().item()
    return 10 * math.log10(255 ** 2 / max(mse, 1e-10))


@torch.no_grad()
def vae_psnr(vae: VQVAE, imgs_uint8: torch.Tensor, batch: int = 256) -> float:
    vae.eval()
    rec = torch.cat([to_uint8(vae.reconstruct(tinyshapes.to_pm1(imgs_uint8[i:i + batch])).add(1).mul(0.5))
                     for i in range(0, len(imgs_uint8), batch)])
    return psnr(rec, imgs_uint8)


def train_vqvae(recipe: Optional[dict] = None, progress: bool = True) -> (VQVAE, dict):
    recipe = recipe or VAE_RECIPE
    torch.manual_seed(recipe["seed"])
    imgs, _ = tinyshapes.generate(recipe["pool"], "train")
    val, _ = tinyshapes.generate(VAE_VAL, "val")
    vae = VQVAE(configs.TINY_VAE).train()
    opt = torch.optim.AdamW(vae.parameters(), lr=recipe["lr"], betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(recipe["seed"])
    hits_V = torch.zeros(configs.TINY_VAE.vocab_size)
    curve: List[dict] = []
    bar = tqdm(range(recipe["steps"]), desc="tiny VQVAE", disable=not progress)
    for step in bar:
        for pg in opt.param_groups:
            pg["lr"] = _lr(step, recipe["steps"], recipe["lr"], recipe["warmup"])
        x = tinyshapes.to_pm1(imgs[torch.randint(len(imgs), (recipe["batch"],), generator=g)])
        rec, vq_loss, hits = vae(x)
        rec_loss = F.mse_loss(rec, x) + recipe["l1"] * F.l1_loss(rec, x)
        loss = rec_loss + vq_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        hits_V += hits
        if (step + 1) % recipe["restart_every"] == 0 and step + 1 < recipe["steps"] * 0.8:
            _restart_dead_codes(vae, x, hits_V, g)
            hits_V.zero_()
        if step % 50 == 0 or step == recipe["steps"] - 1:
            curve.append({"step": step, "loss": round(loss.item(), 5), "rec": round(rec_loss.item(), 5)})
            bar.set_postfix(rec=f"{rec_loss.item():.4f}", vq=f"{vq_loss.item():.4f}")
    vae.eval().requires_grad_(False)
    return vae, {"curve": curve, "val_psnr_db": round(vae_psnr(vae, val), 3)}


@torch.no_grad()
def _restart_dead_codes(vae: VQVAE, x: torch.Tensor, hits_V: torch.Tensor, g: torch.Generator) -> None:
    dead = (hits_V == 0).nonzero().flatten()
    if len(dead) == 0:
        return
    f_NC = vae.quant_conv(vae.encoder(x)).permute(0, 2, 3, 1).reshape(-1, vae.Cvae)
    pick = torch.randint(len(f_NC), (len(dead),), generator=g)
    vae.quantize.embedding.weight.data[dead] = f_NC[pick] + 0.01 * torch.randn(len(dead), vae.Cvae, generator=g)


def train_var(vae: VQVAE, recipe: Optional[dict] = None, progress: bool = True,
              init: Optional[VAR] = None, snapshot: Optional[Path] = None) -> (VAR, dict):
    """``snapshot``: also save the weights there every 500 steps (to watch a long run)."""
    recipe = recipe or VAR_RECIPE
    torch.manual_seed(recipe["seed"])
    imgs, labels = tinyshapes.generate(recipe["pool"], "train")
    tokens = tokenize_images(vae, imgs, progress=progress)
    var = init if init is not None else VAR(configs.TINY_VAR)
    if init is None:
        init_var_weights(var)
    gen = Generator(var, vae).train()
    vae.eval()
    decay = [p for n, p in var.named_parameters() if p.ndim >= 2 and "pos_" not in n and "embed" not in n]
    no_decay = [p for n, p in var.named_parameters() if not (p.ndim >= 2 and "pos_" not in n and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": recipe["wd"]}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=recipe["lr"], betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(recipe["seed"] + 1)
    curve: List[dict] = []
    bar = tqdm(range(recipe["steps"]), desc="tiny VAR", disable=not progress)
    for step in bar:
        for pg in opt.param_groups:
            pg["lr"] = _lr(step, recipe["steps"], recipe["lr"], recipe["warmup"])
        idx = torch.randint(len(labels), (recipe["batch"],), generator=g)
        loss = gen.loss(labels[idx], [t[idx] for t in tokens])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(var.parameters(), 2.0)
        opt.step()
        if step % 50 == 0 or step == recipe["steps"] - 1:
            curve.append({"step": step, "loss": round(loss.item(), 5)})
            bar.set_postfix(ce=f"{loss.item():.3f}")
        if snapshot is not None and (step + 1) % 500 == 0:
            save_safetensors(var, snapshot, configs.TINY_VAR.to_dict())
    var.eval()
    return var, {"curve": curve}


def init_var_weights(var: VAR, init_adaln: float = 0.5, init_adaln_gamma: float = 1e-5, init_head: float = 0.02) -> None:
    """VAR's ``init_weights`` (trunc-normal std √(1/3C), head × 0.02, AdaLN gammas ≈ 0, out-projections ÷ √(2·depth))."""
    std = math.sqrt(1 / var.C / 3)
    for m in var.modules():
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.trunc_normal_(m.weight, std=std)
            if m.bias is not None:
                torch.nn.init.zeros_(m.bias)
        elif isinstance(m, torch.nn.Embedding):
            torch.nn.init.trunc_normal_(m.weight, std=std)
    with torch.no_grad():
        var.head.weight.mul_(init_head)
        var.head_nm.ada_lin[-1].weight.mul_(init_adaln)
        for b in var.blocks:
            b.attn.proj.weight.div_(math.sqrt(2 * len(var.blocks)))
            b.ffn.fc2.weight.div_(math.sqrt(2 * len(var.blocks)))
            if hasattr(b, "ada_lin"):
                b.ada_lin[-1].weight[2 * var.C:].mul_(init_adaln)
                b.ada_lin[-1].weight[:2 * var.C].mul_(init_adaln_gamma)


def save_safetensors(module: torch.nn.Module, path: Path, config: dict, half: bool = False) -> None:
    """Written atomically (``bench.io``): a reader never sees half a file. ``half``: floating tensors
    as fp16 (loading upcasts them to the very same fp32 values). Aliased tensors (a module registered
    under two names) are stored once per name."""
    from safetensors.torch import save

    from bench.io import atomic_write_bytes, canonical_safetensors
    sd = {k: (v.detach().half() if half and v.is_floating_point() else v.detach()).cpu().contiguous().clone()
          for k, v in module.state_dict().items()}
    atomic_write_bytes(path, canonical_safetensors(save(sd, metadata={"config": json.dumps(config)})))


def write_manifest(out: Path, entries: Dict[str, dict]) -> None:
    """Merge ``entries`` (with each file's sha256 and size) into ``out/manifest.json``, atomically."""
    from bench.checkpoint import sha256
    from bench.io import atomic_write_text
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"models": {}}
    for name, e in entries.items():
        e["sha256"] = sha256(out / e["file"])
        e["bytes"] = (out / e["file"]).stat().st_size
        manifest["models"][name] = e
    manifest.update(git_commit=git_commit(), torch=torch.__version__, python=platform.python_version(),
                    created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    atomic_write_text(manifest_path, json.dumps(manifest, indent=1) + "\n")


def set_quality(out: Path, name: str, quality: dict) -> None:
    """Record a model's measured quality in its manifest entry."""
    entry = json.loads((out / "manifest.json").read_text())["models"][name]
    entry["quality"] = quality
    write_manifest(out, {name: entry})


STAGES = ("vqvae", "cnn", "var", "eval")
# what a stage reads from --out: made by an earlier stage of the same call, or already there
STAGE_FILES = {"vqvae": "tiny_vqvae.safetensors", "cnn": "feature_cnn.safetensors", "var": "tiny_var.safetensors"}
STAGE_NEEDS = {"var": ("vqvae",), "eval": ("vqvae", "cnn", "var")}   # STAGE_FILES keys each stage reads
STAGE_MAKES = {"vqvae": ("vqvae",), "cnn": ("cnn",), "var": ("var",)}


def load_tiny_vae(out: Path) -> VQVAE:
    from bench.models.zoo import load_vae
    return load_vae(out / "tiny_vqvae.safetensors", configs.TINY_VAE)


def _numerics(threads: int) -> dict:
    """What besides the recipe decides a checkpoint's bits on CPU: the thread count and the SIMD level."""
    return {"threads": threads, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def isa_pinned(isa: str) -> bool:
    """Whether this process runs under ``ISA_ENV[isa]`` (set before torch started)."""
    return all(os.environ.get(k) == v for k, v in ISA_ENV[isa].items())


def _pins(isa: Optional[str]) -> dict:
    """The manifest fields that say which SIMD pin a stage ran under (``isa: None``: the machine's own)."""
    return {"isa": isa, "isa_env": ISA_ENV[isa]} if isa and isa_pinned(isa) else {"isa": None}


def _vqvae_stage(out: Path, progress: bool) -> None:
    recipe = VAE_RECIPE
    with pinned_threads(recipe["threads"]) as threads:
        t0 = time.time()
        vae, info = train_vqvae(recipe, progress=progress)
        save_safetensors(vae, out / "tiny_vqvae.safetensors", configs.TINY_VAE.to_dict())
        write_manifest(out, {"tiny-vqvae": {"file": "tiny_vqvae.safetensors", "recipe": recipe, **_numerics(threads),
                                            **_pins(recipe.get("isa")), "config": configs.TINY_VAE.to_dict(),
                                            "train_seconds": round(time.time() - t0),
                                            "quality": {"val_psnr_db": info["val_psnr_db"]}, "curve": info["curve"]}})
    print(f"tiny VQVAE: val PSNR {info['val_psnr_db']:.2f} dB")


def _cnn_stage(out: Path, progress: bool) -> None:
    from bench.metrics.features import save_feature_cnn, train_feature_cnn
    recipe = CNN_RECIPE
    with pinned_threads(recipe["threads"]) as threads:
        t0 = time.time()
        imgs, labels = tinyshapes.generate(recipe["pool"], "train")
        model, hist = train_feature_cnn(imgs, labels, num_classes=tinyshapes.NUM_CLASSES, epochs=recipe["epochs"],
                                        batch_size=recipe["batch"], lr=recipe["lr"], seed=recipe["seed"],
                                        progress=progress)
        vimgs, vlabels = tinyshapes.generate(CNN_VAL, "val")
        with torch.no_grad():
            acc = (model.eval().logits(vimgs).argmax(1) == vlabels).float().mean().item()
        save_feature_cnn(model, out / "feature_cnn.safetensors")
        write_manifest(out, {"feature-cnn": {"file": "feature_cnn.safetensors", "recipe": recipe, **_numerics(threads),
                                             **_pins(recipe.get("isa")), "train_seconds": round(time.time() - t0),
                                             "quality": {"val_accuracy": round(acc, 4)}, "curve": hist}})
    print(f"feature CNN: held-out accuracy {acc:.4f}")


def _var_stage(out: Path, progress: bool) -> None:
    recipe = VAR_RECIPE
    with pinned_threads(recipe["threads"]) as threads:
        t0 = time.time()
        vae = load_tiny_vae(out)
        var, info = train_var(vae, recipe, progress=progress, snapshot=out / "tiny_var.snapshot.safetensors")
        (out / "tiny_var.snapshot.safetensors").unlink(missing_ok=True)
        save_safetensors(var, out / "tiny_var.safetensors", configs.TINY_VAR.to_dict())
        write_manifest(out, {"tiny-var": {"file": "tiny_var.safetensors", "recipe": recipe, **_numerics(threads),
                                          **_pins(recipe.get("isa")), "config": configs.TINY_VAR.to_dict(),
                                          "train_seconds": round(time.time() - t0), "curve": info["curve"]}})


def _eval_stage(out: Path, progress: bool, per_class: int = 50) -> None:
    from bench.recipes.tiny_quality import measure_tiny_var
    with pinned_threads(EVAL_THREADS) as threads:
        q = measure_tiny_var(out, per_class=per_class, progress=progress)
    q.update(threads=threads, cpu_capability=torch.backends.cpu.get_cpu_capability(), **_pins(EVAL_ISA))
    set_quality(out, "tiny-var", q)
    print("tiny-var quality:", json.dumps(q))


# stage -> (function, the SIMD level it is pinned to)
_STAGE_FNS = {"vqvae": (_vqvae_stage, lambda: VAE_RECIPE.get("isa")), "cnn": (_cnn_stage, lambda: CNN_RECIPE.get("isa")),
              "var": (_var_stage, lambda: VAR_RECIPE.get("isa")), "eval": (_eval_stage, lambda: EVAL_ISA)}
# What a pinned child must see exactly as the parent does (a caller may have replaced any of them).
_SETTINGS = ("VAE_RECIPE", "VAR_RECIPE", "CNN_RECIPE", "EVAL_THREADS", "EVAL_ISA", "VAE_VAL", "CNN_VAL")


def _run_pinned(isa: str, out: Path, jobs: List[Tuple[str, dict]]) -> None:
    """Run stages (in order: (stage, keyword arguments)) in one child process whose CPU libraries are
    pinned to ``isa`` from the start (the variables are read when torch loads). The child gets this
    process's recipes verbatim; every stage seeds and pins its own threads, so sharing a child changes
    no byte of what it writes."""
    job = json.dumps({"out": str(out), "stages": jobs, "settings": {k: globals()[k] for k in _SETTINGS}})
    subprocess.run([sys.executable, "-m", "bench.recipes.tiny", "--stage-job", job],
                   env={**os.environ, **ISA_ENV[isa]}, check=True)


def warn_if_other_simd(stage: str) -> Optional[str]:
    """A stage run with ``--no-isa-pin`` reproduces the shipped file only on the SIMD level the shipped
    file was trained on (its manifest's ``cpu_capability``): say so before training."""
    from bench.resources import tiny_assets_dir
    try:
        shipped = json.loads((tiny_assets_dir() / "manifest.json").read_text())["models"][stage]["cpu_capability"]
    except (OSError, ValueError, KeyError):
        return None
    here = torch.backends.cpu.get_cpu_capability()
    if here == shipped:
        return None
    msg = (f"note: {stage} is trained with this machine's {here} kernels; the shipped file was trained on "
           f"{shipped}, so the retrained file will not match its sha256 (same recipe, different rounding)")
    print(msg, file=sys.stderr)
    return msg


def run(out: Path, stages=STAGES, progress: bool = True, eval_per_class: int = 50, isa_pin: bool = True) -> None:
    """Train the requested stages in order; each stage saves its checkpoint and manifest entry.

    Each stage runs under its recipe's thread count (``pinned_threads``), recorded as ``threads``, and,
    unless ``isa_pin`` is off, in a child process pinned to its recipe's SIMD level (``isa``)."""
    out.mkdir(parents=True, exist_ok=True)
    if not isa_pin:
        for stage, name in (("vqvae", "tiny-vqvae"), ("cnn", "feature-cnn"), ("var", "tiny-var")):
            if stage in stages:
                warn_if_other_simd(name)
    plan = []   # (stage, its keywords, its recipe's SIMD level, the level of the child it needs or None: here)
    for stage in STAGES:
        if stage in stages:
            isa = _STAGE_FNS[stage][1]()
            kwargs = {"progress": progress, **({"per_class": eval_per_class} if stage == "eval" else {})}
            plan.append((stage, kwargs, isa, isa if isa_pin and isa and not isa_pinned(isa) else None))
    # consecutive stages pinned to one level share one child
    for child_isa, group in itertools.groupby(plan, key=lambda p: p[3]):
        group = list(group)
        if child_isa:
            _run_pinned(child_isa, out, [(stage, kwargs) for stage, kwargs, _, _ in group])
            continue
        for stage, kwargs, isa, _ in group:
            # --no-isa-pin: trained with the machine's own kernels, the manifest must not claim the recipe's pin
            with _unpinned(stage) if not isa_pin and isa else contextlib.nullcontext():
                _STAGE_FNS[stage][0](out, **kwargs)


@contextlib.contextmanager
def _unpinned(stage: str) -> Iterator[None]:
    """Run a stage with its recipe's ``isa`` set to None, so that its manifest entry records the
    recipe it actually ran (``--no-isa-pin``)."""
    name = {"vqvae": "VAE_RECIPE", "cnn": "CNN_RECIPE", "var": "VAR_RECIPE", "eval": "EVAL_ISA"}[stage]
    prev = globals()[name]
    globals()[name] = {**prev, "isa": None} if isinstance(prev, dict) else None
    try:
        yield
    finally:
        globals()[name] = prev


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="varbench train-tiny", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="assets/tiny", help="output folder (default: assets/tiny)")
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {','.join(STAGES)}")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-isa-pin", action="store_true",
                   help="train with this machine's own SIMD kernels instead of each recipe's isa pin (the files "
                        "then reproduce only on machines of the same SIMD level; the manifest records isa: null)")
    p.add_argument("--stage-job", default=None, help=argparse.SUPPRESS)   # internal: the ISA-pinned child
    a = p.parse_args(argv)
    if a.stage_job:
        job = json.loads(a.stage_job)
        globals().update(job["settings"])
        for stage, kwargs in job["stages"]:
            fn, isa_of = _STAGE_FNS[stage]
            if isa_of() and not isa_pinned(isa_of()):
                p.error(f"--stage-job runs {stage} only under the ISA_ENV of its stage")
            fn(Path(job["out"]), **kwargs)
        return 0
    stages, out = checked_stages(p, a.stages, a.out, STAGES, STAGE_NEEDS, STAGE_MAKES, STAGE_FILES)
    run(out, stages, progress=not a.no_progress, isa_pin=not a.no_isa_pin)
    return 0


def checked_stages(p, stages_arg: str, out_arg: str, order, needs, makes, files) -> Tuple[List[str], Path]:
    """A recipe command's ``--stages`` and ``--out`` (this one's and ``tiny_t2i``'s), refused through the
    parser ``p`` before any folder, data or child process is made: unknown stages, none, a file or blank
    ``--out``, and inputs that are missing (:func:`missing_inputs`)."""
    stages = [s.strip() for s in stages_arg.split(",") if s.strip()]
    bad = [s for s in stages if s not in order]
    if bad:
        p.error(f"unknown stage(s) {bad}; choose from {', '.join(order)}")
    if not stages:
        p.error(f"--stages is empty; choose from {', '.join(order)} (all of them by default)")
    out = Path(out_arg)
    if not out_arg.strip() or (out.exists() and not out.is_dir()):
        p.error(f"--out {out_arg!r}: give a folder for the checkpoints and their manifest")
    missing = missing_inputs(out, stages, order, needs, makes, files)
    if missing:
        p.error(missing)
    return stages, out


def missing_inputs(out: Path, stages, order=STAGES, needs=STAGE_NEEDS, makes=STAGE_MAKES,
                   files=STAGE_FILES) -> Optional[str]:
    """What the requested ``stages`` would read from ``out`` (``needs``: stage → keys of ``files``) that
    neither exists nor is made (``makes``) by an earlier requested stage in ``order``, the order the
    stages run in; each file named once, with the stages that make them (checked before any training,
    which takes minutes to hours). None when nothing is missing."""
    reads, made, absent = [], set(), []
    for stage in (s for s in order if s in stages):
        miss = [f for f in needs.get(stage, ()) if f not in made and not (out / files[f]).is_file()]
        made.update(makes.get(stage, ()), miss)
        if miss:
            reads.append(f"stage {stage} reads {', '.join(str(out / files[f]) for f in miss)}")
            absent += miss
    if not absent:
        return None
    makers = [s for s in order if set(makes.get(s, ())) & set(absent)]
    one = len(absent) == 1
    return (f"{'; '.join(reads)}: {'it is' if one else 'they are'} not there; add stage(s) {','.join(makers)} "
            f"(--stages {','.join(s for s in order if s in makers or s in stages)}), or give --out the folder "
            f"that has {'it' if one else 'them'}")


if __name__ == "__main__":
    raise SystemExit(main())
