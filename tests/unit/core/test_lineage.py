"""Lineages: ``derive``'s ``(parents, recipe)`` form, piece codes and their round trips,
``root_position``, ``HeldLineages`` (equal to its joined tuple), the closed set of
forms (``kind``) with their constructors and accessors, and that no other module
tests or builds lineages by shape."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import numpy as np
import pytest

import zephon_jax
from zephon_jax.core.lineage import (
    PIECE_BITS,
    DrawPieceTable,
    DrawRowTable,
    Element,
    HeldLineages,
    LineageKind,
    Opaque,
    all_pointers,
    decode_piece,
    derive,
    derived,
    derived_parts,
    draw,
    draw_parts,
    first_root,
    held_lineage,
    is_derived,
    is_draw,
    is_valid_draw,
    kind,
    opaque,
    parents_of,
    piece,
    piece_code,
    piece_parts,
    plain_lineage,
    recipe_of,
    root_key,
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


def test_a_draw_piece_table_reads_as_the_tuple_of_its_lineages():
    array = np.array([[4, 0, 2, 0], [9, 1, 3, 2], [11, 0, 5, 1]], np.int64)
    table = DrawPieceTable(array)
    lineages = (piece(draw(4, 0, 2), 0), piece(draw(9, 1, 3), 2), piece(draw(11, 0, 5), 1))
    assert len(table) == 3 and tuple(table) == lineages
    assert table[1] == piece(draw(9, 1, 3), 2) and table[-1] == lineages[-1]
    assert table[1:] == lineages[1:] and type(table[0][0][0][0]) is int
    assert table == lineages and table == DrawPieceTable(array.copy())
    assert table != lineages[:2] and table != list(lineages)  # equal to the tuple only
    assert table == HeldLineages((lineages[:1], lineages[1:]))
    assert pickle.loads(pickle.dumps(table)) == lineages
    assert DrawPieceTable(np.zeros((0, 4), np.int64)) == ()


def test_a_draw_row_table_reads_as_the_tuple_of_its_rows_lineages():
    pieces = np.array([[4, 0, 2, 0], [9, 1, 3, 2], [11, 0, 5, 1]], np.int64)
    table = DrawRowTable(pieces, np.array([7, 5, 9], np.int64), np.array([2, 3], np.int64))
    rows = (
        ((piece(draw(4, 0, 2), 0), piece(draw(9, 1, 3), 2)), (7, 5)),
        ((piece(draw(11, 0, 5), 1),), (9,)),
    )
    assert len(table) == 2 and tuple(table) == rows and table.rows() is table.rows()
    assert table[0] == rows[0] and table[-1] == rows[1] and table[1:] == rows[1:]
    assert all(is_derived(row) for row in table) and type(table[1][1][0]) is int
    assert table == rows and table != rows[:1] and table != list(rows)
    assert pickle.loads(pickle.dumps(table)) == rows


def test_held_lineages_pickle_to_an_equal_value():
    held = HeldLineages(((piece_code(2, 1), 4),), decode=held_lineage)
    again = pickle.loads(pickle.dumps(held))
    assert again == held == (((2,), 1), 4)


@pytest.mark.parametrize(
    "lineage, expected",
    [
        (0, LineageKind.POSITION),
        (17, LineageKind.POSITION),
        (draw(5, 1, 2), LineageKind.DRAW),
        (derived((3, 4), None), LineageKind.DERIVED),
        (piece(draw(5, 1, 2), 0), LineageKind.DERIVED),
        (opaque({"a": 1}), LineageKind.OPAQUE),
        (piece_code(3, 1), LineageKind.PIECE_CODE),
    ],
)
def test_kind_classifies_each_form(lineage, expected):
    assert kind(lineage) is expected


@pytest.mark.parametrize(
    "value", ["x", 1.5, True, (1, 2), (1, -2, 3), (1, 2, 3, 4), [(1,), 2], None]
)
def test_kind_rejects_what_is_no_lineage(value):
    with pytest.raises(ValueError, match="is no lineage"):
        kind(value)


def test_constructors_make_the_plain_tuples_the_state_codec_stores():
    assert draw(5, 1, 2) == (5, 1, 2) and type(draw(5, 1, 2)) is tuple
    assert derived((3, 4), (0, 2)) == ((3, 4), (0, 2))
    assert piece(7, 3) == ((7,), 3)
    assert derive("x", [Element("a", 7)], 3).lineage == piece(7, 3)


def test_accessors_take_the_forms_apart():
    lineage = derived((piece(1, 0), draw(2, 0, 9)), (4, 5))
    assert parents_of(lineage) == (((1,), 0), (2, 0, 9))
    assert recipe_of(lineage) == (4, 5)
    assert derived_parts(lineage) == (parents_of(lineage), recipe_of(lineage))
    assert piece_parts(piece(draw(2, 0, 9), 3)) == ((2, 0, 9), 3)
    assert draw_parts(draw(2, 0, 9)) == (2, 0, 9)
    assert first_root(lineage) == 1
    assert first_root(piece(draw(2, 0, 9), 3)) == (2, 0, 9)
    assert root_key(np.int64(4)) == 4 and type(root_key(np.int64(4))) is int
    assert root_key(draw(2, 0, 9)) == (2, 0, 9)


def test_draw_recognisers():
    assert is_draw((1, 2, 3)) and is_valid_draw((1, 2, 3))
    assert is_draw((1, "a", 3)) and not is_valid_draw((1, "a", 3))
    assert not is_valid_draw((1, -1, 3)) and not is_valid_draw((1, True, 3))
    assert not is_draw(((1,), 2)) and not is_draw(3)


def test_decode_piece_inverts_piece_code_for_ints_and_arrays():
    assert decode_piece(piece_code(123456789, 77)) == (123456789, 77)
    positions = np.array([0, 5, 2**30], np.int64)
    pieces = np.array([0, 2**24 - 1, 3], np.int64)
    codes = piece_code(positions, pieces)
    assert (codes < 0).all()
    assert codes.tolist() == [piece_code(p, j) for p, j in zip(positions.tolist(), pieces.tolist())]
    back = decode_piece(codes)
    assert back[0].tolist() == positions.tolist() and back[1].tolist() == pieces.tolist()


# Shape tests and piece-code arithmetic that belong to core/lineage.py alone.
_SHAPE_TESTS = [
    re.compile(r"len\((lineage|root|plain|lin)\w*\) == [23]"),
    re.compile(r"<< 24"),
    re.compile(r"PIECE_BITS"),
    re.compile(r"PIECE_MASK"),
    re.compile(r"len\(\w+\) == 2 and type\(\w+\[0\]\) is tuple"),
]


def lineage_shape_tests(package: Path) -> list[str]:
    """``path:line: text`` of each line of ``package`` (outside core/lineage.py) that
    tests or codes a lineage by its shape."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.relative_to(package).as_posix() == "core/lineage.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if any(rule.search(line) for rule in _SHAPE_TESTS):
                found.append(f"{path.relative_to(package)}:{number}: {line.strip()}")
    return found


