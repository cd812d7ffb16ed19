"""One lane: sampler -> transforms -> operators, run sequentially with its own carry.

A lane's state is its next sampler position, each operator's carry and the
finished rows not yet batched, all written as lineages. Restoring regenerates
every element a state points to (reading those records again, in one batched
read per source) and continues exactly where the state left off.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from zephon_jax import codec
from zephon_jax.element import Element, Opaque, root_position
from zephon_jax.errors import RecordError, StateError, ZephonError
from zephon_jax.sampler.resolve import leaf_paths, leaves, resolve
from zephon_jax.sampler.source import describe_source
from zephon_jax.transforms import DROP

_END = object()
LANE_FORMAT = 1
_MAX_AHEAD = 256


class LanePlan:
    """The parts of a batched dataset a lane needs, shared by all lanes of a process."""

    def __init__(self, batched):
        self.num_lanes = batched.num_lanes
        self.sampler = batched.sampler
        self.leaves = leaves(self.sampler)
        self.leaf_transforms = leaf_paths(self.sampler)
        self.operators = [stage.operator for stage in batched.stages]
        self.post_transforms = [stage.transforms for stage in batched.stages]


def apply_transforms(transforms, data, lane: int, stage: int, lineage) -> Any:
    """Applies per-record transforms in order; returns ``DROP`` if a filter drops it."""
    for transform in transforms:
        data = transform.apply(data, (lane, stage, lineage))
        if data is DROP:
            return DROP
    return data


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

    # ----- reading the sampler -----------------------------------------------------
    def read_roots(self, positions: np.ndarray) -> list:
        """Elements at lane-local ``positions``: Element, ``DROP`` (filtered) or ``_END``."""
        plan = self.plan
        res = resolve(plan.sampler, self.lane, positions, plan.num_lanes)
        out: list = [_END] * len(positions)
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
                    f"lane {self.lane}: reading records {records[:8]}{'...' if len(records) > 8 else ''} "
                    f"from source {describe_source(source)} failed: {e!r}"
                ) from e
            transforms = plan.leaf_transforms[leaf_id]
            for i, record, data in zip(where.tolist(), records, datas):
                position = int(positions[i])
                if transforms:
                    try:
                        data = apply_transforms(transforms, data, self.lane, 0, position)
                    except ZephonError:
                        raise
                    except Exception as e:
                        raise RecordError(
                            f"a transform failed on lane {self.lane}, lane-local position "
                            f"{position}, source {describe_source(source)}, record {record}: {e!r}"
                        ) from e
                out[i] = data if data is DROP else Element(data, position)
        return out

    def _next_root(self):
        if not self._ahead:
            start = self.next_position
            count = self._ahead_size
            self._ahead_size = min(_MAX_AHEAD, self._ahead_size * 2)
            self._ahead.extend(self.read_roots(np.arange(start, start + count, dtype=np.int64)))
        item = self._ahead.popleft()
        if item is not _END:
            self.next_position += 1
        return item

    # ----- running operators --------------------------------------------------------
    def _push(self, stage: int, elements) -> None:
        operators = self.plan.operators
        if stage == len(operators):
            self.pending.extend(elements)
            return
        op = operators[stage]
        post = self.plan.post_transforms[stage]
        for element in elements:
            try:
                carry, outputs = op.step(self.carries[stage], element)
            except ZephonError:
                raise
            except Exception as e:
                raise RecordError(
                    f"{op.describe()} failed on lane {self.lane}, element {element.lineage!r} "
                    f"(from lane-local position {root_position(element.lineage)}): {e!r}"
                ) from e
            self.carries[stage] = carry
            if outputs:
                self._push(stage + 1, self._post(stage, post, outputs))

    def _post(self, stage: int, post, outputs) -> list[Element]:
        if not post:
            return outputs
        kept = []
        for element in outputs:
            try:
                data = apply_transforms(post, element.data, self.lane, stage + 1, element.lineage)
            except ZephonError:
                raise
            except Exception as e:
                raise RecordError(
                    f"a transform after {self.plan.operators[stage].describe()} failed on lane "
                    f"{self.lane}, element {element.lineage!r}: {e!r}"
                ) from e
            if data is not DROP:
                kept.append(Element(data, element.lineage))
        return kept

    def _finish_input(self) -> None:
        self.input_done = True
        for stage, op in enumerate(self.plan.operators):
            carry, outputs = op.flush(self.carries[stage])
            self.carries[stage] = carry
            if outputs:
                self._push(stage + 1, self._post(stage, self.plan.post_transforms[stage], outputs))

    def take(self, n: int) -> list[Element] | None:
        """The next ``n`` rows of this lane, or ``None`` once a finite input is exhausted."""
        pending = self.pending
        while len(pending) < n:
            if self.input_done:
                return None
            item = self._next_root()
            if item is _END:
                self._finish_input()
            elif item is not DROP:
                self._push(0, (item,))
        return [pending.popleft() for _ in range(n)]

    # ----- state -------------------------------------------------------------------
    def get_state(self) -> bytes:
        """This lane's position, carries and unbatched rows, as compact bytes."""
        carries = [op.carry_to_plain(c) for op, c in zip(self.plan.operators, self.carries)]
        pending = tuple(e.lineage for e in self.pending)
        return codec.encode(
            (LANE_FORMAT, self.next_position, self.input_done, tuple(carries), pending)
        )

    def set_state(self, data: bytes) -> None:
        """Restores a state made by :meth:`get_state` (regenerating what it points to)."""
        value = codec.decode(data)
        if not (isinstance(value, tuple) and len(value) == 5 and value[0] == LANE_FORMAT):
            raise StateError(
                f"lane {self.lane}: unrecognized lane state (format "
                f"{value[0] if isinstance(value, tuple) and value else value!r}, expected "
                f"{LANE_FORMAT}); it was written by another zephon_jax version"
            )
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
            data = op.regenerate(lineage, self.at(stage - 1))
            post = lane.plan.post_transforms[stage - 1]
            data = apply_transforms(post, data, lane.lane, stage, lineage)
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

