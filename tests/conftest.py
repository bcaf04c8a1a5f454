import pytest
import torch

from bench.models.generator import Generator
from bench.models.var import VAR, VARConfig
from bench.models.vqvae import VQVAE, VQVAEConfig

# A small model with the official structure: 2 blocks, 2 heads of 64, 5 scales, 8×8 latent, 32 px.
SMALL_VAE = VQVAEConfig(vocab_size=64, z_channels=8, ch=32, ch_mult=(1, 2, 2), num_res_blocks=1,
                        patch_nums=(1, 2, 3, 4, 8))
SMALL_VAR = VARConfig(depth=2, width=128, num_heads=2, num_classes=5, vocab_size=64, Cvae=8,
                      patch_nums=(1, 2, 3, 4, 8))


def randomize_(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Non-trivial weights everywhere (the official init zeroes biases and shrinks AdaLN)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if "scale_mul" in name else 0.05))
    return module


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module's tests (``pytestmark = pytest.mark.usefixtures("one_thread")``):
    the models are tiny, so thread synchronisation costs more than the arithmetic (10× on a busy
    machine), and golden fixtures made on one thread keep one reduction order. Restored after."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def cli(capsys, argv, rc=0):
    """``varbench ARGV`` in-process (bench.cli.main): asserts its exit code, returns (out, err) captured."""
    from bench.cli import main
    assert main(argv) == rc, capsys.readouterr()
    return capsys.readouterr()


def make_small_gen() -> Generator:
    """The small generator with its seeded random weights (the same every call)."""
    torch.manual_seed(0)
    gen = Generator(randomize_(VAR(SMALL_VAR), 1), randomize_(VQVAE(SMALL_VAE), 2), name="small")
    return gen.eval()


@pytest.fixture
def small_gen() -> Generator:
    return make_small_gen()


@torch.no_grad()
def official_loop(gen: Generator, labels: torch.Tensor, seed: int, cfg: float, top_k: int, top_p: float,
                  smooth=None):
    """The official ``autoregressive_infer_cfg`` re-run step by step with the model's pieces and none
    of the sampler's speed-ups: AdaLN recomputed per scale, KV cache re-concatenated per scale
    (``kv_caching(True)`` without a buffer), ``x.repeat(2)`` for the CFG batch. ``smooth(logits, ratio,
    rng)``: more_smooth's soft embedding weights (drawn after the multinomial, the official RNG order).
    Returns (token pyramid, f_hat)."""
    from bench.models.generator import top_k_top_p_filter_
    var, quant, pns = gen.var, gen.vae.quantize, gen.patch_nums
    B, K = labels.shape[0], len(pns)
    g = torch.Generator().manual_seed(seed)
    cond = var.cond(torch.cat((labels, torch.full_like(labels, var.num_classes))))
    lvl_pos = var.lvl_pos()
    x = var.first_tokens(cond)
    f_hat = torch.zeros(B, var.Cvae, pns[-1], pns[-1])
    toks, cur = [], 0
    var.kv_caching(True)
    try:
        for si, pn in enumerate(pns):
            r = si / (K - 1)
            cur += pn * pn
            x = var.run_blocks(x, cond)
            lg = var.get_logits(x, cond)
            lg = top_k_top_p_filter_((1 + cfg * r) * lg[:B] - cfg * r * lg[B:], top_k, top_p)
            V = lg.shape[-1]
            idx = torch.multinomial(lg.softmax(-1).view(-1, V), 1, replacement=True, generator=g).view(B, -1)
            toks.append(idx)
            h_BlC = quant.embedding(idx) if smooth is None else smooth(lg, r, g) @ quant.embedding.weight
            f_hat, nxt = quant.next_input(si, f_hat, h_BlC.transpose(1, 2).reshape(B, var.Cvae, pn, pn))
            if si != K - 1:
                x = var.word_embed(nxt.flatten(2).transpose(1, 2)) + lvl_pos[:, cur:cur + pns[si + 1] ** 2]
                x = x.repeat(2, 1, 1)
    finally:
        var.kv_caching(False)
    return toks, f_hat
