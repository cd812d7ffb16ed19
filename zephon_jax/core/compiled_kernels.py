"""The kernels: the hot loops, each written once in the subset of Python numba compiles.

:func:`jit` compiles a kernel with numba (``numba.njit(cache=True)``) where numba
imports and the environment does not set ``ZEPHON_JAX_COMPILED=0``; otherwise it
returns the function as it is, and the same source runs interpreted, with the
same results bit for bit. :func:`interpreted` gives a kernel's source function
either way (``py_func`` of a compiled one).

Each kernel is a plain module-level function, and the ones that call each other
name each other as globals, never as closure cells: numba's on-disk cache
(beside this file, or under ``NUMBA_CACHE_DIR`` where the package directory is
read-only) then finds them again in every new process and loader worker, so
only the first run on a machine compiles them, and the cache holds one entry per
kernel and signature however many runs there are.

``place``: places pieces of documents into one lane's open rows; every ``pack``
places with it (:class:`~zephon_jax.operators.pack.Bins` over records,
:class:`~zephon_jax.operators.token_bins.TokenBins` over token arrays). The rules,
one piece at a time (:func:`place_piece`): best_fit takes the fullest row with
room (the lowest of equals), first_fit the first row with room in the order the
rows opened; if none has room, the fullest row (the lowest of equals) is emitted
and the piece starts a new row there, for first_fit after the others; a row is
emitted once full or at ``max_segments``. ``gather``: writes packed rows (or the
fields a ``to_training`` fused into it makes of them) into the batch arrays.
``collect_pieces``: a batch's rows' pieces, from the arrays their placements emitted;
``take_front``: where those rows are in them, for all lanes taking from their first runs.
``count_drawn`` and ``add_pieces``: the accounting's counters of delivered pieces
(:mod:`zephon_jax.engine.accounting`).
``draw_pieces`` and ``draw_rows``: read a run of a mixture lane's record pointers, and
its rows made ahead, from a state's bytes (:mod:`zephon_jax.state.codec`).
``mix64`` and ``permute``: the sampler's keyed hash and permutation
(:mod:`zephon_jax.core.permutation`). ``span_runs``: the byte runs of a plain TokenStore's
shard files that hold given token spans (:mod:`zephon_jax.sources.shard_files`).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Callable, TypeVar

import numpy as np

from zephon_jax.core.lineage import decode_piece, piece_code

# Stop codes of ``place``: done; grow ``out`` (and ``row_end``); grow the open rows.
DONE, OUT_FULL, ROW_FULL = 0, 1, 2

_F = TypeVar("_F", bound=Callable[..., Any])


def _load_numba() -> tuple[Any, ImportError | None]:
    """numba, or ``None`` and why not (``ZEPHON_JAX_COMPILED=0``: no error)."""
    if os.environ.get("ZEPHON_JAX_COMPILED") == "0":
        return None, None
    try:
        import numba
    except ImportError as error:  # not installed, or does not import
        return None, error
    return numba, None


_NUMBA, IMPORT_ERROR = _load_numba()
COMPILED = _NUMBA is not None  # whether the kernels below run compiled


def jit(function: _F) -> _F:
    """``function`` compiled by numba (cached on disk, without the GIL) where
    :data:`COMPILED`, else ``function`` itself (it then runs interpreted)."""
    if _NUMBA is None:
        return function
    compiled: _F = _NUMBA.njit(cache=True, nogil=True)(function)
    return compiled


def interpreted(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """The Python function a kernel was made from, run interpreted (also over whole
    numpy arrays where its operations allow, as :func:`mix64`)."""
    return getattr(kernel, "py_func", kernel)


@jit
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


@jit
def to_end(slots, at):
    """Moves ``slots[at]`` after the others; returns its new place."""
    row = slots[at]
    last = len(slots) - 1
    for a in range(at, last):
        slots[a] = slots[a + 1]
    slots[last] = row
    return last


@jit
def best_row(fill, room):
    """best_fit: the fullest row filled to at most ``room`` (the lowest of equals), or -1."""
    i = -1
    top = -1
    for b in range(len(fill)):
        f = fill[b]
        if top < f <= room:
            top = f
            i = b
    return i


@jit
def first_place(fill, slots, room):
    """first_fit: the place in ``slots`` of the first row filled to at most ``room``, or -1."""
    for a in range(len(slots)):
        if fill[slots[a]] <= room:
            return a
    return -1


@jit
def fullest(fill, slots, best):
    """The fullest row (the lowest of equals): its index (best_fit, which scans rows by
    index), or its place in ``slots`` (first_fit, which scans them in that order)."""
    top = -1
    at = 0
    for a in range(len(fill)):
        f = fill[a if best else slots[a]]
        if f > top:
            top = f
            at = a
    return at


@jit
def choose(fill, slots, room, best):
    """The row for a piece that leaves ``room`` in an empty row, and its place in
    ``slots`` (first_fit): the one with room by the method's rule, else the fullest."""
    if best:
        i = best_row(fill, room)
        if i < 0:
            i = fullest(fill, slots, best)
        return i, i
    at = first_place(fill, slots, room)
    if at < 0:
        at = fullest(fill, slots, best)
    return slots[at], at


@jit
def place_piece(fill, count, pieces, slots, code, start, length, leaf, seq_len, max_segments,
                best, out, row_end, n_out, n_rows):  # fmt: skip
    """Places one piece (its lineage code, token start, length and leaf) into the
    open rows by the rules (see the module docstring), emitting rows to ``out`` and
    ``row_end`` from ``n_out``, ``n_rows`` on. Returns ``(n_out, n_rows, stop)``: ``DONE``,
    or ``OUT_FULL`` / ``ROW_FULL`` (that array must grow; nothing of the piece is placed)."""
    room = seq_len - length
    i, at = choose(fill, slots, room, best)
    if n_out + count[i] + 1 > out.shape[1] or n_rows + 2 > row_end.shape[0]:
        return n_out, n_rows, OUT_FULL
    if fill[i] > room:  # no row has room: the fullest goes out, the piece starts a new one
        n_out, n_rows = emit(i, fill, count, pieces, out, row_end, n_out, n_rows)
        if not best:
            at = to_end(slots, at)
    m = count[i]
    if m == pieces.shape[2]:
        return n_out, n_rows, ROW_FULL
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
    return n_out, n_rows, DONE


