"""Accounting: what a run has delivered, per source and per mixture stage, kept in the state.

Every lane keeps a few counters (a :class:`Tally`) that grow when its rows of a
global batch are delivered: per sampler leaf (source) the real tokens, the
segments and the documents started in those rows and the highest epoch seen,
per stage of a mixture by tokens or with weight stages the tokens of each
component, and the number of steps skipped with
:meth:`~zephon_jax.LoaderIterator.skip`. They are part of the lane's state, so
they survive checkpoints and restores on any topology, and their size depends
on the sources and stages, never on the steps trained.

The counters are exactly what summing :meth:`~zephon_jax.LoaderIterator.provenance`
over every delivered step gives, segment by segment:

* ``tokens``: ``stop - start`` of each segment; a segment that holds a whole
  record of unrecorded length (``stop`` is ``None``, an unpacked unsplit row)
  counts the length of its row's ``"tokens"`` field (or of the row, if it is an
  array);
* ``segments``: one per segment;
* ``documents``: the segments that begin at their record's first token
  (``start`` is 0 or ``None``, and ``output``, after ``flat_map``, absent or 0);
* ``epoch``: the highest epoch among the segments.

A lane counts in bulk, not per batch: as rows reach its queue of finished rows
it keeps a compact block of what will be counted of them (for rows out of
``pack``, whose other operators are ``split`` or passthrough, two int64 arrays of
their pieces, taken from the rows' lineages or, on the compiled path, from the
kernel's output), and it counts the delivered ones (those no longer queued) every
few hundred rows, at the end of a mixture stage, when a skip passes over rows,
and when a state is encoded, vectorized over all of them. Any other pipeline
keeps the rows' lineages and walks them to their records as provenance does.

Segments of records made by a user operator that keeps no pointers (``source``
is ``None``) count for no source. Once a finite input ends, the lanes that still
made rows for the batch that could not be completed have counted them too (each
lane counts on its own, so its state does not depend on which lanes a process or
worker runs).
"""

from __future__ import annotations

import json
from itertools import chain
from operator import itemgetter
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from zephon_jax.envelope import is_int
from zephon_jax.errors import PipelineError, StateError
from zephon_jax.lineage import PIECE_BITS, PIECE_MASK, Opaque, plain_lineage

# Per leaf: tokens, segments, documents, highest epoch + 1 (0: none delivered).
Locate = Callable[[np.ndarray], "tuple[np.ndarray, np.ndarray]"]
LEAF_FIELDS = 4


def record_tokens(data: Any) -> int:
    """The tokens of a row holding one whole record: its ``"tokens"`` field's length, or
    the row's length if it is an array; 0 for anything else."""
    if isinstance(data, Mapping):
        data = data.get("tokens")
    shape = np.shape(data) if data is not None else ()
    return int(shape[0]) if shape else 0


def fast_cut(plan: Any) -> int | None:
    """For a pipeline whose rows come out of ``pack`` with every other operator a
    ``split`` (at most one) or a passthrough (and no mixture by tokens or stages), the
    split's ``max_len`` (0 without split): its rows' pieces are read from their
    lineages directly, many rows at once. None for any other pipeline."""
    from zephon_jax.operators.pack import BinPackOperator
    from zephon_jax.operators.split import SplitOperator

    ops = plan.operators
    if plan.mixture is not None or not ops or type(ops[-1]) is not BinPackOperator:
        return None
    splits = [op for op in ops[:-1] if type(op) is SplitOperator]
    if len(splits) > 1 or any(not op.passthrough for op in ops[:-1] if op not in splits):
        return None
    return splits[0].max_len if splits else 0


