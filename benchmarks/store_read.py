"""What a batched TokenStore read of scattered documents costs.

    python benchmarks/store_read.py [--docs 200] [--reps 20]

Writes the ``llm`` case's two stores (``bench.py``'s corpus builders, int32) to a
temporary directory twice, plain (the writer's default: read from the memory-mapped
shard files) and with ``compression="zstd"`` (read through TensorStore), then times
``store.__getitems__(ids)`` of ``--docs`` random ids (a new draw per repetition) on
each store: the median and range of ``--reps`` repetitions, wall and process CPU time
(which counts TensorStore's threads), after five untimed ones, all cases of a store
interleaved. Also times ``read_flat`` (the column path's read) and, for scale, the same
documents read one TensorStore read each (issued at once, then awaited).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import tensorstore as ts

from zephon_jax.sources.storage import ts_context

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import corpus as corpus_mod  # noqa: E402
import documented_pipelines as documented  # noqa: E402


def timed(cases: dict, draws, reps: int) -> dict[str, dict[str, float]]:
    """Median, min and max milliseconds (wall) and median CPU milliseconds of each
    ``cases[name](ids)`` over ``reps`` draws, the cases interleaved (so that they meet
    the same cache)."""
    for _ in range(5):
        for fn in cases.values():
            fn(draws())
    wall: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(reps):
        for name, fn in cases.items():
            ids = draws()
            w, c = time.perf_counter(), time.process_time()
            fn(ids)
            wall[name].append((time.perf_counter() - w) * 1e3)
            cpu[name].append((time.process_time() - c) * 1e3)
    return {
        name: {
            "wall_ms": statistics.median(wall[name]),
            "wall_range": (min(wall[name]), max(wall[name])),
            "cpu_ms": statistics.median(cpu[name]),
        }
        for name in cases
    }


def _tokens_array(store) -> ts.TensorStore:
    """The store's tokens array, opened in the process's TensorStore context."""
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{store.path}/tokens/"}}
    spec["recheck_cached_data"] = "open"
    return ts.open(spec, read=True, context=ts_context()).result()


def one_read_each(store, ids) -> list:
    """The documents with one TensorStore read each, all issued before any is awaited."""
    offsets = store.offsets
    tokens = _tokens_array(store)
    futures = [tokens[int(offsets[i]) : int(offsets[i + 1])].read() for i in ids]
    return [f.result() for f in futures]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=200)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--num-docs", type=int, default=20_000)
    args = parser.parse_args()
    docs = corpus_mod.make_lognormal_corpus(args.num_docs, seed=0)
    uniform = corpus_mod.make_corpus(args.num_docs, max_len=2048, seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        plain = documented.write_stores([docs, uniform], os.path.join(tmp, "plain"))
        packed = documented.write_stores([docs, uniform], os.path.join(tmp, "zstd"), "zstd")
        rng = np.random.default_rng(0)
        for k, (store, zstd) in enumerate(zip(plain, packed)):

            def draws(store=store):
                return rng.integers(0, len(store), args.docs).tolist()

            cases = {
                "getitems": store.__getitems__,
                "read_flat": store.read_flat,
                "zstd getitems": zstd.__getitems__,
                "zstd read_flat": zstd.read_flat,
                "one_read_each": lambda ids, s=zstd: one_read_each(s, ids),
            }
            for name, r in timed(cases, draws, args.reps).items():
                lo, hi = r["wall_range"]
                print(
                    f"store{k} {name:14s} {args.docs} ids: wall {r['wall_ms']:.2f} ms "
                    f"[{lo:.2f}, {hi:.2f}], cpu {r['cpu_ms']:.2f} ms"
                )


if __name__ == "__main__":
    main()
