"""Where the paper-world metric files are looked for, in order, and the whole message when they are not
there (bench.metrics.paper). Reading and using them: tests/test_metrics.py."""
import numpy as np
import pytest
import torch

from bench.metrics import paper
from bench.metrics.paper import (
    ADM_REFERENCE_FILENAME,
    ADM_REFERENCE_URL,
    INCEPTION_WEIGHTS_FILENAME,
    INCEPTION_WEIGHTS_URL,
    PaperAssetNotFound,
    read_adm_reference,
    resolve_adm_reference,
    resolve_inception_weights,
)


@pytest.fixture
def places(tmp_path, monkeypatch):
    """Three folders that may hold the Inception weights: $VARBENCH_CKPT_DIR, the torch hub dir, another."""
    for name in ("VARBENCH_INCEPTION_WEIGHTS", "VARBENCH_CKPT_DIR"):
        monkeypatch.delenv(name, raising=False)
    hub, ckpt, other = tmp_path / "hub", tmp_path / "ckpt", tmp_path / "other"
    for d in (hub / "checkpoints", ckpt, other):
        d.mkdir(parents=True)
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(hub))
    return hub / "checkpoints", ckpt, other


def test_the_torch_hub_cache_is_its_checkpoints_folder(places):
    hub, _, _ = places
    assert paper._torch_hub_checkpoints() == hub


def test_inception_lookup_order(places, monkeypatch):
    hub, ckpt, other = places
    for d in (hub, ckpt, other):
        (d / INCEPTION_WEIGHTS_FILENAME).write_bytes(b"w")
    assert resolve_inception_weights() == hub / INCEPTION_WEIGHTS_FILENAME
    monkeypatch.setenv("VARBENCH_CKPT_DIR", str(ckpt))
    assert resolve_inception_weights() == ckpt / INCEPTION_WEIGHTS_FILENAME   # before the hub cache
    (ckpt / INCEPTION_WEIGHTS_FILENAME).unlink()
    assert resolve_inception_weights() == hub / INCEPTION_WEIGHTS_FILENAME    # then the hub cache
    monkeypatch.setenv("VARBENCH_INCEPTION_WEIGHTS", str(other))
    assert resolve_inception_weights() == other / INCEPTION_WEIGHTS_FILENAME  # the variable before both
    assert resolve_inception_weights(other / INCEPTION_WEIGHTS_FILENAME) == other / INCEPTION_WEIGHTS_FILENAME
    monkeypatch.setenv("VARBENCH_INCEPTION_WEIGHTS", "")   # empty: as if unset
    assert resolve_inception_weights() == hub / INCEPTION_WEIGHTS_FILENAME


def test_an_explicit_place_without_the_file_is_an_error_even_if_the_cache_has_it(places, monkeypatch):
    hub, ckpt, other = places
    (hub / INCEPTION_WEIGHTS_FILENAME).write_bytes(b"w")
    with pytest.raises(PaperAssetNotFound) as e:
        resolve_inception_weights(str(other))
    assert str(e.value) == (
        f"Inception weights {INCEPTION_WEIGHTS_FILENAME} not found (looked at: {other / INCEPTION_WEIGHTS_FILENAME}).\n"
        f"  Get it from {INCEPTION_WEIGHTS_URL}\n"
        f"  and put it in {hub} or $VARBENCH_CKPT_DIR, or point VARBENCH_INCEPTION_WEIGHTS (or weights_path=) at "
        f"the file. varbench never downloads at run time.")
    monkeypatch.setenv("VARBENCH_INCEPTION_WEIGHTS", str(other / "named.pth"))
    with pytest.raises(PaperAssetNotFound, match=r"\(looked at: .*named\.pth\)"):
        resolve_inception_weights()


def test_nothing_anywhere_lists_every_place_looked_at(places, monkeypatch):
    hub, ckpt, _ = places
    monkeypatch.setenv("VARBENCH_CKPT_DIR", str(ckpt))
    with pytest.raises(PaperAssetNotFound) as e:
        resolve_inception_weights()
    assert f"(looked at: {ckpt / INCEPTION_WEIGHTS_FILENAME}, {hub / INCEPTION_WEIGHTS_FILENAME})" in str(e.value)
    assert isinstance(e.value, FileNotFoundError)


def test_adm_reference_messages_in_full(tmp_path, monkeypatch):
    monkeypatch.delenv("VARBENCH_DATA_DIR", raising=False)
    tail = (f".\n  Get it from {ADM_REFERENCE_URL}\n  (the reference batches of openai/guided-diffusion "
            f"`evaluations/`), put it in the folder that VARBENCH_DATA_DIR points at, or pass its path. varbench "
            f"never downloads at run time.")
    with pytest.raises(PaperAssetNotFound) as e:
        resolve_adm_reference()
    assert str(e.value) == (f"ADM reference batch {ADM_REFERENCE_FILENAME} not found (no path given and "
                            f"VARBENCH_DATA_DIR is not set)" + tail)
    with pytest.raises(PaperAssetNotFound) as e:
        resolve_adm_reference(tmp_path)   # a folder without the file
    assert str(e.value) == f"ADM reference batch {ADM_REFERENCE_FILENAME} not found at " \
                           f"{tmp_path / ADM_REFERENCE_FILENAME}" + tail
    monkeypatch.setenv("VARBENCH_DATA_DIR", str(tmp_path / "data"))
    with pytest.raises(PaperAssetNotFound, match=f"not found at {tmp_path / 'data' / ADM_REFERENCE_FILENAME}"):
        resolve_adm_reference()


