"""The collector pause around batch production: nesting, threads, errors, the caller's choice."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import zephon_jax as zj
from zephon_jax.gc_pause import paused_gc


@pytest.fixture(autouse=True)
def _collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_pause_nests_and_restores_the_collector():
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled()


def test_pause_ends_on_an_error():
    with pytest.raises(ValueError):
        with paused_gc():
            raise ValueError("boom")
    assert gc.isenabled()


def test_a_collector_disabled_by_the_program_stays_disabled():
    gc.disable()
    with paused_gc():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_pauses_overlapping_across_threads_end_with_the_last():
    entered, release = threading.Event(), threading.Event()

    def other():
        with paused_gc():
            entered.set()
            release.wait(5)

    thread = threading.Thread(target=other)
    thread.start()
    assert entered.wait(5)
    with paused_gc():
        pass
    assert not gc.isenabled()  # the other thread's pause is still running
    release.set()
    thread.join(5)
    assert gc.isenabled()


def _pipeline():
    records = [{"tokens": np.arange(1 + (i * 37) % 90, dtype=np.int32)} for i in range(300)]
    return zj.Dataset.source(records).shuffle(3).split(64).pack(64).batch(8)


def test_batches_are_made_with_the_collector_paused_and_it_is_on_between_them():
    seen = []

    def note(record):
        seen.append(gc.isenabled())
        return record

    records = [{"tokens": np.arange(1 + i % 50, dtype=np.int32)} for i in range(200)]
    ds = zj.Dataset.source(records).shuffle(1).split(32).map(note).pack(32).batch(4)
    it = iter(zj.Loader(ds))
    for _ in range(5):
        next(it)
        assert gc.isenabled()
    assert seen and not any(seen)


def test_loader_errors_leave_the_collector_on():
    def bad(record):
        raise RuntimeError("bad record")

    records = [{"tokens": np.arange(5, dtype=np.int32)} for _ in range(10)]
    it = iter(zj.Loader(zj.Dataset.source(records).map(bad).batch(2)))
    with pytest.raises(Exception, match="bad record"):
        next(it)
    assert gc.isenabled()
