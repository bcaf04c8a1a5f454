"""The sampler's speed-ups change no value: AdaLN vectors computed once per generation, the
preallocated KV cache, and the decoder's in-place inference path give bit-identical tokens, f_hat
and images to the plain official loop (AdaLN per scale, KV re-concatenated every scale, out-of-place
decoder). The official golden outputs (tests/test_official_var.py) pin the same loop against the
official code; these tests pin each optimisation on its own so a broken one is named."""
import time

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


# ------------------------------------------------------------------ CUDA graphs' buffer protocol
@torch.no_grad()
@pytest.mark.parametrize("variant", [{}, {"attn_l2_norm": True}, {"shared_aln": True}])
def test_graph_protocol_replays_the_official_loop_bit_for_bit(variant):
    """Per-scale graphs (bench.models.graphs) under the eager capture: static inputs, one KV buffer per
    block bound at the scale's offsets, the AdaLN vectors from scale 0's step. Several generations in a
    row (other labels, seeds, no CFG) replay the same steps and still give the official loop's values."""
    from bench.models.graphs import ScaleGraphs, eager_capture
    from bench.models.var import VAR
    from tests.conftest import SMALL_VAR, make_small_gen, randomize_
    gen = make_small_gen()
    if variant:   # cosine attention (the q/k normalisation inside the graph); shared AdaLN (scale 0's step)
        gen.var = randomize_(VAR(SMALL_VAR.replace(**variant)), 1).eval()
    gen.graph_capture = eager_capture
    for labels, seed in ((LABELS, 0), (torch.tensor([3, 1, 1]), 7), (LABELS, 0)):
        toks, f_hat = gen.sample_tokens(labels, seed=seed, cfg=CFG, top_k=TOP_K, top_p=TOP_P)
        ref_toks, ref_f_hat = official_loop(gen, labels, seed, CFG, TOP_K, TOP_P)
        assert all(torch.equal(a, b) for a, b in zip(toks, ref_toks))
        assert torch.equal(f_hat, ref_f_hat)
    graphs = gen.captured_graphs
    assert isinstance(graphs, ScaleGraphs) and len(graphs.replays) == len(gen.patch_nums)
    var, B2 = gen.var, 2 * len(LABELS)
    static = 4 * (B2 * var.C * (1 + var.L) + sum(2 * B2 * b.attn.H * var.L * b.attn.c for b in var.blocks))
    assert graphs.held_mb * 2 ** 20 == static          # off a GPU: the static inputs and KV buffers only
    assert all(b.attn.kv_k is None and not b.attn.caching for b in gen.var.blocks)   # left as eager finds it
    gen.graph_capture = None
    plain = gen.sample_tokens(LABELS[:2], seed=3, cfg=None, top_k=TOP_K, top_p=TOP_P)
    gen.graph_capture = eager_capture   # no CFG: B rows, not 2B: captured again
    toks, f_hat = gen.sample_tokens(LABELS[:2], seed=3, cfg=None, top_k=TOP_K, top_p=TOP_P)
    assert gen.captured_graphs is not graphs and gen.captured_graphs.cond_2BD.shape[0] == 2
    assert all(torch.equal(a, b) for a, b in zip(toks, plain[0])) and torch.equal(f_hat, plain[1])


@torch.no_grad()
def test_graphs_are_captured_again_for_replaced_weights_and_read_edited_ones(small_gen):
    from bench.models.graphs import eager_capture
    small_gen.graph_capture = eager_capture
    small_gen.sample_tokens(LABELS, seed=0, cfg=CFG)
    first = small_gen.captured_graphs
    small_gen.var.blocks[1].ffn.fc2.weight.mul_(0.5)            # edited in place: the same graphs read it
    toks, f_hat = small_gen.sample_tokens(LABELS, seed=0, cfg=CFG, top_k=TOP_K, top_p=TOP_P)
    assert small_gen.captured_graphs is first
    ref_toks, ref_f_hat = official_loop(small_gen, LABELS, 0, CFG, TOP_K, TOP_P)
    assert all(torch.equal(a, b) for a, b in zip(toks, ref_toks)) and torch.equal(f_hat, ref_f_hat)
    fc1 = small_gen.var.blocks[0].ffn.fc1                        # replaced (a physical prune): captured again
    fc1.weight = torch.nn.Parameter(fc1.weight.detach().clone() * 1.5)
    toks2, f_hat2 = small_gen.sample_tokens(LABELS, seed=0, cfg=CFG, top_k=TOP_K, top_p=TOP_P)
    assert small_gen.captured_graphs is not first
    ref_toks, ref_f_hat = official_loop(small_gen, LABELS, 0, CFG, TOP_K, TOP_P)
    assert all(torch.equal(a, b) for a, b in zip(toks2, ref_toks)) and torch.equal(f_hat2, ref_f_hat)


