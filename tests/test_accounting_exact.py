"""Weight-free accounting (``bench.accounting``) against independent counts: the meta-device, memoised
counts equal a plain ``FlopCounterMode`` over the same computation run for real on small models (the
VQVAE and BSQ decoders, text-to-image sampling, HART sampling); per-scale shares add up to the total;
the info objects carry every contract key with the model's values; the memo's key refuses what it
cannot key exactly."""
import dataclasses
import types

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from bench import accounting as acc
from bench.models.bsq import BSQVAE
from bench.models.hart_config import HARTConfig
from bench.models.infinity import Infinity
from bench.models.t2i import T2IGenerator
from tests.test_t2i import SMALL as SMALL_T2I
from tests.test_t2i import SMALL_VAE as SMALL_BSQ
from tests.test_t2i import _perturbed

pytestmark = pytest.mark.usefixtures("one_thread")


def _plain(fn):
    """(total FLOPs, {op name: FLOPs}, the counter's total read at each scale's logits) of fn(hook).
    SDPA's math backend: the CPU's fused attention kernel has no FLOP formula in the counter, the math
    backend runs the same attention as counted matrix products (as the meta device does)."""
    fc, marks = FlopCounterMode(display=False), []
    with fc, torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        fn(lambda si, _: marks.append(fc.get_total_flops()))
    by_op = {str(op).split(".")[1]: int(n) for op, n in fc.get_flop_counts()["Global"].items()}
    return int(fc.get_total_flops()), by_op, marks


@pytest.fixture(scope="module")
def t2i():
    torch.manual_seed(0)
    return T2IGenerator(_perturbed(Infinity(SMALL_T2I)), _perturbed(BSQVAE(SMALL_BSQ), 1)).eval()


# --------------------------------------------------------------------------------------- decoders
def test_decode_flops_count_the_real_decoder_on_the_last_scale(small_gen):
    pn = small_gen.patch_nums[-1]
    plain, _, _ = _plain(lambda _: small_gen.vae.fhat_to_img(torch.zeros(1, small_gen.vae.Cvae, pn, pn)))
    assert acc.decode_flops(small_gen) == plain > 0
    H, W = SMALL_T2I.scale_schedule[-1]
    gen = T2IGenerator(Infinity(SMALL_T2I), BSQVAE(SMALL_BSQ))
    plain, _, _ = _plain(lambda _: gen.vae.decode(torch.zeros(1, gen.vae.d, H, W)))
    assert acc.t2i_decode_flops(gen) == plain > 0


# ----------------------------------------------------------------------------- text-to-image sampling
@pytest.mark.parametrize("T,cfg", [(3, 4.0), (5, 4.0), (5, None)])
def test_t2i_sampling_flops_count_the_official_loop_run_for_real(t2i, T, cfg):
    """The count on a meta copy equals the real generator sampling one prompt of T tokens (the text's
    keys and values recomputed at every scale, as the official loop does); cfg None = the conditional
    batch alone (cfg 1)."""
    feats, mask = torch.randn(1, T, SMALL_T2I.text_channels), torch.ones(1, T, dtype=torch.bool)
    total, by_op, marks = _plain(lambda hook: t2i.sample_bits(feats, mask, seed=0, cfg=1.0 if cfg is None else cfg,
                                                              cache_text_kv=False, logits_hook=hook))
    assert acc.t2i_sampling_flops(t2i, T, cfg=cfg) == total
    assert acc.t2i_sampling_flops(t2i, T, cfg=cfg, by_op=True) == by_op and sum(by_op.values()) == total
    fc, shares = acc._t2i_count(t2i, T, cfg)
    assert shares == [b - a for a, b in zip([0] + marks, marks)] and len(shares) == len(SMALL_T2I.scale_schedule)
    assert sum(shares) == marks[-1] and all(s > 0 for s in shares)


