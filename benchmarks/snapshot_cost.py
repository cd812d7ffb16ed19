"""Cost of the lane snapshots taken after every batch (by device prefetch and workers).

Pipeline: shuffle -> split(2048) -> pack(2048, best_fit, 32 bins) -> batch, on the
lognormal corpus. For each lane count, after every batch: the time of one
snapshot of every lane (what prefetch and each worker take per batch), and the
garbage-collection time per batch (in the batch and the snapshot) while the last ``KEEP`` snapshots are kept
(workers keep those of the batches they made ahead). Also prints a digest of
the encoded lane states of every step, to check that two versions of the code
save the same bytes.

    python benchmarks/snapshot_cost.py [--lanes 64,256,1024] [--steps 40]
"""

from __future__ import annotations

import argparse
import collections
import gc
import hashlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import corpus as corpus_mod  # noqa: E402
import zephon_side  # noqa: E402

import zephon_jax as zj  # noqa: E402
from zephon_jax.state.lane_format import encode_lane_state  # noqa: E402

SEQ_LEN = 2048
KEEP = 5  # worker_prefetch 4, plus the batch handed out


def measure(docs: list, lanes: int, batch_size: int, warmup: int, steps: int) -> dict:
    ds = zephon_side.packing(docs, SEQ_LEN, batch_size, num_lanes=lanes)
    it = iter(zj.Loader(ds))
    producer = it._producer
    for _ in range(warmup):
        next(it)
    gc_time = [0.0]
    started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            gc_time[0] += time.perf_counter() - started[0]

    kept: collections.deque = collections.deque(maxlen=KEEP)
    digest = hashlib.sha256()
    snap_s, snap_cpu, batch_s, gc_s = [], [], [], []
    gc.callbacks.append(on_gc)
    try:
        for _ in range(steps):
            gc_time[0] = 0.0
            t0 = time.perf_counter()
            next(it)
            t1, c1 = time.perf_counter(), time.process_time()
            snaps = producer.lane_snapshots()
            t2, c2 = time.perf_counter(), time.process_time()
            snap_cpu.append(c2 - c1)
            kept.append(snaps)
            batch_s.append(t1 - t0)
            snap_s.append(t2 - t1)
            gc_s.append(gc_time[0])
            for lane in sorted(snaps):
                digest.update(encode_lane_state(snaps[lane], lane))
    finally:
        gc.callbacks.remove(on_gc)
    return {
        "lanes": lanes,
        "snapshot_ms": 1e3 * statistics.median(snap_s),
        "snapshot_cpu_ms": 1e3 * statistics.median(snap_cpu),
        "snapshot_cpu_us_per_lane": 1e6 * statistics.median(snap_cpu) / lanes,
        "batch_ms": 1e3 * statistics.median(batch_s),
        "gc_ms_per_batch": 1e3 * sum(gc_s) / steps,
        "states_sha256": digest.hexdigest()[:16],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lanes", default="64,256,1024")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--num-docs", type=int, default=20_000)
    args = parser.parse_args(argv)
    docs = corpus_mod.make_lognormal_corpus(args.num_docs, seed=0)
    print(f"load average {os.getloadavg()}")
    for lanes in (int(n) for n in args.lanes.split(",")):
        r = measure(docs, lanes, args.batch_size, args.warmup, args.steps)
        print(
            f"{lanes:5d} lanes: snapshot {r['snapshot_ms']:.3f} ms wall, "
            f"{r['snapshot_cpu_ms']:.3f} ms CPU ({r['snapshot_cpu_us_per_lane']:.2f} us/lane); "
            f"batch {r['batch_ms']:.2f} ms, "
            f"gc {r['gc_ms_per_batch']:.3f} ms/batch, states {r['states_sha256']}"
        )
    print(f"load average {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
