"""The README's examples run as written."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


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


def _readme_commands():
    """The module .ci/readme_commands.py, which gives CI the README's commands."""
    path = README.parent / ".ci" / "readme_commands.py"
    spec = importlib.util.spec_from_file_location("readme_commands", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ci_runs_the_readme_commands_verbatim():
    """CI takes exactly the two fresh-machine commands from the README and runs them."""
    assert _readme_commands().fresh_machine_commands(README.read_text()) == [
        "pip install -e . && zephon-jax demo",
        'pip install -e ".[test]" && python -m pytest -q tests',
    ]
    ci = (README.parent / ".ci" / "run").read_text()
    assert "python3 .ci/readme_commands.py README.md" in ci
    assert "python3 -m venv" in ci and "system-site-packages" not in ci
    assert "looking at multiple versions" in ci  # pip's backtracking fails CI
    # the package builds as a wheel and an sdist that pass twine check
    assert '-m build --outdir "$dist"' in ci and 'twine check --strict "$dist"/*.whl' in ci


def test_readme_commands_refuse_a_readme_ci_cannot_follow():
    """A README whose fresh-machine section CI cannot run as two commands is an error."""
    commands = _readme_commands().fresh_machine_commands
    section = "## Fresh machine: the two commands\n\n"
    one = "```bash\npip install -e . && zephon-jax demo\n```\n"
    two = '```bash\npip install -e ".[test]" && python -m pytest -q tests\n```\n'
    with pytest.raises(ValueError, match="no heading 'Fresh machine: the two commands'"):
        commands("# zephon_jax\n\n" + one + two)
    with pytest.raises(ValueError, match="has 1 bash blocks; it must have two"):
        commands(section + one + "## Next\n\n" + two)  # a block under the next heading
    with pytest.raises(ValueError, match="has 2 lines; each must be one command line"):
        commands(section + one + "```bash\npip install -e .\npython -m pytest\n```\n")
    assert commands("# Title\n\n" + section + one + "### Notes\n\n" + two + "## Next\n") == [
        "pip install -e . && zephon-jax demo",
        'pip install -e ".[test]" && python -m pytest -q tests',
    ]


def test_readme_says_how_to_run_the_notebooks():
    assert 'pip install -e ".[notebooks]" && jupyter lab notebooks/' in README.read_text()
