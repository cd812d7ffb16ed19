"""Jagged token store on TensorStore (zarr v3).

Layout of a store directory::

    tokens/     zarr v3 1-D array: every document's tokens, concatenated, in shards of
                read chunks, plain (the default) or blosc/zstd (``compression="zstd"``)
    offsets/    zarr v3 int64 1-D array: doc i is tokens[offsets[i]:offsets[i + 1]]
    meta.json   commit record: {"format", "version", "num_docs", "num_tokens", "dtype", "attrs"}

``meta.json`` is written last and atomically. The arrays may hold more data than
``meta.json`` records (a writer that died before committing); readers only ever see
the committed prefix, and a resuming writer overwrites the rest.

Two ways to write one: :class:`TokenStoreWriter` appends documents in one process
(:func:`write_token_store` wraps it); :func:`create_token_store`,
:func:`write_token_range` and :func:`commit_token_store` write a store of known size
from many processes at once, each filling its own stored shards of the tokens.
Readers read a local plain store's tokens from its memory-mapped shard files
(:mod:`zephon_jax.sources.shard_files`) and any other store through TensorStore.
"""

from __future__ import annotations

import hashlib
import json
import operator
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tensorstore as ts

from zephon_jax.sources.shard_files import CorruptShard, ShardFiles, shard_layout
from zephon_jax.sources.storage import Location, retry_call, ts_context
from zephon_jax.sources.token_array import TokenArray

__all__ = [
    "TokenStore",
    "TokenStoreError",
    "TokenStoreWriter",
    "commit_token_store",
    "create_token_store",
    "write_token_range",
    "write_token_store",
]

FORMAT = "zephon_jax.TokenStore"
VERSION = 1
META_FILE = "meta.json"
PREPARE_RECORD = "prepare.json"  # the job record of `zephon-jax prepare`, beside its store
TOKENS_DIR = "tokens"
OFFSETS_DIR = "offsets"
SUPPORTED_DTYPES = ("uint16", "uint32", "int32")
COMPRESSIONS = (None, "zstd")
DEFAULT_CHUNK_TOKENS = 1 << 20
DEFAULT_READ_CHUNK_TOKENS = 1 << 13
OFFSETS_CHUNK = 1 << 17
# Token spans per virtual concatenation read (building one costs more per span as it grows).
_CONCAT_LAYERS = 1024
_HINT = "was it written with TokenStoreWriter / `zephon-jax prepare`?"


class TokenStoreError(ValueError):
    """A TokenStore is missing, corrupt, or used inconsistently."""


_ts_context = ts_context


def _check_dtype(dtype: Any) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise TokenStoreError(f"unsupported dtype {dtype!r}; use one of {SUPPORTED_DTYPES}") from e
    if dt.name not in SUPPORTED_DTYPES:
        raise TokenStoreError(f"unsupported dtype {dt.name!r}; use one of {SUPPORTED_DTYPES}")
    return dt


def _bytes_codec() -> dict[str, Any]:
    return {"name": "bytes", "configuration": {"endian": "little"}}


def _compression_codec(dtype: np.dtype) -> dict[str, Any]:
    return {
        "name": "blosc",
        "configuration": {
            "cname": "zstd",
            "clevel": 3,
            "shuffle": "shuffle",
            "typesize": dtype.itemsize,
        },
    }


def _array_spec(loc: Location, name: str) -> dict[str, Any]:
    return {"driver": "zarr3", "kvstore": loc.kvstore(name)}


def _check_compression(compression: Any) -> str | None:
    if compression not in COMPRESSIONS:
        raise TokenStoreError(
            f"unsupported compression {compression!r}; use None (plain tokens, read through "
            f"memory maps when local) or 'zstd' (smaller files, decoded on every read)"
        )
    return compression


def _tokens_create_spec(
    loc: Location,
    dtype: np.dtype,
    chunk_tokens: int,
    read_chunk_tokens: int,
    compression: str | None,
) -> dict[str, Any]:
    codecs = [_bytes_codec()]
    if compression is not None:
        codecs.append(_compression_codec(dtype))
    sharding = {
        "name": "sharding_indexed",
        "configuration": {
            "chunk_shape": [read_chunk_tokens],
            "codecs": codecs,
            "index_codecs": [_bytes_codec(), {"name": "crc32c"}],
        },
    }
    metadata = {
        "shape": [0],
        "data_type": dtype.name,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [chunk_tokens]}},
        "codecs": [sharding],
    }
    return {**_array_spec(loc, TOKENS_DIR), "metadata": metadata}


def _offsets_create_spec(loc: Location) -> dict[str, Any]:
    metadata = {
        "shape": [1],
        "data_type": "int64",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [OFFSETS_CHUNK]}},
        "codecs": [_bytes_codec(), _compression_codec(np.dtype(np.int64))],
    }
    return {**_array_spec(loc, OFFSETS_DIR), "metadata": metadata}


def _open_array(loc: Location, name: str, *, write: bool = False) -> ts.TensorStore:
    spec = _array_spec(loc, name)
    if not write:
        # The committed prefix of a store never changes: what was cached since this open
        # is fresh (data cached before it, e.g. of a rewritten store, is checked again).
        spec["recheck_cached_data"] = "open"
    try:
        return retry_call(
            lambda: ts.open(spec, read=True, write=write, context=_ts_context()).result(),
            loc.child(name),
            "opening",
        )
    except (ValueError, OSError) as e:
        raise TokenStoreError(
            f"cannot open the {name!r} array of TokenStore {loc.name!r} ({e}); the store is "
            f"incomplete or corrupt: rewrite it with TokenStoreWriter"
        ) from e


