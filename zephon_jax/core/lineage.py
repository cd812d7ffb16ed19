"""Elements flowing through a lane: record data plus the lineage (pointer) that regenerates it.

A lineage is plain data (ints and tuples, so that states encode it compactly), of
exactly one of these kinds (:class:`LineageKind`, see :func:`kind`):

* ``POSITION``, an ``int >= 0``: the lane-local sampler position of a record
  (stage 0);
* ``DRAW``, ``(position, component, sub)`` (ints >= 0, see :func:`draw`): a
  record drawn by a mixture by tokens or with stages at lane-local ``position``,
  the ``sub``-th draw of ``component`` (stage 0);
* ``DERIVED``, ``(parents, recipe)`` (see :func:`derived`, :func:`derive`): an
  output of an operator, made from the input elements whose lineages are the tuple
  ``parents`` by ``operator.remake(recipe, inputs)``; ``recipe`` is small plain
  data (a piece number, slice bounds, ``None``). A piece that ``split`` cut from
  an element is ``((parent,), j)`` (see :func:`piece`);
* ``OPAQUE``, an :class:`Opaque`: a record that cannot be regenerated, stored by
  value (the fallback for record-level user operators);
* ``PIECE_CODE``, an ``int < 0`` (see :func:`piece_code`): the compact form of
  the piece ``((position,), j)``.

An operator that passes elements through (reorders, delays or drops them,
``passthrough = True``) keeps its input's lineage unchanged: no kind of its own.

States store lineages, never tokens, wherever the operators allow it.

Only this module builds, recognises and takes apart these forms; other modules use
its functions. Inside ``pack`` (and in the rows it sends straight to the batch) a
piece may be held as its piece code; :func:`plain_lineage` writes it in full, and
states and provenance only ever see lineages in full. :func:`piece_code` and
:func:`decode_piece` are the one place the code is encoded and decoded (both also
work element-wise on numpy int64 arrays).
"""

from __future__ import annotations

import enum
import itertools
from collections import abc
from typing import Any, Callable, Iterator, Sequence


class Element:
    """A record and its lineage."""

    __slots__ = ("data", "lineage")

    def __init__(self, data: Any, lineage: Any):
        self.data = data
        self.lineage = lineage

    def __repr__(self) -> str:
        return f"Element(lineage={self.lineage!r})"


class Opaque:
    """Lineage of a record that cannot be regenerated: it carries the record itself."""

    __slots__ = ("data",)

    def __init__(self, data: Any):
        self.data = data


class LineageKind(enum.Enum):
    """The closed set of lineage forms (see the module docstring)."""

    POSITION = "position"
    DRAW = "draw"
    DERIVED = "derived"
    OPAQUE = "opaque"
    PIECE_CODE = "piece code"


def kind(lineage: Any) -> LineageKind:
    """The kind of ``lineage`` (its own form; parents are not checked).

    Raises ``ValueError`` naming the value if it has none of the forms.
    """
    if type(lineage) is int:
        return LineageKind.POSITION if lineage >= 0 else LineageKind.PIECE_CODE
    if is_derived(lineage):
        return LineageKind.DERIVED
    if is_valid_draw(lineage):
        return LineageKind.DRAW
    if type(lineage) is Opaque:
        return LineageKind.OPAQUE
    raise ValueError(
        f"{lineage!r:.200} ({type(lineage).__name__}) is no lineage: a lineage is a position "
        "(an int >= 0), a mixture draw (position, component, sub), (parents, recipe), an "
        "Opaque record or a piece code (an int < 0)"
    )


# ----- positions ---------------------------------------------------------------------


def is_position(lineage: Any) -> bool:
    """Whether ``lineage`` is a sampler position (a Python ``int >= 0``)."""
    return type(lineage) is int and lineage >= 0


def position_of(root: Any) -> int:
    """The lane-local sampler position of a root: a position or a :func:`draw`."""
    return root if type(root) is int else root[0]


# ----- mixture draws -----------------------------------------------------------------


def draw(position: int, component: int, sub: int) -> tuple[int, int, int]:
    """The lineage of the ``sub``-th draw of mixture ``component``, at lane-local ``position``."""
    return (position, component, sub)