def test_graphs_refuse_a_token_policy(small_gen):
    from bench.models.graphs import eager_capture
    from bench.models.policy import TokenPolicy

    class Keep(TokenPolicy):
        name = "keep-some"
    small_gen.graph_capture, small_gen.token_policy = eager_capture, Keep()
    with pytest.raises(ValueError, match="token policy 'keep-some' chooses the tokens"):
        small_gen.sample_tokens(LABELS, seed=0)


def test_cuda_capture_protocol_with_the_cuda_calls_mocked(small_gen, monkeypatch):
    """The GPU path's order, with only torch.cuda's calls replaced: every scale warmed up on the graphs'
    own side stream first, then one graph per scale captured on that stream in one shared pool, the replay
    bound to each graph; the memory held is the static buffers' plus the pool's segments."""
    from bench.models import graphs as G
    log = []

    class Stream:
        def __init__(self, device=None):
            log.append(("new-stream", device))

        def wait_stream(self, other):
            log.append(("wait",))

    class Default:
        def wait_stream(self, other):
            log.append(("default-waits", other))

    class Graph:
        def replay(self):
            log.append(("replay", id(self)))

    class Capturing:
        def __init__(self, graph, pool, stream):
            self.graph, self.pool, self.stream = graph, pool, stream

        def __enter__(self):
            log.append(("capture", id(self.graph), self.pool, self.stream))

        def __exit__(self, *exc):
            return False

    class StreamCtx:
        def __init__(self, s):
            self.s = s

        def __enter__(self):
            log.append(("on-stream", self.s))

        def __exit__(self, *exc):
            log.append(("off-stream",))

    fake = dict(CUDAGraph=Graph, graph=Capturing, graph_pool_handle=lambda: (7, 0), Stream=Stream,
                stream=StreamCtx, current_stream=Default, synchronize=lambda device=None: log.append(("sync", device)))
    for name, value in fake.items():
        monkeypatch.setattr(G.torch.cuda, name, value)
    monkeypatch.setattr(G, "check_current_device", lambda device: log.append(("device-checked", device)))
    monkeypatch.setattr(G, "pool_bytes", lambda pool, device: 3 * 2 ** 20 if pool == (7, 0) else 0)
    # a mocked graph replays nothing: the check against the eager pass (tested on its own) is logged instead
    monkeypatch.setattr(G.ScaleGraphs, "_check", lambda self, eager: log.append(("check", len(eager))) or 0.0)
    steps = []
    real_step = G.ScaleGraphs._step
    blocks = len(small_gen.var.blocks)
    monkeypatch.setattr(G.ScaleGraphs, "_step", lambda self, si: steps.append((si, si == 0 or len(self.ada) == blocks))
                        or real_step(self, si))
    t0 = time.perf_counter()
    g = G.ScaleGraphs(small_gen.var, 6, G.cuda_capture, warmup=2)
    elapsed = time.perf_counter() - t0
    K = len(small_gen.patch_nums)
    assert steps == [(si, True) for si in range(K)] * 3    # two warm-ups (every block), then each scale captured
    assert 0 < g.capture_s <= elapsed
    assert log[-2:] == [("check", K), ("sync", torch.device("cpu"))]   # checked, and finished when it returns
    assert all(b.attn.kv_k is None and not b.attn.caching for b in small_gen.var.blocks)   # the eager cache unbound
    assert log[0] == ("device-checked", torch.device("cpu"))
    (own,) = [i for i, e in enumerate(log) if e[0] == "new-stream"]
    kinds = [e[0] for e in log]
    assert kinds[own + 1:own + 3] == ["wait", "on-stream"] and kinds.index("off-stream") < kinds.index("capture")
    stream = log[own + 2][1]
    captures = [e for e in log if e[0] == "capture"]
    assert len(captures) == K and {e[2] for e in captures} == {(7, 0)} and len({e[1] for e in captures}) == K
    assert all(e[3] is stream for e in captures)           # warmed up and captured on the graphs' own stream
    assert ("default-waits", stream) in log[kinds.index("off-stream"):kinds.index("capture")]
    g.run(0, torch.zeros(6, 1, small_gen.var.C), torch.zeros(6, small_gen.var.C))
    assert log[-1] == ("replay", captures[0][1])
    static = 4 * (6 * small_gen.var.C * (1 + sum(pn * pn for pn in small_gen.patch_nums))
                  + sum(2 * 6 * b.attn.H * small_gen.var.L * b.attn.c for b in small_gen.var.blocks))
    assert g.held_mb == pytest.approx(static / 2 ** 20 + 3) and len(g.ada) == len(small_gen.var.blocks)


