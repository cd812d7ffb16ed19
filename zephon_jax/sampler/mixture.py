"""Weighted mixtures with exact long-run proportions and no lane resonance.

Each lane draws its own mixture schedule: a binary tree of two-way splits,
each a Bresenham sequence ``left_count(k) = (k * a + phase) >> 32`` in exact
integer arithmetic, with ``a`` the left share in units of ``2**-32`` and a
per-lane phase. Every lane therefore receives each component in proportion
(to within one draw per split), whatever the lane count, and the sub-index a
component sees is a bijection onto ``0, 1, 2, ...``. With ``order_seed`` the
schedule is also permuted inside lane-local blocks of ``BLOCK`` draws, which
keeps the per-block counts exact while making the order pseudorandom.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Iterable

import numpy as np

from zephon_jax.errors import PipelineError
from zephon_jax.sampler.permutation import derive_key, permute

_ONE = 1 << 32
BLOCK = 1024
MAX_DRAWS = _ONE
MIN_SHARE = 1 / _ONE  # the schedule's resolution


def normalize_weights(weights: Any) -> tuple[float, ...]:
    """Validates mixture weights and returns them normalized to sum to one.

    Weights are real numbers (not bools or text), finite and > 0, of any
    magnitude: they are scaled by the largest before summing, so ``[1e308, 1e308]``
    normalizes to ``(0.5, 0.5)`` instead of overflowing. A weight whose share is
    below ``2**-32`` of the total is rejected: the schedule resolves shares in
    units of ``2**-32``, so its proportion could not be kept.
    """
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Iterable):
        raise PipelineError(f"mixture weights must be a sequence of numbers; got {weights!r}")
    values = []
    for i, w in enumerate(weights):
        if isinstance(w, (bool, np.bool_)) or not isinstance(w, numbers.Real):
            raise PipelineError(
                f"mixture weight {i} is {w!r} ({type(w).__name__}); weights must be numbers "
                "(int or float)"
            )
        values.append(float(w))
    if not values:
        raise PipelineError("Dataset.mix needs at least one dataset and one weight")
    for i, w in enumerate(values):
        if math.isnan(w) or math.isinf(w) or w <= 0:
            raise PipelineError(
                f"mixture weight {i} is {w!r}; every weight must be a finite number > 0 "
                "(drop a component instead of giving it weight 0)"
            )
    largest = max(values)
    scaled = [w / largest for w in values]  # in [0, 1]: the sum cannot overflow
    total = math.fsum(scaled)
    normalized = tuple(w / total for w in scaled)
    for i, share in enumerate(normalized):
        if share < MIN_SHARE:
            raise PipelineError(
                f"mixture weight {i} ({values[i]!r}) is {share:.3g} of the total, below the "
                f"smallest share a mixture keeps (2**-32, about {MIN_SHARE:.3g}); drop the "
                "component or raise its weight"
            )
    return normalized


@dataclasses.dataclass(frozen=True)
class MixtureNode:
    """Mixes child sampler nodes with the given (normalized) weights."""

    children: tuple
    weights: tuple[float, ...]
    order_seed: int | None = None
    transforms: tuple = ()
    node_key: int = 0
    # The seed given to Dataset.shuffle (order_seed derives from it), for messages only.
    given_seed: int | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        if len(self.children) != len(self.weights):
            raise PipelineError(
                f"Dataset.mix got {len(self.children)} datasets but {len(self.weights)} weights; "
                "give one weight per dataset"
            )

    def split(self, lane: int, draws: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Routes lane-local draws to children: [(mask, child_draws)] per child."""
        draws = draws.astype(np.int64)
        if draws.size and int(draws.max()) >= MAX_DRAWS:
            raise PipelineError("a lane drew more than 2**32 records from one mixture")
        if self.order_seed is not None:
            block = draws // BLOCK
            offset = draws - block * BLOCK
            order = np.empty_like(draws)
            for b in np.unique(block):
                sel = block == b
                key = derive_key(self.order_seed, self.node_key, lane, int(b))
                order[sel] = permute(offset[sel], BLOCK, key)
            draws = block * BLOCK + order
        comp = np.zeros(draws.shape, dtype=np.int64)
        sub = draws.copy()
        self._route(lane, 0, len(self.weights), sub, comp, np.ones(draws.shape, dtype=bool))
        return [(comp == i, sub[comp == i]) for i in range(len(self.children))]

    def _split(self, lane: int, lo: int, mid: int, hi: int) -> tuple[int, int]:
        """Left share (units of 2**-32) and per-lane phase of the split of [lo, hi) at mid."""
        left_w = sum(self.weights[lo:mid])
        share = min(_ONE - 1, max(1, round(left_w / sum(self.weights[lo:hi]) * _ONE)))
        return share, derive_key(self.node_key, lane, lo, hi) % _ONE

    def _route(self, lane, lo, hi, sub, comp, mask) -> None:
        if hi - lo == 1:
            comp[mask] = lo
            return
        mid = (lo + hi) // 2
        share, phase = self._split(lane, lo, mid, hi)
        k = sub[mask].astype(np.uint64)
        a, p = np.uint64(share), np.uint64(phase)
        before = (k * a + p) >> np.uint64(32)
        after = ((k + np.uint64(1)) * a + p) >> np.uint64(32)
        is_left = after > before
        left_sub = before.astype(np.int64)
        right_sub = (k - before).astype(np.int64)
        idx = np.flatnonzero(mask)
        sub[idx] = np.where(is_left, left_sub, right_sub)
        left_mask = np.zeros_like(mask)
        left_mask[idx[is_left]] = True
        right_mask = np.zeros_like(mask)
        right_mask[idx[~is_left]] = True
        self._route(lane, lo, mid, sub, comp, left_mask)
        self._route(lane, mid, hi, sub, comp, right_mask)

    def draws_available(self, lane: int, child_draws: list[int | None]) -> int | None:
        """The lane-local draw from which every child is past its last valid draw.

        ``child_draws[i]`` is how many draws child ``i`` can serve (None: unbounded).
        Draws before the result that land on an exhausted child are skipped by the
        lane; from the result on, none is valid. None if some child is unbounded.
        """
        end = self._draws_needed(lane, 0, len(self.weights), child_draws)
        if end is None or self.order_seed is None or end == 0:
            return end
        return -(-end // BLOCK) * BLOCK  # the order is permuted inside blocks

    def _draws_needed(self, lane, lo, hi, child_draws) -> int | None:
        if hi - lo == 1:
            return child_draws[lo]
        mid = (lo + hi) // 2
        left = self._draws_needed(lane, lo, mid, child_draws)
        right = self._draws_needed(lane, mid, hi, child_draws)
        if left is None or right is None:
            return None
        share, phase = self._split(lane, lo, mid, hi)

        def first(count_at, target: int) -> int:
            lo_k, hi_k = 0, 1
            while count_at(hi_k) < target:
                hi_k *= 2
            while lo_k < hi_k:
                k = (lo_k + hi_k) // 2
                if count_at(k) >= target:
                    hi_k = k
                else:
                    lo_k = k + 1
            return lo_k

        def left_count(k: int) -> int:
            return (k * share + phase) >> 32

        return max(first(left_count, left), first(lambda k: k - left_count(k), right))

    def describe(self) -> dict:
        return {
            "mix": [c.describe() for c in self.children],
            "weights": [float(f"{w:.12g}") for w in self.weights],  # 12 significant digits
            "order_seed": self.order_seed,
            "transforms": [t.describe() for t in self.transforms],
        }
