"""decode() through a real SparkSession: partitions, files, Delta input, errors."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pgoutput_spark import CaptureColumns, CaptureError, decode, quarantined, read_capture
from pgoutput_spark.decoder.batch import decode_batch, restore_tuples
from pgoutput_spark.decoder.stream import StreamEvents
from pgoutput_spark.spark.decode import raw_bytes
from pgoutput_spark.spark.session import release

from ..decoder import builders as b


def _streamed_capture(blocks: int = 30) -> list[bytes]:
    """Interleaved plain and streamed transactions; streamed inserts carry xids."""
    row = b.tuple_data(("t", b"1"), ("t", b"hello"))
    out: list[bytes] = [b.relation(16384, "public", "t", "d", [(1, "id", 23, -1), (0, "v", 25, -1)])]
    for i in range(blocks):
        xid = 1000 + i
        out.append(b.stream_start(xid, True))
        out += [b.insert(16384, row, xid=xid) for _ in range(7)]
        out.append(b.stream_stop())
        out += [b.begin(i, i, 5000 + i), b.insert(16384, row), b.commit(i, i + 1, i)]
        out.append(b.stream_start(xid, False))
        out += [b.delete(16384, b.tuple_data(("t", b"1")), xid=xid) for _ in range(3)]
        out.append(b.stream_stop())
        out.append(b.stream_commit(xid, i, i + 1, i))
    return out


def _write(tmp_path, messages, cuts, name="capture"):
    folder = tmp_path / name
    folder.mkdir()
    table = pa.table({"seq": pa.array(np.arange(len(messages)) * 3 + 7, pa.int64()),
                      "lsn": pa.array(np.arange(len(messages)) // 2, pa.int64()),
                      "data": pa.array(messages, pa.binary())})
    bounds = [0, *cuts, len(messages)]
    for k, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        pq.write_table(table.slice(lo, hi - lo), folder / f"part-{k:05d}.parquet")
    return folder, table


def test_stream_blocks_cut_across_files_and_partitions(spark, tmp_path):
    messages = _streamed_capture()
    # Cuts that fall inside stream blocks, files of very different sizes.
    cuts = [3, 5, 17, 18, 40, 101, 102, 250, 333]
    folder, table = _write(tmp_path, messages, cuts)
    capture = read_capture(spark, str(folder)).repartition(7)  # scramble row order
    decoded = decode(capture).orderBy("seq").toArrow()

    whole = decode_batch(table.column("data"),
                         in_stream=StreamEvents.from_messages(
                             table.column("seq").to_numpy(),
                             np.array([m[0] for m in messages])).in_stream(table.column("seq").to_numpy()),
                         seq=table.column("seq").to_numpy(), lsn=table.column("lsn").to_numpy())
    assert decoded.column("error").null_count == decoded.num_rows
    assert decoded.select(["seq", "in_stream", "stream_xid", "change"]).to_pylist() == \
        whole.batch.select(["seq", "in_stream", "stream_xid", "change"]).to_pylist()
    # Every streamed change carries its block's xid.
    rows = decoded.to_pylist()
    current = None
    for row in rows:
        if row["message_type"] == "stream_start":
            current = row["stream_start"]["xid"]
        elif row["message_type"] == "stream_stop":
            current = None
        elif row["message_type"] in ("insert", "delete"):
            assert row["stream_xid"] == current
            assert row["in_stream"] == (current is not None)


def test_quarantine_keeps_raw_bytes_and_counts(spark, tmp_path):
    messages = [b.begin(1, 2, 3), b"I\x00\x00", b"", b"Z", b.commit(1, 2, 3)]
    folder, _ = _write(tmp_path, messages, [2])
    decoded = decode(read_capture(spark, str(folder)), on_error="quarantine")
    bad = quarantined(decoded).orderBy("seq").collect()
    assert [r["raw"] for r in bad] == [bytearray(b"I\x00\x00"), bytearray(b""), bytearray(b"Z")]
    assert [r["seq"] for r in bad] == [10, 13, 16]
    assert bad[0]["error"] == "Insert.relation_id at seq 10 (lsn 0/0): need 4 bytes at offset 1, have 2"
    assert decoded.where("error is null").count() == 2


def test_raw_carried_as_a_string_keeps_every_byte(spark, tmp_path):
    """``raw_as_string``: the bytes of each deferred change (none of them UTF-8 here) come
    through Spark's cache and back to Python unchanged; quarantine gives them as binary."""
    oid = 0x00FFFE80  # the relation id alone is not UTF-8
    every_byte = bytes(range(256))
    messages = [b.relation(oid, "public", "t", "d", [(1, "id", 17, -1)]), b.begin(1, 2, 3),
                b.insert(oid, b.tuple_data(("b", every_byte))),
                b.update(oid, b.tuple_data(("b", b"\xc3\x28")), b.tuple_data(("b", b"\xff")), old_kind="O"),
                b.delete(oid, b.tuple_data(("b", b"\x80\x80"))), b"I\xff\xfe", b.commit(1, 2, 3)]
    folder, _ = _write(tmp_path, messages, [3])
    capture = read_capture(spark, str(folder))
    decoded = decode(capture, tuples=False, raw_as_string=True, on_error="quarantine").persist()
    try:
        assert decoded.schema["raw"].dataType.simpleString() == "string"
        rows = decoded.orderBy("seq").toArrow()
        assert pa.types.is_string(rows.schema.field("raw").type)
        changes = decoded.where("error IS NULL AND raw IS NOT NULL").select("seq", raw_bytes(decoded)).orderBy("seq")
        assert [bytes(r["raw"]) for r in changes.collect()] == messages[2:5]
        restored = restore_tuples(rows.combine_chunks().to_batches()[0].drop_columns(["change"]))
        whole = decode(capture, on_error="quarantine").orderBy("seq").toArrow()
        assert restored.column("change").to_pylist() == whole.column("change").to_pylist()
        bad = quarantined(decoded).collect()
        assert [bytes(r["raw"]) for r in bad] == [b"I\xff\xfe"]
        assert quarantined(decoded).schema["raw"].dataType.simpleString() == "binary"
    finally:
        release(decoded)


