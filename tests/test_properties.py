"""Property search: random pipelines, topologies and resumes all give the same global batches.

For a random pipeline (1-3 sources with random lengths and weights, shuffle or
not, map, random_map, filter, split, pack with a random method, window_shuffle,
flat_map and user-defined operators) and a random batch size and lane count,
the run is cut at random checkpoint steps into 2-4 phases, each on another
topology (process count, and worker count when workers are available). At each
cut the processes' states are merged with ``merge_states`` and passed through
the codec or JSON, which proves they are plain data. Every global batch must be
byte-identical to the uninterrupted single-process run, and every process must
end at the same batch when the input is finite. A second search adds mixtures by
tokens, a second stage of mixture weights and a batch-size ramp-up (in-process
topologies only, so it stays fast).

The normal suite runs a small derandomized profile. Set
``ZEPHON_PROPERTY_EXAMPLES=N`` to run ``N`` examples instead, and
``ZEPHON_PROPERTY_WORKERS=0`` to search without loader workers.
"""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from pipelines import assert_batches_equal, concat_parts

import zephon_jax as zj
from zephon_jax import codec

EXAMPLES = int(os.environ.get("ZEPHON_PROPERTY_EXAMPLES", "25"))
HAS_WORKERS = importlib.util.find_spec("zephon_jax.workers") is not None
# ZEPHON_PROPERTY_WORKERS=0 searches without loader workers (no process starts).
WORKER_COUNTS = (
    (0, 1, 2) if HAS_WORKERS and os.environ.get("ZEPHON_PROPERTY_WORKERS") != "0" else (0,)
)
BATCH_SIZES = (1, 2, 3, 4, 6, 8)


