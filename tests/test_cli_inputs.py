"""Bad input and faults, as a new user meets them: each is one clear line (exit 2), found before any
work starts, and nothing is lost."""
import json

import pytest

from bench import cli
from bench.cli import main
from bench.tiny.assets import ASSETS

HAVE_TINY = (ASSETS / "tiny_var.safetensors").is_file()


def err_of(capsys, argv, code=2):
    try:
        rc = main(argv)
    except SystemExit as e:          # argparse rejects the value itself
        rc = e.code
    assert rc == code, capsys.readouterr()
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, msg", [
    (["--top-k", "-1"], "--top-k -1 is out of range [0,"),
    (["--top-p", "1.5"], "--top-p 1.5 is out of range [0.0, 1.0]"),
    (["--cfg", "-2"], "--cfg -2.0 is out of range"),
    (["--cfg", "nan"], "--cfg must be a finite float"),
    (["--n", "0"], "--n 0: shapes-c2i needs a positive multiple of its 12 classes"),
    (["--n", "13"], "positive multiple of its 12 classes"),
    (["--method", "+"], "empty method in chain"),
    (["--method", ""], "empty method in chain"),
    (["--method", "magnitude:sparsity=nan"], "sparsity='nan' is not a finite number (range [0.0, 0.9])"),
    (["--method", "magnitude:sparsity=1.5"], "out of range [0.0, 0.9]"),
    (["--method", "magnitud"], "did you mean 'magnitude'"),
    (["--method", "magnitude:sparsty=0.4"], "did you mean 'sparsity'"),
])
@pytest.mark.skipif(not HAVE_TINY, reason="no tiny assets")
def test_run_arguments_are_checked_before_any_work(capsys, tmp_path, argv, msg):
    err = err_of(capsys, ["run", "--model", "tiny-var", "--results", str(tmp_path), *argv])
    assert msg in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())   # nothing was run or written


@pytest.mark.parametrize("seed", ["-1", str(2 ** 63), "abc"])
def test_seeds_out_of_range_name_the_range(capsys, seed):
    err = err_of(capsys, ["run", "--model", "tiny-var", "--seed", seed])
    assert "--seed" in err and ("2^32 - 1" in err or "invalid" in err)


@pytest.mark.skipif(not HAVE_TINY, reason="no tiny assets")
def test_table_n_zero_and_bad_formats(capsys, tmp_path):
    assert "positive multiple" in err_of(capsys, ["table", "evar-table2", "--n", "0", "--no-run", "--results", str(tmp_path)])
    err = err_of(capsys, ["table", "evar-table2", "--format", "md,pdf", "--no-run", "--results", str(tmp_path)])
    assert "unknown format(s) ['pdf']" in err


