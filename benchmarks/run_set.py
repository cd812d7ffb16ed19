"""Runs ``bench.py`` N times, each run in fresh processes, and records every run's figures.

    python benchmarks/run_set.py --runs 5 --out benchmarks/results
    python benchmarks/run_set.py --runs 2 --quick --out /tmp/quick-set   # smoke test
    python benchmarks/report.py benchmarks/results --update-docs          # docs from the set

Each run is two processes, one after the other:

* ``default``: the default install as it runs (numba is a dependency: the
  placement kernel and the sampler's permutation compiled; pipelines that are not
  of the column path's shape on the general path): every case but the TokenArray
  lane sweep; ``--interpreted`` runs it with ``ZEPHON_JAX_COMPILED=0`` instead (as
  without numba);
* ``fast``: the compiled kernels on (the name is that of the extra that installed
  numba before it was a dependency), when numba imports: the LLM pipeline (on the
  column path, as the default install runs it), the packing cases, now with their
  TokenArray sides packed by the compiled kernels, and the TokenArray lane sweep.

``OUT/set.json`` records the command, the environment (Python, jax, jaxlib, numba
or "not installed", Grain, numpy, the CPU model, cores, load average) and each
run's files and seconds; ``OUT/run-K/default.json`` and ``OUT/run-K/fast.json``
hold every figure of run ``K`` with its own environment. At the end the report
(``report.py``) writes ``OUT/summary.json`` (every figure's median and min-max over
the runs) and ``OUT/report.md`` (the tables), and draws the plots into ``OUT/plots``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

DEFAULT_CASES = "llm,llm256,readme,packing,uniform,map_batch,lanes,workers,tokenize"
FAST_CASES = "llm,llm256,packing,uniform,lanes_token_array"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def environment() -> dict[str, Any]:
    """Versions, CPU model, cores and load average of this machine, now."""
    dists = ("zephon_jax", "grain", "numpy", "jax", "jaxlib", "numba", "tokenizers", "tiktoken")
    return {
        "python": sys.version.split()[0],
        "versions": {d: _version(d) for d in dists},
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "load_average": os.getloadavg(),
    }


def bench_command(cases: str, out: str, args: argparse.Namespace) -> list[str]:
    cmd = [sys.executable, os.path.join(_HERE, "bench.py"), "--only", cases, "--json", out]
    if args.quick:
        cmd.append("--quick")
    for flag, value in (("--num-docs", args.num_docs), ("--steps", args.steps)):
        if value is not None:
            cmd += [flag, str(value)]
    return cmd


def _selected(cases: str, only: str | None) -> str:
    if only is None:
        return cases
    keep = set(only.split(","))
    return ",".join(c for c in cases.split(",") if c in keep)


def run_once(index: int, args: argparse.Namespace, fast: bool) -> dict[str, Any]:
    """Run ``index``: the default-install process, then the fast-extra one (if numba)."""
    directory = os.path.join(args.out, f"run-{index}")
    os.makedirs(directory, exist_ok=True)
    record: dict[str, Any] = {"index": index}
    default_env = "0" if args.interpreted else None
    kinds = [("default", DEFAULT_CASES, default_env)]
    kinds += [("fast", FAST_CASES, None)] if fast else []
    for kind, cases, compiled in kinds:
        cases = _selected(cases, args.only)
        if not cases:
            continue
        path = os.path.join(directory, f"{kind}.json")
        env = dict(os.environ)
        env.pop("ZEPHON_JAX_COMPILED", None)
        if compiled is not None:
            env["ZEPHON_JAX_COMPILED"] = compiled
        cmd = bench_command(cases, path, args)
        print(f"run {index} {kind}: {' '.join(cmd)}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        done = subprocess.run(cmd, env=env, check=False)
        if done.returncode != 0:
            raise SystemExit(f"run {index} {kind} failed with exit code {done.returncode}")
        record[kind] = os.path.relpath(path, args.out)
        record[f"{kind}_seconds"] = time.perf_counter() - t0
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs in the set (default 5)")
    parser.add_argument("--out", required=True, help="directory for the set (created)")
    parser.add_argument("--quick", action="store_true", help="tiny corpus and windows (smoke)")
    parser.add_argument("--only", metavar="CASES", help="comma-separated cases (default: all)")
    parser.add_argument("--num-docs", type=int, help="corpus size, passed to bench.py")
    parser.add_argument("--steps", type=int, help="steps before the restore, passed to bench.py")
    parser.add_argument("--no-fast", action="store_true", help="skip the fast-extra process")
    parser.add_argument(
        "--interpreted",
        action="store_true",
        help="run the default process with ZEPHON_JAX_COMPILED=0 (as without numba)",
    )
    parser.add_argument("--no-plots", action="store_true", help="do not draw the plots")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    if os.path.exists(os.path.join(args.out, "set.json")):
        parser.error(f"{args.out} already holds a set (set.json); choose a new --out")
    os.makedirs(args.out, exist_ok=True)
    fast = not args.no_fast and _version("numba") != "not installed"
    meta: dict[str, Any] = {
        "command": [os.path.basename(sys.argv[0] or "run_set.py")] + list(argv or sys.argv[1:]),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "mode": "quick" if args.quick else "full",
        "environment": environment(),
        "fast_extra": fast,
        "default_interpreted": bool(args.interpreted),
        "runs": [],
    }
    for i in range(1, args.runs + 1):
        meta["runs"].append(run_once(i, args, fast))
        with open(os.path.join(args.out, "set.json"), "w") as f:  # rewritten after each run
            json.dump(meta, f, indent=1)
    meta["load_average_at_end"] = os.getloadavg()
    with open(os.path.join(args.out, "set.json"), "w") as f:
        json.dump(meta, f, indent=1)
    import report

    written = report.write_set_report(args.out, plots=not args.no_plots)
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