# The one encoding of piece codes (core.lineage), compiled for the kernels.
_piece_code = jit(piece_code)


@jit
def cut_piece(s0, n, j, cut, position):
    """Piece ``j`` of the document of ``n`` tokens from ``s0`` at lane ``position``, as
    (lineage code, token start, length): cut into pieces of at most ``cut`` (code
    :func:`~zephon_jax.core.lineage.piece_code`), or whole with ``cut`` 0 (code: the
    position)."""
    if cut > 0:
        return _piece_code(position, j), s0 + j * cut, min(cut, n - j * cut)
    return position, s0, n


_OFFSETS_AHEAD = 8  # documents: ``place`` asks for a document's offsets that far ahead


@jit
def place(fill, count, pieces, slots, offsets, bases, leaves, records, positions, k0, j0,
          cut, seq_len, max_segments, best, out, row_end, n_out, n_rows):  # fmt: skip
    """Places pieces of documents ``records[k]`` of leaves ``leaves[k]`` (at lane
    ``positions[k]``), from piece ``j0`` of document ``k0`` on, into the open rows.

    Leaf ``l``'s document ``d`` spans ``offsets[bases[l] + d]`` to the next offset; the
    document arrays may be numpy arrays of any integer type, or (interpreted) lists.
    ``fill[i]``/``count[i]``: tokens and pieces in row ``i``; ``pieces[:, i, :count[i]]``
    its pieces as (lineage code, token start, length, leaf); ``slots``: the rows in the
    order first_fit scans them (the order they opened; an emitted row moves to the
    end), unused by best_fit, which scans rows by index; ``cut`` > 0 cuts documents
    into pieces of at most ``cut`` (see :func:`cut_piece`), 0 takes them whole; empty
    documents are skipped. Emitted rows go to ``out`` (pieces) and ``row_end`` (each
    row's end in ``out``) after the ``n_out`` pieces and ``n_rows`` rows already there.
    Returns ``(k, j, pieces out, rows out, stop)`` (counting those already there): where it
    stopped and why (``DONE``; ``OUT_FULL``, ``ROW_FULL``: grow that array and go on from
    piece ``j`` of document ``k``; nothing of that piece is placed yet).
    """
    j = j0
    if len(records) - k0 > 1:  # a block: the lane's open rows are cold since its last one
        prefetch_values(pieces, 0, pieces.size)
    for k in range(k0, len(records)):
        if k + _OFFSETS_AHEAD < len(records):  # (documents lie scattered in the offsets)
            ahead = k + _OFFSETS_AHEAD
            prefetch_values(offsets, bases[leaves[ahead]] + records[ahead], 2)
        leaf = leaves[k]
        r = bases[leaf] + records[k]
        s0 = offsets[r]
        n = offsets[r + 1] - s0
        npieces = (n + cut - 1) // cut if cut > 0 else min(n, 1)
        while j < npieces:
            code, start, length = cut_piece(s0, n, j, cut, positions[k])
            n_out, n_rows, stop = place_piece(
                fill, count, pieces, slots, code, start, length, leaf, seq_len, max_segments,
                best, out, row_end, n_out, n_rows,
            )  # fmt: skip
            if stop != DONE:
                return k, j, n_out, n_rows, stop
            j += 1
        j = 0
    return len(records), 0, n_out, n_rows, DONE


# A loop index numba need not check for negative values (see ``gather``).
_U = np.uint64


def tokens_at(address, count, like):
    """The ``count`` values of ``like``'s dtype in memory from byte ``address`` on, as an
    array that views them (no copy). The caller keeps the memory alive (it holds the
    array the address is in) for as long as the view is used. Interpreted through
    ``ctypes``; compiled, a kernel reads the memory directly (see
    :func:`_compile_tokens_at`)."""
    size = int(count) * like.itemsize
    if size == 0:
        return like[:0]
    return np.frombuffer((ctypes.c_char * size).from_address(int(address)), like.dtype)


def prefetch(address, size):
    """Asks the processor to start loading the ``size`` bytes from ``address`` on into
    its caches: a hint, which reads nothing and changes nothing. Interpreted, it does
    nothing; compiled, one prefetch instruction per cache line (see
    :func:`_compile_prefetch`)."""


def prefetch_values(array, start, count):
    """:func:`prefetch` of values ``start`` to ``start + count`` of C-contiguous
    ``array`` (as laid out flat); interpreted, nothing."""


@jit
def data_address(array):
    """Where ``array``'s first value is in memory (its data pointer)."""
    return array.ctypes.data


def warm_up() -> None:
    """Sets up numba's compiler and its on-disk cache by loading the smallest kernel
    (:func:`data_address`): about 0.7 s the first time in a process, whichever kernel
    comes first; nothing where the kernels run interpreted. The fork server of the
    loader's workers calls it (:mod:`zephon_jax.workers.server`)."""
    if COMPILED:
        data_address(np.zeros(1, np.int64))


def _compile_tokens_at(numba: Any) -> None:
    """Teaches numba :func:`tokens_at`: the address cast to a pointer to ``like``'s
    dtype, viewed as an array of ``count`` values."""
    from numba.core import types
    from numba.extending import intrinsic, overload

    @intrinsic
    def pointer_to(typingctx, address, like):
        pointer = types.CPointer(like.dtype)

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(pointer))

        return pointer(address, like), codegen

    @overload(tokens_at)
    def compiled_tokens_at(address, count, like):
        def view(address, count, like):
            return numba.carray(pointer_to(address, like), count)  # type: ignore[call-arg]

        return view


