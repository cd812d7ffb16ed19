"""Explaining a past step: the provenance of global batch ``t``, recomputed from a state.

:func:`explain_step` replays only the lanes behind the requested rows, from a
state at or before ``t`` (or from the beginning), and returns what
:meth:`~zephon_jax.LoaderIterator.provenance` returns right after batch ``t``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from zephon_jax.dataset import BatchedDataset
from zephon_jax.engine.provenance import Segment
from zephon_jax.engine.rows import RowProducer, checked_rows
from zephon_jax.errors import PipelineError
from zephon_jax.state.global_state import check_state


def explain_step(
    dataset: Any,
    step: int,
    *,
    state: Mapping[str, Any] | None = None,
    rows: Sequence[int] | None = None,
) -> list[list[Segment]]:
    """The provenance of global batch ``step`` (0-based), rows ``rows`` (default: all).

    With ``state`` (a loader state at or before ``step``: from ``get_state``,
    ``merge_states`` or :func:`zephon_jax.load_state`), only the batches between
    it and ``step`` are produced, and only by the lanes behind ``rows`` at ``step``
    (also under a batch-size ramp-up: a state of one process explains that
    process's rows); without it, the run starts from the beginning. It returns what
    :meth:`~zephon_jax.LoaderIterator.provenance` returns right after batch
    ``step`` on any topology.
    """
    if not isinstance(dataset, BatchedDataset):
        raise PipelineError(
            f"explain_step needs a batched dataset; got {type(dataset).__name__}: finish the "
            "pipeline with .batch(global_batch_size)"
        )
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise PipelineError(f"explain_step(step) needs an int >= 0; got {step!r}")
    size = dataset.batch_size_at(int(step))
    rows = checked_rows(dataset, range(size) if rows is None else rows, size)
    # Only the lanes behind ``rows`` at ``step`` run (a lane owns rows of every step: its
    # own block of each batch size); the batches before ``step`` pick no rows.
    producer = RowProducer(dataset, {n: rows if n == size else [] for n in dataset.batch_sizes})
    start = 0
    if state is not None:
        check_state(state, dataset.fingerprint())
        start = int(state["step"])
        if start > step:
            raise PipelineError(
                f"the state is at step {start}, after step {step}: a state can only explain the "
                "steps from its own on; use an earlier state or none (start from the beginning)"
            )
        producer.restore(state)
    for t in range(start, step + 1):
        if producer.next_rows() is None:
            raise PipelineError(
                f"the pipeline's finite input ends at step {t}, before step {step}: there is no "
                f"global batch {step}"
            )
    return producer.provenance()
