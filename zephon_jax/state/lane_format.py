"""The lane state format: a lane's snapshot as plain data, and as checksummed bytes.

A snapshot is the tuple ``(LANE_FORMAT, next_position, input_done, carries,
pending, step, mixture, tally)``: ``carries`` holds, per operator, ``(held_lineages,
aux)`` (its :class:`~zephon_jax.operators.base.Saved` form with elements written
as their lineages; in memory, the held lineages may be kept as
:class:`~zephon_jax.core.lineage.HeldLineages` groups, joined when encoded),
``pending`` the lineages of the finished rows not yet
batched, ``step`` the global step the lane produces next and ``mixture`` the
carry of plain ints of a mixture by tokens or with weight stages (else None)
and ``tally`` the lane's counters of delivered data ``(skipped, sources, stages)``
(see :mod:`zephon_jax.engine.accounting`; in memory it may be an object counted
when encoded, with a ``saved()`` method).
Its bytes are the :mod:`zephon_jax.state.codec` encoding followed by a CRC-32 of it,
started from the lane number, so a lane's bytes saved under another lane's
number fail the check like corrupt bytes. Decoding validates the whole form
(types, impossible values) and raises :class:`StateError` naming the entry.
Decoded, a carry's held lineages that are all pieces of drawn records come as a
:class:`~zephon_jax.core.lineage.DrawPieceTable`, and unbatched rows that are all
packed rows of such pieces as a :class:`~zephon_jax.core.lineage.DrawRowTable`
(arrays, equal to the tuples; the same bytes either way).
"""

from __future__ import annotations

import zlib
from typing import Any, NamedTuple, Sequence

from zephon_jax.core.lineage import (
    DrawPieceTable,
    DrawRowTable,
    HeldLineages,
    all_pointers,
    draw_parts,
    is_derived,
    is_draw,
    is_opaque,
    is_position,
    parents_of,
    plain_lineage,
)
from zephon_jax.errors import StateError
from zephon_jax.state import codec
from zephon_jax.state.envelope import LANE, is_int

LANE_FORMAT = LANE.version
TALLY_FIELDS = 4  # per source: tokens, segments, documents, highest epoch + 1  # see zephon_jax.state.envelope for the versions


class LaneSnapshot(NamedTuple):
    """A lane's state as immutable plain data (see the module docstring)."""

    format: int
    next_position: int
    input_done: bool
    carries: tuple
    pending: tuple
    step: int
    mixture: Any
    tally: Any  # (skipped, sources, stages); in memory, counted when encoded


def with_tally(snapshot: tuple, tally: Any) -> LaneSnapshot:
    """``snapshot`` with its accounting counters ``tally`` instead of its own."""
    version, position, done, carries, pending, step, mixture, _ = snapshot
    return LaneSnapshot(version, position, done, carries, pending, step, mixture, tally)


def lane_checksum(body: bytes, lane: int) -> bytes:
    """The CRC-32 of a lane state's encoding, started from the lane number."""
    return zlib.crc32(body, lane & 0xFFFFFFFF).to_bytes(4, "little")


_ENTRIES = 8  # a snapshot's, see LaneSnapshot
_HELD_FORMS = (HeldLineages, DrawPieceTable)  # held lineages kept as other than a tuple
_TABLES = (DrawPieceTable, DrawRowTable)


def plain_snapshot(snapshot: tuple) -> tuple:
    """The snapshot with every carry's held lineages as one plain tuple (a snapshot
    may keep them as :class:`~zephon_jax.core.lineage.HeldLineages` groups, a decoded
    one as a :class:`~zephon_jax.core.lineage.DrawPieceTable`), and
    its unbatched rows' lineages in full (see :func:`~zephon_jax.core.lineage.plain_lineage`)."""
    snapshot = tuple(snapshot)
    carries = snapshot[3]
    if isinstance(carries, tuple) and any(
        isinstance(saved, tuple) and len(saved) == 2 and type(saved[0]) in _HELD_FORMS
        for saved in carries
    ):
        carries = tuple(
            (_plain_held(saved[0]), saved[1]) if type(saved[0]) in _HELD_FORMS else saved
            for saved in carries
        )
        snapshot = snapshot[:3] + (carries,) + snapshot[4:]
    pending = snapshot[4]
    if isinstance(pending, tuple):  # rows from pack keep compact lineages until here
        snapshot = snapshot[:4] + (tuple(map(plain_lineage, pending)),) + snapshot[5:]
    elif type(pending) is DrawRowTable:  # decoded from a state
        snapshot = snapshot[:4] + (pending.rows(),) + snapshot[5:]
    if len(snapshot) > 7 and not isinstance(snapshot[7], tuple):  # counted only now
        snapshot = snapshot[:7] + (snapshot[7].saved(),) + snapshot[8:]
    return snapshot


