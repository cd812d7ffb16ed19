"""The Orbax handler and its args: what a save writes, restoring in place, the state taken
when an asynchronous save is requested, the primary process's meta, and what it refuses."""

from __future__ import annotations

import json

import numpy as np
import orbax.checkpoint as ocp
import pytest

import zephon_jax as zj
import zephon_jax.checkpoint as zc
from zephon_jax.state.files import lane_file

DOCS = [{"tokens": np.arange(n + 1, dtype=np.int32)} for n in range(10)]
LANES = 4


def pipeline(seed: int = 1) -> zj.BatchedDataset:
    return zj.Dataset.source(DOCS).shuffle(seed=seed).pack(10).batch(LANES)


def advanced(steps: int, **loader_kwargs) -> zj.LoaderIterator:
    it = iter(zj.Loader(pipeline(), **loader_kwargs))
    for _ in range(steps):
        next(it)
    return it


def rest(it: zj.LoaderIterator, steps: int) -> list[list]:
    return [next(it)["tokens"].tolist() for _ in range(steps)]


def test_save_writes_one_file_per_lane_and_the_meta(tmp_path):
    it = advanced(2)
    state = it.get_state()
    zc.LoaderCheckpointHandler().save(tmp_path, args=zc.Save(it))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        *(lane_file(lane) for lane in range(LANES)),
        "meta.json",
    ]
    for lane in range(LANES):
        assert (tmp_path / lane_file(lane)).read_bytes() == state["lanes"][str(lane)].tobytes()
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta == {
        "format": "zephon_jax.checkpoint",
        "version": 1,
        "state_format": "zephon_jax.state.global_state",
        "state_version": 1,
        "fingerprint": pipeline().fingerprint(),
        "step": 2,
        "num_lanes": LANES,
    }
    assert zc.LoaderCheckpointHandler().metadata(tmp_path) == meta
    assert zc.LoaderCheckpointHandler().metadata(tmp_path / "elsewhere") is None


def test_restore_sets_the_iterator_in_place_and_it_goes_on_exactly(tmp_path):
    handler = zc.LoaderCheckpointHandler()
    handler.save(tmp_path, args=zc.Save(advanced(3)))
    target = advanced(1)
    assert handler.restore(tmp_path, args=zc.Restore(target)) is target
    assert target.step == 3
    assert rest(target, 3) == rest(advanced(3), 3)


def test_a_checkpointer_saves_and_restores_through_the_registered_args(tmp_path):
    it = advanced(2)
    with ocp.Checkpointer(zc.LoaderCheckpointHandler()) as checkpointer:
        checkpointer.save(tmp_path / "item", args=zc.Save(it))
        target = iter(zj.Loader(pipeline()))
        restored = checkpointer.restore(tmp_path / "item", args=zc.Restore(target))
    assert restored is target and target.step == 2
    assert rest(target, 2) == rest(it, 2)


def test_an_async_save_holds_the_state_of_when_it_was_requested(tmp_path):
    it = advanced(2)
    expected = rest(advanced(2), 2)
    with ocp.AsyncCheckpointer(zc.LoaderCheckpointHandler()) as checkpointer:
        checkpointer.save(tmp_path / "item", args=zc.Save(it))
        rest(it, 3)  # training goes on while the files are written
        checkpointer.wait_until_finished()
    assert json.loads((tmp_path / "item" / "meta.json").read_text())["step"] == 2
    target = iter(zj.Loader(pipeline()))
    zc.LoaderCheckpointHandler().restore(tmp_path / "item", args=zc.Restore(target))
    assert rest(target, 2) == expected


def test_a_process_other_than_the_primary_writes_only_its_lanes(tmp_path):
    options = ocp.options.MultiprocessingOptions(primary_host=1)
    handler = zc.LoaderCheckpointHandler(multiprocessing_options=options)
    handler.save(tmp_path, args=zc.Save(advanced(1, process_index=1, process_count=2)))
    assert sorted(p.name for p in tmp_path.iterdir()) == [lane_file(2), lane_file(3)]
    assert handler.metadata(tmp_path) is None


def test_the_meta_keeps_the_excluded_documents_and_restore_reads_them(tmp_path):
    it = advanced(1)
    it.set_state(zj.exclude(it.get_state(), [(0, 4), (0, 2)]))
    zc.LoaderCheckpointHandler().save(tmp_path, args=zc.Save(it))
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["exclude"] == [[0, 2], [0, 4]]
    target = iter(zj.Loader(pipeline()))
    zc.LoaderCheckpointHandler().restore(tmp_path, args=zc.Restore(target))
    assert target.get_state()["exclude"] == [[0, 2], [0, 4]]
    assert rest(target, 3) == rest(it, 3)


@pytest.mark.parametrize("args", [zc.Save, zc.Restore])
def test_args_that_are_not_a_loader_iterator_are_refused(tmp_path, args):
    handler = zc.LoaderCheckpointHandler()
    method = handler.save if args is zc.Save else handler.restore
    with pytest.raises(TypeError) as info:
        method(tmp_path, args=args(zj.Loader(pipeline())))
    assert str(info.value) == (
        f"zephon_jax.checkpoint.{args.__name__} takes the iterator of a zephon_jax.Loader "
        "(iter(loader)); got Loader"
    )
    assert list(tmp_path.iterdir()) == []


def test_restore_refuses_another_pipeline_and_leaves_the_iterator_as_it_was(tmp_path):
    handler = zc.LoaderCheckpointHandler()
    handler.save(tmp_path, args=zc.Save(advanced(2)))
    other = iter(zj.Loader(pipeline(seed=2)))
    next(other)
    with pytest.raises(zj.StateMismatchError) as info:
        handler.restore(tmp_path, args=zc.Restore(other))
    assert info.value.field == "seeds"
    assert "state:    shuffle(1)\n  pipeline: shuffle(2)\n" in str(info.value)
    assert other.step == 1


def test_restore_refuses_an_incomplete_item_naming_what_is_missing(tmp_path):
    handler = zc.LoaderCheckpointHandler()
    handler.save(tmp_path, args=zc.Save(advanced(2)))
    (tmp_path / lane_file(1)).unlink()
    with pytest.raises(zj.StateError, match=r"has no file for lanes \[1\] of the 4 lanes"):
        handler.restore(tmp_path, args=zc.Restore(iter(zj.Loader(pipeline()))))
    # a process running lanes 2 and 3 only needs their files
    target = iter(zj.Loader(pipeline(), process_index=1, process_count=2))
    assert handler.restore(tmp_path, args=zc.Restore(target)).step == 2
    (tmp_path / "meta.json").unlink()
    with pytest.raises(zj.StateError, match=r"meta\.json is missing: the checkpoint item was"):
        handler.restore(tmp_path, args=zc.Restore(target))
