"""``TokenArray``: documents held as one flat token array and their offsets, in memory.

Document ``i`` is ``tokens[offsets[i]:offsets[i + 1]]``. Read as a source it
gives ``{field: view}`` records like any other; a pipeline of the shape
``source(TokenArray) [.shuffle] [.repeat] [.split(S)] .pack(S) .batch(B)`` reads
it column-wise instead and, with numba (a dependency of the package), packs
with compiled kernels (see :mod:`zephon_jax.operators.token_bins`): the same
rows and states, several times faster. ``tokens`` may be a ``np.memmap``.
"""

from __future__ import annotations

import hashlib
import mmap
from typing import Any, Sequence

import numpy as np

from zephon_jax.errors import PipelineError


class TokenArray:
    """A random-access source of documents cut from one flat 1-D token array.

    ``offsets`` (int64, ``len + 1`` entries) starts at 0, never decreases and ends
    at ``len(tokens)``. Records are ``{field: tokens[offsets[i]:offsets[i + 1]]}``,
    read-only views (no copy). Picklable (the arrays travel with it).
    """

    def __init__(
        self, tokens: np.ndarray, offsets: Sequence[int] | np.ndarray, field: str = "tokens"
    ):
        tokens = tokens if isinstance(tokens, np.ndarray) else np.asarray(tokens)
        if tokens.ndim != 1 or tokens.dtype.kind not in "iuf":
            raise PipelineError(
                f"TokenArray needs a 1-D array of numbers as tokens; got dtype {tokens.dtype} "
                f"with shape {tokens.shape}"
            )
        offsets = np.asarray(offsets)
        if offsets.ndim != 1 or len(offsets) < 2 or offsets.dtype.kind not in "iu":
            raise PipelineError(
                "TokenArray needs offsets as a 1-D integer array of len(documents) + 1 entries "
                f"(at least one document); got dtype {offsets.dtype} with shape {offsets.shape}"
            )
        offsets = offsets.astype(np.int64)
        if offsets[0] != 0 or offsets[-1] != len(tokens):
            raise PipelineError(
                f"TokenArray offsets must start at 0 and end at len(tokens) = {len(tokens)}; "
                f"they run from {int(offsets[0])} to {int(offsets[-1])}"
            )
        bad = np.flatnonzero(np.diff(offsets) < 0)
        if len(bad):
            i = int(bad[0])
            raise PipelineError(
                f"TokenArray offsets must not decrease; offsets[{i}] = {int(offsets[i])} > "
                f"offsets[{i + 1}] = {int(offsets[i + 1])}"
            )
        if not isinstance(field, str):
            raise PipelineError(f"TokenArray(field=) needs a str; got {field!r}")
        if tokens.flags.writeable:
            tokens = tokens.view()
            tokens.flags.writeable = False  # the records are views: nobody writes through them
        offsets.flags.writeable = False
        self.tokens = tokens
        self.offsets = offsets
        self.field = field
        self._fingerprint: str | None = None
        self._longest: int | None = None

    @classmethod
    def from_documents(
        cls, documents: Sequence[Any], field: str = "tokens", dtype: Any = None
    ) -> TokenArray:
        """Concatenates ``documents`` (1-D arrays, or dicts holding one under ``field``)."""
        arrays = [np.asarray(d[field] if isinstance(d, dict) else d) for d in documents]
        if not arrays:
            raise PipelineError("TokenArray.from_documents needs at least one document")
        lengths = np.fromiter(map(len, arrays), np.int64, len(arrays))
        offsets = np.zeros(len(arrays) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        tokens = np.concatenate(arrays)
        return cls(tokens if dtype is None else tokens.astype(dtype), offsets, field)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __reduce__(self) -> tuple:
        """Pickles the arrays, except tokens mapped from a file (``np.memmap``,
        ``np.load(..., mmap_mode="r")``): those travel as the file's name and place, and
        the receiving process (a loader worker, say) maps the file again."""
        where = _mapped_file(self.tokens)
        if where is None:
            return (TokenArray, (self.tokens, self.offsets, self.field))
        return (
            _map_token_array,
            (*where, self.tokens.dtype.str, len(self.tokens), self.offsets, self.field),
        )

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        i = int(index)
        if not 0 <= i < len(self):
            raise IndexError(f"TokenArray index {i} out of range 0..{len(self) - 1}")
        offsets = self.offsets
        return {self.field: self.tokens[offsets[i] : offsets[i + 1]]}

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, np.ndarray]]:
        index = np.asarray(indices, np.int64)
        if len(index) and (int(index.min()) < 0 or int(index.max()) >= len(self)):
            raise IndexError(f"TokenArray indices out of range 0..{len(self) - 1}")
        tokens, field = self.tokens, self.field
        starts, stops = self.offsets[index].tolist(), self.offsets[index + 1].tolist()
        return [{field: tokens[a:b]} for a, b in zip(starts, stops)]

    @property
    def lengths(self) -> np.ndarray:
        """Every document's length (int64)."""
        return np.diff(self.offsets)

    @property
    def longest(self) -> int:
        """The length of the longest document."""
        if self._longest is None:
            self._longest = int(self.lengths.max())
        return self._longest

    def fingerprint(self) -> str:
        """Identity of the documents' shape: count, tokens, dtype and a hash of the offsets
        (token values are not hashed)."""
        if self._fingerprint is None:
            digest = hashlib.blake2b(self.offsets.astype("<i8").tobytes(), digest_size=8)
            self._fingerprint = (
                f"{len(self)}-{len(self.tokens)}-{self.tokens.dtype.name}-{digest.hexdigest()}"
            )
        return self._fingerprint

    def __repr__(self) -> str:
        return f"TokenArray({len(self)} documents, {len(self.tokens)} {self.tokens.dtype} tokens)"


def _mapped_file(tokens: np.ndarray) -> tuple[str, int] | None:
    """``(file name, byte offset)`` of contiguous tokens mapped read-only from a file."""
    mapped = tokens
    while not isinstance(mapped, np.memmap) and isinstance(mapped.base, np.ndarray):
        mapped = mapped.base
    handle = getattr(mapped, "_mmap", None)
    filename = getattr(mapped, "filename", None)
    if handle is None or not filename or not tokens.flags.c_contiguous:
        return None
    start = np.frombuffer(handle, np.uint8).ctypes.data  # where the mapping begins
    offset = int(getattr(mapped, "offset", 0))
    mapped_from = offset - offset % mmap.ALLOCATIONGRANULARITY
    return str(filename), mapped_from + tokens.ctypes.data - start


def _map_token_array(
    filename: str, offset: int, dtype: str, length: int, offsets: np.ndarray, field: str
) -> TokenArray:
    tokens = np.memmap(filename, np.dtype(dtype), "r", offset=offset, shape=(length,))
    return TokenArray(tokens, offsets, field)
