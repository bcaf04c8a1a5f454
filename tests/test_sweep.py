"""Run matrices (bench/sweep.py, `varbench sweep`): a grid expands to the run specs `varbench run`
would make, finished cells are skipped, emitted command lines make exactly the todo cells' records,
and bad files are answered with what to write instead."""
import shlex

import pytest
import yaml

from bench import sweep
from bench.cli import build_parser, main
from bench.plan import make_spec
from bench.records import make_record, read_record, write_record
from bench.tiny.assets import ASSETS

GRID = {"world": "tiny", "models": ["tiny-var"],
        "methods": ["dense", "magnitude:sparsity=0.2", "magnitude:sparsity=0.4 + ft:epochs=0.5"],
        "benches": ["shapes-c2i"], "seeds": [0, 1], "n": 24, "sampling": {"cfg": 1.5}}


def write(tmp_path, data, name="grid.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def fake_record(spec, root):
    """A record of ``spec`` where the runner would put it, written by the real writer."""
    write_record(spec.path(root), make_record(spec, {"fid": 1.0}, {"params": 1}, {}))


def test_the_grid_expands_in_order_to_the_specs_run_would_make():
    specs, repeats = sweep.expand(sweep.parse(GRID))
    assert len(specs) == 1 * 3 * 1 * 2 and repeats == 0
    assert [(s.requested["methods"], s.seed) for s in specs[:3]] == [([], 0), ([], 1), (["magnitude:sparsity=0.2"], 0)]
    assert specs[5].key() == make_spec("tiny-var", "magnitude:sparsity=0.4 + ft:epochs=0.5", bench="shapes-c2i",
                                       n=24, seed=1, sampling={"cfg": 1.5}).key()
    # defaults: dense, the world's bench, seed 0; a chain spelled two ways is one run
    specs, repeats = sweep.expand(sweep.parse({"models": "tiny-var", "methods": ["magnitude", "magnitude:sparsity=0.4"]}))
    assert len(specs) == 1 and repeats == 1 and specs[0].bench == "shapes-c2i" and specs[0].seed == 0


def test_cells_without_checkpoints_here_match_a_record_of_any_checkpoint(tmp_path):
    """Listing a paper-world sweep on a machine without its checkpoints (``need_ckpt=False``): a cell is
    done when a record matches it on everything but the checkpoint identity (a record synced from the
    machine that ran it); unreadable files are skipped, and a missing results folder means nothing is done."""
    import dataclasses
    grid = {"world": "paper", "models": ["var-d16"], "methods": ["dense", "magnitude:sparsity=0.2", "magnitude"],
            "benches": ["imagenet256"], "seeds": [0], "n": 1000}
    specs, _ = sweep.expand(sweep.parse(grid), need_ckpt=False)
    assert [s.ckpt for s in specs] == [None] * 3
    root = tmp_path / "results"
    assert sweep.finished(specs, root) == [False, False, False]          # no results folder: no error
    with_ckpt = dataclasses.replace(specs[1], ckpt={"var_d16.pth": "ab" * 32, "vae_ch160v4096z32.pth": "cd" * 32})
    assert with_ckpt.key() != specs[1].key() and with_ckpt.path(root) != specs[1].path(root)
    assert sweep.finished([with_ckpt], root) == [False]
    fake_record(with_ckpt, root)
    (with_ckpt.path(root).parent / "broken.json").write_text("{")
    assert sweep.finished(specs, root) == [False, True, False]
    assert sweep.finished([with_ckpt, specs[1]], root) == [True, True]
    other = dataclasses.replace(with_ckpt, ckpt={"var_d16.pth": "ef" * 32, "vae_ch160v4096z32.pth": "cd" * 32})
    assert sweep.finished([other], root) == [False]     # with checkpoint identity: only its own record counts


def test_finished_cells_are_skipped_and_the_rest_run_in_order(tmp_path, monkeypatch, capsys):
    path, root = write(tmp_path, GRID), tmp_path / "results"
    specs, _ = sweep.expand(sweep.parse(GRID))
    fake_record(specs[2], root)
    assert sweep.finished(specs, root) == [False, False, True, False, False, False]

    assert main(["sweep", str(path), "--results", str(root), "--dry-run"]) == 0
    out = capsys.readouterr()
    rows = {line.split()[-2]: line.split()[-1] for line in out.out.splitlines()[1:]}
    assert rows == {s.key(): "done" if i == 2 else "todo" for i, s in enumerate(specs)}
    assert "6 cells: 1 done, 5 to run" in out.err and len(list(root.rglob("*.json"))) == 1   # ran nothing

    ran = []

    def fake_run(spec, root=None, **kw):       # the runner's contract: write the record at spec.path
        ran.append(spec.key())
        fake_record(spec, root)
    monkeypatch.setattr("bench.runner.run", fake_run)
    assert main(["sweep", str(path), "--results", str(root), "--quiet"]) == 0
    assert ran == [s.key() for i, s in enumerate(specs) if i != 2]
    assert main(["sweep", str(path), "--results", str(root), "--quiet"]) == 0     # all done: nothing runs
    assert len(ran) == 5 and "6 cells: 6 done, 0 to run" in capsys.readouterr().err
    assert main(["sweep", str(path), "--results", str(root), "--device", "foo"]) == 2   # checked though all done
    assert capsys.readouterr().err == "varbench: error: --device 'foo': must be cpu, cuda or cuda:N\n"


def test_the_commands_file_is_checked_before_the_grid_is_planned(tmp_path, capsys, monkeypatch):
    path = write(tmp_path, GRID)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sweep, "load", lambda *a, **k: pytest.fail("planned"))
    (tmp_path / "adir").mkdir()
    for out, message in [("", "--emit-commands: the path is empty; give a file name"),
                         ("adir", "--emit-commands adir is a folder; give a file name (e.g. adir/commands.txt)")]:
        assert main(["sweep", str(path), "--emit-commands", out]) == 2
        assert capsys.readouterr().err == f"varbench: error: {message}\n"


