"""The operator contract: pure functions over an explicit, bounded carry, in lineage terms.

Every operator, built-in or user-defined, is a :class:`LineageOperator`:

* ``init(lane) -> carry``: the empty carry of a lane.
* ``step(carry, element) -> (carry, outputs)``: consume one input element.
* optional ``step_block(carry, elements) -> (carry, outputs)``: consume a block
  of input elements; exactly the fold of ``step`` over them (the outputs
  concatenated in order). Without it the engine folds ``step``
  (:func:`fold_steps`); an operator defines it to spend less per element
  (``split``, ``pack``). If element ``i`` raises, it raises :class:`StepFailed`
  naming ``i``, with the outputs of the elements before it. (It is not part of
  the protocol's required members, so operators written without it still match.)
* ``flush(carry) -> (carry, outputs)``: called once when a finite input ends.
* optional ``recut(carry, pieces) -> (carry, outputs)``: for an operator that cuts
  a stream of items into outputs of ``(start, stop)`` pieces of its inputs (its
  recipe: one span per input, as ``pack(method='concat')``): continue the stream
  with ``pieces`` ``(element, start, stop)``. A restore that excludes records
  takes such outputs back as pieces and re-cuts them in stream order (see
  :mod:`zephon_jax.engine.exclusion`).
* ``remake(recipe, inputs) -> data``: the data of an output made by
  :func:`~zephon_jax.core.lineage.derive`, from its recipe and its inputs' data.
* ``save(carry) -> Saved`` and ``load(saved, lane) -> carry``: the carry's saved
  form and back (see :class:`Saved`).
* optional ``save_lineages(carry) -> (lineages, aux)``: ``save`` with the held
  elements written as their lineages (what a lane snapshot stores); the
  default (:func:`save_lineages`) maps ``save``'s. An operator defines it to
  spend less per snapshot: ``lineages`` may then be a :class:`HeldLineages`,
  groups of lineages joined only when a state is encoded (``pack`` keeps one
  tuple per open row and a snapshot just takes those tuples).

Outputs are :class:`~zephon_jax.core.lineage.Element` s: either an input element
passed through unchanged (operators with ``passthrough = True``: reorder, delay
or drop) or ``derive(data, inputs, recipe)``. An operator thus states *once*
which inputs an output is made from; the engine (``zephon_jax.engine.lane`` and
``zephon_jax.engine.restore``) turns that into pointers for states and regenerates the
output on restore. It never sees the operator's bookkeeping.

**Carries.** The *saved form* is the contract: :meth:`LineageOperator.save`
returns a :class:`Saved`, immutable and plain (the input elements the carry
holds, written as their lineages, plus ``aux``: ``None``, bools, ints, floats,
strings, bytes, numpy arrays and tuples/lists/dicts of them).
``load(save(c), lane)`` must behave exactly as ``c``. In memory a carry may be
anything (mutable buffers, caches) as long as: ``step`` returns the carry to use
next (an operator written against this class may update the one it was given in
place; one made through the contract never does, see below); ``save`` returns
data that later ``step`` s cannot change; nothing in it depends on the process,
worker or topology. (The column path, :mod:`zephon_jax.engine.columns`, keeps
``pack``'s open rows in a working form of its own that it updates in place;
their saved form is ``pack``'s.)

**Blocks.** A lane pushes its records through the operators in blocks (a few
records, sized from the rows it still needs): operator ``k`` steps over a
block, then operator ``k + 1`` over the outputs. Because ``step_block`` is the
fold of ``step`` and operators share nothing, every operator sees the same
inputs in the same order as one element at a time, so the rows are the same;
a lane may finish a few rows ahead, which its state holds as pointers.

Most operators are not written against this class directly but made from a few
pure functions by :func:`zephon_jax.operators.contract.lineage_operator`, which
derives ``save``/``load``, ``remake`` and ``trace`` for them. Built-ins are made
through the same contract (:class:`~zephon_jax.operators.contract.ContractOperator`:
``pack`` first/best fit, ``window_shuffle``, ``flat_map``); their carries are never
changed once returned.

Record-level user operators (:class:`Operator`) run through an adapter that
stores their carry and outputs by value (``zephon_jax.operators.user``).
"""

from __future__ import annotations

