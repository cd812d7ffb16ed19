"""The ``zephon-jax`` command: ``demo``, ``prepare``, ``inspect``, ``verify`` and ``explain``."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from zephon_jax import __version__
from zephon_jax.errors import PipelineError, ZephonError
from zephon_jax.state.files import load_state
from zephon_jax.tools import demo
from zephon_jax.tools.arguments import non_negative, positive
from zephon_jax.tools.explain import explain
from zephon_jax.tools.inspect_plan import (
    BUILTIN_NAME,
    builtin_pipeline,
    describe_plan,
    format_timing,
    load_pipeline,
    time_stages,
)
from zephon_jax.tools.tokenizers import byte_detokenize, load_callable
from zephon_jax.tools.verify import check_topologies, format_checks, parse_topologies, verify

# `prepare` and `prepare_beam` are imported by their command only: they load TensorStore,
# fsspec and pyarrow (about half a second), and Apache Beam.

DESCRIPTION = """\
zephon_jax: elastic-deterministic data loading for JAX. Global batch t, row r is
the same record, bit for bit, on any number of processes, devices and workers,
and across a checkpoint restored on another topology, also through packing,
splitting, shuffle buffers and mixtures."""

EPILOG = """\
Start with `zephon-jax demo`. Run `zephon-jax COMMAND --help` for a command's options."""


PREPARE_DESCRIPTION = """\
Tokenizes text into a TokenStore (random access, zarr v3 on TensorStore) and/or
ArrayRecord files (one record per document: its token ids as raw little-endian
integers of --dtype) in the directory OUT. Input formats come from the file
extension (.jsonl/.json/.ndjson, .parquet/.pq, anything else is text) or --format.
A directory stands for its files with a known extension (.jsonl .json .ndjson
.parquet .pq .txt .text .md .py); its other files are skipped, and listed in a
note: name them, or a glob, to read them.
Runs on all cores (output order does not depend on it), shows progress on
stderr, and commits periodically: interrupt it (Ctrl-C) and rerun the same
command to resume where it stopped, with the same result as one run.
Bad records (invalid JSON, missing field, not UTF-8, ...) are reported with
file and line and skipped (the first 20, then a summary by cause), or stop the
job with --strict; a job that produces no document fails.
Inputs and OUT may be s3:// or gs:// URLs (endpoint and credentials from the
standard environment: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...).
--engine beam runs the conversion as an Apache Beam pipeline (DirectRunner with
--workers, or any runner given by Beam options after `--`, e.g.
`-- --runner=DataflowRunner --project=P --region=R --temp_location=gs://B/tmp`);
its TokenStore is byte-identical to the local engine's."""

INSPECT_DESCRIPTION = """\
PIPELINE is MODULE:FUNCTION, a function without arguments returning a batched
pipeline (zephon_jax.Dataset...batch(global_batch_size)); the current directory
is importable. Without PIPELINE: the built-in corpus pipeline of `zephon-jax
demo` (a mixture of the Python standard library's modules and tests, shuffled,
split and packed first-fit into rows of 1024, batches of 16). Prints the
sources and weights, the operators in order with their carry bounds, the
lanes, the rows per lane and the fingerprint, then runs --steps global batches
on one process and prints where the time goes and how many bytes each
operator's carry takes in a lane state."""

VERIFY_DESCRIPTION = """\
PIPELINE is MODULE:FUNCTION returning a batched pipeline (as for inspect);
without it, the built-in corpus pipeline of `zephon-jax demo`.
Runs it on every topology PROCESSESxWORKERS of --topologies (processes are
simulated in this process and their rows concatenated into the global batch)
and compares --steps global batches, bit for bit, with an uninterrupted run on
one process without workers. With --resume-at K, the states of all processes
after K batches are merged and restored on the next topology of the list.
Every topology is checked first: the process count must divide the global
batch size. Prints the first differing step, row and field of each run.
Exit status: 0 all identical, 1 a difference or a failure, 2 bad arguments
(including a topology that cannot hold the batch)."""

EXPLAIN_DESCRIPTION = """\
PIPELINE is MODULE:FUNCTION returning a batched pipeline (as for inspect);
without it, the demo's pipeline on the built-in corpus. Prints, for each row of
global batch --step (0-based), the documents it holds: source, record, epoch
and the slice of the record, with the first characters of the text where the
source can show it. With --state (a file written by zephon_jax.save_state, or
a checkpoint directory written by zephon_jax.checkpoint.Save), only the batches
from that state on are produced, and only by the lanes of the rows asked for."""

