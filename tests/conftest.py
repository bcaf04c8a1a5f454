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


@pytest.fixture
def small_gen() -> Generator:
    torch.manual_seed(0)
    gen = Generator(randomize_(VAR(SMALL_VAR), 1), randomize_(VQVAE(SMALL_VAE), 2), name="small")
    return gen.eval()
