"""`read_listed`, `update_listed`, `delete_listed` and `txn_append`'s ``replaced``: small Delta
tables as the Parquet files their checksum lists.

Delta 4.0 writes, beside each commit, a checksum file that lists the files of a table of up to
50 files. A table any Parquet reader may read (Delta's reader protocol 1) is read from those
files, and the target's lease and ``pending`` are changed by one transaction over them each,
without the Spark jobs in which Delta reconstructs the table's state. They must give what
Delta's own reader, UPDATE, replaceWhere overwrite and DELETE give, and leave every other table
to Delta.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pgoutput_spark.mirroring.delta import txn_append
from pgoutput_spark.mirroring.deltalog import checksum_files, listed_files, snapshot_now
from pgoutput_spark.mirroring.listed import delete_listed, read_current, read_listed, update_listed
from pgoutput_spark.mirroring.schema import PROPERTIES

from ..plugins.spark import jobs_run
from .deltalog import commits
from .gate import gate_keeper

pytestmark = pytest.mark.spark


def _delta(spark: Any, path: str) -> list[tuple]:
    return sorted((tuple(r) for r in spark.read.format("delta").load(path).collect()), key=repr)


def _listed(spark: Any, path: str) -> list[tuple]:
    return sorted((tuple(r) for r in read_listed(spark, path).collect()), key=repr)


def _rows(spark: Any, first: int, n: int = 3) -> Any:
    return spark.range(first, first + n).selectExpr("id", "CAST(id AS string) AS v", "id % 2 AS part")


def test_read_listed_gives_delta_s_rows_and_leaves_other_tables_to_delta(spark, tmp_path):
    path = str(tmp_path / "t")
    _rows(spark, 0).write.format("delta").partitionBy("part").save(path)
    _rows(spark, 10).withColumn("part", F.lit(None).cast("long")).write.format("delta").mode("append").save(path)
    _rows(spark, 20).withColumn("w", F.lit(1.5)).write.format("delta").mode("append") \
        .option("mergeSchema", "true").save(path)  # files before it have no w: null there
    spark.sql(f"UPDATE delta.`{path}` SET v = 'changed' WHERE id IN (1, 11)")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 21")
    expected = _delta(spark, path)
    assert len(expected) == 8 and (1, "changed", 1, None) in expected and (10, "10", None, None) in expected
    assert _listed(spark, path) == expected
    frame = read_listed(spark, path)
    assert frame.schema == spark.read.format("delta").load(path).schema
    assert frame.where(F.col("part").isNull()).count() == 3  # partition values, null among them
    listed = jobs_run(spark, "listed", lambda: read_listed(spark, path).collect())[1]
    delta = jobs_run(spark, "delta", lambda: spark.read.format("delta").load(path).collect())[1]
    assert listed < delta, (listed, delta)

    spark.sql(f"OPTIMIZE delta.`{path}`")  # the files removed are not read again
    assert _listed(spark, path) == expected
    spark.sql(f"DELETE FROM delta.`{path}`")
    assert read_listed(spark, path).collect() == []
    assert read_listed(spark, path).schema == spark.read.format("delta").load(path).schema

    # Deletion vectors (reader protocol 3), a checksum without a file list (over 50 files), none
    # at all: Delta's reader.
    vectors = str(tmp_path / "dv")
    _rows(spark, 0, 10).coalesce(1).write.format("delta") \
        .option("delta.enableDeletionVectors", "true").save(vectors)
    spark.sql(f"DELETE FROM delta.`{vectors}` WHERE id < 4")
    many = str(tmp_path / "many")
    _rows(spark, 0).coalesce(1).write.format("delta").save(many)
    _rows(spark, 3, 600).repartition(60).write.format("delta").mode("append").save(many)
    lost = str(tmp_path / "lost")
    _rows(spark, 0).write.format("delta").save(lost)
    _rows(spark, 3).write.format("delta").mode("append").save(lost)
    assert listed_files(spark, snapshot_now(spark, lost)) is not None
    for crc in Path(lost, "_delta_log").glob("*.crc"):
        crc.unlink()
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # the snapshots read again, without checksums
    for other, rows in ((vectors, 6), (many, 603), (lost, 6)):
        assert listed_files(spark, snapshot_now(spark, other)) is None, other
        assert _listed(spark, other) == _delta(spark, other) and len(_delta(spark, other)) == rows, other


def test_read_current_reads_a_mirror_s_listed_files_as_delta_s_reader_does(spark, tmp_path):
    """`read_current` of a mirror (column mapping, a widened column, a name with a dot and a
    space, partitions with a null) whose checksum lists its files: Delta's reader over those
    files, the rows and schema of Delta's reader of the version, in fewer Spark jobs; without
    a list (right after a schema change, deletion vectors): Delta's reader of the version."""
    path = str(tmp_path / "mirror")
    writer = _rows(spark, 0).withColumn("a.b c", F.col("id").cast("int")).write.format("delta").partitionBy("part")
    for key, value in PROPERTIES.items():
        writer = writer.option(key, value)
    writer.save(path)
    spark.sql(f"ALTER TABLE delta.`{path}` ALTER COLUMN `a.b c` TYPE bigint")
    assert checksum_files(snapshot_now(spark, path)) is None  # a schema change's checksum: no list
    assert _delta(spark, path) == sorted((tuple(r) for r in read_current(spark, path).collect()), key=repr)
    _rows(spark, 10).withColumn("part", F.lit(None).cast("long")).withColumn("a.b c", F.lit(2**40)) \
        .write.format("delta").mode("append").save(path)
    spark.sql(f"UPDATE delta.`{path}` SET v = 'changed' WHERE id IN (1, 11)")
    assert checksum_files(snapshot_now(spark, path)) is not None
    expected = _delta(spark, path)
    assert len(expected) == 6 and (11, "changed", None, 2**40) in expected and (1, "changed", 1, 1) in expected
    current = read_current(spark, path)
    assert sorted((tuple(r) for r in current.collect()), key=repr) == expected
    assert current.schema == spark.read.format("delta").load(path).schema
    # Each read after a new commit: Delta reconstructs the new version's state to find its files.
    _rows(spark, 20, 1).withColumn("a.b c", F.lit(7).cast("bigint")).write.format("delta").mode("append").save(path)
    listed = jobs_run(spark, "current", lambda: read_current(spark, path).collect())[1]
    _rows(spark, 30, 1).withColumn("a.b c", F.lit(7).cast("bigint")).write.format("delta").mode("append").save(path)
    version = int(snapshot_now(spark, path).version())
    delta = jobs_run(spark, "delta", lambda: spark.read.format("delta").option("versionAsOf", version)
                     .load(path).collect())[1]
    assert listed < delta, (listed, delta)
    # A version read stays that version's rows after later commits (a run caches what it read).
    before = read_current(spark, path)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 0")
    assert sorted((tuple(r) for r in before.collect()), key=repr) == expected + [(20, "20", 0, 7), (30, "30", 0, 7)]
    spark.sql(f"DELETE FROM delta.`{path}`")
    assert read_current(spark, path).collect() == []
    assert read_current(spark, path).schema == spark.read.format("delta").load(path).schema

    vectors = str(tmp_path / "dv")
    _rows(spark, 0, 10).coalesce(1).write.format("delta").option("delta.enableDeletionVectors", "true").save(vectors)
    spark.sql(f"DELETE FROM delta.`{vectors}` WHERE id < 4")
    assert checksum_files(snapshot_now(spark, vectors)) is None
    assert checksum_files(snapshot_now(spark, vectors), deletion_vectors=True) is not None  # read over its list
    assert sorted((tuple(r) for r in read_current(spark, vectors).collect()), key=repr) == _delta(spark, vectors)
    assert len(_delta(spark, vectors)) == 6
    spark.sql(f"DELETE FROM delta.`{vectors}` WHERE id = 8")  # the file's vector updated
    assert sorted((tuple(r) for r in read_current(spark, vectors).collect()), key=repr) == _delta(spark, vectors)
    assert len(_delta(spark, vectors)) == 5


