"""MJHQ-30K and shapes-mjhq: the meta_data.json reader, per-category FID against clean-fid, clean-fid's
features of in-memory images against its own folder pipeline, the prompts and categories of the
tiny bench, CLIP score's formula, and the fidelity runs (FID* of a model against itself, the cache
of the original's outputs reused and resumed)."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.benches import mjhq as mb
from bench.metrics import mjhq as mm
from bench.registry import BENCHES


def _meta(tmp_path, per=3, bad=None):
    meta = {}
    for c in mm.MJHQ_CATEGORIES:
        for k in range(per):
            meta[f"{c[:3]}{k:04x}"] = {"category": c, "prompt": f"a {c} picture number {k}"}
    if bad:
        meta.update(bad)
    p = tmp_path / "meta_data.json"
    p.write_text(json.dumps(meta))
    return p


def test_read_meta_keeps_file_order_and_names_bad_entries(tmp_path):
    df = mm.read_meta(_meta(tmp_path))
    assert list(df.columns) == ["id", "category", "prompt"] and len(df) == 30
    assert df["id"].iloc[0] == "ani0000" and df["category"].iloc[-1] == "vehicles"
    sel = mm.select(df, 2, mm.MJHQ_CATEGORIES)
    assert list(sel["category"]) == [c for c in mm.MJHQ_CATEGORIES for _ in range(2)]
    assert list(sel["prompt"][:2]) == ["a animals picture number 0", "a animals picture number 1"]
    assert list(sel.index) == list(range(2 * len(mm.MJHQ_CATEGORIES)))     # one frame, numbered afresh
    assert len(mm.select(df, 3, mm.MJHQ_CATEGORIES)) == 30                   # every prompt of each category
    with pytest.raises(ValueError) as e:
        mm.select(df, 4, mm.MJHQ_CATEGORIES)
    assert str(e.value) == "category animals has 3 prompts, fewer than the 4 asked for"
    with pytest.raises(ValueError, match="entry 'x1' has category 'cats'"):
        mm.read_meta(_meta(tmp_path, bad={"x1": {"category": "cats", "prompt": "p"}}))
    with pytest.raises(ValueError, match="entry 'x2' is not"):
        mm.read_meta(_meta(tmp_path, bad={"x2": {"category": "art"}}))
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        mm.read_meta(tmp_path / "broken.json")
    with pytest.raises(FileNotFoundError, match="meta_data.json"):
        mm.read_meta(tmp_path / "nope" / "meta_data.json")


def test_category_fids_are_clean_fid_on_each_category_and_on_all():
    from cleanfid.fid import fid_from_feats

    from bench.metrics.fidelity import fid_from_features
    rng = np.random.default_rng(0)
    cats = ("a", "b", "c")
    g = rng.normal(size=(90, 8))
    r = rng.normal(0.3, 1.2, size=(60, 8))
    gc, rc = [c for c in cats for _ in range(30)], [c for c in cats for _ in range(20)]
    out = mm.category_fids(g, gc, r, rc, cats)
    assert out["fid"]["value"] == pytest.approx(fid_from_feats(g, r), rel=1e-12)
    for k, c in enumerate(cats):
        want = fid_from_feats(g[30 * k:30 * k + 30], r[20 * k:20 * k + 20])
        assert out[f"fid_{c}"]["value"] == pytest.approx(want, rel=1e-12)
        assert out[f"fid_{c}"]["n"] == 30
    assert out["fid_mean"]["value"] == pytest.approx(np.mean([out[f"fid_{c}"]["value"] for c in cats]))
    # our FID (torch-fidelity's statistics and square root) agrees with clean-fid on the same features
    assert fid_from_features(torch.from_numpy(g), torch.from_numpy(r)) == pytest.approx(fid_from_feats(g, r), rel=1e-6)
    assert all(e["higher_is_better"] is False for e in out.values())
    assert out["fid"]["n"] == out["fid_mean"]["n"] == 90
    two = mm.category_fids(g, gc, r[:42], rc[:42], cats)                   # 2 reference images of c: the least
    assert two["fid_c"]["value"] == pytest.approx(fid_from_feats(g[60:], r[40:42]), rel=1e-6)   # rank-1 covariance: sqrtm is touchy
    with pytest.raises(ValueError) as e:
        mm.category_fids(g, gc, r[:41], rc[:41], cats)
    assert str(e.value) == "category c: FID needs at least 2 images on each side, got 30 and 1"
    with pytest.raises(ValueError) as e:
        mm.category_fids(g, gc[:-1], r, rc, cats)
    assert str(e.value) == "category_fids: 90/60 feature rows but 89/60 categories"


class _TinyNet(torch.nn.Module):
    """A stand-in for clean-fid's Inception: float [B, 3, 299, 299] in [0, 255] → [B, 16]."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 16, 7, stride=5)

    def forward(self, x):
        return self.conv((x - 128) / 128).relu().mean((2, 3))


