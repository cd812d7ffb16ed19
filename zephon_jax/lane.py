"""One lane: sampler -> transforms -> operators, run sequentially with its own carry.

A lane's state is its next sampler position, each operator's carry and the
finished rows not yet batched, all written as lineages. Restoring regenerates
every element a state points to (reading those records again, in one batched
read per source) and continues exactly where the state left off.
"""

from __future__ import annotations

import collections
import zlib
from typing import Any, Sequence

import numpy as np

from zephon_jax import codec
from zephon_jax.element import Element, Opaque, root_position
from zephon_jax.errors import PipelineError, RecordError, StateError, ZephonError
from zephon_jax.operators.packing import plain as plain_record
from zephon_jax.provenance import leaf_labels
from zephon_jax.sampler.resolve import end_position, leaf_paths, leaves, resolve
from zephon_jax.sampler.source import source_label
from zephon_jax.transforms import DROP

_END = object()
_SKIP = object()  # a position whose source is past its epochs while another is not
# 2: lane bytes end with a CRC-32 of the encoded state, so corruption is detected.
LANE_FORMAT = 2
# Records a lane reads ahead per block: larger blocks cost less per record; the bound
# on all lanes together keeps memory per lane small when a process runs many lanes.
_MAX_AHEAD = 256
_MAX_AHEAD_ALL_LANES = 65536
_LOCATED_BLOCKS = 4  # about 1,000 positions, 25 KB


