"""The tiny world's feature network (bench.metrics.features) worked out by hand: input scaling, the
layer order, the file format and its refusals, the training recipe step by step (the shipped
feature_cnn.safetensors must come out of `make tiny-models` again), the torch-fidelity extractor and
its registration. Offline and fast: small random networks, tiny images."""
import ast
import math

import pytest
import torch
import torch.nn.functional as tF
from safetensors.torch import save_file
from torch_fidelity.registry import FEATURE_EXTRACTORS_REGISTRY

from bench.metrics import features as F


def _net(num_classes=5, width=4, seed=0):
    torch.manual_seed(seed)
    net = F.TinyShapesCNN(num_classes=num_classes, width=width)
    g = torch.Generator().manual_seed(seed)
    for m in net.modules():   # BatchNorm statistics away from 0 / 1, so train and eval mode differ
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.3)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
    return net.eval()


def _images(n, size=16, seed=0):
    return torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def _message(excinfo) -> str:
    return str(excinfo.value)


# --- the network ----------------------------------------------------------------------------------

def test_normalize_maps_uint8_to_minus_one_one_as_torch_fidelity_does():
    x = torch.tensor([0, 64, 128, 192, 255], dtype=torch.uint8).view(1, 1, 1, 5).expand(1, 3, 1, 5)
    want = torch.tensor([-1.0, -0.5, 0.0, 0.5, 127 / 128])
    assert torch.equal(F.TinyShapesCNN.normalize(x)[0, 0, 0], want)
    with pytest.raises(ValueError) as e:
        F.TinyShapesCNN.normalize(torch.zeros(1, 3, 4, 4))
    assert _message(e) == "expecting uint8 images, got torch.float32"
    for shape in ((1, 1, 4, 4), (3, 4, 4)):
        with pytest.raises(ValueError) as e:
            F.TinyShapesCNN.normalize(torch.zeros(shape, dtype=torch.uint8))
        assert _message(e) == f"expecting [B,3,H,W] images, got {shape}"


def test_features_are_the_three_stages_with_two_max_pools_then_the_global_mean():
    net, x = _net(), _images(2)
    h = net.stage1((x.float() - 128) / 128)
    h = net.stage2(tF.max_pool2d(h, 2))
    h = net.stage3(tF.max_pool2d(h, 2))
    pooled = h.mean(dim=(2, 3))
    torch.testing.assert_close(net.features(x), pooled)
    torch.testing.assert_close(net.logits(x), pooled @ net.fc.weight.T + net.fc.bias)
    assert net.feature_dim == 16 == net.features(x).shape[1]
    assert F.TinyShapesCNN(width=32).feature_dim == 128


def test_architecture_and_refused_class_counts():
    net, w, k = F.TinyShapesCNN(num_classes=16, width=32), 32, 16
    convs = 9 * (3 * w + w * w) + 9 * (w * 2 * w + 4 * w * w) + 9 * (2 * w * 4 * w + 16 * w * w)
    norms = 2 * 2 * (w + 2 * w + 4 * w)                    # weight and bias, two BatchNorms per stage
    assert sum(p.numel() for p in net.parameters()) == convs + norms + 4 * w * k + k   # ≈ 0.29M
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 6 and all(m.bias is None for m in convs)
    # "same" 3×3 convolutions: the map keeps its size (a padding of 2 would be hidden by the global mean)
    assert all((m.kernel_size, m.stride, m.padding) == ((3, 3), (1, 1), (1, 1)) for m in convs)
    for bad in (1, 0):
        with pytest.raises(ValueError) as e:
            F.TinyShapesCNN(num_classes=bad)
        assert _message(e) == f"num_classes must be >= 2, got {bad}"


# --- files ----------------------------------------------------------------------------------------

def test_save_writes_the_config_and_string_metadata_and_equal_weights_give_equal_bytes(tmp_path):
    net = _net()
    F.save_feature_cnn(net, tmp_path / "a.safetensors")                         # no metadata given
    F.save_feature_cnn(net, tmp_path / "b.safetensors", metadata={"epochs": 6, 7: "x"})
    assert F.read_feature_cnn_metadata(tmp_path / "a.safetensors") == \
        {"format": "varbench-tinyshapes-cnn", "num_classes": "5", "width": "4"}
    assert F.read_feature_cnn_metadata(tmp_path / "b.safetensors") == \
        {"format": "varbench-tinyshapes-cnn", "num_classes": "5", "width": "4", "epochs": "6", "7": "x"}
    F.save_feature_cnn(_net(), tmp_path / "c.safetensors")
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "c.safetensors").read_bytes()