def test_cleanfid_features_of_tensors_equal_clean_fids_folder_pipeline(tmp_path):
    from cleanfid.fid import get_folder_features
    from PIL import Image
    g = torch.Generator().manual_seed(1)
    imgs = torch.randint(0, 256, (5, 3, 40, 56), generator=g, dtype=torch.uint8)
    for i, im in enumerate(imgs):
        Image.fromarray(im.permute(1, 2, 0).numpy()).save(tmp_path / f"{i:03d}.png")
    net = _TinyNet().eval()
    ref = get_folder_features(str(tmp_path), model=net, num_workers=0, batch_size=2, device=torch.device("cpu"),
                              mode="clean", verbose=False)
    ours = mm.cleanfid_features(imgs, net, batch_size=2)
    assert ours.shape == ref.shape == (5, 16)
    assert np.array_equal(ours, ref)
    ours_list = mm.cleanfid_features(list(imgs), net, batch_size=3)     # a list of images, other batches
    assert np.allclose(ours_list, ref, atol=1e-5)


def test_cleanfid_inception_missing_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="inception-2015-12-05.pt.*VARBENCH_CLEANFID_INCEPTION"):
        mm.load_cleanfid_inception(str(tmp_path))


def test_shapes_mjhq_prompts_are_the_reference_scenes_captions():
    from bench.data import scenes
    assert mm.SHAPES_CATEGORIES == scenes.TASKS
    b = BENCHES.get("shapes-mjhq")()
    assert b.default_n == 3000 and b.batch_size == 1 and b.conditions == "prompts"
    labels = b.labels(12)
    _, prompts, specs, _ = scenes.generate(12, "ref")
    # category-major: the first 2 prompts of each task are scenes k·6 + task index, k = 0, 1
    want = [prompts[6 * k + t] for t in range(6) for k in range(2)]
    assert labels == want
    assert b.label_categories(12) == [c for c in scenes.TASKS for _ in range(2)]
    assert [s.task for s in specs[:6]] == list(scenes.TASKS)
    for bad in (0, 7, 3006, 2.0, True):
        with pytest.raises(ValueError, match="multiple of 6 up to 3000"):
            b.check_n(bad)
    with pytest.raises(ValueError) as e:
        b.check_n(-6)
    assert str(e.value) == ("--n -6: shapes-mjhq takes one image per prompt, the same number from each of its 6 "
                            "categories: a positive multiple of 6 up to 3000 (the default)")
    assert b.check_n(3000) == 3000 and b.check_n(6) == 6

    class OneCategory(type(b)):   # n = 1 is a whole multiple of one category
        categories, default_n = ("scenes",), 3
    assert OneCategory.check_n(1) == 1 and OneCategory.check_n(3) == 3
    table = b.prompt_table()
    assert list(table.columns) == ["id", "category", "prompt"] and len(table) == 3000
    assert list(table["id"][:3]) == ["ref-00000", "ref-00001", "ref-00002"] and table["id"].iloc[-1] == "ref-02999"
    assert list(b.chosen(12)["id"]) == [f"ref-{6 * k + t:05d}" for t in range(6) for k in range(2)]
    # scoring checks that the rows are of this bench's prompts, in order
    with pytest.raises(ValueError) as e:
        b.score({"features": torch.zeros(12, 4)}, list(reversed(labels)))
    assert str(e.value) == "shapes-mjhq: the images' prompts are not this bench's prompts in order"


