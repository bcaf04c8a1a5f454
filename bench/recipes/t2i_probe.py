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

Layout agreement (``layout_agreement``). A position prompt fixes which colour lies on which side, and
a next-scale model has to commit to that colour layout early: on ``val`` position scenes, the sum of
the VAE's own codes over the first k scales, decoded, is the ``reference``; ``sampled`` is the same
for the model's samples of the scenes' prompts. Per k, the fraction of scenes whose two colours lie in
the prompt's order along the relation's axis (centroids of the colour-strength maps of
``bench.data.scenes_detect``): 0.5 is chance; the reference says at which scale the layout is decided.

True prefixes (``prefix_quality``). The quality bars again, on ``val`` scenes of each task, with the
first m scales of every sample replaced by the scene's true bits (the official sampler's ``gt_leak``):
m = 0 is the model alone, m = K the VAE's reconstruction; where the pass rate climbs is where the model
loses the scene. With it, the failure modes of the model alone (colour missing, shape wrong, count
wrong, relation wrong).

Cross-attention focus (``attention_focus``). Where the image tokens of an object look in the prompt:
on two-object ``val`` scenes (distinct shapes and colours) under teacher forcing with the scene's own
bits, the tokens whose cell one named object covers (≥ ``FOCUS_COVER`` of its area) and the other not
at all; per scale and block, of the attention (mean over heads) those tokens put on the two colour
words, the share on their own object's colour word (``own_colour``), and likewise for the two shape
words (``own_shape``): 0.5 is no preference, exactly 0.5 for uniform attention. ``key_norm``: the mean
norm of the text keys per head, per block (keys near 0 make every query's attention uniform: the
prompt is then read as the mean of its words' values). The binding probe above says whether the
pairing matters to the model; this says through which words it could.

``python -m bench.recipes.t2i_probe [--dir FOLDER] [--layout] [--prefix] [--attention]`` prints the
probe (and the layout agreement, the true-prefix quality, the cross-attention focus) of a trained
tiny-t2i folder (default: the shipped one, or ``$VARBENCH_TINY_DIR``).
"""
from __future__ import annotations

import functools
from typing import Dict, List, Optional

import torch

from bench.data import scenes
from bench.data.scenes_detect import check, colour_strength, detect
from bench.models.bsq import _resize

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


def _true_bits(vae, imgs_uint8: torch.Tensor, schedule):
    """(label bits per scale, teacher-forcing input) of uint8 images: the VAE's own quantisation, no flips."""
    z = vae.encoder(imgs_uint8.float().div(127.5).sub(1).to(next(vae.parameters()).device)).float()
    return vae.requantize(z, schedule, 0.0)


@functools.lru_cache(maxsize=2)
def _val_all(pool: int):
    """(images, prompts, specs, ground truths) of the first ``pool`` val scenes, generated once per
    process (the probes read the same scenes)."""
    return scenes.generate(pool, "val")


def _val(pool: int):
    """(images, prompts, specs) of the first ``pool`` val scenes."""
    return _val_all(pool)[:3]


@torch.no_grad()
def probe_inputs(vae, schedule, n: int = 150, pool: int = VAL_POOL) -> Dict[str, tuple]:
    """Per probe: (true prompts, altered prompts, label bits, teacher-forcing input) of up to ``n`` of
    the first ``pool`` val scenes. The VAE is frozen, so a training run builds these once and probes
    with them at every quality-curve point."""
    val = _val(pool)
    out = {}
    for probe in PROBES:
        imgs, true_p, alt_p = _scenes(val, probe, n)
        out[probe] = (true_p, alt_p, *_true_bits(vae, imgs, schedule))
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


# ---------------------------------------------------------------------------------------- layout
AXIS = {"left of": (-1, 1), "right of": (-1, -1), "above": (-2, 1), "below": (-2, -1)}   # (image dim, sign)


@torch.no_grad()
def partial_images(vae, bits, schedule) -> List[torch.Tensor]:
    """Per k, the image [B, 3, H, W] in [0, 1] decoded from the codes of scales 1..k summed on the final
    grid (each scale's bits → codes, trilinear up, as the sampler sums them)."""
    Hf, Wf = schedule[-1]
    total, out = 0.0, []
    for b, (h, w) in zip(bits, schedule):
        total = total + _resize(vae.lfq.bits_to_codes(b.view(b.shape[0], h, w, -1)), (Hf, Wf), "trilinear")
        out.append(vae.decode(total.squeeze(2)).add(1).div(2))
    return out


def layout_agrees(img_B3HW: torch.Tensor, specs) -> List[bool]:
    """Per position scene: do its two objects' colours lie in the prompt's order along the relation's
    axis (colour-strength centroids)? The colours must differ."""
    img = img_B3HW.detach().float().cpu()
    img = img.div(255) if img_B3HW.dtype == torch.uint8 else img
    strength = colour_strength(img).clamp(min=0)
    names = list(scenes.COLOUR_NAMES)
    out = []
    for st, spec in zip(strength, specs):
        dim, sign = AXIS[spec.relation]
        c = []
        for o in spec.objects:
            prof = st[names.index(o.colour)].sum(dim=-1 if dim == -2 else -2)   # profile along the axis
            c.append((prof * torch.arange(len(prof))).sum() / prof.sum().clamp(min=1e-6))
        out.append(bool(sign * (c[1] - c[0]) > 0))
    return out


@torch.no_grad()
def layout_inputs(vae, schedule, n: int = 150, pool: int = VAL_POOL) -> tuple:
    """(prompts, specs, reference agreement per scale) of up to ``n`` position scenes with two colours
    among the first ``pool`` val scenes; the reference (the VAE's own codes) is the same at every curve
    point of a training run, so the recipe builds this once."""
    imgs, prompts, specs = _val(pool)
    sel = [i for i, sp in enumerate(specs) if sp.task == "position" and sp.objects[0].colour != sp.objects[1].colour][:n]
    specs = [specs[i] for i in sel]
    bits, _ = _true_bits(vae, imgs[sel], schedule)
    return [prompts[i] for i in sel], specs, _agreement(vae, bits, schedule, specs)


def _agreement(vae, bits, schedule, specs) -> List[float]:
    return [round(sum(layout_agrees(im, specs)) / len(specs), 4) for im in partial_images(vae, bits, schedule)]


@torch.no_grad()
def layout_agreement(gen, sampling: dict, n: int = 150, pool: int = VAL_POOL, seed: int = 0,
                     inputs: Optional[tuple] = None) -> Dict[str, object]:
    """On up to ``n`` position scenes (two colours) of the first ``pool`` val scenes (or ``inputs`` from
    :func:`layout_inputs`): per scale k, the fraction whose colour layout after scales 1..k agrees with
    the relation, for the VAE's codes of the true scene (``reference``) and for the model's samples of
    their prompts with ``sampling`` and ``seed`` (``sampled``)."""
    prompts, specs, reference = inputs or layout_inputs(gen.vae, gen.schedule, n, pool)
    sampled, _ = gen.sample_bits(*gen.encode_prompts(prompts), seed=seed, **sampling)
    return {"scenes": len(specs), "reference": reference, "sampled": _agreement(gen.vae, sampled, gen.schedule, specs)}


# ---------------------------------------------------------------------------------------- true prefixes
LEAK_TASKS = ("single_object", "two_object", "counting", "position")
FAILURES = ("pass", "colour missing", "shape wrong", "count wrong", "relation wrong", "other")


def failure_mode(spec: scenes.SceneSpec, detections) -> str:
    """Why a scene's check fails, the first that applies: a named colour has no object (``colour
    missing``); every colour is there but a named (shape, colour) object is not (``shape wrong``); the
    number of objects of the named kind is off (``count wrong``, one- and many-object prompts); the
    position relation does not hold (``relation wrong``); else ``other``."""
    if check(spec, detections):
        return "pass"
    got = [(x.shape, x.colour) for x in detections]
    want = [(o.shape, o.colour) for o in spec.objects]
    if any(c not in {g[1] for g in got} for _, c in want):
        return "colour missing"
    if any(w not in got for w in want):
        return "shape wrong"
    if spec.task in ("single_object", "colors", "counting") and got.count(want[0]) != len(want):
        return "count wrong"
    return "relation wrong" if spec.relation else "other"


@torch.no_grad()
def leak_inputs(vae, schedule, n: int = 100, pool: int = VAL_POOL, tasks=LEAK_TASKS) -> Dict[str, tuple]:
    """Per task: (prompts, specs, the VAE's bits per scale) of up to ``n`` of the first ``pool`` val scenes."""
    imgs, prompts, specs = _val(pool)
    out = {}
    for task in tasks:
        sel = [i for i, sp in enumerate(specs) if sp.task == task][:n]
        bits, _ = _true_bits(vae, imgs[sel], schedule)
        out[task] = ([prompts[i] for i in sel], [specs[i] for i in sel], bits)
    return out


@torch.no_grad()
def prefix_quality(gen, sampling: dict, n: int = 100, pool: int = VAL_POOL, seed: int = 0,
                   inputs: Optional[Dict[str, tuple]] = None) -> Dict[str, dict]:
    """Where a sampled scene is lost. Per task, on up to ``n`` val scenes (or ``inputs`` from
    :func:`leak_inputs`), for m = 0…K: the fraction whose sample passes the detector's check when the
    first m scales are the scene's true bits (``gt_leak`` = m, ``sampling`` and ``seed`` otherwise):
    m = 0 is the model alone, m = K the VAE's own reconstruction (the ceiling); the drop from m to m−1
    is what sampling scale m costs given a true context. ``failures``: the failure modes
    (:func:`failure_mode`) of the model alone."""
    inputs = inputs or leak_inputs(gen.vae, gen.schedule, n, pool)
    out = {}
    for task, (prompts, specs, bits) in inputs.items():
        feats = gen.encode_prompts(prompts)
        passed, modes = [], {}
        for m in range(len(gen.schedule) + 1):
            _, latent = gen.sample_bits(*feats, seed=seed, gt_leak=m, gt_bits=bits, **sampling)
            dets = detect(gen.decode_uint8(latent))
            passed.append(round(sum(check(s, d) for s, d in zip(specs, dets)) / len(specs), 4))
            if m == 0:
                for s, d in zip(specs, dets):
                    mode = failure_mode(s, d)
                    modes[mode] = modes.get(mode, 0) + 1
        out[task] = {"scenes": len(specs), "passed": passed, "failures": {f: modes[f] for f in FAILURES if f in modes}}
    return out


# ---------------------------------------------------------------------------------------- cross-attention
FOCUS_COVER = 0.15   # an object's token: its cell is at least this much that object, none of the other


def object_cells(mask_a, mask_b, hw, cover: float = FOCUS_COVER) -> torch.Tensor:
    """Indices (row-major in an h×w grid) of the cells that ``mask_a`` covers by at least ``cover`` of
    their area and ``mask_b`` not at all (masks: bool or float [H, W], numpy or torch)."""
    a, b = (torch.as_tensor(m).float()[None, None] for m in (mask_a, mask_b))
    cov_a, cov_b = (torch.nn.functional.adaptive_avg_pool2d(m, tuple(hw)).flatten() for m in (a, b))
    return ((cov_a >= cover) & (cov_b == 0)).nonzero().flatten()


@torch.no_grad()
def attention_inputs(vae, schedule, n: int = 120, pool: int = VAL_POOL, cover: float = FOCUS_COVER) -> tuple:
    """(prompts, label bits, teacher-forcing input, cells, word positions) of up to ``n`` two-object
    scenes (distinct shapes and colours) among the first ``pool`` val scenes: ``cells[j][a][k]`` are
    the tokens of scale k that belong to object a of scene j (:func:`object_cells`); ``words[j][a]``
    the positions of object a's colour and shape words in the tokenized prompt."""
    imgs, prompts, specs, truths = _val_all(pool)
    sel = [i for i, s in enumerate(specs) if s.task in ("two_object", "color_attr")
           and s.objects[0].shape != s.objects[1].shape and s.objects[0].colour != s.objects[1].colour][:n]
    ids, _ = scenes.tokenize([prompts[i] for i in sel])
    cells, words = [], []
    for j, i in enumerate(sel):
        masks = [next(o.mask for o in truths[i].objects if (o.shape, o.colour) == (want.shape, want.colour))
                 for want in specs[i].objects]
        cells.append([[object_cells(masks[a], masks[1 - a], hw, cover) for hw in schedule] for a in range(2)])
        words.append([[int((ids[j] == scenes.WORD_IDS[w]).nonzero()[0]) for w in (o.colour, o.shape)]
                      for o in specs[i].objects])
    bits, x = _true_bits(vae, imgs[sel], schedule)
    return [prompts[i] for i in sel], bits, x, cells, words


def cross_attention_probs(ca, q_BLC: torch.Tensor, kv_BTC: torch.Tensor, mask_BT: torch.Tensor,
                          k_BHTc: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The attention probabilities [B, H, L, T] of an image cross-attention (``infinity.CrossAttention``)
    on its inputs: its own queries and text keys (``k_BHTc``: those keys, when the caller has them from
    ``ca.text_kv``), scale 1/√c, padding masked, the official bf16 rounding where the module has it."""
    B, L, _ = q_BLC.shape
    if k_BHTc is None:
        k_BHTc, _ = ca.text_kv(kv_BTC, mask_BT)
    q_BHLc = ca.mat_q(q_BLC).view(B, L, ca.H, ca.c).transpose(1, 2)
    if ca.bf16:
        q_BHLc = q_BHLc.to(torch.bfloat16).float()
    s_BHLT = (q_BHLc @ k_BHTc.transpose(-1, -2)) / ca.c ** 0.5
    return s_BHLT.masked_fill(~mask_BT[:, None, None, :], float("-inf")).softmax(-1)


@torch.no_grad()
def attention_focus(gen, n: int = 120, pool: int = VAL_POOL, inputs: Optional[tuple] = None) -> Dict[str, object]:
    """The cross-attention focus (module docstring) on up to ``n`` two-object scenes of the first
    ``pool`` val scenes (or ``inputs`` from :func:`attention_inputs`): ``scenes``; per scale, per block
    ``own_colour`` and ``own_shape`` (None at a scale where no token belongs to one object alone);
    per scale ``tokens`` (how many object tokens were averaged); per block ``key_norm``."""
    prompts, bits, x, cells, words = inputs or attention_inputs(gen.vae, gen.schedule, n, pool)
    blocks = list(gen.blocks)
    probs, key_norm = [None] * len(blocks), [None] * len(blocks)

    def hook(bi):
        def pre(ca, args):
            q_BLC, kv_BTC, mask_BT = args
            k_BHTc, _ = ca.text_kv(kv_BTC, mask_BT)
            probs[bi] = cross_attention_probs(ca, q_BLC, kv_BTC, mask_BT, k_BHTc).mean(1).cpu()   # [B, L, T]
            key_norm[bi] = round(k_BHTc.norm(dim=-1).transpose(1, 2)[mask_BT].mean().item(), 4)
        return pre

    hooks = [b.ca.register_forward_pre_hook(hook(bi)) for bi, b in enumerate(blocks)]
    was_training = gen.training
    gen.eval()
    try:
        gen.forward_teacher(*gen.encode_prompts(prompts), bits, x)
    finally:
        for h in hooks:
            h.remove()
        gen.train(was_training)
    starts = [0]
    for h, w in gen.schedule:
        starts.append(starts[-1] + h * w)
    own_colour, own_shape, tokens = [], [], []
    for k in range(len(gen.schedule)):
        sums = torch.zeros(len(blocks), 4, dtype=torch.float64)   # own colour, own shape, other colour, other shape
        count = 0
        for j in range(len(prompts)):
            for a in range(2):
                idx = cells[j][a][k]   # may be empty (adds nothing)
                cols = words[j][a] + words[j][1 - a]
                for bi, p in enumerate(probs):
                    sums[bi] += p[j, starts[k] + idx][:, cols].double().sum(0)
                count += len(idx)
        tokens.append(count)
        own_colour.append([_share(s[0], s[2], count) for s in sums])
        own_shape.append([_share(s[1], s[3], count) for s in sums])
    return {"scenes": len(prompts), "tokens": tokens, "own_colour": own_colour, "own_shape": own_shape,
            "key_norm": key_norm}


def _share(own: torch.Tensor, other: torch.Tensor, tokens: int) -> Optional[float]:
    return round((own / (own + other)).item(), 4) if tokens else None


def main(argv=None) -> int:
    import argparse
    import json
    from pathlib import Path

    from bench.checkpoint import CheckpointError
    from bench.recipes.tiny_t2i import load_tiny_t2i
    from bench.resources import tiny_assets_dir
    p = argparse.ArgumentParser(prog="python -m bench.recipes.t2i_probe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default=None, help="folder with the tiny-t2i files (default: the tiny assets folder)")
    p.add_argument("--n", type=int, default=150, help="scenes per probe (default 150)")
    p.add_argument("--layout", action="store_true",
                   help="also the layout agreement of position scenes per scale (the card's sampling, seed 0)")
    p.add_argument("--prefix", action="store_true",
                   help="also the quality bars with the true bits of the first m scales, m = 0…K, and the failure "
                        "modes of the model alone (the card's sampling, seed 0, --n scenes per task)")
    p.add_argument("--attention", action="store_true",
                   help="also the cross-attention focus: per scale and block, the share of an object's tokens' "
                        "attention on its own colour and shape words (0.5: no preference), and the key norms")
    a = p.parse_args(argv)
    if a.n < 1:
        p.error(f"--n must be ≥ 1, got {a.n}")
    folder = Path(a.dir) if a.dir else tiny_assets_dir()
    if a.dir is not None and not folder.is_dir():
        p.error(f"--dir {a.dir!r} is not a folder: give the folder that holds the tiny-t2i files "
                "(tiny_bsq.safetensors, tiny_t2i.safetensors, tiny_t2i_text.safetensors and manifest.json)")
    try:
        gen = load_tiny_t2i(folder)
    except CheckpointError as e:   # missing, corrupt or mismatched files: the reason, without a traceback
        p.error(str(e))
    out = prompt_sensitivity(gen, a.n)
    if a.layout or a.prefix:
        from bench.registry import MODELS
        sampling = dict(MODELS.get("tiny-t2i").sampling)
    if a.layout:
        out["layout"] = layout_agreement(gen, sampling, a.n)
    if a.prefix:
        out["prefix"] = prefix_quality(gen, sampling, a.n)
    if a.attention:
        out["attention"] = attention_focus(gen, a.n)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
