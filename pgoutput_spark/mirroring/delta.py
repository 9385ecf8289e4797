"""Mirror tables in Delta: where they live, how their schema follows the source, one MERGE per run.

Each source table (relation OID) has one Delta table at
``<root>/<schema>/<table>`` (`mirror_path`). Mirrors are created with column
mapping (so source column names keep any character) and type widening
enabled. Deletion vectors follow the session's Delta defaults (off unless
``spark.databricks.delta.properties.defaults.enableDeletionVectors`` is set,
or the table's property is set later): measured on 2 cores, a MERGE of 60
rows takes 2.4 s with them and 0.9 s without on a 2,000-row mirror, 2.1 s
and 1.3 s on a 2M-row one, and on a 10M-row mirror they only broke even
(`benchmarks/deletion_vectors.py`, `benchmarks/README.md`).

A run's MERGE into a mirror takes the net change of `pgoutput_spark.mirroring.net`
(computed in Spark tasks by `pgoutput_spark.mirroring.rows`) and is idempotent: it
carries the transaction identifier ``txnAppId`` =
``<pipeline>:relation:<oid>``, ``txnVersion`` = the run's applied commit LSN,
and records the run's LSN and seq range as its commit's ``userMetadata``. On a mirror of
up to 50 files it is a Delta transaction of our own (`merge_listed`), otherwise Delta's
MERGE command.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa
from py4j.java_gateway import JavaClass
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from ..assemble.relations import RelationVersion
from ..convert import widens as arrow_widens
from ..decoder.protocol import ReplicaIdentity
from ..errors import PgoutputSparkError
from ..spark.files import is_uri
from ..spark.jvm import jvm_class
from ..spark.session import copy_session, release, temporary_conf
from ..version import __version__
from .history import HISTORY_NAMES
from .net import TableSpec

_log = logging.getLogger(__name__)
_DELTA = "org.apache.spark.sql.delta"  # Delta's package in the JVM
_PYTHON_UTILS = "org.apache.spark.api.python.PythonUtils"
_R = TypeVar("_R")

#: Table properties of every mirror.
PROPERTIES = {
    "delta.columnMapping.mode": "name",
    "delta.enableTypeWidening": "true",
}

#: The commit-metadata key under which a run records what it applied.
METADATA_KEY = "pgoutput_spark"


def user_metadata(metadata: dict[str, Any], app_id: str) -> str:
    """A mirror commit's ``userMetadata``: ``metadata`` and ``app_id`` under `METADATA_KEY`, with
    the version of pgoutput-spark that wrote it (``version``)."""
    return json.dumps({METADATA_KEY: {**metadata, "app_id": app_id, "version": __version__}}, sort_keys=True)


class SchemaChangeError(PgoutputSparkError):
    """A source column changed type in a way the mirror's Delta column cannot follow."""


def _segment(name: str) -> str:
    """A path segment for a source name: kept as is but for ``%``, ``/`` and a leading ``_`` or ``.``."""
    out = name.replace("%", "%25").replace("/", "%2F")
    if out[:1] in ("_", "."):
        out = f"%{ord(out[0]):02X}{out[1:]}"
    return out or "%00"


DEFAULT_TABLE_PATH = "{root}/{schema}/{table}"
DEFAULT_HISTORY_PATH = "{root}/_history/{schema}/{table}"


def mirror_path(root: str, namespace: str, name: str, template: str = DEFAULT_TABLE_PATH) -> str:
    """Where the mirror of ``namespace.name`` lives (``template``: see `ApplyConfig.table_path`)."""
    return absolute_path(template.format(root=root.rstrip("/"), schema=_segment(namespace),
                                         table=_segment(name)))


def absolute_path(path: str) -> str:
    """A local path made absolute, a URI (``s3a://...``, ``file:/...``) as given.

    Delta's SQL on a path (``UPDATE delta.`out/demo/...```) rejects a relative
    one, so every path the jobs write to is made absolute first (relative to
    the working directory, as Spark reads it).
    """
    return path if is_uri(path) else os.path.abspath(path)


def path_table(path: str) -> str:
    """The Delta table at ``path`` as a Spark SQL table name, ``delta.`path```: a source name
    in a mirror's path may hold a backtick, doubled here as Spark SQL quotes it."""
    return f"delta.{quote(path)}"


def catalog_name(template: str, namespace: str, name: str) -> tuple[str, ...]:
    """The catalog name of a mirror, as its parts: each dot-separated part of ``template`` filled
    in with the source names, every character but letters, digits and ``_`` made ``_``, in
    lower case (what Spark's session catalog accepts and how it keeps names)."""
    schema, table = (re.sub(r"[^A-Za-z0-9_]", "_", n) for n in (namespace, name))
    return tuple(part.format(schema=schema, table=table).lower() for part in template.split("."))


def identifier(parts: tuple[str, ...]) -> str:
    """A catalog name as a Spark SQL identifier."""
    return ".".join(quote(part) for part in parts)


class CatalogError(PgoutputSparkError):
    """A mirror's catalog name is taken by a table somewhere else."""


def _location(path: str) -> str:
    path = path.rstrip("/")
    if path.startswith("file:"):
        path = "/" + path[len("file:"):].lstrip("/")
    return path


def catalog_registered(spark: SparkSession, name: tuple[str, ...], path: str) -> bool:
    """Whether ``name`` is the mirror at ``path`` already; `CatalogError` if it is another table."""
    table = identifier(name)
    if not spark.catalog.tableExists(table):
        return False
    location = spark.sql(f"DESCRIBE DETAIL {table}").select("location").first()
    where = location[0] if location is not None else None
    if where is None or _location(where) != _location(path):
        raise CatalogError(f"catalog table {table} exists at {where}, not at the mirror's location "
                           f"{path}; nothing was written. Drop it, or choose another apply.table_name")
    return True


def register(spark: SparkSession, name: tuple[str, ...], path: str) -> None:
    """Name the mirror at ``path`` in the catalog (an external Delta table), with its database."""
    if len(name) > 1:
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {identifier(name[:-1])}")
    spark.sql(f"CREATE TABLE IF NOT EXISTS {identifier(name)} USING delta LOCATION {sql_literal(path)}")


def sql_literal(value: Any) -> str:
    """A value as a Spark SQL literal: NULL, an integer, or a quoted string."""
    if value is None:
        return "NULL"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def quote(name: str) -> str:
    """A column name as a Spark SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def table_spec(version: RelationVersion, columns: list[str]) -> TableSpec:
    """Keyed by the replica identity's columns, or a multiset when the identity is the whole row."""
    key = version.key_columns
    if version.replica_identity is ReplicaIdentity.FULL or not key:
        identity = key if key else tuple(c.name for c in version.columns)
        return TableSpec("multiset", tuple(identity), tuple(columns))
    return TableSpec("keyed", key, tuple(columns))


