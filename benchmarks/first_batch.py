"""First batch of a packing pipeline in a fresh process, and the import of numba.

    python benchmarks/first_batch.py --runs 5

Runs ``--runs`` fresh processes for each of: importing numba (after numpy, as in a
process that packs), and the first batch of ``shuffle -> split(2048) -> pack(2048)
-> batch(64)`` over a ``TokenArray`` of the synthetic log-normal corpus, with the
kernels compiled (the first process compiles them unless numba's cache has them
already, ``NUMBA_CACHE_DIR`` chooses the cache; every later one loads them from it) and with ``ZEPHON_JAX_COMPILED=0``. The first batch
is timed from building the pipeline to ``next()`` returning; the imports (numba's
too) and the corpus are made before, untimed. Prints one JSON line: every run's
seconds and their medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))

IMPORT = """
import time
import numpy
t0 = time.perf_counter()
import numba
print(time.perf_counter() - t0)
"""


def probe(num_docs: int, batch_size: int, profile: str | None) -> None:
    """In this process: import, make the corpus, time (or profile) the first batch."""
    sys.path.insert(0, _HERE)
    import corpus as corpus_mod
    import zephon_side

    import zephon_jax as zj
    from zephon_jax.sources import TokenArray

    if os.environ.get("ZEPHON_JAX_COMPILED") != "0":
        import numba  # noqa: F401
    tokens = TokenArray.from_documents(corpus_mod.make_lognormal_corpus(num_docs, seed=0))
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    t0 = time.perf_counter()
    ds = zephon_side.packing(tokens, 2048, batch_size)
    batch = next(iter(zj.Loader(ds)))
    seconds = time.perf_counter() - t0
    if profile:
        profiler.disable()
        profiler.dump_stats(profile)
    assert batch["tokens"].shape == (batch_size, 2048)
    print(seconds)


def _fresh(args: list[str], env: dict[str, str]) -> float:
    done = subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, check=True
    )
    return float(done.stdout.split()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--num-docs", type=int, default=20000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--probe", action="store_true", help="one timed first batch, here")
    parser.add_argument("--profile", help="with --probe: write cProfile stats here")
    args = parser.parse_args(argv)
    if args.probe:
        probe(args.num_docs, args.batch_size, args.profile)
        return 0
    base = {k: v for k, v in os.environ.items() if k != "ZEPHON_JAX_COMPILED"}
    base["PYTHONPATH"] = os.pathsep.join([os.path.dirname(_HERE), base.get("PYTHONPATH", "")])
    me = [__file__, "--probe", f"--num-docs={args.num_docs}", f"--batch-size={args.batch_size}"]
    runs = {
        "first_ever_s": [_fresh(me, base)],  # compiles, unless numba's cache has the kernels
        "import_numba_s": [_fresh(["-c", IMPORT], base) for _ in range(args.runs)],
        "first_batch_compiled_s": [_fresh(me, base) for _ in range(args.runs)],
        "first_batch_interpreted_s": [
            _fresh(me, {**base, "ZEPHON_JAX_COMPILED": "0"}) for _ in range(args.runs)
        ],
    }
    medians = {f"{k}_median": statistics.median(v) for k, v in runs.items()}
    print(json.dumps({**runs, **medians}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
