"""The bench interface's defaults (bench.benches.base) and the tiny class-conditional bench's own parts: the
fidelity setting and its refusals, class-major labels, n checks, batch seeds, protocol identity, the default
two-step evaluation, FID*, and shapes-c2i's feature rows and class accuracy."""
import pytest
import torch

from bench.benches.base import Bench
from bench.benches.shapes_c2i import ShapesC2I
from bench.registry import BENCHES
from bench.tiny.assets import ASSETS


class Three(Bench):
    name, num_classes, default_n, feature_chunk = "three", 3, 30, 4

    def features(self, imgs, progress=False):
        return {"features": imgs.float().flatten(1)}

    def score(self, feats, labels, seed=0, progress=True):
        return {"sum": float(feats["features"].sum()), "labels": list(labels), "seed": seed, "progress": progress}


def test_fidelity_is_a_boolean_and_needs_feature_rows():
    assert Three().fidelity is False and Three(fidelity=True).fidelity is True
    for bad in (1, "true", None):
        with pytest.raises(ValueError) as e:
            Three(fidelity=bad)
        assert str(e.value) == f"fidelity must be true or false, got {bad!r}"
    rows = ", ".join(sorted(b for b in BENCHES.names() if BENCHES.get(b).feature_chunk))
    assert rows == "imagenet256, mjhq30k, shapes-c2i, shapes-mjhq"
    with pytest.raises(ValueError) as e:
        BENCHES.get("shapes-geneval")(fidelity=True)
    assert str(e.value) == ("bench shapes-geneval has no feature rows to compare with the original model's outputs; "
                            f"benches with fidelity metrics: {rows}")
    assert BENCHES.get("shapes-geneval")(fidelity=False).fidelity is False


def test_labels_are_class_major_and_n_a_positive_multiple_of_the_classes():
    assert Three().labels(6).tolist() == [0, 0, 1, 1, 2, 2]
    assert Three.check_n(3) == 3 and Three.check_n(30) == 30
    from bench.defaults import N_MAX
    assert Three.check_n(N_MAX - N_MAX % 3) == N_MAX - N_MAX % 3
    for bad in (0, -3, 4, 3.0, True, "6", N_MAX - N_MAX % 3 + 3):
        with pytest.raises(ValueError) as e:
            Three.check_n(bad)
        assert str(e.value) == f"--n {bad!r}: three needs a positive multiple of its 3 classes up to 10,000,000 (default 30)"
    with pytest.raises(ValueError, match="--n 4: three"):
        Three().labels(4)


def test_one_seed_per_batch_and_the_protocol_identity():
    assert [Bench.batch_seed(s, b) for s, b in [(0, 0), (0, 5), (2, 0), (2, 7)]] == [0, 5, 2_000_006, 2_000_013]
    assert Three().identity() == {"version": 1}
    assert Three(fidelity=True).identity() == {"version": 1, "fidelity": True}
    assert Three.args_from_protocol(None) == {} == Three.args_from_protocol({"version": 1, "fidelity": False})
    assert Three.args_from_protocol({"version": 1, "fidelity": True}) == {"fidelity": True}
    Three().preflight()          # nothing to check by default


def test_evaluate_scores_the_feature_rows_and_what_a_bench_must_provide():
    imgs = torch.arange(24, dtype=torch.uint8).view(2, 3, 2, 2)
    assert Three().evaluate(imgs, ["a", "b"], seed=4, progress=False) == \
        {"sum": float(imgs.float().sum()), "labels": ["a", "b"], "seed": 4, "progress": False}
    b = Bench()
    b.name = "plain"
    for call, what in [(lambda: b.features(imgs), "scores images in one step (feature_chunk = 0)"),
                       (lambda: b.score({}, []), "scores images in one step (feature_chunk = 0)"),
                       (lambda: b.data(8, "train", None), "provides no training/calibration data")]:
        with pytest.raises(NotImplementedError) as e:
            call()
        assert str(e.value) == f"plain {what}"