def _compile_prefetch(numba: Any) -> None:
    """Teaches numba :func:`prefetch` and :func:`prefetch_values`: LLVM's prefetch
    intrinsic (a read, kept in all cache levels) at each 64-byte line."""
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic, overload

    @intrinsic
    def prefetch_line(typingctx, address):
        def codegen(context, builder, signature, args):
            byte_pointer = ir.IntType(8).as_pointer()
            i32 = ir.IntType(32)
            function = cgutils.get_or_insert_function(
                builder.module,
                ir.FunctionType(ir.VoidType(), [byte_pointer, i32, i32, i32]),
                "llvm.prefetch.p0i8",
            )
            read, all_levels, data = ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)
            builder.call(
                function, [builder.inttoptr(args[0], byte_pointer), read, all_levels, data]
            )
            return context.get_dummy_value()

        return types.void(types.int64), codegen

    @overload(prefetch)
    def compiled_prefetch(address, size):
        def lines(address, size):
            end = address + size
            while address < end:
                prefetch_line(address)  # type: ignore[call-arg]
                address += _CACHE_LINE

        return lines

    @overload(prefetch_values)
    def compiled_prefetch_values(array, start, count):
        def values(array, start, count):
            size = np.int64(array.itemsize)  # (int64 throughout: no float promotion)
            prefetch(np.int64(array.ctypes.data) + np.int64(start) * size, count * size)

        return values


_CACHE_LINE = 64  # bytes

if _NUMBA is not None:
    _compile_tokens_at(_NUMBA)
    _compile_prefetch(_NUMBA)


def array_addresses(
    arrays: tuple[np.ndarray, ...], starts: np.ndarray, leaves: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, ...]]:
    """``(addresses, like, arrays)``: the byte address of value ``starts[k]`` of
    ``arrays[leaves[k]]`` (``leaves`` None: of ``arrays[0]``), an empty array of their
    dtype, and the arrays (which hold that memory: keep them while the addresses are
    used). The arrays are 1-D, C-contiguous and of one dtype."""
    like = arrays[0][:0]
    starts = np.asarray(starts, np.int64) * like.itemsize
    if leaves is None or len(arrays) == 1:
        return starts + data_address(arrays[0]), like, arrays
    bases = np.array([data_address(a) for a in arrays], np.int64)
    return bases[leaves] + starts, like, arrays


@jit
def gather(addresses, like, lengths, row_end, counting, low, high, values, segment_ids,
           positions, targets, loss_mask, pad_id):  # fmt: skip
    """Row ``r`` of the batch from pieces ``row_end[r - 1]:row_end[r]``: their tokens one
    after the other (piece ``k``: the ``lengths[k]`` tokens of ``like``'s dtype from byte
    ``addresses[k]`` on, read by :func:`tokens_at`; the caller holds the arrays they are
    in), segment ids 1, 2, ... and
    positions 0, 1, ... (``counting[:n]``) within each piece; zeros after the last piece.
    With ``low <= high``, first checks that every token lies in ``[low, high]`` (what the
    output dtype holds) and returns False, writing nothing, if one does not; else True.

    With columns in ``targets`` (``to_training`` fused into the gather; else pass arrays
    of one empty row per row), ``values`` are the inputs, and each token's target is the
    next token of its piece, with ``loss_mask`` 1; a piece's last token and the padding
    get ``pad_id`` and 0: the fields :func:`~zephon_jax.transforms.to_training.shifted` makes of the
    gathered rows (segment ids differ between pieces, so a piece ends where its segment
    does).

    The loops index with unsigned integers (``_U``), one loop an output: numba then
    checks no index for a negative wrap-around and vectorizes them (about 3x faster
    than slice assignments). Each piece's tokens are asked for (:func:`prefetch`) while
    the piece before is copied: the pieces lie scattered through the corpus, and their
    first loads otherwise wait on memory (about a fifth of the gather on a store's
    pieces)."""
    if low <= high:
        for k in range(addresses.shape[0]):
            n = _U(lengths[k])
            source = tokens_at(addresses[k], n, like)
            for t in range(n):
                if source[t] < low or source[t] > high:
                    return False
    shift = targets.shape[1] > 0
    width = _U(values.shape[1])
    last_piece = addresses.shape[0] - 1
    if last_piece >= 0:
        prefetch(addresses[0], lengths[0] * like.itemsize)
    begin = 0
    for r in range(values.shape[0]):
        row, segments, row_positions = values[r], segment_ids[r], positions[r]
        row_targets, row_mask = targets[r], loss_mask[r]
        at = _U(0)
        for k in range(begin, row_end[r]):
            if k < last_piece:  # the next piece loads while this one is copied
                prefetch(addresses[k + 1], lengths[k + 1] * like.itemsize)
            n, segment = _U(lengths[k]), k - begin + 1
            source = tokens_at(addresses[k], n, like)
            for t in range(n):
                row[at + t] = source[t]
            for t in range(n):
                segments[at + t] = segment
            for t in range(n):
                row_positions[at + t] = counting[t]
            if shift and n > 0:
                last = n - _U(1)
                for t in range(last):
                    row_targets[at + t] = source[t + _U(1)]
                for t in range(last):
                    row_mask[at + t] = 1
                row_targets[at + last] = pad_id
                row_mask[at + last] = 0
            at += n
        for t in range(at, width):
            row[t] = 0
        for t in range(at, width):
            segments[t] = 0
        for t in range(at, width):
            row_positions[t] = 0
        if shift:
            for t in range(at, width):
                row_targets[t] = pad_id
            for t in range(at, width):
                row_mask[t] = 0
        begin = row_end[r]
    return True


_ROWS_AHEAD = 4  # ``collect_pieces`` asks for a row's pieces that many rows ahead