import functools
import operator
from typing import (
    Any,
    Callable,
    NamedTuple,
    Protocol,
    Sequence,
    runtime_checkable,
)

from zephon_jax.core.lineage import Element
from zephon_jax.core.naming import callable_name
from zephon_jax.core.packed import PackSpec

Carry = Any


class Saved(NamedTuple):
    """The saved form of a carry.

    ``held``: the input elements the carry holds, in order (a state stores their
    lineages; restore regenerates them). ``aux``: the rest, as plain immutable data.
    """

    held: tuple[Element, ...] = ()
    aux: Any = None


class StepFailed(Exception):
    """``step_block`` failed on element ``index`` of its block with ``error`` (its cause).

    ``outputs``: the outputs of the elements before it, in order; ``carry``: the carry
    after them (the engine delivers those outputs, then raises ``error`` naming the element).
    """

    def __init__(self, index: int, error: BaseException, outputs: Sequence[Element], carry: Carry):
        super().__init__(index, error)
        self.index = index
        self.error = error
        self.outputs = outputs
        self.carry = carry


_lineage = operator.attrgetter("lineage")


def save_lineages(op: Any, carry: Carry) -> tuple[tuple, Any]:
    """``op.save(carry)`` with its held elements as lineages: ``(lineages, aux)``.

    Uses ``op.save_lineages`` when the operator has one (it must return exactly
    this), else maps the lineages of ``save``'s elements.
    """
    own = getattr(op, "save_lineages", None)
    if own is not None:
        return own(carry)
    held, aux = op.save(carry)
    return tuple(map(_lineage, held)), aux


def fold_steps(step: Callable, carry: Carry, elements: Sequence[Element]):
    """``step`` folded over ``elements``: ``(carry, outputs)``; the default ``step_block``."""
    outputs: list[Element] = []
    for index, element in enumerate(elements):
        try:
            carry, out = step(carry, element)
        except Exception as e:
            raise StepFailed(index, e, outputs, carry) from e
        if out:
            outputs.extend(out)
    return carry, outputs


def step_block_of(op: Any) -> Callable:
    """``op.step_block``, or the fold of ``op.step`` for an operator without one."""
    block = getattr(op, "step_block", None)
    return block if block is not None else functools.partial(fold_steps, op.step)


class BinPacking(NamedTuple):
    """What a ``pack`` that the column path may run declares (see
    :attr:`LineageOperator.column_packing`): its open rows per lane, whether it fills the
    fullest row with room (best fit; else the first with room), its :class:`PackSpec`."""

    num_bins: int
    best: bool
    spec: PackSpec


