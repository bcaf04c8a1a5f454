"""bench.checkpoint's messages and rules in full: where the checkpoint folder is, what a missing file's
error says, which files read_state_dict accepts and how it unwraps them, the manifest check."""
import json

import pytest
import torch
from safetensors.torch import save_file

from bench import checkpoint as ck
from bench.checkpoint import (
    CheckpointError,
    CheckpointMismatch,
    CheckpointNotFound,
    check_manifest,
    ckpt_dir,
    load_built,
    locate,
    locate_all,
    not_found,
    read_state_dict,
    sha256,
)


def test_mismatch_message_in_full_and_its_fields():
    e = CheckpointMismatch("var.pth", {"a.w": (2, 3)}, {"b": (4,)}, {"c": ((1,), (2,))})
    assert str(e) == ("var.pth does not match the model: 1 missing, 1 unexpected, 1 wrongly shaped tensor(s)\n"
                      "  missing     a.w: expected [2, 3]\n"
                      "  unexpected  b: found [4]\n"
                      "  wrong shape c: expected [1], found [2]")
    assert (e.missing, e.unexpected, e.wrong_shape) == ({"a.w": (2, 3)}, {"b": (4,)}, {"c": ((1,), (2,))})
    assert isinstance(e, CheckpointError) and isinstance(e, RuntimeError)


def test_checkpoint_folder_flag_then_environment_then_default(monkeypatch, tmp_path):
    monkeypatch.setenv("VARBENCH_CKPT_DIR", str(tmp_path / "env"))
    assert ckpt_dir(tmp_path / "flag") == tmp_path / "flag"
    assert ckpt_dir() == tmp_path / "env"
    monkeypatch.delenv("VARBENCH_CKPT_DIR")
    assert ckpt_dir() == ck.DEFAULT_CKPT_DIR
    assert ck.DEFAULT_CKPT_DIR.parts[-3:] == (".cache", "varbench", "checkpoints")
    monkeypatch.setenv("VARBENCH_CKPT_DIR", "")   # empty: as if unset
    assert ckpt_dir() == ck.DEFAULT_CKPT_DIR


def test_not_found_message_in_full(tmp_path):
    e = not_found(tmp_path, ["a.pth: get it from X", "b.pth: get it from Y"])
    assert isinstance(e, CheckpointNotFound) and isinstance(e, FileNotFoundError)
    assert str(e) == (f"2 checkpoint file(s) not found in {tmp_path}:\n  a.pth: get it from X\n  b.pth: get it from Y\n"
                      f"  Put them in {tmp_path} (or point --ckpt-dir / VARBENCH_CKPT_DIR at the folder that has "
                      f"them). varbench never downloads at run time.")
    assert str(not_found(tmp_path, ["c"], put="Unpack the archive there.")) == (
        f"1 checkpoint file(s) not found in {tmp_path}:\n  c\n  Unpack the archive there. varbench never downloads "
        f"at run time.")


def test_locate_all_finds_every_file_or_lists_every_missing_one(tmp_path, monkeypatch):
    monkeypatch.delenv("VARBENCH_CKPT_DIR", raising=False)
    (tmp_path / "a.pth").write_bytes(b"x")
    (tmp_path / "sub.pth").mkdir()   # a folder of that name is not the file
    assert locate_all([("a.pth", "https://a")], tmp_path) == {"a.pth": tmp_path / "a.pth"}
    assert locate("a.pth", tmp_path, "https://a") == tmp_path / "a.pth"
    with pytest.raises(CheckpointNotFound) as e:
        locate_all([("a.pth", "https://a"), ("b.pth", "https://b"), ("sub.pth", "https://s")], tmp_path)
    assert str(e.value) == str(not_found(tmp_path, ["b.pth: get it from https://b", "sub.pth: get it from https://s"]))
    monkeypatch.setenv("VARBENCH_CKPT_DIR", str(tmp_path))   # no flag: the environment's folder
    assert locate("a.pth", None, "https://a") == tmp_path / "a.pth"