def _plain_held(held: HeldLineages | DrawPieceTable) -> tuple:
    """Held lineages as one plain tuple (HeldLineages keep it, for a later encoding)."""
    return held.joined() if type(held) is HeldLineages else tuple(held)


def encode_lane_state(snapshot: tuple, lane: int) -> bytes:
    """Lane ``lane``'s snapshot as compact bytes, ending with its checksum."""
    data = codec.encode(plain_snapshot(snapshot))
    return data + lane_checksum(data, lane)


def decode_lane_state(
    lane: int,
    data: bytes,
    num_operators: int,
    end_position: int | None = None,
    can_end: bool | None = None,
) -> LaneSnapshot:
    """The snapshot in ``data``, validated; a StateError naming the entry if it is corrupt,
    of another format or malformed.

    ``end_position`` is the lane's end (None: not known ahead, or never), against which
    ``next_position`` and ``input_done`` are checked; ``can_end`` says whether the input
    may end at all (default: whether ``end_position`` is known). A mixture by tokens or
    with weight stages finds its end as it draws: its end is not known ahead, yet it can
    end.
    """
    data = bytes(data)
    body, checksum = data[:-4], data[-4:]
    if len(data) < 5 or lane_checksum(body, lane) != checksum:
        _check_format(lane, data)
        raise StateError(
            f"lane {lane}: corrupt state bytes (checksum mismatch over "
            f"{len(data)} bytes); the state was truncated or altered after it was taken, "
            "or holds another lane's bytes: restore from an intact checkpoint"
        )
    value = _decoded(body, num_operators)
    if not (isinstance(value, tuple) and value):
        raise _format_error(lane, value)
    LANE.check_version(value[0], f"lane {lane}: the lane state")
    if len(value) != _ENTRIES:
        raise StateError(
            f"lane {lane}: the lane state has {len(value)} entries, not {_ENTRIES}; the state "
            "was altered"
        )
    snapshot = LaneSnapshot(*value)
    ends = end_position is not None if can_end is None else can_end
    _check_position(lane, snapshot, end_position, ends)
    if not isinstance(snapshot.carries, tuple) or len(snapshot.carries) != num_operators:
        found = len(snapshot.carries) if isinstance(snapshot.carries, tuple) else snapshot.carries
        raise StateError(
            f"lane {lane}: the state has {found!r} operator carries, the pipeline "
            f"{num_operators} operators"
        )
    for stage, saved in enumerate(snapshot.carries):
        if not (
            isinstance(saved, tuple)
            and len(saved) == 2
            and isinstance(saved[0], (tuple, DrawPieceTable))
        ):
            raise StateError(
                f"lane {lane}: the saved carry of operator {stage} is not (held lineages, aux)"
            )
        _check_lineages(saved[0], lane, f"carries[{stage}] held")
    if not isinstance(snapshot.pending, (tuple, DrawRowTable)):
        raise StateError(f"lane {lane}: pending rows must be a tuple of lineages")
    _check_lineages(snapshot.pending, lane, "pending")
    if isinstance(snapshot.step, bool) or not isinstance(snapshot.step, int) or snapshot.step < 0:
        raise StateError(f"lane {lane}: the lane's step must be an int >= 0; got {snapshot.step!r}")
    check_saved_tally(snapshot.tally, lane)
    return snapshot


def _decoded(body: bytes, num_operators: int) -> Any:
    """The value ``body`` encodes (see :func:`~zephon_jax.state.codec.decode`), where it
    has a lane state's form with each carry's held lineages, if all are pieces of
    drawn records, as a :class:`~zephon_jax.core.lineage.DrawPieceTable`, and the
    unbatched rows, if all are packed rows of such pieces, as a
    :class:`~zephon_jax.core.lineage.DrawRowTable` (a restore reads their arrays, no
    tuple per piece)."""
    reader = codec.Reader(body)
    if reader.tuple_length() != _ENTRIES:
        return codec.decode(body)
    head = [reader.value() for _ in range(3)]  # format, next_position, input_done
    if reader.tuple_length() != num_operators:
        return codec.decode(body)
    carries = []
    for _ in range(num_operators):  # read no further than the first of another form
        carry = _carry(reader)
        if carry is None:
            return codec.decode(body)
        carries.append(carry)
    pending = reader.tuple_length()
    if pending is None:
        return codec.decode(body)
    rows = reader.draw_rows(pending)
    unbatched = tuple(reader.values(pending)) if rows is None else DrawRowTable(*rows)
    rest = [reader.value() for _ in range(3)]  # step, mixture, tally
    reader.end()
    return (*head, tuple(carries), unbatched, *rest)


def _carry(reader: codec.Reader) -> tuple | None:
    """The saved carry ``(held lineages, aux)`` ``reader`` reads next (see
    :func:`_decoded`); None (read no further) where the next value is not a pair of a
    tuple and a value."""
    if reader.tuple_length() != 2:
        return None
    held = reader.tuple_length()
    if held is None:
        return None
    table = reader.draw_pieces(held)
    lineages = tuple(reader.values(held)) if table is None else DrawPieceTable(table)
    return (lineages, reader.value())


