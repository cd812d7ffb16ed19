"""Accounting reports: the lanes' tallies in a state (see :mod:`zephon_jax.engine.accounting`)
summed into per-source and per-stage figures, and the reports of several processes merged."""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from zephon_jax.engine.accounting import LEAF_FIELDS, plain_tally
from zephon_jax.engine.lane import LanePlan
from zephon_jax.errors import PipelineError, StateError
from zephon_jax.state.global_state import check_state, lane_bytes
from zephon_jax.state.lane_format import decode_lane_state


def accounting(
    state: Mapping[str, Any], dataset: Any = None, *, lanes: Iterable[int] | None = None
) -> dict[str, Any]:
    """What the lanes of ``state`` have delivered: a report as
    :meth:`~zephon_jax.LoaderIterator.accounting` returns it.

    For a merged state (:func:`~zephon_jax.merge_states`) or one saved by a single
    process, the figures are global. With ``dataset`` (the batched dataset the state
    belongs to, checked against its fingerprint) the sources are keyed by their
    provenance labels; without it, by ``"source <i>"``. ``lanes`` restricts the report
    to those lanes. Cost: one decoding of each lane's state.
    """
    fp = None
    if dataset is not None:
        if not hasattr(dataset, "fingerprint") or not hasattr(dataset, "num_lanes"):
            raise PipelineError(
                f"accounting(state, dataset) needs the batched dataset; got "
                f"{type(dataset).__name__}: pass the pipeline finished with .batch(...)"
            )
        fp = dataset.fingerprint()
    check_state(state, fp)
    saved_fp = state["fingerprint"]
    num_operators = len(json.loads(saved_fp["operators"]))
    if dataset is not None:
        labels = LanePlan(dataset).leaf_labels
    else:
        labels = [f"source {i}" for i in range(len(json.loads(saved_fp["sources"])))]
    wanted = sorted(int(l) for l in state["lanes"]) if lanes is None else sorted(set(lanes))
    tallies = {
        lane: decode_lane_state(lane, lane_bytes(state, lane), num_operators, can_end=True).tally
        for lane in wanted
    }
    return report(tallies, int(state["step"]), labels, stage_weights(saved_fp))


def stage_weights(fp: Mapping[str, str]) -> tuple[list[int], list[list[float]]] | None:
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


def _sum_sources(tallies: Mapping[int, Any], n: int) -> np.ndarray:
    counts = np.zeros(LEAF_FIELDS * n, dtype=np.int64)
    for lane, saved in tallies.items():
        leaf_counts = np.asarray(saved[1], dtype=np.int64)
        if len(leaf_counts) != len(counts):
            raise StateError(
                f"lane {lane}: the state's accounting counts {len(leaf_counts) // LEAF_FIELDS} "
                f"sources, the pipeline has {n}; the state was altered"
            )
        epochs = np.maximum(counts[3::LEAF_FIELDS], leaf_counts[3::LEAF_FIELDS])
        counts += leaf_counts
        counts[3::LEAF_FIELDS] = epochs
    return counts


def report(
    tallies: Mapping[int, Any],
    step: int,
    labels: Sequence[str],
    stages: tuple[list[int], list[list[float]]] | None,
) -> dict[str, Any]:
    """The accounting report of lanes' tallies (``{lane: (skipped, sources, stages)}``)
    at global step ``step``."""
    tallies = {lane: plain_tally(saved) for lane, saved in tallies.items()}
    skipped = {int(t[0]) for t in tallies.values()}
    if len(skipped) > 1:
        raise StateError(
            f"the state's lanes skipped different numbers of steps {sorted(skipped)}; merge "
            "states taken after the same global batch of one run"
        )
    skip = skipped.pop() if skipped else 0
    counts = _sum_sources(tallies, len(labels))
    sources = {}
    for i, key in enumerate(_keys(list(labels))):
        c = counts[LEAF_FIELDS * i : LEAF_FIELDS * (i + 1)].tolist()
        sources[key] = {
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
        "sources": sources,
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

    Each process's :meth:`~zephon_jax.LoaderIterator.accounting` covers the lanes it
    saves (every lane is counted by exactly one process); the reports must be taken
    after the same global batch, and no lane may appear twice.
    """
    reports = list(reports)
    if not reports:
        raise PipelineError("merge_accounting needs at least one report")
    first = reports[0]
    lanes: set[int] = set()
    sources: dict[str, dict[str, Any]] = {}
    stages = [dict(s, tokens=list(s["tokens"])) for s in first["stages"]]
    for i, rep in enumerate(reports):
        _check_mergeable(i, rep, first, lanes)
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


def _check_mergeable(i: int, rep: Mapping[str, Any], first: Mapping[str, Any], lanes: set) -> None:
    for key in ("step", "skipped"):
        if rep[key] != first[key]:
            raise PipelineError(
                f"report {i} has {key}={rep[key]} but report 0 {key}={first[key]}; merge "
                "the reports of one run taken after the same global batch"
            )
    both = lanes & set(rep["lanes"])
    if both:
        raise PipelineError(
            f"report {i} counts lanes {sorted(both)[:8]} that an earlier report counts too; "
            "pass one report per process (each counts the lanes it saves)"
        )
    if len(rep["stages"]) != len(first["stages"]):
        raise PipelineError(f"report {i} has other mixture stages than report 0")
