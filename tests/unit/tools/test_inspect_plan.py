"""``zephon-jax inspect``'s pieces on tiny pipelines: the plan's text, how lanes run,
loading a pipeline function, the stage timing and its table (the command end to end:
tests/unit/tools/test_cli.py)."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest

import zephon_jax as zj
from zephon_jax.core.kernels import set_compiled
from zephon_jax.errors import PipelineError
from zephon_jax.sources.token_array import TokenArray
from zephon_jax.tools.inspect_plan import (
    describe_plan,
    format_timing,
    lane_path,
    load_pipeline,
    short_fingerprint,
    time_stages,
)

DOCS = [{"tokens": np.arange(n, dtype=np.int32) + 1} for n in (3, 5, 2, 7)]  # 17 tokens


def negate(record):
    return {"tokens": -record["tokens"]}


COLUMN_WISE = (
    "column-wise over token arrays, stores or lists of token records, packed by compiled kernels"
)


def mixed(seed=4, kind=list):
    """Two sources of ``kind`` (a list: the column path; a tuple: the general path)."""
    a = zj.Dataset.source(kind(DOCS))
    b = zj.Dataset.source(kind(DOCS[:2])).shuffle(seed)
    return zj.Dataset.mix([a, b], [0.75, 0.25]).split(4).pack(4).batch(2, num_lanes=1)


def test_the_plan_of_a_mixture_split_and_packed():
    lines = describe_plan(mixed()).splitlines()
    assert lines[:3] == ["sources", "  mixture of 2", "    weight 0.750  list(len=4): 4 records, "
                         "not shuffled, forever"]  # fmt: skip
    assert re.fullmatch(
        r"    weight 0\.250  list\(len=2\): 2 records, shuffled \(\d+\), forever", lines[3]
    )
    assert lines[4:-1] == [
        "operators (in order; carry is per lane)",
        "  1. split(max_len=4, key='tokens')",
        "     carry bound: none (pieces are emitted at once)",
        "  2. pack(seq_len=4, method='best_fit', num_bins=32)",
        "     carry bound: 32 open rows of 4 (held as pointers, one per record)",
        "batch: 2 rows per global batch, 1 lanes, 2 row(s) per lane",
        f"lanes run: {COLUMN_WISE}",
    ]
    assert lines[-1] == f"fingerprint: {short_fingerprint(mixed())}"
    assert describe_plan(mixed(kind=tuple)).splitlines()[-2] == "lanes run: the general path"


def test_the_plan_of_transforms_epochs_a_ramp_and_no_operator():
    ds = zj.Dataset.source(DOCS).repeat(2).map(negate).batch({0: 2, 3: 4})
    lines = describe_plan(ds).splitlines()
    assert lines[1] == "  list(len=4): 4 records, not shuffled, 2 epoch(s)"
    assert lines[2] == f"    then map({__name__}.negate)"
    assert lines[3:7] == [
        "operators (in order; carry is per lane)",
        "  none",
        "batch from step 0: 2 rows per global batch, 2 lanes, 1 row(s) per lane",
        "batch from step 3: 4 rows per global batch, 2 lanes, 2 row(s) per lane",
    ]


def test_the_short_fingerprint_follows_the_pipeline():
    assert re.fullmatch(r"[0-9a-f]{16}", short_fingerprint(mixed()))
    assert short_fingerprint(mixed()) == short_fingerprint(mixed())
    assert short_fingerprint(mixed(seed=5)) != short_fingerprint(mixed())


def test_lane_path_says_column_wise_compiled_or_general():
    store = TokenArray(np.arange(1, 18, dtype=np.int32), [0, 3, 8, 10, 17])
    ds = zj.Dataset.source(store).split(4).pack(4).batch(2)
    assert lane_path(ds) == COLUMN_WISE
    old = set_compiled(False)
    try:
        assert lane_path(ds).startswith(
            "the general path (TokenArray sources pack with compiled kernels where numba imports"
        )
    finally:
        set_compiled(old)
    assert lane_path(zj.Dataset.source(store).map(negate).batch(2)) == "the general path"


PIPELINES = """
import numpy as np
import zephon_jax as zj

