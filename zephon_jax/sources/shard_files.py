"""Reading an uncompressed, local TokenStore's tokens straight from its shard files.

A TokenStore's ``tokens`` array is a zarr v3 array of one dimension whose stored files
(shards) each hold ``shard_tokens`` tokens as independent inner chunks of
``chunk_tokens``, with an index of ``(byte offset, byte count)`` per inner chunk at the
end (or the start) of the file. When the inner chunks are stored as plain little-endian
bytes (a store written with ``compression=None``), a token span is a slice of a shard
file: :class:`ShardFiles` memory-maps the shard files it touches, finds the runs of
bytes that hold the spans with one kernel call
(:func:`~zephon_jax.core.compiled_kernels.span_runs`) and copies each run out with one
slice, which costs a small fraction of a TensorStore read of the same spans
(TensorStore's per-chunk work dominates reads of a few thousand tokens). A slice copy
beats a compiled copy loop here (measured: about half the time for runs of a few
kilobytes), so only the finding of the runs is compiled. The gather kernel needs no
copy at all: :meth:`ShardFiles.addresses` says where each span lies in the mapped
files (:func:`~zephon_jax.core.compiled_kernels.span_addresses`), and the kernel reads
it there.

:func:`shard_layout` says from an array's zarr metadata whether it has that layout; a
store of any other layout (compressed, remote, another key encoding) is read through
TensorStore. The shard index's checksum is not verified here (TensorStore verifies it
on its reads); an index whose entries do not fit its file raises :class:`CorruptShard`.
"""

from __future__ import annotations

import mmap
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zephon_jax.core.compiled_kernels import (
    CHUNK_ABSENT,
    CHUNK_UNKNOWN,
    OUTSIDE,
    span_addresses,
    span_runs,
)

__all__ = ["CorruptShard", "ShardFiles", "ShardLayout", "shard_layout"]

_NO_CHUNK = np.uint64(2**64 - 1)  # the index entry of an absent inner chunk
_LITTLE_BYTES = {"name": "bytes", "configuration": {"endian": "little"}}
_INDEX_CODECS = [_LITTLE_BYTES, {"name": "crc32c"}]
_INDEX_CHECKSUM_BYTES = 4
_MAPS_KEPT = 4096  # open shard maps at most (each is one kernel mapping)
_MAPS_HELD_ALL = 64  # a gather holds all open maps while there are at most these


class CorruptShard(ValueError):
    """A shard file's index does not fit the file."""


@dataclass(frozen=True)
class ShardLayout:
    """Where a sharded array of plain-bytes inner chunks keeps its tokens."""

    directory: Path  # the folder of the shard files (``c`` of the array)
    shard_tokens: int
    chunk_tokens: int
    dtype: np.dtype  # the stored (little-endian) dtype
    index_at_end: bool
    fill_value: int

    @property
    def chunks_per_shard(self) -> int:
        """Inner chunks in one shard file."""
        return self.shard_tokens // self.chunk_tokens


def shard_layout(metadata: dict[str, Any], array_dir: Path) -> ShardLayout | None:
    """The layout of the 1-D zarr v3 array at ``array_dir`` with ``metadata`` (its
    ``zarr.json``) when its shard files can be read directly, else None."""
    grid = metadata.get("chunk_grid", {})
    codecs = metadata.get("codecs", [])
    key = metadata.get("chunk_key_encoding", {})
    if key.get("name") != "default" or key.get("configuration", {}).get("separator", "/") != "/":
        return None
    if grid.get("name") != "regular" or len(codecs) != 1:
        return None
    shard = grid.get("configuration", {}).get("chunk_shape", [])
    config = codecs[0].get("configuration", {})
    inner = config.get("chunk_shape", [])
    fill = metadata.get("fill_value")
    if (
        codecs[0].get("name") != "sharding_indexed"
        or len(shard) != 1
        or len(inner) != 1
        or config.get("codecs") != [_LITTLE_BYTES]
        or config.get("index_codecs") != _INDEX_CODECS
        or config.get("index_location", "end") not in ("end", "start")
        or not isinstance(fill, int)
    ):
        return None
    dtype = np.dtype(metadata["data_type"]).newbyteorder("<")
    at_end = config.get("index_location", "end") == "end"
    return ShardLayout(array_dir / "c", int(shard[0]), int(inner[0]), dtype, at_end, fill)


