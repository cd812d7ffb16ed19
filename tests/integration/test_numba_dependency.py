"""numba is a core dependency; without it the loader runs interpreted and says so once.

The compiled kernels come with the plain install (``pip install zephon_jax``), for every
Python the package supports that numba publishes wheels for; the ``fast`` extra stays, empty,
so that ``zephon_jax[fast]`` still installs. Where numba cannot be imported, packing runs
the Python path (the same batches) and one warning per process says so and how to fix it;
``ZEPHON_JAX_COMPILED=0`` chooses that path deliberately, without a warning.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"

# The Pythons numba publishes wheels for (the newest release): each must get numba.
NUMBA_PYTHONS = ("3.10", "3.11", "3.12", "3.13", "3.14", "3.15")

# Packs a token array twice with every warning shown (not only the first per place), so
# a second warning would show; prints how many batches came and whether kernels ran.
PROGRAM = """
import sys
import warnings

warnings.simplefilter("always")
if sys.argv[1] == "block":

    class NoNumba:
        def find_spec(self, name, path=None, target=None):
            if name == "numba" or name.startswith("numba."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoNumba())
    for name in [m for m in sys.modules if m == "numba" or m.startswith("numba.")]:
        del sys.modules[name]

import numpy as np
import zephon_jax as zj
from zephon_jax.core.kernels import kernels
from zephon_jax.sources import TokenArray

rng = np.random.default_rng(0)
docs = [rng.integers(1, 100, int(n)).astype(np.int32) for n in rng.integers(1, 90, 60)]
for _ in range(2):
    ds = zj.Dataset.source(TokenArray.from_documents(docs)).shuffle(seed=0).split(32).pack(32)
    batch = next(iter(zj.Loader(ds.batch(4))))
    print("rows", batch["tokens"].shape, "compiled", kernels() is not None)
"""


def run_program(block: bool, compiled: str | None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("ZEPHON_JAX_COMPILED", None)
    env.pop("PYTHONWARNINGS", None)
    if compiled is not None:
        env["ZEPHON_JAX_COMPILED"] = compiled
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, "block" if block else "keep"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("rows (4, 32) compiled False") == 2, done.stdout
    return done


def warning_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "numba cannot be imported" in line]


def test_without_numba_the_loader_warns_once_in_one_line_with_the_fix():
    done = run_program(block=True, compiled=None)
    lines = warning_lines(done.stderr)
    assert len(lines) == 1, done.stderr[-3000:]
    (line,) = lines
    assert "RuntimeWarning" in line and "No module named 'numba'" in line
    assert "run interpreted" in line
    assert "pip install 'numba>=0.59'" in line and "ZEPHON_JAX_COMPILED=0" in line
    # One line: the message starts and ends on it.
    assert "RuntimeWarning: zephon_jax: numba" in line and line.endswith("without this warning.")


def test_compiled_off_by_the_setting_runs_interpreted_without_a_warning():
    done = run_program(block=True, compiled="0")
    assert warning_lines(done.stderr) == [], done.stderr[-3000:]
    assert "Warning" not in done.stderr, done.stderr[-3000:]


def _pyproject() -> dict:
    return tomllib.loads(PYPROJECT.read_text())


def _numba_requirements(requirements: list[str]) -> list[Requirement]:
    return [r for r in map(Requirement, requirements) if r.name == "numba"]


@pytest.mark.parametrize("python", NUMBA_PYTHONS)
def test_core_dependencies_include_numba_for_every_python_with_its_wheels(python):
    config = _pyproject()["project"]
    numba = _numba_requirements(config["dependencies"])
    applies = [
        r for r in numba if r.marker is None or r.marker.evaluate({"python_version": python})
    ]
    assert len(applies) == 1, (python, [str(r) for r in numba])
    (requirement,) = applies
    assert requirement.specifier.contains("0.68.1")  # a release with wheels for all of them
    lowest = {"3.13": "0.61", "3.14": "0.63", "3.15": "0.68"}.get(python, "0.59")
    assert str(requirement.specifier) == f">={lowest}", (python, str(requirement))


def test_the_running_python_gets_numba_from_the_core_dependencies():
    numba = _numba_requirements(_pyproject()["project"]["dependencies"])
    assert any(r.marker is None or r.marker.evaluate() for r in numba)


def test_the_fast_extra_stays_as_an_empty_alias_and_no_extra_repeats_numba():
    extras = _pyproject()["project"]["optional-dependencies"]
    assert extras["fast"] == []
    assert {name for name, reqs in extras.items() if _numba_requirements(reqs)} == set()
