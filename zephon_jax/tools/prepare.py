"""``zephon-jax prepare``: JSONL, plain text and Parquet into a TokenStore and/or ArrayRecord files.

Output directory layout (``OUT``)::

    OUT/meta.json, tokens/, offsets/    the TokenStore (``--to store`` or ``both``)
    OUT/array_record/part-NNNNN.array_record   ArrayRecord shards (``--to array_record`` or ``both``)
    OUT/prepare.json                    the job record: options, input position, counts

ArrayRecord record format: one record per document, the document's token ids as
raw little-endian integers of the output dtype (``uint16`` for the byte-level
tokenizer, ``uint32`` otherwise), no header; the dtype is in ``prepare.json``.
:class:`zephon_jax.sources.ArrayRecordTokens` reads them back as ``{"tokens": array}`` records, so
both outputs plug into :meth:`zephon_jax.Dataset.source` the same way.

Resuming: input is cut into chunks (a chunk never spans two files) that worker
processes tokenize; the parent writes their documents in input order, so the
output does not depend on the number of workers. Every ``commit_every`` chunks
the job commits: it closes the current ArrayRecord shard, writes the position
it is about to commit into ``prepare.json`` as *pending*, commits the
TokenStore, and marks the position *committed*. A rerun of the same command
after an interruption (Ctrl-C, a kill, a crash) continues after the last
complete commit and produces the same documents as an uninterrupted run.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import signal
import sys
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence, TextIO

import numpy as np

from zephon_jax.core.status_line import StatusLine
from zephon_jax.errors import ZephonError
from zephon_jax.sources.array_record import ARRAY_RECORD_DIR, MANIFEST, ArrayRecordTokens
from zephon_jax.sources.files import expand_paths, file_info
from zephon_jax.sources.storage import (
    Location,
    StorageError,
    filesystem,
    is_no_space,
    is_url,
    split_url,
)
from zephon_jax.tools.tokenizers import (
    EOS_ID,
    is_byte_tokenizer,
    load_tokenizer,
    tokenizer_eos_id,
)

if TYPE_CHECKING:
    from zephon_jax.sources.token_store import TokenStoreWriter

MANIFEST_FORMAT = "zephon_jax.tools.prepare"
MANIFEST_VERSION = 1
TARGETS = ("store", "array_record", "both")
INPUT_FORMATS = ("jsonl", "text", "parquet")
_EXTENSIONS = {
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".txt": "text",
    ".text": "text",
    ".md": "text",
    ".py": "text",
}
KNOWN_EXTENSIONS = tuple(_EXTENSIONS)


class PrepareError(ZephonError):
    """Input, options or an existing output that ``prepare`` cannot work with."""


class PrepareInterrupted(ZephonError):
    """``prepare`` was interrupted; what it committed is valid and a rerun resumes."""


# ----- options and inputs ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PrepareOptions:
    """What ``prepare`` does (the ``zephon-jax prepare`` flags of the same names).

    ``to``: ``"store"``, ``"array_record"`` or ``"both"``; ``input_format``: force
    ``"jsonl"``/``"text"``/``"parquet"`` (default: from each extension);
    ``lines``: one document per line of a text file; ``tokenizer``:
    ``module:function`` (default: bytes); ``dtype``: default uint16 for bytes,
    uint32 otherwise; ``compression``: the store's, None (plain tokens, the fastest
    to read) or ``"zstd"`` (a resumed job keeps its store's); ``workers``: tokenizer
    processes (None: all cores, 0: in this process). A resume must use the same inputs and the same options, except
    ``workers``, ``chunk_records``, ``commit_every`` and ``max_reported_bad``.
    """

    inputs: tuple[str, ...]
    output: str
    to: str = "store"
    input_format: str | None = None
    text_field: str = "text"
    lines: bool = False
    tokenizer: str | None = None
    dtype: str | None = None
    compression: str | None = None
    append_eos: bool = False
    eos_id: int | None = None
    strict: bool = False
    workers: int | None = None
    chunk_records: int = 256
    commit_every: int = 16
    overwrite: bool = False
    max_reported_bad: int = 20
    storage_options: dict[str, Any] | None = dataclasses.field(default=None, compare=False)

    @property
    def out_dtype(self) -> np.dtype:
        """The token dtype written."""
        if self.dtype is not None:
            return np.dtype(self.dtype)
        return np.dtype(np.uint16 if is_byte_tokenizer(self.tokenizer) else np.uint32)


def detect_format(path: str) -> str:
    """The input format of ``path`` from its extension (``jsonl``, ``text`` or ``parquet``)."""
    suffix = Path(path).suffix.lower()
    if suffix in (".gz", ".zst", ".bz2", ".xz"):
        raise PrepareError(f"{path}: compressed input is not supported; decompress it first")
    return _EXTENSIONS.get(suffix, "text")


def expand_inputs(
    inputs: Sequence[str],
    storage_options: dict[str, Any] | None = None,
    skipped: list[str] | None = None,
) -> list[str]:
    """Input files, in order: each input's files sorted by path.

    An input is a local path or an ``s3://`` / ``gs://`` URL: a file, a directory (or URL
    prefix: its files with known extensions, see ``KNOWN_EXTENSIONS``), or a glob. Index
    sidecars and hidden files are never inputs. ``skipped``, if given, receives the
    directories' files left out for their extension.
    """
    if not inputs:
        raise PrepareError("no inputs given: pass JSONL, text or Parquet files (or directories)")
    out: list[str] = []
    for item in inputs:
        try:
            files = expand_paths(
                item, storage_options, extensions=tuple(_EXTENSIONS), skipped=skipped
            )
        except FileNotFoundError as e:
            raise PrepareError(str(e)) from e
        except StorageError as e:
            raise PrepareError(str(e)) from e
        out.extend(f for f in files if f not in out)
    return out


def check_output(opts: PrepareOptions) -> None:
    """Raise PrepareError unless the output is a local path or a supported URL."""
    try:
        split_url(opts.output)
    except StorageError as e:
        raise PrepareError(str(e)) from e


def open_input(path: str, storage_options: dict[str, Any] | None = None):
    """A binary file object for a local path or a URL (each request retried, see filesystem)."""
    fs, inner = filesystem(path, storage_options, stream=True)
    return fs.open(inner, "rb")


@dataclasses.dataclass
class InputFile:
    """One input file: its path or URL, format (one of INPUT_FORMATS), size in bytes and,
    for Parquet, its row count."""

    path: str
    format: str
    size: int
    rows: int = 0  # parquet only


def describe_inputs(opts: PrepareOptions, stream: TextIO | None = None) -> list[InputFile]:
    """The input files; notes on ``stream`` the files of directories left out."""
    result = []
    so = opts.storage_options
    skipped: list[str] = []
    paths = expand_inputs(opts.inputs, so, skipped)
    if skipped and stream is not None:
        print(_skipped_note(skipped), file=stream)
    for path in paths:
        fmt = opts.input_format or detect_format(path)
        if fmt not in INPUT_FORMATS:
            raise PrepareError(f"unknown input format {fmt!r}; use one of {INPUT_FORMATS}")
        item = InputFile(path, fmt, file_info(path, so)["size"])
        if fmt == "parquet":
            import pyarrow.parquet as pq

            try:
                with open_input(path, so) as f:
                    meta = pq.ParquetFile(f)
            except Exception as e:
                raise PrepareError(f"{path}: not a readable Parquet file: {e}") from e
            names = meta.schema_arrow.names
            if opts.text_field not in names:
                raise PrepareError(
                    f"{path}: Parquet file has no column {opts.text_field!r} (columns: "
                    f"{names}); choose one with --text-field"
                )
            item.rows = meta.metadata.num_rows
        result.append(item)
    return result


def _skipped_note(skipped: list[str], show: int = 5) -> str:
    names = ", ".join(skipped[:show]) + (
        f", ... ({len(skipped) - show:,} more)" if len(skipped) > show else ""
    )
    return (
        f"note: skipped {len(skipped):,} file{'s' if len(skipped) != 1 else ''} of the input "
        f"directories for their extension: {names}. A directory stands for its files with "
        f"a known extension ({' '.join(KNOWN_EXTENSIONS)}); name other files, or a glob, "
        "to read them (as text, or as --format says)"
    )


# ----- reading chunks (parent) --------------------------------------------------------


@dataclasses.dataclass
class Chunk:
    """Raw records of one input file, tokenized as one unit by :func:`process_chunk`:
    ``items`` are ``(record_index, raw)`` pairs of records ``start .. end - 1``; ``format``
    is ``jsonl``, ``lines``, ``text`` or ``parquet``."""

    file: int
    format: str
    start: int  # first record index in the file (line index for line formats)
    end: int  # record index after the chunk
    items: list  # (record_index, raw) pairs
    nbytes: float  # input bytes this chunk stands for (progress)
    last_in_file: bool = False


def _read_chunks(
    inputs: list[InputFile], opts: PrepareOptions, file: int, record: int
) -> Iterator[Chunk]:
    """Chunks of raw input from position (file, record) on, in input order."""
    n = max(1, opts.chunk_records)
    for fi in range(file, len(inputs)):
        item = inputs[fi]
        skip = record if fi == file else 0
        if item.format == "parquet":
            yield from _parquet_chunks(fi, item, opts, skip, n)
        elif item.format == "text" and not opts.lines:
            if skip == 0:
                with open_input(item.path, opts.storage_options) as f:
                    raw = f.read()
                yield Chunk(fi, "text", 0, 1, [(0, raw)], float(item.size), True)
        else:
            yield from _line_chunks(
                fi, item, skip, n, "lines" if item.format == "text" else "jsonl", opts
            )


def _line_chunks(
    fi: int, item: InputFile, skip: int, n: int, fmt: str, opts: PrepareOptions
) -> Iterator[Chunk]:
    with open_input(item.path, opts.storage_options) as f:
        items, nbytes, start, index = [], 0, skip, -1
        for index, line in enumerate(f):
            if index < skip:
                continue
            nbytes += len(line)
            if line.strip():
                items.append((index, line))
            if len(items) >= n:
                yield Chunk(fi, fmt, start, index + 1, items, float(nbytes))
                items, nbytes, start = [], 0, index + 1
        yield Chunk(fi, fmt, start, max(index + 1, start), items, float(nbytes), True)


def _parquet_chunks(fi: int, item: InputFile, opts: PrepareOptions, skip: int, n: int):
    import pyarrow.parquet as pq

    per_row = item.size / max(1, item.rows)
    row = 0
    with open_input(item.path, opts.storage_options) as f:
        pf = pq.ParquetFile(f)
        for batch in pf.iter_batches(batch_size=n, columns=[opts.text_field]):
            values = batch.column(0).to_pylist()
            start = row
            row += len(values)
            if row <= skip:
                continue
            first = max(skip, start)
            items = [(start + i, v) for i, v in enumerate(values) if start + i >= first]
            yield Chunk(fi, "parquet", first, row, items, per_row * len(items))
    yield Chunk(fi, "parquet", max(row, skip), max(row, skip), [], 0.0, True)


# ----- tokenizing chunks (workers) ------------------------------------------------------

_worker: dict[str, Any] = {}


def resolve_eos_id(opts: PrepareOptions) -> int | None:
    """The id ``append_eos`` ends every document with (None without ``append_eos``):
    ``eos_id`` if given, else the tokenizer's own (1 for the byte-level one, a Hugging
    Face tokenizer's ``eos_token_id``, ...). Raises PrepareError where neither says."""
    if not opts.append_eos:
        if opts.eos_id is not None:
            raise PrepareError("--eos-id is the id --append-eos appends: add --append-eos")
        return None
    eos_id = opts.eos_id
    if eos_id is None:
        eos_id = tokenizer_eos_id(load_tokenizer(opts.tokenizer))
    if eos_id is None:
        raise PrepareError(
            f"--append-eos: the tokenizer {opts.tokenizer} does not say which id ends a "
            "document (no eos_token_id); give it with --eos-id ID"
        )
    info = np.iinfo(opts.out_dtype)
    if isinstance(eos_id, bool) or not info.min <= eos_id <= info.max:
        raise PrepareError(
            f"--eos-id {eos_id!r} does not fit dtype {opts.out_dtype.name}; pass a wider --dtype "
            "(uint32 or int32)"
        )
    return int(eos_id)


