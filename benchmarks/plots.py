"""Plots of a ``bench.py`` results file (PNG), as shown in ``docs/performance.md``.

python benchmarks/plots.py bench.json docs/_static
"""

from __future__ import annotations

import os
import sys
from typing import Any

ZEPHON = "#1f6feb"
GRAIN = "#9a6700"
FLOOR = "#6e7781"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _label_bars(ax, bars, fmt: str) -> None:
    for bar in bars:
        h = bar.get_height()
        ax.annotate(
            fmt.format(h),
            (bar.get_x() + bar.get_width() / 2, h),
            ha="center",
            va="bottom",
            fontsize=8,
            xytext=(0, 2),
            textcoords="offset points",
        )


def throughput_plot(results: dict[str, Any], path: str) -> str:
    """Real tokens/s per case: zephon_jax and Grain side by side, ratio on top, and the
    Python floor (see ``python_floor.py``) as a dashed line over each case."""
    plt = _pyplot()
    labels, z, t, gf, gb, ratios, floors = [], [], [], [], [], [], []
    nan = {"rate_median": float("nan")}
    cases = [
        (f"log-normal, split\nbest fit, {k}", c, "best_fit") for k, c in results["packing"].items()
    ]
    if "uniform" in results:
        bins = results["uniform"]["settings"]["bins"]
        cases.append((f"uniform 1..2048\nfirst fit, {bins} bins", results["uniform"], "first_fit"))
    for label, case, method in cases:
        s = case["sides"]
        labels.append(label)
        floors.append(s.get("python floor", nan)["rate_median"] / 1e6)
        z.append(s[f"zephon_jax {method}"]["rate_median"] / 1e6)
        t.append(s.get(f"zephon_jax {method}, TokenArray", nan)["rate_median"] / 1e6)
        gf.append(s["grain first_fit"]["rate_median"] / 1e6)
        gb.append(s.get("grain best_fit", nan)["rate_median"] / 1e6)
        ratios.append(
            case.get("token_array_ratio_to_grain_first_fit", case["ratio_to_grain_first_fit"])
        )
    fig, ax = plt.subplots(figsize=(7.5, 3.8), dpi=120)
    x = range(len(labels))
    w = 0.21
    ax.bar([i - 1.5 * w for i in x], z, w, label="zephon_jax, list", color=ZEPHON, alpha=0.55)
    b1 = ax.bar([i - 0.5 * w for i in x], t, w, label="zephon_jax, TokenArray", color=ZEPHON)
    ax.bar([i + 0.5 * w for i in x], gf, w, label="Grain first fit", color=GRAIN)
    ax.bar([i + 1.5 * w for i in x], gb, w, label="Grain best fit", color=GRAIN, alpha=0.55)
    ax.hlines(
        floors,
        [i - 2 * w for i in x],
        [i + 2 * w for i in x],
        colors=FLOOR,
        linestyles="dashed",
        label="Python floor (no lineage, state or checks)",
    )
    for bar, r in zip(b1, ratios, strict=True):
        ax.annotate(
            f"{r:.1f}x",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=9,
            fontweight="bold",
            xytext=(0, 2),
            textcoords="offset points",
        )
    ax.set_xticks(list(x), labels, fontsize=8)
    ax.set_ylabel("real tokens/s (millions)")
    ax.set_title(
        "Packing into rows of 2048 (ratio: zephon_jax over a TokenArray / Grain first fit)",
        fontsize=10,
    )
    ax.legend(fontsize=8, frameon=False)
    ax.margins(y=0.15)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def floor_plot(results: dict[str, Any], path: str) -> str:
    """Share of the memory-copy floor (batches/s over copy-only batches/s), log scale."""
    plt = _pyplot()
    labels, z, t, g = [], [], [], []
    cases = [(f"log-normal {k}", c, "best_fit") for k, c in results["packing"].items()]
    if "uniform" in results:
        cases.append(("uniform, 32 bins", results["uniform"], "first_fit"))
    for label, case, method in cases:
        shares = case["share_of_floor"]
        labels.append(label)
        z.append(shares[f"zephon_jax {method}"])
        t.append(shares.get(f"zephon_jax {method}, TokenArray", float("nan")))
        g.append(shares["grain first_fit"])
    fig, ax = plt.subplots(figsize=(7.5, 3.2), dpi=120)
    x = range(len(labels))
    w = 0.27
    bars = [
        ax.bar(
            [i - w for i in x],
            [100 * v for v in z],
            w,
            label="zephon_jax, list",
            color=ZEPHON,
            alpha=0.55,
        ),
        ax.bar(list(x), [100 * v for v in t], w, label="zephon_jax, TokenArray", color=ZEPHON),
        ax.bar([i + w for i in x], [100 * v for v in g], w, label="Grain", color=GRAIN),
    ]
    for b in bars:
        _label_bars(ax, b, "{:.2g} %")
    ax.axhline(100, color=FLOOR, linestyle="--", linewidth=1)
    ax.text(len(labels) - 0.5, 100, "copy floor", ha="right", va="bottom", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylim(0.05, 300)
    ax.set_xticks(list(x), labels, fontsize=8)
    ax.set_ylabel("% of the copy floor's batches/s")
    ax.set_title("Speed as a share of copying the batch's bytes (np.copyto)", fontsize=10)
    ax.legend(fontsize=8, frameon=False, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def lanes_plot(results: dict[str, Any], path: str) -> str:
    """Lane sweep: tokens/s, memory per lane and restore time against the lane count."""
    plt = _pyplot()
    sweeps = [("list", results["lanes"]["rows"])]
    if "lanes_token_array" in results:
        sweeps.append(("TokenArray", results["lanes_token_array"]["rows"]))
    labels = [str(r["num_lanes"]) for r in sweeps[0][1]]
    fig, axes = plt.subplots(1, 3, figsize=(9, 3.0), dpi=120)
    panels = [
        ("real tokens/s (millions)", lambda r: r["tokens_per_s"] / 1e6, "{:.0f}"),
        ("resident memory per lane (KiB)", lambda r: r["rss_bytes_per_lane"] / 1024, "{:.0f}"),
        ("set_state + first batch (s)", lambda r: r["restore_first_batch_s"], "{:.2f}"),
    ]
    w = 0.8 / len(sweeps)
    for ax, (title, value, fmt) in zip(axes, panels, strict=True):
        for k, (source, rows) in enumerate(sweeps):
            x = [i + (k - (len(sweeps) - 1) / 2) * w for i in range(len(rows))]
            alpha = 0.55 if source == "list" and len(sweeps) > 1 else 1.0
            bars = ax.bar(x, [value(r) for r in rows], w, color=ZEPHON, alpha=alpha, label=source)
            _label_bars(ax, bars, fmt)
        ax.set_xticks(range(len(labels)), labels)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("lanes", fontsize=8)
        ax.margins(y=0.18)
        ax.tick_params(labelsize=8)
    if len(sweeps) > 1:
        axes[0].legend(fontsize=7, frameon=False, loc="lower left")
    b = results["lanes"]["settings"]["batch_size"]
    steps = results["lanes"]["settings"]["steps_before_restore"]
    fig.suptitle(
        f"The same batches of {b} rows x 2048 made by more lanes (restore after {steps} steps)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def workers_plot(results: dict[str, Any], path: str) -> str:
    """Speed over no workers: zephon_jax's workers, and lanes in Grain's worker processes."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 3.2), dpi=120)
    names = [n for n in ("heavy map", "heavy map + pack") if n in results["workers"]]
    sides: list[str] = []
    for n in names:
        sides += [s for s in results["workers"][n]["sides"] if s not in sides]
    w = 0.8 / len(sides)
    for k, side in enumerate(sides):
        values = []
        for n in names:
            r = results["workers"][n]["sides"]
            values.append(
                r[side]["rate_median"] / r["workers=0"]["rate_median"] if side in r else 0.0
            )
        grain = side.startswith("grain")
        bars = ax.bar(
            [i + (k - (len(sides) - 1) / 2) * w for i in range(len(names))],
            values,
            w,
            label="zephon_jax lanes in Grain's mp_prefetch, workers=2"
            if grain
            else side.replace("workers=", "zephon_jax, workers="),
            color=GRAIN if grain else ZEPHON,
            alpha=1.0 if grain else 0.35 + 0.65 * k / max(1, len(sides) - 2),
        )
        _label_bars(ax, [b for b, v in zip(bars, values, strict=True) if v], "{:.2f}x")
    for i, n in enumerate(names):  # the machine's floor: the map alone, 2 processes over 1
        floor = results["workers"][n].get("process_floor")
        if floor:
            ax.hlines(
                floor["speedup_2"], i - 0.45, i + 0.45, colors="black", linestyles="dashed",
                label="the map alone, 2 processes over 1" if i == 0 else None,
            )  # fmt: skip
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_ylabel("speed over no workers")
    ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.margins(y=0.25)
    ax.set_title(f"Loader workers on {results['machine']['cpu_count']} cores", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def tokenize_plot(results: dict[str, Any], path: str) -> str:
    """Tokens/s of each tokenizer: zephon_jax per block, one by one, Grain's map."""
    plt = _pyplot()
    cases = {k: v for k, v in results["tokenize"].items() if k != "settings"}
    kinds = list(cases)
    sides = list(cases[kinds[0]]["sides"])
    fig, ax = plt.subplots(figsize=(6.5, 3.2), dpi=120)
    w = 0.8 / len(sides)
    for k, side in enumerate(sides):
        values = [cases[kind]["sides"][side]["rate_overall"] / 1e6 for kind in kinds]
        grain = side.startswith("grain")
        bars = ax.bar(
            [i + (k - (len(sides) - 1) / 2) * w for i in range(len(kinds))],
            values,
            w,
            label=side,
            color=GRAIN if grain else ZEPHON,
            alpha=(1.0, 0.5)[k % 2],
        )
        _label_bars(ax, bars, "{:.2f}")
    ax.set_xticks(range(len(kinds)), kinds, fontsize=8)
    ax.set_ylabel("M real tokens/s")
    ax.legend(fontsize=7, frameon=False, loc="upper left")
    ax.margins(y=0.25)
    settings = results["tokenize"]["settings"]
    ax.set_title(
        f"Tokenize + pack, {settings['mean_words']:.0f} words per text on average",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def draw_all(results: dict[str, Any], directory: str) -> list[str]:
    os.makedirs(directory, exist_ok=True)
    out = []
    if "packing" in results:
        out.append(throughput_plot(results, os.path.join(directory, "bench_vs_grain.png")))
        out.append(floor_plot(results, os.path.join(directory, "bench_copy_floor.png")))
    if "lanes" in results:
        out.append(lanes_plot(results, os.path.join(directory, "bench_lanes.png")))
    if "workers" in results:
        out.append(workers_plot(results, os.path.join(directory, "bench_workers.png")))
    if "tokenize" in results:
        out.append(tokenize_plot(results, os.path.join(directory, "bench_tokenize.png")))
    return out


if __name__ == "__main__":
    import json

    with open(sys.argv[1]) as f:
        data = json.load(f)
    for p in draw_all(data, sys.argv[2]):
        print(p)
