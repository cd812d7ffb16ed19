"""``zephon-jax prepare``: JSONL, plain text and Parquet into a TokenStore and/or ArrayRecord files.

Output directory layout (``OUT``)::

    OUT/meta.json, tokens/, offsets/    the TokenStore (``--to store`` or ``both``)
    OUT/array_record/part-NNNNN.array_record   ArrayRecord shards (``--to array_record`` or ``both``)
    OUT/prepare.json                    the job record: options, input position, counts

ArrayRecord record format: one record per document, the document's token ids as
raw little-endian integers of the output dtype (``uint16`` for the byte-level
tokenizer, ``uint32`` otherwise), no header; the dtype is in ``prepare.json``.
:class:`ArrayRecordTokens` reads them back as ``{"tokens": array}`` records, so
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

import dataclasses
import importlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TextIO

import numpy as np

from zephon_jax.errors import ZephonError

PAD_ID = 0
EOS_ID = 1
BYTE_OFFSET = 2
BYTE_VOCAB_SIZE = 256 + BYTE_OFFSET

MANIFEST = "prepare.json"
MANIFEST_FORMAT = "zephon_jax.prepare"
MANIFEST_VERSION = 1
ARRAY_RECORD_DIR = "array_record"
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
_MAX_REPORTED_BAD = 20


class PrepareError(ZephonError):
    """Input, options or an existing output that ``prepare`` cannot work with."""


class PrepareInterrupted(ZephonError):
    """``prepare`` was interrupted; what it committed is valid and a rerun resumes."""


# ----- tokenizers -------------------------------------------------------------------


def byte_tokenize(text: str) -> np.ndarray:
    """Byte-level tokens: the UTF-8 bytes of ``text`` plus ``BYTE_OFFSET``, as uint16.

    Ids ``0`` (``PAD_ID``, also what packing pads with) and ``1`` (``EOS_ID``)
    are reserved, so byte ``b`` is token ``b + 2`` and the vocabulary has 258 ids.
    """
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16) + BYTE_OFFSET


def byte_detokenize(tokens: Any) -> str:
    """Inverse of :func:`byte_tokenize`; reserved ids are dropped."""
    arr = np.asarray(tokens).astype(np.int64)
    arr = arr[arr >= BYTE_OFFSET] - BYTE_OFFSET
    return arr.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


def load_callable(spec: str) -> Callable[..., Any]:
    """Resolves ``"module:function"`` (the function may be a dotted attribute path)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise PrepareError(
            f"{spec!r} is not of the form module:function (e.g. mypkg.tok:encode); the module "
            "must be importable from the current directory or PYTHONPATH"
        )
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise PrepareError(f"cannot import module {module_name!r} of {spec!r}: {e}") from e
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise PrepareError(f"module {module_name!r} has no attribute {attr!r}") from e
    if not callable(obj):
        raise PrepareError(f"{spec!r} is a {type(obj).__name__}, not a callable")
    return obj


def load_tokenizer(spec: str | None) -> Callable[[str], Any]:
    """The tokenizer ``spec`` names (``module:function``, ``str -> list[int]``); None: bytes."""
    return byte_tokenize if spec in (None, "", "bytes") else load_callable(spec)


# ----- options and inputs ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PrepareOptions:
    """What ``prepare`` does; everything except the performance knobs is checked on resume."""

    inputs: tuple[str, ...]
    output: str
    to: str = "store"
    input_format: str | None = None
    text_field: str = "text"
    lines: bool = False
    tokenizer: str | None = None
    dtype: str | None = None
    append_eos: bool = False
    strict: bool = False
    workers: int | None = None
    chunk_records: int = 256
    commit_every: int = 16
    overwrite: bool = False

    @property
    def out_dtype(self) -> np.dtype:
        if self.dtype is not None:
            return np.dtype(self.dtype)
        return np.dtype(np.uint16 if load_tokenizer_is_bytes(self.tokenizer) else np.uint32)


def load_tokenizer_is_bytes(spec: str | None) -> bool:
    return spec in (None, "", "bytes")


def detect_format(path: str) -> str:
    """The input format of ``path`` from its extension (``jsonl``, ``text`` or ``parquet``)."""
    suffix = Path(path).suffix.lower()
    if suffix in (".gz", ".zst", ".bz2", ".xz"):
        raise PrepareError(f"{path}: compressed input is not supported; decompress it first")
    return _EXTENSIONS.get(suffix, "text")


def expand_inputs(inputs: Sequence[str]) -> list[str]:
    """Input paths; a directory stands for its files with known extensions, sorted."""
    out: list[str] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            files = sorted(
                str(f) for f in p.rglob("*") if f.is_file() and f.suffix.lower() in _EXTENSIONS
            )
            if not files:
                raise PrepareError(f"directory {item} holds no input files ({sorted(_EXTENSIONS)})")
            out.extend(files)
        elif p.is_file():
            out.append(str(p))
        else:
            raise PrepareError(f"input {item} does not exist")
    if not out:
        raise PrepareError("no inputs given: pass JSONL, text or Parquet files (or directories)")
    return out


