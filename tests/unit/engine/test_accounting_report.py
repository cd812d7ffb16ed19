"""Accounting reports: lanes' tallies summed per source and per stage, a state's report,
and the reports of several processes merged."""

from __future__ import annotations

import json

import numpy as np
import pytest

import zephon_jax as zj
from zephon_jax.engine.accounting_report import (
    accounting,
    merge_accounting,
    report,
    stage_weights,
)
from zephon_jax.errors import PipelineError, StateError


def test_report_sums_lanes_and_keeps_the_highest_epoch():
    tallies = {
        1: (2, (10, 3, 2, 1, 0, 0, 0, 0), ()),
        0: (2, (5, 1, 1, 3, 7, 2, 2, 1), ()),
    }
    rep = report(tallies, 9, ["a", "b"], None)
    assert rep["step"] == 9 and rep["steps"] == 7 and rep["skipped"] == 2
    assert rep["lanes"] == [0, 1] and rep["stages"] == []
    assert rep["sources"] == {
        "a": {"source": 0, "tokens": 15, "segments": 4, "documents": 3, "epoch": 2},
        "b": {"source": 1, "tokens": 7, "segments": 2, "documents": 2, "epoch": 0},
    }


def test_report_keys_shared_labels_by_index_and_none_epoch_when_nothing_delivered():
    rep = report({0: (0, (0, 0, 0, 0, 4, 1, 1, 1), ())}, 1, ["x", "x"], None)
    assert list(rep["sources"]) == ["x (source 0)", "x (source 1)"]
    assert rep["sources"]["x (source 0)"]["epoch"] is None


def test_report_stage_tokens_and_shares():
    # two stages (from steps 0 and 5) of two components: tokens per stage and component
    tallies = {0: (0, (0,) * 8, (3, 1, 0, 0)), 1: (0, (0,) * 8, (3, 1, 2, 0))}
    rep = report(tallies, 6, ["a", "b"], ([0, 5], [[0.5, 0.5], [1.0, 0.0]]))
    assert rep["stages"] == [
        {"start": 0, "weights": [0.5, 0.5], "tokens": [6, 2], "shares": [0.75, 0.25]},
        {"start": 5, "weights": [1.0, 0.0], "tokens": [2, 0], "shares": [1.0, 0.0]},
    ]


def test_report_refuses_lanes_that_skipped_differently_or_count_other_sources():
    with pytest.raises(StateError, match=r"skipped different numbers of steps \[0, 1\]"):
        report({0: (0, (0,) * 4, ()), 1: (1, (0,) * 4, ())}, 3, ["a"], None)
    with pytest.raises(StateError, match="lane 4: the state's accounting counts 2 sources"):
        report({4: (0, (0,) * 8, ())}, 3, ["a"], None)


def test_stage_weights_from_a_fingerprint():
    assert stage_weights({"weights": json.dumps([])}) is None
    assert stage_weights({"weights": json.dumps([[0.5, 0.5]])}) is None
    fp = {"weights": json.dumps([{"stages": {"10": [0.2, 0.8], "0": [1, 0]}}])}
    assert stage_weights(fp) == ([0, 10], [[1, 0], [0.2, 0.8]])


def rep(lanes, step=4, skipped=0, tokens=(1, 0), epoch=0, stages=()):
    sources = {
        "a": {"source": 0, "tokens": tokens[0], "segments": 1, "documents": 1, "epoch": epoch},
        "b": {"source": 1, "tokens": tokens[1], "segments": 0, "documents": 0, "epoch": None},
    }
    return {
        "step": step,
        "steps": step - skipped,
        "skipped": skipped,
        "lanes": lanes,
        "sources": sources,
        "stages": [
            {"start": 0, "weights": [0.5, 0.5], "tokens": list(t), "shares": []} for t in stages
        ],
    }


def test_merge_accounting_adds_figures_and_recomputes_shares():
    merged = merge_accounting(
        [
            rep([0], tokens=(3, 0), epoch=0, stages=[(1, 1)]),
            rep([2, 1], tokens=(5, 0), epoch=2, stages=[(2, 0)]),
        ]
    )
    assert merged["lanes"] == [0, 1, 2] and merged["step"] == 4
    assert merged["sources"]["a"] == {
        "source": 0,
        "tokens": 8,
        "segments": 2,
        "documents": 2,
        "epoch": 2,
    }
    assert merged["sources"]["b"]["epoch"] is None
    assert merged["stages"][0]["tokens"] == [3, 1]
    assert merged["stages"][0]["shares"] == [0.75, 0.25]


def test_merge_accounting_refusals():
    with pytest.raises(PipelineError, match="at least one report"):
        merge_accounting([])
    with pytest.raises(PipelineError, match="report 1 has step=5 but report 0 step=4"):
        merge_accounting([rep([0]), rep([1], step=5)])
    with pytest.raises(PipelineError, match=r"report 1 counts lanes \[1\]"):
        merge_accounting([rep([0, 1]), rep([1])])
    with pytest.raises(PipelineError, match="other mixture stages"):
        merge_accounting([rep([0]), rep([1], stages=[(1, 1)])])


def test_accounting_of_a_state_with_and_without_the_dataset():
    records = [{"tokens": np.full(2, i, np.int32)} for i in range(4)]
    ds = zj.Dataset.source(records).batch(2, num_lanes=2)
    it = iter(zj.Loader(ds))
    next(it)  # lane 0 delivers record 0, lane 1 record 1: 2 tokens each
    state = it.get_state()
    plain = accounting(state)
    assert plain["sources"]["source 0"] == {
        "source": 0,
        "tokens": 4,
        "segments": 2,
        "documents": 2,
        "epoch": 0,
    }
    assert (plain["step"], plain["steps"], plain["lanes"]) == (1, 1, [0, 1])
    only_lane_0 = accounting(state, lanes=[0])
    assert only_lane_0["sources"]["source 0"]["tokens"] == 2
    labelled = accounting(state, ds)
    assert [f["tokens"] for f in labelled["sources"].values()] == [4]
    with pytest.raises(PipelineError, match="needs the batched dataset"):
        accounting(state, zj.Dataset.source(records))
