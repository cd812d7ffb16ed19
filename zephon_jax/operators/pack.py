"""``pack``: bin packing of variable-length records into fixed-length rows.

``first_fit`` and ``best_fit`` keep ``num_bins`` open rows per lane. A record
goes into the first (``first_fit``) or the tightest (``best_fit``) open row it
fits; when it fits none, the fullest row is emitted and the record starts a
new one there. Records are never cut, so a record longer than ``seq_len``
raises (put ``split(seq_len)`` before ``pack``).

Output follows Grain's packers: every 1-D field ``f`` becomes a row of
``seq_len`` (zero padded) plus ``f_segment_ids`` (1-based, 0 = padding) and
``f_positions`` (0-based within each segment), int32.
"""

from __future__ import annotations

import bisect
import itertools

import numpy as np

from zephon_jax.checks import positive_int
from zephon_jax.errors import PipelineError, StateError
from zephon_jax.lineage import derive, root_position
from zephon_jax.operators.base import LineageOperator, Saved

DEFAULT_NUM_BINS = 32
_SCAN_IN_PYTHON = 64  # up to this many bins, a Python scan beats numpy's call overhead


def record_fields(data, seq_len: int, op: str) -> tuple[tuple[str, ...], int]:
    """Validates a record for packing; returns its field names and length."""
    if not isinstance(data, dict) or not data:
        raise PipelineError(
            f"{op} needs records that are dicts of 1-D arrays (e.g. {{'tokens': array}}); "
            f"got {type(data).__name__}"
        )
    n = -1
    for f, v in data.items():
        if not isinstance(v, np.ndarray) or v.ndim != 1:
            raise PipelineError(
                f"{op} needs every field to be a 1-D numpy array; field {f!r} is "
                f"{type(v).__name__} with shape {np.shape(v)}; drop or convert it with a map"
            )
        if n >= 0 and len(v) != n:
            raise PipelineError(
                f"{op} needs all fields of a record to have the same length; got {n} and "
                f"{len(v)} (field {f!r}); pack fields of different lengths in separate pipelines"
            )
        n = len(v)
    return tuple(data), n


def too_long(n: int, seq_len: int, op: str, lineage) -> PipelineError:
    return PipelineError(
        f"a record of {n} items (lane-local position {root_position(lineage)}) reached "
        f"{op} with seq_len={seq_len}; records must fit a row: add .split({seq_len}) before "
        f".pack(...), or raise seq_len"
    )


class RowBuffers:
    """``rows`` zero-padded rows of ``seq_len`` per field, with segment ids and positions.

    Each row is its own set of arrays: emitting a row hands them out and starts
    fresh zero rows, so nothing is copied or cleared.
    """

    __slots__ = (
        "fields",
        "dtypes",
        "seq_len",
        "values",
        "segment_ids",
        "positions",
        "used",
        "used_array",
        "segments",
        "fill_order",
    )

    def __init__(self, data: dict, rows: int, seq_len: int):
        self.fields = tuple(data)
        self.dtypes = tuple(data[f].dtype for f in self.fields)
        self.seq_len = seq_len
        self.values: list[list[np.ndarray]] = []
        self.segment_ids: list[np.ndarray] = []
        self.positions: list[np.ndarray] = []
        self.used = [0] * rows
        self.used_array = np.zeros(rows, np.int64)  # the same, for vectorized bin choice
        self.segments: list[list] = [[] for _ in range(rows)]
        self.fill_order: list[tuple[int, int]] | None = None  # see BinPackOperator
        for _ in range(rows):
            self._new_row()

    def _new_row(self, i: int | None = None) -> None:
        row = [np.zeros(self.seq_len, dtype) for dtype in self.dtypes]
        segment_ids = np.zeros(self.seq_len, np.int32)
        positions = np.zeros(self.seq_len, np.int32)
        if i is None:
            self.values.append(row)
            self.segment_ids.append(segment_ids)
            self.positions.append(positions)
        else:
            self.values[i], self.segment_ids[i], self.positions[i] = row, segment_ids, positions
            self.used[i] = 0
            self.used_array[i] = 0
            self.segments[i] = []

    def place(self, i: int, data: dict, start: int, stop: int, segment, arange: np.ndarray):
        """Appends ``data[f][start:stop]`` for every field to row ``i``."""
        off = self.used[i]
        end = off + stop - start
        for f, row in zip(self.fields, self.values[i]):
            row[off:end] = data[f][start:stop]
        segments = self.segments[i]
        segments.append(segment)
        self.segment_ids[i][off:end] = len(segments)
        self.positions[i][off:end] = arange[: stop - start]
        self.used[i] = end
        self.used_array[i] = end

    def emit(self, i: int) -> dict:
        """Returns row ``i`` as a packed record and starts a fresh row in its place."""
        out = {}
        segment_ids, positions = self.segment_ids[i], self.positions[i]
        for n, (f, row) in enumerate(zip(self.fields, self.values[i])):
            out[f] = row
            out[f + "_segment_ids"] = segment_ids if n == 0 else segment_ids.copy()
            out[f + "_positions"] = positions if n == 0 else positions.copy()
        self._new_row(i)
        return out


