"""Paper tables: a YAML spec per table, rendered from run records to Markdown, LaTeX and JSON.

A table spec is ``tables/<name>.yaml`` (registered in ``bench.registry.TABLES`` by file stem).
Every cell shows ``ours / paper``: our measurement (``± stderr`` when the record has one; empty
when no record exists yet) and the paper's number (``–`` when the paper has none). Output goes to
``tables/out/<world>/<name>.{md,tex,json}``.

Spec format
-----------
::

    title: "EVAR Table 2: structured pruning baselines on VAR-d16"
    caption: "One paragraph, used as the LaTeX caption and under the Markdown title."
    model: {paper: var-d16, tiny: tiny-var}         # the rows' model, per world
    bench: {paper: imagenet256, tiny: shapes-c2i}   # the bench, per world
    n: {paper: 50000}                                # optional: images per run, per world
    row_header: Method                               # optional: header of the label column

    settings:                     # optional: setting id -> method chain. "{method}" is the row's
      tf40: ["{method}:sparsity=0.4"]                # method, its parameters merged with the
      ft40: ["{method}:sparsity=0.4", "ft:epochs=1"] # setting's ("evar:calib=first" +
                                                     # "{method}:sparsity=0.4" ->
                                                     # "evar:calib=first,sparsity=0.4")
    groups:                       # column groups; each is one setting, i.e. one run per row
      - label: "40% sparse (training-free)"          # optional: spanning header (LaTeX)
        short: "40% TF"                              # optional: prefix of Markdown headers
        setting: tf40                                # optional: default is ["{method}"]
        columns:
          - id: tf40_fid          # unique; the key of the paper numbers
            metric: fid           # looked up in record.metrics, then record.cost
            format: "{:.2f}"      # str.format of ours, its stderr and the paper number
            header: FID           # optional: default from the metric name
            scale: 1.0e-6         # optional: multiply ours (e.g. params -> millions)
            better: lower         # optional: lower | higher | none; default from the metric

    info_columns:                 # optional: static text per row (from the row's `info`)
      - {id: note, header: Note, position: after}    # position: before (default) | after

    rows:                         # one of method / methods / paper_only per row
      - {label: Dense, methods: [], note: "A footnote for this row."}   # fixed chain, all groups
      - {label: SlimGPT, method: slimgpt}            # substituted into each group's setting
      - {label: VAR-d20, model: {paper: var-d20}, methods: []}  # own model; none in tiny -> no run
      - {label: LlamaGen-L, paper_only: true, info: {type: AR}}  # never run: not a varbench model

    paper:                        # the paper's numbers: row label -> column id -> number
      SlimGPT: {tf40_fid: 138.91}                    # (or a string shown verbatim, or null)
    footnotes:                    # general notes, printed under the table
      - "Paper: ImageNet 256x256, 50k samples."

Runs and records
----------------
``TableSpec.runs(world, n, seed, sampling)`` lists the runs a table needs: one per (row, setting),
deduplicated, skipping paper-only rows and rows without a model in that world. ``render`` looks
each cell's record up by (model, bench, method chain); if several records match (other n, seed or
sampling) and ``render`` was not told which, it shows the one with the largest n, then the newest,
and says so in a footnote. Footnotes also carry each row's ``note``, the reason a row was not
computed (``row_notes``) and every record's ``notes`` (deviations of the method from the paper).
The ``.json`` output is ``build_table``'s dict: per row its status (run / paper-only / no-model),
footnote marks and, per column id, ``{ours, stderr, paper, text, tex, run_id, methods}``.

API: ``load_spec(name) -> TableSpec``; ``TableSpec.runs(world, n=None, seed=0, sampling=None)``;
``render(spec, world, records, row_notes=None, out_dir=None, ...) -> {"md", "tex", "json"}``;
``render_all(world, root="results", out_dir=None, names=None)``.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import jinja2
import yaml

from bench.records import (
    REPO_ROOT,
    RunSpec,
    atomic_write_text,
    canonical_methods,
    format_method,
    git_commit,
    load_records,
    parse_method,
)
from bench.registry import METRICS, TABLES

TEMPLATES_DIR = REPO_ROOT / "tables" / "templates"
OUT_DIR = REPO_ROOT / "tables" / "out"
FORMATS = ("md", "tex", "json")
PAPER_ONLY_NOTE = "paper number only: not a varbench model"

# metric name -> (header, better). A metric registered in bench.registry.METRICS with a
# `higher_is_better` attribute overrides the direction given here.
METRIC_INFO: Dict[str, Tuple[str, Optional[str]]] = {
    "fid": ("FID", "lower"), "sfid": ("sFID", "lower"), "kid": ("KID", "lower"),
    "is": ("IS", "higher"), "precision": ("Precision", "higher"), "recall": ("Recall", "higher"),
    "clip_score": ("CLIP score", "higher"), "geneval": ("GenEval", "higher"),
    "latency_ms": ("Latency (ms)", "lower"), "params": ("Params", None), "flops": ("FLOPs", None),
}
ARROWS = {"lower": "↓", "higher": "↑", None: ""}


class TableSpecError(ValueError):
    """A table spec that does not follow the format in this module's docstring."""


