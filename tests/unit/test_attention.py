"""``segment_mask``: query ``i`` attends to key ``j`` exactly when ``j <= i`` and both are in
the same segment (padding, segment 0, to earlier padding); shape ``[B, 1, T, T]``."""

from __future__ import annotations

import numpy as np
import pytest

from zephon_jax.attention import segment_mask


def test_a_row_of_two_pieces_and_padding_by_hand():
    mask = np.asarray(segment_mask([[1, 1, 2, 2, 2, 0]]))
    assert mask.shape == (1, 1, 6, 6) and mask.dtype == bool
    expected = np.array(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [0, 0, 1, 0, 0, 0],
            [0, 0, 1, 1, 0, 0],
            [0, 0, 1, 1, 1, 0],
            [0, 0, 0, 0, 0, 1],
        ],
        bool,
    )
    assert np.array_equal(mask[0, 0], expected)


def test_rows_are_masked_each_by_its_own_segments():
    ids = np.array([[1, 2, 2], [1, 1, 1]], np.int32)
    mask = np.asarray(segment_mask(ids))
    assert mask.shape == (2, 1, 3, 3)
    assert np.array_equal(mask[1, 0], np.tril(np.ones((3, 3), bool)))
    assert mask[0, 0].tolist() == [[True, False, False], [False, True, False], [False, True, True]]
    assert mask[:, 0].diagonal(axis1=1, axis2=2).all()  # no query is left without a key


def test_segments_that_repeat_later_are_still_one_segment():
    # the mask compares ids only: equal ids far apart attend (pack numbers pieces 1, 2, ...)
    mask = np.asarray(segment_mask([[1, 2, 1]]))
    assert mask[0, 0, 2].tolist() == [True, False, True]


@pytest.mark.parametrize("shape", [(4,), (1, 2, 3)])
def test_other_shapes_are_refused_naming_the_fix(shape):
    with pytest.raises(ValueError, match=r"shape \[batch, length\].*add a batch axis"):
        segment_mask(np.ones(shape, np.int32))
