"""Build hook: an installed copy remembers the git commit it was built from.

Everything else about the package is declared in pyproject.toml. A regular install (`pip install .`, a
wheel) has no `.git` beside it, so without this its records would say `git_commit: "unknown"`. When the
build runs in a git checkout, `build_py` writes `bench/_build_info.json` (commit, whether tracked files
differed from it, and the time of the build) into the built package; `bench.io.git_commit` reads it
when it finds no checkout. A build from an sdist or any folder without git writes nothing, and the
records then say "unknown", as before.
"""
import json
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _git(*args):
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


class build_py_with_commit(build_py):
    def run(self):
        super().run()
        target = Path(self.build_lib) / "bench" / "_build_info.json"
        target.unlink(missing_ok=True)   # an earlier build's stamp in a reused build/ folder would lie
        commit = _git("rev-parse", "HEAD") if (ROOT / ".git").exists() else None
        if not commit:
            return
        status = _git("status", "--porcelain", "--untracked-files=no")
        info = {"git_commit": commit, "git_dirty": None if status is None else bool(status),
                "built": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(info, indent=1) + "\n")


setup(cmdclass={"build_py": build_py_with_commit})
