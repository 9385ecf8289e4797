"""The apply job on crafted captures: runs, re-runs, crashes, concurrency and schema changes.

Crafted messages pin down behaviour PostgreSQL cannot be made to produce on
demand (a crash at a chosen point, a type change Delta cannot follow); the
end-to-end tests against a real server are in test_apply_pg.py.
"""

from __future__ import annotations

import threading

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pgoutput_spark import apply as job
from pgoutput_spark.apply import ConcurrentRunError, run_apply, status
from pgoutput_spark.config import TablesConfig
from pgoutput_spark.ledger import LEASE_SCHEMA, Ledger
from pgoutput_spark.mirroring import rows as mirror_rows
from pgoutput_spark.mirroring import table as mirror_table
from pgoutput_spark.mirroring.delta import vacuum_files, vacuum_tables
from pgoutput_spark.mirroring.deltalog import file_count, partition_columns, row_count
from pgoutput_spark.mirroring.names import CatalogError, mirror_path
from pgoutput_spark.mirroring.schema import SchemaChangeError
from pgoutput_spark.spark import assemble as spark_assemble

from ..decoder import builders as b
from ..plugins.spark import jobs_run
from .deltalog import commits

INT4, INT8, TEXT = 23, 20, 25
INT4_ARRAY, INT8_ARRAY = 1007, 1016


def _frame(spark, messages, start=0):
    return spark.createDataFrame([(start + i, 100 + start + i, bytearray(m)) for i, m in enumerate(messages)],
                                 "seq long, lsn long, data binary")


def _t(*values):
    return b.tuple_data(*[("n", None) if v is None else ("u", None) if v is ... else ("t", str(v).encode())
                          for v in values])


ONE = b.relation(1, "public", "one", "d", [(1, "id", INT4, -1), (0, "big", TEXT, -1)])
TWO = b.relation(2, "Mixed Case", "t/wo", "f", [(1, "k", TEXT, -1), (1, "n", INT4, -1)])


def _txn(xid, lsn, *changes):
    return [b.begin(lsn, 0, xid), *changes, b.commit(lsn, lsn + 1, 0)]


def _first_slice():
    return [
        *_txn(700, 1000, ONE, b.insert(1, _t(1, "x" * 3000)), b.insert(1, _t(2, "two")), TWO,
              b.insert(2, _t("dup", 1)), b.insert(2, _t("dup", 1)), b.insert(2, _t("other", 5))),
        *_txn(701, 2000, b.update(1, _t(1, ...)),  # unchanged TOAST: kept from the same run
              b.update(2, _t("dup", 2), _t("dup", 1), old_kind="O"),  # one of two identical rows
              b.insert(2, _t("gone", 3)), b.delete(2, _t("gone", 3), old_kind="O"),
              b.delete(1, _t(9, None))),  # no such row: skipped and recorded
    ]


def _second_slice():
    return [
        *_txn(702, 3000, b.update(1, _t(10, ...), _t(1, None))),  # key change; TOAST from the mirror
        *_txn(703, 4000, b.delete(2, _t("other", 5), old_kind="O"), b.insert(1, _t(2, "upsert"))),
    ]


def _mirror(spark, root, schema, table):
    return sorted(tuple(r) for r in spark.read.format("delta").load(
        mirror_path(root, schema, table)).collect())


EXPECTED_ONE = [(2, "upsert"), (10, "x" * 3000)]
EXPECTED_TWO = [("dup", 1), ("dup", 2)]


def test_tables_skipping_changes_at_once_share_the_skipped_table(spark, tmp_path):
    """Two tables' threads record skipped changes in a target's first run: the skipped table both
    append to is created once (two creating appends at once fail one with Delta's protocol change)."""
    root = str(tmp_path / "target")
    changes = _txn(800, 1000, ONE, TWO, b.insert(1, _t(1, "a")), b.delete(1, _t(9, None)),
                   b.delete(2, _t("nope", 0), old_kind="O"), b.update(2, _t("x", 2), _t("x", 1), old_kind="O"))
    result = run_apply(spark, _frame(spark, changes), root, parallelism=2)
    assert {t.table: t.skipped for t in result.tables} == {"public.one": 1, "Mixed Case.t/wo": 2}
    skipped = spark.read.format("delta").load(f"{root}/_pgoutput/skipped").collect()
    assert sorted((r["table"], r["op"], r["row"]) for r in skipped) == [
        ("Mixed Case.t/wo", "delete", '{"k":"nope","n":0}'), ("Mixed Case.t/wo", "update", '{"k":"x","n":2}'),
        ("public.one", "delete", '{"id":9}')]


def test_two_runs_give_the_source_rows_and_a_third_changes_nothing(spark, tmp_path):
    root = str(tmp_path / "target")
    first = _first_slice()
    lines = []
    r1 = run_apply(spark, _frame(spark, first), root, parallelism=1, progress=lines.append)
    # The table with the most changes is written first; results come in OID order.
    written = [line.split(": ", 1)[1].split(" +")[0] for line in lines if line.startswith("table ")]
    assert written == ["Mixed Case.t/wo", "public.one"]
    assert [t.table for t in r1.tables] == ["public.one", "Mixed Case.t/wo"]
    assert (r1.lo, r1.hi, r1.from_lsn, r1.to_lsn, r1.transactions) == (None, len(first) - 1, 1000, 2000, 2)
    assert _mirror(spark, root, "public", "one") == [(1, "x" * 3000), (2, "two")]
    assert _mirror(spark, root, "Mixed Case", "t/wo") == [("dup", 1), ("dup", 2), ("other", 5)]
    counts = {t.table: (t.inserted, t.updated, t.deleted, t.skipped) for t in r1.tables}
    assert counts == {"public.one": (2, 0, 0, 1), "Mixed Case.t/wo": (3, 0, 0, 0)}
    skipped = spark.read.format("delta").load(f"{root}/_pgoutput/skipped").collect()
    assert [(r["table"], r["op"], r["row"]) for r in skipped] == [("public.one", "delete", '{"id":9}')]

    capture = _frame(spark, first + _second_slice())
    r2 = run_apply(spark, capture, root)
    assert (r2.lo, r2.to_lsn) == (r1.hi, 4000)
    assert _mirror(spark, root, "public", "one") == EXPECTED_ONE
    assert _mirror(spark, root, "Mixed Case", "t/wo") == EXPECTED_TWO

    paths = [mirror_path(root, "public", "one"), mirror_path(root, "Mixed Case", "t/wo")]
    before = [commits(p) for p in paths]
    assert run_apply(spark, capture, root).skipped
    assert [commits(p) for p in paths] == before

    st = status(spark, root)
    assert (st.read_point, st.running, st.position, len(st.runs)) == (4000, False, r2.hi, 2)
    # `mirror` finds the paths without reading the runs' rows into Python: the same.
    from pgoutput_spark.reading import _status
    assert _status(spark, root, "default", count=False, runs=0).mirrors == \
        {table: (path, 0) for table, (path, _) in st.mirrors.items()} and len(st.mirrors) == 2
    assert "consistent read point: 0/FA0" in st.render()
    assert paths[1].endswith("/Mixed Case/t%2Fwo")

    # The notebook API: a mirror now, and as the source was at an LSN (Delta time travel).
    import pgoutput_spark
    from pgoutput_spark.apply import NotReadableError

    def rows(frame):
        return sorted(tuple(r) for r in frame.collect())

    assert rows(pgoutput_spark.mirror(spark, root, "public.one")) == EXPECTED_ONE
    assert rows(pgoutput_spark.mirror(spark, root, "public.one", as_of_lsn=2000)) == [(1, "x" * 3000), (2, "two")]
    assert rows(pgoutput_spark.mirror(spark, root, "Mixed Case.t/wo", as_of_lsn="0/9C4")) == \
        [("dup", 1), ("dup", 2), ("other", 5)]  # 0/9C4 = 2500: between the runs
    assert rows(pgoutput_spark.mirror(spark, root, "public.one", as_of_lsn=4000)) == EXPECTED_ONE
    assert rows(pgoutput_spark.mirror(spark, root, "public.one", as_of_lsn=999)) == []  # before any change
    with pytest.raises(NotReadableError, match=r"0/BB8 is inside the commits one run applied at once "
                                               r"\(0/BB8 \.\. 0/FA0\): public.one can be read as of 0/7D0 or 0/FA0"):
        pgoutput_spark.mirror(spark, root, "public.one", as_of_lsn=3000)
    with pytest.raises(NotReadableError, match=r"not applied up to 0/1388 yet: the consistent read point is 0/FA0"):
        pgoutput_spark.mirror(spark, root, "public.one", as_of_lsn=5000)
    with pytest.raises(NotReadableError, match=r"no mirror of public.nope"):
        pgoutput_spark.mirror(spark, root, "public.nope")
    assert pgoutput_spark.status(spark, root).read_point == 4000

    # A full rebuild from the start of the capture, of a mirror gone wrong.
    from pgoutput_spark.errors import ConfigError

    spark.sql(f"DELETE FROM delta.`{paths[0]}` WHERE id = 2")
    spark.sql(f"UPDATE delta.`{paths[0]}` SET big = 'wrong'")
    untouched = commits(paths[1])
    with pytest.raises(ConfigError, match=r"rebuild: no table public\.nope in the capture's relations"):
        run_apply(spark, capture, root, rebuild=["public.nope"])
    # A capture whose first messages are gone (a file deleted from the landing): the replay
    # would leave their changes out, so the rebuild is refused before anything is written.
    rebuilt_at = commits(paths[0])
    n = len(first + _second_slice())
    with pytest.raises(ConfigError, match=rf"rebuild: public\.one cannot be rebuilt from the capture: the capture "
                                          rf"no longer holds every message the runs read: up to seq {n - 1} the "
                                          rf"runs read {n} messages and the capture holds {n - 2} \(seq 2 onwards\); "
                                          r"2 are gone .* \(snapshot --table public\.one\); nothing was written"):
        run_apply(spark, capture.where("seq >= 2"), root, rebuild=["public.one"])
    assert commits(paths[0]) == rebuilt_at
    rebuilt = run_apply(spark, capture, root, rebuild=["public.one"])  # nothing new: it only rebuilds
    assert [(t.table, t.status, t.inserted) for t in rebuilt.tables] == [("public.one", "rebuilt", 2)]
    assert _mirror(spark, root, "public", "one") == EXPECTED_ONE
    assert commits(paths[1]) == untouched
    assert len(status(spark, root).runs) == 3
    # The pipeline goes on where it stood; a rebuild can come with a new slice.
    later = _frame(spark, first + _second_slice() + _txn(704, 5000, b.insert(1, _t(3, "three")),
                                                         b.insert(2, _t("new", 7))))
    both = run_apply(spark, later, root, rebuild=["public.one"])
    assert {t.table: t.status for t in both.tables} == {"public.one": "rebuilt", "Mixed Case.t/wo": "merged"}
    assert _mirror(spark, root, "public", "one") == sorted(EXPECTED_ONE + [(3, "three")])
    assert _mirror(spark, root, "Mixed Case", "t/wo") == sorted(EXPECTED_TWO + [("new", 7)])
    assert status(spark, root).read_point == 5000


