"""HART's residual diffusion head (mit-han-lab/hart ``hart/modules/diffusion/``: ``diffloss.py``,
``gaussian_diffusion.py``, ``respace.py``; itself MAR's ``DiffLoss``), inference only.

Per token of the last scale, a small MLP (``SimpleMLPAdaLN``: ``diff_depth`` AdaLN residual blocks of
width ``diff_width``) denoises the continuous residual that the discrete tokens miss, conditioned on the
transformer's hidden state. The process is OpenAI's improved DDPM: 1000-step cosine schedule, ε
prediction with learned (interpolated) variance, respaced to ``num_sampling_steps`` (8) steps exactly
as ``respace.space_timesteps``, x₀ clipped to [-1, 1], output × 0.6 (``vae_scale``).

Module names and ``state_dict`` keys equal the official ``diffloss.net.*`` (this module is HART's
``diffloss``). The schedule is computed in float64 numpy and each coefficient cast to float32 when
used, as the official ``_extract_into_tensor``, so the arithmetic is the official one operation for
operation.

Classifier-free guidance (``cfg`` = the transformer's guidance at the last scale, t): the batch is
[cond; uncond]; both halves denoise the *conditional* half's x_t, ε = (1+t)·ε_c − t·ε_u is shared,
the variance stays per half. Guidance is skipped, each half denoising its own x_t, when t == 1.0
exactly (official ``if not cfg == 1.0``).

Deviation: official draws the noise from the global RNG (``torch.randn(...).cuda()``: unseeded in
``sample.py``). Here every draw — N×Cvae initial noise duplicated to both halves, then fresh 2N×Cvae
noise at every step, the last one included (its noise is multiplied by 0 but still drawn) — comes
from the ``generator`` passed in (``HART.sample_tokens`` passes its seeded sampling generator, right
after the last scale's token draws), on the model's device.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
import torch.nn as nn

VAE_SCALE = 0.6   # official DiffLoss.vae_scale: targets are divided by it in training


# ---------------------------------------------------------------- the iDDPM schedule
def space_timesteps(num_timesteps: int, section_counts) -> set:
    """Timesteps kept when respacing (official ``respace.space_timesteps``): e.g. "8" keeps
    round(k·999/7) for k = 0…7; "ddimN" a fixed stride; "a,b,c" per equal section."""
    if isinstance(section_counts, int):
        section_counts = str(section_counts)
    if isinstance(section_counts, str):
        if section_counts.startswith("ddim"):
            want = int(section_counts[len("ddim"):])
            for stride in range(1, num_timesteps):
                if len(range(0, num_timesteps, stride)) == want:
                    return set(range(0, num_timesteps, stride))
            raise ValueError(f"cannot create exactly {want} steps with an integer stride")
        section_counts = [int(x) for x in section_counts.split(",")]
    size_per, extra = divmod(num_timesteps, len(section_counts))
    start, kept = 0, []
    for i, count in enumerate(section_counts):
        size = size_per + (1 if i < extra else 0)
        if size < count:
            raise ValueError(f"cannot divide section of {size} steps into {count}")
        stride = 1 if count <= 1 else (size - 1) / (count - 1)
        cur = 0.0                       # accumulated in float, rounded per step (official)
        for _ in range(count):
            kept.append(start + round(cur))
            cur += stride
        start += size
    return set(kept)


def cosine_betas(num_timesteps: int = 1000, max_beta: float = 0.999) -> np.ndarray:
    """Nichol & Dhariwal's cosine schedule, ᾱ(t) = cos²((t + 0.008)/1.008 · π/2)."""
    alpha_bar = lambda t: math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2   # noqa: E731
    return np.array([min(1 - alpha_bar((i + 1) / num_timesteps) / alpha_bar(i / num_timesteps), max_beta)
                     for i in range(num_timesteps)])


class RespacedSchedule:
    """The posterior coefficients of the respaced process (official ``SpacedDiffusion``), float64."""

    def __init__(self, num_sampling_steps="8", num_timesteps: int = 1000):
        base_ac = np.cumprod(1.0 - cosine_betas(num_timesteps), axis=0)
        keep = space_timesteps(num_timesteps, num_sampling_steps)
        betas, self.timestep_map, last = [], [], 1.0
        for i, ac in enumerate(base_ac):
            if i in keep:
                betas.append(1 - ac / last)   # β of the jump from the previous kept step
                last = ac
                self.timestep_map.append(i)
        betas = np.array(betas, dtype=np.float64)
        ac = np.cumprod(1.0 - betas, axis=0)
        ac_prev = np.append(1.0, ac[:-1])
        self.num_steps = len(betas)
        self.sqrt_recip_ac = np.sqrt(1.0 / ac)
        self.sqrt_recipm1_ac = np.sqrt(1.0 / ac - 1)
        post_var = betas * (1.0 - ac_prev) / (1.0 - ac)
        # log clipped: the posterior variance is 0 at the first step
        self.post_log_var = np.log(np.append(post_var[1], post_var[1:])) if len(post_var) > 1 else np.array([])
        self.log_betas = np.log(betas)
        self.coef_x0 = betas * np.sqrt(ac_prev) / (1.0 - ac)
        self.coef_xt = (1.0 - ac_prev) * np.sqrt(1.0 - betas) / (1.0 - ac)

    def at(self, name: str, i: int, like: torch.Tensor) -> torch.Tensor:
        """Coefficient ``name`` of step i as a float32 scalar tensor (official: float64 → .float())."""
        return torch.tensor(float(getattr(self, name)[i]), dtype=torch.float32, device=like.device)


