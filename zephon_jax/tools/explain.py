"""``zephon-jax explain``: the documents behind the rows of a global batch, as text."""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np

from zephon_jax.engine.accounting_report import accounting
from zephon_jax.engine.explain import explain_step
from zephon_jax.engine.provenance import Segment
from zephon_jax.state.global_state import exclusion_of

PREVIEW_CHARS = 60


def record_text(record: Any, decode: Callable[[Any], str] | None) -> str | None:
    """Readable text of a record: its ``text`` (or first string) field, else its decoded tokens."""
    if isinstance(record, str):
        return record
    if isinstance(record, bytes):
        return record.decode("utf-8", errors="replace")
    if isinstance(record, dict):
        text = record.get("text")
        if isinstance(text, str):
            return text
        for value in record.values():
            if isinstance(value, str):
                return value
        tokens = record.get("tokens")
        if decode is not None and tokens is not None:
            return decode(np.asarray(tokens))
    return None


def segment_text(dataset: Any, segment: Segment, decode: Callable[[Any], str] | None) -> str | None:
    """The first characters of the slice a segment holds, when its source can show text.

    A record's token slice is decoded with ``decode``; otherwise the record's
    text field is shown from its beginning.
    """
    if segment["source"] is None:
        return None
    from zephon_jax.sampler.resolve import leaves

    source = leaves(dataset.sampler)[segment["source"]].source
    record = source[segment["record"]]
    if isinstance(record, dict) and "tokens" in record and decode is not None:
        tokens = np.asarray(record["tokens"])[segment["start"] or 0 : segment["stop"]]
        text: str | None = decode(tokens)
    else:
        text = record_text(record, decode)
    if text is None:
        return None
    return text[:PREVIEW_CHARS] + ("..." if len(text) > PREVIEW_CHARS else "")


def format_segment(k: int, segment: Segment, text: str | None) -> str:
    where = (
        f"output {segment['output']}"
        if "output" in segment
        else f"[{segment['start']}:{'' if segment['stop'] is None else segment['stop']}]"
    )
    if segment["source"] is None:
        line = f"  segment {k + 1}: an output of a user operator that keeps no pointers"
    else:
        line = (
            f"  segment {k + 1}: source {segment['source']} ({segment['label']}), record "
            f"{segment['record']}, epoch {segment['epoch']}, slice {where}"
        )
    return line + (f"\n      {text!r}" if text is not None else "")


def explain(
    dataset: Any,
    step: int,
    rows: Sequence[int] | None = None,
    state: dict | None = None,
    decode: Callable[[Any], str] | None = None,
) -> str:
    """The report ``zephon-jax explain`` prints for global batch ``step``."""
    started = time.perf_counter()
    provenance = explain_step(dataset, step, state=state, rows=rows)
    seconds = time.perf_counter() - started
    size = dataset.batch_size_at(int(step))
    rows = list(range(size)) if rows is None else list(rows)
    origin = f"from the state at step {int(state['step'])}" if state is not None else "from step 0"
    report = accounting(state, dataset) if state is not None else None
    if report is not None and report["skipped"]:  # the run passed over batches: say so
        skipped = report["skipped"]
        origin += f", a run that skipped {skipped} batch{'es' if skipped != 1 else ''}"
    excluded = len(exclusion_of(state)) if state is not None else 0
    if excluded:  # documents dropped from the state's step on (zephon_jax.exclude)
        origin += f", {excluded} document{'s' if excluded != 1 else ''} excluded"
    lines = [
        f"global batch {step} (0-based), {len(rows)} of {size} rows, "
        f"computed {origin} in {seconds:.2f} s"
    ]
    for row, segments in zip(rows, provenance):
        lines.append(f"row {row}: {len(segments)} segment{'s' if len(segments) != 1 else ''}")
        for k, segment in enumerate(segments):
            lines.append(format_segment(k, segment, segment_text(dataset, segment, decode)))
    if report is not None:
        lines += format_accounting(report)
    return "\n".join(lines)


def format_accounting(report: dict) -> list[str]:
    """The lines of an accounting report (see :func:`zephon_jax.accounting`)."""
    lines = [
        f"the state's accounting: {report['steps']} batches delivered, {report['skipped']} "
        f"skipped, to step {report['step']}"
    ]
    for key, f in report["sources"].items():
        epoch = "none" if f["epoch"] is None else f["epoch"]
        lines.append(
            f"  source {f['source']} ({key}): {f['tokens']} tokens, {f['segments']} segments, "
            f"{f['documents']} documents, epoch {epoch}"
        )
    for stage in report["stages"]:
        shares = ", ".join(
            f"{share:.3f} (weight {weight:g})"
            for share, weight in zip(stage["shares"], stage["weights"])
        )
        lines.append(f"  stage from step {stage['start']}: token shares {shares}")
    return lines
