"""The operator contract: explicit, bounded carry over a lane's element stream.

An operator is three functions over a carry, in the style of optax:

* ``init(lane) -> carry``
* ``step(carry, element) -> (carry, outputs)``
* ``flush(carry) -> (carry, outputs)``, called once when a finite input ends.

The carry belongs to one lane; ``step`` may update it in place and returns the
carry to use next. Built-in operators are *lineage-aware*: their carries hold
elements, and for a state they are written as lineages (record pointers) and
rebuilt from them on restore, so a state costs bytes per pointer, not per
token. They also say how to regenerate an output from its lineage.

User-defined operators follow the simpler record-level contract of
:class:`Operator` and keep their own plain-data carry.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from zephon_jax.lineage import Element

Rebuild = Callable[[Any], Element]


class LineageOperator:
    """Base of the built-in operators; subclasses override the methods below."""

    name: str = "operator"

    def init(self, lane: int) -> Any:
        return None

    def step(self, carry: Any, element: Element) -> tuple[Any, list[Element]]:
        raise NotImplementedError

    def flush(self, carry: Any) -> tuple[Any, list[Element]]:
        return carry, []

    def carry_bound(self) -> str:
        """Human-readable bound on the carry (elements held), for docs and ``inspect``."""
        return "none"

    def describe(self) -> str:
        """The operator and its parameters, for the pipeline fingerprint."""
        return self.name

    def carry_to_plain(self, carry: Any) -> Any:
        """The carry as plain data, with elements replaced by their lineages."""
        return None

    def carry_from_plain(self, plain: Any, lane: int, rebuild: Rebuild) -> Any:
        """Inverse of :meth:`carry_to_plain`; ``rebuild`` regenerates an input element."""
        return self.init(lane)

    def carry_lineages(self, plain: Any) -> Iterable[Any]:
        """Input lineages a plain carry points to (read in one batch on restore)."""
        return ()

    def parents(self, lineage: Any) -> Iterable[Any]:
        """Lineages of the input elements an output with ``lineage`` is made from."""
        return (lineage,)

    def regenerate(self, lineage: Any, rebuild: Rebuild) -> Any:
        """The data of the output element with ``lineage``, from its parents."""
        return rebuild(lineage).data


class Operator:
    """The contract of a user-defined n-to-m operator, over records and a plain carry.

    Subclass it (or pass any object with these three methods) to
    :meth:`zephon_jax.Dataset.apply`:

    * ``init() -> carry``: the empty carry; plain data (ints, floats, strings,
      numpy arrays, and lists/tuples/dicts of them).
    * ``step(carry, record) -> (carry, list_of_records)``: consume one record.
    * ``flush(carry) -> (carry, list_of_records)``: emit what is left when a finite
      input ends.

    All three must be deterministic functions of their arguments. The carry and
    the records it emits are stored in loader states as data, so keep the carry
    bounded; the guarantee (the same rows on every topology and across resumes)
    then holds for the operator as for the built-in ones.
    """

    def init(self) -> Any:
        raise NotImplementedError

    def step(self, carry: Any, record: Any) -> tuple[Any, list[Any]]:
        raise NotImplementedError

    def flush(self, carry: Any) -> tuple[Any, list[Any]]:
        return carry, []
