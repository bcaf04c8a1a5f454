"""`varbench leaderboard` from synthetic records written by the real record writer.

The records (module fixture): on shapes-c2i, dense (n=120 and n=240), magnitude at 0.4 and at 0.2
(two seeds: FID in both, IS in seed 0 only), taylor without FID, and a stale slimgpt record (method
version 0) that must not show; on the latency bench, two timed chains on the CPU.
"""
import dataclasses
import json
import re
import subprocess
import sys
from html.parser import HTMLParser

import pytest

from bench.cli import main
from bench.plan import make_spec
from bench.records import make_record, write_record

DENSE = "dense"
MAG4 = "magnitude:norm=l2,schedule=uniform,scope=coupled,sparsity=0.4"
MAG2 = "magnitude:norm=l2,schedule=uniform,scope=coupled,sparsity=0.2"
TAYLOR = "taylor:batch=16,n_calib=128,reduce=square-sum,schedule=uniform,sparsity=0.4"
# what the Methods column shows: the chain as requested (the resolved chain above is the row's identity)
LABEL = {DENSE: "dense", MAG4: "magnitude:sparsity=0.4", MAG2: "magnitude:sparsity=0.2", TAYLOR: "taylor:sparsity=0.4"}


def labels(chains):
    return [LABEL[c] for c in chains]


def _write(root, chain, metrics, cost, n=120, seed=0, bench=None, bench_args=None):
    spec = make_spec("tiny-var", chain, bench=bench, n=n, seed=seed, need_ckpt=False, bench_args=bench_args)
    write_record(spec.path(root), make_record(spec, metrics, cost, {}))
    return spec


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    _write(root, "dense", {"fid": {"value": 5.0, "stderr": 0.2}, "is": {"value": 9.0, "stderr": 0.1}},
           {"params": 1234567, "flops": 2.5e9})
    _write(root, "dense", {"fid": {"value": 4.0, "stderr": 0.1}}, {"params": 1234567}, n=240)
    _write(root, "magnitude:sparsity=0.4", {"fid": {"value": 20.0, "stderr": 1.0}, "is": 10.0},
           {"params": 800000, "flops": 1.5e9})
    _write(root, "magnitude:sparsity=0.2", {"fid": 10.0, "is": {"value": 8.0, "stderr": 0.3}}, {"params": 900000})
    _write(root, "magnitude:sparsity=0.2", {"fid": 12.0}, {"params": 900000}, seed=1)
    _write(root, "taylor:sparsity=0.4", {"is": 7.0}, {"params": 800000})
    spec = make_spec("tiny-var", "slimgpt:sparsity=0.4", n=120, need_ckpt=False)
    old = dataclasses.replace(spec, method_versions={"slimgpt": 0})      # an older method version: stale
    write_record(old.path(root), make_record(old, {"fid": 0.5, "is": 99.0}, {}, {}))
    cpu = {"device": "cpu", "batch": 1, "threads": 2}
    _write(root, "dense", {"latency_ms": {"value": 30.0, "stderr": 1.5}}, {}, n=3, bench="latency", bench_args=cpu)
    _write(root, "magnitude:sparsity=0.4", {"latency_ms": 20.0}, {}, n=3, bench="latency", bench_args=cpu)
    return root


def leaderboard(results, out, *args):
    """Run the command; returns {fmt: text} of the written files."""
    assert main(["leaderboard", "--results", str(results), "--out", str(out), *args]) == 0
    return {f: (out / "tiny" / f"leaderboard.{f}").read_text(encoding="utf-8") for f in ("md", "tex", "html", "json")}


def md_tables(md):
    """bench -> (header, rows) of each Markdown table."""
    out, bench = {}, None
    for line in md.splitlines():
        if line.startswith("## "):
            bench = line[3:].strip()
        elif line.startswith("|") and not set(line) <= set("|-: "):
            cells = [c.strip() for c in line.strip()[1:-1].split(" | ")]
            if bench not in out:
                out[bench] = (cells, [])
            else:
                out[bench][1].append(cells)
    return out


