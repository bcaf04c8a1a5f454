"""The paper world's GenEval colour classifier and detector wrapper, against the official procedure written
out by hand on a tiny random open_clip CLIP (the real tokenizer, text and image towers and preprocessing;
no weights file): the per-class zero-shot classifier over the three templates, the crops composited over
grey #999 and cut to the box, the argmax of the logits in batches; and Mask2Former's output unpacked as
the official evaluator does (the image given in BGR, as mmdet reads a file)."""
import numpy as np
import pytest
import torch
from PIL import Image

from bench.metrics import geneval as ge
from bench.metrics import geneval_detectors as gd

open_clip = pytest.importorskip("open_clip")


def _tiny_clip(seed):
    from open_clip.model import CLIP
    torch.manual_seed(seed)
    model = CLIP(embed_dim=16, vision_cfg=dict(image_size=32, patch_size=8, width=32, layers=1, head_width=16),
                 text_cfg=dict(context_length=77, vocab_size=49408, width=32, heads=2, layers=1), quick_gelu=True)
    with torch.no_grad():          # open_clip's init is near-constant at this size: spread it, so that crops disagree
        for w in model.parameters():
            if w.dim() >= 2:
                w.normal_(0, 0.5)
    return model.eval(), open_clip.image_transform(32, is_train=False), open_clip.get_tokenizer("ViT-L-14-quickgelu")


def _scene():
    """A 40×48 image with five coloured patches on a gradient, as (box, mask) objects; the last has no mask."""
    rng = np.random.default_rng(0)
    img = np.zeros((40, 48, 3), dtype=np.uint8)
    img[..., 0] = np.linspace(0, 255, 48, dtype=np.uint8)[None]
    img[..., 2] = rng.integers(0, 256, (40, 48), dtype=np.uint8)
    objects = []
    for k, (x, y, colour) in enumerate([(2, 3, (250, 20, 20)), (20, 4, (20, 240, 30)), (33, 20, (30, 30, 250)),
                                        (5, 25, (250, 250, 10)), (18, 22, (240, 240, 240))]):
        mask = np.zeros((40, 48), dtype=bool)
        mask[y:y + 10, x:x + 11] = True
        mask[y, x] = False                                        # not a full box: the composite matters
        img[mask] = colour
        box = np.array([x - 1.2, y - 0.7, x + 11.4, y + 10.3, 0.9 - 0.1 * k])   # PIL rounds the box
        objects.append((box, mask if k < 4 else None))
    return img, objects


def _by_hand(model, preprocess, tokenizer, img, objects, classname):
    """The official color_classification: open_clip's zero_shot_classifier and run_classification."""
    with torch.no_grad():
        cols = []
        for c in ge.COLORS:
            texts = [f"a photo of a {c} {classname}", f"a photo of a {c}-colored {classname}", f"a photo of a {c} object"]
            e = model.encode_text(tokenizer(texts))
            e = (e / e.norm(dim=-1, keepdim=True)).mean(0)
            cols.append(e / e.norm())
        clf = torch.stack(cols, 1)
        crops = []
        for box, mask in objects:
            pixels = img if mask is None else np.where(mask[..., None], img, np.uint8(0x99))
            x1, y1, x2, y2 = (round(float(v)) for v in box[:4])
            crops.append(preprocess(Image.fromarray(np.ascontiguousarray(pixels[max(y1, 0):y2, max(x1, 0):x2]))))
        f = model.encode_image(torch.stack(crops))
        logits = 100.0 * (f / f.norm(dim=-1, keepdim=True)) @ clf
    return clf, crops, [ge.COLORS[int(i)] for i in logits.argmax(1)]


@pytest.fixture
def clip_colours(monkeypatch):
    import bench.metrics.clip_score as cs
    model, preprocess, tokenizer = _tiny_clip(11)
    calls = []

    def load(weights, device="cpu", arch=cs.ARCH):
        calls.append((weights, device, arch))
        return model, preprocess, tokenizer
    monkeypatch.setattr(cs, "load_openai_clip", load)
    colours = gd.ClipColours("ViT-L-14.pt", batch_size=2)
    assert calls == [("ViT-L-14.pt", "cpu", "ViT-L-14-quickgelu")]
    return colours, (model, preprocess, tokenizer)


