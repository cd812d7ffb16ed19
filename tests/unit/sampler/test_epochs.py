"""Epochs of mixture components: no record comes back before its component's epoch ends.

A mixture reads each component's own stream (``g = draw * num_lanes + lane``,
``epoch = g // len(source)``, each epoch a fresh permutation when shuffled), so
whatever the order of ``mix``, ``shuffle`` and ``repeat`` every lane must read
each component's epochs in order, every ``(record, epoch)`` at most once, and a
record may come back only once its component's epoch is nearly over: at most
the lanes' spread of draws apart (see ``docs/mixtures.md``, "Epochs").

The pipelines here put one record in each row and give every lane one row, so
row ``r`` of every batch is lane ``r``'s next draw in the order it was read.
"""

from __future__ import annotations

import os
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zephon_jax as zj
from zephon_jax.sampler.mixture import BLOCK

# Examples per (unit, shuffle placement) pair; ZEPHON_EPOCH_EXAMPLES=N runs a larger search.
EXAMPLES = int(os.environ.get("ZEPHON_EPOCH_EXAMPLES", "4"))
UNITS = ("records", "tokens", "stages")
SHUFFLES = ("none", "after mix", "after repeat", "components")


def documents(component: int, size: int, max_len: int, seed: int) -> list[dict]:
    """``size`` documents of 1..max_len tokens, each naming its component and record."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len + 1, size=size)
    return [
        {"tokens": np.full(int(n), component, np.int32), "id": np.array([component, i], np.int32)}
        for i, n in enumerate(lengths)
    ]


def ids_only(record: dict) -> dict:
    """Rows of one shape: the record's (component, record) id, its tokens dropped."""
    return {"id": record["id"]}


def delivered(ds: zj.BatchedDataset, steps: int, **loader) -> list[list[tuple[int, int, int]]]:
    """Per step, per row: (source, record, epoch) from provenance; stops where the input does."""
    it = iter(zj.Loader(ds, **loader))
    out = []
    for _ in range(steps):
        try:
            batch = next(it)
        except StopIteration:
            break
        rows = []
        for row, segments in zip(batch["id"], it.provenance()):
            (seg,) = segments
            assert (seg["source"], seg["record"]) == tuple(int(v) for v in row)
            rows.append((seg["source"], seg["record"], seg["epoch"]))
        out.append(rows)
    return out


def check_epochs(steps: list, sizes: list[int], skew: int | None) -> None:
    """Every lane reads each component's epochs in order; each (record, epoch) comes once;
    with ``skew``, at most ``skew`` records of epoch e are still to come when epoch e+1
    begins."""
    last_epoch: dict = {}
    seen: dict = defaultdict(set)  # (source, epoch) -> records
    for step, rows in enumerate(steps):
        for lane, (source, record, epoch) in enumerate(rows):
            before = last_epoch.get((lane, source), 0)
            assert epoch >= before, (
                f"step {step}: lane {lane} read epoch {epoch} of source {source} after epoch "
                f"{before}"
            )
            last_epoch[lane, source] = epoch
            assert record not in seen[source, epoch], (
                f"step {step}: record {record} of source {source} came twice in epoch {epoch}"
            )
            if skew is not None and epoch >= 1 and not seen[source, epoch]:
                pending = sizes[source] - len(seen[source, epoch - 1])
                assert pending <= skew, (
                    f"step {step}: epoch {epoch} of source {source} began with {pending} "
                    f"records of epoch {epoch - 1} still to come (bound {skew})"
                )
            seen[source, epoch].add(record)