def worker_args(opts: PrepareOptions) -> tuple[str | None, str, str, int | None]:
    """What a tokenizing worker needs: (tokenizer, text field, dtype, eos id or None)."""
    return (opts.tokenizer, opts.text_field, opts.out_dtype.name, resolve_eos_id(opts))


def _init_worker(tokenizer: str | None, text_field: str, dtype: str, eos_id: int | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    _exit_with_parent()
    _setup_worker(tokenizer, text_field, dtype, eos_id)


def _exit_with_parent() -> None:
    """Ends this pool worker as soon as its parent process dies (killed by SIGKILL, say);
    otherwise it would wait for work forever, holding the parent's output pipes open."""
    import multiprocessing
    import threading

    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os.kill(os.getpid(), signal.SIGKILL)  # nobody is left to report to

    threading.Thread(target=watch, name="zephon-jax-parent-watch", daemon=True).start()


def _setup_worker(tokenizer: str | None, text_field: str, dtype: str, eos_id: int | None) -> None:
    _worker.update(
        tokenize=load_tokenizer(tokenizer),
        text_field=text_field,
        dtype=np.dtype(dtype),
        eos_id=eos_id,
    )


def ensure_worker(opts: PrepareOptions) -> None:
    """Sets this process up to tokenize chunks of ``opts`` with :func:`process_chunk`
    (loading the tokenizer once per distinct :func:`worker_args`)."""
    args = worker_args(opts)
    if _worker.get("args") != args:
        _setup_worker(*args)
        _worker["args"] = args


def _text_of(fmt: str, raw: Any, field: str) -> str:
    if fmt == "jsonl":
        try:
            obj = json.loads(raw)
        except ValueError as e:
            raise ValueError(f"invalid JSON ({e.__class__.__name__}: {e})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
        if field not in obj:
            raise ValueError(f"no {field!r} field (fields: {sorted(obj)[:8]})")
        raw = obj[field]
        if not isinstance(raw, str):
            raise ValueError(f"field {field!r} is {type(raw).__name__}, not a string")
        return raw
    if fmt == "parquet":
        if not isinstance(raw, str):
            what = "null" if raw is None else type(raw).__name__
            raise ValueError(f"column {field!r} is {what}, not a string")
        return raw
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 (byte offset {e.start})") from None
    return text.rstrip("\r\n") if fmt == "lines" else text


BadRecord = tuple[int, str, tuple[int, int]]


def process_chunk(chunk: Chunk) -> tuple[list[np.ndarray], list[BadRecord], int]:
    """Tokenizes a chunk in a process set up by :func:`ensure_worker` (or the job's pool):
    (documents, bad records, empty count). A bad record is
    ``(record_index, reason, (documents, empty records) of the chunk before it)``."""
    tokenize, field = _worker["tokenize"], _worker["text_field"]
    dtype, eos_id = _worker["dtype"], _worker["eos_id"]
    info = np.iinfo(dtype)
    docs: list[np.ndarray] = []
    bad: list[BadRecord] = []
    empty = 0
    for index, raw in chunk.items:
        try:
            text = _text_of(chunk.format, raw, field)
        except ValueError as e:
            bad.append((index, str(e), (len(docs), empty)))
            continue
        try:
            tokens = np.asarray(tokenize(text))
        except Exception as e:
            bad.append((index, f"the tokenizer failed: {e!r}", (len(docs), empty)))
            continue
        if tokens.ndim != 1 or (tokens.size and tokens.dtype.kind not in "iu"):
            reason = f"the tokenizer returned {tokens.dtype} {tokens.shape}, not 1-D ints"
            bad.append((index, reason, (len(docs), empty)))
            continue
        if tokens.size and (tokens.min() < info.min or tokens.max() > info.max):
            raise PrepareError(
                f"token ids [{tokens.min()}, {tokens.max()}] do not fit dtype {dtype.name}; "
                "pass a wider --dtype (uint32 or int32)"
            )
        if tokens.size == 0:
            empty += 1
            continue
        if eos_id is not None:
            tokens = np.append(tokens, eos_id)
        docs.append(tokens.astype(dtype, copy=False))
    return docs, bad, empty


# ----- the job record ---------------------------------------------------------------


def _write_json_atomic(loc: Location, name: str, value: Any) -> None:
    loc.write(name, json.dumps(value, indent=1, sort_keys=True).encode())


def job_identity(opts: PrepareOptions, inputs: list[InputFile]) -> dict[str, Any]:
    """The options a resume must match (performance knobs such as workers excluded)."""
    return {
        "inputs": [[_absolute(i.path), i.format, i.size] for i in inputs],
        "to": opts.to,
        "text_field": opts.text_field,
        "lines": opts.lines,
        "tokenizer": opts.tokenizer or "bytes",
        "dtype": opts.out_dtype.name,
        "append_eos": opts.append_eos,
        "eos_id": resolve_eos_id(opts),
    }


def _absolute(path: str) -> str:
    return path if is_url(path) else os.path.abspath(path)


@dataclasses.dataclass
class Position:
    """Where a job stands: the next input record (``file``, ``record``) and the counts
    written before it; ``prepare.json`` records it as ``committed`` / ``pending``."""

    file: int = 0
    record: int = 0
    docs: int = 0
    tokens: int = 0
    bad: int = 0
    empty: int = 0
    shards: int = 0
    input_bytes: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class _Outputs:
    """The TokenStore and ArrayRecord writers of one job, and its commit protocol."""

    def __init__(self, opts: PrepareOptions, identity: dict[str, Any]):
        self.opts = opts
        self.loc = Location(opts.output, opts.storage_options)
        self.out = opts.output
        self.identity = identity
        self.dtype = opts.out_dtype
        self.manifest_path = self.loc.child(MANIFEST)
        self.want_store = opts.to in ("store", "both")
        self.want_records = opts.to in ("array_record", "both")
        if self.want_records and self.loc.local is None:
            raise PrepareError(
                f"--to {opts.to} writes ArrayRecord files, which need a local output directory; "
                f"use --to store for {opts.output}, or write locally and copy"
            )
        self.records_dir = (self.loc.local or Path()) / ARRAY_RECORD_DIR
        self.store: TokenStoreWriter | None = None
        self.shard_writer: Any = None  # an array_record ArrayRecordWriter
        self.position = Position()
        self.complete = False
        self.resumed = False
        self._open()

    # -- opening / resuming
    def _open(self) -> None:
        from zephon_jax.sources.token_store import TokenStore, TokenStoreWriter

        out, loc = self.out, self.loc
        if loc.is_file():
            raise PrepareError(f"output {out} is a file; choose a directory")
        if self.opts.overwrite and loc.exists():
            loc.delete_all()
        manifest = self._load_manifest()
        if manifest is None and _only_an_empty_start(loc):
            loc.delete_all()  # a job stopped before its first record: start again
        if manifest is None and loc.names():
            raise PrepareError(
                f"output {out} exists and is not a prepare output (no {MANIFEST}); choose an "
                "empty or new directory, or pass --overwrite to replace it"
            )
        if manifest is None:
            if self.want_store:
                self.store = TokenStoreWriter(
                    out,
                    dtype=self.dtype.name,
                    storage_options=self.opts.storage_options,
                    compression=self.opts.compression,
                )
            loc.mkdir()
            self._write_manifest(self.position, None)
        else:
            self.resumed = True
            self.complete = bool(manifest.get("complete"))
            committed = Position(**manifest["committed"])
            pending = manifest.get("pending")
            pending = Position(**pending) if pending else None
            if self.want_store:
                have = TokenStore(
                    out, storage_options=self.opts.storage_options, allow_partial=True
                ).num_docs
                if have == committed.docs:
                    chosen = committed
                elif pending is not None and have == pending.docs:
                    chosen = pending
                else:
                    raise PrepareError(
                        f"output {out} is inconsistent: the TokenStore holds {have} documents but "
                        f"{MANIFEST} records {committed.docs}; pass --overwrite to start again"
                    )
            else:
                chosen = committed
                if pending is not None and self._shard_path(pending.shards - 1).exists():
                    chosen = pending
            self.position = chosen
            if self.want_store and not self.complete:
                self.store = TokenStoreWriter(
                    out,
                    dtype=self.dtype.name,
                    resume=True,
                    storage_options=self.opts.storage_options,
                )
            self._write_manifest(chosen, None, complete=self.complete)
        if self.want_records:
            self.records_dir.mkdir(parents=True, exist_ok=True)
            for f in self.records_dir.iterdir():  # drop shards of an uncommitted interval
                if f.name.endswith(".tmp") or _shard_index(f.name) >= self.position.shards:
                    f.unlink()

    def _load_manifest(self) -> dict[str, Any] | None:
        raw = self.loc.read(MANIFEST)
        if raw is None:
            return None
        try:
            manifest = json.loads(raw.decode())
        except (OSError, ValueError) as e:
            raise PrepareError(f"{self.manifest_path} is unreadable ({e}); pass --overwrite") from e
        if manifest.get("format") != MANIFEST_FORMAT or manifest.get("version") != MANIFEST_VERSION:
            raise PrepareError(f"{self.manifest_path} is not a zephon_jax prepare record")
        saved = manifest.get("job", {})
        if "eos_id" not in saved:  # written before --eos-id: --append-eos appended EOS_ID
            saved = {**saved, "eos_id": EOS_ID if saved.get("append_eos") else None}
        for key, value in self.identity.items():
            if saved.get(key) != value:
                raise PrepareError(
                    f"output {self.out} was prepared with a different {key!r} ({saved.get(key)!r}, "
                    f"now {value!r}); rerun with the same inputs and options to resume, or pass "
                    "--overwrite to start again"
                )
        return manifest

    def _write_manifest(self, committed: Position, pending: Position | None, complete=False):
        _write_json_atomic(
            self.loc,
            MANIFEST,
            {
                "format": MANIFEST_FORMAT,
                "version": MANIFEST_VERSION,
                "job": self.identity,
                "committed": committed.to_json(),
                "pending": None if pending is None else pending.to_json(),
                "complete": complete,
            },
        )

    # -- writing
    def _shard_path(self, index: int) -> Path:
        return self.records_dir / f"part-{index:05d}.array_record"

    def append(self, docs: list[np.ndarray]) -> None:
        if self.store is not None:
            for doc in docs:
                self.store.append(doc)
        if self.want_records and docs:
            if self.shard_writer is None:
                from array_record.python.array_record_module import ArrayRecordWriter

                tmp = str(self._shard_path(self.position.shards)) + ".tmp"
                self.shard_writer = ArrayRecordWriter(tmp, "group_size:1")
            le = self.dtype.newbyteorder("<")
            for doc in docs:
                self.shard_writer.write(doc.astype(le, copy=False).tobytes())

    def commit(self, position: Position, complete: bool = False) -> None:
        """Makes everything appended up to ``position`` durable, in the documented order."""
        if self.shard_writer is not None:
            self.shard_writer.close()
            self.shard_writer = None
            final = self._shard_path(position.shards)
            os.replace(str(final) + ".tmp", final)
            position.shards += 1
        self._write_manifest(self.position, position)
        if self.store is not None:
            self.store.commit()
        self._write_manifest(position, None, complete=complete)
        self.position = dataclasses.replace(position)
        self.complete = complete

    def abandon(self) -> None:
        """Drops what was appended since the last commit (the next run redoes it)."""
        if self.shard_writer is not None:
            writer, self.shard_writer = self.shard_writer, None
            try:
                writer.close()
            except Exception:  # e.g. a full disk: the shard stays a .tmp file, redone
                pass


def _only_an_empty_start(loc: Location) -> bool:
    """Whether ``loc`` holds only what a job creates before its first commit, and no data."""
    names = loc.names()
    if not names or not names <= {"tokens", "offsets", "meta.json", ARRAY_RECORD_DIR}:
        return False
    raw = loc.read("meta.json")
    if raw is not None:
        try:
            return json.loads(raw.decode()).get("num_docs") == 0
        except ValueError:
            return False
    records = loc.local / ARRAY_RECORD_DIR if loc.local is not None else None
    return records is None or not (records.is_dir() and any(records.iterdir()))


def _shard_index(name: str) -> int:
    try:
        return int(name.split("-")[1].split(".")[0])
    except (IndexError, ValueError):
        return 1 << 62


# ----- progress and summary -----------------------------------------------------------


class Progress:
    """Progress on a text stream: records, tokens, MB/s, ETA (a :class:`StatusLine`: in
    place on a terminal, a line every ``log_interval`` seconds elsewhere)."""

    def __init__(
        self,
        stream: TextIO | None,
        total_bytes: float,
        interval: float = 0.25,
        log_interval: float = 10.0,
    ):
        self.line = StatusLine(stream, interval, log_interval)
        self.total = max(total_bytes, 1.0)
        self.start = time.perf_counter()

    def update(self, pos: Position, run_bytes: float, force: bool = False) -> None:
        if not force and not self.line.due():
            return
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        rate = run_bytes / elapsed
        frac = min(pos.input_bytes / self.total, 1.0)
        eta = (self.total - pos.input_bytes) / rate if rate > 0 else float("inf")
        eta_s = "--:--" if eta == float("inf") else _hms(eta)
        self.line.show(
            f"prepare {frac * 100:5.1f}%  {pos.docs:,} docs  {_human(pos.tokens)} tokens  "
            f"{rate / 1e6:.1f} MB/s  ETA {eta_s}" + (f"  bad {pos.bad}" if pos.bad else ""),
            force=True,
        )

    def note(self, text: str) -> None:
        """Prints a line above the progress (nothing without a stream)."""
        self.line.note(text)

    def done(self) -> None:
        self.line.done()


def _human(n: float) -> str:
    for unit in ("", "K", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.0f}{unit}" if unit == "" else f"{n:.1f}{unit}"
        n /= 1000
    return f"{n:.1f}P"


def _hms(seconds: float) -> str:
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


@dataclasses.dataclass
class PrepareSummary:
    """What a prepare job produced (the committed output, over all its runs)."""

    output: str
    documents: int
    tokens: int
    bad_records: int
    empty_records: int
    length_percentiles: dict[str, int]
    seconds: float
    input_mb: float
    resumed: bool
    complete: bool
    target: str = "store"

    def load_hint(self) -> str:
        """Python that opens the output as a pipeline source."""
        cls = "TokenStore" if self.target in ("store", "both") else "ArrayRecordTokens"
        return (
            f"import zephon_jax; from zephon_jax.sources import {cls}; "
            f"ds = zephon_jax.Dataset.source({cls}({self.output!r}))"
        )

    def format(self) -> str:
        p = self.length_percentiles
        lines = [
            f"{'prepared' if self.complete else 'partially prepared'} {self.output}"
            + (" (resumed)" if self.resumed else ""),
            f"  documents  {self.documents:,}",
            f"  tokens     {self.tokens:,}",
            f"  skipped    {self.bad_records:,} bad, {self.empty_records:,} empty",
            "  doc length " + "  ".join(f"{k} {v:,}" for k, v in p.items()),
        ]
        if self.seconds > 0:
            lines.append(
                f"  this run   {self.seconds:.2f} s, {self.input_mb / self.seconds:.1f} MB/s of input"
            )
        if self.complete and self.documents:
            lines.append(f"  load it    {self.load_hint()}")
        return "\n".join(lines)


def length_percentiles(lengths: np.ndarray) -> dict[str, int]:
    """p50/p90/p99/max of document lengths (zeros for no documents)."""
    if lengths.size == 0:
        return {"p50": 0, "p90": 0, "p99": 0, "max": 0}
    q = np.percentile(lengths, [50, 90, 99], method="lower")
    return {"p50": int(q[0]), "p90": int(q[1]), "p99": int(q[2]), "max": int(lengths.max())}


# ----- the job ----------------------------------------------------------------------


def prepare(opts: PrepareOptions, stream: TextIO | None | str = "stderr") -> PrepareSummary:
    """Runs (or resumes) a prepare job; progress, bad records and notes go to ``stream``.

    Raises :class:`PrepareError` on bad options or, with ``strict``, on the first
    bad record (the records before it are committed), and
    :class:`PrepareInterrupted` on Ctrl-C or SIGTERM after committing every
    chunk finished so far (a second signal stops at once, keeping the last commit).
    """
    if isinstance(stream, str):
        if stream != "stderr":
            raise PrepareError(f"stream must be a text stream, None or 'stderr'; got {stream!r}")
        stream = sys.stderr
    if opts.to not in TARGETS:
        raise PrepareError(f"--to {opts.to!r} is unknown; use one of {TARGETS}")
    if opts.chunk_records < 1 or opts.commit_every < 1:
        raise PrepareError("chunk_records and commit_every must be >= 1")
    try:
        np.iinfo(opts.out_dtype)
    except ValueError as e:
        raise PrepareError(f"--dtype {opts.dtype!r} is not an integer dtype") from e
    if opts.compression not in (None, "zstd"):
        raise PrepareError(f"--compression {opts.compression!r} is unknown; use none or zstd")
    load_tokenizer(opts.tokenizer)  # fail early on a bad module:function
    worker_args(opts)  # and on --append-eos without an id
    check_output(opts)
    inputs = describe_inputs(opts, stream)
    try:
        return _run(opts, stream, inputs)
    except Exception as e:
        if not is_no_space(e):
            raise
        raise _disk_full(opts, e) from e


def _disk_full(opts: PrepareOptions, error: BaseException) -> PrepareError:
    """The error of a job stopped by a full disk (or quota): what is kept, and the fix."""
    committed = "none of its documents are committed"
    try:
        raw = Location(opts.output, opts.storage_options).read(MANIFEST)
        docs = json.loads(raw.decode())["committed"]["docs"] if raw is not None else 0
        committed = f"the {docs:,} documents committed before it are kept"
    except Exception:  # the record itself may be what could not be written
        pass
    return PrepareError(
        f"no space left on device (ENOSPC) while writing {opts.output}: {error}. The output is "
        f"incomplete ({committed}; readers refuse it until it is complete). Free space on that "
        "filesystem, or move the output directory to one with room, then rerun the same "
        "command: it resumes after the last commit"
    )


def _run(opts: PrepareOptions, stream: TextIO | None, inputs: list[InputFile]) -> PrepareSummary:
    """The job of :func:`prepare`, after its checks."""
    outputs = _Outputs(opts, job_identity(opts, inputs))
    if outputs.complete:
        check_not_empty(outputs.position, outputs.complete, opts, BadRecordCauses())
        return _summary(outputs, 0.0, 0.0)
    if outputs.resumed and stream is not None:
        _note_resume(outputs.position, inputs, opts, stream)
    workers = (os.cpu_count() or 1) if opts.workers is None else opts.workers
    job = _Job(opts, inputs, outputs, Progress(stream, float(sum(i.size for i in inputs))))
    pool = _start_pool(workers, worker_args(opts))
    start = time.perf_counter()
    chunks = _read_chunks(inputs, opts, job.pos.file, job.pos.record)
    stop = _StopRequests()
    try:
        with stop:
            for chunk, (docs, bad, empty) in _tokenized(chunks, pool, workers, stop):
                job.take(chunk, docs, bad, empty)
            # Everything appended is whole chunks, in input order: keep it.
            outputs.commit(job.pos, complete=not stop.requested)
        job.finish()
    except BaseException:
        outputs.abandon()
        raise
    finally:
        if pool is not None:
            _stop_pool(pool)
        job.progress.done()
    if stop.requested:
        raise PrepareInterrupted(
            f"interrupted ({stop.requested}): {outputs.position.docs:,} documents committed to "
            f"{opts.output}; run the same command again to resume"
        )
    check_not_empty(outputs.position, outputs.complete, opts, job.causes)
    return _summary(outputs, time.perf_counter() - start, job.run_bytes)


def _note_resume(at: Position, inputs: list[InputFile], opts: PrepareOptions, stream: TextIO):
    """Prints where a resumed job continues."""
    where = "the end" if at.file >= len(inputs) else _where(inputs[at.file], "jsonl", at.record)
    if at.file < len(inputs) and inputs[at.file].format == "parquet":
        where = _where(inputs[at.file], "parquet", at.record)
    print(
        f"resuming {opts.output}: {at.docs:,} documents committed, continuing at {where}",
        file=stream,
    )


def _start_pool(workers: int, args: tuple[str | None, str, str, int | None]) -> Any:
    """A pool of ``workers`` tokenizing processes; None for ``workers <= 0``, after setting
    this process up to tokenize instead."""
    if workers <= 0:
        _setup_worker(*args)
        return None
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context(pool_start_method())
    return ProcessPoolExecutor(workers, context, initializer=_init_worker, initargs=args)


def _stop_pool(pool: Any) -> None:
    """Stops the tokenizing pool: chunks not started are cancelled, the ones a worker has
    started finish, then every worker exits by itself.

    No worker is killed: a worker killed while it sends a result holds the result pipe's
    lock forever, and stopping the pool then waits for that lock forever (as
    ``multiprocessing.Pool.terminate`` can, after an error or a stop request leaves
    chunks in flight)."""
    pool.shutdown(wait=True, cancel_futures=True)


#: Modules whose native threads make forking this process unsafe: a child forked while
#: one of their threads holds a lock can wait on it forever (TensorStore runs threads once
#: a store is open, as the output store is before the pool starts).
THREADED_MODULES = ("jax", "tensorstore")


def pool_start_method() -> str:
    """How the tokenizing pool starts its processes: ``fork`` (fastest) unless a module
    of :data:`THREADED_MODULES` is loaded, then ``forkserver`` (children forked from a
    fresh server process that runs no such threads)."""
    return "forkserver" if any(name in sys.modules for name in THREADED_MODULES) else "fork"


def _tokenized(
    chunks: Iterator[Chunk], pool: Any, workers: int, stop: _StopRequests
) -> Iterator[tuple[Chunk, tuple[list[np.ndarray], list[BadRecord], int]]]:
    """``(chunk, process_chunk(chunk))`` in input order, tokenized by ``pool`` (at most
    ``2 * workers + 2`` chunks in flight) or in this process; stops before the next chunk
    once a stop is requested. PrepareError when a worker of the pool died."""
    if pool is None:
        while not stop.requested and (chunk := next(chunks, None)) is not None:
            yield chunk, process_chunk(chunk)
        return
    from concurrent.futures.process import BrokenProcessPool

    try:
        yield from _pooled(chunks, pool, 2 * workers + 2, stop)
    except BrokenProcessPool as e:
        raise PrepareError(
            "a tokenizing worker process died (killed by a signal, out of memory, or a crash "
            "in the tokenizer); the documents committed before it are kept. Find what killed "
            "it (`dmesg` shows the out-of-memory killer), or use fewer --workers or smaller "
            "--chunk-records, then rerun the same command: it resumes after the last commit"
        ) from e


def _pooled(
    chunks: Iterator[Chunk], pool: Any, limit: int, stop: _StopRequests
) -> Iterator[tuple[Chunk, tuple[list[np.ndarray], list[BadRecord], int]]]:
    """:func:`_tokenized` by ``pool``, with at most ``limit`` chunks in flight."""
    in_flight: deque = deque()
    while not stop.requested:
        while len(in_flight) < limit and (chunk := next(chunks, None)) is not None:
            in_flight.append((chunk, pool.submit(process_chunk, chunk)))
        if not in_flight:
            return
        chunk, future = in_flight.popleft()
        yield chunk, future.result()


class _Job:
    """A running job's position and counters: takes tokenized chunks in input order,
    appends their documents, reports bad records and commits every ``commit_every``."""

    def __init__(
        self,
        opts: PrepareOptions,
        inputs: list[InputFile],
        outputs: _Outputs,
        progress: Progress,
    ) -> None:
        self.opts, self.inputs, self.outputs, self.progress = opts, inputs, outputs, progress
        self.pos = dataclasses.replace(outputs.position)
        self.run_bytes = 0.0
        self.reported = self.since_commit = 0
        self.causes = BadRecordCauses()

    def take(self, chunk: Chunk, docs: list[np.ndarray], bad: list[BadRecord], empty: int) -> None:
        """Writes one tokenized chunk (with ``strict``, up to its first bad record, then
        raises PrepareError); commits when ``commit_every`` chunks are pending."""
        opts, pos = self.opts, self.pos
        if opts.strict and bad:
            _stop_at_bad_record(self.outputs, pos, chunk, docs, bad[0], self.inputs)
        for index, reason, _ in bad:
            self._report_bad(_where(self.inputs[chunk.file], chunk.format, index), reason)
        self.outputs.append(docs)
        pos.docs += len(docs)
        pos.tokens += int(sum(d.size for d in docs))
        pos.bad += len(bad)
        pos.empty += empty
        pos.input_bytes += chunk.nbytes
        self.run_bytes += chunk.nbytes
        last = chunk.last_in_file
        pos.file, pos.record = (chunk.file + 1, 0) if last else (chunk.file, chunk.end)
        self.since_commit += 1
        if self.since_commit >= opts.commit_every:
            self.outputs.commit(pos)
            self.pos = dataclasses.replace(self.outputs.position)
            self.since_commit = 0
        self.progress.update(self.pos, self.run_bytes)

    def _report_bad(self, where: str, reason: str) -> None:
        """Counts a bad record; notes it while fewer than ``max_reported_bad`` were."""
        limit = self.opts.max_reported_bad
        self.causes.add(reason, self.reported >= limit)
        if self.reported < limit:
            self.progress.note(f"skipped {where}: {reason}")
        elif self.reported == limit > 0:
            self.progress.note("more bad records are skipped, counted and summarized at the end")
        self.reported += 1

    def finish(self) -> None:
        """Shows the final progress and the summary of bad records not listed one by one."""
        self.progress.update(self.outputs.position, self.run_bytes, force=True)
        if self.causes.unreported:
            self.progress.note(self.causes.format_unreported())


def _stop_at_bad_record(
    outputs: _Outputs,
    pos: Position,
    chunk: Chunk,
    docs: list[np.ndarray],
    first_bad: tuple[int, str, tuple[int, int]],
    inputs: list[InputFile],
) -> None:
    """``--strict``: commits the chunk's documents before its first bad record (the job
    resumes at that record) and raises PrepareError naming it."""
    index, reason, (docs_before, empty_before) = first_bad
    kept = docs[:docs_before]
    outputs.append(kept)
    pos.docs += len(kept)
    pos.tokens += int(sum(d.size for d in kept))
    pos.empty += empty_before
    pos.file, pos.record = chunk.file, index
    outputs.commit(pos)
    raise PrepareError(
        f"{_where(inputs[chunk.file], chunk.format, index)}: {reason} (--strict: stopped; the "
        f"{pos.docs:,} document{'s' if pos.docs != 1 else ''} before it "
        f"{'are' if pos.docs != 1 else 'is'} committed)"
    )


class BadRecordCauses:
    """Bad records counted by cause (the reason without its record-specific details)."""

    def __init__(self) -> None:
        self.all: collections.Counter[str] = collections.Counter()
        self.unreported: collections.Counter[str] = collections.Counter()
        self.examples: dict[str, str] = {}
        self.reported = 0  # listed one by one, before the summary of the others

    @staticmethod
    def cause(reason: str) -> str:
        return re.split(r" \(|: ", reason, maxsplit=1)[0]

    def add(self, reason: str, unreported: bool) -> None:
        cause = self.cause(reason)
        self.all[cause] += 1
        self.examples.setdefault(cause, reason)
        if unreported:
            self.unreported[cause] += 1
        else:
            self.reported += 1

    def format_unreported(self) -> str:
        """The bad records not listed one by one, by cause ("... and N more" after a list)."""
        total = sum(self.unreported.values())
        parts = ", ".join(f"{n:,} {cause}" for cause, n in self.unreported.most_common())
        if self.reported:
            return f"... and {total:,} more bad records skipped: {parts}"
        return f"skipped {total:,} bad record{'s' if total != 1 else ''}: {parts}"


def check_not_empty(
    pos: Position, complete: bool, opts: PrepareOptions, causes: BadRecordCauses
) -> None:
    """Raise PrepareError when a complete job wrote no document, naming why and the fix."""
    if not complete or pos.docs > 0:
        return
    if pos.bad == 0 and pos.empty == 0:
        raise PrepareError(f"no documents: the inputs {list(opts.inputs)} hold no records")
    missing = f"no {opts.text_field!r} field"
    if causes.all and causes.all.most_common(1)[0][0] == missing:
        example = causes.examples[missing]
        fields = example[example.find("(fields:") + 9 : -1] if "(fields:" in example else "?"
        raise PrepareError(
            f"no documents: {causes.all[missing]:,} of {pos.bad:,} records have no "
            f"{opts.text_field!r} field (fields: {fields}); pass --text-field with the field that "
            f"holds the text, and --overwrite to redo {opts.output}"
        )
    if causes.all:
        parts = ", ".join(f"{n:,} {cause}" for cause, n in causes.all.most_common())
        raise PrepareError(
            f"no documents: every record was bad ({parts}); fix the input or the options "
            f"(--format, --text-field, --tokenizer) and rerun with --overwrite"
        )
    raise PrepareError(
        f"no documents in {opts.output}: all {pos.bad + pos.empty:,} records were bad or empty; "
        "fix the input or the options (--format, --text-field) and rerun with --overwrite"
    )


class _StopRequests:
    """Turns SIGINT/SIGTERM into a request to stop at the next chunk boundary.

    A second signal interrupts at once (nothing after the last commit is kept).
    Only active in the main thread.
    """

    def __init__(self):
        self.requested: str | None = None
        self._saved: dict = {}

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name

    def __enter__(self):
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._saved[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        self._saved.clear()


def _where(item: InputFile, fmt: str, index: int) -> str:
    if fmt in ("jsonl", "lines"):
        return f"{item.path}:{index + 1}"
    if fmt == "parquet":
        return f"{item.path}: row {index}"
    return item.path


def _summary(outputs: _Outputs, seconds: float, run_bytes: float) -> PrepareSummary:
    pos = outputs.position
    if outputs.want_store:
        from zephon_jax.sources.token_store import TokenStore

        lengths = TokenStore(
            outputs.out, storage_options=outputs.opts.storage_options, allow_partial=True
        ).doc_lengths
    else:
        lengths = ArrayRecordTokens(outputs.out).lengths()
    return PrepareSummary(
        output=str(outputs.out),
        documents=pos.docs,
        tokens=pos.tokens,
        bad_records=pos.bad,
        empty_records=pos.empty,
        length_percentiles=length_percentiles(np.asarray(lengths)),
        seconds=seconds,
        input_mb=run_bytes / 1e6,
        resumed=outputs.resumed,
        complete=outputs.complete,
        target=outputs.opts.to,
    )
