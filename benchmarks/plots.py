"""Plots of a set of runs (``run_set.py``), with each figure's range over the runs.

    python benchmarks/report.py SET_DIR --plots docs/_static

Bars are medians over the runs; error bars span the lowest and highest run.
zephon_jax is drawn in blue, Grain in brown; zephon_jax's lanes run by Grain's
worker pool (neither side's own configuration) in grey-green, and reference
points (the lean Python reference, the contiguous copy, the machine's own
scaling) as dashed lines.
"""

from __future__ import annotations

import os
from typing import Any

ZEPHON = "#1f6feb"
GRAIN = "#9a6700"
ADAPTER = "#4d7c6a"  # zephon_jax lanes in Grain's worker pool
REFERENCE = "#6e7781"
TOKEN_ARRAY_SIDE = "zephon_jax %s, TokenArray"
LEAN = "lean Python reference"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bars(ax, x, stats, width, scale=1.0, **kw):
    """Bars at the medians of ``stats`` (``report.Stat`` or None) with min-max error bars."""
    nan = float("nan")
    med = [s.median / scale if s else nan for s in stats]
    lo = [(s.median - s.lo) / scale if s else 0 for s in stats]
    hi = [(s.hi - s.median) / scale if s else 0 for s in stats]
    return ax.bar(x, med, width, yerr=[lo, hi], capsize=2, error_kw={"elinewidth": 0.8}, **kw)


def _label_bars(ax, bars, fmt: str) -> None:
    for bar in bars:
        h = bar.get_height()
        if h != h:  # NaN: no such side in this set
            continue
        ax.annotate(
            fmt.format(h),
            (bar.get_x() + bar.get_width() / 2, h),
            ha="center",
            va="bottom",
            fontsize=7,
            xytext=(0, 2),
            textcoords="offset points",
        )


def _cases(fig: Any, kind: str) -> list[tuple[str, tuple[str, ...], str]]:
    cases = []
    for key in ("B=64", "B=256"):
        if fig(kind, "packing", key, "sides", "grain first_fit", "rate_median"):
            cases.append((f"log-normal, split\nbest fit, {key}", ("packing", key), "best_fit"))
    if fig(kind, "uniform", "sides", "grain first_fit", "rate_median"):
        cases.append(("uniform 1..2048\nfirst fit, B=32", ("uniform",), "first_fit"))
    return cases


def _side(pattern: str, method: str) -> str:
    """A side's name: ``pattern`` with the case's packing method where it has a ``%s``."""
    return pattern % method if "%s" in pattern else pattern


def _save(fig_, plt, path: str) -> str:
    fig_.tight_layout()
    fig_.savefig(path)
    plt.close(fig_)
    return path


def documented_plot(fig: Any, path: str) -> str:
    """Real tokens/s of the documented pipelines (default install) against Grain."""
    plt = _pyplot()
    # A pipeline the set also ran with the kernels on (the LLM pipeline: the column
    # path, as the default install runs it) is shown from that process.
    kinds = {
        n: "fast" if fig("fast", n, "ratio_to_grain") else "default" for n in ("llm", "readme")
    }
    names = [n for n in ("llm", "readme") if fig(kinds[n], n, "ratio_to_grain")]
    labels = {"llm": "LLM pipeline\n(TokenStores, to_training)", "readme": "README example"}
    f, ax = plt.subplots(figsize=(6.5, 3.4), dpi=120)
    x = range(len(names))
    w = 0.35
    for k, (side, color) in enumerate((("zephon_jax", ZEPHON), ("grain", GRAIN))):
        stats = [fig(kinds[n], n, "sides", side, "rate_median") for n in names]
        bars = _bars(ax, [i + (k - 0.5) * w for i in x], stats, w, 1e6, color=color,
                     label="zephon_jax (default install)" if k == 0 else "Grain")  # fmt: skip
        _label_bars(ax, bars, "{:.1f}")
    ax.set_xticks(list(x), [labels[n] for n in names], fontsize=8)
    ax.set_ylabel("real tokens/s (millions)")
    ax.set_title("Documented pipelines, rows of 2048, batch(64)", fontsize=10)
    ax.legend(fontsize=8, frameon=False)
    ax.margins(y=0.2)
    return _save(f, plt, path)


