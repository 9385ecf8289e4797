"""`xact_statuses`: what the source server says of transactions a capture left open."""

from __future__ import annotations

import pytest

from pgoutput_spark.errors import CaptureError
from pgoutput_spark.slot.xact_status import _full_xid, xact_statuses
from pgoutput_spark.testing.pgcluster import free_port


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


def test_a_server_out_of_reach_is_one_error_without_the_connection_string():
    dsn = f"host=127.0.0.1 port={free_port()} user=someone password=secret connect_timeout=5"
    with pytest.raises(CaptureError, match="can't connect to PostgreSQL") as caught:
        xact_statuses(dsn, [700])
    assert "secret" not in str(caught.value)
