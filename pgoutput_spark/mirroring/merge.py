"""One MERGE per mirror per run.

A run's MERGE into a mirror takes the net change of `pgoutput_spark.mirroring.net`
(computed in Spark tasks by `pgoutput_spark.mirroring.rows`) and is idempotent: it
carries the transaction identifier ``txnAppId`` =
``<pipeline>:relation:<oid>``, ``txnVersion`` = the run's applied commit LSN,
and records the run's LSN and seq range as its commit's ``userMetadata``. On a mirror of
up to 50 files it is a Delta transaction of our own (`merge_listed`), otherwise Delta's
MERGE command.

Deletion vectors follow the session's Delta defaults (off unless
``spark.databricks.delta.properties.defaults.enableDeletionVectors`` is set,
or the table's property is set later): measured on 2 cores, Delta's MERGE of
60 rows took 2.4 s with them and 0.9 s without on a 2,000-row mirror, 2.1 s
and 1.3 s on a 2M-row one, and on a 10M-row mirror they only broke even
(`benchmarks/deletion_vectors.py`, `benchmarks/README.md`). With them on,
`merge_listed` marks the rows a MERGE updates or deletes in files of 16 MiB or
more deleted in place (`MARK_MIN_FILE_BYTES`), rewriting smaller files as
without them: a MERGE of random keys then rewrites no large file.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from py4j.java_gateway import JavaClass
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..errors import PgoutputSparkError
from ..spark.jvm import jvm_class
from ..spark.session import one_row, release, temporary_conf
from .deltalog import (
    DELTA,
    active,
    checksum_files,
    checksum_txn_version,
    deletion_vector_actions,
    file_location,
    file_operations,
    files_in_ranges,
    files_of,
    key_ranges,
    ranges_filter,
    register_metrics,
    scala_list,
    scala_seq,
    set_transaction,
    snapshot_now,
    table_bytes,
    table_schema,
    user_metadata,
)
from .history import HISTORY_NAMES
from .names import quote
from .net import TableSpec

_log = logging.getLogger(__name__)
_R = TypeVar("_R")


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

    values: dict[str, str | Column] = {quote(c): f"s.{quote(c)}" for c in spec.columns}
    on = merge_condition(spec)

    def run() -> dict[str, int]:  # on the table as it is now (see `execute_merge`)
        counts = merge_listed(session, path, source, spec, truncated=truncated, app_id=app_id, version=version)
        if counts is not None:
            return counts
        target = DeltaTable.forPath(session, path).alias("t")
        narrowed = None if truncated else delta_ranges(session, path, source, spec)
        condition = F.expr(on) if narrowed is None else F.expr(on) & narrowed
        if spec.mode == "keyed":
            builder = (target.merge(source.alias("s"), condition)
                       .whenMatchedDelete("s._action = 'delete'")
                       .whenMatchedUpdate("s._action = 'upsert'", values)
                       .whenNotMatchedInsert("s._action = 'upsert'", values))
        else:
            builder = (target.merge(source.alias("s"), condition)
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
    files (Delta 4.0 keeps the list for tables of up to 50 files), whose table features are
    `LISTED_MERGE_FEATURES` and which has change data feed and row tracking off (and, with
    deletion vectors off, no file with one). The counts of rows inserted, updated
    and deleted, or None, having written nothing, where Delta's MERGE is needed: another table,
    a history with deletion vectors on, or a ``source`` with two rows for one key.

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
    checksum as `delta.txn_append` does) and is recorded as Delta's MERGE, with its condition,
    clauses and row counts. The transaction reads the whole table: Delta fails it where another
    commit changed the table meanwhile (`execute_merge` retries it after a rewrite of files).
    A commit that changes the table's schema (a run's new column or wider type) leaves the list
    of files out of its checksum, so the MERGE right after it is Delta's command (whose commit
    writes the list again).

    Deletion vectors on (``delta.enableDeletionVectors``), a keyed mirror or a multiset, not
    truncated, without a column the source no longer has: the first job also gives each matched
    row's index in its file (``_metadata.row_index``), and the files of `MARK_MIN_FILE_BYTES` or
    more whose rows the MERGE changes at most half of are kept (`_marked`), their matched rows
    marked deleted by a deletion vector (`deltalog.deletion_vector_actions`, merged with the
    file's vector), the rows of their updates written with the inserts; the other files are
    rewritten as above. A run of random keys into a large mirror then writes its changed rows,
    not the mirror (`benchmarks/apply.py`, the ``dv`` variant).

    ``history``: the MERGE of a history table (`history.merge_history`; ``spec`` keyed, not
    ``truncated``): ``close`` rows end the current version of their key (its ``_valid_to_lsn``,
    ``_valid_to_ts`` and ``_is_current`` set), ``version`` rows are inserted; the counts are
    ``inserted`` (versions) and ``updated`` (versions closed).
    """
    assert not (history and (truncated or spec.mode != "keyed"))
    columns = [*spec.columns, *HISTORY_NAMES] if history else list(spec.columns)
    with active(session) as jvm:
        try:
            log = jvm_class(jvm, f"{DELTA}.DeltaLog").forTable(session._jsparkSession, path)
            txn = log.startTransaction()
            snapshot = txn.snapshot()
            operation = jvm_class(jvm, f"{DELTA}.DeltaOperations$Merge")
            clause = jvm_class(jvm, f"{DELTA}.DeltaOperations$MergePredicate")
            entry = jvm_class(jvm, f"{DELTA}.actions.SetTransaction")
            if snapshot.version() < 0 or not all(isinstance(c, JavaClass) for c in (operation, clause, entry)):
                return None
            done = checksum_txn_version(snapshot, app_id)
            protocol = snapshot.protocol()
            features = {str(f.name()) for f in scala_list(protocol.implicitlyAndExplicitlySupportedFeatures())}
            configuration = snapshot.metadata().configuration()
            enabled = [key for key in ("delta.enableChangeDataFeed", "delta.appendOnly", "delta.enableRowTracking",
                                       "delta.enableDeletionVectors")
                       if configuration.get(key).isDefined() and str(configuration.get(key).get()).lower() == "true"]
            vectors = "delta.enableDeletionVectors" in enabled
            files = checksum_files(snapshot, deletion_vectors=vectors)
            schema = table_schema(snapshot)
        except Exception as exc:  # py4j's: a Delta without these members
            _log.debug("MERGE into %s by Delta's command: %s", path, exc)
            return None
        # Deletion vectors on: rows marked deleted in large files (a history's are Delta's MERGE's).
        if done is None or files is None or (vectors and history) or not features <= LISTED_MERGE_FEATURES:
            return None
        if set(enabled) - {"delta.enableDeletionVectors"}:
            return None
        names = schema.names
        if not set(columns) <= set(names) or len(set(n.lower() for n in names)) != len(names):
            return None
        # Rows marked deleted (their files kept) only where the rows written in their place need
        # nothing of them (no column the mirror keeps that the source no longer has), and where a
        # file is large enough to keep: otherwise no row's index is read.
        marking = vectors and not truncated and set(names) == set(columns) and any(
            int(added.size()) >= MARK_MIN_FILE_BYTES for added in files)
        txn.readWholeTable()  # any commit meanwhile that adds or removes files fails this one
        txn.readTxn().addOne(app_id)  # as Delta's MERGE registers its transaction identifier
        if done >= version:
            return {"inserted": 0, "updated": 0, "deleted": 0}  # committed before: as Delta's MERGE, nothing
        root, operations = snapshot.deltaLog().dataPath().toString(), file_operations(session)
        by_location = {file_location(operations, root, added): added for added in files}
        none = jvm_class(jvm, "scala.Option").empty()

        def rows_of(added: list[Any], positions: bool = False) -> DataFrame:  # the rows in these files
            frame = files_of(session, jvm, snapshot, added)  # its columns numbered, ``row`` its index in its file
            return frame.select(*[F.col(quote(n)).alias(f"t{i}") for i, n in enumerate(names)],
                                *([F.col("_metadata.row_index").alias("row")] if positions else []))

        candidates = files if truncated else _pruned(files, source, spec, schema, history=history)
        matched = _matched(rows_of(candidates, marking), source, spec, names, history=history, positions=marking)
        if matched is None:
            return None
        counts, located, flagged, marks = matched
        try:
            named = [(name, by_location.get(str(operations.absolutePath(root, name).toString()))) for name in located]
            found = files if truncated else [added for _, added in named]
            touched = [added for added in found if added is not None]
            if len(touched) < len(found):
                _log.debug("MERGE into %s by Delta's command: a file read is not in its checksum", path)
                return None
            marked = _marked(marks, named, counts) if marks is not None else []
            kept = {str(added.path()) for added, _ in marked}
            touched = [added for added in touched if str(added.path()) not in kept]
            touched = [*touched, *_compacted(files, [*touched, *(added for added, _ in marked)])]
            records = [added.numLogicalRecords() for added in touched]
            rewritten = sum(int(n.get()) for n in records if n.isDefined())
            if truncated:  # every file rewritten: its rows are the mirror's
                if not all(n.isDefined() for n in records):
                    return None  # no statistics: Delta's MERGE counts the rows it deletes
                counts["deleted"] += rewritten - counts["updated"] - counts["deleted"]
            in_place = [name for name, added in named if added is not None and str(added.path()) in kept]
            inserting = counts["inserted"] + (counts["updated"] if in_place else 0)
            actions = txn.writeFiles(_merged(rows_of(touched), source, flagged, spec, schema, truncated,
                                             inserting, history=history, in_place=in_place)._jdf)
        finally:
            if flagged is not None:
                release(flagged)
            if marks is not None and marks is not flagged:
                release(marks)
        added_files = scala_list(actions)
        for added in touched:
            actions = actions.appended(added.remove())
        vectors_before = {str(added.path()) for added, _ in marked if added.deletionVector() is not None}
        marking_actions = deletion_vector_actions(jvm, snapshot.deltaLog(), marked)
        for action in marking_actions:
            actions = actions.appended(action)
        actions = actions.appended(set_transaction(jvm, entry, app_id, version))
        n_source, matched_deleted = counts.pop("source"), counts.pop("matched_deleted")
        # Rows the MERGE updated or deleted in files it rewrote (the rest it marked deleted in place).
        changed = counts["updated"] + counts["deleted"] - sum(len(rows) for _, rows in marked)
        left = {str(a.path()) for a in marking_actions if a.getClass().getSimpleName() == "AddFile"}
        register_metrics(session, jvm, txn, jvm_class(jvm, f"{DELTA}.DeltaOperationMetrics").MERGE(), {
            "numSourceRows": n_source, "operationNumSourceRows": n_source,  # the latter: what history shows
            "numTargetRowsInserted": counts["inserted"], "numTargetRowsNotMatchedInserted": counts["inserted"],
            "numTargetRowsUpdated": counts["updated"], "numTargetRowsMatchedUpdated": counts["updated"],
            "numTargetRowsDeleted": counts["deleted"], "numTargetRowsMatchedDeleted": matched_deleted,
            "numTargetRowsNotMatchedBySourceDeleted": counts["deleted"] - matched_deleted,
            "numTargetRowsCopied": max(rewritten - changed, 0),
            "numOutputRows": max(rewritten - changed, 0) + counts["updated"] + counts["inserted"],
            "numTargetFilesRemoved": len(touched) + len(marked) - len(left),
            "numTargetFilesAdded": len(added_files),
            "numTargetBytesRemoved": sum(int(a.size()) for a in touched) + sum(
                int(a.size()) for a, _ in marked if str(a.path()) not in left),
            "numTargetBytesAdded": sum(int(a.size()) for a in added_files),
            "numTargetDeletionVectorsAdded": len(left - vectors_before),
            "numTargetDeletionVectorsUpdated": len(left & vectors_before),
            "numTargetDeletionVectorsRemoved": len(vectors_before - left) + sum(
                1 for a in touched if a.deletionVector() is not None)})
        parser = session._jsparkSession.sessionState().sqlParser()
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
                                      scala_seq(jvm, matched_clauses), scala_seq(jvm, inserted_clauses),
                                      scala_seq(jvm, by_source)))
        return counts


