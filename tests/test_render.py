import json

import pytest

from bench.records import RunSpec, make_record, write_record
from bench.registry import UnknownNameError
from bench.render import (
    PAPER_ONLY_NOTE,
    TableSpecError,
    expand_chain,
    load_spec,
    parse_spec,
    render,
    render_all,
)

TABLES = ("evar-table1", "evar-table2", "evar-table3", "evar-table4")
BASELINES = ("slimgpt", "magnitude", "llm-pruner", "oba", "taylor", "evar")


def chains(runs):
    return {r.methods for r in runs}


def tiny(methods, n=1000, seed=0, **kw):
    return RunSpec("tiny", "tiny-var", tuple(methods), "shapes-c2i", n, seed, kw.pop("sampling", {}))


def fake(spec, metrics, notes=(), params=None):
    return make_record(spec, metrics, {"params": params} if params else {}, {}, notes=notes)


@pytest.mark.parametrize("name", TABLES)
def test_every_spec_loads_and_plans_tiny_runs(name):
    t = load_spec(name)
    runs = t.runs("tiny", n=64)
    assert runs and len({r.key() for r in runs}) == len(runs)
    assert {(r.world, r.model, r.bench, r.n, r.seed) for r in runs} == {("tiny", "tiny-var", "shapes-c2i", 64, 0)}
    assert all(r.n == 50000 for r in t.runs("paper"))  # the paper protocol's n is in the spec
    with pytest.raises(TableSpecError, match="pass n="):
        t.runs("tiny")  # the tiny n comes from the bench default, passed in


def test_table2_runs_dense_plus_three_settings_per_method():
    runs = load_spec("evar-table2").runs("tiny", n=1000)
    expected = {()} | {c for m in BASELINES for c in (
        (f"{m}:sparsity=0.4",), (f"{m}:sparsity=0.2",), (f"{m}:sparsity=0.4", "ft:epochs=1"))}
    assert chains(runs) == expected and len(runs) == 1 + 3 * len(BASELINES)


def test_table1_runs_skip_paper_only_and_missing_models():
    t = load_spec("evar-table1")
    assert chains(t.runs("tiny", n=10)) == {(), ("evar:sparsity=0.2", "psad"), ("evar:sparsity=0.4", "psad")}
    paper = {(r.model, r.methods) for r in t.runs("paper")}
    assert ("var-d20", ()) in paper and ("var-d24", ("fastvar",)) in paper and len(paper) == 8
    assert not any("llamagen" in m.lower() for _, ms in paper for m in ms)


def test_table3_and_table4_runs():
    t3 = chains(load_spec("evar-table3").runs("tiny", n=10))
    assert t3 == {(), ("evar:sparsity=0.4",)} | {(f"evar:calib={c},sparsity=0.4",)
                                                  for c in ("first", "fifth", "last", "concat")}
    t4 = chains(load_spec("evar-table4").runs("tiny", n=10))
    p = "evar:sparsity=0.4"
    assert t4 == {(p,), (p, "ft"), (p, "kd"), (p, "psad"), (p, "psad:weighting=exp-increase"),
                  (p, "psad:weighting=linear-increase"), (p, "psad:weighting=exp-decay")}


def test_shared_runs_and_numbers_agree_across_tables():
    # EVAR 40% training-free: Table 2 cell = Table 3 pyramid row = Table 4 starting point (58.21).
    t2, t3, t4 = (load_spec(f"evar-table{i}") for i in (2, 3, 4))
    assert t2.paper["EVAR"]["tf40_fid"] == t3.paper["Pyramid-Aware Accumulation (Ours)"]["fid"] \
        == t4.paper["Pruned (Training-free)"]["fid"] == 58.21
    assert t2.paper["Magnitude"]["tf40_fid"] == 180.82
    key = tiny(["evar:sparsity=0.4"]).key()
    assert all(key in {r.key() for r in t.runs("tiny", n=1000)} for t in (t2, t3, t4))


def test_expand_chain_merges_parameters():
    assert expand_chain(["{method}:sparsity=0.4", "ft:epochs=1"], "evar:calib=first") == (
        "evar:calib=first,sparsity=0.4", "ft:epochs=1")
    with pytest.raises(TableSpecError, match="both set"):
        expand_chain(["{method}:sparsity=0.4"], "evar:sparsity=0.2")


