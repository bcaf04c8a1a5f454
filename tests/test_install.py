"""A regular (non-editable) install works from an empty folder: package data, not the checkout."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_wheel_install_runs_from_an_empty_folder(tmp_path):
    site, work = tmp_path / "site", tmp_path / "empty"
    work.mkdir()
    build = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                            "--target", str(site), str(REPO)], capture_output=True, text=True, timeout=600,
                           env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert build.returncode == 0, build.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VARBENCH_")}
    env["PYTHONPATH"] = str(site)

    def vb(*args):
        out = subprocess.run([sys.executable, "-m", "bench", *args], cwd=work, env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return out.stdout

    where = subprocess.run([sys.executable, "-c", "import bench, bench.resources as r; print(bench.__file__); "
                            "print(r.resource_dir('tables'))"], cwd=work, env=env, capture_output=True, text=True)
    module, tables = where.stdout.split()
    assert module.startswith(str(site)) and tables.startswith(str(site)), "not testing the installed copy"
    # the installed copy's records name the commit it was built from (setup.py stamps it), not "unknown"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    env_of = subprocess.run([sys.executable, "-c", "import json, bench.records as R; print(json.dumps(R.environment()))"],
                            cwd=work, env=env, capture_output=True, text=True)
    rec_env = json.loads(env_of.stdout)
    assert rec_env["git_commit"] == head and isinstance(rec_env["git_dirty"], bool), rec_env
    assert rec_env["versions"]["varbench"], rec_env
    assert {"evar-table1", "evar-table2", "evar-table3", "evar-table4", "evar-table5", "lazyvar-table1",
            "fastvar-table3"} <= set(vb("list", "tables").split())
    # figure specs travel too: with no records a figure says which records it needs
    out = subprocess.run([sys.executable, "-m", "bench", "figures", "pareto"], cwd=work, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 2 and "no shapes-c2i records of tiny-var" in out.stderr, out.stderr
    assert {"dense", "ft", "magnitude"} <= set(vb("list", "methods").split())
    info = json.loads(vb("info", "tiny-var", "--json"))
    assert info["model"] == "tiny-var" and info["params"] > 0 and info["tokens_per_scale"][-1] == 64
    # no records yet: `table --no-run` says where it looked, and writes nothing
    out = subprocess.run([sys.executable, "-m", "bench", "table", "evar-table2", "--no-run"], cwd=work, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 2 and "results folder" in out.stderr and "does not exist" in out.stderr
    assert list(work.iterdir()) == []
