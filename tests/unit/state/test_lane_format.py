"""The lane state format: snapshots as plain data, their checksummed bytes, and the checks
that refuse corrupt bytes, other format versions and impossible values, naming the entry."""

from __future__ import annotations

import zlib

import pytest

from zephon_jax.core.lineage import (
    DrawPieceTable,
    DrawRowTable,
    HeldLineages,
    derived,
    draw,
    opaque,
    piece,
    piece_code,
)
from zephon_jax.errors import StateError
from zephon_jax.state import codec, lane_format
from zephon_jax.state.lane_format import (
    LANE_FORMAT,
    TALLY_FIELDS,
    LaneSnapshot,
    check_lineage,
    check_saved_tally,
    decode_lane_state,
    encode_lane_state,
    lane_checksum,
    plain_snapshot,
    with_tally,
)

TALLY = (1, (30, 4, 3, 1, 12, 2, 2, 1), (42,))  # skipped, two sources' counters, a stage
# Two operators: one holding a position and a split piece, one holding nothing (aux (1, 2)).
CARRIES = (((3, derived((5,), 1)), None), ((), (1, 2)))
PENDING = (derived((4, draw(6, 1, 0)), "row"), 7, draw(2, 0, 1))
SNAPSHOT = (LANE_FORMAT, 12, False, CARRIES, PENDING, 3, None, TALLY)


def snapshot(**changed) -> tuple:
    return tuple(LaneSnapshot(*SNAPSHOT)._replace(**changed))


def with_crc(body: bytes, lane: int) -> bytes:
    return body + lane_checksum(body, lane)


class Tally:
    """An in-memory tally, counted only when encoded."""

    def saved(self) -> tuple:
        return TALLY


def test_the_format_is_the_lane_envelope_s_version():
    assert LANE_FORMAT == 8 and TALLY_FIELDS == 4


def test_lane_checksum_is_a_crc32_started_from_the_lane_number():
    assert lane_checksum(b"abc", 0) == zlib.crc32(b"abc").to_bytes(4, "little")
    assert lane_checksum(b"abc", 5) == zlib.crc32(b"abc", 5).to_bytes(4, "little")
    assert len({lane_checksum(b"abc", lane) for lane in range(8)}) == 8


def test_encoding_is_the_codec_encoding_and_its_checksum():
    data = encode_lane_state(SNAPSHOT, 2)
    body = codec.encode(SNAPSHOT)
    assert data == body + zlib.crc32(body, 2).to_bytes(4, "little")


def test_encode_decode_round_trips_every_entry():
    mixture = (5, (1, 0), [2, 3])
    data = encode_lane_state(snapshot(mixture=mixture, input_done=True), 6)
    got = decode_lane_state(6, data, num_operators=2, end_position=12)
    assert isinstance(got, LaneSnapshot)
    assert got == LaneSnapshot(LANE_FORMAT, 12, True, CARRIES, PENDING, 3, mixture, TALLY)
    assert decode_lane_state(6, bytearray(data), 2, end_position=12).carries == CARRIES


def test_stored_records_round_trip_by_value():
    record = opaque({"tokens": [1, 2]})
    data = encode_lane_state(snapshot(pending=(record, derived((record,), None))), 0)
    pending = decode_lane_state(0, data, 2).pending
    assert pending[0].data == {"tokens": [1, 2]} and pending[1][0][0].data == {"tokens": [1, 2]}


def test_plain_snapshot_joins_held_groups_writes_piece_codes_and_counts_the_tally():
    held = HeldLineages(((3,), (derived((5,), 1),)))
    packed_row = derived((piece_code(9, 2), 4), None)
    compact = snapshot(carries=((held, None), CARRIES[1]), pending=(packed_row,), tally=Tally())
    plain = plain_snapshot(compact)
    assert plain == snapshot(pending=(derived((derived((9,), 2), 4), None),))
    assert type(plain[3][0][0]) is tuple
    decoded = decode_lane_state(1, encode_lane_state(compact, 1), 2)
    assert tuple(decoded) == plain


def test_plain_snapshot_leaves_a_plain_snapshot_as_it_is():
    assert plain_snapshot(SNAPSHOT) == SNAPSHOT
    assert plain_snapshot(list(SNAPSHOT)) == SNAPSHOT


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[:-1],
        lambda data: data[:3],
        lambda data: b"",
        lambda data: data[:5] + bytes([data[5] ^ 1]) + data[6:],
        lambda data: data[:-1] + bytes([data[-1] ^ 0x80]),
    ],
    ids=["truncated", "short", "empty", "flipped", "checksum"],
)
def test_altered_bytes_are_refused_as_corrupt(damage):
    data = damage(encode_lane_state(SNAPSHOT, 4))
    message = (
        f"lane 4: corrupt state bytes (checksum mismatch over {len(data)} bytes); the state "
        "was truncated or altered after it was taken, or holds another lane's bytes: restore "
        "from an intact checkpoint"
    )
    with pytest.raises(StateError) as info:
        decode_lane_state(4, data, 2)
    assert str(info.value) == message


