"""The machine's own scaling for worker processes: the heavy map alone in one process and two.

``ProcessFloor(p)`` runs ``heavy.heavy_record_map`` in ``p`` spawned processes and
nothing else: each batch is 1024 calls, split evenly, with one short message per
process and batch. Two processes over one is what the cores give this Python
work at this moment (shared caches, memory bandwidth, other tenants,
frequency): a ceiling for any loader's workers on the same map. The workers
case runs it interleaved with the loaders.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

import heavy
import numpy as np

RECORDS_PER_BATCH = 1024


def _serve(conn: Any) -> None:
    record = {"x": np.int64(1)}
    work = heavy.heavy_record_map
    while (n := conn.recv()) is not None:
        for _ in range(n):
            work(record)
        conn.send(n)


class ProcessFloor:
    """An endless iterator of record counts, each ``RECORDS_PER_BATCH`` map calls over
    ``processes`` processes."""

    def __init__(self, processes: int):
        ctx = multiprocessing.get_context("spawn")
        self.share = RECORDS_PER_BATCH // processes
        self._conns = []
        self._procs = []
        for _ in range(processes):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(child,), daemon=True)
            proc.start()
            self._conns.append(parent)
            self._procs.append(proc)

    def __iter__(self) -> ProcessFloor:
        return self

    def __next__(self) -> int:
        for conn in self._conns:
            conn.send(self.share)
        return sum(conn.recv() for conn in self._conns)

    def close(self) -> None:
        for conn, proc in zip(self._conns, self._procs):
            conn.send(None)
            proc.join(timeout=10)
            conn.close()


def count(batch: int) -> tuple[float, float]:
    """Records of a batch (its count), as ``measure.count_records`` for loader batches."""
    return float(batch), float(batch)
