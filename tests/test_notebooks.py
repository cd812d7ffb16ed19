"""The example notebooks run end to end (at a reduced size) and match their generator."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("matplotlib")

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
CELL_TIMEOUT_S = 120


def _generator():
    spec = importlib.util.spec_from_file_location(
        "_build_notebooks", NOTEBOOKS / "_build_notebooks.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATOR = _generator()
NAMES = sorted(GENERATOR.NOTEBOOKS)


def test_every_notebook_is_committed():
    assert NAMES == sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))


@pytest.mark.parametrize("name", NAMES)
def test_committed_notebook_matches_its_generator_and_has_outputs(name):
    committed = nbformat.read(NOTEBOOKS / name, as_version=4)
    built = GENERATOR.build(GENERATOR.NOTEBOOKS[name])
    assert [c.source for c in committed.cells] == [c.source for c in built.cells], (
        f"{name} differs from notebooks/_build_notebooks.py: regenerate it with "
        "`python notebooks/_build_notebooks.py --execute`"
    )
    code = [c for c in committed.cells if c.cell_type == "code"]
    # Committed from a full run: every code cell ran, in order, without errors.
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    assert (NOTEBOOKS / name).stat().st_size < 1_500_000


@pytest.fixture(scope="module")
def corpus_cache(tmp_path_factory):
    """One built-in corpus cache shared by the notebooks of this run, outside the home cache."""
    return str(tmp_path_factory.mktemp("zephon_jax_cache"))


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs(name, monkeypatch, corpus_cache):
    """Executes the committed notebook at a reduced size; its own asserts check the results."""
    monkeypatch.setenv("ZEPHON_NB_STEPS", "12")
    monkeypatch.setenv("ZEPHON_JAX_CACHE", corpus_cache)
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    client.execute()
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]
    assert not errors


@pytest.mark.parametrize("figure", ["elastic_resume.png", "llm_sft_eval.png"])
def test_docs_figures_are_committed(figure):
    path = NOTEBOOKS.parent / "docs" / "_static" / figure
    assert path.is_file() and path.stat().st_size > 10_000
