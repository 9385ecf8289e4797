"""Delta's log through the driver's JVM: a table's snapshot now, what its checksum file lists
(files, transaction identifiers, row counts), the pieces of a Delta transaction of our own
(`merge.merge_listed`, `listed`, `delta.txn_append`), and what the pipeline's commits record.

Delta 4.0 writes a checksum file beside each commit, listing a table's files (up to 50) with
their statistics and its transaction identifiers: read from there, a table's files, rows and
last applied version cost no Spark job, where Delta's own commands reconstruct the table's
state in three.
"""

from __future__ import annotations

import json
import re
import struct
import time
from collections.abc import Callable, Sequence
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import numpy as np
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..spark.connect import is_connect
from ..spark.jvm import jvm_class
from ..spark.session import one_row
from ..version import __version__
from .names import path_table, quote

#: Delta's package in the JVM.
DELTA = "org.apache.spark.sql.delta"
_PYTHON_UTILS = "org.apache.spark.api.python.PythonUtils"


#: The commit-metadata key under which a run records what it applied.
METADATA_KEY = "pgoutput_spark"


def user_metadata(metadata: dict[str, Any], app_id: str) -> str:
    """A mirror commit's ``userMetadata``: ``metadata`` and ``app_id`` under `METADATA_KEY`, with
    the version of pgoutput-spark that wrote it (``version``)."""
    return json.dumps({METADATA_KEY: {**metadata, "app_id": app_id, "version": __version__}}, sort_keys=True)


def scala_list(items: Any) -> list[Any]:
    """A Scala collection's items."""
    out, found = [], items.iterator()
    while found.hasNext():
        out.append(found.next())
    return out


def register_metrics(session: SparkSession, jvm: Any, txn: Any, operation_metrics: Any,
                     counts: dict[str, int]) -> None:
    """Register ``counts`` with the transaction ``txn`` as its operation's metrics, and as 0 every
    other metric ``operation_metrics`` names (Delta's set of the operation's metric names, or
    None): the metrics its commit records (``DESCRIBE HISTORY``'s ``operationMetrics``)."""
    metrics = jvm_class(jvm, "java.util.HashMap")()
    named = [] if operation_metrics is None else [str(n) for n in scala_list(operation_metrics)]
    for name in [*named, *counts]:
        metric = jvm_class(jvm, "org.apache.spark.sql.execution.metric.SQLMetrics").createMetric(
            session.sparkContext._jsc.sc(), name)
        metric.set(counts.get(name, 0))
        metrics.put(name, metric)
    txn.registerSQLMetrics(session._jsparkSession, jvm_class(jvm, _PYTHON_UTILS).toScalaMap(metrics))


def set_transaction(jvm: Any, entry: Any, app_id: str, version: int) -> Any:
    """Delta's ``SetTransaction`` action (``entry``: its class) of ``app_id`` at ``version``,
    stamped now as Delta's writer stamps it: milliseconds since the epoch, past 2**31, which py4j
    hands the JVM as a Long, as ``Option[Long]`` holds."""
    return entry(app_id, version, jvm_class(jvm, "scala.Option").apply(int(time.time() * 1000)))


def checksum_txn_version(snapshot: Any, app_id: str) -> int | None:
    """The last version committed under ``app_id`` as the snapshot's checksum file records it
    (-1: none); None where the checksum does not hold the table's transaction identifiers."""
    checksum = snapshot.checksumOpt()
    if not checksum.isDefined() or not checksum.get().setTransactions().isDefined():
        return None
    found = -1
    entries = checksum.get().setTransactions().get().iterator()
    while entries.hasNext():
        entry = entries.next()
        if entry.appId() == app_id:
            found = max(found, int(entry.version()))
    return found


def partition_columns(spark: SparkSession, path: str) -> tuple[str, ...]:
    """The partition columns of the Delta table at ``path`` now (no Spark job)."""
    columns = snapshot_now(spark, path).metadata().partitionColumns()
    return tuple(str(columns.apply(i)) for i in range(columns.size()))


def latest_version(spark: SparkSession, path: str) -> int:
    """The version of the Delta table at ``path`` as the session's Delta log holds it now (brought
    up to date; no Spark job)."""
    return int(snapshot_now(spark, path).version())


def snapshot_now(spark: SparkSession, path: str) -> Any:
    """Delta's snapshot of the table at ``path``, brought up to date (no Spark job)."""
    jvm = spark.sparkContext._jvm
    log = jvm_class(jvm, f"{DELTA}.DeltaLog").forTable(spark._jsparkSession, path)
    none = jvm_class(jvm, "scala.Option").empty()
    return log.update(False, none, none)


