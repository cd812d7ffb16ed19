"""Loader states as plain data: the pipeline fingerprint, building and checking a state,
excluding documents, reading one lane's bytes, and merging the states of all processes."""

from __future__ import annotations

import json

import numpy as np
import pytest

import zephon_jax as zj
from zephon_jax.errors import PipelineError, StateError, StateMismatchError
from zephon_jax.state.global_state import (
    EXCLUDE,
    FINGERPRINT_FIELDS,
    SEEDS_GIVEN,
    STATE_FORMAT,
    STATE_VERSION,
    check_state,
    exclude,
    exclusion_of,
    fingerprint,
    lane_bytes,
    make_state,
    merge_states,
)

DOCS = [{"tokens": np.arange(n + 1, dtype=np.int32)} for n in range(10)]


def keep(record):
    return record


def small_fp(**changed: str) -> dict[str, str]:
    """A fingerprint of a pipeline with 4 lanes, with ``changed`` fields."""
    fp = {field: json.dumps([field]) for field in FINGERPRINT_FIELDS}
    fp.update(num_lanes="4", global_batch_size="8", seeds="[11]", **{SEEDS_GIVEN: "[3]"})
    fp.update(changed)
    return fp


def test_fingerprint_of_a_single_source_lists_every_field_in_order():
    ds = zj.Dataset.source(DOCS).shuffle(seed=3).batch(8, num_lanes=4)
    fp = fingerprint(ds)
    assert list(fp) == [*FINGERPRINT_FIELDS, SEEDS_GIVEN]
    assert fp == {
        "global_batch_size": "8",
        "num_lanes": "4",
        "sources": '["list(len=10)"]',
        "weights": "[]",
        "num_epochs": "[null]",
        "seeds": json.dumps([ds.sampler.describe()["shuffle_seed"]]),
        "operators": "[]",
        "transforms": "[[]]",
        SEEDS_GIVEN: "[3]",
    }
    assert ds.fingerprint() == fp
    unshuffled = fingerprint(zj.Dataset.source(DOCS).batch(8, num_lanes=4))
    assert unshuffled["seeds"] == "[null]" and unshuffled[SEEDS_GIVEN] == "[]"


def test_fingerprint_of_a_mixture_walks_its_components_and_operators():
    a = zj.Dataset.source(DOCS).map(keep)
    b = zj.Dataset.source(DOCS[:5]).repeat(2)
    ds = zj.Dataset.mix([a, b], [1, 3]).shuffle(seed=7).pack(8).batch(2)
    fp = fingerprint(ds)
    mix = ds.sampler.describe()
    seeds = [mix["order_seed"]] + [c["shuffle_seed"] for c in mix["mix"]]
    assert fp["global_batch_size"] == "2" and fp["num_lanes"] == "2"
    assert fp["sources"] == '["list(len=10)", "list(len=5)"]'
    assert fp["weights"] == "[[0.25, 0.75]]"
    assert fp["num_epochs"] == "[null, 2]"
    assert fp["seeds"] == json.dumps(seeds) and len(set(seeds)) == 3
    assert fp["operators"] == json.dumps(["pack(seq_len=8, method='best_fit', num_bins=32)"])
    # each component's, then the mixture's, then the one stage's transforms
    assert fp["transforms"] == json.dumps([[f"map({__name__}.keep)"], [], [], []])
    assert fp[SEEDS_GIVEN] == "[7]"


def test_fingerprint_of_a_batch_ramp_shows_its_schedule():
    ds = zj.Dataset.source(DOCS).batch({0: 4, 10: 8}, num_lanes=4)
    assert fingerprint(ds)["global_batch_size"] == '{"0": 4, "10": 8}'


def test_make_state_builds_the_plain_form_with_sorted_lanes():
    state = make_state(small_fp(), 5, {2: b"\x01\x02", 0: b"\xff"})
    assert state["format"] == STATE_FORMAT == "zephon_jax.state.global_state"
    assert state["version"] == STATE_VERSION == 1
    assert state["step"] == 5 and state["fingerprint"] == small_fp()
    assert list(state["lanes"]) == ["0", "2"]
    assert state["lanes"]["2"].dtype == np.uint8 and state["lanes"]["2"].tolist() == [1, 2]
    assert EXCLUDE not in state
    check_state(state, small_fp())
    with_exclusion = make_state(small_fp(), 5, {}, exclude=(("a", 3), (1, 0)))
    assert with_exclusion[EXCLUDE] == [["a", 3], [1, 0]]


