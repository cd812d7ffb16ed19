"""``zephon-jax verify``: check that a pipeline gives the same global batches on every topology.

A *topology* is ``PxW``: ``P`` processes (simulated in this Python process with
``process_index``/``process_count``; their rows of each batch are concatenated
in process order into the global batch) times ``W`` loader workers per process.
The reference is an uninterrupted run on one process without workers. For every
topology the check compares ``steps`` global batches with the reference, bit
for bit, and then a resume: the states of all processes after ``resume_at``
batches are merged and restored on the *next* topology of the list (the last
one restores on the first), which must continue with the reference's batches.

Topologies are checked before anything runs (:func:`check_topologies`): each
process holds the same number of rows, so the process count must divide the
global batch size. A difference names the first differing step, row and field.
Its usual cause is a user function or operator that is not a pure function of
its input (randomness outside ``random_map``, a global counter, the time, the
process id), which the guarantee rules out.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Sequence

import numpy as np

from zephon_jax.dataset import BatchedDataset
from zephon_jax.errors import PipelineError, ZephonError
from zephon_jax.loader import Loader
from zephon_jax.state.global_state import merge_states


def parse_topologies(text: str) -> list[tuple[int, int]]:
    """``"1x0,2x1,4x2"`` -> ``[(1, 0), (2, 1), (4, 2)]`` (processes x workers)."""
    out = []
    for item in text.split(","):
        item = item.strip()
        m = re.fullmatch(r"(\d+)(?:x(\d+))?", item)
        if not m or int(m.group(1)) < 1:
            raise PipelineError(
                f"topology {item!r} is not PROCESSESxWORKERS (e.g. 2x1; workers may be 0 or "
                "omitted): give a comma-separated list like 1x0,2x1,4x2"
            )
        out.append((int(m.group(1)), int(m.group(2) or 0)))
    if not out:
        raise PipelineError("give at least one topology, e.g. --topologies 1x0,2x0")
    return out


def check_topologies(batched: BatchedDataset, topologies: Sequence[tuple[int, int]]) -> None:
    """Raises :class:`PipelineError` naming every topology that cannot hold the batch."""
    sizes = batched.batch_sizes
    size = math.gcd(*sizes)  # every step's size must split evenly over the processes
    bad = [(p, w) for p, w in topologies if size % p]
    if bad:
        fits = [p for p in range(1, size + 1) if size % p == 0]
        names = ", ".join(f"{p}x{w}" for p, w in bad)
        held = f"{size} rows" if len(sizes) == 1 else f"{list(sizes)} rows (a ramp)"
        raise PipelineError(
            f"topology {names} cannot hold a global batch of {held}: every process holds "
            f"the same number of rows, so the process count must divide {size}; use "
            f"{', '.join(map(str, fits))} processes"
        )


def workers_available() -> bool:
    """Whether this zephon_jax has loader worker processes."""
    import importlib.util

    return importlib.util.find_spec("zephon_jax.workers.producer") is not None


@dataclasses.dataclass(frozen=True)
class Difference:
    """Where two runs first differ."""

    step: int
    row: int | None
    field: str | None
    detail: str

    def __str__(self) -> str:
        where = f"step {self.step}"
        if self.row is not None:
            where += f", row {self.row}"
        if self.field is not None:
            where += f", field {self.field!r}"
        return f"{where}: {self.detail}"


@dataclasses.dataclass(frozen=True)
class Check:
    """One comparison against the reference."""

    name: str
    first_step: int
    steps: int
    difference: Difference | None
    note: str = ""
    error: str | None = None

    @property
    def identical(self) -> bool:
        return self.difference is None and self.error is None


class _Topology:
    """``processes`` loaders of one pipeline, stepped together into global batches."""

    def __init__(self, batched: BatchedDataset, processes: int, workers: int):
        self.iterators = []
        try:
            for p in range(processes):
                loader = Loader(
                    batched, process_index=p, process_count=processes, num_workers=workers
                )
                self.iterators.append(iter(loader))
        except BaseException:
            self.close()
            raise

    def next_global(self) -> Any:
        parts = []
        for it in self.iterators:
            part = next(it, None)
            if part is None:
                return None
            parts.append(part)
        return concat_batches(parts)

    def states(self) -> list[dict]:
        return [it.get_state() for it in self.iterators]

    def restore(self, state) -> None:
        for it in self.iterators:
            it.set_state(state)

    def close(self) -> None:
        for it in self.iterators:
            close = getattr(it, "close", None)
            if close is not None:
                close()


def concat_batches(parts: Sequence[Any]) -> Any:
    """The processes' batches concatenated in process order (dicts of arrays, or arrays)."""
    if isinstance(parts[0], dict):
        return {k: np.concatenate([np.asarray(p[k]) for p in parts]) for k in parts[0]}
    return np.concatenate([np.asarray(p) for p in parts])


