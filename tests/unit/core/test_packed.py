"""The packing core: PackSpec checks, PackedRow as a dict, assemble_rows' layout and casts."""

from __future__ import annotations

import numpy as np
import pytest

from zephon_jax.core.packed import (
    PackedRow,
    PackSpec,
    assemble_rows,
    check_positive,
    output_names,
    plain,
)
from zephon_jax.errors import PipelineError


def arr(*values, dtype=np.int64):
    return np.array(values, dtype)


def test_pieces_row_layout_segments_positions_and_padding():
    spec = PackSpec(6, "pack")
    row = PackedRow(spec, ("t",), [((arr(10, 11, 12),), 1, 3), ((arr(20, 21),), 0, 2)])
    batch = assemble_rows([row])
    assert batch["t"].tolist() == [[11, 12, 20, 21, 0, 0]]
    assert batch["t_segment_ids"].tolist() == [[1, 1, 2, 2, 0, 0]]
    assert batch["t_positions"].tolist() == [[0, 1, 0, 1, 0, 0]]
    assert {v.dtype for v in batch.values()} == {np.dtype(np.int32)}


def test_whole_record_rows_with_two_fields_batch_together():
    spec = PackSpec(4, "pack", dtypes={"w": np.float32})
    a = PackedRow(spec, ("t", "w"), [(arr(1, 2), arr(0.5, 1.5, dtype=np.float64))], (2,))
    b = PackedRow(
        spec,
        ("t", "w"),
        [(arr(3), arr(2.0, dtype=np.float64)), (arr(4, 5, 6), arr(1, 2, 3, dtype=np.float64))],
        (1, 3),
    )
    batch = assemble_rows([a, b])
    assert batch["t"].tolist() == [[1, 2, 0, 0], [3, 4, 5, 6]]
    assert batch["w"].dtype == np.float32
    assert batch["w"].tolist() == [[0.5, 1.5, 0, 0], [2, 1, 2, 3]]
    assert batch["w_segment_ids"].tolist() == [[1, 1, 0, 0], [1, 2, 2, 2]]
    assert batch["t_positions"].tolist() == [[0, 1, 0, 0], [0, 0, 1, 2]]
    # the second field's segment ids are a copy, not the same array
    assert batch["w_segment_ids"] is not batch["t_segment_ids"]


def test_packed_row_reads_as_a_mapping_and_plain_makes_a_dict():
    spec = PackSpec(3, "pack")
    row = PackedRow(spec, ("t",), [((arr(7, 8),), 0, 2)])
    assert list(row) == ["t", "t_segment_ids", "t_positions"] == list(row.keys())
    assert len(row) == 3
    assert repr(row) == "PackedRow(1 pieces, 2/3 items)"
    assert row["t"].tolist() == [7, 8, 0]
    d = plain(row)
    assert type(d) is dict and d["t_segment_ids"].tolist() == [1, 1, 0]
    other = {"x": 1}
    assert plain(other) is other
    assert output_names(["a", "b"]) == [
        "a",
        "a_segment_ids",
        "a_positions",
        "b",
        "b_segment_ids",
        "b_positions",
    ]


def test_int64_above_int32_range_raises_naming_field_and_fix():
    spec = PackSpec(2, "pack")
    row = PackedRow(spec, ("t",), [((arr(2**31),), 0, 1)])
    with pytest.raises(PipelineError, match=r"'t' holds .*2147483648.*dtypes=\{'t': np.int64\}"):
        assemble_rows([row])
    ok = PackedRow(spec, ("t",), [((arr(-(2**31), 2**31 - 1),), 0, 2)])
    assert assemble_rows([ok])["t"].tolist() == [[-(2**31), 2**31 - 1]]


def test_fractional_float_into_int_field_raises_but_whole_floats_pass():
    spec = PackSpec(2, "pack")
    whole = PackedRow(spec, ("t",), [((arr(3.0, dtype=np.float64),), 0, 1)])
    assert assemble_rows([whole])["t"].tolist() == [[3, 0]]
    frac = PackedRow(spec, ("t",), [((arr(2.5, dtype=np.float64),), 0, 1)])
    with pytest.raises(PipelineError, match=r"'t' holds .*2\.5.*np.float32"):
        assemble_rows([frac])


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_float32_field_rounds_but_overflow_raises():
    spec = PackSpec(1, "pack", dtypes={"w": "float32"})
    rounded = PackedRow(spec, ("w",), [((arr(0.1, dtype=np.float64),), 0, 1)])
    assert assemble_rows([rounded])["w"][0, 0] == np.float32(0.1)
    big = PackedRow(spec, ("w",), [((arr(1e300, dtype=np.float64),), 0, 1)])
    with pytest.raises(PipelineError, match="cannot hold exactly"):
        assemble_rows([big])


def test_rows_of_different_packers_do_not_batch():
    a = PackedRow(PackSpec(2, "pack"), ("t",), [((arr(1),), 0, 1)])
    b = PackedRow(PackSpec(3, "pack"), ("t",), [((arr(1),), 0, 1)])
    with pytest.raises(PipelineError, match="different packers"):
        assemble_rows([a, b])
    same = PackedRow(PackSpec(2, "pack"), ("t",), [((arr(5),), 0, 1)])
    assert assemble_rows([a, same])["t"].tolist() == [[1, 0], [5, 0]]


def test_spec_record_validation():
    spec = PackSpec(4, "pack(seq_len=4)")
    fields, arrays, n = spec.record({"a": arr(1, 2), "b": arr(3, 4)}, None)
    assert fields == ("a", "b") and n == 2 and arrays[1].tolist() == [3, 4]
    with pytest.raises(PipelineError, match="dicts of 1-D arrays"):
        spec.record([1, 2], None)
    with pytest.raises(PipelineError, match="field 'b' is list"):
        spec.record({"a": arr(1), "b": [1]}, None)
    with pytest.raises(PipelineError, match="same length; got 2 and 1"):
        spec.record({"a": arr(1, 2), "b": arr(1)}, None)
    with pytest.raises(PipelineError, match="'a_segment_ids'"):
        spec.record({"a": arr(1), "a_segment_ids": arr(1)}, None)
    typo = PackSpec(4, "pack", dtypes={"x": np.int64})
    with pytest.raises(PipelineError, match=r"dtypes for fields \['x'\]"):
        typo.record({"a": arr(1)}, None)


def test_spec_argument_checks_and_describe():
    for bad in (0, -1, True, 2.0, "3"):
        with pytest.raises(PipelineError, match="positive int"):
            check_positive(bad, "pack(seq_len)")
    assert check_positive(np.int64(3), "x") == 3
    with pytest.raises(PipelineError, match="integer or float"):
        PackSpec(2, "pack", dtypes={"t": np.bool_})
    with pytest.raises(PipelineError, match="not a dtype"):
        PackSpec(2, "pack", dtypes={"t": "nonsense"})
    with pytest.raises(PipelineError, match="needs a dict"):
        PackSpec(2, "pack", dtypes=[("t", "int64")])
    spec = PackSpec(8, "pack", dtypes={"t": "int64"}, max_segments=3)
    assert spec.describe() == ", max_segments=3, dtypes={'t': int64}"
    assert PackSpec(8, "pack").describe() == ""
    assert spec.same_rows(PackSpec(8, "other", dtypes={"t": np.int64}))
    assert not spec.same_rows(PackSpec(8, "pack"))
    assert spec.counting().tolist() == list(range(8))
