"""Grain 0.2.x baselines for the side-by-side benchmark (see ``bench.py``).

Every public function builds a Grain pipeline with the public API on an in-memory
corpus, measures it, and returns a flat ``dict`` of figures. Rates are medians over
several timed windows taken after a warm-up, never means. Every result also carries
peak-RSS figures (see :class:`PeakRss`).

``benchmarks/zephon_side.py`` may define functions with the same names and
signatures; ``bench.py`` calls both with identical arguments and compares the keys.

Notes on Grain's behaviour that these functions rely on (checked against the
grain 0.2.18 source):

* ``FirstFitPackIterDataset``/``BestFitPackIterDataset`` fill ``num_packing_bins``
  bins; the first document that fits in none of them flushes *all* bins (partially
  filled ones included) and starts a new set of bins with it. Bins are emitted one
  per element, shuffled (``shuffle_bins=True``) and then batched by ``.batch``.
* Their state is ``{"parent": <parent state at the last flush>, "next_row",
  "counter"}``; ``set_state`` replays the parent from the last flush and re-packs
  the whole set of bins, so restore cost grows with ``num_packing_bins`` but not
  with the number of steps taken.
* ``ConcatThenSplitIterDataset`` restarts ``*_positions`` at 0 and
  ``*_segment_ids`` at 1 for the continuation of a split document, so a split
  document looks like two documents. Its state holds tuples (``(-1, -1)`` meaning
  "no remainder"); after a JSON round trip (what Grain's own checkpoint handler
  does) they come back as lists and ``set_state`` mistakes ``[-1, -1]`` for a
  remainder, silently skipping data. ``restore_cost`` reports this as
  ``restore_matches = False``.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grain
import numpy as np
import psutil
from absl import flags
from grain.experimental import (
    BestFitPackIterDataset,
    ConcatThenSplitIterDataset,
    FirstFitPackIterDataset,
)

PACKING_METHODS = ("first_fit", "best_fit", "concat")

_MB = 1024.0 * 1024.0


# --------------------------------------------------------------------------- memory


def _read_vmhwm_bytes() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_vmhwm() -> bool:
    """Resets this process's peak RSS (Linux >= 4.0); False where not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return _read_vmhwm_bytes() is not None


class PeakRss:
    """Context manager measuring peak RSS of this process (and its children).

    The process's own peak comes from the kernel's high-water mark ``VmHWM``, reset on
    entry through ``/proc/self/clear_refs``; where that is unavailable a psutil sampler
    thread stands in. Children (Grain's ``mp_prefetch`` workers) are sampled with
    psutil every ``interval_s`` when ``children=True``.
    """

    def __init__(self, children: bool = False, interval_s: float = 0.02):
        self._children = children
        self._interval_s = interval_s
        self._proc = psutil.Process()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._hwm_ok = False
        self._sampled_self = 0
        self._sampled_children = 0
        self.result: dict[str, float] = {}

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                if not self._hwm_ok:
                    self._sampled_self = max(self._sampled_self, self._proc.memory_info().rss)
                if self._children:
                    total = 0
                    for c in self._proc.children(recursive=True):
                        try:
                            total += c.memory_info().rss
                        except psutil.Error:
                            pass
                    self._sampled_children = max(self._sampled_children, total)
            except psutil.Error:
                pass
            self._stop.wait(self._interval_s)

    def __enter__(self) -> PeakRss:
        self._rss_before = self._proc.memory_info().rss
        self._hwm_ok = _reset_vmhwm()
        self._sampled_self = self._rss_before
        if self._children or not self._hwm_ok:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        peak = self._sampled_self
        if self._hwm_ok:
            peak = max(peak, _read_vmhwm_bytes() or 0)
        self.result = {
            "rss_before_mb": self._rss_before / _MB,
            "peak_rss_mb": peak / _MB,
            "peak_rss_delta_mb": (peak - self._rss_before) / _MB,
        }
        if self._children:
            self.result["peak_children_rss_mb"] = self._sampled_children / _MB
            self.result["peak_total_rss_mb"] = (peak + self._sampled_children) / _MB


# --------------------------------------------------------------------------- timing


