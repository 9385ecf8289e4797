"""Snapshot, capture and apply end to end: tables full before the slot, traffic during and after.

PostgreSQL is the oracle: the apply workload fills every published table
(every type, TOAST, FULL identity with duplicates, row filters, column lists,
partitions, odd names, pgbench) before the slot exists; `snapshot_tables`
creates the slot and copies the tables while other sessions keep committing;
more traffic follows; `capture_slot` lands the slot and `run_apply` merges it.
The mirrors must then equal PostgreSQL's tables, value for value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pgoutput_spark import read_capture
from pgoutput_spark.apply import NotReadableError, mirror, run_apply, status
from pgoutput_spark.config import TablesConfig
from pgoutput_spark.errors import CaptureError, ConfigError
from pgoutput_spark.lsn import Lsn
from pgoutput_spark.slot.capture import capture_slot
from pgoutput_spark.slot import snapshot
from pgoutput_spark.slot.snapshot import TableCopy, snapshot_tables
from pgoutput_spark.slot.verify import verify_mirrors
from pgoutput_spark.testing.pgcluster import PgCluster

from ..plugins.postgres import new_database
from ..plugins.spark import Lake
from .apply_workload import PUBLICATIONS, Driver, Workload, drive, setup
from .deltalog import commits
from .test_apply_pg import Mirrors

pytestmark = [pytest.mark.spark, pytest.mark.postgres]


def test_snapshot_then_capture_then_apply_equals_the_source(
        spark: Any, pg15: PgCluster, tmp_path: Path, lake: Lake, monkeypatch: pytest.MonkeyPatch) -> None:
    db = new_database(pg15, "snapshot")
    setup(pg15, db)
    drive(pg15, db)  # every table full before the slot exists
    # The mirrors behind a URI (as with object storage): the snapshot's rows reach them through Spark.
    slot, target, landing = f"{db}_slot", f"{lake.uri}/target", str(tmp_path / "landing")
    during = Driver(pg15, db)
    copied: list[TableCopy] = []
    partial: list[TableCopy] = []
    create_slot = snapshot._create_slot

    def create_slot_then_commit(*args: Any, **kwargs: Any) -> Any:
        created = create_slot(*args, **kwargs)  # before the first COPY: only the exported snapshot hides this
        during.txn("UPDATE keyswap SET n = n + 1000 WHERE id % 2 = 1",
                   "UPDATE pgbench_tellers SET tbalance = tbalance - 3",
                   "INSERT INTO logonly VALUES ('as the slot was created', 0, now())")
        return created

    monkeypatch.setattr(snapshot, "_create_slot", create_slot_then_commit)

    def traffic_while_copying(table: TableCopy) -> None:
        if not table.done:  # progress inside a table's copy
            partial.append(table)
            return
        copied.append(table)
        if len(copied) == 1:  # tables copied already and tables not copied yet change now
            during.txn("UPDATE keyswap SET n = n + 100 WHERE id % 2 = 0",
                       "DELETE FROM pgbench_accounts WHERE aid <= 50",
                       "UPDATE pgbench_branches SET bbalance = bbalance + 7",
                       "INSERT INTO logonly VALUES ('during the snapshot', 1, now())")

    result = snapshot_tables(spark, target, slot=slot, publications=PUBLICATIONS, dsn=pg15.conninfo(db),
                             progress=traffic_while_copying, batch_bytes=1 << 20)
    assert len(result.tables) == len(copied) > 10 and sum(t.rows for t in copied) > 100_000
    # Each table's rows went through the driver's temporary folder and were staged beside the
    # mirrors; nothing of either is left (nothing was written under the URI as a local path).
    own = lake.local / "target" / "_pgoutput"
    named = sorted(p.name for p in own.iterdir() if p.name.startswith("snapshot"))
    assert named in (["snapshots"], ["snapshot", "snapshots"]), named
    assert not (own / "snapshot").exists() or not any((own / "snapshot").iterdir())
    accounts = [p for p in partial if p.table == "public.pgbench_accounts"]  # 100,000 rows, 1 MB blocks
    assert {p.stage for p in accounts} == {"copying", "converting"} and len(accounts) > 6
    assert [p.rows for p in accounts if p.stage == "converting"][-1] == 100_000
    # Before any run, `status` lists every mirror the snapshot made, with the rows PostgreSQL sent.
    listed = status(spark, target)
    assert listed.read_point is None and listed.runs == []
    assert {t: rows for t, (_, rows) in listed.mirrors.items()} == {t.table: t.rows for t in result.tables}
    during.txn("UPDATE types_t SET t = 'after the snapshot' WHERE id = 1",
               "DELETE FROM keyswap WHERE id % 3 = 0",
               "INSERT INTO logonly VALUES ('after the snapshot', 2, now())")
    during.untracked(lambda: pg15.run_pgbench(["-c", "2", "-t", "50"], db))
    expected = during._tables()
    during.close()

    capture_slot(landing, slot=slot, dsn=pg15.conninfo(db), publications=PUBLICATIONS, proto_version=2,
                 streaming="on", messages=True, chunk_size=500)
    applied = run_apply(spark, read_capture(spark, landing), target)
    assert applied.to_lsn is not None and applied.to_lsn > result.consistent_point
    final = Workload(db, snapshots={0: expected})  # no dropped columns: they went before the slot
    Mirrors(spark, target, final).assert_equal(expected, "the end of the traffic")
    # verify agrees, over every type of the workload
    verified = verify_mirrors(spark, target, landing, dsn=pg15.conninfo(db))
    assert {t.state for t in verified.tables} == {"equal"}, verified.render()
    # Read as of the snapshot's point (it holds what committed before it), not before it.
    point = int(result.consistent_point)
    copied_rows = next(t.rows for t in result.tables if t.table == "public.pgbench_accounts")
    assert mirror(spark, target, "public.pgbench_accounts", as_of_lsn=point - 1).count() == copied_rows
    with pytest.raises(NotReadableError, match=(
            rf"starts with the snapshot taken at {Lsn(point)}, after {Lsn(point - 2)}: it can be read as of "
            rf"{Lsn(point - 1)} or later")):
        mirror(spark, target, "public.pgbench_accounts", as_of_lsn=point - 2)
    # A mirror that started from the snapshot cannot be rebuilt from the capture (its rows from
    # before the slot are not in it): refused before anything is written.
    versions = commits(f"{target}/public/pgbench_accounts")
    with pytest.raises(ConfigError, match=r"rebuild: public\.pgbench_accounts cannot be rebuilt from the "
                                          r"capture: it started from a snapshot"):
        run_apply(spark, read_capture(spark, landing), target, rebuild=["public.pgbench_accounts"])
    assert commits(f"{target}/public/pgbench_accounts") == versions
    pg15.drop_slot(slot, dbname=db)


def test_a_snapshot_refuses_existing_mirrors_and_slots(spark: Any, pg15: PgCluster, tmp_path: Path) -> None:
    db = new_database(pg15, "snapshot")
    pg15.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE t", dbname=db)
    slot = f"{db}_slot"
    snapshot_tables(spark, str(tmp_path), slot=slot, publications=["p"], dsn=pg15.conninfo(db))
    # A local target: the copy's work beside it, then removed.
    assert list((tmp_path / "_pgoutput" / "snapshot-work").iterdir()) == []
    with pytest.raises(CaptureError, match=f"replication slot '{slot}' exists already"):
        snapshot_tables(spark, str(tmp_path), slot=slot, publications=["p"], dsn=pg15.conninfo(db))
    with pytest.raises(CaptureError, match="public.t: a mirror exists at .*a snapshot starts a new pipeline"):
        snapshot_tables(spark, str(tmp_path), slot=f"{slot}_2", publications=["p"], dsn=pg15.conninfo(db))
    assert [r[0] for r in pg15.query("SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE %s",
                                     (f"{db}%",))] == [slot]  # the refused snapshot created no slot
    pg15.drop_slot(slot, dbname=db)


def test_a_table_renamed_after_its_snapshot_is_named_and_a_resnapshot_mends_it(spark: Any, pg15: PgCluster,
                                                                               tmp_path: Path) -> None:
    """Renamed before any change of it was captured, the table's changes start a mirror of its
    new name, without the snapshot's rows: the run says so; a re-snapshot under the new name
    mends it, as the run's hint says."""
    db = new_database(pg15, "renamed")
    dsn, slot = pg15.conninfo(db), f"{db}_slot"
    target, landing = str(tmp_path / "target"), str(tmp_path / "landing")
    pg15.execute("CREATE TABLE a (id int PRIMARY KEY, v text); INSERT INTO a SELECT g, 'v' || g FROM "
                 "generate_series(1, 20) g; CREATE PUBLICATION p FOR ALL TABLES", dbname=db)
    snapshot_tables(spark, target, slot=slot, publications=["p"], dsn=dsn)
    pg15.execute("ALTER TABLE a RENAME TO b; UPDATE b SET v = 'renamed' WHERE id <= 3; DELETE FROM b WHERE id = 20",
                 dbname=db)
    capture_slot(landing, slot=slot, dsn=dsn, publications=["p"])
    first = run_apply(spark, read_capture(spark, landing), target)
    assert first.renamed == (("public.b", "public.a"),)
    assert "renamed in the source after the snapshot, before any change of them was captured: public.b " \
        "(snapshotted as public.a)" in first.render()
    assert {t.table: (t.updated, t.deleted, t.skipped) for t in first.tables} == {"public.b": (0, 0, 4)}
    snapshot_tables(spark, target, tables=["public.b"], publications=["p"], dsn=dsn)
    pg15.execute("UPDATE b SET v = 'after the re-snapshot' WHERE id = 5", dbname=db)
    capture_slot(landing, slot=slot, dsn=dsn)
    second = run_apply(spark, read_capture(spark, landing), target)
    assert second.renamed == () and "renamed" not in second.render()
    assert {t.table: (t.updated, t.skipped) for t in second.tables} == {"public.b": (1, 0)}
    assert sorted(tuple(r) for r in mirror(spark, target, "public.b").collect()) == \
        sorted(pg15.query("SELECT id, v FROM b", dbname=db))
    pg15.drop_slot(slot, dbname=db)


