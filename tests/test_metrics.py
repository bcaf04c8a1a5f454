"""Fidelity metrics: torch-fidelity plumbing, the maths against independent references, clear errors.

Fast and offline: a randomly initialised TinyShapesCNN saved to tmp_path stands in for the trained
feature network, fixed random feature tensors for everything else.
"""
import numpy as np
import pytest
import scipy.linalg
import torch
from scipy.spatial.distance import cdist
from torch_fidelity.registry import FEATURE_EXTRACTORS_REGISTRY

from bench.metrics import features as F
from bench.metrics import fidelity, paper
from bench.registry import METRICS


def _random_cnn(path, num_classes=12, width=8, seed=0):
    """A randomly initialised feature CNN with non-trivial BatchNorm statistics, saved to ``path``."""
    torch.manual_seed(seed)
    net = F.TinyShapesCNN(num_classes=num_classes, width=width)
    g = torch.Generator().manual_seed(seed)
    for m in net.modules():
        if isinstance(m, torch.nn.Conv2d):  # variance-preserving, so features are not nearly constant
            torch.nn.init.kaiming_normal_(m.weight, generator=g)
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
    F.save_feature_cnn(net.eval(), path, metadata={"recipe": "random init (test)"})
    return net.eval()


def _images(n, size=32, seed=0):
    return torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def _feats(n, d=16, seed=0, shift=0.0, scale=1.0):
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.standard_normal((n, d)) * scale + shift)


@pytest.fixture
def cnn_path(tmp_path):
    path = tmp_path / "feature_cnn.safetensors"
    _random_cnn(path)
    return path


# --- feature network and its torch-fidelity extractor ------------------------------------------------

def test_cnn_shapes_and_sizes():
    net = F.TinyShapesCNN(num_classes=20).eval()
    assert net.features(_images(3)).shape == (3, 128) and net.logits(_images(3)).shape == (3, 20)
    assert net.features(_images(2, size=64)).shape == (2, 128)  # adaptive pooling
    with pytest.raises(Exception, match="uint8"):
        net.features(torch.zeros(1, 3, 32, 32))


def test_save_load_roundtrip(tmp_path, cnn_path):
    net = F.load_feature_cnn(cnn_path)
    meta = F.read_feature_cnn_metadata(cnn_path)
    assert (meta["num_classes"], meta["width"], meta["recipe"]) == ("12", "8", "random init (test)")
    ref = _random_cnn(tmp_path / "again.safetensors")
    x = _images(4)
    torch.testing.assert_close(net.logits(x), ref.logits(x))
    other = _random_cnn(tmp_path / "other.safetensors", seed=1)   # another seed, another network
    assert not torch.allclose(F.load_feature_cnn(tmp_path / "other.safetensors").logits(x), net.logits(x), atol=1e-3)
    torch.testing.assert_close(F.load_feature_cnn(tmp_path / "other.safetensors").logits(x), other.logits(x))


def test_extractor_registered_once_and_batch_size_independent(cnn_path):
    assert FEATURE_EXTRACTORS_REGISTRY["tinyshapes-cnn"] is F.FeatureExtractorTinyShapesCNN
    F.register_tinyshapes_extractor()  # idempotent
    x = _images(64)
    a = fidelity.extract_features(x, weights_path=cnn_path, batch_size=7, device="cpu")
    b = fidelity.extract_features(x, weights_path=cnn_path, batch_size=64, device="cpu")
    assert a["features"].shape == (64, 32) and a["logits"].shape == (64, 12)
    torch.testing.assert_close(a["features"], b["features"], atol=1e-5, rtol=0)
    torch.testing.assert_close(a["logits"], b["logits"], atol=1e-5, rtol=0)
    net = F.load_feature_cnn(cnn_path)  # logits_unbiased = pool @ W^T (no bias), as Inception's
    torch.testing.assert_close(a["logits"], a["features"] @ net.fc.weight.T, atol=1e-5, rtol=0)