def _timing(quick: bool, seconds: float | None) -> tuple[float, float, int]:
    """(warm-up seconds, window seconds, number of windows)."""
    if seconds is None:
        seconds = 1.0 if quick else 8.0
    windows = 3 if quick else 5
    warmup = max(0.2, 0.25 * seconds)
    return warmup, (seconds - warmup) / windows, windows


def _timed_windows(
    it: Iterator[Any],
    count: Callable[[Any], tuple[float, float]],
    *,
    warmup_s: float,
    window_s: float,
    windows: int,
) -> dict[str, Any]:
    """Pulls from ``it`` for ``warmup_s`` then for ``windows`` windows of ``window_s``.

    ``count(element)`` returns ``(units, aux)``; the rate is units/s per window, and
    the sums of ``units`` and ``aux`` over the timed windows are returned too.
    Each window covers whole elements, so its length may slightly exceed window_s.
    """
    t0 = time.perf_counter()
    next(it)
    first_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warmup_s:
        next(it)
    rates, units_total, aux_total, elements = [], 0.0, 0.0, 0
    for _ in range(windows):
        units = 0.0
        start = time.perf_counter()
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


def _close(it: Any) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        close()


# --------------------------------------------------------------------------- pipelines


def _ensure_absl_flags_parsed() -> None:
    """``mp_prefetch`` reads the absl flag ``grain_enable_multiprocess_worker_profiling``
    directly (grain 0.2.18 ``_src/core/profiler.py``) and raises
    ``UnparsedFlagAccessError`` outside ``absl.app.run``; mark flags parsed (defaults)."""
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def _identity(x: Any) -> Any:
    return x


def _read_options(read_threads: int | None) -> grain.ReadOptions | None:
    if read_threads is None:
        return None  # Grain's default: ReadOptions(num_threads=16, prefetch_buffer_size=500)
    return grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=500)


def build_packing_dataset(
    corpus: list[dict[str, np.ndarray]],
    method: str = "first_fit",
    seq_len: int = 2048,
    batch_size: int = 8,
    num_packing_bins: int = 8,
    seed: int = 0,
    read_threads: int | None = None,
) -> grain.IterDataset:
    """shuffle -> repeat -> to_iter_dataset -> pack -> batch, on ``{"tokens"}`` docs."""
    if method not in PACKING_METHODS:
        raise ValueError(f"method must be one of {PACKING_METHODS}, got {method!r}")
    ds = (
        grain.MapDataset.source(corpus)
        .shuffle(seed=seed)
        .repeat()
        .to_iter_dataset(_read_options(read_threads))
    )
    length_struct = {"tokens": seq_len}
    if method == "first_fit":
        ds = FirstFitPackIterDataset(
            ds, length_struct=length_struct, num_packing_bins=num_packing_bins, seed=seed
        )
    elif method == "best_fit":
        ds = BestFitPackIterDataset(
            ds, length_struct=length_struct, num_packing_bins=num_packing_bins, seed=seed
        )
    else:
        ds = ConcatThenSplitIterDataset(ds, length_struct=length_struct)
    return ds.batch(batch_size, drop_remainder=True)


def _count_packed(batch: dict[str, np.ndarray]) -> tuple[float, float]:
    seg = batch["tokens_segment_ids"]
    return float(np.count_nonzero(seg)), float(seg.size)


def _batches_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


# --------------------------------------------------------------------------- benchmarks


def measure_records(make_iterator, batch_size: int, quick: bool, seconds: float | None) -> dict:
    """Records/s of batches of ``{"x": ...}`` from ``make_iterator()`` (shared by both sides)."""
    warmup_s, window_s, windows = _timing(quick, seconds)
    with PeakRss() as mem:
        it = make_iterator()
        try:
            r = _timed_windows(
                it,
                lambda b: (float(b["x"].shape[0]), 0.0),
                warmup_s=warmup_s,
                window_s=window_s,
                windows=windows,
            )
        finally:
            _close(it)
    return {
        "records_per_s": r["rate_median"],
        "records_per_s_windows": r["rates"],
        "batches_per_s": r["rate_median"] / batch_size,
        "first_batch_s": r["first_element_s"],
        **mem.result,
    }


