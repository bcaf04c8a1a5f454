"""The leaderboard: every current record of a world, ranked, one table per bench. Records only.

``varbench leaderboard [--world W] [--results DIR] [--out DIR] [--sort METRIC]`` (``make
leaderboard``) writes ``<out>/<world>/leaderboard.{md,tex,html,json}``. Paper tables answer "does
the tiny world reproduce the paper?"; the leaderboard answers "what has been measured, and which
chain is best?" over *every* record, whatever table (if any) asked for it. Like ``bench.render`` it
reads JSON records and the registries' metadata only: no torch, no model or method code.

Rows
----
One row per bench, model, resolved method chain (the record's ``spec.methods``; no methods =
``dense``), *setting* and n. The setting is what else keys a run besides its seed: the sampling
overrides as requested (``cfg=3.0``) and the bench's own setting (the latency bench's device, batch,
threads, ...), read back through ``Bench.args_from_protocol``. Precisely, records share a row when
their spec keys agree once the seed is left out (``RunSpec.key(ignore=("seed",))``).

Aggregation (several seeds of one row)
--------------------------------------
Records that differ only in their seed are one row; its *Seeds* column lists them. Each cell is the
mean over the row's records that recorded that metric. The error bar is the standard error of that
mean over seeds (sample standard deviation / sqrt(k)) when k >= 2 seeds recorded it and their values
differ; with one seed it is that record's own ``stderr`` (none recorded: no error bar); a value
every seed agrees on (params, FLOPs) has none. A cell that fewer than all of the row's K seeds
recorded says so: ``[k/K]``. Missing values are never imputed or averaged as zeros: a metric no
record of the row has leaves the cell empty, and the row stays. Records with different n are never
averaged: metrics such as FID depend on n (FID is biased upwards at small n), so each n is its own
row.

Columns
-------
``#`` (rank), Model, Methods (the chain as requested, e.g. ``magnitude:sparsity=0.4 + ft``; the
resolved chain with every default is the row's identity, in the JSON and as the HTML cell's
tooltip), Setting (only when some row has one), n, Seeds, then the bench's quality metrics in the
order the bench declares them (``Bench.metrics``), then the fidelity metrics ``FIDELITY`` that
``--fidelity`` runs add (FID*, PSNR, SSIM, LPIPS), then the costs ``COSTS`` (params, FLOPs) read from
each record's ``cost`` block, then Latency (ms): the ``latency`` bench's median for the same model
and resolved chain, at the setting most latency records share (named in the caption). A run's own
sampling time is not shown: it is measured under whatever else the machine was doing, while the
latency bench times generations under a fixed protocol. Header, direction arrow (↓ lower is better,
↑ higher is better) and number format come from the metric catalog (``bench.metrics.catalog``). A
column without a single value in the bench is left out.

Sort rule
---------
Each bench's table is sorted by its *primary metric*: the first metric the bench declares that has
a direction in the catalog and a value in some row (FID for the image benches, latency for the
latency bench), best first: ascending when lower is better, descending when higher is better.
``--sort METRIC`` sorts every bench that has a METRIC column by it instead (a metric without a
direction, e.g. params, sorts ascending). Rows without the sort metric come last and get no rank;
ties share a rank and are ordered by model, method chain and n. Each table's caption states its rule.
In the HTML page, clicking a column header re-sorts by that column (best first on the first click,
reversed on the next), numbers by value, empty cells always last.

Stale records
-------------
As in the paper tables (``bench.render``), only current records are shown: a record whose request
would resolve to another key today (``bench.plan.staleness``: a method default or version, the
checkpoint, the bench protocol changed, or a schema-1 record) is left out, never mixed in, and the
bench's notes count the records left out and name ``varbench runs --stale``. Unreadable record files
are skipped with a warning by the loader (the same as ``varbench runs``).

API: ``records_frame(records) -> DataFrame`` (one row per record), ``build(records, world, sort=None)
-> dict`` (the ``.json`` output), ``texts(board) -> {"md", "tex", "html", "json"}`` and
``write(board, out_dir) -> {format: path}`` (atomic writes).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import jinja2
import markupsafe
import pandas as pd

from bench.defaults import WORLDS
from bench.io import atomic_write_text, git_commit
from bench.registry import BENCHES, METRICS
from bench.render import ARROWS, _env, _tex_escape
from bench.resources import resource_dir, tables_out_dir

FORMATS = ("md", "tex", "html", "json")
COSTS = ("params", "flops")                             # read from a record's ``cost`` block
FIDELITY = ("fid_star", "psnr", "ssim", "lpips")        # a ``--fidelity`` run's metrics (any bench)
LATENCY, TIMING_BENCH = "latency_ms", "latency"         # the latency column of the quality tables: joined
                                                        # from the latency bench's records (module docstring)
STDERR = ".stderr"                                       # frame column suffix of a metric's error bar
BEST_FIRST = {"lower": "ascending", "higher": "descending", None: "ascending"}


class LeaderboardError(ValueError):
    """Nothing to rank (no records, or only stale ones), or a request the records cannot answer."""


# --------------------------------------------------------------------------------------------------
# records -> frames


# a model of each world for the "no records" hint
EXAMPLE_RUN = {"tiny": "tiny-var", "paper": "var-d16"}


def _setting(spec: Mapping[str, Any]) -> str:
    """What keys a run besides model, chain, n and seed, as text ('' when nothing is set)."""
    overrides = ((spec.get("requested") or {}).get("sampling") or {})
    bench_args = BENCHES.get(spec["bench"]).args_from_protocol(spec.get("protocol"))
    parts = [", ".join(f"{k}={v}" for k, v in sorted(overrides.items())),
             ", ".join(f"{k}={v}" for k, v in bench_args.items())]
    return " · ".join(p for p in parts if p)


def _number(v: Any) -> Optional[float]:
    if isinstance(v, Mapping):
        v = v.get("value")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def records_frame(records: Mapping[str, Mapping[str, Any]], ckpt_dir: Optional[str | os.PathLike] = None) -> pd.DataFrame:
    """One row per record (``records``: path -> record, as ``varbench runs`` loads them): its spec
    fields, staleness (``stale``, ``why``: the same test as ``varbench runs --stale``) and one column
    per catalog metric it holds (``<metric>`` and ``<metric>.stderr``; costs ``COSTS`` from ``cost``)."""
    from bench.plan import staleness
    from bench.records import RunSpec

    rows = []
    for path, rec in records.items():
        s = rec["spec"]
        st = staleness(rec, ckpt_dir=ckpt_dir)
        row = {"path": str(path), "run_id": rec["run_id"], "world": s["world"], "model": s["model"],
               "bench": s["bench"], "methods": " + ".join(s["methods"]) or "dense", "methods_list": list(s["methods"]),
               "label": " + ".join((s.get("requested") or {}).get("methods") or s["methods"]) or "dense",
               "setting": "" if st.stale else _setting(s), "n": s["n"], "seed": s["seed"],
               "group": RunSpec.from_dict(s).key(ignore=("seed",)), "created": rec["created"],
               "git_commit": (rec.get("env") or {}).get("git_commit") or "unknown",
               "git_dirty": bool((rec.get("env") or {}).get("git_dirty")), "stale": st.stale, "why": st.reason}
        for name, m in rec["metrics"].items():
            if name in METRICS and _number(m) is not None:
                row[name] = _number(m)
                row[name + STDERR] = _number(m.get("stderr"))
        for name in COSTS:
            if _number(rec["cost"].get(name)) is not None:
                row[name] = _number(rec["cost"][name])
                cost = rec["cost"][name]
                row[name + STDERR] = _number(cost.get("stderr")) if isinstance(cost, Mapping) else None
        rows.append(row)
    return pd.DataFrame(rows)


def seed_mean(values: Sequence[float], one_stderr: Optional[float]) -> tuple:
    """(value, stderr) of one row's k seeds: k = 1, the value and its record's own stderr
    (``one_stderr``); k ≥ 2, the mean ± sample standard deviation / √k (None when the seeds agree)."""
    k = len(values)
    if k == 1:
        return float(values[0]), one_stderr
    mean = sum(values) / k
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (k - 1))
    return float(mean), (sd / math.sqrt(k) if sd > 0 else None)


def _aggregate(records: pd.DataFrame, measures: Sequence[str]) -> List[Dict[str, Any]]:
    """One entry per row of the leaderboard (see "Aggregation" in the module docstring)."""
    out = []
    for _, sub in records.groupby("group", sort=False):
        first = sub.iloc[0]
        entry = {"model": first["model"], "methods": list(first["methods_list"]), "chain": first["methods"],
                 "label": first["label"],
                 "setting": first["setting"], "n": int(first["n"]), "seeds": sorted(int(s) for s in sub["seed"]),
                 "run_ids": sorted(sub["run_id"]), "values": {}}
        for m in measures:
            if m not in sub:
                continue
            got = sub[sub[m].notna()]
            k = len(got)
            if k == 0:
                continue
            err = got[m + STDERR].iloc[0] if k == 1 and m + STDERR in got else None
            value, err = seed_mean(list(got[m].astype(float)), None if err is None or pd.isna(err) else float(err))
            entry["values"][m] = {"value": value, "stderr": err, "k": k}
        out.append(entry)
    return out


# --------------------------------------------------------------------------------------------------
# the board (the .json output)


def _fmt(v: Optional[float], fmt: str) -> str:
    return "" if v is None else fmt.format(v)


def _cell(measure: Optional[Mapping[str, Any]], fmt: str, seeds: int) -> Dict[str, Any]:
    """Display texts of one metric cell: 'value ± err [k/K]' (Markdown/HTML) and its LaTeX."""
    if measure is None:
        return {"text": "", "tex": "", "sort": None}
    value, err = _fmt(measure["value"], fmt), _fmt(measure["stderr"], fmt)
    partial = f" [{measure['k']}/{seeds}]" if measure["k"] < seeds else ""
    text = (f"{value} ± {err}" if err else value) + partial
    tex = (f"{value}\\,$\\pm$\\,{err}" if err else value) + partial
    return {"text": text, "tex": tex, "sort": measure["value"]}


def _primary(bench_metrics: Sequence[str], present: Sequence[str]) -> Optional[str]:
    return next((m for m in bench_metrics if m in present and METRICS.get(m).better is not None), None)


def _sort(rows: List[Dict[str, Any]], metric: Optional[str]) -> None:
    """Sort ``rows`` in place by ``metric`` best first (empty last; ties: model, chain, n) and rank them."""
    better = METRICS.get(metric).better if metric else None
    sign = -1.0 if better == "higher" else 1.0
    rows.sort(key=lambda r: (r["model"], r["chain"], r["n"]))
    if metric is None:
        for r in rows:
            r["rank"] = None
        return
    rows.sort(key=lambda r: (metric not in r["values"], sign * r["values"].get(metric, {}).get("value", 0.0)))
    rank, prev = 0, None
    for i, r in enumerate(rows):
        v = r["values"].get(metric, {}).get("value")
        if v is None:
            r["rank"] = None
            continue
        if v != prev:
            rank, prev = i + 1, v
        r["rank"] = rank


def _caption(bench: str, metric: Optional[str], requested: Optional[str], n_rows: int, n_records: int,
             n_stale: int, partial: bool) -> str:
    if n_rows == 0:
        rule = "Nothing current to rank."
    elif metric is None:
        rule = "No metric with a direction has a value: rows in model, method-chain and n order."
    else:
        info = METRICS.get(metric)
        way = {"lower": "lower is better, best first", "higher": "higher is better, best first",
               None: "no better direction: ascending"}[info.better]
        why = "--sort" if requested == metric else "the bench's primary metric"
        rule = (f"Sorted by {info.header} {ARROWS[info.better]}".rstrip() + f" ({why}; {way}); rows without "
                f"{info.header} last, unranked; ties share a rank, in model, method-chain and n order.")
    if requested and requested != metric:
        rule += f" (--sort {requested}: {bench} has no {requested} values.)"
    text = f"{n_rows} row{'s' * (n_rows != 1)} from {n_records} current record{'s' * (n_records != 1)}. {rule}"
    if n_rows:
        text += (" Cells: mean over the row's seeds ± standard error over seeds (one seed: the record's own "
                 "stderr); empty: not recorded.")
    if partial:
        text += " [k/K]: mean over the k of the row's K seeds that recorded the metric."
    if n_stale:
        text += (f" {n_stale} stale record{'s' * (n_stale != 1)} not shown (made under an older method, "
                 "checkpoint or protocol; list: `varbench runs --stale`).")
    return text


def _columns(bench_metrics: Sequence[str], present: Sequence[str], with_setting: bool,
             extra: Sequence[str] = ()) -> List[Dict[str, Any]]:
    def text(id, header, type="text"):
        return {"id": id, "header": header, "arrow": "", "type": type, "best": "ascending",
                "description": "", "align": "r" if type == "num" else "l"}
    cols = [text("rank", "#", "num"), text("model", "Model"), text("methods", "Methods")]
    if with_setting:
        cols.append(text("setting", "Setting"))
    cols += [text("n", "n", "num"), text("seeds", "Seeds")]
    for m in [*bench_metrics, *[c for c in (*FIDELITY, *COSTS, *extra) if c not in bench_metrics]]:
        if m in present:
            info = METRICS.get(m)
            cols.append({"id": m, "header": info.header, "arrow": ARROWS[info.better], "type": "num",
                         "best": BEST_FIRST[info.better], "description": info.description, "align": "r",
                         "format": info.format, "better": info.better})
    return cols


def _latency_join(rows: List[Dict[str, Any]], timing: pd.DataFrame) -> Optional[str]:
    """Add the latency bench's median (``LATENCY``) to the quality rows of the same model and resolved
    chain, for one setting: the one most latency records share (ties: the first in sort order).
    Returns that setting's text, or None when nothing joined."""
    if timing.empty:
        return None
    counts = timing.groupby("setting").size()
    setting = sorted(counts.index, key=lambda k: (-counts[k], k))[0]
    by_chain = {key: entry for entry in _aggregate(timing[timing["setting"] == setting], [LATENCY])
                for key in [(entry["model"], entry["chain"])] if LATENCY in entry["values"]}
    joined = False
    for r in rows:
        hit = by_chain.get((r["model"], r["chain"]))
        if hit is not None:
            r["values"][LATENCY] = {**hit["values"][LATENCY], "k": len(r["seeds"])}
            joined = True
    return setting if joined else None


