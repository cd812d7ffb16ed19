"""A lean Python reference for packing: the same batches with little per-record Python.

``LeanPythonReference`` makes the batches of ``shuffle -> [split] -> pack -> batch``
with nothing but the work itself: a shuffled order of the records, each record's
length read from its array, pieces cut as views, first or best fit over plain
integers, open rows as lists of views, and each batch assembled like
zephon_jax's (one concatenation per field, one ``np.repeat`` for segment ids,
one concatenation of slices of ``0, 1, ...`` for positions) into arrays it
reuses. It keeps no lineage, no state and checks nothing, so it cannot resume.
It is a reference point, not a lower bound on what Python per record costs: a
leaner loop makes the same batches faster. The benchmark runs it beside
zephon_jax and Grain, and a loader's speed over it is its share of the lean
Python reference (the contiguous copy, ``measure.ContiguousCopy``, relates a batch to
moving its bytes instead).
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np


class LeanPythonReference:
    """An endless iterator of packed batches ``{key, key_segment_ids, key_positions}``."""

    def __init__(
        self,
        docs: list[dict[str, np.ndarray]],
        seq_len: int,
        batch_size: int,
        method: str = "best_fit",
        num_bins: int = 32,
        split: bool = True,
        seed: int = 0,
        key: str = "tokens",
    ):
        if method not in ("first_fit", "best_fit"):
            raise ValueError(f"unknown method {method!r}")
        self.docs, self.seq_len, self.batch_size = docs, seq_len, batch_size
        self.best, self.num_bins, self.split, self.key = method == "best_fit", num_bins, split, key
        self._rng = np.random.default_rng(seed)
        self._order: list[int] = []
        self._at = 0
        self._fill = [0] * num_bins
        self._bins: list[list[np.ndarray]] = [[] for _ in range(num_bins)]
        # best fit: every bin's fill * num_bins + (num_bins - 1 - index), sorted
        self._codes = sorted(num_bins - 1 - i for i in range(num_bins))
        self._rows: list[list[np.ndarray]] = []
        shape = (batch_size, seq_len)
        self._out = {
            key: np.empty(shape, np.int32),
            key + "_segment_ids": np.empty(shape, np.int32),
            key + "_positions": np.empty(shape, np.int32),
        }
        self._counting = np.arange(seq_len, dtype=np.int32)
        self._zeros = np.zeros(seq_len, np.int32)

    def __iter__(self) -> LeanPythonReference:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        while len(self._rows) < self.batch_size:
            self._place(self._next_records(128))
        rows, self._rows = self._rows[: self.batch_size], self._rows[self.batch_size :]
        return self._assemble(rows)

    def _next_records(self, count: int) -> list[Any]:
        if self._at >= len(self._order):  # a new epoch, in a new shuffled order
            self._order = self._rng.permutation(len(self.docs)).tolist()
            self._at = 0
        take = self._order[self._at : self._at + count]
        self._at += len(take)
        docs = self.docs
        return [docs[i] for i in take]

    def _place(self, records: list[Any]) -> None:
        seq_len, width, key = self.seq_len, self.num_bins, self.key
        top = width - 1
        fill, bins, codes, rows = self._fill, self._bins, self._codes, self._rows
        best, split = self.best, self.split
        for record in records:
            array = record[key]
            n = array.shape[0]
            pieces = (
                [array[j : j + seq_len] for j in range(0, n, seq_len)]
                if split and n > seq_len
                else [array]
            )
            for piece in pieces:
                n = piece.shape[0]
                if n == 0:
                    continue
                room = seq_len - n
                if best:
                    k = bisect.bisect_right(codes, room * width + top) - 1
                    i = top - codes.pop(k if k >= 0 else -1) % width
                else:
                    for i, u in enumerate(fill):  # noqa: B007 - the loop finds ``i``
                        if u <= room:
                            break
                    else:
                        i = fill.index(max(fill))
                if fill[i] > room:  # fits no bin: the fullest goes out
                    rows.append(bins[i])
                    bins[i] = []
                    fill[i] = 0
                    if not best:  # first fit keeps its bins in opening order
                        bins.append(bins.pop(i))
                        fill.append(fill.pop(i))
                        i = top
                bins[i].append(piece)
                used = fill[i] = fill[i] + n
                if used == seq_len:
                    rows.append(bins[i])
                    bins[i] = []
                    used = fill[i] = 0
                    if not best:
                        bins.append(bins.pop(i))
                        fill.append(fill.pop(i))
                if best:
                    bisect.insort(codes, used * width + top - i)

    def _assemble(self, rows: list[list[np.ndarray]]) -> dict[str, np.ndarray]:
        seq_len, counting, zeros = self.seq_len, self._counting, self._zeros
        values: list[np.ndarray] = []
        positions: list[np.ndarray] = []
        lengths: list[int] = []
        segments: list[int] = []
        for row in rows:
            row_lengths = [piece.shape[0] for piece in row]
            values += row
            lengths += row_lengths
            segments += range(1, len(row) + 1)
            positions += [counting[:n] for n in row_lengths]
            pad = seq_len - sum(row_lengths)
            if pad:
                values.append(zeros[:pad])
                lengths.append(pad)
                segments.append(0)
                positions.append(zeros[:pad])
        out, key = self._out, self.key
        np.concatenate(values, out=out[key].reshape(-1), casting="safe")
        np.copyto(
            out[key + "_segment_ids"].reshape(-1),
            np.repeat(np.asarray(segments, np.int32), lengths),
        )
        np.concatenate(positions, out=out[key + "_positions"].reshape(-1))
        return out
