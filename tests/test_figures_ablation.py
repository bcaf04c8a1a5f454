"""Ablation figures (sweep, table_bars, gates): drawn from records written by the real writer, the
plotted data read back off the matplotlib Axes and compared with the records; absent cells absent
(never zero); the token figure fails clearly until its methods exist; PSAD's torch-free gate curves
equal the trainer's."""
import math

import pytest
from matplotlib.container import BarContainer, ErrorbarContainer

import bench.figures as figures
from bench.cli import main
from bench.figures import (
    EmptyFigureError,
    FigureSpecError,
    figure,
    gate_onsets,
    gate_values,
    load_figure,
    render,
    sweep_series,
)
from bench.plan import make_spec, table_cells
from bench.records import load_records, make_record, write_record
from bench.render import load_spec, render_from_records

TABLE3_MISSING, TABLE4_MISSING = "Fifth scale only", "+ Vanilla KD"


def _put(root, methods, fid, stderr=0.1, n=None, created=None):
    spec = make_spec("tiny-var", methods, bench="shapes-c2i", n=n, need_ckpt=False)
    return _put_spec(root, spec, fid, stderr, created)


def _put_spec(root, spec, fid, stderr=0.1, created=None):
    rec = make_record(spec, {"fid": {"value": fid, "stderr": stderr}, "is": 9.0}, {"params": 2e6}, {"total_s": 1.0})
    if created:
        rec["created"] = created
    write_record(spec.path(root), rec)
    return rec


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Records of a small ablation study; every FID is distinct so a mix-up shows."""
    root = tmp_path_factory.mktemp("ablation") / "results"
    recs = {"dense": _put(root, [], 1.4, 0.05)}
    # written out of x order; one point without a stderr; an older record of the same point at another n
    recs["mag04"] = _put(root, ["magnitude:sparsity=0.4"], 9.5, 0.4)
    recs["mag02"] = _put(root, ["magnitude:sparsity=0.2"], 3.25, None)
    recs["mag04_old"] = _put(root, ["magnitude:sparsity=0.4"], 99.0, 1.0, n=300, created="2020-01-01T00:00:00+00:00")
    recs["mag04_ft"] = _put(root, ["magnitude:sparsity=0.4", "ft"], 2.75, 0.2)
    recs["evar02"] = _put(root, ["evar:sparsity=0.2"], 1.9, 0.15)
    recs["first04"] = _put(root, ["evar:calib=first,sparsity=0.4"], 6.1, 0.3)       # not a "{method}" series
    for table, missing, fids in (("evar-table3", TABLE3_MISSING, (1.4, 6.1, 5.0, 4.4, 3.6, 3.3)),
                                 ("evar-table4", TABLE4_MISSING, (3.3, 1.9, 0.0, 2.2, 2.1, 1.95, 1.7))):
        spec = load_spec(table)
        cells = {c.row: c for c in table_cells(spec, "tiny", need_ckpt=False)}
        for row, fid in zip([r.label for r in spec.rows], fids):
            if row != missing:
                recs[table, row] = _put_spec(root, cells[row].spec, fid, round(0.05 * fid, 4))
    recs["psad_b"] = _put(root, ["evar:sparsity=0.4", "psad:onset=0.8,ramp=0.25"], 1.8)
    recs["psad_code"] = _put(root, ["evar:sparsity=0.4", "psad:variant=code,onset=0.3"], 1.85)
    return root, recs


def _series(ax):
    """{legend label: (xdata, ydata, [(low, high) or None per point])} of every errorbar line."""
    out = {}
    for c in ax.containers:
        if isinstance(c, ErrorbarContainer) and not c.get_label().startswith("_"):
            line = c.lines[0]
            segs = c.lines[2][0].get_segments() if c.lines[2] else [[]] * len(line.get_xdata())
            bars = [None if len(s) == 0 else (s[0][1], s[1][1]) for s in segs]
            out[c.get_label()] = (list(line.get_xdata()), list(line.get_ydata()), bars)
    return out


def _bars(ax):
    """{row label: (width, (low, high) or None)} of the bars, and the texts by row."""
    labels = {round(t.get_position()[1]): t.get_text() for t in ax.get_yticklabels()}
    out = {}
    for c in ax.containers:
        if isinstance(c, BarContainer):
            segs = c.errorbar.lines[2][0].get_segments() if c.errorbar is not None and c.errorbar.lines[2] else None
            for i, p in enumerate(c.patches):
                err = None if segs is None or len(segs[i]) == 0 else (segs[i][0][0], segs[i][1][0])
                out[labels[round(p.get_y() + p.get_height() / 2)]] = (p.get_width(), err)
    texts = {labels.get(round(t.get_position()[1])): t.get_text() for t in ax.texts}
    return out, texts


@pytest.mark.parametrize("name", ["fid-vs-sparsity", "calibration", "recovery", "psad-gates"])
def test_new_figures_render_png_and_pdf_with_embedded_truetype_fonts(root, tmp_path, name):
    png, pdf = render(name, world="tiny", root=root[0], out=tmp_path / "out")
    assert (png.name, pdf.name) == (f"{name}.png", f"{name}.pdf")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    data = pdf.read_bytes()
    assert data[:5] == b"%PDF-" and b"/FontFile2" in data and b"/Type3" not in data
    assert not list((tmp_path / "out" / "tiny").glob(".*tmp*"))


def test_sweep_draws_one_sorted_line_per_chain_with_the_records_values(root):
    root, recs = root
    fig = figure("fid-vs-sparsity", "tiny", root)
    ax = fig.axes[0]
    got = _series(ax)
    assert set(got) == {"magnitude", "magnitude + ft", "evar"}          # the calib=first chain is filtered out
    xs, ys, bars = got["magnitude"]
    assert xs == [0.2, 0.4] and ys == [3.25, 9.5]                       # sorted by x; the newest 0.4 record
    assert bars[0] is None and bars[1] == pytest.approx((9.5 - 0.4, 9.5 + 0.4))   # no stderr: no bar, not 0
    assert got["magnitude + ft"][:2] == ([0.4], [2.75]) and got["evar"][:2] == ([0.2, 0.4], [1.9, 3.3])
    assert got["evar"][2] == [pytest.approx((1.9 - 0.15, 1.9 + 0.15)), pytest.approx((3.3 - 0.165, 3.3 + 0.165))]
    dense = [ln for ln in ax.lines if ln.get_label() == "dense (no method)"]
    assert len(dense) == 1 and list(dense[0].get_ydata()) == [1.4, 1.4]
    assert ax.get_yscale() == "log" and ax.get_xlabel().startswith("sparsity")
    note = " ".join(t.get_text() for t in fig.texts)
    # Tab. 3's calib=first/last/concat, Tab. 4's evar + ft (epochs=2.0) and four psad rows, two other psad settings
    assert "10 other chain(s) setting sparsity not drawn" in note
    fig.clf()


def test_sweep_series_group_by_the_chain_without_the_swept_parameter(root):
    root, recs = root
    spec = {**load_figure("fid-vs-sparsity"), "series": None}      # every chain that sets sparsity
    loaded = load_records(root, "tiny")   # the 0.4 record first: the points must still come sorted by x
    first = recs["mag04"]["run_id"]
    series, dense, left_out = sweep_series(spec, {first: loaded[first], **loaded}, "tiny")
    by = {s["label"]: s for s in series}
    assert {"magnitude", "magnitude + ft", "evar", "evar (calib=first)"} <= set(by) and left_out == []
    assert by["magnitude"]["key"] == ((), "magnitude:norm=l2,schedule=uniform,scope=coupled", ())
    assert [p["run_id"] for p in by["magnitude"]["points"]] == [recs["mag02"]["run_id"], recs["mag04"]["run_id"]]
    assert by["magnitude + ft"]["style_key"] == "ft" and by["magnitude"]["style_key"] == "dense"
    # Table 4's recoveries are series of their own (one point each), never merged into "evar"
    assert any(label.startswith("evar + psad") for label in by) and dense["run_id"] == recs["dense"]["run_id"]
    assert by["evar"]["points"][-1]["y"] == 3.3 and [p["x"] for p in by["evar"]["points"]] == [0.2, 0.4]


@pytest.mark.parametrize("name, table, missing", [("calibration", "evar-table3", TABLE3_MISSING),
                                                  ("recovery", "evar-table4", TABLE4_MISSING)])
def test_table_bars_show_exactly_the_tables_cells(root, tmp_path, name, table, missing):
    root, recs = root
    fig = figure(name, "tiny", root)
    ax = fig.axes[0]
    bars, texts = _bars(ax)
    shown = render_from_records(table, "tiny", root=root, out_dir=tmp_path, formats=("json",))["json"]
    for row in shown["rows"]:
        cell = row["cells"]["fid"]
        if cell["ours"] is None:
            assert row["label"] not in bars and texts[row["label"]].startswith("no record")   # absent, not 0
        else:
            width, err = bars[row["label"]]
            assert width == cell["ours"] == recs[table, row["label"]]["metrics"]["fid"]["value"]
            assert err == pytest.approx((cell["ours"] - cell["stderr"], cell["ours"] + cell["stderr"]))
    assert missing not in bars and len(bars) == len(shown["rows"]) - 1
    assert [t.get_text() for t in ax.get_yticklabels()] == [r["label"] for r in shown["rows"]]   # table order
    note = " ".join(t.get_text() for t in fig.texts)
    assert f"absent: {missing}: no record yet" in note.replace("\n", " ")
    fig.clf()


def test_token_keep_ratio_without_records_says_what_it_looked_for(root):
    with pytest.raises(EmptyFigureError) as e:
        render("token-keep-ratio", "tiny", root=root[0], out=root[0].parent / "o")
    msg = str(e.value)
    assert "sets keep of lazyvar" in msg and "shapes-c2i records of tiny-var" in msg
    assert "not implemented" not in msg


def test_token_keep_ratio_draws_lazyvar_keep_and_leaves_per_scale_ratios_off_the_axis(tmp_path):
    root = tmp_path / "results"
    _put(root, [], 1.4, 0.05)
    _put(root, ["lazyvar:keep=0.5,pgd=false"], 4.5)
    _put(root, ["lazyvar:keep=0.25,pgd=false"], 7.25)
    _put(root, ["lazyvar:keep=0.5"], 5.5)
    _put(root, ["lazyvar:keep=0.2/0.1/0.05/0.01"], 9.75)          # one ratio per scale: not one x
    series, dense, left_out = sweep_series(load_figure("token-keep-ratio"), load_records(root), "tiny")
    got = {s["label"]: [(p["x"], p["y"]) for p in s["points"]] for s in series}
    assert got == {"lazyvar (pgd=false)": [(0.25, 7.25), (0.5, 4.5)], "lazyvar": [(0.5, 5.5)]}
    assert dense["y"] == 1.4 and left_out == ["lazyvar (keep=0.2/0.1/0.05/0.01)"]


def test_sweep_says_not_implemented_only_for_methods_the_registry_lacks(tmp_path, monkeypatch):
    (tmp_path / "figs").mkdir()
    (tmp_path / "figs" / "mixed.yaml").write_text(
        "title: t\nkind: sweep\nmodel: {tiny: tiny-var}\nbench: {tiny: shapes-c2i}\n"
        "x: {method_param: sparsity}\ny: fid\nmethods: [magnitude, ghostvar]\n")
    (tmp_path / "figs" / "bad.yaml").write_text(
        "title: t\nkind: sweep\nmodel: {tiny: tiny-var}\nbench: {tiny: shapes-c2i}\n"
        "x: {method_param: keep_ratio}\ny: fid\nmethods: [magnitude]\n")
    monkeypatch.setattr(figures, "figures_dir", lambda: tmp_path / "figs")
    with pytest.raises(EmptyFigureError) as e:
        figure("mixed", "tiny", tmp_path / "none")
    assert "; ghostvar: not implemented in varbench yet" in str(e.value) and "magnitude:sparsity=" in str(e.value)
    with pytest.raises(FigureSpecError, match="method magnitude has no parameter 'keep_ratio'"):
        load_figure("bad")


def test_cli_draws_the_figures_it_can_and_reports_the_token_figure(root, tmp_path, capsys):
    assert main(["figures", "--results", str(root[0]), "--out", str(tmp_path / "o")]) == 0
    out, err = capsys.readouterr()
    for name in ("fid-vs-sparsity", "calibration", "recovery", "psad-gates"):
        assert f"{name}.pdf" in out
    assert "figure token-keep-ratio:" in err and "sets keep of lazyvar" in err and "figures not drawn" in err
    assert main(["figures", "token-keep-ratio", "--results", str(root[0]), "--out", str(tmp_path / "o")]) == 2
    assert "keep of lazyvar" in capsys.readouterr().err


@pytest.mark.parametrize("K", [1, 2, 7, 10])
@pytest.mark.parametrize("onset, ramp", [(0.6, 0.1), (0.35, 0.05), (0.0, 0.2), (1.0, 0.3), (0.6, 0.0), (0.9, 1.0)])
def test_pure_python_gates_equal_the_trainers(K, onset, ramp):
    torch = pytest.importorskip("torch")
    from methods.psad import gates, onsets
    assert gate_onsets(K, onset, ramp) == pytest.approx(onsets(K, onset, ramp).tolist(), abs=0)
    ts = sorted({i / 64 for i in range(65)} | {b for ti in gate_onsets(K, onset, ramp) for b in (ti, ti + ramp)
                                               if 0 <= b <= 1})
    for t in ts:
        ours, theirs = gate_values(t, K, onset, ramp), gates(t, K, onset, ramp)
        assert theirs.dtype == torch.float32 and ours == pytest.approx(theirs.tolist(), abs=1e-6), t


def _panels(fig):
    return [a for a in fig.axes if a.get_visible()]


def test_gates_figure_one_panel_per_recorded_schedule(root):
    root, recs = root
    fig = figure("psad-gates", "tiny", root)
    panels = _panels(fig)
    titles = [a.get_title() for a in panels]
    psad_default = sorted(r["run_id"] for k, r in recs.items() if isinstance(k, tuple) and k[0] == "evar-table4"
                          and "psad" in " ".join(r["spec"]["methods"]))
    assert len(psad_default) == 4 and len(panels) == 2                  # variant=code (no gates) left out
    assert titles[0].startswith("onset 0.6 · ramp Δ 0.1\nrecords ") and f"{psad_default[0]}" in titles[0]
    assert "(+2)" in titles[0]
    assert titles[1] == f"onset 0.8 · ramp Δ 0.25\nrecord {recs['psad_b']['run_id']}"
    for ax, (onset, ramp) in zip(panels, [(0.6, 0.1), (0.8, 0.25)]):
        lines = ax.get_lines()
        assert [ln.get_label() for ln in lines] == [f"scale {i} ({pn}×{pn})" for i, pn in enumerate((1, 2, 3, 4, 5, 6, 8))]
        for i, ln in enumerate(lines):
            xs, ys = list(ln.get_xdata()), list(ln.get_ydata())
            assert xs[0] == 0 and xs[-1] == 1 and xs == sorted(xs)
            assert ys == [gate_values(t, 7, onset, ramp)[i] for t in xs]
        assert lines[6].get_ydata()[-1] == pytest.approx(min(1.0, (1 - onset) / ramp))
    fig.clf()


def test_gates_figure_without_records_is_drawn_from_the_defaults(tmp_path):
    fig = figure("psad-gates", "tiny", tmp_path / "empty")
    (ax,) = _panels(fig)
    assert ax.get_title() == "onset 0.6 · ramp Δ 0.1\ndefaults (methods YAML; no record)"
    assert "from the method's defaults" in " ".join(t.get_text() for t in fig.texts)
    ys = ax.get_lines()[3].get_ydata()
    assert min(ys) == 0 and max(ys) == 1 and not any(math.isnan(y) for y in ys)
    fig.clf()