def test_lane_bytes_reads_every_saved_form_and_names_the_lanes_covered():
    state = make_state(small_fp(), 1, {0: b"ab", 1: b"c", 3: b"d"})
    assert lane_bytes(state, 0) == b"ab"
    state["lanes"]["1"] = [99]  # as JSON gives it back
    state["lanes"]["3"] = b"d"
    assert lane_bytes(state, 1) == b"c" and lane_bytes(state, 3) == b"d"
    with pytest.raises(StateError, match=r"does not cover lane 2 \(it covers lanes 0-1, 3\)"):
        lane_bytes(state, 2)
    with pytest.raises(StateError, match=r"covers lanes none\); .*merge_states"):
        lane_bytes(make_state(small_fp(), 1, {}), 0)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda s: s.pop("lanes"), r"has no 'lanes' entry; it is not a zephon_jax loader state"),
        (lambda s: s.update(version=2), r"has version 2; this zephon_jax reads version 1"),
        (lambda s: s.update(format="x"), r"format is 'x', not 'zephon_jax\.state\.global_state'"),
        (lambda s: s.update(fingerprint=[]), r"'fingerprint' is a list, not a dict of str"),
        (lambda s: s["fingerprint"].pop("weights"), r"fingerprint has no 'weights' field"),
        (lambda s: s["fingerprint"].update(seeds=[11]), r"field 'seeds' is a list, not a str"),
        (lambda s: s.update(step=-1), r"'step' is -1 \(int\); it must be an int >= 0"),
        (lambda s: s.update(step=True), r"'step' is True \(bool\)"),
        (lambda s: s.update(lanes=[1]), r"'lanes' is a list, not a dict from lane to bytes"),
        (lambda s: s["lanes"].update({"01": b""}), r"has the key '01'; lane keys are lane"),
        (lambda s: s["lanes"].update({"4": b""}), r"has lane 4, but its pipeline has 4 lanes"),
        (lambda s: s["lanes"].update({"1": [256]}), r"lanes\['1'\] is list; a lane state is"),
        (
            lambda s: s["lanes"].update({"1": np.zeros(2, np.int32)}),
            r"lanes\['1'\] is a int32 array of shape \(2,\)",
        ),
        (lambda s: s.update(exclude="a"), r"'exclude' entry must list \(label, record\) pairs"),
        (lambda s: s.update(exclude=[["a", -1]]), r"holds \['a', -1\]: a label is a source's"),
    ],
)
def test_check_state_names_the_malformed_entry(change, match):
    state = make_state(small_fp(), 2, {0: b"x", 3: b"y"})
    check_state(state)
    change(state)
    with pytest.raises(StateError, match=match):
        check_state(state)


def test_check_state_refuses_what_is_not_a_dict():
    with pytest.raises(StateError, match="a loader state is a dict; got list"):
        check_state([1])


@pytest.mark.parametrize("field", FINGERPRINT_FIELDS)
def test_a_fingerprint_mismatch_names_the_field_that_differs(field):
    state = make_state(small_fp(), 0, {})
    other = small_fp(**{field: '"other"'})
    with pytest.raises(StateMismatchError) as info:
        check_state(state, other)
    error = info.value
    assert error.field == field
    assert (error.saved, error.current) == (small_fp()[field], '"other"')
    assert f"the state's pipeline {field!r} differs" in str(error)


def test_the_first_differing_field_is_named_first():
    state = make_state(small_fp(), 0, {})
    with pytest.raises(StateMismatchError) as info:
        check_state(state, small_fp(operators="[]", num_lanes="8"))
    assert info.value.field == "num_lanes"


def test_a_seed_mismatch_shows_the_seeds_given_to_shuffle():
    state = make_state(small_fp(), 0, {})
    with pytest.raises(StateMismatchError) as info:
        check_state(state, small_fp(seeds="[12]", **{SEEDS_GIVEN: "[4, 5]"}))
    assert "state:    shuffle(3)\n  pipeline: shuffle seeds [4, 5]\n" in str(info.value)
    with pytest.raises(StateMismatchError) as info:
        check_state(state, small_fp(seeds="[null]", **{SEEDS_GIVEN: "[]"}))
    assert "pipeline: not shuffled\n" in str(info.value)
    state["fingerprint"][SEEDS_GIVEN] = "{altered"  # unreadable: the fingerprint's values shown
    with pytest.raises(StateMismatchError) as info:
        check_state(state, small_fp(seeds="[12]"))
    assert "state:    '[11]'\n  pipeline: '[12]'\n" in str(info.value)


