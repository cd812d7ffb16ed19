"""``explain_step``: the provenance of global batch ``t``, equal to what the iterator's
``provenance()`` says right after batch ``t``, from the beginning or from a state, for
all rows or some; bad arguments refused."""

from __future__ import annotations

import numpy as np
import pytest

import zephon_jax as zj
from zephon_jax.engine.explain import explain_step
from zephon_jax.errors import PipelineError

DOCS = [{"tokens": np.arange(n, dtype=np.int32) + 100 * n} for n in (3, 5, 2, 7)]


def packed():
    return zj.Dataset.source(DOCS).repeat(1).split(4).pack(4, method="concat").batch(2, num_lanes=1)


def segment(record, start, stop):
    return {
        "source": 0,
        "label": "list(len=4)",
        "record": record,
        "epoch": 0,
        "start": start,
        "stop": stop,
    }


def test_step_zero_by_hand_and_as_the_iterator_says():
    ds = packed()
    it = iter(zj.Loader(ds))
    batch = next(it)
    # row 0: record 0 (3 tokens) then the first token of record 1's first piece (4 tokens)
    assert batch["tokens"].tolist() == [[300, 301, 302, 500], [501, 502, 503, 504]]
    expected = [
        [segment(0, 0, 3), segment(1, 0, 1)],
        [segment(1, 1, 4), segment(1, 4, 5)],
    ]
    assert it.provenance() == expected
    assert explain_step(ds, 0) == expected


def test_later_steps_from_the_start_or_from_a_state_and_chosen_rows():
    ds = packed()
    it = iter(zj.Loader(ds))
    next(it)
    state = it.get_state()
    next(it)
    assert explain_step(ds, 1) == it.provenance()
    assert explain_step(ds, 1, state=state) == it.provenance()
    assert explain_step(ds, 1, rows=[1]) == it.provenance()[1:]
    assert explain_step(ds, 1, rows=[1, 0]) == it.provenance()[::-1]


def test_bad_arguments_are_refused():
    ds = packed()
    it = iter(zj.Loader(ds))
    next(it)
    next(it)
    later = it.get_state()
    with pytest.raises(PipelineError, match="needs a batched dataset; got Dataset"):
        explain_step(zj.Dataset.source(DOCS), 0)
    for step in (-1, True, 1.0):
        with pytest.raises(PipelineError, match=r"explain_step\(step\) needs an int >= 0"):
            explain_step(ds, step)
    with pytest.raises(PipelineError, match="the state is at step 2, after step 1"):
        explain_step(ds, 1, state=later)
    with pytest.raises(PipelineError, match="row 2 is outside the global batch of 2"):
        explain_step(ds, 0, rows=[2])
    with pytest.raises(PipelineError, match="input ends at step 2, before step 5"):
        explain_step(ds, 5)
