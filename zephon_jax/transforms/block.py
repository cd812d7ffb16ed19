"""Per-record transforms over a block of records, batched where a transform can.

A lane reads records in blocks. :func:`apply_transforms_block` runs the
transforms one at a time over a block: a transform with an
``apply_batch(records, rng_keys)`` method gets all the records still kept in
one call (``tokenize`` encodes a block of texts at once); the others get them
one by one through ``apply``. Packed rows reach them as plain dicts. The contract of ``apply_batch`` is that it
returns exactly ``[apply(r, k) for r, k in zip(records, rng_keys)]``, so
batching changes speed, never outputs.
"""

from __future__ import annotations

from typing import Any, Sequence

from zephon_jax.core.packed import plain
from zephon_jax.errors import PipelineError, ZephonError
from zephon_jax.transforms.filter import FilterTransform

DROP = FilterTransform.DROP


class BlockFailed(Exception):
    """``transform`` raised ``error`` on record ``index`` of a block (chained as cause)."""

    def __init__(self, index: int, transform: Any, error: BaseException):
        super().__init__(index)
        self.index = index
        self.transform = transform
        self.error = error


def apply_transforms_block(
    transforms: Sequence[Any], datas: Sequence[Any], lane: int, stage: int, lineages: Sequence
) -> list:
    """The records of a block after ``transforms``; ``DROP`` marks dropped records.

    Record ``i`` gets the rng key ``(lane, stage, lineages[i])``, as one by one.
    If a batched call fails, the block is redone record by record, so that the
    ``BlockFailed`` raised names the failing record.
    """
    datas = [plain(data) for data in datas] if transforms else list(datas)
    alive = list(range(len(datas)))
    for transform in transforms:
        batch = getattr(transform, "apply_batch", None)
        outs = None
        if batch is not None and len(alive) > 1:
            try:
                outs = batch([datas[i] for i in alive], [(lane, stage, lineages[i]) for i in alive])
            except Exception:
                outs = None  # redone one by one below, to name the failing record
            if outs is not None and len(outs) != len(alive):
                raise PipelineError(
                    f"{transform.describe()}.apply_batch returned {len(outs)} records for "
                    f"{len(alive)}; it must return one record per input, in order"
                )
        if outs is None:
            outs = []
            for i in alive:
                try:
                    outs.append(transform.apply(datas[i], (lane, stage, lineages[i])))
                except Exception as e:
                    raise BlockFailed(i, transform, e) from e
        for i, data in zip(alive, outs):
            datas[i] = data
        alive = [i for i in alive if datas[i] is not DROP]
    return datas


def block_error(failed: BlockFailed, where: str, user_error, after: str = ""):
    """``(error, cause)`` to raise for a failed record found ``where``.

    A PipelineError gains the place; another ZephonError passes as it is; an
    error of a user function becomes ``user_error(name, where, error)`` (a
    RecordError naming the transform).
    """
    e = failed.error
    if isinstance(e, PipelineError):
        return PipelineError(f"{e}\n  (at {where})"), e
    if isinstance(e, ZephonError):
        return e, e.__cause__
    return user_error(f"{failed.transform.describe()}{after}", where, e), e