def test_exclude_adds_sorted_pairs_without_repeats_and_keeps_the_state():
    state = make_state(small_fp(), 3, {0: b"x"}, exclude=(("b", 1),))
    out = exclude(state, [("a", 9), (np.int64(2), 0), ("b", 1), ["a", 2]])
    assert out[EXCLUDE] == [[2, 0], ["a", 2], ["a", 9], ["b", 1]]
    assert exclusion_of(out) == ((2, 0), ("a", 2), ("a", 9), ("b", 1))
    assert state[EXCLUDE] == [["b", 1]]  # a new state; the given one is unchanged
    assert out["step"] == 3 and out["lanes"] is state["lanes"]
    assert exclusion_of(make_state(small_fp(), 3, {})) == ()


@pytest.mark.parametrize(
    "documents, match",
    [
        ("ab", r"documents must list \(label, record\) pairs; got str"),
        ([("a", 1, 2)], r"holds \('a', 1, 2\), not a \(label, record\) pair"),
        ([(-1, 0)], r"holds \(-1, 0\): a label is a source's label \(str\) or index"),
        ([("a", 1.0)], r"holds \('a', 1\.0\): a label"),
    ],
)
def test_exclude_refuses_documents_that_are_not_pairs(documents, match):
    with pytest.raises(PipelineError, match=match):
        exclude(make_state(small_fp(), 0, {}), documents)


def process_states(ds, processes: int, steps: int) -> list[dict]:
    states = []
    for process in range(processes):
        it = iter(zj.Loader(ds, process_index=process, process_count=processes))
        for _ in range(steps):
            next(it)
        states.append(it.get_state())
    return states


def test_merging_two_processes_gives_the_one_process_state():
    ds = zj.Dataset.source(DOCS).shuffle(seed=1).pack(10).batch(4)
    first, second = process_states(ds, 2, steps=3)
    assert sorted(first["lanes"]) == ["0", "1"] and sorted(second["lanes"]) == ["2", "3"]
    merged = merge_states([second, first])
    (whole,) = process_states(ds, 1, steps=3)
    assert merged["step"] == whole["step"] == 3
    assert (
        merged["fingerprint"] == whole["fingerprint"]
        and merged["fingerprint"] is not (second["fingerprint"])
    )
    assert list(merged["lanes"]) == ["0", "1", "2", "3"]
    for lane in range(4):
        assert lane_bytes(merged, lane) == lane_bytes(whole, lane)
    restored = iter(zj.Loader(ds))
    restored.set_state(merged)
    reference = iter(zj.Loader(ds))
    for _ in range(3):
        next(reference)
    assert next(restored)["tokens"].tolist() == next(reference)["tokens"].tolist()


def test_merge_takes_lanes_in_any_saved_form_and_sorts_them_by_number():
    fp = small_fp(num_lanes="12")
    a = make_state(fp, 4, {10: b"\x0a", 2: b"\x02"})
    b = make_state(fp, 4, {2: b"\x02"})
    b["lanes"]["11"] = [11]
    merged = merge_states([a, b])
    assert list(merged["lanes"]) == ["2", "10", "11"]
    assert [v.tolist() for v in merged["lanes"].values()] == [[2], [10], [11]]


def test_merge_keeps_the_exclusion_the_states_share():
    pairs = (("a", 3), (0, 7))
    states = [make_state(small_fp(), 2, {lane: bytes([lane])}, pairs) for lane in range(4)]
    merged = merge_states(states)
    assert merged[EXCLUDE] == [["a", 3], [0, 7]]
    assert exclusion_of(merged) == ((0, 7), ("a", 3))
    states[3] = make_state(small_fp(), 2, {3: b"\x03"}, (("a", 3),))
    with pytest.raises(StateError, match="state 3 excludes other documents than state 0"):
        merge_states(states)


def test_merge_refuses_states_of_other_pipelines_steps_or_lanes():
    with pytest.raises(StateError, match="merge_states needs at least one state"):
        merge_states([])
    base = make_state(small_fp(), 2, {0: b"x"})
    with pytest.raises(StateMismatchError) as info:
        merge_states([base, make_state(small_fp(weights="[[1.0]]"), 2, {1: b"y"})])
    assert info.value.field == "weights"
    with pytest.raises(StateError, match="state 1 is at step 3 but state 0 at step 2"):
        merge_states([base, make_state(small_fp(), 3, {1: b"y"})])
    with pytest.raises(StateError, match="states disagree on lane 0"):
        merge_states([base, make_state(small_fp(), 2, {0: b"z"})])
    altered = make_state(small_fp(), 2, {1: b"y"})
    altered["version"] = 7
    with pytest.raises(StateError, match="has version 7; this zephon_jax reads version 1"):
        merge_states([base, altered])
