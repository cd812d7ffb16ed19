"""The README's examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_examples_run(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) == 2
    namespace: dict = {}
    exec(blocks[0], namespace)
    assert namespace["batch"]["tokens"].shape == (4, 128)
    exec(blocks[1].replace('"/tmp/ckpt"', repr(str(tmp_path / "ckpt"))), namespace)
    assert namespace["it"].step == 1


def test_readme_commands_are_the_ones_ci_runs():
    text = README.read_text()
    assert "pip install -e . && zephon-jax demo" in text
    assert 'pip install -e ".[test]" && python -m pytest -q tests' in text
    ci = (README.parent / ".ci" / "run").read_text()
    assert 'pip install --quiet -e ".[test]"' in ci and "pytest -q tests" in ci
