"""The changes job, run file by file as captures land, against test_decoding."""

from __future__ import annotations

from importlib.metadata import version

import pytest
from pyspark.sql import types as T

from pgoutput_spark import decode, read_capture
from pgoutput_spark.changefeed import run_changes
from pgoutput_spark.mirroring import delta
from pgoutput_spark.reading import ChangeFeedStatus, status
from pgoutput_spark.spark.changes import change_frames
from pgoutput_spark.testing.capture_files import CapturedMessage, write_capture_parquet

from ..decoder.tuple_oracle import Truncate
from .deltalog import check_vacuumed, commits, recorded_vacuums

TABLES = ("a", "b", "c")
INTS = {"id", "a_id", "n", "extra"}


def _typed(name, text):
    return int(text) if name in INTS and text is not None else text


def _oracle_by_table(oracle):
    out = {t: [] for t in TABLES}
    for change in oracle:
        if isinstance(change, Truncate):
            for _, table in change.relations:
                out[table].append(("truncate", None))
            continue
        table = change.relation[1]
        row = {c.name: _typed(c.name, c.text) for c in change.new} if change.new else None
        out[table].append((change.action.lower(), row))
    return out


def _ours(spark, target, table, expected):
    """Our rows, each new tuple restricted to the columns test_decoding printed for it.

    Columns the source did not have yet at that change must be NULL here.
    """
    frame = spark.read.format("delta").load(f"{target}/_changes/public/{table}")
    rows = frame.orderBy("_commit_seq", "_seq").collect()
    data = [f.name for f in frame.schema if not f.name.startswith("_")]
    assert len(rows) == len(expected), (table, len(rows), len(expected))
    out = []
    for row, (_, want) in zip(rows, expected):
        if row["_op"] not in ("insert", "update"):
            out.append((row["_op"], None))
            continue
        names = set(want or ())
        assert all(row[c] is None for c in data if c not in names), row
        out.append((row["_op"], {c: row[c] for c in data if c in names}))
    return frame.schema, out


def _land(messages, tmp_path, landing, name):
    part = [CapturedMessage(m.seq, m.lsn, m.xid, m.data) for m in messages]
    for path in write_capture_parquet(part, tmp_path / f"chunk{name}"):
        landing.mkdir(exist_ok=True)
        path.rename(landing / f"{name}-{path.name}")  # files land one by one