# -- schema -------------------------------------------------------------------------------------

def widens(old: T.DataType, new: T.DataType) -> bool:
    """Whether Delta's type widening turns a column of type ``old`` into ``new`` (`convert.widens`)."""
    if old == new:
        return True
    try:
        return arrow_widens(_arrow_of(old), _arrow_of(new))
    except TypeError:  # a type with no Arrow form (a column someone else added): not ours to widen
        return False


@dataclass(frozen=True)
class SchemaPlan:
    """What a run does to a mirror's schema before merging, decided before anything is written."""

    path: str
    exists: bool
    columns: list[tuple[str, pa.DataType]]  # the types the run's rows are converted to
    add: list[T.StructField]
    widen: list[T.StructField]

    @property
    def changes(self) -> bool:
        return not self.exists or bool(self.add or self.widen)


def plan_schema(spark: SparkSession, path: str, table: str, columns: list[tuple[str, pa.DataType]], *,
                remedy: str | None = None, overwrite: bool = False,
                carried: Collection[str] | None = None) -> SchemaPlan:
    """Compare the source's columns with the mirror's; raise `SchemaChangeError` if they cannot meet.

    A column whose source type narrowed keeps the mirror's wider type (values
    are converted to it); one that widened is widened in Delta; any other type
    change is an error naming the table, column and both types, and ``remedy``
    (default: a re-snapshot of the table). Columns of the Delta table that are
    not in ``columns`` are left alone. With ``overwrite`` (a re-snapshot that
    replaces the mirror's rows and columns) the mirror's types do not matter.
    ``carried``, if given, names the columns the run's rows can carry: another
    column of ``columns`` (dropped in the source before the run's first change)
    is planned only where the mirror has it (its values there become NULL as
    rows change), never added (a re-snapshot after the drop left it out).
    """
    from ..capture import _is_delta

    exists = _is_delta(spark, path)
    existing = ({f.name: f.dataType for f in spark.read.format("delta").load(path).schema.fields}
                if exists and not overwrite else {})
    if carried is not None:
        columns = [(name, arrow) for name, arrow in columns if name in carried or name in existing]
    wanted = from_arrow_schema(pa.schema(columns), prefer_timestamp_ntz=True)
    if not exists or overwrite:
        _check_case_collisions(table, path, [name for name, _ in columns])
        return SchemaPlan(path, exists, columns, [] if exists else list(wanted.fields), [])
    if remedy is None:
        remedy = (f"Re-snapshot the table (pgoutput-spark snapshot --table {table} ...): it overwrites the "
                  f"mirror, rows and columns, and the apply goes on from there")
    _check_case_collisions(table, path, [*existing, *(n for n, _ in columns if n not in existing)])
    add, widen, out = [], [], []
    for (name, arrow), field in zip(columns, wanted.fields):
        have = existing.get(name)
        if have is None:
            add.append(field)
        elif have != field.dataType:
            if widens(have, field.dataType):
                widen.append(field)
            elif widens(field.dataType, have):
                arrow = _arrow_of(have)
            else:
                raise SchemaChangeError(
                    f"{table}: column {name!r} changed type from {have.simpleString()} to "
                    f"{field.dataType.simpleString()}, which the Delta table at {path} cannot widen "
                    f"to; nothing was written. {remedy}")
        out.append((name, arrow))
    return SchemaPlan(path, True, out, add, widen)


def _check_case_collisions(table: str, path: str, names: list[str]) -> None:
    """Delta keeps column names case-insensitively unique; PostgreSQL does not ("id" and "Id")."""
    seen: dict[str, str] = {}
    for name in names:
        other = seen.setdefault(name.casefold(), name)
        if other != name:
            raise SchemaChangeError(
                f"{table}: columns {other!r} and {name!r} differ only in case, which a Delta table "
                f"cannot hold (Delta column names are case-insensitive); nothing was written to {path}. "
                f"Leave one out of the publication with a column list, or rename it in the source")


def _arrow_of(data_type: T.DataType) -> pa.DataType:
    from pyspark.sql.pandas.types import to_arrow_type

    return to_arrow_type(data_type)


def apply_schema(spark: SparkSession, plan: SchemaPlan) -> None:
    """Create the mirror, or add and widen its columns (each a Delta commit, idempotent in effect)."""
    from delta.tables import DeltaTable

    if not plan.exists:
        builder = DeltaTable.createIfNotExists(spark).location(plan.path).addColumns(
            T.StructType(plan.add))
        for key, value in PROPERTIES.items():
            builder = builder.property(key, value)
        builder.execute()
        return
    target = path_table(plan.path)
    if plan.add:
        columns = ", ".join(f"{quote(f.name)} {f.dataType.simpleString()}" for f in plan.add)
        spark.sql(f"ALTER TABLE {target} ADD COLUMNS ({columns})")
    for field in plan.widen:
        name, data_type = quote(field.name), field.dataType
        while isinstance(data_type, T.ArrayType):  # Delta widens an array's elements, not the array
            name, data_type = f"{name}.element", data_type.elementType
        spark.sql(f"ALTER TABLE {target} ALTER COLUMN {name} TYPE {data_type.simpleString()}")


# -- merge ------------------------------------------------------------------------------------------


class MirrorConflictError(PgoutputSparkError):
    """A commit by another writer changed a mirror's rows or schema while a run merged into it."""


#: Operations that rewrite a table's files without changing its rows (``dataChange`` false):
#: a MERGE that lost to one of them is retried on the table as they left it.
REWRITES = frozenset({"OPTIMIZE", "REORG"})
MERGE_ATTEMPTS = 4

_CONFLICTING = re.compile(r"Conflicting commit: (\{.*\})")
_CONCURRENCY = re.compile(r"Concurrent\w*Exception|MetadataChangedException|ProtocolChangedException")


def conflicting_operation(exc: Exception) -> str | None:
    """The operation of the commit a Delta concurrency error names ("OPTIMIZE", "UPDATE", ...);
    None for another error. An unreadable one is "an unknown operation"."""
    text = str(exc)
    if not _CONCURRENCY.search(f"{type(exc).__name__} {text[:2000]}"):
        return None
    found = _CONFLICTING.search(text)
    try:
        return str(json.loads(found.group(1))["operation"]) if found else "an unknown operation"
    except (ValueError, KeyError, TypeError):
        return "an unknown operation"