class Tally:
    """A lane's counters of delivered and skipped data (see the module docstring).

    Rows are counted in bulk: :meth:`add` takes the lineages of many delivered rows
    at once (a lane hands over those delivered since it last counted, see
    :meth:`Lane.count_delivered <zephon_jax.lane.Lane.count_delivered>`), with
    ``stage`` the mixture stage they were delivered in.
    """

    __slots__ = (
        "skipped", "leaves", "stages", "stage", "component_of", "stage_schedule",
        "_components", "_plan", "_lane", "_cut",
    )  # fmt: skip

    def __init__(self, plan: Any, lane: int = 0):
        from zephon_jax.sampler.resolve import leaves

        self._plan = plan
        self._lane = lane
        self._cut = fast_cut(plan)
        self.skipped = 0
        self.stage = 0  # the mixture stage of the rows delivered and not yet counted
        self.leaves = [0] * (LEAF_FIELDS * len(plan.leaves))
        mixture = plan.mixture
        if mixture is None:
            self.component_of: list[int] | None = None
            self.stage_schedule = None
            self._components = 0
            self.stages: list[int] = []
        else:
            self.component_of = [
                k for k, child in enumerate(mixture.children) for _ in leaves(child)
            ]
            self.stage_schedule = mixture.stages
            self._components = len(mixture.children)
            self.stages = [0] * (len(mixture.stages.starts) * self._components)

    @property
    def counts_packed(self) -> bool:
        """Whether rows are counted from their pieces' arrays (see :func:`fast_cut`)."""
        return self._cut is not None

    def block(self, rows: Sequence[Any]) -> tuple:
        """What :meth:`add` counts of ``rows`` (elements, in the order they were made),
        kept until they are delivered: for rows out of ``pack`` (see :func:`fast_cut`) their
        pieces, as :func:`listed_block` gives them (the compiled path passes the arrays
        ``(codes, lengths, ends)`` instead: a position or a
        :func:`~zephon_jax.lineage.piece_code` and a length per piece, ``ends[i]`` the
        pieces of rows ``0..i``); else ``(lineages, record tokens or None)``."""
        lineages = [row.lineage for row in rows]
        if self._cut is not None:
            listed = listed_block(lineages)
            if listed is not None:
                return listed
        tokens = [record_tokens(row.data) for row in rows] if self._cut is None else None
        return (lineages, tokens)

    def add(self, blocks: Sequence[tuple], locate: Locate | None = None) -> None:
        """Counts the delivered rows of ``blocks`` (see :meth:`block`) in stage
        :attr:`stage`; ``locate(positions)`` gives the leaf and epoch of lane-local
        positions (default: the sampler resolves them)."""
        listed = [block for block in blocks if len(block) == 4]
        if len(listed) > 1:  # one conversion for all (parents of one form, as a rule)
            converted = _codes(list(chain.from_iterable(block[0] for block in listed)), False)
            if converted is not None:
                joined = list(chain.from_iterable(block[1] for block in listed))
                packed = (converted, np.array(joined, np.int64), None)
                blocks = [block for block in blocks if len(block) != 4] + [packed]
        codes, lengths = [], []
        for block in blocks:
            if len(block) == 3:
                codes.append(block[0])
                lengths.append(block[1])
            elif len(block) == 4:
                flat, counts = block[0], block[2]
                converted = _codes(flat)
                if converted is None:  # parents of another form: traced
                    ends = np.cumsum(counts).tolist()
                    lineages = [
                        (tuple(flat[a:b]), tuple(block[1][a:b]))
                        for a, b in zip([0, *ends[:-1]], ends)
                    ]
                    self._add_traced(lineages, None)
                    continue
                codes.append(converted)
                lengths.append(np.array(block[1], np.int64))
            else:
                self._add_traced(*block)
        if codes:
            self._add_packed(np.concatenate(codes), np.concatenate(lengths), locate)

    def _add_packed(self, codes: np.ndarray, lengths: np.ndarray, locate: Locate | None) -> None:
        """Counts pieces of rows out of ``pack``: ``codes`` positions (>= 0) of whole
        records or split pieces (< 0), ``lengths`` their tokens; vectorized."""
        if not len(codes):
            return
        pieces = codes < 0
        code = ~codes
        positions = np.where(pieces, code >> PIECE_BITS, codes)
        firsts = ~pieces | ((code & PIECE_MASK) == 0)  # starts at its record's first token
        if locate is None:
            from zephon_jax.sampler.resolve import resolve

            plan = self._plan
            unique, where = np.unique(positions, return_inverse=True)
            res = resolve(plan.sampler, self._lane, unique, plan.num_lanes)
            leaf, epoch = res.leaf[where], res.epoch[where]
        else:
            leaf, epoch = locate(positions)
        n = len(self.leaves) // LEAF_FIELDS
        figures: list
        if n == 1:
            figures = [[int(lengths.sum()), len(codes), int(firsts.sum()), int(epoch.max()) + 1]]
        else:
            tokens = np.zeros(n, np.int64)
            np.add.at(tokens, leaf, lengths)
            segments = np.bincount(leaf, minlength=n)
            documents = np.bincount(leaf[firsts], minlength=n)
            epochs = np.zeros(n, np.int64)
            np.maximum.at(epochs, leaf, epoch + 1)
            figures = list(
                zip(tokens.tolist(), segments.tolist(), documents.tolist(), epochs.tolist())
            )
        counts = self.leaves
        for i, (t, g, d, e) in enumerate(figures):
            at = LEAF_FIELDS * i
            counts[at] += t
            counts[at + 1] += g
            counts[at + 2] += d
            if e > counts[at + 3]:
                counts[at + 3] = e

    def _add_traced(self, lineages: Sequence[Any], tokens: Sequence[int] | None) -> None:
        """Counts rows by walking each one's lineage to its records, as provenance does."""
        from zephon_jax.provenance import locate_pieces, row_pieces

        plan = self._plan
        rows = [row_pieces(plan.operators, plain_lineage(lineage)) for lineage in lineages]
        located = locate_pieces(plan, self._lane, rows)
        counts = self.leaves
        component_of = self.component_of
        stage_tokens = self.stages
        base_stage = self.stage * self._components
        for r, pieces in enumerate(rows):
            alone = len(pieces) == 1
            for piece in pieces:
                lineage = piece.lineage
                if type(lineage) is Opaque:  # a record of a user operator: no source
                    continue
                leaf, _, epoch = located[lineage if type(lineage) is tuple else int(lineage)]
                start, stop = piece.start, piece.stop
                if stop is not None:
                    n = stop - (start or 0)
                else:
                    n = tokens[r] if alone and tokens is not None else 0
                at = LEAF_FIELDS * leaf
                counts[at] += n
                counts[at + 1] += 1
                if not start and not piece.output:  # starts at its record's first token
                    counts[at + 2] += 1
                if epoch >= counts[at + 3]:
                    counts[at + 3] = epoch + 1
                if component_of is not None:
                    stage_tokens[base_stage + component_of[leaf]] += n

    def saved(self) -> tuple:
        """The counters as plain data: ``(skipped, leaf counters, stage tokens)``."""
        return (self.skipped, tuple(self.leaves), tuple(self.stages))

    def copy(self) -> Tally:
        """An independent copy (the same pipeline and lane)."""
        other = Tally.__new__(Tally)
        for name in Tally.__slots__:
            setattr(other, name, getattr(self, name))
        other.leaves = list(self.leaves)
        other.stages = list(self.stages)
        return other

    def load(self, saved: Any, lane: int) -> None:
        """Takes the counters of ``saved`` (see :meth:`saved`), checked against this
        pipeline's sources and stages."""
        skipped, counts, stages = plain_tally(saved)
        if len(counts) != len(self.leaves) or len(stages) != len(self.stages):
            raise StateError(
                f"lane {lane}: the state's accounting has {len(counts) // LEAF_FIELDS} sources "
                f"and {len(stages)} stage counters, this pipeline {len(self.leaves) // LEAF_FIELDS}"
                f" and {len(self.stages)}; the state was altered or comes from another pipeline"
            )
        self.skipped = skipped
        self.leaves = list(counts)
        self.stages = list(stages)