def _bench_table(bench: str, current: pd.DataFrame, n_stale: int, sort: Optional[str],
                 timing: Optional[pd.DataFrame] = None) -> Dict[str, Any]:
    declared = tuple(BENCHES.get(bench).metrics)
    measures = [*declared, *[c for c in (*FIDELITY, *COSTS) if c not in declared]]
    rows = _aggregate(current, measures)
    latency_setting = None
    if bench != TIMING_BENCH and timing is not None:
        latency_setting = _latency_join(rows, timing)
        if latency_setting is not None:
            measures.append(LATENCY)
    present = [m for m in measures if any(m in r["values"] for r in rows)]
    metric = sort if sort in present else _primary(declared, present)
    _sort(rows, metric)
    cols = _columns(declared, present, with_setting=any(r["setting"] for r in rows),
                    extra=(LATENCY,) if latency_setting is not None else ())
    for c in cols:   # the HTML header's aria-sort: which column the page opens sorted by
        c["sorted"] = c["best"] if c["id"] == metric else "none"
    partial = False
    for r in rows:
        cells = {"rank": {"text": "" if r["rank"] is None else str(r["rank"]), "sort": r["rank"]},
                 "model": {"text": r["model"], "sort": r["model"]},
                 "methods": {"text": r["label"], "sort": r["label"], "title": r["chain"]},
                 "setting": {"text": r["setting"], "sort": r["setting"]},
                 "n": {"text": str(r["n"]), "sort": r["n"]},
                 "seeds": {"text": ", ".join(map(str, r["seeds"])), "sort": ", ".join(map(str, r["seeds"]))}}
        for c in cols:
            if "format" in c:
                cells[c["id"]] = _cell(r["values"].get(c["id"]), c["format"], len(r["seeds"]))
                partial |= c["id"] in r["values"] and r["values"][c["id"]]["k"] < len(r["seeds"])
        for c in cells.values():
            c.setdefault("tex", _tex_escape(c["text"]))
        r["cells"] = [cells[c["id"]] for c in cols]
    return {"bench": bench, "sort": {"metric": metric, "requested": sort,
                                     "better": METRICS.get(metric).better if metric else None},
            "caption": _caption(bench, metric, sort, len(rows), len(current), n_stale, partial)
            + (f" {METRICS.get(LATENCY).header}: the `{TIMING_BENCH}` bench's median for the same model and chain "
               f"({latency_setting}; `varbench latency`), not the run's own sampling time." if latency_setting else ""),
            "columns": cols, "rows": rows, "records": len(current), "stale": n_stale,
            "git_commits": sorted(set(current["git_commit"])), "git_dirty": bool(current["git_dirty"].any())}


