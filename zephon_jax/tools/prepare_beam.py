"""``zephon-jax prepare --engine beam``: the same conversion as an Apache Beam pipeline.

The output TokenStore is byte-identical to the local engine's and does not depend
on the number of workers:

1. the driver cuts the inputs into units in input order (a byte range of a JSONL or
   line-text file owning the lines that start in it, a row group of a Parquet file,
   a whole text file);
2. workers tokenize units and write each unit's tokens and document lengths to
   ``OUT/_beam_tmp/``;
3. one step gathers the units' counts, lays the units out in input order (each unit's
   first token and document), creates the arrays at their final sizes and writes
   the offsets;
4. workers write the tokens array one stored shard (``chunk_tokens`` tokens) at a
   time, each from the unit pieces that fall in it, so no two workers write one file;
5. a last step writes ``meta.json`` and ``prepare.json`` and deletes the unit files.

On DirectRunner ``--num-workers`` sets ``direct_num_workers``; any other runner
(Dataflow, Flink, Spark) is chosen by the Beam pipeline options after ``--``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import numpy as np

from zephon_jax.sources.storage import Location, filesystem, join
from zephon_jax.sources.token_store import (
    DEFAULT_CHUNK_TOKENS,
    TokenStore,
    commit_token_store,
    create_token_store,
    write_token_range,
)
from zephon_jax.tools.prepare import (
    MANIFEST,
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    BadRecordCauses,
    Chunk,
    InputFile,
    Position,
    PrepareError,
    PrepareOptions,
    PrepareSummary,
    check_not_empty,
    check_output,
    describe_inputs,
    ensure_worker,
    job_identity,
    length_percentiles,
    open_input,
    process_chunk,
    worker_args,
)
from zephon_jax.tools.tokenizers import load_tokenizer

TMP_DIR = "_beam_tmp"
DEFAULT_UNIT_BYTES = 64 << 20
SHARD_TOKENS = DEFAULT_CHUNK_TOKENS  # tokens per stored shard: one shard_tasks task each


@dataclasses.dataclass(frozen=True)
class Unit:
    """A piece of input, tokenized by one worker: records of ``file`` in ``[start, end)``.

    ``start``/``end`` are byte offsets for line formats (the unit owns the lines that start
    in the range), row indices for Parquet, and ``0``/``1`` for a whole text file.
    """

    index: int
    file: int
    start: int
    end: int


def plan_units(
    inputs: list[InputFile], opts: PrepareOptions, unit_bytes: int = DEFAULT_UNIT_BYTES
) -> list[Unit]:
    """The units of ``inputs`` in input order."""
    units: list[Unit] = []
    for fi, item in enumerate(inputs):
        if item.format == "parquet":
            import pyarrow.parquet as pq

            with open_input(item.path, opts.storage_options) as f:
                meta = pq.ParquetFile(f).metadata
            row = 0
            for g in range(meta.num_row_groups):
                n = meta.row_group(g).num_rows
                units.append(Unit(len(units), fi, row, row + n))
                row += n
        elif item.format == "text" and not opts.lines:
            units.append(Unit(len(units), fi, 0, 1))
        else:
            for lo in range(0, max(item.size, 1), max(1, unit_bytes)):
                units.append(Unit(len(units), fi, lo, min(lo + unit_bytes, item.size)))
    return units


def _read_unit(unit: Unit, item: InputFile, opts: PrepareOptions) -> Chunk:
    """The raw records of ``unit`` (record index = byte offset of the line, or the row)."""
    if item.format == "parquet":
        import pyarrow.parquet as pq

        with open_input(item.path, opts.storage_options) as f:
            pf = pq.ParquetFile(f)
            row_group = _row_group_of(pf.metadata, unit.start)
            values = pf.read_row_group(row_group, columns=[opts.text_field]).column(0).to_pylist()
        items = [(unit.start + i, v) for i, v in enumerate(values)]
        return Chunk(unit.file, "parquet", unit.start, unit.end, items, 0.0)
    if item.format == "text" and not opts.lines:
        with open_input(item.path, opts.storage_options) as f:
            return Chunk(unit.file, "text", 0, 1, [(0, f.read())], 0.0)
    fmt = "lines" if item.format == "text" else "jsonl"
    items = []
    with open_input(item.path, opts.storage_options) as f:
        pos = unit.start
        if pos > 0:
            f.seek(pos - 1)
            if f.read(1) != b"\n":  # the line at pos began in the previous unit
                pos += len(f.readline())
        while pos < unit.end:
            line = f.readline()
            if not line:
                break
            if line.strip():
                items.append((pos, line))
            pos += len(line)
    return Chunk(unit.file, fmt, unit.start, unit.end, items, 0.0)


def _row_group_of(meta: Any, row: int) -> int:
    first = 0
    for g in range(meta.num_row_groups):
        if first == row:
            return g
        first += meta.row_group(g).num_rows
    raise PrepareError(f"row {row} starts no row group")


def _where(item: InputFile, fmt: str, index: int) -> str:
    return f"{item.path}: row {index}" if fmt == "parquet" else f"{item.path}: byte {index}"


# ----- pipeline steps (run on workers; module-level so that they pickle) --------------------


def tokenize_unit(unit: Unit, inputs: list[InputFile], opts: PrepareOptions) -> dict[str, Any]:
    """Tokenizes one unit and writes its tokens and lengths to the temporary directory."""
    ensure_worker(opts)
    item = inputs[unit.file]
    chunk = _read_unit(unit, item, opts)
    docs, bad, empty = process_chunk(chunk)
    if bad and opts.strict:
        index, reason, _ = bad[0]
        raise PrepareError(f"{_where(item, chunk.format, index)}: {reason} (--strict: stopped)")
    dtype = opts.out_dtype.newbyteorder("<")
    lengths = np.array([d.size for d in docs], dtype="<i8")
    tokens = np.concatenate(docs).astype(dtype) if docs else np.empty(0, dtype=dtype)
    tmp = Location(join(opts.output, TMP_DIR), opts.storage_options)
    tmp.write(f"unit-{unit.index:08d}.tokens", tokens.tobytes())
    tmp.write(f"unit-{unit.index:08d}.lengths", lengths.tobytes())
    return {
        "unit": unit.index,
        "docs": int(lengths.size),
        "tokens": int(tokens.size),
        "empty": empty,
        "bad": [(_where(item, chunk.format, i), r) for i, r, _ in bad],
    }


def layout(stats: list[dict[str, Any]], opts: PrepareOptions) -> dict[str, Any]:
    """Lays the units out in input order, creates the arrays and writes the offsets."""
    stats = sorted(stats, key=lambda s: s["unit"])
    tok_counts = np.array([s["tokens"] for s in stats], dtype=np.int64)
    token_base = np.concatenate([[0], np.cumsum(tok_counts)])
    tmp = Location(join(opts.output, TMP_DIR), opts.storage_options)
    lengths = [
        np.frombuffer(tmp.read(f"unit-{s['unit']:08d}.lengths") or b"", dtype="<i8") for s in stats
    ]
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths + [np.zeros(0, "<i8")]))])
    create_token_store(
        opts.output,
        offsets,
        opts.out_dtype,
        storage_options=opts.storage_options,
        compression=opts.compression,
    )
    return {
        "token_base": token_base.tolist(),
        "units": [s["unit"] for s in stats],
        "num_docs": int(sum(s["docs"] for s in stats)),
        "num_tokens": int(token_base[-1]),
        "empty": int(sum(s["empty"] for s in stats)),
        "bad": [b for s in stats for b in s["bad"]],
    }


def shard_tasks(plan: dict[str, Any]) -> list[tuple[int, list[tuple[int, int, int]]]]:
    """For each stored shard of the tokens array: the unit pieces ``(unit, lo, hi)`` in it."""
    base, units = plan["token_base"], plan["units"]
    tasks: dict[int, list[tuple[int, int, int]]] = {}
    for k, unit in enumerate(units):
        a, b = base[k], base[k + 1]
        pos = a
        while pos < b:
            shard = pos // SHARD_TOKENS
            end = min(b, (shard + 1) * SHARD_TOKENS)
            tasks.setdefault(shard, []).append((unit, pos - a, end - a))
            pos = end
    return sorted(tasks.items())


def write_shard(task: tuple[int, list[tuple[int, int, int]]], opts: PrepareOptions) -> int:
    """Writes one stored shard of the tokens array from its unit pieces; returns its index."""
    shard, pieces = task
    dtype = opts.out_dtype.newbyteorder("<")
    tmp = join(opts.output, TMP_DIR)
    parts = []
    for unit, lo, hi in pieces:
        fs, inner = filesystem(join(tmp, f"unit-{unit:08d}.tokens"), opts.storage_options)
        raw = fs.cat_file(inner, start=lo * dtype.itemsize, end=hi * dtype.itemsize)
        parts.append(np.frombuffer(raw, dtype=dtype))
    data = np.concatenate(parts).astype(opts.out_dtype)
    write_token_range(opts.output, shard * SHARD_TOKENS, data, storage_options=opts.storage_options)
    return shard


def finalize(
    _count: int, plan: dict[str, Any], inputs: list[InputFile], opts: PrepareOptions
) -> None:
    """Commits the store (meta.json, then prepare.json) and deletes the unit files."""
    loc = Location(opts.output, opts.storage_options)
    commit_token_store(opts.output, storage_options=opts.storage_options)
    position = Position(
        file=len(inputs),
        docs=plan["num_docs"],
        tokens=plan["num_tokens"],
        bad=len(plan["bad"]),
        empty=plan["empty"],
        input_bytes=float(sum(i.size for i in inputs)),
    )
    causes = BadRecordCauses()
    for _, reason in plan["bad"]:
        causes.add(reason, False)
    record = {
        "bad_report": {
            "first": plan["bad"][: opts.max_reported_bad],
            "causes": dict(causes.all),
            "examples": causes.examples,
        },
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "job": job_identity(opts, inputs),
        "committed": position.to_json(),
        "pending": None,
        "complete": True,
    }
    loc.write(MANIFEST, json.dumps(record, indent=1, sort_keys=True).encode())
    Location(join(opts.output, TMP_DIR), opts.storage_options).delete_all()


# ----- the driver -----------------------------------------------------------------------


def beam_options(num_workers: int | None, pipeline_args: Sequence[str]) -> Any:
    """Beam PipelineOptions: ``pipeline_args`` as given, DirectRunner with ``num_workers``."""
    from apache_beam.options.pipeline_options import PipelineOptions

    args = list(pipeline_args)
    if not any(a == "--runner" or a.startswith("--runner=") for a in args):
        args.append("--runner=DirectRunner")
    if num_workers is not None and not any(a.startswith("--direct_num_workers") for a in args):
        args.append(f"--direct_num_workers={num_workers}")
        if num_workers > 1 and not any(a.startswith("--direct_running_mode") for a in args):
            args.append("--direct_running_mode=multi_processing")
    return PipelineOptions(args)


def prepare_beam(
    opts: PrepareOptions,
    *,
    num_workers: int | None = None,
    pipeline_args: Sequence[str] = (),
    unit_bytes: int = DEFAULT_UNIT_BYTES,
    stream: TextIO | None | str = "stderr",
) -> PrepareSummary:
    """Runs ``prepare`` as an Apache Beam pipeline; the TokenStore equals the local engine's.

    Writes ``--to store`` only, into an absent or empty output (``overwrite`` deletes it
    first); a failed job leaves no ``meta.json`` and is rerun from the start (Beam itself
    retries failed work). Raises PrepareError as the local engine does, including when no
    document was produced.
    """
    try:
        import apache_beam as beam
    except ImportError as e:
        raise PrepareError("--engine beam needs Apache Beam: pip install 'zephon_jax[beam]'") from e
    text_stream = _text_stream(stream)
    inputs = _check_job(opts, text_stream)
    units = plan_units(inputs, opts, unit_bytes)
    if text_stream is not None:
        print(
            f"prepare (beam): {len(inputs)} files in {len(units)} units -> {opts.output}",
            file=text_stream,
        )
    with beam.Pipeline(options=beam_options(num_workers, pipeline_args)) as p:
        _add_steps(beam, p, units, inputs, opts)
    return _summary(opts, text_stream)


def _text_stream(stream: TextIO | None | str) -> TextIO | None:
    """``stream`` with ``"stderr"`` resolved; PrepareError for any other string."""
    if isinstance(stream, str):
        if stream != "stderr":
            raise PrepareError(f"stream must be a text stream, None or 'stderr'; got {stream!r}")
        return sys.stderr
    return stream


def _check_job(opts: PrepareOptions, stream: TextIO | None) -> list[InputFile]:
    """Checks the options and the output (emptied with ``overwrite``); returns the inputs.

    Raises PrepareError for options the Beam engine cannot run or an output that is not
    empty."""
    if opts.to != "store":
        raise PrepareError("--engine beam writes a TokenStore only: use --to store")
    load_tokenizer(opts.tokenizer)
    check_output(opts)
    try:
        np.iinfo(opts.out_dtype)
    except ValueError as e:
        raise PrepareError(f"--dtype {opts.dtype!r} is not an integer dtype") from e
    worker_args(opts)  # fail early on --append-eos without an id
    inputs = describe_inputs(opts, stream)
    loc = Location(opts.output, opts.storage_options)
    if opts.overwrite and loc.exists():
        loc.delete_all()
    if loc.is_file() or loc.names():
        raise PrepareError(
            f"output {opts.output} is not empty; --engine beam writes a new store: choose a new "
            "location or pass --overwrite"
        )
    return inputs


def _add_steps(
    beam: Any, p: Any, units: list[Unit], inputs: list[InputFile], opts: PrepareOptions
) -> None:
    """Adds the job's steps (tokenize, lay out, write shards, commit) to pipeline ``p``."""
    stats = (
        p
        | "Units" >> beam.Create(units)
        | "Spread" >> beam.Reshuffle()
        | "Tokenize" >> beam.Map(tokenize_unit, inputs, opts)
        | "Gather" >> beam.combiners.ToList()
    )
    plan = stats | "Layout" >> beam.Map(layout, opts)
    written = (
        plan
        | "Shards" >> beam.FlatMap(shard_tasks)
        | "SpreadShards" >> beam.Reshuffle()
        | "WriteShards" >> beam.Map(write_shard, opts)
        | "Count" >> beam.combiners.Count.Globally()
    )
    _ = written | "Commit" >> beam.Map(finalize, beam.pvalue.AsSingleton(plan), inputs, opts)


