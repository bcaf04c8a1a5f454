import dataclasses
import json

import pytest

from bench.plan import table_cells, unique_specs
from bench.records import RunSpec, make_record, write_record
from bench.registry import TABLES, UnknownNameError
from bench.render import (
    PAPER_ONLY_NOTE,
    EmptyRenderError,
    TableSpecError,
    expand_chain,
    load_spec,
    parse_spec,
    render,
    render_from_records,
)

BASELINES = ("slimgpt", "magnitude", "llm-pruner", "oba", "taylor", "evar")


def chains(t, world="tiny"):
    """The chains (as written in the spec) of every row that runs in ``world``."""
    return {t.chain(r, g) for r in t.rows if t.model_for(r, world) for g in t.groups}


def fake(spec, metrics, notes=(), params=None):
    return make_record(spec, metrics, {"params": params} if params else {}, {}, notes=notes)


def cells_and_specs(name, n=600):
    cells = table_cells(load_spec(name), "tiny", n=n)
    return cells, {(c.row, c.group): c.spec for c in cells}


@pytest.mark.parametrize("name", TABLES.names())
def test_every_spec_loads_plans_and_renders_with_aligned_rows(name, tmp_path):
    t = load_spec(name)
    cells = table_cells(t, "tiny")
    assert len(cells) == len(t.rows) * len(t.groups)
    for c in cells:
        assert (c.spec is None) != (c.reason is None)   # a run, or the reason it has none
    specs = unique_specs(cells)
    assert len({s.key() for s in specs}) == len(specs)
    assert all(s.world == "tiny" and s.model in ("tiny-var", "tiny-t2i") for s in specs)
    assert all(c.spec.bench == t.bench_for("tiny", t.groups[c.group]) for c in cells if c.spec is not None)
    assert set(t.benches("tiny")) <= {"shapes-c2i", "latency", "shapes-geneval", "shapes-mjhq"}
    out = render(t, "tiny", cells, {}, out_dir=tmp_path)
    lines = [ln for ln in out["md"].splitlines() if ln.startswith("|")]
    assert len(lines) == 2 + len(t.rows) and len({len(ln) for ln in lines}) == 1, "ragged Markdown table"
    ncols = 1 + len(t.columns) + len(t.info_columns)
    body = [ln for ln in out["tex"].splitlines() if ln.rstrip().endswith("\\\\") and "multicolumn" not in ln]
    assert body and all(ln.count(" & ") == ncols - 1 for ln in body), "LaTeX rows with the wrong cell count"


def test_table2_chains_dense_plus_three_settings_per_method():
    expected = {()} | {c for m in BASELINES for c in (
        (f"{m}:sparsity=0.4",), (f"{m}:sparsity=0.2",), (f"{m}:sparsity=0.4", "ft:epochs=1"))}
    assert chains(load_spec("evar-table2")) == expected


def test_table2_cells_resolve_defaults_and_share_the_dense_run():
    cells, specs = cells_and_specs("evar-table2")
    dense = {specs[("Dense", g)].key() for g in range(3)}
    assert len(dense) == 1
    mag = specs[("Magnitude", 0)]
    assert mag.methods == ("magnitude:norm=l2,schedule=uniform,scope=coupled,sparsity=0.4",)
    assert mag.requested["methods"] == ["magnitude:sparsity=0.4"] and mag.method_versions == {"magnitude": 1}
    assert set(mag.ckpt) == {"tiny_var.safetensors", "tiny_vqvae.safetensors"} and mag.protocol["version"] == 2
    ft = specs[("Magnitude", 2)]
    assert ft.methods[1].startswith("ft:batch=64,epochs=1.0,")
    assert not [c for c in cells if c.reason], "every method of Table 2 is implemented: every cell has a run"
    evar = specs[("EVAR", 0)]
    assert evar.methods[0].startswith("evar:") and "calib=pyramid" in evar.methods[0] and evar.method_versions == {"evar": 1}


def test_table1_chains_skip_paper_only_and_missing_models():
    t = load_spec("evar-table1")
    assert chains(t) == {(), ("evar:sparsity=0.2", "psad"), ("evar:sparsity=0.4", "psad")}
    paper = {(t.model_for(r, "paper"), t.chain(r, g)) for r in t.rows if t.model_for(r, "paper") for g in t.groups}
    assert ("var-d20", ()) in paper and ("var-d24", ("fastvar",)) in paper and len(paper) == 8


def test_table3_and_table4_chains():
    assert chains(load_spec("evar-table3")) == {(), ("evar:sparsity=0.4",)} | {
        (f"evar:calib={c},sparsity=0.4",) for c in ("first", "fifth", "last", "concat")}
    p = "evar:sparsity=0.4"
    assert chains(load_spec("evar-table4")) == {(p,), (p, "ft"), (p, "kd"), (p, "psad"), (p, "psad:weighting=exp-increase"),
                                                (p, "psad:weighting=linear-increase"), (p, "psad:weighting=exp-decay")}


def test_shared_numbers_agree_across_tables():
    # EVAR 40% training-free: Table 2 cell = Table 3 pyramid row = Table 4 starting point (58.21).
    t2, t3, t4 = (load_spec(f"evar-table{i}") for i in (2, 3, 4))
    assert t2.paper["EVAR"]["tf40_fid"] == t3.paper["Pyramid-Aware Accumulation (Ours)"]["fid"] \
        == t4.paper["Pruned (Training-free)"]["fid"] == 58.21
    assert t2.paper["Magnitude"]["tf40_fid"] == 180.82


