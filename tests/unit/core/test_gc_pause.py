"""The collector pause around batch production: nesting, threads, errors, the caller's choice;
a long-lived pause (a restore) moves what it built to the oldest generation unwalked."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
import weakref

import numpy as np
import pytest

import zephon_jax as zj
from zephon_jax.core.gc_pause import paused_gc


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


class Node:
    """A tracked object that can be part of a cycle."""

    def __init__(self):
        self.other = None


def _oldest(objects) -> int:
    """How many of ``objects`` are in the oldest generation."""
    ids = {id(o) for o in objects}
    return sum(id(o) in ids for o in gc.get_objects(generation=2))


def test_a_long_lived_pause_moves_what_it_built_to_the_oldest_generation():
    gc.collect()
    with paused_gc(long_lived=True):
        kept = [Node() for _ in range(5000)]
    assert gc.isenabled()
    assert gc.get_count()[0] < 1000  # nothing left for a young collection to walk
    assert _oldest(kept) == len(kept)
    gc.collect()
    with paused_gc():  # a plain pause leaves them to the young collections
        young = [Node() for _ in range(5000)]
    assert _oldest(young) == 0


def test_a_long_lived_pause_nested_in_a_plain_one_moves_them_when_the_last_ends():
    gc.collect()
    with paused_gc():
        with paused_gc(long_lived=True):
            kept = [Node() for _ in range(2000)]
        assert _oldest(kept) == 0  # the outer pause still holds
    assert _oldest(kept) == len(kept)
    gc.collect()
    with paused_gc():  # the mark ended with the pause
        young = [Node() for _ in range(2000)]
    assert _oldest(young) == 0


def test_cycles_built_in_a_long_lived_pause_are_freed_by_a_full_collection():
    freed = []
    with paused_gc(long_lived=True):
        a, b = Node(), Node()
        a.other, b.other = b, a
        weakref.finalize(a, freed.append, True)
        del a, b
    gc.collect()
    assert freed == [True]


def test_a_long_lived_pause_leaves_frozen_objects_and_a_disabled_collector_alone():
    gc.collect()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with paused_gc(long_lived=True):
            young = [Node() for _ in range(2000)]
        assert gc.get_freeze_count() == frozen  # the program's freeze holds
        assert _oldest(young) == 0  # and nothing moved
    finally:
        gc.unfreeze()
    gc.disable()
    with paused_gc(long_lived=True):
        young = [Node() for _ in range(2000)]
    assert not gc.isenabled()
    assert _oldest(young) == 0


def test_set_state_leaves_the_restored_lanes_out_of_the_young_generation():
    ds = _pipeline()
    it = iter(zj.Loader(ds))
    for _ in range(3):
        next(it)
    state = it.get_state()
    expected = next(it)
    restored = iter(zj.Loader(ds))
    gc.collect()
    restored.set_state(state)
    assert gc.isenabled()
    assert gc.get_count()[0] < 1000
    lanes = list(restored._producer.lanes.values())
    assert _oldest(lanes) == len(lanes)
    np.testing.assert_array_equal(next(restored)["tokens"], expected["tokens"])


def _token_mixture():
    """A mixture by tokens on the column path, as the LLM pipeline of the docs."""
    docs = [np.arange(1 + (i * 53) % 150, dtype=np.int32) for i in range(400)]
    sources = [zj.Dataset.source([{"tokens": d} for d in docs[k::2]]) for k in range(2)]
    mixed = zj.Dataset.mix(sources, [0.7, 0.3], unit="tokens").shuffle(0)
    return mixed.split(64).pack(64).to_training(pad_id=0).batch(8)


def _records_path():
    """The general path: a map, a filter and a window shuffle after pack."""
    records = [{"tokens": np.arange(1 + (i * 37) % 90, dtype=np.int32)} for i in range(300)]
    ds = zj.Dataset.source(records).shuffle(3).filter(lambda r: len(r["tokens"]) > 1)
    return ds.map(lambda r: r).split(64).pack(64).window_shuffle(4, seed=1).batch(8)


_GARBAGE_PROGRAM = """
import gc, importlib.util, json
spec = importlib.util.spec_from_file_location("gc_pause_tests", {path!r})
tests = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tests)
import zephon_jax as zj
found = {{}}
for name in {names!r}:
    it = iter(zj.Loader(getattr(tests, name)()))
    for _ in range(5):
        next(it)
    gc.collect()
    gc.disable()
    for _ in range(30):
        next(it)
    found[name] = gc.collect()
    gc.enable()
print(json.dumps(found))
"""
_MAKERS = ["_pipeline", "_token_mixture", "_records_path"]


@pytest.fixture(scope="module")
def cyclic_garbage() -> dict[str, int]:
    """What a collection finds after 30 batches of each pipeline, in a fresh interpreter:
    in the test process, other threads (an object store client's event loop left by
    other tests) free cycles of their own while the batches are made, which the
    collection would count too."""
    program = _GARBAGE_PROGRAM.format(path=__file__, names=_MAKERS)
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("make", _MAKERS)
def test_batches_make_no_cyclic_garbage(make, cyclic_garbage):
    """The loader frees all it drops by reference counting: no cycles for the
    collector to find (the collector is paused while a batch is made)."""
    assert cyclic_garbage[make] == 0
