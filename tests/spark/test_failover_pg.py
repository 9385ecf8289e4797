"""A failover slot (PostgreSQL 17+): the pipeline's slot on the primary, kept on a standby.

From PostgreSQL 17 a slot made with ``failover`` is copied to the standbys that synchronize
slots (``sync_replication_slots`` or ``pg_sync_replication_slots()``), and a primary with
``synchronized_standby_slots`` hands out no change before those standbys have its WAL. A
PostgreSQL 17 primary and a streaming standby of it: `snapshot` makes the pipeline's slot a
failover slot, `capture` reads it on the primary; the standby's copy is refused there (it is
read on the primary); then, after changes the copy has not caught up with, the standby is
promoted and the pipeline goes on from its copy (not from the old primary, still up a while).
The mirrors are compared with the tables of the server that had the changes. Without
``synchronized_standby_slots`` a landing can hold changes a promoted standby never had:
refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from pgoutput_spark import mirror, read_capture
from pgoutput_spark.apply import run_apply
from pgoutput_spark.cli import main
from pgoutput_spark.errors import CaptureError
from pgoutput_spark.lsn import Lsn
from pgoutput_spark.slot.capture import capture_slot
from pgoutput_spark.slot.snapshot import snapshot_tables
from pgoutput_spark.slot.verify import verify_mirrors
from pgoutput_spark.testing.pgcluster import PgCluster
from ..plugins.postgres import zonky_bindir

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

PUB = "failover_pub"
TABLES = f"""
CREATE TABLE keyed (id int PRIMARY KEY, v text, big text);
CREATE TABLE bag (v text, n int);
ALTER TABLE bag REPLICA IDENTITY FULL;
INSERT INTO keyed SELECT g, 'before ' || g, CASE WHEN g = 1 THEN repeat('toast me ', 5000) END
  FROM generate_series(1, 50) g;
INSERT INTO bag SELECT 'same', 1 FROM generate_series(1, 3);
CREATE PUBLICATION {PUB} FOR TABLE keyed, bag;
"""


def _slot(cluster: PgCluster, db: str, slot: str) -> tuple[Any, ...]:
    (row,) = cluster.query("SELECT failover, synced, confirmed_flush_lsn::text FROM pg_replication_slots"
                           " WHERE slot_name = %s", [slot], dbname=db)
    return row


def _synced(primary: PgCluster, standby: PgCluster, db: str, slot: str, wait: float) -> bool:
    """Whether the standby's slot sync worker brought its copy of `slot` to the primary's position
    within `wait` seconds. Its first copy stays temporary while the slot on the primary needs
    catalog rows older than the standby kept then: until the capture moves the slot on."""
    want = [(_slot(primary, db, slot)[2],)]
    return _within(wait, lambda: standby.query("SELECT confirmed_flush_lsn::text FROM pg_replication_slots"
                                               " WHERE slot_name = %s AND synced AND NOT temporary", [slot]) == want)


def _within(seconds: float, check: Callable[[], bool]) -> bool:
    """Whether `check()` holds within `seconds` (asked every 0.05 s)."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _assert_mirrors_equal(spark: Any, target: str, source: PgCluster, db: str) -> None:
    keyed = [tuple(r) for r in mirror(spark, target, "public.keyed").select("id", "v", "big").collect()]
    assert sorted(keyed, key=repr) == sorted(source.query("SELECT id, v, big FROM keyed", dbname=db), key=repr)
    bag = [tuple(r) for r in mirror(spark, target, "public.bag").select("v", "n").collect()]
    assert sorted(bag, key=repr) == sorted(source.query("SELECT v, n FROM bag", dbname=db), key=repr)


@contextmanager
def _primary_and_standby(synchronized: bool) -> Iterator[tuple[PgCluster, PgCluster, str]]:
    """A PostgreSQL 17 primary with TABLES and a physical slot for its standby (named in its
    synchronized_standby_slots when `synchronized`), and the standby, syncing slots."""
    with PgCluster(zonky_bindir(17)) as primary:
        db = primary.create_database("failover_source")
        primary.execute(TABLES, dbname=db)
        primary.execute("SELECT pg_create_physical_replication_slot('standby_1', true)")
        if synchronized:
            primary.execute("ALTER SYSTEM SET synchronized_standby_slots = 'standby_1'")
            primary.execute("SELECT pg_reload_conf()")
        with primary.standby({"primary_slot_name": "'standby_1'", "hot_standby_feedback": "on",
                              "sync_replication_slots": "on"}) as standby:
            standby.wait_replayed()
            yield primary, standby, db


