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
    world_params:                 # optional: per world, parameters given to a method wherever it
      paper: {psad: {epochs: 40}} # appears in this table's chains, unless the chain sets them (e.g.
      tiny: {psad: {epochs: 3}}   # the paper's recovery schedule and a scaled tiny one; stated in a
                                  # footnote)
    reference_row: Dense          # optional: the row relative columns compare against
    groups:                       # column groups; each is one setting, i.e. one run per row
      - label: "40% sparse (training-free)"          # optional: spanning header (LaTeX)
        short: "40% TF"                              # optional: prefix of Markdown headers
        setting: tf40                                # optional: default is ["{method}"]
        columns:
          - id: tf40_fid          # unique; the key of the paper numbers
            metric: fid           # looked up in record.metrics, then record.cost; per world where the
                                  # worlds' benches differ: {paper: fid_people, tiny: fid_position}
            format: "{:.2f}"      # str.format of ours, its stderr and the paper number
            header: FID           # optional: default from the metric name (per world, like metric)
            scale: 1.0e-6         # optional: multiply ours (e.g. params -> millions)
            better: lower         # optional: lower | higher | none; default from the metric
            relative: speedup     # optional: speedup (ref/ours) | ratio (ours/ref) | delta (ours-ref)
      - label: "Speed"            # a group may use its own bench (e.g. latency beside quality):
        bench: {tiny: latency}    #   per world; n per world (default: that bench's own default,
        n: {tiny: 10}             #   not --n) and the bench's setting for its cells, per world
        bench_args: {tiny: {device: cpu, batch: 16}, paper: {device: cuda, batch: 1}}
        columns:
          - {id: speed, metric: latency_ms, relative: speedup}

    info_columns:                 # optional: static text per row (from the row's `info`)
      - {id: note, header: Note, position: after}    # position: before (default) | after

    rows:                         # one of method / methods / paper_only per row
      - {label: Dense, methods: [], note: "A footnote for this row."}   # fixed chain, all groups
      - {label: SlimGPT, method: slimgpt}            # substituted into each group's setting
      - {label: K2, method: {paper: "lazyvar:keep=0.4/0.2/0.1/0.02", tiny: "lazyvar:keep=0.4/0.2/0.1"}}
                                                     # a method per world (the tiny model's scale list)
      - {label: VAR-d20, model: {paper: var-d20}, methods: []}  # own model; none in tiny -> no run
      - {label: LlamaGen-L, paper_only: true, info: {type: AR}}  # never run: not a varbench model
      - {label: Dense, methods: [], rank: false}     # rank: false leaves the row out of Kendall's tau
      - {label: ALL, methods: [], bench_args: {device: coreml, compute_units: ALL}}  # the bench's setting
      - {label: HART + FastVAR, model: {paper: hart-0.7b}, method: fastvar, reference: HART}
                                                     # relative columns against HART, not the table's reference

    paper:                        # the paper's numbers: row label -> column id -> number
      SlimGPT: {tf40_fid: 138.91}                    # (or a string shown verbatim, or null)
    footnotes:                    # general notes, printed under the table
      - "Paper: ImageNet 256x256, 50k samples."

Runs and records
----------------
``bench.plan.table_cells(spec, world, n, seed, sampling)`` gives every (row, column group) its exact
run spec (resolved chain, versions, checkpoint identity, protocol), or the reason it has none
(paper-only row, no model in this world, method not implemented yet). A cell shows the record whose
key equals its spec's key, nothing else; a stale record of the same request (older method version
or defaults, other checkpoint) is not shown, and a footnote says why. Footnotes also carry each
row's ``note``, ``row_notes`` and every record's ``notes`` (deviations of the method from the paper).

Relative columns (``relative: speedup | ratio | delta``) are computed from the same metric in the
``reference_row`` (default: the first row with ``methods: []``) of the same column group, or in the
row a row names as its ``reference`` (e.g. HART + FastVAR against HART where the table's reference is
Infinity); their error bars are not propagated. Latency records name their measurement run
(``metrics.latency_ms.group``): a ratio between cells of two runs is not taken (the cell stays empty
with a footnote), since only times measured side by side compare.

