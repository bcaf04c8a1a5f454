"""The original model's cached outputs for the fidelity metrics (bench.originals), without a model: which spec
is the original, where its folder is, when it is complete, what ``ensure`` samples, writes and reuses, and the
pair rows and their record entries."""
import json

import pytest
import torch

from bench import originals
from bench.benches.base import Bench
from bench.io import save_png
from bench.metrics.pairs import psnr, ssim
from bench.plan import make_spec
from bench.runner import sample_features


def _spec(methods=("magnitude:sparsity=0.4",), **kw):
    return make_spec("tiny-var", list(methods), bench="shapes-c2i", n=24, bench_args={"fidelity": True},
                     need_ckpt=False, **kw)


def test_the_original_is_the_dense_run_of_the_same_protocol_without_the_setting():
    spec = _spec(sampling={"cfg": 3.0}, seed=2)
    dense = make_spec("tiny-var", [], bench="shapes-c2i", n=24, need_ckpt=False, sampling={"cfg": 3.0}, seed=2)
    orig = originals.original_spec(spec)
    assert orig == dense and orig.key() == dense.key()
    assert spec.protocol["fidelity"] is True and spec.methods       # the spec itself is left as it was
    assert orig.requested == {"methods": [], "sampling": {"cfg": 3.0}}
    # every method run of that protocol, and the original's own fidelity run, share one folder
    root = "/results"
    d = originals.folder(spec, root)
    assert d == dense.path(root).parent / "_originals" / dense.key()
    assert str(d).startswith("/results/tiny/tiny-var/shapes-c2i/_originals/")
    same = {"sampling": {"cfg": 3.0}, "seed": 2}
    assert originals.folder(_spec((), **same), root) == originals.folder(_spec(("magnitude:sparsity=0.2",), **same),
                                                                         root) == d
    assert originals.folder(_spec(sampling={"cfg": 3.0}, seed=1), root) != d != originals.folder(_spec(seed=2), root)
    assert originals.image_path(d, 7) == d / "images" / "000007.png"


@pytest.mark.parametrize("content, done", [
    (None, False), ("{}", False), ('{"run_id": "other"}', False), ("{not json", False), ("[1]", False), ("KEY", True),
])
def test_complete_needs_a_done_mark_of_this_original(tmp_path, content, done):
    orig = originals.original_spec(_spec())
    if content is not None:
        (tmp_path / originals.DONE).write_text(json.dumps({"run_id": orig.key()}) if content == "KEY" else content)
    assert originals.complete(tmp_path, orig) is done


class FakeGen:
    def __init__(self):
        self.seeds = []

    def generate(self, labels, seed=0, **sampling):
        self.seeds.append((seed, sampling))
        v = torch.tensor([int(x) * 20 + seed % 7 for x in labels], dtype=torch.uint8)
        return v.view(-1, 1, 1, 1).expand(-1, 3, 4, 4).contiguous()


class FakeBench(Bench):
    batch_size, feature_chunk = 4, 8

    def features(self, imgs, progress=False):
        return {"features": imgs.float().mean((1, 2, 3))[:, None]}


