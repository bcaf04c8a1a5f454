"""Figures rendered from records only: one YAML spec per figure in ``figures/``.

Spec format (``figures/<name>.yaml``)::

    title: "Speed–quality trade-off"
    kind: pareto                   # pareto | scale_latency
    model: {paper: var-d16, tiny: tiny-var}
    bench: {paper: imagenet256, tiny: shapes-c2i}   # quality records (pareto)
    x: flops                       # pareto: flops (the quality record's cost) or latency_ms (the
                                   # latency record of the same model and chain)
    y: fid                         # a metric of the quality records
    latency: {device: cpu, batch: 1}   # which latency records (pareto with x: latency_ms; scale_latency)

``pareto``: one point per method chain with a record of ``bench`` (model fixed), y error bars from
the metric's stderr when recorded, x error bars from the latency IQR; the Pareto front (no point
both cheaper and better) joined by a line; points labelled by chain. ``scale_latency``: one stacked
bar per latency record of the model (per-scale medians, then the VQVAE decode), so where a method
saves time is visible. Output: ``<out>/<world>/<name>.png`` and ``.pdf`` (fonts embedded as
TrueType, Okabe–Ito colour-blind-safe palette). A figure with no data raises ``EmptyFigureError``
naming the records it looked for.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List

import yaml

OKABE_ITO = ("#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7")
KINDS = ("pareto", "scale_latency")
X_AXES = {"flops": "GFLOPs per image (transformer, CFG doubling included)",
          "latency_ms": "latency per generation (ms, median; bars: IQR)"}


class FigureSpecError(ValueError):
    """A malformed figure spec."""


class EmptyFigureError(ValueError):
    """No record has what the figure needs."""


def figures_dir() -> Path:
    from bench.resources import resource_dir
    return resource_dir("figures")


def figure_names() -> List[str]:
    return sorted(p.stem for p in figures_dir().glob("*.yaml"))


def load_figure(name: str) -> Dict[str, Any]:
    path = figures_dir() / f"{name}.yaml"
    if not path.is_file():
        import difflib
        close = difflib.get_close_matches(name, figure_names(), n=3, cutoff=0.5)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else "."
        raise FigureSpecError(f"unknown figure {name!r}{hint} Known figures: {', '.join(figure_names())}")
    spec = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    kind = spec.get("kind")
    if kind not in KINDS:
        raise FigureSpecError(f"{path}: kind must be one of {KINDS}, got {kind!r}")
    if kind == "pareto" and spec.get("x") not in X_AXES:
        raise FigureSpecError(f"{path}: x must be one of {tuple(X_AXES)}, got {spec.get('x')!r}")
    spec["name"] = name
    return spec


def _chain(rec) -> str:
    return " + ".join(rec["spec"]["methods"]) or "dense"


def _short(chain: str) -> str:
    """'evar:calib=pyramid,sparsity=0.4 + ft:epochs=2,lr=…' -> 'evar 0.4 + ft' (labels stay legible)."""
    parts = []
    for m in chain.split(" + "):
        name, _, params = m.partition(":")
        sp = [p.split("=")[1] for p in params.split(",") if p.startswith("sparsity=")]
        parts.append(name + (f" {sp[0]}" if sp else ""))
    return " + ".join(parts)


def _latency_records(records, world, model, setting) -> Dict[str, dict]:
    out = {}
    for rec in records.values():
        s = rec["spec"]
        if (s["world"], s["model"], s["bench"]) != (world, model, "latency"):
            continue
        p = s.get("protocol") or {}
        if all(p.get(k) == v for k, v in (setting or {}).items()):
            prev = out.get(_chain(rec))
            if prev is None or rec["created"] > prev["created"]:
                out[_chain(rec)] = rec
    return out


def pareto_points(spec, records, world) -> List[dict]:
    model, bench = spec["model"][world], spec["bench"][world]
    y = spec.get("y", "fid")
    lat = _latency_records(records, world, model, spec.get("latency")) if spec["x"] == "latency_ms" else {}
    best: Dict[str, dict] = {}
    for rec in records.values():
        s = rec["spec"]
        if (s["world"], s["model"], s["bench"]) != (world, model, bench) or y not in rec["metrics"]:
            continue
        chain = _chain(rec)
        if spec["x"] == "flops":
            x, xerr = rec["cost"].get("flops"), None
        else:
            lr = lat.get(chain)
            if lr is None:
                continue
            m = lr["metrics"]["latency_ms"]
            x, xerr = m["value"], m.get("iqr", 0) / 2
        if x is None:
            continue
        m = rec["metrics"][y]
        p = {"chain": chain, "label": _short(chain), "x": float(x), "xerr": xerr, "y": float(m["value"]),
             "yerr": m.get("stderr"), "n": s["n"], "created": rec["created"]}
        if chain not in best or p["created"] > best[chain]["created"]:
            best[chain] = p
    return sorted(best.values(), key=lambda p: p["x"])


def pareto_front(points: List[dict], lower_is_better: bool = True) -> List[dict]:
    """Points no other point beats on both axes (cheaper or equal and strictly better, or vice versa)."""
    sign = 1 if lower_is_better else -1
    front = []
    for p in points:
        dominated = any(q is not p and q["x"] <= p["x"] and sign * q["y"] <= sign * p["y"]
                        and (q["x"] < p["x"] or sign * q["y"] < sign * p["y"]) for q in points)
        if not dominated:
            front.append(p)
    return sorted(front, key=lambda p: p["x"])


def _style():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({"pdf.fonttype": 42, "ps.fonttype": 42, "font.size": 9, "axes.spines.top": False,
                         "axes.spines.right": False, "axes.prop_cycle": matplotlib.cycler(color=OKABE_ITO)})
    return plt


def render(name: str, world: str = "tiny", root=None, out=None) -> List[Path]:
    """Render figure ``name`` from the records under ``root``; returns the written PNG and PDF paths."""
    from bench.records import load_records
    from bench.registry import METRICS as REG
    spec = load_figure(name)
    records = load_records(root, world, on_error=lambda p, e: None)
    plt = _style()
    fig, ax = plt.subplots(figsize=(5.2, 3.6) if spec["kind"] == "pareto" else (6.0, 3.6))
    if spec["kind"] == "pareto":
        pts = pareto_points(spec, records, world)
        if not pts:
            raise EmptyFigureError(f"figure {name}: no {spec['bench'][world]} records of {spec['model'][world]} with "
                                   f"{spec.get('y', 'fid')}" + (" and a matching latency record" if spec["x"] == "latency_ms" else "")
                                   + f" under {root or 'results'}/{world} (run `varbench table …`"
                                   + (" and `varbench latency …`" if spec["x"] == "latency_ms" else "") + " first)")
        y = spec.get("y", "fid")
        info = REG.get(y)
        lower = info.better != "higher"
        # colour = the chain's first method (its family), marker = its recovery step; labels in the
        # legend (points of one sparsity share their FLOPs, so text next to them would overlap)
        firsts = sorted({p["chain"].split(" + ")[0].split(":")[0] for p in pts}, key=lambda m: (m != "dense", m))
        colour = {m: OKABE_ITO[i % len(OKABE_ITO)] for i, m in enumerate(firsts)}
        marker = {None: "o", "ft": "s", "kd": "^", "psad": "D"}
        scale = 1e-9 if spec["x"] == "flops" else 1.0
        seen = set()
        for p in pts:
            parts = [m.split(":")[0] for m in p["chain"].split(" + ")]
            rec = parts[1] if len(parts) > 1 else None
            key = (parts[0], rec)
            ax.errorbar(p["x"] * scale, p["y"], xerr=None if p["xerr"] is None else p["xerr"] * scale,
                        yerr=p["yerr"], fmt=marker.get(rec, "P"), ms=5, color=colour[parts[0]], capsize=2, lw=1,
                        mfc=colour[parts[0]] if rec is None else "white", mew=1.2,
                        label=None if key in seen else " + ".join(x for x in (parts[0], rec) if x))
            seen.add(key)
        front = pareto_front(pts, lower)
        ax.plot([p["x"] * scale for p in front], [p["y"] for p in front], "--", color="0.5", lw=1, zorder=0,
                label="Pareto front")
        for p in front:
            ax.annotate(p["label"], (p["x"] * scale, p["y"]), textcoords="offset points", xytext=(4, 4), fontsize=6.5)
        ax.legend(frameon=False, fontsize=6.5, ncol=2, loc="upper right")
        ax.set_xlabel(X_AXES[spec["x"]])
        ax.set_ylabel(f"{info.header} ({'lower' if lower else 'higher'} is better; bars: ±stderr)")
        note = f"{spec['model'][world]} · {spec['bench'][world]} · n={pts[0]['n']} · {world} world"
    else:
        setting = spec.get("latency") or {}
        lat = _latency_records(records, world, spec["model"][world], setting)
        if not lat:
            raise EmptyFigureError(f"figure {name}: no latency records of {spec['model'][world]} with {setting} "
                                   f"under {root or 'results'}/{world} (run `varbench latency …` first)")
        chains = sorted(lat, key=lambda c: -lat[c]["metrics"]["latency_ms"]["value"])
        K = max(len(lat[c]["cost"]["per_scale_ms"]) for c in chains)
        colors = [plt.cm.viridis(i / max(K - 1, 1)) for i in range(K)]
        for j, c in enumerate(chains):
            cost, bottom = lat[c]["cost"], 0.0
            for si, v in enumerate(cost["per_scale_ms"]):
                ax.bar(j, v, bottom=bottom, color=colors[si], label=f"scale {si}" if j == 0 else None, width=0.6)
                bottom += v
            ax.bar(j, cost["decode_ms"], bottom=bottom, color="0.75", hatch="//", label="decode" if j == 0 else None,
                   width=0.6)
        ax.set_xticks(range(len(chains)), [_short(c) for c in chains], rotation=20, ha="right")
        ax.set_ylabel("ms per generation (median per scale)")
        ax.legend(frameon=False, fontsize=6.5, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        any_rec = lat[chains[0]]
        p = any_rec["spec"]["protocol"]
        note = f"{spec['model'][world]} · {p['device']} · batch {p['batch']}" + \
            (f" · threads {p['threads']}" if p.get("threads") else "") + f" · {world} world"
    ax.set_title(spec.get("title", name), fontsize=10)
    fig.text(0.01, 0.01, note, fontsize=6, color="0.35")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    from bench.resources import figures_out_dir
    folder = figures_out_dir(out) / world
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in ("png", "pdf"):
        target = folder / f"{name}.{ext}"
        tmp = folder / f".{name}.{os.getpid()}.tmp.{ext}"
        fig.savefig(tmp, dpi=200 if ext == "png" else None)
        os.replace(tmp, target)           # atomic: a figure is complete or absent
        paths.append(target)
    plt.close(fig)
    return paths
