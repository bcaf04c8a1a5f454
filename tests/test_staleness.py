"""Which records a table, the leaderboard and `varbench runs` may use: a record is found by its exact key
(or, where the checkpoint files are absent, by every other field), is stale when its request made today
lands elsewhere, and the reason names what changed."""
import dataclasses

import pytest

from bench.plan import RANDOM_CKPT, _diff, make_spec, match_records, staleness
from bench.records import make_record


def today(chain="magnitude", **kw):
    return make_spec("tiny-var", chain, n=kw.pop("n", 12), seed=kw.pop("seed", 0), need_ckpt=False, **kw)


def rec(spec, **metrics):
    return make_record(spec, metrics or {"fid": 1.0}, {}, {})


def old_dict(spec, **change):
    return {**dataclasses.replace(spec, **change).to_dict()}


# --- the reasons ---------------------------------------------------------------------------------------

def test_each_change_is_named():
    new = dataclasses.replace(today("magnitude + ft"), ckpt={"tiny_var.safetensors": "ab" * 32})
    assert _diff(old_dict(new), new) == "key changed"
    assert _diff(old_dict(new, method_versions=None), new) == \
        "made before record keys covered method defaults, versions and checkpoints (schema 1)"
    assert _diff(old_dict(new, methods=("magnitude:sparsity=0.3",)), new) == \
        f"method parameters now resolve to {' + '.join(new.methods)}"
    dense = today("dense")
    assert _diff(old_dict(dense, methods=("magnitude",)), dense) == "method parameters now resolve to dense"
    ft, mag = new.method_versions["ft"], new.method_versions["magnitude"]           # today's versions
    assert _diff(old_dict(new, method_versions={"magnitude": mag - 1, "ft": ft}), new) == \
        f"method version magnitude v{mag - 1}→v{mag}"
    assert _diff(old_dict(new, method_versions={"magnitude": mag - 1, "ft": ft + 2}), new) == \
        f"method version ft v{ft + 2}→v{ft}, magnitude v{mag - 1}→v{mag}"
    # a method the old chain did not have is the chain's change, not a version change
    assert _diff(old_dict(new, methods=new.methods[:1], method_versions={"magnitude": 1}), new) == \
        f"method parameters now resolve to {' + '.join(new.methods)}"
    assert _diff(old_dict(new, ckpt={"tiny_var.safetensors": "cd" * 32}), new) == "checkpoint files changed"
    assert _diff(old_dict(new, ckpt=None), new) == "checkpoint files changed"
    unknown_here = dataclasses.replace(new, ckpt=None)          # files absent here: no claim about them
    assert _diff(old_dict(new), unknown_here) == "key changed"
    assert _diff(old_dict(new, protocol={"version": 0}), new) == "bench protocol changed"
    assert _diff(old_dict(new, sampling={**new.sampling, "cfg": 9.0}), new) == "default sampling changed"
    assert _diff({**old_dict(new), "sampling": None}, new) == "default sampling changed"
    assert _diff(old_dict(new, method_versions={"magnitude": mag - 1, "ft": ft}, protocol=None,
                          sampling={"cfg": 1.0}), new) == \
        f"method version magnitude v{mag - 1}→v{mag}; bench protocol changed; default sampling changed"


# --- staleness of a record -----------------------------------------------------------------------------

def test_a_record_is_current_until_its_request_lands_elsewhere():
    spec = today()
    st = staleness(rec(spec))
    assert not st.stale and st.reason == "" and st.current.key() == spec.key()
    old = rec(dataclasses.replace(spec, method_versions={"magnitude": 0}))
    st = staleness(old)
    assert st.stale and st.reason == "method version magnitude v0→v1" and st.current.key() == spec.key()
    # a record without a request (schema 1 upgraded) is asked again with its resolved chain
    bare = rec(dataclasses.replace(spec, requested=None))
    assert not staleness(bare).stale
    # the request's own sampling overrides are asked again too
    hot = today(sampling={"cfg": 3.0})
    assert not staleness(rec(hot)).stale and staleness(rec(hot)).current.sampling["cfg"] == 3.0
    # and its bench setting (a latency record's batch), read back from the recorded protocol
    lat = make_spec("tiny-var", "magnitude", bench="latency", n=3, need_ckpt=False, bench_args={"batch": 4})
    st = staleness(rec(lat))
    assert not st.stale and st.current.protocol["batch"] == 4


def test_records_that_cannot_be_asked_again_are_stale_with_the_first_line_of_why():
    spec = today()
    gone = rec(dataclasses.replace(spec, methods=("magnitude:sparsity=0.99",),
                                   requested={"methods": ["magnitude:sparsity=0.99"], "sampling": {}}))
    st = staleness(gone)
    assert st.stale and st.current is None
    assert st.reason == "cannot be rerun as recorded: magnitude: parameter sparsity=0.99 out of range [0.0, 0.9]"
    r = rec(spec)
    r["spec"]["model"] = "tiny-vax"
    st = staleness(r)
    assert st.stale and st.reason.startswith("cannot be rerun as recorded: unknown model 'tiny-vax'")
    assert "\n" not in st.reason


