"""``zephon-jax demo``: the guarantee, shown on the built-in corpus in about a minute.

The pipeline mixes the two parts of the built-in corpus (standard-library
modules and their tests, byte-level tokens), shuffles, splits documents into
pieces of ``seq_len`` and packs them first-fit into rows of ``seq_len``. Then:

1. a fresh process with 8 simulated devices loads global ``jax.Array`` batches
   through a ``NamedSharding`` and saves the loader with Orbax after
   ``resume_at`` steps (and keeps going, uninterrupted, as the reference);
2. fresh processes with 4 and with 2 devices restore that checkpoint and
   continue;
3. beside it, the standard per-host Grain pipeline (shard the sources by host,
   then pack per host with ``FirstFitPackIterDataset``, as MaxText does) runs on
   the hosts those device counts make (``devices_per_host`` devices each);

and a table shows a fingerprint of every global batch (the first 8 hex digits
of the SHA-256 of all its fields): zephon_jax's are identical on every
topology and across the resume; Grain's change with the host count.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Sequence, TextIO

import numpy as np

import zephon_jax as zj
from zephon_jax.errors import ZephonError
from zephon_jax.tools.arguments import positive

COMMAND_HELP = "the guarantee on the built-in corpus, on 8, 4 and 2 simulated devices"
COMMAND_DESCRIPTION = """\
Runs a mixture -> shuffle -> split -> first-fit pack pipeline over the built-in
corpus (the Python standard library's sources, byte-level tokens; prepared once
into a cache) on 8 simulated devices, checkpoints it with Orbax, restores it in
fresh processes on 4 and on 2 devices, and prints a fingerprint of every global
batch: identical everywhere. Beside it, the standard per-host Grain pipeline
(shard by host, then pack per host, as MaxText does) shows where its batches
diverge. Ends with throughput. Exit status 0 if zephon_jax's batches all match."""


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """The demo's pipeline and topologies."""

    steps: int = 16
    resume_at: int = 6
    global_batch_size: int = 16
    seq_len: int = 1024
    num_bins: int = 8
    weights: tuple[float, float] = (0.7, 0.3)
    seed: int = 0
    devices: tuple[int, ...] = (8, 4, 2)
    devices_per_host: int = 2
    max_files: int | None = None
    cache_dir: str | None = None
    throughput_steps: int = 200


def corpus_sources(cfg: DemoConfig, stream: TextIO | None = None):
    """(library, tests) TokenStores of the built-in corpus."""
    from zephon_jax.tools.corpus import builtin_corpus

    return tuple(
        builtin_corpus(part, cache_dir=cfg.cache_dir, max_files=cfg.max_files, stream=stream)
        for part in ("library", "tests")
    )


def build_pipeline(cfg: DemoConfig, sources: Sequence[Any]):
    """The demo pipeline: mixture -> shuffle -> split -> first-fit pack -> batch."""
    library, tests = sources
    components = [
        zj.Dataset.source(library, name="library"),
        zj.Dataset.source(tests, name="tests"),
    ]
    mixture = zj.Dataset.mix(components, cfg.weights)
    return (
        mixture.shuffle(cfg.seed)
        .split(cfg.seq_len)
        .pack(cfg.seq_len, method="first_fit", num_bins=cfg.num_bins)
        .batch(cfg.global_batch_size)
    )


def batch_fingerprint(batch: Any) -> str:
    """First 8 hex digits of the SHA-256 of a global batch (all fields, sorted by name)."""
    digest = hashlib.sha256()
    for name in sorted(batch):
        arr = np.ascontiguousarray(np.asarray(batch[name]))
        digest.update(f"{name}:{arr.dtype.str}:{arr.shape};".encode())
        digest.update(arr.tobytes())
    return digest.hexdigest()[:8]


def real_tokens(batch: Any) -> int:
    return int((np.asarray(batch["tokens_segment_ids"]) > 0).sum())


# ----- zephon_jax on simulated devices (runs in a fresh process) -----------------------


def _child(cfg: DemoConfig, mode: str, checkpoint_dir: str) -> dict[str, Any]:
    """One sharded run in this (fresh) process: ``mode`` is ``save`` or ``restore``."""
    import jax
    import orbax.checkpoint as ocp
    from jax.sharding import NamedSharding, PartitionSpec

    from zephon_jax import checkpoint as zjc

    devices = jax.device_count()
    mesh = zj.data_mesh()
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    batched = build_pipeline(cfg, corpus_sources(cfg))
    iterator = iter(zj.Loader(batched, sharding=sharding))
    manager = ocp.CheckpointManager(checkpoint_dir)
    first = 0
    if mode == "restore":
        manager.restore(cfg.resume_at, args=ocp.args.Composite(data=zjc.Restore(iterator)))
        first = cfg.resume_at
    fingerprints, tokens, seconds = [], 0, 0.0
    for step in range(first, cfg.steps):
        t0 = time.perf_counter()
        batch = next(iterator)
        jax.block_until_ready(batch)
        seconds += time.perf_counter() - t0
        shards = {len(a.sharding.device_set) for a in batch.values()}
        assert shards == {devices}, shards
        fingerprints.append(batch_fingerprint(batch))
        tokens += real_tokens(batch)
        if mode == "save" and step + 1 == cfg.resume_at:
            manager.save(cfg.resume_at, args=ocp.args.Composite(data=zjc.Save(iterator)))
            manager.wait_until_finished()
    manager.close()
    close = getattr(iterator, "close", None)
    if close is not None:
        close()
    return {
        "devices": devices,
        "first_step": first,
        "fingerprints": fingerprints,
        "tokens": tokens,
        "seconds": seconds,
    }


