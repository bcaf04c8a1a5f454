"""Figure specs: every malformed spec is refused when it is loaded, with a message that names the
file, the key and what is allowed (never a KeyError or a blank figure later); unknown figures
suggest the closest names; a spec without the requested world says which key to add."""
import pytest

import bench.figures as figures
from bench.figures import EmptyFigureError, FigureSpecError, figure, gate_schedules, load_figure, sweep_series

KNOWN = ("calibration, fid-vs-sparsity, pareto, pareto-latency, psad-gates, recovery, scale-latency, "
         "token-keep-ratio")
SWEEP = "title: t\nkind: sweep\nmodel: {tiny: tiny-var}\nbench: {tiny: shapes-c2i}\n"
SWEEP_X = SWEEP + "x: {method_param: sparsity}\ny: fid\n"   # a complete sweep spec


@pytest.fixture
def figs(tmp_path, monkeypatch):
    """Write specs into a figures folder of their own: ``figs(name=text, …)`` -> that folder."""
    folder = tmp_path / "figs"
    folder.mkdir()
    monkeypatch.setattr(figures, "figures_dir", lambda: folder)

    def write(**specs):
        for name, text in specs.items():
            (folder / f"{name}.yaml").write_text(text, encoding="utf-8")
        return folder
    return write


def _refused(name):
    with pytest.raises(FigureSpecError) as e:
        load_figure(name)
    return str(e.value)


def test_unknown_figures_suggest_the_closest_and_list_all():
    assert _refused("paretto") == (f"unknown figure 'paretto'; did you mean 'pareto' or 'pareto-latency'? "
                                   f"Known figures: {KNOWN}")
    assert _refused("zzz") == f"unknown figure 'zzz'. Known figures: {KNOWN}"   # nothing close: no guess


def test_at_most_three_suggestions(figs):
    figs(**{f"a{i}": "title: t\nkind: gates\nmethod: psad\n" for i in range(5)})
    assert _refused("a") == "unknown figure 'a'; did you mean 'a4' or 'a3' or 'a2'? Known figures: a0, a1, a2, a3, a4"


def test_a_spec_is_loaded_with_its_name(figs):
    figs(ok="title: t\nkind: gates\nmethod: psad\n")
    assert load_figure("ok") == {"title": "t", "kind": "gates", "method": "psad", "name": "ok"}


@pytest.mark.parametrize("text, got", [("title: t\nkind: bars\n", "'bars'"), ("title: t\n", "None"), ("", "None")])
def test_an_unknown_kind_is_refused(figs, text, got):
    folder = figs(bad=text)
    assert _refused("bad") == (f"{folder / 'bad.yaml'}: kind must be one of ('pareto', 'scale_latency', 'sweep', "
                               f"'table_bars', 'gates'), got {got}")


@pytest.mark.parametrize("y, shown", [("fidd", "'fidd'; did you mean 'fid'"), (3, "'3'."), (None, "'None'.")])
@pytest.mark.parametrize("kind", ["sweep", "table_bars"])
def test_an_unknown_metric_is_refused(figs, kind, y, shown):
    body = SWEEP + "x: {method_param: sparsity}\n" if kind == "sweep" else "title: t\nkind: table_bars\ntable: evar-table3\n"
    folder = figs(bad=body + ("" if y is None else f"y: {y}\n"))
    msg = _refused("bad")
    assert msg.startswith(f"{folder / 'bad.yaml'}: y: unknown metric {shown}") and " Known metrics: " in msg
    assert "fid" in msg.split(" Known metrics: ")[1].split(", ")


@pytest.mark.parametrize("x", ["sparsity", "{label: s}", "{method_param: 3}", "{method_param: sparsity, lbl: s}",
                               "[sparsity]"])
def test_a_sweep_needs_one_method_parameter_as_x(figs, x):
    folder = figs(bad=SWEEP + f"x: {x}\ny: fid\n")
    import yaml
    assert _refused("bad") == (f"{folder / 'bad.yaml'}: x must be {{method_param: NAME}} (optionally with label:), "
                               f"got {yaml.safe_load('x: ' + x)['x']!r}")


