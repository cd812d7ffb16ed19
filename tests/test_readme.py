"""The README's examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_examples_run_on_their_own(capsys):
    """Each Python block runs as written, in a fresh namespace, and prints what it says."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) == 2
    namespace: dict = {}
    exec(blocks[0], namespace)
    assert capsys.readouterr().out.splitlines() == [
        "{'tokens': (4, 128), 'tokens_segment_ids': (4, 128), 'tokens_positions': (4, 128)}",
        "True",
    ]
    assert namespace["resumed"].step == 3  # it delivered the third global batch (index 2)
    assert "the third global batch (index 2)" in blocks[0]
    namespace = {}
    exec(blocks[1], namespace)
    assert capsys.readouterr().out == "1\n"


def test_readme_commands_are_the_ones_ci_runs():
    text = README.read_text()
    assert "pip install -e . && zephon-jax demo" in text
    assert 'pip install -e ".[test]" && python -m pytest -q tests' in text
    ci = (README.parent / ".ci" / "run").read_text()
    assert 'pip install --quiet -e ".[test]"' in ci and "pytest -q tests" in ci
    # the package builds as a wheel and an sdist that pass twine check
    assert "python3 -m build --outdir" in ci and 'twine check --strict "$dist"/*.whl' in ci


def test_readme_says_how_to_run_the_notebooks():
    assert 'pip install -e ".[notebooks]" && jupyter lab notebooks/' in README.read_text()