class BinPackOperator(LineageOperator):
    """First-fit or best-fit packing over ``num_bins`` open rows per lane.

    Carry: at most ``num_bins`` open rows; saved as the records in them (one
    pointer per record) and each bin's record count. A packed row is derived
    from its records, with their lengths as the recipe.
    """

    name = "pack"

    def __init__(self, seq_len: int, method: str = "best_fit", num_bins: int | None = None):
        if method not in ("first_fit", "best_fit"):
            raise PipelineError(f"unknown pack method {method!r}")
        self.seq_len = positive_int(seq_len, "pack(seq_len)")
        self.method = method
        self.num_bins = positive_int(
            DEFAULT_NUM_BINS if num_bins is None else num_bins, "pack(num_bins)"
        )
        self.max_held = self.num_bins * self.seq_len
        self._arange = np.arange(self.seq_len, dtype=np.int32)

    def _new_bins(self, data) -> RowBuffers:
        return RowBuffers(data, self.num_bins, self.seq_len)

    def step(self, carry: RowBuffers | None, element):
        data = element.data
        fields, n = record_fields(data, self.seq_len, "pack")
        if n > self.seq_len:
            raise too_long(n, self.seq_len, f"pack(method={self.method!r})", element.lineage)
        if n == 0:
            return carry, []
        if carry is None:
            carry = self._new_bins(data)
        elif fields != carry.fields:
            raise PipelineError(
                f"pack got records with fields {list(fields)} after records with fields "
                f"{list(carry.fields)}; every record must have the same fields"
            )
        out = []
        if self.method == "best_fit":
            i = self._best_fit(carry, self.seq_len - n, out)
        else:
            i = self._first_fit(carry, self.seq_len - n)
            if i < 0:
                i = carry.used.index(max(carry.used))
                out.append(self._emit(carry, i))
        carry.place(i, data, 0, n, element, self._arange)
        if carry.fill_order is not None:
            bisect.insort(carry.fill_order, (carry.used[i], -i))
        return carry, out

    def _best_fit(self, carry: RowBuffers, room: int, out: list) -> int:
        """Takes the fullest bin filled to at most ``room`` (else emits the fullest bin) out
        of the fill order and returns its index; ties go to the lowest index."""
        order = carry.fill_order
        if order is None:  # kept sorted by (fill, -bin) from here on; rebuilt after restore
            order = carry.fill_order = sorted((u, -i) for i, u in enumerate(carry.used))
        k = bisect.bisect_right(order, (room, 1)) - 1
        i = -order.pop(k if k >= 0 else -1)[1]
        if k < 0:
            out.append(self._emit(carry, i))
        return i

    @staticmethod
    def _emit(carry: RowBuffers, i: int):
        segments = carry.segments[i]
        field = carry.fields[0]
        return derive(carry.emit(i), segments, tuple([len(e.data[field]) for e in segments]))

    def _first_fit(self, carry: RowBuffers, room: int) -> int:
        """The lowest bin filled to at most ``room``, or -1."""
        if self.num_bins <= _SCAN_IN_PYTHON:
            return next((j for j, u in enumerate(carry.used) if u <= room), -1)
        fits = carry.used_array <= room
        return int(fits.argmax()) if fits.any() else -1

    def flush(self, carry: RowBuffers | None):
        if carry is None:
            return carry, []
        out = [self._emit(carry, i) for i, u in enumerate(carry.used) if u]
        carry.fill_order = None
        return carry, out

    def save(self, carry: RowBuffers | None) -> Saved:
        if carry is None:
            return Saved()
        held = tuple(itertools.chain.from_iterable(carry.segments))
        return Saved(held, tuple(map(len, carry.segments)))

    def load(self, saved: Saved, lane: int) -> RowBuffers | None:
        if saved.aux is None:
            return None
        carry = None
        held = iter(saved.held)
        for i, count in enumerate(saved.aux):
            for _ in range(count):
                element = next(held)
                data = element.data
                if carry is None:
                    carry = self._new_bins(data)
                n = record_fields(data, self.seq_len, "pack")[1]
                carry.place(i, data, 0, n, element, self._arange)
        return carry

    def remake(self, recipe, inputs):
        rows = None
        for data, length in zip(inputs, recipe):
            if rows is None:
                rows = RowBuffers(data, 1, self.seq_len)
            n = record_fields(data, self.seq_len, "pack")[1]
            if n != length:
                raise StateError(
                    f"a record packed with {length} items now has {n}; the sources or the "
                    "functions before pack changed since the state was taken"
                )
            rows.place(0, data, 0, n, None, self._arange)
        return rows.emit(0)

    def trace(self, recipe, parents, start, stop):
        """A row is its records, whole, in segment order."""
        return [(parent, 0, n, None) for parent, n in zip(parents, recipe)]

    def carry_bound(self) -> str:
        return f"{self.num_bins} open rows of {self.seq_len} (one pointer per record in them)"

    def describe(self) -> str:
        return f"pack(seq_len={self.seq_len}, method={self.method!r}, num_bins={self.num_bins})"
