"""The pipeline against a hot standby: PostgreSQL 16 and later decode logically on a standby too.

Teams point logical decoding at a standby to spare the primary. A PostgreSQL 16 (and 18) primary
and a streaming standby of it (`PgCluster.standby`): `snapshot` (a new pipeline's and a table's
re-snapshot), `capture` and `verify` connect to the standby only, the traffic runs on the
primary, and the mirrors are compared with the primary's tables; then the primary goes away,
the standby is promoted, and the pipeline goes on from it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from pgoutput_spark import mirror, read_capture
from pgoutput_spark.apply import run_apply
from pgoutput_spark.slot.capture import capture_slot
from pgoutput_spark.slot.snapshot import snapshot_tables
from pgoutput_spark.slot.verify import verify_mirrors
from pgoutput_spark.testing.pgcluster import PgCluster

from ..plugins.postgres import new_cluster, standby_snapshots

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

TABLES = """
CREATE TABLE keyed (id int PRIMARY KEY, v text, n numeric(8, 2), big text);
CREATE TABLE bag (v text, n int);
ALTER TABLE bag REPLICA IDENTITY FULL;
INSERT INTO keyed SELECT g, 'before ' || g, g / 4.0, CASE WHEN g = 1 THEN repeat('toast me ', 5000) END
  FROM generate_series(1, 60) g;