def is_draw(lineage: Any) -> bool:
    """Whether ``lineage`` has a :func:`draw`'s shape (a quick test, for lineages a lane
    made; :func:`is_valid_draw` checks its items too)."""
    return type(lineage) is tuple and len(lineage) == 3


def is_valid_draw(lineage: Any) -> bool:
    """Whether ``lineage`` is a :func:`draw` of three Python ints >= 0 (as read from a state)."""
    return is_draw(lineage) and all(type(x) is int and x >= 0 for x in lineage)


def draw_parts(lineage: tuple) -> tuple[int, int, int]:
    """``(position, component, sub)`` of a :func:`draw`."""
    return lineage[0], lineage[1], lineage[2]


def draw_component(lineage: tuple) -> int:
    """The mixture component of a :func:`draw`."""
    return lineage[1]


def draw_sub(lineage: tuple) -> int:
    """The component's own draw number of a :func:`draw`."""
    return lineage[2]


# ----- operator outputs --------------------------------------------------------------


def derived(parents: tuple, recipe: Any = None) -> tuple:
    """The lineage of an operator output made by ``recipe`` from inputs whose lineages
    are ``parents`` (a tuple)."""
    return (parents, recipe)


def derive(data: Any, inputs: Sequence[Element], recipe: Any = None) -> Element:
    """An output made from ``inputs`` (elements an operator received) by ``recipe``.

    ``data`` must equal ``operator.remake(recipe, [e.data for e in inputs])``: on
    restore the engine regenerates the output that way, from the inputs' lineages.
    """
    return Element(data, (tuple([e.lineage for e in inputs]), recipe))


def is_derived(lineage: Any) -> bool:
    """Whether ``lineage`` has the ``(parents, recipe)`` form :func:`derive` makes."""
    return type(lineage) is tuple and len(lineage) == 2 and type(lineage[0]) is tuple


def all_derived(lineages: list) -> bool:
    """Whether every one of ``lineages`` :func:`is_derived`, checked in passes over all."""
    return not lineages or (
        set(map(type, lineages)) == {tuple}
        and set(map(len, lineages)) == {2}
        and set(map(type, map(_first, lineages))) == {tuple}
    )


def all_pointers(lineages: Sequence) -> bool:
    """Whether every one of ``lineages`` is a position, a :func:`is_valid_draw` draw or
    derived from such (any depth), checked a level at a time in passes over all (the
    common case of a state's lineages, quickly). False means "check them one by one",
    not "invalid": it is False too for mixed levels, ``Opaque`` records and numpy ints."""
    level = lineages
    while level:
        types = set(map(type, level))
        if types == {int}:
            return min(level) >= 0
        if types != {tuple}:
            return False
        sizes = set(map(len, level))
        if sizes == {3}:  # draws
            values = list(itertools.chain.from_iterable(level))
            return set(map(type, values)) == {int} and min(values) >= 0
        if sizes != {2} or set(map(type, map(_first, level))) != {tuple}:
            return False
        level = list(itertools.chain.from_iterable(map(_first, level)))
    return True


def _first(lineage: tuple) -> Any:
    return lineage[0]


def parents_of(lineage: tuple) -> tuple:
    """The parents' lineages of a :func:`derived` lineage."""
    return lineage[0]


def recipe_of(lineage: tuple) -> Any:
    """The recipe of a :func:`derived` lineage."""
    return lineage[1]


def derived_parts(lineage: tuple) -> tuple[tuple, Any]:
    """``(parents, recipe)`` of a :func:`derived` lineage."""
    return lineage[0], lineage[1]


def piece(parent: Any, j: int) -> tuple:
    """The lineage of piece ``j`` that ``split`` cuts from the element with lineage ``parent``."""
    return ((parent,), j)


def is_piece(lineage: Any) -> bool:
    """Whether ``lineage`` is derived from one parent (the form :func:`piece` makes)."""
    return is_derived(lineage) and len(lineage[0]) == 1


def piece_parts(lineage: tuple) -> tuple[Any, Any]:
    """``(parent, j)`` of a :func:`piece` (the recipe of any one-parent lineage as ``j``)."""
    return lineage[0][0], lineage[1]


