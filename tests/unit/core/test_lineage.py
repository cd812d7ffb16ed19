"""Lineages: ``derive``'s ``(parents, recipe)`` form, piece codes and their round trips,
``root_position``, and ``HeldLineages`` (equal to its joined tuple)."""

from __future__ import annotations

import pickle

import pytest

from zephon_jax.core.lineage import (
    PIECE_BITS,
    Element,
    HeldLineages,
    Opaque,
    derive,
    held_lineage,
    is_derived,
    piece_code,
    plain_lineage,
    root_position,
)


def test_derive_keeps_the_inputs_lineages_in_order_and_the_recipe():
    a, b = Element("a", 3), Element("b", ((5,), 1))
    out = derive("ab", [a, b], recipe=(0, 2))
    assert out.data == "ab"
    assert out.lineage == ((3, ((5,), 1)), (0, 2))
    assert derive("x", [a]).lineage == ((3,), None)


@pytest.mark.parametrize(
    "lineage, derived",
    [
        (((1, 2), None), True),
        (((), 7), True),
        (7, False),
        ((1, 2), False),  # a pair, but its parents are no tuple
        (((1,), 2, 3), False),  # three items
        ([(1,), 2], False),  # a list is no lineage
    ],
)
def test_is_derived_recognizes_only_parents_and_recipe(lineage, derived):
    assert is_derived(lineage) is derived


@pytest.mark.parametrize(
    "lineage, root",
    [
        (9, 9),
        (((4, 8), 0), 4),
        (((((12,), 1), 5), None), 12),
        (Opaque({"a": 1}), None),
        (((), None), None),
    ],
)
def test_root_position_follows_first_parents_down_to_a_position(lineage, root):
    assert root_position(lineage) == root


@pytest.mark.parametrize("position, piece", [(0, 0), (0, 1), (7, 3), (123456, 2**24 - 1)])
def test_piece_code_is_negative_and_held_lineage_reads_it_back(position, piece):
    code = piece_code(position, piece)
    assert code < 0
    assert held_lineage(code) == ((position,), piece)


def test_piece_code_by_hand():
    # ~((1 << 24) | 2) = -(2**24 + 2) - 1
    assert piece_code(1, 2) == -(2**PIECE_BITS + 3)
    assert piece_code(0, 0) == -1


@pytest.mark.parametrize("held", [0, 5, ((3,), 1), ((1, 2), None)])
def test_held_lineage_returns_full_lineages_unchanged(held):
    assert held_lineage(held) is held


def test_plain_lineage_writes_piece_codes_among_parents_in_full():
    lineage = ((piece_code(4, 1), 6, piece_code(9, 0)), (0, 3))
    assert plain_lineage(lineage) == ((((4,), 1), 6, ((9,), 0)), (0, 3))


@pytest.mark.parametrize("lineage", [5, ((1, 2), None), ((((3,), 0),), 1), (1, 2)])
def test_plain_lineage_leaves_lineages_without_codes_as_they_are(lineage):
    assert plain_lineage(lineage) is lineage


def test_held_lineages_join_groups_in_order_and_equal_the_tuple():
    held = HeldLineages(((1, 2), (), (3,)))
    assert len(held) == 3
    assert list(held) == [1, 2, 3]
    assert held[0] == 1 and held[-1] == 3 and held[1:] == (2, 3)
    assert held == (1, 2, 3)
    assert held != (1, 2)
    assert held != [1, 2, 3]  # equal to the tuple only
    assert held == HeldLineages(((1,), (2, 3)))
    assert held != HeldLineages(((1, 2),))


def test_held_lineages_decode_each_item():
    held = HeldLineages(((piece_code(2, 1),), (7,)), decode=held_lineage)
    assert held == (((2,), 1), 7)
    assert len(held) == 2


def test_held_lineages_pickle_to_an_equal_value():
    held = HeldLineages(((piece_code(2, 1), 4),), decode=held_lineage)
    again = pickle.loads(pickle.dumps(held))
    assert again == held == (((2,), 1), 4)
