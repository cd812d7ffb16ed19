"""The compiled kernels: numba functions at module level, imported only with numba.

Each kernel is a plain module-level function, and the ones that call each other
name each other as globals, never as closure cells: numba's on-disk cache
(``cache=True``, beside this file, or under ``NUMBA_CACHE_DIR`` where the package
directory is read-only) then finds them again in every new process and loader
worker, so only the first run on a machine compiles them, and the cache holds
one entry per kernel and signature however many runs there are. See
:mod:`zephon_jax.core.kernels` for what each kernel does.
"""

from __future__ import annotations

import numba
import numpy as np

from zephon_jax.core.kernel_codes import DONE, OUT_FULL, ROW_FULL
from zephon_jax.core.lineage import PIECE_BITS

_jit = numba.njit(cache=True, nogil=True)


@_jit
def emit(i, fill, count, pieces, out, row_end, n_out, n_rows):
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


@_jit
def to_end(slots, at):
    """Moves ``slots[at]`` after the others; returns its new place."""
    row = slots[at]
    last = slots.shape[0] - 1
    for a in range(at, last):
        slots[a] = slots[a + 1]
    slots[last] = row
    return last


@_jit
def place(fill, count, pieces, slots, offsets, bases, leaves, records, positions, k0, j0,
           cut, seq_len, max_segments, best, out, row_end):  # fmt: skip
    """Places pieces of documents ``records[k]`` of leaves ``leaves[k]`` (at lane
    ``positions[k]``), from piece ``j0`` of document ``k0`` on, into the open rows.

    Leaf ``l``'s document ``d`` spans ``offsets[bases[l] + d]`` to the next offset.
    ``fill[i]``/``count[i]``: tokens and pieces in row ``i``; ``pieces[:, i, :count[i]]``
    its pieces as (lineage code, token start, length, leaf); ``slots``: the rows in the
    order first_fit scans them (the order they opened; an emitted row moves to the
    end), unused by best_fit, which scans rows by index; ``cut`` > 0 cuts documents
    into pieces of at most ``cut`` (code ``~((position << PIECE_BITS) | j)``), 0 takes them
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
                code = ~((position << PIECE_BITS) | j)
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
                return k, j, n_out, n_rows, OUT_FULL
            if fill[i] > room:
                n_out, n_rows = emit(i, fill, count, pieces, out, row_end, n_out, n_rows)
                if not best:
                    at = to_end(slots, at)
            if count[i] == cap:
                return k, j, n_out, n_rows, ROW_FULL
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
    return records.shape[0], 0, n_out, n_rows, DONE


@_jit
def gather(tokens, starts, lengths, leaves, row_end, counting, low, high, values, segment_ids,
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


@_jit
def mix64(x):
    """SplitMix64's finalizer on one uint64, as :func:`zephon_jax.core.permutation._mix64`."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@_jit
def permute(x, n, a, b, round_keys, out):
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
                    left = (left + mix64(right ^ round_keys[r]) % a) % a
                else:
                    right = (right + mix64(left ^ round_keys[r]) % b) % b
            v = left * b + right
            if v < n:
                break
        out[i] = np.int64(v)
