"""``Loader``: iterates global batches (or this process's rows of them) with resumable state."""

from __future__ import annotations

import functools
import time
from typing import Any, Iterator, Mapping, Sequence

from zephon_jax.core.checks import positive_int, timeout_seconds
from zephon_jax.core.gc_pause import paused_gc
from zephon_jax.dataset import BatchedDataset
from zephon_jax.engine.accounting_report import accounting
from zephon_jax.engine.lane import Lane, LanePlan
from zephon_jax.engine.provenance import rows_provenance
from zephon_jax.engine.rows import RowProducer, encode_snapshots
from zephon_jax.errors import PipelineError
from zephon_jax.state.global_state import check_state, exclusion_of, lane_bytes, make_state
from zephon_jax.workers.producer import StateAt, WorkerRowProducer, start_method_of


def process_rows(global_batch_size: int, process_index: int, process_count: int) -> range:
    """Rows ``[i*B/n, (i+1)*B/n)`` of a global batch of ``B`` rows held by process ``i`` of ``n``."""
    process_count = positive_int(process_count, "process_count")
    if not isinstance(process_index, int) or not 0 <= process_index < process_count:
        raise PipelineError(f"process_index must be in [0, {process_count}); got {process_index!r}")
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

    Without ``sharding``, with ``process_index=i, process_count=n``, each batch
    is a dict of numpy arrays holding rows ``[i*B/n, (i+1)*B/n)`` of the global
    batch of ``B`` rows: the processes' batches concatenated in process order are
    the global batch, and row ``r`` of global batch ``t`` is the same on every
    topology.

    With ``sharding`` (a ``jax.sharding.NamedSharding``, a pytree of them
    matching the batch fields, or a ``(Mesh, PartitionSpec)`` pair), each batch
    is a dict of global ``jax.Array`` values of ``B`` rows. The process and its
    devices come from jax; the process computes exactly the rows its devices
    hold (each once, even if several devices hold it) and the state covers the
    lanes behind those rows. ``device_prefetch`` batches are kept on the devices
    ahead of the one in use, built by a background thread (0: none); it never
    changes what :meth:`LoaderIterator.get_state` says was consumed.

    ``num_workers`` worker processes split this process's lanes between them;
    the batches do not depend on it. Each makes up to ``worker_prefetch``
    batches ahead; the performance guide ("Loader workers") says when workers
    help. A worker that sends nothing for ``worker_timeout_s`` seconds while the
    loader waits for it (its start, a batch, a state), or reads none of the loader's
    messages for that long while they fill its pipe, counts as hung: it is killed
    and :class:`~zephon_jax.errors.WorkerError` names it (``None``: wait forever).
    ``worker_start_method`` chooses how workers start: ``None`` (the default) forks
    them from a fork server that has loaded the package where the platform has one
    (Linux, macOS), and spawns them elsewhere; ``"spawn"`` makes each a new
    interpreter (slower to start; it reads the environment as it is then); see
    :func:`~zephon_jax.workers.producer.worker_context`.
    """

    def __init__(
        self,
        dataset: BatchedDataset,
        *,
        process_index: int | None = None,
        process_count: int | None = None,
        num_workers: int = 0,
        worker_prefetch: int = 8,
        worker_timeout_s: float | None = 300.0,
        worker_start_method: str | None = None,
        sharding: Any = None,
        device_prefetch: int = 2,
    ):
        if not isinstance(dataset, BatchedDataset):
            raise PipelineError(
                f"Loader needs a batched dataset; got {type(dataset).__name__}: finish the "
                "pipeline with .batch(global_batch_size)"
            )
        self.dataset = dataset
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise PipelineError(f"num_workers must be an int >= 0; got {num_workers!r}")
        if (
            isinstance(device_prefetch, bool)
            or not isinstance(device_prefetch, int)
            or device_prefetch < 0
        ):
            raise PipelineError(f"device_prefetch must be an int >= 0; got {device_prefetch!r}")
        self.num_workers = num_workers
        self.worker_prefetch = worker_prefetch
        self.worker_timeout_s = timeout_seconds(worker_timeout_s, "worker_timeout_s")
        self.worker_start_method = start_method_of(worker_start_method)
        self.device_prefetch = device_prefetch
        self.sharding: Any = None  # a BatchSharding with sharding
        if sharding is None:
            self.process_index = 0 if process_index is None else process_index
            self.process_count = 1 if process_count is None else process_count
            self._rows = {}
            for start, size in zip(dataset.batch_schedule.starts, dataset.batch_schedule.values):
                try:
                    self._rows[size] = process_rows(size, self.process_index, self.process_count)
                except PipelineError as e:
                    if not dataset.is_ramp:
                        raise
                    raise PipelineError(f"at step {start} of the batch-size ramp-up: {e}") from e
        else:
            self._init_sharded(sharding, process_index, process_count)

    @property
    def rows(self) -> Sequence[int]:
        """The global rows this process loads, in the order of its batch rows.

        With a batch-size ramp-up they depend on the step: see :meth:`rows_at`.
        """
        if self.dataset.is_ramp:
            raise PipelineError(
                "with a batch-size ramp-up the rows a process loads change with the step: "
                "use rows_at(step)"
            )
        return self._rows[self.dataset.batch_schedule.values[0]]

    def rows_at(self, step: int) -> Sequence[int]:
        """The global rows this process loads at global step ``step``."""
        return self._rows[self.dataset.batch_size_at(step)]

    def rows_of_size(self, size: int) -> Sequence[int]:
        """The global rows this process loads from a global batch of ``size`` rows."""
        return self._rows[size]

    def _init_sharded(
        self, sharding: Any, process_index: int | None, process_count: int | None
    ) -> None:
        import jax

        from zephon_jax.sharding import BatchSharding

        self.process_index = jax.process_index()
        self.process_count = jax.process_count()
        for name, given, actual in (
            ("process_index", process_index, self.process_index),
            ("process_count", process_count, self.process_count),
        ):
            if given is not None and given != actual:
                raise PipelineError(
                    f"{name}={given} was given with sharding, but jax says {actual}; with "
                    f"sharding the process comes from jax: drop {name}"
                )
        self.sharding = BatchSharding(sharding, self.dataset.batch_sizes)
        self._rows = {
            size: self.sharding.process_rows(self.process_index, size)
            for size in self.dataset.batch_sizes
        }
        if not any(self._rows.values()):
            raise PipelineError(
                f"the devices of process {self.process_index} hold no rows of the batch sharding; "
                "build the mesh over the devices of every process (e.g. zj.data_mesh())"
            )

    # ----- which process holds what ---------------------------------------------------
    def rows_of_process(self, process_index: int, size: int | None = None) -> Sequence[int]:
        """The global rows process ``process_index`` loads from a batch of ``size`` rows.

        ``size`` defaults to the constant batch size (required with a ramp-up).
        """
        if size is None:
            size = self.dataset.batch_size_at(0)
            if self.dataset.is_ramp:
                raise PipelineError("with a batch-size ramp-up, give the batch size: size=")
        if self.sharding is not None:
            return self.sharding.process_rows(process_index, size)
        return process_rows(size, process_index, self.process_count)

    def _lanes_of_process(self, process_index: int) -> set[int]:
        """The lanes behind the rows of process ``process_index`` at any step."""
        lanes: set[int] = set()
        for size in self.dataset.batch_sizes:
            per_lane = size // self.dataset.num_lanes
            lanes.update(r // per_lane for r in self.rows_of_process(process_index, size))
        return lanes

    @property
    def agree_on_end(self) -> bool:
        """Whether each process runs every lane of a finite input to end where the others do.

        Several jax processes agree through one all-gather per step instead (see
        :meth:`LoaderIterator.__next__`).
        """
        return self.sharding is None or self.process_count == 1

    @property
    def lanes(self) -> list[int]:
        """The lanes this process runs; its state covers them.

        Those behind its rows, or every lane of a finite input (see ``agree_on_end``).
        """
        if self.agree_on_end and self.dataset.is_finite:
            return list(range(self.dataset.num_lanes))
        return sorted(self._lanes_of_process(self.process_index))

    def lanes_to_save(self) -> list[int]:
        """The lanes this process writes in a checkpoint.

        Every lane is written exactly once: by the lowest-index process whose rows it owns.
        """
        if self.sharding is not None:
            lower = [p for p in self.sharding.process_indices() if p < self.process_index]
        else:
            lower = list(range(self.process_index))
        taken: set[int] = set()
        for p in lower:
            taken.update(self._lanes_of_process(p))
        return sorted(self._lanes_of_process(self.process_index) - taken)

    # ----- iteration ------------------------------------------------------------------
    def make_producer(self):
        """The row producer for this loader: in-process, or split over worker processes."""
        agree_on_end = self.agree_on_end
        if self.num_workers == 0:
            return RowProducer(self.dataset, self.rows_of_size, agree_on_end=agree_on_end)

        return WorkerRowProducer(
            self.dataset,
            self.rows_of_size,
            self.num_workers,
            self.worker_prefetch,
            start_method=self.worker_start_method,
            agree_on_end=agree_on_end,
            timeout_s=self.worker_timeout_s,
        )

    def __iter__(self) -> LoaderIterator:
        return LoaderIterator(self)


class LoaderIterator(Iterator[Any]):
    """An iterator over batches with ``get_state()`` / ``set_state(state)``."""

    def __init__(self, loader: Loader):
        self.loader = loader
        self._fingerprint = loader.dataset.fingerprint()
        self._producer = loader.make_producer()
        self.step = 0
        self._prefetcher: Any = None  # a DevicePrefetcher with device prefetch
        # Lane states after the last batch handed out, while the producer runs ahead.
        # (snapshots, or where worker processes keep them: see _snapshots)
        self._delivered: Any = None
        # What provenance() needs about the last batch: its rows' (lane, lineage) pairs,
        # or, from worker processes, the lane snapshots taken just before it.
        self._last_picks: list | None = None
        self._before_last: Any = None  # snapshots, or a function returning them (workers)
        # For metrics(): when next() was first called, seconds spent inside next(), rows.
        self._exclude: tuple = ()  # the documents excluded (see zephon_jax.exclude)
        self._first_next: float | None = None
        self._waited = 0.0
        self._rows = 0
        # Seconds spent putting batches onto devices (a list: the prefetch thread adds).
        self._device_seconds = [0.0]

    def __next__(self) -> Any:
        started = time.perf_counter()
        if self._first_next is None:
            self._first_next = started
        try:
            batch = self._next()
        finally:
            self._waited += time.perf_counter() - started
        self._rows += len(self.loader.rows_at(self.step - 1))
        return batch

    def metrics(self) -> dict[str, float]:
        """Figures for a dashboard, as a plain dict of numbers (ready for TensorBoard or
        W&B): ``step`` (the global step reached),
        ``rows`` (rows of this process delivered), ``seconds`` (wall time since the
        first ``next()``), ``rows_per_s``, ``wait_s`` (time the training loop spent
        waiting inside ``next()``) and ``wait_share`` (``wait_s / seconds``: near 0 when
        the loader keeps up, near 1 when it is the bottleneck).

        Then the time this process spent in each stage of making batches, batches
        made ahead included: ``lanes_s`` (its lanes reading records and running the
        operators; 0 with loader workers), ``workers_s`` (waiting for the loader
        workers' rows; 0 without), ``assemble_s`` (stacking rows into batch arrays)
        and ``device_s`` (putting batches onto the devices; 0 without a mesh). With
        device prefetch they run beside the training loop, so they tell where the
        loader's time goes, and ``wait_share`` whether the training loop feels it.
        Six clock reads a batch; no time per operator (the compiled path runs ``split``
        and ``pack`` as one kernel), for which a profiler is the tool.
        """
        seconds = 0.0 if self._first_next is None else time.perf_counter() - self._first_next
        stages = getattr(self._producer, "stage_seconds", {})
        return {
            "step": float(self.step),
            "rows": float(self._rows),
            "seconds": seconds,
            "rows_per_s": self._rows / seconds if seconds > 0 else 0.0,
            "wait_s": self._waited,
            "wait_share": self._waited / seconds if seconds > 0 else 0.0,
            "lanes_s": stages.get("lanes", 0.0),
            "workers_s": stages.get("workers", 0.0),
            "assemble_s": stages.get("assemble", 0.0),
            "device_s": self._device_seconds[0],
        }

    def _next(self) -> Any:
        sharding = self.loader.sharding
        if sharding is None or self.loader.device_prefetch == 0:
            return self._next_now(sharding)
        if self._prefetcher is None:
            self._start_prefetch()
        item = self._prefetcher.get()
        if not all(self._processes_with_batch(item is not None)):
            raise StopIteration
        batch, self._delivered, self._last_picks, self._before_last = item
        keep = getattr(self._producer, "keep_states_from", None)
        if keep is not None and self._before_last is not None:
            keep(self._before_last.index)  # the workers may drop older snapshots
        self.step += 1
        return batch

    def _next_now(self, sharding: Any) -> Any:
        """The next batch, made now (no device prefetch).

        Where several processes agree on the end (see :meth:`_processes_with_batch`),
        a batch that some but not all of them made is not delivered, and each puts
        its lanes back where the last delivered batch left them.
        """
        producer = self._producer
        last_picks = getattr(producer, "last_picks", None)
        # Worker processes keep the snapshots and send them only when asked.
        lazy = getattr(producer, "snapshots_before_last", None)
        eager = last_picks is None and lazy is None
        before = producer.lane_snapshots() if eager else None
        delivered = self._delivered_mark() if self._gathers_end() else None
        keep = getattr(producer, "keep_states_from", None)
        if keep is not None and delivered is not None:
            # Going back needs the workers' snapshots after the last batch delivered, and
            # provenance() those before it.
            keep(max(delivered.index - 1, 0))
        batch = producer.next_batch()
        every, some = self._processes_with_batch(batch is not None)
        if not every:
            if some and delivered is not None:
                self._go_back(delivered)
            raise StopIteration
        if sharding is not None:
            size = self.loader.dataset.batch_size_at(self.step)
            started = time.perf_counter()
            batch = sharding.make_global(self.loader.rows_of_size(size), batch, size)
            self._device_seconds[0] += time.perf_counter() - started
        self._last_picks = last_picks() if last_picks is not None else None
        self._before_last = lazy if lazy is not None else before
        self.step += 1
        return batch

    def _delivered_mark(self) -> Any:
        """The lanes' state after the last batch handed out: snapshots (cheap: no
        encoding), or where the workers keep them (no messages)."""
        producer = self._producer
        return getattr(producer, "state_at_last", producer.lane_snapshots)()

    def _go_back(self, delivered: Any) -> None:
        """Puts the producer back to ``delivered`` (see :meth:`_delivered_mark`): the
        state and accounting are then those after the last batch delivered, and
        :meth:`provenance` still describes that batch.

        Worker processes are sent back by a restore, after which they keep no snapshot
        from before it: those before the last batch delivered are fetched first.
        """
        if callable(self._before_last):
            self._before_last = self._producer.snapshots_at(
                StateAt(delivered.generation, delivered.index - 1)
            )
        lanes = encode_snapshots(self._snapshots(delivered))
        self._producer.restore(make_state(self._fingerprint, self.step, lanes, self._exclude))

    def provenance(self) -> list[list[dict[str, Any]]]:
        """The documents behind each row of the batch ``next()`` returned last.

        One list per row this process holds, in row order; each has one dict
        per segment, in segment-id order, with ``source`` (leaf index in the
        mixture order), ``label``, ``record``, ``epoch`` and the slice
        ``start``/``stop`` of the record (after its component's own transforms)
        that the segment holds. See :mod:`zephon_jax.engine.provenance`. It reads no
        record: it resolves the pointers the lanes already keep (with worker
        processes, it recomputes the batch's lanes once in this process).
        """

        if self.step == 0 or (self._last_picks is None and self._before_last is None):
            raise PipelineError(
                "provenance() describes the last batch next() returned, and there is none yet "
                "(or the iterator was just restored): call next() first"
            )
        if self._last_picks is not None:
            producer = self._producer
            return rows_provenance(
                producer.plan, self._last_picks, getattr(producer, "lanes", None)
            )

        replay = RowProducer(self.loader.dataset, self.loader.rows_of_size, agree_on_end=False)
        lanes = encode_snapshots(self._snapshots(self._before_last) or {})
        replay.restore(make_state(self._fingerprint, self.step - 1, lanes, self._exclude))
        replay.next_rows()
        return replay.provenance()

    def accounting(self) -> dict[str, Any]:
        """What the run has delivered so far, from the lanes' counters in the state.

        A dict with ``step`` (the global step reached), ``steps`` (batches delivered),
        ``skipped`` (batches passed over by :meth:`skip`), ``lanes`` (those counted),
        ``sources`` (per source, keyed by its provenance label: ``source`` its leaf
        index, ``tokens``, ``segments``, ``documents`` started and the highest
        ``epoch``, None before any) and ``stages`` (for a mixture by tokens or with
        weight stages, per stage: ``start``, ``weights``, the ``tokens`` of each
        component and their ``shares``; else empty). The figures equal the sum of
        :meth:`provenance` over every delivered batch (see
        :mod:`zephon_jax.engine.accounting`) and survive checkpoints and restores on any
        topology. This process counts the lanes it saves (:meth:`Loader.lanes_to_save`):
        with one process the figures are global, with several
        :func:`zephon_jax.merge_accounting` of every process's report is. Cost: one
        state of this process's lanes, O(lanes), not O(steps).

        After a finite input ends under several jax processes, the report is that of
        the last batch delivered, with or without device prefetch and loader workers.
        """
        loader = self.loader
        return accounting(self.get_state(), loader.dataset, lanes=loader.lanes_to_save())

    def skip(self, n: int) -> None:
        """Passes over the next ``n`` global batches without delivering them.

        The next batch is then the one an uninterrupted run delivers at step
        ``step + n``, on any topology; the state records the skip (its lanes are past
        those batches, and :meth:`accounting` counts them as ``skipped``, not their
        data), so a restore elsewhere continues the same way. This process's lanes make
        the skipped batches' rows (only not assembled), at about the cost of producing
        them. A finite input that ends within them ends the iteration.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise PipelineError(f"skip(n) needs an int n >= 0 (global batches); got {n!r}")
        if n == 0:
            return
        state = self.get_state()
        loader = self.loader
        producer = RowProducer(
            loader.dataset, loader.rows_of_size, agree_on_end=loader.agree_on_end
        )
        producer.restore(state)
        step = int(state["step"])
        for _ in range(n):
            if not producer.skip_rows():
                break
            step += 1
        self.set_state(make_state(self._fingerprint, step, producer.lane_states(), self._exclude))

    def _gathers_end(self) -> bool:
        """Whether the processes agree on the end of the input, one all-gather per step:
        several jax processes and a finite input (see :attr:`Loader.agree_on_end`)."""
        loader = self.loader
        return loader.sharding is not None and loader.process_count > 1 and loader.dataset.is_finite

    def _processes_with_batch(self, have_batch: bool) -> tuple[bool, bool]:
        """Whether every process, and whether some process, has its part of the next batch.

        A finite input can end a step earlier in one process's lanes than in
        another's; under jax with several processes they agree (one small
        all-gather per step, only for finite pipelines) so all stop together.
        """
        if not self._gathers_end():
            return have_batch, have_batch
        import numpy as np
        from jax.experimental import multihost_utils

        flags = multihost_utils.process_allgather(np.array([have_batch], dtype=np.int32))
        return bool(np.all(flags)), bool(np.any(flags))

    def _snapshots(self, lanes: Any) -> Any:
        """Lane snapshots from what ``__next__`` keeps: snapshots, a function returning
        them, or where the workers keep them (``StateAt``)."""
        if callable(lanes):
            return lanes()
        snapshots_at = getattr(self._producer, "snapshots_at", None)
        if snapshots_at is not None and lanes is not None and not isinstance(lanes, dict):
            return snapshots_at(lanes)
        return lanes

    def _start_prefetch(self) -> None:
        from zephon_jax.sharding import DevicePrefetcher

        producer, sharding = self._producer, self.loader.sharding
        rows_of_size, size_at = self.loader.rows_of_size, self.loader.dataset.batch_size_at
        next_step = [self.step]
        device_seconds = self._device_seconds

        # A closure, not a method: the thread must not keep this iterator alive.
        last_picks = getattr(producer, "last_picks", None)
        # Worker processes keep the snapshots: note where, fetch them only for a state.
        snapshot = getattr(producer, "state_at_last", producer.lane_snapshots)

        def produce():
            before = snapshot() if last_picks is None else None
            batch = producer.next_batch()
            if batch is None:
                return None
            size = size_at(next_step[0])
            next_step[0] += 1
            lanes = snapshot()
            picks = last_picks() if last_picks is not None else None
            started = time.perf_counter()
            batch = sharding.make_global(rows_of_size(size), batch, size)
            device_seconds[0] += time.perf_counter() - started
            return batch, lanes, picks, before

        self._delivered = snapshot()
        keep = getattr(producer, "keep_states_from", None)
        if keep is not None:
            keep(self._delivered.index)
        self._prefetcher = DevicePrefetcher(produce, self.loader.device_prefetch)

    def _stop_prefetch(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None

    def get_state(self) -> dict[str, Any]:
        """The state after the last batch returned; plain data covering this process's lanes."""
        if self._prefetcher is not None and self._delivered is not None:
            lanes = encode_snapshots(self._snapshots(self._delivered))
        else:
            lanes = self._producer.lane_states()
        return make_state(self._fingerprint, self.step, lanes, self._exclude)

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Continues from ``state`` (from any topology, if it covers this process's lanes).

        Raises :class:`~zephon_jax.errors.StateMismatchError` naming the field if
        the state comes from a different pipeline, and
        :class:`~zephon_jax.errors.StateError` if it misses a lane this process
        runs; the iterator is then unchanged.
        """
        check_state(state, self._fingerprint)
        with paused_gc(long_lived=True):  # one pause for decoding and rebuilding the lanes
            self._set_state(state)
        self.step = int(state["step"])
        self._exclude = exclusion_of(state)
        self._last_picks = self._before_last = None

    def _set_state(self, state: Mapping[str, Any]) -> None:
        """Checks every lane of ``state`` this process runs, then restores the producer
        (batches prefetched are dropped; a failed restore leaves the iterator where it was)."""
        # Every lane this process runs is checked (decoded once) before anything changes.
        producer = self._producer
        if isinstance(producer, RowProducer):
            restore = functools.partial(producer.restore, state, producer.check_state(state))
        else:
            plan = LanePlan(self.loader.dataset)
            for lane in self.loader.lanes:
                Lane(plan, lane).check_state(lane_bytes(state, lane))
            restore = functools.partial(producer.restore, state)
        if self._prefetcher is None or self._delivered is None:
            restore()
        else:
            delivered = make_state(
                self._fingerprint,
                self.step,
                encode_snapshots(self._snapshots(self._delivered)),
                self._exclude,
            )
            self._stop_prefetch()
            try:
                restore()
            except BaseException:
                self._producer.restore(delivered)
                raise

    def close(self) -> None:
        """Stops device prefetch and worker processes; the iterator cannot continue after."""
        self._stop_prefetch()
        close = getattr(self._producer, "close", None)
        if close is not None:
            close()

    def __del__(self) -> None:
        prefetcher = getattr(self, "_prefetcher", None)
        if prefetcher is not None:
            prefetcher.close()
