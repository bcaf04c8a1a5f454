"""The HART text-to-image transformer (mit-han-lab/hart ``hart/modules/models/transformer/
hart_transformer_t2i.py``, ``hart/modules/networks/basic_hart.py``) and its sampling loop.

Module names and ``state_dict`` keys equal the official ``HARTForT2I`` (llama attention), so its
checkpoints load with ``strict=True``. Shapes are named in variables: B batch, L tokens, C width,
H heads, c head dim, V vocabulary, Lc context tokens; ``2B`` marks the CFG batch [cond; uncond].

How HART differs from VAR (``bench.models.var``):
- Text is a prefix. The Qwen2 hidden states of the prompt (``context_token`` of them, padding included)
  go through ``context_embed`` and *are* scale 0; the 1×1 scale's token is predicted at the last
  context position. Every token attends to every context token (padding too: the mask never enters
  attention), the context attends bidirectionally to itself.
- Positions are RoPE, not learned: 1-D over the context (position ids = cumsum(mask) − 1, as official
  ``encode_prompts``), 2-D over image tokens at (i, j)·P/pn (P the last scale) plus the context's last
  position id (0 in the unconditional half). The 2-D cos/sin layout is the official one:
  [row | row | col | col] frequency blocks of c/4 under ``rotate_half`` (so dimension d pairs with
  d + c/2 across the row/column halves).
- Llama blocks: RMSNorm (also where official asks for ``elementwise_affine=False``: its fused RMSNorm
  ignores the flag, so every norm has a weight), ``qkv_proj`` without bias plus q/v biases, SwiGLU MLP
  (or VAR's GELU MLP with ``mlp_type='gpt2'``). Block conditioning: ``ada_lin`` on the context pooled by
  ``sep_aln_pooling_mode``, or with ``disable_aln`` + ``shared_aln`` a per-block [6, C]
  ``scale_shift_table`` plus the mask-averaged context (PixArt style), or nothing. The head's AdaLN
  always max-pools the context over all tokens.
- The last scale (MaskGIT with one iteration, so all its tokens at once) is followed by the residual
  diffusion head (``bench.models.hart_diffusion``) on decoder_norm(hidden + word_embed(code)).

Sampling is official ``autoregressive_infer_cfg``: [cond; uncond] batch with an all-zero unconditional
prompt whose mask keeps only its first token; guidance t = cfg·si/(S−1), logits (1+t)·c − t·u (the
last scale reuses the previous scale's t; the diffusion head gets the same t); top-k 600 below scale 7,
300 from it on (the official ignores its ``top_k`` argument); top-p optional (default 0: off);
``more_smooth`` (Gumbel-softmax code mixing, default True as official ``sample.py``/``app.py``).
The AdaLN vectors are computed once per generation (official: per scale and block; same values).
The loop calls the token policy (``bench.models.policy``) as VAR's and Infinity's do: every attention
and MLP sub-layer through ``route`` (a subset rotates by RoPE at its own positions), whole-scale
subsets, trailing skips, groups of scales in one pass, zero residuals; the identity policy is
bit-identical to none (the golden tests run through it).
``generate`` returns uint8 x·255 truncated, as ``app.py``/``sample.py`` save images.

Deviations from the official code:
- The diffusion head's noise comes from the seeded sampling generator, drawn after the last scale's
  token (official: the unseeded global RNG) — see ``bench.models.hart_diffusion``.
- Only ``num_maskgit_iters=1`` (the official default and the only value its sampler is run with);
  official's random MaskGIT order (numpy, unseeded) then has no effect.
- Teacher-forced ``forward`` returns logits only: no random condition drop (official drops rows with
  ``randn < cond_drop_rate`` even in eval), no MAR masking of the last scale, no diffusion loss.
- A top-k above the vocabulary keeps every token (official ``topk`` raises).
- Official ``sample.py`` runs under CUDA fp16 autocast; here the arithmetic is in the parameters' dtype
  (the golden test: fp32 on the CPU, bit-identical to the official code run the same way).
- Not implemented (refused with a clear error): ``attn_type='gpt2'``, cross-attention, timestep-MLP
  level embedding, samplers other than iDDPM.
- No RoPE tables are stored as buffers (official keeps non-persistent ``inv_freq`` buffers); they are
  recomputed per call, with the same expression, so models built on ``meta`` load with ``assign``.
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench.models.generator import gumbel_softmax_rng, sample_top_k_top_p
from bench.models.hart_config import HARTConfig, checkpoint_files
from bench.models.hart_diffusion import DiffusionHead
from bench.models.policy import TokenPolicy, enter_group, run_group, scatter_kept

ROPE_THETA = 10000


# ---------------------------------------------------------------- RoPE
def rope_inv_freq(head_dim: int, step: int, theta: int = ROPE_THETA) -> torch.Tensor:
    """θ^(−k/c) for k = 0, step, 2·step, …: step 2 for the 1-D context RoPE, step 4 for the 2-D image
    RoPE (each axis gets half the rotation pairs). Computed on the CPU, as the official buffers are."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, step, dtype=torch.int64).float() / head_dim))


