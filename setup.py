"""Build hook: an installed copy remembers the git commit it was built from.

Everything else about the package is declared in pyproject.toml. A regular install (`pip install .`, a
wheel) has no `.git` beside it, so without this its records would say `git_commit: "unknown"`. When the
build runs in a git checkout, `build_py` writes `bench/_build_info.json` (commit, whether tracked files
differed from it, and the time of the build) into the built package; `bench.io.git_commit` reads it
when it finds no checkout. A build from an sdist or any folder without git writes nothing, and the
records then say "unknown", as before.
"""
import importlib.util
import json
from datetime import datetime, timezone
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _provenance():
    """bench/io.py's own git_commit / git_dirty, the ones records use, loaded by path: the build
    environment has none of the package's dependencies, and io.py needs only the standard library."""
    spec = importlib.util.spec_from_file_location("_varbench_io", ROOT / "bench" / "io.py")
    io = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(io)
    return io.git_commit(), io.git_dirty()


class build_py_with_commit(build_py):
    def run(self):
        super().run()
        target = Path(self.build_lib) / "bench" / "_build_info.json"
        target.unlink(missing_ok=True)   # an earlier build's stamp in a reused build/ folder would lie
        commit, dirty = _provenance()
        if commit == "unknown":          # no checkout here (e.g. an sdist): nothing to stamp
            return
        info = {"git_commit": commit, "git_dirty": dirty,
                "built": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(info, indent=1) + "\n")


setup(cmdclass={"build_py": build_py_with_commit})