def test_load_builds_the_saved_network_in_eval_mode_without_gradients(tmp_path):
    net, x = _net(), _images(3)
    F.save_feature_cnn(net, tmp_path / "n.safetensors")
    got = F.load_feature_cnn(tmp_path / "n.safetensors", device="cpu")
    assert (got.num_classes, got.width, got.training) == (5, 4, False)
    assert not any(p.requires_grad for p in got.parameters())
    assert torch.equal(got.logits(x), net.logits(x))
    shipped = F.load_feature_cnn()   # no path: the shipped default file
    assert torch.equal(shipped.fc.weight, F.load_feature_cnn(F.DEFAULT_WEIGHTS_PATH).fc.weight)


def test_load_refuses_other_files_with_the_whole_message(tmp_path):
    tensors = {k: v.contiguous() for k, v in _net().state_dict().items()}
    cases = {"other": {"format": "something-else", "num_classes": "5", "width": "4"},
             "no_width": {"format": "varbench-tinyshapes-cnn", "num_classes": "5"},
             "no_classes": {"format": "varbench-tinyshapes-cnn", "width": "4"}}
    for name, meta in cases.items():
        path = tmp_path / f"{name}.safetensors"
        save_file(tensors, str(path), metadata=meta)
        with pytest.raises(ValueError) as e:
            F.load_feature_cnn(path)
        head, tail = f"{path} is not a tinyshapes feature CNN (metadata ", \
            "); it should be written by bench.metrics.features.save_feature_cnn"
        msg = _message(e)   # the metadata as the file gives it back, in no fixed key order
        assert msg.startswith(head) and msg.endswith(tail)
        assert ast.literal_eval(msg[len(head):-len(tail)]) == meta
    extra = tmp_path / "extra.safetensors"   # right metadata, one tensor too many: strict load
    save_file({**tensors, "head.weight": torch.zeros(2)}, str(extra),
              metadata={"format": "varbench-tinyshapes-cnn", "num_classes": "5", "width": "4"})
    with pytest.raises(RuntimeError, match="Unexpected key"):
        F.load_feature_cnn(extra)


def test_a_missing_file_says_how_to_make_it(tmp_path):
    path = tmp_path / "gone.safetensors"
    for fn in (F.read_feature_cnn_metadata, F.load_feature_cnn):
        with pytest.raises(F.WeightsNotFoundError) as e:
            fn(path)
        assert _message(e) == (
            f"feature-network weights gone.safetensors not found at {path}.\n"
            "  `make tiny-models` creates it (it trains the tinyshapes CNN and writes "
            "assets/tiny/feature_cnn.safetensors); or pass feature_extractor_weights_path= a file "
            "written by bench.metrics.features.save_feature_cnn.")


# --- prediction -----------------------------------------------------------------------------------

def test_predict_logits_uses_eval_mode_keeps_the_callers_mode_and_handles_no_images():
    net, x = _net(), _images(7)
    with torch.no_grad():
        want = net.logits(x)
    net.train()
    got = F.predict_logits(net, x, batch_size=3)
    assert net.training   # the caller's mode is restored
    torch.testing.assert_close(got, want)   # BatchNorm's running statistics, in 3 batches
    assert F.predict_logits(net, x[:0]).shape == (0, 5)
    assert F.accuracy(net.eval(), x, want.argmax(1)) == 1.0
    assert F.accuracy(net, x, (want.argmax(1) + 1) % 5) == 0.0
    assert math.isnan(F.accuracy(net, x[:0], torch.zeros(0, dtype=torch.long)))


def test_random_shift_crops_the_edge_replicated_image_at_drawn_offsets():
    x = torch.arange(2 * 3 * 5 * 6, dtype=torch.float32).view(2, 3, 5, 6)
    got = F._random_shift(x, 2, torch.Generator().manual_seed(4))
    g = torch.Generator().manual_seed(4)
    dy, dx = torch.randint(0, 5, (2,), generator=g), torch.randint(0, 5, (2,), generator=g)
    assert len({*dy.tolist(), *dx.tolist()}) > 1, "pick a seed whose offsets differ"
    for i in range(2):
        rows = (torch.arange(5) + dy[i] - 2).clamp(0, 4)
        cols = (torch.arange(6) + dx[i] - 2).clamp(0, 5)
        assert torch.equal(got[i], x[i][:, rows][:, :, cols])


# --- training -------------------------------------------------------------------------------------

