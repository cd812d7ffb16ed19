"""``zephon-jax explain``'s text: record previews, segment lines, the state's accounting,
and the report's header for a run from the start or from a state that skipped batches
and excluded documents (the provenance itself: tests/unit/engine/test_explain.py)."""

from __future__ import annotations

import re

import numpy as np

import zephon_jax as zj
from zephon_jax.tools.explain import (
    PREVIEW_CHARS,
    explain,
    format_accounting,
    format_segment,
    record_text,
    segment_text,
)
from zephon_jax.tools.tokenizers import byte_detokenize, byte_tokenize

TEXTS = ("hello", "world wide", "ab", "the quick brown fox jumps")
LABEL = "list(len=4)"


def packed():
    """Byte tokens cut into pieces of 4 and concatenated into rows of 4: the token stream
    "helloworld wideabthe quick..." gives rows "hell", "owor", "ld w", "idea", "bthe", ..."""
    docs = [{"tokens": byte_tokenize(t)} for t in TEXTS]
    return zj.Dataset.source(docs).repeat(1).split(4).pack(4, method="concat").batch(2, num_lanes=1)


def seg(record, start, stop, source=0):
    return {
        "source": source,
        "label": LABEL,
        "record": record,
        "epoch": 0,
        "start": start,
        "stop": stop,
    }


def test_record_text_prefers_text_then_any_string_then_decoded_tokens():
    assert record_text("plain", None) == "plain"
    assert record_text(b"caf\xc3\xa9 \xff", None) == "café \ufffd"
    assert record_text({"id": 3, "text": "body", "title": "t"}, None) == "body"
    assert record_text({"id": 3, "title": "t", "other": "u"}, None) == "t"
    tokens = {"tokens": byte_tokenize("hi")}
    assert record_text(tokens, byte_detokenize) == "hi"
    assert record_text(tokens, None) is None
    assert record_text(np.arange(3), byte_detokenize) is None


def test_segment_lines():
    assert format_segment(0, seg(2, 1, 3), "'b'") == (
        f"  segment 1: source 0 ({LABEL}), record 2, epoch 0, slice [1:3]\n      \"'b'\""
    )
    assert format_segment(4, seg(2, 5, None), None) == (
        f"  segment 5: source 0 ({LABEL}), record 2, epoch 0, slice [5:]"
    )
    assert format_segment(1, dict(seg(7, None, None), output=2), None).endswith(
        "record 7, epoch 0, slice output 2"
    )
    opaque = dict(seg(0, None, None), source=None)
    assert format_segment(2, opaque, "x") == (
        "  segment 3: an output of a user operator that keeps no pointers\n      'x'"
    )


def test_segment_text_decodes_the_slice_or_shows_the_text_cut_short():
    ds = packed()
    assert segment_text(ds, seg(1, 6, 10), byte_detokenize) == "wide"
    assert segment_text(ds, seg(1, 6, None), byte_detokenize) == "wide"
    assert segment_text(ds, seg(1, 6, 10), None) is None  # tokens, nothing to decode them
    assert segment_text(ds, dict(seg(1, 0, 1), source=None), byte_detokenize) is None
    long_text = "x" * (PREVIEW_CHARS + 5)
    texts = zj.Dataset.source([{"text": long_text}, {"text": "short"}]).batch(1)
    assert segment_text(texts, seg(0, 0, 1), None) == "x" * PREVIEW_CHARS + "..."
    assert segment_text(texts, seg(1, 0, 1), None) == "short"


def test_explain_from_the_start():
    lines = explain(packed(), 0, decode=byte_detokenize).splitlines()
    assert re.fullmatch(
        r"global batch 0 \(0-based\), 2 of 2 rows, computed from step 0 in \d+\.\d\d s", lines[0]
    )
    assert lines[1:] == [
        "row 0: 1 segment",
        f"  segment 1: source 0 ({LABEL}), record 0, epoch 0, slice [0:4]",
        "      'hell'",
        "row 1: 2 segments",
        f"  segment 1: source 0 ({LABEL}), record 0, epoch 0, slice [4:5]",
        "      'o'",
        f"  segment 2: source 0 ({LABEL}), record 1, epoch 0, slice [0:3]",
        "      'wor'",
    ]


def test_explain_from_a_state_names_its_skips_exclusions_and_accounting():
    ds = packed()
    it = iter(zj.Loader(ds))
    next(it)  # delivers "hell", "owor": 8 tokens in 3 segments of 2 documents
    it.skip(1)  # passes over "ld w", "idea"
    state = zj.exclude(it.get_state(), [(LABEL, 0), (LABEL, 1)])  # both already delivered
    lines = explain(ds, 2, rows=[1], state=state, decode=byte_detokenize).splitlines()
    assert re.fullmatch(
        r"global batch 2 \(0-based\), 1 of 2 rows, computed from the state at step 2, a run "
        r"that skipped 1 batch, 2 documents excluded in \d+\.\d\d s",
        lines[0],
    )
    assert lines[1:] == [
        "row 1: 2 segments",  # " qui": after "bthe" in row 0
        f"  segment 1: source 0 ({LABEL}), record 3, epoch 0, slice [3:4]",
        "      ' '",
        f"  segment 2: source 0 ({LABEL}), record 3, epoch 0, slice [4:7]",
        "      'qui'",
        "the state's accounting: 1 batches delivered, 1 skipped, to step 2",
        f"  source 0 ({LABEL}): 8 tokens, 3 segments, 2 documents, epoch 0",
    ]


def test_explain_from_a_plain_state_says_nothing_of_skips_or_exclusions():
    ds = packed()
    it = iter(zj.Loader(ds))
    next(it)
    next(it)
    first = explain(ds, 3, state=it.get_state()).splitlines()[0]
    assert "from the state at step 2 in " in first
    assert "skipped" not in first and "excluded" not in first


def test_accounting_lines_by_hand():
    report = {
        "step": 9,
        "steps": 7,
        "skipped": 2,
        "sources": {
            "web": {"source": 0, "tokens": 120, "segments": 9, "documents": 4, "epoch": 1},
            "code": {"source": 1, "tokens": 0, "segments": 0, "documents": 0, "epoch": None},
        },
        "stages": [
            {"start": 0, "weights": [0.75, 0.25], "shares": [0.7, 0.3]},
            {"start": 5, "weights": [0.5, 0.5], "shares": [0.4567, 0.5433]},
        ],
    }
    assert format_accounting(report) == [
        "the state's accounting: 7 batches delivered, 2 skipped, to step 9",
        "  source 0 (web): 120 tokens, 9 segments, 4 documents, epoch 1",
        "  source 1 (code): 0 tokens, 0 segments, 0 documents, epoch none",
        "  stage from step 0: token shares 0.700 (weight 0.75), 0.300 (weight 0.25)",
        "  stage from step 5: token shares 0.457 (weight 0.5), 0.543 (weight 0.5)",
    ]