def test_fidelity_is_a_setting_of_feature_benches_only():
    from bench.plan import make_spec
    spec = make_spec("tiny-t2i", (), bench="shapes-mjhq", n=12, bench_args={"fidelity": True})
    assert spec.protocol["fidelity"] is True
    plain = make_spec("tiny-t2i", (), bench="shapes-mjhq", n=12)
    assert "fidelity" not in plain.protocol and plain.key() != spec.key()
    assert BENCHES.get("shapes-mjhq").args_from_protocol(spec.protocol) == {"fidelity": True}
    with pytest.raises(ValueError, match="no feature rows.*shapes-mjhq"):
        make_spec("tiny-t2i", (), bench="shapes-geneval", n=8, bench_args={"fidelity": True})
    with pytest.raises(ValueError, match="true or false"):
        BENCHES.get("shapes-mjhq")(fidelity="yes")


def test_clip_score_formula():
    from bench.metrics.clip_score import clip_score_metric, cosines
    a = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]]), dim=-1)
    t = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]]), dim=-1)
    cos = cosines(a, t)
    assert np.allclose(cos, [1.0, 0.6, 0.0])
    m = clip_score_metric(cos)
    assert m["value"] == pytest.approx(100 * 1.6 / 3) and m["n"] == 3     # the raw mean ×100, not clamped
    assert m["stderr"] == pytest.approx(100 * np.std(cos, ddof=1) / np.sqrt(3), rel=1e-12) and m["stderr"] > 25
    assert m["higher_is_better"] is True and m["error"] == "standard error of the mean over images"
    assert clip_score_metric(np.array([-0.2, -0.1]))["value"] == pytest.approx(-15.0)
    assert clip_score_metric([-0.2, -0.1])["stderr"] == pytest.approx(5.0)     # a list; 100·(0.1/√2)/√2
    assert clip_score_metric(np.array([0.3]))["stderr"] is None        # one image: no error bar, not a zero one
    with pytest.raises(ValueError, match="pairs images with their prompts"):
        cosines(a, t[:2])
    from bench.metrics.clip_score import load_openai_clip
    with pytest.raises(FileNotFoundError, match="VARBENCH_CLIP_WEIGHTS"):
        load_openai_clip("/nonexistent/ViT-L-14.pt")


def test_mjhq30k_preflight_names_what_is_missing(tmp_path, monkeypatch):
    for v in ("VARBENCH_MJHQ_DIR", "VARBENCH_CLEANFID_INCEPTION", "VARBENCH_CLIP_WEIGHTS"):
        monkeypatch.delenv(v, raising=False)
    with pytest.raises(FileNotFoundError, match="VARBENCH_MJHQ_DIR"):
        BENCHES.get("mjhq30k")().preflight()
    with pytest.raises(FileNotFoundError, match="meta_data.json"):
        BENCHES.get("mjhq30k")(mjhq_dir=str(tmp_path)).preflight()
    _meta(tmp_path)
    with pytest.raises(FileNotFoundError, match="VARBENCH_CLEANFID_INCEPTION"):
        BENCHES.get("mjhq30k")(mjhq_dir=str(tmp_path), inception=str(tmp_path / "x.pt")).preflight()
    (tmp_path / "inception-2015-12-05.pt").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="VARBENCH_CLIP_WEIGHTS"):
        BENCHES.get("mjhq30k")(mjhq_dir=str(tmp_path), inception=str(tmp_path)).preflight()


