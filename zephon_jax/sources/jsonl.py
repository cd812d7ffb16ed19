"""JSON Lines files as a random-access source, through a cached byte-offset index.

Index sidecar format (``FILE.zjidx`` beside ``FILE``, or in the cache directory when
the data's location is not writable): one JSON header line ``{"format", "version",
"size", "version_tag", "records"}``, then ``records`` little-endian int64 line starts,
then ``records`` int64 line ends (the newline excluded). The index is rebuilt when the
file's size or version tag (mtime locally, etag on object stores) changes, or when it
was written by another version of the format (version 1 counted whitespace-only lines
as records).

A line is blank, and not a record, when it holds nothing but ASCII whitespace (space,
tab, ``\r``, ``\v``, ``\f``): the lines ``bytes.strip`` empties, as ``zephon-jax
prepare`` skips them.
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

from zephon_jax.core.status_line import StatusLine
from zephon_jax.sources.files import INDEX_SUFFIX, checked_indices, expand_paths, file_info
from zephon_jax.sources.storage import ShortReadError, filesystem, retry_call

__all__ = ["JsonlSource"]

INDEX_FORMAT = "zephon_jax.jsonl_index"
INDEX_VERSION = 2
BLOCK_BYTES = 8 << 20
COALESCE_BYTES = 64 << 10
JSONL_EXTENSIONS = (".jsonl", ".json", ".ndjson")
# The bytes a blank line may hold: those bytes.strip() removes, less the newline.
_BLANK = np.zeros(256, dtype=bool)
_BLANK[list(b" \t\r\x0b\x0c")] = True


def _cache_dir() -> Path:
    env = os.environ.get("ZEPHON_JAX_CACHE")
    return (Path(env) if env else Path.home() / ".cache" / "zephon_jax") / "jsonl_index"


def _line_spans(data: bytes, base: int) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends (newline excluded) of the non-blank lines of a whole-lines buffer.

    A line is blank when it is empty or holds only the bytes of ``_BLANK``.
    """
    buf = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(buf == 10)
    starts = np.concatenate([[0], newlines + 1]).astype(np.int64)
    ends = np.concatenate([newlines, [buf.size]]).astype(np.int64)
    if starts[-1] == buf.size:  # the buffer ends with a newline
        starts, ends = starts[:-1], ends[:-1]
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    # Only a line that starts with a blank byte can be blank (JSON lines rarely do).
    maybe = np.flatnonzero(_BLANK[buf[starts]]) if starts.size else starts
    if maybe.size:
        keep = np.ones(starts.size, dtype=bool)
        keep[maybe] = _has_content(data, buf, starts[maybe], ends[maybe])
        starts, ends = starts[keep], ends[keep]
    return starts + base, ends + base


def _has_content(data: bytes, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Whether each non-empty line ``[starts, ends)`` of ``data`` (``buf``: its bytes)
    holds a byte that is not blank, given that its first byte is blank."""
    out = np.zeros(starts.size, dtype=bool)
    todo = np.arange(starts.size)
    for offset in range(1, 9):  # the first bytes of every line at once (indentation)
        pos = starts[todo] + offset
        inside = pos < ends[todo]
        todo, pos = todo[inside], pos[inside]
        hit = ~_BLANK[buf[pos]]
        out[todo[hit]] = True
        todo = todo[~hit]
        if not todo.size:
            return out
    for i in todo.tolist():  # longer runs of whitespace: bytes.strip, as prepare
        out[i] = bool(data[starts[i] : ends[i]].strip())
    return out


def build_index(
    url: str, storage_options: Mapping[str, Any] | None = None, size: int | None = None
) -> np.ndarray:
    """``(2, records)`` int64 array of line starts and ends, by one sequential read of ``url``.

    With ``size`` (the file's size), a read that ends early is tried again, never indexed.
    """
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
        if size is not None and base + len(carry) != size:
            raise ShortReadError(f"{url}: read {base + len(carry)} of its {size} bytes")
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

    def read_sidecar() -> bytes:
        return retry_call(lambda: fs.cat_file(sidecar), url + INDEX_SUFFIX)

    for reader in (read_sidecar, cached.read_bytes):
        try:
            spans = _decode_index(reader(), info)
        except (OSError, ValueError):
            continue
        if spans is not None:
            return spans, False
    spans = build_index(url, storage_options, info["size"])
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


def _whole(blob: Any, path: str, start: int, end: int) -> bytes:
    """``blob`` if it holds every byte of ``[start, end)``; raises (transient) otherwise.

    A response cut short is never taken as data: ShortReadError makes the read try again.
    """
    if isinstance(blob, BaseException):
        raise blob
    if len(blob) != end - start:
        raise ShortReadError(
            f"{path}: asked for bytes {start}..{end} ({end - start} bytes), got {len(blob)}"
        )
    return blob


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
    path, lines in file order; blank lines (empty or only spaces, tabs and other ASCII
    whitespace) are skipped. Random access goes through a
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
        label = self.paths[int(file_of[0])]
        if len(set(paths)) > 1:
            label += f" and {len(set(paths)) - 1} more file{'s' if len(set(paths)) > 2 else ''}"
        if shared:

            def read_all() -> list[bytes]:
                blobs = fs.cat_ranges(paths, starts, ends, on_error="raise")
                return [_whole(b, p, a, e) for b, p, a, e in zip(blobs, paths, starts, ends)]

            return retry_call(read_all, label)
        by_path = {p: fs_ for fs_, p in fss}

        def read_one(p: str, a: int, b: int) -> bytes:
            return _whole(by_path[p].cat_file(p, start=a, end=b), p, a, b)

        return [retry_call(partial(read_one, p, a, b), p) for p, a, b in zip(paths, starts, ends)]
