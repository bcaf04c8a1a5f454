"""The sampler's speed-ups change no value: AdaLN vectors computed once per generation, the
preallocated KV cache, and the decoder's in-place inference path give bit-identical tokens, f_hat
and images to the plain official loop (AdaLN per scale, KV re-concatenated every scale, out-of-place
decoder). The official golden outputs (tests/test_official_var.py) pin the same loop against the
official code; these tests pin each optimisation on its own so a broken one is named."""
import pytest
import torch

from bench.models.generator import to_uint8
from tests.conftest import official_loop

pytestmark = pytest.mark.usefixtures("one_thread")
LABELS = torch.tensor([0, 4, 2])
CFG, TOP_K, TOP_P = 1.5, 20, 0.9


@torch.no_grad()
@pytest.mark.parametrize("seed", [0, 5])
def test_optimised_sampler_equals_the_plain_official_loop_bit_for_bit(small_gen, seed):
    toks, f_hat = small_gen.sample_tokens(LABELS, seed=seed, cfg=CFG, top_k=TOP_K, top_p=TOP_P)
    ref_toks, ref_f_hat = official_loop(small_gen, LABELS, seed, CFG, TOP_K, TOP_P)
    assert all(torch.equal(a, b) for a, b in zip(toks, ref_toks))
    assert torch.equal(f_hat, ref_f_hat)
    img = small_gen.generate(LABELS, seed=seed, cfg=CFG, top_k=TOP_K, top_p=TOP_P)
    with torch.enable_grad():   # the decoder's training path: out of place, as the model was trained
        ref_img = to_uint8(small_gen.vae.fhat_to_img(ref_f_hat).add_(1).mul_(0.5))
    assert torch.equal(img, ref_img)


@torch.no_grad()
def test_cached_adaln_vectors_equal_the_per_scale_ones(small_gen):
    var = small_gen.var
    cond = var.cond(torch.tensor([1, 5]))
    blocks, head = var.ada_vectors(cond)
    assert len(blocks) == len(var.blocks)
    for b, a in zip(var.blocks, blocks):
        assert torch.equal(a, b.ada_lin(cond).view(-1, 1, 6, var.C))
    assert torch.equal(head, var.head_nm.ada_lin(cond).view(-1, 1, 2, var.C))
    x = torch.randn(2, 4, var.C)
    assert torch.equal(var.run_blocks(x, cond, None, None, blocks), var.run_blocks(x, cond))
    assert torch.equal(var.get_logits(x, cond, head), var.get_logits(x, cond))


@torch.no_grad()
def test_kv_buffer_equals_concatenation_and_is_reset_per_generation(small_gen):
    attn = small_gen.var.blocks[0].attn
    g = torch.Generator().manual_seed(3)
    chunks = [torch.randn(2, attn.H, n, attn.c, generator=g) for n in (1, 4, 9)]
    attn.kv_caching(True, max_len=14)
    for i, k in enumerate(chunks):
        got_k, got_v = attn._cache(k, -k)
        want = torch.cat(chunks[:i + 1], dim=2)
        assert torch.equal(got_k, want) and torch.equal(got_v, -want)
    attn.kv_caching(True, max_len=14)           # a new generation starts from an empty cache
    got_k, _ = attn._cache(chunks[1], chunks[1])
    assert torch.equal(got_k, chunks[1])
    attn.kv_caching(True, max_len=14)           # a different batch size gets a new buffer
    got_k, _ = attn._cache(chunks[0][:1], chunks[0][:1])
    assert got_k.shape[0] == 1 and torch.equal(got_k, chunks[0][:1])
    attn.kv_caching(False)
    assert attn.kv_k is None and not attn.caching