def delta_ranges(session: SparkSession, path: str, source: DataFrame, spec: TableSpec, *,
                 history: bool = False) -> Column | None:
    """For Delta's MERGE of ``source`` into the table at ``path`` (alias ``t``): a predicate on
    the table's keys that every row the MERGE matches meets (`deltalog.ranges_filter` of the
    ranges `_pruned` compares), which Delta's data skipping turns into the files its MERGE
    reads to match them; None where the table is under `deltalog.PRUNE_MIN_BYTES` (its
    checksum's size), or no key is compared. Not for a run that truncated: every row is read."""
    snapshot = snapshot_now(session, path)
    schema = table_schema(snapshot)
    ranges = key_ranges(None, schema, spec.key, lambda: _matching(source, spec, history=history),
                        [quote(k) for k in spec.key], size=table_bytes(snapshot))
    return None if ranges is None else ranges_filter(ranges, schema, "t")


def _matching(source: DataFrame, spec: TableSpec, *, history: bool = False) -> DataFrame:
    """The rows of ``source`` a MERGE matches with the table's: a keyed one's every row, a
    multiset's ``delete_all`` rows, a history's ``close`` rows."""
    action = "close" if history else "delete_all" if spec.mode == "multiset" else None
    return source if action is None else source.where(F.col("_action") == action)


