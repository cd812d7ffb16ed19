"""Parquet files as a random-access source, by row, through the footers' row-group index."""

from __future__ import annotations

import collections
import hashlib
import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from zephon_jax.sources.files import checked_indices, expand_paths
from zephon_jax.sources.storage import filesystem, retry_call

__all__ = ["ParquetSource"]

PARQUET_EXTENSIONS = (".parquet", ".pq")


class ParquetSource:
    """Parquet files as a random-access source; record ``i`` is row ``i`` as a dict.

    ``paths``: a path or URL (``s3://``, ``gs://``), a directory or prefix (its ``.parquet``
    and ``.pq`` files), a glob, or a list of them; files sorted by path, rows in file
    order. ``columns``: the columns each record holds (default: all). Rows are located
    through the row-group index in the footers (read once, in parallel, when the source is
    created); a read decodes whole row groups of the requested columns and keeps the last
    ``cache_row_groups`` of them in an LRU. ``__getitems__`` groups a batch by row group
    and fetches the missing ones concurrently. Picklable (footers travel with it);
    ``fingerprint()`` depends on file names, row counts and columns, not on where the
    files are.
    """

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        columns: Sequence[str] | None = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
        cache_row_groups: int = 8,
        read_workers: int = 8,
    ) -> None:
        self.storage_options = dict(storage_options or {})
        self.paths = expand_paths(paths, self.storage_options, extensions=PARQUET_EXTENSIONS)
        self.cache_row_groups = max(1, int(cache_row_groups))
        self.read_workers = max(1, int(read_workers))
        with ThreadPoolExecutor(min(8, len(self.paths))) as pool:
            metas = list(pool.map(self._read_footer, self.paths))
        names = metas[0].schema.to_arrow_schema().names
        self.columns = list(columns) if columns is not None else names
        for url, meta in zip(self.paths, metas):
            have = meta.schema.to_arrow_schema().names
            missing = [c for c in self.columns if c not in have]
            if missing:
                raise ValueError(
                    f"{url}: Parquet file has no column(s) {missing} (columns: {have}); "
                    f"choose among them with columns=[...]"
                )
        self._metas = metas
        groups = [
            (f, g, m.row_group(g).num_rows)
            for f, m in enumerate(metas)
            for g in range(m.num_row_groups)
        ]
        self._group_file = np.array([g[0] for g in groups], dtype=np.int64)
        self._group_index = np.array([g[1] for g in groups], dtype=np.int64)
        rows = np.array([g[2] for g in groups], dtype=np.int64)
        self._group_first = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        digest = hashlib.blake2b(digest_size=8)
        for url, meta in zip(self.paths, metas):
            digest.update(
                f"{os.path.basename(url)}\0{meta.num_rows}\0{meta.num_row_groups}\n".encode()
            )
        digest.update("\0".join(self.columns).encode())
        self._fingerprint = f"parquet-{len(self.paths)}-{len(self)}-{digest.hexdigest()}"
        self._init_cache()

    def _init_cache(self) -> None:
        self._cache: collections.OrderedDict[int, Any] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.row_groups_read = 0

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for key in ("_cache", "_lock", "row_groups_read"):
            state.pop(key)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_cache()

    def _read_footer(self, url: str) -> Any:
        import pyarrow.parquet as pq

        fs, inner = filesystem(url, self.storage_options)

        def read() -> Any:
            with fs.open(inner, "rb", cache_type="none") as f:
                return pq.ParquetFile(f).metadata

        try:
            return retry_call(read, url, "reading the footer of")
        except FileNotFoundError:
            raise
        except OSError as e:
            if "Parquet" in str(e) or "magic" in str(e):
                raise ValueError(f"{url} is not a Parquet file: {e}") from e
            raise

    def _read_group(self, group: int) -> Any:
        import pyarrow.parquet as pq

        f, g = int(self._group_file[group]), int(self._group_index[group])
        url = self.paths[f]
        fs, inner = filesystem(url, self.storage_options)

        def read() -> Any:
            with fs.open(inner, "rb", cache_type="none") as fh:
                return pq.ParquetFile(fh, metadata=self._metas[f]).read_row_group(
                    g, columns=self.columns
                )

        return retry_call(read, url, f"reading row group {g} of")

    def __len__(self) -> int:
        return int(self._group_first[-1])

    def __repr__(self) -> str:
        return f"ParquetSource({len(self.paths)} files, {len(self)} rows, columns={self.columns})"

    def fingerprint(self) -> str:
        """Identity of the content's shape: file names, row counts, row groups and columns."""
        return self._fingerprint

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Batched ``[self[i] for i in indices]``, in order; each row group decoded once."""
        idx = checked_indices(indices, len(self), "ParquetSource")
        if idx.size == 0:
            return []
        group_of = np.searchsorted(self._group_first, idx, side="right") - 1
        wanted = np.unique(group_of).tolist()
        tables = self._groups(wanted)
        out: list[Any] = [None] * idx.size
        for group in wanted:
            sel = np.flatnonzero(group_of == group)
            rows = tables[group].take(idx[sel] - self._group_first[group]).to_pylist()
            for k, row in zip(sel.tolist(), rows):
                out[k] = row
        return out

    def _groups(self, wanted: list[int]) -> dict[int, Any]:
        with self._lock:
            have = {g: self._cache[g] for g in wanted if g in self._cache}
            for g in have:
                self._cache.move_to_end(g)
        missing = [g for g in wanted if g not in have]
        if len(missing) == 1:
            have[missing[0]] = self._read_group(missing[0])
        elif missing:
            with ThreadPoolExecutor(min(self.read_workers, len(missing))) as pool:
                have.update(zip(missing, pool.map(self._read_group, missing)))
        with self._lock:
            self.row_groups_read += len(missing)
            for g in missing:
                self._cache[g] = have[g]
            while len(self._cache) > self.cache_row_groups:
                self._cache.popitem(last=False)
        return have