@pytest.mark.skipif(not HAVE_TINY, reason="no tiny assets")
def test_results_and_output_folders_that_cannot_be_used(capsys, tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert "is a file" in err_of(capsys, ["table", "evar-table2", "--results", str(a_file), "--no-run"])
    assert "is a file" in err_of(capsys, ["table", "evar-table2", "--out", str(a_file), "--no-run",
                                          "--results", str(tmp_path)])
    assert "does not exist" in err_of(capsys, ["table", "evar-table2", "--no-run", "--results", str(tmp_path / "typo")])
    assert "is a file" in err_of(capsys, ["run", "--model", "tiny-var", "--n", "12", "--results", str(a_file)])



@pytest.mark.skipif(not HAVE_TINY, reason="no tiny assets")
def test_a_read_only_results_folder_is_refused_before_work(capsys, tmp_path, monkeypatch):
    """Root writes anywhere, so the read-only folder is simulated at the one place that probes it."""
    import bench.io

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(bench.io.tempfile, "mkstemp", denied)
    err = err_of(capsys, ["run", "--model", "tiny-var", "--n", "12", "--results", str(tmp_path / "ro")])
    assert "results folder" in err and "not writable (Permission denied)" in err


def test_paper_world_lists_every_missing_checkpoint(capsys, tmp_path):
    err = err_of(capsys, ["run", "--model", "var-d16", "--ckpt-dir", str(tmp_path)])
    assert "2 checkpoint file(s) not found" in err and "var_d16.pth" in err and "vae_ch160v4096z32.pth" in err
    assert "huggingface.co/FoundationVision/var" in err and "never downloads" in err


def test_paper_world_checks_inception_weights_before_sampling(capsys, tmp_path, monkeypatch):
    for f in ("var_d16.pth", "vae_ch160v4096z32.pth"):
        (tmp_path / f).write_bytes(b"not loaded: the Inception check comes first")
    monkeypatch.setenv("VARBENCH_INCEPTION_WEIGHTS", str(tmp_path / "no-inception.pth"))
    monkeypatch.setenv("VARBENCH_DATA_DIR", str(tmp_path))
    err = err_of(capsys, ["run", "--model", "var-d16", "--ckpt-dir", str(tmp_path), "--results", str(tmp_path / "r")])
    assert "weights-inception-2015-12-05" in err and "not a readable checkpoint" not in err


def test_info_method_typo_gets_the_right_advice(capsys):
    assert "did you mean 'magnitude'" in err_of(capsys, ["info", "tiny-var", "--method", "magnitud"])
    assert "did you mean 'sparsity'" in err_of(capsys, ["info", "tiny-var", "--method", "magnitude:sparsty=0.4"])


def test_ctrl_c_is_one_line_and_exit_130(capsys, monkeypatch):
    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "cmd_list", interrupted)
    err = err_of(capsys, ["list", "models"], code=130)
    assert err == ("varbench: interrupted; nothing partial was written (records and tables are written atomically, "
                   "finished runs are kept)\n")


@pytest.mark.skipif(not HAVE_TINY, reason="no tiny assets")
def test_force_does_not_overwrite_a_record_of_a_newer_schema(capsys, tmp_path):
    from bench.plan import make_spec
    spec = make_spec("tiny-var", [], n=12)
    path = spec.path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"schema": 99, "run_id": spec.key()}))
    err = err_of(capsys, ["run", "--model", "tiny-var", "--n", "12", "--results", str(tmp_path), "--force"])
    assert "schema-99 record" in err and "not overwriting" in err
    assert json.loads(path.read_text())["schema"] == 99


def test_two_token_methods_in_one_chain_are_a_clear_error(monkeypatch):
    from bench.registry import METHODS
    from bench.spec import SpecError, resolve_chain
    for name in ("toka", "tokb"):
        monkeypatch.setitem(METHODS._meta, name, {"name": name, "kind": "tokens", "version": 1, "params": {}})
    assert resolve_chain(["toka", "magnitude"]) == ("toka", "magnitude:norm=l2,schedule=uniform,scope=coupled,sparsity=0.4")
    with pytest.raises(SpecError, match="one token-policy slot"):
        resolve_chain(["toka", "tokb"])


def test_device_is_checked_before_any_work(tmp_path, capsys):
    import torch
    for bad in ("banana", "mps", "meta", "cuda:x"):
        assert main(["run", "--model", "tiny-var", "--n", "12", "--device", bad, "--results", str(tmp_path)]) == 2
        assert f"--device {bad!r}: must be cpu, cuda or cuda:N\n" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["run", "--model", "tiny-var", "--n", "12", "--device", "cuda", "--results", str(tmp_path)]) == 2
        assert "CUDA is not available" in capsys.readouterr().err
    assert not any(tmp_path.rglob("*.json"))


def test_sampling_help_names_every_models_default_from_its_card():
    """--cfg / --top-k / --top-p help lists each registered model's own default (read from the cards)."""
    from bench.registry import MODELS
    actions = {a.dest: a.help for a in cli.build_parser()._subparsers._group_actions[0].choices["latency"]._actions}
    for key in ("cfg", "top_k", "top_p"):
        for name in MODELS.names():
            sampling = MODELS.get(name).sampling
            if key in sampling:
                assert any(name in part and part.endswith(f" {sampling[key]}")
                           for part in actions[key].split("model's: ")[1].rstrip(")").split(", ")), (key, name)