@torch.no_grad()
def test_graphs_are_checked_against_the_eager_pass_after_capture(small_gen):
    """Each graph is replayed once on the warm-up's seeded inputs, its outputs NaN first: a replay that
    does nothing, or computes something else, is an error at capture, not wrong tokens later."""
    from bench.models import graphs as G
    g = G.ScaleGraphs(small_gen.var, 4, G.eager_capture)
    assert g.max_abs_diff == 0.0 and all(torch.isfinite(t).all() for t in g.logits)
    assert g.cond_2BD.abs().sum() > 0                     # seeded inputs, not zeros

    def noop(step, pool=None, stream=None):              # the kernels escaped the capture
        return (lambda: None), step()
    with pytest.raises(RuntimeError) as e:
        G.ScaleGraphs(small_gen.var, 4, noop)
    assert str(e.value) == ("the CUDA graph of scale 0 does not reproduce the eager pass: max |Δ logits| nan (a kernel "
                            "outside the capture, or inputs not read from the static buffers); run without CUDA graphs")
    assert all(b.attn.kv_k is None and not b.attn.caching for b in small_gen.var.blocks)

    def off_by(delta):                                     # replays that compute something slightly else
        def capture(step, pool=None, stream=None):
            replay, outs = G.eager_capture(step)

            def shifted():
                replay()
                outs[0].add_(delta)
            return shifted, outs
        return capture
    with pytest.raises(RuntimeError, match="scale 0 does not reproduce"):
        G.ScaleGraphs(small_gen.var, 4, off_by(2 * G.CHECK_ATOL))
    with pytest.warns(UserWarning) as caught:
        g = G.ScaleGraphs(small_gen.var, 4, off_by(G.CHECK_ATOL / 2))
    assert [str(w.message) for w in caught] == ["the CUDA graphs' logits differ from the eager pass's by up to 0.0005: "
                                                "the sampled tokens may differ from the eager sampler's"]
    assert g.max_abs_diff == pytest.approx(G.CHECK_ATOL / 2, rel=1e-3)


def test_graphs_need_the_model_on_the_current_cuda_device_and_count_their_pool(monkeypatch):
    from bench.models import graphs as G
    monkeypatch.setattr(G.torch.cuda, "current_device", lambda: 0)
    G.check_current_device(torch.device("cuda", 0))
    with pytest.raises(ValueError, match=r"on cuda:1 but the current CUDA device is cuda:0: call "
                                         r"torch.cuda.set_device\('cuda:1'\) first"):
        G.check_current_device(torch.device("cuda", 1))
    segments = [{"device": 0, "total_size": 100, "segment_pool_id": (7, 0)},
                {"device": 0, "total_size": 30, "segment_pool_id": (0, 0)},      # the ordinary pool
                {"device": 1, "total_size": 50, "segment_pool_id": (7, 0)},      # another device
                {"device": 0, "total_size": 20, "segment_pool_id": [7, 0]}]
    monkeypatch.setattr(G.torch.cuda, "memory_snapshot", lambda: segments)
    assert G.pool_bytes((7, 0), "cuda:0") == 120


def test_an_empty_cuda_graph_is_an_error_and_other_capture_warnings_pass(monkeypatch):
    """A capture that recorded nothing (work sent to another device) would replay as a no-op."""
    import warnings

    from bench.models import graphs as G

    class Graph:
        def replay(self):
            pass

    def capturing(message):
        class Capturing:
            def __init__(self, graph, pool, stream):
                pass

            def __enter__(self):
                pass

            def __exit__(self, *exc):
                warnings.warn(message, stacklevel=2)
                return False
        return Capturing
    monkeypatch.setattr(G.torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(G.torch.cuda, "graph", capturing("The CUDA Graph is empty. This usually means that ..."))
    for _ in range(2):   # every time, whatever the caller's warning filters say
        with warnings.catch_warnings(), pytest.raises(RuntimeError) as e:
            warnings.simplefilter("ignore")
            G.cuda_capture(lambda: (torch.zeros(1),), None, None)
        assert str(e.value) == ("the captured CUDA graph is empty (The CUDA Graph is empty. This usually means that "
                                "...): the model's tensors are not on the current CUDA device")
    monkeypatch.setattr(G.torch.cuda, "graph", capturing("something else"))
    with pytest.warns(UserWarning, match="something else"):
        replay, outs = G.cuda_capture(lambda: (torch.ones(1),), None, None)
    assert torch.equal(outs[0], torch.ones(1))