def test_our_fid_equals_torch_fidelity_calculate_metrics(cnn_path):
    """The in-memory path gives what torch-fidelity's own pipeline gives with our extractor."""
    from torch_fidelity import calculate_metrics

    x1, x2 = _images(40, seed=1), _images(40, seed=2).div(4, rounding_mode="floor")
    ds = [fidelity._TensorImages(x) for x in (x1, x2)]
    tf = calculate_metrics(input1=ds[0], input2=ds[1], fid=True, feature_extractor="tinyshapes-cnn",
                           feature_extractor_weights_path=str(cnn_path), cuda=False, cache=False, verbose=False,
                           save_cpu_ram=True)["frechet_inception_distance"]
    ours = fidelity.evaluate(x1, x2, metrics=("fid",), bootstrap=0, weights_path=cnn_path, device="cpu")
    assert ours["fid"]["value"] > 1e-3  # torch-fidelity keeps mu in float32, we use float64
    assert ours["fid"]["value"] == pytest.approx(tf, rel=1e-5)


def test_train_feature_cnn_learns_and_is_deterministic():
    colours = torch.tensor([[255, 0, 0], [0, 255, 0], [0, 0, 255]], dtype=torch.uint8)
    labels = torch.arange(48) % 3
    noise = torch.randint(-40, 41, (48, 3, 16, 16), generator=torch.Generator().manual_seed(0))
    images = (colours[labels][:, :, None, None].int() + noise).clamp(0, 255).to(torch.uint8)
    runs = [F.train_feature_cnn(images, labels, num_classes=3, epochs=8, batch_size=16, lr=1e-2, seed=5,
                                progress=False, width=4, augment=True, val_images=images, val_labels=labels)
            for _ in range(2)]
    (model, hist), (_, hist2) = runs
    assert hist == hist2 and len(hist) == 8 and set(hist[0]) == {"epoch", "loss", "train_acc", "val_acc"}
    assert hist[-1]["loss"] < hist[0]["loss"] and hist[-1]["train_acc"] == 1.0
    assert F.accuracy(model, images, labels) == hist[-1]["val_acc"] == 1.0
    # another seed: another initialisation and data order, hence another loss curve
    _, hist6 = F.train_feature_cnn(images, labels, num_classes=3, epochs=8, batch_size=16, lr=1e-2, seed=6,
                                   progress=False, width=4, augment=True, val_images=images, val_labels=labels)
    assert [h["loss"] for h in hist6] != [h["loss"] for h in hist]


# --- metric maths against independent references ------------------------------------------------------

def _fid_scipy(f1, f2):
    f1, f2 = f1.numpy(), f2.numpy()
    mu1, mu2 = f1.mean(0), f2.mean(0)
    s1, s2 = np.cov(f1, rowvar=False), np.cov(f2, rowvar=False)
    covmean = scipy.linalg.sqrtm(s1 @ s2).real
    return float((mu1 - mu2) @ (mu1 - mu2) + np.trace(s1) + np.trace(s2) - 2 * np.trace(covmean))


def test_fid_matches_scipy_sqrtm_reference():
    f1, f2 = _feats(400, seed=1), _feats(300, seed=2, shift=0.3, scale=1.5)
    ours = fidelity.fid_from_features(f1, f2)
    assert ours > 1 and ours == pytest.approx(_fid_scipy(f1, f2), rel=1e-6)


def test_fid_zero_on_itself_and_monotone_in_noise():
    f = _feats(500, seed=3)
    assert abs(fidelity.fid_from_features(f, f)) < 1e-8
    noise = _feats(500, seed=4)
    fids = [fidelity.fid_from_features(f, f + s * noise) for s in (0.0, 0.1, 0.3, 1.0, 3.0)]
    assert abs(fids[0]) < 1e-8 and all(a < b for a, b in zip(fids, fids[1:])), fids


def _prc_brute_force(real, fake, k=3):
    real, fake = real.numpy(), fake.numpy()
    radius_real = np.sort(cdist(real, real), axis=1)[:, k]  # column 0 is the point itself
    radius_fake = np.sort(cdist(fake, fake), axis=1)[:, k]
    d_fake_real = cdist(fake, real)
    precision = np.mean([any(d_fake_real[i, j] <= radius_real[j] for j in range(len(real))) for i in range(len(fake))])
    recall = np.mean([any(d_fake_real[i, j] <= radius_fake[i] for i in range(len(fake))) for j in range(len(real))])
    return precision, recall


