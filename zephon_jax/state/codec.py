"""A compact, self-describing binary encoding of plain data (no pickle).

Encodes ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, ``list``,
``tuple``, ``dict`` (string keys), numpy arrays and numpy scalars of numeric or
bool dtype, and ``Opaque`` lineages (literal records). Every value decodes to
the same type it was encoded from: a ``np.float32`` comes back a ``np.float32``
(not a Python float), an ``np.int16`` an ``np.int16``.
Integers are zigzag varints, so lane states made of small integers (record
pointers) stay a few bytes per pointer. Decoding never executes code.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from zephon_jax.core import compiled_kernels as ck
from zephon_jax.core.lineage import Opaque, draw_piece_lineages, piece
from zephon_jax.errors import StateError

_NONE, _FALSE, _TRUE, _INT, _FLOAT, _STR, _BYTES, _LIST, _TUPLE, _DICT, _ARRAY, _OPAQUE = range(12)
_SCALAR = 12  # a numpy scalar: dtype, then its bytes
_NUMERIC_KINDS = "biufc"


def _put_uint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _put_int(out: bytearray, value: int) -> None:
    _put_uint(out, (value << 1) if value >= 0 else ((-value << 1) - 1))


def _put_dtype(out: bytearray, dtype: np.dtype) -> None:
    text = dtype.newbyteorder("<").str.encode("ascii")
    _put_uint(out, len(text))
    out += text


# The encodings of the ints 0..63 (one tag byte, one varint byte).
_SMALL_INTS = [bytes((_INT, v << 1)) for v in range(64)]


def _encode_items(items: tuple | list, out: bytearray) -> None:
    """Each of ``items``, as :func:`_encode` writes it; small ints, plain ints and tuples
    of them (the bulk of record pointers) without a call each."""
    small = _SMALL_INTS
    for item in items:
        kind = type(item)
        if kind is int:
            if 0 <= item < 64:
                out += small[item]
            else:
                out.append(_INT)
                _put_int(out, item)
        elif kind is tuple and len(item) < 0x80:
            out.append(_TUPLE)
            out.append(len(item))
            _encode_items(item, out)
        else:
            _encode(item, out)


def _encode(obj: Any, out: bytearray) -> None:
    if obj is None:
        out.append(_NONE)
    elif obj is True or obj is False:
        out.append(_TRUE if obj else _FALSE)
    elif isinstance(obj, np.generic):  # before int/float: np.float64 is a float subclass
        if obj.dtype.kind not in _NUMERIC_KINDS:
            raise StateError(
                f"cannot encode a numpy scalar of dtype {obj.dtype}: only numeric and bool "
                "scalars are plain data; convert it before storing it in a carry"
            )
        out.append(_SCALAR)
        _put_dtype(out, obj.dtype)
        out += np.asarray(obj, dtype=obj.dtype.newbyteorder("<")).tobytes()
    elif isinstance(obj, int):
        out.append(_INT)
        _put_int(out, int(obj))
    elif isinstance(obj, float):
        out.append(_FLOAT)
        out += struct.pack("<d", float(obj))
    elif isinstance(obj, str):
        data = obj.encode("utf-8")
        out.append(_STR)
        _put_uint(out, len(data))
        out += data
    elif isinstance(obj, (bytes, bytearray)):
        out.append(_BYTES)
        _put_uint(out, len(obj))
        out += obj
    elif isinstance(obj, tuple):
        out.append(_TUPLE)
        _put_uint(out, len(obj))
        _encode_items(obj, out)
    elif isinstance(obj, list):
        out.append(_LIST)
        _put_uint(out, len(obj))
        _encode_items(obj, out)
    elif isinstance(obj, dict):
        out.append(_DICT)
        _put_uint(out, len(obj))
        for key, value in obj.items():
            if not isinstance(key, str):
                raise StateError(
                    f"cannot encode a dict key of type {type(key).__name__}; use str keys"
                )
            _encode(key, out)
            _encode(value, out)
    elif isinstance(obj, np.ndarray):
        if obj.dtype.kind not in _NUMERIC_KINDS:
            raise StateError(
                f"cannot encode a numpy array of dtype {obj.dtype}: only numeric and bool arrays "
                "are plain data; convert it before storing it in a carry"
            )
        out.append(_ARRAY)
        _put_dtype(out, obj.dtype)
        _put_uint(out, obj.ndim)
        for dim in obj.shape:
            _put_uint(out, dim)
        out += np.ascontiguousarray(obj, dtype=obj.dtype.newbyteorder("<")).tobytes()
    elif isinstance(obj, Opaque):
        out.append(_OPAQUE)
        _encode(obj.data, out)
    else:
        raise StateError(
            f"cannot encode an object of type {type(obj).__name__}: a carry must be plain data "
            "(None, bool, int, float, str, bytes, list, tuple, dict, numpy arrays and scalars)"
        )


def encode(obj: Any) -> bytes:
    """Encodes plain data to bytes; raises StateError on anything else."""
    out = bytearray()
    _encode(obj, out)
    return bytes(out)


def _uint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it."""
    byte = data[pos]
    if byte < 0x80:
        return byte, pos + 1
    result, shift = byte & 0x7F, 7
    while True:
        pos += 1
        byte = data[pos]
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos + 1
        shift += 7


