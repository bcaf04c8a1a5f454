"""`varbench info`: its text line by line against its own --json, for each model family, with and
without a method chain; a chain that cannot be accounted for without weights says what to run.
(Ordered fast first: the mutation driver stops at the first failure.)"""
import json

from bench.commands import common
from tests.conftest import cli as _out


def _info(capsys, *argv):
    data = json.loads(_out(capsys, ["info", *argv, "--json"]).out)
    return data, _out(capsys, ["info", *argv]).out.splitlines()


def test_info_text_is_its_json(capsys):
    d, lines = _info(capsys, "tiny-var")
    kv = d["kv_cache_values"]
    assert lines == [
        "tiny-var: depth 4, width 192, 32px, cosine attention on",
        f"  transformer parameters  {d['params']:,}",
        f"  tokenizer parameters    {d['tokenizer_params']:,}",
        f"  FLOPs / image (CFG)     {common.human(d['flops'])}  ({d['flops']:,})",
        f"  FLOPs / image (no CFG)  {common.human(d['flops_no_cfg'])}  ({d['flops_no_cfg']:,})",
        f"  VQVAE decode FLOPs      {common.human(d['tokenizer_decode_flops'])}",
        f"  KV cache (CFG)          {kv:,} values: {kv * 2 / 1e9:.3g} GB in bf16, {kv * 4 / 1e9:.3g} GB in fp32 "
        "(the tokens the sampler caches)",
        f"  tokens per scale        {d['tokens_per_scale']}  (L = {d['total_tokens']})"]
    assert d["tokens_per_scale"] == [1, 4, 9, 16, 25, 36, 64] and d["total_tokens"] == 155
    assert "methods" not in d


def test_info_of_a_method_that_needs_weights_says_to_run_it(capsys, monkeypatch):
    import bench.method
    from bench.spec import SpecError

    def needs_weights(model, chain, ctx):
        raise RuntimeError("no data on the meta device")
    monkeypatch.setattr(bench.method, "apply_chain", needs_weights)
    r = _out(capsys, ["info", "tiny-var", "--method", "evar"], rc=2)
    assert r.out == "" and r.err.startswith("varbench: error: cannot account for evar without weights or data (")
    assert r.err == ("varbench: error: cannot account for evar without weights or data (RuntimeError: no data on the "
                     "meta device); `varbench run` records params and FLOPs of the real model.\n")

    def bad_value(model, chain, ctx):
        raise SpecError("evar: sparsity=2 is out of range")
    monkeypatch.setattr(bench.method, "apply_chain", bad_value)    # a parameter error keeps its own message
    r = _out(capsys, ["info", "tiny-var", "--method", "evar"], rc=2)
    assert "sparsity=2 is out of range" in r.err and "cannot account" not in r.err


