"""Compiled kernels (numba, a dependency of the package) for the hot loops.

:func:`kernels` returns them, or ``None`` when numba cannot be imported or the
environment sets ``ZEPHON_JAX_COMPILED=0``; callers then take their Python
path, which gives the same results bit for bit. When numba cannot be imported
(and ``ZEPHON_JAX_COMPILED`` is not ``0``) the first call warns once per
process, in one line, that the loader runs interpreted and how to fix it. The
kernels live in
:mod:`zephon_jax.core.compiled_kernels` (imported only here, so a process that packs
no token array never imports numba); they are compiled the first time on a
machine and loaded from numba's on-disk cache by every later process and
loader worker.

``place``: places the pieces of a block of documents into one lane's open rows,
exactly as :meth:`~zephon_jax.operators.pack.BinPackOperator.step_block` does
(best_fit: the fullest row with room, the lowest of equals; first_fit: the
first row with room, in the order the rows opened; if none has room, the
fullest row is emitted and the piece starts a new row, for first_fit after the
others; a row is emitted once full or at ``max_segments``). ``gather``: writes packed rows into the batch arrays.
``permute``: the sampler's keyed permutation
(:func:`~zephon_jax.core.permutation.permute`), element by element.
"""

from __future__ import annotations

import os
import warnings
from types import SimpleNamespace
from typing import Any

from zephon_jax.core import kernel_codes

_KERNELS: Any = False  # not yet looked for


def kernels() -> Any:
    """The compiled kernels (``place``, ``gather``, ``permute``), or ``None`` without numba.

    Looked for once per process: ``ZEPHON_JAX_COMPILED=0`` gives ``None`` silently;
    otherwise a failed import of numba gives ``None`` and one warning.
    """
    global _KERNELS
    if _KERNELS is False:
        _KERNELS = None if os.environ.get("ZEPHON_JAX_COMPILED") == "0" else _compile()
    return _KERNELS


def loaded_kernels() -> Any:
    """The kernels if something already asked for them (a pipeline that packs token
    arrays), else ``None``: the sampler's permutation uses them then, without making
    every process that shuffles import numba."""
    return _KERNELS or None


def _compile() -> Any:
    try:
        from zephon_jax.core import compiled_kernels as compiled
    except ImportError as error:  # numba is not installed, or does not import
        _warn_interpreted(error)
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


# Stop codes of ``place`` (kept in kernel_codes, which the compiled kernels import).
DONE, OUT_FULL, ROW_FULL = kernel_codes.DONE, kernel_codes.OUT_FULL, kernel_codes.ROW_FULL
