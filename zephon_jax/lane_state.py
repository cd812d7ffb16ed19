"""The lane state format: a lane's snapshot as plain data, and as checksummed bytes.

A snapshot is the tuple ``(LANE_FORMAT, next_position, input_done, carries,
pending, step, mixture)``: ``carries`` holds, per operator, ``(held_lineages,
aux)`` (its :class:`~zephon_jax.operators.base.Saved` form with elements written
as their lineages), ``pending`` the lineages of the finished rows not yet
batched, ``step`` the global step the lane produces next and ``mixture`` the
carry of plain ints of a mixture by tokens or with weight stages (else None).
Its bytes are the :mod:`zephon_jax.codec` encoding followed by a CRC-32 of it.
"""

from __future__ import annotations

import zlib
from typing import Any, NamedTuple

from zephon_jax import codec
from zephon_jax.errors import StateError

# 2: lane bytes end with a CRC-32 of the encoded state, so corruption is detected.
# 3: carries are saved as (held lineages, aux); operator outputs as (parents, recipe).
# 4: the lane's step and its mixture carry (batch-size ramps, token and staged mixtures).
LANE_FORMAT = 4


class LaneSnapshot(NamedTuple):
    """A lane's state as immutable plain data (see the module docstring)."""

    format: int
    next_position: int
    input_done: bool
    carries: tuple
    pending: tuple
    step: int
    mixture: Any


def encode_lane_state(snapshot: tuple) -> bytes:
    """A lane snapshot as compact bytes, ending with a CRC-32 of the rest."""
    data = codec.encode(tuple(snapshot))
    return data + zlib.crc32(data).to_bytes(4, "little")


def decode_lane_state(lane: int, data: bytes, num_operators: int) -> LaneSnapshot:
    """The snapshot in ``data``; a StateError if it is corrupt or of another format."""
    data = bytes(data)
    body, checksum = data[:-4], data[-4:]
    if len(data) < 5 or zlib.crc32(body).to_bytes(4, "little") != checksum:
        _check_format(lane, data)
        raise StateError(
            f"lane {lane}: corrupt state bytes (checksum mismatch over "
            f"{len(data)} bytes); the state was truncated or altered after it was taken: "
            "restore from an intact checkpoint"
        )
    value = codec.decode(body)
    if not (isinstance(value, tuple) and len(value) == 7 and value[0] == LANE_FORMAT):
        raise _format_error(lane, value)
    snapshot = LaneSnapshot(*value)
    if not isinstance(snapshot.carries, tuple) or len(snapshot.carries) != num_operators:
        found = len(snapshot.carries) if isinstance(snapshot.carries, tuple) else snapshot.carries
        raise StateError(
            f"lane {lane}: the state has {found!r} operator carries, the pipeline "
            f"{num_operators} operators"
        )
    for stage, saved in enumerate(snapshot.carries):
        if not (isinstance(saved, tuple) and len(saved) == 2 and isinstance(saved[0], tuple)):
            raise StateError(
                f"lane {lane}: the saved carry of operator {stage} is not (held lineages, aux)"
            )
    if not isinstance(snapshot.pending, tuple):
        raise StateError(f"lane {lane}: pending rows must be a tuple of lineages")
    if isinstance(snapshot.step, bool) or not isinstance(snapshot.step, int) or snapshot.step < 0:
        raise StateError(f"lane {lane}: the lane's step must be an int >= 0; got {snapshot.step!r}")
    return snapshot


def _format_error(lane: int, value: Any) -> StateError:
    found = value[0] if isinstance(value, tuple) and value else value
    return StateError(
        f"lane {lane}: unrecognized lane state (lane format {found!r}, this zephon_jax reads "
        f"{LANE_FORMAT}); it was written by another zephon_jax version: restore it with the "
        "release that wrote it"
    )


def _check_format(lane: int, data: bytes) -> None:
    """Raises a version error if ``data`` is an intact lane state of another format."""
    try:
        value = codec.decode(data)
    except StateError:
        return
    if isinstance(value, tuple) and value and isinstance(value[0], int) and value[0] != LANE_FORMAT:
        raise _format_error(lane, value)