def test_numeric_type_overrides_in_snapshot_apply_and_verify(spark: Any, pg15: PgCluster, tmp_path: Path) -> None:
    """``tables.types``: an unconstrained numeric as ``decimal(12,2)``, another as ``double`` and a
    ``numeric(6,2)`` as ``string``: the snapshot's rows and the changes applied after it hold what
    PostgreSQL's ``::numeric(12,2)``, ``::float8`` and ``::text`` give, and verify calls the mirror
    equal; an override the column's type cannot take stops the run before anything is written."""
    db = new_database(pg15, "overrides")
    pg15.execute("CREATE TABLE m (id int PRIMARY KEY, amount numeric, rate numeric, note numeric(6,2));"
                 " INSERT INTO m SELECT g, g / 7.0, (g / 3.0) * 10::numeric ^ (g % 5 - 2), g / 8.0"
                 "   FROM generate_series(1, 40) g;"
                 " INSERT INTO m VALUES (41, 0.125, 'NaN', NULL), (42, -0.125, 'Infinity', 1.5);"
                 " CREATE PUBLICATION pub FOR TABLE m", dbname=db)
    tables = TablesConfig(types={"public.m": {"amount": "decimal(12, 2)", "rate": "double", "note": "string"}})
    slot, target, landing, dsn = f"{db}_slot", str(tmp_path / "target"), str(tmp_path / "landing"), pg15.conninfo(db)
    snapshot_tables(spark, target, slot=slot, publications=["pub"], dsn=dsn, selection=tables)
    pg15.execute("UPDATE m SET amount = amount * 3.33333, rate = rate / 7 WHERE id % 4 = 0;"
                 " INSERT INTO m VALUES (43, 2.675, 0.00001, 2.25), (44, -2.675, '-Infinity', NULL);"
                 " DELETE FROM m WHERE id = 1", dbname=db)
    capture_slot(landing, slot=slot, dsn=dsn, publications=["pub"], proto_version=1)
    run_apply(spark, read_capture(spark, landing), target, tables=tables)

    def rows(values: list[Any]) -> list[tuple[Any, ...]]:  # NaN as text: NaN != NaN
        return sorted(tuple("NaN" if v != v else v for v in row) for row in values)

    path = f"{target}/public/m"
    frame = spark.read.format("delta").load(path)
    assert [f.dataType.simpleString() for f in frame.schema] == ["int", "decimal(12,2)", "double", "string"]
    expected = pg15.query("SELECT id, amount::numeric(12,2), rate::float8, note::text FROM m", dbname=db)
    assert rows([tuple(r) for r in frame.collect()]) == rows(expected)
    verified = verify_mirrors(spark, target, landing, dsn=dsn, selection=tables)
    assert [t.state for t in verified.tables] == ["equal"], verified.render()

    before = commits(path)
    pg15.execute("UPDATE m SET rate = 1 WHERE id = 2", dbname=db)
    capture_slot(landing, slot=slot, dsn=dsn)
    with pytest.raises(ConfigError, match=r"tables\.types: public\.m\.id is int4; double applies to numeric "
                                          r"columns only"):
        run_apply(spark, read_capture(spark, landing), target,
                  tables=TablesConfig(types={"public.m": {**tables.types["public.m"], "id": "double"}}))
    assert commits(path) == before
    pg15.drop_slot(slot, dbname=db)


