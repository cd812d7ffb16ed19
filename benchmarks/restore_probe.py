"""Restore time in a fresh process: what a resumed job pays before its first batch.

    python benchmarks/restore_probe.py --state STATE --source list --num-docs 20000 \\
        --lanes 1024 --batch-size 1024

Imports the modules (numba too, when installed and not turned off) and makes the
synthetic corpus, untimed; then times building the pipeline, ``load_state`` of the
state file, ``set_state`` on a fresh iterator and its first batch (compiling the
kernels or loading them from numba's cache is part of it). Prints one JSON line:
the seconds and a digest of the batch, which the caller compares with the
uninterrupted run's.

The documented LLM pipeline (``documented_pipelines.llm_zephon``: two TokenStores
mixed by tokens, shuffle, split, pack, to_training, batch) has its own mode, which
times each part apart::

    python benchmarks/restore_probe.py --llm --setup --store-dir DIR --state STATE \
        --lanes 1024 --batch-size 1024 --steps 200     # once: stores, state, digest
    python benchmarks/restore_probe.py --llm --store-dir DIR --state STATE \
        --lanes 1024 --batch-size 1024 --runs 5        # 5 fresh processes

``--setup`` writes the two stores (the log-normal and the uniform corpus of
``--num-docs`` documents each) under ``--store-dir``, runs ``--steps`` batches,
saves the state to ``--state`` and the next batch's digest beside it
(``STATE.digest``). A probe run opens the stores and builds the pipeline
(``build_s``), reads the state (``load_state_s``), restores a fresh iterator
(``set_state_s``) and makes its first batch (``first_batch_s``), and checks the
digest; ``--runs N`` runs N such probes, each in a new interpreter, and prints the
median and range of each part, in wall time and (``*_cpu_s``) in the process's CPU
time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import corpus as corpus_mod  # noqa: E402
import documented_pipelines as documented  # noqa: E402
import numpy as np  # noqa: E402
import zephon_side  # noqa: E402

import zephon_jax as zj  # noqa: E402
from zephon_jax.sources import TokenArray  # noqa: E402
from zephon_jax.sources.token_store import TokenStore  # noqa: E402

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


PARTS = ("build_s", "load_state_s", "set_state_s", "first_batch_s", "restore_s")
# The same parts in the process's CPU time (all its threads), which a shared
# machine's steal and frequency changes disturb less than the wall time.
CPU_PARTS = tuple(part.removesuffix("_s") + "_cpu_s" for part in PARTS)


def _store_paths(store_dir: str) -> list[str]:
    return [os.path.join(store_dir, f"store{i}") for i in range(2)]


def llm_setup(args: argparse.Namespace) -> None:
    """Writes the stores (if absent), runs ``--steps`` batches, saves the state and digest."""
    if not all(os.path.isdir(p) for p in _store_paths(args.store_dir)):
        os.makedirs(args.store_dir, exist_ok=True)
        docs = corpus_mod.make_lognormal_corpus(args.num_docs, seed=0)
        uniform = corpus_mod.make_corpus(args.num_docs, max_len=SEQ_LEN, seed=1)
        documented.write_stores([docs, uniform], args.store_dir)
    stores = [TokenStore(p) for p in _store_paths(args.store_dir)]
    ds = documented.llm_zephon(stores, SEQ_LEN, args.batch_size, num_lanes=args.lanes)
    it = iter(zj.Loader(ds))
    for _ in range(args.steps):
        next(it)
    zj.save_state(it.get_state(), args.state)
    with open(f"{args.state}.digest", "w") as f:
        f.write(batch_digest(next(it)))


def llm_probe(args: argparse.Namespace) -> dict[str, float | str | bool]:
    """One restore of the LLM pipeline, timed part by part (see the module docstring)."""
    marks = [(time.perf_counter(), time.process_time())]
    stores = [TokenStore(p) for p in _store_paths(args.store_dir)]
    ds = documented.llm_zephon(stores, SEQ_LEN, args.batch_size, num_lanes=args.lanes)
    marks.append((time.perf_counter(), time.process_time()))
    state = zj.load_state(args.state)
    marks.append((time.perf_counter(), time.process_time()))
    it = iter(zj.Loader(ds))
    it.set_state(state)
    marks.append((time.perf_counter(), time.process_time()))
    batch = next(it)
    marks.append((time.perf_counter(), time.process_time()))
    digest = batch_digest(batch)
    with open(f"{args.state}.digest") as f:
        exact = f.read().strip() == digest
    out: dict[str, float | str | bool] = {}
    for clock, names in enumerate((PARTS, CPU_PARTS)):
        at = [mark[clock] for mark in marks]
        times = [b - a for a, b in zip(at, at[1:])] + [at[-1] - at[0]]
        out.update(zip(names, times, strict=True))
    return {**out, "digest": digest, "exact": exact}


def llm_runs(args: argparse.Namespace) -> dict[str, object]:
    """``--runs`` probes, each in a new interpreter: median and range of each part."""
    cmd = [sys.executable, os.path.abspath(__file__), "--llm", "--state", args.state]
    cmd += ["--store-dir", args.store_dir, "--lanes", str(args.lanes)]
    cmd += ["--batch-size", str(args.batch_size)]
    runs = []
    for _ in range(args.runs):
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"probe failed ({done.returncode}): {done.stderr[-2000:]}")
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    summary: dict[str, object] = {"runs": len(runs), "exact": all(r["exact"] for r in runs)}
    for part in PARTS + CPU_PARTS:
        xs = [r[part] for r in runs]
        summary[part] = [statistics.median(xs), min(xs), max(xs)]
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", required=True, help="a state file written by save_state")
    parser.add_argument("--source", choices=("list", "token_array"))
    parser.add_argument("--num-docs", type=int, default=20_000)
    parser.add_argument("--lanes", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--llm", action="store_true", help="the documented LLM pipeline")
    parser.add_argument("--store-dir", help="--llm: where the two TokenStores are")
    parser.add_argument("--setup", action="store_true", help="--llm: write stores and state")
    parser.add_argument("--steps", type=int, default=200, help="--llm --setup: batches run")
    parser.add_argument("--runs", type=int, default=0, help="--llm: fresh processes to run")
    args = parser.parse_args(argv)
    _import_numba()
    if args.llm:
        if not args.store_dir:
            parser.error("--llm needs --store-dir")
        if args.setup:
            llm_setup(args)
            return 0
        result = llm_runs(args) if args.runs else llm_probe(args)
        print(json.dumps(result))
        return 0
    if args.source is None:
        parser.error("--source is needed without --llm")
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
