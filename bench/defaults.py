"""One defaults table, shared by the Python API and the CLI (torch-fidelity style). Torch-free.

Every default a user can override lives here once, with its valid range; the CLI's help text, the
sampling loop's keyword defaults and the record keys read them from this table.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Mapping

# Official VAR FID protocol (VAR README, "Sampling & Zero-shot Inference").
SAMPLING = {"cfg": 1.5, "top_k": 900, "top_p": 0.96, "more_smooth": False}

# The tiny world's default sampling: with a 512-entry codebook top-k 900 would be a no-op, and the
# tiny model needs a stronger guidance to reach its class accuracy.
TINY_SAMPLING = {"cfg": 2.0, "top_k": 50, "top_p": 0.9, "more_smooth": False}

# Infinity (text-to-image): the evaluation protocol of FoundationVision/Infinity scripts/eval.sh and
# evaluation/README.md (cfg 4, tau 1: GenEval, ImageReward, HPSv2.1, FID), which FastVAR's geneval.sh and
# mjhq30k_fid_clip.py use too; scripts/infer.sh's single-image demo samples at tau 0.5 (give --tau 0.5 for
# it). gen_one_img's top-k 900 (a no-op for two classes per bit) and top-p 0.97. Guidance is constant
# across scales.
INFINITY_SAMPLING = {"cfg": 4.0, "tau": 1.0, "top_k": 900, "top_p": 0.97}

# HART (mit-han-lab/hart sample.py): cfg 4.5 (VAR-style ramp), more_smooth on, top-p off; top-k is fixed by
# the model (600 below scale 7, 300 from it). HART's issue #14 advises more_smooth=False for FID.
HART_SAMPLING = {"cfg": 4.5, "top_p": 0.0, "more_smooth": True}

# tiny-t2i: chosen on the quality bars after training (bench/recipes/tiny_t2i.py records them).
TINY_T2I_SAMPLING = {"cfg": 3.0, "tau": 1.0, "top_k": 0, "top_p": 0.97}

# name -> (type, lowest, highest, help); None bounds are open. cfg may also be None (no guidance).
SAMPLING_PARAMS = {
    "cfg": (float, 0.0, 100.0, "classifier-free guidance scale (VAR, HART: at the last scale, ramped linearly "
                               "from 0 at the first; Infinity: the same at every scale)"),
    "top_k": (int, 0, 1_000_000, "keep the k most likely tokens (0: all)"),
    "top_p": (float, 0.0, 1.0, "keep the smallest set of tokens with this probability mass (0: all)"),
    "more_smooth": (bool, None, None, "Gumbel-softmax smoothing (VAR: visualisation only, never for FID; HART's "
                                      "sample.py and FastVAR's HART scripts sample with it on)"),
    "tau": (float, 1e-3, 100.0, "sampling temperature: logits divided by tau (text-to-image models)"),
}

WORLDS = ("tiny", "paper")
DEFAULT_WORLD = "tiny"

# Seeds: one torch.Generator seed per sampling batch is derived as seed·1_000_003 + batch; keeping
# the run seed below 2^32 keeps every derived seed well inside torch's 64-bit range.
SEED_MAX = 2 ** 32 - 1
# Images per run: far above any protocol (ImageNet FID 50,000, MJHQ-30K 30,000) and below where one
# run's batch seeds (batch index < 1_000_003) would reach the next run seed's.
N_MAX = 10_000_000
# Images per timed generation (latency bench, Core ML export): far above what one generation of any
# registered model fits in memory; a larger number is a typo, not a setting.
BATCH_MAX = 4096


def check_sampling(sampling: Mapping[str, Any], where: str = "sampling") -> Dict[str, Any]:
    """The sampling settings, checked against ``SAMPLING_PARAMS``; errors name the setting and its range."""
    out: Dict[str, Any] = {}
    for key, value in sampling.items():
        if key not in SAMPLING_PARAMS:
            raise ValueError(f"{where}: unknown sampling setting {key!r}; known: {', '.join(SAMPLING_PARAMS)}")
        typ, lo, hi, _ = SAMPLING_PARAMS[key]
        flag = "--" + key.replace("_", "-")
        if key == "cfg" and value is None:
            out[key] = None
            continue
        if typ is bool:
            if not isinstance(value, bool):
                raise ValueError(f"{flag} must be true or false, got {value!r}")
            out[key] = value
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                (typ is int and not float(value).is_integer()) or not math.isfinite(value):
            raise ValueError(f"{flag} must be a finite {typ.__name__} in [{lo}, {hi}], got {value!r}")
        if not lo <= value <= hi:
            raise ValueError(f"{flag} {value} is out of range [{lo}, {hi}]")
        out[key] = typ(value)
    return out


def model_sampling(defaults_: Mapping[str, Any], overrides: Mapping[str, Any], model: str = "the model") -> Dict[str, Any]:
    """A model's sampling settings: its defaults with ``overrides`` checked and applied. A setting the
    model's sampler does not take (VAR has no temperature, HART fixes its top-k) is refused by name."""
    foreign = [k for k in overrides if k not in defaults_]
    if foreign:
        flags = ", ".join("--" + k.replace("_", "-") for k in foreign)
        raise ValueError(f"{flags}: not a sampling setting of {model} (it takes {', '.join(defaults_)})")
    return check_sampling({**defaults_, **check_sampling(dict(overrides))})


def check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise ValueError(f"--seed must be an integer in [0, {SEED_MAX}] (2^32 - 1), got {seed!r}")
    return seed

# Core ML compute-unit settings (`varbench latency --device coreml --compute-units`; EVAR Table 5's rows
# are the first three).
COMPUTE_UNITS = ("CPU_AND_NE", "ALL", "CPU_AND_GPU", "CPU_ONLY")