def test_file_by_file_runs_equal_test_decoding_and_rerun_is_a_no_op(spark, captured, tmp_path, monkeypatch,
                                                                     restore_spark_conf):
    """Landed at least once: each file after the first lands again in part beside it (the
    end of the file before, already applied, and the start of its own). The runs' own table
    is compacted whenever it holds more than 2 files (50 outside tests), and the target's own
    tables vacuumed then (with no retention; 7 days outside tests)."""
    monkeypatch.setattr(delta, "LEDGER_MAX_FILES", 2)
    vacuumed = recorded_vacuums(monkeypatch, spark)
    messages, oracle = captured
    landing = tmp_path / "landing"
    target = str(tmp_path / "target")
    cuts = [0, 181, 900, len(messages)]  # inside a stream block, mid-workload
    saved = []
    for k, (lo, hi) in enumerate(zip(cuts, cuts[1:])):
        _land(messages[lo:hi], tmp_path, landing, f"{k:02d}")
        repeated = 0
        if k > 0:  # the retry's rows of this file are this run's repeats
            _land(messages[lo - (lo - cuts[k - 1]) // 2:lo + (hi - lo) // 3], tmp_path, landing, f"{k:02d}-retry")
            repeated = (hi - lo) // 3
        result = run_changes(spark, read_capture(spark, str(landing)), target)
        assert not result.skipped and result.hi == messages[hi - 1].seq
        assert (result.messages, result.repeated_rows) == (hi - lo, repeated)
        # The retry's rows of the file before were read by the run before: late, repeats.
        assert (result.landed.late_rows, result.landed.unread) == ((lo - cuts[k - 1]) // 2 if k else 0, 0)
        saved.append(result.open_rows)
        # Open-transaction rows: only this run's and those it read (the previous run's) are kept.
        held = spark.read.format("delta").load(f"{target}/_pgoutput/pending").select("_run_hi").distinct()
        assert {r[0] for r in held.collect()} <= {result.lo, result.hi}
    assert saved[0] > 0  # the first run's rows were saved, and later deleted
    runs = f"delta.`{target}/_pgoutput/runs`"
    assert spark.sql(f"DESCRIBE DETAIL {runs}").first()["numFiles"] <= 2
    assert [r[0] for r in spark.sql(f"SELECT status FROM {runs} ORDER BY at").collect()] == ["started", "finished"] * 3
    # Each record names the pgoutput-spark that wrote it, the version pip installed.
    assert {r[0] for r in spark.sql(f"SELECT version FROM {runs}").collect()} == {version("pgoutput-spark")}
    check_vacuumed(spark, vacuumed, {"runs"})  # compacted, then vacuumed, as its 3rd and 5th records made 3 files
    expected = _oracle_by_table(oracle)
    for table in TABLES:
        schema, rows = _ours(spark, target, table, expected[table])
        assert rows == expected[table], table
    schema, _ = _ours(spark, target, "a", expected["a"])
    assert schema["id"].dataType == T.IntegerType() and schema["v"].dataType == T.StringType()
    assert schema["extra"].dataType == T.LongType()  # added mid-stream
    assert schema["_commit_ts"].dataType == T.TimestampType()

    before = {t: commits(f"{target}/_changes/public/{t}") for t in TABLES}
    again = run_changes(spark, read_capture(spark, str(landing)), target)
    assert again.skipped
    assert {t: commits(f"{target}/_changes/public/{t}") for t in TABLES} == before


def test_a_file_landed_after_runs_wrote_past_its_seqs_fails_the_run(spark, captured, tmp_path):
    """A plain transaction's file lands after the runs read the files around it: the run
    fails naming the file and writes nothing; with ``accept_late_files`` it is recorded
    and the next run goes on."""
    from pgoutput_spark.errors import CaptureError

    messages, _ = captured
    plain = [(b, next(i for i in range(b, len(messages)) if messages[i].data[:1] == b"C") + 1)
             for b, m in enumerate(messages) if m.data[:1] == b"B"]
    # One whose relations were described before it: the runs read its neighbours without it.
    begin, end = next((b, e) for b, e in plain if not {m.data[:1] for m in messages[b:e]} & {b"R", b"Y"})
    landing, target = tmp_path / "landing", str(tmp_path / "target")
    _land(messages[:begin], tmp_path, landing, "00")
    _land(messages[end:], tmp_path, landing, "02")
    first = run_changes(spark, read_capture(spark, str(landing)), target)
    assert first.messages == len(messages) - (end - begin)
    _land(messages[begin:end], tmp_path, landing, "01")
    runs = commits(f"{target}/_pgoutput/runs")
    with pytest.raises(CaptureError, match=rf"with {end - begin} messages no run read: \S+01-part-00000.parquet "
                                           rf"\(seqs {messages[begin].seq} to {messages[end - 1].seq}, "
                                           rf"{end - begin} rows\): the run of seqs up to {messages[-1].seq} read "
                                           rf"{first.messages} messages, the capture holds {len(messages)} there now"):
        run_changes(spark, read_capture(spark, str(landing)), target)
    assert commits(f"{target}/_pgoutput/runs") == runs
    accepted = run_changes(spark, read_capture(spark, str(landing)), target, accept_late_files=True)
    assert accepted.skipped and accepted.landed.unread == end - begin
    assert f"{end - begin} messages among them no run read, accepted" in accepted.render()
    assert run_changes(spark, read_capture(spark, str(landing)), target).skipped


def test_a_runs_table_from_before_runs_recorded_their_files_goes_on_and_records_them(spark, captured, tmp_path):
    """A runs table without ``new_files`` (as runs before they recorded the files they saw
    left it) nor ``session`` (the walsender session of a run's last message): the next run
    goes on after the last finished run, records every file it sees, and a file landed late
    after that is checked."""
    messages, oracle = captured
    landing, target = tmp_path / "landing", str(tmp_path / "target")
    cut = 900
    _land(messages[:cut], tmp_path, landing, "00")
    first = run_changes(spark, read_capture(spark, str(landing)), target)
    runs = f"{target}/_pgoutput/runs"
    old = spark.read.format("delta").load(runs).drop("new_files", "session").localCheckpoint()
    old.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(runs)
    _land(messages[cut:], tmp_path, landing, "01")
    second = run_changes(spark, read_capture(spark, str(landing)), target)
    assert (second.lo, second.hi, second.messages) == (first.hi, messages[-1].seq, len(messages) - cut)
    expected = _oracle_by_table(oracle)
    for table in TABLES:
        assert _ours(spark, target, table, expected[table])[1] == expected[table], table
    recorded = spark.read.format("delta").load(runs).where("new_files IS NOT NULL").collect()
    assert [sorted(f.rsplit("/", 1)[-1][:2] for f in r["new_files"]) for r in recorded] == [["00", "01"]]
    assert "session" in spark.read.format("delta").load(runs).columns
    _land(messages[cut - 5:cut - 4], tmp_path, landing, "00-late")  # a message the first run read: a repeat
    late = run_changes(spark, read_capture(spark, str(landing)), target)
    assert late.skipped and (late.landed.late_rows, late.landed.unread) == (1, 0)


def test_bounded_runs_cut_anywhere_equal_test_decoding(spark, captured, tmp_path):
    """`max_messages` cuts runs anywhere (inside stream blocks, between Prepare and Commit
    Prepared): run after run until nothing remains, the change tables equal test_decoding's."""
    messages, oracle = captured
    landing, target = tmp_path / "landing", str(tmp_path / "target")
    part = [CapturedMessage(m.seq, m.lsn, m.xid, m.data) for m in messages]
    for path in write_capture_parquet(part, tmp_path / "chunk"):
        landing.mkdir(exist_ok=True)
        path.rename(landing / path.name)
    capture = read_capture(spark, str(landing))
    bound = len(messages) // 3 + 1
    results = [run_changes(spark, capture, target, max_messages=bound)]
    while results[-1].remaining:
        results.append(run_changes(spark, capture, target, max_messages=bound))
    assert [r.messages for r in results] == [bound, bound, len(messages) - 2 * bound]
    assert [r.remaining for r in results] == [True, True, False]
    assert results[0].open_rows > 0  # the first cut is inside an open transaction
    assert results[0].render().endswith(f"more of the capture remains after seq {results[0].hi}: run again")
    expected = _oracle_by_table(oracle)
    for table in TABLES:
        _, rows = _ours(spark, target, table, expected[table])
        assert rows == expected[table], table
    # `status` of a change feed's target: its position, its finished runs, the capture all read.
    state = status(spark, target, capture=capture)
    assert isinstance(state, ChangeFeedStatus) and not state.running
    assert (state.position, state.run_count, state.landed_after) == (max(m.seq for m in messages), 3, 0)
    assert [(r["hi"], r["messages"]) for r in state.runs] == [(r.hi, r.messages) for r in results]
    text = status(spark, target, last=2).render()
    assert text.startswith("change feed (pgoutput-spark changes)") and "runs: 3 (last 2)" in text
    assert run_changes(spark, capture, target, max_messages=bound).skipped


def _replay(rows, key):
    """A row-by-row reference applier: the table after applying change rows in order."""
    table: list[tuple] = []
    for r in rows:
        op = r["_op"]
        if op == "truncate":
            table.clear()
            continue
        if op in ("update", "delete"):
            old = r["_old"]
            match = (lambda t: t[:1] == (old[key[0]],)) if key else (lambda t: t == tuple(old.values()))
            if old is None:  # key unchanged: find the row by the new key
                match = lambda t: t[:1] == (r[key[0]],)  # noqa: E731
            index = next(i for i, t in enumerate(table) if match(t))
            table.pop(index)
        if op in ("insert", "update"):
            table.append(r["new"])
    return sorted(table, key=repr)


def test_pg16_protocol_4_parallel_streaming_gives_the_source_tables(spark, captured_pg16, tmp_path):
    messages, source, _ = captured_pg16
    landing = tmp_path / "landing"
    target = str(tmp_path / "target")
    cuts = [0, len(messages) // 3, 2 * len(messages) // 3, len(messages)]
    for k, (lo, hi) in enumerate(zip(cuts, cuts[1:])):
        for path in write_capture_parquet(messages[lo:hi], tmp_path / f"chunk{k:02d}"):
            landing.mkdir(exist_ok=True)
            path.rename(landing / f"{k:02d}-{path.name}")
        run_changes(spark, read_capture(spark, str(landing)), target)
    frames = {t: spark.read.format("delta").load(f"{target}/_changes/public/{t}") for t in KEYS}
    _assert_replay_equals(frames, source)


KEYS = {"a": ("id",), "b": ("id",), "c": ()}


def _assert_replay_equals(frames, source):
    for table, key in KEYS.items():
        frame = frames[table]
        data = [f.name for f in frame.schema if not f.name.startswith("_")]
        rows = [{**r.asDict(), "new": tuple(r[c] for c in data),
                 "_old": r["_old"].asDict() if r["_old"] is not None else None}
                for r in frame.orderBy("_commit_seq", "_seq").collect()]
        expected = sorted((tuple(row) + (None,) * (len(data) - len(row)) for row in source[table]), key=repr)
        assert _replay(rows, key) == expected, table


@pytest.mark.parametrize("protocol", [1, 2, 3])
def test_pg16_older_protocols_give_the_source_tables(spark, captured_pg16, protocol):
    _, source, older = captured_pg16
    frame = spark.createDataFrame([(m.seq, m.lsn, bytearray(m.data)) for m in older[protocol]],
                                  "seq long, lsn long, data binary")
    frames = {name.split(".")[1]: df for name, df in change_frames(decode(frame)).items()}
    _assert_replay_equals(frames, source)


def test_quarantined_messages_are_kept_and_counted(spark, tmp_path):
    from ..decoder import builders as b

    rel = b.relation(1, "public", "q", "d", [(1, "id", 23, -1)])
    data = [b.begin(1, 0, 7), rel, b.insert(1, b.tuple_data(("t", b"1"))), b.commit(1, 2, 0), b"\x00junk"]
    frame = spark.createDataFrame([(i, 0, bytearray(d)) for i, d in enumerate(data)],
                                  "seq long, lsn long, data binary")
    target = str(tmp_path / "target")
    lines: list[str] = []
    result = run_changes(spark, frame, target, on_error="quarantine", progress=lines.append)
    assert (result.quarantined, result.changes) == (1, {"public.q": 1})
    assert lines == ["slice: after the start up to seq 4", "table 1/1 written: public.q 1 changes"]
    bad = spark.read.format("delta").load(f"{target}/_pgoutput/quarantine").collect()
    assert [(r["seq"], bytes(r["raw"])) for r in bad] == [(4, b"\x00junk")]
    assert "unknown message type byte 0x00" in bad[0]["error"]


def _two_table_capture(spark):
    from ..decoder import builders as b

    t1 = b.relation(1, "public", "one", "d", [(1, "id", 23, -1)])
    t2 = b.relation(2, "public", "two", "d", [(1, "id", 23, -1), (0, "v", 25, -1)])
    data = [b.begin(1, 0, 7), t1, b.insert(1, b.tuple_data(("t", b"1"))), t2,
            b.insert(2, b.tuple_data(("t", b"5"), ("t", b"x"))), b.commit(1, 2, 0),
            b.begin(3, 0, 8), b.delete(1, b.tuple_data(("t", b"1"))), b.commit(3, 4, 0)]
    return spark.createDataFrame([(i, i, bytearray(d)) for i, d in enumerate(data)],
                                 "seq long, lsn long, data binary")


def _tables(spark, target):
    return {t: sorted(tuple(r) for r in spark.read.format("delta").load(f"{target}/_changes/public/{t}")
                      .select("_op", "_seq", "id").collect()) for t in ("one", "two")}


def test_a_run_killed_before_its_end_is_redone_without_duplicates(spark, tmp_path, monkeypatch):
    from pgoutput_spark import changefeed

    capture = _two_table_capture(spark)
    clean = str(tmp_path / "clean")
    run_changes(spark, capture, clean)

    target = str(tmp_path / "crashed")
    real_record = changefeed._State.record

    def crash_at_finish(self, status, *args, **kwargs):
        if status == "finished":
            raise RuntimeError("killed after the table writes, before the run was recorded")
        return real_record(self, status, *args, **kwargs)

    monkeypatch.setattr(changefeed._State, "record", crash_at_finish)
    spark.catalog.clearCache()  # what other tests left: the check below is about this run's
    with pytest.raises(RuntimeError, match="killed"):
        run_changes(spark, capture, target)
    assert spark._jsparkSession.sharedState().cacheManager().isEmpty()  # nothing the run cached stays
    monkeypatch.setattr(changefeed._State, "record", real_record)
    crashed = status(spark, target)
    assert (crashed.running, crashed.position, crashed.run_count) == (True, None, 0)  # started, not finished
    assert "a run is in progress, or the last one died" in crashed.render()
    written = _tables(spark, target)
    assert written == _tables(spark, clean)  # the tables were written before the "crash"

    redo = run_changes(spark, capture, target)  # redoes the recorded slice: Delta skips the writes
    assert (redo.lo, redo.hi) == (None, 8)
    assert (status(spark, target).running, status(spark, target).position) == (False, 8)
    assert _tables(spark, target) == _tables(spark, clean)
    assert run_changes(spark, capture, target).skipped


def test_change_for_a_relation_never_described_fails_naming_oid_and_seq(spark, tmp_path):
    from pgoutput_spark.assemble.relations import UnknownRelationError

    from ..decoder import builders as b

    data = [b.begin(1, 0, 7), b.insert(42, b.tuple_data(("t", b"1"))), b.commit(1, 2, 0)]
    frame = spark.createDataFrame([(i, i, bytearray(d)) for i, d in enumerate(data)],
                                  "seq long, lsn long, data binary")
    with pytest.raises(UnknownRelationError, match="seq 1 refers to relation OID 42"):
        run_changes(spark, frame, str(tmp_path / "target"))


def test_type_changes_widen_keep_the_wider_type_or_fail_before_anything_is_written(spark, tmp_path):
    from pgoutput_spark.mirroring.schema import SchemaChangeError

    from ..decoder import builders as b
    from .test_apply import INT4, INT8, TEXT, _frame, _t, _txn

    target = str(tmp_path / "target")
    path = f"{target}/_changes/public/%5Fw%2Fx"  # the mirrors' path encoding for "_w/x"
    columns = [(1, "id", INT4, -1), (0, "a", INT4, -1), (0, "b c", TEXT, -1)]
    v1 = b.relation(6, "public", "_w/x", "d", columns)
    capture = _txn(900, 1000, v1, b.insert(6, _t(1, 10, "x")))
    run_changes(spark, _frame(spark, capture), target)
    # as a change table written before they were created with type widening on
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableTypeWidening' = 'false')")
    # a widens to bigint; a column whose name Delta only takes with column mapping appears.
    v2 = b.relation(6, "public", "_w/x", "d", [columns[0], (0, "a", INT8, -1), columns[2], (0, "d;e", INT4, -1)])
    capture += _txn(901, 2000, v2, b.insert(6, _t(2, 2**40, "y", 5)), b.update(6, _t(1, 11, "x", 6)),
                    b.delete(6, _t(2, None, None, None)))
    run_changes(spark, _frame(spark, capture), target)
    # a narrows back to int within one run: the column keeps bigint, the run's earlier bigint too.
    v3 = b.relation(6, "public", "_w/x", "d", [*columns, (0, "d;e", INT4, -1)])
    capture += _txn(902, 3000, v2, b.insert(6, _t(3, 2**41, "z", 7)), b.delete(6, _t(3, None, None, None)),
                    v3, b.insert(6, _t(4, 12, "w", 8)))
    run_changes(spark, _frame(spark, capture), target)
    frame = spark.read.format("delta").load(path)
    types = {f.name: f.dataType for f in frame.schema.fields if not f.name.startswith("_")}
    assert types == {"id": T.IntegerType(), "a": T.LongType(), "b c": T.StringType(), "d;e": T.IntegerType()}
    assert frame.schema["_old"].dataType["a"].dataType == T.LongType()
    rows = frame.orderBy("_commit_seq", "_seq").collect()
    assert [(r["_op"], r["id"], r["a"], r["b c"], r["d;e"]) for r in rows] == [
        ("insert", 1, 10, "x", None), ("insert", 2, 2**40, "y", 5), ("update", 1, 11, "x", 6),
        ("delete", None, None, None, None), ("insert", 3, 2**41, "z", 7), ("delete", None, None, None, None),
        ("insert", 4, 12, "w", 8)]
    assert [r["_old"] and r["_old"]["id"] for r in rows] == [None, None, None, 2, None, 3, None]
    # a becomes text: no Delta table can follow; nothing of the run is written, the next run fails alike.
    versions = commits(path)
    v4 = b.relation(6, "public", "_w/x", "d", [columns[0], (0, "a", TEXT, -1), columns[2], (0, "d;e", INT4, -1)])
    capture += _txn(903, 4000, v4, b.insert(6, _t(5, "five", "v", 9)))
    for _ in range(2):
        with pytest.raises(SchemaChangeError, match=r"public\._w/x: column 'a' changed type from bigint to "
                                                    r"string, which the Delta table at .* cannot widen to; "
                                                    r"nothing was written\. Move the change table away"):
            run_changes(spark, _frame(spark, capture), target)
        assert commits(path) == versions


def test_an_arrays_elements_widen_in_the_change_table_and_its_old_field(spark, tmp_path):
    from ..decoder import builders as b
    from .test_apply import INT4, INT4_ARRAY, INT8_ARRAY, _frame, _t, _txn

    target = str(tmp_path / "target")
    v1 = b.relation(7, "public", "arr", "f", [(1, "id", INT4, -1), (1, "ns", INT4_ARRAY, -1)])
    capture = _txn(910, 1000, v1, b.insert(7, _t(1, "{1,NULL}")))
    run_changes(spark, _frame(spark, capture), target)
    v2 = b.relation(7, "public", "arr", "f", [(1, "id", INT4, -1), (1, "ns", INT8_ARRAY, -1)])
    capture += _txn(911, 2000, v2, b.update(7, _t(1, "{%d}" % 2**40), old=_t(1, "{1,NULL}"), old_kind="O"))
    run_changes(spark, _frame(spark, capture), target)
    frame = spark.read.format("delta").load(f"{target}/_changes/public/arr")
    assert frame.schema["ns"].dataType == T.ArrayType(T.LongType())
    assert frame.schema["_old"].dataType["ns"].dataType == T.ArrayType(T.LongType())
    rows = frame.orderBy("_commit_seq", "_seq").collect()
    assert [(r["_op"], r["ns"], r["_old"] and r["_old"]["ns"]) for r in rows] == [
        ("insert", [1, None], None), ("update", [2**40], [1, None])]
