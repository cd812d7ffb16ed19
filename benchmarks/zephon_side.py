"""The zephon_jax side of the side-by-side benchmark (see ``bench.py``).

Each public function mirrors the function of the same name in
``grain_baselines.py``: same arguments, same corpus, same timing method (its
warm-up and median-of-windows helpers, reused as they are) and the same return
keys, plus a few zephon_jax-only keys (``state_bytes_per_lane``, ``pipeline``).

``read_threads`` is accepted for symmetry and ignored: zephon_jax reads records
in blocks on the calling thread (or in worker processes, see ``num_workers``).
"""

from __future__ import annotations

import base64
import json
import os
import time
from typing import Any

import numpy as np
from grain_baselines import (
    PeakRss,
    _close,
    _count_packed,
    _timed_windows,
    _timing,
    measure_packing,
    measure_records,
    measure_restore,
)

import zephon_jax as zj

DEFAULT_WINDOW = 16  # window_shuffle window of the restore pipeline


def _identity(x: Any) -> Any:
    return x


def build_packing_dataset(
    corpus: list[dict[str, np.ndarray]],
    method: str = "first_fit",
    seq_len: int = 2048,
    batch_size: int = 8,
    num_packing_bins: int | None = 8,
    seed: int = 0,
) -> zj.BatchedDataset:
    """shuffle -> pack -> batch on ``{"tokens"}`` docs (repeats forever, like Grain's)."""
    ds = zj.Dataset.source(corpus).shuffle(seed)
    bins = None if method == "concat" else num_packing_bins
    return ds.pack(seq_len, method=method, num_bins=bins).batch(batch_size)


def build_restore_dataset(
    corpus: list[dict[str, np.ndarray]],
    method: str = "first_fit",
    seq_len: int = 2048,
    batch_size: int = 1,
    num_packing_bins: int | None = 8,
    seed: int = 0,
    window: int = DEFAULT_WINDOW,
) -> zj.BatchedDataset:
    """shuffle -> split -> pack -> window_shuffle -> batch: the restore benchmark pipeline."""
    bins = None if method == "concat" else num_packing_bins
    return (
        zj.Dataset.source(corpus)
        .shuffle(seed)
        .split(seq_len)
        .pack(seq_len, method=method, num_bins=bins)
        .window_shuffle(window, seed + 1)
        .batch(batch_size)
    )


def state_to_json(state: dict[str, Any], indent: int | None = 4) -> str:
    """A loader state as JSON (lane bytes in base64): what a JSON checkpoint would hold."""
    plain = dict(state)
    plain["lanes"] = {k: base64.b64encode(v.tobytes()).decode() for k, v in state["lanes"].items()}
    separators = None if indent else (",", ":")
    return json.dumps(plain, indent=indent, separators=separators)


def state_from_json(blob: str) -> dict[str, Any]:
    plain = json.loads(blob)
    plain["lanes"] = {
        k: np.frombuffer(base64.b64decode(v), dtype=np.uint8) for k, v in plain["lanes"].items()
    }
    return plain


# --------------------------------------------------------------------------- benchmarks


def map_batch(
    corpus_size: int = 100_000,
    batch_size: int = 128,
    seconds: float | None = None,
    quick: bool = False,
    read_threads: int | None = None,
) -> dict[str, Any]:
    """(a) ``source -> shuffle -> map(identity) -> batch`` on records ``{"x": np.int64(i)}``."""
    records = [{"x": np.int64(i)} for i in range(corpus_size)]

    def make_iterator():
        return iter(
            zj.Loader(zj.Dataset.source(records).shuffle(0).map(_identity).batch(batch_size))
        )

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
    num_packing_bins: int | None = 8,
    seconds: float | None = None,
    quick: bool = False,
    seed: int = 0,
    read_threads: int | None = None,
) -> dict[str, Any]:
    """(b) shuffle + pack + batch; real (non-padding) tokens/s and fill.

    ``num_packing_bins`` is the number of open rows per lane (zephon_jax's
    default, ``None``, is 32); ignored by ``method="concat"``.
    """
    ds = build_packing_dataset(corpus, method, seq_len, batch_size, num_packing_bins, seed)
    return {
        **measure_packing(lambda: iter(zj.Loader(ds)), seq_len, quick, seconds),
        "method": method,
        "num_packing_bins": num_packing_bins if method != "concat" else None,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "read_threads": read_threads,
        "pipeline": repr(ds),
    }


def restore_cost(
    corpus: list[dict[str, np.ndarray]],
    steps: int = 100,
    method: str = "first_fit",
    num_packing_bins: int | None = 8,
    seq_len: int = 2048,
    batch_size: int = 1,
    quick: bool = False,
    seed: int = 0,
    read_threads: int | None = None,
) -> dict[str, Any]:
    """(c) Checkpoint after ``steps`` batches and restore into a fresh iterator.

    The pipeline adds ``split(seq_len)`` before and ``window_shuffle`` after the
    packer (Grain's has neither). The state goes through JSON like Grain's
    (lane bytes base64-encoded); ``state_bytes`` is that JSON's size with
    ``indent=4``, ``state_bytes_per_lane`` the encoded lane states' bytes per
    lane (no fingerprint). ``restore_s`` is the median of ``iter(loader)`` +
    ``set_state(decoded)`` + the first ``next``.
    """
    ds = build_restore_dataset(corpus, method, seq_len, batch_size, num_packing_bins, seed)
    loader = zj.Loader(ds)
    figures, state = measure_restore(
        lambda: iter(loader), state_to_json, state_from_json, steps, quick
    )
    lane_bytes = [len(v) for v in state["lanes"].values()]
    return {
        **figures,
        "state_bytes_per_lane": sum(lane_bytes) / len(lane_bytes),
        "num_lanes": len(lane_bytes),
        "method": method,
        "num_packing_bins": num_packing_bins if method != "concat" else None,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "pipeline": repr(ds),
        "state": json.loads(state_to_json(state, indent=None)),
    }


