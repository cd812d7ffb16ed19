"""Shared test fixtures: small corpora, pipelines, and topology runners."""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator, NamedTuple

import numpy as np

import zephon_jax as zj
from zephon_jax.core.kernels import kernels


def user_module(tmp_path, monkeypatch, name: str, source: str) -> Iterator[str]:
    """Yields ``name``, a module of ``source`` importable for the test (a generator for a
    pytest fixture): written under ``tmp_path``, put on ``sys.path``, never cached past it."""
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    yield name
    sys.modules.pop(name, None)


@contextlib.contextmanager
def kernels_set(enabled: bool | None) -> Iterator[None]:
    """Runs the block under ``zj.set_compiled(enabled)``, then restores the choice before."""
    previous = zj.set_compiled(enabled)
    try:
        yield
    finally:
        zj.set_compiled(previous)


def tag_compiled(record):
    """The record's process runs the compiled kernels (1) or not (0): a map that lets a
    test see what a loader worker chose."""
    return {"compiled": np.array([kernels() is not None], np.int8)}


def make_docs(num_docs: int, max_len: int, seed: int, vocab: int = 1000, min_len: int = 1):
    """Documents ``{"tokens": int32 array}`` with lengths uniform in [min_len, max_len]."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_len, max_len + 1, size=num_docs)
    return [{"tokens": rng.integers(1, vocab, size=int(n)).astype(np.int32)} for n in lengths]


class Joined(NamedTuple):
    held: tuple = ()
    tokens: int = 0


def join_init(lane):
    return Joined()


def join_step(min_len, carry, element):
    """Joins records until ``min_len`` tokens: a ``lineage_operator`` whose carry holds
    the elements (pointers); ``join_make`` concatenates them."""
    carry = Joined(carry.held + (element,), carry.tokens + len(element.data["tokens"]))
    if carry.tokens < min_len:
        return carry, []
    return Joined(), [zj.made_from(carry.held)]


def join_flush(carry):
    return Joined(), [zj.made_from(carry.held)] if carry.held else []


def join_make(recipe, records):
    return {"tokens": np.concatenate([r["tokens"] for r in records])}


def add_one(record):
    return {"tokens": record["tokens"] + 1}


def not_multiple_of_seven(record):
    return len(record["tokens"]) % 7 != 0


def full_pipeline(batch_size: int = 8, num_lanes: int | None = None) -> zj.BatchedDataset:
    """mix + shuffle + map + filter + split + pack + window_shuffle."""
    a = zj.Dataset.source(make_docs(300, 150, seed=1))
    b = zj.Dataset.source(make_docs(200, 40, seed=2, vocab=500))
    return (
        zj.Dataset.mix([a, b], [0.7, 0.3])
        .shuffle(seed=3)
        .map(add_one)
        .filter(not_multiple_of_seven)
        .split(48)
        .pack(48, method="best_fit", num_bins=6)
        .window_shuffle(4, seed=5)
        .batch(batch_size, num_lanes=num_lanes)
    )


def take(iterator, steps: int) -> list:
    return [next(iterator) for _ in range(steps)]


def run_topology(ds: zj.BatchedDataset, process_count: int, steps: int, **loader_kwargs) -> list:
    """Global batches assembled from ``process_count`` processes' rows (in process order)."""
    iterators = [
        iter(zj.Loader(ds, process_index=i, process_count=process_count, **loader_kwargs))
        for i in range(process_count)
    ]
    return [concat_parts([next(it) for it in iterators]) for _ in range(steps)]


def concat_parts(parts: list):
    if isinstance(parts[0], dict):
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return np.concatenate(parts)


def assert_batches_equal(actual: list, expected: list) -> None:
    """Exact equality (bytes, dtype, shape) of whole global batches."""
    assert len(actual) == len(expected)
    for step, (a, e) in enumerate(zip(actual, expected)):
        if isinstance(e, dict):
            assert list(a) == list(e), f"step {step}: fields {list(a)} != {list(e)}"
            for key in e:
                _assert_array_equal(a[key], e[key], f"step {step}, field {key!r}")
        else:
            _assert_array_equal(a, e, f"step {step}")


def assert_batch_equal(got, want) -> None:
    """Exact equality of one batch (numpy or jax arrays) with a numpy batch."""
    assert sorted(got) == sorted(want)
    for name in want:
        value = np.asarray(got[name])
        assert value.dtype == want[name].dtype and value.tobytes() == want[name].tobytes(), name


def _assert_array_equal(a, e, where: str) -> None:
    a, e = np.asarray(a), np.asarray(e)
    assert a.dtype == e.dtype, f"{where}: dtype {a.dtype} != {e.dtype}"
    assert a.shape == e.shape, f"{where}: shape {a.shape} != {e.shape}"
    if a.tobytes() != e.tobytes():
        rows = [r for r in range(a.shape[0]) if a[r].tobytes() != e[r].tobytes()]
        raise AssertionError(f"{where}: rows {rows} differ")


def resume_across(ds, steps: int, save_at: int, save_procs: int, restore_procs: int, **kw) -> list:
    """Runs ``save_at`` steps on ``save_procs`` processes, merges their states, and
    continues on ``restore_procs`` processes; returns the batches after ``save_at``."""
    iterators = [
        iter(zj.Loader(ds, process_index=i, process_count=save_procs, **kw))
        for i in range(save_procs)
    ]
    for _ in range(save_at):
        for it in iterators:
            next(it)
    state = zj.merge_states([it.get_state() for it in iterators])
    restored = [
        iter(zj.Loader(ds, process_index=i, process_count=restore_procs, **kw))
        for i in range(restore_procs)
    ]
    for it in restored:
        it.set_state(state)
    return [concat_parts([next(it) for it in restored]) for _ in range(steps - save_at)]


STAGED_TOKEN_WEIGHTS = {0: [0.5, 0.3, 0.2], 6: [0.0, 0.5, 0.5], 14: [0.2, 0.3, 0.5]}
RAMP = {0: 4, 5: 8, 11: 16}


def schedule_pipeline(sizes=None, num_lanes: int | None = None) -> zj.BatchedDataset:
    """Token-weighted staged mixture + shuffle + map + split + pack + batch-size ramp-up.

    Stages change at steps 6 and 14 (the first component has weight 0 in the
    second stage); the batch grows at steps 5 and 11; the third source ends after
    three epochs on some lanes partway through.
    """
    a = zj.Dataset.source(make_docs(300, 150, seed=1))
    b = zj.Dataset.source(make_docs(200, 40, seed=2, vocab=500)).map(add_one)
    c = zj.Dataset.source(make_docs(100, 10, seed=3, vocab=50)).repeat(3)
    return (
        zj.Dataset.mix([a, b, c], STAGED_TOKEN_WEIGHTS, unit="tokens")
        .shuffle(seed=3)
        .filter(not_multiple_of_seven)
        .split(48)
        .pack(48, method="best_fit", num_bins=6)
        .batch(RAMP if sizes is None else sizes, num_lanes=num_lanes)
    )
