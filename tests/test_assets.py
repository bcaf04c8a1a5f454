"""The shipped tiny world is pinned by its manifest: every listed checkpoint is present with the
recorded size and sha256, was trained by the recipes in ``bench/recipes/tiny.py`` and
``bench/recipes/tiny_t2i.py`` (thread count included); the class-conditional models meet the quality
bars of ``bench/recipes/tiny_quality.py``; tiny-t2i's quality is recorded on the full eval protocol
against ``tiny_t2i.BARS`` (it meets two of its four bars: the README and the recipe say which); the
folder stays within 30 MB of checkpoints."""
import json

import pytest

from bench.checkpoint import sha256
from bench.data import tinyshapes
from bench.recipes import tiny, tiny_quality, tiny_t2i
from bench.tiny.assets import ASSETS

BARS = tiny_quality.BARS
MODELS = ("tiny-vqvae", "feature-cnn", "tiny-var", "tiny-bsq", "tiny-t2i", "tiny-t2i-text")
RECIPES = {"tiny-vqvae": tiny.VAE_RECIPE, "feature-cnn": tiny.CNN_RECIPE, "tiny-var": tiny.VAR_RECIPE,
           "tiny-bsq": tiny_t2i.BSQ_RECIPE}   # tiny-t2i's files name their recipe (code_recipe)
BUDGET_BYTES = 30 * 2 ** 20


@pytest.fixture(scope="module")
def manifest() -> dict:
    return json.loads((ASSETS / "manifest.json").read_text())


def test_manifest_lists_the_tiny_world(manifest):
    assert set(manifest["models"]) == set(MODELS)
    assert len({e["file"] for e in manifest["models"].values()}) == len(MODELS)
    for key in ("git_commit", "torch", "python", "created"):
        assert manifest[key], key
    listed = {e["file"] for e in manifest["models"].values()}
    unlisted = {p.name for p in ASSETS.glob("*.safetensors")} - listed
    assert not unlisted, f"checkpoints in {ASSETS} not in the manifest: {sorted(unlisted)}"


@pytest.mark.parametrize("name", MODELS)
def test_file_matches_manifest(manifest, name):
    entry = manifest["models"][name]
    path = ASSETS / entry["file"]
    assert path.is_file(), f"{path} is missing"
    assert path.stat().st_size == entry["bytes"], f"{path}: size differs from the manifest"
    assert sha256(path) == entry["sha256"], f"{path}: sha256 differs from the manifest"


def code_recipe(name: str, entry: dict) -> dict:
    """The code's recipe for a shipped file: tiny-t2i's files name theirs (``T2I_RECIPES``: cpu or gpu)."""
    if name in ("tiny-t2i", "tiny-t2i-text"):
        return tiny_t2i.T2I_RECIPES[entry["recipe_name"]]
    return RECIPES[name]


@pytest.mark.parametrize("name", MODELS)
def test_recorded_recipe_is_the_code_recipe(manifest, name):
    """The recorded recipe is the code's, apart from the thread count (checked below) and a time budget,
    which only fixed the number of steps (recorded, and so compared)."""
    entry = manifest["models"][name]
    recipe = code_recipe(name, entry)
    without_threads = lambda r: {k: v for k, v in r.items() if k not in ("threads", "time_budget_s")}  # noqa: E731
    assert without_threads(entry["recipe"]) == without_threads(recipe), \
        f"{name}: the shipped checkpoint was trained by another recipe than bench/recipes/tiny.py's"
    assert "threads" in entry, f"{name}: the manifest does not record the thread count"
    assert entry["threads"] == entry["recipe"]["threads"] == recipe["threads"], \
        f"{name}: trained under another thread count than the pinned recipe's; retrain it with `make tiny-models`"
    if recipe.get("isa"):   # trained in the ISA-pinned child process (bench/recipes/tiny.py)
        from bench.recipes.tiny import ISA_ENV
        assert entry["isa"] == recipe["isa"] and entry["isa_env"] == ISA_ENV[recipe["isa"]]
        assert entry["cpu_capability"] == recipe["isa"].upper()


def test_quality_bars(manifest):
    m = manifest["models"]
    assert m["tiny-vqvae"]["quality"]["val_psnr_db"] >= BARS["vqvae_val_psnr_db"]
    assert m["feature-cnn"]["quality"]["val_accuracy"] >= BARS["cnn_val_accuracy"]
    q = m["tiny-var"]["quality"]
    for key in ("class_acc", "precision", "recall"):
        assert q[key] >= BARS[key], f"tiny-var {key} {q[key]} is below the bar {BARS[key]}"
        assert q["bars"][key] >= BARS[key], f"tiny-var {key} was checked against a laxer bar"
    assert q["n"] >= 50 * tinyshapes.NUM_CLASSES, "tiny-var quality was measured on fewer samples than the protocol"


def test_tiny_t2i_quality_is_recorded_on_the_eval_protocol(manifest):
    """Not a bar check (two bars are not met yet): the figures are there, measured on the full protocol
    with the recipe's bars and the card's sampling, and the met flags agree with them."""
    from bench.registry import MODELS as CARDS
    q = manifest["models"]["tiny-t2i"]["quality"]
    assert q["bars"] == tiny_t2i.BARS and q["per_task"] >= tiny_t2i.EVAL["per_task"]
    assert q["sampling"] == CARDS.get("tiny-t2i").sampling
    for task, bar in tiny_t2i.BARS.items():
        assert 0 <= q[task] <= 1 and q["met"][task] == (q[task] >= bar), task
    assert manifest["models"]["tiny-bsq"]["quality"]["val_psnr_db"] >= 28.0
    t2i = manifest["models"]["tiny-t2i"]
    recipe = code_recipe("tiny-t2i", t2i)   # a curve point every eval_every steps and at the last step
    assert [c["step"] for c in t2i["quality_curve"]] == \
        sorted({*range(recipe["eval_every"], recipe["steps"] + 1, recipe["eval_every"]), recipe["steps"]})


def test_tiny_world_fits_its_budget():
    total = sum(p.stat().st_size for p in ASSETS.glob("*.safetensors"))
    assert total <= BUDGET_BYTES, f"assets/tiny holds {total / 2**20:.1f} MB of checkpoints (budget 30 MB)"


def test_every_shipped_model_records_its_threads_and_simd_level(manifest):
    """What retraining needs to reproduce a file bit for bit: the thread count and the SIMD level.
    The class-conditional files (and the tiny-var quality figures) were made pinned to AVX2; the
    text-to-image files unpinned (the AVX2 pin does not fit the recipe's 2-hour budget: the recipe's
    docstring), with the level they were trained on recorded."""
    for name, e in manifest["models"].items():
        assert isinstance(e["threads"], int) and e["threads"] >= 1, name
        if name in ("tiny-bsq", "tiny-t2i", "tiny-t2i-text"):
            assert e["isa"] is None and e["cpu_capability"], f"{name}: its SIMD level is not recorded"
        else:
            assert e["isa"] == "avx2" and e["cpu_capability"] == "AVX2", f"{name}: not trained pinned to AVX2"
    q = manifest["models"]["tiny-var"]["quality"]
    assert q["isa"] == "avx2" and q["cpu_capability"] == "AVX2", "tiny-var quality not measured pinned to AVX2"


def test_retraining_on_another_simd_level_says_the_file_will_differ(monkeypatch, capsys):
    import torch

    from bench.recipes.tiny import warn_if_other_simd
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert "trained on AVX2" in warn_if_other_simd("tiny-var") and "sha256" in capsys.readouterr().err
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert warn_if_other_simd("tiny-vqvae") is None