def file_count(spark: SparkSession, path: str) -> int | None:
    """The files of the Delta table at ``path`` now, from its version's checksum file (no Spark
    job); None without one (Delta writes one beside each commit unless told not to)."""
    checksum = snapshot_now(spark, path).checksumOpt()
    return int(checksum.get().numFiles()) if checksum.isDefined() else None


def row_count(spark: SparkSession, path: str) -> int:
    """The rows of the Delta table at ``path`` now.

    Delta writes a checksum file beside each commit, and with it, for a table of up to
    ``spark.databricks.delta.allFilesInCrc.thresholdNumFiles`` files (50 by default), every
    file's statistics: the rows come from those (each file's record count less the rows its
    deletion vector removes, as Delta counts them), without a Spark job. A mirror of a few
    thousand rows costs a Spark count about 75 ms of planning and jobs on 2 cores, and
    ``status`` counts every mirror. Without such a checksum (more files, statistics not
    collected, another writer), a count of that version. In a Spark Connect session, which
    reaches no JVM, a count.
    """
    if is_connect(spark):
        return spark.read.format("delta").load(path).count()
    snapshot = snapshot_now(spark, path)
    checksum = snapshot.checksumOpt()
    files = checksum.get().allFiles() if checksum.isDefined() else None
    if files is not None and files.isDefined():
        total = 0
        added = files.get().iterator()
        while added.hasNext():
            records = added.next().numLogicalRecords()
            if records.isEmpty():  # a file written without statistics
                break
            total += int(records.get())
        else:
            return total
    return spark.read.format("delta").option("versionAsOf", int(snapshot.version())).load(path).count()


def files_of(spark: SparkSession, jvm: Any, snapshot: Any, files: list[Any]) -> DataFrame:
    """The rows of ``files`` (``AddFile`` actions of the snapshot's table) as Delta's reader reads
    them (``DeltaLog.createDataFrame``: no state reconstruction, no data skipping), the table's
    columns by its schema."""
    none = jvm_class(jvm, "scala.Option").empty()
    return DataFrame(snapshot.deltaLog().createDataFrame(snapshot, scala_seq(jvm, files), False, none), spark)


def scala_seq(jvm: Any, items: list[Any]) -> Any:
    """A Scala ``Seq`` of JVM objects."""
    out = jvm_class(jvm, "java.util.ArrayList")()
    for item in items:
        out.add(item)
    return jvm_class(jvm, _PYTHON_UTILS).toSeq(out)