def tex_tables(tex):
    """bench -> (header, rows) of each LaTeX table (cells between \\toprule and \\bottomrule)."""
    out = {}
    for block in tex.split("\\begin{table}")[1:]:
        bench = block.split("bench ", 1)[1].split(".", 1)[0]
        lines = [ln.rstrip()[:-2] for ln in block.split("\\toprule", 1)[1].split("\\bottomrule", 1)[0].splitlines()
                 if ln.rstrip().endswith("\\\\")]
        cells = [[c.strip() for c in re.split(r"(?<!\\)&", ln)] for ln in lines]     # an escaped \& is text
        out[bench] = (cells[0], cells[1:])
    return out


class _Tables(HTMLParser):
    """bench -> {"head": [(col, attrs)], "rows": [[(text, data-value)]]} of each table.lb."""

    def __init__(self):
        super().__init__()
        self.tables, self.cur, self.cell, self.attrs = {}, None, None, None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and "lb" in (a.get("class") or ""):
            self.cur = self.tables.setdefault(a["data-bench"], {"head": [], "rows": []})
        elif self.cur is not None and tag == "tr":
            self.cur["rows"].append([])
        elif self.cur is not None and tag in ("td", "th"):
            self.cell, self.attrs = [], a

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)

    def handle_endtag(self, tag):
        if self.cur is not None and tag in ("td", "th"):
            text = "".join(self.cell).strip()
            if tag == "th":
                self.cur["head"].append((text, self.attrs))
            else:
                self.cur["rows"][-1].append((text, self.attrs.get("data-value")))
            self.cell = None
        elif tag == "table":
            self.cur = None


def html_tables(html):
    p = _Tables()
    p.feed(html)
    for t in p.tables.values():
        t["rows"] = [r for r in t["rows"] if r]          # the header row holds th cells only
    return p.tables


def column(table, name):
    header, rows = table
    i = next(i for i, h in enumerate(header) if h.split(" ")[0] == name or h.startswith(name))
    return [r[i] for r in rows]


@pytest.fixture(scope="module")
def board(results, tmp_path_factory):
    return leaderboard(results, tmp_path_factory.mktemp("out"))


def test_rows_follow_the_primary_metric_in_md_tex_html_and_json(board):
    order = [DENSE, DENSE, MAG2, MAG4, TAYLOR]          # FID 4.0 (n=240), 5.0, 11.0, 20.0, none
    md = md_tables(board["md"])["shapes-c2i"]
    assert column(md, "Methods") == labels(order) and column(md, "n") == ["240", "120", "120", "120", "120"]
    assert column(md, "#") == ["1", "2", "3", "4", ""]                          # no FID: no rank
    assert [m.replace("\\_", "_") for m in column(tex_tables(board["tex"])["shapes-c2i"], "Methods")] == labels(order)
    h = html_tables(board["html"])["shapes-c2i"]
    i = [t for t, _ in h["head"]].index("Methods")
    assert [r[i][0] for r in h["rows"]] == labels(order)
    assert re.findall(r'<td class="txt chain"[^>]*title="([^"]*)"', board["html"])[-5:] == order   # tooltips
    j = json.loads(board["json"])
    assert [r["chain"] for r in j["benches"][1]["rows"]] == order and j["benches"][1]["sort"]["metric"] == "fid"
    assert [r["methods"] for r in j["benches"][1]["rows"]] == [[] if c == DENSE else [c] for c in order]
    assert "Sorted by FID ↓ (the bench's primary metric; lower is better, best first)" in board["md"]


def test_error_bars_are_shown_and_missing_cells_stay_empty(board):
    md = md_tables(board["md"])["shapes-c2i"]
    tex = tex_tables(board["tex"])["shapes-c2i"]
    assert column(md, "FID")[:2] == ["4.00 ± 0.10", "5.00 ± 0.20"]
    assert column(tex, "FID")[1] == "5.00\\,$\\pm$\\,0.20"
    assert column(md, "FID")[4] == column(tex, "FID")[4] == ""                  # taylor: no FID recorded
    assert column(md, "FLOPs") == ["", "2.5e+09", "", "1.5e+09", ""]           # only two records have FLOPs
    assert column(md, "Params")[2] == "900,000"                                  # equal over seeds: no ± 0
    h = html_tables(board["html"])["shapes-c2i"]
    fid = [t for t, _ in h["head"]].index("FID ↓")
    assert [r[fid] for r in h["rows"]][3:] == [("20.00 ± 1.00", "20.0"), ("", "")]