def _nothing_cached(spark):
    """Whether the session caches no frame: a killed run's must not stay (a notebook goes on in it)."""
    return spark._jsparkSession.sharedState().cacheManager().isEmpty()


def _crash(monkeypatch, target, name, *, on_call=1):
    """Make ``target.name`` raise on its ``on_call``-th call."""
    real = getattr(target, name)
    calls = {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == on_call:
            raise RuntimeError(f"killed in {name}")
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, failing)


@pytest.mark.parametrize("stage", [
    pytest.param((job, "assemble", 1, False), id="after-decoding"),
    # New mirrors are written by appends, existing ones by MERGEs.
    pytest.param((mirror_table, "append", 2, False), id="between-two-new-tables"),
    pytest.param((mirror_table, "merge", 2, True), id="between-two-tables"),
    pytest.param((job, "_finish", 1, False), id="after-merges-before-state"),
    # The open transactions' save runs beside the tables' writes: it fails while they go on.
    pytest.param((job, "_save_open_rows", 1, True), id="saving-open-transactions"),
])
def test_a_run_killed_at_any_stage_is_redone_to_the_same_tables(spark, tmp_path, monkeypatch, stage):
    module, name, on_call, existing = stage
    root = str(tmp_path / "target")
    capture = _frame(spark, _first_slice() + _second_slice())
    before = 0
    if existing:  # the mirrors exist before the run that is killed
        before = sum(t.inserted for t in run_apply(spark, _frame(spark, _first_slice()), root).tables)
    spark.catalog.clearCache()  # what other tests left: the check below is about this run's
    with monkeypatch.context() as m:
        _crash(m, module, name, on_call=on_call)
        with pytest.raises(RuntimeError, match="killed"):
            run_apply(spark, capture, root, parallelism=1)
    assert _nothing_cached(spark)
    assert status(spark, root).running
    redo = run_apply(spark, capture, root)
    assert redo.redone and (redo.lo is None) is not existing
    assert _mirror(spark, root, "public", "one") == EXPECTED_ONE
    assert _mirror(spark, root, "Mixed Case", "t/wo") == EXPECTED_TWO
    # A redone run reports what the interrupted one merged, from the commits themselves.
    # (With the mirrors there before: 5 rows from the first slice, the moved key 10 in the redo.)
    assert (before, sum(t.inserted for t in redo.tables)) == ((5, 1) if existing else (0, 3 + 1))
    assert run_apply(spark, capture, root).skipped
    assert len(status(spark, root).runs) == 1 + existing


def test_a_run_killed_between_a_tables_history_and_its_mirror_is_redone_to_the_same_tables(spark, tmp_path,
                                                                                             monkeypatch):
    """A table's history is merged before its mirror. A run killed between the two (the
    mirror's MERGE fails), redone, merges the mirror only: the history holds each version once,
    and the redone run reports the versions the interrupted one wrote."""
    tables = TablesConfig(history=("public.one",))
    root = str(tmp_path / "target")
    run_apply(spark, _frame(spark, _first_slice()), root, tables=tables)
    capture = _frame(spark, _first_slice() + _second_slice())
    path = mirror_path(root, "public", "one", "{root}/_history/{schema}/{table}")
    real = mirror_table.merge

    def failing(session, at, *args, **kwargs):
        if at == mirror_path(root, "public", "one"):
            raise RuntimeError("killed in merge")
        return real(session, at, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(mirror_table, "merge", failing)
        with pytest.raises(RuntimeError, match="killed"):
            run_apply(spark, capture, root, tables=tables, parallelism=1)
    written = commits(path)
    redo = run_apply(spark, capture, root, tables=tables)
    assert redo.redone and {t.table: t.history for t in redo.tables} == {"public.one": 2, "Mixed Case.t/wo": None}
    assert commits(path) == written  # the history's MERGE not done again
    assert _mirror(spark, root, "public", "one") == EXPECTED_ONE
    # The slices' versions of public.one: (id, big, valid from, valid to) by commit LSN. Id 1's
    # update at 2000 leaves its TOASTed value as it was (a version of its own), the key change
    # at 3000 carries it to id 10, the insert of id 2 at 4000 replaces its row.
    x = "x" * 3000
    versions = spark.read.format("delta").load(path).select("id", "big", "_valid_from_lsn", "_valid_to_lsn",
                                                            "_is_current")
    assert sorted(map(tuple, versions.collect())) == [
        (1, x, 1000, 2000, False), (1, x, 2000, 3000, False), (2, "two", 1000, 4000, False),
        (2, "upsert", 4000, None, True), (10, x, 3000, None, True)]
    assert run_apply(spark, capture, root, tables=tables).skipped


def _third_slice():
    return [
        *_txn(704, 5000, b.insert(1, _t(20, "before")), b.truncate([1, 2]), b.insert(1, _t(21, "after")),
              b.insert(2, _t("dup", 7)), b.insert(2, _t("dup", 7))),
        *_txn(705, 6000, b.update(1, _t(22, ...), _t(21, None)),  # a key change: the TOAST value meets it
              b.update(2, _t("dup", 8), _t("dup", 7), old_kind="O")),
        *_txn(706, 7000, b.update(1, _t(22, "changed"))),  # found by its new key: in the moved row's task
    ]


def test_a_few_change_rows_are_looked_up_and_netted_on_the_driver(spark, tmp_path, monkeypatch, caplog):
    """A table with no history and at most `LOCAL_NET_ROWS` change rows is converted, looked up in
    its mirror and netted on the driver, more in Python tasks: the same rows, counts and skipped
    changes either way (unchanged TOAST, a multiset update, a delete of a missing row; then
    updates and deletes of the mirrors' rows, a key moved with its TOAST value, truncates)."""
    import logging

    runs = [((_first_slice,), ([(1, "x" * 3000), (2, "two")], [("dup", 1), ("dup", 2), ("other", 5)])),
            ((_first_slice, _second_slice), (EXPECTED_ONE, EXPECTED_TWO)),
            ((_first_slice, _second_slice, _third_slice), ([(22, "changed")], [("dup", 7), ("dup", 8)]))]
    done = {}
    for where, limit in (("driver", mirror_table.LOCAL_NET_ROWS), ("task", 0)):
        monkeypatch.setattr(mirror_table, "LOCAL_NET_ROWS", limit)
        root = str(tmp_path / where)
        counts = []
        for slices, expected in runs:
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="pgoutput_spark"):
                result = run_apply(spark, _frame(spark, [m for part in slices for m in part()]), root)
            on_driver = sorted(r.getMessage().rsplit(":", 1)[0] for r in caplog.records
                               if "on the driver" in r.getMessage())
            step = "convert, net change" if len(slices) == 1 else "convert, pre-image, net change"  # new mirrors
            assert on_driver == ([f"{t}: {step} on the driver" for t in ("Mixed Case.t/wo", "public.one")]
                                 if where == "driver" else [])
            assert (_mirror(spark, root, "public", "one"), _mirror(spark, root, "Mixed Case", "t/wo")) == expected
            counts.append([(t.table, t.inserted, t.updated, t.deleted, t.skipped, t.truncated)
                           for t in result.tables])
            if len(counts) == 1:  # new mirrors
                files = [len(spark.read.format("delta").load(mirror_path(root, *t)).inputFiles())
                         for t in (("public", "one"), ("Mixed Case", "t/wo"))]
                assert files == [1, 1], files  # a few rows in one file, not one per core
                skipped = spark.read.format("delta").load(f"{root}/_pgoutput/skipped").select("table", "seq")
                done_skipped = sorted(map(tuple, skipped.collect()))
        done[where] = (counts, done_skipped)
    assert done["driver"] == done["task"] and done["driver"][0][0][0][4] == 1, done  # public.one's missing row
    assert [t[4] for t in done["driver"][0][1]] == [0, 0]  # the moved key's TOAST value found on the driver