def check_saved_tally(saved: Any, lane: int) -> None:
    """Raises a StateError unless ``saved`` has the form ``(skipped, sources, stages)``."""
    if not (isinstance(saved, tuple) and len(saved) == 3):
        raise StateError(
            f"lane {lane}: the state's accounting is {saved!r:.80}, not (skipped, sources, "
            "stages); the state was altered"
        )
    skipped, counts, stages = saved
    ok = is_int(skipped) and skipped >= 0
    for part in (counts, stages):
        ok = ok and isinstance(part, tuple) and all(is_int(v) and v >= 0 for v in part)
    if not ok or len(counts) % TALLY_FIELDS:
        raise StateError(
            f"lane {lane}: the state's accounting {saved!r:.120} is malformed (counters are "
            "ints >= 0, four per source); the state was altered"
        )


def _check_position(
    lane: int, snapshot: LaneSnapshot, end_position: int | None, can_end: bool
) -> None:
    position, done = snapshot.next_position, snapshot.input_done
    if not is_int(position) or position < 0:
        raise StateError(
            f"lane {lane}: 'next_position' is {position!r}; it must be an int >= 0: the "
            "state was altered"
        )
    if not isinstance(done, bool):
        raise StateError(
            f"lane {lane}: 'input_done' is {done!r} ({type(done).__name__}); it must be a "
            "bool: the state was altered"
        )
    if done and not can_end:
        raise StateError(
            f"lane {lane}: 'input_done' is True, but this pipeline's input never ends; the "
            "state was altered or comes from a finite pipeline"
        )
    if end_position is not None and (
        position > end_position or (done and position != end_position)
    ):
        raise StateError(
            f"lane {lane}: 'next_position' is {position} (input_done={done}), but this "
            f"lane's input ends at lane-local position {end_position}; the state was altered"
        )


def _is_pointer(lineage: Any) -> bool:
    """A quick check of the common lineage forms (positions and operator outputs of them,
    any depth); False means "check it in full", not "invalid"."""
    if type(lineage) is int:
        return lineage >= 0
    if is_derived(lineage):
        for parent in parents_of(lineage):
            if not is_position(parent) and not _is_pointer(parent):
                return False
        return True
    return False


def _check_lineages(lineages: Sequence, lane: int, where: str) -> None:
    """Raises as :func:`check_lineage` for the first of ``lineages`` that is malformed."""
    if isinstance(lineages, _TABLES):  # pieces of draws of ints: valid where none is negative
        array = lineages.array if isinstance(lineages, DrawPieceTable) else lineages.pieces
        if not len(array) or int(array[:, :3].min()) >= 0:
            return
    elif all_pointers(lineages):  # all of the common forms: nothing to report
        return
    for i, lineage in enumerate(lineages):
        if not _is_pointer(lineage):
            check_lineage(lineage, lane, f"{where}[{i}]")


def check_lineage(lineage: Any, lane: int, where: str) -> None:
    """Raises unless ``lineage`` has a lineage's form: a sampler position (an int >= 0),
    a mixture draw ``(position, component, draw)`` of ints >= 0, an ``Opaque`` record,
    or ``(parents, recipe)`` with a tuple of lineages as parents.

    Recipes are the operators' own plain data; each operator checks its recipes.
    """

    if is_opaque(lineage) or (is_int(lineage) and lineage >= 0):
        return
    if is_derived(lineage):
        for i, parent in enumerate(parents_of(lineage)):
            check_lineage(parent, lane, f"{where} parent {i}")
        return
    if is_draw(lineage) and all(is_int(x) and x >= 0 for x in draw_parts(lineage)):
        return
    raise StateError(
        f"lane {lane}: {where} is {lineage!r} ({type(lineage).__name__}); a record pointer is "
        "a lane-local position (an int >= 0), a mixture draw, a stored record or (parents, "
        "recipe): the state was altered"
    )


def _format_error(lane: int, value: Any) -> StateError:
    found = value[0] if isinstance(value, tuple) and value else value
    return StateError(
        f"lane {lane}: unrecognized lane state (lane format {found!r}, this zephon_jax reads "
        f"{LANE_FORMAT}); it was written by another zephon_jax version: restore it with the "
        "release that wrote it"
    )


def _check_format(lane: int, data: bytes) -> None:
    """Raises a version error if ``data`` is an intact lane state of another format: one
    without a checksum (format 1), or one whose checksum started from 0 on every lane
    (formats 2 to 4)."""
    bodies = [data]
    if len(data) >= 5 and lane_checksum(data[:-4], 0) == data[-4:]:
        bodies.append(data[:-4])
    for body in bodies:
        try:
            value = codec.decode(body)
        except StateError:
            continue
        if isinstance(value, tuple) and value and is_int(value[0]) and value[0] != LANE_FORMAT:
            raise _format_error(lane, value)
