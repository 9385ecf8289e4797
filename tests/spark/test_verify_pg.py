"""`verify_mirrors` against a real PostgreSQL: equal after apply, drift named by key, lag not drift."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pgoutput_spark import read_capture
from pgoutput_spark.apply import run_apply
from pgoutput_spark.changefeed import RUNS_SCHEMA as FEED_RUNS
from pgoutput_spark.cli import main
from pgoutput_spark.errors import ConfigError
from pgoutput_spark.mirroring.schema import SchemaChangeError
from pgoutput_spark.slot.capture import capture_slot
from pgoutput_spark.slot.snapshot import snapshot_tables
from pgoutput_spark.slot.verify import verify_mirrors
from pgoutput_spark.spark.session import local_frame
from pgoutput_spark.testing.pgcluster import PgCluster

from ..plugins.postgres import new_database

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

TABLES = """
CREATE TABLE typed (id int PRIMARY KEY, n numeric(10, 2), f float8, t text, b bytea, ts timestamptz,
                    tl timestamp, d date, ia int[], j jsonb, iv interval, ok bool, u uuid, big text);
CREATE TABLE bag (v text, n int);  -- no key: a multiset
ALTER TABLE bag REPLICA IDENTITY FULL;
INSERT INTO typed SELECT g, g / 7.0, g / 3.0, CASE WHEN g % 4 = 0 THEN '' ELSE 'row ' || g END,
    decode(md5(g::text), 'hex'), '2026-01-01 00:00+02'::timestamptz + g * interval '1 hour',
    '2026-01-01'::timestamp + g * interval '1 minute', '2026-01-01'::date + g,
    CASE WHEN g % 5 = 0 THEN NULL WHEN g % 7 = 0 THEN '{}' ELSE ARRAY[g, NULL, -g] END,
    jsonb_build_object('g', g), g * interval '1 day 2 seconds', g % 2 = 0, md5(g::text)::uuid,
    CASE WHEN g = 1 THEN repeat('toast me ', 5000) END
  FROM generate_series(1, 300) g;
