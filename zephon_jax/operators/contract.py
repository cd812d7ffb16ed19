"""The functional operator contract: a few pure functions over an immutable, plain carry.

:func:`lineage_operator` makes an operator from

* ``init(lane) -> carry``: the empty carry of a lane;
* ``step(carry, element) -> (carry, outputs)``: consume one input element;
* optional ``flush(carry) -> (carry, outputs)``: emit what is left when a finite
  input ends;
* optional ``make(recipe, inputs) -> record``: the record of an output
  :func:`made_from` input elements, from their *records* and the recipe.

An output is an input element passed through unchanged, or ``made_from(inputs,
recipe)``: *this output is made from these input elements*. The engine computes
its record with ``make``, when stepping and again when a state is restored, so
the pointers a state stores, the regeneration (``remake``) and the provenance
(``trace``: by default every input, whole) are all derived from that one
statement. An operator without ``make`` only passes elements through
(``passthrough``: it reorders, delays or drops them).

**The carry** is immutable plain data: ``None``, bools, ints, floats, strings,
bytes, numpy arrays and scalars (numeric or bool), tuples, lists and dicts
(string keys) of them, and the input elements the operator holds. ``init``'s
carry may be a ``NamedTuple`` or a frozen dataclass, and so may its fields (as
``init`` gives them). ``step`` returns a new carry and never changes the old
one. The engine checks each new carry and refuses anything else with an error
naming the type. Its saved form (:class:`~zephon_jax.operators.base.Saved`) is
derived: the held elements, in the order a walk of the carry meets them (a state
stores their lineages), and the carry's structure with the rest of its data;
``load`` rebuilds the same structure around the regenerated elements and refuses
a structure that does not fit (:class:`~zephon_jax.errors.StateError`).

The engine runs such an operator as a
:class:`~zephon_jax.operators.base.LineageOperator` (:class:`ContractOperator`),
the lower-level form it derives everything else for. Built-in operators are made
the same way; a built-in may also pass a ``step_block(carry, elements) -> (carry,
elements)`` over a block of elements, which returns the engine's elements exactly as
folding ``step`` and converting its outputs gives them (raising
:class:`~zephon_jax.operators.base.StepFailed` for a failing element), and its own
``save``/``load`` to keep an established saved form.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

import numpy as np

from zephon_jax.core.lineage import Element, derived
from zephon_jax.core.naming import callable_name
from zephon_jax.core.packed import plain
from zephon_jax.errors import PipelineError, StateError
from zephon_jax.operators.base import Carry, LineageOperator, Saved, StepFailed
from zephon_jax.state.envelope import is_int

#: The recipe of an input element a non-passthrough operator passes through unchanged.
PASSED = "zephon_jax.passed"


class _Unset:
    """The marker of a value not given (one object, across pickling too)."""

    def __reduce__(self) -> str:
        return "_UNSET"

    def __repr__(self) -> str:
        return "<unset>"


_UNSET: Any = _Unset()


class Made(NamedTuple):
    """An output made from ``inputs`` (input elements) by ``recipe`` (see :func:`made_from`).

    ``data``: the record, when the operator already computed it (built-ins); it must
    equal ``make(recipe, [e.data for e in inputs])``. Left out, the engine calls ``make``.
    """

    inputs: tuple
    recipe: Any = None
    data: Any = _UNSET


def made_from(inputs: Sequence[Element], recipe: Any = None) -> Made:
    """The output made from the input elements ``inputs`` by ``recipe`` (small plain data).

    Return it from ``step`` or ``flush``: the engine computes its record as
    ``make(recipe, [e.data for e in inputs])`` and stores only pointers to
    ``inputs`` (plus ``recipe``) in a state.
    """
    inputs = tuple(inputs)
    for element in inputs:
        if type(element) is not Element:
            raise PipelineError(
                f"made_from(inputs) takes the input elements the operator received; got "
                f"{type(element).__name__}. Pass the elements themselves, not their records"
            )
    return Made(inputs, recipe)


# ----- checking the carry ------------------------------------------------------------

_LEAVES = frozenset({Element, type(None), bool, int, float, str, bytes})
_NUMERIC = "biufc"


def _is_record(node: Any) -> bool:
    """Whether ``node`` is a NamedTuple or dataclass instance."""
    kind = type(node)
    return (issubclass(kind, tuple) and hasattr(kind, "_fields")) or (
        dataclasses.is_dataclass(node) and not isinstance(node, type)
    )


def _fields(node: Any) -> tuple:
    """The field values of a NamedTuple or dataclass instance, in order."""
    if isinstance(node, tuple):
        return tuple(node)
    return tuple(getattr(node, f.name) for f in dataclasses.fields(node))


def _refuse(name: str, where: str, what: str, fix: str) -> PipelineError:
    return PipelineError(
        f"the carry of operator {name!r} holds {what} at {where}; a carry is immutable plain "
        f"data (None, bools, ints, floats, strings, bytes, numeric numpy arrays, tuples, lists "
        f"and dicts of them) and the input elements it holds: {fix}"
    )


def check_carry(carry: Any, template: Any, name: str, where: str = "carry") -> None:
    """Raises a :class:`PipelineError` naming the first part of ``carry`` that is not
    plain data or an element, or a NamedTuple or dataclass where ``template`` (the carry
    ``init`` gives) has none of that type."""
    kind = type(carry)
    if kind in _LEAVES:
        return
    if kind is tuple or kind is list:
        if not set(map(type, carry)) <= _LEAVES:
            for i, item in enumerate(carry):
                check_carry(item, None, name, f"{where}[{i}]")
    elif kind is dict:
        for key, value in carry.items():
            if type(key) is not str:
                raise _refuse(name, where, f"a dict key {key!r}", "use string keys")
            check_carry(value, None, name, f"{where}[{key!r}]")
    elif _is_record(carry):
        _check_record(carry, template, name, where)
    elif isinstance(carry, (np.ndarray, np.generic)):
        if carry.dtype.kind not in _NUMERIC:
            raise _refuse(name, where, f"a numpy {carry.dtype} value", "use a numeric dtype")
    else:
        fix = "keep sets as sorted tuples" if isinstance(carry, (set, frozenset)) else ""
        fix = fix or "hold its plain data, or the element itself, instead"
        raise _refuse(name, where, f"a value of type {kind.__qualname__}", fix)


def _check_record(carry: Any, template: Any, name: str, where: str) -> None:
    kind = type(carry)
    if dataclasses.is_dataclass(carry) and not kind.__dataclass_params__.frozen:
        raise _refuse(
            name, where, f"a mutable dataclass {kind.__qualname__}", "declare it frozen=True"
        )
    if type(template) is not kind:
        raise _refuse(
            name,
            where,
            f"a value of type {kind.__qualname__}",
            "a NamedTuple or frozen dataclass can stand only where init()'s carry has one of "
            "the same type (a state rebuilds it from there); use a plain tuple or dict here",
        )
    for (field, value), model in zip(_named_fields(carry), _fields(template)):
        check_carry(value, model, name, f"{where}.{field}")


def _named_fields(node: Any) -> list[tuple[str, Any]]:
    if isinstance(node, tuple):
        return list(zip(getattr(type(node), "_fields", ()), node))
    return [(f.name, getattr(node, f.name)) for f in dataclasses.fields(node)]


# ----- the derived saved form --------------------------------------------------------

# Node tags of a carry's saved structure (``aux``): (tag, payload).
_VALUE, _ELEMENT, _TUPLE, _LIST, _DICT, _RECORD, _ELEMENTS, _ELEMENT_LIST = range(8)


def flatten(carry: Any, held: list[Element]) -> tuple:
    """The saved structure of a checked ``carry``; its elements are appended to ``held``
    in walk order (a subtree without elements is kept as one value)."""
    kind = type(carry)
    if kind is Element:
        held.append(carry)
        return (_ELEMENT,)
    if kind is tuple or kind is list:
        if carry and set(map(type, carry)) == {Element}:
            held.extend(carry)
            return (_ELEMENTS if kind is tuple else _ELEMENT_LIST, len(carry))
        children = tuple(flatten(item, held) for item in carry)
        if all(child[0] == _VALUE for child in children):
            return (_VALUE, carry)
        return (_TUPLE if kind is tuple else _LIST, children)
    if kind is dict:
        items = {key: flatten(value, held) for key, value in carry.items()}
        if all(child[0] == _VALUE for child in items.values()):
            return (_VALUE, carry)
        return (_DICT, items)
    if _is_record(carry):
        return (_RECORD, tuple(flatten(value, held) for value in _fields(carry)))
    return (_VALUE, carry)


def unflatten(node: Any, template: Any, held: Iterator[Element]) -> Any:
    """The carry :func:`flatten` saved as ``node``, with ``held``'s elements in their
    places and records rebuilt as ``template`` has them; ``ValueError`` if it does not fit."""
    if type(node) is not tuple or not node or type(node[0]) is not int:
        raise ValueError(f"{node!r:.80} is no carry node")
    tag = node[0]
    if tag == _VALUE and len(node) == 2:
        return node[1]
    if tag == _ELEMENT and len(node) == 1:
        return next(held)
    if tag in (_ELEMENTS, _ELEMENT_LIST) and len(node) == 2 and type(node[1]) is int:
        elements = [next(held) for _ in range(node[1])]
        return tuple(elements) if tag == _ELEMENTS else elements
    if tag in (_TUPLE, _LIST) and len(node) == 2 and type(node[1]) is tuple:
        items = [unflatten(child, None, held) for child in node[1]]
        return tuple(items) if tag == _TUPLE else items
    if tag == _DICT and len(node) == 2 and type(node[1]) is dict:
        return {key: unflatten(child, None, held) for key, child in node[1].items()}
    if tag == _RECORD and len(node) == 2 and type(node[1]) is tuple and _is_record(template):
        models = _fields(template)
        if len(models) == len(node[1]):
            values = [unflatten(c, m, held) for c, m in zip(node[1], models)]
            return _rebuild(template, values)
    raise ValueError(f"{node!r:.80} does not fit the carry init() gives")


def _rebuild(template: Any, values: list) -> Any:
    if isinstance(template, tuple):
        return type(template)(*values)
    names = [f.name for f in dataclasses.fields(template)]
    return dataclasses.replace(template, **dict(zip(names, values)))


# ----- the operator --------------------------------------------------------------------


class ContractOperator(LineageOperator):
    """An operator made by :func:`lineage_operator`, as the engine runs it.

    ``save``/``load``, ``remake`` and ``trace`` are derived from the carry and from
    the :func:`made_from` declarations ``step`` and ``flush`` return.
    """

    def __init__(
        self,
        name: str,
        init: Callable[[int], Any],
        step: Callable[[Any, Element], tuple[Any, Sequence[Any]]],
        flush: Callable[[Any], tuple[Any, Sequence[Any]]] | None = None,
        make: Callable[[Any, Sequence[Any]], Any] | None = None,
        *,
        trace: Callable | None = None,
        max_held: int = 0,
        describe: str | None = None,
        carry_bound: str = "user-defined",
        step_block: Callable | None = None,
        save: Callable[[Any], Saved] | None = None,
        load: Callable[[Saved, int], Any] | None = None,
        user_code: bool = True,
    ):
        for what, fn in (("init", init), ("step", step)):
            if not callable(fn):
                raise PipelineError(f"lineage_operator({name!r}) needs a callable {what}")
        self.name = str(name)
        self.passthrough = make is None
        self.max_held = int(max_held)
        self.user_code = user_code
        self.init_fn, self.step_fn, self.flush_fn, self.make_fn = init, step, flush, make
        self.trace_fn = trace
        self.description = describe or self._default_description()
        self.bound = carry_bound
        self.save_fn, self.load_fn = save, load
        self._template = _UNSET
        if step_block is not None:
            self.block_fn = step_block
            # A built-in's carry is not checked (its tests do): its block runs as given.
            self.step_block = self._step_block if user_code else step_block

    def _default_description(self) -> str:
        named = [("step", self.step_fn), ("flush", self.flush_fn), ("make", self.make_fn)]
        parts = [f"{what}={callable_name(fn)}" for what, fn in named if fn is not None]
        return f"{self.name}({', '.join(parts)})"

    def template(self) -> Any:
        """The carry ``init`` gives (lane 0): where a carry may hold records of which type."""
        if self._template is _UNSET:
            self._template = self.init_fn(0)
        return self._template

    # ----- running -----------------------------------------------------------------

    def init(self, lane: int) -> Carry:
        carry = self.init_fn(lane)
        check_carry(carry, self.template(), self.name)
        return carry

    def step(self, carry: Carry, element: Element) -> tuple[Carry, list[Element]]:
        return self._result(self.step_fn(carry, element), "step")

    def _step_block(self, carry: Carry, elements: Sequence[Element]):
        carry, outputs = self.block_fn(carry, elements)  # the engine's elements already
        if self.user_code:
            check_carry(carry, self.template(), self.name)
        return carry, outputs

    def flush(self, carry: Carry) -> tuple[Carry, list[Element]]:
        if self.flush_fn is None:
            return carry, []
        return self._result(self.flush_fn(carry), "flush")

    def _result(self, result: Any, what: str) -> tuple[Carry, list[Element]]:
        if type(result) is not tuple or len(result) != 2:
            raise PipelineError(
                f"{self.name}.{what} must return (carry, outputs); got {type(result).__name__}"
            )
        carry, outputs = result
        if self.user_code:  # built-in operators' carries are checked by their tests
            check_carry(carry, self.template(), self.name)
        return carry, self._outputs(outputs, what)

    def _outputs(self, outputs: Any, what: str) -> list[Element]:
        """The engine's elements for the outputs ``step`` or ``flush`` returned."""
        if not outputs:
            return []
        if self.passthrough and (not self.user_code or set(map(type, outputs)) == {Element}):
            return list(outputs)
        return [self._output(output, what) for output in outputs]

    def _output(self, output: Any, what: str) -> Element:
        kind = type(output)
        if kind is Made:
            if self.make_fn is None:
                raise PipelineError(
                    f"{self.name}.{what} returned made_from(...) but the operator has no "
                    "make(recipe, inputs); pass make= to lineage_operator"
                )
            parents = tuple([e.lineage for e in output.inputs])
            data = output.data
            if data is _UNSET:
                data = self.make_fn(output.recipe, [e.data for e in output.inputs])
            return Element(data, derived(parents, output.recipe))
        if kind is Element:
            if self.passthrough:
                return output
            return Element(output.data, derived((output.lineage,), PASSED))
        raise PipelineError(
            f"{self.name}.{what} returned a {kind.__name__} as an output; an output is an "
            "input element passed through unchanged or made_from(inputs, recipe)"
        )

    # ----- derived: regeneration, provenance, saved form ---------------------------

    def remake(self, recipe: Any, inputs: Sequence[Any]) -> Any:
        if self.make_fn is None or (type(recipe) is str and recipe == PASSED):
            return inputs[0]
        return self.make_fn(recipe, inputs)

    def trace(self, recipe, parents, start, stop):
        if type(recipe) is str and recipe == PASSED:
            return [(parents[0], start, stop, None)]
        if self.trace_fn is not None:
            return self.trace_fn(recipe, parents, start, stop)
        return [(parent, None, None, None) for parent in parents]

    def save(self, carry: Carry) -> Saved:
        if self.save_fn is not None:
            return self.save_fn(carry)
        held: list[Element] = []
        structure = flatten(carry, held)
        return Saved(tuple(held), structure)

    def load(self, saved: Saved, lane: int) -> Carry:
        if self.load_fn is not None:
            return self.load_fn(saved, lane)
        held = iter(saved.held)
        try:
            carry = unflatten(saved.aux, self.template(), held)
        except StopIteration:
            problem = f"it holds {len(saved.held)} elements, fewer than its structure needs"
        except (ValueError, TypeError) as e:
            problem = str(e)
        else:
            if next(held, _UNSET) is _UNSET:
                return carry
            problem = f"it holds {len(saved.held)} elements, more than its structure needs"
        raise StateError(
            f"the saved carry of {self.describe()} does not fit the operator: {problem}; the "
            "state was altered or taken with another version of the operator"
        )

    def describe(self) -> str:
        return self.description

    def carry_bound(self) -> str:
        return self.bound


