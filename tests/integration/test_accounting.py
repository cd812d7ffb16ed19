"""Accounting (what a run delivered, kept in the state) and skipping global batches."""

from __future__ import annotations

import numpy as np
import pytest
from pipelines import concat_parts, make_docs

import zephon_jax as zj
from zephon_jax.engine.accounting import record_tokens

STEPS = 6


def _sources():
    a = zj.Dataset.source(make_docs(60, 40, seed=1), name="a")
    b = zj.Dataset.source(make_docs(40, 20, seed=2, vocab=500), name="b")
    return a, b


def mixed(kind: str = "pack", batch=8) -> zj.BatchedDataset:
    """Small pipelines covering records, tokens and stages, split, pack and a ramp."""
    a, b = _sources()
    if kind == "pack":
        ds = zj.Dataset.mix([a, b], [0.6, 0.4]).shuffle(seed=3).split(16).pack(24, num_bins=3)
    elif kind == "split":
        ds = zj.Dataset.mix([a, b], [0.5, 0.5]).repeat().split(16).map(_pad16)
    elif kind == "stages":
        ds = (
            zj.Dataset.mix([a, b], {0: [0.8, 0.2], 3: [0.2, 0.8]}, unit="tokens")
            .split(16)
            .pack(24, num_bins=2)
        )
    elif kind == "tokens":
        ds = zj.Dataset.mix([a, b], [0.5, 0.5], unit="tokens").split(32).pack(32, num_bins=2)
    elif kind == "window":  # pieces reach pack through a passthrough operator
        ds = zj.Dataset.mix([a, b], [0.5, 0.5]).repeat().split(16).window_shuffle(4, seed=1)
        ds = ds.pack(24, num_bins=2)
    elif kind == "unsplit":  # pack takes whole records
        ds = zj.Dataset.mix([a, b], [0.5, 0.5]).repeat().map(_crop8).pack(24, num_bins=2)
    elif kind == "columns":  # token arrays, read column-wise by the compiled kernels
        from zephon_jax.sources.token_array import TokenArray

        arrays = [
            zj.Dataset.source(TokenArray.from_documents([d["tokens"] for d in docs]), name=n)
            for docs, n in ((make_docs(60, 40, seed=1), "a"), (make_docs(40, 20, seed=2), "b"))
        ]
        ds = zj.Dataset.mix(arrays, [0.6, 0.4]).repeat().split(16).pack(24, num_bins=3)
    elif kind == "records":
        ds = zj.Dataset.mix([a, b], [0.5, 0.5]).map(_crop8)
    elif kind == "concat":  # documents run on from one row into the next
        ds = zj.Dataset.mix([a, b], [0.6, 0.4]).shuffle(seed=3).split(16).pack(24, method="concat")
    elif kind == "ramp":
        ds = zj.Dataset.mix([a, b], [0.7, 0.3]).split(16).pack(24, num_bins=2)
        return ds.batch(global_batch_size={0: 4, 3: 8})
    else:
        raise ValueError(kind)
    return ds.batch(batch)


def _pad16(record):
    tokens = np.zeros(16, np.int32)
    tokens[: len(record["tokens"])] = record["tokens"]
    return {"tokens": tokens}


def _crop8(record):
    tokens = np.resize(record["tokens"], 8)
    return {"tokens": tokens}


def expected(ds, rows_per_step, batches) -> dict:
    """Accounting by summing provenance over delivered steps (and the row data where a
    segment is a whole record)."""
    labels = ["a", "b"]
    out = {
        k: {"source": i, "tokens": 0, "segments": 0, "documents": 0, "epoch": None}
        for i, k in enumerate(labels)
    }
    for provenance, batch in zip(rows_per_step, batches):
        for r, segments in enumerate(provenance):
            for s in segments:
                figures = out[s["label"]]
                if s["stop"] is None:
                    tokens = record_tokens({"tokens": batch["tokens"][r]})
                else:
                    tokens = s["stop"] - (s["start"] or 0)
                figures["tokens"] += tokens
                figures["segments"] += 1
                figures["documents"] += s["start"] in (0, None)
                if figures["epoch"] is None or s["epoch"] > figures["epoch"]:
                    figures["epoch"] = s["epoch"]
    return out


def run_global(ds, steps, process_count=1, state=None, **kw):
    """Global batches, provenance per step and the merged accounting after each step."""
    its = [
        iter(zj.Loader(ds, process_index=i, process_count=process_count, **kw))
        for i in range(process_count)
    ]
    if state is not None:
        for it in its:
            it.set_state(state)
    batches, provenance, reports = [], [], []
    for _ in range(steps):
        batches.append(concat_parts([next(it) for it in its]))
        provenance.append([row for it in its for row in it.provenance()])
        reports.append(zj.merge_accounting([it.accounting() for it in its]))
    return its, batches, provenance, reports


