"""The functional operator contract: ``lineage_operator`` runs pure ``init/step/flush/make``
over an immutable carry and derives the rest. Its saved form is the carry's structure with
the held elements as pointers (a round trip through bytes continues identically; an altered
one is refused); a carry that is not plain data is refused naming the type; outputs made
from inputs get their record from ``make`` when stepping and when a lane is restored;
passthrough is inferred; provenance defaults to every input, whole."""

from __future__ import annotations

import dataclasses
import functools
import pickle
from typing import NamedTuple

import numpy as np
import pytest

import zephon_jax as zj
from zephon_jax.core.lineage import Element, derived
from zephon_jax.engine.lane import Lane, LanePlan
from zephon_jax.engine.provenance import row_pieces
from zephon_jax.engine.restore import set_lane_state
from zephon_jax.errors import PipelineError, StateError
from zephon_jax.operators.base import Saved
from zephon_jax.operators.contract import PASSED, lineage_operator, made_from
from zephon_jax.state import codec


class Joined(NamedTuple):
    held: tuple = ()
    tokens: int = 0


def join_step(min_len, carry, element):
    carry = Joined(carry.held + (element,), carry.tokens + len(element.data["tokens"]))
    if carry.tokens < min_len:
        return carry, []
    return Joined(), [made_from(carry.held)]


def join_flush(carry):
    return Joined(), [made_from(carry.held)] if carry.held else []


MAKES: list = []  # the recipes ``join_make`` was called with, in order


def join_make(recipe, records):
    MAKES.append(recipe)
    return {"tokens": np.concatenate([r["tokens"] for r in records])}


def join_init(lane):
    return Joined()


def join(min_len=20):
    step = functools.partial(join_step, min_len)
    return lineage_operator("join", join_init, step, join_flush, join_make, max_held=min_len)