def test_a_net_change_spread_over_tasks_by_key_gives_the_same_tables(spark, tmp_path):
    """``net_task_rows`` below a table's change rows: its rows go to tasks by key, updates that
    move a row to another key's bucket go to both in halves, and every task sees every
    truncate. A key change that leaves a TOASTed column unchanged has the table netted again in
    one task (its value is in the old key's)."""
    root, rows = str(tmp_path / "target"), 1  # one task per change row
    first = run_apply(spark, _frame(spark, _first_slice()), root, net_task_rows=rows)
    assert {t.table: t.tasks > 1 for t in first.tables} == {"public.one": True, "Mixed Case.t/wo": True}
    assert _mirror(spark, root, "public", "one") == [(1, "x" * 3000), (2, "two")]
    assert _mirror(spark, root, "Mixed Case", "t/wo") == [("dup", 1), ("dup", 2), ("other", 5)]
    second = run_apply(spark, _frame(spark, _first_slice() + _second_slice()), root, net_task_rows=rows)
    assert [t.skipped for t in second.tables] == [0, 0]  # the moved key's TOAST value found
    # public.one's 2 change rows netted again in one task (the key change's TOAST); t/wo has 1.
    assert [(t.table, t.tasks) for t in second.tables] == [("public.one", 1), ("Mixed Case.t/wo", 1)]
    assert _mirror(spark, root, "public", "one") == EXPECTED_ONE
    assert _mirror(spark, root, "Mixed Case", "t/wo") == EXPECTED_TWO
    capture = _frame(spark, _first_slice() + _second_slice() + _third_slice())
    third = run_apply(spark, capture, root, net_task_rows=rows)
    assert all(t.truncated for t in third.tables)
    assert _mirror(spark, root, "public", "one") == [(22, "changed")]
    assert _mirror(spark, root, "Mixed Case", "t/wo") == [("dup", 7), ("dup", 8)]
    assert [t.skipped for t in third.tables] == [0, 0]
    spread = [t for t in third.tables if t.tasks > 1]
    assert spread and all(f"net change in {t.tasks} tasks" in third.render() for t in spread)


def test_a_slice_missing_seqs_fails_when_asked_to_and_applies_when_gaps_are_allowed(spark, tmp_path):
    """The capture contract allows gaps in seq (by default any frame but a landing of
    ``pgoutput-spark capture``: tests/spark/test_apply_pg.py); ``seq_gaps="fail"`` names them."""
    from pgoutput_spark.errors import CaptureError

    root = str(tmp_path / "target")
    messages = _frame(spark, _first_slice() + _second_slice())
    gapped = messages.where("seq NOT IN (17, 18) AND seq <> 21")
    with pytest.raises(CaptureError, match=r"^the capture misses 3 of the seqs 0 to 22 this run would apply "
                                           r"\(first: seqs 17 to 18\): .* Nothing was written"):
        run_apply(spark, gapped, root, seq_gaps="fail")
    st = status(spark, root)
    assert (st.runs, st.position, st.mirrors) == ([], None, {})
    first = run_apply(spark, messages.where("seq <= 15"), root, seq_gaps="fail")  # one whole transaction
    with pytest.raises(CaptureError, match=r"misses 1 of the seqs 16 to 22 .* \(first: seq 16\)"):
        run_apply(spark, messages.where("seq > 16"), root, seq_gaps="fail")
    assert status(spark, root).position == first.hi == 15
    # Allowed (the default for a frame): the slice's transactions apply, the gap's are not there.
    rest = run_apply(spark, messages.where("seq NOT BETWEEN 16 AND 18"), root)
    assert (rest.lo, rest.hi, rest.messages) == (15, 22, 4)


def test_a_seq_landed_twice_with_different_messages_fails_before_anything_is_written(spark, tmp_path):
    """A repeated row is the same message again (tests/spark/test_apply_pg.py lands real ones);
    one seq holding two different messages breaks the capture contract."""
    from pgoutput_spark.errors import CaptureError

    root = str(tmp_path / "target")
    first = _first_slice()
    clash = spark.createDataFrame([(3, 103, bytearray(first[4]))], "seq long, lsn long, data binary")
    again = spark.createDataFrame([(5, 105, bytearray(first[5]))], "seq long, lsn long, data binary")
    with pytest.raises(CaptureError, match=r"different messages under one seq \(seq 3: 2 different "
                                           r"messages \(lsn 0/67\)\): seq must name one message"):
        run_apply(spark, _frame(spark, first).union(clash).union(again), root)
    st = status(spark, root)
    assert (st.runs, st.position, st.running, st.mirrors) == ([], None, False, {})


def test_a_target_from_before_runs_recorded_their_files_starts_recording_them(spark, tmp_path):
    """A lease written before runs recorded the capture's files (no ``files`` column, nor the
    walsender session of ``scan_session``, nor that session in ``_runs``' ``lease_end``, nor
    ``_runs``' ``to_commit_ts``: `status` has no read point time until a run records one; nor
    ``_runs``' ``version``: `status` tells no change of version from such a row): the
    next run cannot tell new files from old, checks none and records them all; the run after
    it finds a retried upload of the first file (the sample capture's files, landed one by
    one; `test_apply_pg.py` lands late files that were never read)."""
    import shutil
    from pathlib import Path

    import pgoutput_spark
    from pgoutput_spark import read_capture

    sample, landing, root = Path(__file__).parents[2] / "examples" / "sample_capture", tmp_path / "landing", \
        str(tmp_path / "target")
    landing.mkdir()

    def run(*names: str) -> job.ApplyResult:
        for name in names:
            shutil.copy(sample / "part-00000.parquet" if name.startswith("0-") else sample / name, landing / name)
        return run_apply(spark, read_capture(spark, str(landing)), root)

    run("part-00000.parquet")
    lease_path, lease = f"{root}/_pgoutput/lease", Ledger(spark, root, "default").lease()
    # The lease as a run of before left it: released (idle) by an UPDATE, without the files.
    old = spark.createDataFrame([("default", lease.run_id, "idle", lease.lo, lease.hi, lease.scan.last_begin_seq,
                                  lease.scan.last_stream_xid, lease.applied_lsn, None)],
                                LEASE_SCHEMA.replace(", files array<string>, scan_session string", ""))
    old.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(lease_path)
    runs = spark.read.format("delta").load(f"{root}/_runs").withColumn(
        "lease_end", F.col("lease_end").dropFields("scan_session")).drop("to_commit_ts", "version")
    runs = spark.createDataFrame(runs.collect(), runs.schema)
    runs.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(f"{root}/_runs")
    assert job.status(spark, root).read_point_time is None  # no commit time in the runs' rows of before
    second = run("part-00001.parquet")
    assert (len(second.landed.new_files), second.landed.late_rows) == (2, 0)
    now = job.status(spark, root)
    assert second.to_commit_ts is not None and now.read_point_time == second.to_commit_ts
    assert [r["version"] for r in now.runs] == [None, pgoutput_spark.__version__]
    assert "run by pgoutput-spark" not in now.render()
    both = ["part-00000.parquet", "part-00001.parquet"]
    # The second run's `_runs` row hands the lease back with them; the third run's claim writes them.
    assert sorted(Path(f).name for f in Ledger(spark, root, "default").lease().files) == both
    third = run("0-retried.parquet", "part-00002.parquet")
    assert (third.landed.late_rows, third.landed.unread) == (183, 0)  # the first file's rows, read by run 1
    assert third.hi == 1808 and third.messages == 73
    assert sorted(Path(f).name for f in spark.read.format("delta").load(lease_path).first()["files"]) == both
    assert "scan_session" in spark.read.format("delta").load(f"{root}/_runs").schema["lease_end"].dataType.names


