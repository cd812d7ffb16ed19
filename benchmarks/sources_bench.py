"""Random-access reads of each source, local and on an S3 server (moto on 127.0.0.1).

    python benchmarks/sources_bench.py [--docs 20000] [--batch 64] [--repeats 7]

For every source, batches of ``--batch`` uniformly random indices are read with
``__getitems__`` (what the loader calls); the figure is records/s, the median over
``--repeats`` timed batches after one warm-up batch. Grain's ArrayRecordDataSource
over the same documents runs beside it as the reference. ``--repeats`` rounds are
run and the median is reported. On S3 the moto server
serves a few hundred requests/s on a small machine, so the table also reports HTTP
requests per record (counted from the server's request log): that, not seconds,
is what carries over to a real object store.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "..", "tests"))


class RequestCounter(logging.Handler):
    """Counts the HTTP requests in the moto server's request log."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def emit(self, record):
        if "HTTP/1.1" in record.getMessage():
            self.count += 1


def make_corpus(folder: Path, docs: int) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    texts = [" ".join(["word"] * int(n)) for n in rng.integers(20, 400, size=docs)]
    half = docs // 2
    for k, part in enumerate((texts[:half], texts[half:])):
        with open(folder / f"part-{k}.jsonl", "w") as f:
            for t in part:
                f.write(json.dumps({"text": t}) + "\n")
        pq.write_table(pa.table({"text": part}), folder / f"part-{k}.parquet", row_group_size=1000)
    return texts


def time_reads(source, batch: int, repeats: int, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    n = len(source)
    source.__getitems__(rng.integers(0, n, size=batch).tolist())  # warm-up
    rates = []
    for _ in range(repeats):
        idx = rng.integers(0, n, size=batch).tolist()
        t0 = time.perf_counter()
        out = source.__getitems__(idx)
        rates.append(batch / (time.perf_counter() - t0))
        assert len(out) == batch
    return statistics.median(rates)


class OneByOne:
    """A source read one record at a time (to show what batching buys)."""

    def __init__(self, source):
        self.source = source

    def __len__(self):
        return len(self.source)

    def __getitems__(self, idx):
        return [self.source[i] for i in idx]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--s3-repeats", type=int, default=3)
    args = parser.parse_args()

    import datasets
    from array_record.python.array_record_module import ArrayRecordWriter
    from grain.sources import ArrayRecordDataSource

    from zephon_jax.sources import JsonlSource, ParquetSource, TokenStore, write_token_store

    tmp = Path(tempfile.mkdtemp(prefix="sources_bench-"))
    data = tmp / "data"
    data.mkdir()
    texts = make_corpus(data, args.docs)
    tokens = [np.frombuffer(t.encode(), np.uint8).astype(np.uint16) for t in texts]
    write_token_store(tmp / "store", tokens, dtype="uint16")
    writer = ArrayRecordWriter(str(tmp / "docs.array_record"), "group_size:1")
    for t in tokens:
        writer.write(t.tobytes())
    writer.close()
    hf = datasets.Dataset.from_dict({"text": texts})

    local = {
        "grain ArrayRecordDataSource": ArrayRecordDataSource([str(tmp / "docs.array_record")]),
        "TokenStore": TokenStore(tmp / "store"),
        "JsonlSource": JsonlSource(data, progress=False),
        "ParquetSource": ParquetSource(data, cache_row_groups=8),
        "HF datasets.Dataset (batched)": hf,
        "HF datasets.Dataset (one by one)": OneByOne(hf),
    }
    rows = []
    for name, source in local.items():
        rate = time_reads(source, args.batch, args.repeats)
        rows.append(("local", name, rate, None))

    from object_stores import S3_BUCKET, s3_server, upload_tree

    counter = RequestCounter()
    logging.getLogger("werkzeug").addHandler(counter)
    logging.getLogger("werkzeug").setLevel(logging.INFO)
    with s3_server():
        upload_tree(data, f"s3://{S3_BUCKET}/data")
        write_token_store(f"s3://{S3_BUCKET}/store", tokens, dtype="uint16")
        remote = {
            "TokenStore": lambda: TokenStore(f"s3://{S3_BUCKET}/store"),
            "JsonlSource": lambda: JsonlSource(f"s3://{S3_BUCKET}/data", progress=False),
            "ParquetSource": lambda: ParquetSource(f"s3://{S3_BUCKET}/data", cache_row_groups=8),
        }
        for name, make in remote.items():
            source = make()
            before = counter.count
            cold_idx = np.random.default_rng(99).integers(0, len(source), size=args.batch)
            source.__getitems__(cold_idx.tolist())  # the first batch: nothing cached yet
            cold = (counter.count - before) / args.batch
            before = counter.count
            rate = time_reads(source, args.batch, args.s3_repeats, seed=1)
            warm = (counter.count - before) / (args.batch * (args.s3_repeats + 1))
            rows.append(("s3 (moto)", name, rate, (cold, warm)))

    ref = rows[0][2]
    print(f"random batched reads: {args.docs} docs, batches of {args.batch} random indices")
    print(
        f"{'where':10} {'source':34} {'records/s':>12} {'vs grain':>9} "
        f"{'requests/record (first batch, later batches)':>46}"
    )
    for where, name, rate, req in rows:
        req_s = "" if req is None else f"{req[0]:.2f}, {req[1]:.2f}"
        print(f"{where:10} {name:34} {rate:12,.0f} {rate / ref:9.2f} {req_s:>46}")
    hf_ratio = rows[4][2] / rows[5][2]
    print(f"HF datasets: batched reads are {hf_ratio:.1f}x faster per row than one by one")


if __name__ == "__main__":
    main()