def execute_merge(session: SparkSession, run: Callable[[], _R], *, path: str, app_id: str, version: int,
                  metadata: dict[str, Any]) -> _R:
    """Run the MERGE ``run()`` makes and executes as one idempotent commit: Delta's transaction
    identifier and our metadata.

    A MERGE that loses to a concurrent rewrite of the table's files (`REWRITES`: a scheduled
    ``OPTIMIZE``, auto compaction, ``REORG``) is built again and retried, up to `MERGE_ATTEMPTS`
    attempts: the rows it read are the rows the rewrite kept. One that loses to a commit that
    changed rows or the schema (an ``UPDATE`` behind the pipeline's back) raises `MirrorConflictError`:
    nothing of it was written, and a re-run redoes the run's slice.
    """
    settings = {
        # The source is persisted by the caller and deterministic: Delta need not materialize it again.
        "merge.materializeSource": "none",
        "write.txnAppId": app_id,
        "write.txnVersion": str(version),
        "commitInfo.userMetadata": user_metadata(metadata, app_id),
    }
    with temporary_conf(session, {f"spark.databricks.delta.{key}": value for key, value in settings.items()}):
        for attempt in range(1, MERGE_ATTEMPTS + 1):
            try:
                return run()
            except Exception as exc:
                operation = conflicting_operation(exc)
                if operation is None:
                    raise
                if operation not in REWRITES or attempt == MERGE_ATTEMPTS:
                    what = ("kept rewriting its files" if operation in REWRITES else
                            "changed its rows or schema (a writer other than this pipeline, whose "
                            "runs take turns by its lease)")
                    raise MirrorConflictError(
                        f"{path}: a concurrent {operation} commit {what} while this run merged into "
                        f"it ({attempt} attempt(s)); this MERGE wrote nothing. Re-run: the run redoes "
                        f"its slice") from exc
                _log.info("%s: a concurrent %s rewrote its files during the MERGE: retrying (%d)",
                          path, operation, attempt)
        raise AssertionError("unreachable")


def merge(session: SparkSession, path: str, source: DataFrame, spec: TableSpec, *, truncated: bool,
          app_id: str, version: int, metadata: dict[str, Any]) -> dict[str, int]:
    """One idempotent MERGE of ``source`` (net rows without ``skipped``) into the mirror at ``path``:
    `merge_listed` where the mirror is a table of the files its checksum lists, otherwise Delta's."""
    from delta.tables import DeltaTable

    values = {quote(c): f"s.{quote(c)}" for c in spec.columns}
    on = merge_condition(spec)

    def run() -> dict[str, int]:  # on the table as it is now (see `execute_merge`)
        counts = merge_listed(session, path, source, spec, truncated=truncated, app_id=app_id, version=version)
        if counts is not None:
            return counts
        target = DeltaTable.forPath(session, path).alias("t")
        if spec.mode == "keyed":
            builder = (target.merge(source.alias("s"), on)
                       .whenMatchedDelete("s._action = 'delete'")
                       .whenMatchedUpdate("s._action = 'upsert'", values)
                       .whenNotMatchedInsert("s._action = 'upsert'", values))
        else:
            builder = (target.merge(source.alias("s"), on)
                       .whenMatchedDelete()
                       .whenNotMatchedInsert("s._action = 'insert'", values))
        result = (builder.whenNotMatchedBySourceDelete() if truncated else builder).execute()
        row = result.first() if result is not None else None
        if row is None:  # committed before (a redone run): Delta's MERGE does nothing
            return {"inserted": 0, "updated": 0, "deleted": 0}
        return {"inserted": row["num_inserted_rows"], "updated": row["num_updated_rows"],
                "deleted": row["num_deleted_rows"]}

    return execute_merge(session, run, path=path, app_id=app_id, version=version, metadata=metadata)


#: A mirror `merge_listed` finds with more files than this also has its small files rewritten
#: (`_compacted`): each run adds a file or two, and past 50 files Delta's checksum no longer lists
#: them (the MERGE is then Delta's command, and reads of the mirror find its files by Spark jobs).
MERGE_MAX_FILES = 32
#: `merge_listed` writes up to this many inserted rows of a keyed mirror as one file.
ONE_FILE_INSERTS = 1_000_000
#: A file smaller than this is small (`MERGE_MAX_FILES`).
SMALL_FILE_BYTES = 16 * 1024 * 1024


def _compacted(files: list[Any], touched: list[Any]) -> list[Any]:
    """The mirror's small files (`SMALL_FILE_BYTES`) that ``touched`` lacks, where the mirror
    has more than `MERGE_MAX_FILES` files: `merge_listed` rewrites them too, their rows as they
    are, as ``OPTIMIZE`` would (once every thirty runs or so, in which a few MiB are rewritten)."""
    if len(files) <= MERGE_MAX_FILES:
        return []
    rewritten = {str(added.path()) for added in touched}
    return [added for added in files if str(added.path()) not in rewritten and int(added.size()) < SMALL_FILE_BYTES]


def merge_condition(spec: TableSpec, *, history: bool = False) -> str:
    """The MERGE's condition: the key's columns equal (keyed), or a ``delete_all`` row whose
    identity columns equal the mirror row's, nulls equal to nulls (a multiset); a history's: a
    ``close`` row whose key is a current version's (`history.merge_history`)."""
    if history:
        return " AND ".join(["s._action = 'close'", "t._is_current",
                             *[f"t.{quote(k)} = s.{quote(k)}" for k in spec.key]])
    if spec.mode == "keyed":
        return " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in spec.key)
    return " AND ".join(["s._action = 'delete_all'", *[f"t.{quote(k)} <=> s.{quote(k)}" for k in spec.key]])


#: Table features whose tables `merge_listed` writes as Delta's MERGE would: those of a mirror
#: (`PROPERTIES`), the ones every writer supports, those that only change how the log is kept,
#: and those a property turns on, which `merge_listed` checks is off (change data feed, deletion
#: vectors). Any other (row tracking, generated or identity columns, clustering, check
#: constraints, Iceberg compatibility, ...) leaves the MERGE to Delta.
LISTED_MERGE_FEATURES = frozenset({
    "appendOnly", "invariants", "columnMapping", "typeWidening", "typeWidening-preview", "timestampNtz",
    "changeDataFeed", "deletionVectors", "domainMetadata", "v2Checkpoint", "vacuumProtocolCheck",
    "inCommitTimestamp",
})