def test_expand_chain_merges_parameters():
    assert expand_chain(["{method}:sparsity=0.4", "ft:epochs=1"], "evar:calib=first") == (
        "evar:calib=first,sparsity=0.4", "ft:epochs=1")
    with pytest.raises(TableSpecError, match="both set"):
        expand_chain(["{method}:sparsity=0.4"], "evar:sparsity=0.2")


def test_render_fills_exactly_the_cells_with_records(tmp_path):
    cells, specs = cells_and_specs("evar-table2")
    mag, dense = specs[("Magnitude", 0)], specs[("Dense", 0)]
    recs = [fake(mag, {"fid": {"value": 12.3456, "stderr": 0.5}, "is": 7.0},
                 notes=["magnitude: L2 norm over each head / channel group"]),
            fake(dense, {"fid": 3.0, "is": 20.0})]
    found = {r["run_id"]: r for r in recs}
    out = render("evar-table2", "tiny", cells, found, row_notes={"OBA": "oba: not implemented yet"}, out_dir=tmp_path)

    rows = {r["label"]: r for r in out["json"]["rows"]}
    cell = rows["Magnitude"]["cells"]["tf40_fid"]
    assert cell["ours"] == 12.3456 and cell["paper"] == 180.82 and cell["text"] == "12.35 ± 0.50 / 180.82"
    assert rows["Magnitude"]["cells"]["tf40_is"]["text"] == "7.00 / 3.90"
    assert rows["Magnitude"]["cells"]["tf20_fid"] == {
        "ours": None, "stderr": None, "paper": 152.29, "text": "/ 152.29", "tex": "/ 152.29",
        "run_id": None, "source": None, "methods": ["magnitude:norm=l2,schedule=uniform,scope=coupled,sparsity=0.2"]}
    assert [rows["Dense"]["cells"][c]["text"] for c in ("tf40_fid", "tf20_is", "ft40_fid")] == \
        ["3.00 / 3.55", "20.00 / 274.40", "3.00 / 3.55"]  # one dense run fills every group
    filled = [(r["label"], c) for r in out["json"]["rows"] for c, v in r["cells"].items() if v["ours"] is not None]
    assert sorted(filled) == sorted([("Magnitude", "tf40_fid"), ("Magnitude", "tf40_is")]
                                    + [("Dense", c) for c in rows["Dense"]["cells"]])
    assert out["json"]["measured_cells"] == len(filled)

    notes = {f["text"]: f["mark"] for f in out["json"]["footnotes"]}
    assert notes["magnitude: L2 norm over each head / channel group"] in rows["Magnitude"]["footnotes"]
    assert notes["oba: not implemented yet"] in rows["OBA"]["footnotes"]
    md = out["md"]
    assert "12.35 ± 0.50 / 180.82" in md and "/ 58.21" in md and "40% TF FID ↓" in md and "IS ↑" in md
    footer = md.strip().splitlines()[-1]
    commit = recs[0]["env"]["git_commit"][:12]
    for part in ("world tiny", "model tiny-var", "bench shapes-c2i", "n 600", f"git {commit}"):
        assert part in footer

    tex = out["tex"]
    for cmd in (r"\toprule", r"\midrule", r"\bottomrule", r"\cmidrule(lr){2-3}", r"FID $\downarrow$"):
        assert cmd in tex
    assert r"12.35\,$\pm$\,0.50 / 180.82" in tex and r"40\% sparse (training-free)" in tex

    files = {p.suffix: p for p in (tmp_path / "tiny").iterdir()}
    assert set(files) == {".md", ".tex", ".json"} and all(p.stem == "evar-table2" for p in files.values())
    assert files[".md"].read_text() == md and files[".tex"].read_text() == tex
    assert json.loads(files[".json"].read_text()) == out["json"]


def test_table1_paper_only_rows_have_a_footnote(tmp_path):
    cells = table_cells(load_spec("evar-table1"), "tiny")
    out = render("evar-table1", "tiny", cells, {}, out_dir=tmp_path, formats=("md",))
    rows = {r["label"]: r for r in out["json"]["rows"]}
    notes = {f["mark"]: f["text"] for f in out["json"]["footnotes"]}
    for label in ("LlamaGen-L", "AiM-L", "CoDe (N=8)"):
        assert rows[label]["status"] == "paper-only"
        assert [notes[m] for m in rows[label]["footnotes"]] == [PAPER_ONLY_NOTE]
    assert rows["VAR-d20"]["status"] == "no-model" and "var-d20" in notes[rows["VAR-d20"]["footnotes"][0]]
    assert rows["LlamaGen-L"]["cells"]["fid"]["text"] == "/ 3.07" and "| Type" in out["md"]
    assert [p.name for p in (tmp_path / "tiny").iterdir()] == ["evar-table1.md"]


def test_params_are_scaled_to_millions(tmp_path):
    cells, specs = cells_and_specs("evar-table3")
    rec = fake(specs[(load_spec("evar-table3").rows[0].label, 0)], {"fid": 3.5}, params=1_312_768)
    out = render("evar-table3", "tiny", cells, {rec["run_id"]: rec}, out_dir=tmp_path, formats=("json",))
    assert out["json"]["rows"][0]["cells"]["params"]["text"] == "1.313 / 310"


