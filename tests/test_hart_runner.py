"""hart-0.7b through the runner: prompts → images with its text model (``HARTGenerator``), the official
checkpoint folder's files and identity, token methods installed through the generator, and the
latency bench end to end on a checkpoint folder of the golden fixture's small model "a" (with a
stand-in for the Qwen2 text model, which needs ``transformers`` and 3 GB of weights)."""
import pytest
import torch
import torch.nn as nn

from bench.checkpoint import CheckpointNotFound
from bench.models.hart_t2i import HARTGenerator
from bench.models.policy import TokenPolicy
from tests.test_hart import _official_config_files, golden, models  # noqa: F401  (fixtures)
from tests.test_token_methods import _apply

pytestmark = pytest.mark.usefixtures("one_thread")
KW = dict(cfg=4.5, top_p=0.0, more_smooth=False)


class WordFeatures(nn.Module):
    """Test stand-in for HART's Qwen2 prompt encoder: one seeded random vector per word, the prompt
    padded or cut to the model's context length, mask = the words' positions (as ``encode_prompts``)."""

    def __init__(self, context_token: int, context_dim: int):
        super().__init__()
        self.T, self.C = context_token, context_dim

    def _word(self, w: str) -> torch.Tensor:
        g = torch.Generator().manual_seed(sum(ord(c) * 31 ** i for i, c in enumerate(w)) % (2 ** 31))
        return torch.randn(self.C, generator=g)

    def encode(self, prompts):
        feats, mask = torch.zeros(len(prompts), self.T, self.C), torch.zeros(len(prompts), self.T, dtype=torch.long)
        for b, p in enumerate(prompts):
            words = p.lower().split()[:self.T]
            for i, w in enumerate(words):
                feats[b, i] = self._word(w)
            mask[b, :len(words)] = 1
        return feats, mask


def _gen(models):  # noqa: F811
    cfg = models["a"].cfg
    return HARTGenerator(models["a"], WordFeatures(cfg.context_token, cfg.context_dim), name="hart-test")


PROMPTS = ["a photo of a red apple", "two dogs on a sofa"]


def test_prompts_give_what_hart_gives_for_their_features(models):  # noqa: F811
    gen = _gen(models)
    feats, mask = gen.text_encoder.encode(PROMPTS)
    want = models["a"].generate(feats, mask, seed=5, **KW)
    assert torch.equal(gen.generate(PROMPTS, seed=5, **KW), want)
    assert torch.equal(gen.generate((feats, mask), seed=5, **KW), want)   # features given directly
    assert not torch.equal(gen.generate(PROMPTS[::-1], seed=5, **KW), want)
    no_text = HARTGenerator(models["a"])
    with pytest.raises(RuntimeError, match="no text encoder"):
        no_text.generate(PROMPTS)


def test_token_methods_install_through_the_generator(models):  # noqa: F811
    gen = _gen(models)
    dense = gen.generate(PROMPTS, seed=1, **KW)
    try:
        same, _ = _apply(gen, "fastvar:drop=0/0")
        assert type(models["a"].token_policy).__name__ == "FastVARPolicy"   # the sampling loop's hook
        assert torch.equal(same.generate(PROMPTS, seed=1, **KW), dense)
        pruned, ctx = _apply(gen, "fastvar")
        assert "fastvar (hart schedule)" in ctx.notes[0]
        assert not torch.equal(pruned.generate(PROMPTS, seed=1, **KW), dense)
    finally:
        gen.token_policy = TokenPolicy()


def _folder(root, models):  # noqa: F811
    """An official-layout checkpoint folder (config files as the official classes save them) of model a."""
    from safetensors.torch import save_file
    folder = root / "hart-0.7b-1024px"
    _official_config_files(folder, models["a"].cfg)
    for sub, module in (("llm", models["a"]), ("tokenizer", models["tok"])):
        save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(folder / sub / "model.safetensors"))
    return folder