def test_t2i_flops_grow_with_the_prompt_and_double_with_guidance(t2i):
    f = {T: acc.t2i_sampling_flops(t2i, T, cfg=None) for T in (2, 4, 6)}
    assert f[6] - f[4] == f[4] - f[2] > 0          # text projections and cross-attention: linear in T
    assert acc.t2i_sampling_flops(t2i, 4, cfg=1.0) == f[4]
    assert 1.9 * f[4] < acc.t2i_sampling_flops(t2i, 4, cfg=4.0) <= 2 * f[4]


def test_t2i_info_keys_and_values(t2i):
    from bench.models.text import t5_encoder_params
    card = types.SimpleNamespace(name="t2i-test", sampling={"cfg": 3.0, "tau": 1.0}, image_size=16)
    with torch.device("meta"):
        meta = T2IGenerator(Infinity(SMALL_T2I), BSQVAE(SMALL_BSQ), name="t2i-test")
    out = acc.t2i_info(meta, card, text_tokens=5)
    cfg = SMALL_T2I
    assert out == {
        "model": "t2i-test", "params": acc.count_params(t2i.infinity), "tokenizer_params": acc.count_params(t2i.vae),
        "text_encoder_params": t5_encoder_params(),   # FLAN-T5-XL's encoder (no text model here); None without transformers
        "flops": acc.t2i_sampling_flops(t2i, 5, cfg=3.0),
        "kv_cache_values": 2 * 2 * cfg.L * cfg.width * cfg.depth,   # keys and values, CFG rows, every token
        "flops_no_cfg": acc.t2i_sampling_flops(t2i, 5, cfg=None),
        "flops_by_op": acc.t2i_sampling_flops(t2i, 5, cfg=3.0, by_op=True),
        "tokenizer_decode_flops": acc.t2i_decode_flops(t2i), "text_tokens": 5,
        "tokens_per_scale": [1, 4, 16], "scale_schedule": [[1, 1], [2, 2], [4, 4]], "total_tokens": 21,
        "image_size": 16, "depth": 2, "width": 64, "heads": [4, 4], "ffn_hidden": [cfg.ffn_hidden] * 2,
        "bits_per_token": 8, "sampling": {"cfg": 3.0, "tau": 1.0}}


def test_t2i_info_counts_the_cards_guidance_and_the_text_encoder_it_has(t2i):
    """cfg 1 in the card: the FLOPs are those of the conditional batch alone; a generator with its text
    encoder counts that encoder's parameters (not FLAN-T5-XL's)."""
    from bench.models.text import TinyTextEncoder
    from tests.test_t2i import TEXT
    card = types.SimpleNamespace(name="t2i-test", sampling={"cfg": 1.0}, image_size=16)
    with torch.device("meta"):
        meta = T2IGenerator(Infinity(SMALL_T2I), BSQVAE(SMALL_BSQ), TinyTextEncoder(TEXT), name="t2i-test")
    out = acc.t2i_info(meta, card, text_tokens=4)
    assert out["flops"] == out["flops_no_cfg"] == acc.t2i_sampling_flops(t2i, 4, cfg=None)
    assert out["text_encoder_params"] == acc.count_params(meta.text_encoder) > 0


def test_model_cost_of_a_text_to_image_model(t2i):
    """The prompt length of the count: TEXT_TOKENS, or the model's longest prompt if shorter (8 here)."""
    T = min(acc.TEXT_TOKENS, SMALL_T2I.text_maxlen)
    assert T == 8
    total, shares = acc.t2i_sampling_flops(t2i, T, cfg=3.0), acc._t2i_count(t2i, T, 3.0)[1]
    assert acc.model_cost(t2i, {"cfg": 3.0}, per_scale=True) == {
        "params": acc.count_params(t2i.infinity), "tokenizer_params": acc.count_params(t2i.vae),
        "text_encoder_params": None, "text_tokens": 8, "flops": total,
        "flops_no_cfg": acc.t2i_sampling_flops(t2i, T, cfg=None), "scale_flops": shares, "scale_passes": [True] * 3}