def test_lpips_weights_come_from_the_environment_in_the_paper_world_only(monkeypatch):
    monkeypatch.setenv("VARBENCH_LPIPS_ALEXNET", "/w/alexnet.pth")
    assert BENCHES.get("imagenet256")().lpips_weights == "/w/alexnet.pth"
    assert ShapesC2I().lpips_weights is None
    monkeypatch.delenv("VARBENCH_LPIPS_ALEXNET")
    assert BENCHES.get("imagenet256")().lpips_weights is None


def test_fid_star_is_the_benchs_fid_between_the_two_sets():
    from bench.metrics.pairs import fid_star
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(40, 6, generator=g, dtype=torch.float64), torch.randn(40, 6, generator=g, dtype=torch.float64)
    m = Three().fidelity_metrics({"features": a}, {"features": b}, labels=None)
    assert m == {"fid_star": {"value": fid_star(a, b), "n": 40, "higher_is_better": False}}
    assert m["fid_star"]["value"] > 0 and isinstance(m["fid_star"]["n"], int)


needs_assets = pytest.mark.skipif(not (ASSETS / "feature_cnn.safetensors").is_file(),
                                  reason="tiny-world checkpoints not built (make tiny-models)")


@needs_assets
def test_shapes_c2i_names_its_feature_network_and_refuses_a_missing_one(tmp_path, monkeypatch):
    from bench.checkpoint import sha256
    b = ShapesC2I()
    w = ASSETS / "feature_cnn.safetensors"
    assert b.feature_weights == str(w)
    assert b.identity() == {"version": 2, "files": {"feature_cnn.safetensors": sha256(w)}}
    assert ShapesC2I(fidelity=True).identity()["fidelity"] is True
    monkeypatch.setenv("VARBENCH_TINY_DIR", str(tmp_path))      # read at call time
    assert b.feature_weights == str(tmp_path / "feature_cnn.safetensors")
    for call in (b.preflight, b.identity):
        with pytest.raises(FileNotFoundError) as e:
            call()
        assert str(e.value) == (f"feature network {tmp_path / 'feature_cnn.safetensors'} not found. Put it in "
                                f"{tmp_path}, point VARBENCH_TINY_DIR at the folder that has it, or unset "
                                f"VARBENCH_TINY_DIR to use the one shipped with varbench. `varbench train-tiny` "
                                f"retrains it.")
    assert ShapesC2I(feature_weights=str(w)).feature_weights == str(w)
    with pytest.raises(FileNotFoundError) as e:   # a path given explicitly: no folder or variable to point
        ShapesC2I(feature_weights=str(tmp_path / "no.safetensors")).preflight()
    assert str(e.value) == (f"feature network {tmp_path / 'no.safetensors'} not found. Give the path of an existing "
                            f"file. `varbench train-tiny` retrains it.")


@needs_assets
def test_shapes_c2i_rows_and_class_accuracy():
    """The rows: torch-fidelity's features and logits of the feature CNN, and its class logits; class_acc the
    fraction of images classified as their label with its binomial standard error."""
    from bench.data import tinyshapes
    from bench.metrics.features import load_feature_cnn
    from bench.metrics.fidelity import extract_features
    imgs, labels = tinyshapes.generate(24, "ref")
    b = ShapesC2I()
    rows = b.features(imgs)
    ref = extract_features(imgs, weights_path=b.feature_weights, batch_size=64)
    assert set(rows) == {"features", "logits", "class_logits"}
    assert torch.equal(rows["features"], ref["features"]) and torch.equal(rows["logits"], ref["logits"])
    with torch.no_grad():
        assert torch.equal(rows["class_logits"], load_feature_cnn(b.feature_weights).eval().logits(imgs))
    wrong = labels.clone()
    wrong[:6] = (wrong[:6] + 1) % 12                # 6 of 24 labels that the CNN will not give
    hit = (rows["class_logits"].argmax(1) == wrong).float()
    m = b.score(rows, wrong, progress=False)
    assert m["class_acc"] == {"value": hit.mean().item(), "stderr": (hit.std() / 24 ** 0.5).item(), "n": 24,
                              "higher_is_better": True, "error": "binomial standard error over samples"}
    assert m["class_acc"]["value"] <= 18 / 24 and m["class_acc"]["stderr"] > 0
    assert set(m) == set(ShapesC2I.metrics) and m["fid"]["n"] == 24