def _train_by_hand(images, labels, num_classes, epochs, batch_size, lr, seed, width, weight_decay, augment,
                   max_shift):
    """The recipe as its docstring states it: seeded init, AdamW, one optimiser step per batch of a
    fresh permutation each epoch, learning rate × min(1, (s+1)/warm-up) × ½(1 + cos(π·min(1, s/total)))
    with a warm-up of a quarter epoch (at least one step), mean loss and running accuracy per epoch."""
    torch.manual_seed(seed)
    model = F.TinyShapesCNN(num_classes=num_classes, width=width)
    gen = torch.Generator().manual_seed(seed + 1)
    per_epoch = -(-len(images) // batch_size)
    total, warmup = max(1, epochs * per_epoch), max(1, per_epoch // 4)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    step, history = 0, []
    for epoch in range(epochs):
        model.train()
        order = torch.randperm(len(images), generator=gen)
        loss_sum = correct = seen = 0
        for start in range(0, len(images), batch_size):
            idx = order[start:start + batch_size]
            x = images[idx]
            if augment:
                B, _, H, W = x.shape
                dy = torch.randint(0, 2 * max_shift + 1, (B,), generator=gen)
                dx = torch.randint(0, 2 * max_shift + 1, (B,), generator=gen)
                pad = tF.pad(x, (max_shift,) * 4, mode="replicate")
                x = torch.stack([pad[i, :, dy[i]:dy[i] + H, dx[i]:dx[i] + W] for i in range(B)])
            for pg in opt.param_groups:
                pg["lr"] = lr * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, step / total)))
            logits = model.logits(x)
            loss = tF.cross_entropy(logits, labels[idx].long())
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            loss_sum += float(loss.detach()) * len(idx)
            correct += int((logits.argmax(1) == labels[idx]).sum())
            seen += len(idx)
        history.append({"epoch": epoch + 1, "loss": loss_sum / seen, "train_acc": correct / seen})
    return model.eval(), history


