"""``window_shuffle``: a shuffle buffer of ``window`` elements per lane."""

from __future__ import annotations

import numpy as np

from zephon_jax.core.checks import positive_int
from zephon_jax.core.permutation import derive_key, hash_u64, permute
from zephon_jax.errors import StateError
from zephon_jax.operators.base import LineageOperator, Saved
from zephon_jax.state.envelope import is_int

_BLOCK = 256


class _Window:
    __slots__ = ("buffer", "count", "key", "_draws", "_draws_block")

    def __init__(self, key: int, buffer: list, count: int):
        self.key = key
        self.buffer = buffer
        self.count = count
        self._draws: list[int] = []
        self._draws_block = -1

    def draw(self, window: int) -> int:
        block = self.count // _BLOCK
        if block != self._draws_block:
            positions = np.arange(block * _BLOCK, (block + 1) * _BLOCK, dtype=np.uint64)
            self._draws = (hash_u64(positions, self.key) % np.uint64(window)).tolist()
            self._draws_block = block
        return self._draws[self.count - block * _BLOCK]


class WindowShuffleOperator(LineageOperator):
    """Holds ``window`` elements; each new one evicts a pseudorandom held one.

    The evicted slot for the ``c``-th element of a lane is a keyed hash of
    ``(seed, lane, c)``: no topology input. Carry: at most ``window`` elements
    (saved as pointers) and a counter. Elements pass through unchanged.
    """

    name = "window_shuffle"
    user_code = False
    passthrough = True

    def __init__(self, window: int, seed: int):
        self.window = positive_int(window, "window_shuffle(window)")
        self.max_held = self.window
        self.seed = int(seed)

    def init(self, lane):
        return _Window(derive_key(self.seed, lane), [], 0)

    def step(self, carry: _Window, element):
        if len(carry.buffer) < self.window:
            carry.buffer.append(element)
            return carry, []
        slot = carry.draw(self.window)
        carry.count += 1
        out = carry.buffer[slot]
        carry.buffer[slot] = element
        return carry, [out]

    def flush(self, carry: _Window):

        n = len(carry.buffer)
        order = permute(np.arange(n), n, derive_key(carry.key, carry.count)).tolist()
        out = [carry.buffer[i] for i in order]
        carry.buffer = []
        return carry, out

    def save(self, carry: _Window) -> Saved:
        return Saved(tuple(carry.buffer), carry.count)

    def load(self, saved: Saved, lane: int) -> _Window:

        count = saved.aux
        if not is_int(count) or count < 0 or len(saved.held) > self.window:
            raise StateError(
                f"the saved carry of {self.describe()} holds {len(saved.held)} elements after "
                f"{count!r} draws; the state was altered"
            )
        return _Window(derive_key(self.seed, lane), list(saved.held), int(count))

    def carry_bound(self) -> str:
        return f"{self.window} element pointers"

    def describe(self) -> str:
        return f"window_shuffle(window={self.window}, seed={self.seed})"