def _until_the_copy_is_ready(primary: PgCluster, standby: PgCluster, db: str, slot: str,
                             land: Callable[[], object]) -> None:
    """A change, landed by `land`, until the standby's copy of `slot` is ready; then the standby's
    slot sync worker is stopped, so that the copy stays where it is."""
    for attempt in range(20):
        if _synced(primary, standby, db, slot, wait=3):
            break
        primary.execute(f"INSERT INTO bag VALUES ('moves the slot on', {attempt})", dbname=db)
        land()
    else:
        raise AssertionError(f"the standby's copy of {slot} is not ready:\n" + standby.log_file.read_text()[-3000:])
    assert _slot(standby, db, slot)[:2] == (True, True)
    standby.execute("ALTER SYSTEM SET sync_replication_slots = off")
    standby.execute("SELECT pg_reload_conf()")
    assert _within(30, lambda: standby.query(
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'slotsync worker'") == [(0,)]), \
        "the standby's slot sync worker did not stop"


def test_a_failover_slot_continues_on_the_promoted_standby(spark: Any, tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    with _primary_and_standby(synchronized=True) as (primary, standby, db):
        dsn, slot = primary.conninfo(db), "pipe"
        target, landing = str(tmp_path / "target"), str(tmp_path / "landing")
        snapshot_tables(spark, target, slot=slot, publications=[PUB], dsn=dsn, failover=True)
        assert _slot(primary, db, slot)[:2] == (True, False)

        primary.execute("UPDATE keyed SET v = 'after' WHERE id % 3 = 0; UPDATE keyed SET v = 'big kept'"
                        " WHERE id = 1; DELETE FROM keyed WHERE id > 45;"
                        " DELETE FROM bag WHERE ctid IN (SELECT ctid FROM bag LIMIT 1)", dbname=db)
        capture_slot(landing, slot=slot, dsn=dsn, publications=[PUB], chunk_size=20)
        _until_the_copy_is_ready(primary, standby, db, slot, lambda: capture_slot(
            landing, slot=slot, dsn=dsn, publications=[PUB], chunk_size=20))
        run_apply(spark, read_capture(spark, landing), target)
        _assert_mirrors_equal(spark, target, primary, db)

        # The standby's copy is the primary's to move: reading it there is refused, nothing landed.
        with pytest.raises(CaptureError, match=r"slot 'pipe' on .* is a copy of the primary's failover slot,"
                                               r" .*read the slot on the primary"):
            capture_slot(landing, slot=slot, dsn=standby.conninfo(db), publications=[PUB])

        # More changes landed from the primary (the copy stays behind them), then it goes away.
        primary.execute("INSERT INTO keyed SELECT g, 'late', NULL FROM generate_series(100, 120) g;"
                        " UPDATE keyed SET id = 1000 WHERE id = 2; INSERT INTO bag VALUES ('x', 2)", dbname=db)
        landed = capture_slot(landing, slot=slot, dsn=dsn, publications=[PUB], chunk_size=20)
        assert landed.messages > 0 and landed.caught_up and landed.chunks[-1].timeline == 1
        standby.wait_replayed()
        assert "synchronized_standby_slots is empty" not in caplog.text
        copy = _slot(standby, db, slot)[2]
        standby.promote()  # the old primary stays up a while: split brain, which the capture must see
        standby.execute("DELETE FROM keyed WHERE id = 1000; INSERT INTO bag VALUES ('on the promoted one', 3)",
                        dbname=db)

        promoted = standby.conninfo(db)
        resumed = capture_slot(landing, slot=slot, dsn=promoted, publications=[PUB], chunk_size=20)
        assert resumed.recovered, f"the copy at {copy} was not behind the landing: nothing to recover"
        assert resumed.messages > 0 and resumed.chunks[-1].timeline == 2
        assert "is a failover slot, but synchronized_standby_slots is empty on this primary" in caplog.text
        run_apply(spark, read_capture(spark, landing), target)
        _assert_mirrors_equal(spark, target, standby, db)

        # The old primary, still up, is not where the pipeline goes on: refused, nothing landed.
        files = sorted(Path(landing).glob("part-*.parquet"))
        with pytest.raises(CaptureError, match=r"read on timeline 2\), but slot 'pipe' on .* is on timeline 1,"
                                               r" an older one: it is not the server that took over"):
            capture_slot(landing, slot=slot, dsn=dsn, publications=[PUB])
        assert sorted(Path(landing).glob("part-*.parquet")) == files
        primary.stop()
        verified = verify_mirrors(spark, target, landing, dsn=promoted)
        assert {t.table: t.state for t in verified.tables} == {"public.keyed": "equal", "public.bag": "equal"}, \
            verified.render()


def test_a_landing_with_changes_the_promoted_standby_never_had_is_refused(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """No synchronized_standby_slots: the primary hands out changes its standby has not received.
    The capture warns; after a failover, the promoted standby's history left the landing's
    timeline before the landing's end, and the capture refuses to go on. On the way, a standby
    named in synchronized_standby_slots that streams no more: the capture says so and waits."""
    with _primary_and_standby(synchronized=False) as (primary, standby, db):
        landing, slot = str(tmp_path / "landing"), "pipe"

        def land(cluster: PgCluster) -> Any:
            return capture_slot(landing, slot=slot, dsn=cluster.conninfo(db), publications=[PUB],
                                create_slot=True, failover=True)

        land(primary)
        assert "is a failover slot, but synchronized_standby_slots is empty on this primary" in caplog.text
        _until_the_copy_is_ready(primary, standby, db, slot, lambda: land(primary))
        standby.execute("ALTER SYSTEM SET primary_conninfo = ''")  # the standby receives no more WAL
        standby.execute("SELECT pg_reload_conf()")
        assert _within(30, lambda: primary.query(  # its walsender on the primary gone too
            "SELECT active FROM pg_replication_slots WHERE slot_name = 'standby_1'") == [(False,)]), \
            "the standby still streams"
        primary.execute("INSERT INTO keyed VALUES (900, 'only the old primary had this', NULL)", dbname=db)

        # Named in synchronized_standby_slots, the standby that streams no more holds the changes back:
        # the capture says so and waits, until the setting leaves it out.
        primary.execute("ALTER SYSTEM SET synchronized_standby_slots = 'standby_1'")
        primary.execute("SELECT pg_reload_conf()")
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(land, primary)
            assert _within(10, lambda: "no standby streams from standby_1: the capture waits until one does"
                           in caplog.text), f"no line says the capture waits:\n{caplog.text}"
            landed = sorted(Path(landing).glob("part-*.parquet"))
            time.sleep(2)
            assert not waiting.done() and sorted(Path(landing).glob("part-*.parquet")) == landed
            primary.execute("ALTER SYSTEM RESET synchronized_standby_slots")
            primary.execute("SELECT pg_reload_conf()")
            ahead = waiting.result(timeout=60)
        assert ahead.messages > 0 and ahead.chunks[-1].timeline == 1
        primary.stop()
        standby.promote()
        assert standby.query("SELECT count(*) FROM keyed WHERE id = 900", dbname=db) == [(0,)]
        standby.execute("INSERT INTO keyed VALUES (901, 'on the promoted one', NULL)", dbname=db)

        files = sorted(Path(landing).glob("part-*.parquet"))
        with pytest.raises(CaptureError, match=(
                rf"ends at {Lsn(ahead.chunks[-1].end_lsn)} \(chunk {ahead.chunks[-1].chunk},"
                r" read on timeline 1\), but slot 'pipe' on .* left timeline 1 at \S+, when it was promoted"
                r" \(timeline 2\): the landing, and the mirrors, hold changes this server never had")):
            land(standby)
        assert sorted(Path(landing).glob("part-*.parquet")) == files


def test_snapshot_refuses_a_failover_slot_before_17(spark: Any, pg15: PgCluster, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    db = pg15.create_database("failover_before_17")
    pg15.execute(f"CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION {PUB} FOR TABLE t", dbname=db)
    target = str(tmp_path / "target")
    code = main(["snapshot", "--target", target, "--slot", "pipe", "--publication", PUB, "--dsn", pg15.conninfo(db),
                 "--master", "local[2]", "--failover"])
    assert code == 1
    assert "failover slots need PostgreSQL 17 or later; the server is PostgreSQL 15" in capsys.readouterr().err
    assert pg15.query("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'pipe'") == [(0,)]
    assert not (tmp_path / "target").exists()