INSERT INTO bag SELECT 'same', 1 FROM generate_series(1, 3);
CREATE PUBLICATION verify_pub FOR TABLE typed, bag;
"""


def _states(result: Any) -> dict[str, str]:
    return {t.table: t.state for t in result.tables}


def test_verify_tells_equal_drift_and_lag_apart(spark: Any, pg15: PgCluster, tmp_path: Path,
                                                restore_spark_conf: Any, capsys: pytest.CaptureFixture[str]) -> None:
    db = new_database(pg15, "verify")
    pg15.execute(TABLES, dbname=db)
    slot, target, landing = f"{db}_slot", str(tmp_path / "target"), str(tmp_path / "landing")
    dsn = pg15.conninfo(db)
    snapshot_tables(spark, target, slot=slot, publications=["verify_pub"], dsn=dsn)
    pg15.execute("UPDATE typed SET n = n * 10, f = f + 1, ia = ia || 7 WHERE id <= 20;"
                 " UPDATE typed SET t = 'toast kept' WHERE id = 1;"  # big stays unchanged TOAST
                 " DELETE FROM typed WHERE id BETWEEN 100 AND 110; DELETE FROM bag WHERE ctid IN"
                 " (SELECT ctid FROM bag LIMIT 1); INSERT INTO bag VALUES ('same', 1), (NULL, NULL)",
                 dbname=db)
    capture_slot(landing, slot=slot, dsn=dsn, publications=["verify_pub"], proto_version=1)
    first = verify_mirrors(spark, target, landing, dsn=dsn).render()  # landed, never applied
    assert "mirrors no change applied yet" in first and "the apply has applied none of it" in first, first
    # A change feed's target (its runs table, as `run_changes` writes it) has no mirrors to verify.
    feed = str(tmp_path / "feed")
    local_frame(spark, [("finished", -1, 5, None, None, 6, 2, None, None, None, None, "0.1.0")], FEED_RUNS) \
        .write.format("delta").save(f"{feed}/_pgoutput/runs")
    with pytest.raises(ConfigError, match="holds a change feed .pgoutput-spark changes., not mirrors"):
        verify_mirrors(spark, feed, landing, dsn=dsn)
    run_apply(spark, read_capture(spark, landing), target)

    equal = verify_mirrors(spark, target, landing, dsn=dsn)
    assert _states(equal) == {"public.typed": "equal", "public.bag": "equal"}, equal.render()
    typed = next(t for t in equal.tables if t.table == "public.typed")
    assert typed.source_rows == typed.mirror_rows == 289 and typed.source_hash == typed.mirror_hash

    # drift: a mirror row edited behind the pipeline's back is named by its key
    spark.sql(f"UPDATE delta.`{target}/public/typed` SET t = 'edited' WHERE id = 42")
    drift = verify_mirrors(spark, target, landing, dsn=dsn, keys=True)
    assert _states(drift) == {"public.typed": "differs", "public.bag": "equal"}, drift.render()
    assert next(t for t in drift.tables if t.table == "public.typed").keys == ["key (42): values differ"]
    command = ["verify", "--target", target, "--landing", landing, "--dsn", dsn, "--master", "local[2]"]
    assert main([*command, "--keys"]) == 3  # a scheduler sees drift in the exit code
    assert "key (42): values differ" in capsys.readouterr().out
    spark.sql(f"UPDATE delta.`{target}/public/typed` SET t = 'row 42' WHERE id = 42")
    # A user's maintenance between runs: compacted and vacuumed mirrors, and the runs go on.
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    # VACUUM lists the folder in this many tasks, 10,000 by default: 21-27 s a table here, not 2-3 s.
    spark.conf.set("spark.sql.sources.parallelPartitionDiscovery.parallelism", "2")
    for table in ("typed", "bag"):
        spark.sql(f"OPTIMIZE delta.`{target}/public/{table}` ZORDER BY ({'id' if table == 'typed' else 'v'})")
        spark.sql(f"VACUUM delta.`{target}/public/{table}` RETAIN 0 HOURS").collect()

    # lag: a change committed but not captured is "not comparable", never drift
    pg15.execute("INSERT INTO bag VALUES ('later', 2)", dbname=db)
    lagging = verify_mirrors(spark, target, landing, dsn=dsn)
    assert _states(lagging) == {"public.typed": "equal", "public.bag": "not comparable"}, lagging.render()
    assert "1 change(s) committed before" in next(t for t in lagging.tables if t.table == "public.bag").reason
    # captured but not applied: the landing is ahead of the apply
    capture_slot(landing, slot=slot, dsn=dsn)
    behind = verify_mirrors(spark, target, landing, dsn=dsn)
    assert _states(behind)["public.bag"] == "not comparable" and "run apply first" in behind.render()

    # A column added with a DEFAULT: old rows have it in the source, and no message carries it.
    # A table added to the publication with rows in it: no message carries those rows either,
    # and its updates and deletes of them find no mirror row: skipped, and the run says why.
    pg15.execute("ALTER TABLE typed ADD COLUMN extra int DEFAULT 7; UPDATE typed SET t = 'new' WHERE id = 5;"
                 " CREATE TABLE late (id int PRIMARY KEY, v text);"
                 " INSERT INTO late SELECT g, 'before' FROM generate_series(1, 40) g;"
                 " ALTER PUBLICATION verify_pub ADD TABLE late;"
                 " UPDATE late SET v = 'published' WHERE id <= 3; DELETE FROM late WHERE id = 4;"
                 " INSERT INTO late VALUES (41, 'published')", dbname=db)
    capture_slot(landing, slot=slot, dsn=dsn)
    joined = run_apply(spark, read_capture(spark, landing), target)
    assert {t.table: (t.inserted, t.updated, t.deleted, t.skipped) for t in joined.tables}["public.late"] == \
        (1, 0, 0, 4)
    assert "skipped: updates or deletes that found no row in the mirror of public.late" in joined.render()
    assert "pgoutput-spark snapshot --table public.late" in joined.render()
    stale = verify_mirrors(spark, target, landing, dsn=dsn)  # bag caught up: equal again
    assert _states(stale) == {"public.typed": "differs", "public.bag": "equal", "public.late": "differs"}, \
        stale.render()
    # The remedy, a re-snapshot of the table; changes committed before it and applied after
    # it are in the snapshot already (a duplicate in the multiset would show), later ones apply.
    # A table added with rows is re-snapshotted too, before any run saw its changes.
    pg15.execute("INSERT INTO bag VALUES ('before the re-snapshot', 3); UPDATE typed SET n = 1 WHERE id = 6;"
                 " CREATE TABLE later (id int PRIMARY KEY, v text);"
                 " INSERT INTO later SELECT g, 'before' FROM generate_series(1, 10) g;"
                 " ALTER PUBLICATION verify_pub ADD TABLE later; UPDATE later SET v = 'published' WHERE id = 1",
                 dbname=db)
    resnapshot = ["snapshot", "--target", target, "--publication", "verify_pub", "--dsn", dsn,
                  "--master", "local[2]", "--table", "public.typed", "--table", "public.bag"]
    assert main([*resnapshot, "--table", "public.late", "--table", "public.later"]) == 0
    assert "re-snapshot as of" in capsys.readouterr().out
    pg15.execute("INSERT INTO bag VALUES ('after the re-snapshot', 4); UPDATE typed SET n = 2 WHERE id = 7;"
                 " UPDATE late SET v = 'after the re-snapshot' WHERE id IN (5, 41);"
                 " UPDATE later SET v = 'after the re-snapshot' WHERE id = 2", dbname=db)
    capture_slot(landing, slot=slot, dsn=dsn)
    after = run_apply(spark, read_capture(spark, landing), target)
    counts = {t.table: (t.updated, t.skipped) for t in after.tables}
    assert counts["public.late"] == (2, 0) and counts["public.later"] == (1, 0)  # the one before: in the snapshot
    assert main(command) == 0 and "4 equal, 0 differs, 0 not comparable" in capsys.readouterr().out

    # A type change Delta cannot follow (int[] -> text) stops the apply before anything is
    # written, naming the remedy: a re-snapshot, which takes the source's columns as they are
    # now (a renamed column's old name goes too) and which the apply then goes on from.
    pg15.execute("ALTER TABLE typed ALTER COLUMN ia TYPE text USING ia::text;"
                 " ALTER TABLE typed RENAME COLUMN t TO title;"
                 " UPDATE typed SET ia = 'now text' WHERE id = 8", dbname=db)
    capture_slot(landing, slot=slot, dsn=dsn)
    with pytest.raises(SchemaChangeError, match=r"public\.typed: column 'ia' changed type from array<int> to "
                                                r"string, .* Re-snapshot the table \(pgoutput-spark snapshot "
                                                r"--table public\.typed \.\.\.\)"):
        run_apply(spark, read_capture(spark, landing), target)
    assert main(resnapshot[:-2]) == 0 and "re-snapshot as of" in capsys.readouterr().out  # typed only
    redone = run_apply(spark, read_capture(spark, landing), target)  # the failed run's slice: in the snapshot
    assert {t.table: (t.inserted, t.updated, t.deleted) for t in redone.tables}["public.typed"] == (0, 0, 0)
    pg15.execute("UPDATE typed SET ia = 'after', title = 'renamed' WHERE id = 9", dbname=db)
    capture_slot(landing, slot=slot, dsn=dsn)
    result = run_apply(spark, read_capture(spark, landing), target)
    assert {t.table: (t.inserted, t.updated, t.deleted) for t in result.tables}["public.typed"] == (0, 1, 0)
    assert main(command) == 0 and "4 equal, 0 differs, 0 not comparable" in capsys.readouterr().out
    columns = spark.read.format("delta").load(f"{target}/public/typed").schema
    assert columns["ia"].dataType.simpleString() == "string" and "title" in columns.names
    assert "t" not in columns.names

    # A mirror whose table is gone from the publication is listed, not compared, not drift.
    (bag_rows,), = pg15.query("SELECT count(*) FROM bag", dbname=db)
    pg15.execute("DROP TABLE bag", dbname=db)
    orphaned = verify_mirrors(spark, target, landing, dsn=dsn)
    assert _states(orphaned) == {"public.typed": "equal", "public.bag": "no source",
                                  "public.late": "equal", "public.later": "equal"}, orphaned.render()
    bag = next(t for t in orphaned.tables if t.table == "public.bag")
    assert bag.mirror_rows == bag_rows and "dropped, renamed or left the publication" in bag.reason
    assert main(command) == 0 and "3 equal, 0 differs, 0 not comparable, 1 without a source" in \
        capsys.readouterr().out

    # The table created again under its name (another OID): its changes go to the mirror, which
    # keeps the old table's rows, as a subscriber's table would, and the run says so; a
    # re-snapshot starts the mirror from the new table.
    pg15.execute("CREATE TABLE bag (k int PRIMARY KEY, v text); ALTER PUBLICATION verify_pub ADD TABLE bag;"
                 " INSERT INTO bag VALUES (1, 'new'), (2, 'new')", dbname=db)
    capture_slot(landing, slot=slot, dsn=dsn)
    renewed = run_apply(spark, read_capture(spark, landing), target)
    assert renewed.replaced == ("public.bag",) and "replaced in the source: public.bag took changes of a " \
        "table that is not the one its mirror started from" in renewed.render()
    assert _states(verify_mirrors(spark, target, landing, dsn=dsn))["public.bag"] == "differs"
    assert main([*resnapshot[:-4], "--table", "public.bag"]) == 0 and "re-snapshot as of" in capsys.readouterr().out
    pg15.execute("UPDATE bag SET v = 'after the re-snapshot' WHERE k = 1", dbname=db)
    capture_slot(landing, slot=slot, dsn=dsn)
    again = run_apply(spark, read_capture(spark, landing), target)
    assert again.replaced == () and "replaced" not in again.render()
    assert {t.table: (t.inserted, t.updated, t.deleted) for t in again.tables} == {"public.bag": (0, 1, 0)}
    assert main(command) == 0 and "4 equal, 0 differs, 0 not comparable" in capsys.readouterr().out
    pg15.drop_slot(slot, dbname=db)