@pytest.mark.parametrize("key, value, want", [
    ("methods", "magnitude", "a list of method names"), ("methods", "[magnitude, 3]", "a list of method names"),
    ("methods", "{magnitude: 1}", "a list of method names"),
    ("series", "'{method}'", "a list of labels such as '{method} + ft'"),
    ("series", "['{method}', 3]", "a list of labels such as '{method} + ft'")])
def test_a_sweeps_methods_and_series_are_lists_of_names(figs, key, value, want):
    import yaml
    folder = figs(bad=SWEEP_X + f"{key}: {value}\n")
    assert _refused("bad") == f"{folder / 'bad.yaml'}: {key} must be {want}, got {yaml.safe_load('v: ' + value)['v']!r}"


def test_a_sweeps_methods_must_have_the_swept_parameter(figs):
    folder = figs(bad=SWEEP_X + "methods: [evar, lazyvar]\n",
                  later=SWEEP_X + "methods: [evar, ghostvar]\n")
    assert _refused("bad") == f"{folder / 'bad.yaml'}: method lazyvar has no parameter 'sparsity'"
    assert load_figure("later")["methods"] == ["evar", "ghostvar"]   # not implemented yet: checked once it is


def test_a_sweeps_yscale_is_linear_or_log(figs):
    folder = figs(bad=SWEEP_X + "yscale: symlog\n",
                  lin=SWEEP_X + "yscale: linear\n",
                  log=SWEEP_X + "yscale: log\n")
    assert _refused("bad") == f"{folder / 'bad.yaml'}: yscale must be linear or log, got 'symlog'"
    assert load_figure("lin")["yscale"] == "linear" and load_figure("log")["yscale"] == "log"


@pytest.mark.parametrize("x", ["latency", None])
def test_a_pareto_x_is_flops_or_latency(figs, x):
    folder = figs(bad="title: t\nkind: pareto\nmodel: {tiny: tiny-var}\nbench: {tiny: shapes-c2i}\n"
                  + ("" if x is None else f"x: {x}\n"))
    assert _refused("bad") == f"{folder / 'bad.yaml'}: x must be one of ('flops', 'latency_ms'), got {x!r}"


def test_table_bars_need_a_known_table_and_one_of_its_metrics(figs):
    folder = figs(table="title: t\nkind: table_bars\ntable: evar-tabel3\ny: fid\n",
                  metric="title: t\nkind: table_bars\ntable: evar-table3\ny: clip_score\n")
    msg = _refused("table")
    assert msg.startswith(f"{folder / 'table.yaml'}: table: unknown table 'evar-tabel3'; did you mean 'evar-table3'")
    assert _refused("metric") == (f"{folder / 'metric.yaml'}: table evar-table3 has no column of metric "
                                  f"'clip_score'; its metrics: fid, params")


def test_gates_need_a_method_with_onset_and_ramp_and_a_mapping_where(figs):
    folder = figs(unknown="title: t\nkind: gates\nmethod: psda\n", none="title: t\nkind: gates\n",
                  params="title: t\nkind: gates\nmethod: ft\n",
                  where="title: t\nkind: gates\nmethod: psad\nwhere: [variant, paper]\n")
    msg = _refused("unknown")
    assert msg.startswith(f"{folder / 'unknown.yaml'}: method: unknown method 'psda'; did you mean 'psad'")
    msg = _refused("none")
    assert msg.startswith(f"{folder / 'none.yaml'}: method: unknown method 'None'") and " Known methods: dense, " in msg
    assert _refused("params") == (f"{folder / 'params.yaml'}: method ft has no parameter(s) onset, ramp; the gates "
                                  f"kind draws γ̃_i(t) from onset and ramp (methods/psad.py)")
    assert _refused("where") == f"{folder / 'where.yaml'}: where must be a mapping parameter -> value, got ['variant', 'paper']"