def merge_listed(session: SparkSession, path: str, source: DataFrame, spec: TableSpec, *, truncated: bool,
                 app_id: str, version: int, history: bool = False) -> dict[str, int] | None:
    """`merge`'s MERGE as one Delta transaction of our own, on a mirror whose checksum lists its
    files (Delta 4.0 keeps the list for tables of up to 50 files), none with deletion vectors,
    whose table features are `LISTED_MERGE_FEATURES` and which has deletion vectors, change data
    feed and row tracking off. The counts of rows inserted, updated
    and deleted, or None, having written nothing, where Delta's MERGE is needed: another table,
    or a ``source`` with two rows for one key.

    What Delta's MERGE does, without its reconstruction of the table's state (three Spark jobs)
    and with two Spark jobs where it has about ten: one joins the mirror's key columns, read
    with the file each row is in, to ``source``, counting the rows each action matches and
    listing the files they are in (a multiset: a third counts its rows to insert); the other
    rewrites those files (Delta's reader and writer: column mapping, type widening) with the
    matched rows updated or deleted, plus the rows to insert. Both join the mirror's rows to
    the source's on the mirror's side, broadcasting the source where it is small, where Delta's
    rewrite shuffles every row of the files it rewrites (10,000 random-key changes into a
    10M-row mirror: 8.4 s against 13.3 s, `benchmarks/apply.py`). The commit removes the files
    rewritten, carries the transaction identifier (``app_id``, ``version``, checked in the
    checksum as `_checked_append` does) and is recorded as Delta's MERGE, with its condition,
    clauses and row counts. The transaction reads the whole table: Delta fails it where another
    commit changed the table meanwhile (`execute_merge` retries it after a rewrite of files).
    A commit that changes the table's schema (a run's new column or wider type) leaves the list
    of files out of its checksum, so the MERGE right after it is Delta's command (whose commit
    writes the list again).

    ``history``: the MERGE of a history table (`history.merge_history`; ``spec`` keyed, not
    ``truncated``): ``close`` rows end the current version of their key (its ``_valid_to_lsn``,
    ``_valid_to_ts`` and ``_is_current`` set), ``version`` rows are inserted; the counts are
    ``inserted`` (versions) and ``updated`` (versions closed).
    """
    assert not (history and (truncated or spec.mode != "keyed"))
    columns = [*spec.columns, *HISTORY_NAMES] if history else list(spec.columns)
    with _active(session) as jvm:
        try:
            log = jvm_class(jvm, f"{_DELTA}.DeltaLog").forTable(session._jsparkSession, path)  # type: ignore[attr-defined]
            txn = log.startTransaction()
            snapshot = txn.snapshot()
            operation = jvm_class(jvm, f"{_DELTA}.DeltaOperations$Merge")
            clause = jvm_class(jvm, f"{_DELTA}.DeltaOperations$MergePredicate")
            entry = jvm_class(jvm, f"{_DELTA}.actions.SetTransaction")
            if snapshot.version() < 0 or not all(isinstance(c, JavaClass) for c in (operation, clause, entry)):
                return None
            done = _checksum_txn_version(snapshot, app_id)
            files = _checksum_files(snapshot)
            protocol = snapshot.protocol()
            features = {str(f.name()) for f in _scala_list(protocol.implicitlyAndExplicitlySupportedFeatures())}
            configuration = snapshot.metadata().configuration()
            # Deletion vectors on: Delta's MERGE marks rows deleted where this would rewrite files.
            enabled = [key for key in ("delta.enableChangeDataFeed", "delta.appendOnly", "delta.enableRowTracking",
                                       "delta.enableDeletionVectors")
                       if configuration.get(key).isDefined() and str(configuration.get(key).get()).lower() == "true"]
            schema = T.StructType.fromJson(json.loads(snapshot.metadata().schema().json()))
        except Exception as exc:  # py4j's: a Delta without these members
            _log.debug("MERGE into %s by Delta's command: %s", path, exc)
            return None
        if done is None or files is None or enabled or not features <= LISTED_MERGE_FEATURES:
            return None
        names = schema.names
        if not set(columns) <= set(names) or len(set(n.lower() for n in names)) != len(names):
            return None
        txn.readWholeTable()  # any commit meanwhile that adds or removes files fails this one
        txn.readTxn().addOne(app_id)  # as Delta's MERGE registers its transaction identifier
        if done >= version:
            return {"inserted": 0, "updated": 0, "deleted": 0}  # committed before: as Delta's MERGE, nothing
        root, operations = snapshot.deltaLog().dataPath().toString(), _file_operations(session)
        by_location = {_file_location(operations, root, added): added for added in files}
        none = jvm_class(jvm, "scala.Option").empty()

        def rows_of(added: list[Any]) -> DataFrame:  # the mirror's rows in these files, its columns numbered
            frame = _files_of(session, jvm, snapshot, added)
            return frame.select(*[F.col(quote(n)).alias(f"t{i}") for i, n in enumerate(names)])

        matched = _matched(rows_of(files), source, spec, names, history=history)
        if matched is None:
            return None
        counts, located, flagged = matched
        try:
            touched = files if truncated else [
                by_location.get(str(operations.absolutePath(root, name).toString())) for name in located]
            if any(added is None for added in touched):
                _log.debug("MERGE into %s by Delta's command: a file read is not in its checksum", path)
                return None
            touched = [*touched, *_compacted(files, touched)]
            records = [added.numLogicalRecords() for added in touched]
            rewritten = sum(int(n.get()) for n in records if n.isDefined())
            if truncated:  # every file rewritten: its rows are the mirror's
                if not all(n.isDefined() for n in records):
                    return None  # no statistics: Delta's MERGE counts the rows it deletes
                counts["deleted"] += rewritten - counts["updated"] - counts["deleted"]
            actions = txn.writeFiles(_merged(rows_of(touched), source, flagged, spec, schema, truncated,
                                             counts["inserted"], history=history)._jdf)
        finally:
            if flagged is not None:
                release(flagged)
        added_files = _scala_list(actions)
        for added in touched:
            actions = actions.appended(added.remove())
        actions = actions.appended(_set_transaction(jvm, entry, app_id, version))
        n_source, matched_deleted = counts.pop("source"), counts.pop("matched_deleted")
        _register_metrics(session, jvm, txn, jvm_class(jvm, f"{_DELTA}.DeltaOperationMetrics").MERGE(), {
            "numSourceRows": n_source, "operationNumSourceRows": n_source,  # the latter: what history shows
            "numTargetRowsInserted": counts["inserted"], "numTargetRowsNotMatchedInserted": counts["inserted"],
            "numTargetRowsUpdated": counts["updated"], "numTargetRowsMatchedUpdated": counts["updated"],
            "numTargetRowsDeleted": counts["deleted"], "numTargetRowsMatchedDeleted": matched_deleted,
            "numTargetRowsNotMatchedBySourceDeleted": counts["deleted"] - matched_deleted,
            "numTargetRowsCopied": max(rewritten - counts["updated"] - counts["deleted"], 0),
            "numOutputRows": max(rewritten - counts["deleted"], 0) + counts["inserted"],
            "numTargetFilesRemoved": len(touched), "numTargetFilesAdded": len(added_files),
            "numTargetBytesRemoved": sum(int(a.size()) for a in touched),
            "numTargetBytesAdded": sum(int(a.size()) for a in added_files)})
        parser = session._jsparkSession.sessionState().sqlParser()  # type: ignore[attr-defined]
        some = jvm_class(jvm, "scala.Option").apply
        if history:
            matched_clauses = [clause(none, "update")]
            inserted_clauses = [clause(some("s._action = 'version'"), "insert")]
        elif spec.mode == "keyed":
            matched_clauses = [clause(some("s._action = 'delete'"), "delete"),
                               clause(some("s._action = 'upsert'"), "update")]
            inserted_clauses = [clause(some("s._action = 'upsert'"), "insert")]
        else:
            matched_clauses = [clause(none, "delete")]
            inserted_clauses = [clause(some("s._action = 'insert'"), "insert")]
        by_source = [clause(none, "delete")] if truncated else []
        condition = merge_condition(spec, history=history)
        txn.commit(actions, operation(some(parser.parseExpression(condition)), none, none, none,
                                      _seq(jvm, matched_clauses), _seq(jvm, inserted_clauses),
                                      _seq(jvm, by_source)))
        return counts


