"""A compact, self-describing binary encoding of plain data (no pickle).

Encodes ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, ``list``,
``tuple``, ``dict`` (string keys), numpy arrays of numeric or bool dtype, and
``Opaque`` lineages (literal records).
Integers are zigzag varints, so lane states made of small integers (record
pointers) stay a few bytes per pointer. Decoding never executes code.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from zephon_jax.errors import StateError
from zephon_jax.lineage import Opaque

_NONE, _FALSE, _TRUE, _INT, _FLOAT, _STR, _BYTES, _LIST, _TUPLE, _DICT, _ARRAY, _OPAQUE = range(12)


def _put_uint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _put_int(out: bytearray, value: int) -> None:
    _put_uint(out, (value << 1) if value >= 0 else ((-value << 1) - 1))


def _encode(obj: Any, out: bytearray) -> None:
    if obj is None:
        out.append(_NONE)
    elif obj is True or obj is False:
        out.append(_TRUE if obj else _FALSE)
    elif isinstance(obj, (int, np.integer)):
        out.append(_INT)
        _put_int(out, int(obj))
    elif isinstance(obj, (float, np.floating)):
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
        for item in obj:
            _encode(item, out)
    elif isinstance(obj, list):
        out.append(_LIST)
        _put_uint(out, len(obj))
        for item in obj:
            _encode(item, out)
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
        if obj.dtype.kind not in "biufc":
            raise StateError(
                f"cannot encode a numpy array of dtype {obj.dtype}: only numeric and bool arrays "
                "are plain data; convert it before storing it in a carry"
            )
        dtype = obj.dtype.newbyteorder("<").str.encode("ascii")
        out.append(_ARRAY)
        _put_uint(out, len(dtype))
        out += dtype
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
            "(None, bool, int, float, str, bytes, list, tuple, dict, numpy arrays)"
        )


def encode(obj: Any) -> bytes:
    """Encodes plain data to bytes; raises StateError on anything else."""
    out = bytearray()
    _encode(obj, out)
    return bytes(out)


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def uint(self) -> int:
        result = shift = 0
        while True:
            byte = self.data[self.pos]
            self.pos += 1
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                return result
            shift += 7

    def take(self, n: int) -> bytes:
        chunk = self.data[self.pos : self.pos + n]
        if len(chunk) != n:
            raise IndexError
        self.pos += n
        return chunk

    def value(self) -> Any:
        tag = self.data[self.pos]
        self.pos += 1
        if tag == _NONE:
            return None
        if tag == _FALSE:
            return False
        if tag == _TRUE:
            return True
        if tag == _INT:
            z = self.uint()
            return (z >> 1) if not z & 1 else -((z + 1) >> 1)
        if tag == _FLOAT:
            return struct.unpack("<d", self.take(8))[0]
        if tag == _STR:
            return self.take(self.uint()).decode("utf-8")
        if tag == _BYTES:
            return self.take(self.uint())
        if tag in (_LIST, _TUPLE):
            items = [self.value() for _ in range(self.uint())]
            return tuple(items) if tag == _TUPLE else items
        if tag == _DICT:
            n = self.uint()
            return {self.value(): self.value() for _ in range(n)}
        if tag == _ARRAY:
            dtype = np.dtype(self.take(self.uint()).decode("ascii"))
            shape = tuple(self.uint() for _ in range(self.uint()))
            count = int(np.prod(shape, dtype=np.int64))
            raw = self.take(count * dtype.itemsize)
            return np.frombuffer(raw, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))
        if tag == _OPAQUE:
            return Opaque(self.value())
        raise ValueError(f"unknown tag {tag}")


def decode(data: bytes | bytearray | memoryview | np.ndarray) -> Any:
    """Decodes bytes made by :func:`encode`; raises StateError if they are corrupt."""
    if isinstance(data, np.ndarray):
        data = data.tobytes()
    reader = _Reader(bytes(data))
    try:
        value = reader.value()
    except (IndexError, ValueError, UnicodeDecodeError, TypeError) as e:
        raise StateError(
            f"corrupt state bytes ({e!r} at offset {reader.pos}); the state was truncated or "
            "altered: restore from an intact checkpoint"
        ) from e
    if reader.pos != len(reader.data):
        raise StateError(
            f"corrupt state bytes: {len(reader.data) - reader.pos} trailing bytes; restore from an "
            "intact checkpoint"
        )
    return value