def rope_1d(pos_BL: torch.Tensor, head_dim: int, dtype=torch.float32) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, L, c] of Llama RoPE at integer positions."""
    freqs_BLf = pos_BL.float()[:, :, None] * rope_inv_freq(head_dim, 2).to(pos_BL.device)
    emb_BLc = torch.cat((freqs_BLf, freqs_BLf), dim=-1)
    return emb_BLc.cos().to(dtype), emb_BLc.sin().to(dtype)


def rope_2d(pos_BL2: torch.Tensor, head_dim: int, dtype=torch.float32) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, L, c] of the official 2-D RoPE: angles row·f | row·f | col·f | col·f, f of length c/4."""
    B, L, _ = pos_BL2.shape
    freqs_B2Lf = pos_BL2.float().permute(0, 2, 1)[..., None] * rope_inv_freq(head_dim, 4).to(pos_BL2.device)
    emb_BLc = torch.cat((freqs_B2Lf, freqs_B2Lf), dim=-1).transpose(1, 2).reshape(B, L, head_dim)
    return emb_BLc.cos().to(dtype), emb_BLc.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(q_BHLc, k_BHLc, cos_BLc, sin_BLc):
    cos, sin = cos_BLc.unsqueeze(1), sin_BLc.unsqueeze(1)
    return q_BHLc * cos + rotate_half(q_BHLc) * sin, k_BHLc * cos + rotate_half(k_BHLc) * sin


def image_positions(patch_nums: Sequence[int], scales: Sequence[int], offset_B: torch.Tensor) -> torch.Tensor:
    """[B, l, 2] RoPE positions of the tokens of ``scales`` (row-major): (i, j)/pn·P, P the last scale
    (every scale spans the same 0…P range), plus each row's offset (the context's last position id)."""
    P, coords = patch_nums[-1], []
    for si in scales:
        pn = patch_nums[si]
        ar = torch.arange(pn, device=offset_B.device)
        ij_hw2 = torch.stack(torch.meshgrid(ar, ar, indexing="ij"), dim=-1)
        coords.append((ij_hw2 / pn * P).reshape(-1, 2))   # official order: divide, then scale
    return torch.cat(coords)[None] + offset_B[:, None, None]


def context_positions(context_mask_BL: torch.Tensor) -> torch.Tensor:
    """1-D position ids of a prompt (official ``encode_prompts``): cumsum(mask) − 1, so padding after
    the prompt repeats the last real position."""
    return context_mask_BL.long().cumsum(dim=1) - 1


def context_pool(cond_BLC: torch.Tensor, mask_BL: torch.Tensor, mode: str) -> torch.Tensor:
    """[B, C] pooled condition: max over all tokens (padding included), or the masked mean."""
    if mode == "max":
        return cond_BLC.max(dim=1).values
    m_BL1 = mask_BL.unsqueeze(-1)
    return (cond_BLC * m_BL1.to(cond_BLC.dtype) / m_BL1.sum(1).clamp_(1).unsqueeze(1)).sum(1)


