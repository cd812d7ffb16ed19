"""The bare packing pipeline over a ``TokenStore`` against the contiguous copy.

    python benchmarks/store_share.py --runs 5

``shuffle -> split(2048) -> pack(2048) -> batch(B)`` over the log-normal corpus of
``bench.py``, its documents written into a local ``TokenStore`` (int32, the
writer's defaults) and, beside it, as a ``TokenArray`` in memory; the contiguous
copy of ``bench.py`` (fresh arrays of the batch's three int32 fields filled from
contiguous memory) is the reference. The three sides take turns in interleaved
windows in one process (``measure.interleave``); each run is a fresh process.
Prints, per side, the median and range over the runs of its batches/s as a share
of the copy's (the *share of contiguous copy* of ``docs/performance.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import corpus as corpus_mod  # noqa: E402
import measure  # noqa: E402
import numpy as np  # noqa: E402
import zephon_side  # noqa: E402

import zephon_jax as zj  # noqa: E402
from zephon_jax.sources import TokenArray  # noqa: E402
from zephon_jax.sources.token_store import TokenStore, TokenStoreWriter  # noqa: E402

SEQ_LEN = 2048
COPY = "contiguous copy"
SIDES = ("TokenStore", "TokenArray")


def probe(batch_size: int, num_docs: int) -> dict[str, float]:
    """One run: each side's batches/s over the copy's."""
    docs = corpus_mod.make_lognormal_corpus(num_docs, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "store")
        with TokenStoreWriter(path, dtype="int32") as writer:
            writer.extend(d["tokens"] for d in docs)
        sources = {
            "TokenStore": TokenStore(path),
            "TokenArray": TokenArray.from_documents([d["tokens"] for d in docs]),
        }
        sides, sample = [], None
        for name in SIDES:
            it = iter(zj.Loader(zephon_side.packing(sources[name], SEQ_LEN, batch_size)))
            sample = next(it)
            sides.append(measure.Side(name, it, measure.count_batches))
        buffer = np.concatenate([d["tokens"] for d in docs])
        copy = measure.ContiguousCopy(measure.batch_layout(sample), buffer)
        sides.append(measure.Side(COPY, copy, measure.count_batches))
        result = measure.interleave(sides, measure.FULL)
        for side in sides:
            measure.close(side.iterator)
    reference = result[COPY]["rate_median"]
    return {name: result[name]["rate_median"] / reference for name in SIDES}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-docs", type=int, default=20_000)
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(probe(args.batch_size, args.num_docs)))
        return 0
    shares: dict[str, list[float]] = {name: [] for name in SIDES}
    for _ in range(args.runs):
        cmd = [sys.executable, __file__, "--probe", "--batch-size", str(args.batch_size)]
        cmd += ["--num-docs", str(args.num_docs)]
        line = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        for name, share in json.loads(line.strip().splitlines()[-1]).items():
            shares[name].append(share)
    for name, values in shares.items():
        print(
            f"{name:>10}: {100 * statistics.median(values):.1f} % of the contiguous copy's "
            f"batches/s ({100 * min(values):.1f}-{100 * max(values):.1f}), "
            f"batch({args.batch_size}), {args.runs} fresh processes"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