@jit
def collect_pieces(addresses, widths, begins, ends, out):
    """Copies, one row after the other, columns ``[begins[r], ends[r])`` of rows ``1`` to
    ``out.shape[0]`` of the int64 array of ``widths[r]`` columns whose first value is at
    byte ``addresses[r]`` (the caller holds the arrays) into ``out``: the starts, lengths
    and (with three rows) leaves of batch rows' pieces, from the arrays of pieces their
    placements emitted."""
    like = out[0, :0]
    at = 0
    rows = addresses.shape[0]
    for r in range(-_ROWS_AHEAD, rows):
        ahead = r + _ROWS_AHEAD  # (each row's pieces are in an array of their own, cold)
        if ahead < rows:
            for f in range(out.shape[0]):
                start = addresses[ahead] + ((f + 1) * widths[ahead] + begins[ahead]) * 8
                prefetch(start, (ends[ahead] - begins[ahead]) * 8)
        if r < 0:
            continue
        n = ends[r] - begins[r]
        for f in range(out.shape[0]):
            source = tokens_at(addresses[r] + ((f + 1) * widths[r] + begins[r]) * 8, n, like)
            for t in range(n):
                out[f, at + t] = source[t]
        at += n


# The rows of the table of lanes' first runs ``take_front`` reads and updates (see
# zephon_jax.engine.front_rows), one column per lane: the run's next row, the rows left
# in it, the rows and steps taken from it and not yet from the lane, the address and width
# of the run's pieces (see collect_pieces), and the address of its rows' bounds, an int64
# array of 0 and each row's end among the pieces.
NEXT, LEFT, OWED, OWED_STEPS, ADDRESS, WIDTH, BOUNDS = range(7)
FRONT_TABLE = 7


@jit
def take_front(n, table, lanes, slots, offsets, out, slow):
    """A step's take of ``n`` rows by every lane of ``table`` (above) among columns
    ``lanes`` with ``n`` rows left in its first run, which then owes them: for each batch
    row ``r`` of such a lane, row ``offsets[r]`` of lane ``slots[r]``'s take (``slots``:
    columns among ``lanes``), ``out[:, r]`` is its row's index in the run, the run's
    pieces ``[begin, end)`` it holds, and the run's pieces' address and width (the other
    rows' columns are left as they are). Returns how many of ``lanes`` lack the rows
    there, their columns in ``slow[:count]``."""
    need = max(n, 1)
    count = 0
    for k in lanes:
        if table[LEFT, k] < need:
            slow[count] = k
            count += 1
    like = out[0, :0]
    for r in range(slots.shape[0]):
        k = slots[r]
        if table[LEFT, k] < need:
            continue
        index = table[NEXT, k] + offsets[r]
        bounds = tokens_at(table[BOUNDS, k] + index * 8, 2, like)
        out[0, r] = index
        out[1, r] = bounds[0]
        out[2, r] = bounds[1]
        out[3, r] = table[ADDRESS, k]
        out[4, r] = table[WIDTH, k]
    for k in lanes:
        if table[LEFT, k] >= need:
            table[NEXT, k] += n
            table[LEFT, k] -= n
            table[OWED, k] += n
            table[OWED_STEPS, k] += 1
    return count


@jit
def drawable(quanta, next_sub, ends, j):
    """Whether a mixture may draw component ``j``: it has a weight (``quanta[j] > 0``)
    and draws left (``ends[j] < 0``: no end, else ``next_sub[j] < ends[j]``)."""
    return quanta[j] != 0 and (ends[j] < 0 or next_sub[j] < ends[j])


@jit
def pick_component(quanta, credits, next_sub, ends, rotation):
    """A mixture's next component (see :mod:`~zephon_jax.sampler.scheduled_mixture`): of
    those :func:`drawable`, the one with the largest credit, ties going to the first at
    or after ``rotation``; -1 if none is left."""
    k = quanta.shape[0]
    best = -1
    for j in range(k):
        if not drawable(quanta, next_sub, ends, j):
            continue
        if best < 0 or credits[j] > credits[best]:
            best = j
        elif credits[j] == credits[best] and (j - rotation) % k < (best - rotation) % k:
            best = j
    return best


@jit
def pay_credits(quanta, credits, next_sub, ends, best, n):
    """Credits ``n`` tokens (or records) drawn from component ``best`` (its ``next_sub``
    already moved past the draw): every weighted component with draws left, ``best``
    included, gains ``quanta[j] * n``, and ``best`` pays their sum."""
    total = 0
    for j in range(quanta.shape[0]):
        q = quanta[j]
        if q > 0 and (ends[j] < 0 or next_sub[j] < ends[j] or j == best):
            credits[j] += q * n
            total += q
    credits[best] -= total * n


# Stop codes of ``draw_place`` besides ``place``'s: the rows asked for are made; the
# read-ahead of component ``state[COMPONENT]`` is used up; every weighted component is
# past its end; too many draws without a row; too many draws of one component without
# tokens; the log of draws is full; a draw counts more tokens than credits can hold.
ROWS_MADE, NEED_AHEAD, INPUT_END, NO_PROGRESS, DRY, DRAWN_FULL, TOO_LONG = 3, 4, 5, 6, 7, 8, 9
# ``draw_place``'s ``state``: the lane's next position, draws since its last row, the
# drawn-root index of the next draw, whether a document is being placed and its code,
# leaf, record and next piece, whether a draw since the last row had tokens, the
# component a stop concerns, and the pieces, rows and draws already in ``out``,
# ``row_end`` and ``drawn`` (written after them), and, once the rows are made, the
# fewest draws read ahead and not drawn yet of a component with a weight and draws left
# (see ahead_left).
(POSITION, WITHOUT_ROW, NEXT_CODE, PLACING, CODE, LEAF, RECORD, PIECE, ANY_TOKENS,
 COMPONENT, OUT_AT, ROWS_AT, DRAWN_AT, AHEAD_LEFT) = range(14)  # fmt: skip
