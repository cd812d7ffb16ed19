"""zephon_jax lanes run in Grain's own worker processes (``mp_prefetch``), for comparison.

    python benchmarks/grain_workers.py [--quick]

Not part of the package: the measured alternative to ``zephon_jax.workers.producer``.
Each Grain worker receives a slice ``slice(k, None, n)`` through ``set_slice``;
here it picks the ``k``-th block of lanes instead of data, so the batches do not
depend on ``n``. The loader takes ``n`` consecutive elements (Grain interleaves
its workers in turn) and puts their rows in place. Grain's worker calls
``get_state()`` after every element and sends it along, so the lanes' states
are encoded for every batch.

Prints, for the heavy map + pack pipeline of ``bench.py``, tokens/s and the CPU
time per batch of the loader process and the busiest worker, for zephon_jax's
workers and for this one, interleaved; and checks that both give the batches of
the in-process loader.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import corpus as corpus_mod  # noqa: E402
import grain  # noqa: E402
import measure  # noqa: E402
import numpy as np  # noqa: E402
import zephon_side  # noqa: E402
from grain_baselines import flags_parsed  # noqa: E402

import zephon_jax as zj  # noqa: E402
from zephon_jax.engine.rows import RowProducer, encode_snapshots, lanes_to_run  # noqa: E402


class LaneBlocks(grain.IterDataset):
    """The rows of block ``k`` of ``n`` lane blocks; ``set_slice`` chooses ``k`` and ``n``."""

    def __init__(self, batched: zj.BatchedDataset, rows: list[int]):
        super().__init__([])
        self.batched, self.rows = batched, rows
        self.block, self.blocks = 0, 1

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        self.block, self.blocks = sl.start or 0, sl.step or 1

    def __iter__(self):
        return _LaneBlockIterator(self)


def lane_blocks(batched: zj.BatchedDataset, rows: list[int], blocks: int) -> list[list[int]]:
    lanes = lanes_to_run(batched, rows)
    return [b.tolist() for b in np.array_split(lanes, blocks)]


class _LaneBlockIterator(grain.DatasetIterator):
    def __init__(self, ds: LaneBlocks):
        super().__init__()
        lanes = set(lane_blocks(ds.batched, ds.rows, ds.blocks)[ds.block])
        per_lane = ds.batched.rows_per_lane
        rows = [r for r in ds.rows if r // per_lane in lanes]
        self.producer = RowProducer(ds.batched, rows, sorted(lanes))

    def __next__(self) -> Any:
        batch = self.producer.next_batch()
        if batch is None:
            raise StopIteration
        return batch

    def get_state(self) -> dict[str, Any]:
        states = encode_snapshots(self.producer.lane_snapshots())
        return {"lanes": {str(k): np.frombuffer(v, np.uint8) for k, v in states.items()}}

    def set_state(self, state: dict[str, Any]) -> None:
        self.producer.restore(state)


class GrainWorkerBatches:
    """Batches of ``batched`` from ``num_workers`` Grain worker processes."""

    def __init__(self, batched: zj.BatchedDataset, num_workers: int, prefetch: int = 8):
        """``prefetch``: Grain's ``per_worker_buffer_size``, the batches each worker makes
        ahead (a worker's element is its share of one batch), as ``worker_prefetch``."""
        flags_parsed()
        rows = list(range(batched.global_batch_size))
        options = grain.MultiprocessingOptions(
            num_workers=num_workers, per_worker_buffer_size=prefetch
        )
        ds = LaneBlocks(batched, rows).mp_prefetch(options)
        import psutil

        before = {c.pid for c in psutil.Process().children()}
        self.it = iter(ds)
        self.num_workers = num_workers
        self._first = None
        self._first = next(self)
        after = {c.pid for c in psutil.Process().children()}
        self._pids = sorted(after - before)

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self._first is not None:
            batch, self._first = self._first, None
            return batch
        parts = [next(self.it) for _ in range(self.num_workers)]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def worker_pids(self) -> list[int]:
        """Grain's worker processes: the children that appeared with the first batch."""
        return self._pids

    def close(self) -> None:
        self.it.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    timing = measure.QUICK if args.quick else measure.FULL
    docs = corpus_mod.make_lognormal_corpus(5000 if args.quick else 20_000)
    ds = zephon_side.heavy_map_pack(docs)
    reference = iter(zj.Loader(ds))
    expected = [next(reference) for _ in range(4)]
    ours = iter(zj.Loader(ds, num_workers=2))
    theirs = GrainWorkerBatches(ds, 2)
    for name, it in (("zephon_jax workers", ours), ("grain mp_prefetch", theirs)):
        got = [next(it) for _ in range(4)]
        same = all(
            all(np.array_equal(a[k], b[k]) for k in a) for a, b in zip(got, expected, strict=True)
        )
        print(f"{name}: first 4 batches equal the in-process loader's: {same}")
    sides = [
        measure.Side("zephon_jax workers", ours, measure.count_packed),
        measure.Side("grain mp_prefetch", theirs, measure.count_packed),
    ]
    result = measure.interleave(sides, timing)
    import psutil

    for side in sides:
        it = side.iterator
        pids = it._producer.worker_pids() if hasattr(it, "_producer") else it.worker_pids()
        procs = [psutil.Process()] + [psutil.Process(p) for p in pids]
        before = [sum(p.cpu_times()[:2]) for p in procs]
        n = 0
        import time

        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 4 * timing.window_s:
            next(it)
            n += 1
        used = [(sum(p.cpu_times()[:2]) - b) / n * 1e3 for p, b in zip(procs, before, strict=True)]
        r = result[side.name]
        print(
            f"{side.name}: {r['rate_median'] / 1e6:.2f} M tokens/s; CPU ms per batch: loader "
            f"{used[0]:.2f}, workers {', '.join(f'{u:.2f}' for u in used[1:])}"
        )
    for it in (ours, theirs, reference):
        measure.close(it)


if __name__ == "__main__":
    main()
