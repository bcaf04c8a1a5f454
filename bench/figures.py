"""Figures rendered from records only: one YAML spec per figure in ``figures/``.

Spec format (``figures/<name>.yaml``); ``title`` and ``kind`` always, the rest per kind::

    title: "Speed–quality trade-off"
    kind: pareto                   # pareto | scale_latency | sweep | table_bars | gates
    model: {paper: var-d16, tiny: tiny-var}
    bench: {paper: imagenet256, tiny: shapes-c2i}   # quality records (pareto, sweep)
    x: flops                       # pareto: flops (the quality record's cost) or latency_ms (the
                                   # latency record of the same model and chain)
    y: fid                         # a metric of the quality records
    latency: {device: cpu, batch: 1}   # which latency records (pareto with x: latency_ms; scale_latency)

``pareto``: one point per method chain with a record of ``bench`` (model fixed) at one n (the n most
chains have; chains recorded only at another n are named under the figure), its seeds averaged as the
leaderboard does; y error bars from the metric's stderr (one seed) or over seeds, x error bars from
the latency IQR; the Pareto front (no point both cheaper and better) joined by a line; points
labelled by chain. ``scale_latency``: one stacked
bar per chain (per-scale medians, the last scale's sampling step, then the VQVAE decode: together one
generation; records from before the last step was recorded stack scales and decode only), so where a
method saves time is visible.
Latency figures take their records from one measurement run (``metrics.latency_ms.group``, as the
tables compare times only within one): the run that timed the most chains of the model at the
setting, the newest on a tie; the note under the figure counts the chains only other runs timed.

``sweep`` — a metric against one method parameter (``fid-vs-sparsity``, ``token-keep-ratio``)::

    kind: sweep
    model: {paper: var-d16, tiny: tiny-var}
    bench: {paper: imagenet256, tiny: shapes-c2i}
    x: {method_param: sparsity, label: "sparsity"}   # a parameter of a method in the resolved chain
    y: fid
    methods: [fastvar, lazyvar]    # optional: only chains where one of these methods sets x
    series: ["{method}", "{method} + ft"]   # optional: only series with these labels ({method}: the
                                   # swept method's name, at its defaults but x)
    yscale: log                    # optional: linear (default) | log

One point per record of ``bench`` (model fixed) whose resolved chain holds a method with parameter
``x.method_param`` (the first such method, of ``methods`` when given): x = that parameter's value,
y = the metric, error bar = its stderr (none drawn where the record has none). One line per
*series* = the chain with the x parameter removed, so ``magnitude:…,sparsity=0.2`` and ``…=0.4``
share a line and ``… + ft`` is another; points sorted by x, the newest record winning where a series
has two at one x (newest everywhere here: the later ``created``, then the larger run id, for records
of one second: a figure does not depend on the order its records were read in). Colour = the swept
method (with its non-default parameters), line style and marker = the rest of the chain; labels
show only parameters that differ from the methods' YAML defaults (``evar (calib=first) + ft
(epochs=2.0)``); ``series`` keeps only the series whose label is one of its patterns, and the note
under the figure counts those left out. The dense record (empty chain) is a dashed horizontal line
with a ±stderr band, not a point: the parameter's no-op value differs between parameters
(sparsity 0, a keep ratio 1) and the dense model is the same at every x. With no data the
error names the records looked for and, from the method registry, the ``methods`` that are not
implemented yet.

``table_bars`` — a paper table's ablation as bars (``calibration``, ``recovery``)::

    kind: table_bars
    table: evar-table3             # a table spec (tables/<name>.yaml): model, bench, n, rows from it
    y: fid                         # a metric of the table's (non-relative) columns

One horizontal bar (long row labels stay legible) per table row, in the table's order, and per
column of that metric (several column groups: grouped bars, legend = group label), ± stderr, value
written beside it. Cells are matched to records exactly as ``varbench table`` matches them
(``bench.plan.table_cells`` + ``match_records`` + ``bench.render.build_table``), so the figure shows
the records the table shows. A cell without a record gets no bar, never a zero: its row reads "no
record" and the note under the figure says why (no run yet, method not implemented, stale record).
The table's reference row (default its dense row), when measured, is also a dotted line.

``gates`` — PSAD's coarse-to-fine curriculum (``psad-gates``)::

    kind: gates
    model: {paper: var-d16, tiny: tiny-var}
    method: psad                   # the method whose gates are drawn: its parameters onset and ramp
    where: {variant: paper}        # optional: only settings with these parameter values

γ̃_i(t) = min(1, max(0, (t − t_i)/Δ)) of each scale i = 0 … K−1 over training progress t ∈ [0, 1],
as ``methods/psad.py``: t_0 = −Δ (scale 0 open from the start), t_i = onset·i/(K−1), Δ = ramp, a
hard step t ≥ t_i when Δ = 0; K = the model's number of scales (its card's ``var_cfg.patch_nums``).
One panel per distinct (K, onset, ramp) among the records of the model whose chain holds
``method``, titled with their run ids; with no such record, one panel from the method's YAML
defaults, titled "defaults" (the curve is a setting, not a measurement). Computed in pure Python
(this module is torch-free); ``tests/test_figures_ablation.py`` checks it equals
``methods.psad.gates``.

Output: ``<out>/<world>/<name>.png`` and ``.pdf`` (fonts embedded as TrueType, Okabe–Ito
colour-blind-safe palette for categories, viridis for ordered scales). ``figure()`` returns the
drawn matplotlib Figure (tests read the plotted data off its Axes); ``render()`` writes it. A figure
with no data raises ``EmptyFigureError`` naming the records it looked for. A new kind is one draw
function registered with ``@kind(name, check)``.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import yaml

from bench.records import timing_group
from bench.spec import SpecError, format_method, parse_method, resolve_method

OKABE_ITO = ("#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7")
# categories on white: black is kept for references (dense), the pale yellow comes last
SERIES_COLOURS = ("#E69F00", "#56B4E9", "#009E73", "#0072B2", "#D55E00", "#CC79A7", "#F0E442")
STYLES = (("o", "-", True), ("s", "--", False), ("^", ":", True), ("D", "-.", False), ("v", "-", False),
          ("P", "--", True))   # (marker, line style, filled marker) per rest-of-chain
X_AXES = {"flops": "GFLOPs per image (transformer, CFG doubling included)",
          "latency_ms": "latency per generation (ms, median; bars: IQR)"}


class FigureSpecError(ValueError):
    """A malformed figure spec."""


class EmptyFigureError(ValueError):
    """No record has what the figure needs."""


@dataclasses.dataclass(frozen=True)
class Kind:
    draw: Callable[..., Tuple[Any, str]]   # (spec, records, world, root, plt) -> (Figure, note)
    check: Callable[[dict, str], None]     # (spec, where): raise FigureSpecError on a bad spec


KINDS: Dict[str, Kind] = {}


def kind(name: str, check: Optional[Callable[[dict, str], None]] = None):
    """Register a figure kind's draw function (and its spec check) under ``name``."""
    def deco(draw):
        KINDS[name] = Kind(draw, check or (lambda spec, where: None))
        return draw
    return deco