def test_checkpoint_files_identity_and_what_is_missing(tmp_path, models):  # noqa: F811
    from bench.checkpoint import sha256
    from bench.registry import MODELS
    card = MODELS.get("hart-0.7b")
    with pytest.raises(CheckpointNotFound) as e:
        card.identity(tmp_path)
    msg = str(e.value)
    for want in ("llm/config.json", "tokenizer/config.json", "ema_model.bin", "huggingface.co/mit-han-lab/hart"):
        assert want in msg, want
    folder = _folder(tmp_path, models)
    files = card.files(tmp_path)
    assert sorted(files) == ["llm/model.safetensors", "tokenizer/model.safetensors"]
    assert card.identity(tmp_path) == {k: sha256(p) for k, p in files.items()}
    (folder / "llm" / "ema_model.bin").write_bytes((folder / "llm" / "model.safetensors").read_bytes())
    assert "llm/ema_model.bin" in card.files(tmp_path)   # official sample.py loads the EMA weights first
    (folder / "tokenizer" / "model.safetensors").unlink()
    with pytest.raises(CheckpointNotFound) as e:
        card.files(tmp_path)
    listed = [ln.strip() for ln in str(e.value).splitlines()[1:-1]]
    assert listed == ["tokenizer/ weights (one of model.safetensors, pytorch_model.bin): get it from "
                      "https://huggingface.co/mit-han-lab/hart-0.7b-1024px"]


def test_sampling_settings_the_model_does_not_take_are_refused():
    from bench.plan import make_spec
    with pytest.raises(ValueError, match=r"--top-k: not a sampling setting of hart-0\.7b \(it takes cfg, top_p, more_smooth\)"):
        make_spec("hart-0.7b", bench="geneval", sampling={"top_k": 5}, need_ckpt=False)
    with pytest.raises(ValueError, match="--tau: not a sampling setting of tiny-var"):
        make_spec("tiny-var", sampling={"tau": 0.5}, need_ckpt=False)
    assert make_spec("hart-0.7b", bench="geneval", sampling={"cfg": 3}, need_ckpt=False).sampling["cfg"] == 3.0


@pytest.mark.parametrize("compile_", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["eager", "compile"])
def test_latency_bench_runs_hart_from_its_checkpoint_folder(tmp_path, models, monkeypatch, compile_):  # noqa: F811
    """The runner's path for a paper-world HART: spec (identity of the folder's files), load, token
    method, prompts of the world's GenEval bench, timing, per-scale FLOPs, records; under --compile
    (HART's attention and FFN) nothing compiles while timed."""
    from bench.latency import latency_specs, run_latency
    from bench.models.cards import HARTCard
    from bench.registry import MODELS
    _folder(tmp_path, models)
    cfg = models["a"].cfg
    monkeypatch.setattr(HARTCard, "text_encoder", lambda self, ckpt_dir_=None, device="cpu":
                        WordFeatures(cfg.context_token, cfg.context_dim))
    setting = {"device": "cpu", "batch": 1, "threads": 1, "compile": compile_, "warmup": 1}
    specs = latency_specs("hart-0.7b", ["dense", "fastvar"], reps=3, seed=0, setting=setting, world="paper",
                          ckpt_dir=tmp_path)
    assert specs[0].ckpt == MODELS.get("hart-0.7b").identity(tmp_path)
    dense, fast = run_latency(specs, root=tmp_path / "results", ckpt_dir=tmp_path, progress=False)
    for rec in (dense, fast):
        assert rec["metrics"]["latency_ms"]["n"] == 3
        cost = rec["cost"]
        assert cost["text_tokens"] == cfg.context_token and cost.get("flops_no_cfg") is None   # always the CFG batch
        assert sum(cost["scale_flops"]) <= cost["flops"] and len(cost["scale_flops"]) == len(cfg.patch_nums)
    assert fast["cost"]["flops"] < dense["cost"]["flops"]
    assert fast["cost"]["scale_flops"][:6] == dense["cost"]["scale_flops"][:6]   # hart schedule: the last two scales
    assert dense["cost"]["params"] == sum(p.numel() for p in models["a"].parameters())
    if compile_:
        assert dense["cost"]["compile_graphs"] > 0
        assert dense["cost"]["compile_graphs_timed"] == 0 and fast["cost"]["compile_graphs_timed"] == 0


def test_a_missing_text_model_is_named_before_the_transformer_loads(tmp_path, models, monkeypatch):  # noqa: F811
    import bench.models.hart as hart_module
    from bench.registry import MODELS
    _folder(tmp_path, models)
    monkeypatch.setattr(hart_module, "load_hart", lambda *a, **k: pytest.fail("HART loaded first"))
    with pytest.raises(FileNotFoundError, match="Qwen2-VL-1.5B-Instruct"):
        MODELS.get("hart-0.7b")(ckpt_dir=tmp_path)