# ---------------------------------------------------------------- layers
class RMSNorm(nn.Module):
    """Official ``LlamaRMSNormFused`` (a CUDA kernel) in PyTorch: x·rsqrt(mean(x²) + eps) in fp32,
    cast back, times the weight."""

    def __init__(self, C: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.to(x.dtype) * self.weight.to(x.dtype)


class LlamaAttention(nn.Module):
    def __init__(self, C: int, H: int, l2_norm: bool):
        super().__init__()
        self.H, self.c, self.l2_norm = H, C // H, l2_norm
        if l2_norm:   # cosine attention with a learned per-head temperature, clamped at 100 (as VAR)
            self.scale = 1.0
            self.scale_mul_1H11 = nn.Parameter(torch.full((1, H, 1, 1), 4.0).log())
            self.max_scale_mul = torch.log(torch.tensor(100)).item()   # the official float32 value
        else:
            self.scale = 0.25 / math.sqrt(self.c)
        self.qkv_proj = nn.Linear(C, 3 * C, bias=False)
        self.q_bias, self.v_bias = nn.Parameter(torch.zeros(C)), nn.Parameter(torch.zeros(C))
        self.register_buffer("zero_k_bias", torch.zeros(C))   # k has no bias (persistent: in the ckpt)
        self.proj = nn.Linear(C, C)
        self.caching, self.cached_k, self.cached_v = False, None, None

    def kv_caching(self, enable: bool) -> None:
        self.caching, self.cached_k, self.cached_v = enable, None, None

    def forward(self, x_BLC, cos_BLc, sin_BLc, attn_bias=None):
        B, L, C = x_BLC.shape
        bias = torch.cat((self.q_bias, self.zero_k_bias, self.v_bias))
        qkv = F.linear(x_BLC, self.qkv_proj.weight, bias).view(B, L, 3, self.H, self.c)
        q_BHLc, k_BHLc, v_BHLc = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        if self.l2_norm:
            scale_mul = self.scale_mul_1H11.clamp_max(self.max_scale_mul).exp()
            q_BHLc, k_BHLc = F.normalize(q_BHLc, dim=-1).mul(scale_mul), F.normalize(k_BHLc, dim=-1)
        q_BHLc, k_BHLc = apply_rope(q_BHLc, k_BHLc, cos_BLc, sin_BLc)   # keys are cached rotated
        if self.caching:   # next-scale inference: this scale's queries see the context and all earlier scales
            if self.cached_k is not None:
                k_BHLc, v_BHLc = torch.cat((self.cached_k, k_BHLc), 2), torch.cat((self.cached_v, v_BHLc), 2)
            self.cached_k, self.cached_v = k_BHLc, v_BHLc
        o_BHLc = F.scaled_dot_product_attention(q_BHLc, k_BHLc, v_BHLc, attn_mask=attn_bias, scale=self.scale)
        return self.proj(o_BHLc.transpose(1, 2).reshape(B, L, C))


class LlamaMLP(nn.Module):
    def __init__(self, C: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(C, hidden, bias=False)
        self.up_proj = nn.Linear(C, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, C, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class FFN(nn.Module):
    """``mlp_type='gpt2'``: VAR's GELU(tanh) MLP."""

    def __init__(self, C: int, hidden: int):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(C, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, C)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class AdaLNSelfAttn(nn.Module):
    """x += γ1·Attn(N(x)(1+s1)+b1); x += γ2·MLP(N(x)(1+s2)+b2); (γ1,γ2,s1,s2,b1,b2) from the context."""
    SUBLAYERS = ("attn", "ffn")   # the sub-layers a token policy routes (and the latency bench compiles)

    def __init__(self, cfg: HARTConfig):
        super().__init__()
        C = self.C = cfg.embed_dim
        self.attn = LlamaAttention(C, cfg.num_heads, cfg.attn_l2_norm)
        self.ffn = LlamaMLP(C, cfg.ffn_hidden) if cfg.mlp_type == "llama" else FFN(C, cfg.ffn_hidden)
        self.ln_wo_grad = RMSNorm(C, cfg.norm_eps)
        self.pooling = cfg.sep_aln_pooling_mode
        if not cfg.disable_aln:
            self.ada_lin = nn.Sequential(nn.SiLU(inplace=False), nn.Linear(C, 6 * C))
        elif cfg.shared_aln:
            self.scale_shift_table = nn.Parameter(torch.randn(6, C) / C ** 0.5)

    def ada(self, cond_BLC: torch.Tensor, mask_BL: torch.Tensor) -> Optional[torch.Tensor]:
        """The six modulation vectors [B, 6, C] (official order γ1 γ2 s1 s2 b1 b2), or None (no AdaLN)."""
        if hasattr(self, "ada_lin"):
            return self.ada_lin(context_pool(cond_BLC, mask_BL, self.pooling)).view(-1, 6, self.C)
        if hasattr(self, "scale_shift_table"):   # official: always the masked mean here
            return self.scale_shift_table[None] + context_pool(cond_BLC, mask_BL, "avg").unsqueeze(1)
        return None

    def forward(self, x_BLC, ada_B6C, cos_BLc, sin_BLc, attn_bias=None, route=None, block_idx: int = 0):
        """``route(kind, block_idx, h, fn, x)``: the token-policy hook (``bench.models.policy``); ``fn(h,
        keep_Bl=…)`` runs a sub-layer on a subset of the tokens, rotated by RoPE at their own positions."""
        def attn(h, keep_Bl=None):
            if keep_Bl is None:
                return self.attn(h, cos_BLc, sin_BLc, attn_bias)
            at = keep_Bl.unsqueeze(-1).expand(-1, -1, cos_BLc.shape[-1])
            return self.attn(h, cos_BLc.gather(1, at), sin_BLc.gather(1, at), attn_bias)

        ffn = lambda h, keep_Bl=None: self.ffn(h)  # noqa: E731
        if ada_B6C is None:
            h = self.ln_wo_grad(x_BLC)
            x_BLC = x_BLC + (attn(h) if route is None else route("attn", block_idx, h, attn, x_BLC))
            h = self.ln_wo_grad(x_BLC)
            return x_BLC + (ffn(h) if route is None else route("ffn", block_idx, h, ffn, x_BLC))
        gamma1, gamma2, scale1, scale2, shift1, shift2 = ada_B6C.unsqueeze(2).unbind(1)   # each [B, 1, C]
        h = self.ln_wo_grad(x_BLC).mul(scale1.add(1)).add_(shift1)
        h = attn(h) if route is None else route("attn", block_idx, h, attn, x_BLC)
        x_BLC = x_BLC + h.mul(gamma1)
        h = self.ln_wo_grad(x_BLC).mul(scale2.add(1)).add_(shift2)
        h = ffn(h) if route is None else route("ffn", block_idx, h, ffn, x_BLC)
        return x_BLC + h.mul(gamma2)


class AdaLNBeforeHead(nn.Module):
    def __init__(self, C: int, eps: float):
        super().__init__()
        self.C = C
        self.ln_wo_grad = RMSNorm(C, eps)
        self.ada_lin = nn.Sequential(nn.SiLU(inplace=False), nn.Linear(C, 2 * C))

    def ada(self, cond_BLC: torch.Tensor) -> torch.Tensor:
        """[B, 1, 2, C] (scale, shift) from the context max-pooled over every token (official)."""
        if cond_BLC.dim() == 3 and cond_BLC.shape[1] > 1:
            cond_BLC = cond_BLC.max(1, keepdim=True).values
        return self.ada_lin(cond_BLC).view(-1, 1, 2, self.C)

    def forward(self, x_BLC, ada_B12C):
        scale, shift = ada_B12C.unbind(2)
        return self.ln_wo_grad(x_BLC).mul(scale.add(1)).add_(shift)


# ---------------------------------------------------------------- the model
class HART(nn.Module):
    family = "hart"   # the model family token methods key their official schedules on

    def __init__(self, cfg: HARTConfig, tokenizer=None):
        super().__init__()
        self.cfg = cfg.check()
        C, Lc, pns = cfg.embed_dim, cfg.context_token, tuple(cfg.patch_nums)
        self.C, self.V, self.Cvae, self.Lc, self.patch_nums = C, cfg.vocab_size, cfg.Cvae, Lc, pns
        self.word_embed = nn.Linear(cfg.Cvae, C)
        self.context_embed = nn.Linear(cfg.context_dim, C)
        self.context_norm = RMSNorm(cfg.context_dim, cfg.norm_eps) if cfg.use_context_norm else nn.Identity()
        self.lvl_embed = nn.Embedding(len(pns), C)
        init_std = math.sqrt(1 / C / 3)
        for w in (self.context_embed.weight, self.lvl_embed.weight):
            nn.init.trunc_normal_(w.data, mean=0, std=init_std)
        self.blocks = nn.ModuleList([AdaLNSelfAttn(cfg) for _ in range(cfg.depth)])
        # Level of every teacher-forcing position: the context is level 0 (it stands in for the 1×1
        # scale), scale k is level k. Token i sees token j iff level(j) ≤ level(i). Both buffers are
        # persistent in the official model, hence in its checkpoints.
        lvl_L = torch.cat([torch.full((Lc,), 0)] + [torch.full((pn * pn,), i + 1) for i, pn in enumerate(pns[1:])])
        self.register_buffer("lvl_1L", lvl_L[None].contiguous())
        T = lvl_L.numel()
        self.register_buffer("attn_bias_for_masking", torch.where(
            lvl_L.view(1, T, 1) >= lvl_L.view(1, 1, T), 0.0, -torch.inf).reshape(1, 1, T, T).contiguous())
        self.head_nm = AdaLNBeforeHead(C, cfg.norm_eps)
        self.head = nn.Linear(C, cfg.vocab_size)
        self.decoder_norm = RMSNorm(C, cfg.norm_eps)
        self.diffloss = DiffusionHead(cfg.Cvae, C, cfg.diff_width, cfg.diff_depth, cfg.num_sampling_steps)
        self.attach(tokenizer)
        self.token_policy = TokenPolicy()   # the sampling loop's token-policy hook (bench.models.policy)

    @property
    def scales_hw(self):
        """(h, w) of every scale's token map (scale 0 is the 1×1 token predicted from the context)."""
        return tuple((pn, pn) for pn in self.patch_nums)

    # --------------------------------------------------------------- tokenizer (not a submodule)
    def attach(self, tokenizer) -> "HART":
        """Pair with a :class:`~bench.models.hart_vae.HARTTokenizer`. As official (``vae_proxy``) it is
        held outside the module tree: not in ``state_dict``, not moved by ``.to``."""
        if tokenizer is not None and (tokenizer.V != self.V or tokenizer.Cvae != self.Cvae):
            raise ValueError(f"tokenizer (vocab {tokenizer.V}, Cvae {tokenizer.Cvae}) does not match the "
                             f"transformer (vocab {self.V}, Cvae {self.Cvae})")
        self._tokenizer = (tokenizer,)
        return self

    @property
    def tokenizer(self):
        if self._tokenizer[0] is None:
            raise RuntimeError("no tokenizer attached: HART(cfg, tokenizer) or .attach(tokenizer)")
        return self._tokenizer[0]

    # --------------------------------------------------------------- pieces shared by both passes
    def kv_caching(self, enable: bool) -> None:
        for b in self.blocks:
            b.attn.kv_caching(enable)

    def condition(self, context_BLC: torch.Tensor) -> torch.Tensor:
        return self.context_embed(self.context_norm(context_BLC))

    def get_logits(self, x_BLC: torch.Tensor, head_ada: torch.Tensor) -> torch.Tensor:
        return self.head(self.head_nm(x_BLC.float(), head_ada).float()).float()

    def run_blocks(self, x_BLC, ada: List[Optional[torch.Tensor]], cos_BLc, sin_BLc, attn_bias=None, route=None):
        for i, (block, ada_B6C) in enumerate(zip(self.blocks, ada)):
            x_BLC = block(x_BLC, ada_B6C, cos_BLc, sin_BLc, attn_bias, route, i)
        return x_BLC

    # --------------------------------------------------------------- teacher forcing
    def forward(self, context_BLC: torch.Tensor, context_mask_BL: torch.Tensor, x_BLCv_wo_first_l: torch.Tensor,
                context_position_ids_BL: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits [B, L, V] of the whole token pyramid (the 1×1 scale's from the last context token)
        under the block-causal mask; ``x_BLCv_wo_first_l`` is the tokenizer's ``idx_to_var_input``."""
        B, hd = context_BLC.shape[0], self.cfg.hd
        pos_BL = context_positions(context_mask_BL) if context_position_ids_BL is None else context_position_ids_BL
        cond_BLC = self.condition(context_BLC)
        x_BLC = torch.cat((cond_BLC, self.word_embed(x_BLCv_wo_first_l.float())), dim=1)
        x_BLC = x_BLC + self.lvl_embed(self.lvl_1L.expand(B, -1))
        cos_c, sin_c = rope_1d(pos_BL, hd, x_BLC.dtype)
        cos_i, sin_i = rope_2d(image_positions(self.patch_nums, range(1, len(self.patch_nums)), pos_BL[:, -1]),
                               hd, x_BLC.dtype)
        ada = [b.ada(cond_BLC, context_mask_BL) for b in self.blocks]
        x_BLC = self.run_blocks(x_BLC, ada, torch.cat((cos_c, cos_i), 1), torch.cat((sin_c, sin_i), 1),
                                self.attn_bias_for_masking.to(x_BLC.dtype))
        return self.get_logits(x_BLC, self.head_nm.ada(cond_BLC))[:, self.Lc - 1:]

    # --------------------------------------------------------------- sampling
    @torch.no_grad()
    def sample_tokens(self, context_BLC: torch.Tensor, context_mask_BL: torch.Tensor, seed: Optional[int] = 0,
                      cfg: float = 4.5, top_p: float = 0.0, more_smooth: bool = True,
                      context_position_ids_BL: Optional[torch.Tensor] = None, residual: bool = True,
                      logits_hook=None):
        """(token pyramid [list of B×pn² int64; -1 where a token policy gave a position a zero residual],
        f_hat [B, Cvae, P, P]). ``residual=False`` skips the diffusion head (official ``final_stage !=
        0``); ``seed=None`` uses the global RNG; ``logits_hook(si, logits)`` sees every scale's raw
        [cond; uncond] logits (scale 0: at every context position)."""
        quant, pns, hd = self.tokenizer.quantize, self.patch_nums, self.cfg.hd
        B, S, P, Lc = context_BLC.shape[0], len(pns), pns[-1], self.Lc
        rng = None
        if seed is not None:
            rng = torch.Generator(device=context_BLC.device)
            rng.manual_seed(int(seed))
        pos_BL = context_positions(context_mask_BL) if context_position_ids_BL is None else context_position_ids_BL
        # CFG batch: the unconditional prompt is all zeros, at position 0, its mask keeps one token
        pos_2BL = torch.cat((pos_BL, torch.zeros_like(pos_BL)))
        mask_2BL = torch.cat((context_mask_BL, torch.zeros_like(context_mask_BL)))
        mask_2BL[B:, 0] = 1
        cond_2BLC = self.condition(torch.cat((context_BLC, torch.zeros_like(context_BLC))))
        # the condition is the same at every scale: AdaLN vectors once per generation
        ada, head_ada = [b.ada(cond_2BLC, mask_2BL) for b in self.blocks], self.head_nm.ada(cond_2BLC)
        lvl_pos_1LC = self.lvl_embed(self.lvl_1L)
        starts = [0, Lc]   # the context stands in for the 1×1 scale
        for pn in pns[1:]:
            starts.append(starts[-1] + pn * pn)
        f_hat = cond_2BLC.new_zeros(B, self.Cvae, P, P)
        policy, tokens, cached = self.token_policy, [], 0
        policy.begin(B, pns)
        self.kv_caching(True)
        try:
            for group in policy.groups(S):
                if policy.skip(group[0]):
                    break   # f_hat already holds every earlier scale at the full latent size
                # every scale of a group starts from the f_hat accumulated before the group (for a group
                # of one: the official next-scale input, area-downsampled f_hat)
                xs, ropes = [], []
                for si in group:
                    if si == 0:
                        xs.append(cond_2BLC + lvl_pos_1LC[:, :Lc])
                        ropes.append(rope_1d(pos_2BL, hd, xs[-1].dtype))
                        continue
                    pn = pns[si]
                    next_BChw = F.interpolate(f_hat, size=(pn, pn), mode="area")
                    x_BLC = self.word_embed(next_BChw.view(B, self.Cvae, -1).transpose(1, 2)) \
                        + lvl_pos_1LC[:, starts[si]:starts[si + 1]]
                    xs.append(x_BLC.repeat(2, 1, 1))
                    ropes.append(rope_2d(image_positions(pns, [si], pos_2BL[:, -1]), hd, x_BLC.dtype))
                xs, keeps = enter_group(policy, group, xs, [pns[si] for si in group])
                for j, keep in enumerate(keeps):
                    if keep is not None:   # a shortened scale: RoPE at its tokens' own positions
                        ropes[j] = tuple(t.gather(1, keep.unsqueeze(-1).expand(-1, -1, hd)) for t in ropes[j])
                cos, sin = ropes[0] if len(group) == 1 else (torch.cat(t, dim=1) for t in zip(*ropes))
                route = policy.route(group[0])
                outs = run_group(xs, cached, lambda x, bias, cos=cos, sin=sin, route=route: self.run_blocks(x, ada, cos, sin, bias, route))
                cached += sum(x.shape[1] for x in xs)
                for si, x_BLC in zip(group, outs):
                    pn = pns[si]
                    keep_Bl = policy.residual_keep(si)
                    if keep_Bl is None:
                        x_BLC = policy.exit_scale(si, x_BLC)
                    policy.end_scale(si, x_BLC)
                    logits_2BlV = self.get_logits(x_BLC, head_ada)
                    if logits_hook is not None:
                        logits_hook(si, logits_2BlV)
                    ratio = si / (S - 1) if si < S - 1 else (S - 2) / (S - 1)   # the last scale reuses the ratio before it
                    t = cfg * ratio
                    logits_BlV = (1 + t) * logits_2BlV[:B] - t * logits_2BlV[B:]
                    if si == 0:   # the 1×1 token is predicted at the last context position
                        logits_BlV = logits_BlV[:, [-1], :]
                    idx_Bl = sample_top_k_top_p(logits_BlV, 600 if si < 7 else 300, top_p, rng)
                    if more_smooth:   # soft code mixture; the Gumbel draws follow the multinomial (official order)
                        tau = max(0.27 * (1 - ratio * 0.95), 0.005)
                        h_BlC = gumbel_softmax_rng(logits_BlV.mul(1 + ratio), tau, rng) @ quant.embedding.weight.unsqueeze(0)
                    else:
                        h_BlC = quant.embedding(idx_Bl)
                    if si == S - 1 and residual:   # continuous residual of every last-scale token, given its hard code
                        code_2BlC = self.word_embed(quant.embedding(idx_Bl)).repeat(2, 1, 1)
                        z_2BlC = self.decoder_norm(x_BLC + code_2BlC)
                        l = z_2BlC.shape[1]
                        res_2BlC = self.diffloss.sample(z_2BlC.reshape(2 * B * l, -1), cfg=t, generator=rng)
                        h_BlC = h_BlC + res_2BlC.reshape(2 * B, l, self.Cvae)[:B]
                    if keep_Bl is not None:   # pruned positions: zero residual, token -1
                        h_BlC, idx_Bl = scatter_kept(keep_Bl, h_BlC, pn * pn), scatter_kept(keep_Bl, idx_Bl, pn * pn, -1)
                    tokens.append(idx_Bl)
                    h_BChw = h_BlC.transpose(1, 2).reshape(B, self.Cvae, pn, pn)
                    if si < S - 1:
                        quant.add_scale(si, f_hat, h_BChw, pns)
                    else:
                        f_hat.add_(h_BChw)   # no φ at the last scale
                    policy.observe(si, f_hat)
        finally:
            self.kv_caching(False)
            policy.end()
        return tokens, f_hat

    @torch.no_grad()
    def generate(self, context_BLC: torch.Tensor, context_mask_BL: torch.Tensor, seed: Optional[int] = 0,
                 cfg: float = 4.5, top_p: float = 0.0, more_smooth: bool = True, **kw) -> torch.Tensor:
        """Images uint8 [B, 3, H, W] for Qwen2 prompt hidden states [B, Lc, context_dim] and their mask;
        x·255 truncated, as official ``app.py`` and ``sample.py`` save them (VAR's PNGs round)."""
        _, f_hat = self.sample_tokens(context_BLC, context_mask_BL, seed, cfg, top_p, more_smooth, **kw)
        return self.decode_uint8(f_hat)

    def decode_uint8(self, f_hat: torch.Tensor) -> torch.Tensor:
        """The tokenizer's image of a sampled f_hat as uint8, x·255 truncated (the last step of ``generate``)."""
        return self.tokenizer.fhat_to_img(f_hat).add_(1).mul_(0.5).mul_(255).to(torch.uint8)


# ---------------------------------------------------------------- loading official folders
def load_hart(path, device="cpu", use_ema: bool = True) -> HART:
    """HART with its tokenizer from an official checkpoint folder (``llm/`` and ``tokenizer/``, each
    with ``config.json``), strictly loaded. ``use_ema`` prefers ``llm/ema_model.bin`` as official
    ``sample.py`` (``--use_ema`` defaults to True). File names are UNVERIFIED against the real release."""
    from bench.checkpoint import load_built, read_state_dict
    from bench.models.hart_vae import load_tokenizer

    llm_file, tok_file = checkpoint_files(path, use_ema).values()
    cfg = HARTConfig.from_pretrained_dir(path)
    tok = load_tokenizer(tok_file, cfg.tokenizer, device)
    return load_built(lambda: HART(cfg), read_state_dict(llm_file), llm_file.name, device).attach(tok)