Agreement with the paper: under the rows, every column gets Kendall's tau-b between our values and
the paper's over the rows that have both (``scipy.stats.kendalltau``; rows with ``rank: false`` left
out), i.e. whether the tiny world orders the rows as the paper does. The ``.json`` output is ``build_table``'s dict: per row its status
(run / paper-only / no-model), footnote marks and, per column id, ``{ours, stderr, paper, text,
tex, run_id, source, methods}`` (+ ``timing_group`` for a latency cell).

API: ``load_spec(name) -> TableSpec``; ``render(spec, world, cells, found, stale=None, row_notes=None,
out_dir=None, formats=..., force=False) -> {"md", "tex", "json"}``; ``render_from_records(name,
world, root=None, ...)`` (reads the results tree; no torch).
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import jinja2
import yaml

from bench.io import atomic_write_text, git_commit
from bench.plan import staleness
from bench.registry import METHODS, METRICS, TABLES
from bench.resources import resource_dir, tables_out_dir
from bench.spec import SpecError, format_method, parse_chain, parse_method, resolve_params

FORMATS = ("md", "tex", "json")
PAPER_ONLY_NOTE = "paper number only: not a varbench model"
ARROWS = {"lower": "↓", "higher": "↑", None: ""}
# derived columns: value of the row vs the same metric in the reference row (``relative:`` in a column)
RELATIVE = {   # (header symbol, f(ours, ref), the operand that divides: a zero there leaves the cell undefined)
    "speedup": ("×", lambda ours, ref: ref / ours, "ours"),   # e.g. latency: dense / ours
    "ratio": ("×", lambda ours, ref: ours / ref, "ref"),      # e.g. params or FLOPs as a fraction of dense
    "delta": ("Δ", lambda ours, ref: ours - ref, None),       # e.g. FID − dense FID
}


class TableSpecError(ValueError):
    """A table spec that does not follow the format in this module's docstring."""


class EmptyRenderError(RuntimeError):
    """Rendering would replace a table that has measured cells by one that has none."""


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
    relative: Optional[str] = None   # speedup | ratio | delta: derived from the reference row
    per_world: Dict[str, Tuple[str, str]] = dataclasses.field(default_factory=dict)   # world -> (metric, header)

    def in_world(self, world: str) -> "Column":
        """This column as the world's table shows it (its metric and header there)."""
        if world not in self.per_world:
            return self
        metric, header = self.per_world[world]
        return dataclasses.replace(self, metric=metric, header=header, per_world={})

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
    bench: Dict[str, str] = dataclasses.field(default_factory=dict)        # own bench per world (else the table's)
    n: Dict[str, int] = dataclasses.field(default_factory=dict)            # its n per world (else the bench's default)
    bench_args: Dict[str, Dict[str, Any]] = dataclasses.field(default_factory=dict)   # per world: its bench's setting


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
    rank: bool = True                          # counted in the Kendall tau against the paper
    bench_args: Dict[str, Any] = dataclasses.field(default_factory=dict)   # the bench's setting for this row
    method_by_world: Dict[str, str] = dataclasses.field(default_factory=dict)  # method per world, where it differs
    reference: Optional[str] = None            # the row its relative columns compare against (default: the table's)


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