def test_a_run_row_hands_the_lease_back_and_an_interrupted_run_from_before_that_is_redone_once(spark, tmp_path):
    """A finished run leaves the lease row `running` under its id and records its end in its
    `_runs` row; the next claim writes that end into the lease. A `_runs` row without it (a run
    of an earlier version that died after its row, before releasing the lease) is an interrupted
    run: redone once (Delta skips the row's append, so the redo releases the lease by an UPDATE)."""
    root = str(tmp_path / "target")
    first, capture = _frame(spark, _first_slice()), _frame(spark, _first_slice() + _second_slice())
    one = run_apply(spark, first, root)
    lease_path, runs_path = f"{root}/_pgoutput/lease", f"{root}/_runs"
    (row,) = spark.read.format("delta").load(lease_path).collect()
    (run,) = spark.read.format("delta").load(runs_path).collect()
    assert (row["status"], row["run_id"], row["lo"], row["hi"]) == ("running", run["run_id"], None, one.hi)
    assert run["lease_end"]["applied_lsn"] == one.to_lsn == status(spark, root).read_point
    st = status(spark, root)
    assert (st.running, st.position) == (False, one.hi)
    two = run_apply(spark, capture, root)
    assert (two.lo, two.redone) == (one.hi, False)
    (row,) = spark.read.format("delta").load(lease_path).collect()  # the second claim wrote the first's end
    assert (row["status"], row["lo"], row["applied_lsn"]) == ("running", one.hi, one.to_lsn)
    # As an earlier version left a run that died between its row and the lease's release.
    old = spark.read.format("delta").load(runs_path).drop("lease_end")
    old = spark.createDataFrame(old.collect(), old.schema)
    old.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(runs_path)
    assert status(spark, root).running
    redo = run_apply(spark, capture, root)
    assert (redo.lo, redo.hi, redo.redone) == (one.hi, two.hi, True)
    assert spark.read.format("delta").load(lease_path).first()["status"] == "idle"
    assert run_apply(spark, capture, root).skipped
    st = status(spark, root)
    assert (st.running, st.position, st.read_point, len(st.runs)) == (False, two.hi, two.to_lsn, 2)
    assert _mirror(spark, root, "public", "one") == EXPECTED_ONE
    assert _mirror(spark, root, "Mixed Case", "t/wo") == EXPECTED_TWO