def test_render_from_records_reads_the_results_tree_without_checkpoints(tmp_path, monkeypatch):
    cells, specs = cells_and_specs("evar-table2")
    rec = fake(specs[("Magnitude", 0)], {"fid": 40.0, "is": 9.0})
    write_record(RunSpec.from_record(rec).path(tmp_path / "results"), rec)
    out = render_from_records("evar-table2", "tiny", root=tmp_path / "results", out_dir=tmp_path / "out", n=600)
    assert "40.00 / 180.82" in out["md"]
    # the same records render where the checkpoints are absent (results synced from another machine)
    monkeypatch.setenv("VARBENCH_TINY_DIR", str(tmp_path / "nowhere"))
    (tmp_path / "nowhere").mkdir()
    import shutil

    from bench.resources import resource_dir
    shutil.copy(resource_dir("assets/tiny") / "feature_cnn.safetensors", tmp_path / "nowhere")
    out = render_from_records("evar-table2", "tiny", root=tmp_path / "results", out_dir=tmp_path / "out", n=600)
    assert "40.00 / 180.82" in out["md"]


def test_an_empty_render_does_not_replace_a_table_with_cells(tmp_path):
    cells, specs = cells_and_specs("evar-table2")
    rec = fake(specs[("Dense", 0)], {"fid": 3.0, "is": 20.0})
    render("evar-table2", "tiny", cells, {rec["run_id"]: rec}, out_dir=tmp_path)
    before = (tmp_path / "tiny" / "evar-table2.md").read_text()
    with pytest.raises(EmptyRenderError, match="--force") as e:
        render("evar-table2", "tiny", cells, {}, out_dir=tmp_path)
    assert "tiny-var dense @ shapes-c2i n=600" in str(e.value)
    assert (tmp_path / "tiny" / "evar-table2.md").read_text() == before
    render("evar-table2", "tiny", cells, {}, out_dir=tmp_path, force=True)
    assert (tmp_path / "tiny" / "evar-table2.md").read_text() != before


def test_relative_columns_are_derived_from_the_reference_row(tmp_path):
    spec = parse_spec({
        "title": "t", "model": {"tiny": "tiny-var"}, "bench": {"tiny": "shapes-c2i"},
        "groups": [{"columns": [{"id": "lat", "metric": "latency_ms_per_image"},
                                {"id": "speed", "metric": "latency_ms_per_image", "relative": "speedup"},
                                {"id": "dfid", "metric": "fid", "relative": "delta"},
                                {"id": "pr", "metric": "params", "relative": "ratio"}]}],
        "rows": [{"label": "Dense", "methods": []}, {"label": "Mag", "method": "magnitude:sparsity=0.2"}]}, "toy")
    assert spec.reference_row == "Dense"
    cols = {c.id: c for c in spec.columns}
    assert cols["speed"].better == "higher" and cols["dfid"].better == "lower" and "×" in cols["speed"].header
    cells = table_cells(spec, "tiny")
    sp = {c.row: c.spec for c in cells}
    recs = [make_record(sp["Dense"], {"fid": 2.0}, {"latency_ms_per_image": 10.0, "params": 1000}, {}),
            make_record(sp["Mag"], {"fid": 5.5}, {"latency_ms_per_image": 4.0, "params": 640}, {})]
    out = render(spec, "tiny", cells, {r["run_id"]: r for r in recs}, out_dir=tmp_path, formats=("json",))
    mag = out["json"]["rows"][1]["cells"]
    assert mag["lat"]["ours"] == 4.0 and mag["speed"]["ours"] == pytest.approx(2.5)
    assert mag["dfid"]["ours"] == pytest.approx(3.5) and mag["pr"]["ours"] == pytest.approx(0.64)
    dense = out["json"]["rows"][0]["cells"]
    assert dense["speed"]["ours"] == pytest.approx(1.0) and dense["dfid"]["ours"] == 0.0
    # a derived value carries no error bar (none is propagated); the measured column keeps its own
    recs[0]["metrics"]["fid"]["stderr"], recs[1]["metrics"]["fid"]["stderr"] = 0.25, 0.5
    out = render(spec, "tiny", cells, {r["run_id"]: r for r in recs}, out_dir=tmp_path, formats=("json",))
    assert out["json"]["rows"][1]["cells"]["dfid"]["stderr"] is None and out["json"]["rows"][0]["footnotes"] == []
    # without the reference measurement, a relative cell stays empty and says why, on the rows it derives
    # only (the unmeasured reference row has nothing to derive, hence no mark)
    out = render(spec, "tiny", cells, {recs[1]["run_id"]: recs[1]}, out_dir=tmp_path, formats=("json",))
    dense, mag = out["json"]["rows"]
    assert {k: c["ours"] for k, c in mag["cells"].items()} == {"lat": 4.0, "speed": None, "dfid": None, "pr": None}
    texts = {f["mark"]: f["text"] for f in out["json"]["footnotes"]}
    assert sorted(texts[i] for i in mag["footnotes"] if "magnitude" not in texts[i]) == sorted(
        f"{h}: no reference value (Dense not measured)" for h in (cols["speed"].header, cols["dfid"].header,
                                                                 cols["pr"].header))
    assert dense["footnotes"] == []
    # a zero makes a ratio undefined only where it divides: speed-up = ref / ours, ratio = ours / ref
    zero = [make_record(sp["Dense"], {"fid": 0.0}, {"latency_ms_per_image": 0.0, "params": 1000}, {}),
            make_record(sp["Mag"], {"fid": 5.5}, {"latency_ms_per_image": 0.0, "params": 0}, {})]
    out = render(spec, "tiny", cells, {r["run_id"]: r for r in zero}, out_dir=tmp_path, formats=("json",))
    dense, mag = out["json"]["rows"]
    assert {k: c["ours"] for k, c in mag["cells"].items()} == {"lat": 0.0, "speed": None, "dfid": 5.5, "pr": 0.0}
    texts = {f["mark"]: f["text"] for f in out["json"]["footnotes"]}
    derived = lambda row: [texts[i] for i in row["footnotes"] if "magnitude" not in texts[i]]   # noqa: E731
    assert derived(mag) == derived(dense) == [f"{cols['speed'].header}: undefined (this row's value is 0)"]
    zero[0]["cost"].update(latency_ms_per_image=10.0, params=0)
    zero[1]["cost"]["latency_ms_per_image"] = 4.0
    out = render(spec, "tiny", cells, {r["run_id"]: r for r in zero}, out_dir=tmp_path, formats=("json",))
    dense, mag = out["json"]["rows"]
    assert {k: c["ours"] for k, c in mag["cells"].items()} == {"lat": 4.0, "speed": 2.5, "dfid": 5.5, "pr": None}
    texts = {f["mark"]: f["text"] for f in out["json"]["footnotes"]}
    assert derived(mag) == derived(dense) == [f"{cols['pr'].header}: undefined (Dense's value is 0)"]
    zero[0]["cost"]["latency_ms_per_image"] = 0.0   # the reference's zero does not divide in a speed-up: 0 / 4
    out = render(spec, "tiny", cells, {r["run_id"]: r for r in zero}, out_dir=tmp_path, formats=("json",))
    assert out["json"]["rows"][1]["cells"]["speed"]["ours"] == 0.0
    zero[0]["cost"]["params"] = 1000       # the row's own zero does not divide in a ratio: 0 / 1000
    out = render(spec, "tiny", cells, {r["run_id"]: r for r in zero}, out_dir=tmp_path, formats=("json",))
    assert out["json"]["rows"][1]["cells"]["pr"]["ours"] == 0.0 and derived(out["json"]["rows"][1]) == []


