"""Loader workers' start: forked from the fork server against spawned, fresh processes.

    python benchmarks/worker_start.py --runs 5

Each run is a fresh process that starts ``--loaders`` loaders one after another, each
with ``--workers`` workers over ``shuffle -> split(2048) -> pack(2048) -> batch(64)``
of a ``TokenArray`` of the synthetic log-normal corpus (a restore from the previous
loader's state, as a resumed job or an evaluation loop starts loaders again), and times
each from making its iterator to its first batch, closing it untimed. The start methods
take turns run after run. Prints, per start method, the median and range of the first
loader's seconds (with ``forkserver`` it starts the server) and of the later ones', then
one JSON line with every run. The imports and the corpus are made before, untimed.
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
METHODS = ("forkserver", "spawn")


def probe(method: str, loaders: int, workers: int, num_docs: int) -> None:
    """In this process: ``loaders`` loaders started in turn; prints their seconds."""
    sys.path.insert(0, _HERE)
    import corpus as corpus_mod
    import zephon_side

    import zephon_jax as zj
    from zephon_jax.sources import TokenArray

    tokens = TokenArray.from_documents(corpus_mod.make_lognormal_corpus(num_docs, seed=0))
    dataset = zephon_side.packing(tokens, 2048, 64)
    state = None
    seconds = []
    for _ in range(loaders):
        t0 = time.perf_counter()
        iterator = iter(zj.Loader(dataset, num_workers=workers, worker_start_method=method))
        if state is not None:
            iterator.set_state(state)
        next(iterator)
        seconds.append(time.perf_counter() - t0)
        state = iterator.get_state()
        iterator.close()
    print(json.dumps(seconds))


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--loaders", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--num-docs", type=int, default=20000)
    parser.add_argument("--probe", choices=METHODS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        probe(args.probe, args.loaders, args.workers, args.num_docs)
        return 0
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(_HERE), env.get("PYTHONPATH", "")])
    sizes = [f"--loaders={args.loaders}", f"--workers={args.workers}"]
    runs: dict[str, list[list[float]]] = {method: [] for method in METHODS}
    for _ in range(args.runs):
        for method in METHODS:
            done = subprocess.run(
                [sys.executable, __file__, f"--probe={method}", *sizes,
                 f"--num-docs={args.num_docs}"],
                env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            runs[method].append(json.loads(done.stdout.splitlines()[-1]))
    for method, seconds in runs.items():
        later = [s for run in seconds for s in run[1:]]
        print(
            f"{method:>10}: first loader {_summary([run[0] for run in seconds])}, "
            f"later loaders {_summary(later) if later else '-'}"
        )
    print(json.dumps(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
