"""Elements flowing through a lane: record data plus the lineage that regenerates it."""

from __future__ import annotations

from typing import Any


class Element:
    """A record and its lineage.

    The lineage is plain data (ints and tuples; an ``Opaque`` holds literal
    data) from which the record can be rebuilt: the lane-local sampler position
    it came from plus the sub-indices the operators gave it. States store
    lineages, never tokens, wherever the operators allow it.
    """

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


def root_position(lineage: Any) -> int | None:
    """The first sampler position a lineage derives from, for error messages."""
    while isinstance(lineage, tuple) and lineage:
        lineage = lineage[0]
    return lineage if isinstance(lineage, int) else None
