"""JSON Lines files as a random-access source, through a cached byte-offset index.

Index sidecar format (``FILE.zjidx`` beside ``FILE``, or in the cache directory when
the data's location is not writable): one JSON header line ``{"format", "version",
"size", "version_tag", "records"}``, then ``records`` little-endian int64 line starts,
then ``records`` int64 line ends (the newline excluded). The index is rebuilt when the
file's size or version tag (mtime locally, etag on object stores) changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from zephon_jax.sources.files import INDEX_SUFFIX, checked_indices, expand_paths, file_info
from zephon_jax.sources.storage import filesystem, retry_call
from zephon_jax.status_line import StatusLine

__all__ = ["JsonlSource"]

INDEX_FORMAT = "zephon_jax.jsonl_index"
INDEX_VERSION = 1
BLOCK_BYTES = 8 << 20
COALESCE_BYTES = 64 << 10
JSONL_EXTENSIONS = (".jsonl", ".json", ".ndjson")


def _cache_dir() -> Path:
    env = os.environ.get("ZEPHON_JAX_CACHE")
    return (Path(env) if env else Path.home() / ".cache" / "zephon_jax") / "jsonl_index"


def _line_spans(data: bytes, base: int) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends (newline excluded) of the non-blank lines of a whole-lines buffer."""
    buf = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(buf == 10)
    starts = np.concatenate([[0], newlines + 1]).astype(np.int64)
    ends = np.concatenate([newlines, [buf.size]]).astype(np.int64)
    if starts[-1] == buf.size:  # the buffer ends with a newline
        starts, ends = starts[:-1], ends[:-1]
    lengths = ends - starts
    cr_only = np.zeros(lengths.shape, dtype=bool)
    one = lengths == 1
    cr_only[one] = buf[starts[one]] == 13
    keep = (lengths > 0) & ~cr_only
    return starts[keep] + base, ends[keep] + base


def build_index(url: str, storage_options: Mapping[str, Any] | None = None) -> np.ndarray:
    """``(2, records)`` int64 array of line starts and ends, by one sequential read of ``url``."""
    fs, inner = filesystem(url, storage_options)
    parts: list[tuple[np.ndarray, np.ndarray]] = []

    def scan() -> None:
        parts.clear()
        base, carry = 0, b""
        with fs.open(inner, "rb", block_size=BLOCK_BYTES) as f:
            while True:
                block = f.read(BLOCK_BYTES)
                if not block:
                    break
                data = carry + block
                cut = data.rfind(b"\n") + 1
                if cut:
                    parts.append(_line_spans(data[:cut], base))
                    base += cut
                    carry = data[cut:]
                else:
                    carry = data
        if carry:
            parts.append(_line_spans(carry, base))

    retry_call(scan, url, "indexing")
    if not parts:
        return np.zeros((2, 0), dtype=np.int64)
    return np.stack([np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])])


def _encode_index(spans: np.ndarray, info: dict[str, Any]) -> bytes:
    header = {
        "format": INDEX_FORMAT,
        "version": INDEX_VERSION,
        "size": info["size"],
        "version_tag": info["version"],
        "records": int(spans.shape[1]),
    }
    return json.dumps(header).encode() + b"\n" + spans.astype("<i8").tobytes()


def _decode_index(raw: bytes, info: dict[str, Any]) -> np.ndarray | None:
    """The spans in ``raw`` if it is a valid index for a file described by ``info``."""
    head, _, body = raw.partition(b"\n")
    try:
        header = json.loads(head)
    except ValueError:
        return None
    if (
        not isinstance(header, dict)
        or header.get("format") != INDEX_FORMAT
        or header.get("version") != INDEX_VERSION
        or header.get("size") != info["size"]
        or header.get("version_tag") != info["version"]
    ):
        return None
    n = header.get("records")
    if not isinstance(n, int) or len(body) != 16 * n:
        return None
    return np.frombuffer(body, dtype="<i8").reshape(2, n).astype(np.int64)


def _cache_path(url: str) -> Path:
    digest = hashlib.blake2b(url.encode(), digest_size=12).hexdigest()
    return _cache_dir() / f"{digest}{INDEX_SUFFIX}"


def load_or_build_index(
    url: str, storage_options: Mapping[str, Any] | None = None
) -> tuple[np.ndarray, bool]:
    """The index of ``url`` (from its sidecar, the cache, or built and saved); built or not."""
    info = file_info(url, storage_options)
    fs, inner = filesystem(url, storage_options)
    sidecar = inner + INDEX_SUFFIX
    cached = _cache_path(url)
    for reader in (lambda: fs.cat_file(sidecar), cached.read_bytes):
        try:
            spans = _decode_index(reader(), info)
        except (OSError, ValueError):
            continue
        if spans is not None:
            return spans, False
    spans = build_index(url, storage_options)
    if info != file_info(url, storage_options):
        raise RuntimeError(f"{url} changed while it was being indexed; open the source again")
    data = _encode_index(spans, info)
    try:
        _write_beside(fs, sidecar, data)
    except Exception:  # not writable: the cache directory instead
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, cached)
    return spans, True


def _write_beside(fs: Any, sidecar: str, data: bytes) -> None:
    if getattr(fs, "protocol", None) in ("file", ("file", "local")):
        tmp = f"{os.path.dirname(sidecar)}/.{os.path.basename(sidecar)}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, sidecar)
    else:
        fs.pipe_file(sidecar, data)