def elements(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return [
        Element({"tokens": rng.integers(1, 99, int(k)).astype(np.int32)}, p)
        for p, k in enumerate(rng.integers(1, 12, n))
    ]


def run(op, items, cuts=()):
    """All outputs of ``op`` over ``items``; before each cut the carry goes through bytes."""
    by_lineage = {e.lineage: e for e in items}
    carry, out = op.init(0), []
    for i, element in enumerate(items):
        if i in cuts:
            held, aux = op.save(carry)
            lineages, aux = codec.decode(codec.encode((tuple(e.lineage for e in held), aux)))
            carry = op.load(Saved(tuple(by_lineage[x] for x in lineages), aux), 0)
        carry, emitted = op.step(carry, element)
        out += emitted
    return out + op.flush(carry)[1]


# ----- the saved form -------------------------------------------------------------------


def test_outputs_are_made_by_make_and_point_to_their_inputs():
    items = elements()
    out = run(join(), items)
    assert sum(len(e.data["tokens"]) for e in out) == sum(len(e.data["tokens"]) for e in items)
    parents = [p for e in out for p in e.lineage[0]]
    assert parents == [e.lineage for e in items]  # every input once, in order
    for e in out:
        assert e.lineage[1] is None and len(e.data["tokens"]) >= 20 or e is out[-1]


def test_the_saved_carry_holds_pointers_and_continues_the_same_outputs():
    items = elements()
    expected = run(join(), items)
    op = join()
    carry = op.init(0)
    for element in items[:3]:
        carry, _ = op.step(carry, element)
    held, aux = op.save(carry)
    assert held == carry.held  # the elements themselves, stored as their lineages
    assert b"tokens" not in codec.encode(aux)  # no record data in the rest
    for cuts in [(1,), (5, 17), tuple(range(40))]:
        got = run(join(), items, cuts)
        assert [e.lineage for e in got] == [e.lineage for e in expected]
        assert all(
            a.data["tokens"].tobytes() == b.data["tokens"].tobytes() for a, b in zip(got, expected)
        )


class Window(NamedTuple):
    recent: tuple
    stats: Stats
    seen: dict


@dataclasses.dataclass(frozen=True)
class Stats:
    total: int
    last: np.ndarray


def rich_init(lane):
    return Window((), Stats(0, np.zeros(2, np.int32)), {})


def rich_step(carry, element):
    """Keeps the last three elements, nested stats and a dict holding elements and values."""
    tokens = element.data["tokens"]
    stats = Stats(carry.stats.total + len(tokens), tokens[:2].copy())
    seen = {**carry.seen, "last": element, "lengths": (*carry.seen.get("lengths", ()), len(tokens))}
    recent = (carry.recent + (element,))[-3:]
    return Window(recent, stats, seen), [element]


def test_nested_records_dicts_and_arrays_round_trip():
    op = lineage_operator("rich", rich_init, rich_step)
    items = elements(12)
    carry = op.init(0)
    for element in items[:7]:
        carry, _ = op.step(carry, element)
    held, aux = op.save(carry)
    assert [e.lineage for e in held] == [4, 5, 6, 6]
    lineages, aux = codec.decode(codec.encode((tuple(e.lineage for e in held), aux)))
    restored = op.load(Saved(tuple(items[x] for x in lineages), aux), 0)
    assert type(restored) is Window and type(restored.stats) is Stats
    assert restored.recent == carry.recent and restored.seen == carry.seen
    assert restored.stats.total == carry.stats.total
    assert restored.stats.last.tobytes() == carry.stats.last.tobytes()


@pytest.mark.parametrize(
    "held, aux, problem",
    [
        (0, None, "fewer than its structure needs"),
        (2, None, "more than its structure needs"),
        (1, ("x",), "is no carry node"),
        (1, (4, ((2, 3),)), "does not fit the carry init"),
    ],
)
def test_an_altered_saved_carry_is_refused(held, aux, problem):
    op = join()
    carry = op.init(0)
    carry, _ = op.step(carry, elements()[0])
    saved = op.save(carry)
    assert len(saved.held) == 1
    items = tuple(elements()[:held])
    with pytest.raises(StateError, match=f"(?s)the saved carry of join.*{problem}.*altered"):
        op.load(Saved(items, saved.aux if aux is None else aux), 0)


# ----- the carry is checked ------------------------------------------------------------


@dataclasses.dataclass
class Mutable:
    n: int


class Other(NamedTuple):
    n: int


@pytest.mark.parametrize(
    "bad, named, fix",
    [
        ({1, 2}, r"holds a value of type set at carry\.held", "sorted tuples"),
        (object(), r"holds a value of type object at carry\.held", "plain data"),
        (Mutable(1), "mutable dataclass Mutable", "frozen=True"),
        (Other(1), r"holds a value of type Other at carry\.held", "where init"),
        ({3: 1}, "dict key 3", "string keys"),
        (np.array(["a"]), "numpy <U1", "numeric dtype"),
    ],
)
def test_a_carry_that_is_not_plain_data_is_refused(bad, named, fix):
    def step(carry, element):
        return Joined((bad,), 0), []

    op = lineage_operator("bad", join_init, step)
    with pytest.raises(PipelineError, match=f"(?s)operator 'bad'.*{named}.*{fix}"):
        op.step(op.init(0), elements()[0])


def test_a_bad_carry_in_a_pipeline_names_the_record():
    def step(carry, element):
        return {"held": {element.lineage}}, [element]

    op = lineage_operator("bad", lambda lane: {}, step)
    docs = [{"tokens": np.arange(3, dtype=np.int32)}] * 8
    it = iter(zj.Loader(zj.Dataset.source(docs).apply(op).batch(2)))
    with pytest.raises(
        PipelineError, match=r"(?s)holds a value of type set at carry\['held'\].*record 0"
    ):
        next(it)


def test_malformed_outputs_and_steps_are_refused():
    op = lineage_operator("plain", join_init, lambda c, e: (c, [{"tokens": 1}]))
    with pytest.raises(PipelineError, match="returned a dict as an output; an output is"):
        op.step(op.init(0), elements()[0])
    op = lineage_operator("nomake", join_init, lambda c, e: (c, [made_from([e])]))
    with pytest.raises(PipelineError, match="has no make"):
        op.step(op.init(0), elements()[0])
    op = lineage_operator("single", join_init, lambda c, e: [e])
    with pytest.raises(PipelineError, match=r"single\.step must return \(carry, outputs\)"):
        op.step(op.init(0), elements()[0])
    with pytest.raises(PipelineError, match="made_from.inputs. takes the input elements"):
        made_from([{"tokens": 1}])


# ----- derived: passthrough, remake, trace, restore ------------------------------------


def test_passthrough_is_inferred_from_make():
    keep = lineage_operator("keep", join_init, lambda c, e: (c, [e]))
    assert keep.passthrough
    element = elements()[0]
    assert keep.step(keep.init(0), element)[1] == [element]
    assert not join().passthrough


def test_an_input_passed_through_an_operator_that_makes_outputs_points_to_it():
    def step(carry, element):
        if len(element.data["tokens"]) > 6:
            return carry, [element]  # long enough: unchanged
        return carry, [made_from([element], "doubled")]

    def make(recipe, records):
        return {"tokens": np.tile(records[0]["tokens"], 2)}

    op = lineage_operator("mixed", join_init, step, make=make)
    items = elements()
    out = run(op, items)
    for e, source in zip(out, items):
        assert e.lineage[0] == (source.lineage,)
        assert op.remake(e.lineage[1], [source.data])["tokens"].tobytes() == (
            e.data["tokens"].tobytes()
        )
    assert {e.lineage[1] for e in out} == {PASSED, "doubled"}
    assert op.trace(PASSED, (7,), 2, 5) == [(7, 2, 5, None)]


def test_trace_defaults_to_every_input_whole_and_takes_a_trace():
    assert join().trace(None, (1, 2), 0, 4) == [(1, None, None, None), (2, None, None, None)]

    def first_half(recipe, parents, start, stop):
        return [(parents[0], 0, 3, None)]

    op = lineage_operator("t", join_init, join_step, make=join_make, trace=first_half)
    assert op.trace(None, (1, 2), 0, 4) == [(1, 0, 3, None)]
    lineage = derived((derived((5,), None), 6), None)
    assert [(p.lineage, p.start) for p in row_pieces([op, op], lineage)] == [(5, 0)]


def test_a_restored_lane_remakes_its_outputs_with_make():
    docs = [
        {"tokens": np.arange(k, dtype=np.int32) + 100 * k} for k in np.tile([3, 5, 7, 2, 9], 20)
    ]
    ds = zj.Dataset.source(docs).apply(join(16)).split(16).pack(16).batch(4)
    plan = LanePlan(ds)
    lane = Lane(plan, 0)
    for _ in range(3):
        lane.take(4)
    state = lane.get_state()
    restored = Lane(plan, 0)
    MAKES.clear()
    set_lane_state(restored, state)
    assert MAKES, "restoring the rows in flight must call make"
    for _ in range(4):
        for a, b in zip(restored.take(4), lane.take(4)):
            assert a.lineage == b.lineage
            assert all(a.data[k].tobytes() == b.data[k].tobytes() for k in b.data)


def test_describe_names_the_functions_and_their_parameters():
    assert "join_step, 20" in join(20).describe() and join(20).describe() != join(30).describe()
    op = lineage_operator("named", join_init, join_step, describe="named(x=1)", carry_bound="3")
    assert op.describe() == "named(x=1)" and op.carry_bound() == "3"
    assert isinstance(op, zj.LineageOperator)


def test_an_operator_of_module_level_functions_pickles_for_workers():
    op = join(20)
    op.template()
    copy = pickle.loads(pickle.dumps(op))
    items = elements()
    assert copy.describe() == op.describe()
    assert [e.lineage for e in run(copy, items, cuts=(3, 9))] == [e.lineage for e in run(op, items)]
