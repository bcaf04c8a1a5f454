"""The method-spec grammar: one spelling per spec (what run keys are made of), every bad spec refused with
what to write instead, parameters typed and range-checked against their declaration."""
import pytest

from bench import spec as sp
from bench.spec import SpecError, canonical_method, format_method, parse_chain, parse_method

# a declaration of every parameter type, so that each branch of the conversion is exercised on its own
DECL = {"name": "toy", "kind": "weights", "params": {
    "rate": {"default": 0.5, "type": "float", "min": 0.0, "max": 1.0},
    "free": {"default": 2.0, "type": "float"},
    "steps": {"default": 3, "type": "int", "min": 1},
    "cap": {"default": 4, "type": "int", "max": 9},
    "on": {"default": True, "type": "bool"},
    "mode": {"default": "a", "type": "str", "choices": ["alpha", "beta", "a"]},
    "opt": {"default": None, "type": "float"},
    "tag": {"default": "x", "type": "str"},
}}


@pytest.fixture
def toy(monkeypatch):
    real = sp._declaration
    monkeypatch.setattr(sp, "_declaration", lambda name: DECL if name == "toy" else real(name))


@pytest.mark.parametrize("raw, canonical", [
    ("0.40", "0.4"), (".4", "0.4"), ("1e-3", "0.001"), ("007", "7"), ("-0", "0"), ("1.0", "1.0"), ("+2", "2"),
    (" 0.5 ", "0.5"), (" pyramid ", "pyramid"), ("inf", "inf"), ("nan", "nan"), ("l2", "l2"), ("0.2/0.1", "0.2/0.1"),
])
def test_numbers_are_written_one_way_and_text_is_stripped(raw, canonical):
    assert sp._canonical_value(raw) == canonical


def test_spaces_anywhere_in_a_spec_give_the_same_spelling():
    assert parse_method("  magnitude : sparsity = 0.40 , norm = l1 ,") == ("magnitude", {"sparsity": "0.4", "norm": "l1"})
    assert canonical_method("magnitude:norm= l1,sparsity=.4") == canonical_method(" magnitude:sparsity=0.4,norm=l1 ")
    assert canonical_method("magnitude:norm= l1,sparsity=.4") == "magnitude:norm=l1,sparsity=0.4"
    assert parse_method("dense") == ("dense", {})
    assert parse_method("dense:") == ("dense", {})


@pytest.mark.parametrize("bad, message", [
    (None, "a method spec must be a non-empty string, got None"),
    (3, "a method spec must be a non-empty string, got 3"),
    ("", "a method spec must be a non-empty string, got ''"),
    ("   ", "a method spec must be a non-empty string, got '   '"),
    (":sparsity=0.4", "bad method spec ':sparsity=0.4': expected 'name' or 'name:key=value,...'"),
    ("sparsity=0.4", "bad method spec 'sparsity=0.4': expected 'name' or 'name:key=value,...'"),
    ("evar,ft", "bad method spec 'evar,ft'"),
    ("evar ft", "bad method spec 'evar ft'"),
    ("evar+ft", "bad method spec 'evar+ft'"),
    ("evar:sparsity", "bad parameter 'sparsity' in method spec 'evar:sparsity': expected key=value"),
    ("evar:sparsity=", "bad parameter 'sparsity=' in method spec"),
    ("evar:sparsity= ", "bad parameter 'sparsity='"),
    ("evar:=0.4", "bad parameter '=0.4'"),
    ("evar:sparsity=0.4,sparsity=0.5", "parameter 'sparsity' given twice in method spec"),
    ("evar:sparsity=0.4, sparsity =.4", "parameter 'sparsity' given twice"),
])
def test_bad_specs_say_what_to_write(bad, message):
    with pytest.raises(SpecError) as e:
        parse_method(bad)
    assert message in str(e.value)


def test_format_is_the_inverse_of_parse_with_sorted_keys():
    assert format_method("toy", {}) == "toy"
    assert format_method("toy", {"b": True, "a": False, "c": 0.40, "d": 3, "e": "x"}) == "toy:a=false,b=true,c=0.4,d=3,e=x"
    assert sp._text(True) == "true" and sp._text(False) == "false" and sp._text(1) == "1" and sp._text(1.0) == "1.0"
    s = "magnitude:norm=l1,sparsity=0.4"
    assert format_method(*parse_method(s)) == s


def test_chains():
    assert parse_chain(None) == [] and parse_chain([]) == [] and parse_chain(()) == []
    assert parse_chain("a + b:x=1") == ["a", "b:x=1"]
    assert parse_chain([" a ", "b"]) == ["a", "b"]
    assert parse_chain("dense") == ["dense"]
    for bad in ([""], ["a", None], ["a", 3], "a +", "+ a"):
        with pytest.raises(SpecError) as e:
            parse_chain(bad)
        assert str(e.value) == (f"empty method in chain {bad!r}: join method specs with '+', e.g. "
                                f"'magnitude:sparsity=0.4 + ft'; write 'dense' for the unmodified model")
    with pytest.raises(SpecError, match="bad parameter 'x'"):     # every item is parsed, not only split
        parse_chain("a + b:x")