def _start_child(cfg: DemoConfig, devices: int, mode: str, checkpoint_dir: str) -> subprocess.Popen:
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "force_host_platform" not in f]
    flags.append(f"--xla_force_host_platform_device_count={devices}")
    env.update(XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu")
    env.setdefault("PYTHONUNBUFFERED", "1")
    payload = json.dumps(dataclasses.asdict(cfg))
    cmd = [*_child_python(), payload, mode, checkpoint_dir]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _child_python() -> list[str]:
    """The command that runs :func:`_child_main` on the arguments after it, importing the
    ``zephon_jax`` this process uses whatever the working directory holds.

    ``python -m`` and ``python -c`` put the working directory first on ``sys.path``, so
    a folder named ``zephon_jax`` there (the clone, seen from its parent) would be
    imported instead; the code below swaps that entry for the folder that holds this
    package (``-P`` would do it from Python 3.11 only).
    """
    root = os.path.dirname(os.path.dirname(os.path.abspath(zj.__file__)))
    code = (
        f"import sys; root = {root!r}; "
        "sys.path[:1] = [] if root in sys.path[1:] else [root]; "
        "from zephon_jax.tools.demo import _child_main; _child_main(sys.argv[1:])"
    )
    return [sys.executable, "-c", code]


def _finish_child(proc: subprocess.Popen, what: str) -> dict[str, Any]:
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"the {what} process failed (exit {proc.returncode}):\n{err[-4000:]}")
    return json.loads(out.strip().splitlines()[-1])


# ----- the standard per-host Grain pipeline --------------------------------------------


def zephon_throughput(cfg: DemoConfig, sources: Sequence[Any], steps: int) -> float:
    """Real tokens per second of the demo pipeline on one process (numpy batches)."""
    iterator = iter(zj.Loader(build_pipeline(cfg, sources)))
    next(iterator)  # warm up: the first batch opens the sources
    tokens, t0 = 0, time.perf_counter()
    for _ in range(steps):
        tokens += real_tokens(next(iterator))
    return tokens / max(time.perf_counter() - t0, 1e-9)


def grain_per_host(
    cfg: DemoConfig, sources: Sequence[Any], hosts: int, steps: int
) -> dict[str, Any]:
    """Global batches of the per-host Grain pipeline on ``hosts`` hosts (concatenated)."""
    import grain

    class Split(grain.experimental.FlatMapTransform):
        max_fan_out = 1 << 20

        def flat_map(self, record):
            t = record["tokens"]
            return [{"tokens": t[i : i + cfg.seq_len]} for i in range(0, len(t), cfg.seq_len)]

    if cfg.global_batch_size % hosts:
        raise ValueError(f"{hosts} hosts cannot split a batch of {cfg.global_batch_size}")
    per_host = cfg.global_batch_size // hosts
    iterators = []
    for host in range(hosts):
        parts = [
            grain.MapDataset.source(src).shuffle(seed=cfg.seed + i)[host::hosts].repeat()
            for i, src in enumerate(sources)
        ]
        ds = grain.MapDataset.mix(parts, weights=list(cfg.weights)).to_iter_dataset()
        ds = grain.experimental.FlatMapIterDataset(ds, Split())
        ds = grain.experimental.FirstFitPackIterDataset(
            ds, length_struct={"tokens": cfg.seq_len}, num_packing_bins=cfg.num_bins
        )
        iterators.append(iter(ds.batch(per_host, drop_remainder=True)))
    fingerprints, tokens = [], 0
    t0 = time.perf_counter()
    for _ in range(steps):
        parts = [next(it) for it in iterators]
        batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        fingerprints.append(batch_fingerprint(batch))
        tokens += real_tokens(batch)
    return {
        "hosts": hosts,
        "fingerprints": fingerprints,
        "tokens": tokens,
        "seconds": time.perf_counter() - t0,
    }


# ----- the demo -----------------------------------------------------------------------