def test_ensure_samples_what_is_missing_writes_it_and_then_reads_the_cache(tmp_path):
    spec = _spec(sampling={"cfg": 3.0}, seed=5)
    orig = originals.original_spec(spec)
    labels = torch.arange(10) % 12
    made, streamed = [], []
    gen = FakeGen()

    def make():
        made.append(1)
        return gen

    def stream(*a, **kw):
        streamed.append(kw["desc"])
        return sample_features(*a, **kw)

    feats = originals.ensure(spec, FakeBench(), labels, make, stream, tmp_path, progress=False)
    d = originals.folder(spec, tmp_path)
    assert made == [1] and streamed == [f"original {orig.label()}"]
    assert gen.seeds == [(Bench.batch_seed(5, b), orig.sampling) for b in range(3)]     # the original's seed and sampling
    assert sorted(p.name for p in (d / "images").iterdir()) == [f"{i:06d}.png" for i in range(10)]
    assert torch.equal(originals.load_images(d, 0, 10), torch.cat([gen.generate(labels[s:s + 4], seed=Bench.batch_seed(5, s // 4))
                                                                    for s in range(0, 10, 4)]))
    assert json.loads((d / "spec.json").read_text()) == orig.to_dict()
    assert json.loads((d / originals.DONE).read_text()) == {"run_id": orig.key(), "n": 10}
    assert torch.equal(torch.load(d / originals.FEATURES)["features"], feats["features"])
    assert not list(d.glob(".*"))                                    # no temporary file left
    # complete: read back, nothing made, nothing streamed
    again = originals.ensure(spec, FakeBench(), labels, make, stream, tmp_path, progress=False)
    assert torch.equal(again["features"], feats["features"]) and made == [1] and len(streamed) == 1
    # the done mark gone, every image there: streamed from the disk, no generator made, no image rewritten
    (d / originals.DONE).unlink()
    stamp = originals.image_path(d, 3).stat().st_mtime_ns
    again = originals.ensure(spec, FakeBench(), labels, make, stream, tmp_path, progress=False)
    assert made == [1] and len(streamed) == 2 and torch.equal(again["features"], feats["features"])
    assert originals.image_path(d, 3).stat().st_mtime_ns == stamp and originals.complete(d, orig)
    # one image of the middle batch gone: one generator, that batch alone sampled, the others kept
    (d / originals.DONE).unlink()
    originals.image_path(d, 5).unlink()
    save_png(originals.image_path(d, 4), torch.zeros(3, 4, 4, dtype=torch.uint8))   # a cached image is not replaced
    gen.seeds.clear()
    again = originals.ensure(spec, FakeBench(), labels, make, stream, tmp_path, progress=False)
    assert made == [1, 1] and [s for s, _ in gen.seeds] == [Bench.batch_seed(5, 1)]
    assert originals.load_images(d, 4, 5).sum() == 0 and originals.image_path(d, 5).is_file()
    assert torch.equal(originals.load_images(d, 5, 6), FakeGen().generate(labels[5:6], seed=Bench.batch_seed(5, 1)))


def test_an_unreadable_cache_says_which_file_and_to_remake_it(tmp_path):
    spec = _spec(seed=5)
    labels = torch.arange(10) % 12
    originals.ensure(spec, FakeBench(), labels, lambda: FakeGen(), sample_features, tmp_path, progress=False)
    d = originals.folder(spec, tmp_path)
    feats = d / originals.FEATURES
    feats.write_bytes(feats.read_bytes()[:100])                      # truncated
    with pytest.raises(originals.CacheError) as e:
        originals.ensure(spec, FakeBench(), labels, lambda: FakeGen(), sample_features, tmp_path, progress=False)
    assert str(e.value).startswith(f"{feats}: the unmodified model's cached output is unreadable (")
    assert str(e.value).endswith(f"); delete {d} and run again: it is remade from the same seeds")
    img = originals.image_path(d, 7)
    img.write_bytes(img.read_bytes()[:40])
    with pytest.raises(ValueError) as e:
        originals.load_images(d, 4, 8)
    assert str(e.value).startswith(f"{img}: unreadable image (")
    assert str(e.value).endswith(f"); the unmodified model's cached output; delete {d} and run again: it is remade "
                                 f"from the same seeds")
    with pytest.raises(ValueError):                                  # the CLI's one-line errors
        originals.load_images(d, 7, 8)


def test_pair_rows_are_psnr_and_ssim_against_the_cache_and_lpips_with_weights(tmp_path, monkeypatch):
    g = torch.Generator().manual_seed(0)
    cached = torch.randint(0, 256, (5, 3, 16, 16), dtype=torch.uint8, generator=g)
    for i, img in enumerate(cached):
        save_png(originals.image_path(tmp_path, i), img)
    run = torch.randint(0, 256, (3, 3, 16, 16), dtype=torch.uint8, generator=g)
    rows = originals.pair_rows(tmp_path, 2, run)
    assert set(rows) == {"psnr", "ssim"}
    assert torch.equal(rows["psnr"], psnr(run, cached[2:5])) and torch.equal(rows["ssim"], ssim(run, cached[2:5]))
    import bench.metrics.pairs as pairs
    seen = []
    monkeypatch.setattr(pairs, "lpips", lambda a, b, w: seen.append((a, b, w)) or torch.full((len(a),), 0.5))
    rows = originals.pair_rows(tmp_path, 1, run, lpips_weights="alex.pth")
    assert rows["lpips"].tolist() == [0.5] * 3
    (a, b, w), = seen
    assert a is run and torch.equal(b, cached[1:4]) and w == "alex.pth"


def test_pair_metrics_are_means_with_their_standard_errors():
    v = torch.tensor([30.0, 34.0, 41.0, 100.0])
    m = originals.pair_metrics({"psnr": v, "ssim": torch.tensor([0.5, 0.75]), "lpips": torch.tensor([0.25])})
    assert m["psnr"] == {"value": 51.25, "stderr": pytest.approx(float(v.double().std()) / 2, rel=1e-12), "n": 4,
                         "higher_is_better": True, "error": "standard error of the mean over image pairs"}
    assert m["ssim"]["value"] == 0.625 and m["ssim"]["stderr"] == pytest.approx(0.125, rel=1e-12)
    assert m["ssim"]["higher_is_better"] is True and m["ssim"]["n"] == 2
    assert m["lpips"] == {"value": 0.25, "stderr": 0.0, "n": 1, "higher_is_better": False,
                          "error": "standard error of the mean over image pairs"}
    assert list(m) == ["psnr", "ssim", "lpips"] and originals.pair_metrics({"psnr": v})["psnr"]["n"] == 4
    assert originals.pair_metrics({}) == {}