def test_a_row_may_name_its_own_reference(tmp_path):
    """Two models in one table (Infinity and HART in FastVAR's): each method row against its own dense row."""
    spec = parse_spec({
        "title": "t", "model": {"tiny": "tiny-var"}, "bench": {"tiny": "shapes-c2i"},
        "groups": [{"columns": [{"id": "speed", "metric": "latency_ms_per_image", "relative": "speedup"}]}],
        "rows": [{"label": "A", "methods": []}, {"label": "A+m", "method": "magnitude:sparsity=0.2"},
                 {"label": "B", "methods": ["magnitude:sparsity=0.4"], "reference": "B"},
                 {"label": "B+m", "methods": ["magnitude:sparsity=0.4", "ft:epochs=1"], "reference": "B"}]}, "toy")
    cells = table_cells(spec, "tiny")
    sp = {c.row: c.spec for c in cells}
    lat = {"A": 10.0, "A+m": 5.0, "B": 8.0, "B+m": 2.0}
    recs = [make_record(sp[k], {}, {"latency_ms_per_image": v}, {}) for k, v in lat.items()]
    out = render(spec, "tiny", cells, {r["run_id"]: r for r in recs}, out_dir=tmp_path, formats=("json",))
    got = {r["label"]: r["cells"]["speed"]["ours"] for r in out["json"]["rows"]}
    assert got == pytest.approx({"A": 1.0, "A+m": 2.0, "B": 1.0, "B+m": 4.0})
    out = render(spec, "tiny", cells, {r["run_id"]: r for r in recs if r["run_id"] != recs[2]["run_id"]},
                 out_dir=tmp_path, formats=("json",))
    assert out["json"]["rows"][3]["cells"]["speed"]["ours"] is None
    assert any("no reference value (B not measured)" in f["text"] for f in out["json"]["footnotes"])
    with pytest.raises(TableSpecError, match="row 'B': reference 'C' is not a row label"):
        parse_spec({"title": "t", "model": {"tiny": "tiny-var"}, "bench": {"tiny": "shapes-c2i"},
                    "groups": [{"columns": [{"id": "f", "metric": "fid"}]}],
                    "rows": [{"label": "A", "methods": []}, {"label": "B", "methods": [], "reference": "C"}]}, "x")


def test_unknown_table_and_bad_specs_are_clear_errors():
    with pytest.raises(UnknownNameError, match="did you mean 'evar-table2'"):
        load_spec("evar-tabel2")
    with pytest.raises(KeyError, match="unknown rows"):
        render("evar-table2", "tiny", [], {}, row_notes={"Magnitud": "typo"}, formats=("md",))
    good = {"title": "t", "model": {"tiny": "tiny-var"}, "bench": {"tiny": "shapes-c2i"},
            "groups": [{"columns": [{"id": "fid", "metric": "fid"}]}], "rows": [{"label": "A", "method": "evar"}]}
    parse_spec(good, "x")
    for bad, msg in (({**good, "colums": []}, "unknown keys"),
                     ({**good, "paper": {"B": {"fid": 1.0}}}, "unknown row 'B'"),
                     ({**good, "paper": {"A": {"is": 1.0}}}, "unknown columns"),
                     ({**good, "rows": [{"label": "A"}]}, "exactly one of"),
                     ({**good, "groups": [{"setting": "s", "columns": []}]}, "unknown setting"),
                     ({**good, "groups": [{"columns": [{"id": "f", "metric": "fdi"}]}]}, "did you mean 'fid'"),
                     ({**good, "groups": [{"columns": [{"id": "f", "metric": "fid", "relative": "speedup"}]}]},
                      "reference_row"),
                     ({**good, "reference_row": "Z"}, "not a row label")):
        with pytest.raises(TableSpecError, match=msg):
            parse_spec(bad, "x")