def _summary(opts: PrepareOptions, stream: TextIO | None) -> PrepareSummary:
    """The finished job's summary from its store and ``prepare.json``; reports its bad
    records on ``stream``. Raises PrepareError when it produced no document."""
    store = TokenStore(opts.output, storage_options=opts.storage_options)
    raw = Location(opts.output, opts.storage_options).read(MANIFEST)
    record = json.loads(raw.decode()) if raw else {}
    committed = record.get("committed", {})
    causes = _report_bad_records(record.get("bad_report", {}), committed, stream)
    summary = PrepareSummary(
        output=opts.output,
        documents=store.num_docs,
        tokens=store.num_tokens,
        bad_records=int(committed.get("bad", 0)),
        empty_records=int(committed.get("empty", 0)),
        length_percentiles=length_percentiles(store.doc_lengths),
        seconds=0.0,
        input_mb=0.0,
        resumed=False,
        complete=True,
        target="store",
    )
    if store.num_docs == 0:
        check_not_empty(Position(**committed), True, opts, causes)
    return summary


def _report_bad_records(
    report: dict[str, Any], committed: dict[str, Any], stream: TextIO | None
) -> BadRecordCauses:
    """Prints the bad records of ``prepare.json``'s report on ``stream`` (the first ones,
    then a summary by cause) as the local engine does; returns them counted by cause."""
    causes = BadRecordCauses()
    causes.all.update(report.get("causes", {}))
    causes.examples.update(report.get("examples", {}))
    if stream is None:
        return causes
    for where, reason in report.get("first", []):
        print(f"skipped {where}: {reason}", file=stream)
    rest = len(report.get("first", []))
    if committed.get("bad", 0) > rest:
        causes.unreported.update(causes.all)
        by_cause = ", ".join(f"{n:,} {c}" for c, n in causes.all.most_common())
        more = committed["bad"] - rest
        print(
            f"... and {more:,} more bad records skipped; all bad records by cause: {by_cause}"
            if rest
            else f"skipped {more:,} bad record{'s' if more != 1 else ''}: {by_cause}",
            file=stream,
        )
    return causes