class _Progress:
    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.built = total, 0, 0
        self.enabled = enabled and total > 0
        self.start = time.perf_counter()
        self.line = StatusLine(sys.stderr if self.enabled else None, interval=0.5)
        self.lock = threading.Lock()

    def step(self, built: bool) -> None:
        with self.lock:
            self.done += 1
            self.built += built
            if not self.built:
                return
            last = self.done == self.total
            self.line.show(
                f"JsonlSource: indexed {self.done}/{self.total} files "
                f"({self.built} built, {time.perf_counter() - self.start:.1f} s)",
                force=last,
            )
            if last:
                self.line.done()


class JsonlSource:
    """JSON Lines files as a random-access source; record ``i`` is the ``i``-th parsed object.

    ``paths``: a path or URL (``s3://``, ``gs://``), a directory or prefix (its ``.jsonl``,
    ``.json`` and ``.ndjson`` files), a glob, or a list of them. Files are taken sorted by
    path, lines in file order; blank lines are skipped. Random access goes through a
    byte-offset index per file, built once (files in parallel, with progress on stderr)
    and cached beside the file (``FILE.zjidx``) when that is writable, else in
    ``$ZEPHON_JAX_CACHE/jsonl_index``; it is rebuilt when the file's size, mtime or etag
    changes. ``__getitems__`` groups a batch's reads by file and fetches nearby lines
    with one ranged read, all ranges of a batch concurrently. Picklable (the index
    travels with it); ``fingerprint()`` depends on the file names, sizes and line counts,
    not on where the files are, so a state taken on local files restores on a copy in a
    bucket.
    """

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        storage_options: Mapping[str, Any] | None = None,
        index_workers: int = 8,
        progress: bool = True,
    ) -> None:
        self.storage_options = dict(storage_options or {})
        self.paths = expand_paths(paths, self.storage_options, extensions=JSONL_EXTENSIONS)
        prog = _Progress(len(self.paths), progress)

        def index_one(url: str) -> np.ndarray:
            spans, built = load_or_build_index(url, self.storage_options)
            prog.step(built)
            return spans

        with ThreadPoolExecutor(max(1, min(index_workers, len(self.paths)))) as pool:
            spans = list(pool.map(index_one, self.paths))
        self._starts = [s[0] for s in spans]
        self._ends = [s[1] for s in spans]
        counts = np.array([s.shape[1] for s in spans], dtype=np.int64)
        self._first = np.concatenate([[0], np.cumsum(counts)])
        sizes = [int(e[-1]) if e.size else 0 for e in self._ends]
        digest = hashlib.blake2b(digest_size=8)
        for url, n, size in zip(self.paths, counts.tolist(), sizes):
            digest.update(f"{os.path.basename(url)}\0{n}\0{size}\n".encode())
        self._fingerprint = f"jsonl-{len(self.paths)}-{int(self._first[-1])}-{digest.hexdigest()}"
        self._fs: tuple[int, list[tuple[Any, str]]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fs"] = None
        return state

    def _filesystems(self) -> list[tuple[Any, str]]:
        if self._fs is None or self._fs[0] != os.getpid():
            self._fs = (os.getpid(), [filesystem(p, self.storage_options) for p in self.paths])
        return self._fs[1]

    def __len__(self) -> int:
        return int(self._first[-1])

    def __repr__(self) -> str:
        return f"JsonlSource({len(self.paths)} files, {len(self)} records)"

    def fingerprint(self) -> str:
        """Identity of the content's shape: file names, sizes and line counts."""
        return self._fingerprint

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """Batched ``[self[i] for i in indices]``, in order; one ranged read per run of lines."""
        idx = checked_indices(indices, len(self), "JsonlSource")
        if idx.size == 0:
            return []
        file_of = np.searchsorted(self._first, idx, side="right") - 1
        fss = self._filesystems()
        req_paths: list[str] = []
        req_starts: list[int] = []
        req_ends: list[int] = []
        where: dict[int, tuple[int, int, int]] = {}  # global index -> (request, start, end)
        for f in np.unique(file_of):
            local = np.unique(idx[file_of == f] - self._first[f])
            starts, ends = self._starts[f][local], self._ends[f][local]
            run_start = 0
            for k in range(1, local.size + 1):
                if k == local.size or starts[k] - ends[k - 1] > COALESCE_BYTES:
                    r = len(req_paths)
                    req_paths.append(fss[f][1])
                    req_starts.append(int(starts[run_start]))
                    req_ends.append(int(ends[k - 1]))
                    for j in range(run_start, k):
                        where[int(local[j] + self._first[f])] = (r, int(starts[j]), int(ends[j]))
                    run_start = k
        blobs = self._read_ranges(fss, file_of, req_paths, req_starts, req_ends)
        out = []
        for i in idx.tolist():
            r, a, b = where[i]
            line = blobs[r][a - req_starts[r] : b - req_starts[r]]
            try:
                out.append(json.loads(line))
            except ValueError as e:
                f = int(np.searchsorted(self._first, i, side="right") - 1)
                raise ValueError(
                    f"{self.paths[f]}: record {i} (line at byte {a}) is not valid JSON: {e}"
                ) from e
        return out

    def _read_ranges(self, fss, file_of, paths, starts, ends) -> list[bytes]:
        fs = fss[int(file_of[0])][0]
        shared = all(fss[int(f)][0] is fs for f in np.unique(file_of))
        label = self.paths[int(file_of[0])] if len(set(paths)) == 1 else f"{len(set(paths))} files"
        if shared:
            blobs = retry_call(lambda: fs.cat_ranges(paths, starts, ends, on_error="raise"), label)
        else:
            by_path = {p: fs_ for fs_, p in fss}
            blobs = [
                retry_call(partial(by_path[p].cat_file, p, start=a, end=b), p)
                for p, a, b in zip(paths, starts, ends)
            ]
        for blob in blobs:
            if isinstance(blob, BaseException):
                raise blob
        return blobs