def test_published_generated_columns_on_18_in_snapshot_apply_and_verify(spark: Any, pg18: PgCluster,
                                                                         tmp_path: Path) -> None:
    """PostgreSQL 18 publishes stored generated columns with ``publish_generated_columns = stored``
    or a column list naming them (virtual ones never): the snapshot copies the columns the
    changes carry, so each mirror has the published columns, generated ones included, with
    PostgreSQL's values, and verify calls it equal."""
    db = new_database(pg18, "generated")
    pg18.execute("CREATE TABLE g (id int PRIMARY KEY, a int, s int GENERATED ALWAYS AS (a * 2) STORED,"
                 "   v int GENERATED ALWAYS AS (a * 3) VIRTUAL);"
                 " CREATE TABLE h (id int PRIMARY KEY, a int, s text GENERATED ALWAYS AS ('s' || a) STORED);"
                 " CREATE TABLE n (id int PRIMARY KEY, a int, s int GENERATED ALWAYS AS (a + 1) STORED);"
                 " INSERT INTO g (id, a) SELECT i, i FROM generate_series(1, 20) i;"
                 " INSERT INTO h (id, a) SELECT i, i FROM generate_series(1, 20) i;"
                 " INSERT INTO n (id, a) SELECT i, i FROM generate_series(1, 20) i;"
                 " CREATE PUBLICATION gen_stored FOR TABLE g WITH (publish_generated_columns = stored);"
                 " CREATE PUBLICATION gen_listed FOR TABLE h (id, s);"
                 " CREATE PUBLICATION gen_none FOR TABLE n", dbname=db)
    publications = ["gen_stored", "gen_listed", "gen_none"]
    slot, target, landing, dsn = f"{db}_slot", str(tmp_path / "target"), str(tmp_path / "landing"), pg18.conninfo(db)
    snapshot_tables(spark, target, slot=slot, publications=publications, dsn=dsn)
    pg18.execute("UPDATE g SET a = a * 10 WHERE id % 3 = 0; UPDATE h SET a = -a WHERE id < 5;"
                 " UPDATE n SET a = 0 WHERE id > 15; INSERT INTO g (id, a) VALUES (21, 7);"
                 " INSERT INTO h (id, a) VALUES (21, 7); DELETE FROM n WHERE id = 1", dbname=db)
    capture_slot(landing, slot=slot, dsn=dsn, publications=publications)
    run_apply(spark, read_capture(spark, landing), target)

    for table, columns in (("g", "id, a, s"), ("h", "id, s"), ("n", "id, a")):
        frame = mirror(spark, target, f"public.{table}")
        assert frame.columns == columns.split(", ")
        expected = pg18.query(f"SELECT {columns} FROM {table}", dbname=db)
        assert sorted(tuple(r) for r in frame.collect()) == sorted(expected)
    verified = verify_mirrors(spark, target, landing, dsn=dsn)
    assert {t.table: t.state for t in verified.tables} == dict.fromkeys(["public.g", "public.h", "public.n"],
                                                                          "equal"), verified.render()
    pg18.drop_slot(slot, dbname=db)


