"""Lists of input files: paths, URLs, directories (or URL prefixes) and globs, sorted by path."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np

from zephon_jax.sources.storage import filesystem, retry_call, split_url, url_of

INDEX_SUFFIX = ".zjidx"
_GLOB_CHARS = set("*?[")


def is_sidecar(path: str) -> bool:
    """Whether ``path`` is an index sidecar JsonlSource writes (never taken as input)."""
    return path.endswith(INDEX_SUFFIX) or os.path.basename(path).startswith(".")


def _hidden_below(path: str, folder: str) -> bool:
    """Whether ``path`` is a sidecar or hidden, or lies in a hidden folder below ``folder``."""
    below = path[len(folder) :] if path.startswith(folder) else path
    return is_sidecar(path) or any(p.startswith(".") for p in below.split("/") if p)


def expand_paths(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    storage_options: Mapping[str, Any] | None = None,
    *,
    extensions: Sequence[str] | None = None,
    skipped: list[str] | None = None,
) -> list[str]:
    """Every file ``paths`` names, as local paths or URLs, sorted by path, without duplicates.

    A directory (or a URL prefix) stands for the files below it whose extension is in
    ``extensions`` (all files if None); a glob for its matches. Index sidecars and hidden
    files are never included. Raises FileNotFoundError naming an input that matches nothing.
    ``skipped``, if given, receives the files of directories left out for their extension.
    """
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise FileNotFoundError("no input paths given")
    found: set[str] = set()
    for item in items:
        found.update(_expand_one(os.fspath(item), storage_options, extensions, skipped))
    return sorted(found)


def _expand_one(
    text: str,
    storage_options: Mapping[str, Any] | None,
    extensions: Sequence[str] | None,
    skipped: list[str] | None = None,
) -> list[str]:
    scheme, _ = split_url(text)
    fs, inner = filesystem(text, storage_options)
    if any(c in _GLOB_CHARS for c in inner):
        globbed = retry_call(lambda: fs.glob(inner), text, "listing")
        matches = [m for m in globbed if retry_call(partial(fs.isfile, m), text, "listing")]
    elif retry_call(lambda: fs.isdir(inner), text, "listing"):
        listed = retry_call(lambda: fs.find(inner), text, "listing")
        matches = [
            m
            for m in listed
            if (extensions is None or os.path.splitext(m)[1].lower() in extensions)
            and not _hidden_below(m, inner)
        ]
        if skipped is not None:
            left_out = sorted(set(listed) - set(matches))
            skipped.extend(url_of(scheme, m) for m in left_out if not _hidden_below(m, inner))
    elif retry_call(lambda: fs.isfile(inner), text, "listing"):
        matches = [inner]
    else:
        raise FileNotFoundError(f"input {text} does not exist")
    matches = [m for m in matches if not is_sidecar(m)]
    if not matches:
        what = f" with an extension in {sorted(extensions)}" if extensions else ""
        raise FileNotFoundError(f"input {text} names no files{what}")
    return [url_of(scheme, m) for m in matches]


def file_info(url: str, storage_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``{"size", "version"}`` of a file: ``version`` changes when the file does (mtime or etag)."""
    fs, inner = filesystem(url, storage_options)
    info = retry_call(lambda: fs.info(inner), url, "inspecting")
    version = None
    for key in ("ETag", "etag", "md5Hash", "generation", "mtime", "LastModified", "updated"):
        if info.get(key) is not None:
            version = str(info[key])
            break
    return {"size": int(info["size"]), "version": version}


def checked_indices(indices: Sequence[int], size: int, source: str) -> np.ndarray:
    """``indices`` as an int64 array, each checked to be a record of a source of ``size``."""
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    bad = np.flatnonzero((idx < 0) | (idx >= size))
    if bad.size:
        raise IndexError(
            f"{source} index {int(idx[bad[0]])} out of range: valid indices are 0..{size - 1}"
        )
    return idx