def figures_dir() -> Path:
    from bench.resources import resource_dir
    return resource_dir("figures")


def figure_names() -> List[str]:
    return sorted(p.stem for p in figures_dir().glob("*.yaml"))


def load_figure(name: str) -> Dict[str, Any]:
    path = figures_dir() / f"{name}.yaml"
    if not path.is_file():
        from bench.registry import did_you_mean
        hint = did_you_mean(name, figure_names(), n=3, cutoff=0.5) or "."
        raise FigureSpecError(f"unknown figure {name!r}{hint} Known figures: {', '.join(figure_names())}")
    spec = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    k = spec.get("kind")
    if k not in KINDS:
        raise FigureSpecError(f"{path}: kind must be one of {tuple(KINDS)}, got {k!r}")
    KINDS[k].check(spec, str(path))
    spec["name"] = name
    return spec


def _for_world(spec, key: str, world: str) -> str:
    value = (spec.get(key) or {}).get(world)
    if value is None:
        raise FigureSpecError(f"figure {spec['name']}: no {key} for the {world} world (spec key {key}: {{{world}: …}})")
    return value


def _check_metric(metric, where: str) -> None:
    from bench.registry import METRICS
    if not isinstance(metric, str) or metric not in METRICS:
        raise FigureSpecError(f"{where}: y: {METRICS.unknown_message(str(metric))}")


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


def short_labels(chains) -> Dict[str, str]:
    """``_short`` of each chain, except where two different chains would share a label (variants that differ
    in a parameter other than sparsity, e.g. stepvar's score=random / hpf / both): those get ``describe``'s
    label (the parameters that differ from the defaults), so no two points of a figure read alike."""
    from collections import Counter
    short = {c: _short(c) for c in chains}
    counts = Counter(short.values())        # one per distinct chain (``short`` is keyed by chain)
    return {c: short[c] if counts[short[c]] == 1 else describe(c.split(" + ")) for c in chains}


def _defaults(name: str) -> Dict[str, str]:
    """Canonical text of each default parameter of method ``name`` ({} for a method not in the registry)."""
    try:
        return parse_method(resolve_method(name))[1]
    except (SpecError, KeyError, ValueError):
        return {}


def describe(methods) -> str:
    """A chain as a legend label: each method with only the parameters that differ from its defaults."""
    parts = []
    for m in methods:
        name, params = parse_method(m)
        dflt = _defaults(name)
        extra = [f"{k}={v}" for k, v in sorted(params.items()) if dflt.get(k) != v]
        parts.append(name + (f" ({', '.join(extra)})" if extra else ""))
    return " + ".join(parts) or "dense"


def _ylabel(metric: str) -> str:
    from bench.registry import METRICS
    info = METRICS.get(metric)
    return info.header + {"lower": " (lower is better)", "higher": " (higher is better)"}.get(info.better, "")


def _where(root, world: str) -> str:
    """The record folder a figure read (for its error messages)."""
    from bench.resources import results_root
    return str(results_root(root) / world)


def _newer(a: Mapping, b: Optional[Mapping]) -> bool:
    """Whether record (or point) ``a`` replaces ``b``: the later ``created``; records of one second are
    ordered by run id, so that a figure does not depend on the order the records were read in."""
    return b is None or (a["created"], a["run_id"]) > (b["created"], b["run_id"])