def _pruned(files: list[Any], source: DataFrame, spec: TableSpec, schema: T.StructType, *,
            history: bool = False) -> list[Any]:
    """The files of a mirror (its schema ``schema``, from its Delta metadata) that may hold a row
    the MERGE of ``source`` matches (`deltalog.key_ranges`, `deltalog.files_in_ranges`: by their
    statistics of the keys, or of a multiset's identity columns its deletes carry no null in,
    of an integer, decimal, date, timestamp or string type), or all of them; a ``history``'s:
    the files that may hold a current version its ``close`` rows end. Delta's MERGE skips no
    file by its join's keys; changes to a large mirror's recent rows (serial keys, times) are
    then matched in the files they are in, not in every file."""
    ranges = key_ranges(files, schema, spec.key, lambda: _matching(source, spec, history=history),
                        [quote(k) for k in spec.key])
    return files if ranges is None else files_in_ranges(files, ranges)


def _matched(target: DataFrame, source: DataFrame, spec: TableSpec, names: list[str], *, history: bool = False,
             positions: bool = False) -> tuple[dict[str, int], list[str], DataFrame | None, DataFrame | None] | None:
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
    MERGE fails where both match a version).

    ``positions`` (``target`` has the column ``row``, each row's index in its file): also the
    matched mirror rows' ``file`` and ``row`` (for `_marked`): ``flagged`` (keyed), or the rows
    a multiset's MERGE deletes (cached: the caller releases it); otherwise None."""
    keys = [names.index(k) for k in spec.key]
    if history:
        current = target.where(F.col(f"t{names.index('_is_current')}"))
        found = _history_matched(current.select(*[F.col(f"t{i}") for i in keys], F.input_file_name().alias("file")),
                                 source, spec)
        return None if found is None else (*found, None)
    t = target.select(*[F.col(f"t{i}") for i in keys], F.input_file_name().alias("file"),
                      *(["row"] if positions else []))
    if spec.mode == "keyed":
        s = _numbered_source(source, spec)
        at = [spec.columns.index(k) for k in spec.key]
        pairs = t.join(s.select(*[f"s{j}" for j in at]), [t[f"t{i}"] == F.col(f"s{j}") for i, j in zip(keys, at)])
        pairs = pairs.select(*[F.col(f"s{j}").alias(f"k{j}") for j in at], "file", *(["row"] if positions else []))
        flagged = s.join(pairs, [s[f"s{j}"] == pairs[f"k{j}"] for j in at], "left").drop(
            *[f"k{j}" for j in at]).persist()
        try:
            hit = F.col("file").isNotNull()
            upsert, delete = F.col("a") == "upsert", F.col("a") == "delete"
            row = one_row(flagged.agg(
                F.count(F.lit(1)).alias("rows"),
                F.count_distinct(*[F.col(f"s{j}") for j in at]).alias("keys"),
                F.sum(F.when(hit & upsert, 1).otherwise(0)).alias("updated"),
                F.sum(F.when(~hit & upsert, 1).otherwise(0)).alias("inserted"),
                F.sum(F.when(hit & delete, 1).otherwise(0)).alias("deleted"),
                F.collect_set(F.when(hit, F.col("file"))).alias("files")))
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
        return counts, list(row["files"]), flagged, flagged if positions else None
    gone = source.where(F.col("_action") == "delete_all").select(*_source_keys(spec))
    deleted = t.join(gone, [t[f"t{i}"].eqNullSafe(gone[f"s{j}"]) for j, i in enumerate(keys)], "left_semi")
    if positions:
        deleted = deleted.persist()
    try:
        row = one_row(deleted.agg(F.count(F.lit(1)).alias("deleted"), F.collect_set("file").alias("files")))
        sizes = {r["_action"]: r["n"] for r in source.groupBy("_action").agg(F.count(F.lit(1)).alias("n")).collect()}
    except BaseException:
        if positions:
            release(deleted)
        raise
    return ({"inserted": sizes.get("insert", 0), "updated": 0, "deleted": row["deleted"],
             "matched_deleted": row["deleted"], "source": sum(sizes.values())}, list(row["files"]), None,
            deleted if positions else None)


#: `merge_listed` on a mirror with deletion vectors on marks a matched row deleted in its file,
#: keeping the file, where the file is this large or larger (a smaller one is rewritten, as with
#: them off) ...
MARK_MIN_FILE_BYTES = SMALL_FILE_BYTES
#: ... and the MERGE updates or deletes at most this many rows (their positions go through the
#: driver: 4 bytes a row); a larger MERGE rewrites its files.
MARK_MAX_ROWS = 2_000_000


def _marked(marks: DataFrame, named: list[tuple[str, Any]], counts: dict[str, int]) -> list[tuple[Any, list[int]]]:
    """The files `merge_listed` keeps, with the indexes of their rows it marks deleted: those of
    the files the MERGE touches (``named``: as ``marks`` names them, with their ``AddFile``) of
    `MARK_MIN_FILE_BYTES` or more, where the MERGE changes at most half their rows, with their
    matched rows in ``marks`` (``file``, ``row``; keyed: those with a ``file``). None where the
    MERGE changes more than `MARK_MAX_ROWS` rows (an empty list: it rewrites them all)."""
    large = {name: added for name, added in named
             if added is not None and int(added.size()) >= MARK_MIN_FILE_BYTES}
    if not large or counts["updated"] + counts["deleted"] > MARK_MAX_ROWS:
        return []
    found = marks.where(F.col("file").isin(list(large))).groupBy("file").agg(F.collect_list("row").alias("rows"))
    marked = []
    for r in found.collect():
        added, rows = large[r["file"]], r["rows"]
        records = added.numLogicalRecords()
        if records.isDefined() and 2 * len(rows) <= int(records.get()):
            marked.append((added, rows))
    return marked


def _history_matched(current: DataFrame, source: DataFrame,
                     spec: TableSpec) -> tuple[dict[str, int], list[str], None] | None:
    """`_matched` of a history: ``current``, the key columns of its current versions and their
    ``file``."""
    is_close = F.col("_action") == "close"
    sizes = one_row(source.agg(F.count(F.when(is_close, 1)).alias("closes"),
                               F.count_distinct(*[F.when(is_close, F.col(quote(k))) for k in spec.key]).alias("keys"),
                               F.count(F.when(F.col("_action") == "version", 1)).alias("versions"),
                               F.count(F.lit(1)).alias("rows")))
    if sizes["closes"] != sizes["keys"]:
        return None
    closes = source.where(is_close).select(*_source_keys(spec))
    on = [current[c] == closes[f"s{j}"] for j, c in enumerate(current.columns[:-1])]
    row = one_row(current.join(closes, on).agg(F.count(F.lit(1)).alias("updated"),
                                               F.collect_set("file").alias("files")))
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
            schema: T.StructType, truncated: bool, inserting: int, *, history: bool = False,
            in_place: Sequence[str] = ()) -> DataFrame:
    """`merge_listed`'s rows to write: those of ``target`` (the mirror's rows in the files the
    MERGE rewrites, its columns ``t<i>``) as the MERGE leaves them, then those it inserts; the
    mirror's columns (``schema``), ``source``'s values cast to their types. As Delta's MERGE
    does, an update sets ``spec.columns`` and keeps the mirror's other (dropped) columns, and an
    insert leaves those null. ``flagged``: keyed, `_matched`'s source rows, whose upserts that
    match no mirror row are the rows inserted (``inserting`` of them). The mirror's rows are
    joined to the source's (broadcast where small) on their left: no shuffle of the mirror's rows.
    ``in_place``: files (as ``flagged`` names them) whose matched rows the MERGE marks deleted in
    place (`_marked`): their upserts are written as new rows, as inserts are."""
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
        new = F.col("file").isNull() | F.col("file").isin(list(in_place)) if in_place else F.col("file").isNull()
        inserted = flagged.where(new & upsert)
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