def _write_meta(loc: Location, meta: dict[str, Any]) -> None:
    """Atomically replace ``meta.json`` (local: temp file, fsync, os.replace; URL: one PUT)."""
    loc.write(META_FILE, json.dumps(meta, indent=1, sort_keys=True).encode())


def _read_meta(loc: Location) -> dict[str, Any]:
    """Load and validate ``meta.json``; raise TokenStoreError naming the problem."""
    path = loc.name
    if loc.local is not None and loc.local.is_file():
        raise TokenStoreError(
            f"not a TokenStore: {path!r} is a file, and a TokenStore is a directory; make one "
            f"from it with `zephon-jax prepare {path} -o STORE_DIR` and open STORE_DIR"
        )
    if loc.local is not None and not loc.local.is_dir():
        raise TokenStoreError(f"not a TokenStore: directory {path!r} does not exist; {_HINT}")
    meta_path = loc.child(META_FILE)
    raw = loc.read(META_FILE)
    if raw is None:
        raise TokenStoreError(
            f"not a TokenStore: {meta_path!r} is missing (no committed data); {_HINT}"
        )
    try:
        meta = json.loads(raw.decode())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenStoreError(
            f"corrupt meta.json in {path!r}: {e}; rewrite the store with TokenStoreWriter"
        ) from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise TokenStoreError(
            f"not a TokenStore: {meta_path!r} has format {got!r}, expected {FORMAT!r}; {_HINT}"
        )
    if meta.get("version") != VERSION:
        raise TokenStoreError(
            f"unsupported TokenStore version {meta.get('version')!r} in {meta_path!r}; this "
            f"zephon_jax reads version {VERSION}: rewrite the store or upgrade zephon_jax"
        )
    for key in ("num_docs", "num_tokens"):
        value = meta.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise TokenStoreError(
                f"corrupt meta.json in {path!r}: {key!r} is {value!r}, expected an int >= 0; "
                f"rewrite the store with TokenStoreWriter"
            )
    if meta.get("dtype") not in SUPPORTED_DTYPES:
        raise TokenStoreError(
            f"corrupt meta.json in {path!r}: dtype {meta.get('dtype')!r} is not one of "
            f"{SUPPORTED_DTYPES}; rewrite the store with TokenStoreWriter"
        )
    if not isinstance(meta.get("attrs", {}), dict):
        raise TokenStoreError(f"corrupt meta.json in {path!r}: 'attrs' must be an object")
    return meta


def _validate_offsets(path: str, offsets: np.ndarray, num_tokens: int) -> None:
    if offsets[0] != 0:
        raise TokenStoreError(
            f"corrupt TokenStore {path!r}: offsets[0] is {int(offsets[0])}, expected 0; "
            f"rewrite the store with TokenStoreWriter"
        )
    bad = np.flatnonzero(np.diff(offsets) < 0)
    if bad.size:
        i = int(bad[0]) + 1
        raise TokenStoreError(
            f"corrupt TokenStore {path!r}: offsets are not non-decreasing: first bad index "
            f"{i} (offsets[{i - 1}]={int(offsets[i - 1])} > offsets[{i}]={int(offsets[i])}); "
            f"rewrite the store with TokenStoreWriter"
        )
    if offsets[-1] != num_tokens:
        raise TokenStoreError(
            f"corrupt TokenStore {path!r}: last offset is {int(offsets[-1])} but meta.json "
            f"says num_tokens={num_tokens}; rewrite the store with TokenStoreWriter"
        )