class LanePlan:
    """The parts of a batched dataset a lane needs, shared by all lanes of a process."""

    def __init__(self, batched):
        self.num_lanes = batched.num_lanes
        self.sampler = batched.sampler
        self.leaves = leaves(self.sampler)
        self.leaf_transforms = leaf_paths(self.sampler)
        self.leaf_labels = leaf_labels(self.leaves)
        self.operators = [stage.operator for stage in batched.stages]
        self.post_transforms = [stage.transforms for stage in batched.stages]
        self.num_operators = len(self.operators)
        # A lane whose filters drop this many records in a row would likely wait forever.
        self.max_dropped_in_a_row = 16 * sum(leaf.size for leaf in self.leaves) + 100_000
        self.max_ahead = max(64, min(_MAX_AHEAD, _MAX_AHEAD_ALL_LANES // self.num_lanes))


class _TransformFailed(Exception):
    """A user transform raised; ``name`` says which (the cause is chained)."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


def apply_transforms(transforms, data, lane: int, stage: int, lineage) -> Any:
    """Applies per-record transforms in order; returns ``DROP`` if a filter drops it.

    A transform that raises is reported as ``_TransformFailed`` naming it, with
    the original exception chained. Packed rows reach user functions as plain dicts.
    """
    if transforms:
        data = plain_record(data)
    for transform in transforms:
        try:
            data = transform.apply(data, (lane, stage, lineage))
        except ZephonError:
            raise
        except Exception as e:
            raise _TransformFailed(transform.describe()) from e
        if data is DROP:
            return DROP
    return data


def _user_error(what: str, where: str, e: BaseException) -> RecordError:
    """A RecordError for a failed user function, chaining the original exception."""
    cause = e.__cause__ if isinstance(e, _TransformFailed) else e
    error = RecordError(
        f"{what} raised {cause!r} on {where}. The original traceback is chained above "
        "(__cause__); fix the function or the record, then restore the state taken "
        "before the failure to continue"
    )
    error.__cause__ = cause
    return error


def encode_lane_state(snapshot: tuple) -> bytes:
    """A :meth:`Lane.snapshot` as compact bytes, ending with a CRC-32 of the rest."""
    data = codec.encode(snapshot)
    return data + zlib.crc32(data).to_bytes(4, "little")


class Lane:
    """Runs one lane of a pipeline; ``take(n)`` returns its next ``n`` rows."""

    def __init__(self, plan: LanePlan, lane: int):
        self.plan = plan
        self.lane = lane
        self.next_position = 0
        self.input_done = False
        self.carries = [op.init(lane) for op in plan.operators]
        self.pending: collections.deque[Element] = collections.deque()
        self._ahead: collections.deque = collections.deque()
        self._ahead_size = 8
        self._dropped_in_a_row = 0
        self.end_position = end_position(plan.sampler, lane, plan.num_lanes)
        # The last blocks of positions read and where they read from, for provenance.
        self._located: collections.deque = collections.deque(maxlen=_LOCATED_BLOCKS)

    # ----- reading the sampler -----------------------------------------------------
    def read_roots(self, positions: np.ndarray) -> list:
        """Elements at lane-local ``positions``: Element, ``DROP`` (filtered), ``_SKIP``
        (skipped) or ``_END`` (at or past the lane's end position)."""
        plan = self.plan
        res = resolve(plan.sampler, self.lane, positions, plan.num_lanes)
        if len(positions):
            self._located.append((int(positions[0]), int(positions[-1]), positions, res))
        end = self.end_position
        out: list = [_SKIP if end is None or p < end else _END for p in positions.tolist()]
        valid = np.flatnonzero(res.valid)
        for leaf_id in np.unique(res.leaf[valid]):
            where = valid[res.leaf[valid] == leaf_id]
            source = plan.leaves[leaf_id].source
            records = res.record[where].tolist()
            try:
                getitems = getattr(source, "__getitems__", None)
                datas = getitems(records) if getitems else [source[r] for r in records]
            except Exception as e:
                raise RecordError(
                    f"lane {self.lane}: reading records {records[:8]}"
                    f"{'...' if len(records) > 8 else ''} (lane-local positions "
                    f"{positions[where[:8]].tolist()}) from source {source_label(source)} "
                    f"failed: {e!r}. Check that the source's files exist, are readable and "
                    "intact (the original error is chained as __cause__)"
                ) from e
            if len(datas) != len(records):
                raise RecordError(
                    f"lane {self.lane}: source {source_label(source)} returned {len(datas)} "
                    f"records for {len(records)} indices from __getitems__; it must return one "
                    "record per index, in order"
                )
            transforms = plan.leaf_transforms[leaf_id]
            for i, record, data in zip(where.tolist(), records, datas):
                position = int(positions[i])
                if transforms:
                    try:
                        data = apply_transforms(transforms, data, self.lane, 0, position)
                    except _TransformFailed as e:
                        raise _user_error(
                            e.name,
                            f"lane {self.lane}, lane-local position {position}, source "
                            f"{source_label(source)}, record {record}",
                            e,
                        ) from e.__cause__
                out[i] = data if data is DROP else Element(data, position)
        return out

    def locate(self, positions: Sequence[int]) -> list[tuple[int, int, int]]:
        """(leaf, record, epoch) of each lane-local position in ``positions``.

        Positions read recently are found in the blocks this lane resolved when
        it read them; others are resolved again (the sampler is a pure function).
        """
        out: list = [None] * len(positions)
        missing = []
        for i, p in enumerate(positions):
            for first, last, read, res in reversed(self._located):  # newest first
                if not first <= p <= last:
                    continue
                j = p - first
                if j >= len(read) or read[j] != p:  # not contiguous (a restore's reads)
                    j = int(np.searchsorted(read, p))
                    if read[j] != p:
                        continue
                out[i] = (int(res.leaf[j]), int(res.record[j]), int(res.epoch[j]))
                break
            else:
                missing.append(i)
        if missing:
            plan = self.plan
            where = np.array([positions[i] for i in missing], np.int64)
            res = resolve(plan.sampler, self.lane, where, plan.num_lanes)
            for k, i in enumerate(missing):
                out[i] = (int(res.leaf[k]), int(res.record[k]), int(res.epoch[k]))
        return out

    def where(self, lineage) -> str:
        """Where an element comes from: lane, lane-local position, source and record."""
        position = root_position(lineage)
        text = f"lane {self.lane}, element {lineage!r}"
        if position is None:
            return text + " (an output of a user operator)"
        plan = self.plan
        res = resolve(plan.sampler, self.lane, np.array([position], np.int64), plan.num_lanes)
        source = plan.leaves[int(res.leaf[0])].source
        return (
            f"{text} (from lane-local position {position}: source {source_label(source)}, "
            f"record {int(res.record[0])}, epoch {int(res.epoch[0])})"
        )

    def _read_ahead(self) -> None:
        """Reads the next block of positions (growing blocks, up to ``plan.max_ahead``)."""
        start = self.next_position
        count = self._ahead_size
        self._ahead_size = min(self.plan.max_ahead, self._ahead_size * 2)
        self._ahead.extend(self.read_roots(np.arange(start, start + count, dtype=np.int64)))

    # ----- running operators --------------------------------------------------------
    def _push(self, stage: int, elements) -> None:
        plan = self.plan
        if stage == plan.num_operators:
            self.pending.extend(elements)
            return
        op = plan.operators[stage]
        post = plan.post_transforms[stage]
        last = stage + 1 == plan.num_operators and not post
        for element in elements:
            try:
                carry, outputs = op.step(self.carries[stage], element)
            except PipelineError as e:
                raise PipelineError(f"{e}\n  (at {self.where(element.lineage)})") from e
            except ZephonError:
                raise
            except Exception as e:
                raise _user_error(op.describe(), self.where(element.lineage), e) from e
            self.carries[stage] = carry
            if not outputs:
                continue
            if last:
                self.pending.extend(outputs)
            else:
                self._push(stage + 1, self._post(stage, post, outputs))

    def _post(self, stage: int, post, outputs) -> list[Element]:
        if not post:
            return outputs
        kept = []
        for element in outputs:
            try:
                data = apply_transforms(post, element.data, self.lane, stage + 1, element.lineage)
            except _TransformFailed as e:
                raise _user_error(
                    f"{e.name} after {self.plan.operators[stage].describe()}",
                    self.where(element.lineage),
                    e,
                ) from e.__cause__
            if data is not DROP:
                kept.append(Element(data, element.lineage))
        return kept

    def _finish_input(self) -> None:
        self.input_done = True
        for stage, op in enumerate(self.plan.operators):
            try:
                carry, outputs = op.flush(self.carries[stage])
            except ZephonError:
                raise
            except Exception as e:
                raise _user_error(f"{op.describe()}.flush", f"lane {self.lane}", e) from e
            self.carries[stage] = carry
            if outputs:
                self._push(stage + 1, self._post(stage, self.plan.post_transforms[stage], outputs))

    def take(self, n: int) -> list[Element] | None:
        """The next ``n`` rows of this lane, or ``None`` once a finite input is exhausted."""
        pending, ahead, push = self.pending, self._ahead, self._push
        while len(pending) < n:
            if self.input_done:
                return None
            if not ahead:
                self._read_ahead()
            item = ahead.popleft()
            if item is _END:  # the position is not consumed
                self._finish_input()
                continue
            self.next_position += 1
            if item is _SKIP:
                continue
            if item is DROP:
                self._dropped_in_a_row += 1
                if self._dropped_in_a_row > self.plan.max_dropped_in_a_row:
                    self._raise_all_dropped()
            else:
                self._dropped_in_a_row = 0
                push(0, (item,))
        return [pending.popleft() for _ in range(n)]

    def _raise_all_dropped(self) -> None:
        count = self._dropped_in_a_row
        first = self.next_position - count
        total = sum(leaf.size for leaf in self.plan.leaves)
        raise RecordError(
            f"lane {self.lane}: the filters dropped all of the last {count} records it read "
            f"(lane-local positions {first}..{self.next_position - 1}, {count / total:.0f}x "
            "the size of the sources); the loader would wait forever for a record. Check the "
            "filter predicates (a field renamed? a threshold inverted?) and the sources"
        )

    # ----- state -------------------------------------------------------------------
    def snapshot(self) -> tuple:
        """This lane's position, carries and unbatched rows as immutable plain data.

        Cheap (no encoding): take one per batch, encode with :func:`encode_lane_state`
        only when a state is asked for.
        """
        carries = tuple(op.carry_to_plain(c) for op, c in zip(self.plan.operators, self.carries))
        pending = tuple(e.lineage for e in self.pending)
        return (LANE_FORMAT, self.next_position, self.input_done, carries, pending)

    def get_state(self) -> bytes:
        """This lane's position, carries and unbatched rows, as compact bytes."""
        return encode_lane_state(self.snapshot())

    def set_state(self, data: bytes) -> None:
        """Restores a state made by :meth:`get_state` (regenerating what it points to)."""
        data = bytes(data)
        body, checksum = data[:-4], data[-4:]
        if len(data) < 5 or zlib.crc32(body).to_bytes(4, "little") != checksum:
            _check_lane_format(self.lane, data)
            raise StateError(
                f"lane {self.lane}: corrupt state bytes (checksum mismatch over "
                f"{len(data)} bytes); the state was truncated or altered after it was taken: "
                "restore from an intact checkpoint"
            )
        value = codec.decode(body)
        if not (isinstance(value, tuple) and len(value) == 5 and value[0] == LANE_FORMAT):
            raise _format_error(self.lane, value)
        _, next_position, input_done, carries, pending = value
        if len(carries) != len(self.plan.operators):
            raise StateError(
                f"lane {self.lane}: the state has {len(carries)} operator carries, the pipeline "
                f"{len(self.plan.operators)} operators"
            )
        rebuild = _Rebuilder(self)
        rebuild.prefetch(carries, pending)
        self.next_position = next_position
        self.input_done = input_done
        self.carries = [
            op.carry_from_plain(plain, self.lane, rebuild.at(stage))
            for stage, (op, plain) in enumerate(zip(self.plan.operators, carries))
        ]
        final = len(self.plan.operators)
        self.pending = collections.deque(rebuild.at(final)(lin) for lin in pending)
        self._ahead.clear()
        self._ahead_size = 8


def _format_error(lane: int, value) -> StateError:
    found = value[0] if isinstance(value, tuple) and value else value
    return StateError(
        f"lane {lane}: unrecognized lane state (lane format {found!r}, this zephon_jax reads "
        f"{LANE_FORMAT}); it was written by another zephon_jax version: restore it with the "
        "release that wrote it"
    )


def _check_lane_format(lane: int, data: bytes) -> None:
    """Raises a version error if ``data`` is an intact lane state of another format."""
    try:
        value = codec.decode(data)
    except StateError:
        return
    if isinstance(value, tuple) and value and isinstance(value[0], int) and value[0] != LANE_FORMAT:
        raise _format_error(lane, value)


class _Rebuilder:
    """Regenerates elements from lineages, reading every needed record in one batch."""

    def __init__(self, lane: Lane):
        self.lane = lane
        self.roots: dict[int, Any] = {}
        self.cache: dict = {}

    def _collect(self, stage: int, lineage, out: set) -> None:
        if stage == 0:
            out.add(int(lineage))
            return
        if isinstance(lineage, Opaque):
            return
        for parent in self.lane.plan.operators[stage - 1].parents(lineage):
            self._collect(stage - 1, parent, out)

    def prefetch(self, carries, pending) -> None:
        operators = self.lane.plan.operators
        positions: set[int] = set()
        for stage, (op, plain) in enumerate(zip(operators, carries)):
            for lineage in op.carry_lineages(plain) if plain is not None else ():
                self._collect(stage, lineage, positions)
        for lineage in pending:
            self._collect(len(operators), lineage, positions)
        if positions:
            ordered = np.array(sorted(positions), dtype=np.int64)
            for position, item in zip(ordered.tolist(), self.lane.read_roots(ordered)):
                self.roots[position] = item

    def at(self, stage: int):
        return lambda lineage: self.build(stage, lineage)

    def build(self, stage: int, lineage) -> Element:
        key = (stage, lineage) if not _has_opaque(lineage) else None
        if key is not None and key in self.cache:
            return self.cache[key]
        lane = self.lane
        if stage == 0:
            position = int(lineage)
            item = self.roots.get(position)
            if item is None:
                item = lane.read_roots(np.array([position], dtype=np.int64))[0]
            if not isinstance(item, Element):
                raise StateError(
                    f"lane {lane.lane}: the state points to lane-local position {position}, which "
                    "the pipeline no longer produces (filtered or past the last epoch); the "
                    "sources or functions changed since the state was taken"
                )
            element = item
        else:
            op = lane.plan.operators[stage - 1]
            post = lane.plan.post_transforms[stage - 1]
            try:
                data = op.regenerate(lineage, self.at(stage - 1))
                data = apply_transforms(post, data, lane.lane, stage, lineage)
            except ZephonError:
                raise
            except Exception as e:
                raise _user_error(
                    f"regenerating {op.describe()} output (restoring a state)",
                    lane.where(lineage),
                    e,
                ) from (e.__cause__ if isinstance(e, _TransformFailed) else e)
            if data is DROP:
                raise StateError(
                    f"lane {lane.lane}: element {lineage!r} is now dropped by a filter after "
                    f"{op.describe()}; the pipeline's functions are not pure or changed"
                )
            element = Element(data, lineage)
        if key is not None:
            self.cache[key] = element
        return element


def _has_opaque(lineage) -> bool:
    if isinstance(lineage, Opaque):
        return True
    if isinstance(lineage, tuple):
        return any(_has_opaque(x) for x in lineage)
    return False