def test_precision_recall_match_brute_force_k3():
    real, fake = _feats(150, d=8, seed=5), _feats(120, d=8, seed=6, shift=0.6, scale=0.7)
    pr = fidelity.prc_from_features(real, fake, k=3)
    p, r = _prc_brute_force(real, fake, k=3)
    assert 0 < p < 1 and 0 < r < 1
    assert (pr["precision"], pr["recall"]) == pytest.approx((p, r), abs=1e-6)  # float32 mean of 0/1 flags
    # swapping roles swaps the numbers
    swapped = fidelity.prc_from_features(fake, real, k=3)
    assert (swapped["precision"], swapped["recall"]) == pytest.approx((r, p), abs=1e-6)


def test_inception_score_of_one_hot_uniform_logits_is_num_classes():
    K = 16
    logits = 50.0 * torch.eye(K).repeat(100, 1)  # 100 confident samples per class
    assert fidelity.isc_from_logits(logits, splits=1) == pytest.approx(K, rel=1e-6)
    assert fidelity.isc_from_logits(logits) == pytest.approx(K, rel=0.1)
    assert fidelity.isc_from_logits(50.0 * torch.eye(K)[[0] * 64], splits=1) == pytest.approx(1.0, rel=1e-6)


def test_kid_near_zero_on_same_distribution_positive_otherwise():
    a, b = _feats(300, seed=7), _feats(300, seed=8)
    assert abs(fidelity.kid_from_features(a, b, subset_size=100, subsets=20)) < 0.05
    assert fidelity.kid_from_features(a, b + 1.0, subset_size=100, subsets=20) > 0.1


# --- evaluate(): bootstrap, record shape, reference statistics ---------------------------------------