def _check_prepared(loc: Location, num_docs: int) -> None:
    """Raises if ``loc`` is the output of a ``zephon-jax prepare`` job that did not finish."""
    raw = loc.read(PREPARE_RECORD)
    if raw is None:  # not written by prepare
        return
    try:
        record = json.loads(raw.decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        record = None
    if isinstance(record, dict) and record.get("complete") is True:
        return
    raise TokenStoreError(
        f"{loc.name!r} is an incomplete `zephon-jax prepare` output: its {PREPARE_RECORD} does "
        f"not record a finished job (it was stopped, killed or ran out of disk space after "
        f"committing {num_docs:,} documents). Rerun the same prepare command to finish it, or "
        "pass allow_partial=True to read the documents committed so far"
    )


@dataclass(frozen=True)
class _Opened:
    pid: int
    meta: dict[str, Any]
    tokens: ts.TensorStore
    offsets: np.ndarray
    dtype: np.dtype
    coalesce_gap: int
    direct: ShardFiles | None  # reads the tokens without TensorStore (a local plain store)


def _open_store(loc: Location) -> _Opened:
    """Open and fully validate the committed part of a store."""
    path = loc.name
    meta = _read_meta(loc)
    num_docs, num_tokens = meta["num_docs"], meta["num_tokens"]
    dtype = np.dtype(meta["dtype"])
    tokens = _open_array(loc, TOKENS_DIR)
    offsets_arr = _open_array(loc, OFFSETS_DIR)
    if tokens.rank != 1 or offsets_arr.rank != 1:
        raise TokenStoreError(f"corrupt TokenStore {path!r}: arrays must be 1-D")
    if tokens.dtype.numpy_dtype != dtype:
        raise TokenStoreError(
            f"corrupt TokenStore {path!r}: meta.json says dtype {dtype.name!r} but the tokens "
            f"array is {tokens.dtype.numpy_dtype.name!r}; rewrite the store with TokenStoreWriter"
        )
    if offsets_arr.dtype.numpy_dtype != np.int64:
        raise TokenStoreError(
            f"corrupt TokenStore {path!r}: offsets array is "
            f"{offsets_arr.dtype.numpy_dtype.name!r}, expected int64; rewrite the store"
        )
    if offsets_arr.shape[0] < num_docs + 1:
        raise TokenStoreError(
            f"corrupt TokenStore {path!r}: offsets array has {offsets_arr.shape[0]} entries "
            f"but meta.json says num_docs={num_docs} (needs num_docs+1={num_docs + 1}); the "
            f"store is truncated: rewrite it with TokenStoreWriter"
        )
    if tokens.shape[0] < num_tokens:
        raise TokenStoreError(
            f"truncated TokenStore {path!r}: tokens array has {tokens.shape[0]} tokens but "
            f"meta.json says num_tokens={num_tokens}; rewrite the store with TokenStoreWriter"
        )
    offsets = np.asarray(
        retry_call(lambda: offsets_arr[: num_docs + 1].read().result(), loc.child(OFFSETS_DIR)),
        dtype=np.int64,
    )
    _validate_offsets(path, offsets, num_tokens)
    offsets.setflags(write=False)
    direct = _direct_reader(loc, tokens, num_tokens)
    chunk = tokens.chunk_layout.read_chunk.shape
    gap = int((chunk[0] if chunk else None) or DEFAULT_READ_CHUNK_TOKENS)
    return _Opened(os.getpid(), meta, tokens, offsets, dtype, gap, direct)


def _direct_reader(loc: Location, tokens: ts.TensorStore, num_tokens: int) -> ShardFiles | None:
    """Reads of a local store's uncompressed tokens from their files, or None."""
    if loc.local is None:
        return None
    layout = shard_layout(tokens.spec().to_json()["metadata"], loc.local / TOKENS_DIR)
    return None if layout is None else ShardFiles(layout, num_tokens)


class TokenStore:
    """Read-only random-access view of the committed part of a TokenStore.

    Implements Grain's ``RandomAccessDataSource`` (``__len__``, ``__getitem__``) and its
    batched-read extension (``__getitems__``, also exposed as ``_getitems``). Element ``i`` is
    ``{"tokens": np.ndarray}``, a fresh 1-D array of the store's dtype. Thread-safe; picklable
    (only the path is pickled, the store is reopened lazily in the receiving process).

    ``path`` is a local directory or an ``s3://`` / ``gs://`` URL (read through TensorStore's
    kvstore drivers; see :mod:`zephon_jax.sources.storage` for endpoints and credentials,
    which ``storage_options`` overrides).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        storage_options: dict[str, Any] | None = None,
        allow_partial: bool = False,
    ) -> None:
        """Open and validate the store at ``path``; raise TokenStoreError if it is not valid.

        A ``zephon-jax prepare`` output whose job has not finished (it was stopped,
        killed, or ran out of disk space) is refused unless ``allow_partial``: it
        holds only the documents committed so far.
        """
        self._init(os.fspath(path), storage_options)
        self._opened: _Opened | None = _open_store(self._loc)
        if not allow_partial:
            _check_prepared(self._loc, self._opened.meta["num_docs"])

    def _init(self, path: str, storage_options: dict[str, Any] | None) -> None:
        self._loc = Location(path, storage_options)
        self._path: Path | str = self._loc.local if self._loc.local is not None else path
        self._storage_options = storage_options
        self._lock = threading.Lock()
        self._opened = None

    def __getstate__(self) -> dict[str, Any]:
        state: dict[str, Any] = {"path": str(self._path)}
        if self._storage_options:
            state["storage_options"] = self._storage_options
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._init(state["path"], state.get("storage_options"))

    @property
    def _s(self) -> _Opened:
        opened = self._opened
        if opened is not None and opened.pid == os.getpid():
            return opened
        with self._lock:
            if self._opened is None or self._opened.pid != os.getpid():
                self._opened = _open_store(self._loc)
            return self._opened

    @property
    def path(self) -> Path | str:
        """The store directory (a Path), or its URL (a str)."""
        return self._path

    @property
    def num_docs(self) -> int:
        """Number of committed documents."""
        return self._s.meta["num_docs"]

    @property
    def num_tokens(self) -> int:
        """Total number of committed tokens."""
        return self._s.meta["num_tokens"]

    @property
    def dtype(self) -> np.dtype:
        """Token dtype (uint16, uint32 or int32)."""
        return self._s.dtype

    @property
    def attrs(self) -> dict[str, Any]:
        """User attributes recorded in meta.json (a copy)."""
        return dict(self._s.meta.get("attrs", {}))

    @property
    def offsets(self) -> np.ndarray:
        """Read-only int64 array of length num_docs+1; doc i spans offsets[i]:offsets[i+1]."""
        return self._s.offsets

    @property
    def doc_lengths(self) -> np.ndarray:
        """int64 array of the num_docs document lengths."""
        return np.diff(self._s.offsets)

    def __len__(self) -> int:
        return self.num_docs

    def __repr__(self) -> str:
        return f"TokenStore({str(self._path)!r})"

    def fingerprint(self) -> str:
        """Short stable identity of the committed content's shape.

        Combines format version, num_docs, num_tokens, dtype and a hash of the offsets; it
        changes when documents are appended or re-segmented (token values are not hashed).
        """
        s = self._s
        digest = hashlib.blake2b(s.offsets.astype("<i8").tobytes(), digest_size=8).hexdigest()
        return f"ts{VERSION}-{s.meta['num_docs']}-{s.meta['num_tokens']}-{s.dtype.name}-{digest}"

    def _check_index(self, index: Any) -> int:
        i = operator.index(index)
        n = self.num_docs
        if not 0 <= i < n:
            raise IndexError(
                f"TokenStore index {i} out of range: valid indices are 0..{n - 1} "
                f"(negative indices are not supported)"
            )
        return i

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        """Return ``{"tokens": tokens of document index}``; IndexError unless 0 <= index < len."""
        i = self._check_index(index)
        s = self._s
        return {"tokens": self._fetch(s, [(int(s.offsets[i]), int(s.offsets[i + 1]))])[0]}

    @staticmethod
    def _read(s: _Opened, start: int, stop: int) -> Any:
        if start == stop:
            return _Ready(np.empty(0, dtype=s.dtype))
        return s.tokens[start:stop].read()

    def _fetch(self, s: _Opened, ranges: Sequence[tuple[int, int]]) -> list[np.ndarray]:
        """Token spans ``[start, stop)``, read concurrently; transient errors are retried."""
        if s.direct is not None:
            return [
                self._read_direct(s.direct, np.array([a]), np.array([b]), s.dtype)
                for a, b in ranges
            ]

        def read_all() -> list[np.ndarray]:
            futures = [self._read(s, a, b) for a, b in ranges]
            return [f.result() for f in futures]

        return retry_call(read_all, self._loc.child(TOKENS_DIR))

    def _as_indices(self, indices: Sequence[int]) -> np.ndarray:
        idx = np.asarray(indices)
        if idx.size == 0:
            return np.empty(0, dtype=np.int64)
        if idx.ndim != 1 or idx.dtype.kind not in "iu":
            raise TypeError(f"indices must be a 1-D sequence of ints, got {idx.dtype} {idx.shape}")
        idx = idx.astype(np.int64)
        bad = np.flatnonzero((idx < 0) | (idx >= self.num_docs))
        if bad.size:
            self._check_index(int(idx[bad[0]]))
        return idx

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, np.ndarray]]:
        """Batched ``[self[i] for i in indices]``, in order, duplicates allowed.

        Reads the requested documents as :meth:`read_flat` does. Every returned array is independent (no shared memory between elements).
        """
        idx = self._as_indices(indices)
        if idx.size == 0:
            return []
        flat, at, lengths = self._locate(self._s, idx)
        return [
            {"tokens": flat[a : a + n].copy()}
            for a, n in zip(at.tolist(), lengths.tolist(), strict=True)
        ]

    def read_flat(self, indices: Sequence[int]) -> np.ndarray:
        """The tokens of documents ``indices`` (in order, duplicates allowed) one after the
        other in one new 1-D array of the store's dtype; ``doc_lengths[indices]`` tells
        where each ends. The same tokens as concatenating :meth:`__getitems__`'s arrays.

        A local store of plain tokens (``compression=None``) is read straight from its
        memory-mapped shard files, each document copied in turn
        (:mod:`zephon_jax.sources.shard_files`). Any other store is read with one
        TensorStore read of a virtual concatenation of the documents' token ranges
        (ranges within one read chunk of each other are covered by one range; more than
        1024 ranges make several such reads, issued at once), so a block of scattered
        documents costs one read's overhead, not one per document; the read chunks it
        needs are decoded in TensorStore's thread pool. Transient storage errors are
        retried as for every read (:func:`~zephon_jax.sources.storage.retry_policy`).
        """
        idx = self._as_indices(indices)
        s = self._s
        if idx.size == 0:
            return np.empty(0, dtype=s.dtype)
        flat, at, lengths = self._locate(s, idx)
        total = int(lengths.sum())
        if len(flat) == total and bool(np.all(at == np.cumsum(lengths) - lengths)):
            return flat
        spans = [flat[a : a + n] for a, n in zip(at.tolist(), lengths.tolist(), strict=True)]
        return np.concatenate(spans).astype(s.dtype, copy=False)

    def read_spans(
        self, starts: Sequence[int], lengths: Sequence[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Token spans ``[starts[k], starts[k] + lengths[k])`` of the store's token stream
        (``offsets`` index it), read as :meth:`read_flat` reads documents: returns
        ``(flat, at)``, span ``k`` being ``flat[at[k]:at[k] + lengths[k]]``. Spans may
        repeat and overlap; through TensorStore, spans within one read chunk of each
        other are covered by one range (``flat`` may hold tokens between them)."""
        s = self._s
        first, stops = self._checked_spans(s, starts, lengths)
        if first.size == 0:
            return np.empty(0, dtype=s.dtype), np.zeros(0, np.int64)
        return self._locate_spans(s, first, stops)

    def span_addresses(
        self, starts: Sequence[int], lengths: Sequence[int]
    ) -> tuple[np.ndarray, Any] | None:
        """Where token spans ``[starts[k], starts[k] + lengths[k])`` of the store's token
        stream are in memory, without copying them where they can be read in place:
        ``(addresses, held)``, the byte address of each span's first token (of the
        store's dtype) and what holds that memory (keep it while the addresses are
        read; empty spans get address 0). A plain local store's spans are read where
        its shard files are mapped (see :mod:`zephon_jax.sources.shard_files`). None
        for a store read through TensorStore (compressed, or in a bucket): read its
        spans with :meth:`read_spans`."""
        s = self._s
        if s.direct is None:
            return None
        first = np.asarray(starts, np.int64).reshape(-1)
        stops = first + np.asarray(lengths, np.int64).reshape(-1)
        try:
            return _from_shard_files(s.direct.addresses, first, stops)
        except IndexError as e:  # (the shard files bound the spans in the same pass)
            raise IndexError(f"{e} of {self._loc}") from None

    def _checked_spans(
        self, s: _Opened, starts: Sequence[int], lengths: Sequence[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """The spans' starts and stops as arrays; IndexError if one leaves the store."""
        first = np.asarray(starts, np.int64).reshape(-1)
        stops = first + np.asarray(lengths, np.int64).reshape(-1)
        if first.size and (int(first.min()) < 0 or int(stops.max()) > int(s.offsets[-1])):
            raise IndexError(
                f"token spans reach outside the {int(s.offsets[-1])} tokens of {self._loc}"
            )
        return first, stops

    def _locate(self, s: _Opened, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Reads documents ``idx`` (valid indices): the tokens read, and where each
        requested document starts in them and its length (each distinct document is
        read once; see :meth:`_locate_spans`; from the shard files, each in turn)."""
        if s.direct is not None:
            flat, at = self._locate_spans(s, s.offsets[idx], s.offsets[idx + 1])
            return flat, at, s.offsets[idx + 1] - s.offsets[idx]
        uniq, inverse = np.unique(idx, return_inverse=True)
        starts, stops = s.offsets[uniq], s.offsets[uniq + 1]
        flat, at = self._locate_spans(s, starts, stops)
        inverse = inverse.reshape(-1)
        return flat, at[inverse], (stops - starts)[inverse]

    def _locate_spans(
        self, s: _Opened, starts: np.ndarray, stops: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Reads the token spans ``[starts[k], stops[k])`` (within the store): the tokens
        read and where each span starts in them.

        Through TensorStore, spans that overlap or lie within one read chunk of each
        other are covered by one range, so the tokens read may hold tokens of no span;
        from the shard files, each span is copied as it is, one after the other.
        """
        if s.direct is not None:
            lengths = stops - starts
            return self._read_direct(s.direct, starts, stops, s.dtype), np.cumsum(lengths) - lengths
        order = np.argsort(starts, kind="stable")
        first_start, first_stop = starts[order], stops[order]
        reach = np.maximum.accumulate(first_stop)  # the end of the ranges so far
        new_group = np.empty(order.size, dtype=bool)
        new_group[0] = True
        new_group[1:] = first_start[1:] - reach[:-1] > s.coalesce_gap
        group_of = np.cumsum(new_group) - 1
        first = np.flatnonzero(new_group)
        last = np.append(first[1:], order.size) - 1
        g_start, g_stop = first_start[first], reach[last]
        flat = self._fetch_flat(s, g_start, g_stop)
        g_len = g_stop - g_start
        g_at = np.cumsum(g_len) - g_len
        at = np.empty(order.size, np.int64)
        at[order] = g_at[group_of] + first_start - g_start[group_of]
        return flat, at

    def _fetch_flat(self, s: _Opened, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
        """Token spans ``[starts[k], stops[k])`` one after the other, read as one virtual
        concatenation (of at most ``_CONCAT_LAYERS`` spans per read, the reads
        concurrent); transient errors are retried."""
        spans = [(a, b) for a, b in zip(starts.tolist(), stops.tolist(), strict=True) if b > a]
        if not spans:
            return np.empty(0, dtype=s.dtype)
        parts = [spans[k : k + _CONCAT_LAYERS] for k in range(0, len(spans), _CONCAT_LAYERS)]

        def read_all() -> np.ndarray:
            futures = [_read_concat(s.tokens, part) for part in parts]
            arrays = [f.result() for f in futures]
            return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)

        return retry_call(read_all, self._loc.child(TOKENS_DIR))

    def _read_direct(
        self, direct: ShardFiles, starts: np.ndarray, stops: np.ndarray, dtype: np.dtype
    ) -> np.ndarray:
        """The non-empty of spans ``[starts[k], stops[k])`` read from the shard files."""
        keep = stops > starts
        if not keep.any():
            return np.empty(0, dtype=dtype)
        return _from_shard_files(direct.read, starts[keep], stops[keep])

    _getitems = __getitems__

    def to_token_array(self) -> Any:
        """Every committed token read into memory, as a :class:`~zephon_jax.sources.TokenArray`
        (``num_tokens`` x the dtype's size in bytes): the same documents, which a pipeline
        reads column-wise and packs with compiled kernels (see ``docs/performance.md``)."""

        s = self._s
        tokens = self._fetch(s, [(0, int(s.offsets[-1]))])[0]
        return TokenArray(tokens, s.offsets, "tokens")

    def read_range(self, start_doc: int, stop_doc: int) -> list[dict[str, np.ndarray]]:
        """Documents ``start_doc..stop_doc-1`` with one contiguous read (for sequential scans).

        Requires ``0 <= start_doc <= stop_doc <= len(self)``. Returned arrays are
        non-overlapping views into one buffer.
        """
        start, stop = operator.index(start_doc), operator.index(stop_doc)
        if not 0 <= start <= stop <= self.num_docs:
            raise IndexError(
                f"read_range({start}, {stop}) out of range: need 0 <= start <= stop <= "
                f"{self.num_docs}"
            )
        s = self._s
        offs = s.offsets[start : stop + 1]
        span = self._fetch(s, [(int(offs[0]), int(offs[-1]))])[0]
        rel = offs - offs[0]
        return [{"tokens": span[rel[k] : rel[k + 1]]} for k in range(stop - start)]


def _read_concat(tokens: ts.TensorStore, spans: list[tuple[int, int]]) -> Any:
    """A future of the (non-empty) token spans of ``tokens`` one after the other."""
    if len(spans) == 1:
        return tokens[spans[0][0] : spans[0][1]].read()
    return ts.concat([tokens[a:b] for a, b in spans], axis=0).read()


class _Ready:
    """A completed future holding ``value``."""

    def __init__(self, value: np.ndarray) -> None:
        self._value = value

    def result(self) -> np.ndarray:
        return self._value


def _owned_entries(names: set[str]) -> bool:
    """Whether ``names`` are only entries a TokenStoreWriter creates."""
    for name in names:
        if name not in (TOKENS_DIR, OFFSETS_DIR, META_FILE) and not name.startswith(
            f".{META_FILE}."
        ):
            return False
    return True


def _fit_dtype(arr: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``arr`` (1-D ints) as ``dtype``; TokenStoreError if it is not 1-D ints or a value
    does not fit."""
    if arr.ndim != 1:
        raise TokenStoreError(f"a document must be a 1-D array of ints, got shape {arr.shape}")
    if arr.size == 0:
        return np.empty(0, dtype=dtype)
    if arr.dtype.kind not in "iu":
        raise TokenStoreError(f"a document must hold integers, got dtype {arr.dtype}")
    if arr.dtype != dtype:
        info = np.iinfo(dtype)
        lo, hi = arr.min(), arr.max()
        if lo < info.min or hi > info.max:
            raise TokenStoreError(
                f"token values [{lo}, {hi}] do not fit the store dtype {dtype.name} "
                f"(range [{info.min}, {info.max}]); write the store with a wider dtype"
            )
        arr = arr.astype(dtype)
    return arr


class TokenStoreWriter:
    """Appends documents to a TokenStore; ``commit()`` makes them visible to readers.

    Tokens are buffered in memory and written in large blocks. ``commit()`` flushes the
    buffer, then atomically rewrites meta.json; a store is valid only up to its last commit.
    ``resume=True`` continues after the last committed document of an existing store
    (uncommitted data is discarded and overwritten); ``resume=False`` requires ``path`` to be
    absent or an empty directory. ``path`` may be an ``s3://`` or ``gs://`` URL
    (``storage_options`` overrides the environment's endpoint and credentials). As a context manager, a normal exit commits and closes; an
    exception closes without committing the documents appended since the last commit.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        dtype: str | np.dtype = "uint32",
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        resume: bool = False,
        attrs: dict[str, Any] | None = None,
        *,
        read_chunk_tokens: int = DEFAULT_READ_CHUNK_TOKENS,
        flush_tokens: int | None = None,
        storage_options: dict[str, Any] | None = None,
        compression: str | None = None,
    ) -> None:
        """Create (or with ``resume=True`` reopen) the store at ``path``.

        ``chunk_tokens`` is the token count per stored file (a zarr shard);
        ``read_chunk_tokens`` (which must divide it) is the independently stored unit a
        random read fetches. ``flush_tokens`` (default ``8 * chunk_tokens``) bounds buffering.
        ``compression`` is None (the default: plain little-endian tokens, which a local
        store reads straight from memory-mapped files) or ``"zstd"`` (blosc/zstd per read
        chunk: smaller files, decoded through TensorStore on every read, several times
        slower). A resumed store keeps the compression it was created with.
        """
        self._loc = Location(path, storage_options)
        self._path: Path | str = self._loc.local if self._loc.local is not None else self._loc.name
        self._dtype = _check_dtype(dtype)
        self._check_layout(chunk_tokens, read_chunk_tokens)
        self._compression = _check_compression(compression)
        self._flush_tokens = int(flush_tokens or 8 * chunk_tokens)
        self._buffer: list[np.ndarray] = []
        self._buffer_lengths: list[int] = []
        self._buffered_tokens = 0
        self._closed = False
        meta = self._existing_meta(resume)
        if meta is None:
            self._create(chunk_tokens, read_chunk_tokens, attrs or {})
        else:
            self._reopen(meta, attrs)

    @staticmethod
    def _check_layout(chunk_tokens: int, read_chunk_tokens: int) -> None:
        if chunk_tokens <= 0 or read_chunk_tokens <= 0 or chunk_tokens % read_chunk_tokens:
            raise TokenStoreError(
                f"chunk_tokens ({chunk_tokens}) must be a positive multiple of "
                f"read_chunk_tokens ({read_chunk_tokens})"
            )

    def _existing_meta(self, resume: bool) -> dict[str, Any] | None:
        loc, path = self._loc, self._loc.name
        if loc.is_file():
            raise TokenStoreError(f"cannot write a TokenStore at {path!r}: it is a file")
        names = loc.names()
        if not names:
            return None
        if not resume:
            raise TokenStoreError(
                f"{path!r} already exists and is not empty; pass resume=True to append to "
                f"the TokenStore there, or choose another path"
            )
        if META_FILE in names:
            return _read_meta(loc)
        if _owned_entries(names):
            return None
        raise TokenStoreError(
            f"cannot resume at {path!r}: it is not empty and holds no TokenStore "
            f"(no meta.json); choose another path"
        )

    def _create(self, chunk_tokens: int, read_chunk_tokens: int, attrs: dict[str, Any]) -> None:
        self._loc.mkdir()
        ctx = _ts_context()
        spec = _tokens_create_spec(
            self._loc, self._dtype, chunk_tokens, read_chunk_tokens, self._compression
        )
        self._tokens = retry_call(
            lambda: ts.open(spec, create=True, delete_existing=True, context=ctx).result(),
            self._loc.child(TOKENS_DIR),
            "creating",
        )
        ospec = _offsets_create_spec(self._loc)
        self._offsets = retry_call(
            lambda: ts.open(ospec, create=True, delete_existing=True, context=ctx).result(),
            self._loc.child(OFFSETS_DIR),
            "creating",
        )
        self._offsets[0:1].write(np.zeros(1, dtype=np.int64)).result()
        self._attrs = dict(attrs)
        self._flushed_docs = self._flushed_tokens = 0
        self.commit()

    def _reopen(self, meta: dict[str, Any], attrs: dict[str, Any] | None) -> None:
        if meta["dtype"] != self._dtype.name:
            raise TokenStoreError(
                f"cannot resume {self._loc.name!r} with dtype {self._dtype.name!r}: the store "
                f"holds {meta['dtype']!r}; pass dtype={meta['dtype']!r}"
            )
        _open_store(self._loc)
        self._flushed_docs, self._flushed_tokens = meta["num_docs"], meta["num_tokens"]
        tokens = _open_array(self._loc, TOKENS_DIR, write=True)
        offsets = _open_array(self._loc, OFFSETS_DIR, write=True)
        self._tokens = tokens.resize(exclusive_max=[self._flushed_tokens]).result()
        self._offsets = offsets.resize(exclusive_max=[self._flushed_docs + 1]).result()
        self._attrs = dict(meta.get("attrs", {}) if attrs is None else attrs)

    @property
    def path(self) -> Path | str:
        """The store directory (a Path), or its URL (a str)."""
        return self._path

    @property
    def num_docs(self) -> int:
        """Documents appended so far, committed or not."""
        return self._flushed_docs + len(self._buffer_lengths)

    @property
    def num_tokens(self) -> int:
        """Tokens appended so far, committed or not."""
        return self._flushed_tokens + self._buffered_tokens

    def _as_tokens(self, tokens: Any) -> np.ndarray:
        return _fit_dtype(np.asarray(tokens), self._dtype)

    def append(self, tokens: Any) -> int:
        """Buffer one document (1-D ints fitting the dtype); return its document index."""
        if self._closed:
            raise TokenStoreError(f"TokenStoreWriter for {self._loc.name!r} is closed")
        arr = self._as_tokens(tokens)
        self._buffer.append(arr)
        self._buffer_lengths.append(arr.size)
        self._buffered_tokens += arr.size
        if self._buffered_tokens >= self._flush_tokens:
            self._flush()
        return self.num_docs - 1

    def extend(self, docs: Iterable[Any]) -> int:
        """Append every document of ``docs``; return num_docs."""
        for doc in docs:
            self.append(doc)
        return self.num_docs

    def _flush(self) -> None:
        """Write buffered documents to the arrays (not yet visible to readers)."""
        if not self._buffer_lengths:
            return
        lengths = np.asarray(self._buffer_lengths, dtype=np.int64)
        new_offsets = self._flushed_tokens + np.cumsum(lengths)
        t0, t1 = self._flushed_tokens, int(new_offsets[-1])
        d0, d1 = self._flushed_docs, self._flushed_docs + lengths.size
        self._tokens = self._tokens.resize(exclusive_max=[t1]).result()
        self._offsets = self._offsets.resize(exclusive_max=[d1 + 1]).result()
        tokens = np.concatenate(self._buffer) if t1 > t0 else None

        def write() -> None:
            writes = [self._offsets[d0 + 1 : d1 + 1].write(new_offsets)]
            if tokens is not None:
                writes.append(self._tokens[t0:t1].write(tokens))
            for w in writes:
                w.result()

        retry_call(write, self._loc.name, "writing")
        self._flushed_tokens, self._flushed_docs = t1, d1
        self._buffer, self._buffer_lengths, self._buffered_tokens = [], [], 0

    def commit(self) -> int:
        """Flush buffered documents, then atomically rewrite meta.json; return num_docs."""
        if self._closed:
            raise TokenStoreError(f"TokenStoreWriter for {self._loc.name!r} is closed")
        self._flush()
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "num_docs": self._flushed_docs,
            "num_tokens": self._flushed_tokens,
            "dtype": self._dtype.name,
            "attrs": self._attrs,
        }
        _write_meta(self._loc, meta)
        return self._flushed_docs

    def close(self) -> int:
        """Commit and close; idempotent. Return num_docs."""
        if not self._closed:
            self.commit()
            self._closed = True
        return self._flushed_docs

    def __enter__(self) -> TokenStoreWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self._closed = True


def write_token_store(
    path: str | os.PathLike[str],
    docs: Iterable[Any],
    dtype: str | np.dtype = "uint32",
    **writer_kwargs: Any,
) -> TokenStore:
    """Write ``docs`` to a new TokenStore at ``path`` (a directory or a URL); return a reader."""
    with TokenStoreWriter(path, dtype=dtype, **writer_kwargs) as writer:
        writer.extend(docs)
    return TokenStore(path, storage_options=writer_kwargs.get("storage_options"))


# ----- writing a store of known size from many processes ----------------------------------


def _check_new_offsets(offsets: Any) -> np.ndarray:
    """``offsets`` as int64, or TokenStoreError if they cannot be a store's offsets."""
    arr = np.asarray(offsets)
    if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu":
        raise TokenStoreError(
            f"offsets must be a non-empty 1-D array of ints (num_docs + 1 entries), got "
            f"{arr.dtype} {arr.shape}"
        )
    arr = arr.astype(np.int64)
    if arr[0] != 0 or (arr.size > 1 and bool((np.diff(arr) < 0).any())):
        raise TokenStoreError(
            "offsets must start at 0 and never decrease (document i spans "
            "tokens[offsets[i]:offsets[i + 1]])"
        )
    return arr


def create_token_store(
    path: str | os.PathLike[str],
    offsets: Any,
    dtype: str | np.dtype = "uint32",
    *,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    read_chunk_tokens: int = DEFAULT_READ_CHUNK_TOKENS,
    storage_options: dict[str, Any] | None = None,
    compression: str | None = None,
) -> None:
    """Lay out a TokenStore of known size at ``path``, for writers in many processes.

    Creates the ``offsets`` array holding ``offsets`` (document ``i`` spans tokens
    ``offsets[i]:offsets[i + 1]``; ``offsets[0] == 0``, never decreasing) and a ``tokens``
    array of ``offsets[-1]`` tokens of ``dtype``, stored in shards of ``chunk_tokens``.
    Replaces arrays already there. Nothing is visible to readers until
    :func:`commit_token_store`; fill the tokens with :func:`write_token_range` first.
    The store is byte-identical to one :class:`TokenStoreWriter` writes with the same
    documents, dtype, chunk sizes and ``compression`` (as the writer's).

    Raises TokenStoreError for bad offsets, dtype or chunk sizes, a file at ``path``, or
    a committed store there (``meta.json``): delete it first or choose another path.
    """
    loc = Location(path, storage_options)
    dt = _check_dtype(dtype)
    TokenStoreWriter._check_layout(chunk_tokens, read_chunk_tokens)
    compression = _check_compression(compression)
    offs = _check_new_offsets(offsets)
    if loc.is_file():
        raise TokenStoreError(f"cannot write a TokenStore at {loc.name!r}: it is a file")
    if META_FILE in loc.names():
        raise TokenStoreError(
            f"{loc.name!r} already holds a committed TokenStore ({META_FILE}); delete it or "
            "choose another path"
        )
    loc.mkdir()
    tspec = _tokens_create_spec(loc, dt, chunk_tokens, read_chunk_tokens, compression)
    tspec["metadata"]["shape"] = [int(offs[-1])]
    ospec = _offsets_create_spec(loc)
    ospec["metadata"]["shape"] = [offs.size]
    _create_array(loc, TOKENS_DIR, tspec)
    offsets_arr = _create_array(loc, OFFSETS_DIR, ospec)
    retry_call(lambda: offsets_arr.write(offs).result(), loc.child(OFFSETS_DIR), "writing")


def _create_array(loc: Location, name: str, spec: dict[str, Any]) -> ts.TensorStore:
    """The array ``name`` of ``loc`` created from ``spec`` (replacing one there)."""
    return retry_call(
        lambda: ts.open(spec, create=True, delete_existing=True, context=_ts_context()).result(),
        loc.child(name),
        "creating",
    )


def write_token_range(
    path: str | os.PathLike[str],
    start: int,
    tokens: Any,
    *,
    storage_options: dict[str, Any] | None = None,
) -> None:
    """Write ``tokens`` into a store laid out by :func:`create_token_store`, from token
    position ``start`` on.

    ``tokens`` are 1-D ints fitting the store's dtype, and the range must lie within the
    store. Processes may call it at the same time for ranges in different stored shards
    (blocks of ``chunk_tokens`` tokens: align ranges to them); two writes into one shard
    must not overlap in time. Raises TokenStoreError for a range outside the store or
    tokens that do not fit its dtype.
    """
    loc = Location(path, storage_options)
    arr = _open_array(loc, TOKENS_DIR, write=True)
    data = np.asarray(tokens)
    first = operator.index(start)
    if data.ndim != 1 or not 0 <= first <= first + data.size <= arr.shape[0]:
        raise TokenStoreError(
            f"cannot write {data.shape} tokens at {first} into {loc.name!r}: need a 1-D range "
            f"within its {arr.shape[0]} tokens"
        )
    data = _fit_dtype(data, arr.dtype.numpy_dtype)
    retry_call(
        lambda: arr[first : first + data.size].write(data).result(),
        loc.child(TOKENS_DIR),
        "writing",
    )


def commit_token_store(
    path: str | os.PathLike[str],
    *,
    attrs: dict[str, Any] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> int:
    """Make a store laid out by :func:`create_token_store` visible: atomically write its
    ``meta.json`` (with user ``attrs``). Call it once every token range is written, from
    one process; return num_docs. Raises TokenStoreError if the arrays disagree.
    """
    loc = Location(path, storage_options)
    tokens = _open_array(loc, TOKENS_DIR)
    offsets = _open_array(loc, OFFSETS_DIR)
    num_docs, num_tokens = offsets.shape[0] - 1, tokens.shape[0]
    last = int(retry_call(lambda: offsets[num_docs].read().result(), loc.child(OFFSETS_DIR)))
    if last != num_tokens:
        raise TokenStoreError(
            f"cannot commit {loc.name!r}: its last offset is {last} but its tokens array holds "
            f"{num_tokens}; lay it out again with create_token_store"
        )
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "num_docs": num_docs,
        "num_tokens": num_tokens,
        "dtype": tokens.dtype.numpy_dtype.name,
        "attrs": dict(attrs or {}),
    }
    _write_meta(loc, meta)
    return num_docs


def _from_shard_files(call: Any, starts: np.ndarray, stops: np.ndarray) -> Any:
    """``call(starts, stops)`` of a store's :class:`ShardFiles`, a corrupt shard file
    raised as a :class:`TokenStoreError` naming the fix."""
    try:
        return call(starts, stops)
    except CorruptShard as e:
        raise TokenStoreError(f"{e}; rewrite the store with TokenStoreWriter") from e