# --------------------------------------------------------------------------------------------------
# the spec


@dataclasses.dataclass(frozen=True)
class Column:
    id: str
    metric: str
    header: str
    format: Optional[str]
    scale: float
    better: Optional[str]  # "lower" | "higher" | None
    group: int             # index into TableSpec.groups

    @property
    def arrow(self) -> str:
        return ARROWS[self.better]


@dataclasses.dataclass(frozen=True)
class Group:
    label: str
    short: str
    setting: Optional[str]
    chain: Tuple[str, ...]  # the setting's method chain (templates with "{method}")
    columns: Tuple[Column, ...]


@dataclasses.dataclass(frozen=True)
class InfoColumn:
    id: str
    header: str
    position: str  # "before" | "after"


@dataclasses.dataclass(frozen=True)
class Row:
    label: str
    method: Optional[str] = None               # substituted into each group's setting
    methods: Optional[Tuple[str, ...]] = None  # or: a fixed chain for every group
    paper_only: bool = False
    model: Optional[Dict[str, str]] = None     # per-world model overriding the table's
    note: Optional[str] = None
    info: Dict[str, Any] = dataclasses.field(default_factory=dict)


def _keys(d: Any, allowed: Iterable[str], required: Iterable[str], where: str) -> dict:
    if not isinstance(d, dict):
        raise TableSpecError(f"{where}: expected a mapping, got {type(d).__name__}")
    unknown = set(d) - set(allowed)
    missing = [k for k in required if k not in d]
    if unknown or missing:
        raise TableSpecError(f"{where}: " + "; ".join(
            ([f"unknown keys {sorted(unknown)} (allowed: {', '.join(allowed)})"] if unknown else [])
            + ([f"missing keys {missing}"] if missing else [])))
    return d


def metric_direction(metric: str) -> Optional[str]:
    """``"lower"``, ``"higher"`` or None (no arrow) for a metric name."""
    if metric in METRICS:
        hib = getattr(METRICS.get(metric), "higher_is_better", None)
        if hib is not None:
            return "higher" if hib else "lower"
    return METRIC_INFO.get(metric, (None, None))[1]


def expand_chain(template: Sequence[str], method: Optional[str]) -> Tuple[str, ...]:
    """Substitute ``method`` into a setting's chain; see the module docstring."""
    out = []
    for item in template:
        if "{method}" not in item:
            out.append(item)
            continue
        rest = item[len("{method}"):]
        if not item.startswith("{method}") or (rest and not rest.startswith(":")) or "{method}" in rest:
            raise TableSpecError(f"bad setting item {item!r}: write '{{method}}' or '{{method}}:key=value,...'")
        if method is None:
            raise TableSpecError(f"setting item {item!r} needs a row `method`")
        name, params = parse_method(method)
        extra = parse_method("m" + rest)[1]
        clash = sorted(set(params) & set(extra))
        if clash:
            raise TableSpecError(f"row method {method!r} and setting {item!r} both set {clash}")
        out.append(format_method(name, {**params, **extra}))
    return canonical_methods(out)


