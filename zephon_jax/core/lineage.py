"""Elements flowing through a lane: record data plus the lineage (pointer) that regenerates it.

A lineage is plain data, one of:

* an ``int``: the lane-local sampler position of a record (stage 0);
* ``(parents, recipe)``: an output of an operator, made from the input elements
  whose lineages are the tuple ``parents`` by ``operator.remake(recipe, inputs)``
  (see :func:`derive`); ``recipe`` is small plain data (a piece number, slice
  bounds, ``None``);
* an input's lineage unchanged, for operators that pass elements through
  (reorder, delay or drop them, ``passthrough = True``);
* an :class:`Opaque`: a record that cannot be regenerated, stored by value (the
  fallback for record-level user operators).

States store lineages, never tokens, wherever the operators allow it.

Inside ``pack`` (and in the rows it sends straight to the batch) a piece that
``split`` cut from record ``position`` may be written as one negative int,
:func:`piece_code`; :func:`plain_lineage` writes it in full, and states and
provenance only ever see lineages in full.
"""

from __future__ import annotations

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


def derive(data: Any, inputs: Sequence[Element], recipe: Any = None) -> Element:
    """An output made from ``inputs`` (elements an operator received) by ``recipe``.

    ``data`` must equal ``operator.remake(recipe, [e.data for e in inputs])``: on
    restore the engine regenerates the output that way, from the inputs' lineages.
    """
    return Element(data, (tuple([e.lineage for e in inputs]), recipe))


def is_derived(lineage: Any) -> bool:
    """Whether ``lineage`` has the ``(parents, recipe)`` form :func:`derive` makes."""
    return type(lineage) is tuple and len(lineage) == 2 and type(lineage[0]) is tuple


def root_position(lineage: Any) -> int | None:
    """The first sampler position a lineage derives from, for error messages."""
    while isinstance(lineage, tuple) and lineage:
        lineage = lineage[0]
    return lineage if isinstance(lineage, int) else None


# An open row of ``pack`` keeps the lineage ``((position,), piece)`` of a piece that
# ``split`` cut from a record as one negative int (see piece_code), which the collector
# never tracks, instead of two tuples.
PIECE_BITS = 24
PIECE_MASK = (1 << PIECE_BITS) - 1


def piece_code(position: int, piece: int) -> int:
    """The lineage ``((position,), piece)`` (a position >= 0, a piece < 2**24) as one int < 0."""
    return ~((position << PIECE_BITS) | piece)


def held_lineage(held: Any) -> Any:
    """The lineage an open row keeps as ``held`` (a :func:`piece_code` or the lineage)."""
    if type(held) is int and held < 0:
        code = ~held
        return ((code >> PIECE_BITS,), code & PIECE_MASK)
    return held


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