def _dtype(data: bytes, pos: int) -> tuple[np.dtype, int]:
    n, pos = _uint(data, pos)
    text = data[pos : pos + n]
    if len(text) != n:
        raise IndexError("truncated dtype")
    try:
        dtype = np.dtype(text.decode("ascii"))
    except Exception as e:  # np.dtype parses its text: a tampered one may raise anything
        raise ValueError(f"a stored dtype {text!r} is not a dtype ({e!r})") from e
    if dtype.kind not in _NUMERIC_KINDS:
        raise ValueError(f"a stored dtype {dtype} is not numeric")
    return dtype, pos + n


def _take(data: bytes, pos: int, n: int) -> bytes:
    chunk = data[pos : pos + n]
    if len(chunk) != n:
        raise IndexError("truncated value")
    return chunk


def _int(data: bytes, pos: int) -> tuple[int, int]:
    """The zigzag varint at ``pos`` (one or two bytes inline) and the position after it."""
    z = data[pos]
    if z < 0x80:
        pos += 1
    else:
        low = data[pos + 1]
        if low < 0x80:
            z = (z & 0x7F) | (low << 7)
            pos += 2
        else:
            z, pos = _uint(data, pos)
    return (-((z + 1) >> 1) if z & 1 else z >> 1), pos


# The start of ``((a,), b)``: an operator output of one parent, e.g. a piece of a record.
_ONE_PARENT = bytes((_TUPLE, 2, _TUPLE, 1, _INT))
# The start of ``(((a, b, c),), d)``: an output of one parent of three ints, e.g. a piece
# of a record a mixture drew.
_DRAW_PIECE = bytes((_TUPLE, 2, _TUPLE, 1, _TUPLE, 3))


# The prefix as the kernels read it (see _kernel_bytes).
_DRAW_PIECE_PREFIX = np.frombuffer(_DRAW_PIECE, np.uint8) if ck.COMPILED else _DRAW_PIECE
_DRAW_PIECE_MIN = len(_DRAW_PIECE) + 4 * 2  # its bytes at the least: four one-byte ints


