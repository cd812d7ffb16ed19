"""One lane: sampler -> transforms -> operators, run sequentially with its own carry.

The indices the core speaks of:

* **position**: a lane-local sampler position ``p = 0, 1, 2, ...``; the sampler
  maps ``(lane, p)`` to a source record (and epoch) as a pure function.
* **draw**: what the sampler returns for a position: a leaf (source), a record
  index in it and an epoch; mixtures and shuffles are pure functions of the draw.
* **lane**: one of ``num_lanes`` independent pipelines; lane ``l`` owns rows
  ``[l*R, (l+1)*R)`` of every global batch (``R = rows_per_lane``), whatever the
  topology.
* **row**: a row of the global batch, ``0 <= r < global_batch_size``.
* **stage**: ``k`` is the input of operator ``k`` (stage 0: the sampler's
  records after the per-record transforms); the last stage holds finished rows.
* **lineage**: the pointer that regenerates an element (see :mod:`zephon_jax.core.lineage`).
* **step**: the number of global batches delivered so far.

A lane's state is its next position, the global step it produces next, each
operator's saved carry, the finished rows not yet batched (all written as
lineages), for a mixture by tokens or with weight stages, the mixture's
carry of plain ints, and its accounting of the rows it delivered
(:mod:`zephon_jax.engine.accounting`, :mod:`zephon_jax.state.lane_format`).
Restoring regenerates every element a state points to (:mod:`zephon_jax.engine.restore`)
and continues exactly where the state left off.
"""

from __future__ import annotations

import collections
import functools
import itertools
from typing import Any, Sequence

import numpy as np

from zephon_jax.core.checks import TransformFailed, user_error
from zephon_jax.core.lineage import Element, draw_parts, first_root, is_draw, root_position
from zephon_jax.engine.accounting import PartsShape, Tally
from zephon_jax.engine.blocks import (
    MIN_BLOCK,
    block_cap,
    draw_ahead,
    draw_target,
    fill_pending,
    first_block,
    min_block,
)
from zephon_jax.engine.columns import (
    columnar_plan,
    read_documents_ahead,
    take_column_lanes,
    take_columns,
)
from zephon_jax.engine.drawn_roots import DrawnRoots
from zephon_jax.engine.exclusion import Excluded, drop_excluded, excluded_keys
from zephon_jax.engine.pending import PendingRows
from zephon_jax.engine.provenance import leaf_labels
from zephon_jax.errors import PipelineError, RecordError, ZephonError
from zephon_jax.operators.base import StepFailed, save_lineages, step_block_of
from zephon_jax.sampler.resolve import (
    can_end,
    end_position,
    leaf_paths,
    leaves,
    resolve,
    resolve_lanes,
)
from zephon_jax.sampler.scheduled_mixture import DrawerLayout, MixtureDrawer, ScheduledMixtureNode
from zephon_jax.sampler.source import source_label
from zephon_jax.state.lane_format import (
    LANE_FORMAT,
    LaneSnapshot,
    decode_lane_state,
    encode_lane_state,
)
from zephon_jax.transforms import DROP, apply_transforms
from zephon_jax.transforms.block import BlockFailed, apply_transforms_block, block_error

__all__ = ["Lane", "LanePlan", "encode_lane_state", "read_roots_of_lanes"]

_END = object()
_SKIP = object()  # a position whose source is past its epochs while another is not
# Records a lane reads ahead per block: larger blocks cost less per record; the bound
# on all lanes together keeps memory per lane small when a process runs many lanes.
_MAX_AHEAD = 256
_MAX_AHEAD_ALL_LANES = 65536
_LOCATED_BLOCKS = 4  # 256 to 1,024 positions, 0.6 to 2.2 KB (int32 record and epoch)