def test_a_missing_metric_keeps_the_row_and_is_never_averaged_in(board):
    md = md_tables(board["md"])["shapes-c2i"]
    row = dict(zip(md[0], md[1][2]))                                               # magnitude 0.2, seeds 0 and 1
    assert row["Seeds"] == "0, 1"
    assert row["FID ↓"] == "11.00 ± 1.00"                    # mean of 10 and 12; sd/sqrt(2) = 1
    assert row["IS ↑"] == "8.00 ± 0.30 [1/2]"                # seed 0 only: its own value and stderr, flagged
    assert column(md, "IS")[4] == "7.00"                     # taylor's row stays without FID
    assert "[k/K]: mean over the k of the row's K seeds" in board["md"]


def test_other_n_is_another_row_and_seeds_are_one(board):
    j = json.loads(board["json"])["benches"][1]["rows"]
    assert [(r["chain"], r["n"], r["seeds"]) for r in j][:3] == [(DENSE, 240, [0]), (DENSE, 120, [0]), (MAG2, 120, [0, 1])]
    assert len(j[2]["run_ids"]) == 2


def test_stale_records_are_left_out_and_counted(board):
    for fmt in ("md", "tex", "html", "json"):
        assert "slimgpt" not in board[fmt] and "99.00" not in board[fmt]
    assert "1 stale record not shown" in board["md"] and "varbench runs --stale" in board["md"]
    assert json.loads(board["json"])["stale"] == 1


def test_sort_follows_the_metric_direction(results, tmp_path):
    out = leaderboard(results, tmp_path, "--sort", "is")                        # IS: higher is better
    md = md_tables(out["md"])["shapes-c2i"]
    assert column(md, "Methods") == labels([MAG4, DENSE, MAG2, TAYLOR, DENSE])  # IS 10, 9, 8, 7, none (n=240)
    assert column(md, "#") == ["1", "2", "3", "4", ""]
    assert "Sorted by IS ↑ (--sort; higher is better, best first)" in out["md"]
    lat = md_tables(out["md"])["latency"]                                        # no IS there: its primary metric
    assert column(lat, "Methods") == labels([MAG4, DENSE]) and "--sort is: latency has no is values" in out["md"]
    h = html_tables(out["html"])["shapes-c2i"]["head"]
    attrs = {t: a for t, a in h}
    assert (attrs["FID ↓"]["data-best"], attrs["IS ↑"]["data-best"]) == ("ascending", "descending")
    assert (attrs["FID ↓"]["aria-sort"], attrs["IS ↑"]["aria-sort"]) == ("none", "descending")


def test_each_bench_has_its_table_metrics_and_setting(board):
    tables = md_tables(board["md"])
    assert list(tables) == ["latency", "shapes-c2i"]
    header, rows = tables["latency"]
    assert header[:7] == ["#", "Model", "Methods", "Setting", "n", "Seeds", "Latency (ms) ↓"]
    assert [r[2] for r in rows] == labels([MAG4, DENSE]) and rows[1][6] == "30.0 ± 1.5"
    assert rows[0][3].startswith("device=cpu, batch=1, threads=2")
    assert "Setting" not in tables["shapes-c2i"][0] and "KID ↓" not in tables["shapes-c2i"][0]   # no KID recorded
    # the quality table's latency: the latency bench's medians joined on model + resolved chain (dense: n=120
    # and n=240 rows both), never a run's own sampling time; the caption names the setting
    md = tables["shapes-c2i"]
    assert column(md, "Latency (ms)") == ["30.0 ± 1.5", "30.0 ± 1.5", "", "20.0", ""]
    assert "ms / image" not in board["md"]
    assert "the `latency` bench's median for the same model and chain (device=cpu, batch=1, threads=2" in board["md"]


