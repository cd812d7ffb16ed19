"""Argument types shared by the ``zephon-jax`` commands' parsers."""

from __future__ import annotations

import argparse


def positive(text: str) -> int:
    """``text`` as an int >= 1; argparse.ArgumentTypeError otherwise (argparse reports it)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative(text: str) -> int:
    """``text`` as an int >= 0; argparse.ArgumentTypeError otherwise (argparse reports it)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value
