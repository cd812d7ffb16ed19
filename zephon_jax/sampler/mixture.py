"""Weighted mixtures with exact long-run proportions and no lane resonance.

Each lane draws its own mixture schedule: a binary tree of two-way splits,
each a Bresenham sequence ``left_count(k) = (k * a + phase) >> 32`` in exact
integer arithmetic, with ``a`` the left share in units of ``2**-32`` and a
per-lane phase. Every lane therefore receives each component in proportion
(to within one draw per split), whatever the lane count, and the sub-index a
component sees is a bijection onto ``0, 1, 2, ...``. With ``order_seed`` the
schedule is also permuted inside lane-local blocks of ``BLOCK`` draws: which
component each draw of a block goes to is shuffled, keeping the per-block
counts exact, while each component still receives its own draws in order
(component draw ``k`` comes before ``k + 1``). A lane therefore reads every
component front to back, as it reads an unmixed source, and never runs ahead
into a later epoch of it (permuting the component draws themselves would: the
last draws of a block sit many component draws ahead of its first). Within a
block, a lane's count of a component strays from its exact share by at most
``BLOCK / 4`` draws; the small block keeps lanes close to each other, so one
epoch of a component ends on every lane at nearly the same time (see
``docs/mixtures.md``, "Epochs").
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from typing import Any, Iterable

import numpy as np

from zephon_jax.core.permutation import derive_key, permute
from zephon_jax.errors import PipelineError

_ONE = 1 << 32
BLOCK = 64  # draws whose order a shuffled mixture permutes; see the module doc
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
        if self.order_seed is None:
            comp, sub = route_draws(self.weights, self.node_key, lane, draws)
        else:
            comp, sub = self._route_ordered(lane, draws)
        return [(comp == i, sub[comp == i]) for i in range(len(self.children))]

    def _route_ordered(self, lane: int, draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(component, component draw) of each lane draw, in the order-seeded schedule."""
        assert self.order_seed is not None
        block = draws // BLOCK
        offset = draws - block * BLOCK
        comp = np.empty(draws.shape, dtype=np.int64)
        sub = np.empty(draws.shape, dtype=np.int64)
        for b in np.unique(block).tolist():
            sel = block == b
            key = (self.weights, self.node_key, self.order_seed, lane, b)
            block_comp, block_sub = _ordered_block(*key)
            comp[sel] = block_comp[offset[sel]]
            sub[sel] = block_sub[offset[sel]]
        return comp, sub

    def _split(self, lane: int, lo: int, mid: int, hi: int) -> tuple[int, int]:
        """Left share (units of 2**-32) and per-lane phase of the split of [lo, hi) at mid."""
        return _split_share(self.weights, self.node_key, lane, lo, mid, hi)

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


def _split_share(
    weights: tuple[float, ...], node_key: int, lane: int, lo: int, mid: int, hi: int
) -> tuple[int, int]:
    """Left share (units of 2**-32) and per-lane phase of the split of [lo, hi) at mid."""
    left_w = sum(weights[lo:mid])
    share = min(_ONE - 1, max(1, round(left_w / sum(weights[lo:hi]) * _ONE)))
    return share, derive_key(node_key, lane, lo, hi) % _ONE


def route_draws(
    weights: tuple[float, ...], node_key: int, lane: int, draws: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(component, component draw) of each draw of ``lane`` in the unpermuted schedule."""
    comp = np.zeros(draws.shape, dtype=np.int64)
    sub = draws.astype(np.int64, copy=True)
    _route(weights, node_key, lane, 0, len(weights), sub, comp, np.ones(draws.shape, bool))
    return comp, sub


def _route(weights, node_key, lane, lo, hi, sub, comp, mask) -> None:
    """Routes the draws under ``mask`` down the two-way splits of components [lo, hi)."""
    if hi - lo == 1:
        comp[mask] = lo
        return
    mid = (lo + hi) // 2
    share, phase = _split_share(weights, node_key, lane, lo, mid, hi)
    k = sub[mask].astype(np.uint64)
    a, p = np.uint64(share), np.uint64(phase)
    before = (k * a + p) >> np.uint64(32)
    after = ((k + np.uint64(1)) * a + p) >> np.uint64(32)
    is_left = after > before
    idx = np.flatnonzero(mask)
    sub[idx] = np.where(is_left, before.astype(np.int64), (k - before).astype(np.int64))
    left_mask = np.zeros_like(mask)
    left_mask[idx[is_left]] = True
    right_mask = np.zeros_like(mask)
    right_mask[idx[~is_left]] = True
    _route(weights, node_key, lane, lo, mid, sub, comp, left_mask)
    _route(weights, node_key, lane, mid, hi, sub, comp, right_mask)


@functools.lru_cache(maxsize=4096)
def _ordered_block(
    weights: tuple[float, ...], node_key: int, order_seed: int, lane: int, block: int
) -> tuple[np.ndarray, np.ndarray]:
    """(component, component draw) of each offset of one block of ``BLOCK`` lane draws.

    The block's components are those of the unpermuted draws of the block, in a
    keyed pseudorandom order of its slots, so each component receives exactly its
    unpermuted count per block; each component's draws in the block then take
    that component's draws of the block in increasing order. Cached (under
    1 KB an entry, 4096 entries at most): a lane reads a block over several takes.
    """
    key = derive_key(order_seed, node_key, lane, block)
    slots = permute(np.arange(BLOCK, dtype=np.int64), BLOCK, key)
    comp, sub = route_draws(weights, node_key, lane, block * BLOCK + slots)
    for c in np.unique(comp).tolist():
        where = np.flatnonzero(comp == c)  # this component's offsets, in draw order
        sub[where] = np.sort(sub[where])
    # Kept small: component ids fit the smallest type, component draws are < MAX_DRAWS.
    block_comp = comp.astype(np.min_scalar_type(len(weights) - 1))
    block_sub = sub.astype(np.uint32)
    block_comp.flags.writeable = False
    block_sub.flags.writeable = False
    return block_comp, block_sub
