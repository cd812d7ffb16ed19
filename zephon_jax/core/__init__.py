"""The vocabulary every layer shares: lineage, packed rows, hashing, kernels, checks.

``lineage`` (the record pointers an element carries and the named forms they
take), ``packed`` (the packed-row type, its spec and the one row assembly),
``permutation`` (the keyed hash and permutation: the only source of randomness),
``kernels`` / ``compiled_kernels`` (the hot loops, compiled with numba where it is
installed), ``naming`` (how a user function enters a fingerprint), ``checks``
(argument checks and user-error wrapping), ``gc_pause`` and ``status_line``.
Imports only :mod:`zephon_jax.errors` and third-party packages; every other
layer may import it (layers: ``docs/architecture.md``, checked by ``lint-imports``).
"""