def test_a_spec_without_the_world_says_which_key_to_add(figs, tmp_path):
    figs(sweep=SWEEP_X,
         nobench="title: t\nkind: sweep\nmodel: {paper: var-d16, tiny: tiny-var}\nx: {method_param: sparsity}\ny: fid\n",
         gates="title: t\nkind: gates\nmodel: {tiny: tiny-var}\nmethod: psad\n")
    for name, key in (("sweep", "model"), ("gates", "model")):
        with pytest.raises(FigureSpecError) as e:
            figure(name, "paper", tmp_path / "none")
        assert str(e.value) == f"figure {name}: no {key} for the paper world (spec key {key}: {{paper: …}})"
    with pytest.raises(FigureSpecError) as e:
        sweep_series(load_figure("nobench"), {}, "paper")
    assert str(e.value) == "figure nobench: no bench for the paper world (spec key bench: {paper: …})"
    assert [s["K"] for s in gate_schedules(load_figure("gates"), {}, "tiny")] == [7]   # the tiny world's model
    assert sweep_series(load_figure("sweep"), {}, "tiny") == ([], None, [])   # found the world's model and bench
    with pytest.raises(EmptyFigureError, match="no shapes-c2i records of tiny-var with fid whose method chain"):
        figure("sweep", "tiny", tmp_path / "none")


def _empty(figs, tmp_path, text):
    figs(e=text)
    with pytest.raises(EmptyFigureError) as e:
        figure("e", "tiny", tmp_path / "none")
    return str(e.value)


def test_an_empty_sweep_says_what_it_looked_for_and_how_to_make_it(figs, tmp_path):
    where = tmp_path / "none" / "tiny"
    assert _empty(figs, tmp_path, SWEEP_X) == (
        f"figure e: no shapes-c2i records of tiny-var with fid whose method chain sets sparsity under {where} "
        f"(make them with e.g. `varbench run --model tiny-var --bench shapes-c2i --method 'evar:sparsity=…'` or "
        f"`varbench sweep`)")
    assert _empty(figs, tmp_path, SWEEP + "x: {method_param: sparsity}\ny: is\nmethods: [magnitude, taylor]\n") == (
        f"figure e: no shapes-c2i records of tiny-var with is whose method chain sets sparsity of magnitude, taylor "
        f"under {where} (make them with e.g. `varbench run --model tiny-var --bench shapes-c2i --method "
        f"'magnitude:sparsity=…'` or `varbench sweep`)")


def test_an_empty_sweep_over_a_parameter_no_method_has_says_so(figs, tmp_path):
    assert _empty(figs, tmp_path, SWEEP + "x: {method_param: keep_ratio}\ny: fid\n") == (
        f"figure e: no shapes-c2i records of tiny-var with fid whose method chain sets keep_ratio under "
        f"{tmp_path / 'none' / 'tiny'}; no registered method has a parameter 'keep_ratio'")


def test_an_empty_sweep_names_the_methods_not_implemented_and_the_series_left_out(figs, tmp_path):
    from bench.plan import make_spec
    from bench.records import make_record, write_record
    root = tmp_path / "none"
    for methods in (["magnitude:sparsity=0.2", "ft"], ["magnitude:sparsity=0.2", "kd"]):
        spec = make_spec("tiny-var", methods, bench="shapes-c2i", need_ckpt=False)
        write_record(spec.path(root), make_record(spec, {"fid": {"value": 3.0}}, {}, {"total_s": 1.0}))
    msg = _empty(figs, tmp_path, SWEEP_X + "methods: [ghostvar, magnitude, nullvar]\n"
                 "series: ['{method}']\n")
    assert msg == (f"figure e: no shapes-c2i records of tiny-var with fid whose method chain sets sparsity of ghostvar, "
                   f"magnitude, nullvar under {root / 'tiny'}; ghostvar, nullvar: not implemented in varbench yet (not "
                   f"in the method registry, see `varbench list methods`), so no run can have made such a record; 2 "
                   f"series left out (by the spec's series, or x not one number): magnitude + ft, magnitude + kd "
                   f"(make them with e.g. `varbench run --model tiny-var --bench shapes-c2i --method "
                   f"'magnitude:sparsity=…'` or `varbench sweep`)")


def test_gates_need_a_model_with_a_var_scale_schedule(figs, tmp_path):
    figs(t2i="title: t\nkind: gates\nmodel: {tiny: tiny-t2i}\nmethod: psad\n")
    with pytest.raises(FigureSpecError) as e:
        figure("t2i", "tiny", tmp_path / "none")
    assert str(e.value) == "figure t2i: model tiny-t2i has no VAR scale schedule (var_cfg.patch_nums)"