def test_emitted_commands_make_exactly_the_todo_cells(tmp_path, capsys):
    path, root = write(tmp_path, GRID), tmp_path / "results"
    specs, _ = sweep.expand(sweep.parse(GRID))
    fake_record(specs[0], root)
    fake_record(specs[4], root)
    out = tmp_path / "commands.txt"
    assert main(["sweep", str(path), "--results", str(root), "--emit-commands", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 4 and all(line.startswith("varbench run --model tiny-var") for line in lines)
    keys = []
    for line in lines:                         # each line, parsed by `varbench run`, is its cell's spec
        argv = shlex.split(line)
        args = build_parser().parse_args(argv[1:])
        assert args.func.__name__ == "cmd_run" and args.results == str(root.resolve())
        keys.append(make_spec(args.model, args.method, bench=args.bench, n=args.n, seed=args.seed,
                              world=args.world, sampling={"cfg": args.cfg}).key())
    assert keys == [s.key() for i, s in enumerate(specs) if i not in (0, 4)]
    assert "'magnitude:sparsity=0.4 + ft:epochs=0.5'" in lines[-1] and "--cfg 1.5" in lines[-1]
    assert 'sed -n "${SLURM_ARRAY_TASK_ID}p"' in capsys.readouterr().err
    assert len(list(root.rglob("*.json"))) == 2                                       # ran nothing


@pytest.mark.parametrize("change, message", [
    ({"models": ["tiny-vra"]}, "models[0]: unknown model 'tiny-vra'; did you mean 'tiny-var'"),
    ({"methods": ["dense", "magnitud:sparsity=0.2"]}, "methods[1] 'magnitud:sparsity=0.2': unknown method "
                                                       "'magnitud'; did you mean 'magnitude'?"),
    ({"benches": ["shapes-c2"]}, "benches[0]: unknown bench 'shapes-c2'; did you mean 'shapes-c2i' or 'shapes-mjhq' or 'shapes-geneval'?"),
    ({"seed": [0]}, "unknown key 'seed'; did you mean 'seeds'?"),
    ({"benches": ["latency"]}, "latency is not an image bench; run it with `varbench latency`"),
    ({"sampling": {"more_smooth": True}}, "sampling has no key 'more_smooth'. It may set cfg, top_k, top_p"),
    ({"sampling": {"cgf": 1.0}}, "sampling has no key 'cgf'; did you mean 'cfg'? It may set cfg, top_k, top_p"),
    ({"sampling": [1.5]}, "sampling must be a mapping such as `sampling: {cfg: 1.5}`, got [1.5]"),
    ({"seeds": [-1]}, "seeds[0]"),
    ({"n": 25}, "needs a positive multiple of its 12 classes"),
    ({"n": 120_000_000_000}, "--n 120000000000: shapes-c2i needs a positive multiple of its 12 classes up to 10,000,000"),
    ({"methods": ["magnitude:sparsity=2.0"]}, "cell tiny-var magnitude:sparsity=2.0 @ shapes-c2i seed 0: "
                                              "magnitude: parameter sparsity=2.0 out of range [0.0, 0.9]"),
    ({"benches": None}, "benches is empty; give at least one entry or leave the key out"),   # `benches:` alone
    ({"models": None}, "models is empty; give at least one entry or leave the key out"),
    ({"seeds": []}, "seeds is empty; give at least one entry or leave the key out"),
])
def test_bad_sweep_files_are_refused_with_the_fix(tmp_path, capsys, change, message):
    path = write(tmp_path, {**GRID, **change})
    assert main(["sweep", str(path), "--dry-run", "--results", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"varbench: error: {path}: ") and message in err, err


def test_a_bad_cell_without_benches_names_the_default_bench(tmp_path, capsys):
    grid = {k: v for k, v in GRID.items() if k != "benches"}
    path = write(tmp_path, {**grid, "methods": ["magnitude:sparsity=2.0"]})
    assert main(["sweep", str(path), "--dry-run", "--results", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err == (f"varbench: error: {path}: cell tiny-var magnitude:sparsity=2.0 @ default "
                                       f"bench seed 0: magnitude: parameter sparsity=2.0 out of range [0.0, 0.9]\n")


@pytest.mark.skipif(not (ASSETS / "tiny_var.safetensors").is_file(), reason="tiny-world checkpoints not built")
@pytest.mark.usefixtures("one_thread")
def test_a_real_sweep_writes_the_records_run_would(tmp_path, capsys):
    path, root = write(tmp_path, {"models": ["tiny-var"], "n": 12}), tmp_path / "results"
    assert main(["sweep", str(path), "--results", str(root), "--quiet"]) == 0
    spec = make_spec("tiny-var", [], n=12)
    assert read_record(spec.path(root))["run_id"] == spec.key()
    assert main(["sweep", str(path), "--results", str(root), "--dry-run"]) == 0
    assert f"{spec.key()}   done" in capsys.readouterr().out


def test_a_shipped_sweep_loads_by_name_and_an_unknown_name_lists_the_shipped_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)            # no sweeps/ folder here: the name must resolve to the shipped file
    grid = sweep.load("tiny-example")
    assert grid.models == ("tiny-var",) and grid.seeds == (0, 1)
    assert sweep.load("sweeps/tiny-example.yaml") == grid   # the docs' checkout path, from any folder
    with pytest.raises(sweep.SweepError, match="tiny-example"):
        sweep.load("tiny-exampel")
    for other in ("other/tiny-example.yaml", "sweeps/x/tiny-example.yaml", "sweeps/tiny-example.yml"):
        with pytest.raises(sweep.SweepError, match="not found; shipped sweeps"):
            sweep.load(other)


def test_a_sweep_path_that_is_not_a_yaml_file_says_what_it_is(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "bin.yaml").write_bytes(bytes(range(128, 256)))
    (tmp_path / "bad.yaml").write_text("models: [tiny-var\n")
    for path, message in [("", "the sweep file's path is empty; give a YAML file or a shipped sweep's name"),
                          (tmp_path / "d", f"sweep file {tmp_path / 'd'} is a folder; give a YAML file in it"),
                          (tmp_path / "no.yaml", f"sweep file {tmp_path / 'no.yaml'} not found; shipped sweeps (by name): "),
                          (tmp_path / "bin.yaml", f"{tmp_path / 'bin.yaml'}: not a text file, so not a sweep's YAML ("),
                          (tmp_path / "bad.yaml", f"{tmp_path / 'bad.yaml'}: not valid YAML (")]:
        with pytest.raises(sweep.SweepError) as e:
            sweep.load(path)
        assert str(e.value).startswith(message), str(e.value)


def test_the_command_says_what_it_found_and_wrote_and_plans_without_running(tmp_path, capsys, monkeypatch):
    import bench.runner
    monkeypatch.setattr(bench.runner, "run", lambda *a, **k: pytest.fail("a plan ran a cell"))
    monkeypatch.setattr(bench.runner, "preflight", lambda *a, **k: pytest.fail("a plan checked a cell"))
    grid = {**GRID, "methods": ["dense", "magnitude", "magnitude:sparsity=0.4"]}   # one chain spelled twice
    path, root = write(tmp_path, grid), tmp_path / "results"
    specs, repeats = sweep.expand(sweep.parse(grid))
    assert (len(specs), repeats) == (4, 2)
    fake_record(specs[1], root)
    assert main(["sweep", str(path), "--results", str(root), "--dry-run"]) == 0
    out = capsys.readouterr()
    assert out.err == "4 cells: 1 done, 3 to run (2 repeated an earlier cell's run)\n"
    assert len(out.out.splitlines()) == 1 + 4                      # a header and one line per cell, none wrapped
    assert out.out.splitlines()[1].split()[:2] == ["1", "tiny-var"]         # cell numbers, no frame index
    cmds = tmp_path / "c.txt"
    assert main(["sweep", str(path), "--results", str(root), "--emit-commands", str(cmds)]) == 0
    assert capsys.readouterr().err.splitlines()[-1] == (
        f'wrote 3 command(s) to {cmds} (one per line: sed -n "${{SLURM_ARRAY_TASK_ID}}p" {cmds} | bash, array 1-3)')
    assert len(cmds.read_text().splitlines()) == 3
    # a paper-world grid is planned without its checkpoints; running it needs them
    paper = write(tmp_path, {"world": "paper", "models": ["var-d16"], "methods": ["dense"], "benches": ["imagenet256"],
                             "n": 1000}, "paper.yaml")
    assert main(["sweep", str(paper), "--results", str(root), "--dry-run"]) == 0
    assert capsys.readouterr().err == "1 cells: 0 done, 1 to run\n"
    assert main(["sweep", str(paper), "--results", str(root), "--quiet"]) == 2
    assert "var_d16.pth" in capsys.readouterr().err


def test_a_sweep_checks_every_cell_before_running_the_first(tmp_path, capsys, monkeypatch):
    import bench.runner
    calls = []
    monkeypatch.setattr(bench.runner, "preflight", lambda spec, root: calls.append(("preflight", spec.key(), root)))
    monkeypatch.setattr(bench.runner, "run", lambda spec, root, ckpt_dir, progress, device:
                        calls.append(("run", spec.key(), root, progress, device)))
    path, root = write(tmp_path, GRID), tmp_path / "results"
    specs, _ = sweep.expand(sweep.parse(GRID))
    fake_record(specs[0], root)
    assert main(["sweep", str(path), "--results", str(root)]) == 0
    todo = [s.key() for s in specs[1:]]
    assert calls == [("preflight", k, root) for k in todo] + [("run", k, root, True, "cpu") for k in todo]
    err = capsys.readouterr().err
    assert "sweep: " in err and specs[-1].label() in err                 # the bar, with the cell it runs
    assert "run/s]" in err or "s/run]" in err                           # counting runs
    assert err.endswith(f"ran 5 cell(s); records under {root}\n")
    calls.clear()
    assert main(["sweep", str(path), "--results", str(root), "--quiet"]) == 0
    assert [c[3] for c in calls if c[0] == "run"] == [False] * 5
    assert capsys.readouterr().err.splitlines()[-1] == f"ran 5 cell(s); records under {root}"   # no bar
    monkeypatch.setattr("bench.launch.rank", lambda: 1)                 # torchrun: the other ranks run quietly
    calls.clear()
    assert main(["sweep", str(path), "--results", str(root)]) == 0
    assert [c[3] for c in calls if c[0] == "run"] == [False] * 5 and capsys.readouterr() == ("", "")
    (tmp_path / "file").write_text("")
    monkeypatch.setattr("bench.launch.rank", lambda: 0)
    assert main(["sweep", str(path), "--results", str(tmp_path / "file"), "--quiet"]) == 2
    f = tmp_path / "file"
    assert capsys.readouterr().err.endswith(f"\nvarbench: error: results folder {f}: {f} is a file, not a folder\n")