def test_info_refuses_a_chain_the_family_cannot_run_before_building(capsys, monkeypatch):
    from bench.registry import MODELS
    for model in ("tiny-t2i", "hart-0.7b"):
        monkeypatch.setattr(type(MODELS.get(model)), "build", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
        r = _out(capsys, ["info", model, "--method", "magnitude"], rc=2)
        assert r.err.startswith(f"varbench: error: magnitude on a text-to-image model ({model}): weight and recovery "
                                "methods apply to the class-conditional VAR models")


def test_info_names_the_whole_chain_it_cannot_account_for_and_prints_no_progress(capsys, monkeypatch):
    import bench.method
    r = _out(capsys, ["info", "tiny-var", "--method", "magnitude:sparsity=0.5"])
    assert r.err == ""                                  # the meta-device chain runs without progress bars
    seen = []

    def needs_weights(model, chain, ctx):
        seen.append(ctx.progress)
        raise RuntimeError("x")
    monkeypatch.setattr(bench.method, "apply_chain", needs_weights)
    r = _out(capsys, ["info", "tiny-var", "--method", "magnitude + psad"], rc=2)
    assert seen == [False]
    assert r.err.startswith("varbench: error: cannot account for magnitude + psad without weights or data "
                            "(RuntimeError: x)")


def test_info_says_when_cosine_attention_is_off(capsys, monkeypatch):
    import bench.accounting
    real = bench.accounting.info
    monkeypatch.setattr(bench.accounting, "info", lambda gen, **kw: {**real(gen, **kw), "attn_l2_norm": False})
    d, lines = _info(capsys, "tiny-var")
    assert lines[0] == "tiny-var: depth 4, width 192, 32px, cosine attention off" and d["attn_l2_norm"] is False


def test_info_with_a_method_names_it_and_counts_the_pruned_model(capsys):
    dense, _ = _info(capsys, "tiny-var")
    d, lines = _info(capsys, "tiny-var", "--method", "magnitude:sparsity=0.5")
    assert d["methods"] == ["magnitude:sparsity=0.5"] and d["params"] < dense["params"]
    assert lines[1] == f"  transformer parameters  {d['params']:,}"


def test_info_text_of_tiny_t2i(capsys):
    d, lines = _info(capsys, "tiny-t2i")
    attn = sum(v for k, v in d["flops_by_op"].items() if "attention" in k or k == "bmm")
    assert attn > 0
    assert lines[0] == f"tiny-t2i: depth {d['depth']}, width {d['width']}, {d['image_size']}px, " \
                       f"{d['bits_per_token']} bits per token, {len(d['tokens_per_scale'])} scales"
    assert lines[1] == f"  transformer parameters  {d['params']:,}"
    assert lines[2] == f"  tokenizer parameters    {d['tokenizer_params']:,}"
    assert lines[3] == f"  text encoder parameters {d['text_encoder_params']:,}"
    assert lines[4] == (f"  FLOPs / image (CFG)     {common.human(d['flops'])}  ({d['flops']:,}; attention "
                        f"{common.human(attn)}), prompt of {d['text_tokens']} tokens")
    assert lines[5] == f"  FLOPs / image (no CFG)  {common.human(d['flops_no_cfg'])}  ({d['flops_no_cfg']:,})"
    assert lines[6] == f"  VAE decode FLOPs        {common.human(d['tokenizer_decode_flops'])}"
    assert lines[7].startswith(f"  KV cache (CFG)          {d['kv_cache_values']:,} values")
    assert "methods" not in d
    r = _out(capsys, ["info", "tiny-t2i", "--method", "stepvar", "--json"])
    m = json.loads(r.out)
    assert m["methods"] == ["stepvar"] and m["flops"] < d["flops"] and m["params"] == d["params"] and r.err == ""
    short, _ = _info(capsys, "tiny-t2i", "--text-tokens", "1")
    assert short["text_tokens"] == 1 and short["flops"] < d["flops"]
    r = _out(capsys, ["info", "tiny-t2i", "--text-tokens", "0"], rc=2)
    assert r.err == f"varbench: error: --text-tokens 0 is out of range [1, {d['text_tokens']}] for tiny-t2i\n"
    for model, why in [("var-d16", "it takes class labels, not prompts"),
                       ("hart-0.7b", "its text context is padded to a fixed length")]:   # would change nothing
        r = _out(capsys, ["info", model, "--text-tokens", "5"], rc=2)
        assert r.err == (f"varbench: error: --text-tokens applies to the Infinity-class models (infinity-2b, "
                         f"tiny-t2i); {model}: {why}\n")


def test_info_text_of_hart(capsys):
    h, lines = _info(capsys, "hart-0.7b")
    assert lines[0] == f"hart-0.7b: depth 24, width 1536, 1024px (config: {h['config_source']})"
    assert lines[1] == (f"  transformer parameters  {h['params']:,}  (residual diffusion head "
                        f"{h['diffusion_head_params']:,})")
    assert lines[2] == f"  tokenizer parameters    {h['tokenizer_params']:,}"
    tp = h["text_encoder_params"]
    assert lines[3] == "  text model parameters   " + (f"{tp:,}  ({h['text_encoder']})" if tp is not None else
                                                     "(install transformers: pip install 'varbench[t2i]')")
    assert lines[4] == f"  FLOPs / image (CFG)     {common.human(h['flops'])}  ({h['flops']:,}), context of " \
                       f"{h['text_tokens']} tokens"
    assert lines[5] == f"  tokenizer decode FLOPs  {common.human(h['tokenizer_decode_flops'])}"
    r = _out(capsys, ["info", "hart-0.7b", "--method", "fastvar", "--json"])
    assert json.loads(r.out)["flops"] < h["flops"] and r.err == ""      # the chain runs on meta without progress