def throughput_plot(fig: Any, path: str) -> str:
    """Real tokens/s per packing case: the general path, compiled packing, Grain, and the
    lean Python reference as a dashed line."""
    plt = _pyplot()
    cases = _cases(fig, "default")
    f, ax = plt.subplots(figsize=(7.5, 3.8), dpi=120)
    x = range(len(cases))
    w = 0.21
    series = [
        ("zephon_jax, list (general path)", "default", "zephon_jax %s", ZEPHON, 0.55),
        ("zephon_jax, TokenArray (compiled)", "fast", TOKEN_ARRAY_SIDE, ZEPHON, 1.0),
        ("Grain first fit", "default", "grain first_fit", GRAIN, 1.0),
        ("Grain best fit", "default", "grain best_fit", GRAIN, 0.55),
    ]
    for k, (label, kind, side, color, alpha) in enumerate(series):
        stats = [
            fig(kind, *p, "sides", _side(side, m), "rate_median")
            for _, p, m in cases
        ]  # fmt: skip
        bars = _bars(ax, [i + (k - 1.5) * w for i in x], stats, w, 1e6, color=color,
                     alpha=alpha, label=label)  # fmt: skip
        _label_bars(ax, bars, "{:.0f}")
    refs = [fig("default", *p, "sides", LEAN, "rate_median") for _, p, _ in cases]
    ax.hlines([r.median / 1e6 if r else float("nan") for r in refs],
              [i - 2 * w for i in x], [i + 2 * w for i in x], colors=REFERENCE,
              linestyles="dashed", label="lean Python reference (no lineage, state or checks)")  # fmt: skip
    ax.set_xticks(list(x), [c[0] for c in cases], fontsize=8)
    ax.set_ylabel("real tokens/s (millions)")
    ax.set_title("Packing into rows of 2048 (median, bars: lowest-highest run)", fontsize=10)
    ax.legend(fontsize=7, frameon=False)
    ax.margins(y=0.15)
    return _save(f, plt, path)


def copy_plot(fig: Any, path: str) -> str:
    """Share of a contiguous copy of the batch's bytes (batches/s over copy batches/s)."""
    plt = _pyplot()
    cases = _cases(fig, "default")
    f, ax = plt.subplots(figsize=(7.5, 3.2), dpi=120)
    x = range(len(cases))
    w = 0.27
    series = [
        ("zephon_jax, list (general path)", "default", "zephon_jax %s", ZEPHON, 0.55),
        ("zephon_jax, TokenArray (compiled)", "fast", TOKEN_ARRAY_SIDE, ZEPHON, 1.0),
        ("Grain first fit", "default", "grain first_fit", GRAIN, 1.0),
    ]
    for k, (label, kind, side, color, alpha) in enumerate(series):
        stats = [
            fig(kind, *p, "share_of_copy", _side(side, m))
            for _, p, m in cases
        ]  # fmt: skip
        bars = _bars(ax, [i + (k - 1) * w for i in x], stats, w, 0.01, color=color,
                     alpha=alpha, label=label)  # fmt: skip
        _label_bars(ax, bars, "{:.2g} %")
    ax.set_yscale("log")
    ax.set_xticks(list(x), [c[0].replace("\n", ", ") for c in cases], fontsize=7)
    ax.set_ylabel("% of a contiguous copy's batches/s")
    ax.set_title("Speed as a share of copying the batch's bytes from contiguous memory",
                 fontsize=10)  # fmt: skip
    ax.legend(fontsize=7, frameon=False, loc="upper left")
    return _save(f, plt, path)


def lanes_plot(fig: Any, path: str) -> str:
    """Lane sweep: tokens/s, memory per lane and fresh-process restore against lanes."""
    plt = _pyplot()
    sweeps = [
        (label, kind, which, fig.first(kind, which, "rows") or [])
        for label, kind, which in (
            ("list (general path)", "default", "lanes"),
            ("TokenArray (compiled)", "fast", "lanes_token_array"),
        )
    ]
    sweeps = [s for s in sweeps if s[3]]
    labels = [str(r["num_lanes"]) for r in sweeps[0][3]]
    f, axes = plt.subplots(1, 3, figsize=(9, 3.0), dpi=120)
    panels = [
        ("real tokens/s (millions)", "tokens_per_s", 1e6, "{:.0f}"),
        ("resident memory per lane (KiB)", "rss_bytes_per_lane", 1024, "{:.0f}"),
        ("restore in a fresh process (s)", "restore_fresh_process_s", 1, "{:.2f}"),
    ]
    w = 0.8 / len(sweeps)
    for ax, (title, key, scale, fmt) in zip(axes, panels, strict=True):
        for k, (label, kind, which, rows) in enumerate(sweeps):
            stats = [fig(kind, which, "rows", str(i), key) for i in range(len(rows))]
            x = [i + (k - (len(sweeps) - 1) / 2) * w for i in range(len(rows))]
            alpha = 0.55 if kind == "default" and len(sweeps) > 1 else 1.0
            bars = _bars(ax, x, stats, w, scale, color=ZEPHON, alpha=alpha, label=label)
            _label_bars(ax, bars, fmt)
        ax.set_xticks(range(len(labels)), labels)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("lanes", fontsize=8)
        ax.margins(y=0.18)
        ax.tick_params(labelsize=8)
    axes[0].legend(fontsize=7, frameon=False, loc="lower left")
    b = fig.first(sweeps[0][1], sweeps[0][2], "settings", "batch_size")
    steps = fig.first(sweeps[0][1], sweeps[0][2], "settings", "steps_before_restore")
    f.suptitle(f"The same batches of {b} rows x 2048 made by more lanes (restore after "
               f"{steps} steps)", fontsize=10)  # fmt: skip
    return _save(f, plt, path)


