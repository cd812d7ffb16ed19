"""The codec's inline decoding of record pointers is its general decoding.

``((a,), b)`` with int ``a`` and ``b`` (an operator output of one parent, e.g. a
piece of a record) is decoded inline, as are ints of one or two varint bytes.
Decoding with that path and with it turned off gives the same values, of the
same types, for any plain data (drawn by hypothesis), for real lane states, and
for truncated or altered bytes, which both reject with a StateError or both
decode alike.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pipelines import make_docs, take

import zephon_jax as zj
from zephon_jax.core.lineage import DrawRowTable, Opaque, draw_piece_lineages
from zephon_jax.errors import StateError
from zephon_jax.state import codec

# Around the one- and two-byte varint limits (zigzag: |v| < 64, < 8192), and beyond.
EDGE_INTS = [0, 1, -1, 63, -64, 64, -65, 8191, -8192, 8192, -8193, 2**20, -(2**40), 2**70]


def general(data: bytes):
    """``codec.decode`` with the inline pointer path turned off."""
    inline = codec._ONE_PARENT
    codec._ONE_PARENT = b"\xff\xff"  # never the start of an encoded value
    try:
        return codec.decode(data)
    finally:
        codec._ONE_PARENT = inline


def outcome(decode, data: bytes):
    """What ``decode`` makes of ``data``: ("ok", value) or ("error", None) for a StateError."""
    try:
        return ("ok", decode(data))
    except StateError:
        return ("error", None)


def same(a, b) -> bool:
    """Equal values of the same types, all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, Opaque):
        return same(a.data, b.data)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
    return bool(a == b) or bool(a != a and b != b)  # NaN (from altered bytes) as NaN


ints = st.one_of(st.sampled_from(EDGE_INTS), st.integers(-(2**80), 2**80))
leaves = st.one_of(ints, st.none(), st.booleans(), st.text(max_size=3), st.floats(allow_nan=False))
pointers = st.tuples(st.tuples(ints), st.one_of(ints, leaves))  # ((a,), b), b not always an int
values = st.recursive(
    st.one_of(leaves, pointers),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.tuples(st.lists(inner, max_size=3).map(tuple), inner),  # (parents, recipe)
        st.dictionaries(st.text(max_size=2), inner, max_size=3),
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(values)
def test_inline_decoding_equals_general_decoding(value):
    data = codec.encode(value)
    got, want = codec.decode(data), general(data)
    assert same(got, want)
    assert same(got, value)


@pytest.mark.parametrize("parent", EDGE_INTS)
@pytest.mark.parametrize("recipe", EDGE_INTS + ["x", None, (1, 2), 2.5, True])
def test_pointers_of_one_parent_round_trip(parent, recipe):
    value = (((parent,), recipe), [((parent,), recipe)], ((parent, parent), recipe))
    data = codec.encode(value)
    assert same(codec.decode(data), value)
    assert same(general(data), value)


def lane_state_bodies() -> list[bytes]:
    ds = (
        zj.Dataset.source(make_docs(300, 60, seed=7))
        .shuffle(seed=3)
        .split(16)
        .pack(16, num_bins=4)
        .window_shuffle(3, seed=2)
        .batch(4)
    )
    it = iter(zj.Loader(ds))
    take(it, 6)
    return [bytes(v)[:-4] for v in it.get_state()["lanes"].values()]  # without the checksum


def test_lane_states_decode_alike_and_tampered_ones_fail_alike():
    bodies = lane_state_bodies()
    for body in bodies:
        assert body.count(codec._ONE_PARENT) > 3  # the inline path is taken
        assert same(codec.decode(body), general(body))
    assert_tampered_fail_alike(bodies[0], general, seed=0)


def assert_tampered_fail_alike(body: bytes, reference, seed: int) -> None:
    """Every truncation of ``body`` and 300 altered bytes decode (or fail) exactly as
    ``reference`` decodes them; every truncation, and more, is rejected."""
    rng = np.random.default_rng(seed)
    tampered = [body[:cut] for cut in range(len(body))]  # every truncation
    for at in rng.integers(0, len(body), size=300).tolist():  # altered bytes
        for byte in (0x00, 0x01, 0x03, 0x08, 0x7F, 0x80, 0xFF, int(rng.integers(256))):
            tampered.append(body[:at] + bytes([byte]) + body[at + 1 :])
    errors = 0
    for data in tampered:
        got, want = outcome(codec.decode, data), outcome(reference, data)
        assert got[0] == want[0], data
        assert same(got[1], want[1])
        errors += got[0] == "error"
    assert errors > len(body)


def _reference_encoding(value) -> bytes:
    """The format's definition for ints and tuples: a tag, then zigzag varints."""

    def varint(n: int) -> bytes:
        out = bytearray()
        while n >= 0x80:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)
        return bytes(out)

    if type(value) is int:
        return bytes([codec._INT]) + varint(value << 1 if value >= 0 else (-value << 1) - 1)
    assert type(value) is tuple
    return bytes([codec._TUPLE]) + varint(len(value)) + b"".join(map(_reference_encoding, value))


def test_the_quick_encoding_of_ints_and_tuples_is_the_format():
    rng = np.random.default_rng(5)

    def draw(depth: int = 0):
        if depth > 3 or rng.random() < 0.4:
            return int(rng.choice([0, 1, 63, 64, 127, 128, -1, -64, -65, 2**31, -(2**40)]))
        sizes = [0, 1, 2, 3, 200] if depth == 0 else [0, 1, 2, 3]
        return tuple(draw(depth + 1) for _ in range(int(rng.choice(sizes))))

    for _ in range(500):
        value = draw()
        assert codec.encode(value) == _reference_encoding(value), value
        assert codec.decode(codec.encode(value)) == value