# ------------------------------------------------------------------------------------------- HART
def test_hart_flops_and_info_count_the_real_sampler(tmp_path, monkeypatch):
    """hart_info and model_cost on a small HART whose config files sit in the checkpoint folder: the
    counts equal the real model sampling one full-context prompt with its [cond; uncond] batch."""
    from bench.models.hart import HART
    from bench.models.hart_t2i import HARTGenerator
    from bench.models.hart_vae import HARTTokenizer
    from bench.registry import MODELS
    from tests.test_hart import _official_config_files
    cfg = HARTConfig.small_for_tests()
    card = MODELS.get("hart-0.7b")
    monkeypatch.setenv("VARBENCH_CKPT_DIR", str(tmp_path))
    _official_config_files(card.folder(), cfg)
    torch.manual_seed(0)
    gen = HARTGenerator(HART(cfg, HARTTokenizer(cfg.tokenizer)).eval(), name="hart-test")
    ctx, mask = torch.zeros(1, cfg.context_token, cfg.context_dim), torch.ones(1, cfg.context_token, dtype=torch.long)
    total, _, marks = _plain(lambda hook: gen.hart.sample_tokens(ctx, mask, seed=0, cfg=4.5, more_smooth=False,
                                                                 logits_hook=hook))
    fc, shares = acc._hart_count(gen, 4.5)
    assert fc.get_total_flops() == total and shares == [b - a for a, b in zip([0] + marks, marks)]
    pn = cfg.patch_nums[-1]
    decode, _, _ = _plain(lambda _: gen.tokenizer.fhat_to_img(torch.zeros(1, cfg.Cvae, pn, pn)))
    info = acc.hart_info(card)
    assert info["config_source"] == "checkpoint folder" and info["model"] == "hart-0.7b"
    assert info["flops"] == acc._hart_count(gen, card.sampling["cfg"])[0].get_total_flops()
    assert (info["params"], info["diffusion_head_params"], info["tokenizer_params"]) == (
        acc.count_params(gen.hart), acc.count_params(gen.hart.diffloss), acc.count_params(gen.tokenizer))
    assert info["tokenizer_decode_flops"] == decode and info["flops_no_cfg"] is None
    assert (info["text_tokens"], info["total_tokens"], info["depth"], info["width"]) == (
        cfg.context_token, cfg.L, cfg.depth, cfg.embed_dim)
    assert info["tokens_per_scale"] == [p * p for p in cfg.patch_nums] and info["image_size"] == cfg.image_size
    assert info["sampling"] == card.sampling and "methods" not in info
    from bench.models.text import qwen2_params
    assert info["text_encoder_params"] == qwen2_params()        # None without transformers
    assert info["text_encoder"].startswith("Qwen2-1.5B config (assumed for Qwen2-VL-1.5B-Instruct")
    assert acc.hart_info(card, card.build("meta", cfg), ["fastvar"])["methods"] == ["fastvar"]
    cost = acc.model_cost(gen, {"cfg": 4.5}, per_scale=True)
    assert cost == {"params": info["params"], "tokenizer_params": info["tokenizer_params"], "text_encoder_params": None,
                    "text_tokens": cfg.context_token, "flops": total, "flops_no_cfg": None,
                    "scale_flops": shares, "scale_passes": [True] * len(cfg.patch_nums)}


# ---------------------------------------------------------------------------------------- VAR
def test_model_cost_of_var_per_scale(small_gen):
    cost = acc.model_cost(small_gen, {"cfg": 2.0, "top_k": 5, "top_p": 0.5}, per_scale=True)
    total, shares = acc._per_scale_flops(small_gen, 2.0, 5, 0.5)
    assert cost == {"params": acc.count_params(small_gen.var), "tokenizer_params": acc.count_params(small_gen.vae),
                    "flops": total, "flops_no_cfg": acc.sampling_flops(small_gen, cfg=None),
                    "scale_flops": shares, "scale_passes": [True] * len(small_gen.patch_nums)}
    # after the last scale's logits only the φ convolution of its f_hat update runs (3×3, Cvae → Cvae, pn²)
    pn, Cv = small_gen.patch_nums[-1], small_gen.var.cfg.Cvae
    assert total - sum(shares) == 2 * pn * pn * Cv * Cv * 9 and len(shares) == len(small_gen.patch_nums)
    assert acc.model_cost(small_gen, {}) == {k: cost[k] for k in ("params", "tokenizer_params")} | {
        "flops": acc.sampling_flops(small_gen), "flops_no_cfg": cost["flops_no_cfg"]}