def test_a_shuffled_mixture_reads_every_record_once_before_any_repeats():
    """The README's shape: two sources of 1,000 records, weights 0.5/0.5, shuffled after
    the mixture. 800 rows read under half of each source: 800 distinct records."""
    a, b = documents(0, 1000, 1, 0), documents(1, 1000, 1, 1)
    ds = (
        zj.Dataset.mix([zj.Dataset.source(a), zj.Dataset.source(b)], weights=[0.5, 0.5])
        .shuffle(seed=0)
        .map(ids_only)
        .batch(16)
    )
    steps = delivered(ds, 50)
    records = [(s, r) for rows in steps for s, r, _ in rows]
    assert len(records) == 800 and len(set(records)) == 800
    assert {e for rows in steps for _, _, e in rows} == {0}
    check_epochs(delivered(ds, 400), [1000, 1000], skew=16 * (BLOCK // 2 + 4))


def test_shuffle_orders_of_mix_and_repeat_agree_on_epochs():
    """shuffle after mix, after repeat, before repeat, and inside each component: every
    order reads each component's epochs in order, and a finite repeat reads each record
    exactly num_epochs times."""
    sizes = [37, 23]
    srcs = [documents(c, n, 1, c) for c, n in enumerate(sizes)]

    def mix(shuffle_inside: bool) -> zj.Dataset:
        parts = [zj.Dataset.source(s) for s in srcs]
        if shuffle_inside:
            parts = [p.shuffle(seed=3 + i) for i, p in enumerate(parts)]
        return zj.Dataset.mix(parts, weights=[0.6, 0.4])

    orders = {
        "mix-shuffle-repeat": mix(False).shuffle(seed=5).repeat(3),
        "mix-repeat-shuffle": mix(False).repeat(3).shuffle(seed=5),
        "shuffled components": mix(True).repeat(3),
    }
    for name, ds in orders.items():
        steps = delivered(ds.map(ids_only).batch(4), 1000)
        check_epochs(steps, sizes, skew=4 * (BLOCK // 2 + 4))
        counts = defaultdict(int)
        for rows in steps:
            for s, r, _ in rows:
                counts[s, r] += 1
        # Each component splits its draws among the 4 lanes within one of each other, and
        # iteration ends when the first lane runs out: at most 4 per component are left.
        assert sum(counts.values()) >= 3 * sum(sizes) - 4 * len(sizes), name
        assert max(counts.values()) == 3, name


@st.composite
def compositions(draw) -> dict:
    k = draw(st.integers(1, 3))
    return {
        "sizes": [draw(st.integers(3, 40)) for _ in range(k)],
        "max_len": draw(st.integers(1, 9)),
        "weights": [draw(st.integers(1, 9)) for _ in range(k)],
        "epochs": draw(st.sampled_from([None, 1, 2, 3])),
        "batch": draw(st.sampled_from([1, 2, 3, 4, 8])),
        "processes": draw(st.sampled_from([1, 2])),
        "seed": draw(st.integers(0, 2**16)),
    }


def build(spec: dict) -> zj.BatchedDataset:
    parts = []
    for c, size in enumerate(spec["sizes"]):
        part = zj.Dataset.source(documents(c, size, spec["max_len"], spec["seed"] + c))
        if spec["shuffle"] == "components":
            part = part.shuffle(seed=spec["seed"] + 10 + c)
        parts.append(part)
    weights, unit = spec["weights"], spec["unit"]
    if unit == "stages":  # a second stage reverses the weights from step 3 on
        ds = zj.Dataset.mix(parts, weights={0: weights, 3: weights[::-1]})
    else:
        ds = zj.Dataset.mix(parts, weights=weights, unit=unit)
    if spec["shuffle"] == "after mix":
        ds = ds.shuffle(seed=spec["seed"])
    if spec["epochs"] is not None:
        ds = ds.repeat(spec["epochs"])
    if spec["shuffle"] == "after repeat":
        ds = ds.shuffle(seed=spec["seed"])
    return ds.map(ids_only).batch(spec["batch"])


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(spec=compositions())
@pytest.mark.parametrize("unit", UNITS)
@pytest.mark.parametrize("shuffle", SHUFFLES)
def test_any_composition_reads_each_component_epoch_by_epoch(shuffle, unit, spec):
    spec = {**spec, "unit": unit, "shuffle": shuffle}
    ds = build(spec)
    steps = delivered(ds, 60)
    # Fixed weights by records: every lane draws one record per row, so lanes differ
    # by at most ~BLOCK/4 draws of a component each way, plus one per two-way split.
    skew = spec["batch"] * (BLOCK // 2 + 4) if spec["unit"] == "records" else None
    check_epochs(steps, spec["sizes"], skew)
    if spec["processes"] > 1 and spec["batch"] % spec["processes"] == 0:
        parts = [
            delivered(ds, 60, process_index=i, process_count=spec["processes"])
            for i in range(spec["processes"])
        ]
        merged = [sum((p[t] for p in parts), []) for t in range(len(parts[0]))]
        assert merged == steps


@pytest.mark.parametrize("unit", ["records", "tokens"])
def test_a_lane_never_reads_a_later_epoch_of_a_component_first(unit):
    """A long run over small components with a rare one: each lane's epochs of each
    component only go up (the defect read epoch 8 of a source before its epoch 0)."""
    sizes = [50, 7]
    srcs = [zj.Dataset.source(documents(c, n, 5, c)) for c, n in enumerate(sizes)]
    ds = zj.Dataset.mix(srcs, weights=[0.9, 0.1], unit=unit).shuffle(seed=1)
    check_epochs(delivered(ds.map(ids_only).batch(8), 300), sizes, skew=None)