def lineage_operator(
    name: str,
    init: Callable[[int], Any],
    step: Callable[[Any, Element], tuple[Any, Sequence[Any]]],
    flush: Callable[[Any], tuple[Any, Sequence[Any]]] | None = None,
    make: Callable[[Any, Sequence[Any]], Any] | None = None,
    *,
    trace: Callable | None = None,
    max_held: int = 0,
    describe: str | None = None,
    carry_bound: str = "user-defined",
) -> ContractOperator:
    """An operator from pure functions over an immutable plain carry (see the module doc).

    ``name``: for messages. ``init(lane) -> carry``; ``step(carry, element) -> (carry,
    outputs)``; ``flush(carry) -> (carry, outputs)`` (default: nothing left);
    ``make(recipe, inputs) -> record``, the record of ``made_from(inputs, recipe)``
    from the inputs' records (without it the operator only passes elements through).
    ``trace(recipe, parents, start, stop)``: which input slices a slice of an output
    holds (default: every input, whole). ``max_held``: the most input elements a carry
    holds. ``describe``: the operator and its parameters for the pipeline fingerprint
    (default: ``name`` and the functions, with the plain values their closures hold).
    ``carry_bound``: the carry's bound in words, for ``zephon-jax inspect``.
    """
    return ContractOperator(
        name,
        init,
        step,
        flush,
        make,
        trace=trace,
        max_held=max_held,
        describe=describe,
        carry_bound=carry_bound,
    )


