"""A target's run state: the lease that orders runs, the run rows, and the tables they keep.

Under the target root (the full layout is in `pgoutput_spark.apply`'s docstring):
``_pgoutput/lease`` (one row per pipeline: its position, the run holding it, the
capture files the runs before it saw), ``_runs`` (one row per finished run; the row
of the run holding the lease hands it back: see `Ledger.lease`),
``_pgoutput/relations``, ``_pgoutput/pending``, ``_pgoutput/quarantine``,
``_pgoutput/skipped`` and ``_pgoutput/snapshots`` (what `slot.snapshot` copied).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from .assemble.relations import RelationHistory, versions_from_rows
from .capture import _is_delta
from .errors import PgoutputSparkError
from .mirroring.listed import read_listed, update_listed
from .mirroring.merge import conflicting_operation
from .mirroring.names import absolute_path, path_table, sql_literal
from .spark.assemble import ScanState
from .spark.pending import saved_open_rows
from .spark.session import local_frame


class ConcurrentRunError(PgoutputSparkError):
    """Another run holds or took the target's lease."""


LEASE_SCHEMA = ("pipeline string, run_id string, status string, lo long, hi long, "
                "scan_begin long, scan_xid long, applied_lsn long, started_at timestamp, files array<string>, "
                "scan_session string")
#: The lease's columns that leases of earlier versions lack (the capture files the runs saw, the
#: walsender session of the last message): the first run that records its end adds them.
LEASE_ADDED = {"files": "array<string>", "scan_session": "string"}
TABLE_COUNTS = ("array<struct<table:string, path:string, relation_id:long, inserted:long, "
                "updated:long, deleted:long, skipped:long, truncated:boolean, status:string>>")
#: What a run's ``_runs`` row records for the lease it hands back (null in rows from before).
LEASE_END = ("struct<scan_begin:long, scan_xid:long, applied_lsn:long, gone_files:array<string>, "
             "scan_session:string>")
#: The streamed transactions a run forgot (``forget_xids``; null in rows from before).
FORGOTTEN = "array<struct<xid:long, first_seq:long, rows:long>>"
RUNS_SCHEMA = (f"run_id string, pipeline string, lo_seq long, hi_seq long, from_lsn long, "
               f"to_lsn long, messages long, transactions long, quarantined_messages long, "
               f"quarantined_rows long, tables {TABLE_COUNTS}, started_at timestamp, "
               f"finished_at timestamp, duration_s double, new_files array<string>, lease_end {LEASE_END}, "
               f"forgotten {FORGOTTEN}, to_commit_ts timestamp, version string")


#: Reads of a lease that another run is creating, 0.1 s apart, before a run gives up (`Ledger.lease`).
LEASE_CREATION_WAITS = 50

#: Rows a relations table may hold beyond the versions its history keeps before a run rewrites it.
REPEATS_REWRITTEN = 1000


@dataclass(frozen=True)
class Lease:
    run_id: str
    status: str  # idle | running
    lo: int | None
    hi: int | None
    scan: ScanState
    applied_lsn: int | None
    files: frozenset[str] | None = None  # the capture files the last finished run saw
    # The capture files (new, gone) of the finished run whose ``_runs`` row handed the lease
    # back: the next claim writes its end into the lease row (`Ledger.claim`).
    handed_back: tuple[tuple[str, ...], tuple[str, ...]] | None = None


