"""What the figures take from which record, on hand-made records where one wrong pick shows: the
figure's world, model, bench and metric only; the newest record of a point; the swept method's
parameter and the rest of the chain; the labels (defaults dropped) and axis names; where the title and
the note under a figure go (wrapped, clear of the axes)."""
import pytest

from bench.figures import _short, _ylabel, describe, figure, gate_onsets, short_labels, sweep_series
from bench.plan import make_spec
from bench.records import make_record, write_record

SWEEP = {"name": "s", "kind": "sweep", "model": {"tiny": "tiny-var", "paper": "var-d16"},
         "bench": {"tiny": "shapes-c2i", "paper": "imagenet256"}, "x": {"method_param": "sparsity"}, "y": "fid"}


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    import matplotlib.pyplot as plt
    plt.close("all")


def _rec(run_id, methods, fid=None, *, world="tiny", model="tiny-var", bench="shapes-c2i", n=12,
         created="2026-01-01T00:00:00+00:00", stderr=None, **metrics):
    if fid is not None:
        metrics["fid"] = {"value": fid, "stderr": stderr}
    return run_id, {"run_id": run_id, "created": created, "metrics": metrics, "cost": {},
                    "spec": {"world": world, "model": model, "bench": bench, "methods": list(methods), "n": n}}


def _records(*recs):
    return dict(recs)


def _xy(series):
    return {s["label"]: [(p["x"], p["y"]) for p in s["points"]] for s in series}


def test_a_sweep_takes_only_the_figures_world_model_bench_and_metric():
    recs = _records(_rec("a", ["magnitude:sparsity=0.2"], 3.0),
                    _rec("b", ["magnitude:sparsity=0.3"], 30.0, world="paper", model="var-d16", bench="imagenet256"),
                    _rec("b2", ["magnitude:sparsity=0.35"], 34.0, world="paper"),
                    _rec("c", ["magnitude:sparsity=0.3"], 31.0, model="tiny-var-b"),
                    _rec("d", ["magnitude:sparsity=0.3"], 32.0, bench="latency"),
                    _rec("e", ["magnitude:sparsity=0.3"], None, is_={"value": 9.0}),
                    _rec("f", [], 33.0, bench="latency"))
    series, dense, left_out = sweep_series(SWEEP, recs, "tiny")
    assert _xy(series) == {"magnitude": [(0.2, 3.0)]} and dense is None and left_out == []
    series, dense, _ = sweep_series(SWEEP, recs, "paper")
    assert _xy(series) == {"magnitude": [(0.3, 30.0)]}


@pytest.mark.parametrize("order", [1, -1])
def test_the_newest_record_of_a_point_and_of_the_dense_model_wins(order):
    recs = [_rec("old", ["evar:sparsity=0.2"], 9.0, created="2025-01-01T00:00:00+00:00"),
            _rec("new", ["evar:sparsity=0.2"], 2.0, created="2026-01-01T00:00:00+00:00"),
            _rec("d-old", [], 8.0, created="2025-01-01T00:00:00+00:00"),
            _rec("d-new", [], 1.0, created="2026-01-01T00:00:00+00:00")]
    series, dense, _ = sweep_series(SWEEP, _records(*recs[::order]), "tiny")
    assert _xy(series) == {"evar": [(0.2, 2.0)]} and (dense["y"], dense["run_id"]) == (1.0, "d-new")
    # records of one second: the larger run id, whatever the order they were read in
    same = [_rec("p2", ["evar:sparsity=0.2"], 3.0), _rec("p1", ["evar:sparsity=0.2"], 4.0), _rec("d2", [], 5.0),
            _rec("d1", [], 6.0)]
    series, dense, _ = sweep_series(SWEEP, _records(*same[::order]), "tiny")
    assert _xy(series) == {"evar": [(0.2, 3.0)]} and dense["run_id"] == "d2"


def test_methods_keep_only_the_chains_that_sweep_one_of_them():
    recs = _records(_rec("m", ["magnitude:sparsity=0.2"], 3.0), _rec("e", ["evar:sparsity=0.2"], 2.0))
    series, _, left_out = sweep_series({**SWEEP, "methods": ["evar"]}, recs, "tiny")
    assert _xy(series) == {"evar": [(0.2, 2.0)]} and left_out == []
    assert len(sweep_series(SWEEP, recs, "tiny")[0]) == 2


def test_the_swept_method_is_the_first_that_sets_the_parameter():
    """An epochs sweep of ft after magnitude pruning: magnitude has no epochs, ft is swept; the
    pruning stays in the series (its style), ft's other parameters in its colour."""
    spec = {**SWEEP, "x": {"method_param": "epochs"}}
    recs = _records(_rec("a", ["magnitude:sparsity=0.4", "ft:epochs=2,lr=0.001"], 2.5),
                    _rec("b", ["magnitude:sparsity=0.4", "ft:epochs=1,lr=0.001"], 3.5),
                    _rec("c", ["ft:epochs=3"], 1.5))
    series, _, _ = sweep_series(spec, recs, "tiny")
    by = {s["label"]: s for s in series}
    assert _xy(series) == {"magnitude + ft (lr=0.001)": [(1.0, 3.5), (2.0, 2.5)], "ft": [(3.0, 1.5)]}
    assert by["magnitude + ft (lr=0.001)"]["key"] == (("magnitude:sparsity=0.4",), "ft:lr=0.001", ())
    assert (by["magnitude + ft (lr=0.001)"]["colour_key"], by["magnitude + ft (lr=0.001)"]["style_key"]) == (
        "ft (lr=0.001)", "magnitude")


def test_a_value_that_is_not_one_number_is_left_out_with_the_whole_chain_named():
    spec = {**SWEEP, "x": {"method_param": "keep"}}
    recs = _records(_rec("a", ["evar:sparsity=0.2", "lazyvar:keep=0.2/0.1", "ft:epochs=2"], 5.0),
                    _rec("b", ["lazyvar:keep=0.5", "ft"], 4.0))
    series, _, left_out = sweep_series(spec, recs, "tiny")
    assert _xy(series) == {"lazyvar + ft": [(0.5, 4.0)]}
    assert left_out == ["evar (sparsity=0.2) + lazyvar (keep=0.2/0.1) + ft (epochs=2)"]


def test_labels_keep_only_the_parameters_that_differ_from_the_defaults():
    assert describe(["evar:calib=first,sparsity=0.2", "ft:epochs=1.0,lr=0.01"]) == (
        "evar (calib=first, sparsity=0.2) + ft (lr=0.01)")
    assert describe(["magnitude:norm=l2,sparsity=0.4"]) == "magnitude" and describe([]) == "dense"
    assert describe(["ghostvar:a=1"]) == "ghostvar (a=1)"           # not in the registry: every parameter shown
    assert _short("evar:calib=pyramid,sparsity=0.4 + ft:epochs=2,lr=0.1") == "evar 0.4 + ft"
    assert _short("magnitude:norm=l2,sparsity=0.25,scope=coupled") == "magnitude 0.25" and _short("dense") == "dense"


def test_variants_that_would_share_a_short_label_are_told_apart():
    """stepvar's score=random / hpf / both would all read 'stepvar': those get their differing parameters;
    a label that is already unique stays short."""
    from bench.spec import resolve_method
    both, rnd, hpf = (resolve_method(m) for m in ("stepvar", "stepvar:score=random", "stepvar:score=hpf"))
    ev = "evar:calib=pyramid,sparsity=0.4 + ft:epochs=2,lr=0.1"
    chains = [both, rnd, ev, hpf, "dense"]
    assert short_labels(chains) == {both: "stepvar", rnd: "stepvar (score=random)", hpf: "stepvar (score=hpf)",
                                    ev: "evar 0.4 + ft", "dense": "dense"}
    assert short_labels([both, ev]) == {both: "stepvar", ev: "evar 0.4 + ft"}
    assert short_labels([rnd, rnd]) == {rnd: "stepvar"}          # one chain twice is no collision
    m2, m4 = "magnitude:norm=l1,sparsity=0.4", "magnitude:norm=l2,sparsity=0.4"
    assert short_labels([m2, m4]) == {m2: "magnitude (norm=l1)", m4: "magnitude"}


