"""JsonlSource, ParquetSource and Hugging Face datasets as pipeline sources (local files)."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from pipelines import assert_batches_equal, resume_across, run_topology

import zephon_jax as zj
from zephon_jax.sources import JsonlSource, ParquetSource, StorageError
from zephon_jax.sources import jsonl as jsonl_module


def write_jsonl(path, rows, blank_every=0):
    with open(path, "w") as f:
        for i, row in enumerate(rows):
            f.write(json.dumps(row) + "\n")
            if blank_every and i % blank_every == 0:
                f.write("\n")


@pytest.fixture(scope="module")
def jsonl_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("jsonl")
    expected = []
    for name, n in (("b.jsonl", 40), ("a.jsonl", 25), ("c.ndjson", 7)):
        rows = [{"text": f"{name}-{i} " + "z" * (i % 13), "i": i} for i in range(n)]
        write_jsonl(d / name, rows, blank_every=5)
        expected.append((name, rows))
    expected.sort()  # files sorted by path
    return d, [row for _, rows in expected for row in rows]


def test_jsonl_order_batched_reads_and_sidecar(jsonl_dir):
    d, rows = jsonl_dir
    src = JsonlSource(d)
    assert len(src) == len(rows) == 72
    assert [src[i] for i in range(len(src))] == rows  # sorted files, file order, blanks skipped
    picks = [71, 0, 30, 30, 64, 2, 41]
    assert src.__getitems__(picks) == [rows[i] for i in picks]
    # a glob and a list name the same records
    assert JsonlSource(str(d / "*.jsonl")).__getitems__([0, 64]) == [rows[0], rows[64]]
    assert len(JsonlSource([str(d / "c.ndjson"), str(d / "a.jsonl")])) == 32
    # the index lives beside the data and is never itself an input
    assert sorted(p.name for p in d.iterdir() if p.name.endswith(".zjidx")) == [
        "a.jsonl.zjidx",
        "b.jsonl.zjidx",
        "c.ndjson.zjidx",
    ]
    assert len(JsonlSource(str(d / "*"))) == 72
    clone = pickle.loads(pickle.dumps(src))  # what loader workers receive
    assert clone.__getitems__(picks) == [rows[i] for i in picks]
    assert clone.fingerprint() == src.fingerprint()
    with pytest.raises(IndexError, match="out of range"):
        src[72]


def test_jsonl_index_is_cached_and_rebuilt_when_the_file_changes(tmp_path, monkeypatch):
    path = tmp_path / "data.jsonl"
    write_jsonl(path, [{"x": i} for i in range(10)])
    built = []
    real = jsonl_module.build_index
    monkeypatch.setattr(jsonl_module, "build_index", lambda *a: built.append(a) or real(*a))
    assert len(JsonlSource(path)) == 10 and len(built) == 1
    assert len(JsonlSource(path)) == 10 and len(built) == 1  # from the sidecar
    with open(path, "a") as f:
        f.write(json.dumps({"x": 10}) + "\n")
    src = JsonlSource(path)
    assert len(built) == 2 and len(src) == 11 and src[10] == {"x": 10}


def test_jsonl_index_goes_to_the_cache_dir_when_the_data_is_read_only(tmp_path, monkeypatch):
    path = tmp_path / "data.jsonl"
    write_jsonl(path, [{"x": i} for i in range(5)])

    def read_only(fs, sidecar, data):
        raise PermissionError(f"read-only: {sidecar}")

    monkeypatch.setattr(jsonl_module, "_write_beside", read_only)
    monkeypatch.setenv("ZEPHON_JAX_CACHE", str(tmp_path / "cache"))
    assert JsonlSource(path)[4] == {"x": 4}
    assert not (tmp_path / "data.jsonl.zjidx").exists()
    cached = list((tmp_path / "cache" / "jsonl_index").glob("*.zjidx"))
    assert len(cached) == 1
    assert JsonlSource(path)[3] == {"x": 3}  # loads from the cache


# Records among lines holding only whitespace (spaces, tabs, \r, \f), CRLF endings,
# an indented record, and a whitespace-only last line without a newline.
WHITESPACE_LINES = (
    b'{"text": "doc 0", "i": 0}\n   \n\t\t\n\r\n \t\r\n  {"text": "doc 1", "i": 1}\n'
    b'{"text": "doc 2", "i": 2}\r\n\x0c\n\n{"text": "doc 3", "i": 3}\n \t '
)
WHITESPACE_RECORDS = [{"text": f"doc {i}", "i": i} for i in range(4)]


def test_whitespace_only_lines_are_blank_lines(tmp_path, monkeypatch):
    path = tmp_path / "data.jsonl"
    path.write_bytes(WHITESPACE_LINES)
    src = JsonlSource(path, progress=False)
    assert len(src) == 4 and src.fingerprint().startswith("jsonl-1-4-")
    assert src.__getitems__(range(4)) == WHITESPACE_RECORDS
    # Any block size (lines cut between blocks) gives the same offsets.
    spans = jsonl_module.build_index(str(path))
    monkeypatch.setattr(jsonl_module, "BLOCK_BYTES", 5)
    np.testing.assert_array_equal(jsonl_module.build_index(str(path)), spans)
    # A loader that draws every position for several epochs reads only records.
    ds = zj.Dataset.source(src).shuffle(seed=1).map(lambda r: {"i": np.int32(r["i"])}).batch(4)
    it = iter(zj.Loader(ds))
    drawn = np.concatenate([next(it)["i"] for _ in range(6)])
    assert sorted(set(drawn.tolist())) == [0, 1, 2, 3]


def test_index_lines_are_the_lines_bytes_strip_leaves_non_empty():
    rng = np.random.default_rng(0)
    blank, content = b" \t\r\x0b\x0c", b"{x}"
    for _ in range(50):  # lines of up to 30 bytes, long runs of whitespace, content anywhere
        lines = []
        for _ in range(40):
            n, share = int(rng.integers(0, 30)), rng.random() ** 4
            lines.append(
                bytes(
                    rng.choice(list(content if rng.random() < share else blank)) for _ in range(n)
                )
            )
        data = b"\n".join(lines) + (b"\n" if rng.random() < 0.5 else b"")
        starts, ends = jsonl_module._line_spans(data, 0)
        assert [data[a:b] for a, b in zip(starts, ends)] == [line for line in lines if line.strip()]


def test_an_index_that_counted_whitespace_lines_is_rebuilt(tmp_path, monkeypatch):
    path = tmp_path / "data.jsonl"
    path.write_bytes(WHITESPACE_LINES)
    data = np.frombuffer(WHITESPACE_LINES, np.uint8)
    newlines = np.flatnonzero(data == 10)
    starts = np.concatenate([[0], newlines + 1])
    ends = np.concatenate([newlines, [data.size]])
    keep = ends > starts  # the old format: every non-empty line a record
    monkeypatch.setattr(jsonl_module, "INDEX_VERSION", 1)
    info = jsonl_module.file_info(str(path))
    old = jsonl_module._encode_index(np.stack([starts[keep], ends[keep]]), info)
    (tmp_path / "data.jsonl.zjidx").write_bytes(old)
    monkeypatch.undo()
    src = JsonlSource(path, progress=False)
    assert len(src) == 4 and src.__getitems__(range(4)) == WHITESPACE_RECORDS
    assert JsonlSource(path, progress=False).fingerprint() == src.fingerprint()


def test_prepare_and_the_jsonl_source_agree_on_blank_lines(tmp_path):
    from zephon_jax.sources import TokenStore
    from zephon_jax.tools.prepare import PrepareOptions, prepare
    from zephon_jax.tools.tokenizers import byte_detokenize

    path = tmp_path / "data.jsonl"
    path.write_bytes(WHITESPACE_LINES)
    out = tmp_path / "store"
    summary = prepare(PrepareOptions(inputs=(str(path),), output=str(out), workers=0), None)
    assert (summary.documents, summary.bad_records) == (4, 0)
    store = TokenStore(out)
    texts = [byte_detokenize(d["tokens"]) for d in store.__getitems__(list(range(len(store))))]
    assert texts == [r["text"] for r in JsonlSource(path, progress=False).__getitems__(range(4))]


def test_jsonl_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.jsonl"):
        JsonlSource(tmp_path / "nothing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl.*not valid JSON"):
        JsonlSource(bad)[1]
    with pytest.raises(StorageError, match="unsupported URL scheme 'hf'"):
        JsonlSource("hf://datasets/x")


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory):
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path_factory.mktemp("parquet")
    rows = []
    for k, n in ((0, 45), (1, 30)):
        text = [f"file{k} row{i}" for i in range(n)]
        pq.write_table(
            pa.table({"text": text, "n": list(range(n)), "k": [k] * n}),
            d / f"part-{k}.parquet",
            row_group_size=10,
        )
        rows += [{"text": t, "n": i} for i, t in enumerate(text)]
    return d, rows


def test_parquet_rows_columns_and_row_group_lru(parquet_dir):
    d, rows = parquet_dir
    src = ParquetSource(d, columns=["text", "n"], cache_row_groups=2)
    assert len(src) == 75
    assert src[0] == rows[0] and src[74] == rows[74]
    src = ParquetSource(d, columns=["text", "n"], cache_row_groups=2)
    picks = [3, 7, 1, 9, 50, 51, 3]  # two row groups
    assert src.__getitems__(picks) == [rows[i] for i in picks]
    assert src.row_groups_read == 2  # each decoded once
    src.__getitems__([0, 54])
    assert src.row_groups_read == 2  # both cached
    src.__getitems__([20, 30, 40])  # three more: the LRU keeps two
    assert src.row_groups_read == 5 and len(src._cache) == 2
    src.__getitems__([0])
    assert src.row_groups_read == 6
    assert set(ParquetSource(d)[0]) == {"text", "n", "k"}
    clone = pickle.loads(pickle.dumps(src))
    assert clone.__getitems__([74, 0]) == [rows[74], rows[0]] and clone.row_groups_read == 2
    with pytest.raises(ValueError, match="no column.*'body'.*columns="):
        ParquetSource(d, columns=["body"])


def to_tokens(record):
    text = record["text"]
    return {"tokens": np.frombuffer(text.encode(), dtype=np.uint8).astype(np.int32)}


def packed(source, batch_size=6):
    return (
        zj.Dataset.source(source)
        .shuffle(seed=7)
        .map(to_tokens)
        .pack(24, method="first_fit", num_bins=3)
        .batch(batch_size)
    )


def test_file_sources_in_pipelines_across_processes_and_resume(jsonl_dir, parquet_dir):
    rows = jsonl_dir[1] + parquet_dir[1]
    docs = [to_tokens(r)["tokens"] for r in rows]
    expected = run_topology(packed([{"text": r["text"]} for r in rows]), 1, 6)
    jsonl = JsonlSource(jsonl_dir[0])
    parquet = ParquetSource(parquet_dir[0], columns=["text"])

    class Both:  # the two file sources as one, records in the same order as ``rows``
        def __len__(self):
            return len(jsonl) + len(parquet)

        def __getitem__(self, i):
            return jsonl[i] if i < len(jsonl) else parquet[i - len(jsonl)]

    assert [to_tokens(Both()[i])["tokens"].tolist() for i in range(len(rows))] == [
        d.tolist() for d in docs
    ]
    for source in (jsonl, parquet):
        want = run_topology(packed(source), 1, 5)
        assert_batches_equal(run_topology(packed(source), 2, 5), want)
        assert_batches_equal(resume_across(packed(source), 5, 2, 2, 3), want[2:])
    assert_batches_equal(run_topology(packed(Both()), 3, 6), expected)


def test_hugging_face_dataset_is_read_in_batches():
    datasets = pytest.importorskip("datasets")
    texts = [f"hf record {i} " + "y" * (i % 11) for i in range(60)]
    hf = datasets.Dataset.from_dict({"text": texts, "id": list(range(60))})
    calls = []

    class Counting(type(hf)):
        def __getitems__(self, keys):
            calls.append(len(keys))
            return super().__getitems__(keys)

    counting = hf
    counting.__class__ = Counting
    want = run_topology(packed([{"text": t} for t in texts]), 1, 5)
    got = run_topology(packed(counting), 2, 5)
    assert_batches_equal(got, want)
    assert calls and max(calls) > 1  # batched reads, not one row at a time
    assert_batches_equal(resume_across(packed(hf), 5, 2, 1, 2), want[2:])


def test_prepare_with_no_documents_fails_and_summarizes_bad_records(tmp_path, capsys):
    from zephon_jax.tools.cli import main

    data = tmp_path / "content.jsonl"
    write_jsonl(data, [{"content": f"text {i}", "id": i} for i in range(30)] + [[1]] * 3)
    assert main(["prepare", str(data), "-o", str(tmp_path / "out"), "--workers", "0"]) == 1
    err = capsys.readouterr().err
    assert err.count("skipped ") == 20  # the first 20 bad lines, one by one
    assert "and 13 more bad records skipped: 10 no 'text' field, 3 expected a JSON object" in err
    assert "30 of 33 records have no 'text' field" in err and "--text-field" in err
    assert "['content', 'id']" in err
    out = tmp_path / "ok"
    args = ["prepare", str(data), "-o", str(out), "--text-field", "content", "--workers", "0"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert f"ds = zephon_jax.Dataset.source(TokenStore('{out}'))" in printed
