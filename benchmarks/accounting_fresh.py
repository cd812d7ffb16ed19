"""Cost of the accounting counters, in fresh processes (``it.accounting()``).

Each run is a new Python process that builds one pipeline, makes 20 batches to
warm up, then times ``--batches`` more in CPU time (``time.process_time``) and
prints the loader's rate in token slots (64 rows of 2048) per CPU second. Three variants run in
rotated order each round: the counters as they are (``on``), the same again
(``on, again``: the spread between the two is the noise of the machine), and
``Tally.made_rows`` replaced by a function that notes nothing (``off``: no row is
noted or counted). Prints the median and the min-max of each over the rounds, and
the ratio of the medians.

Pipelines: ``shuffle -> split(2048) -> pack(2048) -> batch(64)`` over 20,000
log-normal documents, as a ``TokenArray`` (the compiled path, one lane per row:
the fastest path there is, so the counters weigh most there) and as a list of
dicts (the general path).

    python benchmarks/accounting_fresh.py [--rounds 7] [--batches 1500]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

PROGRAM = r"""
import sys, time
import numpy as np
import zephon_jax as zj
from zephon_jax.engine import accounting
from zephon_jax.sources import TokenArray

kind, variant, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
if variant == "off":
    accounting.Tally.made_rows = lambda *args, **kwargs: None
rng = np.random.default_rng(0)
lengths = np.clip(rng.lognormal(6.0, 1.0, 20000).astype(int), 1, 20000)
docs = [{"tokens": rng.integers(0, 32000, n).astype(np.int32)} for n in lengths]
source = docs if kind == "list" else TokenArray.from_documents([d["tokens"] for d in docs])
ds = zj.Dataset.source(source).shuffle(1).split(2048).pack(2048).batch(64)
it = iter(zj.Loader(ds))
for _ in range(20):
    next(it)
started = time.process_time()
for _ in range(batches):
    next(it)
print(batches * 64 * 2048 / (time.process_time() - started) / 1e6)
"""

VARIANTS = ("on", "on, again", "off")


def run(kind: str, variant: str, batches: int) -> float:
    """M token slots per CPU second of one fresh process."""
    mode = "off" if variant == "off" else "on"
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, kind, mode, str(batches)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="fresh processes of each variant")
    parser.add_argument("--batches", type=int, default=1500, help="timed batches per process")
    parser.add_argument("--kinds", default="array,list", help="pipelines: array, list")
    args = parser.parse_args()
    for kind in args.kinds.split(","):
        batches = args.batches if kind == "array" else max(args.batches // 4, 50)
        rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for r in range(args.rounds):
            for k in range(len(VARIANTS)):
                variant = VARIANTS[(r + k) % len(VARIANTS)]
                rates[variant].append(run(kind, variant, batches))
        medians = {v: statistics.median(x) for v, x in rates.items()}
        print(f"{kind} ({batches} batches, {args.rounds} rounds): M token slots per CPU second")
        for v, x in rates.items():
            print(f"  {v:10s} {medians[v]:7.1f} ({min(x):.1f}-{max(x):.1f})")
        print(
            f"  on / off {medians['on'] / medians['off']:.3f}, "
            f"on, again / off {medians['on, again'] / medians['off']:.3f}"
        )


if __name__ == "__main__":
    main()
