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
"""

from __future__ import annotations

from typing import Any, Sequence


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
