"""Where a batch's time goes with many lanes: the parts of the drawing lanes' work, timed.

    python benchmarks/lane_time.py --store-dir DIR --lanes 8,1024 --runs 5

Runs the pipeline of ``llm_lanes.py`` (``mix(TokenStores, unit="tokens") -> shuffle ->
split(2048) -> pack(2048) -> to_training -> batch(1024)``) with each lane count in a new
interpreter, the lane counts taking turns round after round. A probe makes ``--warmup``
batches, times ``--batches`` more as they are, then wraps each function of :data:`PARTS`
in a timer and makes ``--batches`` more. Prints, per lane count, the milliseconds a
batch takes without the timers and with them, and each part's time a batch with what it
calls (so parts nest, as their labels are indented: the draw call is within the lanes'
draws), as the median and range over the runs, and the difference from the fewest lanes.

A timer costs about half a microsecond a call in a warm loop and more among many lanes'
cold state (up to a fifth of a batch at 1024 lanes), so the parts read high there: compare
their shares, and rates by the batch times without timers (``llm_lanes.py`` gives them
with memory). ``--setup`` writes the stores first (as ``llm_lanes.py --setup`` does).
"""

from __future__ import annotations

import functools
import importlib
import os
import statistics
import sys
import time
from typing import Any, Callable

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import llm_lanes  # noqa: E402

# (label, module, attribute path): the drawing lanes' work, outermost first.
PARTS = (
    ("the lanes' draws", "zephon_jax.engine.columns", "_fill_drawn_lanes"),
    ("  the draw call (kernel and dispatch)", "zephon_jax.operators.pack", "OpenRows.place_draws"),
    ("  the rows made: their run", "zephon_jax.engine.columns", "_logged_rows"),
    ("  the rows made: pending rows, accounting", "zephon_jax.engine.lane", "Lane.row_reached"),
    ("    counting delivered rows (all calls)", "zephon_jax.engine.accounting", "Tally.fold"),
    ("  dropping drawn roots no row points to", "zephon_jax.engine.columns", "_prune_roots"),
    ("reading draws ahead, lanes together", "zephon_jax.engine.columns", "read_draws_ahead"),
    ("  resolving the draws", "zephon_jax.sampler.scheduled_mixture", "resolve_flat"),
    ("noting a lane's first run", "zephon_jax.engine.front_rows", "FrontRows._note"),
    ("settling what a lane owes", "zephon_jax.engine.front_rows", "FrontRows.settle"),
)


def _timed(function: Callable, label: str, spent: dict[str, float]) -> Callable:
    """``function``, adding the wall time of each call (callees included) to ``spent``."""
    clock = time.perf_counter

    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = clock()
        try:
            return function(*args, **kwargs)
        finally:
            spent[label] += clock() - start

    return timed


def _wrap_parts(spent: dict[str, float]) -> None:
    """Replaces each function of :data:`PARTS` where its callers look it up."""
    for label, module_name, path in PARTS:
        owner: Any = importlib.import_module(module_name)
        *outer, name = path.split(".")
        for attribute in outer:
            owner = getattr(owner, attribute)
        spent[label] = 0.0
        setattr(owner, name, _timed(getattr(owner, name), label, spent))


def probe(store_dir: str, lanes: int, warmup: int, batches: int) -> dict:
    """One run in this process (see the module docstring)."""
    it = iter(llm_lanes.loader(store_dir, lanes))
    for _ in range(warmup):
        next(it)
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    plain = (time.perf_counter() - start) / batches
    spent: dict[str, float] = {}
    _wrap_parts(spent)
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    timed = (time.perf_counter() - start) / batches
    parts = {label: seconds / batches * 1e3 for label, seconds in spent.items()}
    return {"lanes": lanes, "plain_ms": plain * 1e3, "timed_ms": timed * 1e3, "parts": parts}


def _line(label: str, values: dict[int, list[float]], counts: list[int]) -> str:
    """A row of the table: the median and range for each lane count, and the difference
    between the medians of the most and the fewest lanes."""
    cells = []
    for n in counts:
        xs = values[n]
        cells.append(f"{statistics.median(xs):6.2f} ({min(xs):.2f}-{max(xs):.2f})")
    diff = statistics.median(values[counts[-1]]) - statistics.median(values[counts[0]])
    return f"{label:44s} " + "  ".join(f"{c:>22s}" for c in cells) + f"  {diff:+7.2f}"


def main(argv: list[str] | None = None) -> int:
    rounds = llm_lanes.lane_rounds(__file__, __doc__.splitlines()[0], probe, argv)
    if rounds is None:
        return 0
    counts, runs = rounds
    header = "ms a batch, median (range)"
    print(f"{header:44s} " + "  ".join(f"{f'{n} lanes':>22s}" for n in counts) + "  most-fewest")
    rows = [("a batch, no timers", "plain_ms"), ("a batch, with the timers", "timed_ms")]
    for label, key in rows:
        print(_line(label, {n: [x[key] for x in runs[n]] for n in counts}, counts))
    for label, _, _ in PARTS:
        print(_line(label, {n: [x["parts"][label] for x in runs[n]] for n in counts}, counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
