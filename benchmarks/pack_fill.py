"""Fill of ``pack`` by method and open rows, on the operator alone.

Lengths uniform in ``1..2048`` (the benchmark's uniform corpus, nothing split),
three shuffled epochs, rows of 2048: the share of real tokens in the emitted rows.
Fill depends only on the lengths and the rules, so one run is exact.

    python benchmarks/pack_fill.py
"""

from __future__ import annotations

import numpy as np
from corpus import make_corpus

from zephon_jax.core.lineage import Element
from zephon_jax.operators import BinPackOperator

SEQ_LEN = 2048
ROWS = (8, 32, 128, 512)


def fill(method: str, num_bins: int, elements: list[Element]) -> float:
    """Real tokens over row slots of the rows ``pack`` emits over ``elements``."""
    op = BinPackOperator(SEQ_LEN, method, num_bins=num_bins)
    _, rows = op.step_block(op.init(0), elements)
    return sum(sum(e.lineage[1]) for e in rows) / (SEQ_LEN * len(rows))


def main() -> None:
    docs = make_corpus(20000, max_len=SEQ_LEN, seed=1)
    rng = np.random.default_rng(0)
    order = np.concatenate([rng.permutation(len(docs)) for _ in range(3)])
    elements = [Element({"tokens": docs[i]["tokens"]}, p) for p, i in enumerate(order)]
    print("| method | " + " | ".join(f"{r} rows" for r in ROWS) + " |")
    print("|---|" + "---:|" * len(ROWS))
    for method in ("first_fit", "best_fit"):
        fills = " | ".join(f"{fill(method, r, elements):.3f}" for r in ROWS)
        print(f"| {method} | {fills} |")


if __name__ == "__main__":
    main()
