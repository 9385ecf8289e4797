"""History tables (SCD type 2) against a real PostgreSQL: at every LSN, the versions valid then
equal the source table as it was then (PostgreSQL's own rows, read after each transaction)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

import pgoutput_spark
from pgoutput_spark import read_capture
from pgoutput_spark.apply import run_apply
from pgoutput_spark.config import TablesConfig
from pgoutput_spark.errors import ConfigError
from pgoutput_spark.lsn import Lsn
from pgoutput_spark.mirroring.names import mirror_path
from pgoutput_spark.reading import NotReadableError
from pgoutput_spark.slot.capture import capture_slot
from pgoutput_spark.slot.snapshot import snapshot_tables
from pgoutput_spark.testing.pgcluster import PgCluster

from ..plugins.postgres import new_database
from .deltalog import commits

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

SETUP = """
CREATE TABLE item (id int PRIMARY KEY, name text, big text, qty int);
ALTER TABLE item ALTER COLUMN big SET STORAGE EXTERNAL;  -- out of line: unchanged TOAST in updates
CREATE TABLE late (id int PRIMARY KEY, v text);           -- its history starts in the second run
CREATE PUBLICATION hist_pub FOR TABLE item, late;
"""

FIRST = [
    "INSERT INTO item SELECT g, 'n' || g, CASE WHEN g = 1 THEN repeat('big ', 5000) END, g FROM generate_series(1, 5) g;"
    " INSERT INTO late VALUES (1, 'one'), (2, 'two')",
    "UPDATE item SET qty = qty + 1 WHERE id <= 3",  # id 1 keeps its big value (unchanged TOAST)
    "UPDATE item SET id = 10 WHERE id = 2",  # the row moves to another key
    "BEGIN; UPDATE item SET name = 'z' WHERE id = 3; UPDATE item SET qty = 99 WHERE id = 3;"
    " DELETE FROM item WHERE id = 4; INSERT INTO item VALUES (6, 'gone', NULL, 0);"
    " DELETE FROM item WHERE id = 6; COMMIT",  # one version per row per transaction
]
SECOND = [
    "UPDATE item SET name = 'after' WHERE id = 1; UPDATE late SET v = 'uno' WHERE id = 1",  # TOAST from the history
    "BEGIN; TRUNCATE item; INSERT INTO item VALUES (1, 'reborn', NULL, 0); COMMIT",
    "UPDATE item SET qty = 5 WHERE id = 1; DELETE FROM late WHERE id = 2",
]
# Changes the apply skips: a re-snapshot of item after them takes them in (for the column added
# with a DEFAULT, whose value for the rows before it no message carries).
THIRD = [
    "UPDATE item SET name = 'before the re-snapshot' WHERE id = 1;"
    " INSERT INTO item VALUES (7, 'seven', NULL, 7)",
    "ALTER TABLE item ADD COLUMN extra int DEFAULT 42",
]
FOURTH = [
    "UPDATE item SET qty = 70 WHERE id = 7; UPDATE late SET v = 'one again' WHERE id = 1",
    "BEGIN; DELETE FROM item WHERE id = 1; INSERT INTO item VALUES (8, 'eight', NULL, 8, 0); COMMIT",
]


def _source(pg: PgCluster, db: str) -> tuple[int, dict[str, list[tuple[Any, ...]]]]:
    lsn = int(Lsn(pg.query("SELECT pg_current_wal_lsn()::text", dbname=db)[0][0]))
    return lsn, {t: sorted(pg.query(f"SELECT * FROM {t}", dbname=db)) for t in ("item", "late")}


def _versions(spark: Any, path: str) -> list[dict[str, Any]]:
    return [r.asDict() for r in spark.read.format("delta").load(path).collect()]


def _valid_at(versions: list[dict[str, Any]], lsn: int) -> list[tuple[Any, ...]]:
    """The rows of the versions valid at ``lsn``, as the README's query selects them."""
    return sorted(tuple(v for k, v in r.items() if not k.startswith("_")) for r in versions
                  if r["_valid_from_lsn"] <= lsn and (r["_valid_to_lsn"] is None or lsn < r["_valid_to_lsn"]))


