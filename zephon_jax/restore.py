"""Restoring a lane: regenerating every element a lane state points to.

One rule for every operator, from the lineage forms of :mod:`zephon_jax.lineage`:
an output of a ``passthrough`` operator is its input; an ``Opaque`` lineage holds
its record; a ``(parents, recipe)`` lineage is ``operator.remake(recipe, parents'
data)``. The per-record transforms after the operator then apply again. All the
sampler records a state needs are read first, in one batched read per source.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from zephon_jax.checks import TransformFailed, user_error
from zephon_jax.errors import StateError, ZephonError
from zephon_jax.lineage import Element, Opaque, is_derived
from zephon_jax.transforms import DROP, apply_transforms

if TYPE_CHECKING:
    from zephon_jax.lane import Lane


class Rebuilder:
    """Regenerates the elements entering each stage of ``lane`` from their lineages.

    Stage ``k`` (``0 <= k < num_operators``) is the input of operator ``k``; stage
    ``num_operators`` holds the finished rows.
    """

    def __init__(self, lane: Lane):
        self.lane = lane
        self.roots: dict[Any, Any] = {}
        self.cache: dict = {}

    def _collect(self, stage: int, lineage, out: set) -> None:
        while stage > 0 and self.lane.plan.operators[stage - 1].passthrough:
            stage -= 1
        if stage == 0:
            if isinstance(lineage, (int, np.integer)) and not isinstance(lineage, bool):
                out.add(int(lineage))
            elif _is_mixture_root(lineage):
                out.add(lineage)
            return
        if is_derived(lineage):
            for parent in lineage[0]:
                self._collect(stage - 1, parent, out)

    def prefetch(self, held_by_stage, pending) -> None:
        """Reads every sampler record the lineages point to, in one batch."""
        positions: set[int] = set()
        for stage, held in enumerate(held_by_stage):
            for lineage in held:
                self._collect(stage, lineage, positions)
        for lineage in pending:
            self._collect(len(self.lane.plan.operators), lineage, positions)
        drawer = self.lane.drawer
        if drawer is not None:  # roots are (position, component, draw)
            roots = sorted(p for p in positions if _is_mixture_root(p))
            if roots:
                self.roots.update(drawer.regenerate(roots))
        elif positions:
            ordered = np.array(sorted(positions), dtype=np.int64)
            for position, item in zip(ordered.tolist(), self.lane.read_roots(ordered)):
                self.roots[position] = item

    def build(self, stage: int, lineage) -> Element:
        """The element with ``lineage`` entering ``stage``."""
        key = (stage, lineage) if not _has_opaque(lineage) else None
        try:
            cached = key is not None and key in self.cache
        except TypeError:
            raise StateError(
                f"lane {self.lane.lane}: the state holds {lineage!r} where a record pointer "
                "belongs (ints and tuples); the state is malformed"
            ) from None
        if cached:
            return self.cache[key]
        element = self._root(lineage) if stage == 0 else self._output(stage - 1, lineage)
        if key is not None:
            self.cache[key] = element
        return element

    def _root(self, lineage) -> Element:
        lane = self.lane
        if lane.drawer is not None:
            return self._mixture_root(lineage)
        if not isinstance(lineage, (int, np.integer)) or isinstance(lineage, bool) or lineage < 0:
            raise StateError(
                f"lane {lane.lane}: the state holds {lineage!r} where a lane-local sampler "
                "position (an int >= 0) belongs; the state is malformed"
            )
        position = int(lineage)
        item = self.roots.get(position)
        if item is None:
            item = lane.read_roots(np.array([position], dtype=np.int64))[0]
        if not isinstance(item, Element):
            raise StateError(
                f"lane {lane.lane}: the state points to lane-local position {position}, which "
                "the pipeline no longer produces (filtered or past the last epoch); the "
                "sources or functions changed since the state was taken"
            )
        return item

    def _mixture_root(self, lineage) -> Element:
        """A record drawn by a mixture by tokens or with stages: ``(position, component, draw)``."""
        lane = self.lane
        if not _is_mixture_root(lineage):
            raise StateError(
                f"lane {lane.lane}: the state holds {lineage!r} where a mixture draw "
                "(position, component, draw) belongs; the state is malformed or was taken "
                "with another pipeline"
            )
        item = self.roots.get(lineage)
        if item is None:
            item = lane.drawer.regenerate([lineage]).get(lineage)
        if not isinstance(item, Element):
            raise StateError(
                f"lane {lane.lane}: the state points to mixture draw {lineage!r}, which the "
                "pipeline no longer produces (filtered or past the last epoch); the sources "
                "or functions changed since the state was taken"
            )
        return item

    def _output(self, index: int, lineage) -> Element:
        """An output of operator ``index``, after the transforms that follow it."""
        lane = self.lane
        op = lane.plan.operators[index]
        post = lane.plan.post_transforms[index]
        try:
            if op.passthrough:
                data = self.build(index, lineage).data
            elif isinstance(lineage, Opaque):
                data = lineage.data
            elif is_derived(lineage):
                parents, recipe = lineage
                data = op.remake(recipe, [self.build(index, p).data for p in parents])
            else:
                raise StateError(
                    f"lane {lane.lane}: the state holds {lineage!r} as an output of "
                    f"{op.describe()}, which is not a (parents, recipe) pointer; the state is "
                    "malformed or was taken with another pipeline"
                )
            data = apply_transforms(post, data, lane.lane, index + 1, lineage)
        except ZephonError:
            raise
        except Exception as e:
            raise user_error(
                f"regenerating {op.describe()} output (restoring a state)",
                lane.where(lineage),
                e,
            ) from (e.__cause__ if isinstance(e, TransformFailed) else e)
        if data is DROP:
            raise StateError(
                f"lane {lane.lane}: element {lineage!r} is now dropped by a filter after "
                f"{op.describe()}; the pipeline's functions are not pure or changed"
            )
        return Element(data, lineage)


def _has_opaque(lineage) -> bool:
    if isinstance(lineage, Opaque):
        return True
    if isinstance(lineage, tuple):
        return any(_has_opaque(x) for x in lineage)
    return False


def _is_mixture_root(lineage) -> bool:
    return (
        type(lineage) is tuple
        and len(lineage) == 3
        and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in lineage)
    )
