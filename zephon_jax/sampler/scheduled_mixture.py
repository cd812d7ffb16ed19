"""Mixtures weighted by tokens, or by stages of weights: a per-lane smooth round robin.

``Dataset.mix(datasets, weights, unit="tokens")`` and mixtures whose weights
are a stage schedule ``{start_step: [w, ...]}`` cannot be a pure function of
the lane-local position: which component draw ``k`` reads depends on the
lengths of the records drawn before it, or on the global step the lane was
producing when it drew. Each lane therefore runs a small sequential chooser,
:class:`MixtureDrawer`, over an explicit carry of plain ints:

* ``stage``: the stage whose weights the credits below follow;
* ``credits[j]``: component ``j``'s token (or record) credit, in units of
  ``2**-32`` of a token;
* ``next_sub[j]``: the next component-local draw of component ``j``.

Each draw picks the component with the largest credit (ties broken by a
per-lane rotation), reads its next record, and with ``n`` the record's tokens
(``len(record["tokens"])`` after the component's own transforms; 1 with
``unit="records"``) adds ``q_k * n`` to every credit and takes ``Q * n`` from
the chosen one (``q_k`` the weights in units of ``2**-32``, ``Q`` their sum).
Credits sum to zero and the chosen credit is never negative, so in every lane
and from the start of each stage, component ``j`` has received within
``(K - 1) * L`` tokens of its share ``w_j * T`` of the ``T`` tokens drawn
(``K`` components with a positive weight, ``L`` the longest record). The shares
are exact in the long run on every lane.

The draws a lane makes while producing the rows of global step ``t`` use the
weights of the stage that holds ``t``; at a stage change the credits restart
from zero and every component continues from its ``next_sub``, so each
component's own order is kept across stages. A drawn record's lineage is
``(position, component, sub)``: restoring reads it back directly.

By tokens, a draw that gives no tokens (a record its component's filter
dropped, or one with empty ``tokens``) leaves the credits as they were, so the
same component is drawn again: a component that never gives tokens would take
every draw while the others wait. A lane raises a :class:`RecordError` naming
the component once ``16 * size + DRY_DRAWS`` draws of it in a row gave no
tokens (``size`` the records of its sources), the bound the lanes' own
no-progress guard uses with the component's size in place of all sources'.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from zephon_jax.core.compiled_kernels import pay_credits, pick_component
from zephon_jax.core.lineage import Element, draw_component, draw_parts, draw_sub
from zephon_jax.core.lineage import draw as draw_lineage
from zephon_jax.core.permutation import derive_key
from zephon_jax.errors import PipelineError, RecordError, StateError
from zephon_jax.sampler.resolve import (
    Resolution,
    end_position,
    leaf_paths,
    leaves,
    resolve,
    resolve_each,
    resolve_flat,
    resolve_lanes,
    unresolved,
)
from zephon_jax.sampler.schedule import StepSchedule
from zephon_jax.sampler.source import source_label
from zephon_jax.transforms import DROP

UNITS = ("records", "tokens")
_ONE = 1 << 32
_FIRST_CHUNK = 8
_MAX_CHUNK = 1024
# Draws read ahead at most, all lanes of a process together (each lane holds
# 24 bytes a draw of each component): fewer per lane with many lanes, never under 64.
_CHUNKS_ALL_LANES = 131072
# Draws of a component a lane about to take must hold read ahead, or they are read for
# all such lanes together (see _reads_next).
_DRAWS_MARGIN = 32
# Draws of a component in a row without tokens allowed on top of 16 times its size (see
# the module docstring): enough for a random filter keeping 1% (0.99**4096 < 1e-17).
DRY_DRAWS = 4096


def _check_stage_weights(num_components: int) -> Callable[[Any, str], tuple[float, ...]]:
    def check(weights: Any, what: str) -> tuple[float, ...]:
        try:
            values = [float(w) for w in weights]
        except (TypeError, ValueError) as e:
            raise PipelineError(f"mixture weights ({what}) must be numbers; got {weights!r}") from e
        if len(values) != num_components:
            raise PipelineError(
                f"mixture weights ({what}) has {len(values)} weights for {num_components} "
                "datasets; give one weight per dataset"
            )
        for i, w in enumerate(values):
            if math.isnan(w) or math.isinf(w) or w < 0:
                raise PipelineError(
                    f"mixture weight {i} ({what}) is {w!r}; every weight must be a finite "
                    "number >= 0"
                )
        total = sum(values)
        if total <= 0:
            raise PipelineError(
                f"mixture weights ({what}) are all zero; a stage needs a positive weight sum"
            )
        return tuple(w / total for w in values)

    return check


def parse_weight_stages(weights: Any, num_components: int) -> StepSchedule:
    """Weights (a list, or ``{start_step: [w, ...]}``) as a schedule of normalized tuples."""
    if not isinstance(weights, Mapping):
        weights = {0: weights}
    return StepSchedule.parse(weights, "Dataset.mix weights", _check_stage_weights(num_components))


# Credits and draws in a carry stay within int64 (what the draw kernels count in).
_CARRY_BOUND = 1 << 62


def max_draw_tokens(quanta: Sequence[np.ndarray]) -> int:
    """The most tokens one draw may count so that credits stay within int64: each credit
    stays within ``K * L * Q`` for ``K`` components, ``L`` the most tokens of a draw and
    ``Q`` the weights' sum in units of ``2**-32`` (see the module docstring)."""
    k = len(quanta[0])
    return _CARRY_BOUND // (k * max(int(q.sum()) for q in quanta))