@pytest.mark.parametrize("augment,n,batch,epochs", [(False, 72, 8, 3), (True, 72, 8, 3), (False, 12, 6, 2)])
def test_training_is_the_documented_recipe_step_by_step(augment, n, batch, epochs):
    """72 images in batches of 8: 9 steps an epoch, a warm-up of 2, 27 steps in all, so the warm-up,
    the cosine and the shuffling each show in the weights. 12 in batches of 6: 2 steps an epoch, where
    a quarter epoch rounds to 0 and the warm-up is its floor of one step."""
    labels = torch.arange(n) % 3
    images = _images(n, size=8, seed=1)
    kw = dict(num_classes=3, epochs=epochs, batch_size=batch, lr=5e-3, seed=3, width=2, weight_decay=5e-4,
              augment=augment, max_shift=1)
    torch.manual_seed(123)
    model, hist = F.train_feature_cnn(images, labels.int(), progress=False, **kw)   # int32 labels are cast
    after = torch.rand(3)
    ref, ref_hist = _train_by_hand(images, labels, **kw)
    assert [h["epoch"] for h in hist] == list(range(1, epochs + 1))
    for h, r in zip(hist, ref_hist):
        assert h["train_acc"] == r["train_acc"] and h["loss"] == pytest.approx(r["loss"], rel=1e-6)
    for (name, a), b in zip(model.state_dict().items(), ref.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    torch.manual_seed(123)
    assert torch.equal(after, torch.rand(3)), "training must leave the global random state as it was"
    assert not model.training and not any(p.requires_grad for p in model.parameters())


def test_training_validates_when_given_both_parts_and_shows_progress_only_when_asked(capfd):
    labels, images = torch.arange(12) % 2, _images(12, size=8)
    kw = dict(num_classes=2, epochs=1, batch_size=6, width=2, seed=0)
    _, hist = F.train_feature_cnn(images, labels, progress=False, val_images=images, **kw)   # no val labels
    assert set(hist[0]) == {"epoch", "loss", "train_acc"}
    assert capfd.readouterr().err == ""
    _, hist = F.train_feature_cnn(images, labels, progress=True, val_images=images, val_labels=labels, **kw)
    err = capfd.readouterr().err
    assert "feature CNN" in err and "step" in err and "val_acc" in hist[0]


def test_training_refuses_bad_inputs_with_the_whole_message():
    images, labels = _images(4, size=8), torch.tensor([0, 1, 2, 1])
    cases = [((images.float(), labels), "expecting uint8 [N,3,H,W] images, got torch.float32 (4, 3, 8, 8)"),
             ((images[:, :1], labels), "expecting uint8 [N,3,H,W] images, got torch.uint8 (4, 1, 8, 8)"),
             ((images[0], labels), "expecting uint8 [N,3,H,W] images, got torch.uint8 (3, 8, 8)"),
             ((images, labels[:3]), "one label per image"),
             ((images, torch.tensor([0, 1, 3, 1])), "labels must lie in [0, 3)"),
             ((images, torch.tensor([0, -1, 2, 1])), "labels must lie in [0, 3)")]
    for (x, y), msg in cases:
        with pytest.raises(ValueError) as e:
            F.train_feature_cnn(x, y, num_classes=3, epochs=1, progress=False, width=2)
        assert _message(e) == msg


# --- torch-fidelity -------------------------------------------------------------------------------

def test_extractor_returns_the_asked_features_in_order_as_floats(tmp_path):
    net, x = _net(), _images(3)
    path = tmp_path / "n.safetensors"
    F.save_feature_cnn(net, path)
    pool = net.features(x)
    want = {"pool": pool, "logits_unbiased": pool @ net.fc.weight.T, "logits": pool @ net.fc.weight.T + net.fc.bias}
    for names in (("pool",), ("logits",), ("logits_unbiased", "pool"), ("logits", "logits_unbiased", "pool")):
        ext = F.FeatureExtractorTinyShapesCNN("tinyshapes-cnn", names, feature_extractor_weights_path=str(path))
        out = ext(x)
        assert len(out) == len(names) and all(t.dtype == torch.float32 for t in out)
        for name, t in zip(names, out):
            torch.testing.assert_close(t, want[name], msg=name)
    for bad, msg in ((x.float(), "Expecting image as torch.Tensor with dtype=torch.uint8"),
                     (x.numpy(), "Expecting image as torch.Tensor with dtype=torch.uint8"),
                     (x[:, :1], "Input is not Bx3xHxW: (3, 1, 16, 16)"), (x[0], "Input is not Bx3xHxW: (3, 16, 16)")):
        with pytest.raises(ValueError) as e:
            ext(bad)
        assert _message(e) == msg
    cls = F.FeatureExtractorTinyShapesCNN
    assert cls.get_provided_features_list() == ("pool", "logits_unbiased", "logits")
    assert {m: cls.get_default_feature_layer_for_metric(m) for m in ("isc", "fid", "kid", "prc")} == \
        {"isc": "logits_unbiased", "fid": "pool", "kid": "pool", "prc": "pool"}
    assert cls.can_be_compiled() is False
    dummy = cls.get_dummy_input_for_compile()
    assert dummy.dtype == torch.uint8 and dummy.shape == (1, 3, 32, 32)


def test_registration_adds_keeps_replaces_after_a_reload_and_refuses_a_stranger(monkeypatch):
    calls = []
    monkeypatch.setattr(F, "register_feature_extractor", lambda name, cls: calls.append((name, cls)))
    monkeypatch.setitem(FEATURE_EXTRACTORS_REGISTRY, F.EXTRACTOR_NAME, F.FeatureExtractorTinyShapesCNN)
    F.register_tinyshapes_extractor()   # already there: nothing to do
    assert calls == [] and FEATURE_EXTRACTORS_REGISTRY[F.EXTRACTOR_NAME] is F.FeatureExtractorTinyShapesCNN
    monkeypatch.delitem(FEATURE_EXTRACTORS_REGISTRY, F.EXTRACTOR_NAME)
    F.register_tinyshapes_extractor()   # absent: registered through torch-fidelity
    assert calls == [(F.EXTRACTOR_NAME, F.FeatureExtractorTinyShapesCNN)]
    stale = type("FeatureExtractorTinyShapesCNN", (), {"__module__": F.__name__})   # this module, reloaded
    monkeypatch.setitem(FEATURE_EXTRACTORS_REGISTRY, F.EXTRACTOR_NAME, stale)
    F.register_tinyshapes_extractor()
    assert FEATURE_EXTRACTORS_REGISTRY[F.EXTRACTOR_NAME] is F.FeatureExtractorTinyShapesCNN and len(calls) == 1
    for module, qualname in (("someone.else", "FeatureExtractorTinyShapesCNN"), (F.__name__, "Other")):
        stranger = type(qualname, (), {"__module__": module})
        monkeypatch.setitem(FEATURE_EXTRACTORS_REGISTRY, F.EXTRACTOR_NAME, stranger)
        with pytest.raises(ValueError) as e:
            F.register_tinyshapes_extractor()
        assert _message(e) == (f"torch-fidelity feature extractor 'tinyshapes-cnn' is already registered "
                               f"by {module}.{qualname}")
        assert FEATURE_EXTRACTORS_REGISTRY[F.EXTRACTOR_NAME] is stranger