def _matched(target: DataFrame, source: DataFrame, spec: TableSpec, names: list[str], *,
             history: bool = False) -> tuple[dict[str, int], list[str], DataFrame | None] | None:
    """`merge_listed`'s first job: the rows the MERGE inserts, updates and deletes among the
    mirror's (``target``: its columns ``t<i>``, as named ``names``), the source's rows (key
    ``source``), the files the matched rows are in and, keyed, the source's rows flagged with
    the file of the mirror row they match (``file``, null for none; cached: the caller
    releases it); None where a source row's key is another's (Delta's MERGE fails then, or
    updates a mirror's duplicates: its call).

    The mirror's keys are joined to the source's (the smaller side, which Spark broadcasts where
    it is small), not the source's rows to every mirror row: no shuffle of the mirror.

    ``history``: the current versions the ``close`` rows end (the updated rows, their files)
    and the ``version`` rows (inserted); None where two ``close`` rows have one key (Delta's
    MERGE fails where both match a version)."""
    keys = [names.index(k) for k in spec.key]
    if history:
        current = target.where(F.col(f"t{names.index('_is_current')}"))
        return _history_matched(current.select(*[F.col(f"t{i}") for i in keys], F.input_file_name().alias("file")),
                                source, spec)
    t = target.select(*[F.col(f"t{i}") for i in keys], F.input_file_name().alias("file"))
    if spec.mode == "keyed":
        s = _numbered_source(source, spec)
        at = [spec.columns.index(k) for k in spec.key]
        pairs = t.join(s.select(*[f"s{j}" for j in at]), [t[f"t{i}"] == F.col(f"s{j}") for i, j in zip(keys, at)])
        pairs = pairs.select(*[F.col(f"s{j}").alias(f"k{j}") for j in at], "file")
        flagged = s.join(pairs, [s[f"s{j}"] == pairs[f"k{j}"] for j in at], "left").drop(
            *[f"k{j}" for j in at]).persist()
        try:
            hit = F.col("file").isNotNull()
            upsert, delete = F.col("a") == "upsert", F.col("a") == "delete"
            row = flagged.agg(
                F.count(F.lit(1)).alias("rows"),
                F.count_distinct(*[F.col(f"s{j}") for j in at]).alias("keys"),
                F.sum(F.when(hit & upsert, 1).otherwise(0)).alias("updated"),
                F.sum(F.when(~hit & upsert, 1).otherwise(0)).alias("inserted"),
                F.sum(F.when(hit & delete, 1).otherwise(0)).alias("deleted"),
                F.collect_set(F.when(hit, F.col("file"))).alias("files")).first()
            assert row is not None
        except BaseException:
            release(flagged)
            raise
        # Each source row matches one mirror row at most, and no two have one key: as many rows
        # flagged as keys (a key with a null column, never a replica identity's, counts none).
        if row["keys"] != row["rows"]:
            release(flagged)
            return None
        counts = {"inserted": row["inserted"] or 0, "updated": row["updated"] or 0,  # sums of no row: null
                  "deleted": row["deleted"] or 0, "matched_deleted": row["deleted"] or 0, "source": row["rows"]}
        return counts, list(row["files"]), flagged
    gone = source.where(F.col("_action") == "delete_all").select(*_source_keys(spec))
    deleted = t.join(gone, [t[f"t{i}"].eqNullSafe(gone[f"s{j}"]) for j, i in enumerate(keys)], "left_semi")
    row = deleted.agg(F.count(F.lit(1)).alias("deleted"), F.collect_set("file").alias("files")).first()
    assert row is not None
    sizes = {r["_action"]: r["n"] for r in source.groupBy("_action").agg(F.count(F.lit(1)).alias("n")).collect()}
    return ({"inserted": sizes.get("insert", 0), "updated": 0, "deleted": row["deleted"],
             "matched_deleted": row["deleted"], "source": sum(sizes.values())}, list(row["files"]), None)


def _history_matched(current: DataFrame, source: DataFrame,
                     spec: TableSpec) -> tuple[dict[str, int], list[str], None] | None:
    """`_matched` of a history: ``current``, the key columns of its current versions and their
    ``file``."""
    is_close = F.col("_action") == "close"
    sizes = source.agg(F.count(F.when(is_close, 1)).alias("closes"),
                       F.count_distinct(*[F.when(is_close, F.col(quote(k))) for k in spec.key]).alias("keys"),
                       F.count(F.when(F.col("_action") == "version", 1)).alias("versions"),
                       F.count(F.lit(1)).alias("rows")).first()
    assert sizes is not None
    if sizes["closes"] != sizes["keys"]:
        return None
    closes = source.where(is_close).select(*_source_keys(spec))
    on = [current[c] == closes[f"s{j}"] for j, c in enumerate(current.columns[:-1])]
    row = current.join(closes, on).agg(F.count(F.lit(1)).alias("updated"),
                                       F.collect_set("file").alias("files")).first()
    assert row is not None
    return ({"inserted": sizes["versions"], "updated": row["updated"], "deleted": 0, "matched_deleted": 0,
             "source": sizes["rows"]}, list(row["files"]), None)


def _source_keys(spec: TableSpec) -> list[Column]:
    """The source's key columns ``spec.key`` as ``s<j>``."""
    return [F.col(quote(k)).alias(f"s{j}") for j, k in enumerate(spec.key)]


def _as_inserted(rows: DataFrame, columns: Sequence[str], schema: T.StructType, *,
                 numbered: bool = False) -> DataFrame:
    """``rows`` (source rows with the values of ``columns``, named as the table's columns or,
    ``numbered``, ``s<j>`` for ``columns[j]`` as `_numbered_source` names them) as the rows an
    insert writes: the table's columns (``schema``) cast to their types, NULL in those
    ``columns`` lacks."""
    def value(name: str) -> Column:
        if name not in columns:
            return F.lit(None)
        return F.col(f"s{columns.index(name)}") if numbered else F.col(quote(name))

    return rows.select(*[value(f.name).cast(f.dataType).alias(f.name) for f in schema.fields])