def test_md_and_tex_rows_are_as_wide_as_their_header(board):
    for tables in (md_tables(board["md"]), tex_tables(board["tex"])):
        for header, rows in tables.values():
            assert rows and all(len(r) == len(header) for r in rows)
    for section in board["md"].split("\n## ")[1:]:
        lines = [ln for ln in section.splitlines() if ln.startswith("|")]
        assert lines and len({len(ln) for ln in lines}) == 1, "ragged Markdown table"
    assert board["tex"].count("\\toprule") == board["tex"].count("\\bottomrule") == 2


def test_html_is_one_self_contained_page_with_a_section_per_bench(board):
    html = board["html"]
    for external in ("http://", "https://", "<link", " src=", "@import"):
        assert external not in html
    assert html.count("<section") == 2 and "<style>" in html and "addEventListener(\"click\"" in html
    assert "lower is better, best first" in html.split("<caption>", 2)[2].split("</caption>")[0]


def test_no_records_unknown_world_and_bad_sort_are_clear_messages(results, tmp_path, capsys):
    assert main(["leaderboard", "--results", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "no records of the tiny world under" in err and "varbench run" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()                                         # nothing written
    with pytest.raises(SystemExit) as e:
        main(["leaderboard", "--world", "nope"])
    assert e.value.code == 2 and "invalid choice: 'nope'" in capsys.readouterr().err
    assert main(["leaderboard", "--results", str(results), "--out", str(tmp_path / "o"), "--sort", "fdi"]) == 2
    assert "did you mean 'fid'" in capsys.readouterr().err
    assert main(["leaderboard", "--results", str(results), "--out", str(tmp_path / "o"), "--world", "paper"]) == 2
    err = capsys.readouterr().err
    assert "no records of the paper world" in err and "`varbench run --model var-d16 --method magnitude`" in err
    assert "`varbench table evar-table2 --world paper`" in err and "tiny-var" not in err   # a command of that world


def test_only_stale_records_say_so(tmp_path, capsys):
    spec = make_spec("tiny-var", "magnitude", n=120, need_ckpt=False)
    old = dataclasses.replace(spec, method_versions={"magnitude": 0})
    write_record(old.path(tmp_path), make_record(old, {"fid": 1.0}, {}, {}))
    assert main(["leaderboard", "--results", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "all 1 records of the tiny world" in capsys.readouterr().err


def test_the_command_imports_no_torch(results, tmp_path):
    code = ("import sys; from bench.cli import main; "
            f"rc = main(['leaderboard', '--results', {str(results)!r}, '--out', {str(tmp_path)!r}]); "
            "assert rc == 0, rc; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=60)
    assert sorted(p.name for p in (tmp_path / "tiny").iterdir()) == [
        "leaderboard.html", "leaderboard.json", "leaderboard.md", "leaderboard.tex"]   # no temporary files left


def _row(model, chain, n, value=None, metric="fid"):
    return {"model": model, "chain": chain, "n": n, "values": {} if value is None else {metric: {"value": value}}}


def test_ranks_share_ties_skip_after_them_and_ties_keep_a_stated_order():
    """Competition ranking (1, 1, 3), best first by the metric's direction; equal values ordered by model,
    chain and n whatever order the records came in; rows without the metric last and unranked."""
    from bench.leaderboard import _sort
    made = [_row("b", "x", 10, 2.0), _row("a", "z", 10, 1.0), _row("a", "y", 20), _row("a", "y", 10, 2.0),
            _row("a", "x", 10, 3.0), _row("a", "a", 10)]
    for order in (made, made[::-1]):
        rows = [dict(r) for r in order]
        _sort(rows, "fid")                               # lower is better
        assert [(r["model"], r["chain"], r["n"], r["rank"]) for r in rows] == [
            ("a", "z", 10, 1), ("a", "y", 10, 2), ("b", "x", 10, 2), ("a", "x", 10, 4), ("a", "a", 10, None),
            ("a", "y", 20, None)]
    rows = [_row("a", "p", 1, 7.0, "is"), _row("a", "q", 1, 9.0, "is"), _row("a", "r", 1, 9.0, "is")]
    _sort(rows, "is")                                    # higher is better
    assert [(r["chain"], r["rank"]) for r in rows] == [("q", 1), ("r", 1), ("p", 3)]
    rows = [_row("b", "x", 1, 1.0), _row("a", "x", 1, 5.0)]
    _sort(rows, None)                                    # nothing to rank by: the stated order, no ranks
    assert [(r["model"], r["rank"]) for r in rows] == [("a", None), ("b", None)]


def test_the_primary_metric_is_the_first_present_one_with_a_direction():
    from bench.leaderboard import _primary
    assert _primary(["fid", "is", "precision"], ["is", "precision"]) == "is"
    assert _primary(["fid", "is"], ["fid", "is"]) == "fid"
    assert _primary(["fid", "is"], ["params"]) is None


def test_seeds_of_one_row_give_a_mean_and_a_standard_error_across_them():
    """k ≥ 2 seeds: mean ± sd/√k (sample sd); equal values give no error bar; one seed keeps its record's."""
    import math

    import pandas as pd

    from bench.leaderboard import _aggregate
    base = {"model": "m", "methods_list": [], "methods": "dense", "label": "dense", "setting": "", "n": 12}
    frame = pd.DataFrame([{**base, "group": "g1", "seed": 0, "run_id": "a", "fid": 1.0, "fid.stderr": 0.3},
                          {**base, "group": "g1", "seed": 1, "run_id": "b", "fid": 1.6, "fid.stderr": 0.3},
                          {**base, "group": "g2", "seed": 0, "run_id": "c", "fid": 2.0, "fid.stderr": 0.25},
                          {**base, "group": "g3", "seed": 0, "run_id": "d", "fid": 4.0, "fid.stderr": None},
                          {**base, "group": "g3", "seed": 1, "run_id": "e", "fid": 4.0, "fid.stderr": None}])
    g1, g2, g3 = _aggregate(frame, ["fid", "is"])
    assert g1["values"]["fid"] == {"value": pytest.approx(1.3), "stderr": pytest.approx(0.6 / math.sqrt(2) / math.sqrt(2)),
                                   "k": 2}
    assert g1["seeds"] == [0, 1] and g1["run_ids"] == ["a", "b"] and "is" not in g1["values"]
    assert g2["values"]["fid"] == {"value": 2.0, "stderr": 0.25, "k": 1}
    assert g3["values"]["fid"] == {"value": 4.0, "stderr": None, "k": 2}


def test_the_footer_and_each_bench_name_the_commits_their_records_came_from(tmp_path):
    import copy

    from bench.leaderboard import build
    from bench.records import load_records
    spec = make_spec("tiny-var", "dense", n=120, need_ckpt=False)
    rec = make_record(spec, {"fid": 5.0}, {"params": 1}, {})
    spec2 = make_spec("tiny-var", "magnitude:sparsity=0.4", n=120, need_ckpt=False)
    rec2 = make_record(spec2, {"fid": 6.0}, {"params": 1}, {})
    rec["env"].update(git_commit="a" * 40, git_dirty=False)
    rec2["env"].update(git_commit="b" * 40, git_dirty=False)
    write_record(spec.path(tmp_path), rec)
    write_record(spec2.path(tmp_path), rec2)
    board = build(load_records(tmp_path), "tiny")
    (b,) = board["benches"]
    assert b["git_commits"] == ["a" * 40, "b" * 40] and b["git_dirty"] is False
    assert f"records from git {'a' * 12}, {'b' * 12} · rendered at git" in board["footer"]
    rec2 = copy.deepcopy(rec2)
    rec2["env"].update(git_commit="unknown", git_dirty=True)     # an installed copy built without git, dirty
    write_record(spec2.path(tmp_path), rec2)
    board = build(load_records(tmp_path), "tiny")
    assert board["benches"][0]["git_commits"] == ["a" * 40, "unknown"] and board["benches"][0]["git_dirty"] is True
    assert f"records from git {'a' * 12}, unknown (uncommitted changes) · rendered" in board["footer"]


def test_the_records_frame_has_one_row_per_record_with_what_runs_and_the_board_read(tmp_path):
    """The frame behind `varbench runs` and the board: identity, chain text, provenance, staleness, and one
    column (+ .stderr) per catalog metric or cost that holds a number."""
    from bench.leaderboard import records_frame
    spec = make_spec("tiny-var", "magnitude:sparsity=0.4 + ft:epochs=1", n=120, need_ckpt=False)
    rec = make_record(spec, {"fid": {"value": 5.0, "stderr": 0.5}, "my_score": 3.0},
                      {"params": 10, "flops": {"value": 2.0e9, "stderr": 1.0e7}}, {})
    rec["metrics"]["is"] = {"value": "n/a"}     # not a number (the record reader refuses it; the frame skips it)
    del rec["env"]["git_commit"]
    stale_spec = dataclasses.replace(make_spec("tiny-var", "slimgpt:sparsity=0.4", n=120, need_ckpt=False),
                                     method_versions={"slimgpt": 0})
    stale = make_record(stale_spec, {"fid": 1.0}, {}, {})
    frame = records_frame({"r/a.json": rec, "r/b.json": stale}).set_index("path")
    a, b = frame.loc["r/a.json"], frame.loc["r/b.json"]
    assert a["world"] == "tiny" and a["created"] == rec["created"] and a["run_id"] == spec.key()
    assert a["methods"] == " + ".join(spec.methods) and a["methods_list"] == list(spec.methods)
    assert a["label"] == "magnitude:sparsity=0.4 + ft:epochs=1"
    assert a["git_commit"] == "unknown" and not a["stale"] and a["why"] in ("", None)
    assert (a["fid"], a["fid.stderr"]) == (5.0, 0.5) and (a["flops"], a["flops.stderr"]) == (2.0e9, 1.0e7)
    assert a["params"] == 10 and pd_isna(a["params.stderr"])
    assert "my_score" not in frame and pd_isna(a.get("is"))          # not in the catalog / not a number
    assert b["stale"] and "slimgpt v0" in b["why"] and b["label"] == "slimgpt:sparsity=0.4"


def pd_isna(v):
    import pandas as pd
    return v is None or bool(pd.isna(v))


def test_fidelity_runs_show_their_fidelity_metrics_and_sort_by_them(tmp_path):
    """A --fidelity run adds FID*, PSNR and SSIM to the bench's metrics: they are columns (after the bench's
    own, before the costs) and --sort takes them."""
    root = tmp_path / "results"
    fid = {"fidelity": True}
    _write(root, "magnitude:sparsity=0.4", {"fid": 20.0, "fid_star": {"value": 3.0, "stderr": None},
                                            "psnr": {"value": 18.5, "stderr": 0.5}, "ssim": 0.61}, {"params": 800000},
           bench_args=fid)
    _write(root, "magnitude:sparsity=0.2", {"fid": 10.0, "fid_star": 1.0, "psnr": 24.0, "ssim": 0.8},
           {"params": 900000}, bench_args=fid)
    _write(root, "dense", {"fid": 5.0}, {"params": 1234567})
    md = md_tables(leaderboard(root, tmp_path / "a", "--sort", "psnr")["md"])["shapes-c2i"]
    assert md[0][3] == "Setting" and md[0][6:11] == ["FID ↓", "FID* ↓", "PSNR ↑", "SSIM ↑", "Params"]
    assert column(md, "Methods") == labels([MAG2, MAG4, DENSE])                   # PSNR 24.0, 18.5, none
    assert column(md, "PSNR") == ["24.00", "18.50 ± 0.50", ""]
    md = md_tables(leaderboard(root, tmp_path / "b", "--sort", "fid_star")["md"])["shapes-c2i"]
    assert column(md, "FID*") == ["1.00", "3.00", ""]
