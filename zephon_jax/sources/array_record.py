"""Reads the ArrayRecord files ``zephon-jax prepare`` writes as a random-access source.

Record format: one record per document, its token ids as raw little-endian
integers of the output dtype (recorded in the output's ``prepare.json``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from zephon_jax.errors import PipelineError

MANIFEST = "prepare.json"
ARRAY_RECORD_DIR = "array_record"


class ArrayRecordTokens:
    """A random-access source over ArrayRecord files written by ``prepare``.

    ``path`` is a prepare output directory (dtype and shards come from its
    ``prepare.json``, only committed shards are read; one whose job has not
    finished is refused unless ``allow_partial``) or a list of ``.array_record``
    files with an explicit ``dtype``. Record ``i`` is
    ``{"tokens": 1-D array}``, like :class:`zephon_jax.sources.TokenStore`.
    """

    def __init__(
        self,
        path: str | os.PathLike | Sequence[str],
        dtype: str | None = None,
        allow_partial: bool = False,
    ):
        if isinstance(path, (str, os.PathLike)) and Path(path).is_dir():
            manifest = json.loads((Path(path) / MANIFEST).read_text())
            if not manifest.get("complete") and not allow_partial:
                raise PipelineError(
                    f"{os.fspath(path)!r} is an incomplete `zephon-jax prepare` output: its "
                    f"{MANIFEST} does not record a finished job (it was stopped, killed or ran "
                    "out of disk space). Rerun the same prepare command to finish it, or pass "
                    "allow_partial=True to read the shards committed so far"
                )
            shards = int(manifest["committed"]["shards"])
            files = [
                str(Path(path) / ARRAY_RECORD_DIR / f"part-{i:05d}.array_record")
                for i in range(shards)
            ]
            dtype = dtype or manifest["job"]["dtype"]
        else:
            files = [str(path)] if isinstance(path, (str, os.PathLike)) else [str(p) for p in path]
        if dtype is None:
            raise PipelineError(
                "ArrayRecordTokens needs dtype= when given files, not a prepare output directory"
            )
        self.files = files
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self._source = None

    @property
    def source(self):
        if self._source is None:
            import grain

            self._source = grain.sources.ArrayRecordDataSource(self.files) if self.files else []
        return self._source

    def __getstate__(self):
        return {"files": self.files, "dtype": self.dtype.str}

    def __setstate__(self, state):
        self.files, self.dtype, self._source = state["files"], np.dtype(state["dtype"]), None

    def __len__(self) -> int:
        return len(self.source)

    def _decode(self, record: bytes) -> dict[str, np.ndarray]:
        return {
            "tokens": np.frombuffer(record, dtype=self.dtype).astype(self.dtype.newbyteorder("="))
        }

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return self._decode(self.source[index])

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, np.ndarray]]:
        return [self._decode(r) for r in self.source.__getitems__(list(indices))]

    def lengths(self) -> np.ndarray:
        """Every record's length in tokens (reads every record)."""
        n = len(self)
        out = np.empty(n, dtype=np.int64)
        for start in range(0, n, 4096):
            stop = min(n, start + 4096)
            for i, r in enumerate(self.source.__getitems__(list(range(start, stop)))):
                out[start + i] = len(r) // self.dtype.itemsize
        return out

    def fingerprint(self) -> str:
        """Stable identity: file names, record count and dtype."""
        names = ",".join(Path(f).name for f in self.files)
        return f"ar-{len(self)}-{self.dtype.name}-{len(self.files)}:{hashlib.blake2b(names.encode(), digest_size=6).hexdigest()}"

    def __repr__(self) -> str:
        return f"ArrayRecordTokens({len(self.files)} files, dtype={self.dtype.name})"
