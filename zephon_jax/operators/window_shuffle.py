"""``window_shuffle``: a shuffle buffer of ``window`` elements per lane."""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from zephon_jax.core.checks import positive_int
from zephon_jax.core.lineage import Element
from zephon_jax.core.permutation import derive_key, hash_u64, permute
from zephon_jax.errors import StateError
from zephon_jax.operators.base import Saved
from zephon_jax.operators.contract import ContractOperator
from zephon_jax.state.envelope import is_int


class WindowCarry(NamedTuple):
    """The carry of a lane: the held elements, the elements evicted so far, the lane's key."""

    buffer: tuple
    evicted: int
    key: int


class WindowShuffleOperator(ContractOperator):
    """Holds ``window`` elements; each new one evicts a pseudorandom held one.

    The evicted slot for the ``c``-th element of a lane is a keyed hash of
    ``(seed, lane, c)``: no topology input. Carry: at most ``window`` elements
    (saved as pointers) and a counter. Elements pass through unchanged.
    """

    may_pack = False  # declared for the engine (see LineageOperator)

    def __init__(self, window: int, seed: int):
        self.window = positive_int(window, "window_shuffle(window)")
        self.seed = int(seed)
        super().__init__(
            "window_shuffle",
            self._init,
            self._step,
            self._flush,
            max_held=self.window,
            describe=f"window_shuffle(window={self.window}, seed={self.seed})",
            carry_bound=f"{self.window} element pointers",
            step_block=self._step_block_fast,
            save=self._save,
            load=self._load,
            user_code=False,
        )

    def _init(self, lane: int) -> WindowCarry:
        return WindowCarry((), 0, derive_key(self.seed, lane))

    def _slots(self, carry: WindowCarry, n: int) -> list[int]:
        """The slots the next ``n`` elements evict."""
        positions = np.arange(carry.evicted, carry.evicted + n, dtype=np.uint64)
        return (hash_u64(positions, carry.key) % np.uint64(self.window)).tolist()

    def _step(self, carry: WindowCarry, element: Element):
        buffer = carry.buffer
        if len(buffer) < self.window:
            return WindowCarry(buffer + (element,), carry.evicted, carry.key), []
        (slot,) = self._slots(carry, 1)
        buffer = buffer[:slot] + (element,) + buffer[slot + 1 :]
        return WindowCarry(buffer, carry.evicted + 1, carry.key), [carry.buffer[slot]]

    def _step_block_fast(self, carry: WindowCarry, elements: Sequence[Element]):
        """The fold of ``_step`` over ``elements``, with one copy of the buffer per block."""
        buffer = list(carry.buffer)
        room = self.window - len(buffer)
        buffer += elements[:room]
        rest = elements[room:]
        outputs = []
        if rest:
            for slot, element in zip(self._slots(carry, len(rest)), rest):
                outputs.append(buffer[slot])
                buffer[slot] = element
        return WindowCarry(tuple(buffer), carry.evicted + len(rest), carry.key), outputs

    def _flush(self, carry: WindowCarry):
        n = len(carry.buffer)
        order = permute(np.arange(n), n, derive_key(carry.key, carry.evicted)).tolist()
        return WindowCarry((), carry.evicted, carry.key), [carry.buffer[i] for i in order]

    def _save(self, carry: WindowCarry) -> Saved:
        return Saved(carry.buffer, carry.evicted)

    def _load(self, saved: Saved, lane: int) -> WindowCarry:
        count = saved.aux
        if not is_int(count) or count < 0 or len(saved.held) > self.window:
            raise StateError(
                f"the saved carry of {self.describe()} holds {len(saved.held)} elements after "
                f"{count!r} draws; the state was altered"
            )
        return WindowCarry(tuple(saved.held), int(count), derive_key(self.seed, lane))
