"""tinyshapes is pinned: deterministic in (split, index), independent of how much is asked for,
class-balanced in every prefix, and bit-identical to the images the shipped tiny world was trained on
(golden hash)."""
import hashlib
import itertools

import pytest
import torch

from bench.data import tinyshapes

CHUNK = tinyshapes.CHUNK
N = 2 * CHUNK + 88  # 600: three chunks, the last one partial

# sha256 of generate(300, "train"): the uint8 image bytes, then the int64 label bytes (both
# C-contiguous, native byte order). Any change to the generator changes this hash; if the change is
# intended, the tiny world's checkpoints must be retrained (`make tiny-models`) with the new data.
GOLDEN_TRAIN_300 = "903816306e1356a83553f2e2577a3869f9aa30c916d261da7b4a4f18b6668633"


def _digest(imgs: torch.Tensor, labels: torch.Tensor) -> str:
    h = hashlib.sha256()
    h.update(imgs.contiguous().numpy().tobytes())
    h.update(labels.to(torch.int64).contiguous().numpy().tobytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def train600():
    return tinyshapes.generate(N, "train")


def test_golden_hash():
    imgs, labels = tinyshapes.generate(300, "train")
    assert imgs.dtype == torch.uint8 and imgs.shape == (300, 3, 32, 32)
    assert labels.dtype == torch.int64 and labels.shape == (300,)
    assert _digest(imgs, labels) == GOLDEN_TRAIN_300


def test_two_calls_identical(train600):
    imgs, labels = tinyshapes.generate(N, "train")
    assert torch.equal(imgs, train600[0]) and torch.equal(labels, train600[1])


@pytest.mark.parametrize("k", [1, 12, CHUNK - 1, CHUNK, CHUNK + 1, 300])
def test_prefix_independent_of_n(train600, k):
    imgs, labels = tinyshapes.generate(k, "train")
    assert torch.equal(imgs, train600[0][:k]) and torch.equal(labels, train600[1][:k])


@pytest.mark.parametrize("start,n", [(0, 5), (1, 20), (CHUNK - 3, 6), (CHUNK, 10), (CHUNK + 7, 300),
                                     (2 * CHUNK - 1, 2), (N - 1, 1), (40, 0)])
def test_start_offset(train600, start, n):
    """Indices start … start+n−1, across chunk boundaries, equal the same slice of a longer call."""
    imgs, labels = tinyshapes.generate(n, "train", start=start)
    assert imgs.shape == (n, 3, 32, 32) and labels.shape == (n,)
    assert torch.equal(imgs, train600[0][start:start + n]) and torch.equal(labels, train600[1][start:start + n])


def test_chunk_boundary_independent_of_n(train600):
    """The images just before and after index CHUNK are the same whatever n is."""
    window = slice(CHUNK - 4, CHUNK + 4)
    for n in (CHUNK + 4, CHUNK + 100):
        imgs, labels = tinyshapes.generate(n, "train")
        assert torch.equal(imgs[window], train600[0][window]) and torch.equal(labels[window], train600[1][window])


def test_splits_differ():
    data = {s: tinyshapes.generate(24, s) for s in tinyshapes.SPLIT_SEEDS}
    for a, b in itertools.combinations(data, 2):
        assert torch.equal(data[a][1], data[b][1])                     # same label cycle …
        differ = (data[a][0] != data[b][0]).flatten(1).any(1)
        assert bool(differ.all()), f"splits {a} and {b} share images at {(~differ).nonzero().flatten().tolist()}"


def test_images_differ_within_split(train600):
    imgs = train600[0].flatten(1)
    assert len(torch.unique(imgs, dim=0)) == len(imgs)


def test_class_balance_of_every_prefix(train600):
    labels = train600[1]
    C = tinyshapes.NUM_CLASSES
    assert torch.equal(labels, torch.arange(N) % C)
    counts = torch.zeros(C, dtype=torch.long)
    for k, y in enumerate(labels.tolist(), start=1):
        counts[y] += 1
        assert int(counts.max() - counts.min()) <= 1, f"prefix of {k} is unbalanced: {counts.tolist()}"
        if k % C == 0:
            assert bool((counts == k // C).all())
    _, off = tinyshapes.generate(30, "val", start=CHUNK + 5)
    assert torch.equal(off, (torch.arange(30) + CHUNK + 5) % C)


def test_independent_of_thread_count():
    prev = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = tinyshapes.generate(40, "ref", start=CHUNK - 20)
        torch.set_num_threads(2)
        two = tinyshapes.generate(40, "ref", start=CHUNK - 20)
    finally:
        torch.set_num_threads(prev)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"^unknown split 'test'; splits are train, val, ref, calib$"):
        tinyshapes.generate(4, "test")
    with pytest.raises(ValueError, match=r"^n and start must be ≥ 0, got n=-1, start=0$"):
        tinyshapes.generate(-1, "train")
    with pytest.raises(ValueError, match=r"^n and start must be ≥ 0, got n=4, start=-1$"):
        tinyshapes.generate(4, "train", start=-1)


@pytest.mark.parametrize("start,n,chunks", [(0, 1, [0]), (0, CHUNK, [0]), (CHUNK - 1, 1, [0]), (CHUNK - 1, 2, [0, 1]),
                                            (CHUNK, CHUNK, [1]), (5, 2 * CHUNK, [0, 1, 2]), (40, 0, [])])
def test_draws_only_the_chunks_it_needs(monkeypatch, start, n, chunks):
    """Each chunk costs 256 supersampled images: a call draws exactly the chunks its indices fall in."""
    drawn, chunk = [], tinyshapes._chunk
    monkeypatch.setattr(tinyshapes, "_chunk", lambda split, c, size: drawn.append(c) or chunk(split, c, size))
    imgs, labels = tinyshapes.generate(n, "calib", size=8, start=start)
    assert drawn == chunks and imgs.shape == (n, 3, 8, 8) and labels.shape == (n,)


def test_to_pm1_is_vars_normalisation():
    """uint8 → [−1, 1] as VAR's normalize_01_into_pm1(x / 255) = 2x/255 − 1, float32."""
    x = torch.tensor([0, 51, 128, 255], dtype=torch.uint8)
    y = tinyshapes.to_pm1(x)
    assert y.dtype == torch.float32 and torch.allclose(y, x.float() / 255 * 2 - 1, atol=1e-7)
    assert y[0] == -1 and y[-1] == 1
