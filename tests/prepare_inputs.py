"""Helpers of ``prepare``'s tests: input files of every format, and what a store holds."""

from __future__ import annotations

import json

import numpy as np

from zephon_jax.sources import TokenStore


def write_inputs(tmp_path):
    """A JSONL file with two bad lines, a text file, a Parquet file with a null; expected texts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = []
    with open(tmp_path / "a.jsonl", "w") as f:
        for i in range(40):
            if i == 2:
                f.write('{"text": broken\n')  # line 3: invalid JSON
            elif i == 5:
                f.write(json.dumps({"body": "no text field"}) + "\n")  # line 6
            elif i == 9:
                f.write("\n")  # blank lines are not records
            else:
                text = f"doc {i} " + "é☃" * (i % 13)
                texts.append(text)
                f.write(json.dumps({"text": text, "id": i}) + "\n")
    (tmp_path / "b.txt").write_text("a whole file\nis one document\n")
    texts.append("a whole file\nis one document\n")
    column = [f"row {i} " * (i % 5 + 1) if i != 4 else None for i in range(30)]
    pq.write_table(pa.table({"text": column}), tmp_path / "c.parquet", row_group_size=8)
    texts.extend(t for t in column if t is not None)
    return [str(tmp_path / n) for n in ("a.jsonl", "b.txt", "c.parquet")], texts


def store_docs(path, allow_partial: bool = False) -> list[np.ndarray]:
    store = TokenStore(path, allow_partial=allow_partial)
    return [d["tokens"] for d in store.__getitems__(list(range(len(store))))]


def write_random_text(path, num_docs: int, seed: int) -> None:
    """JSONL of documents of random characters (they compress little)."""
    rng = np.random.default_rng(seed)
    alphabet = np.array(list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,"))
    with open(path, "w") as f:
        for n in rng.integers(100, 1500, num_docs):
            f.write(json.dumps({"text": "".join(rng.choice(alphabet, int(n)))}) + "\n")


def files_of(directory) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }
