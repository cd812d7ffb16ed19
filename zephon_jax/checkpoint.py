"""Orbax integration: save and restore a loader iterator inside a ``CheckpointManager``.

Use it as one item of a composite checkpoint::

    import zephon_jax.checkpoint as zc

    mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(params), data=zc.Save(it)))
    mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), data=zc.Restore(it)))

The item directory holds one file per lane, ``lane_00017.bin`` (the encoded
lane state, written by the lowest-index process running that lane), and
``meta.json`` (format, pipeline fingerprint, step, lane count, written by the
primary process). Nothing in it names a process or a device, so a checkpoint
restores onto any number of processes, devices and workers: each process reads
the lane files it needs. Orbax creates, synchronizes and finalizes the
directory; saving works with synchronous and asynchronous checkpointing.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import orbax.checkpoint as ocp
from etils import epath

from zephon_jax.loader import LoaderIterator
from zephon_jax.state.files import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_VERSION,
    META_FILE,
    lane_file,
    read_checkpoint_item,
)
from zephon_jax.state.global_state import EXCLUDE


def _check_iterator(iterator: Any, what: str) -> LoaderIterator:
    if not isinstance(iterator, LoaderIterator):
        raise TypeError(
            f"zephon_jax.checkpoint.{what} takes the iterator of a zephon_jax.Loader "
            f"(iter(loader)); got {type(iterator).__name__}"
        )
    return iterator


class LoaderCheckpointHandler(ocp.handlers.AsyncCheckpointHandler):
    """Saves the lanes a process owns and restores the lanes it runs; see the module doc.

    The state is taken when the save is requested; files are written in the
    background with asynchronous checkpointing, while training goes on.
    """

    def __init__(
        self, *, multiprocessing_options: ocp.options.MultiprocessingOptions | None = None
    ):
        options = multiprocessing_options or ocp.options.MultiprocessingOptions()
        self._primary_host = options.primary_host

    def _take(self, args: Save) -> tuple[dict[int, bytes], dict[str, Any] | None]:
        """The lane files this process writes and, on the primary process, the meta."""
        iterator = _check_iterator(args.iterator, "Save")
        state = iterator.get_state()
        lanes = {
            lane: state["lanes"][str(lane)].tobytes() for lane in iterator.loader.lanes_to_save()
        }
        meta = None
        if ocp.multihost.is_primary_host(self._primary_host):
            meta = {
                "format": CHECKPOINT_FORMAT,
                "version": CHECKPOINT_VERSION,
                "state_format": state["format"],
                "state_version": state["version"],
                "fingerprint": state["fingerprint"],
                "step": state["step"],
                "num_lanes": iterator.loader.dataset.num_lanes,
            }
            if EXCLUDE in state:  # the documents excluded (zephon_jax.exclude)
                meta[EXCLUDE] = state[EXCLUDE]
        return lanes, meta

    @staticmethod
    def _write(directory: epath.Path, lanes: dict[int, bytes], meta: dict[str, Any] | None) -> None:
        for lane, data in lanes.items():
            (directory / lane_file(lane)).write_bytes(data)
        if meta is not None:
            (directory / META_FILE).write_text(json.dumps(meta, indent=1))

    async def async_save(self, directory: epath.Path, args: Save) -> list[ocp.future.Future] | None:
        """Takes the iterator's state now; returns the future that writes it."""
        lanes, meta = self._take(args)

        async def write() -> None:
            self._write(directory, lanes, meta)

        return [ocp.future.CommitFutureAwaitingContractedSignals(write(), name="zephon_jax_save")]

    def save(self, directory: epath.Path, args: Save) -> None:
        """Writes the iterator's state now."""
        self._write(epath.Path(directory), *self._take(args))

    def restore(self, directory: epath.Path, args: Restore) -> LoaderIterator:
        """Restores ``args.iterator`` in place from the lane files it needs; returns it.

        Raises :class:`~zephon_jax.errors.StateMismatchError` naming the field if
        the checkpoint comes from another pipeline, :class:`StateError` if it is
        incomplete.
        """
        iterator = _check_iterator(args.iterator, "Restore")
        state = read_checkpoint_item(
            directory, iterator.loader.lanes, iterator.loader.dataset.fingerprint()
        )
        iterator.set_state(state)
        return iterator

    def metadata(self, directory: epath.Path) -> Any | None:
        path = epath.Path(directory) / META_FILE
        return json.loads(path.read_text()) if path.exists() else None

    def finalize(self, directory: epath.Path) -> None:
        pass

    def close(self) -> None:
        pass


@ocp.args.register_with_handler(LoaderCheckpointHandler, for_save=True)
@dataclasses.dataclass
class Save(ocp.args.CheckpointArgs):
    """Saves a loader iterator's position (``iterator = iter(zephon_jax.Loader(...))``)."""

    iterator: LoaderIterator


@ocp.args.register_with_handler(LoaderCheckpointHandler, for_restore=True)
@dataclasses.dataclass
class Restore(ocp.args.CheckpointArgs):
    """Restores a loader iterator in place (it must iterate the same pipeline)."""

    iterator: LoaderIterator