def test_checkpoint_identity_counts_only_where_it_can_be_known():
    spec = today()
    assert spec.ckpt is not None                                          # the shipped tiny checkpoints
    moved = rec(dataclasses.replace(spec, ckpt={"tiny_var.safetensors": "00" * 32}))
    assert staleness(moved).stale and staleness(moved).reason == "checkpoint files changed"
    # random weights name no file: the checkpoint is not compared
    random = rec(dataclasses.replace(spec, ckpt={RANDOM_CKPT: "torch.manual_seed(0)"}))
    assert not staleness(random).stale
    # the checkpoint folder of the paper world is absent here: everything else is compared
    paper = make_spec("var-d16", "magnitude", n=1000, need_ckpt=False)
    assert paper.ckpt is None
    synced = rec(dataclasses.replace(paper, ckpt={"var_d16.pth": "ab" * 32, "vae_ch160v4096z32.pth": "cd" * 32}))
    assert not staleness(synced).stale
    assert staleness(rec(dataclasses.replace(paper, ckpt={"var_d16.pth": "ab" * 32}, seed=0,
                                             method_versions={"magnitude": 0}))).stale


# --- finding records -----------------------------------------------------------------------------------

def test_records_are_found_by_key_and_stale_ones_of_the_same_request_listed():
    spec = today(seed=1)
    current = rec(spec, fid=1.0)
    old = rec(dataclasses.replace(spec, method_versions={"magnitude": 0}), fid=2.0)
    older = rec(dataclasses.replace(spec, protocol={"version": -1}), fid=3.0)
    # not the same request: another seed, n, model, world, chain as typed, sampling override, bench setting
    # (each with its own old version: the request is not part of a key, and records are keyed by run)
    others = [rec(dataclasses.replace(spec, seed=2, method_versions={"magnitude": 5})),
              rec(dataclasses.replace(spec, n=24, method_versions={"magnitude": 6})),
              rec(dataclasses.replace(spec, requested={"methods": ["magnitude:sparsity=0.4"], "sampling": {}},
                                      method_versions={"magnitude": 7})),
              rec(dataclasses.replace(spec, requested={"methods": ["magnitude"], "sampling": {"cfg": 2.0}},
                                      method_versions={"magnitude": 8})),
              rec(dataclasses.replace(spec, world="paper", model="var-d16", method_versions={"magnitude": 9})),
              rec(dataclasses.replace(spec, bench="shapes-mjhq", method_versions={"magnitude": 10}))]
    records = {r["run_id"]: r for r in [old, older, *others]}
    assert len(records) == 8
    found, stale = match_records([spec], records)
    assert found == {} and [r["run_id"] for r in stale[spec.key()]] == [old["run_id"], older["run_id"]]
    found, stale = match_records([spec], {**records, current["run_id"]: current})
    assert found == {spec.key(): current} and stale == {}                 # a current record: no stale list
    assert match_records([], records) == ({}, {})


def test_a_request_with_sampling_overrides_matches_only_the_same_overrides():
    hot = today(sampling={"cfg": 3.0})
    same = rec(dataclasses.replace(hot, method_versions={"magnitude": 0}))
    plain = rec(dataclasses.replace(today(), method_versions={"magnitude": 0}))
    found, stale = match_records([hot], {r["run_id"]: r for r in (same, plain)})
    assert found == {} and [r["run_id"] for r in stale[hot.key()]] == [same["run_id"]]


def test_a_schema_1_record_counts_its_resolved_chain_as_its_request():
    spec = today("magnitude:sparsity=0.4")
    legacy = rec(dataclasses.replace(spec, method_versions={"magnitude": 0}, requested=None))
    legacy["spec"]["requested"] = None
    found, stale = match_records([spec], {legacy["run_id"]: legacy})
    assert found == {} and list(stale) == []                              # its chain as resolved ≠ as typed
    spec2 = dataclasses.replace(spec, requested={"methods": list(spec.methods), "sampling": {}})
    found, stale = match_records([spec2], {legacy["run_id"]: legacy})
    assert [r["run_id"] for r in stale[spec2.key()]] == [legacy["run_id"]]


def test_without_checkpoint_identity_a_record_matches_on_every_other_field():
    paper = make_spec("var-d16", "magnitude", n=1000, need_ckpt=False)
    synced = rec(dataclasses.replace(paper, ckpt={"var_d16.pth": "ab" * 32}))
    found, stale = match_records([paper], {synced["run_id"]: synced})
    assert found == {paper.key(): synced} and stale == {}
    with_ckpt = dataclasses.replace(paper, ckpt={"var_d16.pth": "cd" * 32})   # known here: exact key only
    found, stale = match_records([with_ckpt], {synced["run_id"]: synced})
    assert found == {} and [r["run_id"] for r in stale[with_ckpt.key()]] == [synced["run_id"]]


@pytest.mark.parametrize("batch, candidate", [(1, True), (4, False)])
def test_latency_records_of_another_setting_are_not_stale_candidates(batch, candidate):
    spec = make_spec("tiny-var", "magnitude", bench="latency", n=3, need_ckpt=False, bench_args={"batch": 1})
    other = make_spec("tiny-var", "magnitude", bench="latency", n=3, need_ckpt=False, bench_args={"batch": batch})
    old = rec(dataclasses.replace(other, method_versions={"magnitude": 0}))
    found, stale = match_records([spec], {old["run_id"]: old})
    assert found == {} and (list(stale) == [spec.key()]) is candidate