DRAW_STATE = 14  # the entries of ``draw_place``'s state


@jit
def next_draw(quanta, credits, next_sub, ends, rotation, by_tokens, dry, dry_limit,
              max_tokens, ahead_first, ahead_size, ahead_leaf, ahead_tokens):  # fmt: skip
    """The mixture's next draw that has a record (see :func:`draw_place`), its credits
    paid: ``(DONE, component, its index in the read-ahead)``, or ``(stop, component,
    -1)`` (``INPUT_END``, ``NEED_AHEAD``, ``DRY`` or ``TOO_LONG``: more than
    ``max_tokens``)."""
    while True:
        c = pick_component(quanta, credits, next_sub, ends, rotation)
        if c < 0:
            return INPUT_END, c, -1
        sub = next_sub[c]
        i = sub - ahead_first[c]
        if i < 0 or i >= ahead_size[c]:
            return NEED_AHEAD, c, -1
        next_sub[c] = sub + 1
        if ahead_leaf[c, i] < 0:
            continue
        n = ahead_tokens[c, i]
        if n == 0 and by_tokens:
            dry[c] += 1
            if dry[c] > dry_limit[c]:
                return DRY, c, -1
        elif n > 0:
            if n > max_tokens:
                return TOO_LONG, c, -1
            dry[c] = 0
            pay_credits(quanta, credits, next_sub, ends, c, n)
        return DONE, c, i


@jit
def ahead_left(quanta, next_sub, ends, ahead_first, ahead_size):
    """The fewest draws read ahead and not drawn yet of a :func:`drawable` component
    (those read ahead from its next draw on; 0 where its next draw is not read ahead),
    or ``2**62`` where none is drawable."""
    least = np.int64(1) << 62
    for j in range(quanta.shape[0]):
        if not drawable(quanta, next_sub, ends, j):
            continue
        left = ahead_first[j] + ahead_size[j] - next_sub[j]
        if next_sub[j] < ahead_first[j] or left < 0:
            left = 0
        least = min(least, left)
    return least


_DRAWS_PREFETCHED = 24  # per component: ``prefetch_lane`` asks for that many draws ahead


@jit
def prefetch_lane(fill, count, pieces, slots, offsets, bases, out, row_end, drawn, state, next_sub,
                  ahead_first, ahead_size, ahead_leaf, ahead_record, ahead_tokens):  # fmt: skip
    """Asks for what a call of :func:`draw_place` (its arguments) reads and writes first,
    all at once: a lane's state is cold since its last call (the batches in between
    pushed it out of the caches), and one miss at a time costs a few microseconds a
    call. The lane's open rows, the next draws read ahead of each component and their
    documents' offsets, and where the emitted pieces, rows and draws go next."""
    n_out, n_rows, n_drawn = state[OUT_AT], state[ROWS_AT], state[DRAWN_AT]
    prefetch_values(pieces, 0, pieces.size)
    prefetch_values(fill, 0, fill.size)
    prefetch_values(count, 0, count.size)
    prefetch_values(slots, 0, slots.size)
    for c in range(ahead_first.shape[0]):
        i = next_sub[c] - ahead_first[c]
        m = min(ahead_size[c] - i, _DRAWS_PREFETCHED)
        if i < 0 or m <= 0:
            continue
        prefetch_values(ahead_tokens, c * ahead_tokens.shape[1] + i, m)
        for q in range(i, i + m):
            leaf = ahead_leaf[c, q]
            if leaf >= 0:
                prefetch_values(offsets, bases[leaf] + ahead_record[c, q], 2)
    for row in range(out.shape[0]):
        prefetch_values(out, row * out.shape[1] + n_out, min(64, out.shape[1] - n_out))
    prefetch_values(row_end, n_rows, min(16, row_end.shape[0] - n_rows))
    for row in range(drawn.shape[0]):
        prefetch_values(drawn, row * drawn.shape[1] + n_drawn, min(64, drawn.shape[1] - n_drawn))