def _draw_piece_array(data: bytes, pos: int, most: int) -> tuple[np.ndarray, int]:
    """The draw pieces ``(((a, b, c),), d)`` that follow one another from ``pos`` (which
    starts with ``_DRAW_PIECE``), at most ``most``, read by the kernel
    :func:`~zephon_jax.core.compiled_kernels.draw_pieces` as the rows ``(a, b, c, d)``
    of an int64 array, and the position after them (no rows and ``pos`` if the first
    is not one with four small ints: the general decoding reads it)."""
    most = min(most, (len(data) - pos) // _DRAW_PIECE_MIN)  # (a tampered count is not sized)
    out = np.empty((max(most, 0), 4), np.int64)
    k, pos = ck.draw_pieces(_kernel_bytes(data), pos, _DRAW_PIECE_PREFIX, _INT, out)
    return out[:k], pos


def _kernel_bytes(data: bytes) -> Any:
    """``data`` as the kernels read it: as uint8 where compiled, as it is interpreted."""
    return np.frombuffer(data, np.uint8) if ck.COMPILED else data


def _draw_pieces(data: bytes, pos: int, most: int, items: list) -> tuple[int, int]:
    """Appends to ``items`` the draw pieces of :func:`_draw_piece_array` (as lineages);
    returns how many and the position after them."""
    found, pos = _draw_piece_array(data, pos, most)
    items.extend(draw_piece_lineages(found))
    return len(found), pos


def _items(data: bytes, pos: int, n: int) -> tuple[list, int]:
    """``n`` values from ``pos``; ints, tuples, ``((int,), int)`` and ``(((int, int, int),),
    int)`` (the bulk of record pointers) inline, with the same result as :func:`_value` of
    each."""
    items: list = []
    append = items.append
    left = n
    while left:
        left -= 1
        tag = data[pos]
        if tag == _INT:
            z = data[pos + 1]
            if z < 0x80:
                pos += 2
            else:
                z, pos = _uint(data, pos + 1)
            append(-((z + 1) >> 1) if z & 1 else z >> 1)
        elif tag == _TUPLE and data[pos + 1] < 0x80:
            if data.startswith(_ONE_PARENT, pos):
                parent, at = _int(data, pos + 5)
                if data[at] == _INT:  # else decoded in general below
                    recipe, pos = _int(data, at + 1)
                    append(piece(parent, recipe))
                    continue
            elif data.startswith(_DRAW_PIECE, pos):
                k, pos = _draw_pieces(data, pos, left + 1, items)
                if k:  # else decoded in general below
                    left -= k - 1
                    continue
            inner, pos = _items(data, pos + 2, data[pos + 1])
            append(tuple(inner))
        else:
            item, pos = _value(data, pos)
            append(item)
    return items, pos


def _value(data: bytes, pos: int) -> tuple[Any, int]:
    """The value at ``pos`` and the position after it."""
    tag = data[pos]
    pos += 1
    if tag == _TUPLE or tag == _LIST:
        n, pos = _uint(data, pos)
        items, pos = _items(data, pos, n)
        return (tuple(items) if tag == _TUPLE else items), pos
    if tag == _INT:
        z, pos = _uint(data, pos)
        return (-((z + 1) >> 1) if z & 1 else z >> 1), pos
    if tag == _NONE:
        return None, pos
    if tag == _FALSE:
        return False, pos
    if tag == _TRUE:
        return True, pos
    if tag == _FLOAT:
        return struct.unpack("<d", _take(data, pos, 8))[0], pos + 8
    if tag == _STR or tag == _BYTES:
        n, pos = _uint(data, pos)
        chunk = _take(data, pos, n)
        return (chunk.decode("utf-8") if tag == _STR else chunk), pos + n
    if tag == _DICT:
        n, pos = _uint(data, pos)
        out = {}
        for _ in range(n):
            key, pos = _value(data, pos)
            if not isinstance(key, str):
                raise ValueError(f"a dict key of type {type(key).__name__}")
            out[key], pos = _value(data, pos)
        return out, pos
    if tag == _SCALAR:
        dtype, pos = _dtype(data, pos)
        raw = _take(data, pos, dtype.itemsize)
        return np.frombuffer(raw, dtype=dtype)[0].astype(dtype.newbyteorder("=")), pos + len(raw)
    if tag == _ARRAY:
        dtype, pos = _dtype(data, pos)
        ndim, pos = _uint(data, pos)
        shape = []
        for _ in range(ndim):
            dim, pos = _uint(data, pos)
            shape.append(dim)
        count = int(np.prod(shape, dtype=np.int64))
        raw = _take(data, pos, count * dtype.itemsize)
        array = np.frombuffer(raw, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))
        return array, pos + len(raw)
    if tag == _OPAQUE:
        inner, pos = _value(data, pos)
        return Opaque(inner), pos
    raise ValueError(f"unknown tag {tag}")


