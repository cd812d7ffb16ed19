"""Loader worker processes: rows computed in child processes, identical to the engine's.

``producer`` (:class:`~zephon_jax.workers.producer.WorkerRowProducer`, what the
loader uses), ``protocol`` (the messages and their encoding), ``child`` (the worker
process's loop), ``parent`` (starting, talking to and supervising a worker),
``assembly`` (the batch from the workers' rows), ``pipes`` (framed messages over
pipes) and ``shared_slots`` (shared-memory slots that carry batches without copies). A worker runs the
:mod:`zephon_jax.engine` on its lanes; the parent gets the same rows and states
as an in-process run. Imports the engine and the layers below it; only
:mod:`zephon_jax.loader` imports it.
"""