class Ledger:
    """The target's run state (see module doc)."""

    def __init__(self, spark: SparkSession, target: str, pipeline: str) -> None:
        self.spark, self.root, self.pipeline = spark, absolute_path(target.rstrip("/")), pipeline
        self._snapshot_rows: list[tuple[int, str, int]] | None = None
        self._lease_missing: list[str] = []  # `LEASE_ADDED` columns the lease lacks
        self.lease_path = f"{self.root}/_pgoutput/lease"
        self.runs_path = f"{self.root}/_runs"
        self.relations_path = f"{self.root}/_pgoutput/relations"
        self.pending_path = f"{self.root}/_pgoutput/pending"
        self.quarantine_path = f"{self.root}/_pgoutput/quarantine"
        self.skipped_path = f"{self.root}/_pgoutput/skipped"
        # The tables' threads share the skipped table: two first appends at once would both
        # create it, and Delta fails one of them (a concurrent protocol change).
        self.skipped_lock = threading.Lock()
        self.snapshots_path = f"{self.root}/_pgoutput/snapshots"

    def starts(self) -> dict[int, int]:
        """Relation OID -> the LSN a (re-)snapshot left its mirror at (`slot.snapshot`)."""
        starts: dict[int, int] = {}
        for oid, _, lsn in self._snapshots():
            starts[oid] = max(lsn, starts.get(oid, lsn))
        return starts

    def snapshot_sources(self) -> dict[str, int]:
        """``schema.table`` -> the relation OID its mirror's latest (re-)snapshot copied."""
        return {name: oid for oid, name, _ in sorted(self._snapshots(), key=lambda r: r[2])}

    def snapshot_names(self) -> dict[int, set[str]]:
        """Relation OID -> the ``schema.table`` names (re-)snapshots copied it under."""
        names: dict[int, set[str]] = {}
        for oid, name, _ in self._snapshots():
            names.setdefault(oid, set()).add(name)
        return names

    def _snapshots(self) -> list[tuple[int, str, int]]:
        """(relation OID, table, LSN) of every snapshot of this pipeline, read once per ledger."""
        if self._snapshot_rows is None:
            self._snapshot_rows = [] if not _is_delta(self.spark, self.snapshots_path) else [
                (r[0], r[1], r[2]) for r in read_listed(self.spark, self.snapshots_path)
                .where(F.col("pipeline") == self.pipeline).select("relation_id", "table", "lsn").collect()]
        return self._snapshot_rows

    def lease(self) -> Lease:
        if not _is_delta(self.spark, self.lease_path):
            first = local_frame(self.spark, [(self.pipeline, "", "idle", None, None, None, None, None, None, None,
                                              None)], LEASE_SCHEMA)
            try:
                first.write.format("delta").mode("errorifexists").save(self.lease_path)
            except Exception as exc:  # another run created it first: read theirs
                if not _is_delta(self.spark, self.lease_path):
                    raise ConcurrentRunError(f"could not create the lease at {self.lease_path}: "
                                             f"{str(exc).splitlines()[0]}") from exc
        columns, rows = self._lease_rows()
        self._lease_missing = [c for c in LEASE_ADDED if c not in columns]
        if not rows:
            raise ConcurrentRunError(f"{self.lease_path} holds no lease for pipeline {self.pipeline!r}: "
                                     f"the target belongs to another pipeline")
        r = rows[0]
        files = r.asDict().get("files")  # None: no run recorded them (or a lease from before they were)
        scan = ScanState(r["scan_begin"], r["scan_xid"], r.asDict().get("scan_session"))
        lease = Lease(r["run_id"], r["status"], r["lo"], r["hi"], scan, r["applied_lsn"],
                      None if files is None else frozenset(files))
        return self._handed_back(lease) if lease.status == "running" else lease

    def _lease_rows(self) -> tuple[list[str], list[Row]]:
        """The lease table's columns and this pipeline's rows. Another run creating the lease
        at this moment has its log folder before its first commit, which Delta cannot read
        yet (``DELTA_NO_COMMITS_FOUND``): wait for that commit (`LEASE_CREATION_WAITS`), then
        fail with a `ConcurrentRunError`."""
        for _ in range(LEASE_CREATION_WAITS):
            try:
                leases = read_listed(self.spark, self.lease_path)
                return leases.columns, leases.where(F.col("pipeline") == self.pipeline).collect()
            except Exception as exc:
                if "DELTA_NO_COMMITS_FOUND" not in str(exc):
                    raise
                time.sleep(0.1)
        raise ConcurrentRunError(f"another run on {self.root} is creating its lease and has not committed it "
                                 f"yet; re-run when it has finished")

    def _handed_back(self, lease: Lease) -> Lease:
        """``lease`` as the ``_runs`` row of the run holding it left it: a run hands the lease back
        by that row (one commit less than updating the lease), recording its end there; the next
        claim writes that end into the lease row. Without such a row (or one from before rows
        recorded their end) the run died: the lease stays ``running``, and the next run redoes it."""
        if not _is_delta(self.spark, self.runs_path):
            return lease
        runs = read_listed(self.spark, self.runs_path)
        if "lease_end" not in runs.columns:
            return lease
        rows = runs.where((F.col("pipeline") == self.pipeline) & (F.col("run_id") == lease.run_id)
                          & F.col("lease_end").isNotNull()).select("hi_seq", "new_files", "lease_end").collect()
        if not rows:
            return lease
        hi, new, end = rows[0]
        new, gone = tuple(new or ()), tuple(end["gone_files"] or ())
        files = (lease.files or frozenset()).difference(gone) | set(new)  # as the claim will record them
        scan = ScanState(end["scan_begin"], end["scan_xid"], end.asDict().get("scan_session"))
        return Lease(lease.run_id, "idle", hi, hi, scan, end["applied_lsn"], files, (new, gone))

    def _update(self, assignments: dict[str, str], run_id: str, what: str) -> None:
        condition = f"pipeline = {sql_literal(self.pipeline)} AND run_id = {sql_literal(run_id)}"
        try:
            updated = update_listed(self.spark, self.lease_path, condition, assignments)
            if updated is None:  # not a table its checksum lists: Delta's UPDATE
                sets = ", ".join(f"{k} = {v}" for k, v in assignments.items())
                row = self.spark.sql(f"UPDATE {path_table(self.lease_path)} SET {sets} WHERE {condition}").first()
                updated = None if row is None else row[0]
        except Exception as exc:
            if conflicting_operation(exc) is not None:
                raise ConcurrentRunError(f"another run on {self.root} changed its lease while this "
                                         f"run tried to {what}; nothing of this run was lost, "
                                         f"re-run it") from exc
            raise
        if updated != 1:
            raise ConcurrentRunError(f"another run on {self.root} took its lease before this run "
                                     f"could {what}; re-run when it has finished")

    def claim(self, lease: Lease, run_id: str, hi: int) -> None:
        """Take the lease from ``lease``'s holder for the slice up to ``hi``: one conditional UPDATE,
        which also writes the end of the run that handed it back by its ``_runs`` row (`lease`)."""
        sets = {"run_id": sql_literal(run_id), "status": "'running'", "hi": str(hi),
                "started_at": "current_timestamp()"}
        if lease.handed_back is not None:
            assert lease.lo is not None
            sets.update(self._end(lease.lo, lease.scan, lease.applied_lsn, lease.handed_back))
        self._update(sets, lease.run_id, "claim its slice")

    def release(self, run_id: str, hi: int, end: ScanState, applied_lsn: int | None,
                files: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())) -> None:
        """Hand the lease back at ``hi`` by an UPDATE (a run's ``_runs`` row does it otherwise:
        `lease`); ``files``: (new, gone) capture files since the last run's."""
        self._update({"status": "'idle'", **self._end(hi, end, applied_lsn, files)}, run_id, "record its end")

    def _end(self, hi: int, end: ScanState, applied_lsn: int | None,
             files: tuple[tuple[str, ...], tuple[str, ...]]) -> dict[str, str]:
        """The lease's assignments for a run that ended at ``hi``."""
        new, gone = files
        if self._lease_missing:
            added = ", ".join(f"{c} {LEASE_ADDED[c]}" for c in self._lease_missing)
            self._lease_missing = []
            self.spark.sql(f"ALTER TABLE {path_table(self.lease_path)} ADD COLUMNS ({added})")
        seen = "coalesce(files, CAST(array() AS array<string>))"
        if gone:
            seen = f"array_except({seen}, {_string_array(gone)})"
        return {"lo": str(hi), "scan_begin": sql_literal(end.last_begin_seq),
                "scan_xid": sql_literal(end.last_stream_xid), "scan_session": sql_literal(end.last_session),
                "applied_lsn": sql_literal(applied_lsn),
                "files": f"array_union({seen}, {_string_array(new)})"}

    def own_tables(self) -> list[str]:
        """The paths of the target's own Delta tables that exist (the lease, ``_runs``, ...)."""
        paths = (self.lease_path, self.runs_path, self.relations_path, self.pending_path,
                 self.quarantine_path, self.skipped_path, self.snapshots_path)
        return [path for path in paths if _is_delta(self.spark, path)]

    def slices(self) -> list[tuple[int, int, int]]:
        """Each finished run's slice ``(lo, hi]`` and the messages it read (`capture.landed_files`)."""
        if not _is_delta(self.spark, self.runs_path):
            return []
        return [(-2**63 if r[0] is None else r[0], r[1], r[2]) for r in read_listed(self.spark, self.runs_path)
                .where(F.col("pipeline") == self.pipeline)
                .select("lo_seq", "hi_seq", "messages").collect()]

    def history(self) -> RelationHistory:
        return saved_history(self.spark, self.relations_path)

    def pending(self, hi: int | None) -> DataFrame | None:
        return saved_open_rows(self.spark, self.pending_path, hi)


def saved_history(spark: SparkSession, path: str) -> RelationHistory:
    """The relation history saved at ``path`` (empty without a table). A table holding many more
    rows than versions the history keeps (saved by runs from before they left out the Relation /
    Type messages PostgreSQL sends again in each walsender session) is rewritten with those
    alone, once (`REPEATS_REWRITTEN`): every run reads it whole. The rewrite removes only the
    files it read; rows a concurrent run appends meanwhile stay."""
    history = RelationHistory()
    if not _is_delta(spark, path):
        return history
    rows = read_listed(spark, path).collect()
    history.add(versions_from_rows(rows))
    kept = ([v.seq for versions in history.relations.values() for v in versions]
            + [t.seq for types in history.types.values() for t in types])
    if len(rows) - len(kept) >= REPEATS_REWRITTEN:
        table = spark.read.format("delta").load(path)
        table.where(F.col("seq").isin(kept)).dropDuplicates(["seq"]).write.format("delta").mode("overwrite").save(path)
    return history


def _string_array(values: tuple[str, ...]) -> str:
    """A Spark SQL array<string> of ``values``."""
    return f"CAST(array({', '.join(sql_literal(v) for v in values)}) AS array<string>)"
