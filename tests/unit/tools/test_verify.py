"""``zephon-jax verify``'s pieces: topologies parsed and checked against the batch, batches
compared row by row, the report, and a whole check on a tiny pipeline (in this process,
without workers; tests/integration/test_cli_runs.py runs it with worker processes)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import zephon_jax as zj
from zephon_jax.errors import PipelineError
from zephon_jax.tools.verify import (
    Check,
    Difference,
    check_topologies,
    compare_batches,
    concat_batches,
    format_checks,
    parse_topologies,
    verify,
    workers_available,
)

DOCS = [{"tokens": np.arange(n, dtype=np.int32) + 10 * n} for n in (3, 5, 2, 7, 4, 6)]


def tiny(batch_size=4):
    return zj.Dataset.source(DOCS).shuffle(3).split(4).pack(4).batch(batch_size)


def test_topologies_parse_with_workers_optional():
    assert parse_topologies("1x0,2x1,4x2") == [(1, 0), (2, 1), (4, 2)]
    assert parse_topologies(" 3 , 2x5") == [(3, 0), (2, 5)]


@pytest.mark.parametrize("text", ["0x1", "2y1", "x2", "1x", "", "1x0,,2x0", "-1x0"])
def test_a_malformed_topology_is_named(text):
    with pytest.raises(PipelineError, match="is not PROCESSESxWORKERS.*1x0,2x1,4x2"):
        parse_topologies(text)


def test_topologies_must_divide_the_batch():
    batched = tiny(batch_size=6)
    check_topologies(batched, [(1, 0), (2, 3), (3, 0), (6, 1)])
    with pytest.raises(PipelineError) as info:
        check_topologies(batched, [(2, 0), (4, 1), (5, 0)])
    assert str(info.value) == (
        "topology 4x1, 5x0 cannot hold a global batch of 6 rows: every process holds the "
        "same number of rows, so the process count must divide 6; use 1, 2, 3, 6 processes"
    )


def test_a_ramp_must_be_divided_at_every_size():
    ramp = zj.Dataset.source(DOCS).split(4).pack(4).batch({0: 4, 2: 6}, num_lanes=2)
    check_topologies(ramp, [(2, 0)])
    with pytest.raises(PipelineError, match=r"of \[4, 6\] rows \(a ramp\).*divide 2; use 1, 2 "):
        check_topologies(ramp, [(4, 0)])


def test_differences_say_where():
    assert str(Difference(3, 1, "tokens", "values differ")) == (
        "step 3, row 1, field 'tokens': values differ"
    )
    assert str(Difference(0, None, None, "the run ended earlier")) == (
        "step 0: the run ended earlier"
    )
    assert Check("1x0", 0, 4, None).identical
    assert not Check("1x0", 0, 4, Difference(1, 0, None, "x")).identical
    assert not Check("1x0", 0, 4, None, error="PipelineError: no").identical


def test_processes_batches_concatenate_in_process_order():
    parts = [{"a": np.array([[1, 2]]), "b": np.array([5])}, {"a": [[3, 4]], "b": [6]}]
    got = concat_batches(parts)
    assert got["a"].tolist() == [[1, 2], [3, 4]] and got["b"].tolist() == [5, 6]
    assert concat_batches([np.array([1, 2]), np.array([3])]).tolist() == [1, 2, 3]


def test_compare_finds_the_earliest_differing_row_over_all_fields():
    want = {"x": np.zeros((4, 3), np.int32), "y": np.ones((4, 2), np.int32)}
    got = {k: v.copy() for k, v in want.items()}
    assert compare_batches(5, got, want) is None
    got["x"][3, 0] = 1
    got["y"][1, 1] = 7
    assert compare_batches(5, got, want) == Difference(5, 1, "y", "values differ")
    # Arrays without fields, and a shape or dtype change (no row to name).
    assert compare_batches(2, np.array([1, 2, 4]), np.array([1, 2, 3])) == Difference(
        2, 2, None, "values differ"
    )
    assert compare_batches(0, np.zeros(2, np.int64), np.zeros(2, np.int32)) == Difference(
        0, None, None, "int64(2,) vs int32(2,)"
    )
    assert compare_batches(0, {"y": np.zeros(1)}, {"x": np.zeros(1)}) == Difference(
        0, None, None, "fields ['y'] vs ['x']"
    )


def test_compare_says_which_run_ended_first():
    assert compare_batches(4, None, None) is None
    assert compare_batches(4, None, {"x": 1}).detail == "the run ended earlier"
    assert compare_batches(4, {"x": 1}, None).detail == "the reference ended earlier"


def test_a_pure_pipeline_verifies_identical_on_every_topology_and_resume():
    checks = verify(tiny(), [(1, 0), (2, 0), (4, 0)], steps=4, resume_at=2)
    assert [c.name for c in checks] == [
        "1x0",
        "2x0",
        "4x0",
        "1x0 @2 -> 2x0",
        "2x0 @2 -> 4x0",
        "4x0 @2 -> 1x0",
    ]
    assert all(c.identical for c in checks)
    assert [(c.first_step, c.steps) for c in checks] == [(0, 4)] * 3 + [(2, 2)] * 3
    assert workers_available()


def test_a_counter_in_a_map_is_caught_at_its_first_differing_row():
    counter = itertools.count()

    def stamp(record):  # not a pure function of the record
        return {"tokens": record["tokens"] + next(counter)}

    batched = zj.Dataset.source(DOCS).map(stamp).split(4).pack(4).batch(2)
    (check,) = verify(batched, [(1, 0)], steps=2)
    assert check.difference == Difference(0, 0, "tokens", "values differ")
    assert "DIFFERS at step 0, row 0, field 'tokens'" in format_checks([check])


def test_verify_refuses_bad_counts_before_running():
    with pytest.raises(PipelineError, match="steps must be >= 1; got 0"):
        verify(tiny(), [(1, 0)], steps=0)
    for resume_at in (0, 4):
        with pytest.raises(PipelineError, match=r"resume_at must be in \[1, steps\)"):
            verify(tiny(), [(1, 0)], steps=4, resume_at=resume_at)
    with pytest.raises(PipelineError, match="topology 3x0 cannot hold"):
        verify(tiny(), [(3, 0)], steps=4)


def test_the_report_of_identical_runs():
    checks = [Check("1x0", 0, 20, None), Check("2x1 @5 -> 1x0", 5, 15, None, note="a note")]
    assert format_checks(checks).splitlines() == [
        f"  {'run':<28} {'steps':>9}  result",
        f"  {'1x0':<28} {'0-19':>9}  identical",
        f"  {'2x1 @5 -> 1x0':<28} {'5-19':>9}  identical",
        "  note: a note",
        "all 2 runs are identical to the reference, bit for bit",
    ]


def test_the_report_of_differing_and_failed_runs():
    checks = [
        Check("1x0", 0, 4, None),
        Check("2x0", 0, 4, Difference(1, 3, "tokens", "values differ")),
        Check("4x0", 0, 4, None, error="PipelineError: broken"),
    ]
    lines = format_checks(checks).splitlines()
    assert lines[2] == f"  {'2x0':<28} {'0-3':>9}  DIFFERS at step 1, row 3, field 'tokens': " + (
        "values differ"
    )
    assert lines[3] == f"  {'4x0':<28} {'0-3':>9}  FAILED: PipelineError: broken"
    assert lines[4].startswith("1 of 3 runs differ from the reference (1 process, no workers")
    assert lines[5] == "1 of 3 runs failed with the error shown"
    assert len(lines) == 6
