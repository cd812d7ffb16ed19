"""Cost of the accounting counters (``it.accounting()``), measured inside one process.

Two iterators over the same pipeline run in alternating windows: one with the
lanes' accounting as it is, one with it switched off (``Tally.made_rows`` does
nothing: no row is noted or counted). Interleaving in one process cancels most of
the drift of a shared machine that separate runs of ``bench.py`` suffer. Prints
the median time per batch of each and the time of one ``get_state()`` at the end
(where the noted rows are counted). Pipelines: ``bench.py``'s LLM pipeline and its
list-of-dicts packing (B=64, B=256), and the packing of a TokenArray (the compiled
path).

    python benchmarks/accounting_cost.py [--rounds 8]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import corpus as corpus_mod  # noqa: E402
import documented_pipelines as documented  # noqa: E402
import zephon_side  # noqa: E402

import zephon_jax as zj  # noqa: E402
from zephon_jax.engine import accounting  # noqa: E402
from zephon_jax.sources import TokenArray  # noqa: E402

SEQ_LEN = 2048
_COUNTING = accounting.Tally.made_rows


def _off(*_args) -> None:
    """``Tally.made_rows`` that notes nothing."""


def _use(counting: bool) -> None:
    accounting.Tally.made_rows = _COUNTING if counting else _off  # type: ignore[method-assign]


def compare(name: str, ds: zj.BatchedDataset, batches: int, rounds: int) -> None:
    """Prints the per-batch time with and without the counters, interleaved."""
    its = {}
    for counting in (True, False):
        _use(counting)
        its[counting] = iter(zj.Loader(ds))
        for _ in range(3):
            next(its[counting])
    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds):
        for counting in (True, False) if r % 2 else (False, True):
            _use(counting)
            gc.collect()
            started = time.process_time()
            for _ in range(batches):
                next(its[counting])
            times[counting].append((time.process_time() - started) / batches)
    state_s = {}
    for counting in (True, False):
        _use(counting)
        started = time.process_time()
        its[counting].get_state()
        state_s[counting] = time.process_time() - started
    _use(True)
    on, off = statistics.median(times[True]), statistics.median(times[False])
    print(
        f"{name}: {on * 1e3:.3f} ms/batch with the counters, {off * 1e3:.3f} without "
        f"({100 * (on / off - 1):+.1f}%); get_state {state_s[True] * 1e3:.1f} ms with, "
        f"{state_s[False] * 1e3:.1f} ms without"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8, help="windows of each, interleaved")
    args = parser.parse_args()
    docs = corpus_mod.make_lognormal_corpus(5000, seed=0)
    uniform = corpus_mod.make_corpus(5000, max_len=SEQ_LEN, seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        stores = documented.write_stores([docs, uniform], tmp)
        compare("llm", documented.llm_zephon(stores, SEQ_LEN, 64), 8, args.rounds)
    compare("packing B=64", zephon_side.packing(docs, SEQ_LEN, 64), 25, args.rounds)
    compare("packing B=256", zephon_side.packing(docs, SEQ_LEN, 256), 6, args.rounds)
    tokens = TokenArray.from_documents(docs)
    compare("packing B=64, TokenArray", zephon_side.packing(tokens, SEQ_LEN, 64), 50, args.rounds)


if __name__ == "__main__":
    main()
