"""The benchmark's lean Python reference makes well-formed packed batches of the whole corpus."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from lean_reference import LeanPythonReference  # noqa: E402

SEQ_LEN = 16


def _corpus(lengths):
    """Documents whose tokens are consecutive ids, unique across the corpus (from 1)."""
    ends = np.cumsum(lengths)
    ids = np.arange(1, int(ends[-1]) + 1, dtype=np.int32)
    return [{"tokens": d} for d in np.split(ids, ends[:-1])]


@pytest.mark.parametrize(
    ("method", "split", "lengths"),
    [
        ("best_fit", True, [3, 40, 16, 1, 7, 33, 9, 12, 5, 2, 17, 8]),
        ("first_fit", False, [3, 16, 1, 7, 9, 12, 5, 2, 15, 8, 4, 11]),
    ],
)
def test_rows_are_whole_pieces_in_order(method, split, lengths):
    docs = _corpus(lengths)
    start_of = {int(d["tokens"][0]): len(d["tokens"]) for d in docs}
    first_id = np.array([int(d["tokens"][0]) for d in docs])
    ref = LeanPythonReference(docs, SEQ_LEN, batch_size=4, method=method, num_bins=3, split=split)
    seen = []
    for _ in range(12):
        batch = next(ref)
        tokens, seg, pos = (batch[k] for k in ("tokens", "tokens_segment_ids", "tokens_positions"))
        for row_tokens, row_seg, row_pos in zip(tokens, seg, pos):
            used = int(np.count_nonzero(row_seg))
            assert used > 0
            assert not row_seg[used:].any() and not row_tokens[used:].any()
            assert not row_pos[used:].any()
            # segments 1, 2, ... each a run of consecutive ids, positions 0, 1, ...
            assert (np.diff(row_seg[:used]) >= 0).all() and row_seg[0] == 1
            for k in range(1, int(row_seg[used - 1]) + 1):
                piece = row_tokens[:used][row_seg[:used] == k]
                assert len(piece) > 0
                np.testing.assert_array_equal(piece, np.arange(piece[0], piece[0] + len(piece)))
                np.testing.assert_array_equal(
                    row_pos[:used][row_seg[:used] == k], np.arange(len(piece))
                )
                # a piece starts a document, or at a multiple of seq_len inside one
                doc = int(np.searchsorted(first_id, piece[0], side="right")) - 1
                offset = int(piece[0] - first_id[doc])
                assert offset % SEQ_LEN == 0 and offset + len(piece) <= start_of[int(first_id[doc])]
                seen.append(piece)
    # several epochs went by: every token came once per epoch (none lost or repeated;
    # the last epochs' may still wait in open rows)
    counts = np.bincount(np.concatenate(seen), minlength=sum(lengths) + 1)[1:]
    assert counts.min() >= 2 and counts.max() - counts.min() <= 2