# ----- pipeline pieces (module level, so that they pickle for worker processes) ----------
def make_source(index: int, num_docs: int, max_len: int, seed: int) -> list[dict]:
    """Documents of 1..max_len tokens; the first has one token, which every filter keeps."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len + 1, size=num_docs)
    lengths[0] = 1
    base = 1000 * (index + 1)
    return [
        {"tokens": (base + rng.integers(0, 1000, size=int(n))).astype(np.int32)} for n in lengths
    ]


def add_three(record):
    return {**record, "tokens": record["tokens"] + 3}


def jitter(record, rng):
    return {**record, "tokens": record["tokens"] + rng.integers(0, 50, size=len(record["tokens"]))}


class KeepIfLengthNotMultiple:
    """A pure filter: keeps records whose length is not a multiple of ``k``."""

    def __init__(self, k: int):
        self.k = k

    def __call__(self, record) -> bool:
        return len(record["tokens"]) % self.k != 0


def halves(record):
    """A pure flat_map: the two halves of every field (an empty second half is dropped)."""
    cut = (len(record["tokens"]) + 1) // 2
    first = {k: v[:cut] for k, v in record.items()}
    second = {k: v[cut:] for k, v in record.items()}
    return [first, second] if len(second["tokens"]) else [first]


class MergePairs(zj.Operator):
    """A user operator: concatenates consecutive pairs of records (carry: one record)."""

    def init(self):
        return None

    def step(self, carry, record):
        if carry is None:
            return dict(record), []
        return None, [{k: np.concatenate([carry[k], record[k]]) for k in record}]

    def flush(self, carry):
        return None, ([] if carry is None else [carry])


class SwapPairs(zj.Operator):
    """A user operator: emits each pair of records in reverse order, plus a count."""

    def init(self):
        return {"held": None, "count": 0}

    def step(self, carry, record):
        if carry["held"] is None:
            return {"held": dict(record), "count": carry["count"] + 1}, []
        return {"held": None, "count": carry["count"] + 1}, [record, carry["held"]]

    def flush(self, carry):
        held = carry["held"]
        return {"held": None, "count": carry["count"]}, ([] if held is None else [held])


def build(spec: dict) -> zj.BatchedDataset:
    """The batched dataset a spec (plain data drawn by hypothesis) describes."""
    parts = [zj.Dataset.source(make_source(i, *src)) for i, src in enumerate(spec["sources"])]
    weights = spec["weights"]
    if spec.get("stage") is not None:
        start, later = spec["stage"]
        weights = {0: weights, start: later[: len(weights)]}
    ds = (
        parts[0]
        if len(parts) == 1
        else zj.Dataset.mix(parts, weights, unit=spec.get("unit", "records"))
    )
    if spec["epochs"] is not None:
        ds = ds.repeat(spec["epochs"])
    if spec["shuffle"] is not None:
        ds = ds.shuffle(spec["shuffle"])
    if spec["map"]:
        ds = ds.map(add_three)
    if spec["random_map"] is not None:
        ds = ds.random_map(jitter, seed=spec["random_map"])
    if spec["filter"] is not None:
        ds = ds.filter(KeepIfLengthNotMultiple(spec["filter"]))
    ds = add_ops(ds, spec["pre_ops"])
    method, seq_len, num_bins = spec["pack"]
    if method != "concat":
        ds = ds.split(seq_len)
    ds = ds.pack(seq_len, method=method, num_bins=num_bins)
    ds = add_ops(ds, spec["post_ops"])
    batch = spec["batch"]
    if spec.get("ramp") is not None:
        start, factor = spec["ramp"]
        batch = {0: batch, start: batch * factor}
    return ds.batch(batch, num_lanes=spec["lanes"])


def add_ops(ds: zj.Dataset, ops: list) -> zj.Dataset:
    for op in ops:
        name = op[0]
        if name == "split":
            ds = ds.split(op[1])
        elif name == "window_shuffle":
            ds = ds.window_shuffle(op[1], seed=op[2])
        elif name == "flat_map":
            ds = ds.flat_map(halves)
        elif name == "merge_pairs":
            ds = ds.apply(MergePairs())
        elif name == "swap_pairs":
            ds = ds.apply(SwapPairs())
        elif name == "map":
            ds = ds.map(add_three)
        else:  # pragma: no cover
            raise AssertionError(op)
    return ds


# ----- strategies ---------------------------------------------------------------------------
def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def specs(draw) -> dict:
    num_sources = draw(st.integers(1, 3))
    sources = [
        (draw(st.integers(1, 30)), draw(st.integers(1, 20)), draw(st.integers(0, 2**16)))
        for _ in range(num_sources)
    ]
    weights = [draw(st.integers(1, 5)) for _ in range(num_sources)]
    pre = st.one_of(
        st.tuples(st.just("split"), st.integers(1, 12)),
        st.tuples(st.just("window_shuffle"), st.integers(1, 5), st.integers(0, 99)),
        st.tuples(st.just("flat_map")),
        st.tuples(st.just("merge_pairs")),
    )
    post = st.one_of(
        st.tuples(st.just("window_shuffle"), st.integers(1, 5), st.integers(0, 99)),
        st.tuples(st.just("swap_pairs")),
        st.tuples(st.just("map")),
    )
    method = draw(st.sampled_from(["best_fit", "first_fit", "concat"]))
    num_bins = None if method == "concat" else draw(st.integers(1, 6))
    batch = draw(st.sampled_from(BATCH_SIZES))
    steps = draw(st.integers(1, 10))
    cuts = sorted(draw(st.sets(st.integers(0, steps), min_size=1, max_size=3)))
    processes = divisors(batch)[:4]
    workers = list(WORKER_COUNTS)
    phases = []
    for _ in range(len(cuts) + 1):
        options = [(p, w) for p in processes for w in workers]
        if phases and len(options) > 1:
            options.remove(phases[-1])  # every restore lands on another topology
        # Workers cost a process start each: use them in about one phase in four.
        cheap = [o for o in options if o[1] == 0] or options
        phases.append(draw(st.sampled_from(options if draw(st.integers(0, 3)) == 0 else cheap)))
    return {
        "sources": sources,
        "weights": weights,
        "epochs": draw(st.sampled_from([None, None, None, 1, 2])),
        "shuffle": draw(st.one_of(st.none(), st.integers(0, 2**31))),
        "map": draw(st.booleans()),
        "random_map": draw(st.one_of(st.none(), st.integers(0, 99))),
        "filter": draw(st.one_of(st.none(), st.integers(2, 5))),
        "pre_ops": draw(st.lists(pre, max_size=3)),
        "pack": (method, draw(st.integers(4, 24)), num_bins),
        "post_ops": draw(st.lists(post, max_size=2)),
        "batch": batch,
        "lanes": draw(st.sampled_from(divisors(batch))),
        "steps": steps,
        "cuts": cuts,
        "phases": phases,
        "state_form": draw(st.sampled_from(["codec", "json"])),
    }


@st.composite
def schedule_specs(draw) -> dict:
    """A spec whose mixture is by records or tokens, with a second stage of weights (zeros
    allowed, positive sum) and a batch ramp-up, each or not; in-process topologies only."""
    spec = draw(specs())
    later = [draw(st.integers(0, 5)) for _ in range(3)]
    later[draw(st.integers(0, len(spec["sources"]) - 1))] += 1
    spec["unit"] = draw(st.sampled_from(["records", "tokens"]))
    spec["stage"] = draw(st.one_of(st.none(), st.tuples(st.integers(1, 8), st.just(later))))
    ramp = st.tuples(st.integers(1, 8), st.sampled_from([2, 3]))
    spec["ramp"] = draw(st.one_of(st.none(), ramp))
    phases = [(procs, 0) for procs, _ in spec["phases"]]
    spec["phases"] = [p for i, p in enumerate(phases) if i == 0 or p != phases[i - 1]]
    spec["cuts"] = spec["cuts"][: len(spec["phases"]) - 1]
    return spec


# ----- running --------------------------------------------------------------------------------
def reference(ds: zj.BatchedDataset, steps: int) -> list:
    """The uninterrupted single-process run (shorter if a finite input ends)."""
    it = iter(zj.Loader(ds))
    out = []
    for _ in range(steps):
        try:
            out.append(next(it))
        except StopIteration:
            break
    return out


def next_global(iterators: list):
    """The next global batch from every process's iterator, or None if all ended."""
    parts = []
    for it in iterators:
        try:
            parts.append(next(it))
        except StopIteration:
            parts.append(None)
    ended = [p is None for p in parts]
    assert all(ended) or not any(ended), f"processes disagree on the end: ended={ended}"
    return None if ended[0] else concat_parts(parts)