@dataclasses.dataclass(frozen=True)
class TableSpec:
    """A parsed table spec (see the module docstring for the YAML format)."""

    name: str
    title: str
    caption: str
    model: Dict[str, str]
    bench: Dict[str, str]
    n: Dict[str, int]
    row_header: str
    groups: Tuple[Group, ...]
    info_columns: Tuple[InfoColumn, ...]
    rows: Tuple[Row, ...]
    paper: Dict[str, Dict[str, Any]]
    footnotes: Tuple[str, ...]
    path: Optional[Path] = None

    @property
    def columns(self) -> Tuple[Column, ...]:
        return tuple(c for g in self.groups for c in g.columns)

    def row(self, label: str) -> Row:
        for r in self.rows:
            if r.label == label:
                return r
        raise KeyError(f"table {self.name} has no row {label!r}; rows: {[r.label for r in self.rows]}")

    def bench_for(self, world: str) -> str:
        if world not in self.bench:
            raise TableSpecError(f"table {self.name} has no bench for world {world!r}")
        return self.bench[world]

    def model_for(self, row: Row, world: str) -> Optional[str]:
        """The model a row runs in ``world``, or None if it has none there (or is paper-only)."""
        if row.paper_only:
            return None
        models = row.model if row.model is not None else self.model
        return models.get(world)

    def chain(self, row: Row, group: Group) -> Tuple[str, ...]:
        """The method chain of ``row`` in column group ``group``."""
        if row.methods is not None:
            return row.methods
        return expand_chain(group.chain, row.method)

    def skip_reason(self, row: Row, world: str) -> Optional[str]:
        """Why ``row`` has no runs in ``world`` (None if it has)."""
        if row.paper_only:
            return PAPER_ONLY_NOTE
        if self.model_for(row, world) is None:
            models = ", ".join(sorted(set((row.model or self.model).values())))
            return f"paper number only in the {world} world: {models} has no {world}-world counterpart"
        return None

    def resolve_n(self, world: str, n: Optional[int] = None) -> int:
        n = n if n is not None else self.n.get(world)
        if n is None:
            raise TableSpecError(f"table {self.name} sets no n for world {world!r}; pass n= (the bench default)")
        return n

    def runs(self, world: str, n: Optional[int] = None, seed: int = 0,
             sampling: Optional[Mapping[str, Any]] = None) -> List[RunSpec]:
        """The runs this table needs in ``world``: one per (row, setting), deduplicated, in order.

        ``n``: the argument, else the spec's ``n[world]``, else an error; ``sampling``: the
        argument, else ``{}`` (the model's defaults).
        """
        n = self.resolve_n(world, n)
        bench = self.bench_for(world)
        out: Dict[str, RunSpec] = {}
        for row in self.rows:
            model = self.model_for(row, world)
            if model is None:
                continue
            for group in self.groups:
                spec = RunSpec(world=world, model=model, methods=self.chain(row, group), bench=bench,
                               n=n, seed=seed, sampling=dict(sampling or {}))
                out.setdefault(spec.key(), spec)
        return list(out.values())


def _parse_column(c: Any, group: int, where: str) -> Column:
    c = _keys(c, ("id", "metric", "header", "format", "scale", "better"), ("id", "metric"), where)
    metric = str(c["metric"])
    better = c["better"] if "better" in c else metric_direction(metric)
    if better == "none":
        better = None
    if better not in ARROWS:
        raise TableSpecError(f"{where}: better must be lower, higher or none, got {better!r}")
    fmt = c.get("format")
    if fmt is not None:
        try:
            fmt.format(1.0)
        except (ValueError, IndexError, KeyError) as e:
            raise TableSpecError(f"{where}: bad format {fmt!r}: {e}") from None
    return Column(id=str(c["id"]), metric=metric, header=str(c.get("header", METRIC_INFO.get(metric, (metric,))[0])),
                  format=fmt, scale=float(c.get("scale", 1.0)), better=better, group=group)


def _parse_row(r: Any, where: str) -> Row:
    r = _keys(r, ("label", "method", "methods", "paper_only", "model", "note", "info"), ("label",), where)
    kinds = [k for k in ("method", "methods", "paper_only") if r.get(k) not in (None, False)]  # [] counts
    if len(kinds) != 1:
        raise TableSpecError(f"{where}: give exactly one of method, methods, paper_only (got {kinds or 'none'})")
    methods = r.get("methods")
    try:
        if methods is not None:
            methods = canonical_methods(methods if isinstance(methods, list) else [methods])
        method = r.get("method")
        if method is not None:
            parse_method(method)
    except ValueError as e:
        raise TableSpecError(f"{where}: {e}") from None
    model = r.get("model")
    if model is not None and not isinstance(model, dict):
        raise TableSpecError(f"{where}: model must be a mapping world -> model name")
    return Row(label=str(r["label"]), method=method, methods=methods, paper_only=bool(r.get("paper_only")),
               model=model, note=r.get("note"), info=dict(r.get("info") or {}))