def run_demo(cfg: DemoConfig, stream: TextIO | None = None) -> bool:
    """Runs the demo, prints its table on ``stream`` (default: ``sys.stdout`` at the time of
    the call); returns whether zephon_jax's batches all matched."""
    stream = sys.stdout if stream is None else stream
    if not 0 < cfg.resume_at < cfg.steps:
        raise ValueError(f"resume_at must be in [1, steps); got {cfg.resume_at}, steps={cfg.steps}")
    start = time.perf_counter()
    sources = corpus_sources(cfg, stream=sys.stderr)
    lib, tests = sources
    print(
        f"built-in corpus: {len(lib):,} standard-library modules ({lib.num_tokens / 1e6:.1f}M byte "
        f"tokens) and {len(tests):,} test modules ({tests.num_tokens / 1e6:.1f}M)",
        file=stream,
    )
    print(
        f"pipeline: mix(library {cfg.weights[0]}, tests {cfg.weights[1]}) -> shuffle -> "
        f"split({cfg.seq_len}) -> pack({cfg.seq_len}, first_fit, {cfg.num_bins} bins) -> "
        f"batch({cfg.global_batch_size})",
        file=stream,
    )
    first, *others = cfg.devices
    with tempfile.TemporaryDirectory(prefix="zephon_jax_demo_") as tmp:
        checkpoint_dir = os.path.join(tmp, "checkpoints")
        print(
            f"running on {first} devices, saving with Orbax after step {cfg.resume_at} ...",
            file=stream,
            flush=True,
        )
        reference = _finish_child(
            _start_child(cfg, first, "save", checkpoint_dir), f"{first}-device"
        )
        print(
            f"restoring in fresh processes on {', '.join(map(str, others))} devices; running "
            "the per-host Grain pipeline ...",
            file=stream,
            flush=True,
        )
        children = {d: _start_child(cfg, d, "restore", checkpoint_dir) for d in others}
        hosts = [max(1, d // cfg.devices_per_host) for d in cfg.devices]
        grain_runs = [grain_per_host(cfg, sources, h, cfg.steps) for h in hosts]
        resumed = [_finish_child(children[d], f"{d}-device") for d in others]
    ok = _print_table(cfg, reference, resumed, grain_runs, hosts, stream)
    sharded_rate = reference["tokens"] / max(reference["seconds"], 1e-9)
    zj_rate = zephon_throughput(cfg, sources, cfg.throughput_steps)
    g_run = grain_per_host(cfg, sources, 1, cfg.throughput_steps)
    g_rate = g_run["tokens"] / max(g_run["seconds"], 1e-9)
    print(
        f"throughput over {cfg.throughput_steps} global batches, one process, real (non-padding) "
        f"tokens/s: zephon_jax {zj_rate / 1e6:.2f}M (numpy batches; "
        f"{sharded_rate / 1e6:.2f}M as global jax.Arrays on {first} devices over the "
        f"{cfg.steps} steps above), per-host Grain {g_rate / 1e6:.2f}M on one host",
        file=stream,
    )
    print(f"demo took {time.perf_counter() - start:.0f} s", file=stream)
    return ok


def _print_table(cfg, reference, resumed, grain_runs, hosts, stream) -> bool:
    first, *others = cfg.devices
    zj_cols = [f"{first} dev"] + [f"{d} dev (resumed)" for d in others]
    g_cols = [f"{h} host{'s' if h > 1 else ''}" for h in hosts]
    widths = [max(8, len(c)) for c in zj_cols + g_cols]
    print("", file=stream)
    print(
        f"{'':5}  {'zephon_jax (one global batch per step)':<{sum(widths[: len(zj_cols)]) + 2 * len(zj_cols) - 2}}"
        f"  | per-host Grain (shard by host, then pack; uninterrupted), {cfg.devices_per_host} devices per host",
        file=stream,
    )
    header = "  ".join(c.rjust(w) for c, w in zip(zj_cols, widths))
    gheader = "  ".join(c.rjust(w) for c, w in zip(g_cols, widths[len(zj_cols) :]))
    print(f"{'step':>5}  {header}  | {gheader}", file=stream)
    zj_same, g_same_all = True, True
    ref_g = grain_runs[0]["fingerprints"]
    for step in range(cfg.steps):
        want = reference["fingerprints"][step]
        cells = [want]
        for run in resumed:
            if step < run["first_step"]:
                cells.append("-")
                continue
            got = run["fingerprints"][step - run["first_step"]]
            zj_same &= got == want
            cells.append(got if got == want else f"{got} !=")
        gcells = []
        for k, run in enumerate(grain_runs):
            got = run["fingerprints"][step]
            same = got == ref_g[step]
            g_same_all &= same
            gcells.append(got if k == 0 or same else f"{got} !=")
        row = "  ".join(c.rjust(w) for c, w in zip(cells, widths))
        grow = "  ".join(c.rjust(w) for c, w in zip(gcells, widths[len(zj_cols) :]))
        mark = " <- resume" if step == cfg.resume_at else ""
        print(f"{step:>5}  {row}  | {grow}{mark}", file=stream)
    print(
        "each cell: the first 8 hex digits of the SHA-256 of the whole global batch; '!=' marks "
        "a batch that differs from the first column of its side",
        file=stream,
    )
    if zj_same:
        print(
            f"zephon_jax: every global batch is identical, bit for bit, on {first} devices and "
            f"after restoring the step-{cfg.resume_at} checkpoint on "
            f"{' and '.join(map(str, others))} devices.",
            file=stream,
        )
    else:
        print(
            "zephon_jax: BATCHES DIFFER (see '!='); this is a bug, please report it.", file=stream
        )
    diverged = [
        next((s for s, (a, b) in enumerate(zip(run["fingerprints"], ref_g)) if a != b), None)
        for run in grain_runs[1:]
    ]
    notes = [
        f"{h} host{'s' if h > 1 else ''}: from step {d}" if d is not None else f"{h} hosts: same"
        for h, d in zip(hosts[1:], diverged)
    ]
    print(
        f"per-host Grain: batches change with the host count ({'; '.join(notes)}), and its "
        "checkpoint (one state per process) restores only onto the same number of hosts.",
        file=stream,
    )
    return zj_same


def _child_main(argv: Sequence[str]) -> None:
    payload, mode, checkpoint_dir = argv
    cfg_dict = json.loads(payload)
    cfg_dict["weights"] = tuple(cfg_dict["weights"])
    cfg_dict["devices"] = tuple(cfg_dict["devices"])
    result = _child(DemoConfig(**cfg_dict), mode, checkpoint_dir)
    print(json.dumps(result))


# ----- the command --------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the options of ``zephon-jax demo`` to ``parser`` (read by :func:`run_command`)."""
    parser.add_argument("--steps", type=positive, default=16, help="global batches (default 16)")
    parser.add_argument(
        "--resume-at",
        type=positive,
        default=None,
        help="step after which the checkpoint is taken (default: steps * 3 // 8, at least 1)",
    )
    parser.add_argument("--batch-size", type=positive, default=16, help="global batch size (16)")
    parser.add_argument("--seq-len", type=positive, default=1024, help="packed row length (1024)")
    parser.add_argument(
        "--devices",
        default="8,4,2",
        help="simulated device counts: the first runs and saves, the others restore (8,4,2)",
    )
    parser.add_argument(
        "--devices-per-host",
        type=positive,
        default=2,
        help="devices per simulated Grain host (2: 8 devices = 4 hosts)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a small run: 60 files per corpus part, at most 8 steps, rows of 256",
    )
    parser.add_argument(
        "--cache-dir",
        default=None,
        help="where the built-in corpus is cached ($ZEPHON_JAX_CACHE, else ~/.cache/zephon_jax)",
    )


def config_from_args(args: argparse.Namespace) -> DemoConfig:
    """The DemoConfig of parsed :func:`add_arguments` options; SystemExit naming the option
    for counts that cannot work together."""
    devices = tuple(int(d) for d in args.devices.split(",") if d.strip())
    if len(devices) < 2 or any(d < 1 for d in devices):
        raise SystemExit(
            "zephon-jax demo: --devices needs at least two positive counts, e.g. 8,4,2"
        )
    steps, seq_len, max_files = args.steps, args.seq_len, None
    if args.quick:
        steps, seq_len, max_files = min(steps, 8), min(seq_len, 256), 60
    resume_at = args.resume_at or max(1, steps * 3 // 8)
    if resume_at >= steps:
        raise SystemExit(f"zephon-jax demo: --resume-at must be below --steps ({steps})")
    cfg = DemoConfig(
        steps=steps,
        resume_at=resume_at,
        global_batch_size=args.batch_size,
        seq_len=seq_len,
        devices=devices,
        devices_per_host=args.devices_per_host,
        max_files=max_files,
        cache_dir=args.cache_dir,
        throughput_steps=20 if args.quick else 200,
    )
    for d in devices:
        if args.batch_size % d:
            raise SystemExit(
                f"zephon-jax demo: --batch-size {args.batch_size} is not a multiple of {d} devices"
            )
    return cfg


def run_command(args: argparse.Namespace) -> int:
    """``zephon-jax demo`` on parsed :func:`add_arguments` options: the exit status, 0 if
    zephon_jax's batches all matched, else 1."""
    return 0 if run_demo(config_from_args(args)) else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m zephon_jax.tools.demo [OPTIONS]``: ``zephon-jax demo`` on its own."""
    parser = argparse.ArgumentParser(
        prog="zephon-jax demo",
        description=COMMAND_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_command(args)
    except ZephonError as e:
        print(f"zephon-jax demo: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
