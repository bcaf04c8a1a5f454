"""bench.io on its own: atomic writes (naming, durability, cleanup, mode), canonical safetensors headers,
PNG round trips, writable-folder checks. The SIGKILL test and the installed-copy provenance test are in
tests/test_records.py."""
import json
import os
import stat
import struct

import numpy as np
import pytest
import torch

import bench.io as io
from bench.io import (
    OutputDirError,
    atomic_write,
    atomic_write_bytes,
    atomic_write_text,
    canonical_safetensors,
    check_writable_dir,
    read_image,
    save_png,
)


def _open_fds():
    """The number of file descriptors this process holds (None where /proc is not there)."""
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None


def test_reading_the_umask_leaves_it_as_it_was():
    old = os.umask(0o027)
    try:
        assert io._umask() == 0o027
        assert os.umask(0o027) == 0o027   # still set after the read
    finally:
        os.umask(old)


def test_atomic_write_takes_a_string_path_and_makes_its_folders(tmp_path):
    target = str(tmp_path / "a" / "b" / "f.bin")
    out = atomic_write_bytes(target, b"abc")
    assert out == tmp_path / "a" / "b" / "f.bin" and isinstance(out, type(tmp_path))
    assert out.read_bytes() == b"abc"
    assert atomic_write_text(target, "é") == out and out.read_bytes() == "é".encode("utf-8")
    assert sorted(os.listdir(tmp_path / "a" / "b")) == ["f.bin"]   # no temporary file left


def test_the_temporary_file_is_hidden_beside_the_target(tmp_path):
    (tmp_path / "f.json").write_bytes(b"old")
    seen = []

    def write(fh):
        fh.write(b"new")
        seen.extend(sorted(os.listdir(tmp_path)))
        assert (tmp_path / "f.json").read_bytes() == b"old"   # readers still see the old file

    atomic_write(tmp_path / "f.json", write)
    assert len(seen) == 2 and seen[1] == "f.json"
    tmp = seen[0]
    assert tmp.startswith(".f.json.") and tmp.endswith(".tmp") and len(tmp) > len(".f.json..tmp")
    assert (tmp_path / "f.json").read_bytes() == b"new" and os.listdir(tmp_path) == ["f.json"]