@jit
def draw_place(quanta, credits, next_sub, ends, rotation, by_tokens, dry, dry_limit,
               max_tokens, ahead_first, ahead_size, ahead_leaf, ahead_record, ahead_tokens, excluded,
               offsets, bases, fill, count, pieces, slots, cut, seq_len, max_segments, best,
               out, row_end, rows_wanted, limit, state, drawn):  # fmt: skip
    """Draws documents of a mixture one at a time and places each into the open rows
    (as :func:`place` places one document), until ``rows_wanted`` rows are emitted to
    ``out``/``row_end`` (after the ``state[OUT_AT]`` pieces and ``state[ROWS_AT]`` rows
    already there).

    Component ``j``'s draws ``ahead_first[j]`` to ``ahead_first[j] + ahead_size[j] - 1``
    are read ahead: global leaf ``ahead_leaf[j, i]`` (-1: no record, the draw is passed
    over), document ``ahead_record[j, i]``, ``ahead_tokens[j, i]`` tokens (what the
    draw counts: 1 per record by records). A draw of a document in ``excluded``
    (sorted ``leaf << 40 | record`` keys) moves the lane on but is not placed. Each
    placed draw is logged in ``drawn[:, m]`` as (position, component, sub), from
    ``m = state[DRAWN_AT]`` on. Returns ``(stop, pieces in out, rows in row_end, draws
    in drawn)``, those before included; ``state`` (see its indices above) says where to
    go on from, ``state[COMPONENT]`` which component a stop concerns.
    """
    n_out, n_rows, n_drawn = state[OUT_AT], state[ROWS_AT], state[DRAWN_AT]
    rows_wanted += n_rows
    prefetch_lane(fill, count, pieces, slots, offsets, bases, out, row_end, drawn, state, next_sub,
                  ahead_first, ahead_size, ahead_leaf, ahead_record, ahead_tokens)  # fmt: skip
    one_leaf = np.zeros(1, np.int64)
    one_record = np.zeros(1, np.int64)
    one_code = np.zeros(1, np.int64)
    while True:
        if state[PLACING]:
            one_leaf[0] = state[LEAF]
            one_record[0] = state[RECORD]
            one_code[0] = state[CODE]
            rows_before = n_rows
            _, j, n_out, n_rows, stop = place(
                fill, count, pieces, slots, offsets, bases, one_leaf, one_record, one_code, 0,
                state[PIECE], cut, seq_len, max_segments, best, out, row_end, n_out, n_rows,
            )  # fmt: skip
            if n_rows > rows_before:
                state[WITHOUT_ROW] = 0
                state[ANY_TOKENS] = 0
            if stop != DONE:
                state[PIECE] = j
                return stop, n_out, n_rows, n_drawn
            state[PLACING] = 0
            if state[WITHOUT_ROW] > limit:
                return NO_PROGRESS, n_out, n_rows, n_drawn
        if n_rows >= rows_wanted:
            state[AHEAD_LEFT] = ahead_left(quanta, next_sub, ends, ahead_first, ahead_size)
            return ROWS_MADE, n_out, n_rows, n_drawn
        if n_drawn == drawn.shape[1]:
            return DRAWN_FULL, n_out, n_rows, n_drawn
        stop, c, i = next_draw(
            quanta, credits, next_sub, ends, rotation, by_tokens, dry, dry_limit, max_tokens,
            ahead_first, ahead_size, ahead_leaf, ahead_tokens,
        )  # fmt: skip
        state[COMPONENT] = c
        if stop != DONE:
            return stop, n_out, n_rows, n_drawn
        sub = next_sub[c] - 1
        leaf = ahead_leaf[c, i]
        record = ahead_record[c, i]
        position = state[POSITION]
        state[POSITION] = position + 1
        state[WITHOUT_ROW] += 1
        key = (leaf << 40) | record
        k = np.searchsorted(excluded, key)
        if k < excluded.shape[0] and excluded[k] == key:
            continue  # (the bound on draws without a row is checked after a placement)
        drawn[0, n_drawn] = position
        drawn[1, n_drawn] = c
        drawn[2, n_drawn] = sub
        n_drawn += 1
        r = bases[leaf] + record
        if offsets[r + 1] > offsets[r]:
            state[ANY_TOKENS] = 1
        state[CODE] = state[NEXT_CODE]
        state[NEXT_CODE] += 1
        state[LEAF] = leaf
        state[RECORD] = record
        state[PIECE] = 0
        state[PLACING] = 1


# The one decoding of piece codes (core.lineage), compiled for the kernels.
_decode_piece = jit(decode_piece)


@jit
def add_pieces(counts, leaves, epochs, lengths, firsts):
    """Adds pieces (each one's leaf, epoch, length and whether it starts its record) to
    ``counts[leaf]`` = (tokens, segments, documents, highest epoch + 1), the accounting's
    per-source counters (see :mod:`zephon_jax.engine.accounting`)."""
    for p in range(leaves.shape[0]):
        leaf = leaves[p]
        counts[leaf, 0] += lengths[p]
        counts[leaf, 1] += 1
        if firsts[p]:
            counts[leaf, 2] += 1
        if epochs[p] + 1 > counts[leaf, 3]:
            counts[leaf, 3] = epochs[p] + 1


@jit
def source_epochs(draws, lane, num_lanes, size):
    """The epochs of ``draws`` (one or an array) of ``lane`` of ``num_lanes`` from a
    source of ``size`` records (or sizes, one per draw): arithmetic alone, the shuffled
    record is not needed."""
    return (draws * num_lanes + lane) // size


@jit
def decode_codes(codes):
    """Pieces given as codes (an index, or a :func:`~zephon_jax.core.lineage.piece_code`
    of one) as ``(indices, firsts)``: the index each points to, and whether the piece
    starts its record."""
    n = codes.shape[0]
    indices = np.empty(n, np.int64)
    firsts = np.empty(n, np.bool_)
    for p in range(n):
        code = codes[p]
        if code < 0:
            indices[p], j = _decode_piece(code)
            firsts[p] = j == 0
        else:
            indices[p] = code
            firsts[p] = True
    return indices, firsts


@jit
def _drawn_index(code):
    """The index of the draw a piece's code points to (an index, or a
    :func:`~zephon_jax.core.lineage.piece_code` of one)."""
    return _decode_piece(code)[0] if code < 0 else code


@jit
def kept_draws(pieces, count, logged, base, size):
    """Which of a lane's draws ``base .. base + size - 1`` are still pointed to: by a
    held piece (the first ``count[i]`` codes of open row ``i``, ``pieces[0, i]``) or by
    a logged piece (``logged``, codes). Returns ``(kept, rank)``: the kept draws'
    indices in order, and each draw's place among them (-1: not kept)."""
    rank = np.full(size, -1, np.int64)
    for i in range(count.shape[0]):
        for m in range(count[i]):
            rank[_drawn_index(pieces[0, i, m]) - base] = 0
    for p in range(logged.shape[0]):
        rank[_drawn_index(logged[p]) - base] = 0
    kept = np.empty(size, np.int64)
    n = 0
    for d in range(size):
        if rank[d] == 0:
            rank[d] = n
            kept[n] = base + d
            n += 1
    return kept[:n], rank


@jit
def recode_draws(codes, rank, base, first):
    """``codes`` (indices of draws, or piece codes of them) renumbered after a lane kept
    only some draws (see :func:`kept_draws`): draw ``i`` becomes ``first + rank[i -
    base]``, a piece keeping its number; a new array."""
    out = np.empty(codes.shape[0], np.int64)
    for p in range(codes.shape[0]):
        code = codes[p]
        if code < 0:
            at, j = _decode_piece(code)
            out[p] = _piece_code(first + rank[at - base], j)
        else:
            out[p] = first + rank[code - base]
    return out


