"""Markdown tables of a ``bench.py`` results file, as pasted into ``docs/performance.md``.

python benchmarks/report.py bench.json
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _m(v: float) -> str:
    return f"{v / 1e6:.1f} M"


def _python_floor(case: dict[str, Any], side: str) -> str:
    """The Python floor's rate (and ratio to Grain's first fit), then the shares of it."""
    floor = case["sides"].get("python floor")
    if floor is None:  # a results file from before the Python floor was measured
        return " | | "
    share = case["share_of_python_floor"]
    grain = floor["rate_median"] / case["sides"]["grain first_fit"]["rate_median"]
    return (
        f"{_m(floor['rate_median'])} ({grain:.1f}x Grain) | {100 * share[side]:.0f} % "
        f"(Grain {100 * share['grain first_fit']:.0f} %) | "
    )


TOKEN_ARRAY_SIDE = "zephon_jax %s, TokenArray"  # as bench.py names it


def packing_table(results: dict[str, Any]) -> str:
    lines = [
        "| case | zephon_jax | Grain first fit | Grain best fit | ratio | Python floor "
        "| share of Python floor | share of copy floor |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, case in results["packing"].items():
        s = case["sides"]
        gf, gb = s["grain first_fit"], s["grain best_fit"]
        floor = case["share_of_floor"]
        for name, label, prefix in (
            ("zephon_jax best_fit", "", ""),
            (TOKEN_ARRAY_SIDE % "best_fit", ", TokenArray", "token_array_"),
        ):
            if name not in s:  # a results file from before the TokenArray side
                continue
            z = s[name]
            lines.append(
                f"| log-normal, split, {key}{label} | {_m(z['rate_median'])} (fill "
                f"{z['fill']:.3f}) | {_m(gf['rate_median'])} ({gf['fill']:.3f}) | "
                f"{_m(gb['rate_median'])} ({gb['fill']:.3f}) | "
                f"{case[prefix + 'ratio_to_grain_first_fit']:.1f}x / "
                f"{case[prefix + 'ratio_to_grain_best_fit']:.1f}x | {_python_floor(case, name)}"
                f"{100 * floor[name]:.2f} % (Grain {100 * floor['grain first_fit']:.2f} %) |"
            )
    if "uniform" in results:
        case = results["uniform"]
        s = case["sides"]
        g = s["grain first_fit"]
        floor = case["share_of_floor"]
        for name, label, prefix in (
            ("zephon_jax first_fit", "", ""),
            (TOKEN_ARRAY_SIDE % "first_fit", ", TokenArray", "token_array_"),
        ):
            if name not in s:
                continue
            z = s[name]
            lines.append(
                f"| uniform 1..2048, first fit, 32 bins, B=32{label} | {_m(z['rate_median'])} "
                f"(fill {z['fill']:.3f}) | {_m(g['rate_median'])} ({g['fill']:.3f}) | | "
                f"{case[prefix + 'ratio_to_grain_first_fit']:.1f}x | {_python_floor(case, name)}"
                f"{100 * floor[name]:.2f} % (Grain {100 * floor['grain first_fit']:.2f} %) |"
            )
    return "\n".join(lines)


def _pooled(row: dict[str, Any]) -> str:
    pooled = row.get("pooled_bytes_per_lane")  # measured since the batch arrays are reused
    return "" if pooled is None else f" ({pooled / 1024:.0f} KiB)"


def lanes_table(results: dict[str, Any], which: str = "lanes") -> str:
    lines = [
        "| lanes | real tokens/s | vs 8 lanes | RSS per lane (of it, batch arrays kept for "
        "reuse) | state per lane | `get_state` "
        "| `set_state` + 1st batch | exact |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results[which]["rows"]:
        lines.append(
            f"| {r['num_lanes']} | {_m(r['tokens_per_s'])} | {r['speed_vs_fewest_lanes']:.2f}x | "
            f"{r['rss_bytes_per_lane'] / 1024:.0f} KiB{_pooled(r)} | "
            f"{r['state_bytes_per_lane']:.0f} B | "
            f"{r['get_state_s'] * 1e3:.1f} ms | {r['restore_first_batch_s']:.2f} s | "
            f"{'yes' if r['restore_exact'] else 'NO'} |"
        )
    return "\n".join(lines)


def _k(v: float) -> str:
    return f"{v / 1e3:.1f} k"


def tokenize_table(results: dict[str, Any]) -> str:
    """Records/s and tokens/s of each tokenizer through each side, ratios to the batched side."""
    cases = {k: v for k, v in results["tokenize"].items() if k != "settings"}
    names = list(next(iter(cases.values()))["sides"])
    lines = [
        "| tokenizer | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for kind, case in cases.items():
        s = case["sides"]
        z = s[names[0]]["rate_overall"]
        cells = [
            f"{_k(s[n]['records_per_s'])} rec/s, {_m(s[n]['rate_overall'])} tok/s"
            + ("" if i == 0 else f" (tokenize {z / s[n]['rate_overall']:.2f}x)")
            for i, n in enumerate(names)
        ]
        lines.append(f"| {kind} ({case['tokenizer']}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def workers_table(results: dict[str, Any]) -> str:
    w = results["workers"]
    counts: list[str] = []
    for k, v in w.items():
        if k != "settings":
            counts += [c for c in v["sides"] if c not in counts]
    lines = [
        "| pipeline | " + " | ".join(counts) + " | the map alone, 2 processes over 1 |",
        "|---|" + "---:|" * (len(counts) + 1),
    ]
    for name in ("heavy map", "heavy map + pack"):
        if name not in w:
            continue
        unit = "records/s" if name == "heavy map" else "tokens/s"
        base = w[name]["sides"]["workers=0"]["rate_median"]
        cells = []
        for c in counts:
            if c not in w[name]["sides"]:
                cells.append("")
                continue
            rate = w[name]["sides"][c]["rate_median"]
            value = f"{rate / 1e3:.0f} k" if rate < 1e6 else _m(rate)
            cells.append(f"{value} {unit}" + ("" if c == "workers=0" else f" ({rate / base:.2f}x)"))
        floor = w[name].get("process_floor")
        cells.append(f"{floor['speedup_2']:.2f}x" if floor else "")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    with open(sys.argv[1]) as f:
        results = json.load(f)
    m = results["machine"]
    print(
        f"machine: {m['cpu_count']} cpus, python {m['python']}, {m['versions']}, load "
        f"{m['load_average_at_start']} -> {m.get('load_average_at_end')}; corpus "
        f"{results['corpus']}\n"
    )
    if "packing" in results:
        print(packing_table(results) + "\n")
    for which in ("lanes", "lanes_token_array"):
        if which in results:
            source = results[which]["settings"].get("source", "list")
            print(f"lane sweep, documents as a {source}:\n{lanes_table(results, which)}\n")
    if "tokenize" in results:
        print(tokenize_table(results) + "\n")
    if "workers" in results:
        print(workers_table(results) + "\n")
    if "map_batch" in results:
        mb = results["map_batch"]
        print(
            f"map+batch: zephon_jax {mb['sides']['zephon_jax']['rate_median'] / 1e3:.0f} k "
            f"records/s, Grain {mb['sides']['grain']['rate_median'] / 1e3:.0f} k "
            f"({mb['ratio_to_grain']:.1f}x)"
        )


if __name__ == "__main__":
    main()