def measure_packing(make_iterator, seq_len: int, quick: bool, seconds: float | None) -> dict:
    """Real tokens/s and fill of packed batches from ``make_iterator()`` (shared by both sides)."""
    warmup_s, window_s, windows = _timing(quick, seconds)
    with PeakRss() as mem:
        it = make_iterator()
        try:
            r = _timed_windows(
                it, _count_packed, warmup_s=warmup_s, window_s=window_s, windows=windows
            )
        finally:
            _close(it)
    fill = r["units"] / r["aux"] if r["aux"] else float("nan")
    return {
        "tokens_per_s": r["rate_median"],
        "tokens_per_s_windows": r["rates"],
        "fill": fill,
        "rows_per_s": r["rate_median"] / (seq_len * fill) if r["units"] else 0.0,
        "first_batch_s": r["first_element_s"],
        "batches_timed": r["elements"],
        **mem.result,
    }


def map_batch(
    corpus_size: int = 100_000,
    batch_size: int = 128,
    seconds: float | None = None,
    quick: bool = False,
    read_threads: int | None = None,
) -> dict[str, Any]:
    """(a) ``source -> shuffle -> repeat -> map(identity) -> to_iter_dataset -> batch``.

    Records are ``{"x": np.int64(i)}``. Reports ``records_per_s`` (median of windows).
    ``read_threads=None`` keeps Grain's default ReadOptions (16 prefetch threads).
    """
    records = [{"x": np.int64(i)} for i in range(corpus_size)]

    def make_iterator():
        ds = (
            grain.MapDataset.source(records)
            .shuffle(seed=0)
            .repeat()
            .map(_identity)
            .to_iter_dataset(_read_options(read_threads))
            .batch(batch_size, drop_remainder=True)
        )
        return iter(ds)

    return {
        **measure_records(make_iterator, batch_size, quick, seconds),
        "corpus_size": corpus_size,
        "batch_size": batch_size,
        "read_threads": read_threads,
    }


def packing(
    corpus: list[dict[str, np.ndarray]],
    method: str = "first_fit",
    seq_len: int = 2048,
    batch_size: int = 8,
    num_packing_bins: int = 8,
    seconds: float | None = None,
    quick: bool = False,
    seed: int = 0,
    read_threads: int | None = None,
) -> dict[str, Any]:
    """(b) shuffle + repeat + pack + batch; real (non-padding) tokens/s and fill ratio.

    ``fill`` = real tokens / (rows * seq_len) over all timed windows. ``num_packing_bins``
    is ignored by ``method="concat"``.
    """

    def make_iterator():
        return iter(
            build_packing_dataset(
                corpus, method, seq_len, batch_size, num_packing_bins, seed, read_threads
            )
        )

    return {
        **measure_packing(make_iterator, seq_len, quick, seconds),
        "method": method,
        "num_packing_bins": num_packing_bins if method != "concat" else None,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "read_threads": read_threads,
    }


