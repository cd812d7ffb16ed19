"""Global ``jax.Array`` batches: which rows a process holds, building arrays, device prefetch.

Only the first axis of a batch (its rows) decides what a process computes: a
process asks the batch sharding which rows its addressable devices hold and
loads exactly those, once each, even when several of its devices hold the same
rows (axes the batch is replicated over, such as tensor parallelism). This
module imports ``jax`` itself, so ``import zephon_jax`` stays free of it.
"""

from __future__ import annotations

import atexit
import inspect
import queue
import threading
import weakref
from typing import Any, Callable, Iterable, Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from zephon_jax.errors import PipelineError


def as_named_sharding(sharding: Any, what: str = "sharding") -> NamedSharding:
    """A ``NamedSharding``, given one or a ``(mesh, PartitionSpec)`` pair."""
    if isinstance(sharding, NamedSharding):
        return sharding
    if (
        isinstance(sharding, tuple)
        and len(sharding) == 2
        and isinstance(sharding[0], Mesh)
        and isinstance(sharding[1], PartitionSpec)
    ):
        return NamedSharding(sharding[0], sharding[1])
    raise PipelineError(
        f"{what} must be a jax.sharding.NamedSharding or a (Mesh, PartitionSpec) pair; got "
        f"{type(sharding).__name__}: build one with NamedSharding(mesh, PartitionSpec('data'))"
    )


def data_mesh(
    num_devices: int | None = None, axis_name: str = "data", *, devices: Any = None
) -> Mesh:
    """A one-axis mesh for data parallelism whose axis is ``Auto`` on every JAX version.

    ``jax.make_mesh((n,), ("data",))`` gives ``Explicit`` axes from JAX 0.9 on:
    arrays sharded over it carry their sharding in their type (``int32[8@data,
    64]``), and a model written for automatic sharding (a Flax NNX ``Embed``, a
    gather) raises ``ShardingTypeError`` on them. This mesh is ``Auto``, as
    ``jax.sharding.Mesh`` and ``jax.make_mesh`` before 0.9 give: the same as
    ``jax.make_mesh((n,), (axis_name,), axis_types=(jax.sharding.AxisType.Auto,))``
    where that argument exists (JAX 0.5.3 and later).

    ``devices``: the devices of the mesh (default: ``jax.devices()``, every
    process's); ``num_devices``: use only the first that many of them.
    """
    devices = list(jax.devices() if devices is None else devices)
    if num_devices is not None:
        if isinstance(num_devices, bool) or not isinstance(num_devices, int):
            raise PipelineError(f"data_mesh(num_devices=...) needs an int; got {num_devices!r}")
        if not 1 <= num_devices <= len(devices):
            raise PipelineError(
                f"data_mesh(num_devices={num_devices}) needs between 1 and {len(devices)} "
                f"devices (there are {len(devices)}); pass fewer, or start more devices"
            )
        devices = devices[:num_devices]
    if not devices:
        raise PipelineError("data_mesh(devices=...) got no device; pass at least one")
    if not hasattr(jax, "make_mesh"):  # JAX before 0.4.34: Mesh is Auto
        return Mesh(np.array(devices), (axis_name,))
    kwargs: dict[str, Any] = {}
    axis_type = getattr(jax.sharding, "AxisType", None)
    if axis_type is not None and "axis_types" in inspect.signature(jax.make_mesh).parameters:
        kwargs["axis_types"] = (axis_type.Auto,)
    return jax.make_mesh((len(devices),), (axis_name,), devices=devices, **kwargs)


def _is_sharding_leaf(x: Any) -> bool:
    return isinstance(x, NamedSharding) or (
        isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], Mesh)
    )