def _split_pieces(parents: list) -> np.ndarray | None:
    """Pieces of ``split`` written in full, ``((position,), piece)``, as
    :func:`~zephon_jax.lineage.piece_code` ints; None if ``parents`` are not all such."""
    try:
        positions = np.array([p[0] for p in parents], np.int64)
        pieces = np.array([p[1] for p in parents], np.int64)
    except (TypeError, ValueError, OverflowError, IndexError):
        return _mixed_pieces(parents)
    if positions.shape != (len(parents), 1) or pieces.shape != (len(parents),):
        return None
    if len(parents) and (positions.min() < 0 or pieces.min() < 0 or pieces.max() > PIECE_MASK):
        return None
    return ~((positions[:, 0] << PIECE_BITS) | pieces)


def _mixed_pieces(parents: list) -> np.ndarray | None:
    """As :func:`_split_pieces` for parents some of which are codes already."""
    codes = []
    for p in parents:
        if type(p) is int:
            codes.append(p)
            continue
        if not (
            type(p) is tuple
            and len(p) == 2
            and type(p[0]) is tuple
            and len(p[0]) == 1
            and type(p[0][0]) is int
            and type(p[1]) is int
            and p[0][0] >= 0
            and 0 <= p[1] <= PIECE_MASK
        ):
            return None
        codes.append(~((p[0][0] << PIECE_BITS) | p[1]))
    try:
        return np.array(codes, np.int64)
    except OverflowError:
        return None