@torch.no_grad()
def test_kv_buffer_is_as_long_as_the_last_generation_cached_and_grows_when_needed(small_gen):
    """A token policy caches fewer tokens: the next generation's buffer is that long (its memory
    saving kept), and a generation that caches more (the policy removed) grows it, same values."""
    from bench.models.policy import TokenPolicy
    from tests.test_token_methods import _apply
    labels = torch.tensor([0, 3])
    dense = small_gen.generate(labels, seed=5, cfg=1.5)
    L = small_gen.var.L
    assert all(b.attn.kv_used == L for b in small_gen.var.blocks)   # (the method is applied in place)
    gen, _ = _apply(small_gen, "fastvar")
    pruned = gen.generate(labels, seed=5, cfg=1.5)
    kept = gen.var.blocks[0].attn.kv_used
    assert kept < L and all(b.attn.kv_used == kept for b in gen.var.blocks)
    sizes = []
    gen.sample_tokens(labels, seed=5, cfg=1.5, logits_hook=lambda si, lg: sizes.append(gen.var.blocks[0].attn.kv_k.shape[2]))
    assert set(sizes) == {kept}                  # allocated at the pruned length, never grown
    assert torch.equal(gen.generate(labels, seed=5, cfg=1.5), pruned)
    gen.token_policy = TokenPolicy()             # the identity again: the short buffer grows once
    sizes.clear()
    gen.sample_tokens(labels, seed=5, cfg=1.5, logits_hook=lambda si, lg: sizes.append(gen.var.blocks[0].attn.kv_k.shape[2]))
    assert sizes[0] == kept and sizes[-1] == L
    assert torch.equal(gen.generate(labels, seed=5, cfg=1.5), dense)


def test_decoder_inference_path_equals_its_training_path(small_gen):
    vae = small_gen.vae
    f = torch.randn(2, vae.Cvae, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        fast = vae.fhat_to_img(f)
    slow = vae.fhat_to_img(f)                    # grad enabled: the out-of-place path
    assert torch.equal(fast, slow.detach())


@torch.no_grad()
def test_official_per_scale_adaln_gives_the_same_tokens(small_gen):
    """``cache_adaln=False`` (what FLOP accounting counts) samples exactly what the default does."""
    a, fa = small_gen.sample_tokens(LABELS, seed=2, cfg=CFG, top_k=TOP_K, top_p=TOP_P)
    b, fb = small_gen.sample_tokens(LABELS, seed=2, cfg=CFG, top_k=TOP_K, top_p=TOP_P, cache_adaln=False)
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and torch.equal(fa, fb)


def test_training_loss_is_the_mean_token_cross_entropy_of_teacher_forcing(small_gen):
    """Generator.loss (the FT/KD objective) = mean CE of the teacher-forced logits over every token."""
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(6)
    V = small_gen.var.V
    tokens = [torch.randint(0, V, (2, pn * pn), generator=g) for pn in small_gen.patch_nums]
    labels = torch.tensor([1, 4])
    small_gen.eval()
    logits = small_gen.forward_teacher(labels, tokens)
    want = F.cross_entropy(logits.reshape(-1, V), torch.cat(tokens, 1).reshape(-1))
    assert torch.allclose(small_gen.loss(labels, tokens), want, atol=1e-6)
    flipped = [t.clone() for t in tokens]
    flipped[-1][0, -1] = (flipped[-1][0, -1] + 1) % V          # the last token counts too
    assert not torch.allclose(small_gen.loss(labels, flipped), want)


def test_reuse_heap_keeps_values_and_restores_mmap(small_gen, monkeypatch):
    """The heap context changes where memory comes from, never a value; it is a no-op when disabled."""
    import bench.models.heap as heap
    calls = []
    monkeypatch.setattr(heap, "_MALLOPT", lambda opt, val: calls.append((opt, val)) or 1)
    labels = torch.tensor([0, 3])
    with torch.no_grad():
        a = small_gen.generate(labels, seed=1, cfg=CFG, top_k=TOP_K, top_p=TOP_P)
    assert calls[:3] == [(heap.M_TRIM_THRESHOLD, heap.KEEP_FREED), (heap.M_MMAP_THRESHOLD, heap.MMAP_THRESHOLD_CEILING),
                         (heap.M_MMAP_MAX, 0)] and calls[-1] == (heap.M_MMAP_MAX, heap.MMAP_MAX_DEFAULT)
    calls.clear()
    with heap.reuse_heap(False) as on:
        assert on is False and calls == []
    monkeypatch.setattr(heap, "_MALLOPT", None)
    with torch.no_grad():
        assert torch.equal(small_gen.generate(labels, seed=1, cfg=CFG, top_k=TOP_K, top_p=TOP_P), a)