_FORMAT = argparse.RawDescriptionHelpFormatter


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``zephon-jax`` and its commands; ``command`` is None without one."""
    parser = argparse.ArgumentParser(
        prog="zephon-jax", description=DESCRIPTION, epilog=EPILOG, formatter_class=_FORMAT
    )
    parser.add_argument("--version", action="version", version=f"zephon_jax {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_demo_parser(sub)
    _add_prepare_parser(sub)
    _add_inspect_parser(sub)
    _add_verify_parser(sub)
    _add_explain_parser(sub)
    return parser


def _add_demo_parser(sub: Any) -> None:
    """``demo``: its options belong to :mod:`zephon_jax.tools.demo`."""
    parser = sub.add_parser(
        "demo",
        help=demo.COMMAND_HELP,
        formatter_class=_FORMAT,
        description=demo.COMMAND_DESCRIPTION,
    )
    demo.add_arguments(parser)


def _add_prepare_parser(sub: Any) -> None:
    """``prepare``: inputs, output and engine, then what is written and how, then the job."""
    prep = sub.add_parser(
        "prepare",
        help="JSONL / text / Parquet -> TokenStore and/or ArrayRecord",
        formatter_class=_FORMAT,
        description=PREPARE_DESCRIPTION,
    )
    prep.add_argument(
        "inputs", nargs="+", help="input files, directories, globs or s3:// / gs:// URLs"
    )
    prep.add_argument("-o", "--output", required=True, help="output directory or URL OUT")
    prep.add_argument(
        "--engine",
        choices=("local", "beam"),
        default="local",
        help="local: this machine (default); beam: an Apache Beam pipeline",
    )
    prep.add_argument(  # the old name of --workers for --engine beam; still accepted
        "--num-workers", type=positive, default=None, help=argparse.SUPPRESS
    )
    prep.add_argument(
        "--to",
        choices=("store", "array_record", "both"),
        default="store",
        help="what to write (default: store)",
    )
    _add_prepare_input_arguments(prep)
    _add_prepare_token_arguments(prep)
    _add_prepare_job_arguments(prep)


def _add_prepare_input_arguments(prep: argparse.ArgumentParser) -> None:
    """``prepare``'s options on reading the inputs: format, field, lines."""
    prep.add_argument(
        "--format",
        dest="input_format",
        choices=("jsonl", "text", "parquet"),
        default=None,
        help="input format for every input (default: from each file's extension)",
    )
    prep.add_argument("--text-field", default="text", help="JSONL field / Parquet column (text)")
    prep.add_argument(
        "--lines",
        action="store_true",
        help="text files hold one document per line (default: one document per file)",
    )


def _add_prepare_token_arguments(prep: argparse.ArgumentParser) -> None:
    """``prepare``'s options on the tokens: tokenizer, dtype, end-of-document id."""
    prep.add_argument(
        "--tokenizer",
        default=None,
        metavar="MODULE:FUNCTION",
        help="a callable str -> list[int]; default: byte-level (token = byte + 2; 0 = pad, 1 = eos)",
    )
    prep.add_argument(
        "--dtype",
        default=None,
        choices=("uint16", "uint32", "int32"),
        help="token dtype (default: uint16 for bytes, uint32 for a tokenizer)",
    )
    prep.add_argument(
        "--compression",
        default="none",
        choices=("none", "zstd"),
        help="the TokenStore's tokens: none (default; a local store is read from memory "
        "maps, fastest) or zstd (smaller files, decoded on every read)",
    )
    prep.add_argument(
        "--append-eos",
        action="store_true",
        help="end every document with the end-of-document id (see --eos-id)",
    )
    prep.add_argument(
        "--eos-id",
        type=non_negative,
        default=None,
        metavar="ID",
        help="the id --append-eos appends (default: 1 for the byte-level tokenizer; for "
        "--tokenizer, its eos_token_id when it has one, as a Hugging Face tokenizer's encode "
        "does, else required)",
    )


