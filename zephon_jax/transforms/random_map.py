"""``random_map``: a map that also receives a numpy Generator.

The generator is seeded from the transform's seed and the record's position
(lane, stage and lineage) only, never from process or worker ids, so the same
record gets the same randomness on every topology and after every resume.
"""

from __future__ import annotations

import zlib
from typing import Any, Callable

import numpy as np

from zephon_jax.core.checks import unwrap_grain
from zephon_jax.core.naming import callable_name
from zephon_jax.core.permutation import derive_key
from zephon_jax.state import codec


def flatten_ints(lineage: Any, out: list[int]) -> list[int]:
    """Flattens a lineage (nested tuples of ints) into a list of ints."""
    if isinstance(lineage, tuple):
        out.append(-1 - len(lineage))
        for item in lineage:
            flatten_ints(item, out)
    elif isinstance(lineage, (int, np.integer)):
        out.append(int(lineage))
    else:
        out.append(zlib.crc32(codec.encode(lineage)))
    return out


class RandomMapTransform:
    """Wraps ``fn(record, rng) -> record`` or a Grain ``RandomMapTransform``."""

    def __init__(self, fn: Callable[[Any, np.random.Generator], Any] | Any, seed: int):

        self._fn = unwrap_grain(fn, "random_map", "random_map")
        self.seed = int(seed)
        self.name = callable_name(fn)

    def apply(self, record: Any, rng_key: tuple) -> Any:
        lane, stage, lineage = rng_key
        key = derive_key(self.seed, lane, stage, *flatten_ints(lineage, []))
        rng = np.random.Generator(np.random.Philox(key=key))
        return self._fn(record, rng)

    def describe(self) -> str:
        return f"random_map({self.name}, seed={self.seed})"