class active:
    """``with active(spark) as jvm``: ``spark`` the JVM thread's active session meanwhile (Delta's
    transactions take it from there, as under its writer), the one before put back after."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.jvm = spark.sparkContext._jvm
        self.sessions = jvm_class(self.jvm, "org.apache.spark.sql.SparkSession")

    def __enter__(self) -> Any:
        self.before = self.sessions.getActiveSession()
        self.sessions.setActiveSession(self.spark._jsparkSession)
        return self.jvm

    def __exit__(self, *exc: object) -> None:
        if self.before.isDefined():
            self.sessions.setActiveSession(self.before.get())
        else:
            self.sessions.clearActiveSession()


#: Characters that make Spark's file reader take a path as a glob pattern.
_GLOB = re.compile(r"[{}\[\]*?\\]")
#: Partition column types whose values (Delta's strings) Spark casts back as Delta wrote them.
_PARTITION_TYPES = ("string", "integer", "long", "short", "byte", "boolean", "date")


def listed_files(spark: SparkSession, snapshot: Any) -> list[Any] | None:
    """The ``AddFile`` actions of the snapshot's table as its checksum lists them; None where
    Delta's reader is needed (see `listed.read_listed`; also a partition column of another type than
    `_PARTITION_TYPES`, or a path Spark would take as a glob)."""
    if snapshot.protocol().minReaderVersion() != 1:
        return None
    metadata = snapshot.metadata()
    if str(metadata.format().provider()).lower() != "parquet":
        return None
    fields = {f["name"]: f["type"] for f in json.loads(metadata.schema().json())["fields"]}
    if any(fields.get(name) not in _PARTITION_TYPES for name in partition_names(metadata)):
        return None
    files = checksum_files(snapshot)
    if files is None:
        return None
    root, operations = snapshot.deltaLog().dataPath().toString(), file_operations(spark)
    if any(_GLOB.search(file_location(operations, root, added)) for added in files):
        return None
    return files


def checksum_files(snapshot: Any, *, deletion_vectors: bool = False) -> list[Any] | None:
    """The ``AddFile`` actions of the snapshot's table as its checksum lists them; None where it
    does not, or (unless ``deletion_vectors``) one of them has a deletion vector."""
    checksum = snapshot.checksumOpt()
    listed = checksum.get().allFiles() if checksum.isDefined() else None
    if listed is None or not listed.isDefined():
        return None
    files = scala_list(listed.get())
    if deletion_vectors:
        return files
    return None if any(added.deletionVector() is not None for added in files) else files


def deletion_vector_actions(jvm: Any, log: Any, marked: list[tuple[Any, list[int]]]) -> list[Any]:
    """For each ``AddFile`` of the table of ``log`` (its ``DeltaLog``) with the row indexes (in
    the file, as ``_metadata.row_index`` numbers them) of rows to delete: the actions that delete
    them, as Delta's DML does with deletion vectors on: a ``RemoveFile`` of the file as it was
    and an ``AddFile`` of it with a deletion vector marking them and the rows its vector marked
    already (its statistics' bounds no longer tight); only the ``RemoveFile`` where no row is
    left. The vectors go to one new file in the table's folder (``deletion_vector_<uuid>.bin``,
    Delta's format: `Delta's PROTOCOL.md`, "Deletion Vector Format")."""
    if not marked:
        return []
    dv = f"{DELTA}.deletionvectors"
    store = getattr(jvm_class(jvm, f"{DELTA}.storage.dv.DeletionVectorStore$"), "MODULE$").createInstance(
        log.newDeltaHadoopConf())
    descriptors = getattr(jvm_class(jvm, f"{DELTA}.actions.DeletionVectorDescriptor$"), "MODULE$")
    portable = jvm_class(jvm, f"{dv}.RoaringBitmapArrayFormat").Portable()
    option, root = jvm_class(jvm, "scala.Option"), log.dataPath()
    uid = jvm_class(jvm, "java.util.UUID").randomUUID()
    writer = store.createWriter(store.generateFileNameInTable(store.pathWithFileSystem(root), uid, ""))
    actions: list[Any] = []
    try:
        for added, rows in marked:
            bitmap = _bitmap(jvm, rows)
            if added.deletionVector() is not None:
                bitmap.merge(store.read(added.deletionVector(), root))
            physical = added.numPhysicalRecords()
            if physical.isDefined() and bitmap.cardinality() >= int(physical.get()):
                actions.append(added.remove())  # every row deleted: the file goes
                continue
            written = writer.write(bitmap.serializeAsByteArray(portable))
            vector = descriptors.onDiskWithRelativePath(uid, "", written.length(), bitmap.cardinality(),
                                                        option.apply(written.offset()), option.empty())
            pair = added.removeRows(vector, True, True)  # statistics updated, a data change
            actions += [pair._2(), pair._1()]
    finally:
        writer.close()
    return actions


#: The magic number that opens Delta's portable serialization of a ``RoaringBitmapArray``.
_PORTABLE_BITMAP_ARRAY = 1681511377


def _bitmap(jvm: Any, rows: list[int]) -> Any:
    """Delta's ``RoaringBitmapArray`` of ``rows`` (row indexes under 2**31), built in the JVM from
    one array of bytes (not a py4j call per row): a RoaringBitmap of the indexes, in Delta's
    portable form (its magic number, one 32-bit bitmap, of key 0)."""
    values = np.asarray(rows, dtype=np.int64)
    if values.size and (values.min() < 0 or values.max() >= 2**31):
        raise ValueError(f"a row index out of a deletion vector's 32-bit range: {values.min()}..{values.max()}")
    order = jvm_class(jvm, "java.nio.ByteOrder").LITTLE_ENDIAN
    buffers = jvm_class(jvm, "java.nio.ByteBuffer")
    ints = jvm_class(jvm, "java.nio.IntBuffer").allocate(int(values.size))
    ints.put(buffers.wrap(bytearray(values.astype("<i4").tobytes())).order(order).asIntBuffer())
    bitmap = jvm_class(jvm, "org.roaringbitmap.RoaringBitmap").bitmapOf(ints.array())
    serialized = buffers.allocate(bitmap.serializedSizeInBytes()).order(order)
    bitmap.serialize(serialized)
    header = struct.pack("<iqi", _PORTABLE_BITMAP_ARRAY, 1, 0)  # the magic number, one bitmap, its key
    return jvm_class(jvm, f"{DELTA}.deletionvectors.RoaringBitmapArray").readFrom(
        bytearray(header + bytes(serialized.array())))


#: A table smaller than this (its listed files together, or its checksum's size) is read whole: an
#: aggregate for the range of the keys looked for costs more than reading its files (`key_ranges`).
PRUNE_MIN_BYTES = 64 * 1024 * 1024
#: Ranges of key values looked for (`key_ranges`): (a column's physical name, its kind (`_kind`),
#: lowest, highest), the values as `_bound` gives a file's statistics of that kind.
KeyRanges = list[tuple[str, str, Any, Any]]

_EPOCH_DAY = date(1970, 1, 1).toordinal()
_EPOCH = datetime(1970, 1, 1)
_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)


def _kind(data_type: T.DataType) -> str | None:
    """How `key_ranges` and `_bound` compare values of a column's type, where files' statistics
    bound them (`files_in_ranges`): ``number`` (integers and decimals, as they are), ``date``
    (days since 1970), ``timestamp`` and ``ntz`` (microseconds since 1970, in UTC and in no time
    zone), ``string`` (by code point: UTF-8's byte order, which Spark's and Delta's statistics
    follow); None for other types (floating point, booleans, binary, nested, strings of another
    collation than Spark's binary one: not compared)."""
    if isinstance(data_type, (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.DecimalType)):
        return "number"
    if isinstance(data_type, T.DateType):
        return "date"
    if isinstance(data_type, T.TimestampType):
        return "timestamp"
    if isinstance(data_type, T.TimestampNTZType):
        return "ntz"
    # Strings of Spark's binary collation only: another one orders and equates them otherwise.
    binary = isinstance(data_type, T.StringType) and getattr(data_type, "collation", "UTF8_BINARY") == "UTF8_BINARY"
    return "string" if binary else None


def _aggregated(kind: str, value: Column) -> Column:
    """A minimum's or maximum's ``value`` as `_looked_for` reads it back: exact, whatever the
    session's time zone (``unix_date``, ``unix_micros``; a timestamp without time zone as text,
    which the driver parses: its years may lie beyond Python's)."""
    if kind == "date":
        return F.unix_date(value)
    if kind == "timestamp":
        return F.unix_micros(value)
    return value.cast("string") if kind == "ntz" else value


def _looked_for(kind: str, value: Any) -> Any:
    """An `_aggregated` value as a range's end, or None where it cannot be one (a timestamp
    without time zone beyond Python's years)."""
    if kind != "ntz":
        return value
    try:
        return (datetime.fromisoformat(value) - _EPOCH) // _MICROSECOND
    except ValueError:
        return None


def _bound(kind: str, value: Any, *, high: bool) -> Any:
    """A file's statistic (``minValues``' or, ``high``, ``maxValues``' value, as parsed from its
    JSON, decimals as `Decimal`) as a bound of its column's values of ``kind`` (`_kind`), or None
    where it is none that `files_in_ranges` can compare (missing, of another type, a date or
    timestamp beyond Python's years). Delta writes strings' bounds already widened where it
    truncated them; timestamps to the millisecond, cut (a file's highest value may be up to
    999 microseconds above its statistic), with their offset from UTC to the minute (the
    offsets of local mean time have seconds): a timestamp's bounds are widened by a minute."""
    if kind == "number":
        return value if isinstance(value, (int, Decimal)) and not isinstance(value, bool) else None
    if not isinstance(value, str):
        return None
    if kind == "string":
        return value
    try:
        if kind == "date":
            return date.fromisoformat(value).toordinal() - _EPOCH_DAY
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    if (moment.tzinfo is None) != (kind == "ntz"):
        return None
    if kind == "ntz":
        micros = (moment - _EPOCH) // _MICROSECOND
        return micros + 999 if high else micros
    micros = (moment - _EPOCH_UTC) // _MICROSECOND
    return micros + 60_000_999 if high else micros - 60_000_000


#: What a reader of a table by its keys (`listed.read_current`) asks for the ranges of the keys it
#: looks up: given the table's listed files (None: its checksum lists none), its schema (Delta's
#: metadata's) and its size (bytes, its checksum's), `key_ranges` or None.
Ranges = Callable[[list[Any] | None, T.StructType, int | None], KeyRanges | None]


def table_schema(snapshot: Any) -> T.StructType:
    """The snapshot's table's schema, from its Delta metadata: with its columns' metadata (their
    physical names under column mapping: `physical_name`)."""
    return T.StructType.fromJson(json.loads(snapshot.metadata().schema().json()))


def physical_name(field: T.StructField) -> str:
    """A column's name in the table's Parquet files and statistics: its physical name under
    column mapping, else its name."""
    return str(field.metadata.get("delta.columnMapping.physicalName", field.name))


def table_bytes(snapshot: Any) -> int | None:
    """The size of the snapshot's table (its files' bytes) as its checksum records it; None without one."""
    checksum = snapshot.checksumOpt()
    return int(checksum.get().tableSizeBytes()) if checksum.isDefined() else None


def key_ranges(files: list[Any] | None, schema: T.StructType, keys: Sequence[str],
               frame: Callable[[], DataFrame], columns: Sequence[str], *, size: int | None = None) -> KeyRanges | None:
    """For `files_in_ranges`: the range of the values looked for in each of the table's ``keys``
    of a type `_kind` knows (``schema``: the table's, from its Delta metadata, with each column's
    physical name), from one aggregate of ``frame()``'s ``columns`` (``columns[i]`` holding values
    of ``keys[i]``, of the same kind: `_kind`); an empty list where ``frame()`` has no row.

    A key for which ``frame()`` has a null (a multiset's identity: nulls match nulls, which
    statistics leave out) or a value of another kind is left out. None, without a Spark job
    where it can tell, where the table's ``files`` (two or more) are smaller than
    `PRUNE_MIN_BYTES` together, or no key is left. ``files`` None: a table whose checksum lists
    none (read or merged by Delta's own reader, its ranges as `ranges_filter`), of ``size`` bytes
    (`table_bytes`; None: unknown, and no ranges)."""
    fields = {f.name: f for f in schema.fields}
    kinds = {i: kind for i, kind in enumerate(_kind(fields[k].dataType) if k in fields else None for k in keys)
             if kind is not None}
    at = list(kinds)
    if files is not None:
        size = sum(int(added.size()) for added in files) if len(files) >= 2 else None
    if not at or size is None or size < PRUNE_MIN_BYTES:
        return None
    looked = frame()
    types = looked.select(*[F.col(columns[i]) for i in at]).schema.fields
    at = [i for i, field in zip(at, types) if _kind(field.dataType) == kinds[i]]
    if not at:
        return None
    row = one_row(looked.agg(F.count(F.lit(1)).alias("n"),
                             *[F.count(F.col(columns[i])).alias(f"v{i}") for i in at],
                             *[_aggregated(kinds[i], F.min(F.col(columns[i]))).alias(f"lo{i}") for i in at],
                             *[_aggregated(kinds[i], F.max(F.col(columns[i]))).alias(f"hi{i}") for i in at]))
    if row["n"] == 0:
        return []  # nothing to look for: no file holds it
    found: KeyRanges = []
    for i in at:
        lo, hi = _looked_for(kinds[i], row[f"lo{i}"]), _looked_for(kinds[i], row[f"hi{i}"])
        if row[f"v{i}"] == row["n"] and lo is not None and hi is not None:
            found.append((physical_name(fields[keys[i]]), kinds[i], lo, hi))
    return found or None


def files_in_ranges(files: list[Any], ranges: KeyRanges) -> list[Any]:
    """Those of ``files`` (``AddFile`` actions) that may hold a row whose every column in
    ``ranges`` (`key_ranges`) is in its range: all but those whose statistics' ``minValues`` or
    ``maxValues`` (bounds, tight or not: `_bound`) of a column lie outside it. A file without
    them for a column is kept; none where ``ranges`` is empty."""
    if ranges == []:
        return []
    kept = []
    for added in files:
        text = added.stats()
        try:
            stats = json.loads(text, parse_float=Decimal) if text else {}
        except ValueError:
            stats = {}
        lows, highs = stats.get("minValues") or {}, stats.get("maxValues") or {}
        if not any(_outside(_bound(kind, lows.get(name), high=False), _bound(kind, highs.get(name), high=True), lo, hi)
                   for name, kind, lo, hi in ranges):
            kept.append(added)
    return kept


def ranges_filter(ranges: KeyRanges, schema: T.StructType, alias: str | None = None) -> Column:
    """The rows whose every column in ``ranges`` (`key_ranges`; ``schema`` the table's, with its
    columns' physical names) is in its range, as a predicate on the table's columns (qualified by
    ``alias``): for Delta's own reader and MERGE, whose data skipping then reads only the files
    whose statistics meet it, as `files_in_ranges` keeps them. False where ``ranges`` is empty."""
    if ranges == []:
        return F.lit(False)
    logical = {physical_name(f): f.name for f in schema.fields}
    out = F.lit(True)
    for name, kind, lo, hi in ranges:
        low, high = _literal(kind, lo), _literal(kind, hi)
        if name in logical and low is not None and high is not None:
            column = F.col(f"{alias}.{quote(logical[name])}" if alias else quote(logical[name]))
            out = out & (column >= low) & (column <= high)
    return out


def _literal(kind: str, value: Any) -> Column | None:
    """A range's end (`key_ranges`) as a literal of its column's type; None where Python's
    dates cannot hold it."""
    if kind in ("number", "string"):
        return F.lit(value)
    try:
        if kind == "date":
            return F.expr(f"DATE '{date.fromordinal(_EPOCH_DAY + value).isoformat()}'")
        if kind == "timestamp":
            return F.expr(f"TIMESTAMP '{(_EPOCH_UTC + value * _MICROSECOND).isoformat(sep=' ')}'")
        return F.expr(f"TIMESTAMP_NTZ '{(_EPOCH + value * _MICROSECOND).isoformat(sep=' ')}'")
    except (OverflowError, ValueError):
        return None


def _outside(low: Any, high: Any, lo: Any, hi: Any) -> bool:
    """Whether a file's bounds ``low`` .. ``high`` (either None: unknown) leave out ``lo`` .. ``hi``."""
    return (high is not None and high < lo) or (low is not None and low > hi)


def partition_names(metadata: Any) -> list[str]:
    columns = metadata.partitionColumns()
    return [str(columns.apply(i)) for i in range(columns.size())]


def partition_values(added: Any, names: list[str]) -> dict[str, str | None]:
    """An ``AddFile``'s partition values (Delta's strings; None for null) by column."""
    values = added.partitionValues()
    return {name: (values.get(name).get() if values.get(name).isDefined() else None) for name in names}


def file_operations(spark: SparkSession) -> Any:
    """Delta's ``DeltaFileOperations`` (for `file_location`), looked up once for a table's files."""
    return jvm_class(spark.sparkContext._jvm, f"{DELTA}.util.DeltaFileOperations")


def file_location(operations: Any, root: str, added: Any) -> str:
    """An ``AddFile``'s file, as Delta resolves its (relative, URI-encoded) path."""
    return str(operations.absolutePath(root, added.path()).toString())


def recorded_commits(spark: SparkSession, path: str, pipeline: str) -> list[tuple[int, int]]:
    """(Delta version, to_lsn) of the commits of ``pipeline`` that record what they applied, oldest first."""
    out = []
    for row in spark.sql(f"DESCRIBE HISTORY {path_table(path)}").select("version", "userMetadata").collect():
        try:
            meta = json.loads(row["userMetadata"] or "{}").get(METADATA_KEY) or {}
        except ValueError:
            continue
        if meta.get("pipeline", pipeline) == pipeline and meta.get("to_lsn") is not None:
            out.append((row["version"], int(meta["to_lsn"])))
    return sorted(out)


def applied_commit(spark: SparkSession, path: str, app_id: str, version: int) -> dict[str, int] | None:
    """Counts of this pipeline's MERGE at ``version`` if the mirror already has it (a redone run)."""
    from ..capture import _is_delta

    if not _is_delta(spark, path):
        return None
    history = spark.sql(f"DESCRIBE HISTORY {path_table(path)} LIMIT 20").select(
        "operation", "userMetadata", "operationMetrics").collect()
    for commit in history:
        if commit["operation"] not in ("MERGE", "WRITE") or not commit["userMetadata"]:
            continue
        try:
            meta = json.loads(commit["userMetadata"]).get(METADATA_KEY, {})
        except ValueError:
            continue
        if meta.get("app_id") == app_id and meta.get("to_lsn", -1) >= version:
            m = commit["operationMetrics"] or {}
            if meta.get("snapshot"):  # a re-snapshot since: the run's changes are in its rows
                return {"inserted": 0, "updated": 0, "deleted": 0}
            if commit["operation"] == "WRITE":  # an append (see `append`)
                return {"inserted": int(m.get("numOutputRows", 0)), "updated": 0, "deleted": 0}
            return {"inserted": int(m.get("numTargetRowsInserted", 0)),
                    "updated": int(m.get("numTargetRowsUpdated", 0)),
                    "deleted": int(m.get("numTargetRowsDeleted", 0))}
    return None
