"""The sizes of the blocks in which a lane pushes records through its operators.

A take that still needs ``missing`` rows reads a first block of
``first_block(missing, cap, least)`` records (8 per row still needed, at least
``least``, at most 128, and at most ``cap``), doubling while blocks yield no row
(:func:`next_block`). ``cap`` (:func:`block_cap`) keeps a block to about 32 rows'
worth of records at the rate the lane has made rows so far, so a pipeline that
makes many rows of each record (a ``flat_map`` of whole files into passages, say)
reads a record or two at a time; before its first row a lane starts with 2
records. ``least`` (:func:`min_block`) is 32 records, or more where the loader has
few lanes (fewer, larger blocks: each block costs a placement call), while all its
lanes together stay within ``MIN_BLOCK_ALL_LANES``. The sizes depend only on the
lane's state and the number of lanes, so a restored lane cuts the
same blocks, and a lane makes about one block of rows ahead at most (they are
part of its state, as pointers). Rows do not depend on the blocks; states do
(which rows are made ahead), so every path of a lane uses these sizes.

A lane drawing from a mixture draws one record at a time instead, and a take draws
until the lane holds :func:`draw_target` rows: those of its step and of the next
steps in the same stage of the mixture's weights, up to :func:`draw_ahead` rows
(the draws depend on the stage only, so these are the rows those steps would draw).
"""

from __future__ import annotations

from typing import Any, Callable

BLOCK_PER_ROW = 8  # records per row still needed
MIN_BLOCK = 32  # a lane that owns one row reads 32 records at once ...
MIN_BLOCK_FEW_LANES = 128  # ... or up to this many where the loader has few lanes ...
MIN_BLOCK_ALL_LANES = 8192  # ... while all its lanes' least blocks stay within these
MAX_BLOCK = 128
ROWS_PER_BLOCK = 32  # rows' worth of records a block starts with, at most
FIRST_BLOCK = 2  # records of a lane's first block, before it made a row
DRAW_AHEAD = 8  # rows a take of a mixture lane draws for at most (whole steps) ...
DRAW_AHEAD_MAX = 16  # ... or up to this many where the loader has few lanes ...
DRAW_AHEAD_ALL_LANES = 2048  # ... while all its lanes together draw for at most these


def block_cap(records_read: int, rows_made: int) -> int:
    """The most records a block starts with: ``ROWS_PER_BLOCK`` rows' worth at the
    lane's rate so far (``records_read`` positions for ``rows_made`` rows), at least
    one; ``FIRST_BLOCK`` before the lane made a row."""
    if rows_made <= 0:
        return FIRST_BLOCK
    return max(1, min(MAX_BLOCK, -(-records_read * ROWS_PER_BLOCK // rows_made)))


def min_block(num_lanes: int) -> int:
    """The least records a block starts with when the loader has ``num_lanes`` lanes:
    ``MIN_BLOCK``, or more (up to ``MIN_BLOCK_FEW_LANES``) while all lanes together stay
    within ``MIN_BLOCK_ALL_LANES``. Fewer placement calls with few lanes; with many, the
    rows each lane makes ahead (part of a state, and rebuilt by a restore) stay few."""
    return max(MIN_BLOCK, min(MIN_BLOCK_FEW_LANES, MIN_BLOCK_ALL_LANES // max(1, num_lanes)))


def first_block(missing: int, cap: int = MAX_BLOCK, least: int = MIN_BLOCK) -> int:
    """The records of a take's first block when it still needs ``missing`` rows
    (``cap``: see :func:`block_cap`; ``least``: see :func:`min_block`)."""
    return min(cap, MAX_BLOCK, max(least, BLOCK_PER_ROW * missing))


def next_block(
    size: int, missing: int, grew: bool, cap: int = MAX_BLOCK, least: int = MIN_BLOCK
) -> int:
    """The next block's records after one of ``size`` (0: none yet); ``grew``: whether
    the last block made a row; ``cap``, ``least``: see :func:`first_block`."""
    need = first_block(missing, cap, least)
    return need if grew or not size else min(MAX_BLOCK, max(2 * size, need))


def draw_ahead(num_lanes: int) -> int:
    """The most rows a take of a mixture lane draws for when the loader has
    ``num_lanes`` lanes: ``DRAW_AHEAD``, or more (up to ``DRAW_AHEAD_MAX``) while all
    lanes together stay within ``DRAW_AHEAD_ALL_LANES``. Fewer draw calls with few
    lanes; with many, a state's rows made ahead (rebuilt by a restore) stay bounded."""
    return max(DRAW_AHEAD, min(DRAW_AHEAD_MAX, DRAW_AHEAD_ALL_LANES // max(1, num_lanes)))


def draw_target(
    step: int, n: int, same_stage_until: int, rows_at: Callable[[int], int] | int, ahead: int
) -> int:
    """The rows a lane drawing from a mixture holds once a take of ``n`` rows at
    ``step`` has drawn: ``n``, plus the rows of the next steps (``rows_at(s)`` at step
    ``s``; an int: the same at every step) before ``same_stage_until`` (the first step
    of the next stage), whole steps while the total stays within ``min(ahead, n +
    step)`` (``ahead``: see :func:`draw_ahead`; so a new lane's first takes draw only
    what they take). One draw call then makes the rows of several steps."""
    limit = min(ahead, n + step)
    if isinstance(rows_at, int):  # whole steps of ``rows_at`` rows, by arithmetic
        steps = min(same_stage_until - step - 1, (limit - n) // rows_at if rows_at else 0)
        return n + max(0, steps) * rows_at
    total = n
    step += 1
    while step < same_stage_until:
        rows = rows_at(step)
        if total + rows > limit:
            break
        total += rows
        step += 1
    return total


# Reads the lane's next records: ``read(size) -> (block, counted)`` for the records at
# the next ``size`` positions (fewer at the end of the input), ``block`` what is left to
# place (None: nothing) and ``counted`` how many count towards the no-progress error;
# None past the end of the input.
ReadBlock = Callable[[int], "tuple[Any, int] | None"]


def fill_pending(lane: Any, n: int, read: ReadBlock, place: Callable[[Any], None]) -> bool:
    """Reads blocks of the lane's records and places them (``place(block)``, which puts
    the rows they finish into ``lane.pending``) until the lane holds ``n`` finished rows;
    False if its input ends first. The one block loop of every path of a lane without a
    mixture drawer: the block sizes (see :func:`next_block`), the end of the input
    (``lane.finish_input()``) and the no-progress error (``lane.raise_no_progress()``
    once more than ``max_records_without_row`` records in a row made no row; no block
    reads past the record that makes it)."""
    pending = lane.pending
    limit = lane.plan.max_records_without_row
    size = 0
    had = -1
    while len(pending) < n:
        if lane.input_done:
            return False
        missing, grew = n - len(pending), len(pending) != had
        size = next_block(size, missing, grew, lane.block_cap(n), lane.plan.min_block)
        had = len(pending)
        got = read(min(size, limit + 1 - lane.without_row))
        if got is None:
            lane.finish_input()
            continue
        block, counted = got
        lane.without_row += counted  # reset when a row reaches ``pending``
        if block is not None:
            place(block)
        if lane.without_row > limit:
            lane.raise_no_progress()
    return True