def parse_spec(data: Any, name: str, path: Optional[Path] = None) -> TableSpec:
    """Build and check a ``TableSpec`` from the YAML's data."""
    where = f"table spec {name}" + (f" ({path})" if path else "")
    d = _keys(data, ("title", "caption", "model", "bench", "n", "row_header", "settings", "groups",
                     "info_columns", "rows", "paper", "footnotes"), ("title", "model", "bench", "groups", "rows"), where)
    settings = d.get("settings") or {}
    groups = []
    for i, g in enumerate(d["groups"]):
        gw = f"{where}: groups[{i}]"
        g = _keys(g, ("label", "short", "setting", "columns"), ("columns",), gw)
        setting = g.get("setting")
        if setting is not None and setting not in settings:
            raise TableSpecError(f"{gw}: unknown setting {setting!r}; settings: {sorted(settings)}")
        chain = tuple(settings[setting]) if setting is not None else ("{method}",)
        cols = tuple(_parse_column(c, i, f"{gw}.columns[{j}]") for j, c in enumerate(g["columns"]))
        groups.append(Group(label=str(g.get("label", "")), short=str(g.get("short", g.get("label", ""))),
                            setting=setting, chain=chain, columns=cols))
    infos = tuple(InfoColumn(id=str(c["id"]), header=str(c.get("header", c["id"])), position=c.get("position", "before"))
                  for c in (_keys(c, ("id", "header", "position"), ("id",), f"{where}: info_columns")
                            for c in d.get("info_columns") or []))
    if any(c.position not in ("before", "after") for c in infos):
        raise TableSpecError(f"{where}: info column position must be before or after")
    rows = tuple(_parse_row(r, f"{where}: rows[{i}]") for i, r in enumerate(d["rows"]))
    spec = TableSpec(name=name, title=str(d["title"]), caption=str(d.get("caption", "")).strip(),
                     model=dict(d["model"]), bench=dict(d["bench"]), n=dict(d.get("n") or {}),
                     row_header=str(d.get("row_header", "")), groups=tuple(groups), info_columns=infos,
                     rows=rows, paper={str(k): dict(v or {}) for k, v in (d.get("paper") or {}).items()},
                     footnotes=tuple(str(f) for f in d.get("footnotes") or ()), path=path)
    _check(spec, where)
    return spec


def _check(spec: TableSpec, where: str) -> None:
    ids = [c.id for c in spec.columns] + [c.id for c in spec.info_columns]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    labels = [r.label for r in spec.rows]
    dup_rows = sorted({r for r in labels if labels.count(r) > 1})
    if dup or dup_rows:
        raise TableSpecError(f"{where}: duplicate column ids {dup} / row labels {dup_rows}")
    col_ids = {c.id for c in spec.columns}
    for label, cells in spec.paper.items():
        if label not in labels:
            raise TableSpecError(f"{where}: paper numbers for unknown row {label!r}; rows: {labels}")
        if set(cells) - col_ids:
            raise TableSpecError(f"{where}: paper row {label!r} has unknown columns {sorted(set(cells) - col_ids)}")
    info_ids = {c.id for c in spec.info_columns}
    for row in spec.rows:
        if set(row.info) - info_ids:
            raise TableSpecError(f"{where}: row {row.label!r} has unknown info {sorted(set(row.info) - info_ids)}")
        if not row.paper_only:
            for group in spec.groups:
                spec.chain(row, group)  # raises on a bad template or a parameter clash


def load_spec(name: str | os.PathLike) -> TableSpec:
    """The table spec registered as ``name`` (``UnknownNameError`` with suggestions if none), or a path."""
    if isinstance(name, Path) or str(name).endswith((".yaml", ".yml")):
        path = Path(name)
        name = path.stem
    else:
        path = Path(TABLES.get(str(name)))
    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    return parse_spec(data, name, path)


# --------------------------------------------------------------------------------------------------
# cells


def _fmt(value: Any, fmt: Optional[str]) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return fmt.format(value) if fmt else f"{value:g}"


def _measure(record: Mapping[str, Any], metric: str) -> Optional[Tuple[float, Optional[float]]]:
    """(value, stderr) of ``metric`` in a record's metrics, else its cost, else None."""
    m = record.get("metrics", {}).get(metric)
    if m is None:
        m = record.get("cost", {}).get(metric)
    if isinstance(m, Mapping):
        value, stderr = m.get("value"), m.get("stderr")
    else:
        value, stderr = m, None
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value, stderr


