"""Naming user functions: how a callable enters the pipeline fingerprint and error messages.

:func:`callable_name` names a function by module, qualified name and the plain-data
values of its closure, so that two pipelines that differ only in a closure's
value have different fingerprints.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from typing import Any


def callable_name(fn: Any) -> str:
    """How a user function enters the fingerprint and error messages.

    A function is named by module and qualified name, plus the plain-data values
    of its closure; a ``functools.partial`` by its function and arguments; a
    callable object (or a bound method's object) by its class and its public
    attributes (``__dict__`` entries not starting with ``_``). See :func:`describe_value` for what "plain
    data" shows.
    """
    return _describe_callable(fn, _DEPTH)


_DEPTH = 4  # nesting followed through partials, closures and attributes
_MAX_TEXT = 200  # longer descriptions of a value are replaced by a digest


def _qualified(target: Any) -> str:
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    name = name or type(target).__qualname__
    return f"{module}.{name}" if module else name


def _describe_callable(fn: Any, depth: int) -> str:
    if isinstance(fn, functools.partial):
        args = [describe_value(a, depth - 1) for a in fn.args]
        args += [f"{k}={describe_value(v, depth - 1)}" for k, v in sorted(fn.keywords.items())]
        return f"partial({', '.join([_describe_callable(fn.func, depth - 1), *args])})"
    if inspect.ismethod(fn):
        return f"{_describe_object(fn.__self__, depth - 1)}.{fn.__func__.__name__}"
    if inspect.isfunction(fn):
        name = _qualified(fn)
        cells = [c for c in (fn.__closure__ or ()) if _has_contents(c)]
        if not cells:
            return name
        free = fn.__code__.co_freevars
        values = [
            f"{var}={describe_value(cell.cell_contents, depth - 1)}"
            for var, cell in zip(free, fn.__closure__ or ())
            if _has_contents(cell)
        ]
        return f"{name}[{', '.join(values)}]"
    if inspect.isclass(fn) or inspect.isbuiltin(fn) or inspect.isroutine(fn):
        return _qualified(fn)
    return _describe_object(fn, depth)


def _has_contents(cell: Any) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:  # an empty cell (a variable not yet assigned)
        return False
    return True


def _describe_object(obj: Any, depth: int) -> str:
    """``module.Class(attr=value, ...)`` over the public attributes in ``__dict__``.

    Attributes whose names start with ``_`` are left out: they hold caches and
    handles that may change while the pipeline runs, not parameters.
    """
    name = _qualified(type(obj))
    attrs = getattr(obj, "__dict__", None)
    if not isinstance(attrs, dict) or depth <= 0:
        return f"{name}(...)" if attrs else f"{name}()"
    shown = [
        f"{k}={describe_value(v, depth - 1)}"
        for k, v in sorted(attrs.items())
        if isinstance(k, str) and not k.startswith("_")  # private: caches, handles
    ]
    return f"{name}({', '.join(shown)})"


def describe_value(value: Any, depth: int = _DEPTH) -> str:
    """A stable text for a function argument or attribute, for the fingerprint.

    Plain data is shown by value: ``None``, bools, ints, floats, strings, bytes,
    numpy scalars and arrays (dtype, shape and a SHA-256 of the contents), and
    lists, tuples and dicts of them. Functions, partials and callable objects are
    described by :func:`callable_name`. Anything else shows only its type, as
    ``<module.Type>``: its contents are invisible to the fingerprint. A text
    longer than 200 characters is replaced by its SHA-256.
    """
    import numpy as np

    if value is None or isinstance(value, (bool, int, float, str, np.generic)):
        text = repr(value)
    elif isinstance(value, (bytes, bytearray)):
        text = repr(bytes(value))
    elif isinstance(value, np.ndarray):
        if value.dtype.kind in "biufcSU":
            digest = hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()[:16]
            text = f"array({value.dtype.str}, {value.shape}, sha256:{digest})"
        else:
            text = f"<numpy.ndarray of {value.dtype}>"
    elif depth <= 0:
        text = f"<{_qualified(type(value))}>"
    elif isinstance(value, (list, tuple)):
        items = ", ".join(describe_value(v, depth - 1) for v in value)
        text = (
            f"[{items}]"
            if isinstance(value, list)
            else f"({items}{',' if len(value) == 1 else ''})"
        )
    elif isinstance(value, dict):
        items = ", ".join(
            f"{describe_value(k, depth - 1)}: {describe_value(v, depth - 1)}"
            for k, v in sorted(value.items(), key=lambda kv: repr(kv[0]))
        )
        text = "{" + items + "}"
    elif callable(value):
        text = _describe_callable(value, depth)
    else:
        text = f"<{_qualified(type(value))}>"
    if len(text) > _MAX_TEXT:
        text = f"sha256:{hashlib.sha256(text.encode()).hexdigest()[:32]}"
    return text
