"""``prepare --engine beam``'s steps, run by hand in this process without a runner: units cut
from the inputs, tokenized in any order, laid out, written shard by shard and committed
give the local engine's store byte for byte (the Beam pipeline on DirectRunner and S3:
tests/integration/test_prepare_beam.py)."""

from __future__ import annotations

import hashlib
import json
import random

import pytest
from prepare_inputs import store_docs, write_inputs

from zephon_jax.tools import prepare_beam as pb
from zephon_jax.tools.prepare import PrepareError, PrepareOptions, describe_inputs, prepare
from zephon_jax.tools.prepare_beam import (
    TMP_DIR,
    Unit,
    finalize,
    layout,
    plan_units,
    shard_tasks,
    tokenize_unit,
    write_shard,
)
from zephon_jax.tools.tokenizers import byte_detokenize

# Byte offsets: "ab" 0-14, broken 15-22, blank 23, empty text 24-36, "xyz" 37-52.
LINES = '{"text": "ab"}\n{broken\n\n{"text": ""}\n{"text": "xyz"}\n'


def store_digests(root):
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "prepare.json"
    }


def run_steps(opts, unit_bytes, seed=0):
    """The Beam job's steps in this process, each stage's tasks in a shuffled order."""
    inputs = describe_inputs(opts)
    units = plan_units(inputs, opts, unit_bytes)
    rng = random.Random(seed)
    stats = [tokenize_unit(u, inputs, opts) for u in rng.sample(units, len(units))]
    plan = layout(rng.sample(stats, len(stats)), opts)
    tasks = shard_tasks(plan)
    written = [write_shard(t, opts) for t in rng.sample(tasks, len(tasks))]
    finalize(len(written), plan, inputs, opts)
    return units, stats, plan


def test_units_of_lines_text_and_parquet(tmp_path):
    inputs, _ = write_inputs(tmp_path)
    opts = PrepareOptions(tuple(inputs), str(tmp_path / "o"))
    described = describe_inputs(opts)
    size = described[0].size
    units = plan_units(described, opts, unit_bytes=400)
    jsonl = [Unit(i, 0, lo, min(lo + 400, size)) for i, lo in enumerate(range(0, size, 400))]
    k = len(jsonl)
    assert units == [
        *jsonl,
        Unit(k, 1, 0, 1),  # a text file is one document
        Unit(k + 1, 2, 0, 8),  # Parquet: one unit per row group of 8 rows
        Unit(k + 2, 2, 8, 16),
        Unit(k + 3, 2, 16, 24),
        Unit(k + 4, 2, 24, 30),
    ]
    lines = PrepareOptions(tuple(inputs[1:2]), str(tmp_path / "o"), lines=True)
    assert plan_units(describe_inputs(lines), lines, unit_bytes=20) == [
        Unit(0, 0, 0, 20),
        Unit(1, 0, 20, 29),  # "a whole file\nis one document\n" is 29 bytes
    ]


def test_each_unit_owns_the_lines_that_start_in_it(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text(LINES)
    opts = PrepareOptions((str(path),), str(tmp_path / "o"))
    units, stats, plan = run_steps(opts, unit_bytes=20)
    assert units == [Unit(0, 0, 0, 20), Unit(1, 0, 20, 40), Unit(2, 0, 40, 53)]
    by_unit = {s["unit"]: s for s in stats}
    assert [(s["docs"], s["tokens"], s["empty"]) for s in map(by_unit.get, range(3))] == [
        (1, 2, 0),  # "ab"; the broken line at byte 15 is bad
        (1, 3, 1),  # the blank line, the empty text, "xyz" (it starts at 37)
        (0, 0, 0),  # nothing starts in [40, 53)
    ]
    ((where, reason),) = by_unit[0]["bad"]
    assert where == f"{path}: byte 15" and "invalid JSON" in reason
    assert by_unit[1]["bad"] == by_unit[2]["bad"] == []
    assert plan["token_base"] == [0, 2, 5, 5] and plan["units"] == [0, 1, 2]
    assert (plan["num_docs"], plan["num_tokens"], plan["empty"]) == (2, 5, 1)
    assert [byte_detokenize(d) for d in store_docs(tmp_path / "o")] == ["ab", "xyz"]
    record = json.loads((tmp_path / "o" / "prepare.json").read_text())
    assert record["complete"] and record["committed"]["docs"] == 2
    assert record["committed"]["bad"] == 1 and record["committed"]["empty"] == 1
    assert record["bad_report"]["first"] == [[where, reason]]
    assert not (tmp_path / "o" / TMP_DIR).exists()


def test_the_steps_write_the_local_engines_store(tmp_path):
    inputs, texts = write_inputs(tmp_path)
    local = tmp_path / "local"
    prepare(PrepareOptions(tuple(inputs), str(local), workers=0), None)
    for seed, unit_bytes in ((0, 64), (1, 1000), (2, 1 << 20)):
        out = tmp_path / f"beam{seed}"
        run_steps(PrepareOptions(tuple(inputs), str(out)), unit_bytes, seed)
        assert store_digests(out) == store_digests(local), unit_bytes
    assert [byte_detokenize(d) for d in store_docs(tmp_path / "beam0")] == texts


def test_shards_take_the_unit_pieces_that_fall_in_them(monkeypatch):
    monkeypatch.setattr(pb, "SHARD_TOKENS", 10)
    plan = {"token_base": [0, 7, 7, 25], "units": [4, 5, 6]}  # unit 5 has no tokens
    assert shard_tasks(plan) == [
        (0, [(4, 0, 7), (6, 0, 3)]),
        (1, [(6, 3, 13)]),
        (2, [(6, 13, 18)]),
    ]
    assert shard_tasks({"token_base": [0, 0], "units": [0]}) == []


def test_strict_stops_at_the_first_bad_record_of_a_unit(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text(LINES)
    opts = PrepareOptions((str(path),), str(tmp_path / "o"), strict=True)
    inputs = describe_inputs(opts)
    with pytest.raises(PrepareError, match=r"a\.jsonl: byte 15: .*invalid JSON.*--strict: stopped"):
        tokenize_unit(Unit(0, 0, 0, 20), inputs, opts)
    assert tokenize_unit(Unit(1, 0, 20, 40), inputs, opts)["docs"] == 1