def _npz(path, **arrays):
    np.savez(path, **arrays)
    return path


def test_adm_reference_contents_are_checked(tmp_path):
    imgs = np.zeros((2, 4, 4, 3), np.uint8)
    mu, sigma = np.zeros(3, np.float32), np.eye(3, dtype=np.float32)
    p = _npz(tmp_path / "ref.npz", arr_0=imgs, mu=mu, sigma=sigma, mu_s=mu[:2], sigma_s=np.eye(2))
    ref = read_adm_reference(p)
    assert ref["path"] == p and ref["mu_s"].dtype == np.float64 and ref["sigma_s"].shape == (2, 2)
    assert ref["sigma"].dtype == np.float64
    with pytest.raises(ValueError) as e:
        read_adm_reference(_npz(tmp_path / "a.npz", mu=mu))
    assert str(e.value) == f"{tmp_path / 'a.npz'} is not an ADM reference batch: missing key(s) ['arr_0', 'sigma'] " \
                           f"(found ['mu'])"
    assert read_adm_reference(_npz(tmp_path / "s.npz", mu=mu, sigma=sigma), load_images=False)["images"] is None
    for bad in (imgs.astype(np.int16), imgs[0], imgs[..., :1]):
        with pytest.raises(ValueError) as e:
            read_adm_reference(_npz(tmp_path / "b.npz", arr_0=bad, mu=mu, sigma=sigma))
        assert str(e.value) == f"{tmp_path / 'b.npz'}: arr_0 should be uint8 [N,H,W,3], got {bad.dtype} {bad.shape}"
    for m, s in ((mu, np.eye(4)), (np.zeros((3, 1)), np.eye(3))):
        with pytest.raises(ValueError) as e:
            read_adm_reference(_npz(tmp_path / "c.npz", arr_0=imgs, mu=m, sigma=s))
        assert str(e.value) == f"{tmp_path / 'c.npz'}: mu {m.shape} and sigma {s.shape} do not fit together"


def test_reference_features_pair_the_images_features_with_the_files_statistics(tmp_path, monkeypatch):
    imgs = np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3)
    mu, sigma = np.arange(3, dtype=np.float32), 2 * np.eye(3, dtype=np.float32)
    p = _npz(tmp_path / "ref.npz", arr_0=imgs, mu=mu, sigma=sigma)
    seen = []

    def fake_extract(images, weights_path, batch_size, device, progress):
        seen.append((images, weights_path, batch_size, device, progress))
        return {"features": torch.ones(len(images), width), "logits": torch.zeros(len(images), 7)}

    monkeypatch.setattr(paper, "extract_inception_features", fake_extract)
    width = 3
    fs = paper.adm_reference_features(p, "w.pth", 5, "cpu", True)
    assert sorted(fs) == ["features", "logits", "mu", "sigma"] and fs["logits"] is None
    assert torch.equal(fs["features"], torch.ones(2, 3))
    assert fs["mu"].dtype == np.float64 and np.array_equal(fs["mu"], mu) and np.array_equal(fs["sigma"], sigma)
    images, *rest = seen[0]
    assert torch.equal(images, torch.from_numpy(imgs).permute(0, 3, 1, 2)) and rest == ["w.pth", 5, "cpu", True]
    width = 4
    with pytest.raises(ValueError) as e:
        paper.adm_reference_features(p)
    assert str(e.value) == "reference mu has 3 dims but Inception features have 4"


@pytest.mark.parametrize("n, splits", [(100, 1), (4999, 1), (5000, 1), (12000, 2), (15000, 3)])
def test_inception_score_splits_are_whole_chunks_of_5000_and_at_least_one(tmp_path, monkeypatch, n, splits):
    weights = tmp_path / INCEPTION_WEIGHTS_FILENAME
    weights.write_bytes(b"")
    calls = []
    monkeypatch.setattr(paper, "evaluate", lambda *a, **k: calls.append(k) or {})
    ref = {"features": torch.zeros(4, 2), "logits": None, "mu": np.zeros(2), "sigma": np.eye(2)}
    fake = {"features": torch.zeros(n, 2), "logits": torch.zeros(n, 3)}   # features computed elsewhere
    paper.evaluate_adm(fake, ref, weights_path=weights)
    assert calls[0]["isc_splits"] == splits and type(calls[0]["isc_splits"]) is int
