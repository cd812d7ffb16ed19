"""The argument types of the ``zephon-jax`` parsers: ``positive`` and ``non_negative``."""

from __future__ import annotations

import argparse

import pytest

from zephon_jax.tools.arguments import non_negative, positive


def test_positive_takes_counts_from_one():
    assert positive("1") == 1
    assert positive("17") == 17
    assert positive(" 8 ") == 8  # int() strips blanks


def test_non_negative_takes_counts_from_zero():
    assert non_negative("0") == 0
    assert non_negative("5") == 5


@pytest.mark.parametrize(
    ("convert", "text", "message"),
    [
        (positive, "0", "must be >= 1, got 0"),
        (positive, "-3", "must be >= 1, got -3"),
        (non_negative, "-1", "must be >= 0, got -1"),
    ],
)
def test_out_of_range_counts_name_the_bound_and_the_value(convert, text, message):
    with pytest.raises(argparse.ArgumentTypeError) as info:
        convert(text)
    assert str(info.value) == message


@pytest.mark.parametrize("convert", [positive, non_negative])
def test_text_that_is_no_integer_is_a_value_error(convert):
    """argparse turns a ValueError of a type into "invalid <name> value"."""
    for text in ("two", "1.5", ""):
        with pytest.raises(ValueError):
            convert(text)


def test_argparse_reports_both_kinds_of_error_with_the_option(capsys):
    parser = argparse.ArgumentParser(prog="tool")
    parser.add_argument("--steps", type=positive, default=4)
    parser.add_argument("--skip", type=non_negative, default=0)
    args = parser.parse_args(["--steps", "3", "--skip", "0"])
    assert (args.steps, args.skip) == (3, 0)
    assert parser.parse_args([]).steps == 4
    for argv, message in (
        (["--steps", "0"], "argument --steps: must be >= 1, got 0"),
        (["--skip", "-2"], "argument --skip: must be >= 0, got -2"),
        (["--steps", "many"], "argument --steps: invalid positive value: 'many'"),
    ):
        with pytest.raises(SystemExit) as info:
            parser.parse_args(argv)
        assert info.value.code == 2
        assert message in capsys.readouterr().err