def as_plain(state: dict, form: str) -> dict:
    """The state after a round trip through the codec or JSON (both accept plain data only)."""
    if form == "codec":
        return codec.decode(codec.encode(state))
    plain = {**state, "lanes": {k: np.asarray(v).tolist() for k, v in state["lanes"].items()}}
    return json.loads(json.dumps(plain))


def run_phases(ds: zj.BatchedDataset, spec: dict) -> list:
    """Runs the phases of ``spec``, each on its topology, resuming from the merged state."""
    bounds = [*spec["cuts"], spec["steps"]]
    batches, state, start = [], None, 0
    for (procs, workers), stop in zip(spec["phases"], bounds):
        iterators = [
            iter(zj.Loader(ds, process_index=i, process_count=procs, num_workers=workers))
            for i in range(procs)
        ]
        try:
            if state is not None:
                for it in iterators:
                    it.set_state(state)
            for _ in range(start, stop):
                batch = next_global(iterators)
                if batch is None:
                    return batches
                batches.append(batch)
            merged = zj.merge_states([it.get_state() for it in iterators])
            assert merged["step"] == len(batches)
            state = as_plain(merged, spec["state_form"])
        finally:
            for it in iterators:
                close = getattr(it, "close", None)
                if close is not None:
                    close()
        start = stop
    return batches


def check(spec: dict) -> None:
    ds = build(spec)
    try:
        expected = reference(ds, spec["steps"])
    except zj.RecordError as e:
        # The filter drops every record some lane reads (e.g. 2 lanes over 2 unshuffled
        # records): the loader rightly refuses to wait forever; not a usable pipeline.
        if "filters dropped all" not in str(e):
            raise
        reject()
    assert_batches_equal(run_phases(ds, spec), expected)


@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
@given(specs())
def test_any_pipeline_topology_and_resume_gives_the_same_batches(spec):
    check(spec)


@settings(
    max_examples=2 * EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
@given(schedule_specs())
def test_token_and_staged_mixtures_and_ramps_give_the_same_batches(spec):
    check(spec)


# ----- regressions found by the search ------------------------------------------------------
# A finite input ends at the first batch some lane cannot fill; processes that ran only
# their own lanes used to disagree on it (process 0 produced one batch more).
FINITE_SPEC = {
    "sources": [(23, 7, 4)],
    "weights": [1],
    "epochs": 1,
    "shuffle": None,
    "map": False,
    "random_map": None,
    "filter": None,
    "pre_ops": [],
    "pack": ("best_fit", 8, 2),
    "post_ops": [],
    "batch": 4,
    "lanes": 4,
    "steps": 10,
    "cuts": [1],
    "phases": [(4, 0), (2, 0)],
    "state_form": "codec",
}


def test_finite_input_ends_at_the_same_batch_on_every_process():
    ds = build(FINITE_SPEC)
    for procs in (1, 2, 4):
        its = [iter(zj.Loader(ds, process_index=i, process_count=procs)) for i in range(procs)]
        counts = [sum(1 for _ in it) for it in its]
        assert len(set(counts)) == 1, counts
    check(FINITE_SPEC)


@pytest.mark.skipif(not HAS_WORKERS, reason="zephon_jax.workers is not available")
@pytest.mark.parametrize(
    "spec",
    [
        {**FINITE_SPEC, "phases": [(2, 0), (4, 1)]},
        # The smallest example the search found: lane 1 of 2 has no record at all.
        {
            **FINITE_SPEC,
            "sources": [(1, 1, 0)],
            "pack": ("best_fit", 4, 1),
            "batch": 2,
            "lanes": 2,
            "steps": 1,
            "cuts": [0],
            "phases": [(1, 0), (2, 1)],
        },
    ],
)
def test_finite_input_ends_at_the_same_batch_on_every_process_with_workers(spec):
    check(spec)
