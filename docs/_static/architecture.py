"""Draws ``architecture.svg``: the layer stack of zephon_jax and what flows through a step.

Run from anywhere: ``python docs/_static/architecture.py`` (needs matplotlib). The
output is reproducible (no date, fixed ids), so a rerun changes the file only
when this script changes.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("svg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = Path(__file__).resolve().parent / "architecture.svg"

# Bottom to top, as in pyproject.toml [tool.importlinter]; "|": side by side, independent.
LAYERS = [
    ("errors", "error types: cause and fix"),
    ("core", "lineage, packed rows, keyed permutation, kernels"),
    ("sharding | attention", "rows on devices; segment masks"),
    ("state", "lane format, global state, files"),
    ("transforms | sources", "pure per-record maps; random-access sources"),
    ("sampler", "(lane, position) -> (leaf, record, epoch)"),
    ("operators", "n-to-m with explicit carry"),
    ("dataset", "Dataset / BatchedDataset: the definition"),
    ("engine", "lanes, restore, rows of a global batch"),
    ("workers", "lanes in child processes"),
    ("loader", "Loader, LoaderIterator, get/set_state"),
    ("checkpoint | grain_interop", "Orbax handler; Grain wrapper"),
    ("tools", "the zephon-jax command"),
]

# The flow of one step, top to bottom: (label, detail, colour).
FLOW = [
    ("lane-local position p", "lane l, p = 0, 1, 2, ...", "#e8eef9"),
    ("draw", "sampler: (leaf, record, epoch)", "#e8eef9"),
    ("block of records", "one __getitems__ per source", "#eaf5ea"),
    ("element", "data + lineage (p)", "#eaf5ea"),
    ("operators, stage by stage", "step_block over carries", "#fdf1e1"),
    ("packed row", "PackedRow: pieces, not copies", "#fdf1e1"),
    ("lane's R rows of step t", "rows [l*R, (l+1)*R)", "#f6e8f3"),
    ("global batch t", "numpy dict, or jax.Array", "#f6e8f3"),
]

STATE_FLOW = [
    ("lane snapshot", "position, step, carries, pending"),
    ("lane state", "bytes + CRC-32 (lane)"),
    ("global state", "fingerprint, step, lanes"),
    ("checkpoint item", "lane_NNNNN.bin + meta.json"),
]


def box(ax, x, y, w, h, title, detail, colour, size=9.5):
    ax.add_patch(
        FancyBboxPatch(
            (x, y),
            w,
            h,
            boxstyle="round,pad=0.02,rounding_size=0.08",
            linewidth=0.9,
            edgecolor="#555555",
            facecolor=colour,
        )
    )
    ax.text(x + w / 2, y + h * 0.64, title, ha="center", va="center", fontsize=size, weight="bold")
    ax.text(x + w / 2, y + h * 0.28, detail, ha="center", va="center", fontsize=size - 1.8)


def arrow(ax, start, end, colour="#333333", style="-|>", dashed=False):
    ax.add_patch(
        FancyArrowPatch(
            start,
            end,
            arrowstyle=style,
            mutation_scale=11,
            linewidth=1.0,
            color=colour,
            linestyle="--" if dashed else "-",
        )
    )


def draw_layers(ax) -> None:
    x, w, h, gap = 0.3, 4.4, 0.62, 0.1
    ax.text(x + w / 2, 10.25, "Layers (imports point down only)", ha="center", fontsize=11)
    ax.text(x + w / 2, 9.95, "checked by lint-imports", ha="center", fontsize=8, color="#555555")
    for i, (name, detail) in enumerate(LAYERS):
        y = 0.2 + i * (h + gap)
        shade = "#f2f2f2" if i % 2 else "#ffffff"
        if name in ("engine", "workers", "loader"):
            shade = "#fff6d6"  # the layers a step runs through
        box(ax, x, y, w, h, name, detail, shade, size=9)
    arrow(ax, (x - 0.12, 9.5), (x - 0.12, 0.3), colour="#888888")
    ax.text(x - 0.22, 4.9, "may import", rotation=90, ha="center", va="center", fontsize=8)


FLOW_X, FLOW_W, FLOW_H = 6.1, 3.1, 0.78


def flow_ys() -> list[float]:
    """The bottom of each box of the step's flow, top to bottom."""
    return [9.05 - i * (FLOW_H + 0.4) for i in range(len(FLOW))]


