"""Input file lists: directories (by extension), globs and files, sorted and deduplicated,
sidecars and hidden files left out, inputs that match nothing refused; ``file_info`` and
``checked_indices``."""

from __future__ import annotations

import os

import numpy as np
import pytest

from zephon_jax.sources.files import (
    INDEX_SUFFIX,
    checked_indices,
    expand_paths,
    file_info,
    is_sidecar,
)


@pytest.fixture
def tree(tmp_path):
    for name in [
        "b.jsonl",
        "a.jsonl",
        "notes.txt",
        "a.jsonl" + INDEX_SUFFIX,
        ".hidden.jsonl",
        "sub/c.JSONL",
    ]:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x" * len(name))
    return tmp_path


def test_a_directory_gives_its_files_with_the_extensions_sorted(tree):
    skipped: list[str] = []
    found = expand_paths(tree, extensions=[".jsonl"], skipped=skipped)
    assert found == [str(tree / "a.jsonl"), str(tree / "b.jsonl"), str(tree / "sub/c.JSONL")]
    assert skipped == [str(tree / "notes.txt")]  # hidden files and sidecars are not reported


def test_all_extensions_when_none_given(tree):
    found = expand_paths(str(tree))
    assert [os.path.relpath(p, tree) for p in found] == [
        "a.jsonl",
        "b.jsonl",
        "notes.txt",
        "sub/c.JSONL",
    ]


def test_globs_files_and_duplicates(tree):
    found = expand_paths([str(tree / "*.jsonl"), str(tree / "a.jsonl"), f"file://{tree}/b.jsonl"])
    assert found == [str(tree / "a.jsonl"), str(tree / "b.jsonl")]


def test_inputs_that_match_nothing_are_named(tree):
    with pytest.raises(FileNotFoundError, match=r"input .*missing does not exist"):
        expand_paths(str(tree / "missing"))
    with pytest.raises(FileNotFoundError, match=r"names no files with an extension in \['\.csv'\]"):
        expand_paths(tree, extensions=[".csv"])
    with pytest.raises(FileNotFoundError, match="names no files"):
        expand_paths(str(tree / "*.parquet"))
    with pytest.raises(FileNotFoundError, match="no input paths given"):
        expand_paths([])


def test_files_in_hidden_folders_are_not_inputs(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "d.jsonl").write_text("x")
    (tmp_path / "a.jsonl").write_text("x")
    assert expand_paths(tmp_path, extensions=[".jsonl"]) == [str(tmp_path / "a.jsonl")]


def test_is_sidecar():
    assert is_sidecar("x/a.jsonl" + INDEX_SUFFIX)
    assert is_sidecar("x/.a.jsonl")
    assert not is_sidecar("x/.dir/a.jsonl")
    assert not is_sidecar("x/a.jsonl")


def test_file_info_has_the_size_and_a_version_that_changes(tree):
    path = str(tree / "a.jsonl")
    info = file_info(path)
    assert info["size"] == len("a.jsonl") and info["version"] is not None
    os.utime(path, (1, 1))
    assert file_info(path)["version"] != info["version"]


def test_checked_indices():
    out = checked_indices([[2, 0], [1, 2]], 3, "src")
    assert out.dtype == np.int64 and out.tolist() == [2, 0, 1, 2]
    with pytest.raises(IndexError, match=r"src index 3 out of range: valid indices are 0\.\.2"):
        checked_indices([0, 3, -1], 3, "src")
    with pytest.raises(IndexError, match="src index -1 out of range"):
        checked_indices([-1], 3, "src")