def workers_plot(fig: Any, path: str) -> str:
    """Speed over no workers: zephon_jax's workers, its lanes in Grain's pool (own colour)."""
    plt = _pyplot()
    f, ax = plt.subplots(figsize=(8.5, 3.2), dpi=120)
    names = [n for n in ("heavy map", "heavy map + pack") if fig.first("default", "workers", n)]
    sides: list[str] = []
    for n in names:
        sides += [s for s in fig.first("default", "workers", n, "sides") if s not in sides]
    w = 0.8 / len(sides)
    for k, side in enumerate(sides):
        if side == "workers=0":
            continue
        label = side.split("=")[1] if side.startswith("workers=") else "grain_pool_2"
        stats = [fig("default", "workers", n, f"speedup_{label}") for n in names]
        pool = not side.startswith("workers=")
        bars = _bars(
            ax,
            [i + (k - (len(sides) - 1) / 2) * w for i in range(len(names))],
            stats,
            w,
            color=ADAPTER if pool else ZEPHON,
            alpha=1.0 if pool else 0.35 + 0.65 * k / max(1, len(sides) - 2),
            label=side if pool else side.replace("workers=", "zephon_jax, workers="),
        )
        _label_bars(ax, bars, "{:.2f}x")
    for i, n in enumerate(names):
        floor = fig("default", "workers", n, "process_floor", "speedup_2")
        if floor:
            ax.hlines(floor.median, i - 0.45, i + 0.45, colors="black", linestyles="dashed",
                      label="the map alone, 2 processes over 1" if i == 0 else None)  # fmt: skip
    ax.axhline(1.0, color=REFERENCE, linewidth=0.8)
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_ylabel("speed over no workers")
    ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.margins(y=0.25)
    prefetch = fig.first("default", "workers", "settings", "worker_prefetch")
    ax.set_title(f"Loader workers on {fig.meta['environment']['cpu_count']} cores "
                 f"(prefetch depth {prefetch} on both pools)", fontsize=10)  # fmt: skip
    return _save(f, plt, path)


def tokenize_plot(fig: Any, path: str) -> str:
    """Records/s of each tokenizer through each side."""
    plt = _pyplot()
    kinds = [k for k in fig.first("default", "tokenize") if k != "settings"]
    sides = list(fig.first("default", "tokenize", kinds[0], "sides"))
    f, ax = plt.subplots(figsize=(7.5, 3.2), dpi=120)
    w = 0.8 / len(sides)
    for k, side in enumerate(sides):
        stats = [fig("default", "tokenize", kind, "sides", side, "records_per_s") for kind in kinds]
        grain = side.startswith("grain")
        bars = _bars(ax, [i + (k - (len(sides) - 1) / 2) * w for i in range(len(kinds))], stats,
                     w, 1e3, color=GRAIN if grain else ZEPHON, alpha=(1.0, 0.6, 0.35)[k % 3],
                     label=side)  # fmt: skip
        _label_bars(ax, bars, "{:.1f}")
    ax.set_xticks(range(len(kinds)), kinds, fontsize=8)
    ax.set_ylabel("k records/s")
    ax.legend(fontsize=6, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.margins(y=0.25)
    ax.set_title("Tokenize + pack", fontsize=10)
    return _save(f, plt, path)


def draw_all(fig: Any, directory: str) -> list[str]:
    """Every plot the set has figures for, into ``directory`` (``fig``: ``report.Figures``)."""
    os.makedirs(directory, exist_ok=True)
    out = []
    if fig.has("default", "llm") or fig.has("default", "readme"):
        out.append(documented_plot(fig, os.path.join(directory, "bench_documented.png")))
    if fig.has("default", "packing"):
        out.append(throughput_plot(fig, os.path.join(directory, "bench_vs_grain.png")))
        out.append(copy_plot(fig, os.path.join(directory, "bench_copy.png")))
    if fig.has("default", "lanes") or fig.has("fast", "lanes_token_array"):
        out.append(lanes_plot(fig, os.path.join(directory, "bench_lanes.png")))
    if fig.has("default", "workers"):
        out.append(workers_plot(fig, os.path.join(directory, "bench_workers.png")))
    if fig.has("default", "tokenize"):
        out.append(tokenize_plot(fig, os.path.join(directory, "bench_tokenize.png")))
    return out
