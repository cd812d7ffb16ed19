"""Mixtures by tokens and with weight stages, and batch-size ramp-up, inside E2.

Whole global batches must equal the uninterrupted single-process run byte for
byte on 1, 2 and 4 processes and after merged states are restored on another
process count at steps inside and across stage and ramp boundaries. Shares are
checked per lane against the documented bound.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pipelines import (
    RAMP,
    STAGED_TOKEN_WEIGHTS,
    assert_batches_equal,
    concat_parts,
    make_docs,
    resume_across,
    run_topology,
    schedule_pipeline,
    take,
)

import zephon_jax as zj
from zephon_jax.errors import PipelineError, RecordError, StateMismatchError

STEPS = 24


@pytest.fixture(scope="module")
def reference():
    ds = schedule_pipeline()
    return ds, take(iter(zj.Loader(ds)), STEPS)


def test_batches_follow_the_ramp(reference):
    ds, expected = reference
    assert ds.num_lanes == 4
    for step, batch in enumerate(expected):
        size = 4 if step < 5 else 8 if step < 11 else 16
        assert batch["tokens"].shape == (size, 48)
        assert ds.batch_size_at(step) == size and ds.rows_per_lane_at(step) == size // 4
    assert len({b["tokens"].tobytes() for b in expected}) == STEPS


@pytest.mark.parametrize("process_count", [1, 2, 4])
def test_processes_concatenate_to_the_single_process_batch(reference, process_count):
    ds, expected = reference
    assert_batches_equal(run_topology(ds, process_count, STEPS), expected)


def test_process_rows_follow_the_size_of_each_step(reference):
    ds, expected = reference
    it = iter(zj.Loader(ds, process_index=1, process_count=2))
    for step, batch in enumerate(take(it, 12)):
        size = ds.batch_size_at(step)
        np.testing.assert_array_equal(batch["tokens"], expected[step]["tokens"][size // 2 :])


# Inside ramp/stage 0 (3), on the ramp boundary (5), on the stage boundary (6), inside
# both (9), on the second ramp boundary (11), on the second stage boundary (14), after (19).
@pytest.mark.parametrize(
    "save_at,save_procs,restore_procs",
    [(3, 4, 2), (5, 1, 4), (6, 2, 4), (9, 4, 1), (11, 2, 1), (14, 4, 2), (19, 1, 2)],
)
def test_resume_on_another_topology(reference, save_at, save_procs, restore_procs):
    ds, expected = reference
    resumed = resume_across(ds, STEPS, save_at, save_procs, restore_procs)
    assert_batches_equal(resumed, expected[save_at:])


def test_chained_resumes_across_every_boundary(reference):
    ds, expected = reference
    got, state, step = [], None, 0
    for procs, stop in [(2, 4), (4, 6), (1, 12), (2, 15), (4, STEPS)]:
        its = [iter(zj.Loader(ds, process_index=i, process_count=procs)) for i in range(procs)]
        for it in its:
            if state is not None:
                it.set_state(state)
        for _ in range(step, stop):
            parts = [next(it) for it in its]
            got.append({k: np.concatenate([p[k] for p in parts]) for k in parts[0]})
        state, step = zj.merge_states([it.get_state() for it in its]), stop
    assert_batches_equal(got, expected)


def test_state_is_small_and_holds_plain_ints(reference):
    ds, _ = reference
    it = iter(zj.Loader(ds))
    take(it, 6)
    early = it.get_state()
    take(it, 60)
    late = it.get_state()
    assert late["step"] == 66
    for state in (early, late):
        assert all(len(v) < 700 for v in state["lanes"].values())


# ----- sharded loaders and Orbax checkpoints ----------------------------------------------

MESH_CHECKS = [
    "meshes_of_one_to_eight_devices",
    "replicated_model_axis",
    "state_from_eight_devices_resumes_on_two_across_a_size_change",
    "orbax_checkpoint_on_eight_restores_on_two_and_numpy",
    "size_not_divisible_by_shards_is_rejected",
]


@pytest.fixture(scope="module")
def mesh_results(tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("ramp_mesh") / "results.json"
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    script = Path(__file__).resolve().parents[1] / "schedule_mesh_checks.py"
    proc = subprocess.run(
        [sys.executable, str(script), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("name", MESH_CHECKS)
def test_sharded_loader_follows_the_ramp_on_eight_devices(mesh_results, name):
    assert set(mesh_results) == set(MESH_CHECKS)
    assert mesh_results[name] == "ok", mesh_results[name]


@pytest.mark.parametrize("save_at", [5, 8, 14])
def test_checkpoint_from_two_processes_restores_on_one_and_four(tmp_path, reference, save_at):
    import zephon_jax.checkpoint as zc

    ds, expected = reference
    handler = zc.LoaderCheckpointHandler()
    directory = tmp_path / "item"
    directory.mkdir()
    for process in range(2):
        it = iter(zj.Loader(ds, process_index=process, process_count=2))
        take(it, save_at)
        assert it.loader.lanes_to_save() == [2 * process, 2 * process + 1]
        handler.save(directory, args=zc.Save(it))
    whole = handler.restore(directory, args=zc.Restore(iter(zj.Loader(ds))))
    assert_batches_equal(take(whole, 4), expected[save_at : save_at + 4])
    its = [
        handler.restore(
            directory, args=zc.Restore(iter(zj.Loader(ds, process_index=i, process_count=4)))
        )
        for i in range(4)
    ]
    for t in range(save_at, save_at + 4):
        parts = [next(it) for it in its]
        joined = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        assert_batches_equal([joined], [expected[t]])


# ----- shares ----------------------------------------------------------------------------


def _tagged(source_id: int, docs):
    def tag(record):
        return {"tokens": record["tokens"], "src": np.int32(source_id)}

    return zj.Dataset.source(docs).map(tag)


def _summary(record):
    return {"src": record["src"], "n": np.int32(len(record["tokens"])), "id": record["id"]}


def _with_ids(docs):
    return [{"tokens": d["tokens"], "id": np.int32(i)} for i, d in enumerate(docs)]


def _share_pipeline(weights, unit, sizes, num_lanes):
    docs = [
        _with_ids(make_docs(400, 200, seed=11)),
        _with_ids(make_docs(400, 30, seed=12)),
        _with_ids(make_docs(400, 90, seed=13, min_len=20)),
    ]
    comps = []
    for j, d in enumerate(docs):

        def tag(record, j=j):
            return {**record, "src": np.int32(j)}

        comps.append(zj.Dataset.source(d).map(tag))
    ds = zj.Dataset.mix(comps, weights, unit=unit).map(_summary)
    return ds.batch(sizes, num_lanes=num_lanes), max(len(x["tokens"]) for d in docs for x in d)


def _per_lane_draws(batched, steps):
    """Per lane, the (step, src, tokens, id) of every draw, in order (one row = one draw)."""
    lanes = batched.num_lanes
    out = {lane: [] for lane in range(lanes)}
    for step, batch in enumerate(take(iter(zj.Loader(batched)), steps)):
        per = len(batch["src"]) // lanes
        for lane in range(lanes):
            for r in range(lane * per, (lane + 1) * per):
                out[lane].append(
                    (step, int(batch["src"][r]), int(batch["n"][r]), int(batch["id"][r]))
                )
    return out


def _check_bound(draws, weights, unit, max_len):
    """Within the stage from its start: |T_j - w_j T| <= (K - 1) * L per component."""
    weights = np.asarray(weights) / np.sum(weights)
    k = int((weights > 0).sum())
    amount = np.zeros(len(weights))
    worst = 0.0
    for _, src, n, _ in draws:
        amount[src] += n if unit == "tokens" else 1
        total = amount.sum()
        worst = max(worst, float(np.abs(amount - weights * total).max()))
    bound = (k - 1) * (max_len if unit == "tokens" else 1)
    assert worst <= bound, (worst, bound)
    return amount / amount.sum()


@pytest.mark.parametrize("unit", ["tokens", "records"])
def test_every_lane_gets_its_share_in_every_stage(unit):
    stages = {0: [0.6, 0.1, 0.3], 40: [0.0, 0.5, 0.5], 90: [0.25, 0.25, 0.5]}
    batched, max_len = _share_pipeline(stages, unit, {0: 8, 30: 16, 70: 24}, 8)
    steps = 130
    draws = _per_lane_draws(batched, steps)
    starts = sorted(stages) + [steps]
    for lane, seq in draws.items():
        for s0, s1 in zip(starts, starts[1:]):
            stage_draws = [d for d in seq if s0 <= d[0] < s1]
            shares = _check_bound(stage_draws, stages[s0], unit, max_len)
            # The bound makes the shares approach the weights: within 5% on every lane
            # after ~10k tokens (records: 1%) per stage.
            want = np.asarray(stages[s0]) / sum(stages[s0])
            assert np.abs(shares - want).max() < (0.05 if unit == "tokens" else 0.01), shares
            if stages[s0][0] == 0:
                assert all(d[1] != 0 for d in stage_draws)
        # Each component keeps its own order across stages: lane l reads record
        # l, l + L, l + 2L, ... of an unshuffled source.
        for src in range(3):
            ids = [d[3] for d in seq if d[1] == src]
            assert ids == [(lane + i * batched.num_lanes) % 400 for i in range(len(ids))]


def test_token_shares_on_lanes_of_a_packed_pipeline():
    """Per lane, the tokens drawn per component over 40 steps of a single-stage token mix."""
    batched, max_len = _share_pipeline([0.5, 0.2, 0.3], "tokens", 16, 16)
    for lane, seq in _per_lane_draws(batched, 40).items():
        shares = _check_bound(seq, [0.5, 0.2, 0.3], "tokens", max_len)
        assert np.abs(shares - [0.5, 0.2, 0.3]).max() < 0.05, (lane, shares)


def test_exhausted_component_leaves_the_others_in_proportion():
    a = zj.Dataset.source(make_docs(50, 20, seed=1)).repeat(1)
    b = zj.Dataset.source(make_docs(400, 20, seed=2))
    c = zj.Dataset.source(make_docs(400, 20, seed=3))
    tag = [lambda r, j=j: {"src": np.int32(j), "n": np.int32(len(r["tokens"]))} for j in range(3)]
    mixed = zj.Dataset.mix(
        [a.map(tag[0]), b.map(tag[1]), c.map(tag[2])], [0.5, 0.25, 0.25], unit="records"
    )
    # Records unit with a stage schedule of one stage runs the drawer too.
    staged = zj.Dataset.mix(
        [a.map(tag[0]), b.map(tag[1]), c.map(tag[2])], {0: [0.5, 0.25, 0.25]}, unit="records"
    )
    for ds in (mixed, staged):
        batches = take(iter(zj.Loader(ds.batch(2))), 100)
        src = np.concatenate([b["src"] for b in batches])
        assert (src == 0).sum() == 50  # every record of the finite source, once
        late = src[120:]
        assert (late == 0).sum() == 0
        assert abs((late == 1).mean() - 0.5) < 0.05


# ----- fingerprint and validation -------------------------------------------------------


@pytest.mark.parametrize(
    "other,field",
    [
        (lambda: schedule_pipeline(sizes={0: 4, 6: 8, 11: 16}), "global_batch_size"),
        (lambda: schedule_pipeline(sizes=16, num_lanes=4), "global_batch_size"),
        (lambda: _variant(weights={0: [0.5, 0.3, 0.2], 7: [0.0, 0.5, 0.5]}), "weights"),
        (lambda: _variant(unit="records"), "weights"),
    ],
)
def test_resume_into_another_schedule_names_the_field(reference, other, field):
    ds, _ = reference
    it = iter(zj.Loader(ds))
    take(it, 3)
    state = it.get_state()
    with pytest.raises(StateMismatchError) as info:
        iter(zj.Loader(other())).set_state(state)
    assert info.value.field == field


def _variant(weights=STAGED_TOKEN_WEIGHTS, unit="tokens"):
    from pipelines import add_one, not_multiple_of_seven

    a = zj.Dataset.source(make_docs(300, 150, seed=1))
    b = zj.Dataset.source(make_docs(200, 40, seed=2, vocab=500)).map(add_one)
    c = zj.Dataset.source(make_docs(100, 10, seed=3, vocab=50)).repeat(3)
    return (
        zj.Dataset.mix([a, b, c], weights, unit=unit)
        .shuffle(seed=3)
        .filter(not_multiple_of_seven)
        .split(48)
        .pack(48, method="best_fit", num_bins=6)
        .batch(RAMP)
    )


def test_the_unchanged_variant_restores(reference):
    ds, expected = reference
    it = iter(zj.Loader(ds))
    take(it, 7)
    other = iter(zj.Loader(_variant()))
    other.set_state(it.get_state())
    assert_batches_equal(take(other, 3), expected[7:10])


SRC = zj.Dataset.source(make_docs(20, 10, seed=0))


@pytest.mark.parametrize(
    "build,match",
    [
        (
            lambda: SRC.batch({0: 4, 5: 6}),
            r"global_batch_size=6 \(the size from step 5\).*num_lanes=4",
        ),
        (lambda: SRC.batch({0: 8, 5: 12}, num_lanes=8), r"12 .*not a multiple of num_lanes=8"),
        (lambda: SRC.batch({2: 4}), "first key must be 0"),
        (lambda: SRC.batch({0: 4, -1: 8}), "not a step"),
        (lambda: SRC.batch({0: 4, 3: 0}), "positive int"),
        (lambda: SRC.batch({}), "empty"),
        (lambda: zj.Dataset.mix([SRC, SRC], {1: [1, 1]}), "first key must be 0"),
        (lambda: zj.Dataset.mix([SRC, SRC], {0: [1, 1], 5: [0, 0]}), "all zero"),
        (lambda: zj.Dataset.mix([SRC, SRC], {0: [1, -1]}), r">= 0"),
        (lambda: zj.Dataset.mix([SRC, SRC], {0: [1, 1, 1]}), "3 weights for 2 datasets"),
        (lambda: zj.Dataset.mix([SRC, SRC], [1, 1], unit="bytes"), "unit='bytes'"),
        (lambda: zj.Dataset.mix([SRC, SRC], [1, float("nan")], unit="tokens"), "finite"),
        (
            lambda: zj.Dataset.mix(
                [zj.Dataset.mix([SRC, SRC], [1, 1], unit="tokens"), SRC], [1, 1]
            ),
            "outermost",
        ),
    ],
)
def test_invalid_schedules_are_rejected(build, match):
    with pytest.raises(PipelineError, match=match):
        build()


def test_smallest_size_is_the_default_lane_count():
    assert SRC.batch({0: 4, 5: 8, 9: 12}).num_lanes == 4
    assert SRC.batch({0: 6, 5: 3}).num_lanes == 3


def test_ramp_sizes_must_split_over_processes():
    ds = SRC.batch({0: 4, 5: 6}, num_lanes=2)
    with pytest.raises(PipelineError, match=r"at step 5 .*process_count=4 cannot hold.*6"):
        zj.Loader(ds, process_index=0, process_count=4)
    zj.Loader(ds, process_index=1, process_count=2)


def test_ramp_has_no_constant_only_accessors():
    ds = SRC.batch({0: 2, 3: 4})
    with pytest.raises(PipelineError, match="rows_per_lane_at"):
        _ = ds.rows_per_lane
    with pytest.raises(PipelineError, match="rows_at"):
        _ = zj.Loader(ds).rows


def test_loader_workers_follow_the_ramp_and_resume(reference):
    """Two processes with two worker processes each, then one with two, across boundaries."""
    ds, expected = reference
    its = [iter(zj.Loader(ds, process_index=i, process_count=2, num_workers=2)) for i in range(2)]
    try:
        got = [concat_parts([next(it) for it in its]) for _ in range(8)]
        state = zj.merge_states([it.get_state() for it in its])
    finally:
        for it in its:
            it.close()
    assert_batches_equal(got, expected[:8])
    it = iter(zj.Loader(ds, num_workers=2))
    try:
        it.set_state(state)
        assert_batches_equal(take(it, STEPS - 8), expected[8:])
    finally:
        it.close()


def test_token_mixture_needs_a_tokens_field():
    texts = zj.Dataset.source([{"text": np.zeros(3, np.int32)}] * 4)
    ds = zj.Dataset.mix([texts, SRC], [1, 1], unit="tokens").batch(2)
    with pytest.raises(RecordError, match=r"'tokens' field.*fields: \['text'\]"):
        next(iter(zj.Loader(ds)))