def draw_flow(ax) -> None:
    x, w, h = FLOW_X, FLOW_W, FLOW_H
    ax.text(x + w / 2, 10.25, "One step t: the lanes, then the batch", ha="center", fontsize=11)
    ax.text(
        x + w / 2, 9.95, "engine/lane.py, engine/rows.py", ha="center", fontsize=8, color="#555555"
    )
    ys = flow_ys()
    for y, (title, detail, colour) in zip(ys, FLOW):
        box(ax, x, y, w, h, title, detail, colour)
    for upper, lower in zip(ys, ys[1:]):
        arrow(ax, (x + w / 2, upper), (x + w / 2, lower + h))
    side = [
        (1, "sampler/"),
        (2, "sources/"),
        (3, "transforms/"),
        (4, "operators/"),
        (6, "engine/"),
        (7, "loader, sharding"),
    ]
    for i, text in side:
        ax.text(x - 0.08, ys[i] + h / 2, text, ha="right", va="center", fontsize=7.5, color="#555")


def draw_state(ax) -> None:
    x, w, h, gap, top = 10.2, 3.1, 0.78, 0.6, 7.45
    ax.text(x + w / 2, 10.25, "The cursor, saved", ha="center", fontsize=11)
    ax.text(x + w / 2, 9.95, "pointers, never tokens", ha="center", fontsize=8, color="#555555")
    ys = [top - i * (h + gap) for i in range(len(STATE_FLOW))]
    for y, (title, detail) in zip(ys, STATE_FLOW):
        box(ax, x, y, w, h, title, detail, "#eef6f7")
    for upper, lower in zip(ys, ys[1:]):
        arrow(ax, (x + w / 2, upper), (x + w / 2, lower + h))
    notes = ["encode_lane_state", "get_state / merge_states", "checkpoint.Save"]
    for y, text in zip(ys[1:], notes):
        ax.text(x + w + 0.08, y + h + gap / 2, text, ha="left", va="center", fontsize=7.2)
    flow = flow_ys()
    right = FLOW_X + FLOW_W + 0.02
    # After the lane's rows of step t: its position, carries and pending rows.
    arrow(ax, (right, flow[6] + FLOW_H / 2), (x, ys[0] + h / 2), colour="#3a7f8c", dashed=True)
    # Restore: the state's lineages regenerate the carries, on any topology.
    low = flow[4] + FLOW_H / 2
    arrow(ax, (x + 0.25, ys[-1]), (x + 0.25, 1.2), colour="#3a7f8c", style="-")
    arrow(ax, (x + 0.25, 1.2), (right, low), colour="#3a7f8c")
    ax.text(
        x + 0.35,
        1.25,
        "restore: re-read positions,\nre-apply transforms, remake\n(engine/restore.py)",
        ha="left",
        va="top",
        fontsize=7.5,
        color="#3a7f8c",
    )


def main() -> None:
    plt.rcParams["svg.fonttype"] = "none"  # text stays text: small, searchable
    plt.rcParams["svg.hashsalt"] = "zephon_jax-architecture"  # stable element ids
    plt.rcParams["font.family"] = "DejaVu Sans"
    fig, ax = plt.subplots(figsize=(14.6, 10.6))
    ax.set_xlim(-0.2, 14.4)
    ax.set_ylim(0, 10.5)
    ax.axis("off")
    draw_layers(ax)
    draw_flow(ax)
    draw_state(ax)
    fig.savefig(OUT, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
    plt.close(fig)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