def _numbered_source(source: DataFrame, spec: TableSpec) -> DataFrame:
    """``source``'s columns ``spec.columns`` as ``s<j>``, its action as ``a``."""
    return source.select(*[F.col(quote(c)).alias(f"s{j}") for j, c in enumerate(spec.columns)],
                         F.col("_action").alias("a"))


def _merged(target: DataFrame, source: DataFrame, flagged: DataFrame | None, spec: TableSpec,
            schema: T.StructType, truncated: bool, inserting: int, *, history: bool = False) -> DataFrame:
    """`merge_listed`'s rows to write: those of ``target`` (the mirror's rows in the files the
    MERGE rewrites, its columns ``t<i>``) as the MERGE leaves them, then those it inserts; the
    mirror's columns (``schema``), ``source``'s values cast to their types. As Delta's MERGE
    does, an update sets ``spec.columns`` and keeps the mirror's other (dropped) columns, and an
    insert leaves those null. ``flagged``: keyed, `_matched`'s source rows, whose upserts that
    match no mirror row are the rows inserted (``inserting`` of them). The mirror's rows are
    joined to the source's (broadcast where small) on their left: no shuffle of the mirror's rows."""
    names = schema.names
    if history:
        return _history_merged(target, source, spec, schema, inserting)
    if spec.mode == "keyed":
        assert flagged is not None
        s = _numbered_source(source, spec)
        on = [target[f"t{names.index(k)}"] == s[f"s{spec.columns.index(k)}"] for k in spec.key]
        upsert = F.col("a") == "upsert"
        # A mirror row no source row matched stays, unless the run truncated the table.
        kept = target.join(s, on, "inner" if truncated else "left").where(upsert | F.col("a").isNull())
        inserted = flagged.where(F.col("file").isNull() & upsert)
        if inserting <= ONE_FILE_INSERTS:  # one file, not one per partition of the source
            inserted = inserted.coalesce(1)
        return kept.select(*[
            F.when(upsert, F.col(f"s{spec.columns.index(f.name)}").cast(f.dataType)).otherwise(F.col(f"t{i}"))
            .alias(f.name) if f.name in spec.columns else F.col(f"t{i}").alias(f.name)
            for i, f in enumerate(schema.fields)]).unionByName(_as_inserted(inserted, spec.columns, schema,
                                                                            numbered=True))
    inserted = _as_inserted(source.where(F.col("_action") == "insert"), spec.columns, schema)
    if truncated:
        return inserted
    gone = source.where(F.col("_action") == "delete_all").select(*_source_keys(spec))
    kept = target.join(gone, [target[f"t{names.index(k)}"].eqNullSafe(gone[f"s{j}"]) for j, k in enumerate(spec.key)],
                       "left_anti")
    return kept.select(*[F.col(f"t{i}").alias(f.name) for i, f in enumerate(schema.fields)]).unionByName(inserted)


#: The columns a history's MERGE sets in the versions it closes, from the ``close`` rows.
_CLOSING = ("_valid_to_lsn", "_valid_to_ts")


def _history_merged(target: DataFrame, source: DataFrame, spec: TableSpec, schema: T.StructType,
                    inserting: int) -> DataFrame:
    """`_merged` of a history: ``target``'s rows with the current versions of the ``close``
    rows' keys closed, then the ``version`` rows."""
    names = schema.names
    closes = source.where(F.col("_action") == "close").select(
        *_source_keys(spec), *[F.col(c).alias(f"c{j}") for j, c in enumerate(_CLOSING)], F.lit(True).alias("hit"))
    current = F.col(f"t{names.index('_is_current')}")
    on = [target[f"t{names.index(k)}"] == closes[f"s{j}"] for j, k in enumerate(spec.key)]
    kept = target.join(closes, [current, *on], "left")
    hit = F.col("hit").isNotNull()

    def value(i: int, f: T.StructField) -> Any:
        if f.name in _CLOSING:
            return F.when(hit, F.col(f"c{_CLOSING.index(f.name)}").cast(f.dataType)).otherwise(F.col(f"t{i}"))
        if f.name == "_is_current":
            return F.when(hit, F.lit(False)).otherwise(F.col(f"t{i}"))
        return F.col(f"t{i}")

    inserted = source.where(F.col("_action") == "version")
    if inserting <= ONE_FILE_INSERTS:
        inserted = inserted.coalesce(1)
    return kept.select(*[value(i, f).alias(f.name) for i, f in enumerate(schema.fields)]).unionByName(
        _as_inserted(inserted, [*spec.columns, *HISTORY_NAMES], schema))


def _scala_list(items: Any) -> list[Any]:
    """A Scala collection's items."""
    out, found = [], items.iterator()
    while found.hasNext():
        out.append(found.next())
    return out


def _register_metrics(session: SparkSession, jvm: Any, txn: Any, operation_metrics: Any,
                      counts: dict[str, int]) -> None:
    """Register ``counts`` with the transaction ``txn`` as its operation's metrics, and as 0 every
    other metric ``operation_metrics`` names (Delta's set of the operation's metric names, or
    None): the metrics its commit records (``DESCRIBE HISTORY``'s ``operationMetrics``)."""
    metrics = jvm_class(jvm, "java.util.HashMap")()
    named = [] if operation_metrics is None else [str(n) for n in _scala_list(operation_metrics)]
    for name in [*named, *counts]:
        metric = jvm_class(jvm, "org.apache.spark.sql.execution.metric.SQLMetrics").createMetric(
            session.sparkContext._jsc.sc(), name)  # type: ignore[attr-defined]
        metric.set(counts.get(name, 0))
        metrics.put(name, metric)
    txn.registerSQLMetrics(session._jsparkSession, jvm_class(jvm, _PYTHON_UTILS).toScalaMap(metrics))  # type: ignore[attr-defined]


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
    table keeps its own: see `partition_columns`). ``replaced``: ``replace_where`` as a test of a
    file's partition values (Delta's strings) where it is a predicate on partition columns only;
    with it, a table `read_listed` reads as its checksum's files has those files removed by the
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
    checksum lists the table's files (`_listed_files`; otherwise False); the transaction then
    reads the whole table, so Delta fails it where another commit changed files meanwhile."""
    with _active(frame.sparkSession) as jvm:
        return _checked_append(jvm, frame, path, app_id, version, replace_where, replaced)


def _checked_append(jvm: Any, frame: DataFrame, path: str, app_id: str, version: int,
                    replace_where: str | None = None,
                    replaced: Callable[[dict[str, str | None]], bool] | None = None) -> bool:
    """`_append_checked_by_checksum` in the frame's session."""
    try:
        txn = jvm_class(jvm, f"{_DELTA}.DeltaLog").forTable(frame.sparkSession._jsparkSession, path).startTransaction()  # type: ignore[attr-defined]
        snapshot = txn.snapshot()
        if snapshot.version() < 0:
            return False
        done = _checksum_txn_version(snapshot, app_id)
        schema = json.loads(snapshot.metadata().schema().json())
        write = jvm_class(jvm, f"{_DELTA}.DeltaOperations$Write")
        entry = jvm_class(jvm, f"{_DELTA}.actions.SetTransaction")
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
        listed = _listed_files(frame.sparkSession, snapshot)
        if listed is None:
            return False
        partitions = _partition_names(snapshot.metadata())
        removed = [added for added in listed if replaced(_partition_values(added, partitions))]
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
    txn.commit(actions.appended(_set_transaction(jvm, entry, app_id, version)), operation)
    return True


