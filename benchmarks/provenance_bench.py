"""Provenance cost: describing a batch against producing it, and explaining a far step.

    python benchmarks/provenance_bench.py [--quick]

1. A packing pipeline (two-source mixture, shuffle, split, best-fit pack,
   window_shuffle) on a lognormal corpus: the time of ``next()`` and of
   ``provenance()`` per batch, measured in interleaved windows; medians and
   their ratio.
2. ``explain_step`` of global batch T (100,000; 10,000 with --quick), one row,
   from a state taken at T - 10 against from step 0.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import zephon_jax as zj


def lognormal_docs(num_docs: int, mean: float, seed: int, vocab: int = 32000) -> list[dict]:
    rng = np.random.default_rng(seed)
    sigma = 1.0
    mu = np.log(mean) - sigma**2 / 2
    lengths = np.maximum(1, rng.lognormal(mu, sigma, num_docs).astype(np.int64))
    tokens = rng.integers(0, vocab, int(lengths.sum()), dtype=np.int32)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return [{"tokens": tokens[a:b]} for a, b in zip(bounds[:-1], bounds[1:])]


def packing_pipeline(seq_len: int, batch: int) -> zj.BatchedDataset:
    web = zj.Dataset.source(lognormal_docs(20_000, 600, 0), name="web")
    code = zj.Dataset.source(lognormal_docs(5_000, 1500, 1), name="code")
    mixed = zj.Dataset.mix([web, code], [0.8, 0.2]).shuffle(0)
    return mixed.split(seq_len).pack(seq_len).window_shuffle(16, seed=1).batch(batch)


def batch_vs_provenance(seq_len: int, batch: int, windows: int, steps: int) -> None:
    it = iter(zj.Loader(packing_pipeline(seq_len, batch)))
    for _ in range(20):  # warm up: fill the bins and the window
        next(it)
    produce, describe, segments = [], [], 0
    for _ in range(windows):
        t0 = time.perf_counter()
        for _ in range(steps):
            next(it)
        t1 = time.perf_counter()
        for _ in range(steps):
            rows = it.provenance()
        t2 = time.perf_counter()
        produce.append((t1 - t0) / steps)
        describe.append((t2 - t1) / steps)
        segments = sum(len(r) for r in rows)
    p, d = statistics.median(produce), statistics.median(describe)
    print(f"pipeline: mix(2) -> shuffle -> split({seq_len}) -> pack(best_fit) -> window_shuffle")
    print(f"  batch of {batch} x {seq_len} tokens, {segments} segments in the last batch")
    print(f"  next():       median {p * 1e3:8.3f} ms  (min {min(produce) * 1e3:.3f})")
    print(f"  provenance(): median {d * 1e3:8.3f} ms  (min {min(describe) * 1e3:.3f})")
    print(f"  provenance / batch: {d / p:.3f}")


def explain_far_step(step: int) -> None:
    ds = zj.Dataset.source(lognormal_docs(20_000, 600, 2)).shuffle(0).split(256).pack(256)
    ds = ds.batch(8)
    it = iter(zj.Loader(ds))
    t0 = time.perf_counter()
    for _ in range(step - 10):
        next(it)
    state = it.get_state()
    run_to_state = time.perf_counter() - t0
    t0 = time.perf_counter()
    near = zj.explain_step(ds, step, state=state, rows=[3])
    from_state = time.perf_counter() - t0
    t0 = time.perf_counter()
    far = zj.explain_step(ds, step, rows=[3])
    from_zero = time.perf_counter() - t0
    assert near == far
    print(f"explain_step(step={step:,}, rows=[3]) of a batch-8 packing pipeline")
    print(f"  (reaching step {step - 10:,} with all lanes took {run_to_state:.1f} s)")
    print(f"  from the state at step {step - 10:,}: {from_state * 1e3:8.1f} ms")
    print(f"  from step 0:                 {from_zero * 1e3:8.1f} ms")
    print(f"  speed-up: {from_zero / from_state:.0f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    batch_vs_provenance(2048, 64, windows=3 if args.quick else 7, steps=5 if args.quick else 20)
    explain_far_step(10_000 if args.quick else 100_000)


if __name__ == "__main__":
    main()
