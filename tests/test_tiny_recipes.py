"""The `make tiny-models` recipes run end to end (a few steps each) and write a complete manifest."""
import json

from bench.recipes import tiny as train


def test_recipes_smoke(tmp_path, monkeypatch):
    monkeypatch.setattr(train, "VAE_RECIPE", {**train.VAE_RECIPE, "steps": 3, "batch": 8, "pool": 256, "restart_every": 2})
    monkeypatch.setattr(train, "VAR_RECIPE", {**train.VAR_RECIPE, "steps": 3, "batch": 8, "pool": 256, "warmup": 1})
    monkeypatch.setattr(train, "CNN_RECIPE", {**train.CNN_RECIPE, "epochs": 1, "pool": 256})
    train.run(tmp_path, progress=False, eval_per_class=4)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert set(manifest["models"]) == {"tiny-vqvae", "feature-cnn", "tiny-var"}
    for entry in manifest["models"].values():
        assert len(entry["sha256"]) == 64 and (tmp_path / entry["file"]).stat().st_size == entry["bytes"]
        assert entry["recipe"]["seed"] == 0 and entry["curve"]
    q = manifest["models"]["tiny-var"]["quality"]
    assert {"class_acc", "precision", "recall", "fid", "bars"} <= set(q)
    assert "val_psnr_db" in manifest["models"]["tiny-vqvae"]["quality"]
    assert manifest["git_commit"]
    assert not (tmp_path / "tiny_var.snapshot.safetensors").exists()