def listed_block(lineages: Sequence[Any]) -> tuple | None:
    """``(parents, lengths, counts, 0)`` of rows out of ``pack`` of ``lineages`` (see
    :meth:`Tally.block`): their parents and the parents' lengths one after the other,
    and each row's number of parents (plain lists, made into arrays when counted);
    None where a lineage is not ``(parents, lengths)``."""
    try:
        parents = [lineage[0] for lineage in lineages]
        flat = list(chain.from_iterable(parents))
        lengths = list(chain.from_iterable(map(itemgetter(1), lineages)))
        counts = list(map(len, parents))
    except (TypeError, IndexError):
        return None
    if len(flat) != len(lengths):
        return None
    return (flat, lengths, counts, 0)


def _codes(parents: list, split: bool = True) -> np.ndarray | None:
    """Parents of packed rows as one int each: a position (>= 0) or a piece of split (a
    :func:`~zephon_jax.lineage.piece_code`); None where one is of another form (with
    ``split=False``, also where one is a piece of split written in full)."""
    try:
        codes = np.array(parents, np.int64)  # ints: positions and split's pieces as codes
    except (TypeError, ValueError, OverflowError):
        return _split_pieces(parents) if split else None
    return codes if codes.ndim == 1 else None


def block_rows(block: tuple) -> int:
    """The rows of a block (see :meth:`Tally.block`)."""
    return len(block[0]) if len(block) == 2 else len(block[2])


def take_blocks(blocks: list, n: int) -> tuple[list, list]:
    """The blocks of the first ``n`` rows of ``blocks``, and those of the rest (new
    lists; ``blocks`` is not changed)."""
    taken = []
    for i, block in enumerate(blocks):
        rows = block_rows(block)
        if n >= rows:
            taken.append(block)
            n -= rows
            if n == 0:
                return taken, blocks[i + 1 :]
            continue
        rest: tuple
        if len(block) == 3:
            codes, lengths, ends = block
            cut = int(ends[n - 1])
            taken.append((codes[:cut], lengths[:cut], ends[:n]))
            rest = (codes[cut:], lengths[cut:], ends[n:] - cut)
        elif len(block) == 4:
            flat, lengths, counts, _ = block
            cut = sum(counts[:n])
            taken.append((flat[:cut], lengths[:cut], counts[:n], 0))
            rest = (flat[cut:], lengths[cut:], counts[n:], 0)
        else:
            lineages, tokens = block
            taken.append((lineages[:n], None if tokens is None else tokens[:n]))
            rest = (lineages[n:], None if tokens is None else tokens[n:])
        return taken, [rest, *blocks[i + 1 :]]
    return taken, []


class DeliveredTally:
    """A lane's counters as a snapshot took them: those counted, and the rows delivered
    since, counted only when the saved form is asked for (a snapshot is taken every
    batch and must stay cheap). Pickles as the plain saved tuple."""

    __slots__ = ("_tally", "_blocks", "_done", "_saved")

    def __init__(self, tally: Tally, blocks: list, done: int):
        self._tally = tally.copy()
        self._blocks: list | None = blocks  # never changed in place by the lane
        self._done = done
        self._saved: tuple | None = None

    def saved(self) -> tuple:
        """The plain saved form (see :meth:`Tally.saved`)."""
        if self._saved is None:
            if self._done > 0 and self._blocks is not None:
                self._tally.add(take_blocks(self._blocks, self._done)[0])
            self._saved = self._tally.saved()
            self._blocks = None
        return self._saved

    def __reduce__(self):
        return (tuple, (self.saved(),))

    def __eq__(self, other: object) -> bool:
        return plain_tally(self) == plain_tally(other)

    __hash__ = None  # type: ignore[assignment]