class _Notes:
    """Numbered footnotes, deduplicated by text, numbered by first use."""

    def __init__(self):
        self.texts: List[str] = []

    def mark(self, text: str) -> int:
        if text not in self.texts:
            self.texts.append(text)
        return self.texts.index(text) + 1


def _index(records: Mapping[str, Mapping[str, Any]] | Iterable[Mapping[str, Any]], world: str) -> Dict[tuple, list]:
    values = records.values() if isinstance(records, Mapping) else records
    index: Dict[tuple, list] = {}
    for rec in values:
        s = rec["spec"]
        if s["world"] == world:
            index.setdefault((s["model"], s["bench"], tuple(s["methods"])), []).append(rec)
    return index


def _pick(candidates: list, n: Optional[int], seed: Optional[int], sampling: Optional[Mapping]) -> Tuple[Optional[dict], Optional[str]]:
    """The record to show among those of one chain, and a footnote if the choice was ambiguous."""
    c = [r for r in candidates
         if (n is None or r["spec"]["n"] == n) and (seed is None or r["spec"]["seed"] == seed)
         and (sampling is None or r["spec"]["sampling"] == dict(sampling))]
    if not c:
        return None, None
    c.sort(key=lambda r: (r["spec"]["n"], r.get("created", "")), reverse=True)
    if len(c) == 1:
        return c[0], None
    s = c[0]["spec"]
    return c[0], (f"{len(c)} records match {' + '.join(s['methods']) or 'dense'}; shown: the one with the "
                  f"largest n (n={s['n']}, seed {s['seed']}, {c[0].get('created', '?')})")


def _tex_escape(text: Any) -> str:
    table = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
             "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
             "–": "--", "—": "---", "↓": r"$\downarrow$", "↑": r"$\uparrow$", "±": r"$\pm$", "×": r"$\times$",
             "·": r"$\cdot$"}
    return "".join(table.get(ch, ch) for ch in str(text))


def _cell_texts(ours: str, err: str, paper: str) -> Tuple[str, str]:
    """(markdown, latex) text of one cell."""
    md_ours = f"{ours} ± {err}" if err else ours
    tex_ours = f"{ours}\\,$\\pm$\\,{err}" if err else ours  # ours and err are formatted numbers
    return f"{md_ours} / {paper}".strip(), f"{tex_ours} / {_tex_escape(paper)}".strip()


# --------------------------------------------------------------------------------------------------
# rendering


