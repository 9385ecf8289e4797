"""`merge_listed`: a mirror's MERGE as one Delta transaction of our own, where the mirror's
checksum lists its files.

It must leave a mirror exactly as Delta's MERGE of the same net rows does (rows, the counts
the run reports, the commit's transaction identifier and metadata), on mirrors as runs leave
them: column mapping with names of any character, a column widened after rows were written,
a dropped column that updates keep and inserts leave null, multisets with duplicate and null
rows, truncated tables, and with deletion vectors on, rows marked deleted in large files.
The oracle is Delta's own MERGE of the same rows into a copy of the same mirror. Every other
table (change data feed, a history with deletion vectors, two net rows for one key) is
Delta's. Mirrors are matched only in the files whose statistics of the keys (integers,
decimals, dates, timestamps, strings; a multiset's identity columns without nulls) meet the
source's (checked file by file, and against Delta's MERGE).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

import pgoutput_spark.mirroring.merge as merging
from pgoutput_spark.mirroring import deltalog
from pgoutput_spark.mirroring.delta import append
from pgoutput_spark.mirroring.deltalog import applied_commit
from pgoutput_spark.mirroring.merge import merge
from pgoutput_spark.mirroring.net import TableSpec

pytestmark = pytest.mark.spark

#: The mirror's columns: a key, a widened column, a name of odd characters, a dropped column.
MIRROR = "`id` int, `n` int, `v.x ``y```  string, `gone` string"
COLUMNS = ("id", "n", "v.x `y`")  # the source's columns now: "gone" was dropped
SOURCE = "_action string, `id` int, `n` bigint, `v.x ``y``` string"
APP_ID = "p:relation:7"


def _rows(spark: Any, path: str) -> list[tuple]:
    return sorted((tuple(r) for r in spark.read.format("delta").load(path).collect()), key=repr)


def _mirror(spark: Any, path: str, rows: list[tuple], spec: TableSpec) -> None:
    """A mirror of ``rows`` in two files, its column ``n`` widened to bigint between them (as a
    run's schema step does): the first file keeps int. (A commit that changes the schema leaves
    the list of files out of its checksum; the next write puts it back.)"""
    half = len(rows) // 2
    whole = TableSpec(spec.mode, spec.key, (*COLUMNS, "gone"))
    append(path, spark.createDataFrame(rows[:half], MIRROR), whole, app_id=APP_ID, version=1,
           metadata={"to_lsn": 1}, create=True)
    spark.sql(f"ALTER TABLE delta.`{path}` ALTER COLUMN n TYPE bigint")
    append(path, spark.createDataFrame(rows[half:], MIRROR.replace("`n` int", "`n` bigint")), whole,
           app_id=APP_ID, version=2, metadata={"to_lsn": 2})


def _case(seed: int) -> tuple[TableSpec, list[tuple], list[tuple], bool]:
    """A mirror's rows, net rows to merge and whether the run truncated, drawn from ``seed``."""
    rnd = random.Random(seed)
    size = rnd.choice([0, 6, 40])
    truncated = rnd.random() < 0.3
    if rnd.random() < 0.6:  # keyed by id
        spec = TableSpec("keyed", ("id",), COLUMNS)
        mirror = [(i, rnd.choice([i, None]), rnd.choice(["a", None]), rnd.choice(["kept", None])) for i in range(size)]
        keys = rnd.sample(range(size + 10), rnd.randrange(0, 12))  # some in the mirror, some new
        source = [(rnd.choice(["upsert", "delete"]), k, rnd.choice([2**40 + k, None]), f"s{k}") for k in keys]
    else:  # a multiset of (id, n, v): duplicates and nulls
        spec = TableSpec("multiset", COLUMNS, COLUMNS)
        mirror = [(rnd.randrange(4), rnd.choice([1, None]), rnd.choice(["a", None]), "kept") for _ in range(size)]
        present = sorted({r[:3] for r in mirror}, key=repr)
        gone = rnd.sample(present, min(len(present), rnd.randrange(0, 4))) + [(99, None, None)]  # one matches nothing
        source = [("delete_all", *r) for r in gone] + \
                 [("insert", rnd.randrange(4), rnd.choice([2**40, None]), rnd.choice(["b", None]))
                  for _ in range(rnd.randrange(0, 4))]
    return spec, mirror, source, truncated


def _recorded() -> tuple[list[Any], Any]:
    """`merge_listed` that also records what it returns (None: it left the MERGE to Delta), and
    the list it records into."""
    listed, results = merging.merge_listed, []

    def recorded(*args: Any, **kwargs: Any) -> Any:
        results.append(listed(*args, **kwargs))
        return results[-1]

    return results, recorded


