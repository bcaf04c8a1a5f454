"""The docs stand alone and their walk-throughs work exactly as written."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"


def _blocks(md: str) -> dict:
    """``{path: text}`` of the fenced code blocks tagged ``file=<path>``."""
    return {m.group(1): m.group(2) for m in re.finditer(r"```\w+ file=(\S+)\n(.*?)```", md, flags=re.S)}


def test_the_product_never_points_outside_its_repository():
    outside = ("../" + "shared", "DESIGN" + ".md")
    hits = []
    for top in ("README.md", "bench", "methods", "tests", "docs", "tables", "datasets", "Makefile", "pyproject.toml"):
        for path in [REPO / top] if (REPO / top).is_file() else (REPO / top).rglob("*"):
            if path.is_file() and path.suffix in ("", ".md", ".py", ".yaml", ".toml", ".j2", ".txt"):
                text = path.read_text(encoding="utf-8", errors="replace")
                hits += [f"{path.relative_to(REPO)}: {o}" for o in outside if o in text]
    assert not hits


def test_methods_doc_covers_every_method():
    from bench.registry import METHODS
    text = (DOCS / "methods.md").read_text()
    for name in METHODS.names():
        assert f"## {name}" in text, f"docs/methods.md has no section for {name}"
    assert "docs/architecture.md" in (REPO / "README.md").read_text()
    assert "docs/methods.md" in (REPO / "README.md").read_text()


@pytest.mark.skipif(not (REPO / "assets" / "tiny" / "tiny_var.safetensors").is_file(), reason="no tiny assets")
def test_add_a_method_and_a_table_walkthrough(tmp_path):
    blocks = _blocks((DOCS / "architecture.md").read_text())
    assert set(blocks) == {"methods/halve.yaml", "methods/halve.py", "tables/my-table.yaml"}
    root = tmp_path / "varbench"
    for part in ("bench", "methods", "tables", "datasets"):
        shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__", "out"))
    shutil.copytree(REPO / "assets" / "tiny", root / "assets" / "tiny")
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    for rel, text in blocks.items():
        (root / rel).write_text(text)
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("VARBENCH_RESULTS", None)
    env.pop("VARBENCH_TABLES_OUT", None)
    env.pop("VARBENCH_TINY_DIR", None)

    def vb(*args):
        out = subprocess.run([sys.executable, "-m", "bench", *args], cwd=root, env=env, capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert "halve" in vb("list", "methods").split() and "my-table" in vb("list", "tables").split()
    info = json.loads(vb("info", "tiny-var", "--method", "halve", "--json"))
    assert info["ffn_hidden"] == [384] * 4          # 768 channels per block, half kept
    md = vb("table", "my-table", "--n", "12", "--quiet")
    assert "| Halve" in md and "/ 3.55" in md
    table = json.loads((root / "tables" / "out" / "tiny" / "my-table.json").read_text())
    rows = {r["label"]: r["cells"] for r in table["rows"]}
    assert rows["Halve"]["pratio"]["ours"] < 1.0 and rows["Dense"]["pratio"]["ours"] == 1.0
    assert rows["Halve"]["fid"]["ours"] is not None
