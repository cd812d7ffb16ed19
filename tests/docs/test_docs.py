"""The documentation site builds with warnings as errors, and its examples run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import zephon_jax as zj

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _toctree_entries() -> list[str]:
    text = (DOCS / "index.md").read_text()
    entries = []
    for block in re.findall(r"```\{toctree\}\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = line.strip()
            if line and not line.startswith(":"):
                entries.append(line)
    return entries


ROOT = DOCS.parent
SNIPPET_PAGES = ["README.md"] + sorted(f"docs/{p.name}" for p in DOCS.glob("*.md"))
_SNIPPET = re.compile(
    r"(?:<!-- (snippet [^>]*?) -->\n)?```(python|\{code-block\} python|bash)\n(.*?)```", re.S
)
NOT_RUN = "snippet not run: "
CONTINUES = "snippet continues the one above"
SHELL = "snippet run: shell"


def snippets(page: str) -> list[tuple[str | None, str, int]]:
    """``(marker, code, line)`` of every Python snippet of a page (and marked shell ones)."""
    text = (ROOT / page).read_text()
    return [
        (m.group(1), m.group(3), text.count("\n", 0, m.start(3)) + 1)
        for m in _SNIPPET.finditer(text)
        if m.group(2) != "bash" or m.group(1) == SHELL
    ]


@pytest.mark.parametrize("page", SNIPPET_PAGES)
def test_every_snippet_runs_as_written(page, tmp_path, monkeypatch, capsys):
    """Each snippet runs on its own, in a fresh namespace, unless it says it continues.

    Snippets of a page share a working directory, and shell snippets marked to run
    run there, in order, so a page can go from files to a pipeline.
    """
    monkeypatch.chdir(tmp_path)
    namespace = None
    for marker, code, line in snippets(page):
        if marker is not None and marker.startswith(NOT_RUN):
            continue
        if marker == SHELL:
            proc = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", code], capture_output=True, text=True
            )
            assert proc.returncode == 0, f"{page}:{line}\n{proc.stdout}\n{proc.stderr}"
            continue
        if marker == CONTINUES:
            assert namespace is not None, f"{page}:{line} continues nothing"
        else:
            assert marker is None, f"{page}:{line}: unknown marker {marker!r}"
            namespace = {"__name__": "__snippet__"}
        exec(compile(code, f"{page}:{line}", "exec"), namespace)
    capsys.readouterr()


def test_snippets_that_do_not_run_are_few_and_say_why():
    """Only snippets that need several processes or accelerators may be left out."""
    markers = [
        (page, line, marker)
        for page in SNIPPET_PAGES
        for marker, _, line in snippets(page)
        if marker is not None
    ]
    not_run = [(p, line, m) for p, line, m in markers if m.startswith(NOT_RUN)]
    assert len(not_run) <= 3, not_run
    for page, line, marker in not_run:
        assert re.search(r"needs (several|multiple) .*(processes|GPUs|TPUs)", marker), (
            page,
            line,
        )
    # The README and the migration guide are read piecemeal: every snippet stands alone.
    continued = {p for p, _, m in markers if m == CONTINUES}
    assert not continued & {"README.md", "docs/migration_from_grain.md", "docs/index.md"}
    assert sum(len(snippets(p)) for p in SNIPPET_PAGES) >= 15


def _python_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), flags=re.S)


def test_every_toctree_page_exists():
    entries = _toctree_entries()
    required = {"why", "your_data", "concepts", "operators", "custom_operators", "api"}
    required |= {"distributed", "migration_from_grain", "performance", "reliability"}
    assert required <= set(entries), sorted(required - set(entries))
    missing = [e for e in entries if not (DOCS / f"{e}.md").is_file()]
    assert not missing, f"pages listed in docs/index.md but missing from docs/: {missing}"


def test_docs_build_with_warnings_as_errors(tmp_path):
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_parser")
    out = tmp_path / "html"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-q",
            "-b",
            "html",
            str(DOCS),
            str(out),
            "-d",
            str(tmp_path / "doctrees"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"sphinx build failed:\n{proc.stdout}\n{proc.stderr}"
    for entry in _toctree_entries():
        assert (out / f"{entry}.html").is_file(), entry
    api = (out / "api.html").read_text()
    # The reference is generated from docstrings, not written by hand.
    for name in ("Dataset.pack", "Loader", "LoaderIterator.set_state", "merge_states", "Operator"):
        assert name in api, name
    assert "Packs records into rows of" in api
    # No docstring markup left raw (``jax.Array``s is not a literal followed by "s").
    assert "``" not in api


def test_docstrings_have_no_inline_literal_glued_to_a_word():
    """reST ends an inline literal only before a space or punctuation: ``x``s and a``x``
    show their backticks on the API page."""
    glued = re.compile(r"[A-Za-z0-9]``[A-Za-z0-9]")
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((ROOT / "zephon_jax").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if glued.search(line)
    ]
    assert not found, "\n".join(found)


def test_table_code_never_breaks_a_name_mid_word():
    css = (DOCS / "_static" / "custom.css").read_text()
    assert "custom.css" in (DOCS / "conf.py").read_text()
    rules = dict(re.findall(r"([^{}]+)\{([^{}]*)\}", re.sub(r"/\*.*?\*/", "", css, flags=re.S)))
    table_code = next(body for selector, body in rules.items() if "table code" in selector)
    assert "overflow-wrap: normal" in table_code and "word-break: normal" in table_code
    assert "anywhere" not in table_code and "break-all" not in table_code


def test_custom_operator_page_runs():
    """The custom operator example, including its resume check, runs as written."""
    blocks = _python_blocks("custom_operators.md")
    assert len(blocks) >= 3
    namespace: dict = {"__name__": "docs_example"}
    for block in blocks:
        exec(compile(block, "custom_operators.md", "exec"), namespace)
    assert namespace["reference"] and len(namespace["reference"]) == 10


def test_debugging_page_runs(tmp_path, monkeypatch, capsys):
    """The loss-spike page's examples run as written and print the segments."""
    blocks = _python_blocks("debugging_loss_spikes.md")
    assert len(blocks) == 6  # provenance, explain_step, accounting, skip, exclude, metrics
    for block in blocks:
        exec(compile(block, "debugging_loss_spikes.md", "exec"), {"__name__": "docs_example"})
    out = capsys.readouterr().out
    assert "'label': " in out and "'tokens': " in out and "'rows_per_s': " in out
    assert "'lanes_s': " in out and "'assemble_s': " in out


