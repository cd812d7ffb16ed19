"""Loader states: plain data, fingerprinted, mergeable across processes.

A state is a dict of plain data (no pickle)::

    {"format": "zephon_jax.state.global_state", "version": 1,
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

from zephon_jax.errors import PipelineError, StateError, StateMismatchError
from zephon_jax.state.envelope import STATE, is_int

STATE_FORMAT = STATE.format
STATE_VERSION = STATE.version
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
# Not compared: the seeds given to Dataset.shuffle, which a 'seeds' mismatch shows (the
# 'seeds' field holds the per-node seeds derived from them).
SEEDS_GIVEN = "seeds_given"


def _walk_sampler(node, out: dict) -> None:
    desc = node.describe()
    if node.given_seed is not None and node.given_seed not in out[SEEDS_GIVEN]:
        out[SEEDS_GIVEN].append(node.given_seed)
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
    """The pipeline fingerprint of a :class:`~zephon_jax.dataset.BatchedDataset`: the
    compared ``FINGERPRINT_FIELDS``, and ``SEEDS_GIVEN`` (for messages only)."""
    parts: dict[str, list] = {
        k: [] for k in ("sources", "weights", "num_epochs", "seeds", "transforms", SEEDS_GIVEN)
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
    return {k: fields[k] for k in (*FINGERPRINT_FIELDS, SEEDS_GIVEN)}


def _shown(field: str, saved: Mapping[str, Any], fp: Mapping[str, Any]) -> tuple | None:
    """For a 'seeds' mismatch: the seeds given to ``shuffle`` on both sides, as the
    user wrote them, where both fingerprints carry them and they differ; else None."""
    if field != "seeds":
        return None
    before, now = saved.get(SEEDS_GIVEN), fp.get(SEEDS_GIVEN)
    if not isinstance(before, str) or not isinstance(now, str) or before == now:
        return None
    try:
        return _describe_seeds(before), _describe_seeds(now)
    except (ValueError, TypeError, IndexError):  # an altered state: show the fingerprint's
        return None


def _describe_seeds(given: str) -> str:
    seeds = list(json.loads(given))
    if not seeds:
        return "not shuffled"
    return f"shuffle({seeds[0]})" if len(seeds) == 1 else f"shuffle seeds {seeds}"


def make_state(
    fp: Mapping[str, str], step: int, lanes: Mapping[int, bytes], exclude: tuple = ()
) -> dict[str, Any]:
    """Builds a state dict from encoded lane states (and an exclusion list, see
    :func:`exclude`; the ``"exclude"`` entry is there only when it is not empty)."""
    state = {
        **STATE.header(),
        "fingerprint": dict(fp),
        "step": int(step),
        "lanes": {
            str(l): np.frombuffer(data, dtype=np.uint8).copy() for l, data in sorted(lanes.items())
        },
    }
    if exclude:
        state[EXCLUDE] = [list(pair) for pair in exclude]
    return state


# The state's entry listing the excluded documents as [label or source index, record].
EXCLUDE = "exclude"


def _exclusion_key(pair: tuple) -> tuple:
    label, record = pair
    return (isinstance(label, str), label, record)


def exclusion_of(state: Mapping[str, Any]) -> tuple[tuple[Any, int], ...]:
    """The state's exclusion list as sorted ``(label or source index, record)`` pairs
    (empty without one); a StateError if it is malformed."""
    listed = state.get(EXCLUDE)
    if listed is None:
        return ()
    pairs = _exclusion_pairs(listed, StateError, "the state's 'exclude' entry")
    return tuple(sorted(set(pairs), key=_exclusion_key))


def _exclusion_pairs(listed: Any, error: type, what: str) -> list[tuple[Any, int]]:
    if isinstance(listed, (str, bytes, Mapping)) or not hasattr(listed, "__iter__"):
        raise error(f"{what} must list (label, record) pairs; got {type(listed).__name__}")
    pairs = []
    for item in listed:
        try:
            label, record = item
        except (TypeError, ValueError):
            raise error(
                f"{what} holds {item!r:.60}, not a (label, record) pair as provenance() "
                "reports them (its 'label' or 'source', and its 'record')"
            ) from None
        ok_label = isinstance(label, str) or (is_int(label) and label >= 0)
        if not ok_label or not is_int(record) or record < 0:
            raise error(
                f"{what} holds {item!r:.60}: a label is a source's label (str) or index "
                "(int >= 0), a record an int >= 0, as provenance() reports them"
            )
        pairs.append((label if isinstance(label, str) else int(label), int(record)))
    return pairs


def exclude(state: Mapping[str, Any], documents: Iterable[tuple[Any, int]]) -> dict[str, Any]:
    """``state`` with ``documents`` excluded from its step on: a new state.

    ``documents`` are ``(label, record)`` pairs as
    :meth:`~zephon_jax.LoaderIterator.provenance` reports them (the segment's
    ``label``, or its ``source`` index where several sources share a label, and its
    ``record``). Restored, the state drops those records wherever they would appear
    from its step on, also those an operator holds in its carry or a finished row
    not yet batched holds (see :mod:`zephon_jax.engine.exclusion`): the batches after
    are a pure function of the pipeline, the state and the list, the same on any
    topology. The batches before the state's step are untouched. Exclusions
    accumulate (the state's list and ``documents``) and stay in every later state;
    a state with an exclusion restores into the same pipeline only.
    """
    check_state(state)
    added = _exclusion_pairs(documents, PipelineError, "exclude(state, documents): documents")
    pairs = sorted(set(exclusion_of(state)) | set(added), key=_exclusion_key)
    out = dict(state)
    out[EXCLUDE] = [list(pair) for pair in pairs]
    return out


def check_state(state: Any, fp: Mapping[str, str] | None = None) -> None:
    """Validates a state's whole form and, if ``fp`` is given, its fingerprint against it.

    Every entry is checked for its type and for impossible values (a negative
    step, a lane outside the pipeline's lanes, lane bytes that are not bytes),
    so a malformed state raises :class:`StateError` naming the entry before
    anything is restored.
    """
    if not isinstance(state, Mapping):
        raise StateError(f"a loader state is a dict; got {type(state).__name__}")
    for key in ("format", "version", "fingerprint", "step", "lanes"):
        if key not in state:
            raise StateError(
                f"the state has no {key!r} entry; it is not a zephon_jax loader state (or it "
                "was truncated): pass what LoaderIterator.get_state() or merge_states() returned"
            )
    STATE.check(state, "the state")
    saved = state["fingerprint"]
    if not isinstance(saved, Mapping):
        raise StateError(
            f"the state's 'fingerprint' is a {type(saved).__name__}, not a dict of str; the "
            "state was altered"
        )
    for field in FINGERPRINT_FIELDS:
        if field not in saved:
            raise StateError(f"the state's fingerprint has no {field!r} field; it is corrupt")
        if not isinstance(saved[field], str):
            raise StateError(
                f"the state's fingerprint field {field!r} is a {type(saved[field]).__name__}, "
                "not a str; the state was altered"
            )
    if fp is not None:
        for field in FINGERPRINT_FIELDS:
            if saved[field] != fp[field]:
                raise StateMismatchError(field, saved[field], fp[field], _shown(field, saved, fp))
    step = state["step"]
    if not is_int(step) or step < 0:
        raise StateError(
            f"the state's 'step' is {step!r} ({type(step).__name__}); it must be an int >= 0 "
            "(the number of global batches delivered): the state was altered"
        )
    lanes = state["lanes"]
    if not isinstance(lanes, Mapping):
        raise StateError(
            f"the state's 'lanes' is a {type(lanes).__name__}, not a dict from lane to bytes; "
            "the state was altered"
        )
    num_lanes = int(saved["num_lanes"]) if saved["num_lanes"].isdigit() else None
    for key, data in lanes.items():
        lane = _lane_key(key, num_lanes)
        _blob(data, f"the state's lanes[{lane!r}]")
    exclusion_of(state)


def _lane_key(key: Any, num_lanes: int | None) -> str:
    if not (isinstance(key, str) and key.isdigit() and str(int(key)) == key):
        raise StateError(
            f"the state's 'lanes' has the key {key!r}; lane keys are lane numbers written as "
            "text ('0', '1', ...): the state was altered"
        )
    if num_lanes is not None and int(key) >= num_lanes:
        raise StateError(
            f"the state's 'lanes' has lane {key}, but its pipeline has {num_lanes} lanes; the "
            "state was altered"
        )
    return key


def _blob(data: Any, what: str) -> bytes:
    """Lane bytes from their saved forms: a uint8 array, bytes, or a list of ints (JSON)."""
    if isinstance(data, (bytes, bytearray)):
        return bytes(data)
    if isinstance(data, np.ndarray):
        if data.dtype == np.uint8 and data.ndim == 1:
            return data.tobytes()
    elif isinstance(data, (list, tuple)):
        if all(is_int(b) and 0 <= b < 256 for b in data):
            return bytes(int(b) for b in data)
    shown = f"a {data.dtype} array of shape {data.shape}" if isinstance(data, np.ndarray) else None
    raise StateError(
        f"{what} is {shown or type(data).__name__}; a lane state is bytes (a 1-D uint8 array, "
        "or a list of ints 0..255 after JSON): the state was altered"
    )


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
    return _blob(data, f"the state's lanes[{str(lane)!r}]")


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
        if exclusion_of(state) != exclusion_of(first):
            raise StateError(
                f"state {i} excludes other documents than state 0; merge the states of one "
                "run (every process restores the same exclusion)"
            )
        for lane, raw in state["lanes"].items():
            data = np.frombuffer(_blob(raw, f"state {i}'s lanes[{lane!r}]"), dtype=np.uint8)
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
