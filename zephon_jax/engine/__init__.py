"""The engine: lanes that run a pipeline, and the rows and states they give.

``lane`` (one lane: reads its sampler positions in blocks, runs the operators
and keeps their carries), ``blocks`` (read-ahead block sizes), ``columns`` (the
compiled column path of split and pack over token arrays), ``restore``
(regenerating what a lane state points to), ``rows`` (picking each process's
rows of a global batch from its lanes, and its state), ``provenance`` (which
records make each row) and ``explain`` (the provenance of a past step). Imports
:mod:`zephon_jax.dataset` and the layers below it (operators, sampler,
transforms, sources, state, core); never the loader, workers or tools.
"""