def metric_info(metric: str, where: str = "table spec"):
    """The catalog entry of ``metric`` (``bench.metrics.catalog``); unknown names get suggestions."""
    if metric not in METRICS:
        raise TableSpecError(f"{where}: {METRICS.unknown_message(metric)}")
    return METRICS.get(metric)


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
        try:
            name, params = parse_method(method)
            extra = parse_method("m" + rest)[1]
        except SpecError as e:
            raise TableSpecError(str(e)) from None
        clash = sorted(set(params) & set(extra))
        if clash:
            raise TableSpecError(f"row method {method!r} and setting {item!r} both set {clash}")
        out.append(format_method(name, {**params, **extra}))
    return tuple(m for m in (format_method(*parse_method(x)) for x in out) if m != "dense")


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
    reference_row: Optional[str] = None   # the row derived (relative) columns compare against
    world_params: Dict[str, Dict[str, Dict[str, Any]]] = dataclasses.field(default_factory=dict)

    @property
    def columns(self) -> Tuple[Column, ...]:
        return tuple(c for g in self.groups for c in g.columns)

    def in_world(self, world: str) -> "TableSpec":
        """The spec with every column's metric and header as ``world`` shows them."""
        groups = tuple(dataclasses.replace(g, columns=tuple(c.in_world(world) for c in g.columns)) for g in self.groups)
        return dataclasses.replace(self, groups=groups)

    def row(self, label: str) -> Row:
        for r in self.rows:
            if r.label == label:
                return r
        raise KeyError(f"table {self.name} has no row {label!r}; rows: {[r.label for r in self.rows]}")

    def bench_for(self, world: str, group: Optional["Group"] = None) -> str:
        """The bench of ``group``'s cells (its own, else the table's) in ``world``."""
        if group is not None and world in group.bench:
            return group.bench[world]
        if world not in self.bench:
            raise TableSpecError(f"table {self.name} has no bench for world {world!r}")
        return self.bench[world]

    def benches(self, world: str) -> List[str]:
        """Every bench the table's cells use in ``world``, in order of first use."""
        return list(dict.fromkeys([self.bench_for(world)] + [self.bench_for(world, g) for g in self.groups]))

    def model_for(self, row: Row, world: str) -> Optional[str]:
        """The model a row runs in ``world``, or None if it has none there (or is paper-only)."""
        if row.paper_only:
            return None
        models = row.model if row.model is not None else self.model
        return models.get(world)

    def chain(self, row: Row, group: Group, world: Optional[str] = None) -> Tuple[str, ...]:
        """The method chain of ``row`` in column group ``group`` (with ``world``'s ``world_params``)."""
        method = row.method_by_world.get(world or "", row.method)
        chain = row.methods if row.methods is not None else expand_chain(group.chain, method)
        extra = self.world_params.get(world or "", {})
        if not extra:
            return chain
        out = []
        for item in chain:
            name, params = parse_method(item)
            out.append(format_method(name, {**extra.get(name, {}), **params}))   # the chain's own values win
        return tuple(out)

    def schedule_note(self, world: str) -> Optional[str]:
        """A footnote stating the per-world method parameters of this table, this world's and the paper's."""
        if not self.world_params:
            return None

        def say(w):
            ps = self.world_params.get(w) or {}
            return "; ".join(f"{m}: " + ", ".join(f"{k}={v}" for k, v in sorted(p.items())) for m, p in sorted(ps.items())) or "defaults"
        text = f"Schedule in the {world} world: {say(world)}"
        if world != "paper":
            text += f" (paper world: {say('paper')})"
        return text + "."

    def skip_reason(self, row: Row, world: str) -> Optional[str]:
        """Why ``row`` has no runs in ``world`` (None if it has)."""
        if row.paper_only:
            return PAPER_ONLY_NOTE
        if self.model_for(row, world) is None:
            models = ", ".join(sorted(set((row.model or self.model).values())))
            return f"paper number only in the {world} world: {models} has no {world}-world counterpart"
        return None

def _default_header(metric: str, relative: Optional[str], where: str) -> str:
    """A column's header when the spec gives none: the metric's, with the relative form's mark."""
    h = metric_info(metric, where).header
    return h if relative not in RELATIVE else f"{h} {RELATIVE[relative][0]}"


def _parse_column(c: Any, group: int, where: str) -> Column:
    c = _keys(c, ("id", "metric", "header", "format", "scale", "better", "relative"), ("id", "metric"), where)
    per_world: Dict[str, Tuple[str, str]] = {}
    if isinstance(c["metric"], dict):    # per world: {paper: m, tiny: m'}; the first is the column's own
        metrics = _keys(c["metric"], ("paper", "tiny"), (), f"{where}: metric")
        if not metrics:
            raise TableSpecError(f"{where}: metric per world needs at least one of paper, tiny")
        headers = c.get("header") if isinstance(c.get("header"), dict) else {}
        rel = c.get("relative")
        for w, m in metrics.items():
            per_world[w] = (str(m), str(headers.get(w, _default_header(str(m), rel, where))))
        c = {k: v for k, v in c.items() if k != "header" or not isinstance(v, dict)}
        c["metric"] = per_world[next(iter(metrics))][0]
    elif isinstance(c.get("header"), dict):
        raise TableSpecError(f"{where}: a header per world needs a metric per world")
    metric = str(c["metric"])
    info = metric_info(metric, where)
    relative = c.get("relative")
    if relative is not None and relative not in RELATIVE:
        raise TableSpecError(f"{where}: relative must be one of {', '.join(RELATIVE)}, got {relative!r}")
    default_better = info.better
    if relative == "speedup" and default_better is not None:
        default_better = "higher" if default_better == "lower" else "lower"
    better = c["better"] if "better" in c else default_better
    if better == "none":
        better = None
    if better not in ARROWS:
        raise TableSpecError(f"{where}: better must be lower, higher or none, got {better!r}")
    fmt = c.get("format", info.format if relative is None else "{:.2f}")
    if fmt is not None:
        try:
            fmt.format(1.0)
        except (ValueError, IndexError, KeyError) as e:
            raise TableSpecError(f"{where}: bad format {fmt!r}: {e}") from None
    header = c.get("header", _default_header(metric, relative, where))
    col = Column(id=str(c["id"]), metric=metric, header=str(header), format=fmt, scale=float(c.get("scale", 1.0)),
                 better=better, group=group, relative=relative, per_world=per_world)
    if per_world:
        if any(metric_info(m, where).better != info.better for m, _ in per_world.values()):
            raise TableSpecError(f"{where}: the metrics per world must have the same direction (better)")
        col = dataclasses.replace(col, header=per_world[next(iter(per_world))][1])
    return col