def _set_transaction(jvm: Any, entry: Any, app_id: str, version: int) -> Any:
    """Delta's ``SetTransaction`` action (``entry``: its class) of ``app_id`` at ``version``,
    stamped now as Delta's writer stamps it: milliseconds since the epoch, past 2**31, which py4j
    hands the JVM as a Long, as ``Option[Long]`` holds."""
    return entry(app_id, version, jvm_class(jvm, "scala.Option").apply(int(time.time() * 1000)))


def _checksum_txn_version(snapshot: Any, app_id: str) -> int | None:
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


def partition_columns(spark: SparkSession, path: str) -> tuple[str, ...]:
    """The partition columns of the Delta table at ``path`` now (no Spark job)."""
    columns = _snapshot_now(spark, path).metadata().partitionColumns()
    return tuple(str(columns.apply(i)) for i in range(columns.size()))


def latest_version(spark: SparkSession, path: str) -> int:
    """The version of the Delta table at ``path`` as the session's Delta log holds it now (brought
    up to date; no Spark job)."""
    return int(_snapshot_now(spark, path).version())


def _snapshot_now(spark: SparkSession, path: str) -> Any:
    """Delta's snapshot of the table at ``path``, brought up to date (no Spark job)."""
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    log = jvm_class(jvm, f"{_DELTA}.DeltaLog").forTable(spark._jsparkSession, path)  # type: ignore[attr-defined]
    none = jvm_class(jvm, "scala.Option").empty()
    return log.update(False, none, none)


def file_count(spark: SparkSession, path: str) -> int | None:
    """The files of the Delta table at ``path`` now, from its version's checksum file (no Spark
    job); None without one (Delta writes one beside each commit unless told not to)."""
    checksum = _snapshot_now(spark, path).checksumOpt()
    return int(checksum.get().numFiles()) if checksum.isDefined() else None


#: The files an append-only table of the target's own (``_runs``, ``_pgoutput/relations``, ...)
#: may hold before a run compacts it: each run appends a file, and every read lists and opens
#: them all (``status`` over a ``_runs`` of 3,000 files: about 7 s, compacted: 0.6 s;
#: `benchmarks/ledger_growth.py`). 50 is also where Delta stops keeping a table's file list in
#: its checksum (`row_count`).
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
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
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


def row_count(spark: SparkSession, path: str) -> int:
    """The rows of the Delta table at ``path`` now.

    Delta writes a checksum file beside each commit, and with it, for a table of up to
    ``spark.databricks.delta.allFilesInCrc.thresholdNumFiles`` files (50 by default), every
    file's statistics: the rows come from those (each file's record count less the rows its
    deletion vector removes, as Delta counts them), without a Spark job. A mirror of a few
    thousand rows costs a Spark count about 75 ms of planning and jobs on 2 cores, and
    ``status`` counts every mirror. Without such a checksum (more files, statistics not
    collected, another writer), a count of that version.
    """
    snapshot = _snapshot_now(spark, path)
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


def read_current(spark: SparkSession, path: str) -> DataFrame:
    """The Delta table at ``path`` as of its version now (`latest_version`), not "the latest":
    Spark and Delta plan every cached frame that reads a table's latest version again after each
    write to that table (Delta's file listing jobs), and a run caches frames that read the
    tables it then writes (the pending rows it saves back, a mirror's pre-image).

    Where that version's checksum lists the table's files (Delta 4.0 does for up to 50 files;
    none with deletion vectors: `_checksum_files`), Delta's reader reads those files as they
    are listed (`_files_of`: column mapping, type widening, partition values as Delta reads
    them), without the Spark jobs in which Delta reconstructs a new version's state to find
    them: a small mirror's rows for two keys, read after each of a series of commits to it
    (as a run's pre-image and `slot.verify` read mirrors), 0.28 s against 0.58 s with Delta's
    reader of the version (ad hoc, warm, 2 cores). Otherwise Delta's reader of that version.
    """
    return _read_version(spark, path, _snapshot_now(spark, path))


def _read_version(spark: SparkSession, path: str, snapshot: Any) -> DataFrame:
    """`read_current` of the table at ``path`` as of ``snapshot`` (Delta's, brought up to date)."""
    files = _checksum_files(snapshot)
    if files is None:
        return spark.read.format("delta").option("versionAsOf", int(snapshot.version())).load(path)
    with _active(spark) as jvm:
        return _files_of(spark, jvm, snapshot, files)


def _files_of(spark: SparkSession, jvm: Any, snapshot: Any, files: list[Any]) -> DataFrame:
    """The rows of ``files`` (``AddFile`` actions of the snapshot's table) as Delta's reader reads
    them (``DeltaLog.createDataFrame``: no state reconstruction, no data skipping), the table's
    columns by its schema."""
    none = jvm_class(jvm, "scala.Option").empty()
    return DataFrame(snapshot.deltaLog().createDataFrame(snapshot, _seq(jvm, files), False, none), spark)