def plain_tally(saved: Any) -> Any:
    """A snapshot's accounting as plain data (a :class:`DeliveredTally` counted)."""
    return saved.saved() if type(saved) is DeliveredTally else saved


def check_saved_tally(saved: Any, lane: int) -> None:
    """Raises a StateError unless ``saved`` has the form :meth:`Tally.saved` writes."""
    saved = plain_tally(saved)
    if not (isinstance(saved, tuple) and len(saved) == 3):
        raise StateError(
            f"lane {lane}: the state's accounting is {saved!r:.80}, not (skipped, sources, "
            "stages); the state was altered"
        )
    skipped, counts, stages = saved
    ok = is_int(skipped) and skipped >= 0
    for part in (counts, stages):
        ok = ok and isinstance(part, tuple) and all(is_int(v) and v >= 0 for v in part)
    if not ok or len(counts) % LEAF_FIELDS:
        raise StateError(
            f"lane {lane}: the state's accounting {saved!r:.120} is malformed (counters are "
            "ints >= 0, four per source); the state was altered"
        )


# ----- reports --------------------------------------------------------------------------


def accounting(
    state: Mapping[str, Any],
    dataset: Any = None,
    *,
    lanes: Iterable[int] | None = None,
) -> dict[str, Any]:
    """What the lanes of ``state`` have delivered: a report as
    :meth:`~zephon_jax.LoaderIterator.accounting` returns it.

    For a merged state (:func:`~zephon_jax.merge_states`) or one saved by a single
    process, the figures are global. With ``dataset`` (the batched dataset the
    state belongs to, checked against its fingerprint) the sources are named as
    provenance names them; without it, by their description in the state's
    fingerprint. ``lanes`` restricts the report to those lanes. Cost: one decoding
    of each lane's state.
    """
    from zephon_jax.lane_state import decode_lane_state
    from zephon_jax.state import check_state, lane_bytes

    fp = None
    if dataset is not None:
        from zephon_jax.dataset import BatchedDataset

        if not isinstance(dataset, BatchedDataset):
            raise PipelineError(
                f"accounting(state, dataset) needs the batched dataset; got "
                f"{type(dataset).__name__}: pass the pipeline finished with .batch(...)"
            )
        fp = dataset.fingerprint()
    check_state(state, fp)
    saved_fp = state["fingerprint"]
    sources = json.loads(saved_fp["sources"])
    num_operators = len(json.loads(saved_fp["operators"]))
    if dataset is not None:
        from zephon_jax.lane import LanePlan

        labels = LanePlan(dataset).leaf_labels
    else:
        labels = list(sources)
    wanted = sorted(int(l) for l in state["lanes"]) if lanes is None else sorted(set(lanes))
    tallies = {}
    for lane in wanted:
        snapshot = decode_lane_state(lane, lane_bytes(state, lane), num_operators, can_end=True)
        tallies[lane] = snapshot.tally
    return report(tallies, int(state["step"]), labels, _stage_weights(saved_fp))


def _stage_weights(fp: Mapping[str, str]) -> tuple[list[int], list[list[float]]] | None:
    """``(starts, weights)`` of the stages of a mixture by tokens or with weight stages at
    the root of the sampler (from a fingerprint), else None."""
    weights = json.loads(fp["weights"])
    if not weights or not isinstance(weights[0], dict) or "stages" not in weights[0]:
        return None
    stages = weights[0]["stages"]
    starts = sorted(int(s) for s in stages)
    return starts, [list(stages[str(s)]) for s in starts]


def _keys(labels: Sequence[str]) -> list[str]:
    """The report's key of each source: its label, with ``(source i)`` added where
    several sources share a label."""
    return [
        label if labels.count(label) == 1 else f"{label} (source {i})"
        for i, label in enumerate(labels)
    ]


