"""Mixture throughput: Grain's ``MapDataset.mix`` against zephon_jax mixtures by records,
by tokens and with weight stages, side by side in one process.

    python benchmarks/mixtures.py [--seconds 1.0] [--windows 5]

Every pipeline mixes three in-memory sources of token documents with weights
0.5/0.3/0.2, maps each record to its length (so rows batch) and batches 64
rows. Prints the median records/s over timed windows and the ratio to Grain.
"""

from __future__ import annotations

import argparse
import statistics
import time

import grain
import numpy as np

import zephon_jax as zj

BATCH = 64
WEIGHTS = [0.5, 0.3, 0.2]


def make_sources() -> list[list[dict]]:
    rng = np.random.default_rng(0)
    return [
        [
            {"tokens": rng.integers(1, 1000, int(n), dtype=np.int32)}
            for n in rng.integers(1, m, 4000)
        ]
        for m in (400, 40, 120)
    ]


def length(record: dict) -> dict:
    return {"n": np.int32(len(record["tokens"]))}


def grain_iterator(sources):
    mixed = grain.MapDataset.mix([grain.MapDataset.source(s).repeat() for s in sources], WEIGHTS)
    return iter(mixed.map(length).batch(BATCH).to_iter_dataset())


def zephon_iterator(sources, weights, unit):
    comps = [zj.Dataset.source(s) for s in sources]
    ds = zj.Dataset.mix(comps, weights, unit=unit).map(length).batch(BATCH)
    return iter(zj.Loader(ds))


def records_per_s(make, seconds: float, windows: int) -> float:
    it = make()
    next(it)  # warm up
    rates = []
    for _ in range(windows):
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            next(it)
            count += BATCH
        rates.append(count / (time.perf_counter() - start))
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--windows", type=int, default=5)
    args = parser.parse_args()
    sources = make_sources()
    staged = {0: WEIGHTS, 10: [0.0, 0.5, 0.5], 20: [0.2, 0.3, 0.5]}
    cases = [
        ("grain MapDataset.mix (records)", lambda: grain_iterator(sources)),
        ("zephon_jax mix, records", lambda: zephon_iterator(sources, WEIGHTS, "records")),
        ("zephon_jax mix, records, stages", lambda: zephon_iterator(sources, staged, "records")),
        ("zephon_jax mix, tokens", lambda: zephon_iterator(sources, WEIGHTS, "tokens")),
        ("zephon_jax mix, tokens, stages", lambda: zephon_iterator(sources, staged, "tokens")),
    ]
    baseline = None
    print(f"{'pipeline':<36} {'records/s (median)':>20} {'vs grain':>9}")
    for name, make in cases:
        rate = records_per_s(make, args.seconds, args.windows)
        baseline = baseline or rate
        print(f"{name:<36} {rate:>20,.0f} {rate / baseline:>9.2f}")


if __name__ == "__main__":
    main()