def build(records: Mapping[str, Mapping[str, Any]], world: str, sort: Optional[str] = None,
          ckpt_dir: Optional[str | os.PathLike] = None, root: Optional[str | os.PathLike] = None) -> Dict[str, Any]:
    """The leaderboard of ``world`` from ``records`` (path -> record) as data (the ``.json`` output).

    Raises ``LeaderboardError`` when there is nothing to rank, ``UnknownNameError`` for an unknown
    ``sort`` metric. ``root`` only names the results folder in messages.
    """
    if world not in WORLDS:
        raise LeaderboardError(f"unknown world {world!r}; expected one of {', '.join(WORLDS)}")
    if sort is not None:
        METRICS.get(sort)   # UnknownNameError with "did you mean"
    where = f"{Path(root) / world if root is not None else 'the results folder'}"
    frame = records_frame({p: r for p, r in records.items() if r["spec"]["world"] == world}, ckpt_dir)
    if frame.empty:
        example = EXAMPLE_RUN[world]
        raise LeaderboardError(
            f"no records of the {world} world under {where}: make some first (e.g. `varbench run --model "
            f"{example} --method magnitude`, `varbench table evar-table2{'' if world == 'tiny' else ' --world paper'}`), "
            f"or point --results / $VARBENCH_RESULTS at your records")
    current = frame[~frame["stale"]]
    if current.empty:
        raise LeaderboardError(
            f"all {len(frame)} records of the {world} world under {where} are stale (made under an older method, "
            f"checkpoint or protocol): rerun them, or list them with `varbench runs --stale --world {world}`")
    benches = []
    for bench in sorted(set(frame["bench"])):
        cur = current[current["bench"] == bench]
        n_stale = int((frame["bench"] == bench).sum()) - len(cur)
        if cur.empty:
            benches.append({"bench": bench, "rows": [], "columns": [], "records": 0, "stale": n_stale,
                            "caption": _caption(bench, None, None, 0, 0, n_stale, False), "sort": {},
                            "git_commits": [], "git_dirty": False})
            continue
        benches.append(_bench_table(bench, cur, n_stale, sort, timing=current[current["bench"] == TIMING_BENCH]))
    if sort is not None and not any(b["sort"].get("metric") == sort for b in benches):
        raise LeaderboardError(f"--sort {sort}: no bench of the {world} world has {sort} values; columns: "
                               + "; ".join(f"{b['bench']}: " + ", ".join(c["id"] for c in b["columns"] if "format" in c)
                                           for b in benches if b["columns"]))
    commits = sorted({c for b in benches for c in b["git_commits"]})
    dirty = any(b["git_dirty"] for b in benches)
    n_cur, n_stale = len(current), len(frame) - len(current)
    footer = (f"world {world} · {n_cur} current record{'s' * (n_cur != 1)}"
              + (f", {n_stale} stale not shown" if n_stale else "")
              + f" · records from git {', '.join(c[:12] for c in commits)}" + (" (uncommitted changes)" if dirty else "")
              + f" · rendered at git {git_commit()[:12]}")
    return {"world": world, "benches": benches, "records": n_cur, "stale": n_stale, "footer": footer}