def _parse_row(r: Any, where: str) -> Row:
    r = _keys(r, ("label", "method", "methods", "paper_only", "model", "note", "info", "rank", "bench_args",
                  "reference"), ("label",), where)
    kinds = [k for k in ("method", "methods", "paper_only") if r.get(k) not in (None, False)]  # [] counts
    if len(kinds) != 1:
        raise TableSpecError(f"{where}: give exactly one of method, methods, paper_only (got {kinds or 'none'})")
    methods = r.get("methods")
    try:
        if methods is not None:   # [] (or "dense") is the unmodified model
            items = methods if isinstance(methods, list) else [methods]
            methods = tuple(m for m in (format_method(*parse_method(x)) for x in (parse_chain(items) if items else []))
                            if m != "dense")
        method, by_world = r.get("method"), {}
        if isinstance(method, dict):   # per world: {paper: "lazyvar:keep=…", tiny: "lazyvar:keep=…"}
            by_world = {str(w): str(m) for w, m in _keys(method, ("paper", "tiny"), (), f"{where}: method").items()}
            if not by_world:
                raise TableSpecError(f"{where}: method per world needs at least one of paper, tiny")
            method = next(iter(by_world.values()))
        for m in ([method] if method is not None else []) + list(by_world.values()):
            parse_method(m)
    except ValueError as e:
        raise TableSpecError(f"{where}: {e}") from None
    model = r.get("model")
    if model is not None and not isinstance(model, dict):
        raise TableSpecError(f"{where}: model must be a mapping world -> model name")
    bench_args = r.get("bench_args") or {}
    if not isinstance(bench_args, dict):
        raise TableSpecError(f"{where}: bench_args must be a mapping (the bench's setting, e.g. the latency "
                             f"bench's device and compute_units)")
    return Row(label=str(r["label"]), method=method, methods=methods, paper_only=bool(r.get("paper_only")),
               model=model, note=r.get("note"), info=dict(r.get("info") or {}), rank=bool(r.get("rank", True)),
               bench_args=dict(bench_args), method_by_world=by_world,
               reference=None if r.get("reference") is None else str(r["reference"]))


def parse_spec(data: Any, name: str, path: Optional[Path] = None) -> TableSpec:
    """Build and check a ``TableSpec`` from the YAML's data."""
    where = f"table spec {name}" + (f" ({path})" if path else "")
    d = _keys(data, ("title", "caption", "model", "bench", "n", "row_header", "settings", "groups",
                     "info_columns", "rows", "paper", "footnotes", "reference_row", "world_params"),
              ("title", "model", "bench", "groups", "rows"), where)
    settings = d.get("settings") or {}
    groups = []
    for i, g in enumerate(d["groups"]):
        gw = f"{where}: groups[{i}]"
        g = _keys(g, ("label", "short", "setting", "columns", "bench", "n", "bench_args"), ("columns",), gw)
        for key in ("bench", "n", "bench_args"):
            value = g.get(key) or {}
            if not isinstance(value, dict) or set(value) - {"paper", "tiny"}:
                raise TableSpecError(f"{gw}: {key} must be a mapping world (paper, tiny) -> "
                                     f"{'the bench setting' if key == 'bench_args' else 'value'}")
            if key == "bench_args" and not all(isinstance(v, dict) for v in value.values()):
                raise TableSpecError(f"{gw}: bench_args.<world> must be a mapping (e.g. device: cuda, batch: 1)")
        setting = g.get("setting")
        if setting is not None and setting not in settings:
            raise TableSpecError(f"{gw}: unknown setting {setting!r}; settings: {sorted(settings)}")
        chain = tuple(settings[setting]) if setting is not None else ("{method}",)
        cols = tuple(_parse_column(c, i, f"{gw}.columns[{j}]") for j, c in enumerate(g["columns"]))
        groups.append(Group(label=str(g.get("label", "")), short=str(g.get("short", g.get("label", ""))),
                            setting=setting, chain=chain, columns=cols, bench=dict(g.get("bench") or {}),
                            n={str(k): int(v) for k, v in (g.get("n") or {}).items()},
                            bench_args={w: dict(v) for w, v in (g.get("bench_args") or {}).items()}))
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
                     footnotes=tuple(str(f) for f in d.get("footnotes") or ()), path=path,
                     reference_row=_reference_row(d.get("reference_row"), rows, where),
                     world_params=_world_params(d.get("world_params"), where))
    _check(spec, where)
    return spec


