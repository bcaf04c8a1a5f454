"""Does a text-to-image model read *which* colour goes with which shape, and the relation word?

Sampled quality bars (``bench.recipes.tiny_t2i.measure``) say whether a tiny-t2i model passes, but
early in training they sit at noise level and they cannot tell a model that ignores part of the
prompt from one that draws badly. This probe asks the model directly, under teacher forcing: the
bitwise cross-entropy of held-out ``val`` scenes (the quantiser's own bits, no flips) given their true
prompt, and given a prompt altered in one respect. The increase, per scale, is how much the model
uses that respect of the prompt (0: it ignores it).

- ``binding``: two-object scenes (distinct shapes and colours, tasks two_object / color_attr), the
  shapes swapped between the two colours ("a red circle and a blue square" → "a red square and a
  blue circle"): the same words, only the colour–shape pairing differs.
- ``shapes``: the same scenes, each shape replaced by another one (circle→square→triangle→cross→
  circle): the reference scale for ``binding`` (how much the shape words are used at all).
- ``relation``: position scenes, the relation word flipped (left of ↔ right of, above ↔ below).

``python -m bench.recipes.t2i_probe [--dir FOLDER]`` prints the probe of a trained tiny-t2i folder
(default: the shipped one, or ``$VARBENCH_TINY_DIR``).
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

from bench.data import scenes

PROBES = ("binding", "shapes", "relation")
NEXT_SHAPE = {"circle": "square", "square": "triangle", "triangle": "cross", "cross": "circle"}
FLIP = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
VAL_POOL = 1200   # val scenes searched for probe scenes (first ones of the split: prefix-stable)


def _altered(spec: scenes.SceneSpec, probe: str) -> str:
    a, b = spec.objects
    joint = spec.relation if spec.task == "position" else "and"
    if probe == "binding":
        a, b = scenes.SceneObject(b.shape, a.colour), scenes.SceneObject(a.shape, b.colour)
    elif probe == "shapes":
        a, b = scenes.SceneObject(NEXT_SHAPE[a.shape], a.colour), scenes.SceneObject(NEXT_SHAPE[b.shape], b.colour)
    else:
        joint = FLIP[spec.relation]
    return f"a {a.colour} {a.shape} {joint} a {b.colour} {b.shape}"


def _scenes(val, probe: str, n: int):
    """Up to n probe scenes of ``val`` = (images, prompts, specs): images, true and altered prompts."""
    imgs, prompts, specs = val
    tasks = ("position",) if probe == "relation" else ("two_object", "color_attr")
    sel = [i for i, s in enumerate(specs) if s.task in tasks and s.objects[0].shape != s.objects[1].shape
           and s.objects[0].colour != s.objects[1].colour][:n]
    return imgs[sel], [prompts[i] for i in sel], [_altered(specs[i], probe) for i in sel]


@torch.no_grad()
def probe_inputs(vae, schedule, n: int = 150, pool: int = VAL_POOL) -> Dict[str, tuple]:
    """Per probe: (true prompts, altered prompts, label bits, teacher-forcing input) of up to ``n`` of
    the first ``pool`` val scenes. The VAE is frozen, so a training run builds these once and probes
    with them at every quality-curve point."""
    val = scenes.generate(pool, "val")[:3]
    dev = next(vae.parameters()).device
    out = {}
    for probe in PROBES:
        imgs, true_p, alt_p = _scenes(val, probe, n)
        z = vae.encoder(imgs.float().div(127.5).sub(1).to(dev)).float()
        out[probe] = (true_p, alt_p, *vae.requantize(z, schedule, 0.0))
    return out


@torch.no_grad()
def _ce_per_scale(gen, prompts: List[str], bits, x) -> torch.Tensor:
    ce_BL = gen.token_ce(*gen.encode_prompts(prompts), bits, x)
    return torch.stack([c.mean() for c in ce_BL.split([h * w for h, w in gen.schedule], dim=1)])


@torch.no_grad()
def prompt_sensitivity(gen, n: int = 150, pool: int = VAL_POOL, inputs: Optional[Dict[str, tuple]] = None
                       ) -> Dict[str, dict]:
    """Per probe, on up to ``n`` of the first ``pool`` val scenes (or on ``inputs`` from
    :func:`probe_inputs`): ``scenes`` (how many), ``ce`` (mean bitwise cross-entropy per scale with the
    true prompts) and ``delta`` (per scale: altered prompt minus true prompt, nats per bit)."""
    inputs = inputs or probe_inputs(gen.vae, gen.schedule, n, pool)
    was_training = gen.training
    gen.eval()
    out = {}
    for probe, (true_p, alt_p, bits, x) in inputs.items():
        ce = _ce_per_scale(gen, true_p, bits, x)
        delta = _ce_per_scale(gen, alt_p, bits, x) - ce
        out[probe] = {"scenes": len(true_p), "ce": [round(v, 4) for v in ce.tolist()],
                      "delta": [round(v, 4) + 0.0 for v in delta.tolist()]}
    gen.train(was_training)
    return out


def main(argv=None) -> int:
    import argparse
    import json
    from pathlib import Path

    from bench.recipes.tiny_t2i import load_tiny_t2i
    from bench.resources import tiny_assets_dir
    p = argparse.ArgumentParser(prog="python -m bench.recipes.t2i_probe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default=None, help="folder with the tiny-t2i files (default: the tiny assets folder)")
    p.add_argument("--n", type=int, default=150, help="scenes per probe (default 150)")
    a = p.parse_args(argv)
    if a.n < 1:
        p.error(f"--n must be ≥ 1, got {a.n}")
    folder = Path(a.dir) if a.dir else tiny_assets_dir()
    print(json.dumps(prompt_sensitivity(load_tiny_t2i(folder), a.n), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