def _point(rec, metric: str) -> dict:
    m = rec["metrics"][metric]
    return {"y": float(m["value"]), "yerr": m.get("stderr"), "n": rec["spec"]["n"], "run_id": rec["run_id"],
            "created": rec["created"]}


# ------------------------------------------------------------------ pareto, scale_latency
def _latency_records(records, world, model, setting) -> Tuple[Dict[str, dict], int]:
    """Per chain, the latency records of ``model`` at ``setting`` from one measurement run (times are
    compared within a run only, as in the tables: ``metrics.latency_ms.group``; a record without one is
    a run of its own): the run that timed the most chains, the newest on a tie. Also how many chains
    only other runs timed (left out, and said so under the figure)."""
    runs: Dict[str, Dict[str, dict]] = {}
    for rec in records.values():
        s = rec["spec"]
        if (s["world"], s["model"], s["bench"]) != (world, model, "latency"):
            continue
        p = s.get("protocol") or {}
        if all(p.get(k) == v for k, v in (setting or {}).items()):
            run = runs.setdefault(timing_group(rec) or rec["run_id"], {})
            if _newer(rec, run.get(_chain(rec))):
                run[_chain(rec)] = rec
    if not runs:
        return {}, 0
    best = max(runs.values(), key=lambda run: (len(run), max((r["created"], r["run_id"]) for r in run.values())))
    return best, len(set().union(*runs.values()) - set(best))


def _left_out(n: int) -> str:
    return (f"\n{n} chain{'s' if n > 1 else ''} timed only in another measurement run left out (latencies "
            f"are compared within one run)") if n else ""


def pareto_points(spec, records, world, lat: Optional[Dict[str, dict]] = None) -> List[dict]:
    """Points of a pareto figure; with ``x: latency_ms`` the chains' latency records (``lat``, default
    those of ``_latency_records``). See ``_pareto``."""
    return _pareto(spec, records, world, lat)[0]


def _pareto(spec, records, world, lat: Optional[Dict[str, dict]] = None) -> Tuple[List[dict], Optional[int], Dict[str, list]]:
    """(points, their n, {chain: [its n]} of the chains recorded only at other n). One n per figure (the
    n most chains have, the larger on a tie): FIDs of different sample counts are different quantities.
    A chain's point is its records at that n of one run identity but the seed (sampling, protocol,
    method versions, checkpoint; the identity with the most seeds, then the newest), aggregated over
    seeds as the leaderboard does: one seed, its value and stderr; k ≥ 2 seeds, their mean ± sample sd
    / √k (none when they agree); per seed the newest record. Stale records are not told apart here (as
    in the other record-drawn figures; the leaderboard and tables leave them out)."""
    import json

    from bench.leaderboard import seed_mean
    model, bench = spec["model"][world], spec["bench"][world]
    y = spec.get("y", "fid")
    if lat is None and spec["x"] == "latency_ms":
        lat = _latency_records(records, world, model, spec.get("latency"))[0]
    groups: Dict[tuple, Dict[object, dict]] = {}   # (chain, n, setting) -> seed -> newest point
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
        p = {"chain": chain, "x": float(x), "xerr": xerr, "y": float(m["value"]),
             "yerr": m.get("stderr"), "n": s["n"], "created": rec["created"], "run_id": rec["run_id"]}
        # the run's identity without its seed (RunSpec.key(ignore=("seed",)): sampling, protocol, method
        # versions, checkpoint), as the leaderboard groups seeds into a row
        setting = json.dumps({k: v for k, v in s.items() if k not in ("seed", "requested")}, sort_keys=True)
        seeds = groups.setdefault((chain, s["n"], setting), {})
        if _newer(p, seeds.get(s.get("seed"))):
            seeds[s.get("seed")] = p
    if not groups:
        return [], None, {}
    chains_at: Dict[int, set] = {}
    for chain, n, _ in groups:
        chains_at.setdefault(n, set()).add(chain)
    n = max(chains_at, key=lambda k: (len(chains_at[k]), k))
    best: Dict[str, dict] = {}
    for (chain, n_, _), seeds in groups.items():
        if n_ != n:
            continue
        newest = max(seeds.values(), key=lambda p: (p["created"], p["run_id"]))
        have = best.get(chain)
        if have is not None and (have["seeds"], have["created"], have["run_id"]) >= (
                len(seeds), newest["created"], newest["run_id"]):
            continue
        y_, err = seed_mean([p["y"] for p in seeds.values()], newest["yerr"])
        best[chain] = {**newest, "y": y_, "yerr": err, "seeds": len(seeds)}
    labels = short_labels(list(best))   # told apart where two chains would read alike
    for chain, p in best.items():
        p["label"] = labels[chain]
    others = {c: sorted(k for k, cs in chains_at.items() if c in cs) for c in set().union(*chains_at.values())
              if c not in chains_at[n]}
    return sorted(best.values(), key=lambda p: p["x"]), n, others


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


def _check_pareto(spec, where):
    if spec.get("x") not in X_AXES:
        raise FigureSpecError(f"{where}: x must be one of {tuple(X_AXES)}, got {spec.get('x')!r}")