def test_info_has_every_contract_key(small_gen):
    cfg = small_gen.var.cfg
    out = acc.info(small_gen, image_size=32)
    assert out == {
        "model": small_gen.name, "params": acc.count_params(small_gen.var),
        "tokenizer_params": acc.count_params(small_gen.vae), "flops": acc.sampling_flops(small_gen),
        "kv_cache_values": None,   # a real model that never generated holds no cache
        "flops_no_cfg": acc.sampling_flops(small_gen, cfg=None), "tokenizer_decode_flops": acc.decode_flops(small_gen),
        "tokens_per_scale": [1, 4, 9, 16, 64], "patch_nums": [1, 2, 3, 4, 8], "total_tokens": 94, "image_size": 32,
        "depth": 2, "width": 128, "heads": [2, 2], "ffn_hidden": [512, 512], "attn_l2_norm": cfg.attn_l2_norm,
        "vocab_size": 64}
    assert acc.info(small_gen, name="other")["model"] == "other"
    assert acc.kv_cache_values([b.attn for b in small_gen.var.blocks], rows=2) is None


# ------------------------------------------------------------------------------------------- memo
def test_the_memo_key_is_exact_or_refuses():
    meta = torch.empty(2, 3, device="meta")
    assert acc._key(meta) == ((2, 3), (3, 1), 0, torch.float32)
    assert acc._key(meta.t()) != acc._key(torch.empty(3, 2, device="meta"))      # strides differ
    assert acc._key(1) != acc._key(1.0) and acc._key(True) != acc._key(1)
    assert acc._key(None) == (type(None), None)
    assert acc._key([1, (2.0, None)]) == (list, ((int, 1), (tuple, ((float, 2.0), (type(None), None)))))
    for unkeyable in (torch.zeros(2), torch.Generator(), object(), [meta, torch.zeros(1)]):
        with pytest.raises(acc._Unkeyed):
            acc._key(unkeyable)


def test_the_counts_do_not_depend_on_where_the_model_lives(small_gen):
    with torch.device("meta"):
        meta = type(small_gen)(type(small_gen.var)(small_gen.var.cfg), type(small_gen.vae)(small_gen.vae.cfg),
                               name=small_gen.name)
    assert acc._meta_copy(meta) is meta
    assert acc.sampling_flops(meta) == acc.sampling_flops(small_gen)
    assert acc.decode_flops(meta) == acc.decode_flops(small_gen)
    assert dataclasses.asdict(acc._meta_copy(small_gen).var.cfg) == dataclasses.asdict(small_gen.var.cfg)


def test_pass_starts_follow_the_policys_groups_until_it_skips():
    from bench.models.policy import TokenPolicy

    class Policy(TokenPolicy):
        def __init__(self, groups, skip_from=None):
            super().__init__()
            self._groups, self.skip_from = groups, skip_from

        def groups(self, n_scales):
            return self._groups

        def skip(self, si):
            return self.skip_from is not None and si >= self.skip_from

    assert acc.pass_starts(TokenPolicy(), 4) == [True] * 4
    assert acc.pass_starts(Policy([(0,), (1,), (2, 3), (4,)]), 5) == [True, True, True, False, True]
    assert acc.pass_starts(Policy([(0,), (1,), (2,), (3,)], skip_from=2), 4) == [True, True]
    assert acc.pass_starts(Policy([(0,), (1, 2), (3, 4)], skip_from=3), 5) == [True, True, False]
    assert acc.pass_starts(Policy([(0, 1, 2)], skip_from=0), 3) == []
