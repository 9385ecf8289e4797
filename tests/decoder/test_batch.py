"""decode_batch: one vectorized pass over many messages agrees with one-by-one decoding."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgoutput_spark import decode_message
from pgoutput_spark.decoder.batch import decode_batch, restore_tuples
from pgoutput_spark.decoder.messages import message_from_row
from pgoutput_spark.decoder.schema import DECODED_SCHEMA
from pgoutput_spark.errors import DecodeError

from . import builders as b


def _decode(messages: list[bytes], in_stream: list[bool], binary_type=pa.binary()):
    n = len(messages)
    return decode_batch(pa.array(messages, type=binary_type), in_stream=np.array(in_stream, bool),
                        seq=np.arange(n) + 100, lsn=np.arange(n) * 8)


def _one_by_one(data: bytes, in_stream: bool):
    try:
        return decode_message(data, in_stream)
    except DecodeError as exc:
        return ("error", exc.field, exc.reason)


@pytest.mark.parametrize("binary_type", [pa.binary(), pa.large_binary()])
def test_batch_equals_single_messages_mixed_with_errors(binary_type):
    good = b.every_message()
    # Interleave broken copies so errors sit between good rows of every group.
    rows = []
    for data, in_stream in good:
        rows.append((data, in_stream))
        rows.append((data[: len(data) // 2], in_stream))
    decoded = _decode([r[0] for r in rows], [r[1] for r in rows], binary_type)
    assert decoded.batch.schema == DECODED_SCHEMA
    out = decoded.batch.to_pylist()
    for i, ((data, in_stream), row) in enumerate(zip(rows, out)):
        expected = _one_by_one(data, in_stream)
        if isinstance(expected, tuple):
            assert row["error"] is not None and row["raw"] == data, i
            error = decoded.error(i)
            assert (error.field, error.reason, error.seq) == (expected[1], expected[2], 100 + i)
            assert all(row[f] is None for f in ("begin", "change", "relation", "prepare"))
        else:
            assert row["error"] is None and row["raw"] is None
            assert message_from_row(row) == expected, i


@pytest.mark.parametrize("engine", ["numba", "numpy"])
def test_deferred_tuples_restore_to_the_direct_decode(engine):
    good = b.every_message()
    rows = []  # broken copies between good rows; every message also framed in XLogData
    for i, (data, in_stream) in enumerate(good):
        rows += [(data, in_stream), (data[: len(data) // 2], in_stream),
                 (b.xlogdata(0x100 * i, 0, 0, data), in_stream)]
    data = pa.array([r[0] for r in rows])
    args = dict(in_stream=np.array([r[1] for r in rows]), seq=np.arange(len(rows)) + 100,
                lsn=np.arange(len(rows)) * 8, engine=engine)
    direct = decode_batch(data, **args).batch
    deferred = decode_batch(data, tuples=False, **args).batch
    assert deferred.schema == direct.schema
    change = deferred.column("change")
    assert change.field("old_tuple").null_count == change.field("new_tuple").null_count == len(rows)
    assert change.field("relation_id").equals(direct.column("change").field("relation_id"))
    is_change = np.isin(direct.column("message_type").to_numpy(zero_copy_only=False),
                        ["insert", "update", "delete"]) & np.asarray(direct.column("error").is_null())
    assert np.array_equal(np.asarray(deferred.column("raw").is_valid()),
                          is_change | np.asarray(direct.column("error").is_valid()))
    # Everything but the change tuples and `raw` of good changes is as decoded directly.
    for name in direct.schema.names:
        if name not in ("change", "raw"):
            assert deferred.column(name).equals(direct.column(name)), name
    restored = restore_tuples(deferred)
    assert restored.column("change").equals(direct.column("change"))
    # Rows decoded with their tuples (a previous version's saved rows) keep them.
    mixed = pa.concat_tables([pa.Table.from_batches([direct]), pa.Table.from_batches([deferred])])
    mixed = mixed.combine_chunks().to_batches()[0]
    assert restore_tuples(mixed).column("change").to_pylist() == direct.column("change").to_pylist() * 2


def test_restore_tuples_reports_bad_bytes_with_their_position():
    deferred = decode_batch(pa.array([b.insert(16384, b.tuple_data(("t", b"1")))]), tuples=False,
                            in_stream=np.zeros(1, bool), seq=np.array([7]), lsn=np.array([64])).batch
    raw = deferred.column("raw").to_pylist()[0]
    broken = deferred.set_column(deferred.schema.names.index("raw"), "raw", pa.array([raw[:-1]]))
    with pytest.raises(DecodeError) as info:
        restore_tuples(broken)
    assert (info.value.seq, info.value.lsn, info.value.field) == (7, 64, "Insert.new_tuple[0].value")


def test_sliced_arrow_array_is_honoured():
    messages = [b.stream_stop(), b.begin(1, 2, 3), b.commit(4, 5, 6)]
    array = pa.array(messages, type=pa.binary()).slice(1, 2)
    decoded = decode_batch(array, in_stream=np.zeros(2, bool), seq=np.arange(2), lsn=np.arange(2))
    assert decoded.batch.column("message_type").to_pylist() == ["begin", "commit"]


def test_null_data_is_an_error():
    decoded = decode_batch(pa.array([None, b.stream_stop()], type=pa.binary()),
                           in_stream=np.zeros(2, bool), seq=np.array([5, 6]), lsn=np.array([0, 0]))
    assert decoded.batch.column("error").to_pylist()[0] == "message at seq 5 (lsn 0/0): message data is NULL"
    assert decoded.batch.column("message_type").to_pylist()[1] == "stream_stop"


def test_xlogdata_lsn_comes_from_data_start():
    data = b.xlogdata(0xABCDEF, 0xFFFFFF, 0, b.begin(1, 2, 3))
    decoded = _decode([data, b.stream_stop()], [False, False])
    assert decoded.batch.column("lsn").to_pylist()[0] == 0xABCDEF
    assert decoded.batch.column("raw").to_pylist() == [None, None]


def test_framing_none_rejects_frames():
    data = b.xlogdata(1, 2, 3, b.stream_stop())
    decoded = decode_batch(pa.array([data]), in_stream=np.zeros(1, bool), seq=np.zeros(1),
                           lsn=np.zeros(1), framing="none")
    assert "unknown message type byte 'w'" in decoded.batch.column("error")[0].as_py()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.binary(max_size=64), st.booleans()), min_size=1, max_size=20))
def test_random_bytes_never_raise_anything_but_decode_error(rows):
    decoded = _decode([r[0] for r in rows], [r[1] for r in rows])
    out = decoded.batch.to_pylist()
    for (data, in_stream), row in zip(rows, out):
        try:
            message = decode_message(data, in_stream)
        except DecodeError:
            assert row["error"] is not None
        else:
            assert row["error"] is None and message_from_row(row) == message


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(b.every_message()), st.data())
def test_mutated_messages_only_raise_decode_error(message, data):
    raw, in_stream = message
    mutated = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(mutated) - 1))
        mutated[i] = data.draw(st.integers(0, 255))
    try:
        decode_message(bytes(mutated), in_stream)
    except DecodeError:
        pass