def report(
    tallies: Mapping[int, tuple],
    step: int,
    labels: Sequence[str],
    stages: tuple[list[int], list[list[float]]] | None,
) -> dict[str, Any]:
    """The accounting report of lanes' saved tallies (``{lane: Tally.saved()}``) at
    global step ``step``."""
    skipped = {int(t[0]) for t in tallies.values()}
    if len(skipped) > 1:
        raise StateError(
            f"the state's lanes skipped different numbers of steps {sorted(skipped)}; merge "
            "states taken after the same global batch of one run"
        )
    skip = skipped.pop() if skipped else 0
    counts = np.zeros(LEAF_FIELDS * len(labels), dtype=np.int64)
    for lane, saved in tallies.items():
        if len(saved[1]) != len(counts):
            raise StateError(
                f"lane {lane}: the state's accounting counts {len(saved[1]) // LEAF_FIELDS} "
                f"sources, the pipeline has {len(labels)}; the state was altered"
            )
        leaf_counts = np.asarray(saved[1], dtype=np.int64)
        epochs = np.maximum(counts[3::LEAF_FIELDS], leaf_counts[3::LEAF_FIELDS])
        counts += leaf_counts
        counts[3::LEAF_FIELDS] = epochs
    out_sources = {}
    for i, key in enumerate(_keys(list(labels))):
        c = counts[LEAF_FIELDS * i : LEAF_FIELDS * (i + 1)].tolist()
        out_sources[key] = {
            "source": i,
            "tokens": c[0],
            "segments": c[1],
            "documents": c[2],
            "epoch": c[3] - 1 if c[3] else None,
        }
    out_stages = []
    if stages is not None:
        starts, weights = stages
        components = len(weights[0]) if weights else 0
        tokens = np.zeros(len(starts) * components, dtype=np.int64)
        for saved in tallies.values():
            if saved[2]:
                tokens += np.asarray(saved[2], dtype=np.int64)
        for k, (start, w) in enumerate(zip(starts, weights)):
            out_stages.append(
                _stage(start, w, tokens[k * components : (k + 1) * components].tolist())
            )
    return {
        "step": step,
        "steps": step - skip,
        "skipped": skip,
        "lanes": sorted(int(l) for l in tallies),
        "sources": out_sources,
        "stages": out_stages,
    }


def _stage(start: int, weights: Sequence[float], tokens: Sequence[int]) -> dict[str, Any]:
    total = sum(tokens)
    return {
        "start": start,
        "weights": list(weights),
        "tokens": list(tokens),
        "shares": [t / total if total else 0.0 for t in tokens],
    }


def merge_accounting(reports: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The global accounting of a run from the reports of all its processes.

    Each process's :meth:`~zephon_jax.LoaderIterator.accounting` covers the lanes
    it saves (every lane is counted by exactly one process); the reports must be
    taken after the same global batch, and no lane may appear twice.
    """
    reports = list(reports)
    if not reports:
        raise PipelineError("merge_accounting needs at least one report")
    first = reports[0]
    lanes: set[int] = set()
    sources: dict[str, dict[str, Any]] = {}
    stages = [dict(s, tokens=list(s["tokens"])) for s in first["stages"]]
    for i, rep in enumerate(reports):
        for key in ("step", "skipped"):
            if rep[key] != first[key]:
                raise PipelineError(
                    f"report {i} has {key}={rep[key]} but report 0 {key}={first[key]}; merge "
                    "the reports of one run taken after the same global batch"
                )
        both = lanes & set(rep["lanes"])
        if both:
            raise PipelineError(
                f"report {i} counts lanes {sorted(both)[:8]} that an earlier report counts "
                "too; pass one report per process (each counts the lanes it saves)"
            )
        lanes.update(rep["lanes"])
        for key, figures in rep["sources"].items():
            have = sources.get(key)
            if have is None:
                sources[key] = dict(figures)
                continue
            for field in ("tokens", "segments", "documents"):
                have[field] += figures[field]
            epochs = [e for e in (have["epoch"], figures["epoch"]) if e is not None]
            have["epoch"] = max(epochs) if epochs else None
        if i:
            if len(rep["stages"]) != len(stages):
                raise PipelineError(f"report {i} has other mixture stages than report 0")
            for mine, theirs in zip(stages, rep["stages"]):
                mine["tokens"] = [a + b for a, b in zip(mine["tokens"], theirs["tokens"])]
    return {
        "step": first["step"],
        "steps": first["steps"],
        "skipped": first["skipped"],
        "lanes": sorted(lanes),
        "sources": sources,
        "stages": [_stage(s["start"], s["weights"], s["tokens"]) for s in stages],
    }