def test_the_shape_rules_find_shape_tests(tmp_path):
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "lineage.py").write_text("PIECE_BITS = 24\n")
    (tmp_path / "op.py").write_text(
        "if len(lineage) == 3:\n    pass\ncode = ~(p << 24)\n"
        "ok = len(x) == 2 and type(x[0]) is tuple\n"
    )
    assert [f.split(":")[1] for f in lineage_shape_tests(tmp_path)] == ["1", "3", "4"]


def test_only_core_lineage_tests_lineages_by_shape():
    """Other modules use core.lineage's recognisers, accessors and piece-code functions."""
    found = lineage_shape_tests(Path(zephon_jax.__file__).parent)
    assert not found, "lineage shape tests outside core/lineage.py (use its functions):\n" + (
        "\n".join(found)
    )


@pytest.mark.parametrize(
    "lineages",
    [
        (),
        (0, 5, 17),
        (draw(1, 0, 2), draw(4, 1, 0)),
        (piece(draw(3, 1, 2), 0), piece(draw(5, 0, 1), 7)),
        (derived((piece(2, 0), piece(3, 1)), (0, 8)), derived((), None)),
    ],
    ids=["none", "positions", "draws", "pieces of draws", "nested"],
)
def test_all_pointers_accepts_the_common_forms(lineages):
    assert all_pointers(lineages)


@pytest.mark.parametrize(
    "lineages",
    [
        (0, -1),
        (1, True),
        (draw(1, 0, 2), (1, -2, 3)),
        (draw(1, 0, 2), (1, 2.0, 3)),
        (piece(draw(3, 1, 2), 0), piece((3, 1, False), 0)),
        (3, draw(1, 0, 2)),  # a mixed level: checked one by one
        (opaque(b"x"),),
        (np.int64(3),),
        ((1, 2),),
        (derived((1, (2, 3)), 0),),
    ],
)
def test_all_pointers_leaves_the_rest_to_a_full_check(lineages):
    assert not all_pointers(lineages)