def test_every_operator_has_a_section():
    headings = [
        line for line in (DOCS / "operators.md").read_text().splitlines() if line.startswith("## ")
    ]
    for method in ("split", "pack", "window_shuffle", "flat_map", "apply"):
        assert any(f"`{method}`" in h for h in headings), (
            f"docs/operators.md has no section on {method}"
        )
        assert callable(getattr(zj.Dataset, method))


@pytest.mark.parametrize("page", ["mixtures.md", "batch_size_rampup.md"])
def test_schedule_pages_run(page):
    """The mixture and ramp-up pages' examples, including their assertions, run as written."""
    blocks = _python_blocks(page)
    assert len(blocks) >= 2
    namespace: dict = {"__name__": "docs_example"}
    for block in blocks:
        exec(compile(block, page, "exec"), namespace)


def test_llm_training_page_runs():
    """The LLM pipeline example (tokenizers trained here) and its resume check run as written."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("transformers")
    blocks = _python_blocks("llm_training.md")
    assert len(blocks) == 2
    namespace: dict = {"__name__": "docs_example"}
    for block in blocks:
        exec(compile(block, "llm_training.md", "exec"), namespace)
    assert namespace["dataset"].batch_size_at(0) == 8
    assert namespace["dataset"].batch_size_at(30) == 16


def test_one_version_everywhere():
    """pyproject.toml and the docs take the version from the package; the changelog has it."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "zephon_jax.__version__"
    assert re.fullmatch(r"\d+\.\d+\.\d+", zj.__version__) and zj.__version__ >= "0.3.0"
    conf = (DOCS / "conf.py").read_text()
    assert "release = zephon_jax.__version__" in conf
    changelog = (ROOT / "CHANGELOG.md").read_text()
    sections = re.findall(r"^## (\d+\.\d+\.\d+)", changelog, flags=re.M)
    assert sections[0] == zj.__version__ and sections[-1] == "0.1.0"
    assert sections == sorted(sections, key=lambda v: tuple(map(int, v.split("."))), reverse=True)
    assert "changelog" in _toctree_entries()