def mp_throughput(
    corpus: list[dict[str, np.ndarray]],
    num_workers: int = 0,
    method: str = "first_fit",
    num_packing_bins: int | None = 8,
    seq_len: int = 2048,
    batch_size: int = 8,
    seconds: float | None = None,
    quick: bool = False,
    seed: int = 0,
    read_threads: int | None = None,
) -> dict[str, Any]:
    """(e) The packing pipeline with ``Loader(num_workers=w)``.

    Workers split the lanes, so the output is the same for every ``w``.
    ``startup_s`` is the time to the first batch (process start and pickling
    the corpus included); peak RSS includes the workers.
    """
    warmup_s, window_s, windows = _timing(quick, seconds)
    with PeakRss(children=num_workers > 0) as mem:
        ds = build_packing_dataset(corpus, method, seq_len, batch_size, num_packing_bins, seed)
        t0 = time.perf_counter()
        it = iter(zj.Loader(ds, num_workers=num_workers))
        construct_s = time.perf_counter() - t0
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
        "startup_s": construct_s + r["first_element_s"],
        "num_workers": num_workers,
        "method": method,
        "num_packing_bins": num_packing_bins,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "cpu_count": os.cpu_count(),
        **mem.result,
    }


# --------------------------------------------------------------------------- workers


def python_heavy_map(record: dict[str, Any]) -> dict[str, Any]:
    """A map spending ~10-20 us in pure Python per record (tokenizer-like work)."""
    acc = 0
    for i in range(200):
        acc = (acc * 31 + i) & 0xFFFF
    return {"x": record["x"] + (acc & 1)}


def _threaded_batches(ds: zj.BatchedDataset, num_threads: int):
    """Batches from ``num_threads`` threads, each running a RowProducer over a block of lanes.

    Not a loader feature: the measurement that compares threads with processes.
    """
    from concurrent.futures import ThreadPoolExecutor

    from zephon_jax.rows import RowProducer

    per_lane = ds.rows_per_lane
    blocks = np.array_split(np.arange(ds.num_lanes), num_threads)
    producers = [
        RowProducer(ds, [r for lane in b for r in range(lane * per_lane, (lane + 1) * per_lane)])
        for b in blocks
    ]
    with ThreadPoolExecutor(num_threads) as pool:
        while True:
            parts = list(pool.map(lambda p: p.next_batch(), producers))
            yield {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def worker_scaling(
    num_workers: int = 0,
    mode: str = "processes",
    pipeline: str = "map",
    corpus: list[dict[str, np.ndarray]] | None = None,
    batch_size: int = 64,
    seconds: float | None = None,
    quick: bool = False,
) -> dict[str, Any]:
    """Throughput with ``num_workers`` processes (``Loader``) or threads, per pipeline.

    ``pipeline="map"``: ``python_heavy_map`` + batch (records/s);
    ``pipeline="pack"``: first_fit packing of ``corpus`` (real tokens/s).
    """
    warmup_s, window_s, windows = _timing(quick, seconds)
    if pipeline == "map":
        records = [{"x": np.int64(i)} for i in range(100_000)]
        ds = zj.Dataset.source(records).shuffle(0).map(python_heavy_map).batch(batch_size)
        count = lambda b: (float(b["x"].shape[0]), 0.0)  # noqa: E731
    else:
        ds = build_packing_dataset(corpus, "first_fit", 2048, 8, 8, 0)
        count = _count_packed
    t0 = time.perf_counter()
    if mode == "threads" and num_workers > 0:
        it = _threaded_batches(ds, num_workers)
    else:
        it = iter(zj.Loader(ds, num_workers=num_workers))
    construct_s = time.perf_counter() - t0
    try:
        r = _timed_windows(it, count, warmup_s=warmup_s, window_s=window_s, windows=windows)
    finally:
        _close(it)
    return {
        "rate": r["rate_median"],
        "startup_s": construct_s + r["first_element_s"],
        "num_workers": num_workers,
        "mode": mode,
        "pipeline": pipeline,
    }


def main() -> None:
    """Worker scaling (processes vs threads) for a Python-heavy map and for packing."""
    import argparse

    import corpus as corpus_mod

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    docs = corpus_mod.make_corpus(2048 if args.quick else 8192, max_len=2048, seed=0)
    print(f"cpus: {os.cpu_count()}")
    print(f"{'pipeline':<8} {'mode':<10} {'workers':>7} {'rate':>14} {'startup':>9}")
    for pipeline, unit in (("map", "records/s"), ("pack", "tokens/s")):
        for mode, counts in (("processes", (0, 1, 2)), ("threads", (2,))):
            for w in counts:
                r = worker_scaling(w, mode, pipeline, docs, quick=args.quick)
                print(
                    f"{pipeline:<8} {mode:<10} {w:>7} {r['rate'] / 1e6:>8.3f} M {unit:<9}"
                    f" {r['startup_s'] * 1e3:>7.0f} ms"
                )


if __name__ == "__main__":
    main()