def build_table(spec: TableSpec, world: str, records: Mapping[str, Mapping[str, Any]],
                row_notes: Optional[Mapping[str, str]] = None, n: Optional[int] = None,
                seed: Optional[int] = None, sampling: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The table as data (the ``.json`` output); ``render`` turns it into text."""
    row_notes = dict(row_notes or {})
    labels = [r.label for r in spec.rows]
    unknown = sorted(set(row_notes) - set(labels))
    if unknown:
        raise KeyError(f"row_notes for unknown rows {unknown} of table {spec.name}; rows: {labels}")
    bench = spec.bench_for(world)
    index = _index(records, world)
    notes = _Notes()
    used: List[dict] = []
    rows_out = []
    for row in spec.rows:
        marks: List[int] = []
        reason = spec.skip_reason(row, world)
        for text in (row.note, reason, row_notes.get(row.label)):
            if text:
                marks.append(notes.mark(text))
        model = spec.model_for(row, world)
        cells = {}
        for group in spec.groups:
            chain = spec.chain(row, group) if model else None
            rec, ambiguity = _pick(index.get((model, bench, chain), []), n, seed, sampling) if model else (None, None)
            if ambiguity:
                marks.append(notes.mark(ambiguity))
            if rec is not None:
                if not any(rec is u for u in used):
                    used.append(rec)
                for text in rec.get("notes", []):
                    marks.append(notes.mark(text))
            for col in group.columns:
                got = _measure(rec, col.metric) if rec is not None else None
                ours = stderr = None
                if got is not None:
                    ours = got[0] * col.scale if col.scale != 1.0 else got[0]
                    stderr = got[1] * col.scale if (got[1] is not None and col.scale != 1.0) else got[1]
                paper = spec.paper.get(row.label, {}).get(col.id)
                paper_txt = _fmt(paper, col.format) if paper is not None else "–"
                md, tex = _cell_texts(_fmt(ours, col.format), _fmt(stderr, col.format), paper_txt)
                cells[col.id] = {"ours": ours, "stderr": stderr, "paper": paper, "text": md, "tex": tex,
                                 "run_id": rec["run_id"] if rec is not None and got is not None else None,
                                 "methods": list(chain) if chain is not None else None}
        rows_out.append({"label": row.label, "status": "run" if model else ("paper-only" if row.paper_only else "no-model"),
                         "model": model, "footnotes": sorted(set(marks)),
                         "info": {c.id: row.info.get(c.id) for c in spec.info_columns}, "cells": cells})
    commits = sorted({r.get("env", {}).get("git_commit", "unknown") for r in used})
    dirty = any(r.get("env", {}).get("git_dirty") for r in used)
    return {
        "table": spec.name, "title": spec.title, "caption": spec.caption, "world": world,
        "model": spec.model.get(world), "bench": bench,
        "n": sorted({r["spec"]["n"] for r in used}), "seed": sorted({r["spec"]["seed"] for r in used}),
        "records": len(used), "git_commits": commits, "git_dirty": dirty,
        "rendered_at_commit": git_commit(),
        "row_header": spec.row_header,
        "groups": [{"label": g.label, "short": g.short, "setting": g.setting, "chain": list(g.chain),
                    "columns": [c.id for c in g.columns]} for g in spec.groups],
        "columns": [{"id": c.id, "metric": c.metric, "header": c.header, "better": c.better,
                     "arrow": c.arrow, "group": c.group, "format": c.format} for c in spec.columns],
        "info_columns": [dataclasses.asdict(c) for c in spec.info_columns],
        "rows": rows_out,
        "general_footnotes": list(spec.footnotes),
        "footnotes": [{"mark": i + 1, "text": t} for i, t in enumerate(notes.texts)],
    }


def footer(table: Mapping[str, Any]) -> str:
    """One line: which world, model, bench, n, seed and git commit produced the table."""
    def join(xs):
        return ", ".join(str(x) for x in xs) or "–"
    if table["records"]:
        git = join(c[:12] for c in table["git_commits"]) + (" (uncommitted changes)" if table["git_dirty"] else "")
        k = table["records"]
        src = f"{k} record{'s' if k != 1 else ''} from git {git}"
    else:
        src = f"no records yet; rendered at git {table['rendered_at_commit'][:12]}"
    return (f"world {table['world']} · model {table['model']} · bench {table['bench']} · "
            f"n {join(table['n'])} · seed {join(table['seed'])} · {src}")


def _layout(table: Mapping[str, Any]) -> Dict[str, Any]:
    """Header and body cells in display order, shared by the Markdown and LaTeX templates."""
    infos = table["info_columns"]
    before = [c for c in infos if c["position"] == "before"]
    after = [c for c in infos if c["position"] == "after"]
    many_groups = sum(1 for g in table["groups"] if g["label"]) > 1
    cols = table["columns"]
    groups = table["groups"]

    def md_header(c):
        prefix = groups[c["group"]]["short"] + " " if many_groups and groups[c["group"]]["short"] else ""
        return f"{prefix}{c['header']} {c['arrow']}".strip()

    def tex_header(c):
        return _tex_escape(c["header"]) + (" " + _tex_escape(c["arrow"]) if c["arrow"] else "")

    header_md = [table["row_header"]] + [c["header"] for c in before] + [md_header(c) for c in cols] + [c["header"] for c in after]
    header_tex = [_tex_escape(h) for h in [table["row_header"]] + [c["header"] for c in before]] + \
                 [tex_header(c) for c in cols] + [_tex_escape(c["header"]) for c in after]
    align = ["l"] * (1 + len(before)) + ["r"] * len(cols) + ["l"] * len(after)
    body_md, body_tex = [], []
    for row in table["rows"]:
        marks = row["footnotes"]
        label_md = row["label"] + (f" [{','.join(map(str, marks))}]" if marks else "")
        label_tex = _tex_escape(row["label"]) + (f"\\textsuperscript{{{','.join(map(str, marks))}}}" if marks else "")
        info_b = ["" if row["info"].get(c["id"]) is None else str(row["info"][c["id"]]) for c in before]
        info_a = ["" if row["info"].get(c["id"]) is None else str(row["info"][c["id"]]) for c in after]
        body_md.append([label_md] + info_b + [row["cells"][c["id"]]["text"] for c in cols] + info_a)
        body_tex.append([label_tex] + [_tex_escape(x) for x in info_b] + [row["cells"][c["id"]]["tex"] for c in cols]
                        + [_tex_escape(x) for x in info_a])
    # LaTeX: a spanning header per labelled group, with a \cmidrule under it
    span_cells, rules, first = [""] * (1 + len(before)), [], 2 + len(before)
    for g in groups:
        k = len(g["columns"])
        if g["label"]:
            span_cells.append(f"\\multicolumn{{{k}}}{{c}}{{{_tex_escape(g['label'])}}}")
            rules.append(f"\\cmidrule(lr){{{first}-{first + k - 1}}}")
        else:
            span_cells.extend([""] * k)
        first += k
    span_cells.extend([""] * len(after))
    header_md = [h.replace("|", "\\|") for h in header_md]
    body_md = [[c.replace("|", "\\|") for c in r] for r in body_md]
    widths = [max(3, *(len(r[i]) for r in [header_md] + body_md)) for i in range(len(header_md))]
    return {"header_md": header_md, "header_tex": header_tex, "align": align, "widths": widths,
            "body_md": body_md, "body_tex": body_tex,
            "span_row": " & ".join(span_cells) if rules else "", "cmidrules": " ".join(rules),
            "colspec": "l" * (1 + len(before)) + "c" * len(cols) + "p{5cm}" * len(after)}


def _env() -> Tuple[jinja2.Environment, jinja2.Environment]:
    loader = jinja2.FileSystemLoader(str(TEMPLATES_DIR))
    md = jinja2.Environment(loader=loader, undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                            trim_blocks=True, lstrip_blocks=True, autoescape=False)
    # LaTeX is full of braces and percent signs, so its template uses other delimiters.
    tex = jinja2.Environment(loader=loader, undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True, autoescape=False,
                             block_start_string="<%", block_end_string="%>",
                             variable_start_string="<<", variable_end_string=">>",
                             comment_start_string="<#", comment_end_string="#>")
    tex.filters["tex"] = _tex_escape
    return md, tex


def render(spec: TableSpec | str, world: str, records: Mapping[str, Mapping[str, Any]],
           row_notes: Optional[Mapping[str, str]] = None, out_dir: Optional[str | os.PathLike] = None,
           n: Optional[int] = None, seed: Optional[int] = None, sampling: Optional[Mapping[str, Any]] = None,
           formats: Sequence[str] = FORMATS) -> Dict[str, Any]:
    """Render ``spec`` for ``world`` from ``records`` (run_id -> record).

    Writes ``<out_dir>/<world>/<name>.{md,tex,json}`` (``out_dir`` defaults to ``tables/out``; only
    the extensions in ``formats``) and returns ``{"md": str, "tex": str, "json": dict}``.
    ``row_notes`` maps a row label to the reason it could not be computed (a footnote).
    ``n``/``seed``/``sampling`` restrict which records count; by default any record of a cell's
    (model, bench, method chain) does.
    """
    if not isinstance(spec, TableSpec):
        spec = load_spec(spec)
    bad = sorted(set(formats) - set(FORMATS))
    if bad:
        raise ValueError(f"unknown formats {bad}; choose from {', '.join(FORMATS)}")
    table = build_table(spec, world, records, row_notes, n=n, seed=seed, sampling=sampling)
    ctx = {"t": table, "l": _layout(table), "footer": footer(table)}
    md_env, tex_env = _env()
    md = md_env.get_template("table.md.j2").render(**ctx)
    tex = tex_env.get_template("table.tex.j2").render(**ctx)
    out = Path(out_dir) if out_dir is not None else OUT_DIR
    texts = {"md": md, "tex": tex, "json": json.dumps(table, indent=2, ensure_ascii=False) + "\n"}
    for fmt in formats:
        atomic_write_text(out / world / f"{spec.name}.{fmt}", texts[fmt])
    return {"md": md, "tex": tex, "json": table}


def render_all(world: str = "tiny", root: str | os.PathLike = "results", out_dir: Optional[str | os.PathLike] = None,
               names: Optional[Iterable[str]] = None, formats: Sequence[str] = FORMATS) -> Dict[str, Dict[str, Any]]:
    """Render every registered table (or ``names``) for ``world`` from the records under ``root``."""
    records = load_records(root, world)
    return {name: render(load_spec(name), world, records, out_dir=out_dir, formats=formats)
            for name in (names if names is not None else TABLES.names())}
