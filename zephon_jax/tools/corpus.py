"""The built-in corpus: the Python standard library's own source files, no download needed.

Every Python install carries its standard library as ``.py`` files, so every
machine can build the same kind of dataset offline. The corpus has two parts,
natural for a two-source mixture:

* ``"library"``: the library's modules;
* ``"tests"``: its test suites (files under a ``test``/``tests`` directory, or
  named ``test_*.py``).

Each file is one document, tokenized byte-level (:func:`zephon_jax.tools.tokenizers.byte_tokenize`:
token = byte + 2, ids 0 and 1 reserved for padding and end of document) into a
uint16 :class:`~zephon_jax.sources.TokenStore`. It is prepared once into a cache
(``$ZEPHON_JAX_CACHE``, default ``~/.cache/zephon_jax``) and reused; the cache key
includes the Python version and the file list, so another interpreter gets its
own copy. Files are taken in sorted path order, so the same interpreter always
gives the same store.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import sysconfig
from pathlib import Path
from typing import TextIO

from zephon_jax.sources.token_store import TokenStore

PARTS = ("library", "tests")
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def default_cache_dir() -> Path:
    """``$ZEPHON_JAX_CACHE`` if set, else ``~/.cache/zephon_jax``."""
    env = os.environ.get("ZEPHON_JAX_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "zephon_jax"


def is_test_file(path: Path, root: Path) -> bool:
    """Whether a standard-library file belongs to the ``tests`` part."""
    parts = path.relative_to(root).parts
    return any(p in ("test", "tests") for p in parts[:-1]) or path.name.startswith("test_")


def stdlib_files(part: str, max_files: int | None = None) -> list[Path]:
    """The ``.py`` files of one part of the standard library, sorted by path."""
    if part not in PARTS:
        raise ValueError(f"unknown corpus part {part!r}; use one of {PARTS}")
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        for name in filenames:
            path = Path(dirpath) / name
            if (
                name.endswith(".py")
                and path.is_file()
                and is_test_file(path, root) == (part == "tests")
            ):
                files.append(path)
    files.sort()
    if max_files is not None:
        files = files[:max_files]
    if not files:
        raise FileNotFoundError(f"found no standard-library sources for part {part!r} under {root}")
    return files


def _cache_key(files: list[Path]) -> str:
    digest = hashlib.blake2b(digest_size=8)
    for f in files:
        digest.update(f"{f}\0{f.stat().st_size}\n".encode())
    return f"py{sys.version_info.major}{sys.version_info.minor}-{len(files)}-{digest.hexdigest()}"


@contextlib.contextmanager
def _lock(path: Path):
    """An exclusive lock file, so concurrent processes prepare a part only once."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def builtin_corpus(
    part: str = "library",
    *,
    cache_dir: str | os.PathLike | None = None,
    max_files: int | None = None,
    workers: int | None = None,
    stream: TextIO | None = None,
) -> TokenStore:
    """The built-in corpus part ``part`` (``"library"`` or ``"tests"``) as a TokenStore.

    Prepared on first use (a few seconds; progress on ``stream`` if given) and
    read from the cache afterwards. ``max_files`` keeps only the first files
    (sorted), for quick runs; it is part of the cache key.
    """
    from zephon_jax.tools.prepare import PrepareOptions, prepare

    files = stdlib_files(part, max_files)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    out = cache / "stdlib" / _cache_key(files) / part
    manifest = out / "prepare.json"
    with _lock(out.parent / f".{part}.lock"):
        if not _complete(manifest):
            opts = PrepareOptions(
                inputs=tuple(str(f) for f in files),
                output=str(out),
                input_format="text",
                workers=workers,
                chunk_records=32,
                commit_every=8,
                max_reported_bad=0,  # a few test files are deliberately not UTF-8
            )
            if stream is not None:
                print(
                    f"preparing the built-in corpus ({part}: {len(files)} files) in {out}",
                    file=stream,
                )
            prepare(opts, stream=stream)
    return TokenStore(out)


def builtin_sources(
    *, cache_dir: str | os.PathLike | None = None, max_files: int | None = None, stream=None
) -> dict[str, TokenStore]:
    """Both parts of the built-in corpus, ``{"library": ..., "tests": ...}``."""
    return {
        part: builtin_corpus(part, cache_dir=cache_dir, max_files=max_files, stream=stream)
        for part in PARTS
    }


def _complete(manifest: Path) -> bool:
    import json

    try:
        return bool(json.loads(manifest.read_text()).get("complete"))
    except (OSError, ValueError):
        return False
