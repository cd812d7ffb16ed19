"""Compiled kernels (numba, from the ``fast`` extra) for the hot loops.

:func:`kernels` returns them, or ``None`` when numba is not installed or the
environment sets ``ZEPHON_JAX_COMPILED=0``; callers then take their Python
path, which gives the same results bit for bit. The kernels are compiled on
first use (about a second per process; cached on disk where the package
directory is writable).

``place``: places the pieces of a block of documents into one lane's open rows,
exactly as :meth:`~zephon_jax.operators.pack.BinPackOperator.step_block` does
(best_fit: the fullest row with room, the lowest of equals; first_fit: the
first row with room, in the order the rows opened; if none has room, the
fullest row is emitted and the piece starts a new row, for first_fit after the
others; a row is emitted once full or at ``max_segments``). ``gather``: writes packed rows into the batch arrays.
``permute``: the sampler's keyed permutation
(:func:`~zephon_jax.sampler.permutation.permute`), element by element.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import numpy as np

_KERNELS: Any = False  # not yet looked for


def kernels() -> Any:
    """The compiled kernels (``place``, ``gather``, ``permute``), or ``None`` without numba."""
    global _KERNELS
    if _KERNELS is False:
        _KERNELS = None if os.environ.get("ZEPHON_JAX_COMPILED") == "0" else _compile()
    return _KERNELS


def loaded_kernels() -> Any:
    """The kernels if something already asked for them (a pipeline that packs token
    arrays), else ``None``: the sampler's permutation uses them then, without making
    every process that shuffles import numba."""
    return _KERNELS or None


def _compile() -> Any:
    try:
        import numba
    except ImportError:
        return None
    jit = numba.njit(cache=True, nogil=True)
    mix = jit(_mix64)
    place = jit(_place_with(jit(_emit), jit(_to_end)))
    return SimpleNamespace(
        place=place, gather=jit(_gather), permute=jit(_permute_with(mix)), mix64=mix
    )


# Stop codes of ``place``.
DONE, OUT_FULL, ROW_FULL = 0, 1, 2


def _emit(i, fill, count, pieces, out, row_end, n_out, n_rows):
    """Emits open row ``i``: its pieces to ``out`` from ``n_out`` on, its end to
    ``row_end[n_rows]``; the row is empty again. Returns the new ``(n_out, n_rows)``."""
    for m in range(count[i]):
        for f in range(4):
            out[f, n_out] = pieces[f, i, m]
        n_out += 1
    row_end[n_rows] = n_out
    fill[i] = 0
    count[i] = 0
    return n_out, n_rows + 1


def _to_end(slots, at):
    """Moves ``slots[at]`` after the others; returns its new place."""
    row = slots[at]
    last = slots.shape[0] - 1
    for a in range(at, last):
        slots[a] = slots[a + 1]
    slots[last] = row
    return last


def _place_with(emit, to_end):
    def _place(fill, count, pieces, slots, offsets, bases, leaves, records, positions, k0, j0,
               cut, seq_len, max_segments, best, out, row_end):  # fmt: skip
        """Places pieces of documents ``records[k]`` of leaves ``leaves[k]`` (at lane
        ``positions[k]``), from piece ``j0`` of document ``k0`` on, into the open rows.

        Leaf ``l``'s document ``d`` spans ``offsets[bases[l] + d]`` to the next offset.
        ``fill[i]``/``count[i]``: tokens and pieces in row ``i``; ``pieces[:, i, :count[i]]``
        its pieces as (lineage code, token start, length, leaf); ``slots``: the rows in the
        order first_fit scans them (the order they opened; an emitted row moves to the
        end), unused by best_fit, which scans rows by index; ``cut`` > 0 cuts documents
        into pieces of at most ``cut`` (code ``~((position << 24) | j)``), 0 takes them
        whole (code: the position). Emitted rows go to ``out`` (pieces) and ``row_end``
        (each row's end in ``out``). Returns ``(k, j, pieces out, rows out, stop)``: where it
        stopped and why (``DONE``; ``OUT_FULL``, ``ROW_FULL``: grow that array and go on from
        piece ``j`` of document ``k``; nothing of that piece is placed yet).
        """
        num_bins = fill.shape[0]
        cap = pieces.shape[2]
        out_cap = out.shape[1]
        n_out = 0
        n_rows = 0
        j = j0
        for k in range(k0, records.shape[0]):
            leaf = leaves[k]
            r = bases[leaf] + records[k]
            s0 = offsets[r]
            n = offsets[r + 1] - s0
            if n == 0:
                j = 0
                continue
            npieces = (n + cut - 1) // cut if cut > 0 else 1
            position = positions[k]
            while j < npieces:
                if cut > 0:
                    start = s0 + j * cut
                    length = min(cut, n - j * cut)
                    code = ~((position << 24) | j)
                else:
                    start = s0
                    length = n
                    code = position
                room = seq_len - length
                i = -1
                at = -1  # first_fit: the row's place in ``slots``
                if best:
                    top = -1
                    for b in range(num_bins):
                        if fill[b] <= room and fill[b] > top:
                            top = fill[b]
                            i = b
                else:
                    for a in range(num_bins):
                        if fill[slots[a]] <= room:
                            at = a
                            i = slots[a]
                            break
                if i < 0:  # no row has room: the fullest (the lowest of equals) goes out
                    top = -1
                    for a in range(num_bins):
                        b = a if best else slots[a]
                        if fill[b] > top:
                            top = fill[b]
                            at = a
                            i = b
                if n_out + count[i] + 1 > out_cap or n_rows + 2 > row_end.shape[0]:
                    return k, j, n_out, n_rows, 1
                if fill[i] > room:
                    n_out, n_rows = emit(i, fill, count, pieces, out, row_end, n_out, n_rows)
                    if not best:
                        at = to_end(slots, at)
                if count[i] == cap:
                    return k, j, n_out, n_rows, 2
                m = count[i]
                pieces[0, i, m] = code
                pieces[1, i, m] = start
                pieces[2, i, m] = length
                pieces[3, i, m] = leaf
                count[i] = m + 1
                fill[i] += length
                if fill[i] == seq_len or count[i] == max_segments:
                    n_out, n_rows = emit(i, fill, count, pieces, out, row_end, n_out, n_rows)
                    if not best:
                        to_end(slots, at)
                j += 1
            j = 0
        return records.shape[0], 0, n_out, n_rows, 0

    return _place


def _gather(tokens, starts, lengths, leaves, row_end, counting, low, high, values, segment_ids,
            positions):  # fmt: skip
    """Row ``r`` of the batch from pieces ``row_end[r - 1]:row_end[r]``: their tokens one
    after the other (piece ``k`` from ``tokens[leaves[k]]``), segment ids 1, 2, ... and
    positions 0, 1, ... (``counting[:n]``) within each piece; zeros after the last piece.
    With ``low <= high``, first checks that every token lies in ``[low, high]`` (what the
    output dtype holds) and returns False, writing nothing, if one does not; else True."""
    if low <= high:
        for k in range(starts.shape[0]):
            source = tokens[leaves[k]]
            s = starts[k]
            for t in range(s, s + lengths[k]):
                if source[t] < low or source[t] > high:
                    return False
    begin = 0
    for r in range(values.shape[0]):
        row, segments, row_positions = values[r], segment_ids[r], positions[r]
        at = 0
        segment = 1
        for k in range(begin, row_end[r]):
            s = starts[k]
            n = lengths[k]
            row[at : at + n] = tokens[leaves[k]][s : s + n]
            segments[at : at + n] = segment
            row_positions[at : at + n] = counting[:n]
            at += n
            segment += 1
        row[at:] = 0
        segments[at:] = 0
        row_positions[at:] = 0
        begin = row_end[r]
    return True


def _mix64(x):
    """SplitMix64's finalizer on one uint64, as :func:`zephon_jax.sampler.permutation._mix64`."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _permute_with(mix):
    def _permute(x, n, a, b, round_keys, out):
        """``out[i]``: the image of ``x[i]`` (uint64, below ``n``) under the Feistel
        network over ``Z_a x Z_b`` with ``round_keys``, cycle-walked into ``[0, n)``."""
        rounds = round_keys.shape[0]
        for i in range(x.shape[0]):
            v = x[i]
            while True:
                left = v // b
                right = v - left * b
                for r in range(rounds):
                    if r % 2 == 0:
                        left = (left + mix(right ^ round_keys[r]) % a) % a
                    else:
                        right = (right + mix(left ^ round_keys[r]) % b) % b
                v = left * b + right
                if v < n:
                    break
            out[i] = np.int64(v)

    return _permute
