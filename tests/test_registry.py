import pytest

from bench.cli import main
from bench.registry import BENCHES, MODELS, Registry, UnknownNameError


def test_register_get_and_names():
    reg = Registry("widget", (callable, "callable"))

    @reg.register("alpha")
    def alpha():
        return 1

    assert reg.get("alpha") is alpha and "alpha" in reg.names()


def test_duplicate_name_raises():
    reg = Registry("widget")
    reg.register("a", object())
    with pytest.raises(ValueError, match="duplicate widget name 'a'"):
        reg.register("a", object())


def test_wrong_type_raises():
    reg = Registry("widget", (callable, "a callable"))
    with pytest.raises(TypeError, match="must be a callable"):
        reg.register("x", 42)


def test_unknown_name_suggests_closest_and_lists_all():
    with pytest.raises(UnknownNameError) as e:
        MODELS.get("var-d61")
    msg = str(e.value)
    assert "did you mean 'var-d16'" in msg and "Known models:" in msg and "var-d30" in msg
    with pytest.raises(UnknownNameError, match="Known benches: "):
        BENCHES.get("shapes-c2j")


def test_cli_unknown_model_is_a_clear_error(capsys):
    assert main(["info", "var-d17"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'var-d17'; did you mean" in err


def test_cli_list_models(capsys):
    assert main(["list", "models"]) == 0
    out = capsys.readouterr().out.split()
    assert {"var-d16", "var-d20", "var-d24", "var-d30"} <= set(out)


def test_did_you_mean_hints():
    from bench.registry import did_you_mean
    assert did_you_mean("magnitud", ["magnitude", "evar"]) == "; did you mean 'magnitude'?"
    assert did_you_mean("tiny-vr", ["tiny-var", "tiny-t2i", "var-d16"], n=3, cutoff=0.5) == \
        "; did you mean 'tiny-var' or 'tiny-t2i'?"
    assert did_you_mean("zzz", ["magnitude"]) == ""
    assert did_you_mean(0.5, [0.25, 0.55]) == "; did you mean '0.55'?"     # names of any type, compared as text
    assert did_you_mean("cgf", {"cfg": 1, "top_k": 2}) == "; did you mean 'cfg'?"
