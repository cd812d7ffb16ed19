"""The sizes of the blocks in which a lane pushes records through its operators.

A take that still needs ``missing`` rows reads a first block of
``first_block(missing)`` records (8 per row still needed, at least 32, at most
128), doubling while blocks yield no row (:func:`next_block`). The sizes depend
only on the lane's state, so a restored lane cuts the same blocks, and a lane
makes about one block of rows ahead at most (they are part of its state, as
pointers). Rows do not depend on the blocks; states do (which rows are made
ahead), so every path of a lane uses these sizes.
"""

from __future__ import annotations

BLOCK_PER_ROW = 8  # records per row still needed
MIN_BLOCK = 32  # a lane that owns one row reads 32 records at once
MAX_BLOCK = 128


def first_block(missing: int) -> int:
    """The records of a take's first block when it still needs ``missing`` rows."""
    return min(MAX_BLOCK, max(MIN_BLOCK, BLOCK_PER_ROW * missing))


def next_block(size: int, missing: int, grew: bool) -> int:
    """The next block's records after one of ``size`` (0: none yet); ``grew``: whether
    the last block made a row."""
    need = first_block(missing)
    return need if grew or not size else min(MAX_BLOCK, max(2 * size, need))