def test_another_lane_s_bytes_are_refused():
    data = encode_lane_state(SNAPSHOT, 1)
    with pytest.raises(StateError, match=r"lane 2: corrupt state bytes .*another lane's bytes"):
        decode_lane_state(2, data, 2)


def test_another_format_version_behind_a_valid_checksum_is_refused_with_the_version_error():
    data = encode_lane_state(snapshot(format=LANE_FORMAT - 1), 3)
    with pytest.raises(StateError) as info:
        decode_lane_state(3, data, 2)
    assert str(info.value) == (
        f"lane 3: the lane state has version {LANE_FORMAT - 1}; this zephon_jax reads version "
        f"{LANE_FORMAT}: restore it with the zephon_jax release that wrote it"
    )
    data = encode_lane_state(snapshot(format="8"), 3)
    with pytest.raises(StateError, match=r"lane 3: the lane state's 'version' is '8' \(str\)"):
        decode_lane_state(3, data, 2)


def test_a_first_format_state_without_checksum_is_refused_with_the_version_error():
    old = codec.encode((1, 0, False, (), ()))
    with pytest.raises(StateError) as info:
        decode_lane_state(2, old, 0)
    assert str(info.value) == (
        "lane 2: unrecognized lane state (lane format 1, this zephon_jax reads 8); it was "
        "written by another zephon_jax version: restore it with the release that wrote it"
    )


@pytest.mark.parametrize("lane", [0, 3])
def test_a_state_whose_checksum_started_from_zero_is_refused_with_the_version_error(lane):
    """Lane formats 2 to 4 started every lane's checksum from 0: on any lane, such bytes
    are another version's, not corrupt ones."""
    body = codec.encode((4, 0, False, ((), ()), (), 0, None))
    old = body + zlib.crc32(body).to_bytes(4, "little")
    with pytest.raises(StateError, match=rf"^lane {lane}: (.* has version 4|.*lane format 4)") as e:
        decode_lane_state(lane, old, 2)
    assert str(e.value).endswith("release that wrote it")
    corrupt = body[:-1] + bytes([body[-1] ^ 1]) + old[-4:]
    with pytest.raises(StateError, match=rf"^lane {lane}: corrupt state bytes"):
        decode_lane_state(lane, corrupt, 2)


def test_bytes_that_are_not_a_tuple_are_an_unrecognized_state():
    with pytest.raises(StateError, match=r"lane 0: unrecognized lane state \(lane format 'x'"):
        decode_lane_state(0, with_crc(codec.encode("x"), 0), 2)
    with pytest.raises(StateError, match=r"unrecognized lane state \(lane format \(\),"):
        decode_lane_state(0, with_crc(codec.encode(()), 0), 2)


@pytest.mark.parametrize(
    "value, match",
    [
        (SNAPSHOT[:7], r"lane 5: the lane state has 7 entries, not 8; the state was altered"),
        (snapshot(next_position=-1), r"'next_position' is -1; it must be an int >= 0"),
        (snapshot(next_position=2.0), r"'next_position' is 2\.0"),
        (snapshot(input_done=1), r"'input_done' is 1 \(int\); it must be a bool"),
        (snapshot(carries=CARRIES[:1]), r"has 1 operator carries, the pipeline 2 operators"),
        (snapshot(carries=None), r"has None operator carries, the pipeline 2 operators"),
        (snapshot(carries=(CARRIES[0], ((), 1, 2))), r"carry of operator 1 is not \(held"),
        (snapshot(carries=(CARRIES[0], ([], None))), r"carry of operator 1 is not \(held"),
        # a first carry of three entries, the first of them of a carry's form
        (snapshot(carries=((((), None), 1, 2), CARRIES[1])), r"carry of operator 0 is not"),
        (
            snapshot(carries=((CARRIES[0][0] + (-3,), None), CARRIES[1])),
            r"lane 5: carries\[0\] held\[2\] is -3 \(int\); a record pointer is",
        ),
        (snapshot(pending=[7]), r"lane 5: pending rows must be a tuple of lineages"),
        (
            snapshot(pending=(7, derived((1, 2.5), None))),
            r"pending\[1\] parent 1 is 2\.5 \(float\)",
        ),
        (snapshot(step=-2), r"lane 5: the lane's step must be an int >= 0; got -2"),
        (snapshot(step=True), r"the lane's step must be an int >= 0; got True"),
        (snapshot(tally=TALLY[:2]), r"lane 5: the state's accounting .* not \(skipped, sources"),
    ],
)
def test_malformed_entries_behind_a_valid_checksum_are_named(value, match):
    with pytest.raises(StateError, match=match):
        decode_lane_state(5, with_crc(codec.encode(value), 5), 2)