def read_listed(spark: SparkSession, path: str) -> DataFrame:
    """`read_current`, for a table that Delta's protocol lets any Parquet reader read (reader
    version 1: no deletion vectors, no column mapping) and whose version's checksum file lists
    its files (Delta 4.0 keeps the list of a table of up to 50 files there): the Parquet files
    listed (`_listed_files`), without the Spark jobs in which Delta's reader reconstructs the
    table's state to find them (three, 0.2-0.3 s on 2 cores, for each read of a table of the
    target's own). Any other table: `read_current`.

    A table the caller then changes with Delta's own commands gains nothing: they reconstruct
    the state to find their files (Delta's reader leaves it in Delta's cache for them). The
    target's lease and ``pending`` are changed over the same listed files instead
    (`update_listed`, `delete_listed`, `txn_append`'s overwrite with ``replaced``)."""
    snapshot = _snapshot_now(spark, path)
    listed = _listed_files(spark, snapshot)
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
    with _active(spark) as jvm:
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
        actions = txn.writeFiles(updated._jdf)  # type: ignore[attr-defined]
        for added in listed:
            actions = actions.appended(added.remove())
        predicate = spark._jsparkSession.sessionState().sqlParser().parseExpression(condition)  # type: ignore[attr-defined]
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
    with _active(spark) as jvm:
        started = _listed_transaction(spark, jvm, path, "Delete")
        if started is None:
            return None
        txn, snapshot, delete, listed = started
        partitions = _partition_names(snapshot.metadata())
        removed = [added for added in listed if deleted(_partition_values(added, partitions))]
        if not removed:
            return False
        # The metrics of Delta's DELETE of whole partitions, its rows counted from the files' statistics.
        records = [added.numLogicalRecords() for added in removed]
        counts = {"numRemovedFiles": len(removed), "numRemovedBytes": sum(int(added.size()) for added in removed),
                  "numDeletedRows": sum(int(n.get()) for n in records) if all(n.isDefined() for n in records) else 0,
                  **dict.fromkeys(("numCopiedRows", "numAddedFiles", "numAddedBytes", "numAddedChangeFiles",
                                   "numDeletionVectorsAdded", "numDeletionVectorsRemoved", "numDeletionVectorsUpdated",
                                   "scanTimeMs", "rewriteTimeMs", "executionTimeMs"), 0)}
        _register_metrics(spark, jvm, txn, None, counts)
        parsed = spark._jsparkSession.sessionState().sqlParser().parseExpression(predicate)  # type: ignore[attr-defined]
        txn.commit(_seq(jvm, [added.remove() for added in removed]), delete(_seq(jvm, [parsed])))
        return True


def _listed_transaction(spark: SparkSession, jvm: Any, path: str,
                        operation: str) -> tuple[Any, Any, Any, list[Any]] | None:
    """A Delta transaction on the table at ``path`` that has read the whole table (any file
    another commit removes or adds meanwhile fails its commit), its snapshot, the class of
    Delta's ``operation`` (``DeltaOperations.<operation>``) and the files its checksum lists
    (`_listed_files`); None where there is no table, no such list, or no such class."""
    try:
        txn = jvm_class(jvm, f"{_DELTA}.DeltaLog").forTable(spark._jsparkSession, path).startTransaction()  # type: ignore[attr-defined]
        snapshot = txn.snapshot()
        recorded = jvm_class(jvm, f"{_DELTA}.DeltaOperations${operation}")
        if snapshot.version() < 0 or not isinstance(recorded, JavaClass):
            return None
        listed = _listed_files(spark, snapshot)
    except Exception as exc:  # py4j's: a Delta without these members
        _log.debug("%s of %s through Delta's command: %s", operation, path, exc)
        return None
    if listed is None:
        return None
    txn.readWholeTable()
    return txn, snapshot, recorded, listed


def _seq(jvm: Any, items: list[Any]) -> Any:
    """A Scala ``Seq`` of JVM objects."""
    out = jvm_class(jvm, "java.util.ArrayList")()
    for item in items:
        out.add(item)
    return jvm_class(jvm, _PYTHON_UTILS).toSeq(out)


class _active:
    """``with _active(spark) as jvm``: ``spark`` the JVM thread's active session meanwhile (Delta's
    transactions take it from there, as under its writer), the one before put back after."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
        self.sessions = jvm_class(self.jvm, "org.apache.spark.sql.SparkSession")

    def __enter__(self) -> Any:
        self.before = self.sessions.getActiveSession()
        self.sessions.setActiveSession(self.spark._jsparkSession)  # type: ignore[attr-defined]
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


def _listed_files(spark: SparkSession, snapshot: Any) -> list[Any] | None:
    """The ``AddFile`` actions of the snapshot's table as its checksum lists them; None where
    Delta's reader is needed (see `read_listed`; also a partition column of another type than
    `_PARTITION_TYPES`, or a path Spark would take as a glob)."""
    if snapshot.protocol().minReaderVersion() != 1:
        return None
    metadata = snapshot.metadata()
    if str(metadata.format().provider()).lower() != "parquet":
        return None
    fields = {f["name"]: f["type"] for f in json.loads(metadata.schema().json())["fields"]}
    if any(fields.get(name) not in _PARTITION_TYPES for name in _partition_names(metadata)):
        return None
    files = _checksum_files(snapshot)
    if files is None:
        return None
    root, operations = snapshot.deltaLog().dataPath().toString(), _file_operations(spark)
    if any(_GLOB.search(_file_location(operations, root, added)) for added in files):
        return None
    return files


def _checksum_files(snapshot: Any) -> list[Any] | None:
    """The ``AddFile`` actions of the snapshot's table as its checksum lists them; None where it
    does not, or one of them has a deletion vector."""
    checksum = snapshot.checksumOpt()
    listed = checksum.get().allFiles() if checksum.isDefined() else None
    if listed is None or not listed.isDefined():
        return None
    files = _scala_list(listed.get())
    return None if any(added.deletionVector() is not None for added in files) else files


def _partition_names(metadata: Any) -> list[str]:
    columns = metadata.partitionColumns()
    return [str(columns.apply(i)) for i in range(columns.size())]


def _partition_values(added: Any, names: list[str]) -> dict[str, str | None]:
    """An ``AddFile``'s partition values (Delta's strings; None for null) by column."""
    values = added.partitionValues()
    return {name: (values.get(name).get() if values.get(name).isDefined() else None) for name in names}


def _file_operations(spark: SparkSession) -> Any:
    """Delta's ``DeltaFileOperations`` (for `_file_location`), looked up once for a table's files."""
    return jvm_class(spark.sparkContext._jvm, f"{_DELTA}.util.DeltaFileOperations")  # type: ignore[attr-defined]


def _file_location(operations: Any, root: str, added: Any) -> str:
    """An ``AddFile``'s file, as Delta resolves its (relative, URI-encoded) path."""
    return str(operations.absolutePath(root, added.path()).toString())


def _files_frame(spark: SparkSession, snapshot: Any, listed: list[Any]) -> DataFrame:
    """The rows of the ``listed`` files (`_listed_files`) of the snapshot's table: each file's
    Parquet columns by the table's schema, its partition values as literals."""
    metadata = snapshot.metadata()
    schema = T.StructType.fromJson(json.loads(metadata.schema().json()))
    partitions = _partition_names(metadata)
    if not listed:
        return spark.createDataFrame([], schema)
    root, operations = snapshot.deltaLog().dataPath().toString(), _file_operations(spark)
    groups: dict[tuple[str | None, ...], list[str]] = {}
    for added in listed:
        key = tuple(_partition_values(added, partitions).values())
        groups.setdefault(key, []).append(_file_location(operations, root, added))
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