def test_a_missing_path_is_checkpoint_not_found(tmp_path):
    with pytest.raises(CheckpointNotFound) as e:
        read_state_dict(tmp_path / "nope.pth")
    assert str(e.value) == f"checkpoint {tmp_path / 'nope.pth'} does not exist"
    (tmp_path / "dir.pth").mkdir()
    with pytest.raises(CheckpointNotFound, match="does not exist"):
        read_state_dict(tmp_path / "dir.pth")


def _sd():
    return {"w": torch.arange(6.0).view(2, 3), "n": torch.tensor([1, 2], dtype=torch.int64)}


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)


def test_safetensors_and_torch_files_read_alike(tmp_path):
    save_file(_sd(), str(tmp_path / "m.safetensors"))
    torch.save(_sd(), tmp_path / "m.pth")
    for name in ("m.safetensors", "m.pth"):
        sd = read_state_dict(str(tmp_path / name))   # a string path as well as a Path
        assert type(sd) is dict and _same(sd, _sd())
    # the suffix decides the reader: safetensors bytes under .pth are not a torch file
    (tmp_path / "s.pth").write_bytes((tmp_path / "m.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        read_state_dict(tmp_path / "s.pth")


def test_safetensors_files_go_through_safetensors(tmp_path, monkeypatch):
    import safetensors.torch
    calls, real = [], safetensors.torch.load_file
    monkeypatch.setattr(safetensors.torch, "load_file", lambda *a, **k: calls.append((a, k)) or real(*a, **k))
    save_file(_sd(), str(tmp_path / "m.safetensors"))
    torch.save(_sd(), tmp_path / "m.pth")
    read_state_dict(tmp_path / "m.pth")
    assert calls == []
    read_state_dict(tmp_path / "m.safetensors")
    assert calls == [((str(tmp_path / "m.safetensors"),), {"device": "cpu"})]


def test_wrappers_are_unwrapped_entry_first(tmp_path):
    torch.save({"state_dict": _sd(), "epoch": 3}, tmp_path / "sd.pth")
    assert _same(read_state_dict(tmp_path / "sd.pth"), _sd())
    torch.save({"vae": {"state_dict": _sd()}, "args": "x"}, tmp_path / "vae.pth")
    assert _same(read_state_dict(tmp_path / "vae.pth", entry="vae"), _sd())
    assert _same(read_state_dict(tmp_path / "sd.pth", entry="vae"), _sd())   # no such entry: "state_dict" still
    torch.save({"model": _sd(), "epoch": 3}, tmp_path / "other.pth")   # neither wrapper: not tensors only
    with pytest.raises(CheckpointError) as e:
        read_state_dict(tmp_path / "other.pth", entry="vae")
    assert str(e.value) == f"{tmp_path / 'other.pth'} holds a dict, not a state_dict of tensors"
    torch.save({"vae": torch.zeros(1), "w": torch.ones(1)}, tmp_path / "flat.pth")   # an entry that is a tensor
    assert _same(read_state_dict(tmp_path / "flat.pth", entry="vae"), {"vae": torch.zeros(1), "w": torch.ones(1)})
    torch.save([torch.zeros(1)], tmp_path / "list.pth")
    with pytest.raises(CheckpointError, match="holds a list, not a state_dict of tensors"):
        read_state_dict(tmp_path / "list.pth")


class _Payload:
    """Unpickling it writes a file: a torch file that runs code when loaded without weights_only."""
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_torch_files_are_read_weights_only(tmp_path):
    marker = tmp_path / "code-ran"
    torch.save({"w": torch.zeros(1), "x": _Payload(marker)}, tmp_path / "evil.pth")
    with pytest.raises(CheckpointError) as e:
        read_state_dict(tmp_path / "evil.pth")
    assert not marker.exists()
    size = (tmp_path / "evil.pth").stat().st_size
    assert str(e.value).startswith(f"{tmp_path / 'evil.pth'} ({size:,} bytes) is not a readable checkpoint — "
                                   f"truncated or not a PyTorch/safetensors file (UnpicklingError: ")
    assert str(e.value).endswith("). Re-download or re-create it.") and "\n" not in str(e.value)
    assert "weights_only" not in str(e.value)       # torch's advice to load unguarded is not passed on
    torch.load(tmp_path / "evil.pth", weights_only=False)[  # the payload is live: loaded without the guard, it runs
        "x"].close()
    assert marker.exists()


def test_random_bytes_say_why_without_torchs_advice(tmp_path):
    (tmp_path / "r.pth").write_bytes(bytes(range(256)) * 20)
    with pytest.raises(CheckpointError) as e:
        read_state_dict(tmp_path / "r.pth")
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'r.pth'} (5,120 bytes) is not a readable checkpoint — truncated or not a "
                          "PyTorch/safetensors file (") and msg.endswith("). Re-download or re-create it.")
    reason = msg[msg.index("file (") + 6:msg.rindex(")")]
    assert ": " in reason and reason.split(": ", 1)[1] and "weights_only" not in msg and "Please file" not in msg