def quantize(weights: Sequence[float]) -> tuple[int, ...]:
    """Weights in units of ``2**-32``; positive weights stay positive."""
    return tuple(0 if w == 0 else max(1, round(w * _ONE)) for w in weights)


@dataclasses.dataclass(frozen=True)
class ScheduledMixtureNode:
    """Mixes child sampler nodes by tokens or records, with weights per stage of steps."""

    children: tuple
    stages: StepSchedule
    unit: str = "records"
    order_seed: int | None = None
    transforms: tuple = ()
    node_key: int = 0
    # The seed given to Dataset.shuffle (order_seed derives from it), for messages only.
    given_seed: int | None = dataclasses.field(default=None, compare=False)

    def draws_available(self, lane: int, child_draws: list) -> None:
        """Unknown ahead of time: the lane's :class:`MixtureDrawer` finds its end."""
        return None

    def describe(self) -> dict:
        return {
            "mix": [c.describe() for c in self.children],
            "weights": {
                "unit": self.unit,
                "stages": {
                    str(s): [round(w, 12) for w in ws]
                    for s, ws in zip(self.stages.starts, self.stages.values)
                },
            },
            "order_seed": self.order_seed,
            "transforms": [t.describe() for t in self.transforms],
        }


def max_chunk(num_lanes: int) -> int:
    """The draws of a component a lane reads ahead at most: 1024, fewer from 256 lanes
    on so that all lanes together hold at most ``_CHUNKS_ALL_LANES`` (64 at least):
    512 at 256 lanes, 128 at 1024 lanes (24 bytes a draw and component)."""
    return max(64, min(_MAX_CHUNK, _CHUNKS_ALL_LANES // max(num_lanes, 1)))


class IdsAhead:
    """A drawer's read-ahead when draws read no records (``ids``), as arrays the draw
    kernel (:func:`~zephon_jax.core.compiled_kernels.draw_place`) reads: component
    ``j``'s draws ``first[j]`` to ``first[j] + size[j] - 1``, each a global sampler
    ``leaf`` (-1: the draw has no record), a ``record`` and the ``tokens`` it counts."""

    def __init__(self, num_components: int, max_chunk: int = _MAX_CHUNK):
        self.first = np.zeros(num_components, np.int64)
        self.size = np.zeros(num_components, np.int64)
        shape = (num_components, max_chunk)
        self.leaf = np.zeros(shape, np.int64)
        self.record = np.zeros(shape, np.int64)
        self.tokens = np.zeros(shape, np.int64)

    def put(
        self,
        component: int,
        subs: np.ndarray,
        valid: np.ndarray,
        leaf_ids: np.ndarray,
        records: np.ndarray,
        counts: np.ndarray,
    ) -> None:
        """Holds draws ``subs`` (consecutive) of ``component`` from now on: those at
        ``valid`` are ``records`` of ``leaf_ids`` counting ``counts``, the others none."""
        n = len(subs)
        self.first[component] = subs[0] if n else 0
        self.size[component] = n
        if len(valid) == n:  # every draw has a record (all but past a source's epochs)
            self.leaf[component, :n] = leaf_ids
            self.record[component, :n] = records
            self.tokens[component, :n] = counts
            return
        self.leaf[component, :n] = -1
        self.leaf[component, valid] = leaf_ids
        self.record[component, valid] = records
        self.tokens[component, valid] = counts

    def clear(self) -> None:
        self.size[:] = 0


class _Entry:
    """A component record read ahead: its data after the component's transforms."""

    __slots__ = ("data", "tokens")

    def __init__(self, data: Any, tokens: int):
        self.data = data  # record, DROP, or None for a draw past the component's epochs
        self.tokens = tokens


class DrawerLayout:
    """What every lane's :class:`MixtureDrawer` of one node holds alike, made once for
    all of them (with many lanes, making it per lane was a large part of a restore):
    each component's first global leaf and leaf transforms, the stages' weights as int64
    arrays (:func:`quantize`), the most tokens a draw may count and the dry-draw bounds.
    Its arrays are shared by the drawers and never written to."""

    __slots__ = ("leaf_base", "child_transforms", "quanta", "max_tokens", "dry_limit")

    def __init__(
        self,
        leaf_base: list[int],
        child_transforms: list,
        quanta: list[np.ndarray],
        dry_limit: np.ndarray,
    ):
        self.leaf_base = leaf_base
        self.child_transforms = child_transforms
        self.quanta = quanta
        self.max_tokens = max_draw_tokens(quanta)
        self.dry_limit = dry_limit

    @classmethod
    def of(cls, node: ScheduledMixtureNode) -> DrawerLayout:
        """The layout of ``node``'s drawers."""
        bases = np.cumsum([0] + [len(leaves(child)) for child in node.children])
        return cls(
            bases[:-1].tolist(),
            [leaf_paths(child) for child in node.children],
            [np.array(quantize(ws), np.int64) for ws in node.stages.values],
            np.array(
                [
                    16 * sum(leaf.size for leaf in leaves(child)) + DRY_DRAWS
                    for child in node.children
                ],
                np.int64,
            ),
        )


class MixtureDrawer:
    """One lane's sequential chooser over a :class:`ScheduledMixtureNode` (see module doc).

    ``read(leaf_id, records)`` reads records of a sampler leaf (a list);
    ``transform(transforms, data, lineage, where)`` applies per-record transforms
    (returning ``DROP`` for a filtered record); ``transform_block(transforms,
    datas, lineages, where)``, when given, does the same for a block of records
    (``where(i)`` names record ``i``), so that a transform such as ``tokenize``
    encodes the block in one call. Records are read ahead per component in
    growing blocks; only the carry is state.

    ``ids(leaf_ids, records)``, when given, gives the lengths (in tokens) of records of
    sampler leaves (arrays), called once per block of draws read ahead: the drawer then
    reads no records but keeps the draws' ids and lengths in :attr:`ids_ahead`, which
    the draw kernel reads (:func:`~zephon_jax.core.compiled_kernels.draw_place`; for
    lanes that read the documents column-wise, only without transforms), and
    :meth:`draw` is not used. Restoring (:meth:`regenerate`) reads the records as
    without it.

    ``layout``: :meth:`DrawerLayout.of` ``node``, where the caller makes many drawers of
    one node (made here otherwise).
    """

    def __init__(
        self,
        node: ScheduledMixtureNode,
        lane: int,
        num_lanes: int,
        read: Callable[[int, list[int]], list],
        transform: Callable[[tuple, Any, Any, str], Any],
        transform_block: Callable[[tuple, list, list, Callable[[int], str]], list] | None = None,
        ids: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
        layout: DrawerLayout | None = None,
    ):

        self.node = node
        self.lane = lane
        self.num_lanes = num_lanes
        self._read = read
        self._transform = transform
        self._transform_block = transform_block
        self._ids = ids
        k = len(node.children)
        shared = DrawerLayout.of(node) if layout is None else layout
        self._leaf_base = shared.leaf_base
        self._child_transforms = shared.child_transforms
        self._ends = [end_position(child, lane, num_lanes) for child in node.children]
        # The same for the kernels: int64 arrays, -1 for no end.
        self.ends = np.array([-1 if e is None else e for e in self._ends], np.int64)
        self.quanta = shared.quanta
        self.max_tokens = shared.max_tokens
        self.rotation = derive_key(node.node_key, lane) % k
        self._ahead: list[dict[int, _Entry]] = [{} for _ in range(k)]
        self.max_chunk = max_chunk(num_lanes)
        self.ids_ahead = IdsAhead(k, self.max_chunk) if ids is not None else None
        # The fewest draws of a weighted component read ahead and not drawn yet, as of
        # the last draws of the column-wise kernel (0: unknown; see read_draws_ahead).
        self.ahead_left = 0
        self._chunk = [_FIRST_CHUNK] * k
        # Draws of each component in a row that gave no tokens (not state: a guard).
        self.dry = np.zeros(k, np.int64)
        self.dry_limit = shared.dry_limit
        self.stage = 0
        # The carry (int64 arrays, which the draw kernels update in place).
        self.credits = np.zeros(k, np.int64)
        self.next_sub = np.zeros(k, np.int64)

    # ----- state ---------------------------------------------------------------------
    def carry(self) -> tuple:
        """The carry as plain ints: ``(stage, credits, next_sub)``."""
        return (self.stage, tuple(self.credits.tolist()), tuple(self.next_sub.tolist()))

    def set_carry(self, saved: Any) -> None:
        k = len(self.node.children)
        if not (
            isinstance(saved, tuple)
            and len(saved) == 3
            and isinstance(saved[0], int)
            and 0 <= saved[0] < len(self.node.stages.values)
            and all(isinstance(x, tuple) and len(x) == k for x in saved[1:])
            and all(type(c) is int for c in saved[1])
            and sum(saved[1]) == 0  # the credits' invariant (see the module docstring)
            and all(abs(c) < _CARRY_BOUND for c in saved[1])
            and all(type(s) is int and 0 <= s < _CARRY_BOUND for s in saved[2])
        ):
            raise StateError(
                f"lane {self.lane}: the state's mixture carry {saved!r:.80} does not fit this "
                f"pipeline's mixture of {k} datasets and {len(self.node.stages.values)} stages"
            )
        self.stage = saved[0]
        self.credits = np.array(saved[1], np.int64)
        self.next_sub = np.array(saved[2], np.int64)
        self.dry[:] = 0
        for ahead in self._ahead:
            ahead.clear()
        if self.ids_ahead is not None:
            self.ids_ahead.clear()
        self.ahead_left = 0

    # ----- drawing -------------------------------------------------------------------
    def draw(self, stage: int, position: int) -> Element | Any | None:
        """The record at lane-local ``position``, drawn with the weights of ``stage``.

        Returns an :class:`Element` with lineage ``(position, component, sub)``,
        ``DROP`` if a filter dropped it, or ``None`` once every component with a
        positive weight in ``stage`` is past its last epoch.
        """
        self.enter_stage(stage)
        quanta = self.quanta[stage]
        credits, next_sub, ends = self.credits, self.next_sub, self.ends
        while True:
            best = pick_component(quanta, credits, next_sub, ends, self.rotation)
            if best < 0:
                return None
            sub = int(next_sub[best])
            entry = self._entry(best, sub)
            next_sub[best] = sub + 1
            if entry.data is None:  # a draw of a nested mixture past one source's epochs
                continue
            n = entry.tokens
            if not n and self.node.unit == "tokens":
                self.dry[best] += 1
                if self.dry[best] > self.dry_limit[best]:
                    self.raise_dry(best, sub)
            elif n:
                if n > self.max_tokens:
                    self.raise_too_long(best, sub, n)
                self.dry[best] = 0
                pay_credits(quanta, credits, next_sub, ends, best, n)
            return self._finish(entry.data, position, best, sub)

    def enter_stage(self, stage: int) -> None:
        """Draws from now on follow ``stage``'s weights (a new stage's credits start from
        zero)."""
        if stage != self.stage:
            self.stage = stage
            self.credits = np.zeros(len(self.credits), np.int64)
            self.ahead_left = 0  # (other components may have weights now)

    def raise_too_long(self, component: int, sub: int, n: int) -> None:
        """Raises the error for draw ``sub`` of ``component`` counting ``n`` tokens, more
        than :attr:`max_tokens`."""
        raise RecordError(
            f"{self._where(component, sub)} has {n} tokens, more than a mixture of "
            f"{len(self.credits)} datasets by tokens can count ({self.max_tokens}); "
            "cut such records shorter before mixing (e.g. with a map)"
        )

    def raise_dry(self, component: int, sub: int) -> None:
        """Raises the error for too many draws of ``component`` without tokens, the last
        being draw ``sub``."""
        count = int(self.dry[component])
        labels = ", ".join(
            leaf.name if leaf.name is not None else source_label(leaf.source)
            for leaf in leaves(self.node.children[component])
        )
        raise RecordError(
            f"lane {self.lane}: mixture component {component} ({labels}) gave no tokens in its "
            f"last {count} draws (component draws {sub - count + 1}..{sub}, 16 times its size "
            f"plus {DRY_DRAWS}): its filter dropped every record, or its records have empty "
            "'tokens'. A mixture by tokens draws the component owed the most tokens until "
            "one of its records gives some, so the other components would never be drawn and "
            "the loader would wait forever. Check the component's filter and transforms (a "
            "field renamed? a threshold inverted?), or leave it out of the mixture (weight 0 "
            "in the stages where it is empty)"
        )

    def _finish(self, data: Any, position: int, component: int, sub: int) -> Any:
        if data is DROP:
            return DROP
        lineage = draw_lineage(position, component, sub)
        if self.node.transforms:
            data = self._transform(
                self.node.transforms, data, position, self._where(component, sub, position)
            )
            if data is DROP:
                return DROP
        return Element(data, lineage)

    def _entry(self, component: int, sub: int) -> _Entry:
        ahead = self._ahead[component]
        entry = ahead.pop(sub, None)
        if entry is not None:
            return entry
        subs = self._next_chunk(component, sub)
        ahead.update(zip(subs.tolist(), self._read_component(component, subs)))
        return ahead.pop(sub)

    def _next_chunk(self, component: int, sub: int) -> np.ndarray:
        """The draws of ``component`` to read ahead from ``sub`` on (its read-ahead, now
        empty, grows for the next chunk)."""
        self._ahead[component].clear()
        count = self._chunk[component]
        self._chunk[component] = min(self.max_chunk, count * 2)
        end = self._ends[component]
        stop = sub + count if end is None else min(sub + count, end)
        return np.arange(sub, max(stop, sub + 1), dtype=np.int64)

    def read_ids_ahead(self, component: int, sub: int) -> None:
        """Reads ahead the next chunk of draws of ``component`` from ``sub`` on as ids
        and lengths (see ``ids``): nothing is read."""
        subs = self._next_chunk(component, sub)
        child = self.node.children[component]
        located = self._ids_of(component, resolve(child, self.lane, subs, self.num_lanes))
        assert self._ids is not None
        self._put_ids(component, subs, located, self._ids(*located[1:]))

    def _put_ids(
        self, component: int, subs: np.ndarray, located: tuple, lengths: np.ndarray
    ) -> None:
        """Holds draws ``subs`` of ``component`` read ahead as ids (see :class:`IdsAhead`):
        ``located`` is what :meth:`_ids_of` gave, ``lengths`` the documents' lengths."""
        valid, leaf_ids, records = located
        counts = np.ones(len(valid), np.int64) if self.node.unit == "records" else lengths
        assert self.ids_ahead is not None
        self.ids_ahead.put(component, subs, valid, leaf_ids, records, counts)

    def _ids_of(self, component: int, res: Resolution) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Which of the draws of ``component`` that resolve to ``res`` have a record, and
        those's global sampler leaves and records."""
        valid = np.flatnonzero(res.valid)
        return valid, self._leaf_base[component] + res.leaf[valid], res.record[valid]

    def _read_component(self, component: int, subs: np.ndarray) -> list[_Entry]:
        """Component-local draws ``subs``, read and transformed (batched per source)."""
        out, groups = self._locate_component(component, subs)
        for leaf, where, records in groups:
            datas = self._read(self._leaf_base[component] + leaf, records)
            self._fill_component(component, subs, out, leaf, where, datas)
        return out

    def _locate_component(
        self, component: int, subs: np.ndarray, res: Resolution | None = None
    ) -> tuple[list[_Entry], list[tuple[int, np.ndarray, list[int]]]]:
        """Entries for draws ``subs`` (all without data yet) and, per leaf of the
        component, ``(leaf, where, records)``: the draws of it (indices into ``subs``)
        and their records (``res``: where ``subs`` resolve, if known); reads nothing."""
        if res is None:
            res = resolve(self.node.children[component], self.lane, subs, self.num_lanes)
        out: list[_Entry] = [_Entry(None, 0)] * len(subs)
        valid = np.flatnonzero(res.valid)
        groups = []
        for leaf in np.unique(res.leaf[valid]).tolist():
            where = valid[res.leaf[valid] == leaf]
            groups.append((leaf, where, res.record[where].tolist()))
        return out, groups

    def _fill_component(
        self,
        component: int,
        subs: np.ndarray,
        out: list[_Entry],
        leaf: int,
        where: np.ndarray,
        datas: list,
    ) -> None:
        """Sets ``out[where]`` to the records ``datas`` of ``leaf``, transformed."""
        transforms = self._child_transforms[component][leaf]
        block_subs = subs[where].tolist()
        if transforms and self._transform_block is not None:
            datas = self._transform_block(
                transforms,
                datas,
                [(component, sub) for sub in block_subs],
                functools.partial(_where_in, self._where, component, block_subs),
            )
        elif transforms:
            datas = [
                self._transform(transforms, d, (component, sub), self._where(component, sub))
                for d, sub in zip(datas, block_subs)
            ]
        for i, data, sub in zip(where.tolist(), datas, block_subs):
            out[i] = _Entry(data, self._tokens(data, component, sub))

    def _tokens(self, data: Any, component: int, sub: int) -> int:
        if data is DROP:
            return 0 if self.node.unit == "tokens" else 1
        if self.node.unit == "records":
            return 1
        try:
            return len(data["tokens"])
        except (KeyError, TypeError, IndexError) as e:
            fields = list(data) if isinstance(data, Mapping) else type(data).__name__
            raise RecordError(
                f"Dataset.mix(unit='tokens') counts the 'tokens' field of each record, but "
                f"{self._where(component, sub)} has none (its fields: {fields}); give every "
                "component a 'tokens' field (e.g. with .tokenize or a map before mixing), or "
                "mix with unit='records'"
            ) from e

    def _where(self, component: int, sub: int, position: int | None = None) -> str:
        at = "" if position is None else f", lane-local position {position}"
        return f"lane {self.lane}{at}, mixture component {component}, component draw {sub}"

    def locate(self, roots: Sequence[tuple]) -> list[tuple[int, int, int]]:
        """(leaf, record, epoch) of root lineages ``(position, component, sub)``; reads nothing."""
        return locate_roots(self.node, self.lane, self.num_lanes, roots)

    # ----- restoring -----------------------------------------------------------------
    def regenerate(self, lineages: Sequence[tuple]) -> dict[tuple, Any]:
        """Elements (or ``DROP``) for root lineages ``(position, component, sub)``."""
        out: dict = {}
        for component, group in _by_component(lineages).items():
            subs = np.array(list(map(draw_sub, group)), dtype=np.int64)
            self._finish_all(group, self._read_component(component, subs), out)
        return out

    def _finish_all(self, group: list[tuple], entries: list[_Entry], out: dict) -> None:
        for lineage, entry in zip(group, entries):
            if entry.data is None:
                out[lineage] = None
            else:
                out[lineage] = self._finish(entry.data, *draw_parts(lineage))


def _by_component(lineages: Sequence[tuple]) -> dict[int, list[tuple]]:
    by_component: dict[int, list[tuple]] = {}
    for lineage in lineages:
        by_component.setdefault(int(draw_component(lineage)), []).append(lineage)
    return by_component


def regenerate_lanes(
    drawers: Sequence[MixtureDrawer],
    lineages: Sequence[Sequence[tuple]],
    read: Callable[[int, list[int], str], list],
) -> list[dict[tuple, Any]]:
    """``[d.regenerate(l) for d, l in zip(drawers, lineages)]`` (drawers of one mixture),
    each sampler leaf's records read for all the drawers with one call
    ``read(leaf_id, records, who)`` (``who`` names the lanes, for errors) instead of
    one per drawer: the same elements."""
    jobs = []  # (drawer, component, lineages, subs, entries, the drawer's result)
    results: list[dict] = [{} for _ in drawers]
    by_component: dict[int, list[tuple]] = {}  # (drawer, its result, lineages, subs)
    for drawer, wanted, result in zip(drawers, lineages, results, strict=True):
        for component, group in _by_component(wanted).items():
            subs = np.array(list(map(draw_sub, group)), dtype=np.int64)
            by_component.setdefault(component, []).append((drawer, result, group, subs))
    by_leaf: dict[int, list[tuple]] = {}
    for component, asked in by_component.items():
        first = asked[0][0]
        resolved = resolve_lanes(
            first.node.children[component],
            [a[0].lane for a in asked],
            [a[3] for a in asked],
            first.num_lanes,
        )
        for (drawer, result, group, subs), res in zip(asked, resolved, strict=True):
            out, groups = drawer._locate_component(component, subs, res)
            job = (drawer, component, group, subs, out, result)
            jobs.append(job)
            for leaf, where, records in groups:
                leaf_id = drawer._leaf_base[component] + leaf
                by_leaf.setdefault(leaf_id, []).append((job, leaf, where, records))
    for leaf_id, parts in by_leaf.items():
        first, last = parts[0][0][0].lane, parts[-1][0][0].lane
        who = f"lane {first}" if first == last else f"lanes {first}..{last}"
        datas = read(leaf_id, [r for part in parts for r in part[3]], who)
        at = 0
        for (drawer, component, _, subs, out, _), leaf, where, records in parts:
            drawer._fill_component(component, subs, out, leaf, where, datas[at : at + len(records)])
            at += len(records)
    for drawer, _, group, _, out, result in jobs:
        drawer._finish_all(group, out, result)
    return results


def read_draws_ahead(drawers: Sequence[MixtureDrawer]) -> None:
    """For ``drawers`` (of one mixture, given ``ids``), reads ahead together the chunk of
    draws each would read at its next draw of each component whose read-ahead is empty:
    one resolve per component and one ``ids`` call for all the drawers, not one per
    drawer and component. The same entries as reading them one drawer at a time; only
    what is read ahead changes, no draw and no state."""
    # Only drawers whose last draws left fewer than the margin may read (a cheap test
    # first, as of their last draws: reads and stages since only raise what is left).
    drawers = [d for d in drawers if d._ids is not None and d.ahead_left < _DRAWS_MARGIN]
    if len(drawers) < 2:
        return
    first = drawers[0]
    asked = []  # per component: (component, drawers, their draws, valid, leaf ids, records)
    reads = _reads_next(drawers)
    for component, child in enumerate(first.node.children):
        todo = [drawers[i] for i in np.flatnonzero(reads[:, component]).tolist()]
        if not todo:
            continue
        subs = [d._next_chunk(component, int(d.next_sub[component])) for d in todo]
        res = resolve_flat(child, [d.lane for d in todo], subs, first.num_lanes)
        asked.append((component, todo, subs, *first._ids_of(component, res)))
    if not asked:
        return
    assert first._ids is not None
    lengths = first._ids(
        np.concatenate([a[4] for a in asked]), np.concatenate([a[5] for a in asked])
    )
    at = 0  # the valid draws of the components before
    for component, todo, subs, valid, leaf_ids, records in asked:
        ends = np.cumsum([len(wanted) for wanted in subs])
        cuts = np.searchsorted(valid, ends).tolist()  # each drawer's valid draws end
        begin = done = 0  # the draws and valid draws of the drawers before
        for d, wanted, end, stop in zip(todo, subs, ends.tolist(), cuts, strict=True):
            located = (valid[done:stop] - begin, leaf_ids[done:stop], records[done:stop])
            d._put_ids(component, wanted, located, lengths[at + done : at + stop])
            begin, done = end, stop
        at += done


def _reads_next(drawers: Sequence[MixtureDrawer]) -> np.ndarray:
    """``reads[i, j]``: whether ``drawers[i]``'s draws of component ``j`` (weighted in its
    stage, with draws left) would read ahead within the next ``_DRAWS_MARGIN``, for all
    the drawers at once (a take may draw several steps' documents, see
    :func:`~zephon_jax.engine.blocks.draw_target`: reading them here, together, spares
    the drawing kernel a stop to read one drawer's)."""
    aheads = [d.ids_ahead for d in drawers]
    subs = np.array([d.next_sub for d in drawers])
    ends = np.array([d.ends for d in drawers])
    first = np.array([a.first for a in aheads])  # type: ignore[union-attr]
    covered = first + np.array([a.size for a in aheads])  # type: ignore[union-attr]
    weighted = np.array([d.quanta[d.stage] for d in drawers]) > 0
    to_end = (ends >= 0) & (covered >= ends)  # read ahead up to the component's end
    held = (subs >= first) & ((covered - subs >= _DRAWS_MARGIN) | (to_end & (subs < covered)))
    return ~held & weighted & ((ends < 0) | (subs < ends))


def draw_table(roots: Sequence[tuple]) -> np.ndarray:
    """Root lineages ``(position, component, component draw)`` as an ``(n, 3)`` int64
    array, a row each; raises ValueError where one is not three values."""
    if roots and set(map(len, roots)) != {3}:
        raise ValueError("a root lineage is not (position, component, component draw)")
    values = itertools.chain.from_iterable(roots)
    return np.fromiter(values, np.int64, 3 * len(roots)).reshape(len(roots), 3)


def component_bases(node: ScheduledMixtureNode) -> list[int]:
    """The id of each mixture component's first leaf."""
    return np.cumsum([0] + [len(leaves(child)) for child in node.children[:-1]]).tolist()


def locate_draws(
    node: ScheduledMixtureNode, lane_of: np.ndarray, draws: np.ndarray, num_lanes: int
) -> Resolution:
    """Where root lineages read from: the leaf, record and epoch of each row
    ``(position, component, component draw)`` of ``draws`` (a :func:`draw_table`) of
    lane ``lane_of[i]``, each component's draws resolved for all the lanes together.

    A root names its component and that component's own draw, so this is a pure
    function of the lineage (no history of the lane is needed); nothing is read."""
    out = unresolved((len(draws),))
    bases = component_bases(node)
    components = draws[:, 1]
    for component in np.unique(components).tolist():
        at = np.flatnonzero(components == component)
        res = resolve_each(node.children[component], lane_of[at], draws[at, 2], num_lanes)
        out.leaf[at] = bases[component] + res.leaf
        out.record[at] = res.record
        out.epoch[at] = res.epoch
        out.valid[at] = res.valid
    return out


def locate_roots(
    node: ScheduledMixtureNode, lane: int, num_lanes: int, roots: Sequence[tuple]
) -> list[tuple[int, int, int]]:
    """(leaf, record, epoch) of root lineages ``(position, component, sub)`` of ``lane``
    (see :func:`locate_draws`)."""
    res = locate_draws(node, np.full(len(roots), lane, np.int64), draw_table(roots), num_lanes)
    return list(zip(res.leaf.tolist(), res.record.tolist(), res.epoch.tolist()))


def _where_in(where: Any, component: int, subs: Any, j: int) -> str:
    """``where(component, subs[j])``: where item ``j`` of a block of draws comes from."""
    return where(component, subs[j])
