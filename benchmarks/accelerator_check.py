"""Exact global batches on this process's accelerators, and what delivering them costs.

Runs on whatever devices jax finds (GPUs, TPUs, or the CPU). A packing pipeline
(lognormal documents, ``shuffle -> split -> pack -> batch``) is read by an
unsharded loader as the reference; then, with ``Loader(sharding=...)`` over a
mesh of every device:

* every batch, with device prefetch 0 and 2 and with 2 loader workers, is a
  global ``jax.Array`` on those devices whose bytes equal the reference's;
* a state taken part-way (with prefetch running ahead) resumes on a new iterator
  with the reference's batches;
* tokens per second handed over as numpy batches and as device arrays (each
  batch waited for on the device), in interleaved windows (medians).

Prints a summary and exits 1 if any batch differs. ``--json PATH`` writes the
figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import corpus as corpus_mod  # noqa: E402
import measure  # noqa: E402

import zephon_jax as zj  # noqa: E402


def _pipeline(docs: list, seq_len: int, batch_size: int) -> zj.BatchedDataset:
    return zj.Dataset.source(docs).shuffle(0).split(seq_len).pack(seq_len).batch(batch_size)


def _host(batch: dict[str, Any]) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in batch.items()}


def _same(got: dict[str, Any], want: dict[str, np.ndarray]) -> bool:
    host = _host(got)
    return sorted(host) == sorted(want) and all(
        host[k].dtype == want[k].dtype
        and host[k].shape == want[k].shape
        and host[k].tobytes() == want[k].tobytes()
        for k in want
    )


def _on_devices(batch: dict[str, Any], sharding: Any) -> bool:
    import jax

    return all(isinstance(v, jax.Array) and v.sharding == sharding for v in batch.values())


def _count_slots(batch: dict[str, Any]) -> tuple[float, float]:
    """Token slots of a batch, after it has arrived where it lives."""
    import jax

    tokens = batch["tokens"]
    jax.block_until_ready(tokens)
    return float(tokens.size), float(tokens.size)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small corpus, short windows")
    parser.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    args = parser.parse_args(argv)

    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = jax.devices()
    seq_len = 512 if args.quick else 2048
    batch_size = 8 * len(devices) if args.quick else 64 * len(devices)
    steps = 12 if args.quick else 40
    docs = corpus_mod.make_lognormal_corpus(2000 if args.quick else 20_000, seed=0)
    ds = _pipeline(docs, seq_len, batch_size)
    sharding = NamedSharding(Mesh(np.array(devices), ("data",)), PartitionSpec("data"))
    print(
        f"devices: {len(devices)} x {devices[0].device_kind} ({devices[0].platform}); "
        f"cpus {os.cpu_count()}; batch {batch_size} x {seq_len}; jax {jax.__version__}"
    )

    it = iter(zj.Loader(ds))
    want = [next(it) for _ in range(steps)]
    checks: dict[str, bool] = {}
    for name, kwargs in {
        "prefetch 0": {"device_prefetch": 0},
        "prefetch 2": {"device_prefetch": 2},
        "prefetch 2, 2 workers": {"device_prefetch": 2, "num_workers": 2},
    }.items():
        it = iter(zj.Loader(ds, sharding=sharding, **kwargs))
        got = [next(it) for _ in range(steps)]
        it.close()
        checks[name] = all(_on_devices(g, sharding) and _same(g, w) for g, w in zip(got, want))
    # A state taken while prefetch runs ahead describes the batches handed out.
    cut = steps // 2
    it = iter(zj.Loader(ds, sharding=sharding, device_prefetch=2))
    for _ in range(cut):
        next(it)
    state = it.get_state()
    it.close()
    it = iter(zj.Loader(ds, sharding=sharding, device_prefetch=2))
    it.set_state(state)
    resumed = [next(it) for _ in range(steps - cut)]
    it.close()
    checks[f"resume at step {cut}"] = all(_same(g, w) for g, w in zip(resumed, want[cut:]))

    timing = measure.QUICK if args.quick else measure.FULL
    sides = [
        measure.Side("numpy batches", iter(zj.Loader(ds)), _count_slots),
        measure.Side(
            "device arrays, prefetch 2",
            iter(zj.Loader(ds, sharding=sharding, device_prefetch=2)),
            _count_slots,
        ),
    ]
    t0 = time.perf_counter()
    rates = measure.interleave(sides, timing)
    for side in sides:
        measure.close(side.iterator)
    numpy_rate = rates["numpy batches"]["rate_median"]
    device_rate = rates["device arrays, prefetch 2"]["rate_median"]

    for name, ok in checks.items():
        print(f"  {name:<24} {'exact' if ok else 'DIFFERENT'}")
    print(
        f"  token slots/s: numpy {numpy_rate / 1e6:.1f} M, on devices {device_rate / 1e6:.1f} M "
        f"({device_rate / numpy_rate:.2f}x; medians of {timing.repeats} interleaved windows, "
        f"{time.perf_counter() - t0:.0f} s)"
    )
    if args.json:
        figures = {
            "devices": [str(d) for d in devices],
            "platform": devices[0].platform,
            "cpu_count": os.cpu_count(),
            "batch_size": batch_size,
            "seq_len": seq_len,
            "checks": checks,
            "rates": rates,
            "device_vs_numpy": device_rate / numpy_rate,
        }
        Path(args.json).write_text(json.dumps(figures, indent=1, default=float))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