# --------------------------------------------------------------------------------------------------
# text


def _md_layout(bench: Mapping[str, Any]) -> Dict[str, Any]:
    header = [f"{c['header']} {c['arrow']}".strip() for c in bench["columns"]]
    body = [[c["text"] for c in r["cells"]] for r in bench["rows"]]
    header = [h.replace("|", "\\|") for h in header]
    body = [[c.replace("|", "\\|") for c in r] for r in body]
    widths = [max(3, *(len(r[i]) for r in [header] + body)) for i in range(len(header))]
    return {"header": header, "body": body, "widths": widths, "align": [c["align"] for c in bench["columns"]]}


def _tex_layout(bench: Mapping[str, Any]) -> Dict[str, Any]:
    header = [_tex_escape(c["header"]) + (" " + _tex_escape(c["arrow"]) if c["arrow"] else "") for c in bench["columns"]]
    return {"header": header, "body": [[c["tex"] for c in r["cells"]] for r in bench["rows"]],
            "colspec": "".join(c["align"] for c in bench["columns"])}


def _tex_text(text: str) -> str:
    """LaTeX of a caption: escaped, with `code` spans as \\texttt (so `--stale` keeps its two hyphens)."""
    parts = str(text).split("`")
    return "".join(f"\\texttt{{{_tex_escape(p)}}}" if i % 2 else _tex_escape(p) for i, p in enumerate(parts))