class BatchSharding:
    """How a global batch of ``global_batch_size`` rows lies on the devices.

    ``global_batch_size`` may also be the sizes of a batch-size ramp-up (an
    iterable of ints); methods then take the ``size`` of the batch at hand.

    ``sharding`` is one ``NamedSharding`` for every field, a pytree of them
    matching the batch (e.g. ``{"tokens": s1, "mask": s2}``), or a
    ``(Mesh, PartitionSpec)`` pair in place of any ``NamedSharding``. The batch's
    first axis is its rows; trailing axes may be sharded too.
    """

    def __init__(self, sharding: Any, global_batch_size: int | Iterable[int]):
        sizes = (
            (global_batch_size,) if isinstance(global_batch_size, int) else tuple(global_batch_size)
        )
        self.sizes = tuple(sorted(set(sizes)))
        self.global_batch_size = self.sizes[0]
        leaves, self.treedef = jax.tree.flatten(sharding, is_leaf=_is_sharding_leaf)
        if not leaves:
            raise PipelineError("sharding is empty; give a NamedSharding for the batch")
        self.leaves = [as_named_sharding(s) for s in leaves]
        self.single = len(leaves) == 1 and _is_sharding_leaf(sharding)
        self._row_owners = {
            size: [self._row_map(s, size) for s in self.leaves] for size in self.sizes
        }

    def _row_map(self, sharding: NamedSharding, size: int) -> dict[Any, range]:
        """Device -> the global rows it holds, from the first entry of the spec."""
        spec = sharding.spec
        first = spec[0] if len(spec) else None
        axes = () if first is None else (first if isinstance(first, tuple) else (first,))
        shards = int(np.prod([sharding.mesh.shape[a] for a in axes], dtype=np.int64))
        if size % shards:
            raise PipelineError(
                f"the batch sharding {spec} splits rows into {shards} shards (mesh axes "
                f"{list(axes)}), which does not divide global_batch_size={size}; "
                "choose a batch size (every size of a ramp-up) that is a multiple of the "
                "number of batch shards"
            )
        rows_only = NamedSharding(sharding.mesh, PartitionSpec(first))
        indices = rows_only.devices_indices_map((size,))
        return {d: range(size)[index[0]] for d, index in indices.items()}

    def process_rows(self, process_index: int, size: int | None = None) -> list[int]:
        """The sorted global rows the devices of process ``process_index`` hold (any field).

        ``size``: the global batch size (default: the smallest).
        """
        rows: set[int] = set()
        for owners in self._row_owners[self.global_batch_size if size is None else size]:
            for device, held in owners.items():
                if device.process_index == process_index:
                    rows.update(held)
        return sorted(rows)

    def process_indices(self) -> list[int]:
        """Every process holding part of the batch."""
        owners = self._row_owners[self.global_batch_size]
        return sorted({d.process_index for per_leaf in owners for d in per_leaf})

    def shardings_for(self, batch: Any) -> Any:
        """The batch's pytree of ``NamedSharding`` objects (one sharding for every field)."""
        if self.single:
            return jax.tree.map(lambda _: self.leaves[0], batch)
        batch_def: Any = jax.tree.structure(batch)  # a PyTreeDef: jaxlib ships no stubs for it
        if batch_def != self.treedef:
            raise PipelineError(
                f"the sharding pytree {self.treedef} does not match the batch {batch_def}; give "
                "one NamedSharding per batch field (same keys), or a single NamedSharding for all"
            )
        return jax.tree.unflatten(self.treedef, self.leaves)

    def make_global(self, rows: list[int], local: Any, size: int | None = None) -> Any:
        """Global ``jax.Array`` values of ``size`` rows from ``local`` (first axis: ``rows``).

        All processes must produce the same trailing shape for a field; rows a
        device holds are copied from ``local``, never recomputed.
        """
        size = self.global_batch_size if size is None else size
        position = np.full(size, -1, dtype=np.int64)
        position[np.asarray(rows, dtype=np.int64)] = np.arange(len(rows))
        shardings = self.shardings_for(local)
        return jax.tree.map(
            lambda x, s: _global_array(np.asarray(x), s, position, size),
            local,
            shardings,
        )


def _global_array(local: np.ndarray, sharding: NamedSharding, position: np.ndarray, batch: int):
    if local.ndim < max(1, len(sharding.spec)):
        raise PipelineError(
            f"a batch field of shape {local.shape[1:]} per row cannot take the sharding "
            f"{sharding.spec}, which names {len(sharding.spec)} axes; give that field a "
            "PartitionSpec with at most as many entries as it has axes"
        )
    global_shape = (batch,) + local.shape[1:]

    def shard(index: Any) -> np.ndarray:  # a tuple of slices, one per axis
        held = position[index[0]]
        if (
            held.size
            and held[0] >= 0
            and np.array_equal(held, np.arange(held[0], held[0] + held.size))
        ):
            part = local[held[0] : held[0] + held.size]
        else:
            if held.size and held.min() < 0:  # pragma: no cover - rows come from the same sharding
                raise PipelineError("a device asked for rows this process did not load")
            part = local[held]
        return part[(slice(None),) + tuple(index[1:])]

    return jax.make_array_from_callback(global_shape, sharding, shard)


_END = object()
_LIVE: weakref.WeakSet = weakref.WeakSet()


class DevicePrefetcher:
    """A background thread keeping up to ``depth`` batches already placed on devices.

    ``produce()`` returns ``(batch, lane_states)`` or ``None`` at the end; each
    batch keeps the lane states taken right after it was produced, so a loader
    reports the state of the last batch it *handed out*, never of prefetched ones.
    """

    def __init__(self, produce: Callable[[], tuple[Any, Mapping[int, bytes]] | None], depth: int):
        self._produce = produce
        self._slots = threading.Semaphore(depth)
        self._ready: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._fill, name="zephon_jax-device-prefetch", daemon=True
        )
        _LIVE.add(self)
        self._thread.start()

    def _fill(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._slots.acquire(timeout=0.05):
                    continue
                if self._stop.is_set():
                    return
                item = self._produce()
                if item is None:
                    self._ready.put(_END)
                    return
                self._ready.put(item)
        except BaseException as e:  # handed to the consumer, raised from next()
            self._ready.put(e)

    def get(self) -> tuple[Any, Mapping[int, bytes]] | None:
        """The next ``(batch, lane_states)``; ``None`` at the end; re-raises producer errors."""
        while True:
            try:
                item = self._ready.get(timeout=0.5)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._ready.empty():
                    raise RuntimeError("the device prefetch thread stopped unexpectedly") from None
        if item is _END:
            self._ready.put(_END)  # stays at the end
            return None
        if isinstance(item, BaseException):
            self._ready.put(item)
            raise item
        self._slots.release()
        return item

    def close(self, timeout: float | None = None) -> None:
        """Stops the thread (after the batch it is producing) and drops prefetched batches."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
        while not self._ready.empty():
            self._ready.get_nowait()


@atexit.register
def _close_all() -> None:
    # A prefetch thread still placing arrays while the interpreter exits can crash it.
    for prefetcher in list(_LIVE):
        prefetcher.close(timeout=5.0)