def test_fail_mode_names_the_first_bad_message(spark, tmp_path):
    messages = [b.begin(1, 2, 3), b.commit(1, 2, 3) + b"x", b"Z"]
    folder, _ = _write(tmp_path, messages, [])
    with pytest.raises(Exception, match=r"Commit at seq 10 \(lsn 0/0\): 1 trailing bytes"):
        decode(read_capture(spark, str(folder))).collect()


def test_delta_capture_and_renamed_columns(spark, tmp_path):
    messages = [b.begin(1, 2, 3), b.xlogdata(0x99, 0x99, 0, b.commit(1, 2, 3))]
    frame = spark.createDataFrame(
        [(i, 0, bytearray(m), 700) for i, m in enumerate(messages)],
        "position long, at_lsn long, payload binary, txid int",
    )
    path = str(tmp_path / "delta_capture")
    frame.write.format("delta").save(path)
    columns = CaptureColumns(seq="position", lsn="at_lsn", data="payload", xid="txid")
    rows = decode(read_capture(spark, path), columns=columns).orderBy("seq").collect()
    assert [r["message_type"] for r in rows] == ["begin", "commit"]
    assert [r["xid"] for r in rows] == [700, 700]
    assert rows[1]["lsn"] == 0x99


def test_capture_contract_errors(spark, tmp_path):
    frame = spark.createDataFrame([(1, 2, "x")], "seq long, lsn long, data string")
    with pytest.raises(CaptureError, match="'data' .* is string, expected binary"):
        decode(frame)
    with pytest.raises(CaptureError, match="no column 'payload'"):
        decode(frame, columns=CaptureColumns(data="payload"))
    with pytest.raises(CaptureError, match="can't read capture '.*missing': it does not exist"):
        read_capture(spark, str(tmp_path / "missing"))
    # A folder with no Parquet file yet (a landing's README aside), said so in our words, not Spark's.
    (tmp_path / "empty" / "date=2026-11-22").mkdir(parents=True)
    (tmp_path / "empty" / "README.md").write_text("the landing of slot s\n")
    with pytest.raises(CaptureError, match=r"^can't read capture '.*empty' as parquet: it holds no \*\.parquet "
                                           r"file \(in it or its partition folders\): nothing has landed yet"):
        read_capture(spark, str(tmp_path / "empty"))


def test_a_session_column_ends_the_stream_block_a_walsender_session_left_open(spark):
    """A session that ends inside a stream block: the next session's messages are outside it
    (a Relation and an Insert without the leading xid of a streamed one), as they were sent."""
    row = b.tuple_data(("t", b"1"))
    first = [b.stream_start(7, True), b.relation(16384, "public", "t", "d", [(1, "id", 23, -1)], xid=7),
             b.insert(16384, row, xid=7)]
    second = [b.begin(0x90, 0, 8), b.relation(16384, "public", "t", "d", [(1, "id", 23, -1)]),
              b.insert(16384, row), b.commit(0x90, 0x98, 0)]
    frame = spark.createDataFrame(
        [(i, 0x80 + i, bytearray(m), 100 + (i >= len(first))) for i, m in enumerate(first + second)],
        "seq long, lsn long, data binary, connection int")
    rows = decode(frame, columns=CaptureColumns(session="connection")).orderBy("seq").collect()
    assert [(r["message_type"], r["in_stream"]) for r in rows] == [
        ("stream_start", False), ("relation", True), ("insert", True),
        ("begin", False), ("relation", False), ("insert", False), ("commit", False)]
    assert [r["relation"]["relation_id"] for r in rows if r["message_type"] == "relation"] == [16384, 16384]
    # Without it the second session's messages are read as streamed ones, which they are not.
    with pytest.raises(Exception, match=r"Insert.marker at seq 5 \(lsn 0/85\): expected 'N'"):
        decode(frame).collect()


def test_session_column_errors_name_the_seqs(spark):
    """Every message names its session; one session's messages follow one another."""
    def frame(sessions):
        return spark.createDataFrame([(i, i, bytearray(b.stream_stop()), s) for i, s in enumerate(sessions)],
                                     "seq long, lsn long, data binary, session string")

    with pytest.raises(CaptureError, match=r"session column is NULL for 2 messages \(first: seq 1\)"):
        decode(frame(["a", None, "a", None]), columns=CaptureColumns(session="session"))
    with pytest.raises(CaptureError, match=r"session 'a' \(seqs 0 to 2\) and session 'b' \(seqs 1 to 1\) overlap"):
        decode(frame(["a", "b", "a"]), columns=CaptureColumns(session="session"))
    with pytest.raises(CaptureError, match=r"no column 'walsender' \(the session column\)"):
        decode(frame(["a"]), columns=CaptureColumns(session="walsender"))
