"""Restoring a lane: regenerating every element a lane state points to.

One rule for every operator, from the lineage forms of :mod:`zephon_jax.core.lineage`:
an output of a ``passthrough`` operator is its input; an ``Opaque`` lineage holds
its record; a ``(parents, recipe)`` lineage is ``operator.remake(recipe, parents'
data)``. The per-record transforms after the operator then apply again. All the
sampler records a state needs are read first, in one batched read per source.

Restoring many lanes (:func:`restore_lanes`) resolves the positions of all of them
together and reads each source once for all of them; only the remaking of
operator outputs is done lane by lane (their transforms' random keys name the lane).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from zephon_jax.core.checks import TransformFailed, user_error
from zephon_jax.core.gc_pause import paused_gc
from zephon_jax.core.lineage import (
    Element,
    Opaque,
    all_derived,
    derived_parts,
    is_derived,
    is_valid_draw,
    parents_of,
    position_of,
    recipe_of,
)
from zephon_jax.engine.columns import open_rows_of_lanes, restored_rows
from zephon_jax.engine.exclusion import holds_excluded
from zephon_jax.engine.lane import Lane, read_ahead_together, read_roots_of_lanes
from zephon_jax.engine.pending import PendingRows
from zephon_jax.errors import StateError, ZephonError
from zephon_jax.operators.base import Saved
from zephon_jax.operators.token_bins import SavedRows
from zephon_jax.sampler.scheduled_mixture import regenerate_lanes
from zephon_jax.state.envelope import is_int
from zephon_jax.state.lane_format import LaneSnapshot
from zephon_jax.transforms import DROP, apply_transforms


def restore_lanes(
    lanes: Sequence[Lane], snapshots: Sequence[LaneSnapshot], read_ahead: bool = False
) -> None:
    """Sets ``lanes[i]`` (lanes of one plan) to the checked ``snapshots[i]``, for each ``i``.

    The sampler records all the snapshots point to are read together, one batched
    read per source; then each lane's carries and unbatched rows are rebuilt. With
    ``read_ahead``, the lanes then read their next block ahead, together too (the
    lanes change even if that read fails: pass fresh lanes). The result is the same
    as restoring the lanes one by one. Raises :class:`StateError` naming the lane if
    a snapshot does not fit the pipeline; no lane's records and carries change then.
    """
    with paused_gc(long_lived=True):
        _restore_lanes(lanes, snapshots, read_ahead)


def _restore_lanes(
    lanes: Sequence[Lane], snapshots: Sequence[LaneSnapshot], read_ahead: bool
) -> None:
    for lane, snapshot in zip(lanes, snapshots):
        _set_mixture_carry(lane, snapshot)
    rebuilders = [Rebuilder(lane) for lane in lanes]
    columns = lanes[0].plan.columnar if lanes and not lanes[0].plan.excluded else None
    kept = -1 if columns is None else columns.stage  # open rows kept as pointers, unread
    # Column-wise lanes keep their open rows and rows made ahead as pointers, unread.
    wanted = [
        rebuild.positions(
            [() if k == kept else held for k, (held, _) in enumerate(snapshot.carries)],
            () if kept >= 0 else snapshot.pending,
            snapshot.next_position,
        )
        for rebuild, snapshot in zip(rebuilders, snapshots)
    ]
    _read_roots(rebuilders, wanted)
    made = restored_rows(lanes, snapshots) if kept >= 0 and lanes else None
    restored = []
    for k, (lane, rebuild, snapshot) in enumerate(zip(lanes, rebuilders, snapshots)):
        try:
            if lane.plan.excluded:
                restored.append(_without_excluded(lane, rebuild, snapshot))
                continue
            carries = [
                _saved_rows(op, held, aux, lane.lane, snapshot.next_position)
                if stage == kept
                else op.load(Saved(tuple(rebuild.build_all(stage, held)), aux), lane.lane)
                for stage, (op, (held, aux)) in enumerate(
                    zip(lane.plan.operators, snapshot.carries)
                )
            ]
            final = lane.plan.num_operators
            pending = PendingRows()
            rows = rebuild.build_all(final, snapshot.pending) if made is None else made[k]
            if rows is not None:
                pending.extend(rows)
        except ZephonError:
            raise
        except Exception as e:  # an operator could not read its saved carry
            raise StateError(
                f"lane {lane.lane}: the state's carries do not fit this pipeline's operators "
                f"({e!r}); the state was altered or comes from another zephon_jax release"
            ) from e
        restored.append((carries, pending, (), ()))
    for lane, snapshot, (carries, pending, again, recut) in zip(lanes, snapshots, restored):
        lane.load(snapshot, carries, pending)
        for stage in reversed(range(len(recut))):  # the pieces go before what follows
            lane.recut(stage, recut[stage])
        for stage, elements in enumerate(again):
            lane.feed(stage, elements)
        fed = [k for k, pieces in enumerate(recut) if pieces]
        fed += [k for k, elements in enumerate(again) if elements]
        if fed and snapshot.input_done:  # flushed at its end: what came back is flushed too
            lane.finish_input(min(fed))
    if kept >= 0 and lanes:
        open_rows_of_lanes(lanes)  # the open rows as arrays, from their pointers alone
    if read_ahead:  # the first blocks the lanes read next, read together too
        read_ahead_together([l for l in lanes if l.drawer is None and not l.input_done])


def _without_excluded(lane: Lane, rebuild: Rebuilder, snapshot: LaneSnapshot) -> tuple:
    """``(carries, pending, again, recut)`` of a lane restored without the records its
    plan excludes (see :mod:`zephon_jax.engine.exclusion`): an operator holding an element
    that contains one starts empty, and its held elements, taken apart where they
    contain one, are fed again (``again[k]``: the elements to feed into stage ``k``, in
    the order the state holds them); a finished row that contains one is taken apart
    the same way. An operator that cuts a stream (one with ``recut``, such as
    ``pack(method='concat')``) takes back pieces instead (``recut[k]``: ``(element,
    start, stop)`` in stream order, see :func:`_stream_pieces`)."""
    plan = lane.plan
    n = plan.num_operators
    again: list[list[Element]] = [[] for _ in range(n + 1)]
    carries: list = []
    from_carries = []  # per stage: the pieces its held elements gave back, per stage
    for stage, (op, (held, aux)) in enumerate(zip(plan.operators, snapshot.carries)):
        found: list[list] = [[] for _ in range(n)]
        if cuts_stream(op):
            carries.append(None)  # decided by _stream_pieces
        elif any(holds_excluded(lane, stage, lineage) for lineage in held):
            carries.append(op.init(lane.lane))
            for lineage in held:
                _take_apart(lane, rebuild, stage, lineage, again, found)
        else:
            carries.append(op.load(Saved(tuple(rebuild.build_all(stage, held)), aux), lane.lane))
        from_carries.append(found)
    from_rows: list[list] = [[] for _ in range(n)]
    pending: list = []
    recut_rest = n > 0 and cuts_stream(plan.operators[-1])
    cutting = False
    for lineage in snapshot.pending:
        if cutting:  # the rows after a re-cut one are re-cut too
            _add_pieces(n - 1, lineage, from_rows)
        elif holds_excluded(lane, n, lineage):
            _take_apart(lane, rebuild, n, lineage, again, from_rows)
            cutting = recut_rest
        else:
            pending.append(rebuild.build(n, lineage))
    recut: list[list] = [[] for _ in range(n)]
    for stage in reversed(range(n)):
        if cuts_stream(plan.operators[stage]):
            taken = from_rows[stage] + [
                p for later in reversed(from_carries[stage + 1 :]) for p in later[stage]
            ]
            carries[stage], recut[stage] = _stream_pieces(
                lane, rebuild, stage, snapshot.carries[stage], taken, again, from_rows
            )
    return carries, PendingRows(pending), again, recut


def _saved_rows(op: Any, held: Sequence, aux: Any, lane: int, next_position: int) -> Any:
    """The saved open rows of a column-wise lane's ``pack`` as a :class:`SavedRows` (checked
    as ``op.load`` checks them), which :func:`open_rows_of_lanes` turns into its open
    rows without reading the documents they point to; None where it holds none."""
    op.check_counts(aux, len(held), lane)
    if aux is None or not held:
        return None
    return SavedRows(held, aux, next_position)


def cuts_stream(op: Any) -> bool:
    """Whether ``op`` cuts a stream of items into rows (it has ``recut``): its outputs
    are taken back as pieces, not whole inputs."""
    return callable(getattr(op, "recut", None))


def _add_pieces(stage: int, lineage: Any, pieces: list) -> None:
    """Adds the pieces ``(parent, start, stop)`` of an output of the stream operator
    ``stage`` to ``pieces[stage]``."""
    parents, bounds = derived_parts(lineage)
    pieces[stage].extend((parent, a, b) for parent, (a, b) in zip(parents, bounds))


def _stream_pieces(
    lane: Lane,
    rebuild: Rebuilder,
    stage: int,
    saved: tuple,
    taken: list,
    again: list,
    found: list,
) -> tuple:
    """``(carry, pieces)`` of the stream operator ``stage`` without the excluded records:
    if it gave back pieces of its outputs (``taken``, in stream order) or holds an
    excluded record, it starts empty and takes the pieces again, then those of its own
    open row (each a ``(element, start, stop)``), so the stream keeps its order; a
    piece of an excluded record is dropped (a piece of an element that holds one and
    more is taken apart, see :func:`_take_apart`). Else its carry as saved."""
    op = lane.plan.operators[stage]
    held, aux = saved
    carry = op.load(Saved(tuple(rebuild.build_all(stage, held)), aux), lane.lane)  # checked
    if not taken and not any(holds_excluded(lane, stage, lineage) for lineage in held):
        return carry, []
    open_row = op.save(carry)  # its pieces: the held elements and their (start, stop)
    pieces = []
    dropped: list = []
    own = [(e.lineage, e, a, b) for e, (a, b) in zip(open_row.held, open_row.aux or ())]
    for lineage, element, a, b in [(p, None, a, b) for p, a, b in taken] + own:
        if not holds_excluded(lane, stage, lineage):
            pieces.append((rebuild.build(stage, lineage) if element is None else element, a, b))
        elif not dropped or dropped[-1] != lineage:  # a record's pieces are together
            dropped.append(lineage)
            _take_apart(lane, rebuild, stage, lineage, again, found)
    return op.init(lane.lane), pieces


def _take_apart(
    lane: Lane, rebuild: Rebuilder, stage: int, lineage: Any, again: list, pieces: list
) -> None:
    """Adds the element with ``lineage`` entering ``stage`` to ``again[stage]`` if it holds
    no excluded record; else, the same for each input it was made of (an excluded record,
    or an element that cannot be taken apart, is dropped), or, for an output of a stream
    operator, its pieces to ``pieces[stage - 1]``."""
    if not holds_excluded(lane, stage, lineage):
        again[stage].append(rebuild.build(stage, lineage))
        return
    if stage == 0:
        return
    op = lane.plan.operators[stage - 1]
    if op.passthrough:
        _take_apart(lane, rebuild, stage - 1, lineage, again, pieces)
    elif is_derived(lineage) and cuts_stream(op):
        _add_pieces(stage - 1, lineage, pieces)
    elif is_derived(lineage):
        for parent in parents_of(lineage):
            _take_apart(lane, rebuild, stage - 1, parent, again, pieces)


def _set_mixture_carry(lane: Lane, snapshot: LaneSnapshot) -> None:
    if (snapshot.mixture is None) != (lane.drawer is None):
        raise StateError(
            f"lane {lane.lane}: the state {'has no' if snapshot.mixture is None else 'has a'} "
            f"mixture carry but this pipeline's sampler "
            f"{'needs' if snapshot.mixture is None else 'has'} none"
        )
    if lane.drawer is not None:
        try:
            lane.drawer.set_carry(snapshot.mixture)
        except ZephonError:
            raise
        except Exception as e:
            raise StateError(
                f"lane {lane.lane}: the state's mixture carry {snapshot.mixture!r} does not "
                f"fit this pipeline's mixture ({e!r}); the state was altered"
            ) from e


def _read_roots(rebuilders: Sequence[Rebuilder], wanted: Sequence[set]) -> None:
    """Reads the sampler records at the positions each rebuilder's lane wants, all lanes'
    reads of a source in one batch (mixture drawers' roots too, their records of each
    source read together)."""
    together, ordered = [], []
    drawn, drawers, roots_of = [], [], []
    for rebuild, positions in zip(rebuilders, wanted):
        drawer = rebuild.lane.drawer
        if drawer is not None:  # roots are (position, component, draw)
            roots = sorted(p for p in positions if is_valid_draw(p))
            if roots:
                drawn.append(rebuild)
                drawers.append(drawer)
                roots_of.append(roots)
        elif positions:
            together.append(rebuild)
            ordered.append(np.array(sorted(positions), dtype=np.int64))
    if drawn:
        first = drawn[0].lane
        elements = regenerate_lanes(
            drawers,
            roots_of,
            lambda leaf_id, records, who: first.read_leaf(leaf_id, records, None, who),
        )
        for rebuild, regenerated in zip(drawn, elements):
            rebuild.roots.update(regenerated)
    if together:
        items = read_roots_of_lanes([r.lane for r in together], ordered)
        for rebuild, where, read in zip(together, ordered, items):
            rebuild.roots.update(zip(where.tolist(), read))


class Rebuilder:
    """Regenerates the elements entering each stage of ``lane`` from their lineages.

    Stage ``k`` (``0 <= k < num_operators``) is the input of operator ``k``; stage
    ``num_operators`` holds the finished rows.
    """

    def __init__(self, lane: Lane):
        self.lane = lane
        self.roots: dict[Any, Any] = {}
        # The elements built so far, per stage, by lineage.
        self.cache: list[dict] = [{} for _ in range(lane.plan.num_operators + 1)]

    def _collect(self, stage: int, lineages: list, out: set) -> None:
        """Adds the roots ``lineages`` (entering ``stage``) derive from to ``out``, a stage
        at a time."""
        operators = self.lane.plan.operators
        while stage > 0:
            if not operators[stage - 1].passthrough:
                lineages = [
                    parent
                    for lineage in lineages
                    if is_derived(lineage)
                    for parent in parents_of(lineage)
                ]
            stage -= 1
        for lineage in lineages:
            if type(lineage) is int:
                out.add(lineage)
            elif isinstance(lineage, (int, np.integer)) and not isinstance(lineage, bool):
                out.add(int(lineage))
            elif is_valid_draw(lineage):
                out.add(lineage)

    def positions(self, held_by_stage, pending, next_position: int) -> set:
        """The sampler positions (or mixture draws) the lineages point to; all must be
        positions the lane has read (before ``next_position``)."""
        positions: set[Any] = set()  # ints, or (position, component, draw) of a mixture
        for stage, held in enumerate(held_by_stage):
            self._collect(stage, list(held), positions)
        self._collect(len(self.lane.plan.operators), list(pending), positions)
        furthest = max(map(position_of, positions), default=-1)
        if furthest >= next_position:
            raise StateError(
                f"lane {self.lane.lane}: the state points to lane-local position {furthest}, "
                f"but the lane has read only positions before {next_position}; the state was "
                "altered"
            )
        return positions

    def build(self, stage: int, lineage) -> Element:
        """The element with ``lineage`` entering ``stage``."""
        # An Opaque hashes by identity: a key holding one only finds the same object.
        cache = self.cache[stage]
        try:
            cached = lineage in cache
        except TypeError:
            raise StateError(
                f"lane {self.lane.lane}: the state holds {lineage!r} where a record pointer "
                "belongs (ints and tuples); the state is malformed"
            ) from None
        if cached:
            return cache[lineage]
        element = self._root(lineage) if stage == 0 else self._output(stage - 1, lineage)
        cache[lineage] = element
        return element

    def _root(self, lineage) -> Element:
        lane = self.lane
        if lane.drawer is not None:
            return self._mixture_root(lineage)
        if type(lineage) is not int and not is_int(lineage) or lineage < 0:
            raise StateError(
                f"lane {lane.lane}: the state holds {lineage!r} where a lane-local sampler "
                "position (an int >= 0) belongs; the state is malformed"
            )
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
        return item

    def _mixture_root(self, lineage) -> Element:
        """A record drawn by a mixture by tokens or with stages: ``(position, component, draw)``."""
        lane = self.lane
        if not is_valid_draw(lineage):
            raise StateError(
                f"lane {lane.lane}: the state holds {lineage!r} where a mixture draw "
                "(position, component, draw) belongs; the state is malformed or was taken "
                "with another pipeline"
            )
        item = self.roots.get(lineage)
        if item is None and lane.drawer is not None:
            item = lane.drawer.regenerate([lineage]).get(lineage)
        if not isinstance(item, Element):
            raise StateError(
                f"lane {lane.lane}: the state points to mixture draw {lineage!r}, which the "
                "pipeline no longer produces (filtered or past the last epoch); the sources "
                "or functions changed since the state was taken"
            )
        return item

    def build_all(self, stage: int, lineages: Sequence) -> list[Element]:
        """:meth:`build` of each of ``lineages``, a stage at a time: the parents of all
        the outputs of an operator are built together, then the outputs remade."""
        if stage == 0:
            return self._roots_all(lineages)
        index = stage - 1
        op = self.lane.plan.operators[index]
        cache = self.cache[stage]
        try:
            todo = [lineage for lineage in lineages if lineage not in cache]
        except TypeError:  # an unhashable lineage: one by one, as build() reports it
            return [self.build(stage, lineage) for lineage in lineages]
        if op.passthrough or not all_derived(todo):
            for lineage in todo:
                self.build(stage, lineage)
        elif todo:
            inputs = self.build_all(index, [p for lineage in todo for p in parents_of(lineage)])
            self._remake_all(index, op, todo, inputs)
        return [cache[lineage] for lineage in lineages]

    def _roots_all(self, lineages: Sequence) -> list[Element]:
        """:meth:`build` of each of ``lineages`` at stage 0: in one pass when all are
        positions read as elements (the common case), else one by one."""
        roots = self.roots
        if (
            lineages
            and self.lane.drawer is None
            and set(map(type, lineages)) == {int}
            and min(lineages) >= 0
        ):
            try:
                items = list(map(roots.__getitem__, lineages))
            except KeyError:
                pass
            else:
                if set(map(type, items)) == {Element}:
                    return items
        return [self.build(0, lineage) for lineage in lineages]

    def _remake_all(self, index: int, op, lineages: list, inputs: list[Element]) -> None:
        """Caches the outputs of operator ``index`` with the derived ``lineages`` (not
        cached yet), made from ``inputs``, the elements of their parents in order.

        Without transforms after the operator, the outputs are remade in one loop;
        the first that fails is remade again by :meth:`_remade`, which reports it.
        """
        cache = self.cache[index + 1]
        done = at = 0
        if not self.lane.plan.post_transforms[index]:
            remake = op.remake
            try:
                for lineage in lineages:
                    parents, recipe = derived_parts(lineage)
                    count = len(parents)
                    if count == 1:
                        data = remake(recipe, [inputs[at].data])
                    else:
                        data = remake(recipe, [element.data for element in inputs[at : at + count]])
                    if data is DROP:
                        break
                    cache[lineage] = Element(data, lineage)
                    at += count
                    done += 1
            except Exception:  # remade again below, where its error is reported
                pass
        for lineage in lineages[done:]:
            count = len(parents_of(lineage))
            datas = [element.data for element in inputs[at : at + count]]
            at += count
            cache[lineage] = self._remade(index, op, lineage, datas)

    def _output(self, index: int, lineage) -> Element:
        """An output of operator ``index``, after the transforms that follow it."""
        lane = self.lane
        op = lane.plan.operators[index]
        if op.passthrough:
            return self._remade(index, op, lineage, [self.build(index, lineage).data])
        if isinstance(lineage, Opaque):
            return self._remade(index, op, lineage, None)
        if is_derived(lineage):
            inputs = [self.build(index, p).data for p in parents_of(lineage)]
            return self._remade(index, op, lineage, inputs)
        raise StateError(
            f"lane {lane.lane}: the state holds {lineage!r} as an output of "
            f"{op.describe()}, which is not a (parents, recipe) pointer; the state is "
            "malformed or was taken with another pipeline"
        )

    def _remade(self, index: int, op, lineage, inputs: list | None) -> Element:
        """The output of operator ``index`` with ``lineage`` from its inputs' data (for an
        ``Opaque`` lineage, ``None``), after the transforms that follow the operator."""
        lane = self.lane
        post = lane.plan.post_transforms[index]
        try:
            if inputs is None:
                data = lineage.data
            elif op.passthrough:
                data = inputs[0]
            else:
                try:
                    data = op.remake(recipe_of(lineage), inputs)
                except ZephonError:
                    raise
                except Exception as e:
                    if op.user_code:
                        raise
                    # A built-in operator's recipe that does not fit its inputs.
                    raise StateError(
                        f"lane {lane.lane}: the state holds {lineage!r} as an output of "
                        f"{op.describe()}, which cannot be remade from it ({e!r}); the state "
                        "was altered or taken with another pipeline"
                    ) from e
            if post:
                data = apply_transforms(post, data, lane.lane, index + 1, lineage)
        except ZephonError:
            raise
        except Exception as e:
            raise user_error(
                f"regenerating {op.describe()} output (restoring a state)",
                lane.where(lineage),
                e,
            ) from (e.__cause__ if isinstance(e, TransformFailed) else e)
        if data is DROP:
            raise StateError(
                f"lane {lane.lane}: element {lineage!r} is now dropped by a filter after "
                f"{op.describe()}; the pipeline's functions are not pure or changed"
            )
        return Element(data, lineage)


def set_lane_state(lane: Lane, data: bytes) -> None:
    """Restores one lane from the lane bytes made by :meth:`Lane.get_state`, regenerating
    what they point to.

    Raises :class:`StateError` naming the entry if the state is malformed; the lane's
    records and carries are then unchanged.
    """
    restore_lanes([lane], [lane.check_state(data)])