def test_clip_colours_follow_the_official_zero_shot_procedure(clip_colours):
    colours, (model, preprocess, tokenizer) = clip_colours
    img, objects = _scene()
    clf, crops, expected = _by_hand(model, preprocess, tokenizer, img, objects, "stop sign")
    assert len(set(expected)) == 5, "the test needs a model whose crops disagree (pick another seed)"
    assert torch.allclose(colours.classifier("stop sign"), clf, atol=1e-6)
    assert colours.classifier("stop sign").shape == (16, 10)
    got = colours.crops(img, objects)
    assert len(got) == len(crops) and all(torch.equal(a, b) for a, b in zip(got, crops))
    assert colours.colours(img, objects, "stop sign") == expected            # five crops in batches of 2
    assert colours.colours(img, objects[2:3], "stop sign") == expected[2:3]
    assert colours.colours(img, [], "stop sign") == []


def test_clip_colours_cache_one_classifier_per_class(clip_colours):
    colours, (model, _, _) = clip_colours
    texts = []
    encode_text = model.encode_text
    model.encode_text = lambda t: texts.append(len(t)) or encode_text(t)
    a = colours.classifier("cat")
    assert texts == [3] * 10                       # ten colours × three templates, once
    assert colours.classifier("cat") is a and texts == [3] * 10
    b = colours.classifier("dog")
    assert len(texts) == 20 and not torch.allclose(a, b)


def test_mask2former_results_are_unpacked_per_class_from_a_bgr_image():
    """mmdet 2.x returns (bbox per class, segm per class) for Mask2Former, or bbox alone; classes without a
    box are absent; the image goes in as BGR, the channel order mmdet reads a file in."""
    det = gd.Mask2FormerDetector.__new__(gd.Mask2FormerDetector)
    det.classnames = ["cat", "dog", "car"]
    seen = []
    boxes = [np.array([[1, 2, 10, 12, 0.9]], dtype=np.float32), np.zeros((0, 5), dtype=np.float32),
             np.array([[0, 0, 4, 4, 0.5], [5, 5, 9, 9, 0.4]], dtype=np.float32)]
    masks = [[np.ones((8, 8), bool)], [], [np.zeros((8, 8), bool), np.eye(8, dtype=bool)]]
    image = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3)

    state = {"result": (boxes, masks)}

    def infer(model, img):
        seen.append(img)
        return state["result"]
    det._infer, det.model = infer, None
    b, m = det.detect(image)
    assert np.array_equal(seen[0], image[..., ::-1]) and seen[0].flags["C_CONTIGUOUS"]
    assert list(b) == ["cat", "car"] and np.array_equal(b["car"], boxes[2]) and np.array_equal(b["cat"], boxes[0])
    assert list(m) == ["cat", "car"] and m["car"][1] is masks[2][1] and len(m["car"]) == 2
    for without_masks in (boxes, (boxes,)):                          # bbox alone, or a 1-tuple
        state["result"] = without_masks
        b, m = det.detect(image)
        assert list(b) == ["cat", "car"] and m == {}
    det.clip = type("C", (), {"colours": lambda self, img, objs, cls: [cls] * len(objs)})()
    assert det.colours(image, [1, 2], "car") == ["car", "car"]


def test_mask2former_without_mmdet_says_what_to_do(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_mmdet(name, *a, **k):
        if name.split(".")[0] == "mmdet":
            raise ImportError(name)
        return real_import(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_mmdet)
    with pytest.raises(RuntimeError, match=r"mmdet 2\.x with mmcv-full 1\.7.*varbench geneval import results\.jsonl"):
        gd.Mask2FormerDetector("models", "ViT-L-14.pt", ["cat"])