@pytest.mark.parametrize("kind", ["pack", "split", "stages", "tokens", "records", "ramp"])
@pytest.mark.parametrize("processes", [1, 2, 4])
def test_accounting_is_summed_provenance(kind, processes):
    ds = mixed(kind)
    its, batches, provenance, reports = run_global(ds, STEPS, processes)
    for t in range(STEPS):
        report = reports[t]
        assert report["steps"] == t + 1 and report["skipped"] == 0
        assert report["lanes"] == list(range(ds.num_lanes))
        assert report["sources"] == expected(ds, provenance[: t + 1], batches[: t + 1])
    if kind in ("stages", "tokens"):
        stages = reports[-1]["stages"]
        assert len(stages) == (2 if kind == "stages" else 1)
        total = sum(sum(s["tokens"]) for s in stages)
        assert total == sum(f["tokens"] for f in reports[-1]["sources"].values())
    else:
        assert reports[-1]["stages"] == []


@pytest.mark.parametrize(
    "kind",
    ["pack", "split", "stages", "tokens", "ramp", "window", "unsplit", "columns", "records"],
)
def test_accounting_counted_in_bulk_is_summed_provenance(kind, monkeypatch):
    # Lanes count their delivered rows in bulk; with a tiny bulk they count part-way
    # through batches and stages, and the figures stay exact.
    monkeypatch.setattr("zephon_jax.engine.accounting.FOLD_ROWS", 3)
    ds = mixed(kind)
    steps = 12
    its, batches, provenance, reports = run_global(ds, steps, 2)
    for t in range(steps):
        assert reports[t]["sources"] == expected(ds, provenance[: t + 1], batches[: t + 1])
    if kind == "stages":
        want = [[0, 0], [0, 0]]
        for step in range(steps):
            for row in provenance[step]:
                for s in row:
                    want[step >= 3][s["source"]] += s["stop"] - s["start"]
        assert [s["tokens"] for s in reports[-1]["stages"]] == want


def test_stage_tokens_follow_the_steps_of_each_stage():
    ds = mixed("stages")
    _, batches, provenance, reports = run_global(ds, STEPS)
    for t in (2, 5):
        want = [[0, 0], [0, 0]]
        for step in range(t + 1):
            stage = 0 if step < 3 else 1
            for row in provenance[step]:
                for s in row:
                    want[stage][s["source"]] += s["stop"] - s["start"]
        got = reports[t]["stages"]
        assert [s["tokens"] for s in got] == want
        assert [s["start"] for s in got] == [0, 3]
        assert got[0]["weights"] == [0.8, 0.2]
    # Tokens count in the stage whose steps deliver them; b's share grows in stage 1.
    it = its_after(ds, 12)
    early, late = it.accounting()["stages"]
    assert late["shares"][1] > 0.55 > 0.3 > early["shares"][1]


def its_after(ds, steps):
    it = iter(zj.Loader(ds))
    for _ in range(steps):
        next(it)
    return it


def test_accounting_across_a_resume_on_another_topology():
    ds = mixed("pack")
    _, _, _, whole = run_global(ds, STEPS)
    its, _, _, _ = run_global(ds, 3, process_count=2)
    state = zj.merge_states([it.get_state() for it in its])
    assert zj.accounting(state, ds) == whole[2]
    rest = run_global(ds, STEPS - 3, process_count=4, state=state)[3]
    assert rest == whole[3:]
    # a saved state gives the same figures without the dataset, named by its fingerprint
    plain = zj.accounting(state)
    assert [f["tokens"] for f in plain["sources"].values()] == [
        f["tokens"] for f in whole[2]["sources"].values()
    ]


def test_accounting_with_loader_workers():
    ds = mixed("pack")
    _, _, _, whole = run_global(ds, STEPS)
    it = iter(zj.Loader(ds, num_workers=2))
    try:
        got = []
        for _ in range(STEPS):
            next(it)
            got.append(it.accounting())
    finally:
        it.close()
    assert got == whole


def test_merge_accounting_refuses_a_lane_twice_and_other_steps():
    ds = mixed("pack")
    its = run_global(ds, 2, process_count=2)[0]
    report = its[0].accounting()
    with pytest.raises(zj.PipelineError, match="counts lanes"):
        zj.merge_accounting([report, report])
    later = dict(its[1].accounting(), step=3)
    with pytest.raises(zj.PipelineError, match="same global batch"):
        zj.merge_accounting([report, later])


