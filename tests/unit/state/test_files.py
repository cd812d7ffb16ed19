"""``save_state`` / ``load_state``: one-file states (magic line, encoding, CRC-32) and the
item directories of an Orbax checkpoint (``meta.json`` and one file per lane)."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

import zephon_jax as zj
from zephon_jax.errors import StateError
from zephon_jax.state.envelope import CHECKPOINT
from zephon_jax.state.files import MAGIC, lane_file, load_state, read_checkpoint_item, save_state


@pytest.fixture(scope="module")
def state():
    docs = [{"tokens": np.arange(1, 4 + i % 7, dtype=np.int32)} for i in range(40)]
    it = iter(zj.Loader(zj.Dataset.source(docs).shuffle(3).pack(16).batch(4)))
    for _ in range(2):
        next(it)
    return it.get_state()


def assert_same_state(got, want):
    assert {k: v for k, v in got.items() if k != "lanes"} == {
        k: v for k, v in want.items() if k != "lanes"
    }
    assert sorted(got["lanes"]) == sorted(want["lanes"])
    for lane, data in want["lanes"].items():
        np.testing.assert_array_equal(got["lanes"][lane], data)


def write_item(directory, state, **meta_changes):
    """A checkpoint item directory as zephon_jax.checkpoint writes it."""
    directory.mkdir(parents=True)
    for lane, data in state["lanes"].items():
        (directory / lane_file(int(lane))).write_bytes(np.asarray(data, np.uint8).tobytes())
    meta = {
        **CHECKPOINT.header(),
        "fingerprint": state["fingerprint"],
        "step": state["step"],
        "num_lanes": len(state["lanes"]),
        **meta_changes,
    }
    (directory / "meta.json").write_text(json.dumps(meta))
    return directory


def test_lane_file_names():
    assert lane_file(0) == "lane_00000.bin"
    assert lane_file(123) == "lane_00123.bin"


def test_a_state_file_is_magic_encoding_and_crc_and_loads_back(state, tmp_path):
    path = tmp_path / "state.bin"
    save_state(state, path)
    data = path.read_bytes()
    assert MAGIC == b"zephon_jax.state.global_state-file 1\n" and data.startswith(MAGIC)
    body = data[len(MAGIC) : -4]
    assert data[-4:] == zlib.crc32(body).to_bytes(4, "little")
    assert not (tmp_path / "state.bin.tmp").exists()
    assert_same_state(load_state(path), state)


def test_a_damaged_or_foreign_file_is_refused(state, tmp_path):
    path = tmp_path / "state.bin"
    save_state(state, path)
    data = bytearray(path.read_bytes())
    data[len(MAGIC) + 5] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(StateError, match=r"state\.bin is corrupt \(checksum mismatch\)"):
        load_state(path)
    path.write_bytes(b"{}")
    with pytest.raises(StateError, match="is not a zephon_jax state file"):
        load_state(path)
    with pytest.raises(StateError, match="cannot read the state file"):
        load_state(tmp_path / "missing.bin")


def test_a_checkpoint_item_or_its_step_directory_loads(state, tmp_path):
    item = write_item(tmp_path / "7" / "data", state)
    assert_same_state(load_state(item), state)
    assert_same_state(load_state(tmp_path / "7"), state)  # the one item in the step
    some = read_checkpoint_item(item, lanes=[1, 3])
    assert sorted(some["lanes"]) == ["1", "3"]


def test_a_step_directory_with_two_items_needs_one_named(state, tmp_path):
    write_item(tmp_path / "7" / "a", state)
    write_item(tmp_path / "7" / "b", state)
    with pytest.raises(StateError, match=r"holds several \(\['a', 'b'\]\): name one of them"):
        load_state(tmp_path / "7")


def test_lane_files_without_meta_are_an_unfinished_save(state, tmp_path):
    item = write_item(tmp_path / "data.orbax-checkpoint-tmp", state)
    (item / "meta.json").unlink()
    with pytest.raises(StateError, match=r"incomplete .* 4 lane files but no meta\.json") as info:
        load_state(item)
    assert "Orbax's temporary directory" in str(info.value)


def test_a_missing_or_damaged_lane_file_is_named(state, tmp_path):
    item = write_item(tmp_path / "data", state)
    data = (item / lane_file(2)).read_bytes()
    (item / lane_file(2)).write_bytes(data[:-1])
    with pytest.raises(StateError, match=r"lane_00002\.bin is truncated or corrupt"):
        load_state(item)
    (item / lane_file(2)).unlink()
    with pytest.raises(StateError, match=r"has no file for lanes \[2\] of the 4 lanes"):
        load_state(item)


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"num_lanes": 0}, r"'num_lanes' is 0; the checkpoint is corrupt"),
        ({"format": "other"}, r"format is 'other', not 'zephon_jax\.checkpoint'"),
        ({"version": 2}, r"has version 2; this zephon_jax reads version 1"),
    ],
)
def test_a_bad_meta_is_refused(state, tmp_path, changes, match):
    item = write_item(tmp_path / "data", state, **changes)
    with pytest.raises(StateError, match=match):
        load_state(item)


def test_meta_that_is_not_json_is_refused(state, tmp_path):
    item = write_item(tmp_path / "data", state)
    (item / "meta.json").write_text("{not json")
    with pytest.raises(StateError, match=r"meta\.json is not valid JSON"):
        load_state(item)
