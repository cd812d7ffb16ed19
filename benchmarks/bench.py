"""Side-by-side benchmark driver: Grain baselines vs zephon_jax.

    python benchmarks/bench.py --quick --json /tmp/b.json

The Grain column comes from ``grain_baselines.py``. The zephon_jax column is filled
from ``zephon_side.py`` (next to this file) when it exists and defines a function of
the same name (``map_batch``, ``packing``, ``restore_cost``, ``mp_throughput``); it is
called with exactly the same keyword arguments and must return a dict with the same
keys. Otherwise the column stays blank. ``ratio`` is zephon_jax / grain; each
benchmark name says whether higher or lower is better. All rates are medians over
timed windows.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import resource
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import corpus as corpus_mod  # noqa: E402
import grain_baselines  # noqa: E402

# ----------------------------------------------------------------------------- cases


@dataclasses.dataclass(frozen=True)
class Metric:
    key: str  # key in the result dict
    label: str  # shown after the case name
    unit: str  # "rate", "tok/s", "ratio", "s", "bytes", "MB", "bool"
    higher_is_better: bool | None


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    function: str
    kwargs: dict[str, Any]
    metrics: tuple[Metric, ...]
    needs_corpus: bool = True
    # Arguments that differ on the zephon_jax side (e.g. its own defaults).
    zephon_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


_REC = Metric("records_per_s", "records/s (↑)", "rate", True)
_TOK = Metric("tokens_per_s", "real tokens/s (↑)", "rate", True)
_FILL = Metric("fill", "fill (↑)", "ratio", True)
_RSS = Metric("peak_rss_delta_mb", "peak RSS delta (↓)", "MB", False)
_RESTORE = Metric("restore_s", "restore+1st batch (↓)", "s", False)
_FRESH = Metric("fresh_first_batch_s", "fresh iter 1st batch (↓)", "s", False)
_STATE = Metric("state_bytes", "state size JSON (↓)", "bytes", False)
_GETSTATE = Metric("get_state_s", "get_state (↓)", "s", False)
_MATCH = Metric("restore_matches", "restore matches", "bool", None)
_STARTUP = Metric("startup_s", "time to 1st batch (↓)", "s", False)
_RSS_TOTAL = Metric("peak_total_rss_mb", "peak RSS incl. workers (↓)", "MB", False)
_STATE_LANE = Metric("state_bytes_per_lane", "state bytes per lane (↓)", "bytes", False)


def build_cases(quick: bool) -> list[Case]:
    cases: list[Case] = [
        Case("map+batch", "map_batch", {}, (_REC,), needs_corpus=False),
        Case(
            "map+batch read_threads=0",
            "map_batch",
            {"read_threads": 0},
            (_REC,),
            needs_corpus=False,
        ),
    ]
    for method, bins, rt in [
        ("first_fit", 8, None),
        ("first_fit", 512, None),
        ("best_fit", 8, None),
        ("best_fit", 512, None),
        ("concat", 8, None),
        ("first_fit", 8, 0),
        ("first_fit", 512, 0),
        ("concat", 8, 0),
    ]:
        name = f"pack {method}" + (f" bins={bins}" if method != "concat" else "")
        kwargs: dict[str, Any] = {"method": method, "num_packing_bins": bins}
        if rt is not None:
            name += f" read_threads={rt}"
            kwargs["read_threads"] = rt
        metrics = (_TOK, _FILL, _RSS) if bins == 512 else (_TOK, _FILL)
        cases.append(Case(name, "packing", kwargs, metrics))
    cases.append(
        Case(
            "pack defaults (grain first_fit bins=8, zephon_jax best_fit bins=32)",
            "packing",
            {"method": "first_fit", "num_packing_bins": 8},
            (_TOK, _FILL),
            zephon_kwargs={"method": "best_fit", "num_packing_bins": 32},
        )
    )

    restore_grid = [(8, 100, 0), (8, 10_000, 0), (512, 100, 0), (512, 10_000, 0)]
    restore_grid += [(8, 100, None), (512, 100, None)]
    if not quick:
        restore_grid += [(8, 10_000, None), (512, 10_000, None)]
    for bins, steps, rt in restore_grid:
        name = f"restore first_fit bins={bins} steps={steps}"
        kwargs = {"method": "first_fit", "num_packing_bins": bins, "steps": steps}
        if rt is not None:
            name += f" read_threads={rt}"
            kwargs["read_threads"] = rt
        metrics = (_RESTORE, _FRESH, _STATE, _STATE_LANE, _GETSTATE, _MATCH)
        if steps == 10_000 and bins == 512:
            metrics = (_RESTORE, _FRESH, _STATE, _STATE_LANE, _GETSTATE, _MATCH, _RSS)
        cases.append(Case(name, "restore_cost", kwargs, metrics))
    for steps in (100, 10_000):
        cases.append(
            Case(
                f"restore defaults (zephon_jax bins=32) steps={steps} read_threads=0",
                "restore_cost",
                {"method": "first_fit", "num_packing_bins": 8, "steps": steps, "read_threads": 0},
                (_RESTORE, _STATE_LANE, _GETSTATE, _MATCH),
                zephon_kwargs={"num_packing_bins": 32},
            )
        )
    # Grain's ConcatThenSplit state does not survive a JSON round trip when it holds
    # no remainder (e.g. at step 0): restore_matches shows it.
    for steps in (0, 100):
        cases.append(
            Case(
                f"restore concat steps={steps} read_threads=0 (JSON round trip)",
                "restore_cost",
                {"method": "concat", "steps": steps, "read_threads": 0},
                (_RESTORE, _STATE, _MATCH),
            )
        )
    for w in (0, 1, 2):
        cases.append(
            Case(
                f"mp_prefetch first_fit bins=8 workers={w}",
                "mp_throughput",
                {"num_workers": w, "method": "first_fit", "num_packing_bins": 8},
                (_TOK, _STARTUP, _RSS_TOTAL) if w else (_TOK, _STARTUP),
            )
        )
    return cases


# ----------------------------------------------------------------------------- formatting


def _fmt(value: Any, unit: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if unit == "bool":
        return "yes" if value else "NO"
    v = float(value)
    if unit == "rate":
        for div, suffix in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
            if abs(v) >= div:
                return f"{v / div:.2f}{suffix}"
        return f"{v:.1f}"
    if unit == "ratio":
        return f"{100 * v:.1f} %"
    if unit == "s":
        return f"{v * 1e3:.2f} ms" if v < 1 else f"{v:.2f} s"
    if unit == "bytes":
        return f"{v:.0f} B"
    if unit == "MB":
        return f"{v:.1f} MB"
    return f"{v:.4g}"


def _ratio(g: Any, z: Any, unit: str) -> float | None:
    if unit == "bool" or g is None or z is None:
        return None
    try:
        g, z = float(g), float(z)
    except (TypeError, ValueError):
        return None
    if g == 0:
        return None
    return z / g


def _print_table(rows: list[dict[str, Any]]) -> None:
    header = ("benchmark", "grain", "zephon_jax", "ratio")
    cells = [header] + [
        (
            r["benchmark"],
            r["grain_str"],
            r["zephon_jax_str"],
            "" if r["ratio"] is None else f"{r['ratio']:.2f}x",
        )
        for r in rows
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(4)]
    line = " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    print(line)
    print("-+-".join("-" * w for w in widths))
    for c in cells[1:]:
        print(
            " | ".join(
                (c[i].ljust(widths[i]) if i == 0 else c[i].rjust(widths[i])) for i in range(4)
            )
        )


# ----------------------------------------------------------------------------- machine


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine_info() -> dict[str, Any]:
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    return {
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": sys.version.split()[0],
        "versions": {
            d: _version(d) for d in ("grain", "jax", "jaxlib", "numpy", "psutil", "zephon_jax")
        },
    }


def _load_zephon_side() -> tuple[Any, str | None]:
    """Returns (module or None, error message or None)."""
    if importlib.util.find_spec("zephon_side") is None:
        return None, None
    try:
        return importlib.import_module("zephon_side"), None
    except Exception:  # noqa: BLE001 - report whatever the other side raises
        return None, traceback.format_exc(limit=3)


def _call(fn: Callable[..., dict[str, Any]], kwargs: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    result = fn(**kwargs)
    result = dict(result)
    result.setdefault("_wall_s", time.perf_counter() - t0)
    return result


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        try:
            return obj.item()
        except (TypeError, ValueError):
            pass
    if isinstance(obj, str | int | float | bool) or obj is None:
        return obj
    return repr(obj)


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short timings (< 30 s Grain side)")
    parser.add_argument("--json", metavar="PATH", help="write the rows (and raw results) as JSON")
    parser.add_argument("--filter", metavar="SUBSTR", help="run only cases whose name contains it")
    parser.add_argument("--num-docs", type=int, default=None, help="corpus size (documents)")
    args = parser.parse_args(argv)

    info = machine_info()
    print(
        f"cpus: {info['cpu_count']} (affinity {info['cpu_affinity']})  "
        f"python {info['python']}  {info['platform']}"
    )
    print("versions: " + "  ".join(f"{k} {v}" for k, v in info["versions"].items()))

    num_docs = args.num_docs or (2048 if args.quick else 8192)
    t0 = time.perf_counter()
    corpus = corpus_mod.make_corpus(num_docs, max_len=2048, seed=0)
    corpus_s = time.perf_counter() - t0
    corpus_desc = {
        "num_docs": num_docs,
        "max_len": 2048,
        "seed": 0,
        "tokens": corpus_mod.corpus_tokens(corpus),
    }
    print(
        f"corpus: {num_docs} docs, {corpus_desc['tokens']} tokens "
        f"(built in {corpus_s * 1e3:.0f} ms); mode: {'quick' if args.quick else 'full'}"
    )

    zside, zerr = _load_zephon_side()
    if zerr:
        print(f"zephon_side.py failed to import; zephon_jax column left blank:\n{zerr}")
    elif zside is None:
        print("zephon_side.py not found; zephon_jax column left blank")
    print()

    cases = build_cases(args.quick)
    if args.filter:
        cases = [c for c in cases if args.filter in c.name]

    rows: list[dict[str, Any]] = []
    raw: list[dict[str, Any]] = []
    errors: list[str] = []
    t_start = time.perf_counter()
    grain_s = 0.0
    for case in cases:
        kwargs = dict(case.kwargs, quick=args.quick)
        call_kwargs = dict(kwargs, corpus=corpus) if case.needs_corpus else kwargs
        g_res: dict[str, Any] | None
        try:
            t0 = time.perf_counter()
            g_res = _call(getattr(grain_baselines, case.function), call_kwargs)
            grain_s += time.perf_counter() - t0
        except Exception:  # noqa: BLE001
            g_res = None
            errors.append(f"grain / {case.name}:\n{traceback.format_exc(limit=4)}")
        z_res: dict[str, Any] | None = None
        z_fn = getattr(zside, case.function, None) if zside is not None else None
        z_err = None
        if z_fn is not None:
            try:
                z_res = _call(z_fn, dict(call_kwargs, **case.zephon_kwargs))
            except Exception as e:  # noqa: BLE001
                z_err = f"error: {type(e).__name__}"
                errors.append(f"zephon_jax / {case.name}:\n{traceback.format_exc(limit=4)}")
        for m in case.metrics:
            g = g_res.get(m.key) if g_res else None
            z = z_res.get(m.key) if z_res else None
            rows.append(
                {
                    "benchmark": f"{case.name}: {m.label}",
                    "case": case.name,
                    "function": case.function,
                    "metric": m.key,
                    "unit": m.unit,
                    "higher_is_better": m.higher_is_better,
                    "grain": g,
                    "zephon_jax": z,
                    "ratio": _ratio(g, z, m.unit),
                    "grain_str": _fmt(g, m.unit) if g_res else "error",
                    "zephon_jax_str": z_err or _fmt(z, m.unit),
                }
            )
        raw.append(
            {
                "case": case.name,
                "function": case.function,
                "kwargs": dict(kwargs, **({"corpus": corpus_desc} if case.needs_corpus else {})),
                "zephon_kwargs": case.zephon_kwargs,
                "grain": g_res,
                "zephon_jax": z_res,
            }
        )
        print(f"  done {case.name} ({time.perf_counter() - t_start:.1f} s)", file=sys.stderr)

    total_s = time.perf_counter() - t_start
    print()
    _print_table(rows)
    print()
    maxrss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(
        f"total {total_s:.1f} s (grain side {grain_s:.1f} s); "
        f"process lifetime peak RSS {maxrss_mb:.0f} MB"
    )
    for e in errors:
        print(f"\nERROR {e}", file=sys.stderr)

    if args.json:
        payload = {
            "machine": info,
            "quick": args.quick,
            "corpus": corpus_desc,
            "total_s": total_s,
            "grain_s": grain_s,
            "rows": rows,
            "raw": raw,
            "errors": errors,
        }
        with open(args.json, "w") as f:
            json.dump(_jsonable(payload), f, indent=2)
        print(f"wrote {args.json}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