@pytest.mark.parametrize("metric, label", [("fid", "FID (lower is better)"), ("is", "IS (higher is better)"),
                                           ("params", "Params"), ("fid_star", "FID* (lower is better)")])
def test_axis_labels_say_which_way_is_better(metric, label):
    assert _ylabel(metric) == label


def test_a_single_panel_carries_the_title_and_several_panels_share_one(tmp_path):
    import matplotlib
    matplotlib.use("pdf")                       # whatever the caller's backend, figures draw off-screen
    root = tmp_path / "results"
    for methods, fid in (([], 1.5), (["evar:sparsity=0.2"], 2.5), (["evar:sparsity=0.4", "psad:onset=0.8"], 3.5)):
        spec = make_spec("tiny-var", methods, bench="shapes-c2i", need_ckpt=False)
        write_record(spec.path(root), make_record(spec, {"fid": {"value": fid}}, {}, {"total_s": 1.0}))
    fig = figure("fid-vs-sparsity", "tiny", root)
    assert matplotlib.get_backend().lower() == "agg"
    (ax,) = fig.axes
    assert ax.get_title() == "FID vs sparsity: every pruning method" and fig._suptitle is None
    assert not ax.spines["top"].get_visible() and not ax.spines["right"].get_visible()
    assert ax.get_yticklabels()[0].get_fontsize() == 9 and ax.title.get_fontsize() == 10
    assert [t.get_fontsize() for t in fig.texts] == [6]        # the note under the figure
    fig.clf()
    fig = figure("psad-gates", "tiny", root)   # one panel, titled by its schedule: the figure title goes above
    panels = [a for a in fig.axes if a.get_visible()]
    assert fig._suptitle.get_text() == "PSAD gate curriculum per scale" and fig._suptitle.get_fontsize() == 10
    assert all(a.get_title().startswith("onset ") for a in panels)
    fig.clf()


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Records written by the real writer: a dense model, pruned chains at two sparsities, two PSAD settings."""
    root = tmp_path_factory.mktemp("written") / "results"
    for methods, fid in (([], 1.5), (["evar:sparsity=0.2"], 2.5), (["magnitude:sparsity=0.2"], 4.0),
                         (["magnitude:sparsity=0.4", "ft"], 3.0), (["evar:calib=first,sparsity=0.4"], 6.0),
                         (["evar:sparsity=0.4", "psad:onset=0.8"], 3.5), (["evar:sparsity=0.4", "psad:onset=0.7"], 3.6)):
        spec = make_spec("tiny-var", methods, bench="shapes-c2i", need_ckpt=False)
        write_record(spec.path(root), make_record(spec, {"fid": {"value": fid}}, {"flops": 1e9 - fid}, {"total_s": 1.0}))
    return root


@pytest.mark.parametrize("name, wrapped", [("fid-vs-sparsity", False), ("psad-gates", False), ("pareto", False),
                                           ("calibration", True)])
def test_the_note_is_wrapped_to_the_figure_and_clear_of_the_axes(written, name, wrapped):
    """The note under a figure: wrapped to the figure's width (continuation lines indented), in its
    bottom-left corner, and just below everything the axes draw (ticks, labels, legends inside them)."""
    fig = figure(name, "tiny", written)
    note = fig.texts[-1]   # after the suptitle, if any
    width = int(fig.get_figwidth() * 19)
    lines = note.get_text().split("\n")
    assert note.get_position() == (0.01, 0.01) and note.get_va() == "bottom" and note.get_fontsize() == 6
    assert all(len(ln) <= width for ln in lines), lines
    assert any(ln.startswith("  ") for ln in lines) == wrapped, lines
    from bench.figures import KINDS, _style, load_figure
    from bench.records import load_records
    spec = load_figure(name)
    raw = KINDS[spec["kind"]].draw(spec, load_records(written, "tiny"), "tiny", written, _style())[1]
    assert "".join(note.get_text().split()) == "".join(raw.split())   # the kind's note, only re-wrapped
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    top = note.get_window_extent(r).y1
    low = min(ax.get_tightbbox(r).y0 for ax in fig.axes if ax.get_visible())
    assert top - 1 <= low <= top + 0.3 * fig.dpi, (name, low, top)   # clear of it, and no wasted band (≤ 0.3 in)
    fig.clf()


# ------------------------------------------------------------------ drawing a sweep (the kind's draw, on hand-made records)
def _draw(spec, recs):
    from bench.figures import KINDS, _style
    return KINDS[spec["kind"]].draw(spec, recs, "tiny", None, _style())


def test_each_series_gets_its_own_colour_and_each_rest_of_chain_its_own_style():
    from matplotlib.container import ErrorbarContainer

    from bench.figures import SERIES_COLOURS, STYLES
    recs = _records(_rec("a", ["magnitude:sparsity=0.2"], 3.0), _rec("b", ["evar:sparsity=0.2"], 2.0),
                    _rec("c", ["taylor:sparsity=0.2"], 4.0), _rec("d", ["magnitude:sparsity=0.2", "ft"], 2.5),
                    _rec("e", ["awq:bits=4", "magnitude:sparsity=0.2"], 3.5))
    fig, _ = _draw(SWEEP, recs)
    lines = {c.get_label(): c.lines[0] for c in fig.axes[0].containers if isinstance(c, ErrorbarContainer)}
    colours = {label: ln.get_color() for label, ln in lines.items()}
    # colour = the swept method, in the order the series come (sorted by chain): evar, magnitude, taylor
    assert colours["evar"] == SERIES_COLOURS[0] and colours["taylor"] == SERIES_COLOURS[2]
    assert colours["magnitude"] == colours["magnitude + ft"] == colours["awq (bits=4) + magnitude"] == SERIES_COLOURS[1]
    # style = the rest of the chain: nothing else ("dense") first, then sorted: awq (bits=4), ft
    got = {label: (ln.get_marker(), ln.get_linestyle(), ln.get_markerfacecolor()) for label, ln in lines.items()}
    want = dict(zip(("dense", "awq", "ft"), STYLES))   # (marker, line style, filled)
    assert got["evar"][:2] == got["magnitude"][:2] == want["dense"][:2] and got["evar"][2] == SERIES_COLOURS[0]
    assert got["awq (bits=4) + magnitude"][:2] == want["awq"][:2] and got["awq (bits=4) + magnitude"][2] == "white"
    assert got["magnitude + ft"][:2] == want["ft"][:2] and got["magnitude + ft"][2] == SERIES_COLOURS[1]
    fig.clf()


def test_more_series_than_colours_cycle_through_them():
    from matplotlib.container import ErrorbarContainer

    from bench.figures import SERIES_COLOURS
    recs = _records(*[_rec(str(i), [f"m{i}:sparsity=0.2"], 1.0 + i) for i in range(len(SERIES_COLOURS) + 2)])
    fig, _ = _draw(SWEEP, recs)
    colours = [c.lines[0].get_color() for c in fig.axes[0].containers if isinstance(c, ErrorbarContainer)]
    assert colours == [SERIES_COLOURS[i % len(SERIES_COLOURS)] for i in range(len(SERIES_COLOURS) + 2)]
    fig.clf()


def test_the_dense_record_is_a_dashed_line_with_its_stderr_band():
    recs = _records(_rec("d", [], 1.5, stderr=0.25, n=600), _rec("a", ["magnitude:sparsity=0.2"], 3.0))
    fig, note = _draw(SWEEP, recs)
    ax = fig.axes[0]
    (dense,) = [ln for ln in ax.lines if ln.get_label() == "dense (no method)"]
    assert list(dense.get_ydata()) == [1.5, 1.5] and dense.get_linestyle() == "--" and dense.get_color() == "black"
    (band,) = ax.patches
    low, high = sorted(ax.transData.inverted().transform(band.get_extents().get_points())[:, 1])
    assert (low, high) == pytest.approx((1.25, 1.75))
    assert note == ("tiny-var · shapes-c2i · n=12/600 · tiny world · bars: ±stderr · dashed: dense (band ±stderr)")
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["dense (no method)", "magnitude"]
    fig.clf()
    fig, note = _draw(SWEEP, _records(_rec("d", [], 1.5, n=600), _rec("a", ["magnitude:sparsity=0.2"], 3.0)))
    assert not fig.axes[0].patches                                  # no stderr: no band
    fig.clf()
    fig, note = _draw(SWEEP, _records(_rec("a", ["magnitude:sparsity=0.2"], 3.0)))
    assert note == "tiny-var · shapes-c2i · n=12 · tiny world · bars: ±stderr · no dense record"
    fig.clf()


def test_axis_names_scale_and_the_note_on_chains_left_out():
    from matplotlib.ticker import NullFormatter
    recs = _records(_rec("a", ["magnitude:sparsity=0.2"], 3.0), _rec("b", ["magnitude:sparsity=0.2", "ft"], 2.0))
    fig, note = _draw({**SWEEP, "yscale": "log", "series": ["{method}"], "x": {"method_param": "sparsity", "label": "s"}},
                      recs)
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_yscale()) == ("s", "FID (lower is better)", "log")
    assert list(ax.yaxis.get_major_locator().tick_values(1, 20)) == pytest.approx([0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50])
    assert [ax.yaxis.get_major_formatter()(v, 0) for v in (2.0, 5.0, 10.0, 0.5)] == ["2", "5", "10", "0.5"]
    assert isinstance(ax.yaxis.get_minor_formatter(), NullFormatter)
    assert note.endswith("\n1 other chain(s) setting sparsity not drawn (left out by the spec's series, or not one number)")
    fig.clf()
    fig, note = _draw(SWEEP, recs)
    assert (fig.axes[0].get_xlabel(), fig.axes[0].get_yscale()) == ("sparsity", "linear") and "\n" not in note
    fig.clf()


# ------------------------------------------------------------------ latency records: one measurement run
def _lat(run_id, methods, ms, group=None, created="2026-01-01T00:00:00+00:00", model="tiny-var", bench="latency",
         world="tiny", protocol=None):
    rid, rec = _rec(run_id, methods, None, model=model, bench=bench, world=world, created=created,
                    latency_ms={"value": ms, **({"group": group} if group else {})})
    rec["spec"]["protocol"] = {"device": "cpu", "batch": 1} if protocol is None else protocol
    return rid, rec


def _picked(recs, setting=None):
    from bench.figures import _latency_records
    best, left = _latency_records(_records(*recs), "tiny", "tiny-var", {"device": "cpu"} if setting is None else setting)
    return {chain: r["run_id"] for chain, r in best.items()}, left


def test_latency_records_of_the_figures_model_and_setting_only():
    assert _picked([]) == ({}, 0)
    recs = [_lat("a", [], 100.0, "g"), _lat("b", ["tome"], 80.0, "g"), _lat("c", ["evar"], 70.0, "g", model="var-d16"),
            _lat("d", ["fastvar"], 60.0, "g", bench="shapes-c2i"), _lat("e", ["lazyvar"], 50.0, "g", world="paper"),
            _lat("f", ["stepvar"], 40.0, "g", protocol={"device": "cuda", "batch": 1}),
            _lat("h", ["oba"], 45.0, "g", protocol={})]
    assert _picked(recs) == ({"dense": "a", "tome": "b"}, 0)
    assert _picked(recs, {"device": "cuda"}) == ({"stepvar": "f"}, 0)
    assert _picked(recs, {}) == ({"dense": "a", "tome": "b", "stepvar": "f", "oba": "h"}, 0)


def test_latency_records_without_a_group_are_runs_of_their_own():
    assert _picked([_lat("a", [], 100.0), _lat("b", ["tome"], 80.0, created="2026-02-01T00:00:00+00:00")]) == (
        {"tome": "b"}, 1)                                   # one chain each: the newer run, the other left out


@pytest.mark.parametrize("order", [1, -1])
def test_the_newest_record_of_a_chain_in_a_run_and_the_newest_of_equal_runs_win(order):
    recs = [_lat("old", [], 100.0, "g", created="2026-01-01T00:00:00+00:00"),
            _lat("new", [], 90.0, "g", created="2026-01-02T00:00:00+00:00"),
            _lat("t", ["tome"], 80.0, "g"),
            _lat("x", [], 70.0, "h", created="2026-03-01T00:00:00+00:00"),
            _lat("y", ["fastvar"], 60.0, "h"),
            _lat("z", ["stepvar"], 50.0, "i", created="2026-04-01T00:00:00+00:00")]
    assert _picked(recs[::order]) == ({"dense": "x", "fastvar": "y"}, 2)   # g and h time two chains; h is newer
    assert _picked([r for r in recs if r[0] not in "xy"][::order]) == ({"dense": "new", "tome": "t"}, 1)
    # one second: the larger run id of a chain in a run, and of two runs' newest records
    assert _picked([_lat("a1", [], 100.0, "g"), _lat("a2", [], 90.0, "g")][::order]) == ({"dense": "a2"}, 0)
    assert _picked([_lat("b1", [], 100.0, "g"), _lat("b2", ["tome"], 90.0, "h")][::order]) == ({"tome": "b2"}, 1)


def test_the_note_counts_the_chains_left_out():
    from bench.figures import _left_out
    assert _left_out(0) == ""
    assert _left_out(1) == ("\n1 chain timed only in another measurement run left out (latencies are compared "
                            "within one run)")
    assert _left_out(2) == ("\n2 chains timed only in another measurement run left out (latencies are compared "
                            "within one run)")


def test_render_writes_a_200_dpi_png_and_a_pdf_and_closes_the_figure(written, tmp_path, monkeypatch):
    import os
    import re
    import struct

    import matplotlib.pyplot as plt

    from bench.figures import render
    before = set(plt.get_fignums())
    moved = []
    monkeypatch.setattr(os, "replace", lambda src, dst, real=os.replace: (moved.append((src.name, dst.name)), real(src, dst)))
    png, pdf = render("fid-vs-sparsity", "tiny", written, out=tmp_path)
    # each file is written under a hidden name first (a reader never sees half a figure), then moved in place
    assert [re.sub(r"\.\d+\.", ".PID.", src) for src, _ in moved] == [".fid-vs-sparsity.PID.tmp.png",
                                                                       ".fid-vs-sparsity.PID.tmp.pdf"]
    assert [dst for _, dst in moved] == ["fid-vs-sparsity.png", "fid-vs-sparsity.pdf"]
    assert (png, pdf) == (tmp_path / "tiny" / "fid-vs-sparsity.png", tmp_path / "tiny" / "fid-vs-sparsity.pdf")
    width, height = struct.unpack(">II", png.read_bytes()[16:24])
    assert (width, height) == (1440, 760)                  # 7.2 × 3.8 inches at 200 dpi
    assert set(plt.get_fignums()) == before and sorted(p.name for p in (tmp_path / "tiny").iterdir()) == [
        "fid-vs-sparsity.pdf", "fid-vs-sparsity.png"]


# ------------------------------------------------------------------ pareto points
PARETO = {"name": "p", "kind": "pareto", "model": {"tiny": "tiny-var"}, "bench": {"tiny": "shapes-c2i"}, "x": "flops"}


def _q(run_id, methods, fid, flops, created="2026-01-01T00:00:00+00:00", **kw):
    rid, rec = _rec(run_id, methods, fid, created=created, **kw)
    rec["cost"] = {} if flops is None else {"flops": flops}
    return rid, rec


def _pts(spec, recs, lat=None):
    from bench.figures import pareto_points
    return [(p["chain"], p["x"], p["xerr"], p["y"]) for p in pareto_points(spec, _records(*recs), "tiny", lat)]


def test_pareto_points_of_the_figures_model_bench_and_metric_by_flops():
    recs = [_q("a", [], 1.5, 2e9), _q("b", ["magnitude:sparsity=0.4"], 7.5, 1e9),
            _q("c", ["evar:sparsity=0.4"], 2.5, 1e9, model="var-d16"), _q("d", ["evar:sparsity=0.2"], 2.0, 1e9, bench="x"),
            _q("e", ["taylor:sparsity=0.4"], None, 1e9, is_={"value": 1.0}), _q("f", ["tome"], 1.7, None)]
    assert _pts(PARETO, recs) == [("magnitude:sparsity=0.4", 1e9, None, 7.5), ("dense", 2e9, None, 1.5)]
    recs.append(_q("g", ["kd"], None, 3e9, **{"is": {"value": 9.0, "stderr": 0.5}}))
    assert _pts({**PARETO, "y": "is"}, recs) == [("kd", 3e9, None, 9.0)]


@pytest.mark.parametrize("order", [1, -1])
def test_pareto_takes_the_newest_record_of_a_chain(order):
    recs = [_q("a", ["tome"], 5.0, 1e9, created="2026-01-01T00:00:00+00:00"),
            _q("b", ["tome"], 4.0, 1.1e9, created="2026-02-01T00:00:00+00:00")]
    assert _pts(PARETO, recs[::order]) == [("tome", 1.1e9, None, 4.0)]
    same = [_q("c", ["tome"], 5.0, 1e9), _q("d", ["tome"], 4.0, 1.1e9)]   # one second: the larger run id
    assert _pts(PARETO, same[::order]) == [("tome", 1.1e9, None, 4.0)]


def _seeded(run_id, methods, fid, flops, seed, n=12, sampling=None, created="2026-01-01T00:00:00+00:00", stderr=None):
    rid, rec = _q(run_id, methods, fid, flops, created=created, n=n, stderr=stderr)
    rec["spec"].update(seed=seed, sampling=sampling or {})
    return rid, rec


def test_pareto_takes_one_n_and_averages_a_chains_seeds():
    """The n most chains have (a chain only at another n is left out and named); per chain the mean over
    its seeds ± sd/√k (the leaderboard's rule), the newest record per seed."""
    from bench.figures import _pareto
    recs = [_seeded("a0", [], 2.0, 2e9, 0, stderr=0.3),
            _seeded("m0", ["magnitude:sparsity=0.4"], 20.0, 1e9, 0, stderr=0.5),
            _seeded("m1", ["magnitude:sparsity=0.4"], 23.0, 1e9, 1, stderr=0.5),
            _seeded("m1old", ["magnitude:sparsity=0.4"], 99.0, 1e9, 1, created="2025-01-01T00:00:00+00:00"),
            _seeded("t600", ["tome"], 1.5, 1.5e9, 0, n=600)]
    pts, n, others = _pareto(PARETO, _records(*recs), "tiny")
    assert n == 12 and others == {"tome": [600]}
    got = {p["chain"]: (p["y"], p["yerr"], p["seeds"], p["n"]) for p in pts}
    assert got == {"dense": (2.0, 0.3, 1, 12), "magnitude:sparsity=0.4": (21.5, pytest.approx(1.5), 2, 12)}
    assert {p["chain"]: p["run_id"] for p in pts}["magnitude:sparsity=0.4"] in ("m0", "m1")
    # a tie in chains: the larger n; two seeds that agree: no error bar
    recs += [_seeded("a600", [], 1.0, 2e9, 0, n=600), _seeded("m600", ["magnitude:sparsity=0.4"], 7.0, 1e9, 0, n=600),
             _seeded("m600b", ["magnitude:sparsity=0.4"], 7.0, 1e9, 1, n=600)]
    recs = [r for r in recs if r[0] != "a0"] + [_seeded("t12", ["tome"], 3.0, 1.5e9, 0)]
    pts, n, others = _pareto(PARETO, _records(*recs), "tiny")
    assert n == 600 and others == {}
    assert {p["chain"]: (p["y"], p["yerr"]) for p in pts} == {"dense": (1.0, None), "tome": (1.5, None),
                                                               "magnitude:sparsity=0.4": (7.0, None)}


def test_pareto_takes_a_chains_setting_with_the_most_seeds():
    from bench.figures import _pareto
    recs = [_seeded("a", ["tome"], 2.0, 1e9, 0, sampling={"cfg": 3.0}, created="2026-03-01T00:00:00+00:00"),
            _seeded("b", ["tome"], 4.0, 1e9, 0), _seeded("c", ["tome"], 6.0, 1e9, 1)]
    (p,), n, _ = _pareto(PARETO, _records(*recs), "tiny")
    assert (p["y"], p["seeds"]) == (5.0, 2)
    recs[2] = _seeded("c", ["tome"], 6.0, 1e9, 0, sampling={"cfg": 5.0})   # one seed each: the newest
    (p,), n, _ = _pareto(PARETO, _records(*recs), "tiny")
    assert (p["y"], p["run_id"]) == (2.0, "a")
    # seeds made under another method version (or checkpoint) are another identity, never averaged in
    recs = [_seeded("b", ["tome"], 4.0, 1e9, 0), _seeded("c", ["tome"], 6.0, 1e9, 1),
            _seeded("d", ["tome"], 40.0, 1e9, 2, created="2026-03-01T00:00:00+00:00")]
    recs[2][1]["spec"]["method_versions"] = {"tome": 2}
    (p,), n, _ = _pareto(PARETO, _records(*recs), "tiny")
    assert (p["y"], p["seeds"]) == (5.0, 2)


def test_pareto_seed_statistics_and_the_spelling_of_a_request():
    """k seeds: mean ± sample sd/√k (three seeds, and a spread below 1); seeds requested in other
    spellings of one resolved chain are one identity."""
    from bench.figures import _pareto
    recs = [_seeded("a", ["tome"], 20.0, 1e9, 0), _seeded("b", ["tome"], 21.0, 1e9, 1),
            _seeded("c", ["tome"], 23.0, 1e9, 2)]
    (p,), _, _ = _pareto(PARETO, _records(*recs), "tiny")
    assert (p["y"], p["yerr"], p["seeds"]) == (pytest.approx(64 / 3), pytest.approx((7 / 3) ** 0.5 / 3 ** 0.5), 3)
    recs = recs[:2]
    recs[0][1]["spec"]["requested"] = {"methods": ["tome"], "sampling": {}}
    recs[1][1]["spec"]["requested"] = {"methods": ["tome:ratio=0.5"], "sampling": {}}
    (p,), _, _ = _pareto(PARETO, _records(*recs), "tiny")
    assert (p["y"], p["yerr"], p["seeds"]) == (20.5, pytest.approx(0.5), 2)


def test_the_pareto_note_names_its_n_seeds_and_what_it_left_out():
    from bench.figures import _draw_pareto
    recs = [_seeded("a", [], 2.0, 2e9, 0), _seeded("a1", [], 3.0, 2e9, 1),
            _seeded("m", ["magnitude:sparsity=0.4"], 20.0, 1e9, 0), _seeded("e", ["evar:sparsity=0.4"], 4.0, 1e9, 0),
            _seeded("t", ["tome"], 1.5, 1.5e9, 0, n=600), _seeded("f", ["fastvar"], 1.5, 1.5e9, 0, n=60),
            _seeded("f2", ["fastvar"], 1.5, 1.5e9, 0, n=600)]
    import matplotlib.pyplot as plt
    fig, note = _draw_pareto({**PARETO, "name": "p"}, _records(*recs), "tiny", None, plt)
    assert note == ("tiny-var · shapes-c2i · n=12 · tiny world · points with several seeds: their mean (up to 2 "
                    "seeds)\n2 chains recorded only at another n left out (fastvar: n=60/600; tome: n=600)")
    plt.close(fig)


def test_pareto_points_by_latency_from_the_given_or_the_recorded_run():
    spec = {**PARETO, "x": "latency_ms", "latency": {"device": "cpu"}}
    recs = [_q("a", [], 1.5, 2e9), _q("b", ["tome"], 1.8, 1.5e9), _q("c", ["fastvar"], 2.8, 1.2e9),
            _lat("la", [], 100.0, "g"), _lat("lb", ["tome"], 80.0, "g"),
            _lat("lc", ["fastvar"], 10.0, "g", protocol={"device": "cuda", "batch": 1})]
    recs[3][1]["metrics"]["latency_ms"]["iqr"] = 6.0
    # latency without an IQR: no x error bar (0), never a made-up one
    assert _pts(spec, recs) == [("tome", 80.0, 0.0, 1.8), ("dense", 100.0, 3.0, 1.5)]
    given = {"fastvar": _lat("x", ["fastvar"], 50.0, "z")[1]}
    assert _pts(spec, recs, lat=given) == [("fastvar", 50.0, 0.0, 2.8)]


# ------------------------------------------------------------------ a table's cells as bars
def test_table_bars_data_without_records_says_why_each_cell_is_empty():
    from bench.figures import table_bars_data
    data = table_bars_data({"name": "t1", "table": "evar-table1", "y": "fid"}, {}, "tiny")
    assert [c["id"] for c in data["columns"]] == ["fid"] and data["reference"] is None
    why = {b["row"]: b["absent"] for b in data["bars"]}
    assert why["VAR-d20"] == "paper number only in the tiny world: var-d20 has no tiny-world counterpart"
    assert why["LlamaGen-L"] == "paper number only: not a varbench model"
    assert why["VAR-d16"] == why["VAR-d16 (40% sparse)"] == "no record yet (`varbench table evar-table1 --world tiny`)"
    assert all(b["value"] is None and b["column"] == "fid" for b in data["bars"]) and len(data["bars"]) == 11


def test_table_bars_in_the_paper_world_need_no_checkpoint(tmp_path, monkeypatch):
    from bench.figures import EmptyFigureError
    monkeypatch.setenv("VARBENCH_CKPT_DIR", str(tmp_path / "no-checkpoints"))
    with pytest.raises(EmptyFigureError) as e:
        figure("calibration", "paper", tmp_path / "results")
    assert str(e.value).startswith("figure calibration: no record of any fid cell of table evar-table3 (var-d16 · "
                                   f"imagenet256) under {tmp_path / 'results' / 'paper'}; looked for rows ")


def test_table_bars_say_when_the_tables_runs_cannot_be_made(monkeypatch):
    import bench.plan
    from bench.checkpoint import CheckpointError
    from bench.figures import EmptyFigureError, table_bars_data

    def broken(*a, **kw):
        raise CheckpointError("tiny_var.safetensors: not a safetensors file")
    monkeypatch.setattr(bench.plan, "table_cells", broken)
    with pytest.raises(EmptyFigureError) as e:
        table_bars_data({"name": "calibration", "table": "evar-table3", "y": "fid"}, {}, "tiny")
    assert str(e.value) == ("figure calibration: cannot make the run specs of table evar-table3: tiny_var.safetensors: "
                            "not a safetensors file")


def test_the_pareto_front_when_higher_is_better():
    from bench.figures import pareto_front
    pts = [{"x": 1, "y": 1}, {"x": 2, "y": 3}, {"x": 3, "y": 2}, {"x": 4, "y": 5}, {"x": 4, "y": 4}]
    assert [(p["x"], p["y"]) for p in pareto_front(pts, lower_is_better=False)] == [(1, 1), (2, 3), (4, 5)]
    assert [(p["x"], p["y"]) for p in pareto_front(pts)] == [(1, 1)]


def test_empty_figures_say_what_they_looked_for(tmp_path, monkeypatch):
    from bench.figures import EmptyFigureError
    monkeypatch.delenv("VARBENCH_RESULTS", raising=False)
    msgs = {}
    for name, spec in (("flops", PARETO), ("latency", {**PARETO, "x": "latency_ms", "latency": {"device": "cpu"}})):
        with pytest.raises(EmptyFigureError) as e:
            _draw(spec, {})
        msgs[name] = str(e.value)
    assert msgs == {
        "flops": "figure p: no shapes-c2i records of tiny-var with fid under results/tiny (run `varbench table …` first)",
        "latency": "figure p: no shapes-c2i records of tiny-var with fid and a matching latency record under "
                   "results/tiny (run `varbench table …` and `varbench latency …` first)"}
    with pytest.raises(EmptyFigureError) as e:
        figure("calibration", "tiny", tmp_path)
    assert str(e.value) == (
        f"figure calibration: no record of any fid cell of table evar-table3 (tiny-var · shapes-c2i) under "
        f"{tmp_path / 'tiny'}; looked for rows Dense Baseline, First scale only, Fifth scale only, Last scale only, "
        f"Direct token concatenation, Pyramid-Aware Accumulation (Ours) (run `varbench table evar-table3 --world tiny` "
        f"first)")
    with pytest.raises(EmptyFigureError) as e:
        figure("scale-latency", "tiny", tmp_path)
    assert str(e.value) == (f"figure scale-latency: no latency records of tiny-var with {{'device': 'cpu', 'batch': 1}} "
                            f"under {tmp_path / 'tiny'} (run `varbench latency …` first)")


def test_a_pareto_figure_draws_the_latency_setting_it_names():
    from matplotlib.container import ErrorbarContainer
    spec = {**PARETO, "x": "latency_ms", "latency": {"device": "cpu"}}
    recs = _records(_q("a", [], 1.5, 2e9), _q("b", ["tome"], 1.8, 1.5e9), _lat("la", [], 100.0, "g"),
                    _lat("lb", ["tome"], 10.0, "h", protocol={"device": "cuda", "batch": 1}),
                    _lat("lc", ["fastvar"], 20.0, "h2", created="2025-01-01T00:00:00+00:00"))
    fig, note = _draw(spec, recs)
    xs = [c.lines[0].get_xdata()[0] for c in fig.axes[0].containers if isinstance(c, ErrorbarContainer)]
    assert xs == [100.0] and note == ("tiny-var · shapes-c2i · n=12 · tiny world\n1 chain timed only in another "
                                      "measurement run left out (latencies are compared within one run)")
    fig.clf()
    fig, note = _draw(PARETO, recs)                                # by FLOPs: no measurement run to speak of
    assert note == "tiny-var · shapes-c2i · n=12 · tiny world"
    fig.clf()


# ------------------------------------------------------------------ drawing a pareto figure
def _points_drawn(ax):
    from matplotlib.container import ErrorbarContainer
    out = []
    for c in ax.containers:
        if isinstance(c, ErrorbarContainer):
            ln = c.lines[0]
            out.append((c.get_label(), ln.get_xdata()[0], ln.get_ydata()[0], ln.get_marker(), ln.get_color(),
                        ln.get_markerfacecolor()))
    return out


def test_pareto_colours_by_family_markers_by_recovery_and_gflops():
    from bench.figures import OKABE_ITO
    recs = _records(_q("a", [], 1.5, 2e9), _q("b", ["magnitude:sparsity=0.4"], 7.5, 1e9),
                    _q("c", ["magnitude:sparsity=0.4", "ft"], 3.0, 1e9), _q("d", ["evar:sparsity=0.4", "kd"], 2.5, 1e9),
                    _q("e", ["evar:sparsity=0.4", "psad"], 2.2, 1e9), _q("f", ["evar:sparsity=0.2", "ft"], 1.9, 1.5e9),
                    _q("g", ["tome", "stepvar"], 2.0, 1.8e9), _q("h", ["evar:sparsity=0.2"], 2.9, 1.5e9))
    fig, _ = _draw(PARETO, recs)
    ax = fig.axes[0]
    black, evar, magnitude, tome = OKABE_ITO[:4]   # dense first, then the families sorted
    assert sorted(_points_drawn(ax)) == sorted([
        ("dense", 2.0, 1.5, "o", black, black), ("magnitude", 1.0, 7.5, "o", magnitude, magnitude),
        ("magnitude + ft", 1.0, 3.0, "s", magnitude, "white"), ("evar + kd", 1.0, 2.5, "^", evar, "white"),
        ("evar + psad", 1.0, 2.2, "D", evar, "white"), ("evar + ft", 1.5, 1.9, "s", evar, "white"),
        ("tome + stepvar", 1.8, 2.0, "P", tome, "white"), ("evar", 1.5, 2.9, "o", evar, evar)])
    (front,) = [ln for ln in ax.lines if ln.get_label() == "Pareto front"]
    assert list(front.get_xdata()) == [1.0, 1.5, 2.0] and list(front.get_ydata()) == [2.2, 1.9, 1.5]
    assert front.get_linestyle() == "--"
    assert [(t.get_text(), t.xy) for t in ax.texts] == [("evar 0.4 + psad", (1.0, 2.2)), ("evar 0.2 + ft", (1.5, 1.9)),
                                                       ("dense", (2.0, 1.5))]
    assert ax.get_xlabel() == "GFLOPs per image (transformer, CFG doubling included)"
    assert ax.get_ylabel() == "FID (lower is better; bars: ±stderr)"
    fig.clf()


def test_a_family_is_labelled_once_and_colours_cycle():
    from bench.figures import OKABE_ITO
    recs = _records(_q("a", ["magnitude:sparsity=0.4"], 7.5, 1e9), _q("b", ["magnitude:sparsity=0.2"], 3.0, 1.5e9),
                    *[_q(f"m{i}", [f"m{i}"], 2.0 + i, 2e9 + i) for i in range(len(OKABE_ITO))])
    fig, _ = _draw(PARETO, recs)
    drawn = _points_drawn(fig.axes[0])
    assert [d[0] for d in drawn].count("magnitude") == 1 and len(drawn) == len(OKABE_ITO) + 2
    colours = {d[0]: d[4] for d in drawn if not d[0].startswith("_")}
    assert [colours[f"m{i}"] for i in range(len(OKABE_ITO))] == list(OKABE_ITO)     # sorted: m0 … m7, magnitude
    assert colours["magnitude"] == OKABE_ITO[0]                    # the ninth family: the first colour again
    fig.clf()


def test_a_pareto_of_a_higher_is_better_metric():
    recs = _records(_q("a", [], None, 2e9, **{"is": {"value": 9.0}}),
                    _q("b", ["magnitude:sparsity=0.4"], None, 1e9, **{"is": {"value": 5.0}}),
                    _q("c", ["evar:sparsity=0.4"], None, 1e9, **{"is": {"value": 8.0}}))
    fig, _ = _draw({**PARETO, "y": "is"}, recs)
    ax = fig.axes[0]
    (front,) = [ln for ln in ax.lines if ln.get_label() == "Pareto front"]
    assert list(front.get_ydata()) == [8.0, 9.0] and ax.get_ylabel() == "IS (higher is better; bars: ±stderr)"
    fig.clf()


def test_latency_points_and_their_iqr_in_milliseconds():
    spec = {**PARETO, "x": "latency_ms", "latency": {"device": "cpu"}}
    recs = _records(_q("a", [], 1.5, 2e9), _lat("la", [], 100.0, "g"))
    recs["la"]["metrics"]["latency_ms"]["iqr"] = 6.0
    fig, _ = _draw(spec, recs)
    ax = fig.axes[0]
    (c,) = ax.containers
    (seg,) = c.lines[2][0].get_segments()
    assert c.lines[0].get_xdata()[0] == 100.0 and [p[0] for p in seg] == [97.0, 103.0]
    assert ax.get_xlabel() == "latency per generation (ms, median; bars: IQR)"
    fig.clf()


# ------------------------------------------------------------------ drawing table bars (the cells given)
def _bars_data(columns, bars, reference=None, fmt=None):
    cols = [{"id": cid, "group": group} for cid, group in columns]
    return {"table": {"table": "t9", "model": "tiny-var", "bench": "shapes-c2i", "n": [12, 24], "reference_row": "A"},
            "columns": cols, "reference": reference,
            "bars": [{"row": row, "column": cid, "group": dict(columns)[cid], "format": fmt, "value": v, "stderr": e,
                      "run_id": None, "absent": why} for row, cid, v, e, why in bars]}


def _draw_bars(monkeypatch, data):
    import bench.figures as figures
    monkeypatch.setattr(figures, "table_bars_data", lambda spec, records, world: data)
    return _draw({"name": "b", "kind": "table_bars", "table": "t9", "y": "fid"}, {})


def test_one_column_of_bars_centred_on_their_rows(monkeypatch):
    from matplotlib.colors import to_hex

    from bench.figures import SERIES_COLOURS
    # a single column's group label (here "all") names no bar: no legend, no "(all)" in the note
    fig, note = _draw_bars(monkeypatch, _bars_data([("fid", "all")], [("A", "fid", 4.0, 1.0, None),
                                                                     ("B", "fid", 4.5, None, None),
                                                                     ("C", "fid", None, None, "no record yet")],
                                                    reference=2.0, fmt="{:.2f}"))
    ax = fig.axes[0]
    bars = [(p.get_y() + p.get_height() / 2, p.get_height(), p.get_width(), to_hex(p.get_facecolor())) for p in ax.patches]
    assert bars == [(pytest.approx(0.0), pytest.approx(0.72), 4.0, SERIES_COLOURS[3].lower()),
                    (pytest.approx(1.0), pytest.approx(0.72), 4.5, SERIES_COLOURS[3].lower())]
    top = 5.0                                                    # the longest bar with its error bar
    assert [(t.get_text(), t.get_position()) for t in ax.texts] == [
        ("4.00", (4.0 + 1.0 + 0.01 * top, 0.0)), ("4.50", (4.5 + 0.01 * top, 1.0)),
        ("no record (see note)", (0.01 * top, 2.0))]
    assert ax.get_xlim() == pytest.approx((0, top * 1.15)) and ax.get_ylim()[0] > ax.get_ylim()[1]   # first row on top
    assert [t.get_text() for t in ax.get_yticklabels()] == ["A", "B", "C"] and ax.get_legend() is None
    (ref,) = [ln for ln in ax.lines if ln.get_linestyle() == ":"]
    assert list(ref.get_xdata()) == [2.0, 2.0] and ref.get_linestyle() == ":"
    assert fig.get_figheight() == pytest.approx(1.0 + 0.34 * 3)
    assert note == ("table t9 · tiny-var · shapes-c2i · n=12/24 · tiny world · the cells `varbench table` shows · bars: "
                    "±stderr · no bar = no record, never 0 · dotted: A\nabsent: C: no record yet")
    fig.clf()


def test_column_groups_are_side_by_side_bars_with_a_legend(monkeypatch):
    from matplotlib.colors import to_hex

    from bench.figures import SERIES_COLOURS
    fig, note = _draw_bars(monkeypatch, _bars_data([("fid@0", "d16"), ("fid@1", "")],
                                                    [("A", "fid@0", 2.0, None, None), ("A", "fid@1", 3.0, None, None),
                                                     ("B", "fid@0", 5.0, None, None), ("B", "fid@1", None, None, "stale"),
                                                     ("C", "fid@0", None, None, "no run"), ("C", "fid@1", 1.0, None, None)]))
    ax = fig.axes[0]
    bars = [(round(p.get_y() + p.get_height() / 2, 6), round(p.get_height(), 6), p.get_width(), to_hex(p.get_facecolor()))
            for p in ax.patches]
    c0, c1 = SERIES_COLOURS[0].lower(), SERIES_COLOURS[1].lower()
    assert sorted(bars) == sorted([(-0.2, 0.36, 2.0, c0), (0.8, 0.36, 5.0, c0), (0.2, 0.36, 3.0, c1), (2.2, 0.36, 1.0, c1)])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["d16", "fid@1"]   # a group's label, else the column
    assert ("5", (5.0 + 0.05, 0.8)) in [(t.get_text(), t.get_position()) for t in ax.texts]
    assert ("no record (see note)", (0.05, 1.2)) in [(t.get_text(), t.get_position()) for t in ax.texts]
    assert fig.get_figheight() == pytest.approx(1.0 + 0.34 * 3 * 2) and not ax.lines   # no reference, no error bars
    assert note.endswith("no bar = no record, never 0\nabsent: B: stale\nabsent: C (d16): no run")
    assert ax.get_xlabel() == "FID (lower is better)"
    fig.clf()


# ------------------------------------------------------------------ per-scale latency stacks
def test_scale_latency_stacks_each_chains_scales_then_the_decode():
    import matplotlib
    from matplotlib.colors import to_hex
    spec = {"name": "s", "kind": "scale_latency", "model": {"tiny": "tiny-var"}, "latency": {"device": "cpu"}}
    recs = [_lat("a", [], 100.0, "g"), _lat("b", ["tome"], 80.0, "g"), _lat("c", ["fastvar:drop=0.5"], 90.0, "g")]
    for (_, rec), scales, decode in zip(recs, ([10.0, 20.0, 30.0], [5.0, 10.0, 20.0], [10.0, 10.0, 40.0]),
                                        (40.0, 45.0, 15.0)):
        rec["cost"] = {"per_scale_ms": scales, "decode_ms": decode}
        rec["spec"]["protocol"] = {"device": "cpu", "batch": 1, "threads": 2}
    fig, note = _draw(spec, _records(*recs))
    ax = fig.axes[0]
    # dense first, then by drawn height: tome (35 + 45 = 80 ms) before fastvar (60 + 15 = 75 ms)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["dense", "tome", "fastvar"]
    stacks = [(round(p.get_x() + p.get_width() / 2), p.get_y(), p.get_height(), to_hex(p.get_facecolor()))
              for p in ax.patches]
    viridis = [to_hex(matplotlib.colormaps["viridis"](v)) for v in (0.0, 0.5, 1.0)]
    assert stacks[:4] == [(0, 0.0, 10.0, viridis[0]), (0, 10.0, 20.0, viridis[1]), (0, 30.0, 30.0, viridis[2]),
                          (0, 60.0, 40.0, to_hex("0.75"))]
    assert stacks[4:8] == [(1, 0.0, 5.0, viridis[0]), (1, 5.0, 10.0, viridis[1]), (1, 15.0, 20.0, viridis[2]),
                           (1, 35.0, 45.0, to_hex("0.75"))]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["scale 0", "scale 1", "scale 2", "decode"]
    assert note == "tiny-var · cpu · batch 1 · threads 2 · tiny world"
    recs[2][1]["cost"]["decode_ms"] = 30.0                           # fastvar now stands taller: drawn before tome
    del recs[0][1]["spec"]["protocol"]["threads"]
    fig, note = _draw(spec, _records(*recs))
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["dense", "fastvar", "tome"]
    assert note == "tiny-var · cpu · batch 1 · tiny world"


def test_the_last_sampling_step_stands_between_the_scales_and_the_decode_and_counts_in_the_order():
    from matplotlib.colors import to_hex
    spec = {"name": "s", "kind": "scale_latency", "model": {"tiny": "tiny-var"}, "latency": {}}
    recs = [_lat("a", [], 100.0, "g"), _lat("b", ["tome"], 80.0, "g"), _lat("c", ["fastvar:drop=0.5"], 90.0, "g")]
    recs[0][1]["cost"] = {"per_scale_ms": [10.0, 20.0], "last_step_ms": 3.0, "decode_ms": 40.0}
    recs[1][1]["cost"] = {"per_scale_ms": [5.0, 10.0], "last_step_ms": 2.5, "decode_ms": 40.0}   # 57.5 ms
    recs[2][1]["cost"] = {"per_scale_ms": [5.0, 10.0], "decode_ms": 41.0}   # an older record: 56 ms, no last step
    fig, _ = _draw(spec, _records(*recs))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["dense", "tome", "fastvar"]
    stacks = [(round(p.get_x() + p.get_width() / 2), p.get_y(), p.get_height(), to_hex(p.get_facecolor()))
              for p in ax.patches]
    assert stacks[2:4] == [(0, 30.0, 3.0, to_hex("0.45")), (0, 33.0, 40.0, to_hex("0.75"))]
    assert stacks[6:8] == [(1, 15.0, 2.5, to_hex("0.45")), (1, 17.5, 40.0, to_hex("0.75"))]
    assert stacks[10:] == [(2, 15.0, 41.0, to_hex("0.75"))]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["scale 0", "scale 1", "last sampling step", "decode"]


def test_scales_are_named_by_their_size_when_the_record_has_the_models_scales():
    spec = {"name": "s", "kind": "scale_latency", "model": {"tiny": "tiny-t2i"}, "latency": {}}
    _, rec = _lat("a", [], 100.0, "g", model="tiny-t2i")
    rec["cost"] = {"per_scale_ms": [1.0, 2.0, 3.0, 4.0, 5.0], "decode_ms": 3.0}
    fig, _ = _draw(spec, {"a": rec})
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == [
        "scale 0 (1×1)", "scale 1 (2×2)", "scale 2 (4×4)", "scale 3 (6×6)", "scale 4 (8×8)", "decode"]
    rec["cost"]["per_scale_ms"] = [1.0, 2.0, 3.0, 4.0]   # not the model's five scales: by index only
    fig, _ = _draw(spec, {"a": rec})
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == [
        "scale 0", "scale 1", "scale 2", "scale 3", "decode"]


def test_one_scale_is_drawn_in_the_first_colour():
    import matplotlib
    from matplotlib.colors import to_hex
    spec = {"name": "s", "kind": "scale_latency", "model": {"tiny": "tiny-var"}, "latency": {}}
    _, rec = _lat("a", ["tome"], 100.0, "g")
    rec["cost"] = {"per_scale_ms": [7.0], "decode_ms": 3.0}
    fig, _ = _draw(spec, {"a": rec})
    ax = fig.axes[0]
    assert to_hex(ax.patches[0].get_facecolor()) == to_hex(matplotlib.colormaps["viridis"](0.0))
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["scale 0", "decode"]   # one chain: still labelled
    assert ax.get_ylabel() == "ms per generation (median per scale)"


# ------------------------------------------------------------------ PSAD's gate schedules
GATES = {"name": "g", "kind": "gates", "model": {"tiny": "tiny-var", "paper": "var-d16"}, "method": "psad",
         "where": {"variant": "paper"}}


def test_gate_schedules_from_the_figures_model_and_world_records():
    from bench.figures import gate_schedules
    psad = "psad:onset=0.8,ramp=0.25,variant=paper"
    recs = _records(_rec("b", ["evar:sparsity=0.4", psad], 2.0), _rec("a", ["magnitude:sparsity=0.4", psad], 3.0),
                    _rec("c", ["evar:sparsity=0.4", "psad:onset=0.5,ramp=0.1,variant=paper"], 2.0, model="var-d16"),
                    _rec("d", ["evar:sparsity=0.4", "psad:onset=0.4,ramp=0.1,variant=paper"], 2.0, world="paper"),
                    _rec("e", ["evar:sparsity=0.4", "psad:onset=0.3,ramp=0.1,variant=code"], 2.0))
    (s,) = gate_schedules(GATES, recs, "tiny")
    assert s == {"K": 7, "patch_nums": (1, 2, 3, 4, 5, 6, 8), "onset": 0.8, "ramp": 0.25, "run_ids": ["a", "b"],
                 "source": "records"}
    # c is var-d16 in the tiny world, d tiny-var in the paper world: neither is var-d16's in the paper world
    assert [(s["onset"], s["K"], s["source"]) for s in gate_schedules(GATES, recs, "paper")] == [(0.6, 10, "defaults")]


def test_gate_schedules_without_records_come_from_the_defaults_or_say_why_not(monkeypatch):
    from bench.figures import EmptyFigureError, gate_schedules
    monkeypatch.delenv("VARBENCH_RESULTS", raising=False)
    (s,) = gate_schedules(GATES, {}, "tiny")
    assert (s["onset"], s["ramp"], s["run_ids"], s["source"]) == (0.6, 0.1, [], "defaults")
    with pytest.raises(EmptyFigureError) as e:
        gate_schedules({**GATES, "where": {"variant": "code"}}, {}, "tiny")
    assert str(e.value) == ("figure g: no record of tiny-var under results/tiny with psad {'variant': 'code'}, and "
                            "psad's defaults do not match {'variant': 'code'}")


def test_gates_draw_one_panel_per_schedule_in_rows_of_three():
    import matplotlib
    from matplotlib.colors import to_hex
    onsets = (("0.7", "0.0333", ["a"]), ("0.6", "0.1", ["b", "c"]), ("0.5", "0.2", ["d", "e", "f"]),
              ("0.4", "0", ["g", "h", "i", "j"]))
    recs = _records(*[_rec(rid, ["evar:sparsity=0.4", f"psad:onset={o},ramp={r},variant=paper"], 2.0)
                      for o, r, ids in onsets for rid in ids])
    fig, note = _draw(GATES, recs)
    axes = fig.axes
    assert len(axes) == 6 and [a.get_visible() for a in axes] == [True] * 4 + [False] * 2
    assert (fig.get_figwidth(), fig.get_figheight()) == pytest.approx((2.9 * 3 + 1.3, 2.5 * 2 + 0.5))
    assert all(axes[0].get_shared_y_axes().joined(axes[0], a) for a in axes[1:4])
    # sorted by (onset, ramp); the run ids of each: one, two, or two and a count
    assert [a.get_title() for a in axes[:4]] == ["onset 0.4 · ramp Δ 0\nrecords g, h (+2)",
                                                 "onset 0.5 · ramp Δ 0.2\nrecords d, e (+1)",
                                                 "onset 0.6 · ramp Δ 0.1\nrecords b, c",
                                                 "onset 0.7 · ramp Δ 0.0333\nrecord a"]
    for a in axes[:4]:
        assert a.get_xlim() == (0, 1) and a.get_ylim() == pytest.approx((-0.03, 1.05))
        assert a.get_xlabel() == "training progress t (fraction of steps)"
    assert [a.get_ylabel() for a in axes[:4]] == [r"gate $\tilde\gamma_i(t)$", "", "", r"gate $\tilde\gamma_i(t)$"]
    assert [a.get_legend() is not None for a in axes[:4]] == [False, False, False, True]
    viridis = [to_hex(matplotlib.colormaps["viridis"](0.9 * i / 6)) for i in range(7)]
    assert [to_hex(ln.get_color()) for ln in axes[3].get_lines()] == viridis
    # the curves' bends are points of the curve, not only the 1/400 grid: t_i and t_i + Δ for every scale
    xs = set(axes[3].get_lines()[0].get_xdata())
    bends = {b for ti in gate_onsets(7, 0.7, 0.0333) for b in (ti, ti + 0.0333) if 0 <= b <= 1}
    assert bends <= xs and len(xs) == len(bends | {i / 400 for i in range(401)})
    assert note == "psad gates on tiny-var (K=7 scales) · from records · tiny world · t_0 = −Δ, t_i = onset·i/(K−1)"


def test_one_or_two_schedules_make_one_row():
    recs = _records(_rec("a", ["psad:onset=0.7,ramp=0.1,variant=paper"], 2.0),
                    _rec("b", ["psad:onset=0.5,ramp=0.1,variant=paper"], 2.0))
    fig, _ = _draw(GATES, recs)
    assert len(fig.axes) == 2 and all(a.get_visible() for a in fig.axes)
    assert (fig.get_figwidth(), fig.get_figheight()) == pytest.approx((2.9 * 2 + 1.3, 2.5 + 0.5))
    fig, note = _draw(GATES, {})
    assert len(fig.axes) == 1 and note.startswith("psad gates on tiny-var (K=7 scales) · from the method's defaults")


def test_identical_points_are_both_on_the_front():
    from bench.figures import pareto_front
    pts = [{"x": 1, "y": 2, "c": "a"}, {"x": 1, "y": 2, "c": "b"}, {"x": 2, "y": 3, "c": "c"}]
    assert [p["c"] for p in pareto_front(pts)] == ["a", "b"]


def test_dense_keeps_the_first_colour_and_the_pareto_legend():
    from bench.figures import OKABE_ITO
    recs = _records(_q("a", [], 1.5, 2e9), _q("b", ["awq:bits=4"], 7.5, 1e9), _q("c", ["awq:bits=3", "ft"], 5.0, 0.9e9))
    fig, _ = _draw(PARETO, recs)
    ax = fig.axes[0]
    colours = {d[0]: d[4] for d in _points_drawn(ax)}
    assert colours == {"dense": OKABE_ITO[0], "awq": OKABE_ITO[1], "awq + ft": OKABE_ITO[1]}
    assert sorted(t.get_text() for t in ax.get_legend().get_texts()) == ["Pareto front", "awq", "awq + ft", "dense"]


def test_an_empty_pareto_names_its_metric(monkeypatch):
    from bench.figures import EmptyFigureError
    monkeypatch.delenv("VARBENCH_RESULTS", raising=False)
    with pytest.raises(EmptyFigureError, match="no shapes-c2i records of tiny-var with is under"):
        _draw({**PARETO, "y": "is"}, _records(_q("a", [], 1.5, 2e9)))


def test_the_dense_bar_stands_first_even_when_shortest():
    import matplotlib
    from matplotlib.colors import to_hex
    spec = {"name": "s", "kind": "scale_latency", "model": {"tiny": "tiny-var"}, "latency": {}}
    recs = [_lat("a", [], 10.0, "g"), _lat("b", ["awq"], 80.0, "g")]
    for (_, rec), scales in zip(recs, ([3.0, 2.0], [40.0, 30.0])):
        rec["cost"] = {"per_scale_ms": scales, "decode_ms": 5.0}
    fig, _ = _draw(spec, _records(*recs))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["dense", "awq"]
    viridis = [to_hex(matplotlib.colormaps["viridis"](v)) for v in (0.0, 1.0)]
    assert [to_hex(p.get_facecolor()) for p in ax.patches[:2]] == viridis      # two scales: both ends of the map


def test_table_bars_data_takes_values_run_ids_and_the_reference_from_the_records(tmp_path):
    from bench.figures import table_bars_data
    from bench.plan import table_cells
    from bench.records import load_records
    from bench.render import load_spec
    table = load_spec("evar-table3")
    cells = {c.row: c for c in table_cells(table, "tiny", need_ckpt=False)}
    root = tmp_path / "results"
    ids = {}
    for row, fid in (("Dense Baseline", 1.4), ("First scale only", 6.1)):
        rec = make_record(cells[row].spec, {"fid": {"value": fid, "stderr": 0.1}}, {}, {"total_s": 1.0})
        write_record(cells[row].spec.path(root), rec)
        ids[row] = rec["run_id"]
    data = table_bars_data({"name": "c", "table": "evar-table3", "y": "fid"}, load_records(root, "tiny"), "tiny")
    by = {b["row"]: b for b in data["bars"]}
    assert table.reference_row == "Dense Baseline" and data["reference"] == 1.4
    assert [(by[r]["value"], by[r]["stderr"], by[r]["run_id"], by[r]["absent"]) for r in ids] == [
        (1.4, 0.1, ids["Dense Baseline"], None), (6.1, 0.1, ids["First scale only"], None)]
    assert {b["group"] for b in data["bars"]} == {data["table"]["groups"][0]["label"]}


def test_table_bars_data_from_a_current_and_a_stale_record():
    import dataclasses

    from bench.figures import table_bars_data
    from bench.plan import table_cells
    from bench.records import make_record
    from bench.render import load_spec
    cells = {c.row: c for c in table_cells(load_spec("evar-table1"), "tiny", need_ckpt=False)}
    dense = make_record(cells["VAR-d16"].spec, {"fid": {"value": 12.5, "stderr": 0.5}}, {}, {})
    sparse = cells["VAR-d16 (40% sparse)"].spec
    old = dataclasses.replace(sparse, method_versions={**sparse.method_versions, "evar": 0})   # an older EVAR
    assert old.key() != sparse.key()
    stale = make_record(old, {"fid": 30.0}, {}, {})
    data = table_bars_data({"name": "t1", "table": "evar-table1", "y": "fid"},
                           {r["run_id"]: r for r in (dense, stale)}, "tiny")
    bars = {b["row"]: b for b in data["bars"]}
    assert (bars["VAR-d16"]["value"], bars["VAR-d16"]["stderr"], bars["VAR-d16"]["run_id"], bars["VAR-d16"]["absent"]) \
        == (12.5, 0.5, dense["run_id"], None)
    assert data["reference"] == 12.5
    assert bars["VAR-d16 (40% sparse)"]["value"] is None
    assert bars["VAR-d16 (40% sparse)"]["absent"] == "only a stale record (rerun with `varbench table evar-table1`)"
    assert bars["VAR-d16 (20% sparse)"]["absent"] == "no record yet (`varbench table evar-table1 --world tiny`)"


def test_a_front_of_one_point_is_labelled_but_draws_no_line():
    recs = _records(_q("a", [], 1.5, 2e9), _q("b", ["magnitude:sparsity=0.4"], 1.6, 2.5e9))   # dense dominates
    fig, _ = _draw(PARETO, recs)
    ax = fig.axes[0]
    assert [ln.get_label() for ln in ax.lines if ln.get_label() == "Pareto front"] == []
    assert sorted(t.get_text() for t in ax.get_legend().get_texts()) == ["dense", "magnitude"]
    assert [(t.get_text(), t.xy) for t in ax.texts] == [("dense", (2.0, 1.5))]
    fig.clf()