def test_parameters_are_filled_in_typed_and_checked(toy):
    r = sp.resolve_params("toy", {})
    assert r == {"rate": 0.5, "free": 2.0, "steps": 3, "cap": 4, "on": True, "mode": "a", "opt": None, "tag": "x"}
    assert [type(r[k]) for k in ("rate", "steps", "on", "tag")] == [float, int, bool, str]
    r = sp.resolve_params("toy", {"rate": "1", "steps": "12", "on": "No", "mode": "beta", "opt": "1e-3", "tag": "7",
                                  "free": "-3.5", "cap": 9.0})
    assert r == {"rate": 1.0, "free": -3.5, "steps": 12, "cap": 9, "on": False, "mode": "beta", "opt": 0.001, "tag": "7"}
    assert type(r["rate"]) is float and type(r["steps"]) is int and type(r["cap"]) is int
    for word, val in (("1", True), ("true", True), (" YES ", True), ("0", False), ("false", False), ("no", False)):
        assert sp.resolve_params("toy", {"on": word})["on"] is val
    assert sp.resolve_params("toy", {"rate": "0"})["rate"] == 0.0 and sp.resolve_params("toy", {"steps": 1})["steps"] == 1


@pytest.mark.parametrize("given, message", [
    ({"rat": "0.1"}, "method 'toy' has no parameter 'rat'; did you mean 'rate'? Parameters: rate, free, steps, cap, "
                     "on, mode, opt, tag"),
    ({"zzz": "1"}, "method 'toy' has no parameter 'zzz'. Parameters: rate"),
    ({"rate": "1.5"}, "toy: parameter rate=1.5 out of range [0.0, 1.0]"),
    ({"rate": "-0.1"}, "toy: parameter rate=-0.1 out of range [0.0, 1.0]"),
    ({"steps": "0"}, "toy: parameter steps=0 out of range [1, inf]"),
    ({"cap": "10"}, "toy: parameter cap=10 out of range [-inf, 9]"),
    ({"rate": "inf"}, "toy: parameter rate='inf' is not a finite number (range [0.0, 1.0])"),
    ({"free": "nan"}, "toy: parameter free='nan' is not a finite number"),
    ({"free": "abc"}, "toy: parameter free='abc' is not a finite number"),
    ({"steps": "2.5"}, "toy: parameter steps='2.5' is not an integer (range [1, inf])"),
    ({"steps": 2.5}, "toy: parameter steps=2.5 is not an integer"),
    ({"cap": "3.0"}, "toy: parameter cap='3.0' is not an integer (range [-inf, 9])"),
    ({"on": "maybe"}, "toy: parameter on='maybe' is not true or false (or yes/no, 1/0)"),
    ({"on": "2"}, "toy: parameter on='2' is not true or false (or yes/no, 1/0)"),
    ({"mode": "alpah"}, "toy: parameter mode='alpah' must be one of alpha, beta, a; did you mean 'alpha'?"),
    ({"mode": "q"}, "toy: parameter mode='q' must be one of alpha, beta, a"),
])
def test_bad_parameters_name_the_parameter_and_its_range(toy, given, message):
    with pytest.raises(SpecError) as e:
        sp.resolve_params("toy", given)
    assert message in str(e.value), str(e.value)
    if "did you mean" not in message and "must be one of" in message:
        assert "did you mean" not in str(e.value)


def test_a_method_without_parameters_says_so():
    with pytest.raises(SpecError) as e:
        sp.resolve_params("dense", {"sparsity": "0.4"})
    assert str(e.value) == "method 'dense' has no parameter 'sparsity'. Parameters: (none)"


def test_range_text():
    assert sp._range_text({}) == ""
    assert sp._range_text({"min": 0, "max": 1}) == " (range [0, 1])"
    assert sp._range_text({"min": 0}) == " (range [0, inf])"
    assert sp._range_text({"max": 1}) == " (range [-inf, 1])"
    assert sp._range_text({"choices": ["a", 2], "min": 0}) == " (one of a, 2)"


def test_resolved_specs_and_chains(toy):
    assert sp.resolve_method("toy:rate=.25") == "toy:cap=4,free=2.0,mode=a,on=true,rate=0.25,steps=3,tag=x"   # opt: None
    assert sp.resolve_method("magnitude") == sp.resolve_method("magnitude:sparsity=0.40,norm=l2") == \
        "magnitude:norm=l2,schedule=uniform,scope=coupled,sparsity=0.4"
    assert sp.resolve_chain("dense") == () and sp.resolve_chain(None) == () and sp.resolve_chain([]) == ()
    assert sp.resolve_chain(["dense", "magnitude"]) == ("magnitude:norm=l2,schedule=uniform,scope=coupled,sparsity=0.4",)
    assert sp.resolve_chain("magnitude + fastvar")[1].startswith("fastvar:")
    with pytest.raises(SpecError) as e:
        sp.resolve_chain("fastvar + magnitude + tome")
    fast, mag, tome = sp.resolve_chain("fastvar + magnitude") + sp.resolve_chain("tome")
    assert str(e.value) == (f"chain {fast} + {mag} + {tome} has 2 token methods ({fast}, {tome}); a generator has "
                            f"one token-policy slot, so a chain may hold at most one")
