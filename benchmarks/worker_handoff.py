"""What the loader workers' hand-off costs: message latency and the prefetch depth.

* ``latency``: a process sends a timestamp, then runs Python for 3 ms (as a
  worker making its next batch does); the receiver measures when it arrives.
  Through a ``multiprocessing.Queue`` a feeder thread writes the message, and
  it must wait for the interpreter's switch interval (5 ms) to get the
  interpreter from the busy thread; through a pipe the sender writes it itself
  (what ``zephon_jax.workers.producer`` does).
* ``depth``: the CPU time of each worker's share (32 of 64 lanes) of every
  batch of the heavy map + pack pipeline, measured in this process, replayed
  through the hand-off for several ``worker_prefetch`` depths: the speed as a
  share of perfectly balanced workers (each worker on a core of its own).

Run: ``python benchmarks/worker_handoff.py [--batches N]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import pickle
import statistics
import sys
import time

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import corpus as corpus_mod  # noqa: E402
import heavy  # noqa: E402
import zephon_side  # noqa: E402

from zephon_jax.engine.rows import RowProducer, stack_rows  # noqa: E402

MESSAGES = 200


def _busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        heavy._busy(50)


def _through_queue(q) -> None:
    for _ in range(MESSAGES):
        q.put(time.perf_counter())
        _busy(3)


def _through_pipe(conn) -> None:
    for _ in range(MESSAGES):
        conn.send_bytes(pickle.dumps(time.perf_counter()))
        _busy(3)


def latency() -> dict[str, float]:
    """Median message latency (ms) through a queue and through a pipe written by the sender."""
    ctx = mp.get_context("spawn")
    out = {}
    q = ctx.Queue()
    p = ctx.Process(target=_through_queue, args=(q,))
    p.start()
    delays = [-q.get() + time.perf_counter() for _ in range(MESSAGES)]
    p.join()
    out["queue_ms"] = statistics.median(delays) * 1e3
    r, w = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_through_pipe, args=(w,))
    p.start()
    w.close()
    delays = [-pickle.loads(r.recv_bytes()) + time.perf_counter() for _ in range(MESSAGES)]
    p.join()
    out["pipe_ms"] = statistics.median(delays) * 1e3
    return out


def depth(batches: int, depths=(1, 2, 3, 4, 6, 8)) -> dict[str, object]:
    """Per-batch costs of two workers' shares of heavy map + pack, replayed per depth."""
    docs = corpus_mod.make_lognormal_corpus(20000, seed=0)
    ds = zephon_side.heavy_map_pack(docs)
    halves = [RowProducer(ds, list(range(32 * k, 32 * k + 32))) for k in range(2)]
    costs = np.zeros((2, batches))
    for i in range(batches):
        for k, producer in enumerate(halves):
            t0 = time.thread_time()
            stack_rows(producer.next_rows())
            producer.lane_snapshots()
            costs[k, i] = time.thread_time() - t0
    balanced = costs.sum(axis=1).max()
    shares = {}
    for d in depths:
        done = np.zeros((2, batches))  # when each worker finished each batch
        freed = np.zeros(batches)  # when the loader handed each batch out and freed its slots
        for i in range(batches):
            for k in range(2):
                start = max(done[k, i - 1] if i else 0.0, freed[i - d] if i >= d else 0.0)
                done[k, i] = start + costs[k, i]
            freed[i] = done[:, i].max()
        shares[d] = balanced / freed[-1]
    return {
        "mean_ms": costs.mean() * 1e3,
        "coefficient_of_variation": costs.std() / costs.mean(),
        "correlation": float(np.corrcoef(costs)[0, 1]),
        "share_of_balanced": shares,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=400)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()}")
    lat = latency()
    print(
        f"latency of a message sent before 3 ms of Python: queue {lat['queue_ms']:.3f} ms, "
        f"pipe {lat['pipe_ms']:.3f} ms (medians)"
    )
    d = depth(args.batches)
    print(
        f"heavy map + pack, a worker's share of a batch: {d['mean_ms']:.2f} ms CPU, "
        f"coefficient of variation {d['coefficient_of_variation']:.2f}, correlation of the "
        f"two workers {d['correlation']:.2f}"
    )
    for k, share in d["share_of_balanced"].items():  # type: ignore[union-attr]
        print(f"  worker_prefetch={k}: {share:.3f} of perfectly balanced workers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