def _feature_set(n, seed, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    return {"features": _feats(n, seed=seed, shift=shift), "logits": torch.randn(n, 10, generator=g) * 3}


def test_evaluate_bootstrap_is_positive_and_seeded():
    fake, ref = _feature_set(200, 1, shift=0.2), _feature_set(200, 2)
    kw = dict(bootstrap=5, kid_subset_size=100, kid_subsets=10)
    r1 = fidelity.evaluate(fake, ref, seed=0, **kw)
    r2 = fidelity.evaluate(fake, ref, seed=0, **kw)
    r3 = fidelity.evaluate(fake, ref, seed=1, **kw)
    assert list(r1) == ["fid", "is", "kid", "precision", "recall"] and r1 == r2
    for name, m in r1.items():
        assert set(m) == {"value", "stderr", "n", "higher_is_better", "error"}
        assert m["n"] == 200 and m["stderr"] > 0, name
        assert m["error"] == "bootstrap over generated samples, 5 resamples"
        assert m["higher_is_better"] == METRICS.get(name).higher_is_better
    assert r1["fid"]["stderr"] != r3["fid"]["stderr"]
    assert r1["fid"]["value"] == pytest.approx(fidelity.fid_from_features(fake["features"], ref["features"]))
    assert fidelity.evaluate(fake, ref, metrics=("fid",), bootstrap=0)["fid"]["stderr"] is None


def test_evaluate_with_reference_statistics_and_registered_metrics():
    fake, ref = _feature_set(100, 3), _feature_set(150, 4, shift=0.5)
    stats = fidelity.fid_statistics(ref["features"])
    by_stats = fidelity.evaluate(fake, {"mu": stats["mu"], "sigma": stats["sigma"]}, metrics=("fid",), bootstrap=0)
    assert by_stats["fid"]["value"] == pytest.approx(fidelity.fid_from_features(fake["features"], ref["features"]))
    assert {"fid", "is", "kid", "precision", "recall"} <= set(METRICS.names())
    assert METRICS.get("fid")(fake, ref) == pytest.approx(by_stats["fid"]["value"])
    assert METRICS.get("is")(fake) == pytest.approx(fidelity.isc_from_logits(fake["logits"], seed=0))
    assert [METRICS.get(n).higher_is_better for n in ("fid", "is", "kid", "precision", "recall")] == \
        [False, True, False, True, True]
    with pytest.raises(ValueError, match="reference"):
        fidelity.evaluate(fake, None, metrics=("fid",))


def test_evaluate_from_images_extracts_once(cnn_path, monkeypatch):
    calls = []
    real_extract = fidelity.extract_features
    monkeypatch.setattr(fidelity, "extract_features", lambda *a, **k: calls.append(1) or real_extract(*a, **k))
    out = fidelity.evaluate(_images(30, seed=1), _images(30, seed=2), bootstrap=3, weights_path=cnn_path,
                            device="cpu", kid_subset_size=30)
    assert len(calls) == 2 and all(m["stderr"] > 0 for m in out.values())


# --- clear errors for missing files, no downloads -----------------------------------------------------

def test_missing_feature_weights_error(tmp_path):
    missing = tmp_path / "nope.safetensors"
    with pytest.raises(F.WeightsNotFoundError, match="make tiny-models") as e:
        fidelity.extract_features(_images(2), weights_path=missing, device="cpu")
    assert "nope.safetensors" in str(e.value)
    with pytest.raises(FileNotFoundError, match="feature_cnn.safetensors"):
        F.load_feature_cnn(tmp_path / "feature_cnn.safetensors")


def test_missing_inception_weights_error(tmp_path, monkeypatch):
    monkeypatch.delenv("VARBENCH_CKPT_DIR", raising=False)
    monkeypatch.setenv("VARBENCH_INCEPTION_WEIGHTS", str(tmp_path / "absent.pth"))
    with pytest.raises(paper.PaperAssetNotFound, match="weights-inception-2015-12-05-6726825d.pth") as e:
        paper.extract_inception_features(_images(1))
    assert "absent.pth" in str(e.value) and "never downloads" in str(e.value)
    monkeypatch.setenv("VARBENCH_INCEPTION_WEIGHTS", str(tmp_path))  # a folder holding the file
    (tmp_path / paper.INCEPTION_WEIGHTS_FILENAME).write_bytes(b"")
    assert paper.resolve_inception_weights() == tmp_path / paper.INCEPTION_WEIGHTS_FILENAME


def test_inception_uses_local_file_and_never_downloads(tmp_path, monkeypatch):
    import torch_fidelity.feature_extractor_inceptionv3 as inc

    def no_download(*a, **k):
        raise AssertionError("torch-fidelity tried to download Inception weights")

    loaded = []
    monkeypatch.setattr(inc, "load_state_dict_from_url", no_download)
    monkeypatch.setattr(inc.FeatureExtractorInceptionV3, "load_state_dict", lambda self, sd, *a, **k: loaded.append(sd))
    weights = tmp_path / paper.INCEPTION_WEIGHTS_FILENAME
    torch.save({"marker": torch.ones(1)}, weights)
    out = paper.extract_inception_features(_images(2), weights_path=weights, device="cpu")
    assert out["features"].shape == (2, 2048) and out["logits"].shape == (2, 1008)
    assert len(loaded) == 1 and "marker" in loaded[0]
    with pytest.raises(ValueError, match="weights_path"):
        fidelity.extract_features(_images(1), extractor="vgg16")


def test_read_adm_reference(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    arr_NHWC = rng.integers(0, 256, (4, 8, 8, 3), dtype=np.uint8)
    mu, sigma = rng.standard_normal(5).astype(np.float32), np.eye(5)
    np.savez(tmp_path / paper.ADM_REFERENCE_FILENAME, arr_0=arr_NHWC, mu=mu, sigma=sigma)
    monkeypatch.setenv("VARBENCH_DATA_DIR", str(tmp_path))
    ref = paper.read_adm_reference()
    assert ref["images"].dtype == torch.uint8 and ref["images"].shape == (4, 3, 8, 8)
    assert torch.equal(ref["images"], torch.from_numpy(arr_NHWC).permute(0, 3, 1, 2))
    assert ref["mu"].dtype == np.float64 and np.allclose(ref["mu"], mu) and ref["sigma"].shape == (5, 5)
    assert ref["mu_s"] is None
    assert paper.read_adm_reference(tmp_path, load_images=False)["images"] is None
    np.savez(tmp_path / "bad.npz", arr_0=arr_NHWC)
    with pytest.raises(ValueError, match="mu"):
        paper.read_adm_reference(tmp_path / "bad.npz")


def test_missing_adm_reference_error(tmp_path, monkeypatch):
    monkeypatch.setenv("VARBENCH_DATA_DIR", str(tmp_path))
    with pytest.raises(paper.PaperAssetNotFound, match="VIRTUAL_imagenet256_labeled.npz") as e:
        paper.read_adm_reference()
    msg = str(e.value)
    assert "VARBENCH_DATA_DIR" in msg and "openaipublic.blob.core.windows.net/diffusion/jul-2021/ref_batches" in msg
    monkeypatch.delenv("VARBENCH_DATA_DIR")
    with pytest.raises(FileNotFoundError, match="VARBENCH_DATA_DIR is not set"):
        paper.read_adm_reference()


# --- bootstrap, KID and the ADM protocol against independent computations ---------------------------

def test_bootstrap_stderr_of_precision_is_the_binomial_stderr():
    """Precision is a mean of per-sample 0/1 flags (generated sample inside some reference ball),
    and the bootstrap resamples generated rows with the reference fixed, so its stderr must be
    √(p̂(1−p̂)/n). 30 of 100 generated rows sit on reference points (flag 1), 70 far away (0)."""
    rng = np.random.default_rng(0)
    real = rng.standard_normal((30, 4))
    fake = np.concatenate((real[rng.integers(0, 30, 30)], rng.standard_normal((70, 4)) + 50.0))
    fake, real = torch.from_numpy(fake[rng.permutation(100)]), torch.from_numpy(real)

    def precision(bootstrap, seed):
        return fidelity.evaluate(fake, real, metrics=("precision",), bootstrap=bootstrap, seed=seed)["precision"]

    out = precision(400, 3)
    assert out["value"] == pytest.approx(0.3, abs=1e-6)
    # B=400: the bootstrap estimate's own relative spread is ~1/√(2B) = 3.5%
    assert out["stderr"] == pytest.approx(np.sqrt(0.3 * 0.7 / 100), rel=0.15)   # 0.0458
    assert precision(20, 4) == precision(20, 4)
    assert precision(20, 4)["stderr"] != pytest.approx(precision(20, 5)["stderr"], rel=1e-9)


def _kid_numpy(f1, f2, subsets, size, seed):
    """Unbiased MMD² with k(x, y) = (x·y/d + 1)³, averaged over the subsets that torch-fidelity draws
    (``RandomState(seed)``: ``size`` rows of set 1, then of set 2, without replacement, per subset)."""
    f1, f2 = np.asarray(f1, dtype=np.float64), np.asarray(f2, dtype=np.float64)
    d, rs, vals = f1.shape[1], np.random.RandomState(seed), []
    off = ~np.eye(size, dtype=bool)
    for _ in range(subsets):
        x = f1[rs.choice(len(f1), size, replace=False)]
        y = f2[rs.choice(len(f2), size, replace=False)]
        kxx, kyy, kxy = ((a @ b.T / d + 1.0) ** 3 for a, b in ((x, x), (y, y), (x, y)))
        vals.append(kxx[off].mean() + kyy[off].mean() - 2.0 * kxy.mean())
    return float(np.mean(vals))


def test_kid_matches_an_independent_mmd_over_the_same_subsets():
    a, b = _feats(90, d=6, seed=11), _feats(70, d=6, seed=12, shift=0.4, scale=1.3)
    ours = fidelity.kid_from_features(a, b, subsets=25, subset_size=40, seed=7)
    assert ours > 0.05 and ours == pytest.approx(_kid_numpy(a, b, 25, 40, 7), rel=1e-9)
    # evaluate() passes (generated, reference) in that order and its seed
    ev = fidelity.evaluate(a, b, metrics=("kid",), bootstrap=0, seed=7, kid_subsets=25, kid_subset_size=40)
    assert ev["kid"]["value"] == pytest.approx(ours, rel=1e-12)
    # another seed draws other subsets
    assert fidelity.kid_from_features(a, b, subsets=25, subset_size=40, seed=8) == pytest.approx(
        _kid_numpy(a, b, 25, 40, 8), rel=1e-9)
    assert fidelity.kid_from_features(a, b, subsets=25, subset_size=40, seed=8) != pytest.approx(ours, rel=1e-6)
    # both sets exactly one subset big: one MMD² on the full sets
    full = fidelity.kid_from_features(a[:50], b[:50], subsets=100, subset_size=1000)
    assert full == pytest.approx(_kid_numpy(a[:50], b[:50], 1, 50, 0), rel=1e-9)


def _stand_in_inception(monkeypatch, dim=64):
    """torch-fidelity's ``inception-v3-compat`` extractor with a cheap deterministic network: it is
    constructed and given its weights file as usual (the file is read; ``load_state_dict`` checks it
    got that file's content), but ``forward`` is a fixed random projection of the pixels to
    ``dim`` "pool3" features and a linear map of those to the 1008 ``logits_unbiased``. A real
    Inception pass takes seconds per image on a CPU, and FID on 2048 dimensions seconds more; the
    network itself is not what these tests check."""
    import torch_fidelity.feature_extractor_inceptionv3 as inc

    def load_state_dict(self, sd, *a, **k):
        assert "marker" in sd

    def forward(self, x_uint8):
        assert x_uint8.dtype == torch.uint8
        flat = x_uint8.flatten(1).double() / 255
        g = torch.Generator().manual_seed(flat.shape[1])
        proj = torch.randn(flat.shape[1], dim, generator=g, dtype=torch.float64) / flat.shape[1] ** 0.5
        feats = torch.relu(flat @ proj).float()
        logits = feats @ (torch.randn(dim, 1008, generator=g) * 2.0)
        return tuple({"2048": feats, "logits_unbiased": logits}[f] for f in self.features_list)

    monkeypatch.setattr(inc, "load_state_dict_from_url", lambda *a, **k: pytest.fail("tried to download"))
    monkeypatch.setattr(inc.FeatureExtractorInceptionV3, "load_state_dict", load_state_dict)
    monkeypatch.setattr(inc.FeatureExtractorInceptionV3, "forward", forward)


def test_evaluate_adm_on_a_synthetic_reference(tmp_path, monkeypatch):
    """ADM protocol on a synthetic npz: FID against the file's mu/sigma (here mu = 0, sigma = c·I,
    unlike the statistics of its images), precision/recall (k=3) and KID against the features of
    its images ``arr_0`` (NHWC on disk), IS on one chunk without shuffling. Every number is
    recomputed independently from the features the (stand-in) network produced."""
    D, c = 64, 1e-3
    _stand_in_inception(monkeypatch, dim=D)
    weights = tmp_path / paper.INCEPTION_WEIGHTS_FILENAME
    torch.save({"marker": torch.ones(1)}, weights)
    rng = np.random.default_rng(0)
    arr_NHWC = rng.integers(0, 128, (10, 8, 8, 3), dtype=np.uint8)          # dark reference images
    np.savez(tmp_path / paper.ADM_REFERENCE_FILENAME, arr_0=arr_NHWC, mu=np.zeros(D, np.float32),
             sigma=(c * np.eye(D)).astype(np.float32))
    # 6 generated images like the reference, 6 bright ones (outside the reference manifold)
    fake_imgs = torch.cat((torch.from_numpy(rng.integers(0, 128, (6, 3, 8, 8), dtype=np.uint8)),
                           torch.from_numpy(rng.integers(128, 256, (6, 3, 8, 8), dtype=np.uint8))))

    seen = []
    real_extract = fidelity.extract_features

    def spy(images, *a, **k):
        out = real_extract(images, *a, **k)
        seen.append((images, out))
        return out
    monkeypatch.setattr(paper, "extract_features", spy)
    monkeypatch.setattr(fidelity, "extract_features", spy)

    res = paper.evaluate_adm(fake_imgs, tmp_path / paper.ADM_REFERENCE_FILENAME, weights_path=weights,
                             bootstrap=0, device="cpu")
    assert len(seen) == 2
    (ref_imgs, ref_fs), (gen_imgs, gen_fs) = seen
    assert torch.equal(ref_imgs, torch.from_numpy(arr_NHWC).permute(0, 3, 1, 2)) and torch.equal(gen_imgs, fake_imgs)
    real, fake = ref_fs["features"].double(), gen_fs["features"].double()
    n = len(fake)
    assert real.shape == (10, D) and fake.shape == (12, D)

    # FID with sigma_ref = c·I: tr√(Σ_f·cI) = √c·Σ singular values of the centred features / √(n−1)
    s = np.linalg.svd((fake - fake.mean(0)).numpy(), compute_uv=False)
    fid = float(fake.mean(0).square().sum()) + (s ** 2).sum() / (n - 1) + D * c - 2 * np.sqrt(c) * s.sum() / np.sqrt(n - 1)
    assert res["fid"]["value"] == pytest.approx(fid, rel=1e-6)
    assert res["fid"]["value"] != pytest.approx(fidelity.fid_from_features(fake, real), rel=1e-2)
    p, r = _prc_brute_force(real, fake, k=3)
    assert (res["precision"]["value"], res["recall"]["value"]) == pytest.approx((p, r), abs=1e-6)
    assert 0 < p <= 0.5 and r > 0   # the bright half is outside the reference manifold
    assert res["kid"]["value"] > 0.05
    assert res["kid"]["value"] == pytest.approx(_kid_numpy(fake, real, 100, 10, 0), rel=1e-5)   # float32 kernels
    probs = torch.softmax(gen_fs["logits"].double(), dim=1).numpy()
    isc = np.exp(np.mean(np.sum(probs * (np.log(probs) - np.log(probs.mean(0))), axis=1)))
    assert isc > 1.5 and res["is"]["value"] == pytest.approx(isc, rel=1e-5)
    assert all(m["n"] == 12 and m["stderr"] is None for m in res.values())

    # the bench in two steps (features of 64-image chunks, then scores: what the ranks of a sharded
    # run do) gives the one-step numbers, every value and stderr
    from bench.benches.imagenet256 import ImageNet256
    monkeypatch.setenv("VARBENCH_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(paper, "resolve_inception_weights", lambda path=None: weights)
    bench = ImageNet256()
    assert bench.feature_chunk % 64 == 0              # aligned with the Inception batches of 64
    one = paper.evaluate_adm(fake_imgs, tmp_path / paper.ADM_REFERENCE_FILENAME, weights_path=weights,
                             bootstrap=bench.bootstrap)
    two = bench.score(bench.features(fake_imgs), torch.zeros(12), seed=0)
    assert two == bench.evaluate(fake_imgs, torch.zeros(12)) and set(two) == set(one)
    assert all(two[k]["value"] == one[k]["value"] and two[k]["stderr"] == one[k]["stderr"] for k in one)


def test_evaluate_adm_protocol_settings(tmp_path, monkeypatch):
    """IS on chunks of 5000 after a fixed permutation, KID subsets of 1000, P/R with k = 3, Inception."""
    weights = tmp_path / paper.INCEPTION_WEIGHTS_FILENAME
    weights.write_bytes(b"")
    calls = []
    monkeypatch.setattr(paper, "evaluate", lambda *a, **k: calls.append((a, k)) or {})
    ref = {"features": torch.zeros(4, 2), "logits": None, "mu": np.zeros(2), "sigma": np.eye(2)}
    paper.evaluate_adm(torch.zeros(10000, 3, 1, 1, dtype=torch.uint8), ref, weights_path=weights, seed=9)
    (args, kw), = calls
    assert args[1] is ref and args[4] == 9
    assert kw["extractor"] == "inception-v3-compat" and kw["isc_splits"] == 2 and kw["isc_shuffle"] is True
    assert kw["kid_subset_size"] == 1000 and kw["prc_neighborhood"] == 3 and kw["weights_path"] == weights


def test_is_of_class_major_samples_needs_mixed_chunks():
    """Samples come class by class; chunks taken in that order see half the classes each here and IS halves
    (ImageNet: 100 classes per chunk of 5000, IS capped near 100). The ADM protocol permutes first."""
    from bench.metrics.fidelity import isc_from_logits
    K, per = 20, 50
    logits = torch.full((K * per, K), -30.0)
    logits[torch.arange(K * per), torch.arange(K * per) // per] = 30.0      # confident, class-major
    assert isc_from_logits(logits, splits=2, shuffle=False) == pytest.approx(K / 2, rel=1e-3)
    assert isc_from_logits(logits, splits=2, shuffle=True, seed=0) > 0.9 * K


def test_bootstrap_can_leave_kid_out_without_changing_any_other_number():
    """shapes-c2i v2 bootstraps FID/IS/P/R only: their values and errors equal the all-metric
    bootstrap's (the same resample draws); KID keeps its value and reports the subset std instead."""
    import torch

    from bench.metrics.fidelity import evaluate
    g = torch.Generator().manual_seed(0)
    fake = {"features": torch.randn(80, 16, generator=g), "logits": torch.randn(80, 10, generator=g)}
    ref = torch.randn(100, 16, generator=g) + 0.3
    kw = dict(bootstrap=5, seed=3, kid_subsets=20, kid_subset_size=50)
    full = evaluate(fake, ref, **kw)
    part = evaluate(fake, ref, bootstrap_metrics=("fid", "is", "precision", "recall"), **kw)
    for m in ("fid", "is", "precision", "recall"):
        assert (part[m]["value"], part[m]["stderr"]) == (full[m]["value"], full[m]["stderr"])
    assert part["kid"]["value"] == full["kid"]["value"] and part["kid"]["stderr"] is None
    assert part["kid"]["subset_std"] > 0 and "subsets" in part["kid"]["error"]


def test_kid_left_out_of_the_bootstrap_carries_its_subset_std_and_says_so():
    """What every tiny-world run does (`bootstrap_metrics` without KID): one KID pass gives its mean and
    its std over the random subsets; the other metrics keep their bootstrap errors."""
    fake, ref = _feature_set(120, 5, shift=0.3), _feature_set(120, 6)
    out = fidelity.evaluate(fake, ref, metrics=("fid", "kid", "recall"), bootstrap=3, seed=4, kid_subsets=7,
                            kid_subset_size=50, bootstrap_metrics=("fid", "recall"))
    mean, std = fidelity.kid_from_features(fake["features"], ref["features"], 7, 50, 4, return_std=True)
    assert out["kid"] == {"value": mean, "stderr": None, "n": 120, "higher_is_better": False, "subset_std": std,
                          "error": "no bootstrap; subset_std: std over 7 random subsets (torch-fidelity)"}
    assert out["fid"]["stderr"] > 0 and out["fid"]["error"] == "bootstrap over generated samples, 3 resamples"
    # recall alone is computed (and bootstrapped) without precision
    assert list(out) == ["fid", "kid", "recall"] and out["recall"]["stderr"] > 0
    assert out["recall"]["value"] == fidelity.prc_from_features(ref["features"], fake["features"], 3)["recall"]


def test_a_standard_error_needs_two_resamples():
    fake, ref = _feature_set(60, 7, shift=0.3), _feature_set(60, 8)
    one = fidelity.evaluate(fake, ref, metrics=("fid",), bootstrap=1)["fid"]
    two = fidelity.evaluate(fake, ref, metrics=("fid",), bootstrap=2)["fid"]
    assert one["stderr"] is None and two["stderr"] > 0
    # the resamples by hand: n row indices drawn from all n rows, the sample standard deviation of their FIDs
    rng = np.random.default_rng(0)
    f = [fidelity.fid_from_features(fake["features"][torch.from_numpy(rng.integers(0, 60, size=60))], ref["features"])
         for _ in range(2)]
    assert two["stderr"] == pytest.approx(abs(f[0] - f[1]) / np.sqrt(2), rel=1e-9)
    assert fidelity.evaluate(fake, ref, metrics=("fid",), bootstrap=0)["fid"]["error"] == "none (bootstrap=0)"


@pytest.mark.parametrize("fake, ref, metrics, message", [
    ("fs", "fs", ("fid", "sfid"), "unknown fidelity metric(s) ['sfid']; known: fid, is, kid, precision, recall"),
    ("logits", "fs", ("fid",), "generated samples have no features"),
    ("logits", None, ("is",), None),                                      # IS alone: logits, no reference
    ("features", None, ("is",), "IS needs logits: pass images (or extract_features output) from an extractor "
                                "with 'logits_unbiased'"),
    ("fs", None, ("is", "fid", "kid"), "['fid', 'kid'] need a reference set"),
    ("fs", "stats", ("fid", "precision", "kid"), "['precision', 'kid'] need reference features, not only mu/sigma"),
    ("fs", "stats", ("fid",), None),                                      # FID from mu/sigma alone
    ("fs", "stats", ("recall",), "['recall'] need reference features, not only mu/sigma"),
    ("fs", "mu", ("fid",), "FID needs reference features or mu/sigma"),
])
def test_what_each_metric_needs_is_checked_before_any_work(fake, ref, metrics, message):
    full = _feature_set(40, 9)
    stats = fidelity.fid_statistics(_feature_set(40, 10)["features"])
    sets = {"fs": full, "logits": {"logits": full["logits"]}, "features": {"features": full["features"]},
            "stats": {"mu": stats["mu"], "sigma": stats["sigma"]}, "mu": {"mu": stats["mu"]}, None: None}
    call = lambda: fidelity.evaluate(sets[fake], sets[ref], metrics=metrics, bootstrap=0)   # noqa: E731
    if message is None:
        assert set(call()) == set(metrics)
    else:
        with pytest.raises(ValueError) as e:
            call()
        assert str(e.value) == message
