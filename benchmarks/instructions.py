"""Instructions per batch of the documented LLM pipeline, counted by valgrind: a figure
that other work on a shared machine does not disturb.

    python benchmarks/instructions.py --store-dir DIR --lanes 8,1024

Runs the pipeline of ``llm_lanes.py`` (``mix(TokenStores, unit="tokens") -> shuffle ->
split(2048) -> pack(2048) -> to_training -> batch(1024)``) under valgrind's callgrind in
a new process per lane count, with counting off for the start and the ``--warmup``
batches, then on for the next ``--batches`` batches only. Prints, per lane count, the
instructions the process executed per batch (all its threads, Python, numpy and the
compiled kernels alike) and the ratio to the fewest lanes.

Instructions are not time: a cache miss costs no instruction, and with many lanes the
lanes' state is cold more often, so the rate ratio of ``llm_lanes.py`` is lower than
the inverse of this one. But the count repeats within about 1 % from run to run where
the rate varies by 10-20 % on a shared machine, so it shows a change in the work per
batch (Python calls, numpy calls, kernel loops) that timings cannot resolve. Needs
valgrind (``apt-get install valgrind``); ``--setup`` writes the stores first.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import llm_lanes  # noqa: E402

_POLL_S = 0.2  # how often the probe and the driver look for each other's signal files


def _wait_for(path: str, process: subprocess.Popen | None = None) -> None:
    """Returns once ``path`` exists; raises if ``process`` ended first."""
    while not os.path.exists(path):
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the probe ended (exit status {process.returncode}) first")
        time.sleep(_POLL_S)


def probe(store_dir: str, lanes: int, warmup: int, batches: int, signals: str) -> None:
    """Runs under callgrind: makes ``warmup`` batches, says it is ready (file ``ready``,
    holding its process id) and waits for ``go`` (counting is then on), makes
    ``batches`` batches, says ``done`` and waits for ``exit``. Sleeping between
    looks keeps the process running code, so callgrind takes the driver's commands."""
    it = iter(llm_lanes.loader(store_dir, lanes))
    for _ in range(warmup):
        next(it)
    with open(os.path.join(signals, "ready"), "w") as f:
        f.write(str(os.getpid()))
    _wait_for(os.path.join(signals, "go"))
    for _ in range(batches):
        next(it)
    open(os.path.join(signals, "done"), "w").close()
    _wait_for(os.path.join(signals, "exit"))


def _control(command: str, pid: str) -> None:
    subprocess.run(["callgrind_control", command, pid], check=True, capture_output=True)


def count(store_dir: str, lanes: int, warmup: int, batches: int) -> int:
    """The instructions of ``batches`` batches after ``warmup``, in a new process under
    callgrind (see the module docstring)."""
    with tempfile.TemporaryDirectory() as signals:
        out = os.path.join(signals, "callgrind.out")
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
        cmd += [f"--callgrind-out-file={out}", sys.executable, os.path.abspath(__file__)]
        cmd += ["--store-dir", store_dir, "--probe", str(lanes), "--signals", signals]
        cmd += ["--warmup", str(warmup), "--batches", str(batches)]
        process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            _wait_for(os.path.join(signals, "ready"), process)
            with open(os.path.join(signals, "ready")) as f:
                pid = f.read().strip()
            _control("--instr=on", pid)
            open(os.path.join(signals, "go"), "w").close()
            _wait_for(os.path.join(signals, "done"), process)
            _control("--dump", pid)  # (written to out.1: the counted batches only)
            _control("--instr=off", pid)
            open(os.path.join(signals, "exit"), "w").close()
            process.wait()
        finally:
            if process.poll() is None:
                process.kill()
        return _totals(out + ".1")


def _totals(path: str) -> int:
    """The instruction total of a callgrind dump."""
    with open(path) as f:
        for line in f:
            if line.startswith("totals:"):
                return int(line.split()[1])
    raise ValueError(f"{path} has no totals line")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store-dir", required=True)
    parser.add_argument("--lanes", default="8,1024", help="comma-separated lane counts")
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--num-docs", type=int, default=20_000)
    parser.add_argument("--setup", action="store_true")
    parser.add_argument("--probe", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--signals", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe is not None:
        probe(args.store_dir, args.probe, args.warmup, args.batches, args.signals)
        return 0
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        parser.error("valgrind and callgrind_control are needed: apt-get install valgrind")
    if args.setup:
        llm_lanes.setup(args.store_dir, args.num_docs)
    counts = [int(x) for x in args.lanes.split(",")]
    per_batch = {
        n: count(args.store_dir, n, args.warmup, args.batches) / args.batches for n in counts
    }
    fewest = per_batch[min(counts)]
    for n in counts:
        print(
            f"{n:5d} lanes: {per_batch[n] / 1e6:7.2f} M instructions per batch, "
            f"{per_batch[n] / fewest:.2f}x the fewest lanes'"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