def first_root(lineage: Any) -> Any:
    """The root (a position, draw or ``Opaque``) a lineage's first parents lead to."""
    while type(lineage) is tuple and len(lineage) == 2 and type(lineage[0]) is tuple:
        if not lineage[0]:
            return None
        lineage = lineage[0][0]
    return lineage


def root_key(root: Any) -> Any:
    """A root (a position, numpy ints too, or a :func:`draw`) as a dict key: the draw
    itself, or the position as a Python int."""
    return root if type(root) is tuple else int(root)


def root_position(lineage: Any) -> int | None:
    """The first sampler position a lineage derives from, for error messages."""
    while isinstance(lineage, tuple) and lineage:
        lineage = lineage[0]
    return lineage if isinstance(lineage, int) else None


# ----- stored records ----------------------------------------------------------------


def opaque(data: Any) -> Opaque:
    """The lineage of a record that cannot be regenerated: the record itself."""
    return Opaque(data)


def is_opaque(lineage: Any) -> bool:
    """Whether ``lineage`` is an :class:`Opaque` record."""
    return type(lineage) is Opaque


# ----- piece codes -------------------------------------------------------------------

# An open row of ``pack`` keeps the lineage ``((position,), piece)`` of a piece that
# ``split`` cut from a record as one negative int (see piece_code), which the collector
# never tracks, instead of two tuples.
PIECE_BITS = 24
PIECE_MASK = (1 << PIECE_BITS) - 1
MAX_PIECE = PIECE_MASK  # the largest piece number a piece code holds


def piece_code(position: Any, piece: Any) -> Any:
    """The lineage ``((position,), piece)`` (a position >= 0, a piece < 2**24) as one int < 0
    (element-wise for numpy int64 arrays)."""
    return ~((position << PIECE_BITS) | piece)


def decode_piece(code: Any) -> tuple[Any, Any]:
    """``(position, piece)`` of a :func:`piece_code` (element-wise for numpy int64 arrays)."""
    code = ~code
    return code >> PIECE_BITS, code & PIECE_MASK


def code_position(code: Any) -> Any:
    """The position of a :func:`piece_code` (element-wise for numpy int64 arrays)."""
    return ~code >> PIECE_BITS


def is_piece_code(held: Any) -> bool:
    """Whether ``held`` is a :func:`piece_code`."""
    return type(held) is int and held < 0


def can_code(lineage: Any, count: int) -> bool:
    """Whether the pieces that ``split`` cuts from ``lineage``, ``count`` of them, are
    held as piece codes (``count`` at most :data:`MAX_PIECE`)."""
    return type(lineage) is int and lineage >= 0 and count <= MAX_PIECE


def held_lineage(held: Any) -> Any:
    """The lineage an open row keeps as ``held`` (a :func:`piece_code` or the lineage)."""
    if type(held) is int and held < 0:
        code = ~held
        return ((code >> PIECE_BITS,), code & PIECE_MASK)
    return held


def plain_parents(parents: tuple) -> tuple:
    """``parents`` with each :func:`piece_code` among them written in full."""
    return tuple(map(held_lineage, parents))


def plain_lineage(lineage: Any) -> Any:
    """``lineage`` with its parents in full.

    A row that ``pack``, the last operator, sends to the batch keeps its records'
    lineages as its open row held them (pieces of split records as one int each,
    see :func:`held_lineage`): a lane's unbatched rows and the last batch's rows
    are written in full only when a state is encoded or provenance asked for. No
    lineage has a negative int for a parent, so any other lineage is returned as is.
    """
    if type(lineage) is tuple and len(lineage) == 2 and type(lineage[0]) is tuple:
        parents = lineage[0]
        if any(type(h) is int and h < 0 for h in parents):
            return (tuple(map(held_lineage, parents)), lineage[1])
    return lineage


