"""The declared minimum Python is the one the package is type-checked and linted for."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from zephon_jax.errors import add_note

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_requires_python_is_what_mypy_and_ruff_check():
    config = tomllib.loads(PYPROJECT.read_text())
    minimum = config["project"]["requires-python"]
    assert minimum.startswith(">=")
    major, minor = (int(x) for x in minimum[2:].split("."))
    # mypy checks the standard library as of this version (BaseException.add_note is 3.11).
    assert config["tool"]["mypy"]["python_version"] == f"{major}.{minor}"
    assert config["tool"]["ruff"]["target-version"] == f"py{major}{minor}"
    ci = (PYPROJECT.parent / ".ci" / "run").read_text()
    assert '"$python" -m mypy' in ci  # with the test virtualenv's python


class _NoteLess:
    """An exception as Python 3.10 makes them: no add_note method."""


def test_add_note_keeps_the_note_with_and_without_add_note():
    error = ValueError("x")
    add_note(error, "first")
    add_note(error, "second")
    assert error.__notes__ == ["first", "second"]
    old = _NoteLess()
    add_note(old, "first")  # type: ignore[arg-type]
    add_note(old, "second")  # type: ignore[arg-type]
    assert old.__notes__ == ["first", "second"]