INSERT INTO bag SELECT 'same', 1 FROM generate_series(1, 3);
CREATE PUBLICATION standby_pub FOR TABLE keyed, bag;
"""

TRAFFIC = [
    "UPDATE keyed SET v = 'after', n = n * 2 WHERE id % 3 = 0",
    "UPDATE keyed SET v = 'big kept' WHERE id = 1",  # its TOASTed column unchanged
    "DELETE FROM keyed WHERE id > 55",
    "INSERT INTO keyed SELECT g, 'new', g FROM generate_series(100, 130) g",
    "UPDATE keyed SET id = id + 1000 WHERE id = 2",  # a key change
    "DELETE FROM bag WHERE ctid IN (SELECT ctid FROM bag LIMIT 1)",
    "INSERT INTO bag VALUES ('x', 2)",
]


@contextmanager
def _primary_and_standby(database: str, major: int = 16) -> Iterator[tuple[PgCluster, PgCluster, str]]:
    """A PostgreSQL `major` primary (16: the pgserver wheel's; 17, 18: Zonky's builds) with TABLES
    in a new `database`, and a hot standby that replayed them."""
    with new_cluster(major) as primary, primary.standby({"hot_standby_feedback": "on"}) as standby:
        db = primary.create_database(database)
        primary.execute(TABLES, dbname=db)
        standby.wait_replayed()
        yield primary, standby, db


def _rows(cluster: PgCluster, db: str, query: str) -> list[tuple[Any, ...]]:
    return sorted(cluster.query(query, dbname=db), key=repr)


@pytest.mark.parametrize("major", [16, 18])
def test_snapshot_capture_apply_and_verify_from_a_hot_standby(major: int, spark: Any, tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    with _primary_and_standby("standby_source", major) as (primary, standby, db):
        dsn, slot = standby.conninfo(db), "standby_slot"
        target, landing = str(tmp_path / "target"), str(tmp_path / "landing")
        with standby_snapshots(primary):
            snapshot = snapshot_tables(spark, target, slot=slot, publications=["standby_pub"], dsn=dsn)
        assert {t.table: t.rows for t in snapshot.tables} == {"public.keyed": 60, "public.bag": 3}
        assert "creating slot standby_slot on a standby: PostgreSQL waits for the primary's next" in caplog.text
        assert standby.query("SELECT slot_name FROM pg_replication_slots") == [(slot,)]
        assert primary.query("SELECT slot_name FROM pg_replication_slots WHERE slot_type = 'logical'") == []

        for statement in TRAFFIC:
            primary.execute(statement, dbname=db)
        standby.wait_replayed()
        captured = capture_slot(landing, slot=slot, dsn=dsn, publications=["standby_pub"], chunk_size=40)
        assert len(captured.chunks) > 1 and captured.caught_up
        applied = run_apply(spark, read_capture(spark, landing), target)
        assert sorted(t.table for t in applied.tables) == ["public.bag", "public.keyed"]
        _assert_mirrors_equal(spark, target, primary, db, bag_columns="v, n")
        _assert_verified(spark, target, landing, dsn)

        # A column added with a DEFAULT (no message carries its value for the rows before): the
        # table re-snapshotted from the standby (a temporary slot there), then more traffic.
        primary.execute("ALTER TABLE bag ADD COLUMN d int DEFAULT 7; INSERT INTO bag VALUES ('y', 3, 8)", dbname=db)
        standby.wait_replayed()
        with standby_snapshots(primary):
            snapshot_tables(spark, target, tables=["public.bag"], publications=["standby_pub"], dsn=dsn)
        primary.execute("UPDATE keyed SET v = 'later' WHERE id = 4; DELETE FROM bag WHERE v = 'x';"
                        " INSERT INTO bag VALUES ('z', 4)", dbname=db)
        standby.wait_replayed()
        capture_slot(landing, slot=slot, dsn=dsn, publications=["standby_pub"], chunk_size=40)
        run_apply(spark, read_capture(spark, landing), target)
        _assert_mirrors_equal(spark, target, primary, db, bag_columns="v, n, d")
        _assert_verified(spark, target, landing, dsn)
        assert standby.query("SELECT slot_name FROM pg_replication_slots") == [(slot,)]  # the temporary one gone

        # Failover: the primary goes away after more traffic, the standby is promoted and takes
        # the traffic; its slot is there, and the pipeline goes on from it.
        primary.execute("UPDATE keyed SET n = -n WHERE id % 5 = 0; DELETE FROM bag WHERE v = 'y'", dbname=db)
        standby.wait_replayed()
        primary.stop()
        standby.promote()
        standby.execute("INSERT INTO keyed VALUES (500, 'on the promoted one', 5, NULL);"
                        " UPDATE keyed SET id = 501 WHERE id = 500", dbname=db)
        capture_slot(landing, slot=slot, dsn=dsn, publications=["standby_pub"], chunk_size=40)
        run_apply(spark, read_capture(spark, landing), target)
        _assert_mirrors_equal(spark, target, standby, db, bag_columns="v, n, d")
        _assert_verified(spark, target, landing, dsn)


def _assert_mirrors_equal(spark: Any, target: str, source: PgCluster, db: str, bag_columns: str) -> None:
    keyed = [tuple(r) for r in mirror(spark, target, "public.keyed").select("id", "v", "n", "big").collect()]
    assert sorted(keyed, key=repr) == _rows(source, db, "SELECT id, v, n, big FROM keyed")
    bag = [tuple(r) for r in mirror(spark, target, "public.bag").selectExpr(*bag_columns.split(", ")).collect()]
    assert sorted(bag, key=repr) == _rows(source, db, f"SELECT {bag_columns} FROM bag")


def _assert_verified(spark: Any, target: str, landing: str, dsn: str) -> None:
    verified = verify_mirrors(spark, target, landing, dsn=dsn)
    assert {t.table: t.state for t in verified.tables} == {"public.keyed": "equal", "public.bag": "equal"}, \
        verified.render()


def test_prepared_transactions_decoded_at_prepare_on_a_hot_standby(spark: Any, tmp_path: Path) -> None:
    """A two_phase slot made on a standby (by `snapshot --two-phase`): transactions prepared on the
    primary are landed at their PREPARE, their COMMIT PREPARED and ROLLBACK PREPARED by a later
    capture; after each apply the mirrors equal the primary's tables (a prepared transaction's
    rows only once it is committed)."""
    with _primary_and_standby("standby_two_phase") as (primary, standby, db):
        dsn, slot = standby.conninfo(db), "two_phase_slot"
        target, landing = str(tmp_path / "target"), str(tmp_path / "landing")
        with standby_snapshots(primary):
            snapshot_tables(spark, target, slot=slot, publications=["standby_pub"], dsn=dsn, two_phase=True)
        assert standby.query("SELECT two_phase FROM pg_replication_slots") == [(True,)]

        primary.execute("BEGIN; UPDATE keyed SET v = 'prepared' WHERE id < 10; INSERT INTO bag VALUES ('p', 9);"
                        " PREPARE TRANSACTION 'kept'", dbname=db)
        primary.execute("BEGIN; DELETE FROM keyed WHERE id > 40; PREPARE TRANSACTION 'dropped'", dbname=db)
        primary.execute("UPDATE keyed SET n = 0 WHERE id = 20", dbname=db)
        standby.wait_replayed()
        first = capture_slot(landing, slot=slot, dsn=dsn, publications=["standby_pub"], two_phase=True)
        kinds = Counter(bytes(data[:1]) for data in pq.read_table(landing).column("data").to_pylist())
        assert first.messages > 0 and kinds[b"P"] == 2 and kinds[b"K"] == 0  # two Prepares, no Commit Prepared
        run_apply(spark, read_capture(spark, landing), target)
        _assert_mirrors_equal(spark, target, primary, db, bag_columns="v, n")

        primary.execute("COMMIT PREPARED 'kept'", dbname=db)
        primary.execute("ROLLBACK PREPARED 'dropped'", dbname=db)
        standby.wait_replayed()
        capture_slot(landing, slot=slot, dsn=dsn, publications=["standby_pub"])
        kinds = Counter(bytes(data[:1]) for data in pq.read_table(landing).column("data").to_pylist())
        assert kinds[b"K"] == 1 and kinds[b"r"] == 1  # Commit Prepared, Rollback Prepared
        run_apply(spark, read_capture(spark, landing), target)
        _assert_mirrors_equal(spark, target, primary, db, bag_columns="v, n")
        assert primary.query("SELECT count(*) FROM keyed WHERE v = 'prepared'", dbname=db) == [(9,)]