class HeldLineages(abc.Sequence):
    """The lineages of held elements as groups (tuples), joined into one tuple on first read.

    ``decode`` (a module-level function, so that it pickles) turns each held item
    into its lineage where a carry keeps lineages in a compact form. Equal to the
    joined tuple. A snapshot that keeps a carry's groups, which the
    carry replaces rather than changes, costs a reference per group instead of
    one per element; encoding a state reads the whole.
    """

    __slots__ = ("groups", "decode", "_joined")

    def __init__(self, groups: tuple[tuple, ...], decode: Callable[[Any], Any] | None = None):
        self.groups = groups
        self.decode = decode  # a carry's compact form of a lineage -> the lineage
        self._joined: tuple | None = None

    def joined(self) -> tuple:
        joined = self._joined
        if joined is None:
            joined = self._joined = tuple(iter(self))
        return joined

    def __len__(self) -> int:
        return sum(map(len, self.groups))

    def __getitem__(self, index: Any) -> Any:
        return self.joined()[index]

    def __iter__(self) -> Iterator:
        held = itertools.chain.from_iterable(self.groups)
        return held if self.decode is None else map(self.decode, held)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, HeldLineages):
            other = other.joined()
        return isinstance(other, tuple) and self.joined() == other

    def __repr__(self) -> str:
        return f"HeldLineages({self.joined()!r})"

    def __reduce__(self) -> tuple:
        return (HeldLineages, (self.groups, self.decode))


class DrawPieceTable(abc.Sequence):
    """Lineages of pieces of drawn records, ``(((position, component, draw),), piece)``,
    kept as the rows of an ``(n, 4)`` int64 array (what a lane state decodes an open
    row's held pieces to, see :mod:`zephon_jax.state.lane_format`): read as the tuple
    of those lineages, and equal to it; restoring reads the array itself."""

    __slots__ = ("array",)

    def __init__(self, array: Any):
        self.array = array  # (n, 4) int64: position, component, draw, piece

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return tuple(draw_piece_lineages(self.array[index]))
        a, b, c, d = self.array[index].tolist()
        return (((a, b, c),), d)

    def __iter__(self) -> Iterator:
        return iter(draw_piece_lineages(self.array))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (DrawPieceTable, HeldLineages)):
            other = tuple(other)
        return isinstance(other, tuple) and tuple(self) == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"DrawPieceTable({tuple(self)!r})"

    def __reduce__(self) -> tuple:
        return (DrawPieceTable, (self.array,))


class DrawRowTable(abc.Sequence):
    """Lineages of packed rows of pieces of drawn records, ``(parents, lengths)`` with
    ``parents`` as in a :class:`DrawPieceTable` (what a lane state decodes a mixture
    lane's rows made ahead to), kept as arrays: the pieces (the rows of an ``(n, 4)``
    int64 array), their lengths, and each row's end in them. Read as the tuple of
    those lineages (made on the first read), and equal to it; restoring reads the
    arrays themselves."""

    __slots__ = ("pieces", "lengths", "ends", "_rows")

    def __init__(self, pieces: Any, lengths: Any, ends: Any):
        self.pieces = pieces  # (n, 4) int64: position, component, draw, piece
        self.lengths = lengths  # (n,) int64
        self.ends = ends  # (rows,) int64, ascending
        self._rows: tuple | None = None

    def rows(self) -> tuple:
        """The rows' lineages."""
        rows = self._rows
        if rows is None:
            parents = draw_piece_lineages(self.pieces)
            lengths = self.lengths.tolist()
            bounds = zip([0, *self.ends.tolist()], self.ends.tolist())
            rows = tuple((tuple(parents[a:b]), tuple(lengths[a:b])) for a, b in bounds)
            self._rows = rows
        return rows

    def __len__(self) -> int:
        return len(self.ends)

    def __getitem__(self, index: Any) -> Any:
        return self.rows()[index]

    def __iter__(self) -> Iterator:
        return iter(self.rows())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DrawRowTable):
            other = other.rows()
        return isinstance(other, tuple) and self.rows() == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"DrawRowTable({self.rows()!r})"

    def __reduce__(self) -> tuple:
        return (DrawRowTable, (self.pieces, self.lengths, self.ends))


def draw_piece_lineages(array: Any) -> list:
    """The lineages of the rows ``(position, component, draw, piece)`` of ``array``."""
    return [(((a, b, c),), d) for a, b, c, d in array.tolist()]
