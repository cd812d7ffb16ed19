"""The example notebooks run end to end (at a reduced size) and match their generator."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
import sys
import textwrap
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("matplotlib")

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
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


@pytest.mark.parametrize("name", NAMES)
def test_every_notebook_starts_with_the_install_cell(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert first.source.startswith(GENERATOR.COLAB_INSTALL.strip("\n"))
    assert 'ZEPHON_JAX_SOURCE = ""' in first.source


def _requirement_names(requirements) -> set[str]:
    return {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() for r in requirements}


# Packages a notebook needs without importing them (what transformers needs for a chat template).
NEEDED_BY = {"chat_template": "jinja2"}


def _third_party_needs(name) -> set[str]:
    """The distributions notebook ``name`` imports (or needs, by NEEDED_BY), zephon_jax aside."""
    modules = set()
    for kind, source in GENERATOR.NOTEBOOKS[name]:
        if kind != "code":
            continue
        source = textwrap.dedent(source)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                modules.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                modules.add(node.module.split(".")[0])
        modules.update(module for marker, module in NEEDED_BY.items() if marker in source)
    modules -= set(sys.stdlib_module_names) | {"zephon_jax"}
    dists = importlib.metadata.packages_distributions()
    return {dists[m][0].lower() for m in modules}


@pytest.mark.parametrize("name", NAMES)
def test_the_notebooks_extra_and_the_install_cell_cover_the_notebooks_needs(name):
    config = tomllib.loads((NOTEBOOKS.parent / "pyproject.toml").read_text())
    installed = _requirement_names(config["project"]["dependencies"]) | _requirement_names(
        config["project"]["optional-dependencies"]["notebooks"]
    )
    base = _requirement_names(config["project"]["dependencies"])
    needs = _third_party_needs(name)
    assert needs - installed == set(), "add these to the `notebooks` extra"
    # What the package does not bring, the install cell installs (matplotlib: Colab has it).
    install_cell = next(source for kind, source in GENERATOR.NOTEBOOKS[name] if kind == "code")
    for dist in needs - base - {"matplotlib", "grain"}:
        assert f'"{dist}>=' in install_cell, f"{name}'s install cell does not install {dist}"


def test_the_llm_install_cell_installs_what_is_missing(tmp_path, monkeypatch):
    """With tokenizers missing, notebook 04's install cell tries to install it and, when pip
    cannot, stops with a one-line message naming it."""
    cell = next(source for kind, source in GENERATOR.LLM_SFT if kind == "code")
    outputs = _run_cell(
        tmp_path, monkeypatch, "import sys\nsys.modules['tokenizers'] = None\n" + cell
    )
    assert _text(outputs).endswith("installing tokenizers>=0.19 ...\n")
    (error,) = [o for o in outputs if o.output_type == "error"]
    assert len(error.traceback) == 1
    assert error.traceback[0].startswith(
        "ZephonJaxMissing: pip could not install tokenizers>=0.19."
    )


def _savefig_guards(source: str) -> list[str]:
    """For each ``savefig`` call in ``source``: the source of the ``if`` tests around it."""
    tree = ast.parse(source)
    guards = []

    def visit(node, tests):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "savefig":
            guards.append(" and ".join(tests))
        if isinstance(node, ast.If):
            tests = [*tests, ast.unparse(node.test)]
        for child in ast.iter_child_nodes(node):
            visit(child, tests)

    visit(tree, [])
    return guards


def test_notebooks_write_the_docs_figures_only_when_asked():
    guards = [
        guard
        for cells in GENERATOR.NOTEBOOKS.values()
        for kind, source in cells
        if kind == "code"
        for guard in _savefig_guards(textwrap.dedent(source))
    ]
    assert len(guards) == 2
    for guard in guards:
        assert guard == "os.environ.get('ZEPHON_NB_FIGURES') == '1'"
    # Off by default, and only a full-size --execute --figures build turns it on.
    with pytest.raises(SystemExit):
        GENERATOR.main(["--figures"])


def _run_install_cell(tmp_path, monkeypatch, *, hide_package: bool, source: str = ""):
    """Runs the install cell in a Jupyter kernel; pip may install only into ``tmp_path``, offline.

    ``hide_package`` makes ``zephon_jax`` unimportable, as on a fresh Colab runtime.
    PIP_TARGET keeps pip away from this environment (and ignores what it has installed),
    PIP_NO_INDEX stands for a package index that does not have zephon_jax yet.
    Returns the cell's outputs.
    """
    cell = GENERATOR.COLAB_INSTALL.replace(
        'ZEPHON_JAX_SOURCE = ""', f"ZEPHON_JAX_SOURCE = {source!r}"
    )
    prelude = "import sys\nsys.modules['zephon_jax'] = None\n" if hide_package else ""
    return _run_cell(tmp_path, monkeypatch, prelude + cell)


def _run_cell(tmp_path, monkeypatch, code: str):
    """Runs ``code`` in a Jupyter kernel, pip limited as for :func:`_run_install_cell`."""
    for name, value in {
        "PIP_TARGET": str(tmp_path / "target"),
        "PIP_NO_INDEX": "1",
        "PIP_NO_DEPS": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }.items():
        monkeypatch.setenv(name, value)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(code)]
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    return nb.cells[0].outputs


def _text(outputs, name="stdout"):
    return "".join(o.text for o in outputs if o.output_type == "stream" and o.name == name)


def test_install_cell_does_nothing_when_the_package_is_present(tmp_path, monkeypatch):
    outputs = _run_install_cell(tmp_path, monkeypatch, hide_package=False)
    assert [o.output_type for o in outputs] == ["stream"]
    assert re.fullmatch(r"zephon_jax \S+ is installed\n", _text(outputs))
    assert not (tmp_path / "target").exists()


def test_install_cell_without_package_or_source_says_what_to_set(tmp_path, monkeypatch):
    outputs = _run_install_cell(tmp_path, monkeypatch, hide_package=True)
    assert _text(outputs) == "installing zephon_jax ...\n"
    assert _text(outputs, "stderr") == ""  # no warnings either
    (error,) = [o for o in outputs if o.output_type == "error"]
    # The notebook stops here, showing one line: the message, without a traceback.
    assert len(error.traceback) == 1
    message = error.traceback[0]
    assert message.startswith("ZephonJaxMissing: pip could not install it;")
    assert "set ZEPHON_JAX_SOURCE in this cell to a wheel path or a VCS URL" in message
    assert message.endswith("pip said: ERROR: No matching distribution found for zephon_jax")


def test_install_cell_names_a_source_that_does_not_install(tmp_path, monkeypatch):
    missing = str(tmp_path / "zephon_jax-0.1.0-py3-none-any.whl")
    outputs = _run_install_cell(tmp_path, monkeypatch, hide_package=True, source=missing)
    (error,) = [o for o in outputs if o.output_type == "error"]
    assert len(error.traceback) == 1
    assert (
        f"check ZEPHON_JAX_SOURCE = {missing!r} (a wheel path or a VCS URL)" in error.traceback[0]
    )


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


@pytest.mark.parametrize(
    "figure", ["elastic_resume.png", "llm_sft_eval.png", "realized_mixture.png"]
)
def test_docs_figures_are_committed(figure):
    path = NOTEBOOKS.parent / "docs" / "_static" / figure
    assert path.is_file() and path.stat().st_size > 10_000
