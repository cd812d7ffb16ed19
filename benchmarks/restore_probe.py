"""Restore time in a fresh process: what a resumed job pays before its first batch.

    python benchmarks/restore_probe.py --state STATE --source list --num-docs 20000 \\
        --lanes 1024 --batch-size 1024

Imports the modules (numba too, when installed and not turned off) and makes the
synthetic corpus, untimed; then times building the pipeline, ``load_state`` of the
state file, ``set_state`` on a fresh iterator and its first batch (compiling the
kernels or loading them from numba's cache is part of it). Prints one JSON line:
the seconds and a digest of the batch, which the caller compares with the
uninterrupted run's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import corpus as corpus_mod  # noqa: E402
import numpy as np  # noqa: E402
import zephon_side  # noqa: E402

import zephon_jax as zj  # noqa: E402
from zephon_jax.sources import TokenArray  # noqa: E402

SEQ_LEN = 2048


def batch_digest(batch: dict[str, np.ndarray]) -> str:
    """SHA-256 over every field's name, dtype, shape and bytes (fields in name order)."""
    h = hashlib.sha256()
    for key in sorted(batch):
        a = np.ascontiguousarray(batch[key])
        h.update(f"{key}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _import_numba() -> None:
    if os.environ.get("ZEPHON_JAX_COMPILED") == "0":
        return
    try:
        import numba  # noqa: F401
    except ImportError:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", required=True, help="a state file written by save_state")
    parser.add_argument("--source", choices=("list", "token_array"), required=True)
    parser.add_argument("--num-docs", type=int, required=True)
    parser.add_argument("--lanes", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    args = parser.parse_args(argv)
    _import_numba()
    docs = corpus_mod.make_lognormal_corpus(args.num_docs, seed=0)
    source = TokenArray.from_documents(docs) if args.source == "token_array" else docs
    t0 = time.perf_counter()
    ds = zephon_side.packing(source, SEQ_LEN, args.batch_size, num_lanes=args.lanes)
    state = zj.load_state(args.state)
    it = iter(zj.Loader(ds))
    it.set_state(state)
    batch = next(it)
    seconds = time.perf_counter() - t0
    print(json.dumps({"restore_s": seconds, "digest": batch_digest(batch)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