def measure_restore(
    make_iterator, to_blob, from_blob, steps: int, quick: bool
) -> tuple[dict[str, Any], Any]:
    """Runs ``steps`` batches, checkpoints, and times restoring into fresh iterators.

    ``to_blob(state, indent)`` and ``from_blob(blob)`` serialize the state as each
    library's checkpoint does. Returns the figures (shared by both sides) and the state.
    ``restore_s`` is the median of ``make_iterator()`` + ``set_state(from_blob(blob))``
    + the first ``next``; ``fresh_first_batch_s`` the same without ``set_state``;
    ``restore_matches`` checks each restored batch against the original's next one.
    """
    repeats = 3 if quick else 7
    with PeakRss() as mem:
        it = make_iterator()
        t0 = time.perf_counter()
        for _ in range(steps):
            next(it)
        iterate_s = time.perf_counter() - t0

        get_state_times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            state = it.get_state()
            get_state_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        blob = to_blob(state, 4)
        serialize_s = time.perf_counter() - t0
        expected = next(it)
        _close(it)

        restore_times, set_state_times, matches = [], [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            it2 = make_iterator()
            it2.set_state(from_blob(blob))
            t1 = time.perf_counter()
            got = next(it2)
            restore_times.append(time.perf_counter() - t0)
            set_state_times.append(t1 - t0)
            matches.append(_batches_equal(expected, got))
            _close(it2)

        fresh_times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            it3 = make_iterator()
            next(it3)
            fresh_times.append(time.perf_counter() - t0)
            _close(it3)
    figures = {
        "restore_s": statistics.median(restore_times),
        "restore_set_state_s": statistics.median(set_state_times),
        "fresh_first_batch_s": statistics.median(fresh_times),
        "get_state_s": statistics.median(get_state_times),
        "serialize_s": serialize_s,
        "state_bytes": len(blob.encode()),
        "state_bytes_compact": len(to_blob(state, None).encode()),
        "restore_matches": all(matches),
        "iterate_s": iterate_s,
        "steps_per_s": steps / iterate_s if iterate_s > 0 else None,
        "steps": steps,
        **mem.result,
    }
    return figures, state


def _grain_state_json(state: Any, indent: int | None) -> str:
    if indent is None:
        return json.dumps(state, separators=(",", ":"))
    return json.dumps(state, indent=indent)


def restore_cost(
    corpus: list[dict[str, np.ndarray]],
    steps: int = 100,
    method: str = "first_fit",
    num_packing_bins: int = 8,
    seq_len: int = 2048,
    batch_size: int = 1,
    quick: bool = False,
    seed: int = 0,
    read_threads: int | None = None,
) -> dict[str, Any]:
    """(c) Checkpoint after ``steps`` batches and restore into a fresh iterator.

    The state is serialised the way Grain's ``grain.checkpoint.CheckpointHandler``
    does (``json.dumps(state, indent=4)``); ``state_bytes`` is that file's size,
    ``state_bytes_compact`` the size without indentation. ``restore_s`` is the median
    time of ``iter(ds)`` + ``set_state(json.loads(blob))`` + the first ``next``;
    ``fresh_first_batch_s`` is the same without ``set_state`` (pipeline start-up
    floor). ``restore_matches`` checks the restored batch against the original
    iterator's next batch.
    """
    ds = build_packing_dataset(
        corpus, method, seq_len, batch_size, num_packing_bins, seed, read_threads
    )
    figures, state = measure_restore(lambda: iter(ds), _grain_state_json, json.loads, steps, quick)
    return {
        **figures,
        "method": method,
        "num_packing_bins": num_packing_bins if method != "concat" else None,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "state": state,
    }


def mp_throughput(
    corpus: list[dict[str, np.ndarray]],
    num_workers: int = 0,
    method: str = "first_fit",
    num_packing_bins: int = 8,
    seq_len: int = 2048,
    batch_size: int = 8,
    seconds: float | None = None,
    quick: bool = False,
    seed: int = 0,
    read_threads: int | None = None,
) -> dict[str, Any]:
    """(e) The packing pipeline behind ``mp_prefetch(MultiprocessingOptions(w))``.

    ``num_workers=0`` is a no-op in Grain (same as :func:`packing`). Workers are
    spawned processes; each packs its own slice of the shuffled stream, so the output
    differs with ``num_workers``. ``startup_s`` is the time to the first batch
    (process spawn + pickling the corpus included); peak RSS includes the workers.
    """
    _ensure_absl_flags_parsed()
    warmup_s, window_s, windows = _timing(quick, seconds)
    with PeakRss(children=num_workers > 0) as mem:
        ds = build_packing_dataset(
            corpus, method, seq_len, batch_size, num_packing_bins, seed, read_threads
        )
        ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers))
        it = iter(ds)
        try:
            r = _timed_windows(
                it, _count_packed, warmup_s=warmup_s, window_s=window_s, windows=windows
            )
        finally:
            _close(it)
    return {
        "tokens_per_s": r["rate_median"],
        "tokens_per_s_windows": r["rates"],
        "fill": r["units"] / r["aux"] if r["aux"] else float("nan"),
        "startup_s": r["first_element_s"],
        "num_workers": num_workers,
        "method": method,
        "num_packing_bins": num_packing_bins,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "cpu_count": os.cpu_count(),
        **mem.result,
    }