def test_the_data_is_flushed_and_synced_before_the_rename(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        st = os.fstat(fd)
        synced.append("dir" if stat.S_ISDIR(st.st_mode) else st.st_size)
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    fds = _open_fds()
    atomic_write_bytes(tmp_path / "f.bin", b"x" * 100)   # less than a buffer: on disk only once flushed
    assert synced == [100, "dir"]   # the whole file (flushed first), then the folder holding the new name
    assert _open_fds() == fds   # the folder's descriptor is closed again   # the whole file (flushed first), then the folder holding the new name


def test_a_failed_write_removes_its_temporary_file_and_keeps_the_old_one(tmp_path):
    (tmp_path / "f.bin").write_bytes(b"old")

    def fail(fh):
        fh.write(b"half")
        raise KeyboardInterrupt   # BaseException too: an interrupted run leaves nothing behind

    with pytest.raises(KeyboardInterrupt):
        atomic_write(tmp_path / "f.bin", fail)
    assert os.listdir(tmp_path) == ["f.bin"] and (tmp_path / "f.bin").read_bytes() == b"old"


def test_a_failed_rename_removes_its_temporary_file(tmp_path):
    (tmp_path / "f.bin").mkdir()   # a folder in the way: os.replace fails after the data is written
    (tmp_path / "f.bin" / "x").write_bytes(b"")
    with pytest.raises(OSError):
        atomic_write_bytes(tmp_path / "f.bin", b"data")
    assert os.listdir(tmp_path) == ["f.bin"]


def test_written_files_get_the_mode_of_a_plain_open(tmp_path):
    old = os.umask(0o027)
    try:
        assert atomic_write_bytes(tmp_path / "f", b"").stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(old)


def _safetensors(header: dict, payload: bytes = b"", pad: int = 0) -> bytes:
    raw = json.dumps(header, separators=(",", ":")).encode() + b" " * pad
    return struct.pack("<Q", len(raw)) + raw + payload


def test_canonical_safetensors_sorts_metadata_and_keeps_everything_else():
    t = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
    data = _safetensors({"__metadata__": {"b": "2", "a": "1"}, "w": t}, b"\0\0\x80?", pad=3)
    out = canonical_safetensors(data)
    assert len(out) == len(data) and out[:8] == data[:8] and out.endswith(b"\0\0\x80?")
    raw = out[8:8 + struct.unpack("<Q", data[:8])[0]]
    assert raw == b'{"__metadata__":{"a":"1","b":"2"},"w":' + json.dumps(t, separators=(",", ":")).encode() + b"}   "
    # one key or none: nothing to order
    for meta in ({"b": "2"}, {}):
        one = _safetensors({"__metadata__": meta, "w": t}, b"\0\0\x80?")
        assert canonical_safetensors(one) == one
    no_meta = _safetensors({"w": t}, b"\0\0\x80?")
    assert canonical_safetensors(no_meta) == no_meta


def test_canonical_safetensors_leaves_an_unexpected_layout_alone():
    t = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
    raw = json.dumps({"__metadata__": {"b": "2", "a": "1"}, "w": t}, indent=1).encode()   # not compact
    data = struct.pack("<Q", len(raw)) + raw + b"\0\0\x80?"
    with pytest.warns(UserWarning) as w:
        assert canonical_safetensors(data) == data
    assert [str(x.message) for x in w] == ["unexpected safetensors header layout; metadata order left as written"]
    assert w[0].filename == __file__   # reported at the caller's line


@pytest.mark.parametrize("as_numpy", [False, True])
def test_png_round_trip_is_exact(tmp_path, as_numpy):
    img = torch.randint(0, 256, (3, 5, 7), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    p = save_png(tmp_path / "d" / "x.png", img.numpy() if as_numpy else img)
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    back = read_image(p)
    assert back.dtype == torch.uint8 and back.shape == (3, 5, 7) and torch.equal(back, img)


def test_save_png_brings_a_device_tensor_to_the_cpu_first(tmp_path):
    img = np.arange(3 * 2 * 2, dtype=np.uint8).reshape(3, 2, 2)

    class OnDevice:   # what a CUDA tensor offers: .cpu(), and no array interface of its own
        def cpu(self):
            return img

    assert np.array_equal(read_image(save_png(tmp_path / "x.png", OnDevice())).numpy(), img)


def test_read_image_gives_rgb_for_grey_and_rgba_files(tmp_path):
    from PIL import Image
    Image.fromarray(np.full((2, 3), 7, np.uint8), mode="L").save(tmp_path / "g.png")
    Image.fromarray(np.full((2, 3, 4), 9, np.uint8), mode="RGBA").save(tmp_path / "a.png")
    assert torch.equal(read_image(tmp_path / "g.png"), torch.full((3, 2, 3), 7, dtype=torch.uint8))
    assert torch.equal(read_image(tmp_path / "a.png"), torch.full((3, 2, 3), 9, dtype=torch.uint8))


def test_writable_folder_is_created_and_probed_without_a_trace(tmp_path, monkeypatch):
    probes, real = [], io.tempfile.mkstemp

    def mkstemp(*a, **k):
        fd, name = real(*a, **k)
        probes.append(os.path.basename(name))
        return fd, name

    monkeypatch.setattr(io.tempfile, "mkstemp", mkstemp)
    fds = _open_fds()
    d = check_writable_dir(str(tmp_path / "x" / "y"))
    assert d == tmp_path / "x" / "y" and d.is_dir() and os.listdir(d) == []
    assert len(probes) == 1 and probes[0].startswith(".varbench-write-check.")   # hidden if a crash leaves it
    assert _open_fds() == fds


def test_a_file_in_the_way_is_named(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(OutputDirError) as e:
        check_writable_dir(tmp_path / "f" / "sub" / "dir", "results folder")
    assert str(e.value) == f"results folder {tmp_path / 'f' / 'sub' / 'dir'}: {tmp_path / 'f'} is a file, not a folder"
    with pytest.raises(OutputDirError, match=f"^output folder {tmp_path / 'f'}: {tmp_path / 'f'} is a file"):
        check_writable_dir(tmp_path / "f")
    assert isinstance(e.value, OSError)


def test_checks_without_creating_and_of_output_files(tmp_path, monkeypatch):
    from bench.io import check_writable_file
    (tmp_path / "f").write_text("")
    assert check_writable_dir(tmp_path / "a" / "b", create=False) == tmp_path / "a" / "b"
    assert not (tmp_path / "a").exists()                                   # nothing made
    with pytest.raises(OutputDirError, match=f"^figures {tmp_path / 'f' / 'x'}: {tmp_path / 'f'} is a file, not a folder$"):
        check_writable_dir(tmp_path / "f" / "x", "figures", create=False)
    monkeypatch.setattr(io.os, "access", lambda path, mode: False)
    with pytest.raises(OutputDirError) as e:
        check_writable_dir(tmp_path / "a", "figures", create=False)
    assert str(e.value) == f"figures {tmp_path / 'a'} is not writable ({tmp_path}: permission denied); choose another folder"
    monkeypatch.undo()
    for bad, message in [("", "out: the path is empty; give a file name"),
                         ("  ", "out: the path is empty; give a file name"),
                         (str(tmp_path), f"out {tmp_path} is a folder; give a file name (e.g. {tmp_path / 'r.txt'})"),
                         (str(tmp_path / "f" / "r.txt"), f"out {tmp_path / 'f' / 'r.txt'}: its folder {tmp_path / 'f'}: "
                                                         f"{tmp_path / 'f'} is a file, not a folder")]:
        with pytest.raises(OutputDirError) as e:
            check_writable_file(bad, "out", "r.txt")
        assert str(e.value) == message
    assert check_writable_file(str(tmp_path / "new" / "r.txt"), "out") == tmp_path / "new" / "r.txt"
    assert (tmp_path / "new").is_dir()                                     # its folder is made
    with pytest.raises(OutputDirError, match="^results folder: the path is empty; give a folder$"):
        check_writable_dir("", "results folder")


def test_an_unwritable_folder_says_why(tmp_path, monkeypatch):
    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(io.tempfile, "mkstemp", refuse)
    with pytest.raises(OutputDirError) as e:
        check_writable_dir(tmp_path / "new", "table folder")
    assert str(e.value) == f"table folder {tmp_path / 'new'} is not writable (Permission denied); choose another folder"
    assert (tmp_path / "new").is_dir()   # created first, then probed

    def refuse_plain(*a, **k):
        raise OSError("no strerror")

    monkeypatch.setattr(io.tempfile, "mkstemp", refuse_plain)
    with pytest.raises(OutputDirError, match=r"is not writable \(no strerror\)"):
        check_writable_dir(tmp_path / "new")


def test_git_is_asked_in_the_checkout_and_fails_soft(monkeypatch, tmp_path):
    import subprocess
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=io.SOURCE_ROOT, capture_output=True, text=True)
    assert io._git("rev-parse", "HEAD") == head.stdout.strip() and len(head.stdout.strip()) == 40
    assert io._git("no-such-command") is None
    monkeypatch.setattr(io, "SOURCE_ROOT", tmp_path / "absent")   # git cannot even start there
    assert io._git("rev-parse", "HEAD") is None


def test_git_dirty_and_commit_of_a_checkout(tmp_path, monkeypatch):
    import subprocess

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / "f.py").write_text("a\n")
    git("add", "f.py")
    git("commit", "-q", "-m", "one")
    monkeypatch.setattr(io, "SOURCE_ROOT", tmp_path)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert io.git_commit() == head and io.git_dirty() is False
    (tmp_path / "new.py").write_text("")   # untracked files do not make a checkout dirty
    assert io.git_dirty() is False
    (tmp_path / "f.py").write_text("b\n")
    assert io.git_dirty() is True
    (tmp_path / "f.py").write_text("a\n")
    assert io.git_dirty() is False
    # a .git that git cannot read: the commit is unknown, and so is whether it is dirty
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / ".git").write_text("gitdir: /nonexistent\n")
    monkeypatch.setattr(io, "SOURCE_ROOT", broken)
    assert io.git_commit() == "unknown" and io.git_dirty() is None