def test_a_stale_record_is_not_shown_and_its_cell_says_why(tmp_path):
    import dataclasses

    from bench.plan import match_records
    cells, specs = cells_and_specs("evar-table2")
    mag = specs[("Magnitude", 0)]
    old = fake(dataclasses.replace(mag, method_versions={"magnitude": 0}), {"fid": 9.0, "is": 1.0})
    other_request = fake(dataclasses.replace(mag, method_versions={"magnitude": 0}, sampling={**mag.sampling, "cfg": 3.0},
                                             requested={"methods": mag.requested["methods"], "sampling": {"cfg": 3.0}}),
                         {"fid": 8.0})
    records = {r["run_id"]: r for r in (old, other_request)}
    found, stale = match_records([mag], records)
    assert found == {} and [r["run_id"] for r in stale[mag.key()]] == [old["run_id"]]
    out = render("evar-table2", "tiny", cells, found, stale, out_dir=tmp_path, formats=("json",))
    row = next(r for r in out["json"]["rows"] if r["label"] == "Magnitude")
    assert row["cells"]["tf40_fid"]["ours"] is None
    notes = {f["mark"]: f["text"] for f in out["json"]["footnotes"]}
    assert any("stale record" in notes[m] and "magnitude v0→v1" in notes[m] for m in row["footnotes"])


def _toy(rows, world_params=None):
    d = {"title": "t", "model": {"tiny": "tiny-var", "paper": "var-d16"}, "bench": {"tiny": "shapes-c2i", "paper": "imagenet256"},
         "settings": {"s": ["{method}", "ft"], "one": ["{method}", "ft:epochs=2"]},
         "groups": [{"setting": "s", "columns": [{"id": "fid", "metric": "fid"}]},
                    {"setting": "one", "columns": [{"id": "fid1", "metric": "fid"}]}],
         "rows": rows}
    if world_params:
        d["world_params"] = world_params
    return parse_spec(d, "toy")


def test_world_params_set_a_per_world_schedule_unless_the_chain_sets_it(tmp_path):
    spec = _toy([{"label": "Mag", "method": "magnitude:sparsity=0.2"}],
                {"paper": {"ft": {"epochs": 40}}, "tiny": {"ft": {"epochs": 3}}})
    row = spec.rows[0]
    s, one = spec.groups
    assert spec.chain(row, s, "tiny") == ("magnitude:sparsity=0.2", "ft:epochs=3")
    assert spec.chain(row, s, "paper") == ("magnitude:sparsity=0.2", "ft:epochs=40")
    assert spec.chain(row, one, "tiny") == ("magnitude:sparsity=0.2", "ft:epochs=2")   # the chain's own value wins
    cells = table_cells(spec, "tiny")
    assert cells[0].spec.requested["methods"] == ["magnitude:sparsity=0.2", "ft:epochs=3"]
    out = render(spec, "tiny", cells, {}, out_dir=tmp_path, formats=("json", "md"))
    assert "Schedule in the tiny world: ft: epochs=3 (paper world: ft: epochs=40)." in out["md"]
    with pytest.raises(TableSpecError, match="world_params"):
        _toy([{"label": "Mag", "method": "magnitude"}], {"tiny": {"ft": {"epoch": 3}}})
    with pytest.raises(TableSpecError, match="world_params"):
        _toy([{"label": "Mag", "method": "magnitude"}], {"moon": {"ft": {"epochs": 3}}})


def test_a_row_whose_method_varbench_lacks_is_an_empty_cell_that_says_so():
    spec = _toy([{"label": "X", "method": "nope:sparsity=0.2"}, {"label": "Y", "methods": ["magnitude", "zz", "nope"]},
                 {"label": "M", "method": "magnitude"}])
    cells = table_cells(spec, "tiny")
    assert [(c.row, c.group, c.reason) for c in cells if c.spec is None] == [
        ("X", 0, "not computed: method(s) nope not implemented in varbench yet"),
        ("X", 1, "not computed: method(s) nope not implemented in varbench yet"),
        ("Y", 0, "not computed: method(s) nope, zz not implemented in varbench yet"),
        ("Y", 1, "not computed: method(s) nope, zz not implemented in varbench yet")]
    assert [(c.row, c.spec.n, c.spec.bench) for c in cells if c.spec] == [("M", 600, "shapes-c2i")] * 2   # the bench's n