class _FakeClip(torch.nn.Module):
    """encode_image / encode_text of a CLIP-shaped toy (8-dim embeddings)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.img = torch.nn.Linear(3, 8)
        self.txt = torch.nn.Embedding(300, 8)

    def encode_image(self, x):
        return self.img(x.mean((2, 3)))

    def encode_text(self, t):
        return self.txt(t).mean(1)


def test_mjhq30k_scores_per_category_and_clip(tmp_path, monkeypatch):
    """The paper bench end to end on a fake MJHQ folder (3 images per category), with stand-ins for
    Inception and CLIP: every category's FID and the overall FID are clean-fid's on the same features."""
    from cleanfid.fid import fid_from_feats
    from PIL import Image

    from bench.metrics.clip_score import ClipScorer
    _meta(tmp_path)
    rng = np.random.default_rng(0)
    for c in mm.MJHQ_CATEGORIES:
        (tmp_path / c).mkdir()
        for k in range(3):
            Image.fromarray(rng.integers(0, 256, (48, 48, 3), dtype=np.uint8)).save(tmp_path / c / f"{c[:3]}{k:04x}.jpg")
    net = _TinyNet().eval()
    monkeypatch.setattr(mm, "load_cleanfid_inception", lambda path=None, device="cpu": net)
    b = BENCHES.get("mjhq30k")(mjhq_dir=str(tmp_path), inception=str(tmp_path), clip_weights="unused", device="cpu")
    b.preflight = lambda: None

    def preprocess(pil):
        return torch.from_numpy(np.asarray(pil.resize((16, 16)), dtype=np.float32) / 255).permute(2, 0, 1)

    scorer = ClipScorer(_FakeClip().eval(), preprocess, lambda ps: torch.tensor([[ord(ch) % 300 for ch in p[:8]] for p in ps]))
    b._nets = (net, scorer)
    mb._mjhq_reference.cache_clear()
    labels = b.labels(20)
    assert labels[:2] == ["a animals picture number 0", "a animals picture number 1"] and len(labels) == 20
    imgs = torch.from_numpy(rng.integers(0, 256, (20, 3, 32, 32), dtype=np.uint8))
    m = b.score(b.features(imgs), labels)
    ref, ref_cats = b.reference()
    assert len(ref) == 30 and ref_cats[:3] == ["animals"] * 3
    gen = mm.cleanfid_features(imgs, net)
    assert m["fid"]["value"] == pytest.approx(fid_from_feats(gen, ref), rel=1e-9)
    assert m["fid_people"]["value"] == pytest.approx(fid_from_feats(gen[14:16], ref[21:24]), rel=1e-9)
    cos = (scorer.image_embeddings(imgs) * scorer.text_embeddings(labels)).sum(-1)
    assert m["clip_score"]["value"] == pytest.approx(100 * cos.double().mean().item(), rel=1e-6)
    mb._mjhq_reference.cache_clear()


@pytest.fixture
def counted_generate(monkeypatch):
    """Counts the tiny-t2i batches sampled (the original's and the run's)."""
    from bench.models.t2i import T2IGenerator
    calls = []
    orig = T2IGenerator.generate

    def generate(self, prompts, seed=0, **kw):
        calls.append(seed)
        return orig(self, prompts, seed=seed, **kw)
    monkeypatch.setattr(T2IGenerator, "generate", generate)
    return calls


def test_fid_star_of_the_model_against_itself_and_the_cache(tmp_path, counted_generate, capsys):
    from bench import originals
    from bench.plan import make_spec
    from bench.runner import run
    spec = make_spec("tiny-t2i", (), bench="shapes-mjhq", n=12, bench_args={"fidelity": True})
    rec = run(spec, root=tmp_path, progress=False)
    m = rec["metrics"]
    assert abs(m["fid_star"]["value"]) < 1e-4 and abs(m["fid_star_position"]["value"]) < 1e-4
    assert m["psnr"]["value"] == 100.0 and m["ssim"]["value"] == pytest.approx(1.0, abs=1e-9)
    assert len(counted_generate) == 24            # 12 prompts for the original, 12 for the run, one each
    d = originals.folder(spec, tmp_path)
    assert (d / "done.json").is_file() and len(list((d / "images").glob("*.png"))) == 12
    # a method run reuses the cache: only its own 12 batches are sampled
    counted_generate.clear()
    spec2 = make_spec("tiny-t2i", "stepvar", bench="shapes-mjhq", n=12, bench_args={"fidelity": True})
    assert originals.folder(spec2, tmp_path) == d
    m2 = run(spec2, root=tmp_path, progress=False)["metrics"]
    assert len(counted_generate) == 12
    assert m2["fid_star"]["value"] > 1e-3 and m2["psnr"]["value"] < 100
    from bench.cli import main
    assert main(["runs", "--json", "--results", str(tmp_path)]) == 0      # the listing shows the setting
    listing = json.loads(capsys.readouterr().out)
    assert {r["setting"] for r in listing} == {"fidelity=True"} and all("fid_star" in r for r in listing)
    # a partial cache resumes: one image and the done mark gone → one batch sampled again, same features
    feats = torch.load(d / "features.pt")
    (d / "done.json").unlink()
    (d / "images" / "000005.png").unlink()
    counted_generate.clear()
    from bench.registry import MODELS
    from bench.runner import sample_features
    bench = BENCHES.get("shapes-mjhq")()
    again = originals.ensure(spec2, bench, bench.labels(12), lambda: MODELS.get("tiny-t2i")().eval(), sample_features,
                             tmp_path, progress=False)
    assert counted_generate == [BENCHES.get("shapes-mjhq").batch_seed(0, 5)]
    assert torch.equal(again["features"], feats["features"])


def test_fidelity_on_a_class_conditional_bench(tmp_path):
    """shapes-c2i takes the setting too: FID* over all images (no categories), PSNR and SSIM."""
    from bench.plan import make_spec
    from bench.runner import run
    m = run(make_spec("tiny-var", (), bench="shapes-c2i", n=24, bench_args={"fidelity": True}),
            root=tmp_path, progress=False)["metrics"]
    assert abs(m["fid_star"]["value"]) < 1e-4 and m["psnr"]["value"] == 100.0 and m["ssim"]["n"] == 24
    assert not any(k.startswith("fid_star_") for k in m) and "fid" in m


def test_folders_in_fastvars_layout_score_like_the_run(tmp_path, capsys):
    """generate → <category>/<id>.png; score gives the run's metrics (same images, same seeds); a missing
    image is named; generation resumes with only the missing one."""
    from bench.cli import main
    from bench.plan import make_spec
    from bench.runner import run
    out = tmp_path / "imgs"
    assert main(["mjhq", "generate", str(out), "--n", "12", "--quiet"]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(mm.SHAPES_CATEGORIES)
    assert sorted(p.name for p in (out / "position").iterdir()) == ["ref-00004.png", "ref-00010.png"]
    capsys.readouterr()
    assert main(["mjhq", "score", str(out), "--n", "12", "--json", "--quiet"]) == 0
    scored = json.loads(capsys.readouterr().out)
    rec = run(make_spec("tiny-t2i", (), bench="shapes-mjhq", n=12), root=tmp_path / "r", progress=False)
    assert {k: v["value"] for k, v in scored.items()} == pytest.approx({k: v["value"] for k, v in rec["metrics"].items()},
                                                                       rel=1e-9)
    (out / "counting" / "ref-00008.png").unlink()
    assert main(["mjhq", "score", str(out), "--n", "12", "--quiet"]) == 2
    assert "counting/ref-00008.png" in capsys.readouterr().err
    assert main(["mjhq", "generate", str(out), "--n", "12", "--quiet"]) == 0
    assert "1 image(s) generated now, 11 already there" in capsys.readouterr().out
    assert main(["mjhq", "score", str(out), "--bench", "shapes-geneval"]) == 2
    assert "not an MJHQ bench; MJHQ benches: mjhq30k, shapes-mjhq" in capsys.readouterr().err
    assert main(["mjhq", "score", str(tmp_path / "nowhere"), "--n", "12", "--quiet"]) == 2
    assert f"MJHQ image folder {tmp_path / 'nowhere'} not found (`varbench mjhq generate" in capsys.readouterr().err
    assert main(["mjhq", "score", str(out / "position" / "ref-00004.png"), "--n", "12", "--quiet"]) == 2
    assert "ref-00004.png is not a folder" in capsys.readouterr().err


def test_mjhq30k_preflight_messages_in_full(tmp_path, monkeypatch):
    """Each missing piece in its turn, the whole message; Inception as a file or a folder holding it; the
    environment variables as defaults."""
    for v in ("VARBENCH_MJHQ_DIR", "VARBENCH_CLEANFID_INCEPTION", "VARBENCH_CLIP_WEIGHTS"):
        monkeypatch.delenv(v, raising=False)
    B = BENCHES.get("mjhq30k")

    def message(**kw):
        with pytest.raises(FileNotFoundError) as e:
            B(**kw).preflight()
        return str(e.value)
    assert message() == ("mjhq30k needs MJHQ-30K: set VARBENCH_MJHQ_DIR to the folder holding meta_data.json and the "
                         "unzipped mjhq30k_imgs.zip (<category>/<id>.jpg), from playgroundai/MJHQ-30K")
    assert message(mjhq_dir=str(tmp_path)) == (f"{tmp_path / 'meta_data.json'} not found (VARBENCH_MJHQ_DIR): put "
                                               f"MJHQ-30K's meta_data.json and its unzipped images there")
    _meta(tmp_path)
    inc_dir = tmp_path / "inc"
    inc_dir.mkdir()
    for inception, shown in ((str(inc_dir / "x.pt"), inc_dir / "x.pt"), (str(inc_dir), inc_dir)):
        assert message(mjhq_dir=str(tmp_path), inception=inception) == (
            f"clean-fid's Inception {shown} not found: set VARBENCH_CLEANFID_INCEPTION to inception-2015-12-05.pt "
            f"(or put it in /tmp, where clean-fid looks)")
    if not (Path("/tmp") / mm.INCEPTION_FILE).is_file():    # no argument: clean-fid's own place
        assert f"clean-fid's Inception /tmp/{mm.INCEPTION_FILE} not found" in message(mjhq_dir=str(tmp_path))
    (inc_dir / mm.INCEPTION_FILE).write_bytes(b"")
    clip_tail = (" not found: set VARBENCH_CLIP_WEIGHTS to OpenAI's ViT-L-14 weights (ViT-L-14.pt, or "
                 "open_clip_pytorch_model.bin of timm/vit_large_patch14_clip_224.openai)")
    for inception in (str(inc_dir), str(inc_dir / mm.INCEPTION_FILE)):       # the folder or the file itself
        assert message(mjhq_dir=str(tmp_path), inception=inception) == f"CLIP weights None{clip_tail}"
    assert message(mjhq_dir=str(tmp_path), inception=str(inc_dir), clip_weights=str(inc_dir)) == \
        f"CLIP weights {inc_dir}{clip_tail}"                                  # a folder is not the weights file
    (tmp_path / "ViT-L-14.pt").write_bytes(b"")
    B(mjhq_dir=str(tmp_path), inception=str(inc_dir), clip_weights=str(tmp_path / "ViT-L-14.pt")).preflight()
    monkeypatch.setenv("VARBENCH_MJHQ_DIR", str(tmp_path))
    monkeypatch.setenv("VARBENCH_CLEANFID_INCEPTION", str(inc_dir))
    monkeypatch.setenv("VARBENCH_CLIP_WEIGHTS", str(tmp_path / "ViT-L-14.pt"))
    B().preflight()


def test_mjhq_folder_layout_seeds_resume_and_what_score_reads(tmp_path):
    """generate_folder / score_folder without a model: one image per prompt seeded by its index, .png written
    and .png or .jpg read, what is already there kept; score hands the runner's stream every image in order."""
    from PIL import Image

    from bench.io import read_image
    b = BENCHES.get("shapes-mjhq")()
    chosen = b.chosen(12)
    seeds = []

    class Fake:
        def generate(self, prompts, seed=0, **kw):
            seeds.append((prompts, seed, kw))
            return torch.full((1, 3, 4, 4), seed % 251, dtype=torch.uint8)
    out = tmp_path / "imgs"
    assert mb.generate_folder(Fake(), b, out, 12, seed=3, sampling={"cfg": 4.0}, progress=False) == 12
    assert seeds == [([p], b.batch_seed(3, i), {"cfg": 4.0}) for i, p in enumerate(chosen["prompt"])]
    assert mb.image_path(out, "position", "ref-00004") == out / "position" / "ref-00004.png"
    first = chosen.iloc[0]
    png = out / first["category"] / f"{first['id']}.png"
    Image.open(png).convert("RGB").save(png.with_suffix(".jpg"), quality=100)
    assert mb._existing(out, first["category"], first["id"]) == png            # .png first
    png.unlink()
    assert mb._existing(out, first["category"], first["id"]) == png.with_suffix(".jpg")
    assert mb._existing(out, first["category"], "nothing") is None
    seeds.clear()
    assert mb.generate_folder(Fake(), b, out, 12, seed=3, sampling={}, progress=False) == 0 and seeds == []

    read, scored = [], {}

    def stream(gen, bench, prompts, seed, sampling, cached, progress, desc):
        assert gen is None and isinstance(bench, Scoring) and seed == 0 and sampling == {} and desc == "mjhq features"
        imgs = torch.cat([cached(lo, min(lo + 5, len(prompts))) for lo in range(0, len(prompts), 5)])
        read.append(imgs)
        return {"features": imgs.float().flatten(1)}, {}, {}

    class Scoring(type(b)):
        def score(self, feats, labels, seed=0, progress=True):
            scored.update(feats=feats, labels=labels)
            return {"fid": 1.0}
    sb = Scoring()
    assert mb.score_folder(sb, out, 12, stream, progress=False) == {"fid": 1.0}
    want = torch.stack([read_image(mb._existing(out, r.category, r.id)) for r in chosen.itertuples()])
    assert torch.equal(read[0], want) and scored["labels"] == list(chosen["prompt"])
    assert torch.equal(scored["feats"]["features"], want.float().flatten(1))
    gone = [out / r.category / f"{r.id}.png" for r in list(chosen.itertuples())[1:6]]
    for p in gone:
        p.unlink()
    with pytest.raises(FileNotFoundError) as e:
        mb.score_folder(sb, out, 12, stream, progress=False)
    assert str(e.value) == (f"{out}: missing {', '.join(str(p) for p in gone[:3])} (and 2 more); generate them "
                            f"(`varbench mjhq generate` resumes where it stopped)")
    gone[4].write_bytes(b"")                           # four missing: one more than are named
    with pytest.raises(FileNotFoundError) as e:
        mb.score_folder(sb, out, 12, stream, progress=False)
    assert str(e.value).endswith(f"{gone[2]} (and 1 more); generate them (`varbench mjhq generate` resumes where it "
                                 f"stopped)")
    gone[3].write_bytes(b"")                           # three: all named
    with pytest.raises(FileNotFoundError) as e:
        mb.score_folder(sb, out, 12, stream, progress=False)
    assert str(e.value).endswith(f"{gone[2]}; generate them (`varbench mjhq generate` resumes where it stopped)")
    for where, message in ((tmp_path / "nowhere", f"MJHQ image folder {tmp_path / 'nowhere'} not found (`varbench mjhq "
                                                  f"generate {tmp_path / 'nowhere'}` writes it)"),
                           (gone[3], f"{gone[3]} is not a folder")):
        with pytest.raises(FileNotFoundError) as e:
            mb.score_folder(sb, where, 12, stream, progress=False)
        assert str(e.value) == message