def compare_batches(step: int, got: Any, want: Any) -> Difference | None:
    """The first row and field where two global batches differ (None if identical)."""
    if got is None or want is None:
        if got is None and want is None:
            return None
        ended = "the run" if got is None else "the reference"
        return Difference(step, None, None, f"{ended} ended earlier")
    if isinstance(want, dict):
        if set(got) != set(want):
            return Difference(step, None, None, f"fields {sorted(got)} vs {sorted(want)}")
        fields = sorted(want)
        pairs = [(f, np.asarray(got[f]), np.asarray(want[f])) for f in fields]
    else:
        pairs = [(None, np.asarray(got), np.asarray(want))]
    first: Difference | None = None
    for field, a, b in pairs:
        if a.shape != b.shape or a.dtype != b.dtype:
            d = Difference(step, None, field, f"{a.dtype}{a.shape} vs {b.dtype}{b.shape}")
        else:
            rows = np.flatnonzero(
                ~np.all((a == b).reshape(len(a), -1), axis=1) if a.ndim else np.array([a != b])
            )
            if not rows.size:
                continue
            d = Difference(step, int(rows[0]), field, "values differ")
        if first is None or (d.row is not None and (first.row is None or d.row < first.row)):
            first = d
    return first


def _run(topo: _Topology, steps: int) -> list[Any]:
    out = []
    for _ in range(steps):
        batch = topo.next_global()
        out.append(batch)
        if batch is None:
            break
    return out


def _compare(name: str, got: list, want: list, first_step: int, note: str = "") -> Check:
    for i, (a, b) in enumerate(zip(got, want)):
        diff = compare_batches(first_step + i, a, b)
        if diff is not None:
            return Check(name, first_step, len(want), diff, note)
    return Check(name, first_step, len(want), None, note)


def verify(
    batched: BatchedDataset,
    topologies: Sequence[tuple[int, int]],
    *,
    steps: int = 20,
    resume_at: int | None = None,
) -> list[Check]:
    """Runs ``batched`` on every topology and a resume across them; see the module doc."""
    if steps < 1:
        raise PipelineError(f"steps must be >= 1; got {steps}")
    if resume_at is not None and not 0 < resume_at < steps:
        raise PipelineError(f"resume_at must be in [1, steps); got {resume_at} with steps={steps}")
    check_topologies(batched, topologies)
    note = ""
    if any(w for _, w in topologies) and not workers_available():
        note = "this zephon_jax has no loader workers: ran with 0 workers"
        topologies = [(p, 0) for p, _ in topologies]
    reference_topo = _Topology(batched, 1, 0)
    try:
        reference = _run(reference_topo, steps)
    finally:
        reference_topo.close()
    checks = []
    for procs, workers in topologies:
        name = f"{procs}x{workers}"
        checks.append(
            _guarded(
                name,
                0,
                steps,
                note,
                lambda p=procs, w=workers, n=name: _compare(
                    n, _run_topology(batched, p, w, steps), reference, 0, note
                ),
            )
        )
    if resume_at is not None:
        for i, (procs, workers) in enumerate(topologies):
            to = topologies[(i + 1) % len(topologies)]
            name = f"{procs}x{workers} @{resume_at} -> {to[0]}x{to[1]}"
            checks.append(
                _guarded(
                    name,
                    resume_at,
                    steps - resume_at,
                    note,
                    lambda p=procs, w=workers, t=to, n=name: _compare(
                        n,
                        _resumed(batched, (p, w), t, resume_at, steps),
                        reference[resume_at:],
                        resume_at,
                        note,
                    ),
                )
            )
    return checks


def _guarded(name: str, first_step: int, steps: int, note: str, fn) -> Check:
    try:
        return fn()
    except ZephonError as e:
        return Check(name, first_step, steps, None, note, error=f"{type(e).__name__}: {e}")


def _run_topology(batched, procs: int, workers: int, steps: int) -> list:
    topo = _Topology(batched, procs, workers)
    try:
        return _run(topo, steps)
    finally:
        topo.close()


def _resumed(batched, source: tuple[int, int], target: tuple[int, int], resume_at: int, steps: int):
    topo = _Topology(batched, *source)
    try:
        _run(topo, resume_at)
        state = merge_states(topo.states())
    finally:
        topo.close()
    topo = _Topology(batched, *target)
    try:
        topo.restore(state)
        return _run(topo, steps - resume_at)
    finally:
        topo.close()


def format_checks(checks: Sequence[Check]) -> str:
    out = [f"  {'run':<28} {'steps':>9}  result"]
    for c in checks:
        span = f"{c.first_step}-{c.first_step + c.steps - 1}"
        if c.error is not None:
            result = f"FAILED: {c.error}"
        else:
            result = "identical" if c.identical else f"DIFFERS at {c.difference}"
        out.append(f"  {c.name:<28} {span:>9}  {result}")
    notes = sorted({c.note for c in checks if c.note})
    out.extend(f"  note: {n}" for n in notes)
    differ = [c for c in checks if c.difference is not None]
    failed = [c for c in checks if c.error is not None]
    if differ:
        out.append(
            f"{len(differ)} of {len(checks)} runs differ from the reference (1 process, no "
            "workers, uninterrupted): a user function or operator is probably not a pure "
            "function of its input (global randomness, a counter, time or process ids)"
        )
    if failed:
        out.append(f"{len(failed)} of {len(checks)} runs failed with the error shown")
    if not differ and not failed:
        out.append(f"all {len(checks)} runs are identical to the reference, bit for bit")
    return "\n".join(out)
