"""The layers of docs/architecture.md: no module imports a layer above its own."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# module prefix -> layer (higher may import lower). Leaves (facts any layer may read) are layer 0.
LAYERS = {
    "bench.defaults": 0, "bench.tiny": 0, "bench.io": 0, "bench.resources": 0, "bench.spec": 0, "bench.launch": 0,
    "bench.registry": 0, "bench.checkpoint": 0, "bench.models.configs": 0, "bench.models.hart_config": 0,
    "bench.metrics.catalog": 0, "bench.metrics.mjhq": 0,
    "bench.models": 1, "bench.accounting": 1, "bench.prune": 1,
    "bench.calib": 2, "bench.obs": 2, "bench.importance": 2, "bench.distill": 2,
    "bench.data": 2,
    "bench.metrics": 3,
    "bench.benches": 4,
    "bench.records": 5, "bench.plan": 5, "bench.method": 5, "methods": 5,
    "bench.runner": 6, "bench.originals": 6, "bench.render": 6, "bench.latency": 6, "bench.coreml": 6, "bench.figures": 6,
    "bench.image_grid": 6, "bench.shard": 6, "bench.sweep": 6, "bench.leaderboard": 6,
    "bench.recipes": 7, "bench.cli": 7, "bench.commands": 7, "bench.__main__": 7,
}
# the renderer and the record/plan layer read YAML and JSON only: they may not reach torch code
TORCH_FREE = ("bench", "bench.checkpoint", "bench.render", "bench.figures", "bench.leaderboard", "bench.sweep", "bench.records", "bench.plan", "bench.spec", "bench.registry", "bench.io",
              "bench.resources", "bench.defaults", "bench.launch", "bench.models.cards", "bench.models.configs",
              "bench.models.hart_config", "bench.image_grid",
              "bench.metrics.catalog", "bench.metrics.mjhq", "bench.benches", "bench.tiny")


def layer(module: str) -> int:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[best]


def modules():
    for root in ("bench", "methods"):
        for path in (REPO / root).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            yield name.removesuffix(".__init__"), path


def imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


def test_no_module_imports_a_layer_above_it():
    bad = []
    for name, path in modules():
        for imp in imports(path):
            if imp.split(".")[0] in ("bench", "methods") and imp not in ("bench", "methods") and layer(imp) > layer(name):
                bad.append(f"{name} (layer {layer(name)}) imports {imp} (layer {layer(imp)})")
    assert not bad, "\n".join(bad)


def test_torch_free_modules_import_no_torch_at_module_level():
    bad = []
    for name, path in modules():
        if name == "bench" or not any(name == p or name.startswith(p + ".") for p in TORCH_FREE if p != "bench"):
            continue
        tree = ast.parse(path.read_text())
        for node in tree.body:   # module level only: imports inside functions run when needed
            mods = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for m in mods:
                top = m.split(".")[0]
                if top in ("torch", "torchvision", "torch_fidelity", "numpy") or \
                        (top in ("bench", "methods") and m not in ("bench",)
                         and not any(m == p or m.startswith(p + ".") for p in TORCH_FREE if p != "bench")):
                    bad.append(f"{name} imports {m} at module level")
    assert not bad, "\n".join(bad)
