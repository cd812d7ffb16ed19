"""Loader states: plain data, fingerprinted, mergeable across processes.

A state is a dict of plain data (no pickle)::

    {"format": "zephon_jax.state", "version": 1,
     "fingerprint": {field: str, ...},   # what the pipeline was
     "step": int,                        # global batches delivered so far
     "lanes": {"<lane>": uint8 array}}   # each covered lane's encoded state

Its size depends on the lanes it covers and the operators' carry bounds,
never on the number of steps trained.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

import numpy as np

from zephon_jax.errors import StateError, StateMismatchError

STATE_FORMAT = "zephon_jax.state"
STATE_VERSION = 1
# Compared in this order, so a mismatch names the most telling field first.
FINGERPRINT_FIELDS = (
    "global_batch_size",
    "num_lanes",
    "sources",
    "weights",
    "num_epochs",
    "seeds",
    "operators",
    "transforms",
)


def _walk_sampler(node, out: dict) -> None:
    desc = node.describe()
    if "source" in desc:
        out["sources"].append(desc["source"])
        out["num_epochs"].append(desc["num_epochs"])
        out["seeds"].append(desc["shuffle_seed"])
    else:
        out["weights"].append(desc["weights"])
        out["seeds"].append(desc["order_seed"])
        for child in node.children:
            _walk_sampler(child, out)
    out["transforms"].append([t.describe() for t in node.transforms])


def fingerprint(batched) -> dict[str, str]:
    """The pipeline fingerprint of a :class:`~zephon_jax.dataset.BatchedDataset`."""
    parts: dict[str, list] = {
        k: [] for k in ("sources", "weights", "num_epochs", "seeds", "transforms")
    }
    _walk_sampler(batched.sampler, parts)
    operators = []
    for stage in batched.stages:
        operators.append(stage.operator.describe())
        parts["transforms"].append([t.describe() for t in stage.transforms])
    fields = {
        "global_batch_size": (
            str(batched.global_batch_size)
            if not batched.is_ramp
            else json.dumps(batched.batch_schedule.describe())
        ),
        "num_lanes": str(batched.num_lanes),
        "operators": json.dumps(operators),
    }
    for key, value in parts.items():
        fields[key] = json.dumps(value)
    return {k: fields[k] for k in FINGERPRINT_FIELDS}


def make_state(fp: Mapping[str, str], step: int, lanes: Mapping[int, bytes]) -> dict[str, Any]:
    """Builds a state dict from encoded lane states."""
    return {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "fingerprint": dict(fp),
        "step": int(step),
        "lanes": {
            str(l): np.frombuffer(data, dtype=np.uint8).copy() for l, data in sorted(lanes.items())
        },
    }


def check_state(state: Any, fp: Mapping[str, str] | None = None) -> None:
    """Validates a state's form and, if ``fp`` is given, its fingerprint against it."""
    if not isinstance(state, Mapping):
        raise StateError(f"a loader state is a dict; got {type(state).__name__}")
    for key in ("format", "version", "fingerprint", "step", "lanes"):
        if key not in state:
            raise StateError(
                f"the state has no {key!r} entry; it is not a zephon_jax loader state (or it "
                "was truncated): pass what LoaderIterator.get_state() or merge_states() returned"
            )
    if state["format"] != STATE_FORMAT:
        raise StateError(f"the state's format is {state['format']!r}, not {STATE_FORMAT!r}")
    if int(state["version"]) != STATE_VERSION:
        raise StateError(
            f"the state has version {int(state['version'])}; this zephon_jax reads version "
            f"{STATE_VERSION}: restore it with the zephon_jax release that wrote it"
        )
    if fp is not None:
        saved = state["fingerprint"]
        for field in FINGERPRINT_FIELDS:
            if field not in saved:
                raise StateError(f"the state's fingerprint has no {field!r} field; it is corrupt")
            if str(saved[field]) != fp[field]:
                raise StateMismatchError(field, str(saved[field]), fp[field])


def lane_bytes(state: Mapping[str, Any], lane: int) -> bytes:
    """The encoded state of ``lane``; raises if the state does not cover it."""
    lanes = state["lanes"]
    data = lanes.get(str(lane))
    if data is None:
        have = sorted(int(k) for k in lanes)
        raise StateError(
            f"the state does not cover lane {lane} (it covers lanes {_ranges(have)}); a state from "
            "one process covers only that process's lanes: merge the states of all processes "
            "with zephon_jax.merge_states(...) before restoring on another topology"
        )
    return np.asarray(data, dtype=np.uint8).tobytes()


def _ranges(values: list[int]) -> str:
    if not values:
        return "none"
    parts, start, prev = [], values[0], values[0]
    for v in values[1:] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ", ".join(parts)


def merge_states(states: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Combines the states of all processes of one topology into one global state.

    All states must come from the same pipeline and step. Lanes computed by
    several processes must agree. The result restores onto any topology,
    provided together the states cover every lane.
    """
    states = list(states)
    if not states:
        raise StateError("merge_states needs at least one state")
    first = states[0]
    check_state(first)
    lanes: dict[str, np.ndarray] = {}
    for i, state in enumerate(states):
        check_state(state, first["fingerprint"])
        if int(state["step"]) != int(first["step"]):
            raise StateError(
                f"state {i} is at step {int(state['step'])} but state 0 at step "
                f"{int(first['step'])}; merge states taken after the same global batch"
            )
        for lane, data in state["lanes"].items():
            data = np.asarray(data, dtype=np.uint8)
            if lane in lanes and not np.array_equal(lanes[lane], data):
                raise StateError(
                    f"states disagree on lane {lane}; the processes ran different pipelines "
                    "or the states are from different runs"
                )
            lanes[lane] = data
    merged = dict(first)
    merged["fingerprint"] = dict(first["fingerprint"])
    merged["lanes"] = {k: lanes[k] for k in sorted(lanes, key=int)}
    return merged
