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

Segments of records made by a user operator that keeps no pointers (``source``
is ``None``) count for no source. Once a finite input ends, the lanes that still
made rows for the batch that could not be completed have counted them too (each
lane counts on its own, so its state does not depend on which lanes a process or
worker runs).
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from zephon_jax.envelope import is_int
from zephon_jax.errors import PipelineError, StateError
from zephon_jax.lineage import Opaque

# Per leaf: tokens, segments, documents, highest epoch + 1 (0: none delivered).
LEAF_FIELDS = 4


def record_tokens(data: Any) -> int:
    """The tokens of a row holding one whole record: its ``"tokens"`` field's length, or
    the row's length if it is an array; 0 for anything else."""
    if isinstance(data, Mapping):
        data = data.get("tokens")
    shape = np.shape(data) if data is not None else ()
    return int(shape[0]) if shape else 0


class Tally:
    """A lane's counters of delivered and skipped data (see the module docstring)."""

    __slots__ = ("skipped", "leaves", "stages", "component_of", "stage_schedule", "_components")

    def __init__(self, plan: Any):
        from zephon_jax.sampler.resolve import leaves

        self.skipped = 0
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

    def add(self, rows: Sequence[Sequence[Any]], located: Mapping[Any, tuple], datas, step: int):
        """Counts rows delivered at global step ``step``: ``rows`` their sampler-level
        pieces (see :func:`~zephon_jax.provenance.row_pieces`), ``located`` the
        ``(leaf, record, epoch)`` of each piece's root, ``datas`` the rows' data."""
        counts = self.leaves
        component_of = self.component_of
        stage_tokens = self.stages
        base_stage = 0
        schedule = self.stage_schedule
        if schedule is not None:
            base_stage = schedule.index_at(step) * self._components
        for pieces, data in zip(rows, datas):
            alone = len(pieces) == 1
            for piece in pieces:
                lineage = piece.lineage
                if type(lineage) is Opaque:  # a record of a user operator: no source
                    continue
                leaf, _, epoch = located[lineage if type(lineage) is tuple else int(lineage)]
                start, stop = piece.start, piece.stop
                if stop is not None:
                    tokens = stop - (start or 0)
                else:
                    tokens = record_tokens(data) if alone else 0
                at = LEAF_FIELDS * leaf
                counts[at] += tokens
                counts[at + 1] += 1
                if not start and not piece.output:  # starts at its record's first token
                    counts[at + 2] += 1
                if epoch >= counts[at + 3]:
                    counts[at + 3] = epoch + 1
                if component_of is not None:
                    stage_tokens[base_stage + component_of[leaf]] += tokens

    def saved(self) -> tuple:
        """The counters as plain data: ``(skipped, leaf counters, stage tokens)``."""
        return (self.skipped, tuple(self.leaves), tuple(self.stages))

    def load(self, saved: tuple, lane: int) -> None:
        """Takes the counters of ``saved`` (see :meth:`saved`), checked against this
        pipeline's sources and stages."""
        skipped, counts, stages = saved
        if len(counts) != len(self.leaves) or len(stages) != len(self.stages):
            raise StateError(
                f"lane {lane}: the state's accounting has {len(counts) // LEAF_FIELDS} sources "
                f"and {len(stages)} stage counters, this pipeline {len(self.leaves) // LEAF_FIELDS}"
                f" and {len(self.stages)}; the state was altered or comes from another pipeline"
            )
        self.skipped = skipped
        self.leaves = list(counts)
        self.stages = list(stages)


def check_saved_tally(saved: Any, lane: int) -> None:
    """Raises a StateError unless ``saved`` has the form :meth:`Tally.saved` writes."""
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
