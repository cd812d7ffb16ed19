"""E2: every global batch is byte-identical on every process count and across resumes."""

from __future__ import annotations

import numpy as np
import pytest
from pipelines import (
    assert_batches_equal,
    full_pipeline,
    make_docs,
    resume_across,
    run_topology,
    take,
)

import zephon_jax as zj

STEPS = 50


@pytest.fixture(scope="module")
def reference():
    ds = full_pipeline()
    return ds, take(iter(zj.Loader(ds)), STEPS)


@pytest.mark.parametrize("process_count", [1, 2, 4, 8])
def test_processes_concatenate_to_the_single_process_batch(reference, process_count):
    ds, expected = reference
    assert_batches_equal(run_topology(ds, process_count, STEPS), expected)


def test_rows_are_packed_and_nontrivial(reference):
    _, expected = reference
    batch = expected[0]
    assert set(batch) == {"tokens", "tokens_segment_ids", "tokens_positions"}
    assert batch["tokens"].shape == (8, 48)
    assert (batch["tokens_segment_ids"] > 0).mean() > 0.8
    assert len({expected[t]["tokens"].tobytes() for t in range(STEPS)}) == STEPS


@pytest.mark.parametrize("restore_procs", [2, 8])
@pytest.mark.parametrize("save_at", [1, 17])
def test_merged_state_from_four_processes_resumes_on_another_topology(
    reference, restore_procs, save_at
):
    ds, expected = reference
    resumed = resume_across(ds, STEPS, save_at, save_procs=4, restore_procs=restore_procs)
    assert_batches_equal(resumed, expected[save_at:])


def test_process_count_dividing_batch_but_not_lanes():
    ds = full_pipeline(batch_size=8, num_lanes=2)
    expected = take(iter(zj.Loader(ds)), 20)
    assert_batches_equal(run_topology(ds, 4, 20), expected)
    assert_batches_equal(resume_across(ds, 20, 7, save_procs=8, restore_procs=2), expected[7:])


def test_repeated_resumes_chain_exactly(reference):
    ds, expected = reference
    it = iter(zj.Loader(ds, process_index=0, process_count=1))
    got = take(it, 5)
    for procs, steps in [(2, 9), (8, 3), (1, 11)]:
        state = it.get_state()
        its = [iter(zj.Loader(ds, process_index=i, process_count=procs)) for i in range(procs)]
        for x in its:
            x.set_state(state)
        for _ in range(steps):
            parts = [next(x) for x in its]
            got.append({k: np.concatenate([p[k] for p in parts]) for k in parts[0]})
        it = its[0] if procs == 1 else None
        if it is None:
            state = zj.merge_states([x.get_state() for x in its])
            it = iter(zj.Loader(ds))
            it.set_state(state)
    assert_batches_equal(got, expected[: len(got)])


def test_state_size_does_not_grow_with_steps():
    ds = full_pipeline()
    it = iter(zj.Loader(ds))

    def sizes(samples):
        out = []
        for _ in range(samples):
            take(it, 20)
            out.append(sum(len(v) for v in it.get_state()["lanes"].values()))
        return out

    early = sizes(6)
    take(it, 800)
    late = sizes(6)
    # Open bins hold a varying number of pointers; the mean must not trend upwards.
    assert np.mean(late) < 1.25 * np.mean(early)
    assert max(late) / 8 < 2048


def test_finite_epochs_end_identically_on_every_topology():
    docs = make_docs(40, 30, seed=9)
    ds = (
        zj.Dataset.source(docs)
        .shuffle(1)
        .repeat(2)
        .pack(32, method="first_fit", num_bins=3)
        .batch(4)
    )
    expected = list(iter(zj.Loader(ds)))
    assert 3 < len(expected) < 40
    for procs in (2, 4):
        its = [iter(zj.Loader(ds, process_index=i, process_count=procs)) for i in range(procs)]
        got = []
        while True:
            try:
                parts = [next(x) for x in its]
            except StopIteration:
                break
            got.append({k: np.concatenate([p[k] for p in parts]) for k in parts[0]})
        assert_batches_equal(got, expected)


def _mixture_with_a_finite_component(epochs_of_both: bool) -> zj.BatchedDataset:
    endless = zj.Dataset.source(make_docs(40, 9, seed=1))
    finite = zj.Dataset.source(make_docs(5, 9, seed=2)).repeat(2)
    if epochs_of_both:
        endless = endless.repeat(1)
    return zj.Dataset.mix([endless, finite], [3, 1]).split(4).pack(4).batch(12)


def test_a_mixture_that_never_ends_runs_only_each_process_s_own_lanes():
    ds = _mixture_with_a_finite_component(epochs_of_both=False)
    assert not ds.is_finite
    loaders = [zj.Loader(ds, process_index=i, process_count=6) for i in range(6)]
    assert [loader.lanes for loader in loaders] == [[2 * i, 2 * i + 1] for i in range(6)]
    iterators = [iter(loader) for loader in loaders]
    assert [sorted(it._producer.lanes) for it in iterators] == [loader.lanes for loader in loaders]
    assert [sorted(it.get_state()["lanes"]) for it in iterators] == [
        [str(2 * i), str(2 * i + 1)] for i in range(6)
    ]
    expected = take(iter(zj.Loader(ds)), 30)  # past the finite component's 2 epochs
    assert_batches_equal(run_topology(ds, 6, 30), expected)
    assert_batches_equal(resume_across(ds, 30, 7, 6, 4), expected[7:])


def test_a_mixture_that_can_end_runs_every_lane_on_each_process():
    ds = _mixture_with_a_finite_component(epochs_of_both=True)
    assert ds.is_finite
    assert zj.Loader(ds, process_index=1, process_count=6).lanes == list(range(12))