def test_reliability_page_states_the_lane_format_and_old_states_are_refused():
    import json

    import numpy as np

    from zephon_jax.state.envelope import LANE, STATE
    from zephon_jax.state.global_state import FINGERPRINT_FIELDS

    text = (DOCS / "reliability.md").read_text()
    row = re.search(r"\| a lane's state .*\| \*\*(\d+)\*\* \|", text)
    assert row and int(row.group(1)) == LANE.version
    assert f"this zephon_jax reads version {LANE.version}" in text
    assert re.search(r"loader state .*\| `zephon_jax.state.global_state` \| (\d+) \|", text).group(
        1
    ) == str(STATE.version)
    # A state saved by 0.1.0 (lane format 2) for this pipeline is refused, naming the version.
    saved = json.loads((ROOT / "tests" / "data" / "state_v0_1_0.json").read_text())
    saved["lanes"] = {k: np.asarray(v, np.uint8) for k, v in saved["lanes"].items()}
    docs = [{"tokens": np.arange(1, n + 1, dtype=np.int32)} for n in range(1, 40)]
    ds = zj.Dataset.source(docs).shuffle(seed=0).split(8).pack(8).batch(4)
    compared = {k: v for k, v in ds.fingerprint().items() if k in FINGERPRINT_FIELDS}
    assert saved["fingerprint"] == compared  # the same pipeline: only the version differs
    with pytest.raises(
        zj.StateError,
        match=rf"lane 0: the lane state has version 2; this zephon_jax reads version {LANE.version}",
    ):
        iter(zj.Loader(ds)).set_state(saved)


def test_every_mesh_recipe_gives_auto_axes():
    """A bare ``jax.make_mesh((n,), ("data",))`` is Explicit from JAX 0.9 on, which Flax NNX
    models reject: the docs, README, examples and notebooks use zj.data_mesh, a Mesh, or
    make_mesh with axis_types."""
    files = [ROOT / "README.md", *DOCS.glob("*.md"), *(ROOT / "examples").glob("*.py")]
    files += [*(ROOT / "notebooks").glob("*.ipynb"), ROOT / "zephon_jax" / "tools" / "demo.py"]
    calls = []
    for path in files:
        text = path.read_text()
        for match in re.finditer(r"(?<!`)jax\.make_mesh\(", text):  # code, not `prose`
            call = text[match.start() : text.find("\n", match.start())]
            calls.append(call)
            assert "axis_types=" in call, (path.name, call)
    assert calls  # the plain-JAX recipe on the distributed page
    assert "zj.data_mesh()" in (DOCS / "distributed.md").read_text()


def test_architecture_page_lists_the_layers_of_the_import_contract():
    """The layer table of docs/architecture.md is the [tool.importlinter] contract, in order,
    and the page shows the diagram its script draws."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = project["tool"]["importlinter"]["contracts"]
    declared = [
        [name.strip().removeprefix("zephon_jax.") for name in layer.split("|")]
        for layer in reversed(contract["layers"])  # bottom first, as the page lists them
    ]
    text = (DOCS / "architecture.md").read_text()
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    cells = re.findall(r"^\| (`.*?) \|", section, flags=re.M)
    listed = [re.findall(r"`([a-z_]+)/?`", cell) for cell in cells]
    assert listed == declared
    assert "![" in text and "(_static/architecture.svg)" in text
    assert (DOCS / "_static" / "architecture.svg").is_file()
    assert (DOCS / "_static" / "architecture.py").is_file()


def test_loss_spike_page_shows_the_realized_mixture_figure_and_its_script():
    text = (DOCS / "debugging_loss_spikes.md").read_text()
    assert "(_static/realized_mixture.png)" in text
    assert "python docs/_static/realized_mixture.py" in text
    assert (DOCS / "_static" / "realized_mixture.png").stat().st_size > 10_000
    assert (DOCS / "_static" / "realized_mixture.py").is_file()
