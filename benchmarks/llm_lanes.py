"""The documented LLM pipeline with many lanes: rate and memory per lane, fresh processes.

    python benchmarks/llm_lanes.py --store-dir DIR --lanes 8,1024 --runs 5

Runs ``mix(TokenStores, unit="tokens") -> shuffle -> split(2048) -> pack(2048) ->
to_training -> batch(1024)`` with each lane count in a new interpreter, the lane counts
taking turns round after round. A probe makes ``--warmup`` batches, then times
``--batches`` more and samples the process's resident memory (RSS) after the warm-up and
at the end. Prints, per lane count, the median and range of the real tokens per second,
the ratio to the fewest lanes (the medians), and the RSS each lane adds beyond the
fewest lanes, and the RSS growth over the timed batches, each also without the pages of
memory-mapped files (``RssFile``: a plain local TokenStore's shard files, which the
kernel may drop and read again; see ``docs/performance.md``). ``--setup`` writes the
stores first (as ``restore_probe.py --llm --setup`` does).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Callable

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import corpus as corpus_mod  # noqa: E402
import documented_pipelines as documented  # noqa: E402
import numpy as np  # noqa: E402

import zephon_jax as zj  # noqa: E402
from zephon_jax.sources.token_store import TokenStore  # noqa: E402

SEQ_LEN = 2048
BATCH = 1024


def _rss_kib(key: str = "VmRSS") -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _memory() -> tuple[int, int]:
    """(RSS, RSS without file pages) in KiB."""
    return _rss_kib(), _rss_kib() - _rss_kib("RssFile")


def _paths(store_dir: str) -> list[str]:
    return [os.path.join(store_dir, f"store{i}") for i in range(2)]


def setup(store_dir: str, num_docs: int) -> None:
    """Writes the two stores (the log-normal and the uniform corpus) unless present."""
    if all(os.path.isdir(p) for p in _paths(store_dir)):
        return
    os.makedirs(store_dir, exist_ok=True)
    docs = corpus_mod.make_lognormal_corpus(num_docs, seed=0)
    uniform = corpus_mod.make_corpus(num_docs, max_len=SEQ_LEN, seed=1)
    documented.write_stores([docs, uniform], store_dir)


def loader(store_dir: str, lanes: int) -> zj.Loader:
    """The pipeline over the stores in ``store_dir`` with ``lanes`` lanes, as a loader."""
    stores = [TokenStore(p) for p in _paths(store_dir)]
    return zj.Loader(documented.llm_zephon(stores, SEQ_LEN, BATCH, num_lanes=lanes))


def probe(store_dir: str, lanes: int, warmup: int, batches: int) -> dict:
    """One run in this process (see the module docstring)."""
    it = iter(loader(store_dir, lanes))
    batch = None
    for _ in range(warmup):
        batch = next(it)  # (held, as in the timed loop: one batch alive at each sample)
    before = _memory()
    real = 0
    t0 = time.perf_counter()
    for _ in range(batches):
        batch = next(it)
        real += int(np.count_nonzero(batch["segment_ids"]))
    seconds = time.perf_counter() - t0
    after = _memory()
    return {"lanes": lanes, "tokens_per_s": real / seconds, "rss_kib": after[0],
            "rss_growth_kib": after[0] - before[0], "own_kib": after[1],
            "own_growth_kib": after[1] - before[1]}  # fmt: skip


def lane_rounds(
    script: str, description: str, probe_of: Callable, argv: list[str] | None
) -> tuple[list[int], dict[int, list[dict]]] | None:
    """The command line every lane-count benchmark here shares: parses ``argv``; as a
    probe (``--probe N``), prints ``probe_of(store_dir, N, warmup, batches)`` as JSON and
    returns None; else runs ``script`` as a probe for each lane count in a new
    interpreter, the counts taking turns round after round, and returns the sorted
    lane counts and each count's probe results."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--store-dir", required=True)
    parser.add_argument("--lanes", default="8,1024", help="comma-separated lane counts")
    parser.add_argument("--runs", type=int, default=5)
    # A lane's drawn roots and accounting log reach their size after about 150 to 250
    # batches at 1024 lanes: memory and rate are measured after that.
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--num-docs", type=int, default=20_000)
    parser.add_argument("--setup", action="store_true")
    parser.add_argument("--probe", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe is not None:
        print(json.dumps(probe_of(args.store_dir, args.probe, args.warmup, args.batches)))
        return None
    if args.setup:
        setup(args.store_dir, args.num_docs)
    counts = sorted(int(x) for x in args.lanes.split(","))
    runs: dict[int, list[dict]] = {n: [] for n in counts}
    for r in range(args.runs):
        for n in counts[r % len(counts) :] + counts[: r % len(counts)]:
            cmd = [sys.executable, os.path.abspath(script), "--store-dir", args.store_dir]
            cmd += ["--probe", str(n), "--warmup", str(args.warmup)]
            cmd += ["--batches", str(args.batches)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs[n].append(json.loads(done.stdout.strip().splitlines()[-1]))
    return counts, runs


def main(argv: list[str] | None = None) -> int:
    rounds = lane_rounds(__file__, __doc__.splitlines()[0], probe, argv)
    if rounds is None:
        return 0
    counts, runs = rounds
    fewest = min(counts)
    base_rate = statistics.median(x["tokens_per_s"] for x in runs[fewest])
    for n in counts:
        rates = [x["tokens_per_s"] / 1e6 for x in runs[n]]
        print(
            f"{n:5d} lanes: {statistics.median(rates):6.1f} M tokens/s "
            f"({min(rates):.1f}-{max(rates):.1f}), {statistics.median(rates) * 1e6 / base_rate:.2f}x "
            f"the fewest"
        )
        for what, key in (("RSS", "rss"), ("RSS without file pages", "own")):
            print("       " + _memory_line(what, key, runs, n, fewest))
    return 0


def _memory_line(what: str, key: str, runs: dict[int, list[dict]], n: int, fewest: int) -> str:
    """The median memory of ``n`` lanes, per lane added beyond ``fewest``, and its growth
    over the timed batches (median and range)."""
    base = statistics.median(x[key + "_kib"] for x in runs[fewest])
    mem = statistics.median(x[key + "_kib"] for x in runs[n])
    growth = [x[key + "_growth_kib"] / 1024 for x in runs[n]]
    per_lane = (mem - base) / (n - fewest) if n > fewest else 0.0
    return (
        f"{what} {mem / 1024:.0f} MiB, {per_lane:.1f} KiB per added lane; growth over the "
        f"timed batches {statistics.median(growth):.1f} MiB ({min(growth):.1f}-{max(growth):.1f})"
    )


if __name__ == "__main__":
    sys.exit(main())