@pytest.mark.parametrize("seed", range(8))
def test_merge_listed_leaves_a_mirror_as_delta_s_merge_does(spark: Any, tmp_path: Path, monkeypatch: Any,
                                                            seed: int) -> None:
    spec, mirror, net, truncated = _case(seed)
    monkeypatch.setattr(deltalog, "PRUNE_MIN_BYTES", 0)  # files matched by their statistics, at any size
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    source = spark.createDataFrame(net, SOURCE).persist()
    results, recorded = _recorded()
    counts = {}
    for path, merge_listed in ((theirs, lambda *a, **k: None), (ours, recorded)):
        _mirror(spark, path, mirror, spec)
        monkeypatch.setattr(merging, "merge_listed", merge_listed)
        counts[path] = merge(spark, path, source, spec, truncated=truncated, app_id=APP_ID, version=10,
                             metadata={"to_lsn": 10})
    assert results and results[0] is not None  # our transaction merged, not Delta's command
    assert _rows(spark, ours) == _rows(spark, theirs)
    assert counts[ours] == counts[theirs]
    # What a redone run reads back from the commit (`applied_commit`), and a redone MERGE: nothing.
    assert applied_commit(spark, ours, APP_ID, 10) == applied_commit(spark, theirs, APP_ID, 10) == counts[theirs]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{ours}`").orderBy(F.desc("version")).first()
    assert history["operation"] == "MERGE" and '"to_lsn": 10' in history["userMetadata"]
    again = merge(spark, ours, source, spec, truncated=truncated, app_id=APP_ID, version=10, metadata={"to_lsn": 10})
    assert again == {"inserted": 0, "updated": 0, "deleted": 0}
    assert spark.sql(f"DESCRIBE HISTORY delta.`{ours}`").count() == history["version"] + 1


def test_merge_listed_leaves_other_tables_to_delta(spark: Any, tmp_path: Path) -> None:
    # A table with Delta's change data feed: only Delta's MERGE writes its change files.
    # (Plain names: Delta's change feed fails on a backtick in a column's name.)
    plain = TableSpec("keyed", ("id",), ("id", "v"))
    path = str(tmp_path / "cdf")
    append(path, spark.createDataFrame([(1, "a"), (2, "b")], "id int, v string"), plain, app_id=APP_ID,
           version=1, metadata={"to_lsn": 1}, create=True)
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    append(path, spark.createDataFrame([(3, "c")], "id int, v string"), plain, app_id=APP_ID,
           version=2, metadata={"to_lsn": 2})
    source = spark.createDataFrame([("upsert", 1, "one")], "_action string, id int, v string")
    assert merging.merge_listed(spark, path, source, plain, truncated=False, app_id=APP_ID, version=10) is None
    assert merge(spark, path, source, plain, truncated=False, app_id=APP_ID, version=10,
                 metadata={"to_lsn": 10}) == {"inserted": 0, "updated": 1, "deleted": 0}
    changes = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 3).load(path)
    assert sorted(r[0] for r in changes.select("_change_type").collect()) == ["update_postimage", "update_preimage"]
    # The change feed off again, the table is ours (deletion vectors on as well: the test below);
    # a table with deletion vectors on, a history's MERGE is Delta's.
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES (delta.enableChangeDataFeed = false, "
              f"delta.enableDeletionVectors = true)")
    append(path, spark.createDataFrame([(4, "d"), (6, "f")], "id int, v string").coalesce(1), plain,
           app_id=APP_ID, version=11, metadata={"to_lsn": 11})
    assert merging.merge_listed(spark, path, source.where("false"), plain, truncated=False, app_id=APP_ID,
                                version=12, history=True) is None
    assert merging.merge_listed(spark, path, source, plain, truncated=False, app_id=APP_ID,
                                version=12) == {"inserted": 0, "updated": 1, "deleted": 0}
    # Files with deletion vectors, the property off again: Delta's MERGE (a table whose files
    # `checksum_files` lists only where none has a vector).
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 4")
    assert deltalog.checksum_files(deltalog.snapshot_now(spark, path)) is None
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES (delta.enableDeletionVectors = false)")
    append(path, spark.createDataFrame([(5, "e")], "id int, v string"), plain, app_id=APP_ID,
           version=13, metadata={"to_lsn": 13})
    assert merging.merge_listed(spark, path, source, plain, truncated=False, app_id=APP_ID, version=14) is None
    # Two net rows for one key: nothing written by ours; Delta's MERGE fails as it does.
    spec = TableSpec("keyed", ("id",), COLUMNS)
    path = str(tmp_path / "twice")
    _mirror(spark, path, [(1, 1, "a", None), (2, 2, "b", None)], spec)
    twice = spark.createDataFrame([("upsert", 1, 10, "one"), ("delete", 1, None, None)], SOURCE)
    assert merging.merge_listed(spark, path, twice, spec, truncated=False, app_id=APP_ID, version=10) is None
    with pytest.raises(Exception, match="multiple source rows matched"):
        merge(spark, path, twice, spec, truncated=False, app_id=APP_ID, version=10, metadata={"to_lsn": 10})
    assert _rows(spark, path) == [(1, 1, "a", None), (2, 2, "b", None)]


def test_merge_listed_rewrites_the_small_files_of_a_mirror_of_many(spark: Any, tmp_path: Path,
                                                                   monkeypatch: Any) -> None:
    # Runs add a file or two each; a mirror past MERGE_MAX_FILES files has its small ones rewritten
    # with its next MERGE, so that it stays a table the checksum lists (here: past 3 files).
    monkeypatch.setattr(merging, "MERGE_MAX_FILES", 3)
    spec = TableSpec("keyed", ("id",), ("id", "v"))
    path = str(tmp_path / "many")
    for version in range(1, 6):
        append(path, spark.createDataFrame([(version, f"v{version}")], "id int, v string"), spec, app_id=APP_ID,
               version=version, metadata={"to_lsn": version}, create=version == 1)
    source = spark.createDataFrame([("upsert", 2, "two"), ("upsert", 9, "nine")], "_action string, id int, v string")
    assert merge(spark, path, source, spec, truncated=False, app_id=APP_ID, version=10,
                 metadata={"to_lsn": 10}) == {"inserted": 1, "updated": 1, "deleted": 0}
    assert _rows(spark, path) == [(1, "v1"), (2, "two"), (3, "v3"), (4, "v4"), (5, "v5"), (9, "nine")]
    metrics = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy(F.desc("version")).first()["operationMetrics"]
    assert (metrics["numTargetFilesRemoved"], metrics["numTargetRowsCopied"]) == ("5", "4")
    snapshot = deltalog.snapshot_now(spark, path)
    assert len(deltalog.checksum_files(snapshot)) <= 3


#: A history's table: the key, a column of odd characters, then the history's own columns.
HISTORY = ("`id` int, `v.x ``y``` string, `_valid_from_lsn` bigint, `_valid_to_lsn` bigint, "
           "`_valid_from_ts` timestamp, `_valid_to_ts` timestamp, `_is_current` boolean, `_version_seq` bigint")


def _history_case(seed: int) -> tuple[list[tuple], list[tuple]]:
    """A history's versions (each key's earlier versions closed, its last one current unless
    deleted) and a run's ``close`` and ``version`` rows, drawn from ``seed``."""
    import datetime as dt

    rnd = random.Random(seed)
    at = dt.datetime(2026, 1, 1)

    def ts(lsn: int | None) -> Any:
        return None if lsn is None else at + dt.timedelta(seconds=lsn)

    versions, n = [], [30, 5, 0, 30][seed % 4]
    for key in range(n):
        lsns = sorted(rnd.sample(range(1, 100), rnd.randrange(1, 4)))
        ends = [*lsns[1:], rnd.choice([None, None, 100])]  # the last one current, or deleted at 100
        versions += [(key, rnd.choice([f"v{lsn}", None]), lsn, end, ts(lsn), ts(end), end is None, lsn)
                     for lsn, end in zip(lsns, ends)]
    keys = rnd.sample(range(n + 5), rnd.randrange(1, min(12, n + 5)))  # most have versions, some none
    run = [("close", k, None, None, 200, None, ts(200), False, None) for k in keys]
    run += [("version", k, f"new{k}", 200, end, ts(200), ts(end), end is None, 7)
            for k in rnd.sample(range(45), rnd.randrange(0, 8)) for end in [rnd.choice([None, 300])]]
    return versions, run


@pytest.mark.parametrize("seed", range(4))
def test_merge_listed_closes_and_inserts_a_history_s_versions_as_delta_s_merge_does(
        spark: Any, tmp_path: Path, monkeypatch: Any, seed: int) -> None:
    from pgoutput_spark.mirroring.history import HISTORY_NAMES, merge_history

    versions, run = _history_case(seed)
    monkeypatch.setattr(deltalog, "PRUNE_MIN_BYTES", 0)  # files matched by their statistics, at any size
    spec = TableSpec("keyed", ("id",), ("id", "v.x `y`"))
    whole = TableSpec("keyed", ("id",), (*spec.columns, *HISTORY_NAMES))
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    source = spark.createDataFrame(run, f"_action string, {HISTORY}").persist()
    results, recorded = _recorded()
    counts = {}
    for path, merge_listed in ((theirs, lambda *a, **k: None), (ours, recorded)):
        half = len(versions) // 2  # in two files
        for version, rows in enumerate((versions[:half], versions[half:]), start=1):
            append(path, spark.createDataFrame(rows, HISTORY), whole, app_id=APP_ID, version=version,
                   metadata={"to_lsn": version}, create=version == 1)
        monkeypatch.setattr(merging, "merge_listed", merge_listed)
        counts[path] = merge_history(spark, path, source, spec, app_id=APP_ID, version=10, metadata={"to_lsn": 10})
    assert results and results[0] is not None  # our transaction merged, not Delta's command
    assert _rows(spark, ours) == _rows(spark, theirs)
    assert counts[ours] == counts[theirs]
    assert counts[ours]["versions"] == sum(r[0] == "version" for r in run)
    history = spark.sql(f"DESCRIBE HISTORY delta.`{ours}`").orderBy(F.desc("version")).first()
    assert history["operation"] == "MERGE" and '"to_lsn": 10' in history["userMetadata"]
    theirs_metrics = spark.sql(f"DESCRIBE HISTORY delta.`{theirs}`").orderBy(F.desc("version")).first()
    assert {k: history["operationMetrics"][k] for k in ("numTargetRowsInserted", "numTargetRowsUpdated")} == \
        {k: theirs_metrics["operationMetrics"][k] for k in ("numTargetRowsInserted", "numTargetRowsUpdated")}
    again = merge_history(spark, ours, source, spec, app_id=APP_ID, version=10, metadata={"to_lsn": 10})
    assert again == {"versions": 0, "closed": 0}
    assert spark.sql(f"DESCRIBE HISTORY delta.`{ours}`").count() == history["version"] + 1
    # Two close rows for one key: nothing written by ours, Delta's MERGE decides.
    assert run[0][0] == "close"
    twice = spark.createDataFrame(run[:1] * 2, f"_action string, {HISTORY}")
    assert recorded(spark, ours, twice, spec, truncated=False, app_id=APP_ID, version=11, history=True) is None
    once = spark.createDataFrame(run[:1], f"_action string, {HISTORY}")  # the same table takes one
    assert recorded(spark, ours, once, spec, truncated=False, app_id=APP_ID, version=11, history=True) is not None


@pytest.mark.parametrize("seed", [0, 6, 20])  # cases in which rows are marked (asserted): keyed, a multiset
def test_merge_listed_marks_rows_deleted_in_a_mirror_with_deletion_vectors_as_delta_s_merge_leaves_it(
        spark: Any, tmp_path: Path, monkeypatch: Any, seed: int) -> None:
    # Deletion vectors on, every file large enough to keep (the threshold at 0): the rows a MERGE
    # updates or deletes are marked deleted in their files (where at most half a file's rows), the
    # updated rows written anew, other files rewritten. Two MERGEs, the second over the first's
    # vectors; the oracle is Delta's own MERGE (deletion vectors on too) of the same rows into a
    # copy of the mirror.
    monkeypatch.setattr(merging, "MARK_MIN_FILE_BYTES", 0)
    spec, mirror, net, truncated = _case(seed)
    whole = TableSpec(spec.mode, spec.key if spec.mode == "keyed" else (*COLUMNS, "gone"), (*COLUMNS, "gone"))
    rnd = random.Random(seed)
    runs = [[(*row, rnd.choice(["g", None])) for row in net]]
    if whole.mode == "keyed":  # the second run changes other keys, and some of the same
        runs.append([(rnd.choice(["upsert", "delete"]), k, rnd.choice([k, None]), f"t{k}", "h")
                     for k in rnd.sample(range(50), rnd.randrange(1, 12))])
    else:  # the second run deletes rows of the mirror as the first left it
        runs.append([("delete_all", *row) for row in sorted(set(mirror[:2]), key=repr)]
                    + [("insert", 1, None, "c", "h")])
    schema = SOURCE + ", `gone` string"
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    results, recorded = _recorded()
    for path in (ours, theirs):
        _mirror(spark, path, mirror, whole)
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES (delta.enableDeletionVectors = true)")
    marked = 0
    for run, rows in enumerate(runs):
        source = spark.createDataFrame(rows, schema).persist()
        counts = {}
        for path, merge_listed in ((theirs, lambda *a, **k: None), (ours, recorded)):
            monkeypatch.setattr(merging, "merge_listed", merge_listed)
            counts[path] = merge(spark, path, source, whole, truncated=truncated and run == 0, app_id=APP_ID,
                                 version=10 + run, metadata={"to_lsn": 10 + run})
        assert results[-1] is not None  # our transaction merged, not Delta's command
        assert _rows(spark, ours) == _rows(spark, theirs)
        assert counts[ours] == counts[theirs]
        assert applied_commit(spark, ours, APP_ID, 10 + run) == counts[theirs]
        metrics = spark.sql(f"DESCRIBE HISTORY delta.`{ours}`").orderBy(F.desc("version")).first()["operationMetrics"]
        marked += int(metrics["numTargetDeletionVectorsAdded"]) + int(metrics["numTargetDeletionVectorsUpdated"])
        again = merge(spark, ours, source, whole, truncated=truncated and run == 0, app_id=APP_ID, version=10 + run,
                      metadata={"to_lsn": 10 + run})
        assert again == {"inserted": 0, "updated": 0, "deleted": 0}
        source.unpersist()
    assert marked > 0
    assert deltalog.row_count(spark, ours) == len(_rows(spark, theirs))


def test_merge_listed_marks_rows_of_large_files_and_rewrites_small_or_mostly_changed_ones(
        spark: Any, tmp_path: Path, monkeypatch: Any) -> None:
    spec = TableSpec("keyed", ("id",), ("id", "v"))
    path = str(tmp_path / "marked")
    for version, ids in ((1, range(0, 20)), (2, range(20, 40))):  # two files of 20 rows
        append(path, spark.createDataFrame([(i, f"v{i}") for i in ids], "id int, v string").coalesce(1), spec,
               app_id=APP_ID, version=version, metadata={"to_lsn": version}, create=version == 1)
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES (delta.enableDeletionVectors = true)")
    schema = "_action string, id int, v string"

    def run(version: int, rows: list[tuple]) -> dict[str, str]:
        counts = merge(spark, path, spark.createDataFrame(rows, schema), spec, truncated=False, app_id=APP_ID,
                       version=version, metadata={"to_lsn": version})
        history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy(F.desc("version")).first()
        assert json.loads(history["userMetadata"])["pgoutput_spark"]["to_lsn"] == version
        return {**{k: str(v) for k, v in counts.items()}, **history["operationMetrics"]}

    monkeypatch.setattr(merging, "MARK_MIN_FILE_BYTES", 0)
    # Large files: the rows updated or deleted marked in them, the updated rows written anew.
    first = run(10, [("upsert", 2, "two"), ("delete", 3, None), ("delete", 26, None), ("upsert", 99, "new")])
    assert (first["updated"], first["deleted"], first["inserted"]) == ("1", "2", "1")
    assert (first["numTargetFilesRemoved"], first["numTargetRowsCopied"]) == ("0", "0")
    assert (first["numTargetDeletionVectorsAdded"], first["numTargetFilesAdded"]) == ("2", "1")
    # Again in a file that has a vector: the vector updated; a file whose rows the MERGE mostly
    # changes is rewritten, its vector with it. (Delta's history counts an updated vector as one
    # added and one removed too, as for its own MERGE.)
    rows = [("delete", i, None) for i in range(27, 39)] + [("upsert", 4, "four")]
    second = run(11, rows)
    assert [second[f"numTargetDeletionVectors{k}"] for k in ("Updated", "Added", "Removed")] == ["1", "1", "2"]
    assert (second["numTargetFilesRemoved"], second["numTargetRowsCopied"]) == ("1", "7")  # 20-25, 39
    expected = {i: f"v{i}" for i in range(40)} | {2: "two", 4: "four", 99: "new"}
    for gone in (3, 26, *range(27, 39)):
        expected.pop(gone)
    assert _rows(spark, path) == sorted(expected.items(), key=repr)
    assert deltalog.row_count(spark, path) == len(expected)
    files = deltalog.checksum_files(deltalog.snapshot_now(spark, path), deletion_vectors=True)
    assert sum(1 for a in files if a.deletionVector() is not None) == 1
    # Files under MARK_MIN_FILE_BYTES (16 MiB): rewritten, as with deletion vectors off.
    monkeypatch.undo()
    third = run(12, [("upsert", 1, "one")])
    assert (third["numTargetFilesRemoved"], third["numTargetDeletionVectorsRemoved"]) == ("1", "1")
    assert third["numTargetDeletionVectorsAdded"] == "0"
    assert _rows(spark, path) == sorted((expected | {1: "one"}).items(), key=repr)
    files = deltalog.checksum_files(deltalog.snapshot_now(spark, path), deletion_vectors=True)
    assert not any(a.deletionVector() is not None for a in files)
    # A redone run: nothing.
    assert merge(spark, path, spark.createDataFrame(rows, schema), spec, truncated=False, app_id=APP_ID,
                 version=11, metadata={"to_lsn": 11}) == {"inserted": 0, "updated": 0, "deleted": 0}


def test_a_keyed_merge_matches_only_in_files_whose_key_statistics_meet_the_source_keys(
        spark: Any, tmp_path: Path, monkeypatch: Any) -> None:
    # Files read only where their statistics' range of the key meets the keys looked for: by the
    # MERGE's match (`_pruned`) and a run's pre-image (`read_current` with ``ranges``). Mirrors
    # under PRUNE_MIN_BYTES (64 MiB) are read whole; here every mirror is large enough.
    from pgoutput_spark.mirroring.listed import read_current

    spec = TableSpec("keyed", ("id",), ("id", "v"))
    path = str(tmp_path / "ranges")
    for version, ids in enumerate((range(0, 10), range(10, 20), range(20, 30)), start=1):  # a file each
        append(path, spark.createDataFrame([(i, f"v{i}") for i in ids], "id int, v string").coalesce(1), spec,
               app_id=APP_ID, version=version, metadata={"to_lsn": version}, create=version == 1)
    snapshot = deltalog.snapshot_now(spark, path)
    files = sorted(deltalog.checksum_files(snapshot),  # by their smallest id (under its physical name)
                   key=lambda a: [v for v in json.loads(a.stats())["minValues"].values() if isinstance(v, int)])
    schema = deltalog.table_schema(snapshot)  # physical names too
    source_schema = "_action string, id int, v string"

    def pruned(keys: list[int]) -> list[int]:
        source = spark.createDataFrame([("upsert", k, "x") for k in keys], source_schema)
        return [files.index(a) for a in merging._pruned(files, source, spec, schema)]

    assert merging._pruned(files, spark.createDataFrame([("upsert", 12, "x")], source_schema), spec,
                           schema) == files  # under PRUNE_MIN_BYTES: no aggregate, every file
    monkeypatch.setattr(deltalog, "PRUNE_MIN_BYTES", 0)
    assert pruned([12, 15]) == [1]
    assert pruned([5, 25]) == [0, 1, 2]  # one range over all three
    assert pruned([19, 20]) == [1, 2]
    assert pruned([100, -3]) == [0, 1, 2]
    assert pruned([100]) == [] and pruned([]) == []
    # A history's MERGE: the files of the current versions its close rows end (not its new versions').
    closing = spark.createDataFrame([("close", 12, None), ("version", 12, "x"), ("version", 25, "y")], source_schema)
    assert [files.index(a) for a in merging._pruned(files, closing, spec, schema, history=True)] == [1]
    assert [files.index(a) for a in merging._pruned(files, closing, spec, schema)] == [1, 2]
    # A string key, in its order ("v15" between "v0" and "v9"); one file: every file.
    assert [files.index(a) for a in merging._pruned(files, spark.createDataFrame([("upsert", 1, "v15")], source_schema),
                                                    TableSpec("keyed", ("v",), ("id", "v")), schema)] == [0, 1]
    assert merging._pruned(files[:1], spark.createDataFrame([("upsert", 15, "x")], source_schema), spec,
                           schema) == files[:1]
    # A pre-image's read: the files that may hold the keys looked for.
    looked_for = spark.createDataFrame([(12,), (15,)], "k int")

    def ranges(listed: list[Any] | None, table: Any, size: int | None) -> Any:
        return deltalog.key_ranges(listed, table, ["id"], lambda: looked_for, ["k"], size=size)

    assert sorted(r["id"] for r in read_current(spark, path, ranges=ranges).collect()) == list(range(10, 20))
    assert read_current(spark, path, ranges=lambda listed, table, size: None).count() == 30
    # And the MERGE: its counts and rows with the files it skipped.
    source = spark.createDataFrame([("upsert", 12, "twelve"), ("delete", 15, None), ("upsert", 31, "new")],
                                   source_schema)
    assert merge(spark, path, source, spec, truncated=False, app_id=APP_ID, version=10,
                 metadata={"to_lsn": 10}) == {"inserted": 1, "updated": 1, "deleted": 1}
    expected = {i: f"v{i}" for i in range(30) if i != 15} | {12: "twelve", 31: "new"}
    assert _rows(spark, path) == sorted(expected.items(), key=repr)
    metrics = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy(F.desc("version")).first()["operationMetrics"]
    assert (metrics["numTargetFilesRemoved"], metrics["numTargetRowsCopied"]) == ("1", "8")


#: A mirror keyed by a date, two timestamps, a string or a decimal (`_typed_rows`).
TYPED = "d date, ts timestamp, ntz timestamp_ntz, s string, dec decimal(20, 6), v string"


def _typed_rows(numbers: Any, v: str = "v") -> list[tuple]:
    """Rows of `TYPED` whose every key grows with ``numbers``: a day, an hour each; timestamps
    with microseconds (Delta's statistics keep milliseconds); strings longer than Delta's
    statistics keep (32 characters), told apart by their first."""
    import datetime as dt
    from decimal import Decimal

    return [(dt.date(2024, 1, 1) + dt.timedelta(days=n),
             dt.datetime(2024, 6, 1) + dt.timedelta(hours=n, microseconds=500),
             dt.datetime(2024, 6, 1) + dt.timedelta(hours=n, microseconds=500),
             f"{n:03d}" + "x" * 40, Decimal(n) + Decimal("0.000001"), v) for n in numbers]


def _lowest(added: Any, schema: T.StructType, column: str) -> Any:
    """A file's statistic of the lowest value of ``column`` (under its physical name)."""
    physical = deltalog.physical_name(schema[column])
    return json.loads(added.stats())["minValues"][physical]


def test_files_are_matched_by_statistics_of_dates_timestamps_strings_and_decimals(
        spark: Any, tmp_path: Path, monkeypatch: Any) -> None:
    # A mirror of a column of each type, in three files of ten rows. The files kept for source
    # keys of each column (the file holding a timestamp's last microseconds too, cut from its
    # statistics), then a MERGE keyed by all five that skips files, against Delta's own MERGE.
    monkeypatch.setattr(deltalog, "PRUNE_MIN_BYTES", 0)
    keys = ("d", "ts", "ntz", "s", "dec")
    spec = TableSpec("keyed", keys, (*keys, "v"))
    paths = {name: str(tmp_path / name) for name in ("ours", "theirs")}
    for path in paths.values():
        for version, numbers in enumerate((range(0, 10), range(10, 20), range(20, 30)), start=1):
            append(path, spark.createDataFrame(_typed_rows(numbers), TYPED).coalesce(1), spec, app_id=APP_ID,
                   version=version, metadata={"to_lsn": version}, create=version == 1)
    snapshot = deltalog.snapshot_now(spark, paths["ours"])
    schema = deltalog.table_schema(snapshot)
    files = sorted(deltalog.checksum_files(snapshot), key=lambda a: _lowest(a, schema, "d"))

    def source(actions: list[tuple[str, int]], v: str = "new") -> Any:
        rows = {n: row for n, row in zip([n for _, n in actions], _typed_rows([n for _, n in actions], v))}
        return spark.createDataFrame([(action, *rows[n]) for action, n in actions], f"_action string, {TYPED}")

    for key in keys:
        one = TableSpec("keyed", (key,), spec.columns)

        def pruned(numbers: list[int]) -> list[int]:
            return [files.index(a) for a in merging._pruned(files, source([("upsert", n) for n in numbers]), one,
                                                            schema)]

        assert pruned([12, 15]) == [1], key
        assert pruned([9]) == [0], key  # 9 hours and 500 microseconds: its file's statistic says 9 hours
        assert pruned([5, 25]) == [0, 1, 2], key
        assert pruned([100]) == [] and pruned([-5]) == [], key
        # Delta's reader given the ranges as a predicate (`ranges_filter`): the rows in them.
        found = deltalog.key_ranges(files, schema, (key,), lambda: source([("upsert", 12), ("upsert", 15)]),
                                    [f"`{key}`"])
        within = spark.read.format("delta").load(paths["ours"]).where(deltalog.ranges_filter(found, schema))
        assert sorted(r["d"] for r in within.collect()) == [row[0] for row in _typed_rows(range(12, 16))], key
        # A key of another kind in the source than in the mirror: not compared, every file.
        other = spark.createDataFrame([("upsert", True)], "_action string, d boolean").withColumnRenamed("d", key)
        assert merging._pruned(files, other, TableSpec("keyed", (key,), (key,)), schema) == files, key
    # Strings of another collation than Spark's binary one, floating point: not compared.
    assert deltalog._kind(T.StringType("UTF8_LCASE")) is None and deltalog._kind(T.DoubleType()) is None
    assert deltalog._kind(T.StringType()) == "string"
    # The MERGE: an update and a delete in the second file, an insert; Delta's command the oracle.
    counts = _merged_both(spark, monkeypatch, paths, source([("upsert", 12), ("delete", 15), ("upsert", 40)]), spec)
    assert counts["ours"] == counts["theirs"] == {"inserted": 1, "updated": 1, "deleted": 1}
    assert _rows(spark, paths["ours"]) == _rows(spark, paths["theirs"])
    assert sorted(tuple(r)[:5] for r in spark.read.format("delta").load(paths["ours"]).where("v = 'new'").collect()) \
        == [row[:5] for row in _typed_rows([12, 40])]
    assert _last_metrics(spark, paths["ours"], "numTargetFilesRemoved", "numTargetRowsCopied") == ("1", "8")


def _merged_both(spark: Any, monkeypatch: Any, paths: dict[str, str], net: Any, spec: TableSpec) -> dict[str, Any]:
    """The counts of the MERGE of ``net`` into the two copies of a mirror: ``theirs`` by Delta's
    command (the oracle), ``ours`` by `merge_listed` (asserted: not left to Delta)."""
    results, recorded = _recorded()
    counts = {}
    for name, merge_listed in (("theirs", lambda *a, **k: None), ("ours", recorded)):
        monkeypatch.setattr(merging, "merge_listed", merge_listed)
        counts[name] = merge(spark, paths[name], net, spec, truncated=False, app_id=APP_ID, version=10,
                             metadata={"to_lsn": 10})
    assert results and results[0] is not None
    return counts


def _last_metrics(spark: Any, path: str, *names: str) -> tuple[str, ...]:
    """The metrics ``names`` of the table's last commit, as Delta's history shows them."""
    metrics = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy(F.desc("version")).first()["operationMetrics"]
    return tuple(metrics[name] for name in names)


def test_a_multiset_is_matched_by_statistics_of_its_identity_columns_without_nulls(
        spark: Any, tmp_path: Path, monkeypatch: Any) -> None:
    # A multiset (identity: every column) in three files. The files kept for its deletes' rows:
    # by the columns in which none is null (nulls match nulls, which statistics leave out), none
    # for a run of inserts alone; a pre-image's read likewise; a MERGE against Delta's own.
    from pgoutput_spark.mirroring.listed import read_current

    monkeypatch.setattr(deltalog, "PRUNE_MIN_BYTES", 0)
    spec = TableSpec("multiset", ("a", "b", "c"), ("a", "b", "c"))
    paths = {name: str(tmp_path / name) for name in ("ours", "theirs")}
    mirror = [(n, None if n % 3 == 0 else n * 10, f"c{n:02d}") for n in range(30)]
    for path in paths.values():
        for version, part in enumerate((mirror[0:10], mirror[10:20], mirror[20:30]), start=1):
            append(path, spark.createDataFrame(part * 2, "a int, b int, c string").coalesce(1), spec,  # duplicates
                   app_id=APP_ID, version=version, metadata={"to_lsn": version}, create=version == 1)
    snapshot = deltalog.snapshot_now(spark, paths["ours"])
    schema = deltalog.table_schema(snapshot)
    files = sorted(deltalog.checksum_files(snapshot), key=lambda a: _lowest(a, schema, "c"))
    layout = "_action string, a int, b int, c string"

    def pruned(rows: list[tuple]) -> list[int]:
        return [files.index(a) for a in merging._pruned(files, spark.createDataFrame(rows, layout), spec, schema)]

    assert pruned([("delete_all", 13, 130, "c13")]) == [1]
    assert pruned([("delete_all", 13, 130, "c13"), ("delete_all", 15, None, "c15")]) == [1]  # by a and c
    assert pruned([("delete_all", None, None, "c25"), ("delete_all", 3, None, None)]) == [0, 1, 2]  # no column left
    assert pruned([("delete_all", None, 250, "c25")]) == [2]
    assert pruned([("insert", 13, 130, "c13")]) == []  # inserts match nothing
    # The pre-image's read: the rows of the files that may hold the identities looked up.
    looked_for = spark.createDataFrame([(13, 130, "c13"), (18, None, "c18")], "k0 int, k1 int, k2 string")

    def ranges(listed: list[Any] | None, table: Any, size: int | None) -> Any:
        return deltalog.key_ranges(listed, table, spec.key, lambda: looked_for, ["k0", "k1", "k2"], size=size)

    assert sorted({r["a"] for r in read_current(spark, paths["ours"], ranges=ranges).collect()}) == list(range(10, 20))
    # A MERGE that deletes both copies of two rows, inserts one back and another row: the
    # second file rewritten, the others skipped; Delta's command the oracle.
    net = spark.createDataFrame([("delete_all", 13, 130, "c13"), ("insert", 13, 130, "c13"),
                                 ("delete_all", 15, None, "c15"), ("insert", 31, None, "c31")], layout)
    counts = _merged_both(spark, monkeypatch, paths, net, spec)
    assert counts["ours"] == counts["theirs"] == {"inserted": 2, "updated": 0, "deleted": 4}
    expected = sorted([r for r in mirror if r[0] not in (13, 15)] * 2 + [(13, 130, "c13"), (31, None, "c31")],
                      key=repr)
    assert _rows(spark, paths["ours"]) == _rows(spark, paths["theirs"]) == expected
    assert _last_metrics(spark, paths["ours"], "numTargetFilesRemoved", "numTargetRowsCopied") == ("1", "16")


def test_a_table_whose_checksum_lists_no_files_is_read_and_merged_by_delta_within_the_keys_ranges(
        spark: Any, tmp_path: Path, monkeypatch: Any) -> None:
    # A mirror whose checksum lists no files (Delta lists up to 50; here up to 2) is read and
    # merged by Delta's own reader and MERGE, given a predicate on the keys' ranges whose data
    # skipping reads only the files that may hold them: with the first file moved away, the
    # pre-image's read and the MERGE still work. A keyed mirror and a history.
    from pgoutput_spark.mirroring.history import HISTORY_NAMES, merge_history
    from pgoutput_spark.mirroring.listed import read_current

    monkeypatch.setattr(deltalog, "PRUNE_MIN_BYTES", 0)
    spec = TableSpec("keyed", ("id",), ("id", "v"))
    path = str(tmp_path / "unlisted")
    spark.conf.set("spark.databricks.delta.allFilesInCrc.thresholdNumFiles", "2")
    try:
        for version, ids in enumerate((range(0, 10), range(10, 20), range(20, 30)), start=1):
            append(path, spark.createDataFrame([(i, f"v{i}") for i in ids], "id int, v string").coalesce(1), spec,
                   app_id=APP_ID, version=version, metadata={"to_lsn": version}, create=version == 1)
    finally:
        spark.conf.unset("spark.databricks.delta.allFilesInCrc.thresholdNumFiles")
    snapshot = deltalog.snapshot_now(spark, path)
    assert deltalog.checksum_files(snapshot, deletion_vectors=True) is None and deltalog.table_bytes(snapshot)
    schema = deltalog.table_schema(snapshot)
    first = Path(path) / sorted(p.name for p in Path(path).glob("*.parquet")
                                if {r[0] for r in spark.read.parquet(str(p)).collect()} == set(range(10)))[0]
    aside = tmp_path / "aside.parquet"
    first.rename(aside)  # read it, and Delta's reader fails
    try:
        looked_for = spark.createDataFrame([(12,), (15,)], "k int")

        def ranges(listed: list[Any] | None, table: Any, size: int | None) -> Any:
            return deltalog.key_ranges(listed, table, ["id"], lambda: looked_for, ["k"], size=size)

        # The rows in the keys' range (the pre-image then joins them to the keys).
        assert sorted(r["id"] for r in read_current(spark, path, ranges=ranges).collect()) == [12, 13, 14, 15]
        source = spark.createDataFrame([("upsert", 12, "twelve"), ("delete", 15, None), ("upsert", 31, "new")],
                                       "_action string, id int, v string")
        predicate = merging.delta_ranges(spark, path, source, spec)
        assert predicate is not None and "12" in str(predicate) and "31" in str(predicate)
        assert merge(spark, path, source, spec, truncated=False, app_id=APP_ID, version=10,
                     metadata={"to_lsn": 10}) == {"inserted": 1, "updated": 1, "deleted": 1}
    finally:
        aside.rename(first)
    expected = {i: f"v{i}" for i in range(30) if i != 15} | {12: "twelve", 31: "new"}
    assert _rows(spark, path) == sorted(expected.items(), key=repr)
    assert deltalog.ranges_filter([], schema) is not None  # nothing looked for: false
    assert spark.read.format("delta").load(path).where(deltalog.ranges_filter([], schema)).count() == 0
    # A history: its MERGE within the ranges of the keys its closes end.
    import datetime as dt

    history = str(tmp_path / "history")
    whole = TableSpec("keyed", ("id",), ("id", "v", *HISTORY_NAMES))
    at = dt.datetime(2026, 1, 1)
    spark.conf.set("spark.databricks.delta.allFilesInCrc.thresholdNumFiles", "2")
    try:
        for version, ids in enumerate((range(0, 10), range(10, 20), range(20, 30)), start=1):
            rows = [(i, f"v{i}", 1, None, at, None, True, 1) for i in ids]
            append(history, spark.createDataFrame(rows, f"id int, v string, {HISTORY.split(', ', 2)[2]}").coalesce(1),
                   whole, app_id=APP_ID, version=version, metadata={"to_lsn": version}, create=version == 1)
    finally:
        spark.conf.unset("spark.databricks.delta.allFilesInCrc.thresholdNumFiles")
    first = Path(history) / sorted(p.name for p in Path(history).glob("*.parquet")
                                   if {r[0] for r in spark.read.parquet(str(p)).collect()} == set(range(10)))[0]
    first.rename(aside)
    try:
        run = spark.createDataFrame([("close", 21, None, None, 5, None, at, False, None),
                                     ("version", 21, "new", 5, None, at, None, True, 7),
                                     ("version", 3, "three", 5, None, at, None, True, 8)],  # a version, not matched
                                    f"_action string, id int, v string, {HISTORY.split(', ', 2)[2]}")
        assert merge_history(spark, history, run, TableSpec("keyed", ("id",), ("id", "v")), app_id=APP_ID,
                             version=10, metadata={"to_lsn": 10}) == {"versions": 2, "closed": 1}
    finally:
        aside.rename(first)
    current = {(r["id"], r["v"]) for r in spark.read.format("delta").load(history).where("_is_current").collect()}
    assert current == {(i, f"v{i}") for i in range(30) if i != 21} | {(21, "new"), (3, "three")}
