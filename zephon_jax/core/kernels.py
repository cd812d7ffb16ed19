"""Which kernels a pipeline runs compiled: the column-wise packing and the sampler.

:func:`kernels` returns the compiled kernels of :mod:`zephon_jax.core.compiled_kernels`,
or ``None`` when numba cannot be imported or the environment sets
``ZEPHON_JAX_COMPILED=0``; token arrays then pack on the general path, which
places with the same kernel run interpreted and gives the same results bit for
bit. When numba cannot be imported (and ``ZEPHON_JAX_COMPILED`` is not ``0``)
the first call warns once per process, in one line, that the loader runs
interpreted and how to fix it. The kernels are compiled the first time on a
machine and loaded from numba's on-disk cache by every later process and
loader worker.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace
from typing import Any

from zephon_jax.core import compiled_kernels as compiled

_KERNELS: Any = False  # not yet looked for


def kernels() -> Any:
    """The compiled kernels (``place``, ``gather``, ``permute``), or ``None`` without numba.

    Looked for once per process: ``ZEPHON_JAX_COMPILED=0`` gives ``None`` silently;
    otherwise a failed import of numba gives ``None`` and one warning.
    """
    global _KERNELS
    if _KERNELS is False:
        _KERNELS = _compiled()
    return _KERNELS


def loaded_kernels() -> Any:
    """The kernels if something already asked for them (a pipeline that packs token
    arrays), else ``None``: the sampler's permutation runs compiled then."""
    return _KERNELS or None


def _compiled() -> Any:
    if not compiled.COMPILED:
        if compiled.IMPORT_ERROR is not None:
            _warn_interpreted(compiled.IMPORT_ERROR)
        return None
    return SimpleNamespace(
        place=compiled.place,
        gather=compiled.gather,
        permute=compiled.permute,
        mix64=compiled.mix64,
    )


def _warn_interpreted(error: ImportError) -> None:
    """Say, in one line, that packing runs interpreted without numba, and the fix."""
    cause = " ".join(str(error).split())  # one line
    warnings.warn(
        f"zephon_jax: numba cannot be imported ({cause}), so packing token arrays and "
        "the sampler run interpreted: the same batches, slower. Install "
        "numba (pip install 'numba>=0.59'; it is a dependency of zephon_jax) to compile "
        "them, or set ZEPHON_JAX_COMPILED=0 to run interpreted without this warning.",
        RuntimeWarning,
        stacklevel=2,
    )