def test_the_position_is_checked_against_the_lane_s_end():
    data = encode_lane_state(snapshot(next_position=12), 0)
    assert decode_lane_state(0, data, 2, end_position=12).next_position == 12
    with pytest.raises(StateError) as info:
        decode_lane_state(0, data, 2, end_position=11)
    assert str(info.value) == (
        "lane 0: 'next_position' is 12 (input_done=False), but this lane's input ends at "
        "lane-local position 11; the state was altered"
    )
    done_early = encode_lane_state(snapshot(next_position=10, input_done=True), 0)
    with pytest.raises(StateError, match=r"'next_position' is 10 \(input_done=True\), but"):
        decode_lane_state(0, done_early, 2, end_position=12)


def test_a_finished_input_needs_a_pipeline_that_can_end():
    done = encode_lane_state(snapshot(input_done=True), 0)
    with pytest.raises(StateError, match=r"'input_done' is True, but this pipeline's input never"):
        decode_lane_state(0, done, 2)
    # a mixture by tokens ends without a known end position
    assert decode_lane_state(0, done, 2, end_position=None, can_end=True).input_done is True
    with pytest.raises(StateError, match="input never ends"):
        decode_lane_state(0, done, 2, end_position=12, can_end=False)


@pytest.mark.parametrize(
    "saved", [(0, (), ()), TALLY, (3, (1, 1, 1, 1), (0, 0, 5))], ids=["empty", "two", "stages"]
)
def test_check_saved_tally_accepts_counters_four_per_source(saved):
    check_saved_tally(saved, 0)


@pytest.mark.parametrize(
    "saved, match",
    [
        (None, r"lane 2: the state's accounting is None, not \(skipped, sources, stages\)"),
        ((0, ()), r"accounting is \(0, \(\)\), not \(skipped"),
        ((0, (1, 2, 3), ()), r"accounting \(0, \(1, 2, 3\), \(\)\) is malformed \(counters"),
        ((-1, (), ()), r"accounting \(-1, \(\), \(\)\) is malformed"),
        ((0, (1, 2, 3, -4), ()), r"is malformed"),
        ((0, (), [1]), r"is malformed"),
        ((0, (), (True,)), r"is malformed"),
    ],
)
def test_check_saved_tally_refuses_other_forms(saved, match):
    with pytest.raises(StateError, match=match):
        check_saved_tally(saved, 2)


@pytest.mark.parametrize(
    "lineage",
    [0, 17, draw(3, 1, 2), opaque({"a": 1}), derived((1, derived((draw(0, 0, 0),), 2)), "r")],
    ids=["zero", "position", "draw", "opaque", "nested"],
)
def test_check_lineage_accepts_every_lineage_kind(lineage):
    check_lineage(lineage, 0, "pending[0]")


@pytest.mark.parametrize(
    "lineage, match",
    [
        (-1, r"lane 1: here is -1 \(int\); a record pointer is a lane-local position"),
        ("3", r"here is '3' \(str\)"),
        ((3, -1, 2), r"here is \(3, -1, 2\) \(tuple\)"),
        ((1, 2), r"here is \(1, 2\) \(tuple\)"),
        (derived((1, derived((-2,), 0)), 0), r"here parent 1 parent 0 is -2 \(int\)"),
    ],
)
def test_check_lineage_names_where_an_impossible_pointer_is(lineage, match):
    with pytest.raises(StateError, match=match):
        check_lineage(lineage, 1, "here")