@jit
def count_drawn(counts, stages, codes, lengths, roots, roots_base, leaf_of, sizes, lane,
                num_lanes):  # fmt: skip
    """Counts pieces of a column-wise mixture lane whose components are all sources:
    ``codes`` index the lane's draws (``roots[:, i - roots_base]``: position, component,
    component draw; see :func:`decode_codes`), ``lengths`` their tokens. Adds to
    ``counts`` (see :func:`add_pieces`; component ``k`` is leaf ``leaf_of[k]`` of
    ``sizes[k]`` records) and to ``stages[k]``, the tokens of each component."""
    indices, firsts = decode_codes(codes)
    n = codes.shape[0]
    leaves = np.empty(n, np.int64)
    epochs = np.empty(n, np.int64)
    for p in range(n):
        at = indices[p] - roots_base
        component = roots[1, at]
        leaves[p] = leaf_of[component]
        epochs[p] = source_epochs(roots[2, at], lane, num_lanes, sizes[component])
        stages[component] += lengths[p]
    add_pieces(counts, leaves, epochs, lengths, firsts)


@jit
def draw_pieces(data, pos, prefix, int_tag, out):
    """Reads draw pieces ``(((a, b, c),), d)`` of the state codec
    (:mod:`zephon_jax.state.codec`; the bulk of a mixture lane's record pointers) one
    after another from ``data`` (uint8) at ``pos``, into the rows of ``out`` (k by 4):
    each is ``prefix`` (its three tuples' headers), then four items of tag ``int_tag``
    and a zigzag varint. Stops at the first that is not one (or whose varint is longer
    than 8 bytes, or runs past the end of ``data``: the codec decodes it in general) or
    when ``out`` is full. Returns ``(k, the position after the k-th)``. (Interpreted,
    ``data`` and ``prefix`` may be ``bytes``: faster there than arrays.)"""
    size = len(data)
    m = len(prefix)
    k = 0
    while k < out.shape[0]:
        p = _after_prefix(data, pos, prefix, m, size)
        j = 0
        while p >= 0 and j < 4:
            if p + 1 >= size or data[p] != int_tag:
                p = -1
                break
            p, z = _varint(data, p + 1, size)
            if p >= 0:
                out[k, j] = -((z + 1) >> 1) if z & 1 else z >> 1
            j += 1
        if p < 0:
            break
        pos = p
        k += 1
    return k, pos


@jit
def draw_rows(data, pos, rows, prefix, int_tag, tuple_tag, pieces, lengths, ends):
    """Reads ``rows`` packed rows' lineages ``(parents, lengths)`` of the state codec
    (:mod:`zephon_jax.state.codec`; a mixture lane's rows made ahead) one after another
    from ``data`` (uint8) at ``pos``: ``parents`` a tuple of draw pieces, as
    :func:`draw_pieces` reads them, into the rows of ``pieces`` (n by 4), ``lengths`` a
    tuple of as many ints (tag ``int_tag``), into ``lengths``; each row's end in them
    into ``ends``. Stops at the first row of another form, or when ``pieces`` is full.
    Returns ``(rows read, the position after the last)``. (Interpreted, ``data`` and
    ``prefix`` may be ``bytes``.)"""
    size = len(data)
    n = 0
    r = 0
    while r < rows:
        p = _tuple_of(data, pos, size, tuple_tag)
        if p < 0 or p >= size or data[p] != 2:  # (parents, lengths)
            break
        p, k = _varint(data, _tuple_of(data, p + 1, size, tuple_tag), size)
        if p < 0 or k == 0 or n + k > pieces.shape[0]:
            break
        got, p = draw_pieces(data, p, prefix, int_tag, pieces[n : n + k])
        if got != k:
            break
        p, j = _varint(data, _tuple_of(data, p, size, tuple_tag), size)
        i = 0
        while p >= 0 and j == k and i < k:
            if p + 1 >= size or data[p] != int_tag:
                p = -1
                break
            p, z = _varint(data, p + 1, size)
            lengths[n + i] = -((z + 1) >> 1) if z & 1 else z >> 1
            i += 1
        if p < 0 or i != k:
            break
        n += k
        ends[r] = n
        pos = p
        r += 1
    return r, pos


@jit
def _tuple_of(data, p, size, tuple_tag):
    """The position after the tuple tag at ``p`` in ``data``; a position past ``size``
    if there is none (so that the caller's next read stops)."""
    if 0 <= p < size and data[p] == tuple_tag:
        return p + 1
    return size


@jit
def _after_prefix(data, pos, prefix, m, size):
    """The position after ``prefix`` (``m`` bytes) at ``pos`` in ``data``; -1 if it is not there."""
    if pos + m > size:
        return -1
    for i in range(m):
        if data[pos + i] != prefix[i]:
            return -1
    return pos + m


@jit
def _varint(data, p, size):
    """``(the position after, value)`` of the varint of at most 8 bytes at ``p``;
    ``(-1, 0)`` if it is longer or runs past ``size``."""
    z = np.int64(0)
    shift = 0
    while p < size and shift < 56:
        byte = np.int64(data[p])
        z |= (byte & 0x7F) << shift
        p += 1
        if byte < 0x80:
            return p, z
        shift += 7
    return -1, np.int64(0)


