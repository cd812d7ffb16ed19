"""Which Grain packers give the same rows as which ``pack`` settings (docs/migration_from_grain.md)."""

from __future__ import annotations

import grain
import numpy as np
import pytest

import zephon_jax as zj

SEQ_LEN = 48
FIELDS = ("tokens", "tokens_segment_ids", "tokens_positions")


def documents(max_len: int, num: int = 300, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {"tokens": rng.integers(1, 100, int(n)).astype(np.int32)}
        for n in rng.integers(1, max_len, num)
    ]


def grain_rows(docs: list[dict], packer, **kwargs) -> list[dict]:
    """The rows of a Grain packer over the documents in order (one stream)."""
    ds = grain.MapDataset.source(docs).to_iter_dataset()
    return list(packer(ds, length_struct={"tokens": SEQ_LEN}, **kwargs))


def zephon_rows(docs: list[dict], **pack) -> list[dict]:
    """The rows of ``pack`` over the documents in order (one lane, one epoch)."""
    ds = zj.Dataset.source(docs).repeat(1).pack(SEQ_LEN, **pack).batch(1)
    return [{k: v[0] for k, v in batch.items()} for batch in zj.Loader(ds)]


def as_bytes(rows: list[dict]) -> list[tuple[bytes, ...]]:
    return [tuple(np.asarray(r[f], np.int32).tobytes() for f in FIELDS) for r in rows]


def fill(rows: list[dict]) -> float:
    return float(np.mean([(r["tokens_segment_ids"] > 0).mean() for r in rows]))


FF = grain.experimental.FirstFitPackIterDataset
BF = grain.experimental.BestFitPackIterDataset


@pytest.mark.parametrize("max_segments", [None, 3])
@pytest.mark.parametrize("packer, method", [(FF, "first_fit"), (BF, "best_fit")])
def test_one_bin_gives_grains_rows(packer, method, max_segments):
    docs = documents(40)
    want = grain_rows(docs, packer, num_packing_bins=1, max_sequences_per_bin=max_segments)
    got = zephon_rows(docs, method=method, num_bins=1, max_segments=max_segments)
    assert sorted(want[0]) == sorted(got[0]) == sorted(FIELDS)
    assert len(got) > 50 and as_bytes(got) == as_bytes(want)
    if max_segments is not None:
        assert max(int(r["tokens_segment_ids"].max()) for r in got) == max_segments


@pytest.mark.parametrize("packer, method", [(FF, "first_fit"), (BF, "best_fit")])
def test_more_bins_give_other_rows_than_grain(packer, method):
    """Grain emits every bin when a record fits none; pack emits only the fullest row."""
    docs = documents(40)
    grain_unshuffled = grain_rows(docs, packer, num_packing_bins=8, shuffle_bins=False)
    got = zephon_rows(docs, method=method, num_bins=8)
    assert as_bytes(got) != as_bytes(grain_unshuffled)
    assert len(got) < len(grain_unshuffled)
    assert fill(got) > fill(grain_unshuffled) + 0.05


def test_a_record_that_fits_no_bin_empties_every_grain_bin():
    """Records of 30, 30, 30, 10 tokens in two bins of 48."""
    docs = [{"tokens": np.full(n, i + 1, np.int32)} for i, n in enumerate([30, 30, 30, 10])]
    grain_rows_ = grain_rows(docs, FF, num_packing_bins=2, shuffle_bins=False)
    zephon = zephon_rows(docs, method="first_fit", num_bins=2)

    def contents(rows):
        return [sorted(set(r["tokens"][r["tokens"] > 0].tolist())) for r in rows]

    # Grain: the third record fits neither bin, so both are emitted; it opens a new one.
    assert contents(grain_rows_) == [[1], [2], [3, 4]]
    # pack: only the fullest row goes (the first of equals); the 10 tokens join the
    # second record's row, which is still open.
    assert contents(zephon) == [[1], [2, 4], [3]]


def test_grain_shuffles_its_bins_by_default():
    docs = documents(40)
    shuffled = grain_rows(docs, FF, num_packing_bins=8)
    unshuffled = grain_rows(docs, FF, num_packing_bins=8, shuffle_bins=False)
    assert as_bytes(shuffled) != as_bytes(unshuffled)
    assert sorted(as_bytes(shuffled)) == sorted(as_bytes(unshuffled))


@pytest.mark.parametrize("max_len", [40, 150])
def test_concat_gives_concat_then_split_rows(max_len):
    docs = documents(max_len, num=200)
    want = grain_rows(docs, grain.experimental.ConcatThenSplitIterDataset)
    got = zephon_rows(docs, method="concat")
    assert len(got) > 50 and as_bytes(got) == as_bytes(want)