def test_an_empty_file_names_its_size(tmp_path):
    (tmp_path / "e.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError) as e:
        read_state_dict(tmp_path / "e.safetensors")
    assert str(e.value).startswith(f"{tmp_path / 'e.safetensors'} (0 bytes) is not a readable checkpoint")
    (tmp_path / "big.pth").write_bytes(b"\0" * 1234)
    with pytest.raises(CheckpointError, match=r"\(1,234 bytes\)"):
        read_state_dict(tmp_path / "big.pth")


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.register_buffer("count", torch.zeros(2, dtype=torch.int64))


class _Adapting(_Tiny):
    def adapt_state_dict(self, sd):
        return {("lin." + k[4:] if k.startswith("old.") else k): v for k, v in sd.items()}


def test_load_built_upcasts_adapts_and_freezes():
    sd = {"lin.weight": torch.randn(2, 3).half(), "lin.bias": torch.randn(2).half(), "count": torch.tensor([3, 4])}
    m = load_built(_Tiny, sd, "tiny")
    assert m.lin.weight.dtype == torch.float32 and torch.equal(m.lin.weight, sd["lin.weight"].float())
    assert m.count.dtype == torch.int64 and m.count.tolist() == [3, 4]
    assert not m.training and not any(p.requires_grad for p in m.parameters())
    assert m.lin.weight.device.type == "cpu"
    assert all(p.requires_grad for p in load_built(_Tiny, sd, "tiny", requires_grad=True).parameters())
    old = {("old." + k[4:] if k.startswith("lin.") else k): v for k, v in sd.items()}
    assert torch.equal(load_built(_Adapting, old, "tiny").lin.bias, sd["lin.bias"].float())
    with pytest.raises(CheckpointMismatch) as e:
        load_built(_Tiny, old, "tiny.pth")
    assert str(e.value).startswith("tiny.pth does not match the model: 2 missing, 2 unexpected")


def test_sha256_reads_in_chunks_and_is_cached_by_path_size_and_time(tmp_path):
    import hashlib
    import os
    p = tmp_path / "f.bin"
    data = bytes(range(256)) * 41
    p.write_bytes(data)
    assert sha256(p, chunk=1000) == hashlib.sha256(data).hexdigest()
    st = os.stat(p)
    p.write_bytes(data[::-1])      # same size; the old time kept: the cached digest is returned
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert sha256(p) == hashlib.sha256(data).hexdigest()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert sha256(p) == hashlib.sha256(data[::-1]).hexdigest()


def test_manifest_check_in_full(tmp_path):
    p = tmp_path / "m.safetensors"
    p.write_bytes(b"weights")
    digest = sha256(p)
    assert check_manifest(p) == digest                        # no manifest: the digest
    man = tmp_path / "manifest.json"
    man.write_text(json.dumps({"models": {"m": {"file": "m.safetensors", "sha256": digest},
                                          "other": {"file": "o.safetensors", "sha256": "0" * 64},
                                          "notes": "not an entry", "nosha": {"file": "m.safetensors"}}}))
    assert check_manifest(p) == digest
    man.write_text(json.dumps({"models": {"m": {"file": "m.safetensors", "sha256": "ab" * 32}}}))
    with pytest.raises(CheckpointError) as e:
        check_manifest(p)
    assert str(e.value) == (f"{p} does not match {man} (m: sha256 {digest[:12]}…, manifest says {'ab' * 6}…). "
                            f"Restore the shipped file (git checkout -- m.safetensors) or retrain it "
                            f"with `make tiny-models`, which rewrites the manifest.")
    for entry in ("tiny-bsq", "tiny-t2i", "tiny-t2i-text"):          # the text-to-image files have their own recipe
        man.write_text(json.dumps({"models": {entry: {"file": "m.safetensors", "sha256": "ab" * 32}}}))
        with pytest.raises(CheckpointError, match="retrain it with `make tiny-t2i`, which rewrites the manifest.$"):
            check_manifest(p)
    man.write_text(json.dumps({"models": {"m": {"file": "m.safetensors", "sha256": "ab" * 32}}}))
    other = tmp_path / "elsewhere.json"   # an explicit manifest instead of the one beside the file
    other.write_text(json.dumps({"models": {"m": {"file": "m.safetensors", "sha256": digest}}}))
    assert check_manifest(p, other) == digest
    assert check_manifest(p, tmp_path / "absent.json") == digest
    assert check_manifest(str(p), str(other)) == digest   # string paths too
    man.write_text("{not json")
    try:
        json.loads("{not json")
    except ValueError as err:
        why = str(err)
    with pytest.raises(CheckpointError) as e:
        check_manifest(p)
    assert str(e.value) == f"{man} is not a readable manifest ({why})"
    man.write_text("[1, 2]")   # JSON, but not an object
    with pytest.raises(CheckpointError, match="is not a readable manifest"):
        check_manifest(p)
    man.write_text(json.dumps({"other": 1}))   # no models: nothing to check
    assert check_manifest(p) == digest



def test_a_checkpoint_file_given_as_the_folder_says_so(tmp_path):
    from bench.checkpoint import CheckpointNotFound, locate_all
    f = tmp_path / "var_d16.pth"
    f.write_bytes(b"x")
    with pytest.raises(CheckpointNotFound) as e:
        locate_all([("var_d16.pth", "https://example.org")], f)
    assert str(e.value) == (f"the checkpoint folder {f} is a file: point --ckpt-dir / VARBENCH_CKPT_DIR at the folder "
                            f"that holds the checkpoints (e.g. {tmp_path})")
    assert locate_all([("var_d16.pth", "https://example.org")], tmp_path) == {"var_d16.pth": f}


@pytest.mark.parametrize("text, reason", [
    ("Weights only load failed. In PyTorch 2.6, we changed the default value of the `weights_only` argument.\n"
     "Please file an issue with the following: WeightsUnpickler error: \n\nUnsupported operand 18\n\nCheck the "
     "documentation of torch.load.", "Unsupported operand 18"),
    ("Weights only load failed. This file can still be loaded.\n\t(1) Re-running `torch.load` with `weights_only` "
     "set to `False` will likely succeed.\n\tWeightsUnpickler error: Unsupported global: GLOBAL print was not an "
     "allowed global by default. Please use `torch.serialization.add_safe_globals([print])`.",
     "Unsupported global: GLOBAL print was not an allowed global by default"),
    ("PytorchStreamReader failed reading zip archive: failed finding central directory",
     "PytorchStreamReader failed reading zip archive: failed finding central directory"),
    ("\n  header too large.\nmore", "header too large"), ("length exceeds MAX.", "length exceeds MAX"),
    ("", ""),
])
def test_the_reason_of_a_loader_error_is_its_first_sentence_without_torchs_advice(text, reason):
    assert ck._first_line(RuntimeError(text)) == reason