def test_a_temporal_primary_key_on_18_keys_its_mirror(spark: Any, pg18: PgCluster, tmp_path: Path) -> None:
    """PostgreSQL 18's temporal primary key (``WITHOUT OVERLAPS``, a GiST index) is the table's
    replica identity as any primary key is: rows of one id in periods of their own are rows of
    their own, an update of a period moves its row, a delete takes one period's row away. Were
    it not used as the key, the table would get inserts only and its mirror would keep them all."""
    db = new_database(pg18, "temporal")
    pg18.execute("CREATE EXTENSION btree_gist;"
                 " CREATE TABLE room (id int, during tstzrange, who text, PRIMARY KEY (id, during WITHOUT OVERLAPS));"
                 " INSERT INTO room VALUES (1, '[2026-01-01,2026-02-01)', 'a'), (1, '[2026-02-01,2026-03-01)', 'b'),"
                 "   (2, '[2026-01-01,2026-02-01)', 'c');"
                 " CREATE PUBLICATION temporal FOR TABLE room", dbname=db)
    slot, target, landing, dsn = f"{db}_slot", str(tmp_path / "target"), str(tmp_path / "landing"), pg18.conninfo(db)
    snapshot_tables(spark, target, slot=slot, publications=["temporal"], dsn=dsn)
    pg18.execute("UPDATE room SET who = 'a2' WHERE id = 1 AND during = '[2026-01-01,2026-02-01)';"
                 " UPDATE room SET during = '[2026-03-01,2026-04-01)' WHERE who = 'b';"
                 " INSERT INTO room VALUES (1, '[2026-02-01,2026-03-01)', 'd');"
                 " DELETE FROM room WHERE id = 2", dbname=db)
    capture_slot(landing, slot=slot, dsn=dsn, publications=["temporal"])
    applied = run_apply(spark, read_capture(spark, landing), target)
    assert [(t.table, t.status) for t in applied.tables] == [("public.room", "merged")]
    rows = sorted(tuple(r) for r in mirror(spark, target, "public.room").collect())
    assert rows == sorted(pg18.query("SELECT id, during::text, who FROM room", dbname=db))
    assert len(rows) == 3
    verified = verify_mirrors(spark, target, landing, dsn=dsn)
    assert {t.table: t.state for t in verified.tables} == {"public.room": "equal"}, verified.render()
    pg18.drop_slot(slot, dbname=db)