def _add_prepare_job_arguments(prep: argparse.ArgumentParser) -> None:
    """``prepare``'s options on running the job: strictness, workers, commits, output."""
    prep.add_argument("--strict", action="store_true", help="stop at the first bad record")
    prep.add_argument(
        "--workers",
        type=non_negative,
        default=None,
        help="parallel processes: tokenizers (default: all cores; 0: in this process); "
        "with --engine beam on DirectRunner, Beam's workers (default: Beam's)",
    )
    prep.add_argument(
        "--chunk-records",
        type=positive,
        default=256,
        help="records per work unit (256)",
    )
    prep.add_argument(
        "--commit-every",
        type=positive,
        default=16,
        help="work units between commits (16); a resume redoes at most this many",
    )
    prep.add_argument(
        "--overwrite", action="store_true", help="delete OUT first instead of resuming into it"
    )
    prep.add_argument("--quiet", action="store_true", help="no progress bar or notes")


def _add_inspect_parser(sub: Any) -> None:
    """``inspect``: a pipeline (see :func:`_add_pipeline_arguments`) and steps to time."""
    insp = sub.add_parser(
        "inspect",
        help="a pipeline's plan and per-stage timing",
        formatter_class=_FORMAT,
        description=INSPECT_DESCRIPTION,
    )
    _add_pipeline_arguments(insp)
    insp.add_argument(
        "--steps", type=non_negative, default=20, help="batches to time (20; 0: none)"
    )


def _add_verify_parser(sub: Any) -> None:
    """``verify``: a pipeline, the topologies, steps and the resume point."""
    ver = sub.add_parser(
        "verify",
        help="identical batches on several topologies and across a resume?",
        formatter_class=_FORMAT,
        description=VERIFY_DESCRIPTION,
    )
    _add_pipeline_arguments(ver)
    ver.add_argument(
        "--topologies",
        default="1x0,2x0,4x0",
        help="comma-separated PROCESSESxWORKERS, e.g. 1x0,2x1,4x2 (default 1x0,2x0,4x0)",
    )
    ver.add_argument("--steps", type=positive, default=20, help="global batches per run (20)")
    ver.add_argument(
        "--resume-at",
        type=non_negative,
        default=None,
        help="also check a resume after this many batches (default: steps // 2; 0: no resume)",
    )


def _add_explain_parser(sub: Any) -> None:
    """``explain``: a pipeline, the global batch, its rows, a state and a decoder."""
    exp = sub.add_parser(
        "explain",
        help="which documents made the rows of a global batch",
        formatter_class=_FORMAT,
        description=EXPLAIN_DESCRIPTION,
    )
    exp.add_argument("pipeline", metavar="PIPELINE", nargs="?", help="MODULE:FUNCTION")
    exp.add_argument("--step", type=non_negative, required=True, help="the global batch (0-based)")
    exp.add_argument(
        "--row", type=non_negative, action="append", help="a row to explain (repeat; default all)"
    )
    exp.add_argument("--state", help="a saved loader state at or before --step")
    exp.add_argument(
        "--decode",
        default=None,
        help="how to show tokens as text: 'bytes' (the built-in byte tokenizer; the default for "
        "the demo pipeline) or MODULE:FUNCTION taking a token array",
    )


def _add_pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    """The PIPELINE argument and the built-in pipeline's options (inspect, verify)."""
    parser.add_argument(
        "pipeline",
        metavar="PIPELINE",
        nargs="?",
        default=None,
        help="MODULE:FUNCTION (default: the built-in corpus pipeline of `zephon-jax demo`)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="built-in pipeline only: 60 files per corpus part and rows of 256",
    )
    parser.add_argument(
        "--cache-dir",
        default=None,
        help="built-in pipeline only: where the corpus is cached "
        "($ZEPHON_JAX_CACHE, else ~/.cache/zephon_jax)",
    )


def _load(args, command: str):
    """The pipeline named by ``args.pipeline``, or the built-in one; and its name."""
    if args.pipeline is None:
        name = BUILTIN_NAME + (" (--quick)" if args.quick else "")
        return builtin_pipeline(quick=args.quick, cache_dir=args.cache_dir, stream=sys.stderr), name
    if args.quick or args.cache_dir:
        raise SystemExit(
            f"zephon-jax {command}: --quick and --cache-dir apply to the built-in pipeline only; "
            "drop them or drop PIPELINE"
        )
    return load_pipeline(args.pipeline), args.pipeline


def _cmd_explain(args) -> int:
    if args.pipeline is None:
        cfg = demo.DemoConfig()
        batched = demo.build_pipeline(cfg, demo.corpus_sources(cfg))
        decode = args.decode or "bytes"
    else:
        batched = load_pipeline(args.pipeline)
        decode = args.decode
    decoder = None
    if decode is not None:
        decoder = byte_detokenize if decode == "bytes" else load_callable(decode)
    state = load_state(args.state) if args.state else None
    print(explain(batched, args.step, rows=args.row, state=state, decode=decoder))
    return 0