def _world_params(d: Any, where: str) -> Dict[str, Dict[str, Dict[str, Any]]]:
    if d is None:
        return {}
    out = {}
    for world, methods in _keys(d, ("paper", "tiny"), (), f"{where}: world_params").items():
        out[world] = {}
        for name, params in (methods or {}).items():
            if not isinstance(params, dict):
                raise TableSpecError(f"{where}: world_params.{world}.{name} must be a mapping parameter -> value")
            try:   # a method not implemented yet is checked once it is (its cells say why they are empty)
                if str(name) in METHODS:
                    resolve_params(str(name), params)
            except (SpecError, ValueError, KeyError) as e:
                raise TableSpecError(f"{where}: world_params.{world}.{name}: {e}") from None
            out[world][str(name)] = dict(params)
    return out


def _reference_row(label: Optional[str], rows: Tuple[Row, ...], where: str) -> Optional[str]:
    """The row that relative columns compare against: ``reference_row``, else the first dense row.
    A row's own ``reference`` must name a row too."""
    for r in rows:
        if r.reference is not None and r.reference not in [x.label for x in rows]:
            raise TableSpecError(f"{where}: row {r.label!r}: reference {r.reference!r} is not a row label")
    if label is not None:
        if label not in [r.label for r in rows]:
            raise TableSpecError(f"{where}: reference_row {label!r} is not a row label")
        return str(label)
    return next((r.label for r in rows if r.methods == ()), None)


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
    if any(c.relative for c in spec.columns) and spec.reference_row is None:
        raise TableSpecError(f"{where}: relative columns need a reference_row (or a dense row, methods: [])")
    info_ids = {c.id for c in spec.info_columns}
    for row in spec.rows:
        if set(row.info) - info_ids:
            raise TableSpecError(f"{where}: row {row.label!r} has unknown info {sorted(set(row.info) - info_ids)}")
        if not row.paper_only:
            for group in spec.groups:
                for world in (None, *spec.world_params):
                    spec.chain(row, group, world)  # raises on a bad template or a parameter clash


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
    """A cell's text; a value that rounds to zero prints without a sign ("0.00", not "−0.00")."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    text = fmt.format(value) if fmt else f"{value:g}"
    if text.startswith("-") and not any(c in "123456789" for c in text.split("e")[0]):
        text = text[1:]
    return text


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


def build_table(spec: TableSpec, world: str, cells: Sequence[Any], found: Mapping[str, Mapping[str, Any]],
                stale: Optional[Mapping[str, Sequence[Mapping[str, Any]]]] = None,
                row_notes: Optional[Mapping[str, str]] = None,
                accounting: Optional[Mapping[str, Mapping[str, Any]]] = None) -> Dict[str, Any]:
    """The table as data (the ``.json`` output); ``render`` turns it into text.

    ``cells``: the ``bench.plan.Cell`` of every (row, group) — its exact run spec or the reason it has
    none; ``found``: spec key -> record; ``stale``: spec key -> stale records of the same request
    (each gets a footnote saying why it was not used); ``row_notes``: extra footnotes per row label;
    ``accounting``: weight-free accounting records by key (``bench.records.load_accounting``), used for
    the params/FLOPs columns of cells that have no run record (footnoted).
    """
    from bench.records import WEIGHT_FREE_METRICS, accounting_key
    spec = spec.in_world(world)
    accounting = accounting or {}
    row_notes = dict(row_notes or {})
    stale = stale or {}
    labels = [r.label for r in spec.rows]
    unknown = sorted(set(row_notes) - set(labels))
    if unknown:
        raise KeyError(f"row_notes for unknown rows {unknown} of table {spec.name}; rows: {labels}")
    by_cell = {(c.row, c.group): c for c in cells}
    bench = " + ".join(spec.benches(world))
    notes = _Notes()
    used: List[dict] = []
    rows_out = []
    for row in spec.rows:
        marks: List[int] = []
        for text in (row.note, row_notes.get(row.label)):
            if text:
                marks.append(notes.mark(text))
        model = spec.model_for(row, world)
        cells_out = {}
        for gi, group in enumerate(spec.groups):
            cell = by_cell.get((row.label, gi))
            rec = None
            if cell is not None and cell.reason:
                marks.append(notes.mark(cell.reason))
            if cell is not None and cell.spec is not None:
                rec = found.get(cell.spec.key())
                for old in stale.get(cell.spec.key(), ()) if rec is None else ():
                    why = staleness(old).reason or "its key differs"
                    marks.append(notes.mark(f"not shown: a stale record of {cell.spec.label()} ({why}); "
                                            f"rerun with `varbench table {spec.name}`"))
            if rec is not None:
                if not any(rec is u for u in used):
                    used.append(rec)
                for text in rec.get("notes", []):
                    marks.append(notes.mark(text))
            acc = None
            if rec is None and cell is not None and cell.spec is not None:
                acc = accounting.get(accounting_key(cell.spec))
            for col in group.columns:
                got = _measure(rec, col.metric) if rec is not None else None
                if got is None and acc is not None and col.metric in WEIGHT_FREE_METRICS:
                    got = _measure(acc, col.metric)
                    if got is not None and col.metric == "package_ops":
                        marks.append(notes.mark(f"{col.header}: counted in a Core ML package exported from seeded "
                                                f"random weights of the same sizes (no run record; "
                                                f"`varbench table --weight-free`)"))
                    elif got is not None:
                        marks.append(notes.mark(f"{col.header}: weight-free accounting on the meta device "
                                                f"(no run record yet; `varbench table --weight-free`)"))
                ours = stderr = None
                if got is not None:
                    ours = got[0] * col.scale if col.scale != 1.0 else got[0]
                    stderr = got[1] * col.scale if (got[1] is not None and col.scale != 1.0) else got[1]
                paper = spec.paper.get(row.label, {}).get(col.id)
                timed = rec["metrics"].get(col.metric) if rec is not None and got is not None else None
                cells_out[col.id] = {"ours": ours, "stderr": stderr, "paper": paper,
                                     "run_id": rec["run_id"] if rec is not None and got is not None else None,
                                     "source": "run" if rec is not None and got is not None else (
                                         "accounting" if got is not None else None),
                                     "methods": list(cell.spec.methods) if cell is not None and cell.spec else None}
                if isinstance(timed, dict) and timed.get("group"):   # latency: its measurement run (ratios within one)
                    cells_out[col.id]["timing_group"] = timed["group"]
        rows_out.append({"label": row.label, "status": "run" if model else ("paper-only" if row.paper_only else "no-model"),
                         "model": model, "footnotes": marks, "info": {c.id: row.info.get(c.id) for c in spec.info_columns},
                         "cells": cells_out})
    _derive(spec, rows_out, notes)
    kendall = _kendall(spec, rows_out)
    for row in rows_out:
        row["footnotes"] = sorted(set(row["footnotes"]))
        for col in spec.columns:
            c = row["cells"][col.id]
            paper_txt = _fmt(c["paper"], col.format) if c["paper"] is not None else "–"
            c["text"], c["tex"] = _cell_texts(_fmt(c["ours"], col.format), _fmt(c["stderr"], col.format), paper_txt)
    commits = sorted({r.get("env", {}).get("git_commit") or "unknown" for r in used})
    dirty = any(r.get("env", {}).get("git_dirty") for r in used)
    return {
        "table": spec.name, "title": spec.title, "caption": spec.caption, "world": world,
        "model": spec.model.get(world), "bench": bench,
        "n": sorted({r["spec"]["n"] for r in used}), "seed": sorted({r["spec"]["seed"] for r in used}),
        "records": len(used), "measured_cells": sum(1 for r in rows_out for c in r["cells"].values()
                              if c["ours"] is not None and c["source"] == "run"),
        "git_commits": commits, "git_dirty": dirty,
        "rendered_at_commit": git_commit(),
        "row_header": spec.row_header,
        "reference_row": spec.reference_row,
        "groups": [{"label": g.label, "short": g.short, "setting": g.setting, "chain": list(g.chain),
                    "columns": [c.id for c in g.columns]} for g in spec.groups],
        "columns": [{"id": c.id, "metric": c.metric, "header": c.header, "better": c.better, "relative": c.relative,
                     "arrow": c.arrow, "group": c.group, "format": c.format} for c in spec.columns],
        "info_columns": [dataclasses.asdict(c) for c in spec.info_columns],
        "rows": rows_out,
        "kendall": kendall,
        "general_footnotes": list(spec.footnotes) + [t for t in (spec.schedule_note(world),) if t],
        "footnotes": [{"mark": i + 1, "text": t} for i, t in enumerate(notes.texts)],
    }


def _derive(spec: TableSpec, rows_out: List[dict], notes: "_Notes") -> None:
    """Relative columns: ours = f(row's value, reference row's value) of the same metric and group.
    Error bars are not propagated (stderr null)."""
    rel = [c for c in spec.columns if c.relative]
    if not rel:
        return
    ref_of = {r.label: r.reference or spec.reference_row for r in spec.rows}
    for col in rel:
        # every reference value is read before any reference row's own cell is derived
        refs = {r["label"]: r["cells"][col.id] for r in rows_out if r["label"] in set(ref_of.values())}
        ref_values = {label: c["ours"] for label, c in refs.items()}
        for row in rows_out:
            c = row["cells"][col.id]
            ref_label = ref_of[row["label"]]
            ref_value = ref_values.get(ref_label)
            if c["ours"] is None:
                continue
            if ref_value is None:
                row["footnotes"].append(notes.mark(f"{col.header}: no reference value ({ref_label} not measured)"))
                c["ours"] = None
                continue
            if c.get("timing_group") != refs[ref_label].get("timing_group"):   # ratios of medians within one run
                row["footnotes"].append(notes.mark(
                    f"{col.header}: not timed in the same run as {ref_label} (a ratio of medians is taken within one "
                    f"measurement run); `varbench table {spec.name}` times them together"))
                c["ours"] = None
                continue
            _, derive, divisor = RELATIVE[col.relative]
            if divisor is not None and (c["ours"] if divisor == "ours" else ref_value) == 0:
                # e.g. a speed-up over a zero time: undefined, not infinite
                whose = "this row's" if divisor == "ours" else f"{ref_label}'s"
                row["footnotes"].append(notes.mark(f"{col.header}: undefined ({whose} value is 0)"))
                c["ours"] = None
                continue
            c["ours"] = derive(c["ours"], ref_value)
            c["stderr"] = None


def _kendall(spec: TableSpec, rows_out: List[dict]) -> Dict[str, Dict[str, Any]]:
    """Per column: Kendall's tau-b between ours and the paper's numbers over the ranked rows with both."""
    ranked = {r.label for r in spec.rows if r.rank}
    out = {}
    for col in spec.columns:
        pairs = [(r["cells"][col.id]["ours"], r["cells"][col.id]["paper"]) for r in rows_out if r["label"] in ranked]
        pairs = [(o, p) for o, p in pairs if isinstance(o, (int, float)) and isinstance(p, (int, float))
                 and not isinstance(p, bool)]
        tau = None
        if len(pairs) >= 2:
            from scipy.stats import kendalltau  # lazy: rendering stays cheap when no table is ranked
            t = kendalltau([o for o, _ in pairs], [p for _, p in pairs]).statistic
            tau = None if t != t else float(t)   # NaN (constant column) -> undefined
        out[col.id] = {"tau": tau, "n": len(pairs)}
    return out


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
    kendall = table.get("kendall") or {}
    if any(k.get("tau") is not None for k in kendall.values()):
        taus = [kendall.get(c["id"], {}) for c in cols]
        txt = ["" if k.get("tau") is None else f"{k['tau']:.2f} (n={k['n']})" for k in taus]
        body_md.append(["Kendall τ vs paper"] + [""] * len(before) + txt + [""] * len(after))
        body_tex.append([r"Kendall $\tau$ vs paper"] + [""] * len(before) + txt + [""] * len(after))
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
    loader = jinja2.FileSystemLoader(str(resource_dir("tables/templates")))
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


def check_formats(formats: Sequence[str]) -> Tuple[str, ...]:
    formats = tuple(f.strip() for f in formats if f.strip())
    bad = sorted(set(formats) - set(FORMATS))
    if bad or not formats:
        raise ValueError(f"unknown format(s) {bad or formats}; choose from {', '.join(FORMATS)} (comma-separated)")
    return formats


def _had_cells(path: Path) -> bool:
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    # measured = from a run record; weight-free accounting cells are remade from their records by any render
    # (a table rendered before cells named their source counts as measured)
    return any(isinstance(c, dict) and c.get("ours") is not None and c.get("source", "run") == "run"
               for r in old.get("rows", []) if isinstance(r, dict) for c in (r.get("cells") or {}).values())


def render(spec: TableSpec | str, world: str, cells: Sequence[Any], found: Mapping[str, Mapping[str, Any]],
           stale: Optional[Mapping[str, Sequence[Mapping[str, Any]]]] = None,
           row_notes: Optional[Mapping[str, str]] = None, out_dir: Optional[str | os.PathLike] = None,
           formats: Sequence[str] = FORMATS, force: bool = False,
           accounting: Optional[Mapping[str, Mapping[str, Any]]] = None) -> Dict[str, Any]:
    """Render ``spec`` for ``world`` (arguments as ``build_table``).

    Writes ``<out_dir>/<world>/<name>.{md,tex,json}`` (``out_dir``: ``$VARBENCH_TABLES_OUT``, else
    ``./tables/out``; only the extensions in ``formats``) and returns ``{"md", "tex", "json"}``.
    A render without a single measured cell does not replace a table that has some, unless
    ``force`` (``EmptyRenderError`` names the records that were looked for).
    """
    if not isinstance(spec, TableSpec):
        spec = load_spec(spec)
    formats = check_formats(formats)
    table = build_table(spec, world, cells, found, stale, row_notes, accounting)
    out = tables_out_dir(out_dir) / world
    if not force and table["measured_cells"] == 0 and _had_cells(out / f"{spec.name}.json"):
        wanted = sorted({str(c.spec.label()) for c in cells if c.spec is not None})
        raise EmptyRenderError(
            f"no record matches any cell of {spec.name}, and {out / (spec.name + '.json')} has measured cells: "
            f"not replacing it with an empty table (use --force to do so). Looked for:\n  " + "\n  ".join(wanted))
    ctx = {"t": table, "l": _layout(table), "footer": footer(table)}
    md_env, tex_env = _env()
    md = md_env.get_template("table.md.j2").render(**ctx)
    tex = tex_env.get_template("table.tex.j2").render(**ctx)
    texts = {"md": md, "tex": tex, "json": json.dumps(table, indent=2, ensure_ascii=False, allow_nan=False) + "\n"}
    for fmt in formats:
        atomic_write_text(out / f"{spec.name}.{fmt}", texts[fmt])
    return {"md": md, "tex": tex, "json": table}


def render_from_records(name: str, world: str = "tiny", root: Optional[str | os.PathLike] = None,
                        out_dir: Optional[str | os.PathLike] = None, n: Optional[int] = None, seed: int = 0,
                        sampling: Optional[Mapping[str, Any]] = None, formats: Sequence[str] = FORMATS,
                        force: bool = False, records: Optional[Mapping[str, Mapping[str, Any]]] = None) -> Dict[str, Any]:
    """Render a table from the records under ``root`` (no runs, no torch). Checkpoint files absent
    here are matched on every other field of the spec."""
    from bench.plan import match_records, table_cells
    from bench.records import load_accounting, load_records

    spec = load_spec(name)
    cells = table_cells(spec, world, n=n, seed=seed, sampling=sampling, need_ckpt=False)
    records = load_records(root, world) if records is None else records
    found, stale = match_records([c.spec for c in cells if c.spec is not None], records)
    return render(spec, world, cells, found, stale, out_dir=out_dir, formats=formats, force=force,
                  accounting=load_accounting(root, world))
