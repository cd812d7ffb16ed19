"""Computes chosen rows of every global batch from the lanes that own them."""

from __future__ import annotations

import copy
import operator
import time
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from zephon_jax.core.gc_pause import paused_gc
from zephon_jax.core.lineage import Element
from zephon_jax.core.packed import OutputPool, PackedRow, assemble_rows, plain
from zephon_jax.engine.accounting import stage_check
from zephon_jax.engine.exclusion import excluded_keys, excluded_records
from zephon_jax.engine.front_rows import FrontRows
from zephon_jax.engine.lane import Lane, LanePlan, take_lanes
from zephon_jax.engine.provenance import rows_provenance
from zephon_jax.engine.restore import restore_lanes
from zephon_jax.engine.token_rows import RunRow, RunRows
from zephon_jax.errors import PipelineError, RecordError, StateError
from zephon_jax.sampler.resolve import can_end, end_position
from zephon_jax.state.global_state import exclusion_of, lane_bytes
from zephon_jax.state.lane_format import LaneSnapshot, decode_lane_state, encode_lane_state


class Picks(Sequence[tuple[int, Any]]):
    """``(lane, lineage)`` of each row of a batch, the lineages made only when first
    asked for (most batches are never asked).

    It keeps what makes each lineage, not the rows: plain data (tuples of ints and
    arrays, which the garbage collector stops tracking), so that the rows die with
    the batch and what a batch leaves alive does not push the process towards full
    collections (see :mod:`zephon_jax.core.gc_pause`); for rows of column-wise
    placements (``rows``, see :class:`~zephon_jax.engine.token_rows.RunRows`), the
    placements' runs and an array of where each row is in its run."""

    __slots__ = ("_lanes", "_makes", "_values", "_runs", "_pairs")

    def __init__(self, lanes: list[int], elements: list[Element], rows: RunRows | None = None):
        self._lanes = lanes
        self._runs = rows
        # A function per row, or None (the value is the lineage); its arguments, or the
        # lineage.
        self._makes, self._values = ([], []) if rows is not None else _recipes(elements)
        self._pairs: list[tuple[int, Any]] | None = None

    def _list(self) -> list[tuple[int, Any]]:
        pairs = self._pairs
        if pairs is None:
            if self._runs is not None:
                pairs = list(zip(self._lanes, self._runs.lineages()))
            else:
                pairs = [
                    (l, value if make is None else make(*value))
                    for l, make, value in zip(self._lanes, self._makes, self._values)
                ]
            self._pairs = pairs
            self._makes = self._values = []
            self._runs = None
        return pairs

    def __getitem__(self, i: Any) -> Any:
        return self._list()[i]

    def __len__(self) -> int:
        return len(self._lanes)

    def __eq__(self, other: object) -> bool:
        return self._list() == (list(other) if isinstance(other, Sequence) else other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Picks({self._list()!r})"


_DATA = operator.attrgetter("data")
_LINEAGE = operator.attrgetter("lineage")


def _recipes(elements: list[Element]) -> tuple[list, list]:
    """``(makes, values)`` of :class:`Picks`: each element's
    :meth:`~zephon_jax.engine.token_rows.RunRow.recipe`, or ``(None, lineage)`` for a
    plain element (in a pass over all where they all are)."""
    if set(map(type, elements)) == {Element}:
        return [None] * len(elements), list(map(_LINEAGE, elements))
    makes, values = [], []
    for element in elements:
        make, value = element.recipe() if isinstance(element, RunRow) else (None, element.lineage)
        makes.append(make)
        values.append(value)
    return makes, values


def stack_rows(rows: Sequence[Any], pool: OutputPool | None = None) -> Any:
    """Stacks rows (dicts of arrays, or arrays) into a batch with a leading row axis.

    Packed rows still held as pointers are assembled straight into the batch,
    into arrays from ``pool`` when given (see :class:`OutputPool`).
    """
    if type(rows) is RunRows:
        return assemble_rows(rows, pool)
    first = rows[0]
    if isinstance(first, PackedRow):
        if all(issubclass(kind, PackedRow) for kind in set(map(type, rows))):
            return assemble_rows(rows, pool)
    if any(isinstance(row, PackedRow) for row in rows):
        rows = _plain_rows(rows)
        first = rows[0]
    if isinstance(first, Mapping):
        keys = tuple(first)
        for row in rows:
            if tuple(row) != keys:
                raise PipelineError(
                    f"rows of one batch have different fields: {list(keys)} and {list(row)}; "
                    "make every record carry the same fields (e.g. with a map)"
                )
        return {k: _stack_field(k, [row[k] for row in rows]) for k in keys}
    return _stack_field("row", list(rows))


def _plain_rows(rows: Sequence[Any]) -> list:
    """``rows`` with the packed rows among them as plain dicts (as :func:`plain` makes
    them), those of one kind (type, spec, token arrays, transform after pack) assembled by
    one call (one gather, one read of the tokens they point to), not one by one."""
    out = list(rows)
    groups: dict[tuple, list[int]] = {}
    for i, row in enumerate(rows):
        if isinstance(row, PackedRow):
            key = (type(row), id(row.spec), id(getattr(row, "tokens", None)))
            groups.setdefault(key + (id(getattr(row, "training", None)),), []).append(i)
    for at in groups.values():
        if len(at) == 1:
            out[at[0]] = plain(rows[at[0]])
            continue
        batch = assemble_rows([rows[i] for i in at])
        for j, i in enumerate(at):
            out[i] = {k: v[j] for k, v in batch.items()}
    return out


def _stack_field(name: str, values: list) -> np.ndarray:
    try:
        batch = np.array(values)  # like np.stack for equal shapes, and faster
    except ValueError as e:
        shapes = sorted({np.shape(v) for v in values})
        raise PipelineError(
            f"cannot batch field {name!r}: rows have different shapes {shapes[:4]}; batching "
            "needs equal shapes: add .pack(seq_len) for token sequences, or a map that pads "
            "or crops to a fixed length"
        ) from e
    if batch.dtype == object:
        types = sorted({type(v).__name__ for v in values})
        raise PipelineError(
            f"cannot batch field {name!r}: its values are {types} (e.g. {values[0]!r:.60}), not "
            "numbers or numeric arrays; a source or map returned the wrong type: convert records "
            "to numpy arrays with a map (e.g. decode bytes with np.frombuffer)"
        )
    return batch


def encode_snapshots(snapshots: Mapping[int, tuple]) -> dict[int, bytes]:
    """Encodes lane snapshots into lane states."""
    return {l: encode_lane_state(snapshot, l) for l, snapshot in snapshots.items()}


def is_finite(batched) -> bool:
    """Whether the pipeline's input can end (see :func:`~zephon_jax.sampler.resolve.can_end`).

    A mixture with one never-ending component never ends, even if another
    component is read for a finite number of epochs.
    """
    return can_end(batched.sampler)


def _size(batched, size: int | None) -> int:
    if size is not None:
        return size
    if batched.is_ramp:
        raise PipelineError("a batch-size ramp-up needs the size of the step: pass size=")
    return batched.global_batch_size


def checked_rows(batched, rows: Sequence[int], size: int | None = None) -> list[int]:
    """``rows`` as ints, each checked to be a row of a global batch of ``size`` rows."""
    size = _size(batched, size)
    rows = [int(r) for r in rows]
    for r in rows:
        if not 0 <= r < size:
            raise PipelineError(f"row {r} is outside the global batch of {size}")
    return rows


def lanes_to_run(
    batched, rows: Sequence[int], agree_on_end: bool = True, size: int | None = None
) -> list[int]:
    """The lanes a producer of global ``rows`` (of a batch of ``size`` rows) runs.

    Those owning the rows; with a finite input and ``agree_on_end``, every lane:
    the batch at which a finite input ends depends on every lane, so producers
    (processes) that must stop at the same batch without communicating each run
    them all. The sharded loader agrees through jax instead and passes False.
    """
    if agree_on_end and is_finite(batched):
        return list(range(batched.num_lanes))
    per_lane = _size(batched, size) // batched.num_lanes
    return sorted({int(r) // per_lane for r in rows})


RowsOfSize = Callable[[int], Sequence[int]] | Mapping[int, Sequence[int]]


def rows_by_size(batched, rows: Sequence[int] | RowsOfSize) -> dict[int, list[int]]:
    """For every batch size of ``batched``, the global rows a producer makes (checked).

    ``rows`` is a fixed list (a constant batch size), ``rows(size) -> rows`` or a
    mapping ``{size: rows}``.
    """
    if isinstance(rows, Mapping):
        rows = rows.__getitem__
    elif not callable(rows):
        return {_size(batched, None): checked_rows(batched, rows)}
    return {size: checked_rows(batched, rows(size), size) for size in batched.batch_sizes}


class Producer(Protocol):
    """What a loader iterator reads batches from: :class:`RowProducer`, or
    :class:`~zephon_jax.workers.producer.WorkerRowProducer` with worker processes.

    Both produce the same batches and lane states for the same rows.
    """

    def next_batch(self) -> Any:
        """The next batch of the producer's rows, or ``None`` at the end of a finite input."""

    #: Seconds spent so far per stage of making batches (see ``LoaderIterator.metrics``):
    #: ``lanes`` (in-process lanes making rows), ``workers`` (waiting for worker
    #: processes' rows), ``assemble`` (rows into batch arrays).
    stage_seconds: dict[str, float]

    def lane_snapshots(self) -> dict[int, tuple]:
        """Each lane's snapshot right after the last batch returned."""

    def lane_states(self) -> dict[int, bytes]:
        """The snapshots encoded as lane states."""

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continues from ``state``; on an error the producer is unchanged."""

    def close(self) -> None:
        """Releases what the producer holds (worker processes); idempotent."""


class RowProducer:
    """Produces global rows ``rows`` (any subset, in the given order) of each batch.

    ``rows`` is a list of rows, or, for a batch-size ramp-up, a function from a
    batch size to the rows of a batch of that size. Only the lanes owning those
    rows run (see :func:`lanes_to_run` for finite inputs); a lane whose rows are
    split between several producers (processes) runs in each of them, identically.
    """

    def __init__(
        self,
        batched,
        rows: Sequence[int] | RowsOfSize,
        lanes: Sequence[int] | None = None,
        agree_on_end: bool = True,
    ):
        self.batched = batched
        self.plan = LanePlan(batched)
        self._rows = rows_by_size(batched, rows)
        running: set[int] = set()
        for size, size_rows in self._rows.items():
            running.update(
                lanes_to_run(batched, size_rows, agree_on_end if lanes is None else False, size)
            )
        if lanes is not None:
            running.update(lanes)
        self.lane_ids = sorted(running)
        self._lanes: dict[int, Lane] | None = None  # made on first use (see lanes)
        self._picks = {
            size: [(r // (size // batched.num_lanes), r % (size // batched.num_lanes)) for r in rs]
            for size, rs in self._rows.items()
        }
        # The lane of each row of a batch of each size (shared by the Picks, never changed).
        self._pick_lanes = {size: [l for l, _ in picks] for size, picks in self._picks.items()}
        self.step = 0  # the global step produced next
        # Seconds spent making rows in the lanes and assembling them, for metrics().
        self.stage_seconds = {"lanes": 0.0, "assemble": 0.0}
        # Arrays of dropped batches, written again (see OutputPool: never one still in use).
        self.pool = OutputPool()
        # The error that interrupted a batch: the lanes are then part-way through it.
        self._failure: BaseException | None = None
        # (lane, lineage) of each row of the last batch, for provenance.
        self._last: Picks | None = None
        self._stage_check_at = 0  # the next step at which the lanes' accounting looks up
        # the mixture stage (see zephon_jax.engine.accounting.stage_check)
        self._front: FrontRows | None = None  # (see _front_rows)

    @property
    def lanes(self) -> dict[int, Lane]:
        """The lanes this producer runs, by number: made on first use, so that a restore
        right after building (a resumed job) makes them once, not twice."""
        lanes = self._lanes
        if lanes is None:
            lanes = self._lanes = {l: Lane(self.plan, l) for l in self.lane_ids}
        return lanes

    @lanes.setter
    def lanes(self, lanes: dict[int, Lane]) -> None:
        self._lanes = lanes

    @property
    def rows(self) -> list[int]:
        """The rows of the next step's batch."""
        return self.rows_at(self.step)

    def rows_at(self, step: int) -> list[int]:
        """The global rows this producer makes at global step ``step``, in order."""
        return self._rows[self.batched.batch_size_at(step)]

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise RecordError(
                f"this loader failed while producing a batch ({self._failure!r}) and its lanes "
                "stopped part-way through it: continuing or taking its state would skip or "
                "repeat records. Restore a state taken before the failure with "
                "set_state(state), or start a new iterator"
            ) from self._failure

    def next_rows(self) -> Sequence[Any] | None:
        """The data of this producer's rows of the next global batch (None at the end).

        After an error the producer refuses to continue until :meth:`restore`.
        """
        self._check_usable()
        if self.step >= self._stage_check_at:  # a mixture stage begins (accounting)
            self._stage_check_at = stage_check(self.lanes, self.step)
        size = self.batched.batch_size_at(self.step)
        per_lane = size // self.batched.num_lanes
        try:
            # Every lane takes its rows even past the end of a finite input, so the state
            # after the end is the same whichever lanes a producer runs.
            with paused_gc():
                picked, taken = self._take_step(size, per_lane)
        except BaseException as e:
            self._failure = e
            raise
        self.step += 1
        if picked is None:  # a lane's input ended
            self._last = None
            self._undelivered(taken or {})
            return None
        # Rows of column-wise placements: made when read.
        run_rows = picked if type(picked) is RunRows else RunRows.of(picked)
        self._last = Picks(self._pick_lanes[size], picked, run_rows)
        return list(map(_DATA, picked)) if run_rows is None else run_rows

    def _take_step(self, size: int, per_lane: int) -> tuple[Any, dict[int, int] | None]:
        """Each lane's take of its ``per_lane`` rows of the next step (of ``size`` rows):
        this producer's rows of it (elements, or :class:`RunRows`), or, once a lane's
        finite input ended, None and how many rows each lane took."""
        picks = self._picks[size]
        front = self._front_rows()
        if front is not None:  # column-wise lanes: all together (see FrontRows)
            return front.take(per_lane, picks)
        taken = take_lanes(self.lanes, per_lane)
        if None in taken.values():
            return None, {l: len(elements or ()) for l, elements in taken.items()}
        rows: Mapping[int, list[Element]] = taken  # type: ignore[assignment]  # (no None)
        return [rows[l][i] for l, i in picks], None

    def _front_rows(self) -> FrontRows | None:
        """The takes of this producer's lanes where they are column-wise (made for the
        lanes of now: a restore makes new ones), else None."""
        if self.plan.columnar is None:
            return None
        lanes = self.lanes
        front = self._front
        if front is None or front.lanes is not lanes:
            front = self._front = FrontRows(lanes)
        return front

    def skip_rows(self) -> bool:
        """Passes over the next global batch: the lanes make their rows of it, which are
        neither returned nor counted as delivered; each lane counts a skipped step. False
        (nothing skipped) once a finite input ends."""
        self._check_usable()
        if self.step >= self._stage_check_at:
            self._stage_check_at = stage_check(self.lanes, self.step)
        size = self.batched.batch_size_at(self.step)
        try:
            with paused_gc():
                taken = take_lanes(self.lanes, size // self.batched.num_lanes)
        except BaseException as e:
            self._failure = e
            raise
        self.step += 1
        self._last = None
        if any(elements is None for elements in taken.values()):
            self._undelivered({l: len(elements or ()) for l, elements in taken.items()})
            return False
        for l, lane in self.lanes.items():
            lane.tally.skipped(len(taken[l] or ()), len(lane.pending))
        return True

    def _undelivered(self, taken: Mapping[int, int]) -> None:
        """The rows lanes took (``taken``: how many each) for a batch that could not be
        completed (a finite input ended) are not delivered: their accounting passes over
        them."""
        for l, count in taken.items():
            if count:
                lane = self.lanes[l]
                lane.tally.undelivered(count, len(lane.pending))

    def last_picks(self) -> Picks | None:
        """``(lane, lineage)`` of each row of the last batch (None before the first)."""
        return self._last

    def provenance(self) -> list[list[dict]]:
        """The documents behind each row of the last batch (see :mod:`zephon_jax.engine.provenance`)."""
        if self._last is None:
            raise PipelineError(
                "provenance() describes the last batch returned, and there is none yet (or the "
                "input ended): call next() first"
            )
        return rows_provenance(self.plan, self._last, self.lanes)

    def next_batch(self) -> Any:
        seconds = self.stage_seconds
        with paused_gc():  # one pause for the rows and their assembly
            started = time.perf_counter()
            rows = self.next_rows()
            made = time.perf_counter()
            seconds["lanes"] += made - started
            if rows is None:
                return None
            try:
                batch = stack_rows(rows, self.pool)
            except BaseException as e:
                self._failure = e
                raise
            # Freed inside the pause: the collection its end may start would walk them.
            del rows
            seconds["assemble"] += time.perf_counter() - made
            return batch

    def lane_snapshots(self) -> dict[int, tuple]:
        """Each lane's :meth:`~zephon_jax.engine.lane.Lane.snapshot` (cheap; encode on demand)."""
        self._check_usable()
        with paused_gc():
            return {l: lane.snapshot() for l, lane in self.lanes.items()}

    def lane_states(self) -> dict[int, bytes]:
        return encode_snapshots(self.lane_snapshots())

    def close(self) -> None:
        """Nothing to release in-process."""

    def check_state(self, state: Mapping[str, Any]) -> dict[int, LaneSnapshot]:
        """The snapshot of every lane this producer runs, from ``state``, checked (a
        StateError naming the entry if one is malformed or missing); nothing changes."""
        with paused_gc():
            return {
                l: decode_lane_state(
                    l,
                    lane_bytes(state, l),
                    self.plan.num_operators,
                    self._end_position(l),
                    self.plan.can_end,
                )
                for l in self.lane_ids
            }

    def _end_position(self, lane: int) -> int | None:
        return end_position(self.plan.sampler, lane, self.plan.num_lanes)

    def restore(
        self, state: Mapping[str, Any], checked: Mapping[int, LaneSnapshot] | None = None
    ) -> None:
        """Restores every lane from ``state`` (``checked``: what :meth:`check_state` made
        of it), all lanes together (see :func:`~zephon_jax.engine.restore.restore_lanes`); on any
        error the producer is unchanged."""
        snapshots = self.check_state(state) if checked is None else checked
        plan = copy.copy(self.plan)  # this one's lanes go on if the restore fails
        plan.excluded = excluded_records(plan.leaf_labels, exclusion_of(state))
        plan.excluded_keys = excluded_keys(plan.excluded)
        lanes = {l: Lane(plan, l) for l in self.lane_ids}
        restore_lanes(list(lanes.values()), [snapshots[l] for l in lanes], read_ahead=True)
        steps = {lane.step for lane in lanes.values()}
        if len(steps) > 1:
            raise StateError(
                f"the state's lanes are at different steps {sorted(steps)}; merge states taken "
                "after the same global batch"
            )
        self.plan = plan
        self.lanes = lanes
        self._stage_check_at = 0
        self.step = steps.pop() if steps else int(state["step"])
        self._failure = None
        self._last = None
