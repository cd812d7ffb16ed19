"""Which kernels a pipeline runs compiled: the column-wise packing and the sampler.

:func:`kernels` returns the compiled kernels of :mod:`zephon_jax.core.compiled_kernels`,
or ``None`` when numba cannot be imported, the environment sets
``ZEPHON_JAX_COMPILED=0``, or :func:`set_compiled` turned them off; token arrays then
pack on the general path, which places with the same kernel and gives the same
results bit for bit. When numba cannot be imported (and ``ZEPHON_JAX_COMPILED`` is
not ``0``) the first call warns once, in one line, that the loader runs interpreted
and how to fix it. The kernels are compiled the first time on a machine and loaded
from numba's on-disk cache by every later process and loader worker.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace
from typing import Any

from zephon_jax.core import compiled_kernels as compiled
from zephon_jax.errors import ZephonError

_SETTING: bool | None = None  # set_compiled's choice; None: the environment's
_KERNELS: Any = False  # not yet looked for


def set_compiled(enabled: bool | None) -> bool | None:
    """Chooses whether pipelines run the compiled kernels; returns the previous choice.

    ``False``: token arrays pack on the general path and the sampler permutes
    with numpy, as with ``ZEPHON_JAX_COMPILED=0``; ``True``: the compiled kernels
    (raises :class:`~zephon_jax.ZephonError`, naming the cause and the fix, where
    they are not compiled: numba does not import, or ``ZEPHON_JAX_COMPILED=0`` was
    set when zephon_jax was imported); ``None``: back to the default, the compiled
    kernels where numba imports unless ``ZEPHON_JAX_COMPILED=0`` (looked for again,
    so a missing numba warns again). The batches, states and provenance are the same
    bit for bit either way: the same kernel source runs interpreted.

    It takes effect for pipelines iterated afterwards (a loader's iterator, a
    ``verify`` or ``inspect`` run): the choice is made when an iterator plans its
    lanes, in this process and in the loader workers it starts. ``pack`` over
    records (the general path) places with the kernel as the process imported it;
    ``ZEPHON_JAX_COMPILED=0`` before the import runs that one interpreted too.
    """
    global _SETTING, _KERNELS
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(
            f"set_compiled takes True, False or None, not {enabled!r}: True runs the "
            "compiled kernels, False runs them interpreted, None restores the default"
        )
    if enabled and not compiled.COMPILED:
        raise ZephonError(_not_compiled_message()) from compiled.IMPORT_ERROR
    previous = _SETTING
    _SETTING = enabled
    _KERNELS = _kernel_namespace() if enabled else False
    return previous


def compiled_setting() -> bool | None:
    """The choice :func:`set_compiled` made last (``None``: the default)."""
    return _SETTING


def kernels() -> Any:
    """The compiled kernels (``place``, ``gather``, ``permute``), or ``None`` without numba.

    ``None`` after ``set_compiled(False)``. By default looked for once (again after
    ``set_compiled(None)``): ``ZEPHON_JAX_COMPILED=0`` gives ``None`` silently;
    otherwise a failed import of numba gives ``None`` and one warning.
    """
    global _KERNELS
    if _SETTING is False:
        return None
    if _KERNELS is False:
        _KERNELS = _compiled()
    return _KERNELS


def loaded_kernels() -> Any:
    """The kernels if something already asked for them (a pipeline that packs token
    arrays, or ``set_compiled(True)``), else ``None``: the sampler's permutation runs
    compiled then."""
    if _SETTING is False:
        return None
    return _KERNELS or None


def _compiled() -> Any:
    if not compiled.COMPILED:
        if compiled.IMPORT_ERROR is not None:
            _warn_interpreted(compiled.IMPORT_ERROR)
        return None
    return _kernel_namespace()


def _kernel_namespace() -> SimpleNamespace:
    return SimpleNamespace(
        place=compiled.place,
        draw_place=compiled.draw_place,
        gather=compiled.gather,
        collect_pieces=compiled.collect_pieces,
        take_front=compiled.take_front,
        permute=compiled.permute,
        mix64=compiled.mix64,
    )


def _not_compiled_message() -> str:
    """Why ``set_compiled(True)`` cannot be honoured, and the fix, in one line."""
    if compiled.IMPORT_ERROR is None:
        return (
            "set_compiled(True): the kernels were not compiled because ZEPHON_JAX_COMPILED=0 "
            "was set when zephon_jax was imported; unset it before importing zephon_jax, "
            "or leave the kernels interpreted (set_compiled(False) or None)"
        )
    cause = " ".join(str(compiled.IMPORT_ERROR).split())
    return (
        f"set_compiled(True): numba cannot be imported ({cause}), so the kernels cannot "
        "run compiled. Install numba (pip install 'numba>=0.59'; it is a dependency of "
        "zephon_jax), or leave the kernels interpreted (set_compiled(False) or None)"
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