class ShardFiles:
    """Token spans of a directly readable array (see :func:`shard_layout`) of
    ``num_tokens`` tokens, copied out of memory-mapped shard files or located in them.

    Each shard's index is read the first time a span touches it; at most 4096 shard
    maps stay open (the oldest is dropped first). Thread-safe. A process keeps its own
    maps: make one per process.
    """

    def __init__(self, layout: ShardLayout, num_tokens: int) -> None:
        self._layout = layout
        self._num_tokens = num_tokens
        num_chunks = -(-num_tokens // layout.chunk_tokens)
        self._where = np.full(num_chunks, CHUNK_UNKNOWN, np.int64)  # byte offset in its shard
        self._maps: dict[int, memoryview] = {}
        num_shards = -(-num_chunks // layout.chunks_per_shard)
        self._base_of = np.zeros(num_shards, np.int64)  # each open map's address, else 0
        self._lock = threading.RLock()

    def read(self, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
        """Token spans ``[starts[k], stops[k])`` (non-empty, within the array) one after
        the other in one new array of the native dtype."""
        layout = self._layout
        size = layout.dtype.itemsize
        runs, shard, offset, first_byte, bounds = self._runs(starts, stops)
        out = np.empty(int(bounds[runs]), layout.dtype)
        raw = out.view(np.uint8).data  # a memoryview: its slices cost less than an array's
        maps = self._maps
        byte_bounds = bounds[: runs + 1] * size
        first = first_byte[:runs]
        copies = zip(
            shard[:runs].tolist(),
            offset[:runs].tolist(),
            first.tolist(),
            (first + np.diff(byte_bounds)).tolist(),
            byte_bounds.tolist(),
            byte_bounds[1:].tolist(),
        )
        for sh, written, b0, b1, p0, p1 in copies:
            if written < 0:  # inner chunks never written hold the fill value
                out[p0 // size : p1 // size] = layout.fill_value
            else:
                raw[p0:p1] = (maps.get(sh) or self._map(sh))[b0:b1]
        return out if layout.dtype.isnative else out.astype(layout.dtype.newbyteorder("="))

    def addresses(
        self, starts: np.ndarray, stops: np.ndarray
    ) -> tuple[np.ndarray, list[Any]] | None:
        """Where token spans ``[starts[k], stops[k])`` (int64 arrays) are in memory:
        ``(addresses, held)``, the byte address of each span's first token (0 for an
        empty span), and what holds that memory (keep it while the addresses are read).
        A span that lies in one run of a shard file is read where the file is mapped
        (:func:`~zephon_jax.core.compiled_kernels.span_addresses`); the others (across
        inner chunks stored apart, or in chunks never written) are copied by
        :meth:`read` into one new array. None where the stored dtype is not native;
        IndexError where a span reaches outside the array."""
        layout = self._layout
        if not layout.dtype.isnative:
            return None
        size = layout.dtype.itemsize
        addresses = np.empty(len(starts), np.int64)
        shard_of = np.empty(len(starts), np.int64)
        cut = (starts, stops, self._num_tokens, layout.chunk_tokens, layout.chunks_per_shard)
        for _ in range(3):  # more shards than stay mapped at once: the spans are copied
            with self._lock:  # no map is dropped while its addresses are taken
                missing, apart = span_addresses(
                    *cut, self._where, size, self._base_of, addresses, shard_of
                )
                if not missing:
                    held = self._held(addresses, shard_of)
                    break
            if missing == OUTSIDE:
                raise IndexError(f"token spans reach outside the {self._num_tokens} tokens")
            chunks = shard_of[:missing]
            self._know(chunks)
            for shard in np.unique(chunks // layout.chunks_per_shard).tolist():
                self._mapped(shard)
        else:
            return None
        if apart:
            copied = np.flatnonzero(addresses < 0)
            flat = self.read(starts[copied], stops[copied])
            lengths = stops[copied] - starts[copied]
            addresses[copied] = flat.ctypes.data + (np.cumsum(lengths) - lengths) * size
            held.append(flat)
        return addresses, held

    def _held(self, addresses: np.ndarray, shard_of: np.ndarray) -> list[Any]:
        """The maps the located spans (``addresses > 0``, in shards ``shard_of``) are
        in: all maps open while they are few (cheaper than finding those used)."""
        if len(self._maps) <= _MAPS_HELD_ALL:
            return list(self._maps.values())
        used = np.flatnonzero(np.bincount(shard_of[addresses > 0])).tolist()
        return [self._maps[shard] for shard in used]

    def _runs(self, starts: np.ndarray, stops: np.ndarray) -> tuple:
        """:func:`~zephon_jax.core.compiled_kernels.span_runs` of the spans (shards'
        indices read first where needed): ``(runs, shard, offset, first_byte, bounds)``."""
        layout = self._layout
        size = layout.dtype.itemsize
        cut = (starts, stops, layout.chunk_tokens, layout.chunks_per_shard)
        runs, unknown, shard, offset, first_byte, bounds = span_runs(*cut, self._where, size)
        if unknown:  # read the indices of the shards not touched before, then again
            self._know(shard[:unknown])
            runs, _, shard, offset, first_byte, bounds = span_runs(*cut, self._where, size)
        return runs, shard, offset, first_byte, bounds

    def _know(self, chunks: np.ndarray) -> None:
        """Reads the index of every shard holding one of ``chunks`` not read yet."""
        unknown = chunks[self._where[chunks] == CHUNK_UNKNOWN]
        if unknown.size == 0:
            return
        with self._lock:
            for shard in np.unique(unknown // self._layout.chunks_per_shard).tolist():
                self._read_index(shard)

    def _read_index(self, shard: int) -> None:
        layout = self._layout
        per = layout.chunks_per_shard
        first = shard * per
        count = min(per, self._where.size - first)
        data = np.frombuffer(self._map(shard), np.uint8)
        if data.size == 0:
            self._where[first : first + count] = CHUNK_ABSENT
            return
        self._where[first : first + count] = _index_entries(data, layout, shard)[:count]

    def _map(self, shard: int) -> memoryview:
        """Shard file ``shard`` as read-only bytes (empty when the file does not exist)."""
        data = self._maps.get(shard)
        if data is not None:
            return data
        return self._mapped(shard)

    def _mapped(self, shard: int) -> memoryview:
        """Shard file ``shard`` mapped (if it is not) as read-only bytes; its address in
        memory noted in ``_base_of`` while the map is open (0: an empty file)."""
        with self._lock:
            data = self._maps.get(shard)
            if data is None:
                data = _map_file(self._layout.directory / str(shard))
                if len(self._maps) >= _MAPS_KEPT:
                    oldest = next(iter(self._maps))
                    del self._maps[oldest]
                    self._base_of[oldest] = 0
                self._base_of[shard] = np.frombuffer(data, np.uint8).ctypes.data if data else 0
                self._maps[shard] = data
            return data


def _index_entries(data: np.ndarray, layout: ShardLayout, shard: int) -> np.ndarray:
    """Byte offset of each inner chunk of shard file ``data`` (``CHUNK_ABSENT`` for none)."""
    per = layout.chunks_per_shard
    index_bytes = 16 * per + _INDEX_CHECKSUM_BYTES
    chunk_bytes = layout.chunk_tokens * layout.dtype.itemsize
    path = layout.directory / str(shard)
    if data.size < index_bytes:
        raise CorruptShard(f"shard file {path} is shorter ({data.size} bytes) than its index")
    at = data.size - index_bytes if layout.index_at_end else 0
    entries = data[at : at + 16 * per].view("<u8").reshape(per, 2)
    absent = (entries[:, 0] == _NO_CHUNK) & (entries[:, 1] == _NO_CHUNK)
    offset = entries[:, 0].astype(np.int64)  # past 2**63: negative, so refused below
    fits = (offset >= 0) & (offset <= data.size - chunk_bytes)
    bad = ~absent & ((entries[:, 1] != chunk_bytes) | ~fits)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise CorruptShard(
            f"shard file {path} is corrupt: the index entry of inner chunk {k} "
            f"({int(entries[k, 0])}, {int(entries[k, 1])}) does not fit its {data.size} bytes"
        )
    offset[absent] = CHUNK_ABSENT
    return offset


def _map_file(path: Path) -> memoryview:
    """The bytes of the file at ``path`` memory-mapped read-only (empty when absent)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return memoryview(b"")
    try:
        if os.fstat(fd).st_size == 0:
            return memoryview(b"")
        return memoryview(mmap.mmap(fd, 0, access=mmap.ACCESS_READ))
    finally:
        os.close(fd)