def test_kendall_tau_per_column_against_the_paper(tmp_path):
    from scipy.stats import kendalltau
    labels = ["Dense", "A", "B", "C", "D"]
    rows = [{"label": "Dense", "methods": [], "rank": False}] + \
           [{"label": x, "method": f"magnitude:sparsity=0.{i + 1}"} for i, x in enumerate(labels[1:])]
    spec = _toy(rows)
    paper = {"Dense": 1.0, "A": 10.0, "B": 20.0, "C": 30.0, "D": 40.0}
    ours = {"Dense": 99.0, "A": 1.5, "B": 1.2, "C": 3.0, "D": 4.0}       # A/B swapped; Dense unranked
    spec = dataclasses.replace(spec, paper={k: {"fid": v, "fid1": v} for k, v in paper.items()})
    cells = table_cells(spec, "tiny")
    recs = {}
    for c in cells:
        if c.group == 0:
            r = make_record(c.spec, {"fid": ours[c.row]}, {}, {})
            recs[r["run_id"]] = r
    out = render(spec, "tiny", cells, recs, out_dir=tmp_path, formats=("json", "md", "tex"))
    k = out["json"]["kendall"]
    want = kendalltau([1.5, 1.2, 3.0, 4.0], [10, 20, 30, 40]).statistic
    assert k["fid"] == {"tau": pytest.approx(want), "n": 4} and want == pytest.approx(2 / 3)
    assert k["fid1"] == {"tau": None, "n": 0}                       # no measured cells: undefined
    assert f"{want:.2f} (n=4)" in out["md"] and "Kendall $\\tau$ vs paper" in out["tex"]
    md_rows = [ln for ln in out["md"].splitlines() if ln.startswith("|")]
    assert len({len(ln) for ln in md_rows}) == 1 and md_rows[-1].startswith("| Kendall τ vs paper")
    # two ranked rows are the fewest that order anything (τ = ±1); one is too few (undefined)
    for kept, tau in ((("A", "B"), -1.0), (("C", "D"), 1.0), (("D",), None)):
        some = {k: r for k, r in recs.items() if any(c.spec.key() == k and c.row in kept for c in cells)}
        k = render(spec, "tiny", cells, some, out_dir=tmp_path, formats=("json",))["json"]["kendall"]
        assert k["fid"] == {"tau": tau, "n": len(kept)}


def test_weight_free_accounting_fills_params_anywhere_and_a_run_record_wins(tmp_path, capsys):
    """`table --weight-free` measures params/FLOPs on the meta device (no checkpoints or data) and
    writes accounting records that are not runs; cells use them only without a run record."""
    from bench.cli import main
    from bench.records import load_accounting, record_paths
    res, out = tmp_path / "res", tmp_path / "out"
    assert main(["table", "evar-table3", "--weight-free", "--results", str(res), "--out", str(out),
                 "--format", "json"]) == 0
    table = json.loads(capsys.readouterr().out)
    rows = {r["label"]: r["cells"] for r in table["rows"]}
    assert rows["Dense Baseline"]["params"]["ours"] == pytest.approx(2.874968)      # tiny-var, millions
    # evar at 40% on tiny-var: 2 of 6 heads and 307 of 768 FFN channels leave each of the 4 blocks
    removed = 4 * (2 * 32 * 4 * 192 + 2 * 2 * 32 + 2 + 307 * (2 * 192 + 1))
    assert rows["Last scale only"]["params"]["ours"] == pytest.approx((2874968 - removed) / 1e6)
    assert rows["Last scale only"]["params"]["source"] == "accounting" and rows["Last scale only"]["fid"]["ours"] is None
    assert table["measured_cells"] == 0 and any("weight-free accounting" in f["text"] for f in table["footnotes"])
    assert len(load_accounting(res, "tiny")) == 6 and record_paths(res) == []          # not runs
    # accounting cells are not measured ones: the same command again, or --no-run, renders the same table
    first = (out / "tiny" / "evar-table3.json").read_text(encoding="utf-8")
    for again in (["--weight-free"], ["--no-run"]):
        assert main(["table", "evar-table3", *again, "--results", str(res), "--out", str(out), "--format", "json"]) == 0
        assert json.loads(capsys.readouterr().out)["rows"] == table["rows"]
        assert json.loads((out / "tiny" / "evar-table3.json").read_text(encoding="utf-8"))["rows"] == json.loads(first)["rows"]
    # a run record of the dense cell wins over its accounting
    cells = table_cells(load_spec("evar-table3"), "tiny")
    dense = next(c.spec for c in cells if c.row == "Dense Baseline")
    write_record(dense.path(res), make_record(dense, {"fid": 1.5}, {"params": 3_000_000}, {}))
    out_t = render_from_records("evar-table3", "tiny", root=res, out_dir=out, formats=("json",))["json"]
    d = next(r for r in out_t["rows"] if r["label"] == "Dense Baseline")["cells"]
    assert d["params"]["ours"] == pytest.approx(3.0) and d["params"]["source"] == "run" and d["fid"]["ours"] == 1.5


def _two_bench_spec(**latency_group):
    return parse_spec({
        "title": "t", "model": {"tiny": "tiny-var", "paper": "var-d16"}, "bench": {"tiny": "shapes-c2i", "paper": "imagenet256"},
        "groups": [{"columns": [{"id": "fid", "metric": "fid"}, {"id": "dfid", "metric": "fid", "relative": "delta"}]},
                   {"columns": [{"id": "speed", "metric": "latency_ms", "relative": "speedup"}], **latency_group}],
        "rows": [{"label": "Dense", "methods": []}, {"label": "Mag", "method": "magnitude:sparsity=0.2"}]}, "toy")