def test_state_size_per_lane_with_eight_sources():
    sources = [zj.Dataset.source(make_docs(50, 30, seed=s), name=f"s{s}") for s in range(8)]
    ds = (
        zj.Dataset.mix(sources, {0: [1] * 8, 4: list(range(1, 9))}, unit="tokens")
        .split(16)
        .pack(32, num_bins=4)
        .batch(4)
    )
    it = iter(zj.Loader(ds))
    for _ in range(20):
        next(it)
    sizes = [len(v) for v in it.get_state()["lanes"].values()]
    assert max(sizes) < 2048, sizes
    assert sum(f["tokens"] for f in it.accounting()["sources"].values()) > 20 * 4 * 16


def test_an_altered_accounting_is_refused():
    from zephon_jax.state.lane_format import encode_lane_state

    ds = mixed("pack")
    it = iter(zj.Loader(ds))
    next(it)
    lane = it._producer.lanes[0]
    snapshot = lane.snapshot()
    bad = snapshot._replace(tally=(0, (1, 2), ()))
    state = it.get_state()
    state["lanes"]["0"] = np.frombuffer(encode_lane_state(bad, 0), np.uint8)
    with pytest.raises(zj.StateError, match="accounting"):
        iter(zj.Loader(ds)).set_state(state)


def test_metrics_are_plain_numbers_that_grow():
    it = iter(zj.Loader(mixed("pack")))
    assert it.metrics()["rows"] == 0
    for _ in range(3):
        next(it)
    m = it.metrics()
    assert all(type(v) is float for v in m.values())
    assert m["step"] == 3 and m["rows"] == 24
    assert 0 < m["wait_s"] <= m["seconds"] and 0 < m["wait_share"] <= 1
    assert m["rows_per_s"] == pytest.approx(24 / m["seconds"], rel=0.05)
    # the stages: in-process lanes and assembly took time, inside next() here
    assert 0 < m["lanes_s"] and 0 < m["assemble_s"]
    assert m["lanes_s"] + m["assemble_s"] <= m["wait_s"]
    assert m["workers_s"] == 0 and m["device_s"] == 0  # no workers, no mesh


def test_metrics_time_the_workers_and_the_devices(sharding):
    it = iter(zj.Loader(mixed("pack"), sharding=sharding, num_workers=1))
    for _ in range(3):
        next(it)
    m = it.metrics()
    it.close()
    assert m["lanes_s"] == 0  # the lanes ran in the worker
    assert 0 < m["workers_s"] and 0 < m["assemble_s"] and 0 < m["device_s"]


@pytest.mark.parametrize("processes", [1, 2])
def test_a_finite_input_counts_only_the_batches_delivered(processes):
    # The batch the input ends in is not delivered: rows some lanes made for it are not
    # counted, whichever lanes a process runs.
    a, b = _sources()
    ds = zj.Dataset.mix([a, b], [0.6, 0.4]).repeat(1).split(16).pack(24, num_bins=2).batch(8)
    its = [iter(zj.Loader(ds, process_index=i, process_count=processes)) for i in range(processes)]
    batches, provenance = [], []
    while True:
        parts = [next(it, None) for it in its]
        if parts[0] is None:
            assert all(p is None for p in parts)
            break
        batches.append(concat_parts(parts))
        provenance.append([row for it in its for row in it.provenance()])
    report = zj.merge_accounting([it.accounting() for it in its])
    assert report["steps"] == len(batches) > 3
    assert report["sources"] == expected(ds, provenance, batches)


def test_after_the_end_workers_leave_the_state_the_lanes_leave_in_process():
    """A finite input whose lanes end at different steps: a worker whose lanes completed
    their rows of the batch another worker's lanes could not complete leaves them
    undelivered (not counted), so the state and the accounting after the end are the
    in-process ones, byte for byte (2 workers, one lane each)."""
    for seed in range(4):
        lengths = np.random.default_rng(seed).integers(2, 10, 16).tolist()
        docs = [
            {"tokens": np.arange(1, n + 1, dtype=np.int32) + 100 * i} for i, n in enumerate(lengths)
        ]
        ds = zj.Dataset.source(docs).repeat(1).split(6).pack(8, num_bins=2).batch(2)
        ends = []
        for workers in (0, 2):
            it = iter(zj.Loader(ds, num_workers=workers))
            steps = sum(1 for _ in it)
            state = it.get_state()
            ends.append((steps, {k: bytes(v) for k, v in state["lanes"].items()}, it.accounting()))
            it.close()
        assert ends[1] == ends[0], seed
