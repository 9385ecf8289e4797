"""Delta tables read and changed over the files their checksum lists: the target's own tables
(the lease, ``pending``) and mirrors read as of a version (a run's pre-image, `verify`),
without the Spark jobs in which Delta's reader and commands reconstruct a table's state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from py4j.java_gateway import JavaClass
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..spark.connect import is_connect
from ..spark.jvm import jvm_class
from .deltalog import (
    DELTA,
    Ranges,
    active,
    checksum_files,
    file_location,
    file_operations,
    files_in_ranges,
    files_of,
    listed_files,
    partition_names,
    partition_values,
    ranges_filter,
    register_metrics,
    scala_seq,
    snapshot_now,
    table_bytes,
    table_schema,
)
from .names import path_table, quote

_log = logging.getLogger(__name__)


def read_current(spark: SparkSession, path: str, *, ranges: Ranges | None = None) -> DataFrame:
    """The Delta table at ``path`` as of its version now (`deltalog.latest_version`), not "the latest":
    Spark and Delta plan every cached frame that reads a table's latest version again after each
    write to that table (Delta's file listing jobs), and a run caches frames that read the
    tables it then writes (the pending rows it saves back, a mirror's pre-image).

    Where that version's checksum lists the table's files (Delta 4.0 does for up to 50 files:
    `checksum_files`), Delta's reader reads those files as they are listed (`files_of`: column
    mapping, type widening, partition values, deletion vectors as Delta reads them), without
    the Spark jobs in which Delta reconstructs a new version's state to find them: a small
    mirror's rows for two keys, read after each of a series of commits to it (as a run's
    pre-image and `slot.verify` read mirrors), 0.28 s against 0.58 s with Delta's reader of
    the version (ad hoc, warm, 2 cores). Otherwise Delta's reader of that version. In a
    Spark Connect session, which reaches no JVM, Delta's reader of the version its history names
    newest.

    ``ranges``: for a caller that then looks up rows by key (a run's pre-image), given the
    listed files (None: none listed), the table's schema (its Delta metadata's) and size, the
    ranges of the keys looked for (`deltalog.key_ranges`), or None: only the files that may hold
    them are read (`deltalog.files_in_ranges`; by Delta's reader, the rows in the ranges,
    `deltalog.ranges_filter`, which its data skipping reads from the files that may hold them).
    """
    if is_connect(spark):
        newest = spark.sql(f"DESCRIBE HISTORY {path_table(path)} LIMIT 1").select("version").collect()[0][0]
        return spark.read.format("delta").option("versionAsOf", int(newest)).load(path)
    return _read_version(spark, path, snapshot_now(spark, path), ranges)


def _read_version(spark: SparkSession, path: str, snapshot: Any, ranges: Ranges | None = None) -> DataFrame:
    """`read_current` of the table at ``path`` as of ``snapshot`` (Delta's, brought up to date)."""
    files = checksum_files(snapshot, deletion_vectors=True)
    if files is None:
        rows = spark.read.format("delta").option("versionAsOf", int(snapshot.version())).load(path)
        if ranges is None:
            return rows
        schema = table_schema(snapshot)
        found = ranges(None, schema, table_bytes(snapshot))
        return rows if found is None else rows.where(ranges_filter(found, schema))
    if ranges is not None:
        found = ranges(files, table_schema(snapshot), None)
        if found is not None:
            files = files_in_ranges(files, found)
    with active(spark) as jvm:
        return files_of(spark, jvm, snapshot, files)


def read_listed(spark: SparkSession, path: str) -> DataFrame:
    """`read_current`, for a table that Delta's protocol lets any Parquet reader read (reader
    version 1: no deletion vectors, no column mapping) and whose version's checksum file lists
    its files (Delta 4.0 keeps the list of a table of up to 50 files there): the Parquet files
    listed (`listed_files`), without the Spark jobs in which Delta's reader reconstructs the
    table's state to find them (three, 0.2-0.3 s on 2 cores, for each read of a table of the
    target's own). Any other table: `read_current`.

    A table the caller then changes with Delta's own commands gains nothing: they reconstruct
    the state to find their files (Delta's reader leaves it in Delta's cache for them). The
    target's lease and ``pending`` are changed over the same listed files instead
    (`update_listed`, `delete_listed`, `delta.txn_append`'s overwrite with ``replaced``).

    In a Spark Connect session, which reaches no JVM: `read_current` (Delta's reader of the
    version now, as here)."""
    if is_connect(spark):
        return read_current(spark, path)
    snapshot = snapshot_now(spark, path)
    listed = listed_files(spark, snapshot)
    if listed is not None:
        return _files_frame(spark, snapshot, listed)
    return _read_version(spark, path, snapshot)


def update_listed(spark: SparkSession, path: str, condition: str, assignments: dict[str, str]) -> int | None:
    """``UPDATE path SET assignments WHERE condition`` (Spark SQL expressions) on a table
    `read_listed` reads as the Parquet files its checksum lists: one Delta transaction that
    reads those files, rewrites them with the rows updated and commits that as Delta's UPDATE
    does (operation ``UPDATE``), without the state reconstruction in which Delta's command
    finds the files (four Spark jobs; these tables are of one or a few files, rewritten whole).
    Returns the rows updated (no commit for none); None, having written nothing, where the
    table is not such a table: the caller runs Delta's command. The transaction reads the
    whole table, so Delta fails it with a concurrency error where another commit changed the
    table meanwhile, as it fails Delta's UPDATE."""
    with active(spark) as jvm:
        started = _listed_transaction(spark, jvm, path, "Update")
        if started is None:
            return None
        txn, snapshot, update, listed = started
        frame = _files_frame(spark, snapshot, listed)
        schema = frame.schema
        unknown = set(assignments) - set(schema.names)
        if unknown:
            raise ValueError(f"no column {sorted(unknown)} in {path}")
        matched = F.expr(condition)
        rows = frame.where(matched).count()
        if rows == 0:
            return 0
        updated = frame.select(*[
            F.when(matched, F.expr(assignments[f.name]).cast(f.dataType)).otherwise(F.col(quote(f.name))).alias(f.name)
            if f.name in assignments else F.col(quote(f.name)) for f in schema.fields])
        actions = txn.writeFiles(updated._jdf)
        for added in listed:
            actions = actions.appended(added.remove())
        predicate = spark._jsparkSession.sessionState().sqlParser().parseExpression(condition)
        txn.commit(actions, update(jvm_class(jvm, "scala.Option").apply(predicate)))
        return rows


def delete_listed(spark: SparkSession, path: str, predicate: str,
                  deleted: Callable[[dict[str, str | None]], bool]) -> bool | None:
    """``DELETE FROM path WHERE predicate``, a predicate on partition columns only, which
    ``deleted`` tests on a file's partition values (Delta's strings), on a table `read_listed`
    reads as its checksum's files: one Delta transaction that removes the files of the partitions
    it matches, committed as Delta's DELETE (operation ``DELETE``), without the state
    reconstruction in which Delta's command finds them. True: files removed; False: none
    matched (no commit); None, having written nothing, where the table is not such a table
    (the caller runs Delta's command). The transaction reads the whole table, so Delta fails it
    where another commit removed files meanwhile."""
    with active(spark) as jvm:
        started = _listed_transaction(spark, jvm, path, "Delete")
        if started is None:
            return None
        txn, snapshot, delete, listed = started
        partitions = partition_names(snapshot.metadata())
        removed = [added for added in listed if deleted(partition_values(added, partitions))]
        if not removed:
            return False
        # The metrics of Delta's DELETE of whole partitions, its rows counted from the files' statistics.
        records = [added.numLogicalRecords() for added in removed]
        counts = {"numRemovedFiles": len(removed), "numRemovedBytes": sum(int(added.size()) for added in removed),
                  "numDeletedRows": sum(int(n.get()) for n in records) if all(n.isDefined() for n in records) else 0,
                  **dict.fromkeys(("numCopiedRows", "numAddedFiles", "numAddedBytes", "numAddedChangeFiles",
                                   "numDeletionVectorsAdded", "numDeletionVectorsRemoved", "numDeletionVectorsUpdated",
                                   "scanTimeMs", "rewriteTimeMs", "executionTimeMs"), 0)}
        register_metrics(spark, jvm, txn, None, counts)
        parsed = spark._jsparkSession.sessionState().sqlParser().parseExpression(predicate)
        txn.commit(scala_seq(jvm, [added.remove() for added in removed]), delete(scala_seq(jvm, [parsed])))
        return True


def _listed_transaction(spark: SparkSession, jvm: Any, path: str,
                        operation: str) -> tuple[Any, Any, Any, list[Any]] | None:
    """A Delta transaction on the table at ``path`` that has read the whole table (any file
    another commit removes or adds meanwhile fails its commit), its snapshot, the class of
    Delta's ``operation`` (``DeltaOperations.<operation>``) and the files its checksum lists
    (`listed_files`); None where there is no table, no such list, or no such class."""
    try:
        txn = jvm_class(jvm, f"{DELTA}.DeltaLog").forTable(spark._jsparkSession, path).startTransaction()
        snapshot = txn.snapshot()
        recorded = jvm_class(jvm, f"{DELTA}.DeltaOperations${operation}")
        if snapshot.version() < 0 or not isinstance(recorded, JavaClass):
            return None
        listed = listed_files(spark, snapshot)
    except Exception as exc:  # py4j's: a Delta without these members
        _log.debug("%s of %s through Delta's command: %s", operation, path, exc)
        return None
    if listed is None:
        return None
    txn.readWholeTable()
    return txn, snapshot, recorded, listed


def _files_frame(spark: SparkSession, snapshot: Any, listed: list[Any]) -> DataFrame:
    """The rows of the ``listed`` files (`listed_files`) of the snapshot's table: each file's
    Parquet columns by the table's schema, its partition values as literals."""
    metadata = snapshot.metadata()
    schema = table_schema(snapshot)
    partitions = partition_names(metadata)
    if not listed:
        return spark.createDataFrame([], schema)
    root, operations = snapshot.deltaLog().dataPath().toString(), file_operations(spark)
    groups: dict[tuple[str | None, ...], list[str]] = {}
    for added in listed:
        key = tuple(partition_values(added, partitions).values())
        groups.setdefault(key, []).append(file_location(operations, root, added))
    data = T.StructType([f for f in schema.fields if f.name not in partitions])
    frames = []
    for key, locations in groups.items():
        values = dict(zip(partitions, key))
        frame = spark.read.schema(data).parquet(*locations)
        frames.append(frame.select(*[
            F.lit(values[f.name]).cast(f.dataType).alias(f.name) if f.name in values else F.col(quote(f.name))
            for f in schema.fields]))
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    return out
