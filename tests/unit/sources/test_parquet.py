"""Parquet files as a random-access source: rows through the footers' row-group index,
column choice, batched reads decoding each row group once, pickling, the fingerprint, and
the errors for a missing column, a missing file and a file that is not Parquet."""

from __future__ import annotations

import pickle
import re
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon_jax.sources.parquet import PARQUET_EXTENSIONS, ParquetSource


def write(path, first: int, count: int, group: int = 4) -> list[dict]:
    """A file of rows ``{"id", "text", "score"}`` numbered from ``first``, in row groups of
    ``group`` rows; returns its rows."""
    ids = list(range(first, first + count))
    table = pa.table({"id": ids, "text": [f"row {i}" for i in ids], "score": [i / 2 for i in ids]})
    pq.write_table(table, path, row_group_size=group)
    return table.to_pylist()


@pytest.fixture
def folder(tmp_path):
    """``b.parquet`` (rows 10..19, row groups of 4) and ``a.pq`` (rows 0..4, groups of 2)."""
    second = write(tmp_path / "b.parquet", 10, 10)
    first = write(tmp_path / "a.pq", 0, 5, group=2)
    (tmp_path / "notes.txt").write_text("not an input")
    return tmp_path, first + second


def test_files_are_read_in_path_order_with_every_column(folder):
    path, rows = folder
    src = ParquetSource(path)
    assert PARQUET_EXTENSIONS == (".parquet", ".pq")
    assert [p.rsplit("/", 1)[-1] for p in src.paths] == ["a.pq", "b.parquet"]
    assert len(src) == 15 and src.columns == ["id", "text", "score"]
    assert repr(src) == "ParquetSource(2 files, 15 rows, columns=['id', 'text', 'score'])"
    assert [src[i] for i in range(15)] == rows
    assert src[6] == {"id": 11, "text": "row 11", "score": 5.5}


def test_chosen_columns_in_the_order_given(folder):
    path, rows = folder
    src = ParquetSource([path / "b.parquet", path / "a.pq"], columns=["score", "id"])
    assert [p.rsplit("/", 1)[-1] for p in src.paths] == ["a.pq", "b.parquet"]
    assert src[14] == {"score": 9.5, "id": 19}
    assert list(src[0]) == ["score", "id"]


def test_batched_reads_in_any_order_decode_each_row_group_once(folder):
    path, rows = folder
    src = ParquetSource(path, columns=["id"])
    # row groups: a.pq [0-1] [2-3] [4], b.parquet [5-8] [9-12] [13-14]
    assert src.__getitems__([14, 0, 5, 1, 14, 8]) == [
        {"id": rows[i]["id"]} for i in (14, 0, 5, 1, 14, 8)
    ]
    assert src.row_groups_read == 3
    assert src.__getitems__([]) == []
    assert src.__getitems__([6, 0]) == [{"id": 11}, {"id": 0}]
    assert src.row_groups_read == 3  # both cached


def test_the_cache_keeps_the_last_row_groups_read(folder):
    path, _ = folder
    src = ParquetSource(path, columns=["id"], cache_row_groups=2, read_workers=0)
    assert (src.cache_row_groups, src.read_workers) == (2, 1)
    src.__getitems__([0, 2, 4])  # three groups: the first drops out
    assert src.row_groups_read == 3
    src.__getitems__([2, 4])
    assert src.row_groups_read == 3
    assert src[0] == {"id": 0} and src.row_groups_read == 4
    assert ParquetSource(path, cache_row_groups=0).cache_row_groups == 1


def test_indices_out_of_range_are_refused(folder):
    src = ParquetSource(folder[0])
    with pytest.raises(
        IndexError, match=r"ParquetSource index 15 out of range: valid indices are 0\.\.14"
    ):
        src[15]
    with pytest.raises(IndexError, match=r"ParquetSource index -1 out of range"):
        src.__getitems__([3, -1])


def test_a_pickled_source_reads_the_same_rows_with_a_fresh_cache(folder):
    path, rows = folder
    src = ParquetSource(path)
    src.__getitems__([0, 9])
    clone = pickle.loads(pickle.dumps(src))
    assert clone.row_groups_read == 0
    assert clone.__getitems__([9, 0, 13]) == [rows[9], rows[0], rows[13]]
    assert clone.row_groups_read == 3 and src.row_groups_read == 2
    assert clone.fingerprint() == src.fingerprint() and repr(clone) == repr(src)


def test_the_fingerprint_depends_on_names_rows_groups_and_columns_not_the_place(
    folder, tmp_path_factory
):
    path, _ = folder
    fp = ParquetSource(path).fingerprint()
    assert re.fullmatch(r"parquet-2-15-[0-9a-f]{16}", fp)
    moved = tmp_path_factory.mktemp("elsewhere")
    for name in ("a.pq", "b.parquet"):
        shutil.copy(path / name, moved / name)
    assert ParquetSource(moved).fingerprint() == fp
    assert ParquetSource(path, columns=["id"]).fingerprint() != fp
    write(moved / "b.parquet", 10, 10, group=5)  # the same rows in other row groups
    assert ParquetSource(moved).fingerprint() != fp
    (moved / "b.parquet").rename(moved / "c.parquet")
    write(moved / "b.parquet", 10, 10)
    (moved / "c.parquet").unlink()
    assert ParquetSource(moved).fingerprint() == fp
    (moved / "b.parquet").rename(moved / "c.parquet")
    assert ParquetSource(moved).fingerprint() != fp


def test_a_missing_column_names_the_file_and_its_columns(folder):
    path, _ = folder
    pq.write_table(pa.table({"id": [1]}), path / "c.parquet")
    with pytest.raises(ValueError) as info:
        ParquetSource(path, columns=["id", "text"])
    assert str(info.value) == (
        f"{path / 'c.parquet'}: Parquet file has no column(s) ['text'] (columns: ['id']); "
        "choose among them with columns=[...]"
    )
    assert len(ParquetSource(path, columns=["id"])) == 16


def test_missing_files_and_files_that_are_not_parquet_are_refused(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=f"input {re.escape(str(tmp_path))}/nope.parquet does not exist"
    ):
        ParquetSource(tmp_path / "nope.parquet")
    (tmp_path / "notes.txt").write_text("text")
    with pytest.raises(
        FileNotFoundError, match=r"names no files with an extension in \['\.parquet', '\.pq'\]"
    ):
        ParquetSource(tmp_path)
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(ValueError, match=r"bad\.parquet is not a Parquet file: .*magic bytes"):
        ParquetSource(tmp_path)


def test_a_file_removed_after_the_source_was_made_is_named_when_read(tmp_path):
    write(tmp_path / "a.parquet", 0, 8)
    src = ParquetSource(tmp_path)
    (tmp_path / "a.parquet").unlink()
    with pytest.raises(FileNotFoundError, match=r"reading row group 1 of .*a\.parquet: not found"):
        src[5]