@dataclasses.dataclass
class _Input:
    path: str
    format: str
    size: int
    rows: int = 0  # parquet only


def _describe_inputs(opts: PrepareOptions) -> list[_Input]:
    result = []
    for path in expand_inputs(opts.inputs):
        fmt = opts.input_format or detect_format(path)
        if fmt not in INPUT_FORMATS:
            raise PrepareError(f"unknown input format {fmt!r}; use one of {INPUT_FORMATS}")
        item = _Input(path, fmt, os.path.getsize(path))
        if fmt == "parquet":
            import pyarrow.parquet as pq

            try:
                meta = pq.ParquetFile(path)
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


# ----- reading chunks (parent) --------------------------------------------------------


@dataclasses.dataclass
class _Chunk:
    file: int
    format: str
    start: int  # first record index in the file (line index for line formats)
    end: int  # record index after the chunk
    items: list  # (record_index, raw) pairs
    nbytes: float  # input bytes this chunk stands for (progress)
    last_in_file: bool = False


def _read_chunks(
    inputs: list[_Input], opts: PrepareOptions, file: int, record: int
) -> Iterator[_Chunk]:
    """Chunks of raw input from position (file, record) on, in input order."""
    n = max(1, opts.chunk_records)
    for fi in range(file, len(inputs)):
        item = inputs[fi]
        skip = record if fi == file else 0
        if item.format == "parquet":
            yield from _parquet_chunks(fi, item, opts, skip, n)
        elif item.format == "text" and not opts.lines:
            if skip == 0:
                raw = Path(item.path).read_bytes()
                yield _Chunk(fi, "text", 0, 1, [(0, raw)], float(item.size), True)
        else:
            yield from _line_chunks(fi, item, skip, n, "lines" if item.format == "text" else "jsonl")


def _line_chunks(fi: int, item: _Input, skip: int, n: int, fmt: str) -> Iterator[_Chunk]:
    with open(item.path, "rb") as f:
        items, nbytes, start, index = [], 0, skip, -1
        for index, line in enumerate(f):
            if index < skip:
                continue
            nbytes += len(line)
            if line.strip():
                items.append((index, line))
            if len(items) >= n:
                yield _Chunk(fi, fmt, start, index + 1, items, float(nbytes))
                items, nbytes, start = [], 0, index + 1
        yield _Chunk(fi, fmt, start, max(index + 1, start), items, float(nbytes), True)


def _parquet_chunks(fi: int, item: _Input, opts: PrepareOptions, skip: int, n: int):
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(item.path)
    per_row = item.size / max(1, item.rows)
    row = 0
    for batch in pf.iter_batches(batch_size=n, columns=[opts.text_field]):
        values = batch.column(0).to_pylist()
        start = row
        row += len(values)
        if row <= skip:
            continue
        first = max(skip, start)
        items = [(start + i, v) for i, v in enumerate(values) if start + i >= first]
        yield _Chunk(fi, "parquet", first, row, items, per_row * len(items))
    yield _Chunk(fi, "parquet", max(row, skip), max(row, skip), [], 0.0, True)


# ----- tokenizing chunks (workers) ------------------------------------------------------

_worker: dict[str, Any] = {}


def _init_worker(tokenizer: str | None, text_field: str, dtype: str, append_eos: bool) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    _setup_worker(tokenizer, text_field, dtype, append_eos)


def _setup_worker(tokenizer: str | None, text_field: str, dtype: str, append_eos: bool) -> None:
    _worker.update(
        tokenize=load_tokenizer(tokenizer),
        text_field=text_field,
        dtype=np.dtype(dtype),
        append_eos=append_eos,
    )


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


def _process_chunk(chunk: _Chunk) -> tuple[list[np.ndarray], list[tuple[int, str]], int]:
    """Tokenizes a chunk: (documents, [(record_index, reason)] for bad records, empty count)."""
    tokenize, field = _worker["tokenize"], _worker["text_field"]
    dtype, eos = _worker["dtype"], _worker["append_eos"]
    info = np.iinfo(dtype)
    docs, bad, empty = [], [], 0
    for index, raw in chunk.items:
        try:
            text = _text_of(chunk.format, raw, field)
        except ValueError as e:
            bad.append((index, str(e)))
            continue
        try:
            tokens = np.asarray(tokenize(text))
        except Exception as e:
            bad.append((index, f"the tokenizer failed: {e!r}"))
            continue
        if tokens.ndim != 1 or (tokens.size and tokens.dtype.kind not in "iu"):
            bad.append((index, f"the tokenizer returned {tokens.dtype} {tokens.shape}, not 1-D ints"))
            continue
        if tokens.size and (tokens.min() < info.min or tokens.max() > info.max):
            raise PrepareError(
                f"token ids [{tokens.min()}, {tokens.max()}] do not fit dtype {dtype.name}; "
                "pass a wider --dtype (uint32 or int32)"
            )
        if eos:
            tokens = np.append(tokens, EOS_ID)
        if tokens.size == 0:
            empty += 1
            continue
        docs.append(tokens.astype(dtype, copy=False))
    return docs, bad, empty
