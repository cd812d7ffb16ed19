"""Timing and memory helpers shared by every benchmark: interleaved windows, RSS, a contiguous copy.

Every comparison runs its sides *interleaved* in one process: each side gets a
warm-up, then the sides take turns, one timed window each, for ``repeats``
rounds (the order rotates every round). A machine that slows down for a moment
slows every side, not one, so ratios stay fair. Each side reports the median
and the best (minimum-time) window, and its overall rate (all timed units over
all timed seconds: for pipelines whose cost comes in bursts longer than a
window); ratios are taken between medians unless said otherwise.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

# A batch -> (units counted, e.g. real tokens; slots, e.g. rows x seq_len).
Counter = Callable[[Any], tuple[float, float]]


@dataclasses.dataclass
class Side:
    """One contestant: an iterator of batches and how to count a batch."""

    name: str
    iterator: Iterator[Any]
    count: Counter
    rates: list[float] = dataclasses.field(default_factory=list)
    units: float = 0.0
    slots: float = 0.0
    batches: int = 0
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "rate_median": statistics.median(self.rates),
            "rate_best": max(self.rates),
            "rate_worst": min(self.rates),
            "rate_overall": self.units / self.seconds,
            "rates": self.rates,
            "fill": self.units / self.slots if self.slots else None,
            "batches_timed": self.batches,
        }


@dataclasses.dataclass(frozen=True)
class Timing:
    warmup_s: float
    window_s: float
    repeats: int
    preroll: int = 2  # batches pulled untimed before each window (drains worker queues)


QUICK = Timing(warmup_s=0.3, window_s=0.25, repeats=3)
FULL = Timing(warmup_s=1.0, window_s=1.0, repeats=5)


def count_packed(batch: dict[str, np.ndarray]) -> tuple[float, float]:
    """Real (non-padding) tokens and token slots of a packed batch."""
    seg = batch["tokens_segment_ids"]
    return float(np.count_nonzero(seg)), float(seg.size)


def count_records(batch: dict[str, np.ndarray]) -> tuple[float, float]:
    n = float(next(iter(batch.values())).shape[0])
    return n, n


def _window(side: Side, seconds: float, preroll: int) -> None:
    for _ in range(preroll):
        next(side.iterator)
    units = 0.0
    start = time.perf_counter()
    while True:
        u, s = side.count(next(side.iterator))
        units += u
        side.slots += s
        side.batches += 1
        now = time.perf_counter()
        if now - start >= seconds:
            break
    side.units += units
    side.seconds += now - start
    side.rates.append(units / (now - start))


def interleave(sides: list[Side], timing: Timing) -> dict[str, dict[str, Any]]:
    """Warms every side up, then times them in turns; returns each side's summary."""
    for side in sides:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timing.warmup_s:
            next(side.iterator)
    for r in range(timing.repeats):
        k = r % len(sides)
        for side in sides[k:] + sides[:k]:
            _window(side, timing.window_s, timing.preroll)
    return {side.name: side.summary() for side in sides}


def ratio(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Median rate of ``a`` over median rate of ``b``."""
    return a["rate_median"] / b["rate_median"]


# ----- a contiguous copy of the batch's bytes ------------------------------------------


class ContiguousCopy:
    """Batches made of nothing but copies: a reference for a batch's memory traffic.

    Each batch allocates fresh arrays of the given shapes and dtypes (as a loader
    does) and fills each with ``np.copyto`` from the next contiguous slice of
    ``source``, a buffer larger than the caches. A loader reads documents
    scattered through its corpus, so this is a reference point for moving a
    batch's bytes, not a bound a loader could reach.
    """

    def __init__(self, fields: dict[str, tuple[tuple[int, ...], np.dtype]], source: np.ndarray):
        self.fields = fields
        self.source = np.ascontiguousarray(source).view(np.uint8).reshape(-1)
        self.offset = 0

    def __iter__(self) -> ContiguousCopy:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        out = {}
        for key, (shape, dtype) in self.fields.items():
            dst = np.empty(shape, dtype)
            nbytes = dst.nbytes
            if self.offset + nbytes > len(self.source):
                self.offset = 0
            src = self.source[self.offset : self.offset + nbytes].view(dtype).reshape(shape)
            self.offset += nbytes
            np.copyto(dst, src)
            out[key] = dst
        return out


def batch_layout(batch: dict[str, np.ndarray]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    return {k: (v.shape, v.dtype) for k, v in batch.items()}


def count_batches(batch: Any) -> tuple[float, float]:
    return 1.0, 1.0


# ----- memory -------------------------------------------------------------------------


def current_rss() -> int:
    """Resident bytes of this process now, after a collection and returning free heap."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # glibc keeps freed heap otherwise
    except (OSError, AttributeError):
        pass
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    import resource

    return pages * resource.getpagesize()


def median_time(fn: Callable[[], Any], repeats: int) -> tuple[float, float, Any]:
    """(median, min) seconds of ``fn()`` over ``repeats`` calls, and its last result."""
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times), result


def close(it: Any) -> None:
    fn = getattr(it, "close", None)
    if fn is not None:
        fn()


# ----- one side alone -----------------------------------------------------------------


def timing(quick: bool, seconds: float | None) -> tuple[float, float, int]:
    """(warm-up seconds, window seconds, number of windows) for a single-side benchmark."""
    if seconds is None:
        seconds = 1.0 if quick else 8.0
    windows = 3 if quick else 5
    warmup = max(0.2, 0.25 * seconds)
    return warmup, (seconds - warmup) / windows, windows


def timed_windows(
    it: Iterator[Any], count: Counter, *, warmup_s: float, window_s: float, windows: int
) -> dict[str, Any]:
    """Pulls from ``it`` for ``warmup_s``, then times ``windows`` windows of ``window_s``.

    ``count(element)`` returns ``(units, aux)``; returns the median rate of units/s,
    every window's rate, the sums of units and aux, and the first element's time.
    """
    t0 = time.perf_counter()
    next(it)
    first_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warmup_s:
        next(it)
    rates, units_total, aux_total, elements = [], 0.0, 0.0, 0
    for _ in range(windows):
        units, start = 0.0, time.perf_counter()
        while True:
            u, a = count(next(it))
            units += u
            aux_total += a
            elements += 1
            now = time.perf_counter()
            if now - start >= window_s:
                break
        rates.append(units / (now - start))
        units_total += units
    return {
        "rate_median": statistics.median(rates),
        "rates": rates,
        "units": units_total,
        "aux": aux_total,
        "elements": elements,
        "first_element_s": first_s,
    }