def fully_general(data: bytes):
    """``codec.decode`` with both inline pointer paths (one int parent, one draw parent)
    turned off."""
    inline = codec._DRAW_PIECE
    codec._DRAW_PIECE = b"\xff\xff"  # never the start of an encoded value
    try:
        return general(data)
    finally:
        codec._DRAW_PIECE = inline


# ``(((a, b, c),), d)``: a piece of a record a mixture drew; sometimes not all ints.
draw_pieces = st.tuples(st.tuples(st.tuples(ints, ints, ints | leaves)), ints | leaves)


@settings(max_examples=200, deadline=None)
@given(st.lists(draw_pieces | values, max_size=6).map(tuple))
def test_inline_draw_pieces_equal_general_decoding(value):
    data = codec.encode(value)
    assert same(codec.decode(data), fully_general(data))
    assert same(codec.decode(data), value)


@pytest.mark.parametrize("a", EDGE_INTS)
def test_draw_pieces_round_trip_around_the_varint_limits(a):
    value = tuple((((a, b, -a),), b) for b in EDGE_INTS)
    data = codec.encode(value)
    assert data.count(codec._DRAW_PIECE) == len(EDGE_INTS)
    assert same(codec.decode(data), value)
    assert same(fully_general(data), value)


def mixture_lane_bodies() -> list[bytes]:
    """Lane states of a mixture by tokens (whose lineages are draws) cut into pieces."""
    mixed = zj.Dataset.mix(
        [
            zj.Dataset.source(make_docs(200, 60, seed=1)),
            zj.Dataset.source(make_docs(80, 30, seed=2)),
        ],
        [0.6, 0.4],
        unit="tokens",
    )
    ds = mixed.shuffle(seed=3).split(8).pack(64).batch(4)
    it = iter(zj.Loader(ds))
    take(it, 5)
    return [bytes(v)[:-4] for v in it.get_state()["lanes"].values()]  # without the checksum


def test_mixture_lane_states_decode_alike_and_tampered_ones_fail_alike():
    bodies = mixture_lane_bodies()
    for body in bodies:
        assert same(codec.decode(body), fully_general(body))
    body = max(bodies, key=lambda b: b.count(codec._DRAW_PIECE))
    assert body.count(codec._DRAW_PIECE) > 3  # the inline path is taken
    assert_tampered_fail_alike(body, fully_general, seed=1)


def _all_draw_pieces(value: tuple) -> bool:
    """Whether every item is a draw piece of four ints of at most 8 varint bytes."""
    small = range(-(2**55), 2**55)
    return bool(value) and all(
        type(item) is tuple
        and len(item) == 2
        and type(item[0]) is tuple
        and len(item[0]) == 1
        and type(item[0][0]) is tuple
        and len(item[0][0]) == 3
        and all(type(v) is int and v in small for v in (*item[0][0], item[1]))
        for item in value
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(draw_pieces, max_size=5).map(tuple)
    | st.lists(draw_pieces | values, max_size=6).map(tuple)
)
def test_the_reader_reads_a_tuple_of_draw_pieces_as_their_array(value):
    data = codec.encode(value)
    reader = codec.Reader(data)
    assert reader.tuple_length() == len(value)
    start = reader.pos
    table = reader.draw_pieces(len(value))
    assert (table is not None) == _all_draw_pieces(value)
    if table is None:
        assert reader.pos == start  # nothing read
        got = tuple(reader.values(len(value)))
    else:
        assert table.dtype == np.int64 and table.shape == (len(value), 4)
        got = tuple(draw_piece_lineages(table))
    reader.end()
    assert same(got, value)


def test_the_reader_refuses_corrupt_bytes_as_decode_does():
    data = codec.encode(((((1, 2, 3),), 4), 5))
    assert codec.Reader(codec.encode(5)).tuple_length() is None
    reader = codec.Reader(data[:-1])
    assert reader.tuple_length() == 2
    assert reader.draw_pieces(2) is None  # the second item is not a draw piece
    with pytest.raises(StateError, match=r"corrupt state bytes \(IndexError"):
        reader.values(2)
    reader = codec.Reader(data + b"\x00")
    reader.value()
    with pytest.raises(StateError, match="corrupt state bytes: 1 trailing bytes"):
        reader.end()


# Packed rows' lineages ``(parents, lengths)``: mostly of draw pieces and as many lengths.
packed_rows = st.one_of(
    st.lists(draw_pieces, min_size=1, max_size=3).flatmap(
        lambda ps: st.tuples(st.just(tuple(ps)), st.tuples(*[ints] * len(ps)))
    ),
    st.tuples(st.lists(draw_pieces | values, max_size=3).map(tuple), values),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(packed_rows, max_size=4).map(tuple))
def test_the_reader_reads_packed_rows_of_draw_pieces_as_arrays(value):
    reader = codec.Reader(codec.encode(value))
    assert reader.tuple_length() == len(value)
    start = reader.pos
    rows = reader.draw_rows(len(value))
    readable = bool(value) and all(
        type(row) is tuple
        and len(row) == 2
        and type(row[0]) is tuple
        and type(row[1]) is tuple
        and len(row[0]) == len(row[1])
        and _all_draw_pieces(row[0])
        and _all_draw_pieces(tuple((((0, 0, 0),), n) for n in row[1]))  # small ints
        for row in value
    )
    assert (rows is not None) == readable
    if rows is None:
        assert reader.pos == start  # nothing read
        got = tuple(reader.values(len(value)))
    else:
        got = DrawRowTable(*rows).rows()
    reader.end()
    assert same(got, value)