class LanePlan:
    """The parts of a batched dataset a lane needs, shared by all lanes of a process."""

    def __init__(self, batched):
        self.num_lanes = batched.num_lanes
        self.sampler = batched.sampler
        self.rows_per_lane_at = batched.rows_per_lane_at
        # The rows each lane makes at every step (None: a ramp changes them).
        self.fixed_rows = None if batched.is_ramp else batched.rows_per_lane_at(0)
        # A mixture by tokens or with weight stages is drawn sequentially by each lane.
        self.mixture = self.sampler if isinstance(self.sampler, ScheduledMixtureNode) else None
        # What every lane's mixture drawer holds alike, made once.
        self.drawer_layout = None if self.mixture is None else DrawerLayout.of(self.mixture)
        self.leaves = leaves(self.sampler)
        self.can_end = can_end(self.sampler)  # whether the input may end at all
        self.leaf_transforms = leaf_paths(self.sampler)
        self.leaf_labels = leaf_labels(self.leaves)
        self.operators = [stage.operator for stage in batched.stages]
        self.post_transforms = [stage.transforms for stage in batched.stages]
        self.step_blocks = [step_block_of(op) for op in self.operators]
        self.num_operators = len(self.operators)
        self.fused = [_fused_with_next(self, k) for k in range(self.num_operators)]
        self.max_ahead = max(64, min(_MAX_AHEAD, _MAX_AHEAD_ALL_LANES // self.num_lanes))
        self.min_block = min_block(self.num_lanes)  # (see zephon_jax.engine.blocks)
        self.draw_ahead = draw_ahead(self.num_lanes)  # (a mixture lane's, ditto)
        # A lane that reads this many records without a row reaching the batch (all of
        # them dropped, by a filter or an operator that emits nothing) would likely wait
        # forever: 16x the sources (a filter may drop long runs), plus what operators hold.
        self.max_records_without_row = (
            16 * sum(leaf.size for leaf in self.leaves)
            + 100_000
            + sum(int(getattr(op, "max_held", 0) or 0) for op in self.operators)
        )
        # Set where lanes read a token array column-wise (see zephon_jax.engine.columns).
        self.columnar = columnar_plan(self)
        # Records a state excludes, per leaf (see zephon_jax.engine.exclusion), and as
        # the draw kernel's sorted keys (set together).
        self.excluded: Excluded = {}
        self.excluded_keys = excluded_keys(self.excluded)
        # What every lane's tally counting holds alike, made once.
        self.parts_shape = PartsShape(self)


def _fused_with_next(plan: LanePlan, stage: int) -> tuple | None:
    """``(pack, cut, key, compact)`` where operator ``stage`` cuts records (a ``split``,
    declaring ``cuts_records`` and ``cut_key``) and directly feeds one that declares it
    places such pieces (``fuses_after_split``: a first_fit/best_fit ``pack``); the two
    then run fused, see :attr:`~zephon_jax.operators.base.LineageOperator.fuses_after_split`
    (``compact``: pack is the last operator); else None."""
    ops = plan.operators
    if stage + 1 >= len(ops) or plan.post_transforms[stage]:
        return None
    split, pack = ops[stage], ops[stage + 1]
    cut = split.cuts_records
    if not 0 < cut <= pack.fuses_after_split:
        return None
    # Rows of the last operator go straight to the batch: they keep compact lineages.
    return pack, cut, split.cut_key, stage + 2 == len(ops)


class Lane:
    """Runs one lane of a pipeline; ``take(n)`` returns its next ``n`` rows."""

    # Where a column-wise lane's producer takes its rows for it, and its place there (see
    # zephon_jax.engine.front_rows); while ``_owing``, the lane settles what it owes before
    # its pending rows or step are read.
    _front: Any = None
    _slot = 0
    _owing = False
    # While owing: what its snapshots share, taken by the first (nothing else of the lane
    # changes before it settles).
    _unchanged: tuple | None = None

    def __init__(self, plan: LanePlan, lane: int):
        self.plan = plan
        self.lane = lane
        self.next_position = 0
        self._step = 0  # the global step this lane produces next
        self.input_done = False
        self.drawer = None
        if plan.mixture is not None:
            columnar = plan.columnar
            self.drawer = MixtureDrawer(
                plan.mixture,
                lane,
                plan.num_lanes,
                self.read_leaf,
                self._transform_root,
                self._transform_roots,
                None if columnar is None else columnar.reader.ahead,
                plan.drawer_layout,
            )
        self.carries = [op.init(lane) for op in plan.operators]
        self._pending = PendingRows()  # finished rows not taken yet
        self.tally = Tally(plan, lane)  # what it delivered (see zephon_jax.engine.accounting)
        self._ahead: collections.deque = collections.deque()
        self._ahead_size = 0  # the next read-ahead's positions (0: the next block's)
        self.documents_ahead: tuple | None = None  # column-wise lanes (lane_columns)
        self.drawn = self._new_roots()
        self.without_row = 0  # records read since a row last reached ``pending``
        self.deepest = -1  # the deepest stage those records reached (-1: none passed a filter)
        self.end_position = end_position(plan.sampler, lane, plan.num_lanes)
        # The last blocks of positions read and where they read from, for provenance:
        # (first, last, positions or None if first..last, table), see remember.
        self._located: list[tuple] = []

    @property
    def pending(self) -> PendingRows:
        """The finished rows not taken yet."""
        if self._owing:
            self._front.settle(self._slot)
        return self._pending

    @pending.setter
    def pending(self, rows: PendingRows) -> None:
        if self._owing:
            self._front.settle(self._slot)
        self._pending = rows

    @property
    def step(self) -> int:
        """The global step this lane produces next."""
        if self._owing:
            self._front.settle(self._slot)
        return self._step

    @step.setter
    def step(self, step: int) -> None:
        if self._owing:
            self._front.settle(self._slot)
        self._step = step

    def owe_to(self, front: Any, slot: int) -> None:
        """Has ``front`` (a :class:`~zephon_jax.engine.front_rows.FrontRows`, ``slot``
        this lane's place in it) take this lane's rows from now on, which the lane then
        owes until it settles (see :meth:`take_owed`)."""
        self._front, self._slot, self._owing = front, slot, True
        self._unchanged = None  # (see snapshot)

    def take_owed(self, rows: int, steps: int) -> None:
        """Takes the ``rows`` rows its producer took for it over ``steps`` steps (its
        first rows, handed out already: nothing is made); owes nothing after."""
        self._owing = False
        self._pending.drop(rows)
        self._step += steps

    def _new_roots(self) -> DrawnRoots:
        """A column-wise mixture lane's draws by index, none yet: the placement kernel
        codes pieces by these indices, and so does the accounting's log of the rows
        (which reads them through ``tally.roots``)."""
        roots = DrawnRoots()
        columnar = self.plan.columnar
        self.tally.roots = roots if columnar is not None and columnar.drawn else None
        return roots

    # ----- reading the sampler -----------------------------------------------------
    def read_roots(self, positions: np.ndarray) -> list:
        """Elements at lane-local ``positions``: Element, ``DROP`` (filtered), ``_SKIP``
        (skipped) or ``_END`` (at or past the lane's end position)."""
        return read_roots_of_lanes([self], [positions])[0]

    def remember(self, positions: np.ndarray, res) -> None:
        """Keeps where ``positions`` (sorted, not empty) read from, compactly, for
        :meth:`locate`: the positions only if not contiguous, the leaf only with several
        leaves, int32 where the values fit."""
        first, last = int(positions[0]), int(positions[-1])
        read = None if last - first + 1 == len(positions) else positions
        single = len(self.plan.leaves) == 1
        table = np.stack((res.record, res.epoch) if single else (res.leaf, res.record, res.epoch))
        if int(table.max()) < 2**31 and int(table.min()) >= 0:
            table = table.astype(np.int32)
        located = self._located
        if len(located) == _LOCATED_BLOCKS:
            del located[0]
        located.append((first, last, read, table))

    def _place(self, leaf_id: int, where: np.ndarray, positions: np.ndarray, records, datas, out):
        """Puts the records ``datas`` read for ``positions[where]`` (from leaf ``leaf_id``)
        into ``out``, after the leaf's transforms, as elements."""
        transforms = self.plan.leaf_transforms[leaf_id]
        block_positions = positions[where].tolist()
        if transforms:
            try:
                datas = apply_transforms_block(transforms, datas, self.lane, 0, block_positions)
            except BlockFailed as failed:
                source = self.plan.leaves[leaf_id].source
                error, cause = block_error(
                    failed,
                    f"lane {self.lane}, lane-local position {block_positions[failed.index]}, "
                    f"source {source_label(source)}, record {records[failed.index]}",
                    user_error,
                )
                raise error from cause
        for i, position, data in zip(where.tolist(), block_positions, datas):
            out[i] = data if data is DROP else Element(data, position)

    def read_leaf(
        self, leaf_id: int, records: list[int], positions: list | None = None, who: str = ""
    ) -> list:
        """The records ``records`` of sampler leaf ``leaf_id``, in one batched read
        (``who`` names the lanes in errors, default this one)."""
        source = self.plan.leaves[leaf_id].source
        who = who or f"lane {self.lane}"
        try:
            getitems = getattr(source, "__getitems__", None)
            datas = getitems(records) if getitems else [source[r] for r in records]
        except Exception as e:
            at = "" if positions is None else f" (lane-local positions {positions})"
            raise RecordError(
                f"{who}: reading records {records[:8]}"
                f"{'...' if len(records) > 8 else ''}{at} from source {source_label(source)} "
                f"failed: {e!r}. Check that the source's files exist, are readable and "
                "intact (the original error is chained as __cause__)"
            ) from e
        if len(datas) != len(records):
            raise RecordError(
                f"{who}: source {source_label(source)} returned {len(datas)} "
                f"records for {len(records)} indices from __getitems__; it must return one "
                "record per index, in order"
            )
        return datas

    def _transform_root(self, transforms, data, lineage, where: str):
        """Sampler-level transforms of a mixture drawer's record (errors name ``where``)."""
        try:
            return apply_transforms(transforms, data, self.lane, 0, lineage)
        except TransformFailed as e:
            raise user_error(e.name, where, e) from e.__cause__

    def _transform_roots(self, transforms, datas, lineages, where) -> list:
        """Sampler-level transforms of a block of a mixture drawer's records, batched where
        a transform can; ``where(i)`` names record ``i`` in errors."""
        try:
            return apply_transforms_block(transforms, datas, self.lane, 0, lineages)
        except BlockFailed as failed:
            error, cause = block_error(failed, where(failed.index), user_error)
            raise error from cause

    def locate(self, positions: Sequence[Any]) -> list[tuple[int, int, int]]:
        """(leaf, record, epoch) of each lane-local position in ``positions``.

        Positions read recently are found in the blocks this lane resolved when
        it read them; others are resolved again (the sampler is a pure function).
        With a mixture by tokens or with stages, ``positions`` are its roots
        ``(position, component, draw)``, which locate themselves.
        """
        if self.drawer is not None:
            return self.drawer.locate(positions)
        out: list = [None] * len(positions)
        missing = []
        for i, p in enumerate(positions):
            for first, last, read, table in reversed(self._located):  # newest first
                if not first <= p <= last:
                    continue
                j = p - first
                if read is not None:  # not contiguous (a restore's reads)
                    j = int(np.searchsorted(read, p))
                    if read[j] != p:
                        continue
                column = table[:, j].tolist()
                out[i] = (column[0], column[1], column[2]) if len(column) == 3 else (0, *column)
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
        text = f"lane {self.lane}, element {lineage!r:.200}"
        if position is None:
            return text + " (an output of a user operator)"
        plan = self.plan
        if plan.mixture is not None:
            root = first_root(lineage)
            if is_draw(root):
                _, component, sub = draw_parts(root)
                return (
                    f"{text} (from lane-local position {position}: mixture component "
                    f"{component}, component draw {sub})"
                )
            return text
        res = resolve(plan.sampler, self.lane, np.array([position], np.int64), plan.num_lanes)
        source = plan.leaves[int(res.leaf[0])].source
        return (
            f"{text} (from lane-local position {position}: source {source_label(source)}, "
            f"record {int(res.record[0])}, epoch {int(res.epoch[0])})"
        )

    def _read_ahead(self) -> None:
        """Reads the next block of positions (growing blocks, up to ``plan.max_ahead``)."""
        self._ahead.extend(self.read_roots(self._ahead_block()))

    def _ahead_block(self) -> np.ndarray:
        """The positions the next read-ahead reads (after those already read ahead): at
        least the next block's, twice as many as the last read-ahead, up to
        ``plan.max_ahead`` and to four times the lane's block cap (see
        :mod:`zephon_jax.engine.blocks`); before the lane made a row, the blocks of a
        first take (``MIN_BLOCK``)."""
        start = self.next_position + len(self._ahead)
        rows = self.plan.rows_per_lane_at(self.step)
        if not self.step and not self.pending:
            count = MIN_BLOCK
        else:
            count = max(self.first_block(rows), min(self._ahead_size, 4 * self.block_cap(rows)))
        self._ahead_size = min(self.plan.max_ahead, 2 * count)
        return np.arange(start, start + count, dtype=np.int64)

    def first_block(self, n: int) -> int:
        """:func:`~zephon_jax.engine.blocks.first_block` of a take of ``n`` rows now."""
        return first_block(n - len(self.pending), self.block_cap(n), self.plan.min_block)

    def block_cap(self, n: int) -> int:
        """:func:`~zephon_jax.engine.blocks.block_cap` of this lane, taking ``n`` rows a step:
        its positions read over the rows made so far (``n`` per step done, and those
        made ahead). A function of the lane's state."""
        return block_cap(self.next_position, self.step * n + len(self.pending))

    # ----- running operators --------------------------------------------------------
    def _push(self, stage: int, elements) -> None:
        """Steps operator ``stage`` over a block of elements, then the next one over its
        outputs; rows out of the last operator go to ``pending``."""
        plan = self.plan
        if stage > self.deepest and elements:
            self.deepest = stage
        if stage == plan.num_operators:
            self.row_reached(elements)
            return
        fused = plan.fused[stage]
        if fused is not None:  # split, then pack, in one loop for the elements it takes
            pack, cut, key, compact = fused
            carry, rows, taken, empty = pack.place_split(
                self.carries[stage + 1], elements, cut, key, compact
            )
            self.carries[stage + 1] = carry
            if taken > empty and stage + 1 > self.deepest:
                self.deepest = stage + 1
            if rows:
                self._push_outputs(stage + 1, plan.post_transforms[stage + 1], rows)
            if taken:
                elements = elements[taken:]
                if not elements:
                    return
        post = plan.post_transforms[stage]
        failed = None
        try:
            carry, outputs = plan.step_blocks[stage](self.carries[stage], elements)
        except StepFailed as e:
            failed = e
        except ZephonError:
            raise
        except Exception as e:  # a step_block that does not say which element failed
            op = plan.operators[stage]
            where = (
                f"{self.where(elements[0].lineage)} (or another of its block of {len(elements)})"
            )
            raise user_error(op.describe(), where, e) from e
        if failed is not None:
            # The outputs of the elements before the failing one go on first, as one by one.
            self.carries[stage] = failed.carry
            if failed.outputs:
                self._push_outputs(stage, post, failed.outputs)
            self._raise_step_error(stage, elements[failed.index], failed.error)
        self.carries[stage] = carry
        if outputs:
            self._push_outputs(stage, post, outputs)

    def feed(self, stage: int, elements: Sequence[Element]) -> None:
        """Pushes ``elements`` (each as it enters ``stage``) through the operators from
        ``stage`` on (a restore taking excluded records out, see
        :mod:`zephon_jax.engine.exclusion`)."""
        if elements:
            self._push(stage, list(elements))

    def recut(self, stage: int, pieces: Sequence[tuple]) -> None:
        """Continues the stream of operator ``stage`` (one with ``recut``, such as
        ``pack(method='concat')``) with ``pieces`` ``(element, start, stop)`` and pushes
        the rows it cuts on (a restore taking excluded records out, see
        :mod:`zephon_jax.engine.exclusion`)."""
        if pieces:
            op = self.plan.operators[stage]
            self.carries[stage], outputs = op.recut(self.carries[stage], list(pieces))
            if outputs:
                self._push_outputs(stage, self.plan.post_transforms[stage], outputs)

    def _push_outputs(self, stage: int, post, outputs) -> None:
        if stage + 1 == self.plan.num_operators and not post:
            self.row_reached(outputs)
        else:
            self._push(stage + 1, self._post(stage, post, outputs))

    def _raise_step_error(self, stage: int, element: Element, error: BaseException) -> None:
        if isinstance(error, PipelineError):
            raise PipelineError(f"{error}\n  (at {self.where(element.lineage)})") from error
        if isinstance(error, ZephonError):
            raise error
        op = self.plan.operators[stage]
        raise user_error(op.describe(), self.where(element.lineage), error) from error

    def row_reached(self, rows, logged: bool = False) -> None:
        if rows:
            pending = self.pending
            pending.extend(rows)
            # noted for the accounting, counted later (``logged``: see Tally.made_rows)
            self.tally.made_rows(rows, len(pending), logged)
            self.without_row = 0
            self.deepest = -1

    def _post(self, stage: int, post, outputs) -> list[Element]:
        if not post:
            return outputs
        lineages = [element.lineage for element in outputs]
        datas = [element.data for element in outputs]
        try:
            datas = apply_transforms_block(post, datas, self.lane, stage + 1, lineages)
        except BlockFailed as failed:
            error, cause = block_error(
                failed,
                self.where(lineages[failed.index]),
                user_error,
                f" after {self.plan.operators[stage].describe()}",
            )
            raise error from cause
        return [Element(d, lin) for d, lin in zip(datas, lineages) if d is not DROP]

    def finish_input(self, first: int = 0) -> None:
        """Marks the input ended and flushes the operators from stage ``first`` on, in
        order, each one's outputs going through those after it (a restore also calls it
        after feeding an ended lane's operators again, see
        :func:`~zephon_jax.engine.restore.restore_lanes`)."""
        self.input_done = True
        for stage, op in enumerate(self.plan.operators):
            if stage < first:
                continue
            try:
                carry, outputs = op.flush(self.carries[stage])
            except ZephonError:
                raise
            except Exception as e:
                raise user_error(f"{op.describe()}.flush", f"lane {self.lane}", e) from e
            self.carries[stage] = carry
            if outputs:
                self._push(stage + 1, self._post(stage, self.plan.post_transforms[stage], outputs))

    def take(self, n: int | None = None) -> list[Element] | None:
        """This lane's rows of its next global step, or ``None`` once a finite input ends.

        ``n`` rows (default: the step's rows per lane); the lane then moves to the
        next step. Raises a RecordError once ``plan.max_records_without_row``
        records in a row yield no row (every one dropped somewhere), instead of
        reading forever.
        """
        if n is None:
            n = self.plan.rows_per_lane_at(self.step)
        rows = self._take(n)
        self.step += 1
        return rows

    def _take(self, n: int) -> list[Element] | None:
        if self.plan.columnar is not None:
            return take_columns(self, n)
        pending = self.pending
        if len(pending) >= n:  # made ahead by the last block
            return pending.take(n)
        if self.drawer is not None:
            done = self._draw_pending(n)
        else:  # in blocks (see zephon_jax.engine.blocks)
            done = fill_pending(self, n, self._next_block, functools.partial(self._push, 0))
        return pending.take(n) if done else None

    def _draw_pending(self, n: int) -> bool:
        """Draws and pushes records one at a time (a mixture drawer's draws depend on the
        step's stage) until the lane holds :meth:`draw_target` rows; False if its input
        ends before it holds ``n``."""
        pending = self.pending
        limit = self.plan.max_records_without_row
        drawer = self.drawer
        assert drawer is not None
        stage = drawer.node.stages.index_at(self.step)
        target = self.draw_target(n)
        while len(pending) < target:
            if self.input_done:
                return len(pending) >= n
            item = drawer.draw(stage, self.next_position)
            if item is None:
                self.finish_input()
                continue
            self.next_position += 1
            if item is _SKIP:
                continue
            self.without_row += 1  # reset by _push when a row reaches ``pending``
            if self.plan.excluded and item is not DROP:
                item = drop_excluded(self, [item])[0]
            if item is not DROP:
                self._push(0, (item,))
            if self.without_row > limit:
                self.raise_no_progress()
        return True

    def draw_target(self, n: int) -> int:
        """The rows a mixture lane holds once its take of ``n`` rows has drawn (see
        :func:`~zephon_jax.engine.blocks.draw_target`): a function of its state."""
        assert self.drawer is not None
        plan = self.plan
        stage_end = self.drawer.node.stages.next_start(self.step)
        rows_at = plan.rows_per_lane_at if plan.fixed_rows is None else plan.fixed_rows
        return draw_target(self.step, n, stage_end, rows_at, plan.draw_ahead)

    def _next_block(self, size: int) -> tuple[list | None, int] | None:
        """The records at the next ``size`` positions (fewer where the input ends), less
        those skipped or filtered (None: none is left), and how many were not skipped;
        None at the end."""
        ahead = self._ahead
        block: list = []
        counted = 0
        while size:
            if not ahead:
                self._read_ahead()
            items = list(itertools.islice(ahead, size))
            end = _END in items
            if end:  # the position of _END is not consumed
                items = items[: items.index(_END)]
                if not items and not block:
                    ahead.popleft()
                    return None
            for _ in items:
                ahead.popleft()
            self.next_position += len(items)
            if self.plan.excluded:
                items = drop_excluded(self, items)
            if _SKIP in items or DROP in items:
                counted += sum(item is not _SKIP for item in items)
                block += [item for item in items if item is not _SKIP and item is not DROP]
            else:
                counted += len(items)
                block += items
            if end:
                break
            size -= len(items)
        return block or None, counted

    def raise_no_progress(self) -> None:
        count = self.without_row
        total = sum(leaf.size for leaf in self.plan.leaves)
        span = (
            f"(lane-local positions {self.next_position - count}..{self.next_position - 1}, "
            f"{count / max(total, 1):.0f}x the size of the sources)"
        )
        if self.deepest < 0:
            raise RecordError(
                f"lane {self.lane}: the filters dropped all of the last {count} records it read "
                f"{span}; the loader would wait forever for a record. Check the filter "
                "predicates (a field renamed? a threshold inverted?) and the sources"
            )
        op = self.plan.operators[self.deepest]
        raise RecordError(
            f"lane {self.lane}: the last {count} records it read {span} produced no row; the "
            f"loader would wait forever for one. None got past operator {self.deepest} "
            f"({op.describe()}) and the filters after it: a filter that "
            "drops every record, a flat_map returning no records, or records with empty "
            "sequences into split or pack. Check the functions and the records reaching it"
        )

    # ----- state -------------------------------------------------------------------
    def snapshot(self) -> LaneSnapshot:
        """This lane's position, saved carries and unbatched rows as immutable plain data.

        Cheap (no encoding): take one per batch, encode with :func:`encode_lane_state`
        only when a state is asked for. Lineages may still be in a carry's compact
        form here (see :func:`~zephon_jax.state.lane_format.plain_snapshot`); encoding writes
        them in full.
        """
        # What the lane owes its producer is read, not settled: a snapshot taken every
        # batch leaves the producer taking its rows for it. Until it settles, nothing
        # but what it owes changes, so its snapshots share the rest.
        owing = self._owing
        unchanged = self._unchanged if owing else None
        if unchanged is None:
            unchanged = (
                tuple(map(save_lineages, self.plan.operators, self.carries)),
                self._pending.lineages(),
                None if self.drawer is None else self.drawer.carry(),
            )
            if owing:
                self._unchanged = unchanged
        carries, pending, mixture = unchanged
        owed, steps = self._front.owed(self._slot) if owing else (0, 0)
        return LaneSnapshot(
            LANE_FORMAT,
            self.next_position,
            self.input_done,
            carries,
            pending[owed:],
            self._step + steps,
            mixture,
            self.tally.snapshot(len(self._pending) - owed),
        )

    def get_state(self) -> bytes:
        """This lane's position, carries and unbatched rows, as compact bytes."""
        return encode_lane_state(self.snapshot(), self.lane)

    def check_state(self, data: bytes) -> LaneSnapshot:
        """The snapshot in lane bytes, with its checksum, version and form checked;
        the lane does not change."""
        plan = self.plan
        return decode_lane_state(
            self.lane, data, plan.num_operators, self.end_position, plan.can_end
        )

    def load(self, snapshot: LaneSnapshot, carries: list, pending: PendingRows) -> None:
        """Takes ``snapshot``'s position and step, with the carries and unbatched rows
        regenerated from it (see :func:`zephon_jax.engine.restore.restore_lanes`)."""
        self.next_position = snapshot.next_position
        self.step = snapshot.step
        self.input_done = snapshot.input_done
        self.carries = carries
        self.pending = pending
        self.tally.load(snapshot.tally, pending)
        self._ahead.clear()
        self._ahead_size = 0  # the next read-ahead's positions (0: the next block's)
        self.documents_ahead = None
        self.drawn = self._new_roots()
        self.without_row = 0
        self.deepest = -1


def read_roots_of_lanes(lanes: Sequence[Lane], positions: Sequence[np.ndarray]) -> list[list]:
    """:meth:`Lane.read_roots` of ``positions[i]`` in ``lanes[i]`` (lanes of one plan), for
    each ``i``: the positions are resolved together and each source is read once for
    all the lanes (one ``__getitems__`` call)."""
    plan = lanes[0].plan
    resolutions = resolve_lanes(plan.sampler, [l.lane for l in lanes], positions, plan.num_lanes)
    outs = []
    by_leaf: dict[int, list[tuple[int, np.ndarray]]] = {}
    for k, (lane, where_at, res) in enumerate(zip(lanes, positions, resolutions)):
        if len(where_at):
            lane.remember(where_at, res)
        end = lane.end_position
        outs.append([_SKIP if end is None or p < end else _END for p in where_at.tolist()])
        valid = np.flatnonzero(res.valid)
        leaf_of = res.leaf[valid]
        for leaf_id in np.unique(leaf_of).tolist():
            by_leaf.setdefault(leaf_id, []).append((k, valid[leaf_of == leaf_id]))
    for leaf_id, parts in by_leaf.items():
        records = [resolutions[k].record[where].tolist() for k, where in parts]
        (k0, where0), k1 = parts[0], parts[-1][0]
        first = lanes[k0]
        who = f"lane {first.lane}" if k0 == k1 else f"lanes {first.lane}..{lanes[k1].lane}"
        shown = positions[k0][where0[:8]].tolist() if k0 == k1 else None
        datas = first.read_leaf(leaf_id, [r for part in records for r in part], shown, who)
        at = 0
        for (k, where), part in zip(parts, records):
            lanes[k]._place(leaf_id, where, positions[k], part, datas[at : at + len(part)], outs[k])
            at += len(part)
    return outs


def take_lanes(lanes: dict[int, Lane], n: int) -> dict[int, list[Element] | None]:
    """``{l: lane.take(n)}`` for ``lanes`` (of one plan), the lanes about to read reading
    ahead together first (see :func:`read_ahead_for_take`)."""
    first = next(iter(lanes.values()), None)
    if first is not None and first.plan.columnar is not None:
        return take_column_lanes(lanes, n)
    read_ahead_for_take(list(lanes.values()), n)
    return {l: lane.take(n) for l, lane in lanes.items()}


def read_ahead_for_take(lanes: Sequence[Lane], rows: int) -> None:
    """Reads ahead, all together, for those of ``lanes`` whose next ``take(rows)`` would
    start by reading on its own (see :func:`read_ahead_together`). Read-ahead only
    caches the records of the next positions: no row and no state depends on it. If
    the joint read fails, nothing is read ahead: each lane then reads on its own and
    the first that fails raises the error naming its lane and positions."""
    if not lanes:
        return
    if lanes[0].plan.columnar is not None:  # document ids only
        read_documents_ahead(lanes, rows)
        return
    short = [
        lane
        for lane in lanes
        if lane.drawer is None
        and not lane.input_done
        and len(lane.pending) < rows
        and len(lane._ahead) < lane.first_block(rows)
    ]
    if len(short) > 1:
        sizes = [lane._ahead_size for lane in short]
        try:
            read_ahead_together(short)
        except Exception:  # each lane reads on its own and names its failure
            for lane, size in zip(short, sizes):
                lane._ahead_size = size


def read_ahead_together(lanes: Sequence[Lane]) -> None:
    """Has each of ``lanes`` (sampler-drawn, input not done, nothing read ahead) read
    its next block ahead, all together (see :func:`read_roots_of_lanes`): what each
    would read first on its own, with one resolve and one read per source."""
    if lanes and lanes[0].plan.columnar is None:
        blocks = [lane._ahead_block() for lane in lanes]
        for lane, items in zip(lanes, read_roots_of_lanes(lanes, blocks)):
            lane._ahead.extend(items)