def test_two_runs_at_once_serialize_or_one_fails_clearly(spark, tmp_path):
    root = str(tmp_path / "target")
    capture = _frame(spark, _first_slice() + _second_slice())
    outcomes: list[object] = []

    def one_run():
        try:
            outcomes.append(run_apply(spark, capture, root))
        except Exception as exc:  # kept, so that an unexpected error shows in the assertions below
            outcomes.append(exc)

    threads = [threading.Thread(target=one_run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(outcomes) == 2 and any(not isinstance(o, Exception) for o in outcomes), outcomes
    for o in outcomes:
        assert not isinstance(o, Exception) or (isinstance(o, ConcurrentRunError) and "another run" in str(o)), o
    if any(isinstance(o, Exception) for o in outcomes):
        run_apply(spark, capture, root)  # what the failed run would have done, if anything
    assert _mirror(spark, root, "public", "one") == EXPECTED_ONE
    assert _mirror(spark, root, "Mixed Case", "t/wo") == EXPECTED_TWO
    assert not status(spark, root).running


def test_schema_changes_add_widen_keep_dropped_and_renamed_columns(spark, tmp_path):
    root = str(tmp_path / "target")  # a table name with a backtick: its path goes into Delta's SQL
    v1 = b.relation(3, "public", "s`q", "d", [(1, "id", INT4, -1), (0, "a", INT4, -1), (0, "b", TEXT, -1),
                                            (0, "e", INT4_ARRAY, -1), (0, "f", INT8_ARRAY, -1)])
    first = _txn(800, 1000, v1, b.insert(3, _t(1, 10, "b1", "{1,NULL}", "{5}")),
                 b.insert(3, _t(2, 20, "b2", "{2}", None)))
    run_apply(spark, _frame(spark, first), root)
    # a widens to bigint, and e's elements too (Delta widens an array's elements); f's narrow,
    # so the mirror keeps bigint[]; b is renamed to c, a new column d appears.
    v2 = b.relation(3, "public", "s`q", "d", [(1, "id", INT4, -1), (0, "a", INT8, -1), (0, "c", TEXT, -1),
                                            (0, "d", INT4, -1), (0, "e", INT8_ARRAY, -1), (0, "f", INT4_ARRAY, -1)])
    second = _txn(801, 2000, v2, b.insert(3, _t(3, 2**40, "c3", 3, "{%d}" % 2**41, "{7,8}")),
                  b.update(3, _t(1, 11, "c1", 1, "{1}", "{6}")))
    run_apply(spark, _frame(spark, first + second), root)
    frame = spark.read.format("delta").load(mirror_path(root, "public", "s`q"))
    types = {f.name: f.dataType for f in frame.schema.fields}
    assert types == {"id": T.IntegerType(), "a": T.LongType(), "b": T.StringType(), "c": T.StringType(),
                     "d": T.IntegerType(), "e": T.ArrayType(T.LongType()), "f": T.ArrayType(T.LongType())}
    # A renamed column is a dropped column (kept, NULL for rows changed since) plus a new one.
    assert sorted(tuple(r) for r in frame.select("id", "a", "b", "c", "d", "e", "f").collect()) == [
        (1, 11, None, "c1", 1, [1], [6]), (2, 20, "b2", None, None, [2], None),
        (3, 2**40, None, "c3", 3, [2**41], [7, 8])]


def test_a_type_change_delta_cannot_follow_fails_before_anything_is_written(spark, tmp_path):
    root = str(tmp_path / "target")
    v1 = b.relation(4, "public", "w", "d", [(1, "id", INT4, -1), (0, "a", INT4, -1)])
    first = _txn(900, 1000, v1, b.insert(4, _t(1, 10)))
    layout = "{root}/mirrors/{schema}.{table}"  # another layout, through `apply.table_path`
    run_apply(spark, _frame(spark, first), root, table_path=layout)
    path = f"{root}/mirrors/public.w"
    before = commits(path)
    v2 = b.relation(4, "public", "w", "d", [(1, "id", INT4, -1), (0, "a", TEXT, -1)])
    with pytest.raises(SchemaChangeError, match=r"public\.w: column 'a' changed type from int to string"):
        run_apply(spark, _frame(spark, first + _txn(901, 2000, v2, b.insert(4, _t(2, "x")))), root,
                  table_path=layout)
    assert commits(path) == before
    assert sorted(tuple(r) for r in spark.read.format("delta").load(path).collect()) == [(1, 10)]


def test_timestamp_columns_and_names_with_dots_and_backticks(spark, tmp_path):
    root = str(tmp_path / "target")
    rel = b.relation(5, "public", "d", "d", [(1, "id", INT4, -1), (0, "a.b", INT4, -1), (0, "ts", 1114, -1),
                                             (0, "we`ird", TEXT, -1)])
    msgs = _txn(1, 1000, rel, b.insert(5, _t(1, 7, "2024-02-29 23:59:59.999999", "x")),
                b.insert(5, _t(2, None, None, "y")), b.update(5, _t(2, 3, "2000-01-01 00:00:00", ...)))
    run_apply(spark, _frame(spark, msgs), root)
    frame = spark.read.format("delta").load(mirror_path(root, "public", "d"))
    assert frame.schema["ts"].dataType == T.TimestampNTZType()  # PostgreSQL `timestamp`
    import datetime as dt

    assert sorted(tuple(r) for r in frame.collect()) == [
        (1, 7, dt.datetime(2024, 2, 29, 23, 59, 59, 999999), "x"), (2, 3, dt.datetime(2000, 1, 1), "y")]


def test_a_small_tables_changes_are_converted_in_one_task(spark, monkeypatch):
    """The conversion's tasks follow the table's change rows (`ROWS_PER_TASK` each), not the
    partitions of the run's committed rows; the rows are the same."""
    from pgoutput_spark.spark import changes
    from pgoutput_spark.spark.assemble import assemble
    from pgoutput_spark.spark.decode import decode

    rel = b.relation(5, "public", "c", "d", [(1, "id", INT4, -1)])
    msgs = [*_txn(1, 1000, rel, *[b.insert(5, _t(i)) for i in range(20)]),
            *_txn(2, 2000, *[b.update(5, _t(i)) for i in range(10)])]
    decoded = decode(_frame(spark, msgs).repartition(3)).persist()
    assembled = []  # released at the end: nothing stays cached for the tests after this one
    try:
        assembled.append(assemble(decoded))
        committed = assembled[0].committed
        history = changes.history_of(decoded)
        every = changes.typed_change_frame(committed, 5, history)
        assert every.rdd.getNumPartitions() > 1
        monkeypatch.setattr(changes, "ROWS_PER_TASK", 30)
        one = changes.typed_change_frame(committed, 5, history, rows=30)
        monkeypatch.setattr(changes, "ROWS_PER_TASK", 29)
        two = changes.typed_change_frame(committed, 5, history, rows=30)
        assert (one.rdd.getNumPartitions(), two.rdd.getNumPartitions()) == (1, 2)
        assert sorted(map(repr, one.collect())) == sorted(map(repr, every.collect()))
        # The apply job's decode defers the tuples to the conversion: the same typed rows, and
        # no struct or array column (their NULLs are slow to write as Arrow) reaches the task.
        deferred = decode(_frame(spark, msgs).repartition(3), tuples=False)
        assembled.append(assemble(deferred))
        later = assembled[1].committed
        task_types = {f.dataType.typeName() for f in changes.relation_rows(later, 5, tuples=False).schema}
        assert not task_types & {"struct", "array", "map"}, task_types
        assert sorted(map(repr, changes.typed_change_frame(later, 5, history, tuples=False).collect())) == \
            sorted(map(repr, every.collect()))
    finally:
        for done in assembled:
            done.release()
        decoded.unpersist()


def test_every_tables_change_rows_come_from_one_compiled_filter(spark, capsys):
    """Spark writes integer literals into the code it generates: a filter on each table's OID
    would be a class of its own, compiled (and JIT-compiled) once per table."""
    from pgoutput_spark.spark import changes
    from pgoutput_spark.spark.assemble import assemble
    from pgoutput_spark.spark.decode import decode

    msgs = [*_first_slice(), *_txn(702, 3000, b.truncate([1, 2]), b.insert(2, _t("new", 1)))]
    assembled = assemble(decode(_frame(spark, msgs), tuples=False))
    committed = assembled.committed.persist()
    try:
        def rows_and_code(oid):
            frame = changes.relation_rows(committed, oid, tuples=False)
            rows = sorted((r["seq"], r["message_type"]) for r in frame.collect())
            frame.explain(mode="codegen")
            code = [line for line in capsys.readouterr().out.splitlines() if line.startswith("/*")]
            return rows, code

        before = {key: spark.conf.get(key) for key in ("spark.sql.adaptive.enabled", "spark.sql.codegen.factoryMode")}
        spark.conf.set("spark.sql.adaptive.enabled", "false")  # its plans show code only once run
        spark.conf.set("spark.sql.codegen.factoryMode", "FALLBACK")  # Spark's default; the suite's runs without
        try:
            (one, code_one), (two, code_two) = rows_and_code(1), rows_and_code(2)
        finally:
            for key, value in before.items():
                spark.conf.set(key, value)
        assert code_one and code_one == code_two
        # seq = position in msgs: Begin, Relation, ... (see _first_slice); the truncate is seq 17.
        assert one == [(2, "insert"), (3, "insert"), (10, "update"), (14, "delete"), (17, "truncate")]
        assert two == [(5, "insert"), (6, "insert"), (7, "insert"), (11, "update"), (12, "insert"),
                       (13, "delete"), (17, "truncate"), (18, "insert")]
    finally:
        committed.unpersist()
        assembled.release()  # its scanned messages, cached: nothing stays for the tests after


@pytest.mark.usefixtures("restore_spark_conf")
def test_small_runs_query_without_generated_code_and_put_the_setting_back(spark, tmp_path, monkeypatch):
    """`small_run`: the apply and the changes job run a small slice's queries without generated
    code (the test session sets that itself, so here it is unset first) and leave the session
    as they found it; so do their first reads of the target (`without_codegen`), before the
    slice's size is known."""
    from pgoutput_spark import changefeed, ledger
    from pgoutput_spark.changefeed import run_changes

    key = "spark.sql.codegen.factoryMode"
    spark.conf.unset(key)
    seen, reads = [], []

    def progress(line):
        seen.append(spark.conf.get(key, None))

    def noting(method):
        def read(self, *args):
            reads.append(spark.conf.get(key, None))
            return method(self, *args)
        return read

    monkeypatch.setattr(ledger.Ledger, "lease", noting(ledger.Ledger.lease))
    monkeypatch.setattr(changefeed._State, "position", noting(changefeed._State.position))
    warmed: list = []  # each run starts the Python workers' warm-up first (one job per application)
    monkeypatch.setattr(job, "warm_python_workers", lambda spark: warmed.append(("apply", reads[:])))
    monkeypatch.setattr(changefeed, "warm_python_workers", lambda spark: warmed.append(("changes", reads[:])))
    capture = _frame(spark, _first_slice())
    run_apply(spark, capture, str(tmp_path / "mirrors"), progress=progress)
    applied = list(seen)
    assert spark.conf.get(key, None) is None
    seen.clear()
    run_changes(spark, capture, str(tmp_path / "changes"), progress=progress)
    assert applied and set(applied) == {"NO_CODEGEN"} and seen and set(seen) == {"NO_CODEGEN"}
    assert reads == ["NO_CODEGEN", "NO_CODEGEN"]  # the lease, the changes job's position
    assert warmed == [("apply", []), ("changes", ["NO_CODEGEN"])]  # each before its first read
    assert spark.conf.get(key, None) is None
    assert _mirror(spark, str(tmp_path / "mirrors"), "public", "one") == [(1, "x" * 3000), (2, "two")]


def test_one_task_gets_null_arrays_and_structs_back_as_they_were(spark):
    """`in_tasks` sends NULL arrays as empty ones with a flag (Spark writes runs of NULL
    arrays to Arrow in quadratic time): the task sees the very rows Spark holds."""
    import json

    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = ("id long, tags array<string>, ints array<int>, "
              "old struct<a: int, tags: array<string>, w: struct<m: int>>")
    rows = [(1, None, [1, None], None), (2, [], None, (1, None, None)), (3, ["x", None], [], (None, [], (4,))),
            *[(i, None, None, None) for i in range(4, 40)], (40, ["y"], [2], (2, ["z"], (5,)))]
    frame = spark.createDataFrame(rows, schema)

    def compute(table):
        return pa.table({"rows": [json.dumps(table.to_pylist())]})

    out = mirror_rows.in_tasks(frame, None, to_arrow_schema(frame.schema), pa.schema([("rows", pa.string())]),
                                compute)
    seen = sorted(json.loads(out.collect()[0]["rows"]), key=lambda r: r["id"])
    assert seen == json.loads(json.dumps(frame.toArrow().to_pylist()))
    assert [r["tags"] for r in seen[:3]] == [None, [], ["x", None]]
    assert [r["old"] for r in seen[:3]] == [None, {"a": 1, "tags": None, "w": None},
                                           {"a": None, "tags": [], "w": {"m": 4}}]
    assert mirror_rows.arrays_without_nulls(spark.createDataFrame([(1, "a")], "id long, s string"))[1] == {}


def test_open_transactions_saved_with_decoded_tuples_still_apply(spark, tmp_path, monkeypatch):
    """Runs before the tuples were deferred saved open transactions with their tuples in
    ``change`` and no ``raw``: the next run applies them beside deferred ones, in one table."""
    from pgoutput_spark.spark import decode as spark_decode

    root = str(tmp_path / "target")
    opened = [b.begin(2000, 0, 701), ONE, b.insert(1, _t(1, "one")), b.insert(1, _t(2, "two")),
              b.update(1, _t(1, "uno"))]
    rest = [b.insert(1, _t(3, "three")), b.delete(1, _t(2, None)), b.commit(2000, 2001, 0)]
    whole = spark_decode.decode
    monkeypatch.setattr(job, "decode", lambda *args, **kwargs: whole(*args, **{**kwargs, "tuples": True}))
    run_apply(spark, _frame(spark, opened), root)
    saved = spark.read.format("delta").load(f"{root}/_pgoutput/pending").where("message_type = 'insert'")
    assert [(r["raw"], r["change"]["new_tuple"] is not None) for r in saved.collect()] == [(None, True)] * 2
    monkeypatch.undo()
    spark.catalog.clearCache()  # what other tests left: the check below is about this run's
    with monkeypatch.context() as m:  # killed where it looks at the rows read back (cached then)
        _crash(m, spark_assemble, "_carries_tuples")
        with pytest.raises(RuntimeError, match="killed"):
            run_apply(spark, _frame(spark, opened + rest), root)
    assert _nothing_cached(spark)
    later = run_apply(spark, _frame(spark, opened + rest), root)
    assert later.redone and later.transactions == 1
    assert _mirror(spark, root, "public", "one") == [(1, "uno"), (3, "three")]


def test_a_transaction_open_over_runs_keeps_only_two_runs_rows_in_pending(spark, tmp_path, monkeypatch):
    """A streamed transaction open across runs: each run saves its rows by its hi and drops those
    of the runs before its lo, in one pending commit where it does both (pending partitioned by
    the run, one written without partitions rewritten with them); a run killed after that
    commit is redone without writing it again, and the transaction applies once when it ends."""
    root, pending = str(tmp_path / "target"), f"{tmp_path}/target/_pgoutput/pending"
    msgs = [*_txn(700, 1000, ONE, b.insert(1, _t(1, "a"))), b.stream_start(800, True),
            b.insert(1, _t(2, "s1"), xid=800), b.stream_stop()]
    held, inserts = [], []  # after each run: the runs whose rows pending holds; its own inserts there

    def run(extra):
        msgs.extend(extra)
        result = run_apply(spark, _frame(spark, msgs), root)
        saved = spark.read.format("delta").load(pending)
        held.append(sorted({r[0] for r in saved.select("_run_hi").collect()}))
        inserts.append(saved.where(f"_run_hi = {result.hi} AND message_type = 'insert'").count())
        return result

    r1 = run([])
    assert partition_columns(spark, pending) == ("_run_hi",)
    # As a target from before pending was partitioned: the next run's save partitions it.
    spark.read.format("delta").load(pending).write.format("delta").mode("overwrite") \
        .option("overwriteSchema", "true").save(pending)
    assert partition_columns(spark, pending) == ()
    r2 = run([b.stream_start(800, False), b.insert(1, _t(3, "s2"), xid=800), b.stream_stop()])
    assert partition_columns(spark, pending) == ("_run_hi",)
    before = commits(pending)
    _crash(monkeypatch, job, "_finish")
    with pytest.raises(RuntimeError, match="killed in _finish"):
        run([b.stream_start(800, False), b.insert(1, _t(4, "s3"), xid=800), b.stream_stop()])
    assert commits(pending) == before + 1  # the third run's rows saved, the first's dropped
    monkeypatch.undo()
    r3 = run([])  # the interrupted slice again: its save is in the table already
    assert r3.redone and commits(pending) == before + 1
    assert inserts[:3] == [1, 2, 3]  # the streamed inserts so far, saved once by each run
    r4 = run([b.stream_commit(800, 5000, 5001, 0)])
    assert held == [[r1.hi], [r1.hi, r2.hi], [r2.hi, r3.hi], [r3.hi]]
    assert r4.open_rows == 0 and r4.transactions == 1
    assert _mirror(spark, root, "public", "one") == [(1, "a"), (2, "s1"), (3, "s2"), (4, "s3")]


def test_mirror_properties_deletion_vectors_follow_the_session_default(spark, tmp_path):
    """Column mapping and type widening always; deletion vectors only where the session's
    Delta default (or the user, on the table) asks for them. A new mirror is created by its
    first append, in one commit, even when the run leaves it empty."""
    rel = b.relation(5, "public", "p", "d", [(1, "id", INT4, -1)])
    gone = b.relation(6, "public", "gone", "d", [(1, "id", INT4, -1)])
    msgs = _txn(1, 1000, rel, b.insert(5, _t(1)), gone, b.insert(6, _t(1)), b.delete(6, _t(1)))
    default = "spark.databricks.delta.properties.defaults.enableDeletionVectors"

    def properties(root, table="p"):
        path = mirror_path(root, "public", table)
        return spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()["properties"]

    run_apply(spark, _frame(spark, msgs), str(tmp_path / "plain"))
    for table, rows in (("p", [(1,)]), ("gone", [])):
        plain = properties(str(tmp_path / "plain"), table)
        assert plain["delta.columnMapping.mode"] == "name" and plain["delta.enableTypeWidening"] == "true"
        assert plain.get("delta.enableDeletionVectors", "false") == "false"
        path = mirror_path(str(tmp_path / "plain"), "public", table)
        commits = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
        assert [(c["version"], c["operation"]) for c in commits] == [(0, "WRITE")]
        assert '"app_id": "default:relation:' in commits[0]["userMetadata"]
        assert [tuple(r) for r in spark.read.format("delta").load(path).collect()] == rows
    spark.conf.set(default, "true")
    try:
        run_apply(spark, _frame(spark, msgs), str(tmp_path / "dv"))
    finally:
        spark.conf.unset(default)
    assert properties(str(tmp_path / "dv"))["delta.enableDeletionVectors"] == "true"


def test_mirrors_can_also_be_catalog_tables(spark, tmp_path):
    """``table_name``: each mirror is an external catalog table too (odd characters become ``_``)."""
    root = str(tmp_path / "target")
    database = f"mirrors_{tmp_path.name[-12:].replace('-', '_')}"
    spark.sql(f"CREATE NAMESPACE {database} LOCATION '{tmp_path / 'warehouse'}'")
    try:
        template = database + ".{schema}__{table}"
        run_apply(spark, _frame(spark, _first_slice()), root, table_name=template)
        run_apply(spark, _frame(spark, _first_slice() + _second_slice()), root, table_name=template)
        one = spark.table(f"`{database}`.`public__one`").collect()
        two = spark.table(f"`{database}`.`Mixed_Case__t_wo`").collect()
        assert sorted(tuple(r) for r in one) == EXPECTED_ONE
        assert sorted(tuple(r) for r in two) == EXPECTED_TWO

        # A name of one part is in the session's current database, where the run checked it: the
        # tables' writing threads name them from copies of the session, its database with them.
        spark.sql(f"USE `{database}`")
        run_apply(spark, _frame(spark, _first_slice()), str(tmp_path / "here"), table_name="{schema}__{table}_here")
        assert spark.catalog.tableExists(f"`{database}`.public__one_here")
        assert not spark.catalog.tableExists("default.public__one_here")
        spark.sql("USE default")

        # A name taken by another table: a clear error before anything is written.
        spark.sql(f"DROP TABLE `{database}`.`public__one`")
        spark.sql(f"CREATE TABLE `{database}`.`public__one` (id int) USING delta "
                  f"LOCATION '{tmp_path / 'elsewhere'}'")
        other = str(tmp_path / "other")
        with pytest.raises(CatalogError, match=r"`public__one` exists at .*elsewhere"):
            run_apply(spark, _frame(spark, _first_slice()), other, table_name=template)
        assert not (tmp_path / "other" / "public").exists()
    finally:
        spark.sql("USE default")
        spark.sql(f"DROP NAMESPACE IF EXISTS {database} CASCADE")


def test_tables_settings_choose_tables_key_them_and_keep_columns_as_text(spark, tmp_path, monkeypatch):
    """``tables.exclude`` leaves a table out; ``tables.keys`` keys a FULL-identity table;
    ``tables.types`` keeps a numeric column holding NaN as its text."""
    from pgoutput_spark.config import TablesConfig

    root = str(tmp_path / "target")
    price = b.relation(6, "public", "price", "d", [(1, "id", INT4, -1), (0, "amount", 1700, (10 << 16 | 2) + 4)])
    msgs = [*_first_slice(), *_txn(702, 3000, price, b.insert(6, _t(1, "NaN")), b.insert(6, _t(2, "1.50")))]
    tables = TablesConfig(exclude=("public.o*",), keys={"Mixed Case.t/wo": ("k",)},
                          types={"public.price": {"amount": "string"}})
    result = run_apply(spark, _frame(spark, msgs), root, tables=tables)
    assert result.excluded == ("public.one",)
    assert "not mirrored (tables.include / exclude): public.one" in result.render()
    assert not (tmp_path / "target" / "public" / "one").exists()
    # Keyed by k: the second ("dup", 1) insert overwrote the first, the update changed it to 2.
    assert _mirror(spark, root, "Mixed Case", "t/wo") == [("dup", 2), ("other", 5)]
    prices = spark.read.format("delta").load(mirror_path(root, "public", "price"))
    assert prices.schema["amount"].dataType == T.StringType()
    assert sorted(tuple(r) for r in prices.collect()) == [(1, "NaN"), (2, "1.50")]

    # Without the override the NaN cannot be a decimal: the run stops, naming the column.
    from pgoutput_spark.errors import TypeConversionError

    for where, limit in (("driver", mirror_table.LOCAL_NET_ROWS), ("task", 0)):  # a few rows: on the driver
        monkeypatch.setattr(mirror_table, "LOCAL_NET_ROWS", limit)
        other = str(tmp_path / f"other-{where}")
        spark.catalog.clearCache()  # what other tests left: the check below is about this run's
        with pytest.raises(TypeConversionError, match=r"public\.price\.amount"):  # in a task: recovered
            run_apply(spark, _frame(spark, msgs), other, tables=TablesConfig(include=("public.price",)))
        assert _nothing_cached(spark)  # nor the net change that failed


def test_a_key_override_for_a_table_with_a_key_fails_before_anything_is_written(spark, tmp_path):
    from pgoutput_spark.config import TablesConfig
    from pgoutput_spark.errors import ConfigError

    root = str(tmp_path / "target")
    for keys, message in [({"public.one": ("big",)}, r"public\.one has a replica identity key \(id\)"),
                          ({"Mixed Case.t/wo": ("nope",)}, r"no column nope in Mixed Case\.t/wo")]:
        with pytest.raises(ConfigError, match=message):
            run_apply(spark, _frame(spark, _first_slice()), root, tables=TablesConfig(keys=keys))
        assert not (tmp_path / "target" / "public").exists()


def test_backfill_slices_rerun_late_and_out_of_order(spark, tmp_path):
    """Slices by capture partition: the later one first applies both; the earlier one is then skipped."""
    from pgoutput_spark.errors import ConfigError

    root = str(tmp_path / "target")
    first = _first_slice()
    capture = _frame(spark, first + _second_slice()).withColumn(
        "part", F.when(F.col("seq") < len(first), "day1").otherwise("day2"))
    late = run_apply(spark, capture, root, slice_where="part = 'day2'")
    assert (late.lo, late.hi) == (None, len(first) + len(_second_slice()) - 1)
    assert late.note.startswith("the target was behind this slice (it held up to nothing; "
                                f"the slice starts at seq {len(first)})")
    assert _mirror(spark, root, "public", "one") == EXPECTED_ONE
    assert _mirror(spark, root, "Mixed Case", "t/wo") == EXPECTED_TWO
    paths = [mirror_path(root, "public", "one"), mirror_path(root, "Mixed Case", "t/wo")]
    before = [commits(p) for p in paths]
    for again in ("part = 'day1'", "part = 'day2'"):
        skipped = run_apply(spark, capture, root, slice_where=again)
        assert skipped.skipped and "the target holds every change up to seq" in skipped.render()
    assert [commits(p) for p in paths] == before
    with pytest.raises(ConfigError, match=r"no capture row matches the slice \"part = 'day3'\""):
        run_apply(spark, capture, root, slice_where="part = 'day3'")

    # Bounded by LSN: the last message at or before it ends the slice (the target holds it).
    by_lsn = run_apply(spark, capture, root, until_lsn=100 + len(first) - 1)
    assert by_lsn.skipped and f"the slice ends at seq {len(first) - 1} and the target holds" in by_lsn.render()


def test_max_messages_bounds_each_run_and_the_runs_end_where_one_run_does(spark, tmp_path):
    """Runs of at most N messages, inside a slice and after it, cut anywhere (here inside
    transactions): together they give the tables one run gives, and say when more remain.
    Rows landed twice count once, in the run whose slice holds them."""
    root = str(tmp_path / "target")
    messages = _first_slice() + _second_slice()
    # seq 14 is not used: a gap in seq
    capture = spark.createDataFrame([(i + (i >= 14), 100 + i, bytearray(m)) for i, m in enumerate(messages)],
                                    "seq long, lsn long, data binary")
    capture = capture.union(capture.where("seq IN (3, 15)"))  # landed twice
    last = len(messages)
    runs = [run_apply(spark, capture, root, until_seq=12, max_messages=8),
            run_apply(spark, capture, root, until_seq=12, max_messages=8),
            run_apply(spark, capture, root, max_messages=8),
            run_apply(spark, capture, root, max_messages=8)]
    assert [(r.lo, r.hi, r.remaining) for r in runs] == [
        (None, 7, True), (7, 12, False), (12, 20, True), (20, last, False)]
    assert [r.messages for r in runs] == [8, 5, 7, last - 20]  # fewer across the gap
    assert [r.repeated_rows for r in runs] == [1, 0, 1, 0]
    assert "more of the capture remains after seq 7 (max_messages 8): run again" in runs[0].render()
    assert runs[1].note is None
    assert run_apply(spark, capture, root, max_messages=8).skipped
    assert _mirror(spark, root, "public", "one") == EXPECTED_ONE
    assert _mirror(spark, root, "Mixed Case", "t/wo") == EXPECTED_TWO
    with pytest.raises(ValueError, match="max_messages must be at least 1"):
        run_apply(spark, capture, root, max_messages=0)


def test_a_bad_message_fails_the_run_or_is_quarantined_counted_with_its_bytes(spark, tmp_path):
    """By default a message that does not decode fails the run, naming its seq, LSN and what is
    wrong, before anything is written; with ``on_error="quarantine"`` it is kept with its raw
    bytes, counted in the run's result and its `_runs` row, and the other messages apply."""
    from pgoutput_spark.errors import DecodeError

    rel = b.relation(5, "public", "q", "d", [(1, "id", INT4, -1)])
    messages = [*_txn(1, 1000, rel, b.insert(5, _t(1)), b.insert(5, _t(2))), b"\x00junk",
                *_txn(2, 2000, b.insert(5, _t(3)))]
    frame = _frame(spark, messages)
    root = str(tmp_path / "target")
    with pytest.raises(DecodeError, match=r"seq 5\b.*lsn 0/69\b.*unknown message type byte 0x00"):
        run_apply(spark, frame, root)
    st = status(spark, root)
    assert (st.runs, st.position, st.mirrors) == ([], None, {})
    result = run_apply(spark, frame, root, on_error="quarantine")
    assert (result.messages, result.quarantined_messages) == (len(messages), 1)
    bad = spark.read.format("delta").load(f"{root}/_pgoutput/quarantine").collect()
    assert [(r["seq"], r["lsn"], bytes(r["raw"])) for r in bad] == [(5, 105, b"\x00junk")]
    assert _mirror(spark, root, "public", "q") == [(1,), (2,), (3,)]
    assert [(r["messages"], r["quarantined_messages"]) for r in status(spark, root).runs] == [(len(messages), 1)]


def test_status_lists_the_transactions_a_run_leaves_open(spark, tmp_path):
    """A streamed transaction without its end and a block without its Commit wait in pending:
    `status` names them (kind, xid, where they started), oldest first; once they end, none."""
    root = str(tmp_path / "target")
    head = [*_txn(700, 1000, ONE, b.insert(1, _t(1, "a"))),
            b.stream_start(800, True), b.relation(1, "public", "one", "d", [(1, "id", INT4, -1), (0, "big", TEXT, -1)],
                                                  xid=800),
            b.insert(1, _t(2, "streamed"), xid=800), b.stream_stop(),
            b.begin(3000, 0, 801), b.insert(1, _t(3, "plain"))]
    run_apply(spark, _frame(spark, head), root)
    state = status(spark, root)
    assert [t[:4] for t in state.open_transactions] == [("streamed", 800, 4, 104), ("block", 801, 8, 108)]
    assert all(t[4] >= 2 for t in state.open_transactions)
    assert "open transactions carried to the next run: 2\n  streamed xid 800 since seq 4 (LSN 0/68)" in \
        state.render()
    assert "open across runs" not in state.render()  # it started in the last run's slice: no hint
    tail = [b.commit(3000, 3001, 0), b.stream_commit(800, 4000, 4001, 0)]
    run_apply(spark, _frame(spark, head + tail), root)
    assert status(spark, root).open_transactions == []
    assert _mirror(spark, root, "public", "one") == [(1, "a"), (2, "streamed"), (3, "plain")]


def test_a_pre_image_stays_as_read_while_cached_and_its_mirror_is_written(spark, tmp_path):
    """The mirror's rows a run looks up (cached, and the source of its MERGE) are those of the
    version it read, after a write to the mirror too (see `saved_open_rows`' test)."""
    from pgoutput_spark.mirroring.deltalog import latest_version
    from pgoutput_spark.mirroring.net import TableSpec
    from pgoutput_spark.mirroring.rows import looked_up, looked_up_keys, pre_image
    from pgoutput_spark.spark.session import release

    path = str(tmp_path / "mirror")
    spark.range(3).selectExpr("id", "'a' AS v").write.format("delta").save(path)
    assert latest_version(spark, path) == 0
    # id 1 moves to 11, id 0 keeps its key (no old key, twice): both look their row up; an insert does not.
    typed = spark.createDataFrame(
        [("update", None, 0, "b"), ("update", (1,), 11, "b"), ("insert", None, 2, "b"), ("update", None, 0, "c")],
        "_op string, _old struct<id: bigint>, id bigint, v string").selectExpr("*", "2L AS _seq", "2L AS _commit_seq")
    spec = TableSpec("keyed", ("id",), ("id", "v"))
    keys = looked_up(typed, spec)
    assert sorted(keys.toArrow().column(0).to_pylist()) == [0, 1]
    assert sorted(looked_up_keys(typed.toArrow(), spec).column(0).to_pylist()) == [0, 0, 1]  # the driver's
    found = pre_image(spark, path, keys, typed.schema, spec).persist()
    everything = pre_image(spark, path, None, typed.schema, spec).persist()  # a history run with a truncate
    try:
        assert [(f.name, f.dataType) for f in found.schema] == [(f.name, f.dataType) for f in typed.schema]
        assert sorted((r["id"], r["v"], r["_op"]) for r in found.collect()) == [(0, "a", "pre"), (1, "a", "pre")]
        driver_keys = spark.createDataFrame(looked_up_keys(typed.toArrow(), spec))  # key 0 twice
        assert sorted(r["id"] for r in pre_image(spark, path, driver_keys, typed.schema, spec).collect()) == [0, 1]
        assert everything.count() == 3
        spark.range(3, 5).selectExpr("id", "'c' AS v").write.format("delta").mode("append").save(path)
        assert latest_version(spark, path) == 1
        assert sorted(r["id"] for r in found.collect()) == [0, 1]
        assert sorted(r["id"] for r in everything.collect()) == [0, 1, 2]
        assert pre_image(spark, path, None, typed.schema, spec).count() == 5  # a new read sees the write
    finally:
        release(found)
        release(everything)


def test_vacuum_deletes_the_files_no_version_within_the_retention_reads(spark, tmp_path, caplog):
    """`vacuum_files`: nothing within Delta's default retention (7 days); with none, every file
    the table's rewrites removed, the current ones kept. `vacuum_tables` logs a table it cannot
    vacuum and goes on."""
    import logging

    path = str(tmp_path / "lease")
    spark.range(1).coalesce(1).write.format("delta").save(path)
    for _ in range(4):
        spark.sql(f"UPDATE delta.`{path}` SET id = id + 1")
    files = sorted(p.name for p in (tmp_path / "lease").glob("*.parquet"))
    assert len(files) == 5 and vacuum_files(spark, path) == 0
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
              f"('delta.deletedFileRetentionDuration' = 'interval 0 seconds')")
    assert vacuum_files(spark, path) == 4
    current = [f.rsplit("/", 1)[-1] for f in spark.read.format("delta").load(path).inputFiles()]
    assert sorted(p.name for p in (tmp_path / "lease").glob("*.parquet")) == current and current[0] in files
    assert [r[0] for r in spark.read.format("delta").load(path).collect()] == [4]
    with caplog.at_level(logging.WARNING, logger="pgoutput_spark.mirroring.delta"):
        vacuum_tables(spark, [str(tmp_path / "none"), path])
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [f"could not vacuum {tmp_path / 'none'}"]


def test_status_counts_rows_from_the_delta_log_and_counts_where_it_cannot(spark, tmp_path, restore_spark_conf):
    """`row_count`: a mirror's rows from the file statistics in its version's checksum file, without
    a Spark job (less the rows a deletion vector removes); a count where the checksum has no
    file list (more files than Delta keeps there) or a file has no statistics. `status` lists
    each mirror with those counts. `file_count`: the files, from the checksum too."""

    root = str(tmp_path / "target")
    run_apply(spark, _frame(spark, _first_slice() + _second_slice()), root)
    one = mirror_path(root, "public", "one")
    assert {t: n for t, (_, n) in status(spark, root).mirrors.items()} == {"public.one": 2, "Mixed Case.t/wo": 2}

    def counted(path, group):
        n, jobs = jobs_run(spark, group, lambda: row_count(spark, path))
        assert n == spark.read.format("delta").load(path).count()
        return n, jobs

    assert counted(one, "one") == (2, 0)
    spark.sql(f"ALTER TABLE delta.`{one}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    spark.sql(f"DELETE FROM delta.`{one}` WHERE id = 2")
    assert spark.sql(f"DESCRIBE HISTORY delta.`{one}`").first()["operationMetrics"]["numDeletionVectorsAdded"] == "1"
    assert counted(one, "deletion-vector") == (1, 0)

    many = str(tmp_path / "many")  # more files than the checksum lists
    spark.conf.set("spark.databricks.delta.allFilesInCrc.thresholdNumFiles", "2")
    spark.range(10).repartition(3).write.format("delta").save(many)
    spark.conf.unset("spark.databricks.delta.allFilesInCrc.thresholdNumFiles")
    rows, jobs = counted(many, "many")
    assert rows == 10 and jobs > 0
    files, jobs = jobs_run(spark, "files", lambda: file_count(spark, many))
    assert (files, jobs) == (len(spark.read.format("delta").load(many).inputFiles()), 0) and files == 3
    spark.sql(f"DELETE FROM delta.`{many}`")
    assert file_count(spark, many) == 0 and row_count(spark, many) == 0
    # A pending table without files: a run neither reads it nor looks for its oldest run's rows.
    from pgoutput_spark.spark.pending import _oldest_run_hi, _saved_rows

    assert jobs_run(spark, "empty", lambda: (_saved_rows(spark, many), _oldest_run_hi(spark, many))) == \
        ((None, float("inf")), 0)
    bare = str(tmp_path / "bare")  # files without statistics
    spark.conf.set("spark.databricks.delta.stats.collect", "false")
    spark.range(7).write.format("delta").save(bare)
    spark.conf.unset("spark.databricks.delta.stats.collect")
    spark.range(7, 9).write.format("delta").mode("append").save(bare)
    rows, jobs = counted(bare, "bare")
    assert rows == 9 and jobs > 0


def test_each_of_spark_partition_values_goes_to_its_partition(spark):
    """`rows.halved_net_frame` sends a bucket's rows to one task by a value Spark's hash
    partitioning sends there: Spark's own hash, and its partitions, agree."""
    ints = [0, 1, -1, 42, 7_000_000, 2**31 - 1, -2**31]
    hashed = spark.createDataFrame([(i,) for i in ints], "i int").select(F.hash("i")).collect()
    assert [r[0] for r in hashed] == [mirror_rows.spark_hash_int(i) for i in ints]
    for tasks in (1, 2, 3, 8):
        values = mirror_rows.spark_partition_values(tasks)
        frame = spark.createDataFrame([(v,) for v in values], "v int").repartition(tasks, "v")
        placed = {r[0]: r[1] for r in frame.select("v", F.spark_partition_id()).collect()}
        assert placed == {v: p for p, v in enumerate(values)}
