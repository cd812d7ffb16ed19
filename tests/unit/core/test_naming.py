"""``callable_name`` and ``describe_value``: how user functions and their values are named
in the fingerprint (module, qualified name, plain-data values; never memory addresses)."""

from __future__ import annotations

import functools
import hashlib

import numpy as np

from zephon_jax.core.naming import callable_name, describe_value

HERE = __name__  # the module these helpers are defined in


def double(x):
    return 2 * x


def scaled(factor):
    def apply(x):
        return factor * x

    return apply


class Scale:
    def __init__(self, factor):
        self.factor = factor
        self._cache = {}  # private: left out

    def __call__(self, x):
        return self.factor * x

    def apply(self, x):
        return self.factor * x


def test_a_function_is_named_by_module_and_qualified_name():
    assert callable_name(double) == f"{HERE}.double"
    assert callable_name(len) == "builtins.len"
    assert callable_name(Scale) == f"{HERE}.Scale"


def test_a_closure_shows_the_values_it_closes_over():
    assert callable_name(scaled(3)) == f"{HERE}.scaled.<locals>.apply[factor=3]"
    assert callable_name(scaled(3)) != callable_name(scaled(4))


def test_a_closure_over_a_variable_not_yet_assigned_shows_no_value():
    def make():
        def use():
            return later

        name = callable_name(use)
        later = 1
        return name, callable_name(use)

    before, after = make()
    assert before.endswith(".make.<locals>.use")
    assert after == before + "[later=1]"


def test_a_partial_shows_its_function_and_arguments_keywords_sorted():
    fn = functools.partial(double, 2, z="a", b=1.5)
    assert callable_name(fn) == f"partial({HERE}.double, 2, b=1.5, z='a')"


def test_an_object_shows_its_public_attributes_and_a_method_its_object():
    assert callable_name(Scale(2)) == f"{HERE}.Scale(factor=2)"
    assert callable_name(Scale(2).apply) == f"{HERE}.Scale(factor=2).apply"


def test_plain_values_are_shown_by_value():
    assert describe_value(None) == "None"
    assert describe_value([1, "a", 2.5, True]) == "[1, 'a', 2.5, True]"
    assert describe_value((1,)) == "(1,)"
    assert describe_value((1, 2)) == "(1, 2)"
    assert describe_value({"b": 1, "a": (2,)}) == "{'a': (2,), 'b': 1}"
    assert describe_value(bytearray(b"ab")) == "b'ab'"
    assert describe_value(np.int32(7)) == repr(np.int32(7)) != describe_value(7)  # keeps its type


def test_an_array_is_shown_by_dtype_shape_and_a_digest_of_its_contents():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    digest = hashlib.sha256(a.tobytes()).hexdigest()[:16]
    assert describe_value(a) == f"array(<i4, (2, 3), sha256:{digest})"
    assert describe_value(a.T) != describe_value(a)  # other shape and contents
    changed = a.copy()
    changed[1, 2] = 0
    assert describe_value(changed) != describe_value(a)
    assert describe_value(np.array([object()])) == "<numpy.ndarray of object>"


def test_other_values_show_only_their_type():
    class Handle:
        __slots__ = ()

    assert describe_value(Handle()) == f"<{HERE}.{Handle.__qualname__}>"


def test_nesting_deeper_than_four_levels_shows_the_type():
    assert describe_value([[[[[1]]]]]) == "[[[[<builtins.list>]]]]"
    assert describe_value([[[[1]]]]) == "[[[[1]]]]"


def test_a_long_text_is_replaced_by_its_digest():
    long = "x" * 300
    text = repr(long)
    assert describe_value(long) == f"sha256:{hashlib.sha256(text.encode()).hexdigest()[:32]}"
    assert describe_value("x" * 198) == repr("x" * 198)  # 200 characters with the quotes
