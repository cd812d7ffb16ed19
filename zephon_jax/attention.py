"""Attention masks for packed rows: a token sees only earlier tokens of its own segment.

This module imports ``jax`` itself, so ``import zephon_jax`` stays free of it.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp


def segment_mask(segment_ids: Any) -> Any:
    """The causal same-segment attention mask of packed rows, ``bool[B, 1, T, T]``.

    ``mask[b, 0, i, j]`` is true exactly when ``j <= i`` and
    ``segment_ids[b, j] == segment_ids[b, i]``: query ``i`` attends to key ``j``
    of its own document piece, never to a later token or another piece. Padding
    (segment 0) attends only to earlier padding, so no query is left without a
    key. The head axis has size 1 and broadcasts over any number of heads;
    pass it as ``mask=`` to ``flax.nnx.MultiHeadAttention`` or
    ``jax.nn.dot_product_attention`` (after a transpose to its ``[B, N, T, S]``
    layout, which this already is). ``segment_ids``: int ``[B, T]`` (the
    ``segment_ids`` of ``to_training`` or ``tokens_segment_ids`` of ``pack``).
    """
    segment_ids = jnp.asarray(segment_ids)
    if segment_ids.ndim != 2:
        raise ValueError(
            f"segment_mask needs segment ids of shape [batch, length]; got shape "
            f"{segment_ids.shape}: pass a batch's segment_ids (add a batch axis to one row)"
        )
    length = segment_ids.shape[1]
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    causal = jnp.tril(jnp.ones((length, length), dtype=bool))
    return (same & causal)[:, None, :, :]
