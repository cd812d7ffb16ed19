"""The packing core shared by ``pack(method=...)``: pointer rows, output dtypes, assembly.

A packed row is a :class:`PackedRow`: a cheap description, the ``(arrays,
start, stop)`` pieces of the records it holds (or, for whole records, their
arrays and lengths). Nothing is copied while rows
are open. Rows are assembled once, straight into the output arrays, by
:func:`assemble_rows`: one ``np.concatenate`` per field over the pieces of every
row of a batch (with slices of a zero row as padding), one ``np.repeat`` for
segment ids and one ``np.concatenate`` of slices of ``0, 1, 2, ...`` for
positions. A row read on its own (by a map after
``pack``, say) is assembled the same way as a batch of one. Given an
:class:`OutputPool`, a batch is written into arrays of an earlier batch that
nothing references any more, instead of fresh ones (see the pool).

Output fields follow Grain's packers: every 1-D field ``f`` gives ``f`` (zero
padded), ``f_segment_ids`` (1-based, 0 = padding) and ``f_positions`` (0-based
within each piece, 0 on padding); segment ids and positions are int32.

Output dtypes are a function of the pipeline definition alone, never of the
records a row happens to hold: a field is int32 unless ``dtypes`` names
another dtype for it. A value the output dtype cannot hold exactly (an int64
above 2**31, a fractional float in an int32 field) raises a
:class:`~zephon_jax.errors.PipelineError` naming the field and the fix; a float
field declared float32 rounds float64 values to float32 (finite values that
overflow it raise).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, Iterator, Sequence

import numpy as np

from zephon_jax.core.lineage import root_position
from zephon_jax.errors import PipelineError

DEFAULT_DTYPE = np.dtype(np.int32)
SEGMENT_IDS = "_segment_ids"
POSITIONS = "_positions"

Piece = tuple  # (arrays: tuple[np.ndarray, ...], start: int, stop: int), see PackedRow


class PackSpec:
    """What every row of one ``pack`` shares: row length, output dtypes, the name for errors."""

    __slots__ = ("seq_len", "op", "dtypes", "max_segments", "_zeros", "_counting", "_checked")

    def __init__(
        self,
        seq_len: int,
        op: str,
        dtypes: Mapping[str, Any] | None = None,
        max_segments: int | None = None,
    ):
        self.seq_len = check_positive(seq_len, "pack(seq_len)")
        self.op = op
        self.max_segments = (
            None if max_segments is None else check_positive(max_segments, "pack(max_segments)")
        )
        self.dtypes = _check_dtypes(dtypes)
        self._zeros: dict[np.dtype, np.ndarray] = {}
        self._counting: np.ndarray | None = None
        self._checked: set[tuple] = set()

    def dtype(self, field: str) -> np.dtype:
        return self.dtypes.get(field, DEFAULT_DTYPE)

    def zeros(self, dtype: np.dtype) -> np.ndarray:
        zeros = self._zeros.get(dtype)
        if zeros is None:
            zeros = self._zeros[dtype] = np.zeros(self.seq_len, dtype)
        return zeros

    def counting(self) -> np.ndarray:
        """``0, 1, ..., seq_len - 1`` in the segment dtype (positions are its slices)."""
        counting = self._counting
        if counting is None:
            counting = self._counting = np.arange(self.seq_len, dtype=np.int32)
        return counting

    def same_rows(self, other: PackSpec) -> bool:
        """Whether rows of both specs batch together (same length and output dtypes)."""
        return self.seq_len == other.seq_len and self.dtypes == other.dtypes

    def describe(self) -> str:
        """The parameters beyond ``seq_len`` and ``method``, for ``describe()``."""
        text = ""
        if self.max_segments is not None:
            text += f", max_segments={self.max_segments}"
        if self.dtypes:
            text += ", dtypes={" + ", ".join(f"{f!r}: {d.name}" for f, d in self.dtypes.items())
            text += "}"
        return text

    def record(self, data: Any, lineage: Any) -> tuple[tuple[str, ...], tuple, int]:
        """Validates one record; returns its field names, arrays and length."""
        if type(data) is dict and len(data) == 1:  # the common case, checked quickly
            ((f, v),) = data.items()
            if type(v) is np.ndarray and v.ndim == 1:
                fields = (f,)
                if fields not in self._checked:
                    self._check_names(fields)
                return fields, (v,), len(v)
        if not isinstance(data, Mapping) or not data:
            raise PipelineError(
                f"{self.op} needs records that are dicts of 1-D arrays (e.g. {{'tokens': "
                f"array}}); got {type(data).__name__}"
            )
        fields = tuple(data)
        arrays = tuple(data.values())
        n = -1
        for f, v in zip(fields, arrays):
            if not isinstance(v, np.ndarray) or v.ndim != 1:
                raise PipelineError(
                    f"{self.op} needs every field to be a 1-D numpy array; field {f!r} is "
                    f"{type(v).__name__} with shape {np.shape(v)}; drop or convert it with a map"
                )
            if n >= 0 and len(v) != n:
                raise PipelineError(
                    f"{self.op} needs all fields of a record to have the same length; got {n} "
                    f"and {len(v)} (field {f!r}); pack fields of different lengths in separate "
                    "pipelines"
                )
            n = len(v)
        if fields not in self._checked:
            self._check_names(fields)
        return fields, arrays, n

    def _check_names(self, fields: tuple[str, ...]) -> None:
        taken = set(fields)
        for f in fields:
            for suffix in (SEGMENT_IDS, POSITIONS):
                if f + suffix in taken:
                    raise PipelineError(
                        f"{self.op} would write field {f + suffix!r}, which the records already "
                        f"have (fields {list(fields)}): packing packed rows again, or a record "
                        "with its own segment ids, would overwrite them. Pack once, or rename "
                        "or drop the field with a map first"
                    )
        unknown = set(self.dtypes) - taken
        if unknown:
            raise PipelineError(
                f"{self.op} got dtypes for fields {sorted(unknown)} that the records (fields "
                f"{list(fields)}) do not have; fix the names in dtypes="
            )
        self._checked.add(fields)

    def too_long(self, n: int, lineage: Any) -> PipelineError:
        return PipelineError(
            f"a record of {n} items (lane-local position {root_position(lineage)}) reached "
            f"{self.op} with seq_len={self.seq_len}; records must fit a row: add "
            f".split({self.seq_len}) before .pack(...), or raise seq_len"
        )


def check_positive(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise PipelineError(f"{what} needs a positive int; got {value!r}")
    return int(value)


def _check_dtypes(dtypes: Mapping[str, Any] | None) -> dict[str, np.dtype]:
    if dtypes is None:
        return {}
    if not isinstance(dtypes, Mapping):
        raise PipelineError(
            f"pack(dtypes=) needs a dict from field name to numpy dtype; got "
            f"{type(dtypes).__name__}"
        )
    out = {}
    for field, dtype in dtypes.items():
        try:
            dtype = np.dtype(dtype)
        except TypeError as e:
            raise PipelineError(f"pack(dtypes=): {dtype!r} for {field!r} is not a dtype") from e
        if dtype.kind not in "iuf":
            raise PipelineError(
                f"pack(dtypes=): {field!r} has dtype {dtype}; packed fields must be integer or "
                "float numbers"
            )
        out[str(field)] = dtype
    return out


def _references(pooled: list, i: int) -> int:
    return sys.getrefcount(pooled[i])


# References to an array held only by a pool's list, as _references counts them.
_ONLY_POOL = _references([np.empty(0)], 0)


class OutputPool:
    """Batch arrays handed out again once nothing outside the pool references them.

    Fresh output arrays for every batch are costly when batches are dropped
    right after use (by a training step's ``device_put``, say): the allocator
    gives their memory back to the system, and the next batch's arrays fault
    it in again, page by page. A pool keeps up to ``size`` arrays per shape and
    dtype for each output field (``size`` batches' worth) and hands one out again
    only when its reference count shows that the pool alone holds it. Whatever can still read an array holds a reference to
    it: the caller's batch dict or a variable, a view or slice (through
    ``.base``), a ``memoryview``, a jax array aliasing it zero-copy (it keeps
    the numpy array alive). So a batch the caller keeps, or any part of it, is
    never overwritten. Only a raw address (``array.ctypes.data`` kept without
    the array) escapes this; such code must keep the array too.

    The count cannot rise between the check and the reuse: only a holder of a
    reference can make another, and the pool's references are private.
    """

    __slots__ = ("size", "_arrays", "_next")

    def __init__(self, size: int = 4):
        self.size = size
        self._arrays: dict[tuple, list[np.ndarray]] = {}
        self._next: dict[tuple, int] = {}

    def empty(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An array for output field ``name`` that nothing else references (contents arbitrary)."""
        key = (name, shape, dtype)
        pooled = self._arrays.setdefault(key, [])
        for i in range(len(pooled)):
            if _references(pooled, i) == _ONLY_POOL:
                return pooled[i]
        array = np.empty(shape, dtype)
        if len(pooled) < self.size:
            pooled.append(array)
        else:  # every pooled array is in use: forget the oldest (its holder keeps it alive)
            i = self._next.get(key, 0)
            pooled[i] = array
            self._next[key] = (i + 1) % self.size
        return array


class PackedRow(Mapping):
    """One packed row, held as pointers to the records in it until it is assembled.

    ``pieces``: the ``(arrays, start, stop)`` pieces of the records in it; or,
    given ``lengths``, whole records: each one's array (records of one field) or
    tuple of arrays, of those lengths. Reads like a read-only dict of the output
    fields (assembled on first access); :func:`assemble_rows` builds a whole
    batch of them straight into the batch arrays.
    """

    __slots__ = ("spec", "fields", "pieces", "lengths", "_data")

    def __init__(
        self,
        spec: PackSpec,
        fields: tuple[str, ...],
        pieces: Sequence[Any],
        lengths: tuple[int, ...] | None = None,
    ):
        self.spec = spec
        self.fields = fields
        self.pieces = tuple(pieces)
        self.lengths = lengths
        self._data: dict[str, np.ndarray] | None = None

    def to_dict(self) -> dict[str, np.ndarray]:
        """The assembled row (computed once)."""
        if self._data is None:
            batch = assemble_rows([self])
            self._data = {k: v[0] for k, v in batch.items()}
        return self._data

    def keys(self):  # noqa: D102 - output names, without assembling
        return output_names(self.fields)

    def __getitem__(self, key: str) -> np.ndarray:
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(output_names(self.fields))

    def __len__(self) -> int:
        return 3 * len(self.fields)

    def __repr__(self) -> str:
        lengths = self.lengths
        used = (
            sum(stop - start for _, start, stop in self.pieces) if lengths is None else sum(lengths)
        )
        return f"PackedRow({len(self.pieces)} pieces, {used}/{self.spec.seq_len} items)"


def output_names(fields: Sequence[str]) -> list[str]:
    return [name for f in fields for name in (f, f + SEGMENT_IDS, f + POSITIONS)]


def plain(data: Any) -> Any:
    """``data`` as user code expects it: a packed row becomes a plain dict."""
    return dict(data.to_dict()) if isinstance(data, PackedRow) else data


def assemble_rows(
    rows: Sequence[PackedRow], pool: OutputPool | None = None
) -> dict[str, np.ndarray]:
    """The rows as one batch: a ``(len(rows), seq_len)`` array per output field.

    With a ``pool``, the arrays are ones of earlier batches that nothing else
    references any more (see :class:`OutputPool`); without, fresh ones.
    """
    assemble = getattr(type(rows[0]), "assemble_batch", None)  # rows with their own way
    if assemble is not None:
        batch = assemble(rows, pool)
        if batch is not None:
            return batch
    spec, fields = rows[0].spec, rows[0].fields
    seq_len = spec.seq_len
    for row in rows:
        if row.fields != fields or (row.spec is not spec and not row.spec.same_rows(spec)):
            _raise_mixed(rows)
    out_dtypes = [spec.dtype(f) for f in fields]
    zeros = [spec.zeros(d) for d in out_dtypes]
    counting, no_positions = spec.counting(), spec.zeros(SEGMENT_DTYPE)
    parts: list[list[np.ndarray]] = [[] for _ in fields]
    positions_parts: list[np.ndarray] = []  # 0, 1, ... within each piece; zeros on padding
    lengths: list[int] = []  # of every piece, padding included
    segments: list[int] = []  # segment id of every piece (0: padding)
    single = len(fields) == 1
    values0 = parts[0]
    for row in rows:
        whole = row.lengths
        if whole is not None:  # whole records, as pack holds them: no slices
            if single:
                values0 += row.pieces
            else:
                for values, column in zip(parts, zip(*row.pieces)):
                    values += column
            lengths += whole
            segments += range(1, len(whole) + 1)
            used = sum(whole)
            positions_parts += [counting[:n] for n in whole]
        else:
            used = 0
            for k, (arrays, start, stop) in enumerate(row.pieces, 1):
                for values, array in zip(parts, arrays):
                    values.append(array if start == 0 and stop == len(array) else array[start:stop])
                lengths.append(stop - start)
                segments.append(k)
                positions_parts.append(counting[: stop - start])
                used += stop - start
        if used < seq_len:
            for values, zero in zip(parts, zeros):
                values.append(zero[: seq_len - used])
            lengths.append(seq_len - used)
            segments.append(0)
            positions_parts.append(no_positions[: seq_len - used])
    shape = (len(rows), seq_len)

    def empty(name: str, dtype: np.dtype) -> np.ndarray:
        return np.empty(shape, dtype) if pool is None else pool.empty(name, shape, dtype)

    f0 = fields[0]
    segment_ids = empty(f0 + SEGMENT_IDS, SEGMENT_DTYPE)
    positions = empty(f0 + POSITIONS, SEGMENT_DTYPE)
    # Segment ids: each piece's id repeated over its length; positions: slices of 0, 1, ...
    np.copyto(segment_ids.reshape(-1), np.repeat(np.asarray(segments, SEGMENT_DTYPE), lengths))
    np.concatenate(positions_parts, out=positions.reshape(-1))
    batch = {}
    for f, values, dtype in zip(fields, parts, out_dtypes):
        batch[f] = _concatenate(values, dtype, f, spec, empty(f, dtype))
        if f == f0:
            batch[f + SEGMENT_IDS], batch[f + POSITIONS] = segment_ids, positions
        else:
            batch[f + SEGMENT_IDS] = _copy(segment_ids, empty(f + SEGMENT_IDS, SEGMENT_DTYPE))
            batch[f + POSITIONS] = _copy(positions, empty(f + POSITIONS, SEGMENT_DTYPE))
    return batch


SEGMENT_DTYPE = np.dtype(np.int32)


def _copy(source: np.ndarray, out: np.ndarray) -> np.ndarray:
    np.copyto(out, source)
    return out


def _concatenate(
    values: list[np.ndarray], dtype: np.dtype, field: str, spec: PackSpec, out: np.ndarray
) -> np.ndarray:
    """``np.concatenate(values)`` as ``dtype``, written into ``out``; raises where a value
    would change."""
    flat = out.reshape(-1)
    try:  # every value casts to dtype safely: the common case
        np.concatenate(values, out=flat, casting="safe")
        return out
    except (TypeError, ValueError):  # some value may not fit, or dtypes do not mix: checked below
        pass
    sources = {v.dtype for v in values}
    np.concatenate(values, out=flat, casting="unsafe")
    unsafe = sources - {dtype}
    unsafe = {d for d in unsafe if not np.can_cast(d, dtype, "safe")}
    for source in unsafe:
        _check_cast(np.concatenate([v for v in values if v.dtype == source]), dtype, field, spec)
    return out


def _check_cast(values: np.ndarray, dtype: np.dtype, field: str, spec: PackSpec) -> None:
    if values.dtype.kind not in "biuf":
        raise PipelineError(
            f"{spec.op}: field {field!r} has dtype {values.dtype}; packed fields must be "
            "numbers: convert it with a map or drop it"
        )
    with np.errstate(all="ignore"):
        cast = values.astype(dtype)
        if dtype.kind in "iu" and values.dtype.kind in "iu":  # a range (wrapping round-trips)
            info = np.iinfo(dtype)
            if values.dtype == np.uint64:
                bad = values > np.uint64(info.max)
            else:
                wide = values.astype(np.int64)
                bad = wide < info.min
                if info.max < 2**63:
                    bad |= wide > info.max
        elif dtype.kind == "f" and values.dtype.kind == "f":
            bad = np.isinf(cast) & ~np.isinf(values)  # rounding is allowed, overflow is not
        else:
            bad = cast.astype(values.dtype) != values
            if values.dtype.kind == "f":
                bad |= np.isnan(values)
    if bad.any():
        value = values[np.flatnonzero(bad)[0]]
        raise PipelineError(
            f"{spec.op}: field {field!r} holds {value!r} ({values.dtype}), which its packed dtype "
            f"{dtype} cannot hold exactly. Packed fields are int32 unless pack(dtypes=...) says "
            f"otherwise: pass dtypes={{{field!r}: np.{_wide(values.dtype)}}} (or convert the "
            "field with a map)"
        )


def _wide(dtype: np.dtype) -> str:
    return "float32" if dtype.kind == "f" else "int64"


def _raise_mixed(rows: Sequence[PackedRow]) -> None:
    kinds = sorted({(row.fields, row.spec.op, row.spec.seq_len) for row in rows}, key=str)
    raise PipelineError(
        f"rows of one batch come from different packers or have different fields: {kinds[:3]}; "
        "every row of a batch must come from the same pack(...) and carry the same fields"
    )