def _html_text(text: str) -> markupsafe.Markup:
    """HTML of a caption: escaped, with `code` spans as <code>."""
    parts = str(text).split("`")
    return markupsafe.Markup("".join(f"<code>{markupsafe.escape(p)}</code>" if i % 2 else str(markupsafe.escape(p))
                                     for i, p in enumerate(parts)))


def _html_env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(resource_dir("tables/templates"))),
                             undefined=jinja2.StrictUndefined, autoescape=True, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(sort_value=_sort_value, text=_html_text)
    return env


def _sort_value(v: Any) -> str:
    """The HTML ``data-value`` of a cell: the raw number (sorts numerically) or the text; '' = empty."""
    if v is None:
        return ""
    return repr(float(v)) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def texts(board: Mapping[str, Any]) -> Dict[str, str]:
    """The Markdown, LaTeX (booktabs), HTML and JSON texts of a board made by ``build``."""
    md_env, tex_env = _env()
    tex_env.filters["text"] = _tex_text
    html_env = _html_env()
    md = [{"b": b, "l": _md_layout(b)} for b in board["benches"]]
    tex = [{"b": b, "l": _tex_layout(b), "label": f"tab:leaderboard-{board['world']}-{b['bench']}"}
           for b in board["benches"]]
    return {"md": md_env.get_template("leaderboard.md.j2").render(board=board, benches=md),
            "tex": tex_env.get_template("leaderboard.tex.j2").render(board=board, benches=tex),
            "html": html_env.get_template("leaderboard.html.j2").render(board=board),
            "json": json.dumps(board, indent=2, ensure_ascii=False, allow_nan=False) + "\n"}


def write(board: Mapping[str, Any], out_dir: Optional[str | os.PathLike] = None,
          formats: Sequence[str] = FORMATS) -> Dict[str, Path]:
    """Write ``<out_dir>/<world>/leaderboard.<fmt>`` atomically for each format (``out_dir``:
    ``$VARBENCH_TABLES_OUT``, else ``./tables/out``); returns format -> path."""
    out = tables_out_dir(out_dir) / board["world"]
    all_texts = texts(board)
    return {fmt: atomic_write_text(out / f"leaderboard.{fmt}", all_texts[fmt]) for fmt in formats}