DOCS = [{"tokens": np.arange(3, dtype=np.int32)}]

def batched():
    return zj.Dataset.source(DOCS).batch(1)

def unbatched():
    return zj.Dataset.source(DOCS)

def other():
    return [1, 2]
"""


def test_load_pipeline_wants_a_batched_dataset(tmp_path, monkeypatch):
    (tmp_path / "inspect_user.py").write_text(PIPELINES)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("inspect_user", None)
    try:
        assert load_pipeline("inspect_user:batched").batch_sizes == (1,)
        with pytest.raises(PipelineError, match=r"without a batch size; end the pipeline with"):
            load_pipeline("inspect_user:unbatched")
        with pytest.raises(PipelineError, match="inspect_user:other returned list; it must"):
            load_pipeline("inspect_user:other")
    finally:
        sys.modules.pop("inspect_user", None)


def test_time_stages_counts_what_the_loader_delivers():
    ds = mixed(kind=tuple)  # the general path: a time per operator
    result = time_stages(ds, 3)
    batches = [next(it) for it in [iter(zj.Loader(ds))] for _ in range(3)]
    assert (result["steps"], result["rows"]) == (3, 6)
    assert result["tokens"] == sum(int((b["tokens_segment_ids"] > 0).sum()) for b in batches)
    assert [name for name, _ in result["stages"]] == [
        "read tuple(len=4)",
        "read tuple(len=2)",
        "1. split(max_len=4, key='tokens')",
        "2. pack(seq_len=4, method='best_fit', num_bins=32)",
        "batch assembly",
        "sampler and lane bookkeeping",
    ]
    assert all(seconds >= 0 for _, seconds in result["stages"])
    names = [name for name, _, _ in result["state"]]
    assert names == [
        *[name for name, _ in result["stages"][2:4]],
        "rows not yet batched",
        "whole lane state",
    ]
    (split, pack, pending, whole) = [(median, most) for _, median, most in result["state"]]
    assert whole[0] > pack[0] + pending[0] and split[0] > 0


def test_time_stages_stops_where_a_finite_pipeline_ends():
    ds = zj.Dataset.source(DOCS).repeat(1).split(4).pack(4, method="concat")
    result = time_stages(ds.batch(2, num_lanes=1), 10)  # 17 tokens fill 4 rows of 4: 2 batches
    assert (result["steps"], result["rows"], result["tokens"]) == (2, 4, 16)


def test_the_timing_table_by_hand():
    result = {
        "steps": 4,
        "rows": 32,
        "seconds": 2.0,
        "tokens": 1000,
        "stages": [("read list(len=4)", 0.5), ("batch assembly", 1.5)],
        "state": [("1. pack(seq_len=4)", 1200, 1500), ("whole lane state", 2048, 4096)],
    }
    width = len("read list(len=4)")
    assert format_timing(result).splitlines() == [
        "timing over 4 global batches (one process, every lane)",
        f"  {'stage':<{width}}  total s  ms/batch  share",
        f"  {'read list(len=4)':<{width}}    0.500    125.00  25.0%",
        f"  {'batch assembly':<{width}}    1.500    375.00  75.0%",
        f"  {'total':<{width}}    2.000    500.00",
        "  2.0 batches/s, 16 rows/s, 500 real tokens/s",
        "lane state after 4 global batches (bytes per lane)",
        f"  {'part':<56}   median       max",
        f"  {'1. pack(seq_len=4)':<56}    1,200     1,500",
        f"  {'whole lane state':<56}    2,048     4,096",
    ]
    plain = dict(result, tokens=0, state=[])
    assert format_timing(plain).splitlines()[-1] == "  2.0 batches/s, 16 rows/s"
