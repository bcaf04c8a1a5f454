"""From a request to the exact run spec (bench.plan.make_spec): worlds, benches and models that fit together,
chains a model family can take, the request kept as typed, and every refusal with what to do instead."""
import pytest

from bench.checkpoint import CheckpointNotFound
from bench.plan import check_chain_fits, make_spec, requested_chain
from bench.registry import UnknownNameError
from bench.spec import resolve_chain


@pytest.mark.parametrize("args, kw, message", [
    (("tiny-var",), {"world": "moon"}, "unknown world 'moon'; expected one of tiny, paper"),
    (("tiny-var",), {"world": "paper"},
     "world mismatch: world paper, model tiny-var is tiny-world, bench imagenet256 is paper-world"),
    (("var-d16",), {"bench": "shapes-c2i", "need_ckpt": False},
     "world mismatch: world paper, model var-d16 is paper-world, bench shapes-c2i is tiny-world"),
    (("tiny-var",), {"bench": "imagenet256"},
     "world mismatch: world tiny, model tiny-var is tiny-world, bench imagenet256 is paper-world"),
    (("tiny-t2i",), {"bench": "shapes-c2i", "need_ckpt": False},
     "bench shapes-c2i is conditioned on classes, model tiny-t2i on prompts "
     "(benches for it: geneval, mjhq30k, shapes-geneval, shapes-mjhq)"),
    (("tiny-var",), {"bench": "shapes-geneval"},
     "bench shapes-geneval is conditioned on prompts, model tiny-var on classes (benches for it: imagenet256, shapes-c2i)"),
    (("tiny-var",), {"n": 13}, "--n 13: shapes-c2i needs a positive multiple of its 12 classes up to 10,000,000 (default 600)"),
    (("tiny-var",), {"seed": -1}, "--seed must be an integer in [0, 4294967295] (2^32 - 1), got -1"),
    (("tiny-var",), {"sampling": {"cfg": -1.0}}, "--cfg -1.0 is out of range [0.0, 100.0]"),
    (("tiny-var",), {"sampling": {"tau": 1.0}}, "--tau: not a sampling setting of tiny-var (it takes cfg, top_k, top_p, "
                                                "more_smooth)"),
])
def test_requests_that_cannot_be_run_say_why(args, kw, message):
    with pytest.raises(ValueError) as e:
        make_spec(*args, **kw)
    assert str(e.value) == message


def test_text_to_image_models_take_token_methods_only():
    message = ("on a text-to-image model (tiny-t2i): weight and recovery methods apply to the class-conditional VAR "
               "models; token methods (fastvar, lazyvar, stepvar, tome) to the text-to-image families too")
    with pytest.raises(ValueError) as e:
        make_spec("tiny-t2i", "magnitude + ft + fastvar + magnitude:sparsity=0.2", bench="shapes-geneval", need_ckpt=False)
    assert str(e.value) == "magnitude, ft " + message                  # each name once, in chain order
    with pytest.raises(ValueError) as e:
        check_chain_fits("hart-0.7b", resolve_chain("psad"))
    assert str(e.value).startswith("psad on a text-to-image model (hart-0.7b): ")
    check_chain_fits("tiny-t2i", resolve_chain("fastvar"))
    check_chain_fits("tiny-t2i", ())
    check_chain_fits("tiny-var", resolve_chain("magnitude + ft + fastvar"))   # class-conditional: anything
    assert make_spec("tiny-t2i", "fastvar", bench="shapes-geneval", need_ckpt=False).methods[0].startswith("fastvar:")


def test_the_request_is_kept_as_typed_in_canonical_spelling():
    assert requested_chain("dense + magnitude:sparsity=.40") == ["magnitude:sparsity=0.4"]
    assert requested_chain(["dense"]) == [] and requested_chain(()) == [] and requested_chain("dense") == []
    with pytest.raises(UnknownNameError, match="unknown method 'magnitud'; did you mean 'magnitude'?"):
        requested_chain("magnitud")
    with pytest.raises(UnknownNameError, match="unknown method 'nope'"):
        requested_chain(["dense", "nope:x=1"])
    s = make_spec("tiny-var", "dense + magnitude:sparsity=.40", sampling={"cfg": 3})
    assert s.requested == {"methods": ["magnitude:sparsity=0.4"], "sampling": {"cfg": 3.0}}
    assert s.methods == resolve_chain("magnitude") and s.method_versions == {"magnitude": 1}
    assert s.sampling == {"cfg": 3.0, "top_k": 50, "top_p": 0.9, "more_smooth": False}   # the model's, overridden
    assert make_spec("tiny-var", None).methods == () == make_spec("tiny-var").methods


def test_defaults_and_settings_of_a_spec():
    s = make_spec("tiny-var")
    assert (s.world, s.bench, s.n, s.seed) == ("tiny", "shapes-c2i", 600, 0)       # the world's bench, its n
    assert s.ckpt and all(len(v) == 64 for v in s.ckpt.values())                    # sha256 of the shipped files
    assert s.protocol["files"] and s.protocol["version"] >= 1
    lat = make_spec("tiny-var", bench="latency", n=3, bench_args={"batch": 4})
    assert lat.bench == "latency" and lat.protocol["batch"] == 4 and lat.n == 3
    assert make_spec("var-d16", bench="latency", n=3, need_ckpt=False).world == "paper"   # latency: any world


def test_a_paper_run_names_the_missing_checkpoint_files(tmp_path):
    with pytest.raises(CheckpointNotFound) as e:
        make_spec("var-d16", n=1000, ckpt_dir=tmp_path)
    assert "var_d16.pth" in str(e.value) and "vae_ch160v4096z32.pth" in str(e.value) and str(tmp_path) in str(e.value)
    assert make_spec("var-d16", n=1000, ckpt_dir=tmp_path, need_ckpt=False).ckpt is None
