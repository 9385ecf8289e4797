"""`xact_statuses`: what the source server says of transactions a capture left open."""

from __future__ import annotations


import pytest

from pgoutput_spark.errors import CaptureError
from pgoutput_spark.slot.xact_status import _full_xid, xact_statuses
from pgoutput_spark.testing.pgcluster import PgCluster, free_port


@pytest.mark.parametrize("xid, near, full", [
    (50, (3 << 32) + 100, (3 << 32) + 50),
    (200, (3 << 32) + 100, (3 << 32) + 200),  # above the snapshot's xmax: running, assigned after it
    ((1 << 32) - 10, (3 << 32) + 100, (2 << 32) + (1 << 32) - 10),  # just before the epoch began
    (99, 100, 99),
    ((1 << 32) - 10, 100, None),  # there is no epoch before the first
])
def test_a_32_bit_xid_is_the_transaction_with_those_bits_nearest_the_servers_snapshot(xid, near, full):
    assert _full_xid(xid, near) == full


def test_the_server_reports_committed_aborted_in_progress_and_what_it_cannot_know(pg15):
    conn = pg15.connect(autocommit=False)
    try:
        conn.execute("CREATE TEMP TABLE t (x int)")
        committed = int(conn.execute("SELECT pg_current_xact_id()::text::int8").fetchone()[0])
        conn.commit()
        conn.execute("INSERT INTO t VALUES (1)")
        aborted = int(conn.execute("SELECT pg_current_xact_id()::text::int8").fetchone()[0])
        conn.rollback()
        conn.execute("INSERT INTO t VALUES (2)")
        running = int(conn.execute("SELECT pg_current_xact_id()::text::int8").fetchone()[0])
        assert max(committed, aborted, running) < 1 << 32  # a new cluster's first epoch
        # The snapshot's xmax is the one after the last transaction that ended: `running` is not below it.
        assert xact_statuses(pg15.conninfo(), [committed, aborted, running]) == {
            committed: "committed", aborted: "aborted", running: "in progress"}
        with pytest.raises(CaptureError, match=rf"has not assigned some of the transaction ids {committed}, "
                                               rf"{running + 1000} yet .*: it is not the server the capture came from, "
                                               rf"or a standby behind it"):
            xact_statuses(pg15.conninfo(), [committed, running + 1000])
    finally:
        conn.rollback()
        conn.close()
    assert xact_statuses(pg15.conninfo(), []) == {}


def _current_xid(conn) -> int:
    return int(conn.execute("SELECT pg_current_xact_id()::text::int8").fetchone()[0])


@pytest.mark.postgres
def test_a_standby_answers_as_its_primary_and_one_behind_it_is_named():
    with PgCluster.debian(15) as primary, primary.standby() as standby:
        assert standby.query("SELECT pg_is_in_recovery()") == [(True,)]
        conn = primary.connect(autocommit=False)
        try:
            conn.execute("CREATE TABLE t (x int)")
            committed = _current_xid(conn)
            conn.commit()
            conn.execute("INSERT INTO t VALUES (1)")
            aborted = _current_xid(conn)
            conn.rollback()
            conn.execute("INSERT INTO t VALUES (2)")
            running = _current_xid(conn)
            standby.wait_replayed()  # the running one's insert too
            assert xact_statuses(standby.conninfo(), [committed, aborted, running]) == {
                committed: "committed", aborted: "aborted", running: "in progress"}
            conn.commit()
            standby.wait_replayed()
            assert xact_statuses(standby.conninfo(), [running]) == {running: "committed"}

            standby.execute("SELECT pg_wal_replay_pause()")
            conn.execute("INSERT INTO t VALUES (3)")
            later = _current_xid(conn)
            conn.commit()
            with pytest.raises(CaptureError, match=rf"has not assigned some of the transaction ids {later} yet "
                                                   rf".*, or a standby behind it"):
                xact_statuses(standby.conninfo(), [later])
            standby.execute("SELECT pg_wal_replay_resume()")
            standby.wait_replayed()
            assert xact_statuses(standby.conninfo(), [later]) == {later: "committed"}
        finally:
            conn.close()


@pytest.mark.postgres
def test_a_transaction_older_than_the_servers_oldest_status_is_one_it_cannot_tell():
    """PostgreSQL drops the status of transactions (pg_xact, 2^20 to a segment) once every database
    is frozen past them: then it answers NULL, which `xact_statuses` passes on as None."""
    with PgCluster.debian(15) as pg:  # a cluster of its own: every database frozen, template0 too
        with pg.connect(autocommit=False) as conn:
            conn.execute("CREATE TABLE t (x int)")
            old = int(conn.execute("SELECT pg_current_xact_id()::text::int8").fetchone()[0])
            conn.rollback()
        assert xact_statuses(pg.conninfo(), [old]) == {old: "aborted"}
        # Past pg_xact's first segment: a transaction id for each of 1.1M committed transactions.
        pg.execute("DO $$ BEGIN FOR i IN 1..1100000 LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$")
        pg.execute("ALTER DATABASE template0 ALLOW_CONNECTIONS true")
        for (dbname,) in pg.query("SELECT datname FROM pg_database"):
            pg.execute("VACUUM FREEZE", dbname=dbname)
        with pg.connect() as conn:
            recent = int(conn.execute("SELECT pg_current_xact_id()::text::int8").fetchone()[0])
        assert recent - old > 1 << 20 and recent < 1 << 32
        assert pg.query("SELECT pg_xact_status(%s::text::xid8)", [old]) == [(None,)]  # PostgreSQL's own answer
        assert xact_statuses(pg.conninfo(), [old, recent]) == {old: None, recent: "committed"}


def test_a_server_out_of_reach_is_one_error_without_the_connection_string():
    dsn = f"host=127.0.0.1 port={free_port()} user=someone password=secret connect_timeout=5"
    with pytest.raises(CaptureError, match="can't connect to PostgreSQL") as caught:
        xact_statuses(dsn, [700])
    assert "secret" not in str(caught.value)