@runtime_checkable
class LineageOperator(Protocol):
    """The contract every operator follows (subclass it to inherit the defaults).

    Besides its methods, an operator declares what it can do; the engine takes its
    faster paths only for operators that declare them, and a subclass inherits its
    parent's declarations (reset those it no longer keeps). The defaults declare
    nothing, so the general path runs:

    * ``cuts_records`` (``c``, 0: no) and ``cut_key``: the outputs are exactly
      ``split(c, cut_key)``'s, so the engine may cut records itself (fused with a
      ``pack`` after it, or in the column path).
    * ``rows_list_pieces``: each output's lineage lists the pieces it holds and their
      lengths, so delivered rows are counted many at once (after passthrough
      operators and at most one that ``cuts_records``), never traced one by one.
    * ``fuses_after_split`` (``s``, 0: no): ``place_split`` places the pieces of an
      operator that ``cuts_records`` (at most ``s``) right before it directly.
    * ``column_packing`` (a :class:`BinPacking`, None: no): the rows are exactly
      ``pack``'s with these parameters; alone, or after a fused split, over token
      arrays, the column path places them with the compiled kernel.
    * ``may_pack`` (True unless declared False): whether an output may be a packed row
      made from inputs that are not.
    """

    name: str = "operator"
    #: Outputs are input elements, unchanged; ``remake`` is then never called.
    passthrough: bool = False
    #: Input elements the carry can hold at most (bounds the work before an output).
    max_held: int = 0
    #: Whether ``remake`` runs user code: its errors are then the user's (RecordError);
    #: a built-in operator's are a malformed state's (StateError).
    user_code: bool = True
    # What the operator can do, declared for the engine's faster paths (see the class
    # docstring). The defaults declare nothing: the general path runs.
    #: ``c > 0``: the outputs are exactly ``split(c, cut_key)``'s (each input cut into
    #: pieces ``piece(lineage, j)`` of at most ``c`` items); 0: no such operator.
    cuts_records: int = 0
    #: The field ``cuts_records`` measures and cuts.
    cut_key: str = "tokens"
    #: Each output's lineage is ``derived(parents, lengths)``: the inputs (whole, or pieces
    #: of an operator that ``cuts_records``) it holds and their lengths, in order.
    rows_list_pieces: bool = False
    #: ``s > 0``: the operator has ``place_split(carry, elements, cut, key, compact)``, which
    #: does exactly what an operator with ``cuts_records = cut <= s`` (and ``cut_key =
    #: key``) right before it does, then this operator's ``step_block``, for the leading
    #: elements it takes; it returns ``(carry, rows, taken, empty)`` (see
    #: :meth:`~zephon_jax.operators.pack.BinPackOperator.place_split`); 0: none.
    fuses_after_split: int = 0
    #: A :class:`BinPacking`: the rows and the carry are exactly those of ``pack`` with these
    #: parameters, so the column path may place them with the compiled kernel (adopting
    #: the carry's open rows); None: no such operator.
    column_packing: BinPacking | None = None
    #: False: an output is a packed row only where its input is one (``to_training``
    #: then needs a ``pack`` before it).
    may_pack: bool = True

    def init(self, lane: int) -> Carry:
        return None

    def step(self, carry: Carry, element: Element) -> tuple[Carry, Sequence[Element]]: ...

    def flush(self, carry: Carry) -> tuple[Carry, Sequence[Element]]:
        return carry, []

    def remake(self, recipe: Any, inputs: Sequence[Any]) -> Any:
        """The data of the output ``derive(data, inputs, recipe)`` made, from ``inputs``' data."""
        if self.passthrough:  # never called: an output is its input
            return inputs[0]
        raise NotImplementedError(f"{type(self).__name__} derives outputs but has no remake()")

    def trace(
        self, recipe: Any, parents: tuple, start: int | None, stop: int | None
    ) -> list[tuple[Any, int | None, int | None, int | None]]:
        """Provenance: the input slices slice ``[start, stop)`` of a derived output comes from.

        One ``(parent_lineage, start, stop, output)`` per piece, in the output's
        order; ``None`` bounds mean a whole input, ``output`` numbers an output
        that is not a slice (a ``flat_map`` result). Default: every input, whole.
        """
        return [(parent, None, None, None) for parent in parents]

    def save(self, carry: Carry) -> Saved:
        """The carry's saved form; the default suits carries that are plain data."""
        return Saved((), carry)

    def load(self, saved: Saved, lane: int) -> Carry:
        """The carry from its saved form (``held`` regenerated as elements)."""
        return saved.aux

    def describe(self) -> str:
        """The operator and its parameters, for the pipeline fingerprint (default: the class
        and its public attributes, see :func:`~zephon_jax.transforms.callable_name`)."""

        return callable_name(self)

    def carry_bound(self) -> str:
        """Human-readable bound on the carry, for docs and ``inspect``."""
        return "none"


class Operator:
    """The contract of a record-level user operator, over records and a plain carry.

    Subclass it (or pass any object with these three methods) to
    :meth:`zephon_jax.Dataset.apply`:

    * ``init() -> carry``: the empty carry; plain data (ints, floats, strings,
      numpy arrays, and lists/tuples/dicts of them).
    * ``step(carry, record) -> (carry, list_of_records)``: consume one record.
    * ``flush(carry) -> (carry, list_of_records)``: emit what is left when a finite
      input ends.

    All three must be deterministic functions of their arguments. The carry and
    the records it emits are stored in loader states *by value*, so keep the
    carry bounded; the guarantee (the same rows on every topology and across
    resumes) then holds for the operator as for the built-in ones. To store
    pointers instead, make the operator with
    :func:`~zephon_jax.operators.contract.lineage_operator`.
    """

    def init(self) -> Any:
        raise NotImplementedError

    def step(self, carry: Any, record: Any) -> tuple[Any, list[Any]]:
        raise NotImplementedError

    def flush(self, carry: Any) -> tuple[Any, list[Any]]:
        return carry, []
