"""Each operator alone, and a user-defined one: E2 across process counts and resumes,
plus the operator's own contract."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from pipelines import (
    assert_batches_equal,
    join_flush,
    join_init,
    join_make,
    join_step,
    make_docs,
    resume_across,
    run_topology,
    take,
)

import zephon_jax as zj

STEPS = 24


def repeat_twice(record):
    return [record, {"tokens": record["tokens"][::-1].copy()}]


def jitter(record, rng):
    return {
        "tokens": record["tokens"] + rng.integers(0, 3, size=len(record["tokens"])).astype(np.int32)
    }


def crop_pad_16(record):
    tokens = record["tokens"][:16]
    return {"tokens": np.pad(tokens, (0, 16 - len(tokens)))}


class RunningSumEmitter(zj.Operator):
    """Keeps a running token count; emits a record every time a multiple of 50 is crossed."""

    def init(self):
        return {"total": 0, "held": []}

    def step(self, carry, record):
        carry["held"].append(record["tokens"][:8].copy())
        before, carry["total"] = carry["total"], carry["total"] + len(record["tokens"])
        if carry["total"] // 50 > before // 50:
            held, carry["held"] = carry["held"], []
            out = np.concatenate(held)[:16]
            return carry, [{"tokens": np.pad(out, (0, 16 - len(out))).astype(np.int32)}]
        return carry, []

    def flush(self, carry):
        return carry, []


def join_short(min_len):
    step = functools.partial(join_step, min_len)
    return zj.lineage_operator("join_short", join_init, step, join_flush, join_make)


def pipelines():
    docs = make_docs(200, 90, seed=4)
    src = zj.Dataset.source(docs).shuffle(11)
    return {
        "split": src.split(16).map(crop_pad_16).batch(8),
        "first_fit": src.pack(96, method="first_fit", num_bins=4).batch(8),
        "best_fit": src.pack(96, method="best_fit", num_bins=4).batch(8),
        "concat": src.pack(64, method="concat").batch(8),
        "window_shuffle": src.map(crop_pad_16).window_shuffle(5, seed=2).batch(8),
        "flat_map": src.flat_map(repeat_twice).map(crop_pad_16).batch(8),
        "random_map": src.random_map(jitter, seed=8).map(crop_pad_16).batch(8),
        "user_operator": src.apply(RunningSumEmitter()).batch(8),
        "lineage_operator": src.apply(join_short(120)).split(48).pack(48).batch(8),
    }


@pytest.fixture(scope="module", params=sorted(pipelines()))
def case(request):
    ds = pipelines()[request.param]
    return ds, take(iter(zj.Loader(ds)), STEPS)


@pytest.mark.parametrize("process_count", [2, 8])
def test_each_operator_is_identical_across_process_counts(case, process_count):
    ds, expected = case
    assert_batches_equal(run_topology(ds, process_count, STEPS), expected)


@pytest.mark.parametrize("restore_procs", [2, 8])
def test_each_operator_resumes_from_a_merged_state(case, restore_procs):
    ds, expected = case
    assert_batches_equal(resume_across(ds, STEPS, 9, 4, restore_procs), expected[9:])


def test_a_lineage_operator_state_holds_pointers_not_records():
    """Records three times the bytes (same lengths), same rows: the same lane states."""
    docs = make_docs(200, 90, seed=4)
    wide = [{"tokens": d["tokens"].astype(np.int64), "w": np.ones(len(d["tokens"]))} for d in docs]

    def lane_states(records):
        ds = zj.Dataset.source(records).shuffle(11).apply(join_short(120)).split(48).pack(48)
        it = iter(zj.Loader(ds.batch(8)))
        take(it, 5)
        return {lane: bytes(data) for lane, data in it.get_state()["lanes"].items()}

    narrow = lane_states(docs)
    assert lane_states(wide) == narrow
    assert max(map(len, narrow.values())) < 4096  # (rows made ahead: about one block)


def test_split_pieces_are_bounded_and_cover_each_document():
    docs = [{"tokens": np.arange(n, dtype=np.int32)} for n in (5, 33, 16, 0, 17)]
    pieces = [e.data["tokens"] for e in _elements(zj.Dataset.source(docs).repeat(1).split(16))]
    # Every piece is as long as it can be: full pieces of 16, then the remainder.
    assert [len(p) for p in pieces] == [5, 16, 16, 1, 16, 16, 1]
    starts = [0, 1, 4, 5]  # the pieces of each non-empty document, in order
    for doc, lo, hi in zip([d for d in docs if len(d["tokens"])], starts, starts[1:] + [7]):
        np.testing.assert_array_equal(np.concatenate(pieces[lo:hi]), doc["tokens"])
    ds = zj.Dataset.source(docs).repeat(1).split(16).map(crop_pad_16).batch(1)
    rows = [b["tokens"][0] for b in zj.Loader(ds)]
    assert len(rows) == 1 + 3 + 1 + 2
    np.testing.assert_array_equal(rows[1], np.arange(16))
    np.testing.assert_array_equal(rows[3], np.pad(np.arange(32, 33), (0, 15)))


@pytest.mark.parametrize("method", ["first_fit", "best_fit", "concat"])
def test_packed_rows_follow_grain_layout(method):
    docs = make_docs(60, 40, seed=6)
    ds = zj.Dataset.source(docs).repeat(1).pack(64, method=method).batch(2, num_lanes=1)
    seen = []
    for batch in zj.Loader(ds):
        for tokens, seg, pos in zip(
            batch["tokens"], batch["tokens_segment_ids"], batch["tokens_positions"]
        ):
            assert seg.dtype == np.int32 and pos.dtype == np.int32
            n_seg = seg.max()
            # 1-based contiguous segments, then zero padding.
            used = int((seg > 0).sum())
            assert (seg[:used] > 0).all() and (seg[used:] == 0).all()
            assert list(np.unique(seg[:used])) == list(range(1, n_seg + 1))
            for s in range(1, n_seg + 1):
                span = np.flatnonzero(seg == s)
                np.testing.assert_array_equal(pos[span], np.arange(len(span)))
                seen.append(tokens[span])
            assert (tokens[used:] == 0).all() and (pos[used:] == 0).all()
    packed = np.concatenate(seen)
    original = np.concatenate([d["tokens"] for d in docs])
    # Every token appears at most once; only the final incomplete batch (< 1 row here) is
    # dropped when a finite input ends.
    values, counts = np.unique(original, return_counts=True)
    got = dict(zip(*np.unique(packed, return_counts=True)))
    assert all(got.get(v, 0) <= c for v, c in zip(values, counts))
    assert 0 <= len(original) - len(packed) < 64


def test_best_fit_default_fill_is_high():
    docs = make_docs(2000, 2048, seed=1)
    ds = zj.Dataset.source(docs).shuffle(0).pack(2048).batch(8)
    batches = take(iter(zj.Loader(ds)), 60)
    fill = np.mean([(b["tokens_segment_ids"] > 0).mean() for b in batches[10:]])
    assert fill > 0.95


def test_window_shuffle_is_a_permutation_within_the_stream():
    src = [{"x": np.int64(i)} for i in range(64)]
    ds = zj.Dataset.source(src).repeat(1).window_shuffle(8, seed=1).batch(1)
    out = [int(b["x"][0]) for b in zj.Loader(ds)]
    assert sorted(out) == list(range(64))
    assert out != list(range(64))
    # No element leaves before the window holds the 7 that arrive after it ...
    assert max(v - i for i, v in enumerate(out)) <= 7
    # ... and some stay in the window longer than a window's length.
    assert max(i - v for i, v in enumerate(out)) > 7


def test_random_map_rng_depends_on_position_not_process():
    src = zj.Dataset.source([{"tokens": np.zeros(4, np.int32)}] * 12)
    ds = src.random_map(jitter, seed=1).batch(4)
    expected = take(iter(zj.Loader(ds)), 3)
    # The same rows on 2 and 4 processes, and after a resume on another process count ...
    for procs in (2, 4):
        assert_batches_equal(run_topology(ds, procs, 3), expected)
    assert_batches_equal(resume_across(ds, 3, 1, 1, 4), expected[1:])
    # ... but not the same noise for every position (all records are equal) or seed.
    rows = np.concatenate([x["tokens"] for x in expected])
    assert len({r.tobytes() for r in rows}) > 1
    b = take(iter(zj.Loader(src.random_map(jitter, seed=2).batch(4))), 3)
    assert any(x["tokens"].tobytes() != y["tokens"].tobytes() for x, y in zip(expected, b))


def test_grain_transform_objects_are_accepted():
    import grain

    class Double(grain.transforms.Map):
        def map(self, element):
            return {"tokens": element["tokens"] * 2}

    class Noise(grain.transforms.RandomMap):
        def random_map(self, element, rng):
            return {"tokens": element["tokens"] + rng.integers(0, 2, size=4).astype(np.int32)}

    class NonEmpty(grain.transforms.Filter):
        def filter(self, element):
            return element["tokens"].sum() > 0

    src = [{"tokens": np.full(4, i, np.int32)} for i in range(10)]
    ds = zj.Dataset.source(src).map(Double()).random_map(Noise(), seed=1).filter(NonEmpty())
    batches = take(iter(zj.Loader(ds.batch(3))), 4)
    assert all(b["tokens"].shape == (3, 4) for b in batches)
    assert_batches_equal(run_topology(ds.batch(3), 3, 4), batches)


def test_split_cuts_every_sequence_field_of_the_record_length():
    record = {
        "tokens": list(range(10)),  # a list key: cut, not copied whole into every piece
        "labels": tuple(range(100, 110)),
        "mask": np.arange(10, dtype=np.int8),
        "embedding": np.arange(20, dtype=np.float32).reshape(10, 2),
        "title": "ten chars!",  # a string as long as the record: copied, never cut
        "doc_id": 7,
        "other": np.arange(3),  # another length: copied
    }
    ds = zj.Dataset.source([record]).repeat(1).split(4)
    pieces = [e.data for e in _elements(ds)]
    assert [p["tokens"] for p in pieces] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [p["labels"] for p in pieces] == [(100, 101, 102, 103), (104, 105, 106, 107), (108, 109)]
    np.testing.assert_array_equal(np.concatenate([p["mask"] for p in pieces]), record["mask"])
    assert [p["embedding"].shape for p in pieces] == [(4, 2), (4, 2), (2, 2)]
    np.testing.assert_array_equal(
        np.concatenate([p["embedding"] for p in pieces]), record["embedding"]
    )
    for p in pieces:
        assert p["title"] == "ten chars!" and p["doc_id"] == 7
        np.testing.assert_array_equal(p["other"], np.arange(3))


def _elements(ds):
    """Every element a one-lane pipeline's last operator emits, in order."""
    from zephon_jax.engine.lane import Lane, LanePlan

    lane = Lane(LanePlan(ds.batch(1)), 0)
    out = []
    while (rows := lane.take(1)) is not None:
        out.extend(rows)
    return out