@jit
def mix64(x):
    """SplitMix64's finalizer: a bijective avalanche hash of a uint64 (wraps mod 2**64);
    interpreted, of every element of a uint64 array (:func:`interpreted`)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@jit
def permute(x, n, a, b, round_keys, out):
    """``out[i]``: the image of ``x[i]`` (uint64, below ``n``) under the Feistel
    network over ``Z_a x Z_b`` with ``round_keys``, cycle-walked into ``[0, n)``."""
    rounds = round_keys.shape[0]
    for i in range(x.shape[0]):
        v = x[i]
        while True:
            left = v // b
            right = v - left * b
            for r in range(rounds):  # (a sum of two values below m, taken mod m: one subtraction)
                if r % 2 == 0:
                    left = left + mix64(right ^ round_keys[r]) % a
                    if left >= a:
                        left -= a
                else:
                    right = right + mix64(left ^ round_keys[r]) % b
                    if right >= b:
                        right -= b
            v = left * b + right
            if v < n:
                break
        out[i] = np.int64(v)


# ``span_runs``'s chunk table: an inner chunk never written (it holds the fill value);
# one whose shard's index is not read yet.
CHUNK_ABSENT, CHUNK_UNKNOWN = -1, -2
OUTSIDE = -1  # ``span_addresses``: a span reaches outside the array


@jit
def span_runs(starts, stops, chunk_tokens, chunks_per_shard, where, itemsize):
    """Token spans ``[starts[k], stops[k])`` (non-empty) of a sharded array, cut at its
    inner chunks' borders, as runs that one slice copy each reads (or one fill writes):
    the pieces of one span or of consecutive spans join where they lie one after the
    other in one shard file, or are all of chunks never written. ``where[c]`` is inner
    chunk ``c``'s byte offset in its shard file (``CHUNK_ABSENT``, ``CHUNK_UNKNOWN``).

    Returns ``(runs, unknown, shard, offset, first_byte, bounds)``: run ``r`` is of
    shard file ``shard[r]``, from byte ``first_byte[r]`` on (``offset[r] < 0``: never
    written), and fills tokens ``bounds[r]`` to ``bounds[r + 1]`` of the output;
    ``unknown > 0``: the runs are not made, and ``shard[:unknown]`` holds a chunk of
    each shard whose index must be read first (then call again)."""
    pieces = 0
    for k in range(starts.shape[0]):
        pieces += (stops[k] - 1) // chunk_tokens - starts[k] // chunk_tokens + 1
    shard = np.empty(pieces, np.int64)
    offset = np.empty(pieces, np.int64)
    first_byte = np.empty(pieces, np.int64)
    bounds = np.empty(pieces + 1, np.int64)
    runs = 0
    unknown = 0
    at = 0  # tokens out so far
    for k in range(starts.shape[0]):
        position = starts[k]
        while position < stops[k]:
            chunk = position // chunk_tokens
            end = min(stops[k], (chunk + 1) * chunk_tokens)
            written = where[chunk]
            s = chunk // chunks_per_shard
            if written == CHUNK_UNKNOWN:
                if unknown == 0 or shard[unknown - 1] // chunks_per_shard != s:
                    shard[unknown] = chunk
                    unknown += 1
            elif unknown == 0:
                byte = written + (position - chunk * chunk_tokens) * itemsize
                joins = runs > 0 and (
                    (written < 0 and offset[runs - 1] < 0)
                    or (
                        written >= 0
                        and offset[runs - 1] >= 0
                        and shard[runs - 1] == s
                        and first_byte[runs - 1] + (at - bounds[runs - 1]) * itemsize == byte
                    )
                )
                if not joins:
                    shard[runs] = s
                    offset[runs] = written
                    first_byte[runs] = byte
                    bounds[runs] = at
                    runs += 1
            at += end - position
            position = end
    bounds[runs] = at
    return runs, unknown, shard, offset, first_byte, bounds


@jit
def span_addresses(starts, stops, num_tokens, chunk_tokens, chunks_per_shard, where, itemsize,
                   bases, addresses, shard_of):  # fmt: skip
    """Where token spans ``[starts[k], stops[k])`` of a sharded array of ``num_tokens``
    tokens lie in memory (see :func:`span_runs`), for spans that lie in one run of bytes
    of one mapped shard file (``bases[s]``: shard file ``s``'s address in memory, 0 if
    not mapped): ``addresses[k]`` the address of the span's first token, ``shard_of[k]``
    its shard file. ``addresses[k] = -1`` for the others: across inner chunks stored
    apart, in chunks never written, or not aligned to ``itemsize``. An empty span gets
    address 0 (and shard -1).

    Returns ``(missing, apart)``. ``missing`` is :data:`OUTSIDE` where a span reaches
    outside the array; else how many spans' shard files must first be mapped or have
    their index read (``where[c] == CHUNK_UNKNOWN``): ``shard_of[:missing]`` then holds
    a chunk of each (call again once they are). ``addresses`` is made only where
    ``missing`` is 0; ``apart`` is then how many spans got -1."""
    missing = 0
    for k in range(starts.shape[0]):
        if stops[k] <= starts[k]:
            continue
        if starts[k] < 0 or stops[k] > num_tokens:
            return OUTSIDE, 0
        chunk = starts[k] // chunk_tokens
        s = chunk // chunks_per_shard
        written = where[chunk]
        if written == CHUNK_UNKNOWN or (written >= 0 and bases[s] == 0):
            shard_of[missing] = chunk
            missing += 1
    if missing:
        return missing, 0
    apart = 0
    for k in range(starts.shape[0]):
        if stops[k] <= starts[k]:
            addresses[k] = 0
            shard_of[k] = -1
            continue
        chunk = starts[k] // chunk_tokens
        s = chunk // chunks_per_shard
        written = where[chunk]
        shard_of[k] = s
        addresses[k] = -1
        apart += 1
        if written < 0:
            continue
        byte = written + (starts[k] - chunk * chunk_tokens) * itemsize
        if byte % itemsize != 0:
            continue
        last = (stops[k] - 1) // chunk_tokens
        joined = True
        for c in range(chunk + 1, last + 1):  # later chunks must follow in the same file
            if (
                c // chunks_per_shard != s
                or where[c] != written + (c - chunk) * chunk_tokens * itemsize
            ):
                joined = False
                break
        if joined:
            addresses[k] = bases[s] + byte
            apart -= 1
    return 0, apart