def test_a_leading_double_dash_is_dropped(capsys, monkeypatch):
    # `torchrun -m bench -- run ...` (docs/sharding.md): argparse would keep the "--"
    import sys
    assert main(["list", "models"]) == 0
    plain = capsys.readouterr().out
    assert main(["--", "list", "models"]) == 0
    assert capsys.readouterr().out == plain and "tiny-var" in plain
    monkeypatch.setattr(sys, "argv", ["varbench", "list", "models"])   # the console script passes no argv
    assert main() == 0 and capsys.readouterr().out == plain


def test_train_tiny_hands_its_arguments_to_the_recipe(monkeypatch):
    import bench.recipes.tiny as recipe
    seen = []
    monkeypatch.setattr(recipe, "main", lambda argv: seen.append(argv) or 7)
    assert main(["train-tiny", "--stages", "cnn"]) == 7 and seen == [["--stages", "cnn"]]


def test_a_closed_stdout_pipe_is_not_an_error(capsys, monkeypatch):
    # `varbench ... | head`: stdout is pointed at /dev/null so that Python's exit flush stays quiet
    import os
    import sys

    def closed(args):
        raise BrokenPipeError
    calls = []
    monkeypatch.setattr(cli, "cmd_list", closed)
    monkeypatch.setattr(os, "open", lambda path, flags: calls.append(("open", path, flags)) or 41)
    monkeypatch.setattr(os, "dup2", lambda a, b: calls.append(("dup2", a, b)))
    monkeypatch.setattr(sys, "stdout", type("Out", (), {"fileno": lambda self: 43})())
    assert main(["list", "models"]) == 0
    assert calls == [("open", os.devnull, os.O_WRONLY), ("dup2", 41, 43)]


@pytest.mark.parametrize("exc", ["UnknownNameError", "CheckpointError", "FileNotFoundError", "ValueError",
                                 "OutputDirError", "EmptyRenderError"])
def test_what_a_user_can_fix_is_one_line_and_exit_2(capsys, monkeypatch, exc):
    from bench.checkpoint import CheckpointError
    from bench.io import OutputDirError
    from bench.registry import UnknownNameError
    from bench.render import EmptyRenderError
    cls = {c.__name__: c for c in (UnknownNameError, CheckpointError, FileNotFoundError, ValueError, OutputDirError,
                                    EmptyRenderError)}[exc]

    def fails(args):
        raise cls("what to fix")
    monkeypatch.setattr(cli, "cmd_list", fails)
    assert err_of(capsys, ["list", "models"]) == "varbench: error: what to fix\n"


def test_a_bug_is_not_dressed_as_a_user_error(monkeypatch):
    def bug(args):
        raise RuntimeError("a defect of ours")
    monkeypatch.setattr(cli, "cmd_list", bug)
    with pytest.raises(RuntimeError, match="a defect of ours"):
        main(["list", "models"])


@pytest.mark.parametrize("exc, message", [
    (IsADirectoryError(21, "Is a directory", "out"), "out: Is a directory"),
    (NotADirectoryError(20, "Not a directory", "f/x"), "f/x: Not a directory"),
    (PermissionError(13, "Permission denied", "/root/x", None, "/root/y"), "/root/x -> /root/y: Permission denied"),
])
def test_a_path_that_cannot_be_used_is_one_line_naming_it(capsys, monkeypatch, exc, message):
    def fails(args):
        raise exc
    monkeypatch.setattr(cli, "cmd_list", fails)
    assert err_of(capsys, ["list", "models"]) == f"varbench: error: {message}\n"


def test_an_os_error_about_no_path_keeps_its_traceback(monkeypatch):
    def fails(args):
        raise OSError("image file is truncated")      # PIL: says no file; a bug if it reaches here
    monkeypatch.setattr(cli, "cmd_list", fails)
    with pytest.raises(OSError, match="image file is truncated"):
        main(["list", "models"])