# ---------------------------------------------------------------- the denoising MLP (SimpleMLPAdaLN)
def modulate(x, shift, scale):
    return x * (1 + scale) + shift


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden: int, freq_dim: int = 256):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(freq_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.freq_dim = freq_dim

    @staticmethod
    def sinusoid(t_N: torch.Tensor, dim: int, max_period: int = 10000) -> torch.Tensor:
        half = dim // 2   # [cos | sin], the official (GLIDE) expression order
        freqs = torch.exp(-math.log(max_period) * torch.arange(start=0, end=half, dtype=torch.float32) / half)
        args = t_N[:, None].float() * freqs.to(t_N.device)[None]
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        return torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1) if dim % 2 else emb

    def forward(self, t_N):
        return self.mlp(self.sinusoid(t_N, self.freq_dim))


class ResBlock(nn.Module):
    def __init__(self, C: int):
        super().__init__()
        self.in_ln = nn.LayerNorm(C, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(C, C), nn.SiLU(), nn.Linear(C, C))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(C, 3 * C))

    def forward(self, x, y):
        shift, scale, gate = self.adaLN_modulation(y).chunk(3, dim=-1)
        return x + gate * self.mlp(modulate(self.in_ln(x), shift, scale))


class FinalLayer(nn.Module):
    def __init__(self, C: int, out: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(C, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(C, out)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(C, 2 * C))

    def forward(self, x, y):
        shift, scale = self.adaLN_modulation(y).chunk(2, dim=-1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class SimpleMLPAdaLN(nn.Module):
    """ε (first Cvae outputs) and the variance interpolation value (last Cvae) of a noisy token x_t,
    given the diffusion step and the transformer's condition z."""

    def __init__(self, in_channels: int, width: int, z_channels: int, depth: int):
        super().__init__()
        self.in_channels = in_channels
        self.time_embed = TimestepEmbedder(width)
        self.cond_embed = nn.Linear(z_channels, width)
        self.input_proj = nn.Linear(in_channels, width)
        self.res_blocks = nn.ModuleList([ResBlock(width) for _ in range(depth)])
        self.final_layer = FinalLayer(width, 2 * in_channels)

    def forward(self, x_NC, t_N, z_ND):
        y = self.time_embed(t_N) + self.cond_embed(z_ND)
        x = self.input_proj(x_NC)
        for block in self.res_blocks:
            x = block(x, y)
        return self.final_layer(x, y)


class DiffusionHead(nn.Module):
    """Official ``DiffLoss`` at inference: ``net`` plus the respaced sampler."""

    def __init__(self, Cvae: int, z_channels: int, width: int, depth: int, num_sampling_steps="8"):
        super().__init__()
        self.Cvae = Cvae
        self.net = SimpleMLPAdaLN(Cvae, width, z_channels, depth)
        self.schedule = RespacedSchedule(num_sampling_steps)

    def _step(self, x, eps, var_value, i: int, noise, temperature: float):
        """One ancestral step x_t → x_{t−1} (official ``p_mean_variance`` + ``p_sample``, LEARNED_RANGE)."""
        s = self.schedule
        frac = (var_value + 1) / 2                    # [-1, 1] → between the two variance bounds
        log_var = frac * s.at("log_betas", i, x) + (1 - frac) * s.at("post_log_var", i, x)
        x0 = (s.at("sqrt_recip_ac", i, x) * x - s.at("sqrt_recipm1_ac", i, x) * eps).clamp(-1, 1)
        mean = s.at("coef_x0", i, x) * x0 + s.at("coef_xt", i, x) * x
        nonzero = torch.tensor(float(i != 0), dtype=x.dtype, device=x.device)   # no noise at the last step
        return mean + nonzero * torch.exp(0.5 * log_var) * noise * temperature

    @torch.no_grad()
    def sample(self, z_2ND: torch.Tensor, cfg: float, generator: Optional[torch.Generator] = None,
               temperature: float = 1.0) -> torch.Tensor:
        """Residual tokens [2N, Cvae] for conditions [cond; uncond] (rows 0…N−1 are the guided ones)."""
        N2, C = z_2ND.shape[0], self.Cvae
        draw = lambda n: torch.randn(n, C, generator=generator, device=z_2ND.device)   # noqa: E731
        guided = not cfg == 1.0
        if guided:
            noise_NC = draw(N2 // 2)
            x = torch.cat([noise_NC, noise_NC], dim=0)   # one noise for both halves
        else:
            x = draw(N2)
        s = self.schedule
        for i in reversed(range(s.num_steps)):
            t_N = torch.full((N2,), s.timestep_map[i], dtype=torch.int64, device=x.device)
            if guided:   # both halves from the conditional x_t; guided ε shared, variance per half
                half = x[: N2 // 2]
                out = self.net(torch.cat([half, half], dim=0), t_N, z_2ND)
                eps_c, eps_u = out[:, :C].split(N2 // 2, dim=0)
                eps_half = eps_c * (1 + cfg) - cfg * eps_u
                eps, var_value = torch.cat([eps_half, eps_half], dim=0), out[:, C:]
            else:
                out = self.net(x, t_N, z_2ND)
                eps, var_value = out[:, :C], out[:, C:]
            x = self._step(x, eps, var_value, i, draw(N2), temperature)
        return x * VAE_SCALE
