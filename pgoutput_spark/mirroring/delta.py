"""Writes to Delta tables other than a mirror's MERGE (`merge`): appends under Delta's
transaction identifiers (a mirror's first rows, inserts into a multiset, the target's own
tables), a table replaced whole, and the upkeep of the target's own tables (compaction,
vacuum).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from py4j.java_gateway import JavaClass
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ..spark.jvm import jvm_class
from ..spark.session import copy_session
from .deltalog import (
    DELTA,
    active,
    checksum_txn_version,
    file_count,
    listed_files,
    partition_names,
    partition_values,
    set_transaction,
    user_metadata,
)
from .names import path_table, quote
from .net import TableSpec
from .schema import PROPERTIES

_log = logging.getLogger(__name__)


def append(path: str, source: DataFrame, spec: TableSpec, *, app_id: str, version: int,
           metadata: dict[str, Any], create: bool = False) -> None:
    """Append ``source``'s rows to the mirror at ``path``: what a MERGE would do when no row can match.

    For a mirror this run creates and for a multiset receiving only inserts.
    Idempotent like `merge` (same transaction identifiers, metadata). With
    ``create`` the append creates the mirror (schema: ``source``'s, properties:
    `PROPERTIES`) in the same commit, even with no rows.
    """
    writer = (source.select(*[F.col(quote(c)) for c in spec.columns]).write.format("delta").mode("append")
              .option("txnAppId", app_id).option("txnVersion", version)
              .option("userMetadata", user_metadata(metadata, app_id)))
    _with_properties(writer, create).save(path)


def _with_properties(writer: Any, new_table: bool) -> Any:
    """``writer`` giving a table it creates `PROPERTIES` (Delta takes "delta.*" writer options
    as a new table's properties)."""
    if new_table:
        for key, value in PROPERTIES.items():
            writer = writer.option(key, value)
    return writer


def _schema_merging_writer(frame: DataFrame, mode: str = "append") -> Any:
    """A Delta writer of ``frame`` that merges new columns into the table's schema."""
    return frame.write.format("delta").mode(mode).option("mergeSchema", "true")


def append_rows(frame: DataFrame, path: str) -> None:
    """Append ``frame`` to the Delta table at ``path`` (created by the first append), merging new
    columns into its schema: the pipeline's own records (runs, snapshots), rewritten by no retry."""
    _schema_merging_writer(frame).save(path)


def txn_append(frame: DataFrame, path: str, app_id: str, version: int, *, new_table: bool = False,
               replace_where: str | None = None, partition_by: tuple[str, ...] = (),
               replaced: Callable[[dict[str, str | None]], bool] | None = None) -> None:
    """Append ``frame`` to the Delta table at ``path``, merging new columns into its schema, under
    Delta's transaction identifiers (a redone run writes nothing twice). ``new_table``: the
    write creates the table, with `PROPERTIES`. ``replace_where``: the same commit deletes the
    rows matching this predicate (which ``frame``'s rows must match too: Delta's ``replaceWhere``).
    ``partition_by``: the table's partition columns, for a write that creates it (an existing
    table keeps its own: see `deltalog.partition_columns`). ``replaced``: ``replace_where`` as a test of a
    file's partition values (Delta's strings) where it is a predicate on partition columns only;
    with it, a table `listed.read_listed` reads as its checksum's files has those files removed by the
    checked append's transaction (`_append_checked_by_checksum`)."""
    if not new_table and (replace_where is None or replaced is not None) and \
            _append_checked_by_checksum(frame, path, app_id, version, replace_where, replaced):
        return
    writer = (_schema_merging_writer(frame, "append" if replace_where is None else "overwrite")
              .option("txnAppId", app_id).option("txnVersion", version))
    if replace_where is not None:
        writer = writer.option("replaceWhere", replace_where)
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    _with_properties(writer, new_table).save(path)


def _append_checked_by_checksum(frame: DataFrame, path: str, app_id: str, version: int,
                                replace_where: str | None = None,
                                replaced: Callable[[dict[str, str | None]], bool] | None = None) -> bool:
    """`txn_append`'s plain append to an existing table whose columns and types ``frame`` has:
    one Delta transaction that reads ``app_id``'s last version in the table's checksum file,
    writes the rows and commits them with that transaction identifier, as Delta's writer does
    with ``txnAppId`` / ``txnVersion``. Delta 4.0's writer reads the identifier from a
    reconstruction of the table's whole state instead (``Snapshot.transactions``: three more
    Spark jobs and about 0.5 s an append on 2 cores), though the checksum holds the table's
    identifiers (up to 100). The identifier is registered as read, so Delta fails a concurrent
    commit of the same one, as it fails the writer's. False, having written nothing, where this
    does not apply (a new table, a checksum without the identifiers, other columns or types, a
    Delta whose classes differ): the caller uses the writer.

    With ``replaced`` (see `txn_append`), the files of the partitions it matches are removed in
    the same commit, an overwrite recorded as the writer records ``replaceWhere``'s, where the
    checksum lists the table's files (`listed_files`; otherwise False); the transaction then
    reads the whole table, so Delta fails it where another commit changed files meanwhile."""
    with active(frame.sparkSession) as jvm:
        return _checked_append(jvm, frame, path, app_id, version, replace_where, replaced)


def _checked_append(jvm: Any, frame: DataFrame, path: str, app_id: str, version: int,
                    replace_where: str | None = None,
                    replaced: Callable[[dict[str, str | None]], bool] | None = None) -> bool:
    """`_append_checked_by_checksum` in the frame's session."""
    try:
        txn = jvm_class(jvm, f"{DELTA}.DeltaLog").forTable(frame.sparkSession._jsparkSession, path).startTransaction()
        snapshot = txn.snapshot()
        if snapshot.version() < 0:
            return False
        done = checksum_txn_version(snapshot, app_id)
        schema = json.loads(snapshot.metadata().schema().json())
        write = jvm_class(jvm, f"{DELTA}.DeltaOperations$Write")
        entry = jvm_class(jvm, f"{DELTA}.actions.SetTransaction")
        if not isinstance(write, JavaClass) or not isinstance(entry, JavaClass):
            raise LookupError("no DeltaOperations.Write or SetTransaction class")
    except Exception as exc:  # py4j's: a Delta without these members
        _log.debug("appending to %s through Delta's writer: %s", path, exc)
        return False
    if done is None or _shape(schema) != _shape(frame.schema.jsonValue()):
        return False
    removed = []
    if replace_where is not None:
        assert replaced is not None
        listed = listed_files(frame.sparkSession, snapshot)
        if listed is None:
            return False
        partitions = partition_names(snapshot.metadata())
        removed = [added for added in listed if replaced(partition_values(added, partitions))]
        txn.readWholeTable()  # as Delta's overwrite reads the partitions it replaces
    txn.readTxn().addOne(app_id)  # as `txnVersion` records it, for Delta's check of concurrent commits
    if done >= version:
        return True  # committed before (a redone run): as the writer, nothing
    actions = txn.writeFiles(frame._jdf)
    for added in removed:
        actions = actions.appended(added.remove())
    option = jvm_class(jvm, "scala.Option")
    none = option.empty()
    save = jvm_class(jvm, "org.apache.spark.sql.SaveMode")
    operation = write(save.Append, none, none, none) if replace_where is None else \
        write(save.Overwrite, option.apply(snapshot.metadata().partitionColumns()), option.apply(replace_where), none)
    txn.commit(actions.appended(set_transaction(jvm, entry, app_id, version)), operation)
    return True


def _shape(schema: Any) -> Any:
    """A schema's JSON without nullability and field metadata: what an append must match."""
    if isinstance(schema, dict):
        return {k: _shape(v) for k, v in schema.items()
                if k not in ("nullable", "containsNull", "valueContainsNull", "metadata")}
    if isinstance(schema, list):
        return [_shape(v) for v in schema]
    return schema


def txn_replace(frame: DataFrame, path: str, app_id: str, version: int, *,
                partition_by: tuple[str, ...] = ()) -> None:
    """Replace the Delta table at ``path`` by ``frame``: its rows, schema and partition columns
    (``partition_by``), in one commit under Delta's transaction identifiers. ``frame`` may read
    the table itself (Delta reads the version it had)."""
    (frame.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
     .option("txnAppId", app_id).option("txnVersion", version).partitionBy(*partition_by).save(path))


#: The files an append-only table of the target's own (``_runs``, ``_pgoutput/relations``, ...)
#: may hold before a run compacts it: each run appends a file, and every read lists and opens
#: them all (``status`` over a ``_runs`` of 3,000 files: about 7 s, compacted: 0.6 s;
#: `benchmarks/ledger_growth.py`). 50 is also where Delta stops keeping a table's file list in
#: its checksum (`deltalog.row_count`).
LEDGER_MAX_FILES = 50


def compact_files(spark: SparkSession, path: str, max_files: int | None = None, *, adding: int = 0) -> bool:
    """``OPTIMIZE`` the Delta table at ``path`` when its checksum counts more than ``max_files``
    files (`LEDGER_MAX_FILES` by default) with the ``adding`` files a write about to follow will
    add; return whether it did. The rows stay as they are, and so do the table's transaction
    identifiers."""
    files = file_count(spark, path)
    if files is None or files + adding <= (LEDGER_MAX_FILES if max_files is None else max_files):
        return False
    spark.sql(f"OPTIMIZE {path_table(path)}").collect()
    return True


def vacuum_files(spark: SparkSession, path: str) -> int:
    """Delete the files of the Delta table at ``path`` that none of its versions within the
    table's retention (``delta.deletedFileRetentionDuration``, 7 days by default) reads; return
    how many.

    For the target's own tables, which runs rewrite (the lease and ``pending`` once a run)
    or compact: each rewrite leaves the old file behind, hundreds of thousands of small files
    after months of runs every few minutes; the partition folders those files leave empty go
    too. The files are those Delta's ``VACUUM ... DRY RUN``
    lists (the same as its ``VACUUM`` deletes); deleted here because Delta's ``VACUUM`` prints
    a line on the JVM's standard output, which the command line's ``--json`` keeps to one
    JSON object. Delta lists the table's directory in a Spark job of
    ``spark.sql.sources.parallelPartitionDiscovery.parallelism`` tasks, 10,000 by default (40-50 s
    on 2 cores for a small table): here, in a session of its own, as many as Spark's default
    parallelism (about 1.2 s a table on 2 cores).
    """
    from ..spark.files import hadoop

    session = copy_session(spark)  # the listing's parallelism set for this call alone
    session.conf.set("spark.sql.sources.parallelPartitionDiscovery.parallelism",
                     str(max(1, spark.sparkContext.defaultParallelism)))
    names = [name for (name,) in session.sql(f"VACUUM {path_table(path)} DRY RUN").collect()]
    if not names:
        return 0
    _, fs = hadoop(spark, path)  # the table's files are on its file system
    jvm = spark.sparkContext._jvm
    hadoop_path = jvm_class(jvm, "org.apache.hadoop.fs.Path")
    files = [hadoop_path(name) for name in names]
    deleted = sum(bool(fs.delete(file, False)) for file in files)
    # A partitioned table's (``pending``: a partition per run) folders its files left empty, as
    # Delta's VACUUM deletes them; the table's own folder stays.
    table = fs.makeQualified(hadoop_path(path))
    for folder in {file.getParent().toString(): file.getParent() for file in files}.values():
        folder = fs.makeQualified(folder)
        if not folder.equals(table) and fs.exists(folder) and not fs.listStatus(folder):
            fs.delete(folder, False)
    return deleted


def vacuum_tables(spark: SparkSession, paths: list[str]) -> None:
    """`vacuum_files` on each of ``paths``, four at a time. Maintenance: a table it cannot
    vacuum (a file system that refuses a delete, ...) is logged as a warning, and the run
    goes on (its data is committed; the next vacuum tries again)."""
    def vacuum(path: str) -> None:
        try:
            vacuum_files(spark, path)
        except Exception as exc:  # py4j's and Spark's errors alike
            _log.warning("could not vacuum %s: %s", path, str(exc).splitlines()[0] if str(exc) else repr(exc))

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(vacuum, paths))
