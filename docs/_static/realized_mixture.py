"""Draws ``realized_mixture.png``: the realized mixture of a staged mixture by tokens,
from ``it.accounting()`` sampled every few steps, beside the stages' weights.

Run from anywhere: ``python docs/_static/realized_mixture.py`` (needs matplotlib). The
pipeline is the accounting example of ``docs/debugging_loss_spikes.md`` run for longer;
the figures come from a deterministic run, so a rerun draws the same curves.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("agg")

import matplotlib.pyplot as plt  # noqa: E402

import zephon_jax as zj  # noqa: E402

OUT = Path(__file__).resolve().parent / "realized_mixture.png"
STEPS, STAGE, EVERY = 200, 100, 2  # steps run, the second stage's start, sampling period
WEIGHTS = {0: [0.8, 0.2], STAGE: [0.5, 0.5]}
NAMES = ["docs", "code"]


def dataset() -> zj.BatchedDataset:
    """The two-source mixture by tokens with two stages, split, packed and batched."""
    docs = [{"tokens": np.arange(n, dtype=np.int32)} for n in range(1, 400)]
    code = [{"tokens": np.full(n, 7, dtype=np.int32)} for n in range(1, 120)]
    sources = [zj.Dataset.source(docs, name="docs"), zj.Dataset.source(code, name="code")]
    return zj.Dataset.mix(sources, weights=WEIGHTS, unit="tokens").split(64).pack(64).batch(8)


def sample(steps: int, every: int) -> tuple[list[int], np.ndarray]:
    """The steps sampled and, at each, every stage's realized token shares so far
    (``[step, stage, component]``), from ``it.accounting()`` every ``every`` steps."""
    it = iter(zj.Loader(dataset()))
    at, shares = [], []
    for t in range(1, steps + 1):
        next(it)
        if t % every == 0:
            at.append(t)
            shares.append([stage["shares"] for stage in it.accounting()["stages"]])
    return at, np.array(shares)


def draw(at: list[int], shares: np.ndarray) -> plt.Figure:
    """Each component's realized share in its stage (solid) beside its weight (dashed)."""
    fig, ax = plt.subplots(figsize=(8, 3.2))
    starts = sorted(WEIGHTS) + [STEPS]
    steps = np.asarray(at)
    for k, (start, end) in enumerate(zip(starts, starts[1:])):
        inside = (steps > start) & (steps <= end)
        for c, (name, color) in enumerate(zip(NAMES, ("tab:blue", "tab:orange"))):
            label = name if k == 0 else None
            ax.plot(steps[inside], shares[inside, k, c], color=color, label=label)
            weight = WEIGHTS[start][c]
            ax.hlines(weight, start, end, colors=color, linestyles="--", lw=1)
        ax.axvline(start, color="0.7", lw=0.8)
    ax.set_ylim(0, 1)
    ax.set_xlim(0, STEPS)
    ax.set_xlabel("step")
    ax.set_ylabel("share of the stage's tokens")
    ax.set_title("realized mixture (solid) vs weights (dashed), per stage", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    return fig


def main() -> None:
    at, shares = sample(STEPS, EVERY)
    draw(at, shares).savefig(OUT, dpi=110, metadata={"Software": None})
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