def _padded(rows: list[tuple[Any, ...]], versions: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """PostgreSQL's rows from before a column was added, NULL in it as the history has them."""
    width = len([k for k in versions[0] if not k.startswith("_")])
    return [(*row, *[None] * (width - len(row))) for row in rows]


def test_history_versions_valid_at_any_lsn_equal_the_source_then(spark: Any, pg15: PgCluster, tmp_path: Path,
                                                                  restore_spark_conf: Any) -> None:
    db = new_database(pg15, "history")
    pg15.execute(SETUP, dbname=db)
    slot, landing, target = f"{db}_slot", str(tmp_path / "landing"), str(tmp_path / "target")
    dsn = pg15.conninfo(db)
    capture_slot(landing, slot=slot, dsn=dsn, publications=["hist_pub"], create_slot=True, proto_version=1)
    states = [_source(pg15, db)]
    for sql in FIRST:
        pg15.execute(sql, dbname=db)
        states.append(_source(pg15, db))
    capture_slot(landing, slot=slot, dsn=dsn)
    first = run_apply(spark, read_capture(spark, landing), target, tables=TablesConfig(history=("public.item",)))
    assert {t.table: t.history for t in first.tables} == {"public.item": 10, "public.late": None}
    first_end = states[-1][0]
    for sql in SECOND:
        pg15.execute(sql, dbname=db)
        states.append(_source(pg15, db))
    capture_slot(landing, slot=slot, dsn=dsn)
    both = TablesConfig(history=("public.*",))
    # One net-change task per change row: the histories are computed in several tasks by key.
    second = run_apply(spark, read_capture(spark, landing), target, tables=both, net_task_rows=1)
    assert {t.table: t.tasks > 1 for t in second.tables} == {"public.item": True, "public.late": True}

    item = mirror_path(target, "public", "item", "{root}/_history/{schema}/{table}")
    late = mirror_path(target, "public", "late", "{root}/_history/{schema}/{table}")
    items, lates = _versions(spark, item), _versions(spark, late)
    for lsn, rows in states:
        assert _valid_at(items, lsn) == rows["item"], Lsn(lsn)
        if lsn >= first_end:  # late's history starts where its mirror stood when history was turned on
            assert _valid_at(lates, lsn) == rows["late"], Lsn(lsn)
    assert sorted((r["id"], r["name"], r["big"], r["qty"]) for r in items if r["_is_current"]) == \
        states[-1][1]["item"]
    (after,) = [r for r in items if r["name"] == "after"]
    assert after["big"] == "big " * 5000  # carried forward from the first run's version
    # The notebook API: the source as of any LSN up to the read point, from a history; also
    # one inside a run's commit range, which the mirror's time travel cannot show.
    point = second.to_lsn
    for lsn, rows in states:
        at = min(lsn, point)  # the WAL's position after the last commit: no commit between
        assert sorted(map(tuple, pgoutput_spark.history(spark, target, "public.item", as_of_lsn=at).collect())) \
            == rows["item"], Lsn(lsn)
        if lsn >= first_end:
            assert sorted(map(tuple, pgoutput_spark.history(spark, target, "public.late", as_of_lsn=at).collect())) \
                == rows["late"], Lsn(lsn)
    # At a commit's own LSN: its versions valid from there, the ones it replaced no longer.
    for commit in sorted({r["_valid_from_lsn"] for r in items} | {r["_valid_to_lsn"] for r in items} - {None}):
        (rows, *_) = [rows for lsn, rows in states if lsn >= commit]
        assert sorted(map(tuple, pgoutput_spark.history(spark, target, "public.item", as_of_lsn=commit).collect())) \
            == rows["item"], Lsn(commit)
    inside = states[len(FIRST) + 1][0]  # after the second run's first commit, before its last
    with pytest.raises(NotReadableError, match=r"inside the commits one run applied at once"):
        pgoutput_spark.mirror(spark, target, "public.item", as_of_lsn=inside)
    with pytest.raises(NotReadableError, match=r"the history of public\.late starts at .* with its mirror's rows "
                                               r"then, after .*: it can be read as of"):
        pgoutput_spark.history(spark, target, "public.late", as_of_lsn=states[0][0])
    with pytest.raises(NotReadableError, match=r"public\.item is not applied up to .* yet"):
        pgoutput_spark.history(spark, target, "public.item", as_of_lsn=point + 1)
    with pytest.raises(NotReadableError, match=r"no history of public\.nope under"):
        pgoutput_spark.history(spark, target, "public.nope")
    assert pgoutput_spark.history(spark, target, "public.item").count() == len(items)
    # Idempotent: nothing new, no commit; the same slice again changes nothing either.
    before = commits(item)
    assert run_apply(spark, read_capture(spark, landing), target, tables=both).skipped
    assert commits(item) == before

    # A re-snapshot brings item's history to its rows too: the changes it takes in (which the
    # apply then skips) close and open versions at its point; from there on, the versions valid
    # at any LSN equal the source then, and the apply goes on from both.
    skipped_from = len(states)
    for sql in THIRD:
        pg15.execute(sql, dbname=db)
        states.append(_source(pg15, db))
    capture_slot(landing, slot=slot, dsn=dsn)
    resnapshot = snapshot_tables(spark, target, publications=["hist_pub"], tables=["public.item"], dsn=dsn)
    # Closed: id 1 (renamed, and extra 42 now); opened: id 1 and the new id 7.
    assert [t.history for t in resnapshot.tables] == [(1, 2)], resnapshot.render()
    assert "its history: 1 version(s) closed, 2 opened" in resnapshot.render()
    states.append(_source(pg15, db))
    snapshot_state = len(states) - 1
    for sql in FOURTH:
        pg15.execute(sql, dbname=db)
        states.append(_source(pg15, db))
    capture_slot(landing, slot=slot, dsn=dsn)
    fourth = run_apply(spark, read_capture(spark, landing), target, tables=both)
    assert {t.table: t.history for t in fourth.tables} == {"public.item": 2, "public.late": 1}  # new versions
    items, lates = _versions(spark, item), _versions(spark, late)
    for k, (lsn, rows) in enumerate(states):
        if skipped_from <= k < snapshot_state:
            continue  # changes the re-snapshot took in: at its point, not at their own commits
        assert _valid_at(items, lsn) == _padded(rows["item"], items), (k, Lsn(lsn))
        if lsn >= first_end:
            assert _valid_at(lates, lsn) == rows["late"], (k, Lsn(lsn))
    at_snapshot = [r for r in items if r["_valid_from_lsn"] == int(resnapshot.consistent_point) - 1]
    assert sorted((r["id"], r["extra"], r["_version_seq"]) for r in at_snapshot) == [(1, 42, None), (7, 42, None)]
    assert all(r["_valid_from_ts"] is not None for r in at_snapshot)
    # Again with nothing changed since: every current version equals its row, no history commit.
    before = commits(item)
    again = snapshot_tables(spark, target, publications=["hist_pub"], tables=["public.item"], dsn=dsn)
    assert [t.history for t in again.tables] == [(0, 0)] and commits(item) == before
    # History needs a key: with item's identity now the whole row, a re-snapshot stops before
    # writing anything, as the apply would; tables.keys gives it one.
    pg15.execute("ALTER TABLE item REPLICA IDENTITY FULL", dbname=db)
    mirror = mirror_path(target, "public", "item")
    written = commits(mirror)
    with pytest.raises(ConfigError, match=r"public\.item has a history table .* give it one with tables\.keys"):
        snapshot_tables(spark, target, publications=["hist_pub"], tables=["public.item"], dsn=dsn)
    assert commits(mirror) == written and commits(item) == before
    keyed = snapshot_tables(spark, target, publications=["hist_pub"], tables=["public.item"], dsn=dsn,
                            selection=TablesConfig(keys={"public.item": ("id",)}))
    assert [t.history for t in keyed.tables] == [(0, 0)]


def test_a_history_whose_keys_change_computed_in_halves_equals_the_source_at_every_lsn(
        spark: Any, pg15: PgCluster, tmp_path: Path, caplog: Any) -> None:
    """A history table in tasks of 40 change rows (`apply.net_task_rows`): key changes and a
    swap through a third key in one transaction move rows between the tasks' buckets, each
    update in both as halves, its old key's version closed in one task and its new key's opened
    in the other (before halves, those buckets joined into one task, `moved_buckets`). A key
    change that leaves a TOASTed column unchanged cannot be halved (its value is in the old
    key's task): that run computes the history, and the mirror, again in one task."""
    db = new_database(pg15, "history_halves")
    pg15.execute("CREATE TABLE kt (id int PRIMARY KEY, v text, big text);"
                 " ALTER TABLE kt ALTER COLUMN big SET STORAGE EXTERNAL;"  # out of line: unchanged TOAST
                 " CREATE PUBLICATION kt_pub FOR TABLE kt", dbname=db)
    big = "repeat(md5(g::text), 100)"  # 3,200 bytes, stored EXTERNAL: TOASTed, not compressed
    runs = [
        [f"INSERT INTO kt SELECT g, 'v', CASE WHEN g > 90 THEN {big} ELSE 'small' END FROM generate_series(1, 100) g"],
        ["UPDATE kt SET id = id + 1000, v = 'moved' WHERE id % 3 = 0 AND id <= 90",
         "BEGIN; UPDATE kt SET id = -1 WHERE id = 1; UPDATE kt SET id = 1 WHERE id = 2;"
         " UPDATE kt SET id = 2 WHERE id = -1; COMMIT",
         "DELETE FROM kt WHERE id % 7 = 0",
         "BEGIN; UPDATE kt SET v = 'again' WHERE id > 1000; UPDATE kt SET id = id + 1000 WHERE id > 1080; COMMIT"],
        ["UPDATE kt SET id = id + 2000 WHERE id > 95 AND id <= 100",  # big left unchanged: sent as 'u'
         "UPDATE kt SET v = 'w' WHERE id < 1100"],
    ]
    slot, landing, target = f"{db}_slot", str(tmp_path / "landing"), str(tmp_path / "target")
    dsn = pg15.conninfo(db)
    capture_slot(landing, slot=slot, dsn=dsn, publications=["kt_pub"], create_slot=True, proto_version=1)

    def state() -> tuple[int, list[tuple[Any, ...]]]:
        lsn = int(Lsn(pg15.query("SELECT pg_current_wal_lsn()::text", dbname=db)[0][0]))
        return lsn, sorted(pg15.query("SELECT * FROM kt", dbname=db))

    states = [state()]
    history = mirror_path(target, "public", "kt", "{root}/_history/{schema}/{table}")
    spread, halved, again = [], [], []
    for statements in runs:
        for sql in statements:
            pg15.execute(sql, dbname=db)
            states.append(state())
        capture_slot(landing, slot=slot, dsn=dsn)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="pgoutput_spark"):
            result = run_apply(spark, read_capture(spark, landing), target,
                               tables=TablesConfig(history=("public.kt",)), net_task_rows=40)
        messages = [r.getMessage() for r in caplog.records]
        (table,) = result.tables
        spread.append(table.tasks > 1)
        halved.append(not any("updates that move rows between keys" in m for m in messages))
        again.append(any("(history): an update moved a row to another task's key with a TOAST column unchanged"
                         in m and m.endswith("computed again in one") for m in messages))
        versions = _versions(spark, history)
        for lsn, rows in states:
            assert _valid_at(versions, lsn) == rows, Lsn(lsn)
        mirror = spark.read.format("delta").load(mirror_path(target, "public", "kt")).collect()
        assert sorted(tuple(r) for r in mirror) == states[-1][1]
    assert (spread, halved, again) == ([True, True, False], [True, True, True], [False, False, True])


