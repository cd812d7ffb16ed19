"""Per-record functions with a real Python cost, for the worker benchmarks.

They live in a module of their own so that worker processes can import them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

LOOP = 300  # iterations of pure Python per record: about 15-25 us on one core


def _busy(n: int) -> int:
    acc = 0
    for i in range(n):
        acc = (acc * 31 + i) & 0xFFFF
    return acc


def heavy_record_map(record: dict[str, Any]) -> dict[str, Any]:
    """A map spending about 20 us of pure Python per record (tokenizer-like work)."""
    return {"x": record["x"] + (_busy(LOOP) & 1)}


def heavy_document_map(record: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same cost per document, returning its tokens (a cleaning or tokenizing step)."""
    _busy(LOOP)
    return {"tokens": record["tokens"]}
