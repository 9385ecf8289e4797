"""decode_message on crafted messages: every type, every field, and bad input."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from pgoutput_spark import decode_message
from pgoutput_spark.decoder import messages as m
from pgoutput_spark.decoder.protocol import ReplicaIdentity, TupleKind
from pgoutput_spark.errors import DecodeError
from pgoutput_spark.lsn import Lsn

from . import builders as b

PG_EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)


def test_begin_fields_are_unsigned_and_typed():
    msg = decode_message(b.begin(0x16B3748, 1_500_000, 4_000_000_000))
    assert msg == m.Begin(Lsn("0/16B3748"), PG_EPOCH + timedelta(seconds=1.5), 4_000_000_000)
    assert str(msg.final_lsn) == "0/16B3748"


def test_relation_columns_and_identity():
    msg = decode_message(b.relation(3_000_000_000, "public", "Mixed Case", "d",
                                    [(1, "id", 23, -1), (0, "note", 1043, 104)]))
    assert isinstance(msg, m.Relation)
    assert msg.relation_id == 3_000_000_000
    assert (msg.namespace, msg.relation_name) == ("public", "Mixed Case")
    assert msg.replica_identity is ReplicaIdentity.DEFAULT
    assert msg.columns == (m.RelationColumn(1, "id", 23, -1), m.RelationColumn(0, "note", 1043, 104))
    assert [c.is_key for c in msg.columns] == [True, False]
    assert msg.xid is None


def test_tuple_kinds():
    row = b.tuple_data(("t", b"42"), ("n", None), ("u", None), ("b", b"\x00\x01"), ("t", b""))
    msg = decode_message(b.insert(16384, row))
    assert msg == m.Insert(16384, (
        m.TupleValue(TupleKind.TEXT, b"42"), m.TupleValue(TupleKind.NULL, None),
        m.TupleValue(TupleKind.UNCHANGED_TOAST, None), m.TupleValue(TupleKind.BINARY, b"\x00\x01"),
        m.TupleValue(TupleKind.TEXT, b""),
    ))


def test_update_variants():
    row, key = b.tuple_data(("t", b"2")), b.tuple_data(("t", b"1"))
    assert decode_message(b.update(1, row)).old_tuple is None
    with_key = decode_message(b.update(1, row, key, "K"))
    assert (with_key.old_kind, with_key.old_tuple) == ("K", (m.TupleValue(TupleKind.TEXT, b"1"),))
    assert decode_message(b.update(1, row, row, "O")).old_kind == "O"


def test_streamed_messages_carry_xid_only_in_stream():
    row = b.tuple_data(("t", b"1"))
    assert decode_message(b.insert(5, row, xid=900), in_stream=True) == \
        m.Insert(5, (m.TupleValue(TupleKind.TEXT, b"1"),), xid=900)
    with pytest.raises(DecodeError):  # the xid is read as the relation id: 'N' is missing
        decode_message(b.insert(5, row, xid=900), in_stream=False)


def test_truncate_options():
    msg = decode_message(b.truncate([1, 4_294_967_295], 3))
    assert msg == m.Truncate(3, True, True, (1, 4_294_967_295))


def test_message_content_is_bytes():
    msg = decode_message(b.message(True, 0x20, "pfx", b"\x00\xff"))
    assert msg == m.LogicalMessage(1, True, Lsn(0x20), "pfx", b"\x00\xff")


@pytest.mark.parametrize("extended", [False, True])
def test_stream_abort_length_tells_protocol_4_parallel(extended):
    data = b.stream_abort(7, 8, 0x99, 1_000_000) if extended else b.stream_abort(7, 8)
    msg = decode_message(data)
    assert (msg.xid, msg.subxid) == (7, 8)
    if extended:
        assert (msg.abort_lsn, msg.abort_ts) == (Lsn(0x99), PG_EPOCH + timedelta(seconds=1))
    else:
        assert msg.abort_lsn is None and msg.abort_ts is None


def test_two_phase_messages():
    assert decode_message(b.begin_prepare(1, 2, 3, 4, "g")) == m.BeginPrepare(Lsn(1), Lsn(2), PG_EPOCH + timedelta(microseconds=3), 4, "g")
    assert isinstance(decode_message(b.prepare(1, 2, 3, 4, "g", stream=True)), m.StreamPrepare)
    assert decode_message(b.commit_prepared(1, 2, 3, 4, "g")).gid == "g"
    rollback = decode_message(b.rollback_prepared(1, 2, 3, 4, 5, "g"))
    assert (rollback.prepare_end_lsn, rollback.rollback_end_lsn, rollback.xid) == (1, 2, 5)


def test_xlogdata_frame_is_unwrapped():
    msg = decode_message(b.xlogdata(0x10, 0x20, 0, b.stream_stop()))
    assert isinstance(msg, m.StreamStop)


@pytest.mark.parametrize("data, in_stream", b.every_message())
def test_every_truncation_point_raises_decode_error(data, in_stream):
    whole = decode_message(data, in_stream=in_stream)
    for cut in range(len(data)):
        if isinstance(whole, m.StreamAbort) and cut == 9:
            # The first 9 bytes of a protocol 4 parallel Stream Abort are a
            # complete Stream Abort of the other protocols.
            assert decode_message(data[:cut]) == m.StreamAbort(whole.xid, whole.subxid)
            continue
        with pytest.raises(DecodeError):
            decode_message(data[:cut], in_stream=in_stream)


@pytest.mark.parametrize("data, in_stream", b.every_message())
def test_trailing_bytes_raise(data, in_stream):
    with pytest.raises(DecodeError, match="trailing bytes|is 10 bytes long|is 26 bytes long"):
        decode_message(data + b"\x00", in_stream=in_stream)


def test_error_names_field_position_and_offset():
    data = b.insert(16384, b.tuple_data(("t", b"1"), ("t", b"22"), ("t", b"333"), ("t", b"4444")))
    with pytest.raises(DecodeError) as info:
        decode_message(data[:-3], seq=1042, lsn=0x16B3748)
    error = info.value
    assert str(error) == ("Insert.new_tuple[3].value at seq 1042 (lsn 0/16B3748): "
                          "need 4 bytes at offset 34, have 1")
    assert (error.field, error.offset, error.message_type, error.seq) == (
        "Insert.new_tuple[3].value", 34, "Insert", 1042)


@pytest.mark.parametrize("data, reason", [
    (b"", "empty message"),
    (b"Z\x00", "unknown message type byte 'Z'"),
    (b.origin(1, "x")[:-1], "no NUL terminator"),
    (b"I" + bytes(4) + b"N" + b"\x00\x01t\x7f\xff\xff\xff", "need 2147483647 bytes"),
    (b"I" + bytes(4) + b"N" + b"\x00\x01t\xff\xff\xff\xff", "negative length -1"),
    (b"I" + bytes(4) + b"N" + b"\xff\xff" + b"n" * 10, "65535 columns announced"),
    (b"I" + bytes(4) + b"N" + b"\x00\x01x", "unknown tuple value kind 'x'"),
    (b"I" + bytes(4) + b"X", "expected 'N'"),
    (b"T" + b"\xff\xff\xff\xff\x00" + bytes(8), "4294967295 columns announced"),
    (b"R" + bytes(4) + b"\0\0" + b"q" + b"\x00\x00", "expected 'd', 'n', 'f' or 'i'"),
    (b"R" + bytes(4) + b"\0\0d" + b"\xff\xff" + bytes(30), "65535 columns announced"),
    (b"M" + b"\x01" + bytes(8) + b"p\0" + b"\x7f\xff\xff\xff", "need 2147483647 bytes"),
    (b"B" + b"\xff" * 8 + bytes(12), "out of range"),
    (b"w" + bytes(10), "need 8 bytes"),
])
def test_bad_input_reasons(data, reason):
    with pytest.raises(DecodeError, match=reason):
        decode_message(data)


def test_invalid_utf8_name_is_a_decode_error():
    with pytest.raises(DecodeError, match="not valid UTF-8"):
        decode_message(b"Y" + bytes(4) + b"\xff\xfe\0name\0")


def test_decode_error_survives_pickling():
    import pickle

    with pytest.raises(DecodeError) as info:
        decode_message(b"", seq=5, lsn=7)
    clone = pickle.loads(pickle.dumps(info.value))
    assert (str(clone), clone.seq, clone.lsn, clone.field) == (
        str(info.value), 5, 7, info.value.field)


def test_commit_time_past_year_9999_is_a_decode_error():
    data = bytes.fromhex("430000000000016b374800000000016b3780040000000001e240")
    with pytest.raises(DecodeError, match="Commit.commit_ts: value at offset 18 out of range"):
        decode_message(data)


def test_messages_print_like_the_protocol_docs():
    """``print(message)``: the type byte, then each field with its wire type; ``repr`` is unchanged."""
    from pgoutput_spark import decode_message

    begin = decode_message(b"B\x00\x00\x00\x00\x01\x6b\x37\x48" + bytes(8) + b"\x00\x00\x02\x9a")
    assert str(begin).splitlines() == [
        "Begin  Byte1('B')",
        "  Int64 (XLogRecPtr)     final_lsn  0/16B3748",
        "  Int64 (TimestampTz)    commit_ts  2000-01-01 00:00:00+00:00",
        "  Int32 (TransactionId)  xid        666",
    ]
    assert repr(begin).startswith("Begin(final_lsn=Lsn('0/16B3748'), ")