def test_a_column_group_with_its_own_bench_n_and_setting(tmp_path):
    """Quality and latency side by side: the latency group's cells are latency runs with the group's
    n (not the table's --n) and per-world setting; relative columns compare within the group."""
    spec = _two_bench_spec(bench={"tiny": "latency", "paper": "latency"}, n={"tiny": 5},
                           bench_args={"tiny": {"batch": 16, "threads": 1}, "paper": {"device": "cuda"}})
    assert spec.benches("tiny") == ["shapes-c2i", "latency"]
    cells = table_cells(spec, "tiny", n=120)
    by = {(c.row, c.group): c.spec for c in cells}
    assert by[("Dense", 0)].bench == "shapes-c2i" and by[("Dense", 0)].n == 120
    lat = by[("Mag", 1)]
    assert lat.bench == "latency" and lat.n == 5 and lat.protocol["batch"] == 16 and lat.protocol["threads"] == 1
    paper = {c.row: c.spec for c in table_cells(spec, "paper", need_ckpt=False) if c.group == 1}
    assert paper["Mag"].protocol["device"] == "cuda" and paper["Mag"].n == 10   # the latency bench's default n
    recs = [make_record(by[("Dense", 0)], {"fid": 2.0}, {}, {}), make_record(by[("Mag", 0)], {"fid": 3.0}, {}, {}),
            make_record(by[("Dense", 1)], {"latency_ms": {"value": 90.0}}, {}, {}),
            make_record(by[("Mag", 1)], {"latency_ms": {"value": 60.0}}, {}, {})]
    out = render(spec, "tiny", cells, {r["run_id"]: r for r in recs}, out_dir=tmp_path, formats=("json", "md"))
    mag = out["json"]["rows"][1]["cells"]
    assert mag["dfid"]["ours"] == pytest.approx(1.0) and mag["speed"]["ours"] == pytest.approx(1.5)
    assert "bench shapes-c2i + latency" in out["md"]
    # a speed-up is a ratio within one measurement run: records of two runs give no cell, and say why
    for groups, speed in ((("g1", "g1"), 1.5), (("g1", "g2"), None), ((None, "g2"), None)):
        lat = [make_record(by[(row, 1)], {"latency_ms": {"value": v, **({"group": g} if g else {})}}, {}, {})
               for row, v, g in (("Dense", 90.0, groups[0]), ("Mag", 60.0, groups[1]))]
        out = render(spec, "tiny", cells, {r["run_id"]: r for r in recs[:2] + lat}, out_dir=tmp_path, formats=("json",))
        rows = out["json"]["rows"]
        assert rows[1]["cells"]["speed"]["ours"] == (None if speed is None else pytest.approx(speed))
        assert rows[0]["cells"]["speed"]["ours"] == pytest.approx(1.0)      # the reference against itself
        assert rows[1]["cells"]["dfid"]["ours"] == pytest.approx(1.0)       # other columns unaffected
        said = [f["text"] for f in out["json"]["footnotes"] if "not timed in the same run" in f["text"]]
        assert said == ([] if speed is not None else [
            "Latency (ms) ×: not timed in the same run as Dense (a ratio of medians is taken within one measurement "
            "run); `varbench table toy` times them together"])
    # without its own bench a group runs the table's bench
    assert {c.spec.bench for c in table_cells(_two_bench_spec(), "tiny")} == {"shapes-c2i"}
    for bad, msg in (({"bench_args": {"batch": 16}}, "world"), ({"bench_args": {"tiny": 16}}, "mapping"),
                     ({"n": [5]}, "mapping")):
        with pytest.raises(TableSpecError, match=msg):
            _two_bench_spec(**bad)


def test_the_table_command_times_a_tables_latency_cells_together(tmp_path, monkeypatch):
    """Speed-ups are ratios measured in one run: the latency cells of one setting go to one
    ``run_latency`` call (alternated); the quality cells run one by one."""
    import bench.latency
    import bench.runner
    from bench.cli import main
    timed, ran = [], []
    monkeypatch.setattr(bench.latency, "run_latency", lambda specs, **kw: timed.append([s.label() for s in specs]))
    monkeypatch.setattr(bench.runner, "run", lambda spec, **kw: ran.append(spec.label()))
    monkeypatch.setattr(bench.runner, "preflight", lambda spec, root: None)
    main(["table", "stepvar-table1", "--results", str(tmp_path / "r"), "--out", str(tmp_path / "o"), "--quiet"])
    assert len(timed) == 1 and len(timed[0]) == 4 and all("@ latency" in t for t in timed[0])
    assert len(ran) == 4 and all("@ shapes-c2i" in r for r in ran)