def test_openai_clip_loads_from_a_torchscript_archive_as_clip_load_files_are(tmp_path):
    """OpenAI's ViT-L-14.pt is a TorchScript archive, which open_clip's loader (torch.load with
    weights_only=True) refuses; a state dict file still goes through weights_only. A tiny CLIP config
    stands in for ViT-L-14 (the same code path)."""
    import warnings

    import open_clip
    from open_clip import factory

    from bench.metrics.clip_score import is_torchscript, load_openai_clip
    factory._MODEL_CONFIGS["varbench-test-tiny-quickgelu"] = {
        "embed_dim": 16, "quick_gelu": True,
        "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 16, "head_width": 16},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}
    try:
        arch = "varbench-test-tiny-quickgelu"
        torch.manual_seed(0)
        model = open_clip.create_model(arch).eval()
        mask = model.attn_mask   # OpenAI's archive holds the mask as a constant, not a buffer
        del model._buffers["attn_mask"]
        model.attn_mask = mask
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(model, (torch.randn(1, 3, 32, 32), torch.zeros(1, 77, dtype=torch.long)),
                                     strict=False, check_trace=False)
        traced.save(str(tmp_path / "ViT-L-14.pt"))
        torch.save(model.state_dict(), tmp_path / "open_clip_pytorch_model.bin")
        assert is_torchscript(tmp_path / "ViT-L-14.pt") and not is_torchscript(tmp_path / "open_clip_pytorch_model.bin")
        (tmp_path / "none.txt").write_text("x")
        assert not is_torchscript(tmp_path / "none.txt")
        want = model.state_dict()
        for name in ("ViT-L-14.pt", "open_clip_pytorch_model.bin"):
            loaded, preprocess, tokenizer = load_openai_clip(tmp_path / name, arch=arch)
            got = loaded.state_dict()
            assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want), name
            assert not loaded.training and tokenizer(["a red circle"]).shape == (1, 77)

        class Other(torch.nn.Module):   # a TorchScript archive of something else: its keys are named
            def __init__(self):
                super().__init__()
                self.logit_scale = torch.nn.Parameter(torch.ones([]))

            def forward(self, x):
                return x * self.logit_scale
        torch.jit.save(torch.jit.script(Other()), str(tmp_path / "other.pt"))
        with pytest.raises(ValueError, match=r"(?s)other\.pt: not OpenAI's varbench-test-tiny-quickgelu \(.*Missing key"):
            load_openai_clip(tmp_path / "other.pt", arch=arch)
    finally:
        del factory._MODEL_CONFIGS["varbench-test-tiny-quickgelu"]