def test_a_history_whose_updates_miss_their_rows_is_computed_again_without_their_new_versions(
        spark: Any, pg15: PgCluster, tmp_path: Path, caplog: Any) -> None:
    """A history (and its mirror) in tasks of 20 change rows, in halves, where key changes find
    no row: the table had rows before the slot, never captured. The bucket of such an update's
    old key cannot know that its new version was opened in the other bucket: the versions are
    computed again in as many tasks without it, until no pass finds one (a second key change of
    the row it would have left is found by the second pass), and so is the mirror's net change.
    The oracle is a twin table, not published, that took the same statements from empty: at
    every LSN the versions valid then equal its rows, and the mirror its rows at the end."""
    db = new_database(pg15, "history_missing")
    pg15.execute("CREATE TABLE kt (id int PRIMARY KEY, v text); CREATE TABLE twin (id int PRIMARY KEY, v text);"
                 " INSERT INTO kt SELECT g, 'before' FROM generate_series(1, 20) g;"
                 " CREATE PUBLICATION kt_pub FOR TABLE kt", dbname=db)
    runs = [("INSERT INTO {} SELECT g, 'x' FROM generate_series(101, 140) g",
             "UPDATE {} SET id = id + 1000, v = 'moved' WHERE id <= 12",  # rows never captured
             "UPDATE {} SET id = id + 1000 WHERE id BETWEEN 1001 AND 1012",  # their new rows, moved on
             "UPDATE {} SET id = id + 100 WHERE id BETWEEN 101 AND 110"),
            ("UPDATE {} SET v = 'again' WHERE id > 2000 OR id BETWEEN 13 AND 16",
             "UPDATE {} SET id = id + 10 WHERE id BETWEEN 13 AND 16",
             "DELETE FROM {} WHERE id BETWEEN 201 AND 205",
             "UPDATE {} SET id = id - 200 WHERE id BETWEEN 206 AND 210")]
    slot, landing, target = f"{db}_slot", str(tmp_path / "landing"), str(tmp_path / "target")
    dsn = pg15.conninfo(db)
    capture_slot(landing, slot=slot, dsn=dsn, publications=["kt_pub"], create_slot=True, proto_version=1)

    def twin() -> tuple[int, list[tuple[Any, ...]]]:
        lsn = int(Lsn(pg15.query("SELECT pg_current_wal_lsn()::text", dbname=db)[0][0]))
        return lsn, sorted(pg15.query("SELECT * FROM twin", dbname=db))

    states = [twin()]
    history = mirror_path(target, "public", "kt", "{root}/_history/{schema}/{table}")
    found = []
    for statements in runs:
        for statement in statements:
            for table in ("kt", "twin"):
                pg15.execute(statement.format(table), dbname=db)
            states.append(twin())
        capture_slot(landing, slot=slot, dsn=dsn)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="pgoutput_spark"):
            result = run_apply(spark, read_capture(spark, landing), target,
                               tables=TablesConfig(history=("public.kt",)), net_task_rows=20)
        messages = [r.getMessage() for r in caplog.records]
        assert not any("again in one" in m for m in messages), messages
        (table,) = result.tables
        found.append((table.tasks > 1, table.skipped,
                      len([m for m in messages if "(history)" in m and "without their new versions" in m]),
                      len([m for m in messages if "without their new rows" in m])))
        versions = _versions(spark, history)
        for lsn, rows in states:
            assert _valid_at(versions, lsn) == rows, Lsn(lsn)
        mirror = spark.read.format("delta").load(mirror_path(target, "public", "kt")).collect()
        assert sorted(tuple(r) for r in mirror) == states[-1][1]
    # Skipped: 12 key changes of rows never captured and the 12 of their new rows; then 16
    # updates of rows not there (13-16, never captured; 2001-2012, which the skipped key changes
    # would have made) and the key changes of 13-16. The passes: 3 in the first run (the second
    # key change of a row is found by the second pass), 2 in the second.
    assert found == [(True, 24, 2, 2), (True, 20, 1, 1)], found
