"""Figures: rendered from records only (PNG + PDF with embedded TrueType fonts), the Pareto front
by dominance, clear errors when records or figures are missing."""
import pytest

from bench.cli import main
from bench.figures import (
    EmptyFigureError,
    FigureSpecError,
    figure,
    load_figure,
    pareto_front,
    pareto_points,
    render,
)
from bench.records import RunSpec, load_records, make_record, write_record

SETTING = {"version": 1, "device": "cpu", "batch": 1, "threads": 1, "compile": False, "warmup": 1}   # latency records


def _write(root, methods, bench, metrics, cost, protocol=None, n=12):
    spec = RunSpec(world="tiny", model="tiny-var", methods=tuple(methods), bench=bench, n=n, seed=0,
                   sampling={"cfg": 2.0}, ckpt={"f": "0"}, method_versions={}, protocol=protocol or {"version": 1})
    rec = make_record(spec, metrics, cost, {"total_s": 1.0})
    write_record(spec.path(root), rec)
    return rec


@pytest.fixture
def records(tmp_path):
    root = tmp_path / "results"
    for methods, fid, flops, lat in (([], 1.4, 1.3e9, 120.0), (["magnitude:sparsity=0.4"], 7.8, 0.84e9, 90.0),
                                     (["evar:sparsity=0.4"], 2.2, 0.84e9, 92.0),
                                     (["evar:sparsity=0.4", "ft:epochs=2"], 1.6, 0.84e9, None)):
        _write(root, methods, "shapes-c2i", {"fid": {"value": fid, "stderr": 0.2}}, {"flops": flops})
        if lat is not None:
            _write(root, methods, "latency",
                   {"latency_ms": {"value": lat, "iqr": 4.0, "group": "run-a"}, "images_per_s": 1e3 / lat,
                    "peak_mem_mb": 500.0},
                   {"flops": flops, "per_scale_ms": [lat / 10] * 7, "decode_ms": lat * 0.3}, protocol=SETTING, n=5)
    return root


def test_pareto_front_is_the_non_dominated_set():
    pts = [{"x": 1, "y": 5}, {"x": 2, "y": 3}, {"x": 2, "y": 4}, {"x": 3, "y": 3}, {"x": 4, "y": 1}]
    assert [(p["x"], p["y"]) for p in pareto_front(pts)] == [(1, 5), (2, 3), (4, 1)]
    assert [(p["x"], p["y"]) for p in pareto_front(pts, lower_is_better=False)] == [(1, 5)]


def test_points_come_from_the_records(records):
    recs = load_records(records, "tiny")
    pts = pareto_points(load_figure("pareto"), recs, "tiny")
    assert {p["label"]: (p["x"], p["y"], p["yerr"]) for p in pts} == {
        "dense": (1.3e9, 1.4, 0.2), "magnitude 0.4": (0.84e9, 7.8, 0.2), "evar 0.4": (0.84e9, 2.2, 0.2),
        "evar 0.4 + ft": (0.84e9, 1.6, 0.2)}
    assert [p["label"] for p in pareto_front(pts)] == ["evar 0.4 + ft", "dense"]
    lat = pareto_points(load_figure("pareto-latency"), recs, "tiny")
    assert {p["label"]: p["x"] for p in lat} == {"dense": 120.0, "magnitude 0.4": 90.0, "evar 0.4": 92.0}
    assert all(p["xerr"] == 2.0 for p in lat)   # half the IQR either side


def test_latency_figures_take_one_measurement_run(records):
    """A newer record from another measurement run (one that a later run could not re-time with its
    partners, e.g. stale then): the figures keep the run that timed the most chains and say what they
    left out, as a table compares times only within one run."""
    _write(records, ["tome"], "shapes-c2i", {"fid": {"value": 1.5, "stderr": 0.2}}, {"flops": 1.1e9})
    _write(records, ["tome"], "latency", {"latency_ms": {"value": 70.0, "iqr": 1.0, "group": "run-b"}},
           {"flops": 1.1e9, "per_scale_ms": [7.0] * 7, "decode_ms": 1.0}, protocol=SETTING, n=5)
    recs = load_records(records, "tiny")
    lat = pareto_points(load_figure("pareto-latency"), recs, "tiny")
    assert {p["label"]: p["x"] for p in lat} == {"dense": 120.0, "magnitude 0.4": 90.0, "evar 0.4": 92.0}
    for name in ("pareto-latency", "scale-latency"):
        fig = figure(name, world="tiny", root=records)
        note = " ".join(" ".join(t.get_text() for t in fig.texts).split())   # the note is wrapped
        assert "1 chain timed only in another measurement run left out" in note
    ax = figure("scale-latency", world="tiny", root=records).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["dense", "evar 0.4", "magnitude 0.4"]


@pytest.mark.parametrize("name", ["pareto", "pareto-latency", "scale-latency"])
def test_figures_render_png_and_pdf_with_embedded_truetype_fonts(records, tmp_path, name):
    paths = render(name, world="tiny", root=records, out=tmp_path / "out")
    png, pdf = paths
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    data = pdf.read_bytes()
    assert data[:5] == b"%PDF-" and b"/FontFile2" in data and b"/Type3" not in data
    assert not list((tmp_path / "out" / "tiny").glob(".*tmp*"))


def test_missing_records_and_unknown_figures_are_clear(tmp_path, capsys):
    with pytest.raises(EmptyFigureError, match="no shapes-c2i records of tiny-var"):
        render("pareto", root=tmp_path, out=tmp_path / "o")
    with pytest.raises(EmptyFigureError, match="varbench latency"):
        render("scale-latency", root=tmp_path, out=tmp_path / "o")
    with pytest.raises(FigureSpecError, match="did you mean 'pareto'"):
        load_figure("paretto")
    assert main(["figures", "paretto", "--results", str(tmp_path)]) == 2
    assert "did you mean" in capsys.readouterr().err


def test_cli_renders_all_figures(records, tmp_path, capsys):
    assert main(["figures", "--results", str(records), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert out.count("wrote") == 5 and "pareto.pdf" in out   # + fid-vs-sparsity, psad-gates (from defaults)
