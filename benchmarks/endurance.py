"""Endurance: a long run of a small packing pipeline keeps flat memory and leaks nothing.

    python benchmarks/endurance.py --steps 100000 --every 1000 --json /tmp/endurance.json
    python benchmarks/endurance.py --pipeline llm --steps 200000 --checkpoint-every 1000

Runs ``--steps`` global batches of shuffle -> map -> split -> pack(best_fit) ->
window_shuffle, or with ``--pipeline llm`` the documented LLM pipeline (two
``TokenStore`` sources mixed by tokens -> shuffle -> split -> pack ->
to_training), with loader workers when ``zephon_jax.workers.producer`` is available, and
samples, every ``--every`` steps: resident memory of the loader process and
its workers (without the pages of memory-mapped files, ``RssFile``: a plain local
TokenStore's shard files, page cache the kernel may drop; they are sampled
apart), thread count, open file descriptors, child processes, the loader's
shared-memory segments in ``/dev/shm``, the size of ``get_state()`` and of the
cache folders a run writes (numba's cache and the checkpoint directory). With
``--checkpoint-every K`` an Orbax ``CheckpointManager`` (two kept) saves the
loader every ``K`` steps. After ``close()`` it checks that threads,
descriptors, processes and segments are back to what they were before the
loader started.

Asserts (exit status 1 and a list of failures otherwise):

* memory growth between the end of warm-up and the end of the run is below
  ``--max-growth-mb``;
* thread, descriptor, process and segment counts are constant after warm-up and
  back to their baseline after ``close()``;
* the state size stays within its bound: at most ``--max-state-growth`` times
  the largest size seen during warm-up (open bins hold a varying number of
  record pointers, so the size varies within a bound, never with steps).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import sys
import threading
import time

import numpy as np

import zephon_jax as zj

HAS_WORKERS = importlib.util.find_spec("zephon_jax.workers.producer") is not None


def add_one(record):
    return {"tokens": record["tokens"] + 1}


def make_pipeline(batch: int, seq_len: int, num_docs: int) -> zj.BatchedDataset:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 2 * seq_len, size=num_docs)
    docs = [{"tokens": rng.integers(1, 32000, size=int(n)).astype(np.int32)} for n in lengths]
    return (
        zj.Dataset.source(docs)
        .shuffle(1)
        .map(add_one)
        .split(seq_len)
        .pack(seq_len, method="best_fit", num_bins=8)
        .window_shuffle(16, seed=2)
        .batch(batch)
    )


def make_llm_pipeline(batch: int, seq_len: int, num_docs: int, folder: str) -> zj.BatchedDataset:
    """Two TokenStores (long web-like and short chat-like documents) mixed by tokens."""
    from zephon_jax.sources import write_token_store

    rng = np.random.default_rng(0)
    stores = []
    for name, longest in (("web", 4 * seq_len), ("chat", seq_len // 2)):
        lengths = rng.integers(1, longest, size=num_docs)
        docs = [rng.integers(2, 32000, size=int(n)).astype(np.int32) for n in lengths]
        stores.append(write_token_store(os.path.join(folder, name), docs, dtype="int32"))
    web, chat = (zj.Dataset.source(s) for s in stores)
    return (
        zj.Dataset.mix([web, chat], [0.7, 0.3], unit="tokens")
        .shuffle(seed=0)
        .split(seq_len)
        .pack(seq_len)
        .to_training()
        .batch(batch)
    )


def folder_bytes(path: str | None) -> int:
    """Bytes of the files under ``path`` (0 when it does not exist)."""
    total = 0
    if path and os.path.isdir(path):
        for root, _, files in os.walk(path):
            for name in files:
                try:
                    total += os.path.getsize(os.path.join(root, name))
                except FileNotFoundError:  # removed by a concurrent cleanup
                    pass
    return total


def numba_cache_folder() -> str | None:
    """Where numba caches the compiled kernels of this install (its __pycache__)."""
    import zephon_jax.core.kernels

    return os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
        os.path.dirname(zephon_jax.core.kernels.__file__), "__pycache__"
    )


# ----- process metrics from /proc (Linux) ---------------------------------------------------
def _status_mb(pid: int) -> dict[str, float]:
    try:
        with open(f"/proc/{pid}/status") as f:
            rows = [line.split() for line in f]
    except FileNotFoundError:
        return {}
    return {row[0].rstrip(":"): int(row[1]) / 1024 for row in rows if row[-1:] == ["kB"]}


def rss_mb(pid: int) -> float:
    """Resident memory without file-backed pages (mapped files), in MB."""
    status = _status_mb(pid)
    return status.get("VmRSS", 0.0) - status.get("RssFile", 0.0)


def file_rss_mb(pid: int) -> float:
    """Resident pages of memory-mapped files (a plain TokenStore's shards), in MB."""
    return _status_mb(pid).get("RssFile", 0.0)


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _children_of(pid: int) -> list[int]:
    children = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:  # (it ended meanwhile)
        return []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children += [int(c) for c in f.read().split()]
        except FileNotFoundError:
            pass
    return children


def child_pids() -> list[int]:
    """This process's descendants: its children and theirs (loader workers forked from
    the fork server are the server's children)."""
    found, todo = [], _children_of(os.getpid())
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += _children_of(pid)
    return sorted(found)


def shm_entries(prefix: str) -> int:
    try:
        return sum(1 for name in os.listdir("/dev/shm") if name.startswith(prefix))
    except FileNotFoundError:
        return 0


def shm_mappings() -> int:
    """Shared-memory segments mapped into this process (named or already unlinked)."""
    with open("/proc/self/maps") as f:
        return len(
            {
                line.split()[-2] if line.rstrip().endswith("(deleted)") else line.split()[-1]
                for line in f
                if "/dev/shm/" in line
            }
        )


def state_bytes(state: dict) -> int:
    return sum(len(v) for v in state["lanes"].values())


def leak_counts(prefix: str) -> dict:
    return {
        "threads": thread_count(),
        "fds": open_fds(),
        "children": len(child_pids()),
        "shm": shm_entries(prefix),
        "shm_maps": shm_mappings(),
    }


# ----- the run ---------------------------------------------------------------------------
def sample(step: int, it, prefix: str, started: float, folders: dict) -> dict:
    children = child_pids()
    return {
        "step": step,
        "seconds": round(time.perf_counter() - started, 3),
        "rss_mb": round(rss_mb(os.getpid()), 2),
        "worker_rss_mb": round(sum(rss_mb(c) for c in children), 2),
        "file_rss_mb": round(file_rss_mb(os.getpid()) + sum(file_rss_mb(c) for c in children), 2),
        "threads": thread_count(),
        "python_threads": threading.active_count(),
        "fds": open_fds(),
        "children": len(children),
        "shm": shm_entries(prefix),
        "shm_maps": shm_mappings(),
        "state_bytes": state_bytes(it.get_state()),
        **{f"{name}_bytes": folder_bytes(path) for name, path in folders.items()},
    }


def run(args) -> dict:
    import tempfile

    work = tempfile.mkdtemp(prefix="zj-endurance-")
    if args.pipeline == "llm":
        ds = make_llm_pipeline(args.batch, args.seq_len, args.num_docs, work)
    else:
        ds = make_pipeline(args.batch, args.seq_len, args.num_docs)
    folders = {"numba_cache": numba_cache_folder(), "checkpoints": os.path.join(work, "ckpt")}
    prefix = f"zj{os.getpid():x}"  # the workers' segment names start with it
    if args.workers:
        # multiprocessing's resource tracker and the workers' fork server are one process
        # each per interpreter, started on first use and kept until exit by design: start
        # them before the baseline.
        from multiprocessing import forkserver, resource_tracker

        from zephon_jax.workers.producer import DEFAULT_START_METHOD, worker_context

        resource_tracker.ensure_running()
        if DEFAULT_START_METHOD == "forkserver":
            worker_context(DEFAULT_START_METHOD)  # (the server loads the package first)
            forkserver.ensure_running()
    # Orbax and TensorStore keep threads and descriptors of their own from the first
    # manager on: make it before the baseline, so only the loader's are counted.
    manager = checkpoint_manager(folders["checkpoints"]) if args.checkpoint_every else None
    gc.collect()
    baseline = leak_counts(prefix)
    kwargs = {"num_workers": args.workers} if args.workers else {}
    it = iter(zj.Loader(ds, **kwargs))
    started = time.perf_counter()
    samples = [sample(0, it, prefix, started, folders)]
    tokens = 0
    real = "loss_mask" if args.pipeline == "llm" else "tokens_segment_ids"
    for step in range(1, args.steps + 1):
        batch = next(it)
        tokens += int(np.count_nonzero(batch[real]))
        if manager is not None and step % args.checkpoint_every == 0:
            save(manager, step, it)
        if step % args.every == 0 or step == args.steps:
            if manager is not None:
                manager.wait_until_finished()  # sample between saves, not during one
            samples.append(sample(step, it, prefix, started, folders))
            if args.verbose:
                print(json.dumps(samples[-1]), flush=True)
    elapsed = time.perf_counter() - started
    if manager is not None:
        manager.wait_until_finished()
        manager.close()
    close = getattr(it, "close", None)
    if close is not None:
        close()
    del it
    gc.collect()
    time.sleep(0.5)  # let exiting workers be reaped
    after = leak_counts(prefix)
    return {
        "config": vars(args),
        "elapsed_s": round(elapsed, 2),
        "steps_per_s": round(args.steps / elapsed, 1),
        "real_tokens_per_s": round(tokens / elapsed),
        "baseline": baseline,
        "after_close": after,
        "samples": samples,
    }


def checkpoint_manager(path: str):
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(max_to_keep=2)
    return ocp.CheckpointManager(path, options=options)


def save(manager, step: int, it) -> None:
    import orbax.checkpoint as ocp

    import zephon_jax.checkpoint as zc

    manager.save(step, args=ocp.args.Composite(data=zc.Save(it)))


def check(result: dict, args) -> list[str]:
    """The failed assertions, as sentences."""
    samples = result["samples"]
    warm = [s for s in samples if s["step"] <= args.warmup]
    rest = [s for s in samples if s["step"] >= args.warmup]
    failures = []
    if not warm or not rest:
        return [f"no samples around the warm-up of {args.warmup} steps"]
    start, end = rest[0], rest[-1]
    growth = (end["rss_mb"] + end["worker_rss_mb"]) - (start["rss_mb"] + start["worker_rss_mb"])
    result["rss_growth_mb"] = round(growth, 2)
    if growth > args.max_growth_mb:
        failures.append(
            f"memory grew by {growth:.1f} MB after warm-up (bound {args.max_growth_mb})"
        )
    for key in ("numba_cache_bytes", "checkpoints_bytes"):
        sizes = [s[key] for s in rest]
        if max(sizes) > 2 * max(1, sizes[0]) + 65536:
            failures.append(f"{key} grew after warm-up: {sizes[0]} -> {max(sizes)}")
    for key in ("threads", "fds", "children", "shm", "shm_maps"):
        values = sorted({s[key] for s in rest})
        if args.checkpoint_every and key in ("threads", "fds"):
            # Orbax's and TensorStore's pools start and end threads around saves: what
            # must not happen is growth, so the last quarter may not exceed the first.
            quarter = max(1, len(rest) // 4)
            early = max(s[key] for s in rest[:quarter])
            late = max(s[key] for s in rest[-quarter:])
            if late > early:
                failures.append(f"{key} grew after warm-up: {early} -> {late} ({values})")
        elif len(values) > 1:
            failures.append(f"{key} changed after warm-up: {values}")
        if result["after_close"][key] > result["baseline"][key]:
            failures.append(
                f"{key}: {result['after_close'][key]} after close, {result['baseline'][key]} before"
            )
    warm_max = max(s["state_bytes"] for s in warm)
    sizes = [s["state_bytes"] for s in rest]
    result["state_bytes"] = {"warmup_max": warm_max, "min": min(sizes), "max": max(sizes)}
    if max(sizes) > args.max_state_growth * warm_max:
        failures.append(
            f"state size reached {max(sizes)} bytes after warm-up, above "
            f"{args.max_state_growth} x {warm_max}"
        )
    return failures


def summary(result: dict) -> str:
    samples = result["samples"]
    first, last = samples[1] if len(samples) > 1 else samples[0], samples[-1]
    return "\n".join(
        [
            f"steps: {result['config']['steps']} in {result['elapsed_s']} s "
            f"({result['steps_per_s']} steps/s, {result['real_tokens_per_s']} real tokens/s), "
            f"workers: {result['config']['workers']}",
            f"rss (loader + workers): {first['rss_mb'] + first['worker_rss_mb']:.1f} MB at step "
            f"{first['step']}, {last['rss_mb'] + last['worker_rss_mb']:.1f} MB at step "
            f"{last['step']}; growth after warm-up {result.get('rss_growth_mb')} MB; mapped "
            f"file pages {first['file_rss_mb']:.1f} -> {last['file_rss_mb']:.1f} MB",
            f"threads {last['threads']}, fds {last['fds']}, children {last['children']}, "
            f"shm {last['shm']}, shm mappings {last['shm_maps']} (during); after close: {result['after_close']} "
            f"(baseline {result['baseline']})",
            f"state bytes: {result.get('state_bytes')}",
            f"numba cache: {first['numba_cache_bytes']} -> {last['numba_cache_bytes']} bytes; "
            f"checkpoints: {first['checkpoints_bytes']} -> {last['checkpoints_bytes']} bytes",
        ]
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pipeline", choices=("packing", "llm"), default="packing")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument(
        "--checkpoint-every", type=int, default=0, help="save with Orbax every K steps (0: never)"
    )
    parser.add_argument("--every", type=int, default=1000, help="sample every K steps")
    parser.add_argument("--warmup", type=int, default=None, help="default: 10%% of --steps")
    parser.add_argument("--workers", type=int, default=2 if HAS_WORKERS else 0)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--num-docs", type=int, default=5000)
    parser.add_argument("--max-growth-mb", type=float, default=32.0)
    parser.add_argument("--max-state-growth", type=float, default=1.5)
    parser.add_argument("--json", default=None, help="write the samples and summary here")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.warmup is None:
        args.warmup = max(args.every, args.steps // 10 // args.every * args.every)
    result = run(args)
    failures = check(result, args)
    result["failures"] = failures
    print(summary(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("OK: flat memory, no leaked threads, processes, shared memory or descriptors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