def test_update_listed_updates_as_delta_s_update_and_fails_on_a_concurrent_change(spark, tmp_path):
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    for path in (ours, theirs):
        _rows(spark, 0, 4).withColumn("at", F.lit(None).cast("timestamp")).coalesce(1).write.format("delta").save(path)
    sets = {"v": "concat(v, '!')", "part": "7", "at": "current_timestamp()"}
    updated, jobs = jobs_run(spark, "update-listed", lambda: update_listed(spark, ours, "id >= 2", sets))
    assert updated == 2
    sql = f"UPDATE delta.`{theirs}` SET v = concat(v, '!'), part = 7, at = current_timestamp() WHERE id >= 2"
    assert jobs < jobs_run(spark, "update-delta", lambda: spark.sql(sql).collect())[1]  # commands run in sql()
    assert [r[:3] for r in _delta(spark, ours)] == [r[:3] for r in _delta(spark, theirs)] == [
        (0, "0", 0), (1, "1", 1), (2, "2!", 7), (3, "3!", 7)]
    assert [r["at"] is not None for r in sorted(spark.read.format("delta").load(ours).collect())] == \
        [False, False, True, True]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{ours}`").orderBy("version").collect()
    assert [r["operation"] for r in history] == ["WRITE", "UPDATE"]
    assert "id >= 2" in history[1]["operationParameters"]["predicate"]

    done = commits(ours)
    assert update_listed(spark, ours, "id = 99", sets) == 0  # nothing matched: no commit
    assert commits(ours) == done
    with pytest.raises(ValueError, match="no column"):
        update_listed(spark, ours, "id = 1", {"nope": "1"})
    assert commits(ours) == done

    vectors = str(tmp_path / "dv")  # reader protocol 3: Delta's UPDATE, by the caller
    _rows(spark, 0).write.format("delta").option("delta.enableDeletionVectors", "true").save(vectors)
    assert update_listed(spark, vectors, "id = 1", sets) is None
    assert commits(vectors) == 1

    # Another writer's UPDATE commits while this one writes its rows: Delta fails this one.
    gate = tmp_path / "gate"
    gate.mkdir()
    spark.udf.register("gated", gate_keeper(gate), T.StringType())

    def other_writer() -> None:
        while not (gate / "started").exists():
            time.sleep(0.05)
        try:
            spark.newSession().sql(f"UPDATE delta.`{ours}` SET v = 'theirs' WHERE id = 0")
        finally:
            (gate / "done").touch()

    thread = threading.Thread(target=other_writer, daemon=True)
    thread.start()
    with pytest.raises(Exception, match="Concurrent"):
        update_listed(spark, ours, "id = 1", {"v": "gated('mine')"})
    thread.join(60)
    assert [r[:2] for r in _delta(spark, ours)][:2] == [(0, "theirs"), (1, "1")]


def _partitions(spark: Any, path: str) -> list[int]:
    return sorted({r["_run_hi"] for r in spark.read.format("delta").load(path).collect()})


def test_partitions_replaced_and_deleted_by_the_listed_files_as_delta_does(spark, tmp_path):
    """`pending`'s overwrite of some runs' partitions (``txn_append`` with ``replaced``) and its
    delete of older runs' (`delete_listed`): the rows and the log's operations Delta's writer
    and DELETE leave, fewer jobs, and a redone overwrite writes nothing."""
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    app = "p:pending"

    def runs(*his: int) -> Any:
        return spark.createDataFrame([(h * 10 + i, h) for h in his for i in range(2)], "x long, _run_hi long")

    for path in (ours, theirs):
        txn_append(runs(1, 2), path, app, 2, partition_by=("_run_hi",))  # as `pending` is created
        txn_append(runs(3), path, app, 3)
    where = "_run_hi < 3 OR _run_hi = 5"
    _, jobs = jobs_run(spark, "replace-listed", lambda: txn_append(
        runs(5), ours, app, 5, replace_where=where, replaced=lambda v: int(v["_run_hi"]) < 3 or v["_run_hi"] == "5"))
    writer = jobs_run(spark, "replace-writer", lambda: txn_append(runs(5), theirs, app, 5, replace_where=where))[1]
    assert jobs < writer, (jobs, writer)
    assert _delta(spark, ours) == _delta(spark, theirs) == [(30, 3), (31, 3), (50, 5), (51, 5)]
    assert _listed(spark, ours) == _delta(spark, ours)
    history = spark.sql(f"DESCRIBE HISTORY delta.`{ours}`").orderBy("version").collect()
    assert [(r["operation"], r["operationParameters"]["mode"]) for r in history] == \
        [("WRITE", "Append"), ("WRITE", "Append"), ("WRITE", "Overwrite")]
    written = spark.sql(f"DESCRIBE HISTORY delta.`{theirs}`").orderBy("version").collect()
    assert history[2]["operationParameters"]["predicate"] == written[2]["operationParameters"]["predicate"]
    done = commits(ours)
    txn_append(runs(5), ours, app, 5, replace_where=where, replaced=lambda v: True)  # redone: nothing
    assert commits(ours) == done

    assert delete_listed(spark, ours, "_run_hi < 2", lambda v: int(v["_run_hi"]) < 2) is False  # none: no commit
    assert commits(ours) == done
    assert delete_listed(spark, ours, "_run_hi < 4", lambda v: int(v["_run_hi"]) < 4) is True
    spark.sql(f"DELETE FROM delta.`{theirs}` WHERE _run_hi < 4")
    assert _delta(spark, ours) == _delta(spark, theirs) == [(50, 5), (51, 5)]
    deletes = [spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()[-1]
               for path in (ours, theirs)]
    assert [r["operation"] for r in deletes] == ["DELETE"] * 2
    metrics = [{k: v for k, v in r["operationMetrics"].items() if not k.endswith("TimeMs")} for r in deletes]
    assert metrics[0] == metrics[1] and metrics[0]["numRemovedFiles"] == "2", metrics

    vectors = str(tmp_path / "dv")  # reader protocol 3: Delta's DELETE, by the caller
    runs(1).write.format("delta").partitionBy("_run_hi").option("delta.enableDeletionVectors", "true").save(vectors)
    assert delete_listed(spark, vectors, "_run_hi < 4", lambda v: True) is None
    assert commits(vectors) == 1