class stateless(ContractOperator):
    """A 1-to-n operator without carry from a pure ``fn(record) -> list of records``.

    Output ``m`` of an input is ``made_from([input], m)``, regenerated by calling
    ``fn`` again on the input, like ``optax.stateless`` wraps a pure update.
    """

    def __init__(self, fn: Callable[[Any], Iterable[Any]], name: str = "stateless"):
        self.fn = fn
        super().__init__(
            name,
            no_carry,
            self._outputs_of,
            make=self._output_of,
            trace=_output_trace,
            describe=f"{name}({callable_name(fn)})",
            carry_bound="none (outputs are emitted at once)",
            step_block=self._block_outputs,
            save=save_nothing,  # the saved form of an operator without carry, as always
            load=self._load_nothing,
        )

    def _load_nothing(self, saved: Saved, lane: int) -> None:
        return load_nothing(self, saved)

    def _block_outputs(self, carry: None, elements: Sequence[Element]):
        """What ``step`` over each of ``elements`` gives, as the engine's elements."""
        out: list[Element] = []
        fn = self.fn
        for index, element in enumerate(elements):
            try:
                outputs = fn(plain(element.data))
                parents = (element.lineage,)  # what made_from((element,), m) points to
                if type(outputs) is list and len(outputs) == 1:
                    out.append(Element(outputs[0], derived(parents, 0)))
                else:
                    out += [Element(o, derived(parents, m)) for m, o in enumerate(outputs)]
            except Exception as e:
                raise StepFailed(index, e, out, carry) from e
        return carry, out

    def _outputs_of(self, carry: None, element: Element) -> tuple[None, list[Made]]:
        inputs = (element,)
        return carry, [Made(inputs, m, out) for m, out in enumerate(self.fn(plain(element.data)))]

    def _output_of(self, recipe: Any, inputs: Sequence[Any]) -> Any:
        if not is_int(recipe) or recipe < 0:
            raise StateError(
                f"the state holds output {recipe!r} of {self.describe()}; an output index is "
                "an int >= 0: the state was altered"
            )
        for m, out in enumerate(self.fn(plain(inputs[0]))):
            if m == recipe:
                return out
        raise RuntimeError(
            f"{self.describe()} returned fewer outputs on restore than before; "
            "the function must be pure"
        )


def no_carry(lane: int) -> None:
    """``init`` of an operator without carry: ``None``."""
    return None


def save_nothing(carry: None) -> Saved:
    """The saved form of no carry, ``Saved((), None)`` (what an operator without carry
    has always saved)."""
    return Saved((), None)


def load_nothing(op: LineageOperator, saved: Saved) -> None:
    """No carry, from its saved form: a :class:`StateError` if ``saved`` holds anything."""
    if saved.held or saved.aux is not None:
        raise StateError(
            f"the saved carry of {op.describe()} holds {len(saved.held)} elements and "
            f"{saved.aux!r:.80}; it has no carry: the state was altered"
        )
    return None


def _output_trace(recipe: Any, parents: tuple, start: Any, stop: Any) -> list:
    return [(parents[0], None, None, recipe)]  # output ``recipe`` of the input
