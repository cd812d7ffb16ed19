"""The built-in corpus: where it is cached, how the standard library's files split into its
two parts (sorted, the same every time), and its preparation once per cache key (the
store's contents: tests/unit/tools/test_prepare.py)."""

from __future__ import annotations

import io
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from zephon_jax.tools.corpus import (
    PARTS,
    builtin_corpus,
    builtin_sources,
    default_cache_dir,
    is_test_file,
    stdlib_files,
)
from zephon_jax.tools.tokenizers import byte_detokenize

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def test_the_cache_is_the_environment_variable_or_the_home_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("ZEPHON_JAX_CACHE", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    monkeypatch.setenv("ZEPHON_JAX_CACHE", "")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / ".cache" / "zephon_jax"
    monkeypatch.delenv("ZEPHON_JAX_CACHE")
    assert default_cache_dir() == tmp_path / ".cache" / "zephon_jax"


@pytest.mark.parametrize(
    ("relative", "is_test"),
    [
        ("json/decoder.py", False),
        ("test/test_json.py", True),
        ("test/support/__init__.py", True),  # under a test directory
        ("idlelib/idle_test/test_x.py", True),  # named test_*.py
        ("lib2to3/tests/data/x.py", True),
        ("unittest/mock.py", False),  # "unittest" is not "test"
        ("test.py", False),
        ("tests.py", False),
    ],
)
def test_which_files_are_tests(relative, is_test):
    root = Path("/lib/python3")
    assert is_test_file(root / relative, root) == is_test


def test_the_parts_are_sorted_disjoint_and_the_same_every_time():
    library, tests = stdlib_files("library"), stdlib_files("tests")
    assert library == sorted(library) and tests == sorted(tests)
    assert not set(library) & set(tests)
    assert stdlib_files("library") == library
    assert all(f.suffix == ".py" and f.is_file() for f in library[:50] + tests[:50])
    assert not [f for f in library if is_test_file(f, STDLIB)]
    assert all(is_test_file(f, STDLIB) for f in tests)
    assert STDLIB / "json" / "decoder.py" in library
    assert not [f for f in library + tests if {"site-packages", "__pycache__"} & set(f.parts)]
    assert stdlib_files("tests", max_files=3) == tests[:3]
    assert PARTS == ("library", "tests")


def test_an_unknown_part_is_named():
    with pytest.raises(ValueError, match=r"unknown corpus part 'docs'; use one of \('library'"):
        stdlib_files("docs")


def test_each_part_is_prepared_once_per_key_then_read_from_the_cache(tmp_path):
    stream = io.StringIO()
    lib = builtin_corpus("library", cache_dir=tmp_path, max_files=2, workers=0, stream=stream)
    files = stdlib_files("library", 2)
    key = lib.path.parent.name
    assert lib.path == tmp_path / "stdlib" / key / "library"
    assert key.startswith(f"py{sys.version_info.major}{sys.version_info.minor}-2-")
    assert stream.getvalue().startswith(
        f"preparing the built-in corpus (library: 2 files) in {lib.path}\n"
    )
    texts = [f.read_text(encoding="utf-8") for f in files]
    assert [byte_detokenize(lib[i]["tokens"]) for i in range(len(lib))] == [t for t in texts if t]
    assert lib.dtype == np.uint16
    again = io.StringIO()
    assert builtin_corpus("library", cache_dir=tmp_path, max_files=2, stream=again).path == lib.path
    assert again.getvalue() == ""  # read from the cache, nothing prepared
    other = builtin_corpus("library", cache_dir=tmp_path, max_files=1, workers=0)
    assert other.path != lib.path and other.path.parent.name.split("-")[1] == "1"
    builtin_corpus("tests", cache_dir=tmp_path, max_files=2, workers=0)
    both = builtin_sources(cache_dir=tmp_path, max_files=2, stream=again)
    assert list(both) == ["library", "tests"] and again.getvalue() == ""
    assert both["library"].fingerprint() == lib.fingerprint()
    assert both["tests"].path.name == "tests"