def test_render_fills_exactly_the_cells_with_records(tmp_path):
    t = load_spec("evar-table2")
    recs = [fake(tiny(["magnitude:sparsity=0.4"]), {"fid": {"value": 12.3456, "stderr": 0.5}, "is": 7.0},
                 notes=["magnitude: L2 norm over each head / channel group"]),
            fake(tiny([]), {"fid": 3.0, "is": 20.0}),
            fake(RunSpec("paper", "var-d16", ("magnitude:sparsity=0.4",), "imagenet256", 50000, 0, {}),
                 {"fid": 99.0})]  # another world: ignored
    records = {r["run_id"]: r for r in recs}
    out = render(t, "tiny", records, row_notes={"OBA": "oba: not implemented yet"}, out_dir=tmp_path)

    rows = {r["label"]: r for r in out["json"]["rows"]}
    cell = rows["Magnitude"]["cells"]["tf40_fid"]
    assert cell["ours"] == 12.3456 and cell["paper"] == 180.82 and cell["text"] == "12.35 ± 0.50 / 180.82"
    assert rows["Magnitude"]["cells"]["tf40_is"]["text"] == "7.00 / 3.90"
    assert rows["Magnitude"]["cells"]["tf20_fid"] == {
        "ours": None, "stderr": None, "paper": 152.29, "text": "/ 152.29", "tex": "/ 152.29",
        "run_id": None, "methods": ["magnitude:sparsity=0.2"]}
    assert [rows["Dense"]["cells"][c]["text"] for c in ("tf40_fid", "tf20_is", "ft40_fid")] == \
        ["3.00 / 3.55", "20.00 / 274.40", "3.00 / 3.55"]  # one dense run fills every group (paper: EVAR Tab. 1 dense)
    filled = [(r["label"], c) for r in out["json"]["rows"] for c, v in r["cells"].items() if v["ours"] is not None]
    assert sorted(filled) == sorted([("Magnitude", "tf40_fid"), ("Magnitude", "tf40_is")]
                                    + [("Dense", c) for c in rows["Dense"]["cells"]])

    notes = {f["text"]: f["mark"] for f in out["json"]["footnotes"]}
    assert notes["magnitude: L2 norm over each head / channel group"] in rows["Magnitude"]["footnotes"]
    assert notes["oba: not implemented yet"] in rows["OBA"]["footnotes"]
    md = out["md"]
    assert "12.35 ± 0.50 / 180.82" in md and "/ 58.21" in md and "40% TF FID ↓" in md and "IS ↑" in md
    assert f"[{notes['oba: not implemented yet']}] oba: not implemented yet" in md
    footer = md.strip().splitlines()[-1]
    commit = recs[0]["env"]["git_commit"][:12]
    for part in ("world tiny", "model tiny-var", "bench shapes-c2i", "n 1000", f"git {commit}"):
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
    out = render("evar-table1", "tiny", {}, out_dir=tmp_path, formats=("md",))
    rows = {r["label"]: r for r in out["json"]["rows"]}
    notes = {f["mark"]: f["text"] for f in out["json"]["footnotes"]}
    for label in ("LlamaGen-L", "AiM-L", "CoDe (N=8)"):
        assert rows[label]["status"] == "paper-only"
        assert [notes[m] for m in rows[label]["footnotes"]] == [PAPER_ONLY_NOTE]
    assert rows["VAR-d20"]["status"] == "no-model" and "var-d20" in notes[rows["VAR-d20"]["footnotes"][0]]
    assert rows["LlamaGen-L"]["cells"]["fid"]["text"] == "/ 3.07" and "| Type" in out["md"]
    assert [p.name for p in (tmp_path / "tiny").iterdir()] == ["evar-table1.md"]


def test_several_matching_records_pick_the_largest_n_or_the_requested_one(tmp_path):
    small = fake(tiny([], n=100), {"fid": 9.0})
    big = fake(tiny([], n=1000), {"fid": 5.0})
    records = {r["run_id"]: r for r in (small, big)}
    out = render("evar-table3", "tiny", records, out_dir=tmp_path)
    dense = out["json"]["rows"][0]
    assert dense["cells"]["fid"]["ours"] == 5.0
    assert any("2 records match" in f["text"] for f in out["json"]["footnotes"])
    out = render("evar-table3", "tiny", records, out_dir=tmp_path, n=100)
    assert out["json"]["rows"][0]["cells"]["fid"]["ours"] == 9.0 and out["json"]["n"] == [100]


def test_params_are_scaled_to_millions(tmp_path):
    rec = fake(tiny([]), {"fid": 3.5}, params=1_312_768)
    out = render("evar-table3", "tiny", {rec["run_id"]: rec}, out_dir=tmp_path, formats=())
    assert out["json"]["rows"][0]["cells"]["params"]["text"] == "1.313 / 310"


def test_render_all_reads_the_results_tree(tmp_path):
    rec = fake(tiny(["evar:sparsity=0.4"]), {"fid": 40.0, "is": 9.0})
    write_record(RunSpec.from_record(rec).path(tmp_path / "results"), rec)
    out = render_all("tiny", root=tmp_path / "results", out_dir=tmp_path / "out",
                     names=["evar-table2", "evar-table3"])
    assert "40.00 / 58.21" in out["evar-table2"]["md"] and "40.00 / 58.21" in out["evar-table3"]["md"]
    assert (tmp_path / "out" / "tiny" / "evar-table3.tex").is_file()


def test_unknown_table_and_bad_specs_are_clear_errors():
    with pytest.raises(UnknownNameError, match="did you mean 'evar-table2'"):
        load_spec("evar-tabel2")
    with pytest.raises(KeyError, match="unknown rows"):
        render("evar-table2", "tiny", {}, row_notes={"Magnitud": "typo"}, formats=())
    good = {"title": "t", "model": {"tiny": "tiny-var"}, "bench": {"tiny": "shapes-c2i"},
            "groups": [{"columns": [{"id": "fid", "metric": "fid"}]}], "rows": [{"label": "A", "method": "evar"}]}
    parse_spec(good, "x")
    for bad, msg in (({**good, "colums": []}, "unknown keys"),
                     ({**good, "paper": {"B": {"fid": 1.0}}}, "unknown row 'B'"),
                     ({**good, "paper": {"A": {"is": 1.0}}}, "unknown columns"),
                     ({**good, "rows": [{"label": "A"}]}, "exactly one of"),
                     ({**good, "groups": [{"setting": "s", "columns": []}]}, "unknown setting")):
        with pytest.raises(TableSpecError, match=msg):
            parse_spec(bad, "x")