@pytest.mark.parametrize(
    "bad, match",
    [
        (piece(draw(3, -1, 2), 4), r"held\[40\] parent 0 is \(3, -1, 2\) \(tuple\)"),
        (piece(draw(3, 1, 2.0), 4), r"held\[40\] parent 0 is \(3, 1, 2\.0\) \(tuple\)"),
        (piece((3, 1), 4), r"held\[40\] parent 0 is \(3, 1\) \(tuple\)"),
        (-5, r"held\[40\] is -5 \(int\)"),
    ],
)
def test_a_bad_pointer_among_many_pieces_of_draws_is_named(bad, match):
    held = tuple(piece(draw(i, i % 2, i // 2), i % 3) for i in range(60))
    held = held[:40] + (bad,) + held[41:]
    value = snapshot(carries=((held, None), CARRIES[1]))
    with pytest.raises(StateError, match=r"lane 5: carries\[0\] " + match):
        decode_lane_state(5, with_crc(codec.encode(value), 5), 2)


def test_with_tally_replaces_only_the_counters():
    snapshot = LaneSnapshot(8, 5, False, ((), None), (), 3, None, (0, (1, 2, 3, 1), ()))
    other = with_tally(snapshot, (1, (9, 9, 9, 2), ()))
    assert other[:-1] == snapshot[:-1] and other.tally == (1, (9, 9, 9, 2), ())
    assert type(other) is LaneSnapshot


DRAWN = tuple(piece(draw(i, i % 2, i // 2), i % 3) for i in range(30))  # a mixture's pieces


def test_held_pieces_of_drawn_records_decode_as_a_table_equal_to_their_tuple():
    value = snapshot(carries=((DRAWN, None), CARRIES[1]))
    data = encode_lane_state(value, 3)
    got = decode_lane_state(3, data, 2)
    held = got.carries[0][0]
    assert type(held) is DrawPieceTable and held == DRAWN
    assert held.array.tolist() == [[i, i % 2, i // 2, i % 3] for i in range(30)]
    assert type(got.carries[1][0]) is tuple and got.pending == PENDING
    assert got == value and encode_lane_state(got, 3) == data  # encodes to the same bytes


# Rows made ahead of those pieces: (parents, lengths).
DRAWN_ROWS = ((DRAWN[:3], (5, 7, 9)), (DRAWN[3:4], (16,)), (DRAWN[4:6], (1, 2)))


def test_rows_made_ahead_of_drawn_pieces_decode_as_a_table_equal_to_their_tuple():
    value = snapshot(carries=((DRAWN, None), CARRIES[1]), pending=DRAWN_ROWS)
    data = encode_lane_state(value, 3)
    got = decode_lane_state(3, data, 2)
    assert type(got.pending) is DrawRowTable and got.pending == DRAWN_ROWS
    assert got.pending.ends.tolist() == [3, 4, 6]
    assert got.pending.lengths.tolist() == [5, 7, 9, 16, 1, 2]
    assert got == value and encode_lane_state(got, 3) == data  # encodes to the same bytes
    other = snapshot(pending=DRAWN_ROWS + (7,))  # not all rows of drawn pieces
    assert type(decode_lane_state(3, encode_lane_state(other, 3), 2).pending) is tuple


@pytest.mark.parametrize(
    "bad, match",
    [
        (piece(draw(3, -1, 2), 4), r"pending\[1\] parent 1 parent 0 is \(3, -1, 2\) \(tuple\)"),
        (piece(draw(-3, 1, 2), 4), r"pending\[1\] parent 1 parent 0 is \(-3, 1, 2\) \(tuple\)"),
    ],
)
def test_a_bad_pointer_in_rows_made_ahead_of_drawn_pieces_is_named(bad, match):
    rows = list(DRAWN_ROWS)
    rows[1] = ((DRAWN[3], bad), (16, 2))
    value = snapshot(pending=tuple(rows))
    with pytest.raises(StateError, match=r"lane 5: " + match):
        decode_lane_state(5, with_crc(codec.encode(value), 5), 2)


def test_lane_states_decode_as_the_codec_decodes_them_even_altered(monkeypatch):
    """The lane decoding (held pieces as tables) accepts and refuses exactly what the
    codec's general decoding does, with equal snapshots, for every truncation and
    alteration of a state's bytes behind a valid checksum."""
    carries = ((DRAWN, None), ((7, 8), (1, 2)))
    body = codec.encode(snapshot(carries=carries, pending=DRAWN_ROWS))
    tampered = [body[:cut] for cut in range(len(body))]
    for at in range(len(body)):
        for byte in (0x00, 0x01, 0x03, 0x06, 0x7F, 0x80, 0xFF):
            tampered.append(body[:at] + bytes([byte]) + body[at + 1 :])

    def outcome(data: bytes):
        try:
            return ("ok", tuple(plain_snapshot(decode_lane_state(1, with_crc(data, 1), 2))))
        except StateError:
            return ("error", None)

    got = [outcome(data) for data in tampered]
    monkeypatch.setattr(lane_format, "_decoded", lambda body, n: codec.decode(body))
    want = [outcome(data) for data in tampered]
    assert got == want
    assert 100 < sum(kind == "ok" for kind, _ in got) < len(got) - 100
