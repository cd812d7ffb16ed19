"""The saved form of a run: what a state is made of, on the wire and on disk.

``codec`` (the compact, self-checking encoding of plain data and lineages),
``envelope`` (the versions and the tagged, versioned forms of carries),
``lane_format`` (one lane's bytes: position, step, carries by pointer),
``global_state`` (the global state dict: fingerprint, checks, :func:`merge_states`)
and ``files`` (:func:`save_state` / :func:`load_state`). Imports only
:mod:`zephon_jax.core` and :mod:`zephon_jax.errors`: a state can be read, checked
and merged without building a pipeline. The Orbax handler that stores it is
:mod:`zephon_jax.checkpoint`, above the loader.
"""