@kind("pareto", _check_pareto)
def _draw_pareto(spec, records, world, root, plt):
    from bench.registry import METRICS as REG
    name = spec["name"]
    lat, left_out = (_latency_records(records, world, spec["model"][world], spec.get("latency"))
                     if spec["x"] == "latency_ms" else ({}, 0))
    pts, n, other_n = _pareto(spec, records, world, lat)
    if not pts:
        raise EmptyFigureError(f"figure {name}: no {spec['bench'][world]} records of {spec['model'][world]} with "
                               f"{spec.get('y', 'fid')}" + (" and a matching latency record" if spec["x"] == "latency_ms" else "")
                               + f" under {_where(root, world)} (run `varbench table …`"
                               + (" and `varbench latency …`" if spec["x"] == "latency_ms" else "") + " first)")
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
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
    if len(front) > 1:   # a front of one point is no line: no legend entry for it either
        ax.plot([p["x"] * scale for p in front], [p["y"] for p in front], "--", color="0.5", lw=1, zorder=0,
                label="Pareto front")
    for p in front:
        ax.annotate(p["label"], (p["x"] * scale, p["y"]), textcoords="offset points", xytext=(4, 4), fontsize=6.5)
    ax.legend(frameon=False, fontsize=6.5, ncol=2, loc="upper right")
    ax.set_xlabel(X_AXES[spec["x"]])
    ax.set_ylabel(f"{info.header} ({'lower' if lower else 'higher'} is better; bars: ±stderr)")
    several = max(p["seeds"] for p in pts)
    note = (f"{spec['model'][world]} · {spec['bench'][world]} · n={n} · {world} world"
            + (f" · points with several seeds: their mean (up to {several} seeds)" if several > 1 else ""))
    if other_n:
        note += (f"\n{len(other_n)} chain{'s' if len(other_n) > 1 else ''} recorded only at another n left out ("
                 + "; ".join(f"{short_labels(list(other_n))[c]}: n={'/'.join(map(str, ns))}"
                             for c, ns in sorted(other_n.items())) + ")")
    return fig, note + _left_out(left_out)


def _scales_hw(model: str, K: int) -> Optional[Tuple[Tuple[int, int], ...]]:
    """The registered model's (h, w) per scale, when it has the ``K`` scales a record timed (else None:
    the legend then names scales by index only)."""
    from bench.registry import MODELS
    hws = MODELS.get(model).scales_hw if model in MODELS else None   # every model card has them
    return hws if hws is not None and len(hws) == K else None


