"""Transaction assembly against PostgreSQL's own test_decoding output.

A test_decoding slot without streaming or two-phase prints every committed
transaction whole, at its commit, in commit order, without rolled-back
subtransactions, aborted or rolled-back-prepared transactions: exactly the
change sequence that assembly must produce from the pgoutput stream.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from pgoutput_spark import decode
from pgoutput_spark.spark.assemble import ScanState, assemble
from pgoutput_spark.spark.session import local_frame

from ..decoder.tuple_oracle import Truncate


def _frame(spark, messages, framed=False):
    from ..decoder import builders as b

    data = [b.xlogdata(m.lsn, m.lsn, 0, m.data) if framed else m.data for m in messages]
    table = pa.table({"seq": [m.seq for m in messages], "lsn": [m.lsn for m in messages],
                      "data": pa.array(data, pa.binary())})
    return spark.createDataFrame(table)  # a local relation, as `local_frame`'s


def _as_oracle(spark, decoded_rows, committed):
    """Our committed changes as (relation, action, new text, old text) in commit order."""
    relations = {}
    for row in decoded_rows:
        if row["message_type"] == "relation":
            r = row["relation"]
            relations[r["relation_id"]] = (r["namespace"], r["relation_name"], r["columns"])
    out = []
    for row in committed:
        kind = row["message_type"]
        if kind == "truncate":
            names = sorted(relations[o][:2] for o in row["truncate"]["relation_ids"])
            out.append(("TRUNCATE", tuple(names), row["truncate"]["cascade"]))
            continue
        change = row["change"]
        namespace, name, columns = relations[change["relation_id"]]
        new = tuple((c["name"], v["value"].decode() if v["value"] is not None else v["kind"])
                    for c, v in zip(columns, change["new_tuple"] or []))
        old = tuple((c["name"], v["value"].decode()) for c, v in zip(columns, change["old_tuple"] or [])
                    if v["kind"] != "n")
        out.append((kind.upper(), (namespace, name), new, old))
    return out


def _oracle(changes):
    out = []
    for ch in changes:
        if isinstance(ch, Truncate):
            out.append(("TRUNCATE", tuple(sorted(ch.relations)), ch.cascade))
            continue
        new = tuple((c.name, c.text if c.kind == "value" else {"null": "n", "unchanged-toast": "u"}[c.kind])
                    for c in ch.new or ())
        old = tuple((c.name, c.text) for c in ch.old or () if c.kind == "value")
        out.append((ch.action, ch.relation, new, old))
    return out


def _committed_in_order(assembled):
    return assembled.committed.orderBy("commit_seq", "seq").collect()


#: The two ways a scan finds each message's block and stream: a lookup in the run's Begin and
#: Stream Start seqs (runs up to LOOKUP_LIMIT of them), or a window per seq bucket (larger runs;
#: small buckets here, so that carries cross them).
#: Or `decode` finds them itself when given the scan's start (``positions``).
SCANS = pytest.mark.parametrize("scan", [{}, {"lookup_limit": 0, "rows_per_bucket": 50}, {"positions": True}],
                                ids=["lookup", "window", "decode"])


def _decode(frame, scan, state=ScanState(), **kwargs):
    """Decoded and cached, as the jobs cache what they decode (`apply`, `changes`): the assembly
    and the checks read the messages in several passes, each of which would decode them again."""
    return decode(frame, positions=state if scan.get("positions") else None, **kwargs).cache()


@pytest.fixture(autouse=True)
def _uncached(spark):
    """The frames a test cached (`_decode`) are dropped after it."""
    yield
    spark.catalog.clearCache()


def _assemble(decoded, scan, state=ScanState(), **kwargs):
    return assemble(decoded, state, **{k: v for k, v in scan.items() if k != "positions"}, **kwargs)


@SCANS
def test_committed_changes_equal_test_decoding(spark, captured, scan):
    messages, oracle = captured
    decoded = _decode(_frame(spark, messages), scan)
    assembled = _assemble(decoded, scan)
    rows = decoded.orderBy("seq").collect()
    ours = _as_oracle(spark, rows, _committed_in_order(assembled))
    assert ours == _oracle(oracle)
    assert assembled.open_rows.count() == 0
    assert assembled.end_state == ScanState(None, None)
    outcomes = sorted(t.outcome.value for t in assembled.ledger.txns)
    assert outcomes == ["committed"] * 5 + ["discarded"] * 2
    assert len(assembled.ledger.discards) == 1
    msgs = assembled.messages.orderBy("seq").collect()
    assert [(m["prefix"], bytes(m["content"]), m["commit_lsn"] is not None) for m in msgs] == [
        ("nt", b"not transactional", False), ("tx", b"transactional", True)]


@SCANS
def test_runs_cut_anywhere_carry_open_transactions(spark, captured, scan):
    # Cuts inside stream blocks, between Prepare and Commit Prepared, mid-block.
    cuts = [5, 40, 300, 301, 700, 1200]
    messages, oracle = captured
    bounds = [0, *[c for c in cuts if c < len(messages)], len(messages)]
    state, pending = ScanState(), None
    committed = []
    decoded_all = []
    for lo, hi in zip(bounds, bounds[1:]):
        part = _frame(spark, messages[lo:hi])
        decoded = _decode(part, scan, state, initially_in_stream=state.last_stream_xid is not None)
        decoded_all += decoded.collect()
        assembled = _assemble(decoded, scan, state, pending=pending)
        committed += assembled.committed.collect()
        state = assembled.end_state
        open_rows = assembled.open_rows.collect()
        # The runs skip saving open rows when the driver rules them out: it must never be wrong.
        assert assembled.may_leave_open or not open_rows, (lo, hi)
        pending = local_frame(spark, open_rows, assembled.open_rows.schema)
    assert pending.count() == 0
    assert not assembled.may_leave_open  # ... and it does rule them out at the capture's end
    committed.sort(key=lambda r: (r["commit_seq"], r["seq"]))
    decoded_all.sort(key=lambda r: r["seq"])
    assert _as_oracle(spark, decoded_all, committed) == _oracle(oracle)
    assert len({r["seq"] for r in committed}) == len(committed)


def test_decode_finds_each_messages_block_and_stream_as_the_scan_does(spark, captured):
    from pgoutput_spark.spark.assemble import scan

    messages, _ = captured
    state, blocks, streams = ScanState(), 0, 0
    for lo, hi in [(0, 5), (5, 40), (40, 300), (300, 301), (301, 700), (700, len(messages))]:
        # From seq 300 on as the walsender frames them: the positions are read past the frame.
        part = _frame(spark, messages[lo:hi], framed=lo >= 300)
        stream = state.last_stream_xid is not None
        scanned, end, _ = scan(decode(part, initially_in_stream=stream).where(F.col("error").isNull()), state)
        found = decode(part, initially_in_stream=stream, positions=state)
        expected = sorted(tuple(r) for r in scanned.select("seq", "block_seq", "top_xid").collect())
        assert sorted(tuple(r) for r in found.select("seq", "block_seq", "top_xid").collect()) == expected
        blocks += sum(r[1] is not None for r in expected)
        streams += sum(r[2] is not None for r in expected)
        state = end
    assert blocks > 10 and streams > 10  # both kinds, carried across the cuts


def test_past_the_lookup_limit_decode_leaves_the_positions_to_the_scan(spark, captured, monkeypatch):
    from pgoutput_spark.spark import decode as decoding

    messages, oracle = captured
    monkeypatch.setattr(decoding, "LOOKUP_LIMIT", 10)  # the capture has more Begin / Stream Start
    decoded = decode(_frame(spark, messages), positions=ScanState())
    assert "block_seq" not in decoded.columns and "top_xid" not in decoded.columns
    ours = _as_oracle(spark, decoded.orderBy("seq").collect(),
                      _committed_in_order(assemble(decoded, lookup_limit=0, rows_per_bucket=50)))
    assert ours == _oracle(oracle)


@SCANS
def test_committed_rows_carry_commit_metadata(spark, captured, scan):
    messages, _ = captured
    decoded = _decode(_frame(spark, messages), scan)
    committed = _assemble(decoded, scan).committed
    missing = committed.where(F.col("commit_lsn").isNull() | F.col("commit_ts").isNull()
                              | F.col("txn_xid").isNull() | F.col("commit_seq").isNull())
    assert missing.count() == 0
    # Changes take effect at or after their own position, never before.
    assert committed.where(F.col("commit_seq") < F.col("seq")).count() == 0
    # Each change has the xid PostgreSQL sent in its Begin / Begin Prepare (or its Stream Start).
    xid, expected = None, {}
    for r in decoded.orderBy("seq").collect():
        kind = r["message_type"]
        if kind in ("begin", "begin_prepare", "stream_start"):
            xid = (r["begin"]["xid"] if kind == "begin" else r["prepare"]["xid"] if kind == "begin_prepare"
                   else r["stream_start"]["xid"])
        expected[r["seq"]] = xid
    assert {r["seq"]: r["txn_xid"] for r in committed.collect()} == {
        r["seq"]: expected[r["seq"]] for r in committed.collect()}


@pytest.mark.parametrize("protocol", [1, 2])
def test_older_protocols_commit_the_same_changes(spark, captured, captured_by_protocol, protocol):
    messages = captured_by_protocol[protocol]
    kinds = {m.data[:1] for m in messages}
    assert (b"S" in kinds) == (protocol == 2)
    assert not kinds & {b"b", b"P", b"K", b"r", b"p"}  # no two-phase messages before protocol 3
    decoded = _decode(_frame(spark, messages), {})
    ours = _as_oracle(spark, decoded.orderBy("seq").collect(), _committed_in_order(assemble(decoded)))
    assert ours == _oracle(captured[1])


def test_origin_is_recorded_and_can_be_skipped(spark, captured):
    messages, _ = captured
    decoded = _decode(_frame(spark, messages), {})
    upstream = assemble(decoded).committed.where(F.col("txn_origin") == "upstream").collect()
    assert [(r["message_type"], r["change"]["new_tuple"][0]["value"]) for r in upstream] == [
        ("insert", bytearray(b"9000"))]
    skipped = assemble(decoded, skip_origins=("upstream",)).committed
    assert skipped.where(F.col("txn_origin") == "upstream").count() == 0
    assert skipped.count() == assemble(decoded).committed.count() - 1


def test_open_transaction_of_a_skipped_origin_still_carries_over(spark):
    from ..decoder import builders as b

    rel = b.relation(1, "public", "t", "d", [(1, "id", 23, -1)])
    row = b.tuple_data(("t", b"1"))
    data = [b.stream_start(9, True), b.origin(5, "upstream"), b.relation(1, "public", "t", "d",
                                                                          [(1, "id", 23, -1)], xid=9),
            b.insert(1, row, xid=9), b.stream_stop(),
            b.begin(1, 0, 3), rel, b.insert(1, row), b.commit(1, 2, 0),
            b.stream_commit(9, 5, 6, 0)]
    frame = spark.createDataFrame([(i, i, bytearray(d)) for i, d in enumerate(data)],
                                  "seq long, lsn long, data binary")
    first = assemble(decode(frame.where("seq < 6")), skip_origins=("upstream",))
    assert first.committed.count() == 0
    # The stream's Start, Origin, Relation and Insert, and the Begin still waiting for its Commit.
    assert sorted(r["seq"] for r in first.open_rows.collect()) == [0, 1, 2, 3, 5]
    pending = spark.createDataFrame(first.open_rows.collect(), first.open_rows.schema)
    second = assemble(decode(frame.where("seq >= 6")), first.end_state, pending=pending,
                      skip_origins=("upstream",))
    assert [r["seq"] for r in second.committed.collect()] == [7]  # only the local transaction


def test_saved_open_rows_read_stay_as_read_while_cached_and_the_table_is_written(spark, tmp_path):
    """A run caches the open rows it read back, then saves into the same table: the cached frame
    keeps the rows of the version it read (Spark plans a cached frame that reads a Delta table's
    latest version again after each write to the table, Delta's file listing with it)."""
    from pgoutput_spark.spark.pending import saved_open_rows
    from pgoutput_spark.spark.session import release

    path = str(tmp_path / "pending")
    spark.range(3).selectExpr("id AS seq", "7L AS _run_hi").write.format("delta").save(path)
    read = saved_open_rows(spark, path, 7).persist()
    try:
        assert read.count() == 3
        spark.range(3, 5).selectExpr("id AS seq", "7L AS _run_hi").write.format("delta").mode("append").save(path)
        assert sorted(r["seq"] for r in read.collect()) == [0, 1, 2]
        assert saved_open_rows(spark, path, 7).count() == 5  # a new read sees the write
    finally:
        release(read)


@pytest.mark.parametrize("positions", [True, False], ids=["decode", "scan"])
def test_open_rows_read_back_are_read_once_and_released_with_the_rest(spark, tmp_path, monkeypatch, positions):
    """Where `decode` found the positions, the scanned messages are not cached, and each plan built
    on them would read the pending Delta table again (Delta listing its files each time): the rows
    read back are cached instead. Where the scan finds them, the scanned messages (those rows
    with them) are cached. Either is released with the rest, or by `assemble` itself when it fails."""
    from pgoutput_spark.spark import assemble as assemble_module
    from pgoutput_spark.spark.pending import save_open_rows, saved_open_rows

    from ..decoder import builders as b

    row = b.tuple_data(("t", b"1"))
    data = [b.stream_start(9, True), b.relation(1, "public", "t", "d", [(1, "id", 23, -1)], xid=9),
            b.insert(1, row, xid=9), b.stream_stop(),
            b.begin(1, 0, 3), b.relation(1, "public", "t", "d", [(1, "id", 23, -1)]), b.insert(1, row),
            b.commit(1, 2, 0), b.stream_commit(9, 5, 6, 0)]
    frame = spark.createDataFrame([(i, i, bytearray(d)) for i, d in enumerate(data)],
                                  "seq long, lsn long, data binary")
    first = assemble(decode(frame.where("seq < 5"), positions=ScanState()))
    path = str(tmp_path / "pending")
    assert save_open_rows(first, path, "test:pending", None, 4) == 4  # the stream's three rows, the Begin
    later = decode(frame.where("seq >= 5"), positions=first.end_state if positions else None)
    pending = saved_open_rows(spark, path, 4)

    def killed(*args):
        raise RuntimeError("killed after caching")

    spark.catalog.clearCache()  # what other tests left: the check below is about this assembly's
    for step in ("_controls", "_carries_tuples"):  # its plans, its look at the rows read back
        with monkeypatch.context() as m:  # an assembly that fails leaves nothing cached
            m.setattr(assemble_module, step, killed)
            with pytest.raises(RuntimeError, match="killed"):
                assemble(later, first.end_state, pending=pending)
        assert not pending.is_cached and spark._jsparkSession.sharedState().cacheManager().isEmpty()
    second = assemble(later, first.end_state, pending=pending)
    try:
        assert (second.pending.is_cached, second.scanned.is_cached) == (positions, not positions)
        assert sorted(r["seq"] for r in second.committed.collect()) == [2, 6]  # the stream's, the block's
        assert second.pending_tuples  # `decode` decoded the tuples (its default): saved in ``change``, not ``raw``
    finally:
        second.release()
    assert not second.pending.is_cached and not second.scanned.is_cached


def test_forgetting_a_streamed_transaction_deletes_its_saved_rows_and_only_those(spark, tmp_path, caplog):
    """`forget_xids`' checks and delete on a ``pending`` table as the runs save it: the run that
    ended at seq 10 left streamed transaction 7 open, and 8 prepared by a Stream Prepare (its
    Commit Prepared always comes: not forgettable); the rows of the run that ended at 5 are not
    read again. The end-to-end case against PostgreSQL is in `test_apply_pg.py`."""
    from pgoutput_spark.errors import ConfigError
    from pgoutput_spark.spark.pending import ForgottenStream, forget_open_streams, open_streams, to_forget

    path = str(tmp_path / "pending")
    rows = [(3, "stream_start", 7, None, 10), (4, "insert", 7, None, 10), (6, "insert", 7, None, 10),
            (5, "stream_start", 8, None, 10), (8, "stream_prepare", 8, None, 10),
            (9, "begin", None, 9, 10), (10, "insert", None, 9, 10),
            (2, "stream_start", 7, None, 5), (3, "stream_start", 6, None, 5)]
    (spark.createDataFrame(rows, "seq long, message_type string, top_xid long, block_seq long, _run_hi long")
     .write.format("delta").partitionBy("_run_hi").save(path))
    assert open_streams(spark, path, 10) == {7: (3, 3)} and open_streams(spark, path, 5) == {7: (2, 1), 6: (3, 1)}
    assert to_forget(spark, path, 10, ScanState(), (7, 7), redone=False) == (ForgottenStream(7, 3, 3),)
    with pytest.raises(ConfigError, match=r"forget_xids: 8 is not a streamed transaction open at the target's "
                                          r"position \(seq 10\); open ones: 7 \(since seq 3, 3 rows\)\. Nothing"):
        to_forget(spark, path, 10, ScanState(), (7, 8), redone=False)
    with pytest.raises(ConfigError, match="open ones: none"):
        to_forget(spark, path, None, ScanState(), (7,), redone=False)
    with pytest.raises(ConfigError, match="still inside a stream block of transaction 7 at the target's position"):
        to_forget(spark, path, 10, ScanState(None, 7), (7,), redone=False)
    with caplog.at_level("WARNING", logger="pgoutput_spark.spark.pending"):
        assert to_forget(spark, path, 10, ScanState(), (6,), redone=True) == ()  # a retried command
    assert "forget_xids: 6 is not open at seq 10: taken as forgotten by the interrupted run" in caplog.text
    said: list[str] = []
    forget_open_streams(spark, path, 10, (ForgottenStream(7, 3, 3),), said.append)
    forget_open_streams(spark, path, 10, (ForgottenStream(7, 3, 3),), said.append)  # again: nothing more
    assert said == ["forgotten (forget_xids): streamed transaction 7, open since seq 3, 3 rows left out unapplied"] * 2
    left = sorted(tuple(r) for r in spark.read.format("delta").load(path).select("_run_hi", "seq").collect())
    assert left == [(5, 2), (5, 3), (10, 5), (10, 8), (10, 9), (10, 10)]
    assert open_streams(spark, path, 10) == {}


def test_forgetting_what_the_server_reports_aborted_asks_about_the_open_streams_only(spark, tmp_path):
    """`to_forget`'s ``ask`` (a run's ``forget_aborted``): asked about the streamed transactions
    open at the position but those named in ``forget_xids`` and the one whose stream block the
    capture is inside (13); it forgets those reported aborted and says why it keeps the others.
    Against PostgreSQL's own answers: `test_apply_pg.py`."""
    from pgoutput_spark.spark.pending import ForgottenStream, to_forget

    path = str(tmp_path / "pending")
    rows = [(3, "stream_start", 7, None, 20), (4, "insert", 7, None, 20), (5, "stream_start", 11, None, 20),
            (6, "stream_start", 12, None, 20), (7, "stream_start", 13, None, 20), (8, "stream_start", 14, None, 20)]
    (spark.createDataFrame(rows, "seq long, message_type string, top_xid long, block_seq long, _run_hi long")
     .write.format("delta").partitionBy("_run_hi").save(path))
    asked: list[list[int]] = []

    def ask(xids: list[int]) -> dict[int, str | None]:
        asked.append(xids)
        return {7: "aborted", 12: None, 13: "aborted", 14: "committed"}

    said: list[str] = []
    forgotten = to_forget(spark, path, 20, ScanState(None, 13), (11,), redone=False, ask=ask, say=said.append)
    assert asked == [[7, 12, 14]]
    assert forgotten == (ForgottenStream(7, 3, 2, asked=True), ForgottenStream(11, 5, 1))
    assert [f.note() for f in forgotten] == [
        "forgotten (PostgreSQL reports it aborted): streamed transaction 7, open since seq 3, 2 rows left out "
        "unapplied",
        "forgotten (forget_xids): streamed transaction 11, open since seq 5, 1 rows left out unapplied"]
    assert said == [
        "kept open (forget_aborted): streamed transaction 12, open since seq 6, 1 rows: PostgreSQL no longer knows "
        "its outcome (older than its oldest transaction status); if it aborted, forget it with forget_xids",
        "kept open (forget_aborted): streamed transaction 14, open since seq 8, 1 rows: PostgreSQL reports it "
        "committed"]
    assert to_forget(spark, path, None, ScanState(), (), redone=False, ask=ask) == () and len(asked) == 1  # none open
