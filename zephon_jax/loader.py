"""``Loader``: iterates global batches (or this process's rows of them) with resumable state."""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from zephon_jax.batching import RowProducer
from zephon_jax.dataset import BatchedDataset
from zephon_jax.errors import PipelineError
from zephon_jax.state import check_state, make_state


def process_rows(global_batch_size: int, process_index: int, process_count: int) -> range:
    """Rows ``[i*B/n, (i+1)*B/n)`` of a global batch of ``B`` rows held by process ``i`` of ``n``."""
    if isinstance(process_count, bool) or not isinstance(process_count, int) or process_count < 1:
        raise PipelineError(f"process_count must be a positive int; got {process_count!r}")
    if not isinstance(process_index, int) or not 0 <= process_index < process_count:
        raise PipelineError(
            f"process_index must be in [0, {process_count}); got {process_index!r}"
        )
    if global_batch_size % process_count:
        raise PipelineError(
            f"process_count={process_count} cannot hold global_batch_size={global_batch_size} "
            "evenly: every process gets the same number of rows, so the batch size must be a "
            "multiple of the process count"
        )
    per = global_batch_size // process_count
    return range(process_index * per, (process_index + 1) * per)


class Loader:
    """Iterates the batches of a :class:`~zephon_jax.dataset.BatchedDataset`.

    With ``process_index=i, process_count=n`` each batch is a dict of numpy
    arrays holding rows ``[i*B/n, (i+1)*B/n)`` of the global batch of ``B`` rows:
    the processes' batches concatenated in process order are the global batch,
    and row ``r`` of global batch ``t`` is the same on every topology.
    """

    def __init__(
        self,
        dataset: BatchedDataset,
        *,
        process_index: int = 0,
        process_count: int = 1,
    ):
        if not isinstance(dataset, BatchedDataset):
            raise PipelineError(
                f"Loader needs a batched dataset; got {type(dataset).__name__}: finish the "
                "pipeline with .batch(global_batch_size)"
            )
        self.dataset = dataset
        self.process_index = process_index
        self.process_count = process_count
        self.rows = process_rows(dataset.global_batch_size, process_index, process_count)

    def __iter__(self) -> LoaderIterator:
        return LoaderIterator(self)


class LoaderIterator(Iterator[Any]):
    """An iterator over batches with ``get_state()`` / ``set_state(state)``."""

    def __init__(self, loader: Loader):
        self.loader = loader
        self._fingerprint = loader.dataset.fingerprint()
        self._producer = RowProducer(loader.dataset, loader.rows)
        self.step = 0

    def __next__(self) -> Any:
        batch = self._producer.next_batch()
        if batch is None:
            raise StopIteration
        self.step += 1
        return batch

    def get_state(self) -> dict[str, Any]:
        """The state after the last batch returned; plain data covering this process's lanes."""
        return make_state(self._fingerprint, self.step, self._producer.lane_states())

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Continues from ``state`` (from any topology, if it covers this process's lanes).

        Raises :class:`~zephon_jax.errors.StateMismatchError` naming the field if
        the state comes from a different pipeline.
        """
        check_state(state, self._fingerprint)
        producer = RowProducer(self.loader.dataset, self.loader.rows)
        producer.restore(state)
        self._producer = producer
        self.step = int(state["step"])
