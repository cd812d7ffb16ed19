"""Loader states on disk: one-file states, and the lane files of an Orbax checkpoint item.

``save_state(state, path)`` writes a state (from ``get_state`` or
``merge_states``) as one file: a magic line, the state in zephon_jax's plain-data
encoding, and a CRC-32. ``load_state(path)`` reads such a file, or the item
directory that :mod:`zephon_jax.checkpoint` wrote inside an Orbax checkpoint
(``meta.json`` plus one ``lane_NNNNN.bin`` per lane), or a checkpoint step
directory holding exactly one such item. Neither needs jax or orbax.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from typing import Any, Iterable, Mapping

import numpy as np

from zephon_jax.errors import StateError
from zephon_jax.state import codec
from zephon_jax.state.envelope import CHECKPOINT, STATE_FILE, is_int
from zephon_jax.state.global_state import EXCLUDE, STATE_FORMAT, STATE_VERSION, check_state
from zephon_jax.state.lane_format import lane_checksum

MAGIC = f"{STATE_FILE.format} {STATE_FILE.version}\n".encode()
CHECKPOINT_FORMAT = CHECKPOINT.format
CHECKPOINT_VERSION = CHECKPOINT.version
META_FILE = "meta.json"
_UNFINISHED = ".orbax-checkpoint-tmp"  # how Orbax names the directory of a save in flight


def lane_file(lane: int) -> str:
    """The name of lane ``lane``'s file in a checkpoint item directory."""
    return f"lane_{lane:05d}.bin"


def save_state(state: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Writes ``state`` to the file ``path`` (replaced atomically)."""
    check_state(state)
    plain = dict(state)
    plain["lanes"] = {k: np.asarray(v, np.uint8).tobytes() for k, v in state["lanes"].items()}
    body = codec.encode(plain)
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "wb") as f:
        f.write(MAGIC + body + zlib.crc32(body).to_bytes(4, "little"))
    os.replace(tmp, path)


def load_state(path: str | os.PathLike) -> dict[str, Any]:
    """A state from a :func:`save_state` file or a zephon_jax checkpoint directory."""
    path = os.fspath(path)
    if os.path.isdir(path):
        return read_checkpoint_item(_item_directory(path))
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise StateError(f"cannot read the state file {path}: {e}") from e
    if not data.startswith(MAGIC):
        raise StateError(
            f"{path} is not a zephon_jax state file (written by zephon_jax.save_state) nor a "
            "checkpoint directory"
        )
    body, checksum = data[len(MAGIC) : -4], data[-4:]
    if zlib.crc32(body).to_bytes(4, "little") != checksum:
        raise StateError(f"{path} is corrupt (checksum mismatch): it was truncated or altered")
    state = codec.decode(body)
    if not isinstance(state, dict) or not isinstance(state.get("lanes"), dict):
        raise StateError(f"{path} does not hold a loader state")
    state["lanes"] = {k: np.frombuffer(v, np.uint8) for k, v in state["lanes"].items()}
    check_state(state)
    return state


def _item_directory(path: str) -> str:
    if os.path.exists(os.path.join(path, META_FILE)):
        return path
    lanes = [n for n in os.listdir(path) if re.fullmatch(r"lane_\d+\.bin", n)]
    if lanes:
        raise StateError(
            f"{path} is an incomplete zephon_jax checkpoint item: it holds {len(lanes)} lane "
            f"files but no {META_FILE}, which is written last: the save did not finish (the "
            "process was killed or failed while saving). Restore an earlier checkpoint step"
            + (
                " (this is Orbax's temporary directory of an unfinished save)"
                if _UNFINISHED in path
                else ""
            )
        )
    items = sorted(d for d in os.listdir(path) if os.path.exists(os.path.join(path, d, META_FILE)))
    if len(items) != 1:
        raise StateError(
            f"{path} is not a zephon_jax checkpoint item (no {META_FILE})"
            + (f" and holds several ({items}): name one of them" if items else "")
        )
    return os.path.join(path, items[0])


def _path(path: Any) -> Any:
    """``path`` as an ``etils.epath.Path``: local, or an object-store URL Orbax wrote to."""
    from etils import epath

    return epath.Path(path)


def read_checkpoint_meta(directory: Any) -> dict[str, Any]:
    """The checked ``meta.json`` of a checkpoint item directory."""
    meta_path = _path(directory) / META_FILE
    if not meta_path.exists():
        raise StateError(
            f"{meta_path} is missing: the checkpoint item was not written by "
            "zephon_jax.checkpoint.Save or is incomplete"
        )
    try:
        meta = json.loads(meta_path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise StateError(f"{meta_path} is not valid JSON ({e}); the checkpoint is corrupt") from e
    CHECKPOINT.check(meta, str(meta_path))
    for key in ("fingerprint", "step", "num_lanes"):
        if key not in meta:
            raise StateError(f"{meta_path} has no {key!r} entry; the checkpoint is corrupt")
    if not is_int(meta["num_lanes"]) or meta["num_lanes"] < 1:
        raise StateError(
            f"{meta_path}'s 'num_lanes' is {meta['num_lanes']!r}; the checkpoint is corrupt"
        )
    return meta


def read_checkpoint_item(
    directory: Any,
    lanes: Iterable[int] | None = None,
    fingerprint: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The state in a checkpoint item directory, covering ``lanes`` (default: all lanes).

    With ``fingerprint`` the state is checked against it before any lane file is read.
    """
    directory = _path(directory)
    meta = read_checkpoint_meta(directory)
    state: dict[str, Any] = {
        "format": meta.get("state_format", STATE_FORMAT),
        "version": meta.get("state_version", STATE_VERSION),
        "fingerprint": meta["fingerprint"],
        "step": meta["step"],  # checked with the rest by check_state
        "lanes": {},
    }
    if EXCLUDE in meta:  # the documents excluded (zephon_jax.exclude)
        state[EXCLUDE] = meta[EXCLUDE]
    check_state(state, fingerprint)
    needed = list(range(int(meta["num_lanes"]))) if lanes is None else list(lanes)
    missing = [lane for lane in needed if not (directory / lane_file(lane)).exists()]
    if missing:
        raise StateError(
            f"the checkpoint in {directory} has no file for lanes {missing[:16]}"
            f"{'...' if len(missing) > 16 else ''} of the {meta['num_lanes']} lanes this "
            "pipeline runs; it is incomplete (a process failed while saving, or files were "
            "removed): restore an earlier checkpoint step"
        )
    for lane in needed:
        path = directory / lane_file(lane)
        data = path.read_bytes()
        if len(data) < 5 or lane_checksum(data[:-4], lane) != data[-4:]:
            raise StateError(
                f"{path} is truncated or corrupt ({len(data)} bytes, checksum mismatch): the "
                "checkpoint was not completely written (a process died while saving, or the "
                "disk filled up) or was altered since: restore an earlier checkpoint step"
            )
        state["lanes"][str(lane)] = np.frombuffer(data, dtype=np.uint8)
    return state