def _prepare_workers(args) -> int | None:
    """--workers, or its deprecated spelling --num-workers (with a warning)."""
    workers = args.workers
    if args.num_workers is not None:
        print("zephon-jax prepare: --num-workers is deprecated; use --workers", file=sys.stderr)
        if workers is not None and workers != args.num_workers:
            raise SystemExit(
                f"zephon-jax prepare: --workers {workers} and --num-workers {args.num_workers} "
                "disagree; give --workers only"
            )
        workers = args.num_workers
    if args.engine == "beam" and workers == 0:
        raise SystemExit(
            "zephon-jax prepare: --workers 0 (no worker process) is for the local engine; "
            "with --engine beam give 1 or more, or leave it to Beam"
        )
    return workers


def _cmd_prepare(args) -> int:
    from zephon_jax.tools.prepare import PrepareInterrupted, PrepareOptions, prepare

    workers = _prepare_workers(args)
    if args.engine != "beam" and args.beam_args:
        raise SystemExit("zephon-jax prepare: `-- BEAM_OPTIONS` need --engine beam")

    opts = PrepareOptions(
        inputs=tuple(args.inputs),
        output=args.output,
        to=args.to,
        input_format=args.input_format,
        text_field=args.text_field,
        lines=args.lines,
        tokenizer=args.tokenizer,
        dtype=args.dtype,
        compression=None if args.compression == "none" else args.compression,
        append_eos=args.append_eos,
        eos_id=args.eos_id,
        strict=args.strict,
        workers=workers,
        chunk_records=args.chunk_records,
        commit_every=args.commit_every,
        overwrite=args.overwrite,
    )
    stream = None if args.quiet else sys.stderr
    try:
        if args.engine == "beam":
            from zephon_jax.tools.prepare_beam import prepare_beam

            summary = prepare_beam(
                opts, num_workers=workers, pipeline_args=args.beam_args, stream=stream
            )
        else:
            summary = prepare(opts, stream=stream)
    except PrepareInterrupted as e:
        print(f"zephon-jax prepare: {e}", file=sys.stderr)
        return 130
    print(summary.format())
    return 0


def _cmd_inspect(args) -> int:
    batched, name = _load(args, "inspect")
    print(f"pipeline {name}")
    print(describe_plan(batched))
    if args.steps:
        print(format_timing(time_stages(batched, args.steps), batched.global_batch_size))
    return 0


def _cmd_verify(args) -> int:
    resume_at = args.steps // 2 if args.resume_at is None else args.resume_at
    if resume_at and resume_at >= args.steps:
        raise SystemExit(f"zephon-jax verify: --resume-at must be below --steps ({args.steps})")
    try:
        topologies = parse_topologies(args.topologies)
    except PipelineError as e:
        return _usage_error("verify", f"--topologies: {e}")
    batched, name = _load(args, "verify")
    try:
        check_topologies(batched, topologies)
    except PipelineError as e:
        return _usage_error("verify", f"--topologies: {e}")
    print(
        f"verify {name}: {args.steps} global batches of {batched.global_batch_size} rows "
        f"on {', '.join(f'{p}x{w}' for p, w in topologies)}"
        + (f", resume after {resume_at}" if resume_at else "")
    )
    checks = verify(batched, topologies, steps=args.steps, resume_at=resume_at or None)
    print(format_checks(checks))
    return 0 if all(c.identical for c in checks) else 1


def _usage_error(command: str, message: str) -> int:
    print(f"zephon-jax {command}: {message}", file=sys.stderr)
    return 2


COMMANDS = {
    "demo": demo.run_command,
    "prepare": _cmd_prepare,
    "inspect": _cmd_inspect,
    "verify": _cmd_verify,
    "explain": _cmd_explain,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``zephon-jax`` command; returns the exit status."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    beam_args: list[str] = []
    if argv[:1] == ["prepare"] and "--" in argv:  # `prepare ... -- BEAM_PIPELINE_OPTIONS`
        cut = argv.index("--")
        argv, beam_args = argv[:cut], argv[cut + 1 :]
    args = parser.parse_args(argv)
    args.beam_args = beam_args
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return COMMANDS[args.command](args)
    except ZephonError as e:
        print(f"zephon-jax {args.command}: {e}", file=sys.stderr)
        return 1 if args.command != "verify" else 2


if __name__ == "__main__":
    sys.exit(main())