@needs_assets
def test_shapes_c2i_training_and_calibration_data_are_tokenised_tinyshapes_splits():
    from bench.data import tinyshapes
    from bench.data.tokens import tokenize_images
    from bench.registry import MODELS
    vae = MODELS.get("tiny-var")().vae
    for split, source in (("calib", "calib"), ("train", "train"), ("anything else", "train")):
        labels, tokens = ShapesC2I().data(6, split, vae)
        imgs, want = tinyshapes.generate(6, source)
        assert torch.equal(labels, want)
        assert all(torch.equal(a, b) for a, b in zip(tokens, tokenize_images(vae, imgs, progress=False)))


def test_imagenet_calibration_data_is_vars_evaluation_transform_at_a_uniform_stride(tmp_path, monkeypatch):
    """ImageNet256.data on an ImageFolder in tmp_path: images picked at a uniform stride (EVAR-code's calibration
    sampling), each through VAR's val transform (utils/data.py: Resize(288, LANCZOS), CenterCrop(256), ToTensor,
    ×2 − 1, composed here from torchvision), tokenised 32 at a time by the model's VQVAE, scale by scale."""
    import numpy as np
    from PIL import Image
    from torchvision import transforms
    from torchvision.transforms import InterpolationMode

    from bench.benches.imagenet256 import ImageNet256
    monkeypatch.setenv("VARBENCH_DATA_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError) as e:
        ImageNet256().data(4, "calib", None)
    assert str(e.value) == (f"ImageNet val folder not found: {tmp_path / 'imagenet' / 'val'}\n  Put the ILSVRC-2012 "
                            f"images there in ImageFolder layout (one sub-folder per class, n01440764/ …) or set "
                            f"VARBENCH_DATA_DIR. varbench never downloads data.")
    with pytest.raises(FileNotFoundError, match=r"ImageNet train folder not found: .*imagenet/train\n"):
        ImageNet256().data(4, "train", None)
    rng = np.random.default_rng(0)
    # sizes whose longer side at 288 has a fraction ≥ 0.5 (500×353: 407.93 → torchvision keeps 407), odd crops
    sizes = [(500, 353), (353, 500), (300, 300), (640, 427), (290, 311)]
    paths = []
    for c in ("n01", "n02", "n03"):
        (tmp_path / "imagenet" / "val" / c).mkdir(parents=True)
        for k, (w, h) in enumerate(sizes):
            p = tmp_path / "imagenet" / "val" / c / f"{k}.png"
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(p)
            paths.append((p, int(c[-1]) - 1))

    class FakeVQVAE:
        post_quant_conv = torch.nn.Conv2d(1, 1, 1)

        def __init__(self):
            self.batches = []

        def img_to_idx(self, x):
            self.batches.append(x)
            return [x.mean((1, 2, 3), keepdim=True).flatten(1), x[:, :, 100:102, 50].flatten(1)]
    vae = FakeVQVAE()
    labels, tokens = ImageNet256().data(34, "calib", vae)
    picks = torch.linspace(0, 14, 34).round().long().tolist()
    assert labels.tolist() == [paths[i][1] for i in picks]
    assert [len(b) for b in vae.batches] == [32, 2]
    official = transforms.Compose([transforms.Resize(288, interpolation=InterpolationMode.LANCZOS),
                                   transforms.CenterCrop((256, 256)), transforms.ToTensor()])
    want = torch.stack([official(Image.open(paths[i][0]).convert("RGB")) * 2 - 1 for i in picks])
    got = torch.cat(vae.batches)
    assert got.shape == (34, 3, 256, 256) and torch.equal(got, want)
    assert [t.shape for t in tokens] == [(34, 1), (34, 6)]
    assert torch.equal(tokens[0], want.mean((1, 2, 3), keepdim=True).flatten(1))
    assert torch.equal(tokens[1], want[:, :, 100:102, 50].flatten(1))