def test_a_column_may_show_another_metric_per_world(tmp_path):
    """metric/header per world: the tiny world's stand-in category beside the paper's."""
    spec = parse_spec({
        "title": "t", "model": {"paper": "infinity-2b", "tiny": "tiny-t2i"},
        "bench": {"paper": "mjhq30k", "tiny": "shapes-mjhq"}, "groups": [{"columns": [
            {"id": "cat", "metric": {"paper": "fid_people", "tiny": "fid_position"},
             "header": {"tiny": "position FID"}, "format": "{:.2f}"},
            {"id": "d", "metric": {"paper": "fid_people", "tiny": "fid_position"}, "relative": "delta"}]}],
        "rows": [{"label": "Dense", "methods": []}, {"label": "S", "method": "stepvar"}],
        "paper": {"Dense": {"cat": 30.61}}}, "x")
    assert spec.in_world("paper").columns[0].header == "FID people"
    assert spec.in_world("tiny").columns[0].header == "position FID"
    assert spec.in_world("tiny").columns[1].header.startswith("FID position")
    cells = table_cells(spec, "tiny", n=12)
    dense, st = (c.spec for c in cells)
    found = {r["run_id"]: r for r in (fake(dense, {"fid_position": 3.0, "fid_people": 99.0}),
                                      fake(st, {"fid_position": 4.5}))}
    out = render(spec, "tiny", cells, found, out_dir=tmp_path)
    rows = {r["label"]: r for r in out["json"]["rows"]}
    assert rows["Dense"]["cells"]["cat"]["text"] == "3.00 / 30.61"
    assert rows["S"]["cells"]["d"]["ours"] == pytest.approx(1.5)
    assert "position FID" in out["md"] and "FID people" not in out["md"]
    for bad, msg in ((dict(metric={"tiny": "fid_position", "paper": "geneval"}), "same direction"),
                     (dict(metric="fid", header={"tiny": "x"}), "needs a metric per world"),
                     (dict(metric={"moon": "fid"}), "moon")):
        with pytest.raises(TableSpecError, match=msg):
            parse_spec({"title": "t", "model": {"tiny": "tiny-t2i"}, "bench": {"tiny": "shapes-mjhq"},
                        "groups": [{"columns": [{"id": "c", **bad}]}], "rows": [{"label": "D", "methods": []}]}, "x")


def test_a_row_may_run_another_method_per_world():
    spec = parse_spec({
        "title": "t", "model": {"paper": "infinity-2b", "tiny": "tiny-t2i"},
        "bench": {"paper": "geneval", "tiny": "shapes-geneval"}, "groups": [{"columns": [{"id": "g", "metric": "geneval"}]}],
        "rows": [{"label": "D", "methods": []},
                 {"label": "K", "method": {"paper": "lazyvar:keep=0.4/0.2/0.1/0.02", "tiny": "lazyvar:keep=0.4/0.2/0.1"}}]},
        "x")
    row = spec.row("K")
    assert spec.chain(row, spec.groups[0], "tiny") == ("lazyvar:keep=0.4/0.2/0.1",)
    assert spec.chain(row, spec.groups[0], "paper") == ("lazyvar:keep=0.4/0.2/0.1/0.02",)
    spec_k = next(c.spec for c in table_cells(spec, "tiny", n=8) if c.row == "K")
    assert spec_k.requested["methods"] == ["lazyvar:keep=0.4/0.2/0.1"]
    with pytest.raises(TableSpecError, match="moon"):
        parse_spec({"title": "t", "model": {"tiny": "tiny-t2i"}, "bench": {"tiny": "shapes-geneval"},
                    "groups": [{"columns": [{"id": "g", "metric": "geneval"}]}],
                    "rows": [{"label": "K", "method": {"moon": "lazyvar"}}]}, "x")


def test_cells_that_round_to_zero_carry_no_sign():
    from bench.render import _fmt
    assert _fmt(-0.001, "{:.2f}") == "0.00" and _fmt(-0.0, None) == "0" and _fmt(-0.004, "{:.1%}") == "-0.4%"
    assert _fmt(-0.01, "{:.2f}") == "-0.01" and _fmt(-1e-9, "{:.2e}") == "-1.00e-09" and _fmt(-0.0004, "{:.1%}") == "0.0%"
    assert _fmt(None, "{:.2f}") == "" and _fmt("n/a", "{:.2f}") == "n/a"


def test_weight_free_counts_are_shared_by_the_benches_of_one_model_and_chain(tmp_path, monkeypatch):
    """A table asks for the same model and chain on several benches: the meta-device count runs once."""
    from bench import runner
    from bench.plan import make_spec
    calls = []
    real = runner.model_cost
    monkeypatch.setattr(runner, "model_cost", lambda gen, sampling: calls.append(1) or real(gen, sampling))
    monkeypatch.setattr(runner, "_COSTS", {})
    a = runner.account(make_spec("tiny-var", "magnitude:sparsity=0.2", bench="shapes-c2i", need_ckpt=False), tmp_path)
    b = runner.account(make_spec("tiny-var", "magnitude:sparsity=0.2", bench="latency", need_ckpt=False), tmp_path)
    assert len(calls) == 1 and a["cost"] == b["cost"]
    c = runner.account(make_spec("tiny-var", "magnitude:sparsity=0.4", bench="latency", need_ckpt=False), tmp_path)
    assert len(calls) == 2 and c["cost"]["params"] < a["cost"]["params"]


def test_a_cell_takes_only_a_number_from_its_record():
    """metrics first, then cost; a bool, a text or a null value is no measurement (the cell stays empty)."""
    from bench.render import _measure
    rec = {"metrics": {"fid": {"value": 2.5, "stderr": 0.1}, "ok": True, "note": {"value": "n/a"},
                       "gone": {"value": None}, "params": 7},
           "cost": {"params": 9, "flops": 3.0e9, "flag": False}}
    assert _measure(rec, "fid") == (2.5, 0.1) and _measure(rec, "params") == (7, None)
    assert _measure(rec, "flops") == (3.0e9, None)
    for metric in ("ok", "note", "gone", "flag", "absent"):
        assert _measure(rec, metric) is None, metric