@kind("scale_latency")
def _draw_scale_latency(spec, records, world, root, plt):
    setting = spec.get("latency") or {}
    lat, left_out = _latency_records(records, world, spec["model"][world], setting)
    if not lat:
        raise EmptyFigureError(f"figure {spec['name']}: no latency records of {spec['model'][world]} with {setting} "
                               f"under {_where(root, world)} (run `varbench latency …` first)")
    fig, ax = plt.subplots(figsize=(6.0, 3.6))
    # the dense reference first, then by the drawn height (a sum of per-scale medians, which need not
    # order as the timed medians do, so that the bars stand in order)
    chains = sorted(lat, key=lambda c: (c != "dense", -sum(lat[c]["cost"]["per_scale_ms"])
                                        - lat[c]["cost"].get("last_step_ms", 0.0) - lat[c]["cost"]["decode_ms"]))
    K = max(len(lat[c]["cost"]["per_scale_ms"]) for c in chains)
    colors = [plt.cm.viridis(i / max(K - 1, 1)) for i in range(K)]
    hws = _scales_hw(spec["model"][world], K)
    names = [f"scale {si}" + (f" ({hws[si][0]}×{hws[si][1]})" if hws else "") for si in range(K)]
    for j, c in enumerate(chains):
        cost, bottom = lat[c]["cost"], 0.0
        for si, v in enumerate(cost["per_scale_ms"]):
            ax.bar(j, v, bottom=bottom, color=colors[si], label=names[si] if j == 0 else None, width=0.6)
            bottom += v
        if "last_step_ms" in cost:   # the last scale's sampling step, after its logits
            ax.bar(j, cost["last_step_ms"], bottom=bottom, color="0.45", label="last sampling step" if j == 0 else None,
                   width=0.6)
            bottom += cost["last_step_ms"]
        ax.bar(j, cost["decode_ms"], bottom=bottom, color="0.75", hatch="//", label="decode" if j == 0 else None,
               width=0.6)
    labels = short_labels(chains)
    ax.set_xticks(range(len(chains)), [labels[c] for c in chains], rotation=20, ha="right")
    ax.set_ylabel("ms per generation (median per scale)")
    ax.legend(frameon=False, fontsize=6.5, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    p = lat[chains[0]]["spec"]["protocol"]
    return fig, (f"{spec['model'][world]} · {p['device']} · batch {p['batch']}"
                 + (f" · threads {p['threads']}" if p.get("threads") else "") + f" · {world} world" + _left_out(left_out))


# ------------------------------------------------------------------ sweep
def _check_sweep(spec, where):
    from bench.registry import METHODS
    x = spec.get("x")
    if not isinstance(x, dict) or not isinstance(x.get("method_param"), str) or set(x) - {"method_param", "label"}:
        raise FigureSpecError(f"{where}: x must be {{method_param: NAME}} (optionally with label:), got {x!r}")
    _check_metric(spec.get("y"), where)
    only = spec.get("methods")
    if only is not None and (not isinstance(only, list) or not all(isinstance(m, str) for m in only)):
        raise FigureSpecError(f"{where}: methods must be a list of method names, got {only!r}")
    for m in only or ():   # a method not implemented yet is checked once it is
        if m in METHODS and x["method_param"] not in (METHODS.meta(m).get("params") or {}):
            raise FigureSpecError(f"{where}: method {m} has no parameter {x['method_param']!r}")
    pats = spec.get("series")
    if pats is not None and (not isinstance(pats, list) or not all(isinstance(p, str) for p in pats)):
        raise FigureSpecError(f"{where}: series must be a list of labels such as '{{method}} + ft', got {pats!r}")
    if spec.get("yscale", "linear") not in ("linear", "log"):
        raise FigureSpecError(f"{where}: yscale must be linear or log, got {spec.get('yscale')!r}")


def _swept(methods, param: str, only) -> Optional[Tuple[int, str, Dict[str, str]]]:
    """(index, name, params) of the chain's first method that has ``param`` (and is in ``only``)."""
    for i, m in enumerate(methods):
        name, params = parse_method(m)
        if param in params and (only is None or name in only):
            return i, name, params
    return None


def sweep_series(spec, records, world) -> Tuple[List[dict], Optional[dict], List[str]]:
    """(series, dense, left_out): each series ``{key, label, colour_key, style_key, points}`` with points
    ``{x, y, yerr, n, run_id}`` sorted by x; ``dense`` the newest dense record's point (or None);
    ``left_out`` the labels of the series that the spec's ``series`` patterns leave out, and of the chains
    whose value of x is not one number (e.g. ``lazyvar:keep=0.2/0.1``, one ratio per scale)."""
    model, bench = _for_world(spec, "model", world), _for_world(spec, "bench", world)
    y, param, only = spec["y"], spec["x"]["method_param"], spec.get("methods")
    best: Dict[Tuple[tuple, float], dict] = {}
    dense, off_axis = None, set()
    for rec in records.values():
        s = rec["spec"]
        if (s["world"], s["model"], s["bench"]) != (world, model, bench) or y not in rec["metrics"]:
            continue
        point = _point(rec, y)
        if not s["methods"]:
            dense = point if _newer(point, dense) else dense
            continue
        hit = _swept(s["methods"], param, only)
        if hit is None:
            continue
        i, name, params = hit
        swept = format_method(name, {k: v for k, v in params.items() if k != param})
        try:
            point["x"] = float(params[param])
        except ValueError:   # e.g. lazyvar:keep=0.2/0.1 (one ratio per scale): not a point of this axis
            off_axis.add(describe(s["methods"][:i] + [format_method(name, params)] + s["methods"][i + 1:]))
            continue
        key = (tuple(s["methods"][:i]), swept, tuple(s["methods"][i + 1:]))
        if _newer(point, best.get((key, point["x"]))):
            best[key, point["x"]] = point
    grouped: Dict[tuple, List[dict]] = {}
    for (key, _), p in best.items():
        grouped.setdefault(key, []).append(p)
    series = [{"key": key, "label": describe(key[0] + (key[1],) + key[2]), "colour_key": describe([key[1]]),
               "style_key": describe(key[0] + key[2]), "points": sorted(pts, key=lambda p: p["x"])}
              for key, pts in sorted(grouped.items())]
    pats = spec.get("series")
    keep = [s for s in series if pats is None
            or s["label"] in {p.replace("{method}", parse_method(s["key"][1])[0]) for p in pats}]
    return keep, dense, [s["label"] for s in series if s not in keep] + sorted(off_axis)


def _sweep_empty(spec, world, root, left_out=()) -> EmptyFigureError:
    """What a sweep looked for, and (from the method registry) why there may be nothing to find."""
    from bench.registry import METHODS
    param, only = spec["x"]["method_param"], spec.get("methods")
    model, bench = spec["model"][world], spec["bench"][world]
    having = [m for m in METHODS.names() if param in (METHODS.meta(m).get("params") or {})]
    msg = (f"figure {spec['name']}: no {bench} records of {model} with {spec['y']} whose method chain sets {param}"
           + (f" of {', '.join(only)}" if only else "") + f" under {_where(root, world)}")
    missing = [m for m in only or () if m not in METHODS]
    if missing:
        msg += (f"; {', '.join(missing)}: not implemented in varbench yet (not in the method registry, see "
                f"`varbench list methods`), so no run can have made such a record")
    elif not having:
        msg += f"; no registered method has a parameter {param!r}"
    if left_out:
        msg += f"; {len(left_out)} series left out (by the spec's series, or x not one number): {', '.join(left_out)}"
    runnable = [m for m in (only or having) if m in METHODS]
    if runnable:
        msg += (f" (make them with e.g. `varbench run --model {model} --bench {bench} --method "
                f"'{runnable[0]}:{param}=…'` or `varbench sweep`)")
    return EmptyFigureError(msg)


@kind("sweep", _check_sweep)
def _draw_sweep(spec, records, world, root, plt):
    import numpy as np
    series, dense, left_out = sweep_series(spec, records, world)
    if not series:
        raise _sweep_empty(spec, world, root, left_out)
    fig, ax = plt.subplots(figsize=(7.2, 3.8))
    colours = {k: SERIES_COLOURS[i % len(SERIES_COLOURS)]
               for i, k in enumerate(dict.fromkeys(s["colour_key"] for s in series))}
    # style = the rest of the chain; "dense" (nothing else, i.e. training-free) gets the first, solid style
    styles = {k: STYLES[i % len(STYLES)] for i, k in enumerate(sorted({s["style_key"] for s in series},
                                                                      key=lambda k: (k != "dense", k)))}
    for s in series:
        pts, colour = s["points"], colours[s["colour_key"]]
        marker, ls, filled = styles[s["style_key"]]
        errs = [p["yerr"] for p in pts]
        ax.errorbar([p["x"] for p in pts], [p["y"] for p in pts], label=s["label"], color=colour, marker=marker,
                    ls=ls, lw=1.2, ms=5, mew=1.2, mfc=colour if filled else "white", capsize=2.5, elinewidth=1,
                    yerr=None if all(e is None for e in errs) else np.array([np.nan if e is None else e for e in errs]))
    if dense is not None:
        ax.axhline(dense["y"], color="black", ls="--", lw=1, label="dense (no method)", zorder=1)
        if dense["yerr"]:
            ax.axhspan(dense["y"] - dense["yerr"], dense["y"] + dense["yerr"], color="0.6", alpha=0.2, lw=0, zorder=0)
    if spec.get("yscale") == "log":   # plain numbers (2, 5, 10), not 2×10⁰
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(spec["x"].get("label") or spec["x"]["method_param"])
    ax.set_ylabel(_ylabel(spec["y"]))
    ax.legend(frameon=False, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ns = sorted({p["n"] for s in series for p in s["points"]} | ({dense["n"]} if dense else set()))
    note = (f"{spec['model'][world]} · {spec['bench'][world]} · n={'/'.join(map(str, ns))} · {world} world · "
            f"bars: ±stderr · " + ("no dense record" if dense is None else "dashed: dense (band ±stderr)"))
    if left_out:
        note += (f"\n{len(left_out)} other chain(s) setting {spec['x']['method_param']} not drawn "
                 f"(left out by the spec's series, or not one number)")
    return fig, note


# ------------------------------------------------------------------ table_bars
def _check_table_bars(spec, where):
    from bench.render import load_spec
    try:
        table = load_spec(str(spec.get("table")))
    except KeyError as e:   # UnknownNameError: "did you mean"
        raise FigureSpecError(f"{where}: table: {e}") from None
    _check_metric(spec.get("y"), where)
    metrics = sorted({m for c in table.columns if not c.relative for m in [c.metric, *(pm for pm, _ in c.per_world.values())]})
    if spec["y"] not in metrics:
        raise FigureSpecError(f"{where}: table {table.name} has no column of metric {spec['y']!r}; its metrics: "
                              f"{', '.join(metrics)}")


def table_bars_data(spec, records, world) -> dict:
    """The table's rows and columns of metric ``y`` as ``varbench table`` fills them from ``records``:
    ``{table, columns, bars: [{row, column, group, value, stderr, run_id, absent}], reference}``;
    ``absent`` is None for a measured cell, else why it has no record."""
    from bench.checkpoint import CheckpointError
    from bench.plan import match_records, table_cells
    from bench.render import build_table, load_spec
    table = load_spec(spec["table"])
    try:
        cells = table_cells(table, world, need_ckpt=False)
    except (CheckpointError, FileNotFoundError) as e:
        raise EmptyFigureError(f"figure {spec['name']}: cannot make the run specs of table {table.name}: {e}") from None
    found, stale = match_records([c.spec for c in cells if c.spec is not None], records)
    built = build_table(table, world, cells, found, stale)
    by_cell = {(c.row, c.group): c for c in cells}
    columns = [c for c in built["columns"] if c["metric"] == spec["y"] and not c["relative"]]
    bars = []
    for row in built["rows"]:
        for col in columns:
            got, cell = row["cells"][col["id"]], by_cell.get((row["label"], col["group"]))
            absent = None
            if got["ours"] is None:
                if cell is None or cell.spec is None:
                    absent = cell.reason if cell is not None else "no run in this world"
                elif stale.get(cell.spec.key()):
                    absent = f"only a stale record (rerun with `varbench table {table.name}`)"
                else:
                    absent = f"no record yet (`varbench table {table.name} --world {world}`)"
            bars.append({"row": row["label"], "column": col["id"], "group": built["groups"][col["group"]]["label"],
                         "format": col["format"], "value": got["ours"], "stderr": got["stderr"],
                         "run_id": got["run_id"], "absent": absent})
    ref = next((b["value"] for b in bars if b["row"] == table.reference_row and b["column"] == columns[0]["id"]), None)
    return {"table": built, "columns": columns, "bars": bars, "reference": ref}


@kind("table_bars", _check_table_bars)
def _draw_table_bars(spec, records, world, root, plt):
    import numpy as np
    data = table_bars_data(spec, records, world)
    t, bars, columns = data["table"], data["bars"], data["columns"]
    if all(b["absent"] for b in bars):
        raise EmptyFigureError(f"figure {spec['name']}: no record of any {spec['y']} cell of table {t['table']} "
                               f"({t['model']} · {t['bench']}) under {_where(root, world)}; looked for rows "
                               f"{', '.join(dict.fromkeys(b['row'] for b in bars))} "
                               f"(run `varbench table {t['table']} --world {world}` first)")
    rows = list(dict.fromkeys(b["row"] for b in bars))
    fig, ax = plt.subplots(figsize=(6.6, 1.0 + 0.34 * len(rows) * len(columns)))
    h = 0.8 / len(columns)
    top = max(b["value"] + (b["stderr"] or 0) for b in bars if not b["absent"])
    for c, col in enumerate(columns):
        mine = [b for b in bars if b["column"] == col["id"]]
        ys = [rows.index(b["row"]) + (c - (len(columns) - 1) / 2) * h for b in mine]
        here = [(y, b) for y, b in zip(ys, mine) if not b["absent"]]
        errs = [b["stderr"] for _, b in here]
        ax.barh([y for y, _ in here], [b["value"] for _, b in here], height=h * 0.9,
                color=SERIES_COLOURS[3] if len(columns) == 1 else SERIES_COLOURS[c % len(SERIES_COLOURS)],
                label=(col["group"] or col["id"]) if len(columns) > 1 else None,
                xerr=None if all(e is None for e in errs) else np.array([np.nan if e is None else e for e in errs]),
                error_kw={"capsize": 2.5, "elinewidth": 1, "ecolor": "black"})
        for y, b in zip(ys, mine):
            if b["absent"]:
                ax.text(0.01 * top, y, "no record (see note)", va="center", fontsize=7, color="0.35", style="italic",
                        zorder=5, bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
            else:
                value = b["format"].format(b["value"]) if b["format"] else f"{b['value']:g}"
                ax.text(b["value"] + (b["stderr"] or 0) + 0.01 * top, y, value, va="center", fontsize=6.5)
    ref = data["reference"]
    if ref is not None:
        ax.axvline(ref, color="black", ls=":", lw=1, zorder=1)
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()   # the table's first row on top
    ax.set_xlim(0, top * 1.15)
    ax.set_xlabel(_ylabel(spec["y"]))
    if len(columns) > 1:
        ax.legend(frameon=False, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    absent = [f"{b['row']}{' (' + b['group'] + ')' if len(columns) > 1 and b['group'] else ''}: {b['absent']}"
              for b in bars if b["absent"]]
    n = "/".join(map(str, t["n"]))
    return fig, "\n".join([f"table {t['table']} · {t['model']} · {t['bench']} · n={n} · {world} world · the cells "
                           f"`varbench table` shows · bars: ±stderr · no bar = no record, never 0"
                           + (f" · dotted: {t['reference_row']}" if ref is not None else "")] + [f"absent: {a}" for a in absent])


# ------------------------------------------------------------------ gates
def gate_onsets(K: int, onset: float, ramp: float) -> List[float]:
    """t_i of PSAD's gates (``methods/psad.py`` ``onsets``): t_0 = −Δ, t_i = onset·i/(K−1)."""
    return [-ramp if i == 0 else onset * i / max(K - 1, 1) for i in range(K)]


def gate_values(t: float, K: int, onset: float, ramp: float) -> List[float]:
    """γ̃_i(t) = min(1, max(0, (t − t_i)/Δ)) for i = 0 … K−1; a hard step t ≥ t_i when Δ = 0."""
    if ramp == 0:
        return [1.0 if t >= ti else 0.0 for ti in gate_onsets(K, onset, ramp)]
    return [min(1.0, max(0.0, (t - ti) / ramp)) for ti in gate_onsets(K, onset, ramp)]


def _check_gates(spec, where):
    from bench.registry import METHODS
    m = spec.get("method")
    if not isinstance(m, str) or m not in METHODS:
        raise FigureSpecError(f"{where}: method: {METHODS.unknown_message(str(m))}")
    missing = {"onset", "ramp"} - set(METHODS.meta(m).get("params") or {})
    if missing:
        raise FigureSpecError(f"{where}: method {m} has no parameter(s) {', '.join(sorted(missing))}; the gates kind "
                              f"draws γ̃_i(t) from onset and ramp (methods/psad.py)")
    if not isinstance(spec.get("where", {}), dict):
        raise FigureSpecError(f"{where}: where must be a mapping parameter -> value, got {spec.get('where')!r}")


def gate_schedules(spec, records, world, root=None) -> List[dict]:
    """One ``{K, patch_nums, onset, ramp, run_ids, source}`` per distinct schedule among the model's
    records whose chain holds ``spec['method']`` (and matches ``where``); from the method's YAML
    defaults (``source: "defaults"``) when there is none."""
    from bench.registry import MODELS
    model, method = _for_world(spec, "model", world), spec["method"]
    patch_nums = tuple(getattr(getattr(MODELS.get(model), "var_cfg", None), "patch_nums", ()) or ())
    if not patch_nums:
        raise FigureSpecError(f"figure {spec['name']}: model {model} has no VAR scale schedule (var_cfg.patch_nums)")
    want = parse_method(format_method("m", spec.get("where") or {}))[1]
    found: Dict[Tuple[float, float], dict] = {}
    for rec in sorted(records.values(), key=lambda r: r["run_id"]):
        if (rec["spec"]["world"], rec["spec"]["model"]) != (world, model):
            continue
        for m in rec["spec"]["methods"]:
            name, params = parse_method(m)
            if name == method and all(params.get(k) == v for k, v in want.items()):
                s = found.setdefault((float(params["onset"]), float(params["ramp"])), {"run_ids": [], "source": "records"})
                s["run_ids"].append(rec["run_id"])
    if not found:
        dflt = _defaults(method)
        if any(dflt.get(k) != v for k, v in want.items()):
            raise EmptyFigureError(f"figure {spec['name']}: no record of {model} under {_where(root, world)} with "
                                   f"{method} {want}, and {method}'s defaults do not match {want}")
        found[float(dflt["onset"]), float(dflt["ramp"])] = {"run_ids": [], "source": "defaults"}
    return [{"K": len(patch_nums), "patch_nums": patch_nums, "onset": o, "ramp": r, **v}
            for (o, r), v in sorted(found.items())]


@kind("gates", _check_gates)
def _draw_gates(spec, records, world, root, plt):
    schedules = gate_schedules(spec, records, world, root)
    cols = min(len(schedules), 3)
    rows = -(-len(schedules) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.9 * cols + 1.3, 2.5 * rows + 0.5), sharey=True, squeeze=False)
    for ax in axes.flat[len(schedules):]:
        ax.set_visible(False)
    for ax, s in zip(axes.flat, schedules):
        K, onset, ramp = s["K"], s["onset"], s["ramp"]
        bends = [b for ti in gate_onsets(K, onset, ramp) for b in (ti, ti + ramp) if 0 <= b <= 1]
        ts = sorted(set([i / 400 for i in range(401)] + bends))
        curves = list(zip(*(gate_values(t, K, onset, ramp) for t in ts)))
        for i, ys in enumerate(curves):
            pn = s["patch_nums"][i]
            ax.plot(ts, ys, color=plt.cm.viridis(0.9 * i / max(K - 1, 1)), lw=1.4, label=f"scale {i} ({pn}×{pn})")
        ids = s["run_ids"]
        who = ("defaults (methods YAML; no record)" if s["source"] == "defaults" else
               f"record {ids[0]}" if len(ids) == 1 else
               f"records {', '.join(ids[:2])}" + (f" (+{len(ids) - 2})" if len(ids) > 2 else ""))
        ax.set_title(f"onset {onset:g} · ramp Δ {ramp:g}\n{who}", fontsize=7.5)
        ax.set_xlim(0, 1)
        ax.set_ylim(-0.03, 1.05)
        ax.set_xlabel("training progress t (fraction of steps)")
    for ax in axes[:, 0]:
        ax.set_ylabel(r"gate $\tilde\gamma_i(t)$")
    axes.flat[len(schedules) - 1].legend(frameon=False, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    model = spec["model"][world]
    src = "from the method's defaults (no record of it yet)" if schedules[0]["source"] == "defaults" else "from records"
    return fig, (f"{spec['method']} gates on {model} (K={schedules[0]['K']} scales) · {src} · {world} world · "
                 f"t_0 = −Δ, t_i = onset·i/(K−1)")


# ------------------------------------------------------------------ drawing and writing
def _style():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({"pdf.fonttype": 42, "ps.fonttype": 42, "font.size": 9, "axes.spines.top": False,
                         "axes.spines.right": False, "axes.prop_cycle": matplotlib.cycler(color=OKABE_ITO)})
    return plt


def figure(name: str, world: str = "tiny", root=None, records: Optional[Dict[str, dict]] = None):
    """Figure ``name`` drawn from the records under ``root`` (a matplotlib Figure; close it when done);
    ``records`` (run id -> record, ``load_records``): those already read, for drawing several figures."""
    from bench.records import load_records
    spec = load_figure(name)
    if records is None:
        records = load_records(root, world, on_error=lambda p, e: None)
    plt = _style()
    fig, note = KINDS[spec["kind"]].draw(spec, records, world, root, plt)
    visible = [a for a in fig.axes if a.get_visible()]
    if len(visible) == 1 and not visible[0].get_title():   # a kind's own panel title (gates) is kept
        visible[0].set_title(spec.get("title", name), fontsize=10)
    else:
        fig.suptitle(spec.get("title", name), fontsize=10)
    import textwrap
    width = int(fig.get_figwidth() * 19)   # characters of 6 pt text per line across the figure
    note = "\n".join(textwrap.fill(line, width, subsequent_indent="  ") for line in note.split("\n"))
    fig.text(0.01, 0.01, note, fontsize=6, color="0.35", va="bottom")
    lines = note.count("\n") + 1
    fig.tight_layout(rect=(0, min(0.4, (0.12 * lines + 0.04) / fig.get_figheight()), 1, 1))
    return fig


def render(name: str, world: str = "tiny", root=None, out=None, records: Optional[Dict[str, dict]] = None) -> List[Path]:
    """Render figure ``name`` from the records under ``root`` (or ``records``, see ``figure``); returns the
    written PNG and PDF paths."""
    from bench.resources import figures_out_dir
    fig = figure(name, world, root, records)
    plt = _style()
    folder = figures_out_dir(out) / world
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    try:
        for ext in ("png", "pdf"):
            target = folder / f"{name}.{ext}"
            tmp = folder / f".{name}.{os.getpid()}.tmp.{ext}"
            fig.savefig(tmp, dpi=200 if ext == "png" else None)
            os.replace(tmp, target)           # atomic: a figure is complete or absent
            paths.append(target)
    finally:
        plt.close(fig)
    return paths
