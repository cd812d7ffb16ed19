"""The stop codes of the packing kernel ``place`` (see :mod:`zephon_jax.core.kernels`).

Apart from the kernels' module so that the compiled kernels
(:mod:`zephon_jax.core.compiled_kernels`, which :mod:`zephon_jax.core.kernels` loads) import
them without importing their loader back.
"""

DONE, OUT_FULL, ROW_FULL = 0, 1, 2