class Reader:
    """Reads the values encoded one after another in bytes, for a caller that knows
    their structure (a lane state's, see :mod:`zephon_jax.state.lane_format`); every
    read raises StateError where the bytes are corrupt, as :func:`decode` does."""

    def __init__(self, data: bytes | bytearray | memoryview | np.ndarray):
        if isinstance(data, np.ndarray):
            data = data.tobytes()
        self.data = bytes(data)
        self.pos = 0

    def value(self) -> Any:
        """The next value."""
        with _corrupt_bytes():
            value, self.pos = _value(self.data, self.pos)
        return value

    def tuple_length(self) -> int | None:
        """The length of the tuple that starts here, read past its head; None (nothing
        read) where the next value is not a tuple."""
        with _corrupt_bytes():
            if self.data[self.pos] != _TUPLE:
                return None
            n, self.pos = _uint(self.data, self.pos + 1)
        return n

    def values(self, n: int) -> list:
        """The next ``n`` values."""
        with _corrupt_bytes():
            values, self.pos = _items(self.data, self.pos, n)
        return values

    def draw_pieces(self, n: int) -> np.ndarray | None:
        """The next ``n`` values as the rows ``(a, b, c, d)`` of an ``(n, 4)`` int64 array
        where they are all draw pieces ``(((a, b, c),), d)`` written with small ints (the
        open rows of a mixture lane's ``pack``), read past them; else None (nothing read)."""
        data, pos = self.data, self.pos
        if not n or not data.startswith(_DRAW_PIECE, pos):
            return None
        with _corrupt_bytes():
            found, after = _draw_piece_array(data, pos, n)
        if len(found) != n:
            return None
        self.pos = after
        return found

    def draw_rows(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The next ``n`` values as arrays where they are all packed rows' lineages
        ``(parents, lengths)``, ``parents`` draw pieces as :meth:`draw_pieces` reads them
        and ``lengths`` as many ints (a mixture lane's rows made ahead): the pieces (the
        rows of an ``(m, 4)`` int64 array), their lengths and each row's end in them,
        read past them; else None (nothing read)."""
        data, pos = self.data, self.pos
        most = (len(data) - pos) // _DRAW_PIECE_MIN
        if not n or n > most:
            return None
        pieces = np.empty((most, 4), np.int64)
        lengths = np.empty(most, np.int64)
        ends = np.empty(n, np.int64)
        with _corrupt_bytes():
            rows, after = ck.draw_rows(
                _kernel_bytes(data), pos, n, _DRAW_PIECE_PREFIX, _INT, _TUPLE, pieces, lengths, ends
            )  # fmt: skip
        if rows != n:
            return None
        self.pos = after
        m = int(ends[-1])
        return pieces[:m], lengths[:m], ends

    def end(self) -> None:
        """Raises unless every byte was read."""
        if self.pos != len(self.data):
            raise StateError(
                f"corrupt state bytes: {len(self.data) - self.pos} trailing bytes; restore "
                "from an intact checkpoint"
            )


class _corrupt_bytes:
    """Turns an error of reading bytes into the StateError of corrupt bytes."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: Any, trace: Any) -> None:
        # Decoding only reads: any failure means the bytes are not what encode() made.
        if isinstance(error, _READ_ERRORS):
            raise StateError(
                f"corrupt state bytes ({error!r}); the state was truncated or altered: "
                "restore from an intact checkpoint"
            ) from error


_READ_ERRORS = (IndexError, ValueError, TypeError, OverflowError, RecursionError, MemoryError)


def decode(data: bytes | bytearray | memoryview | np.ndarray) -> Any:
    """Decodes bytes made by :func:`encode`; raises StateError if they are corrupt."""
    reader = Reader(data)
    value = reader.value()
    reader.end()
    return value
