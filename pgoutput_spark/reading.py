"""Reading a target: `status` (its runs and consistent read point) and `mirror` (a mirror,
now or as of a source LSN)."""

from __future__ import annotations

import dataclasses
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from .capture import CaptureColumns, _is_delta
from .errors import PgoutputSparkError
from .ledger import Ledger
from .lsn import Lsn
from .mirroring.deltalog import METADATA_KEY, recorded_commits, row_count
from .mirroring.names import DEFAULT_HISTORY_PATH, mirror_path, path_table, quote
from .results import utc_from_micros, utc_text
from .spark.session import one_row


@dataclass(frozen=True)
class Status:
    """A target's run history and its consistent read point."""

    runs: list[dict[str, Any]]  # oldest first: every run's row, or the last few asked for (`status`)
    read_point: int | None  # every mirror is complete up to this commit LSN
    running: bool  # a run holds the lease (or died holding it)
    position: int | None  # capture seq up to which runs have finished
    mirrors: dict[str, tuple[str, int]] = field(default_factory=dict)  # table -> (path, rows)
    # Transactions the last run left open (their rows wait in _pgoutput/pending for their end):
    # (kind: streamed | prepared | block, xid, first seq, first LSN, rows), oldest first. One
    # whose first seq stays while the position moves on may never end (see README).
    open_transactions: list[tuple[str, int | None, int, int | None, int]] = field(default_factory=list)
    run_count: int | None = None  # the target's runs, where `runs` holds the last few only
    # When the read point's commit committed in the source (UTC; `status` reads it from the run that
    # applied it): None before a first commit, or where that run's row is from before runs recorded it.
    read_point_time: datetime | None = None
    # With a capture (`status`'s ``capture``): its messages after `position` (distinct seqs), and the
    # last seq it holds; what the next runs have to apply.
    landed_after: int | None = None
    landed_to_seq: int | None = None

    def render(self, last: int = 10) -> str:
        lines = []
        if not self.runs and not self.run_count and not self.mirrors and self.position is None and not self.running:
            lines.append("nothing here yet: no run or snapshot has written to this target (is its path right?)")
        point = "nothing applied yet" if self.read_point is None else str(Lsn(self.read_point))
        if self.read_point_time is not None:
            point += f" (committed {utc_text(self.read_point_time)})"
        lines.append(f"consistent read point: {point}")
        lines.append(f"capture position: seq {self.position}" if self.position is not None
                     else "capture position: start")
        if self.landed_after is not None:
            lines.append(_landed_line(self.landed_after, self.landed_to_seq))
        if self.running:
            lines.append("a run is in progress, or the last one died: the next run redoes its slice")
        count = len(self.runs) if self.run_count is None else self.run_count
        shown = self.runs[max(0, len(self.runs) - last):]
        lines.append(f"runs: {count}" + (f" (last {len(shown)})" if count > len(shown) else ""))
        before = None  # the pgoutput-spark version of the run shown before (`_runs`' version)
        for r in shown:
            to = "-" if r["to_lsn"] is None else str(Lsn(r["to_lsn"]))
            changed = sum((t["inserted"] + t["updated"] + t["deleted"]) for t in r["tables"] or [])
            after = "the start" if r["lo_seq"] is None else f"seq {r['lo_seq']}"
            lines.append(f"  {r['finished_at']:%Y-%m-%d %H:%M:%S}  after {after} up to seq {r['hi_seq']}  "
                         f"to {to}  messages {r['messages']}  transactions {r['transactions']}  "
                         f"rows changed {changed}  skipped {r['quarantined_rows']}  "
                         f"quarantined {r['quarantined_messages']}  {r['duration_s']:.1f} s")
            version = r.get("version")  # absent from rows of before, None in their column
            if version is not None and before is not None and version != before:
                lines.append(f"      run by pgoutput-spark {version} (the run before by {before})")
            before = version or before
            for t in sorted(r["tables"] or [], key=lambda t: t["table"]):
                lines.append(f"      {t['table']}: +{t['inserted']} ~{t['updated']} -{t['deleted']}"
                             + (f" skipped {t['skipped']}" if t["skipped"] else "")
                             + (" truncated" if t["truncated"] else ""))
            for f in r.get("forgotten") or []:  # absent from rows of before
                lines.append(f"      forgot streamed transaction {f['xid']} (open since seq {f['first_seq']}, "
                             f"{f['rows']} rows)")
        if self.open_transactions:
            lines.append(f"open transactions carried to the next run: {len(self.open_transactions)}")
            for kind, xid, seq, lsn, rows in self.open_transactions:
                lines.append(f"  {kind} xid {xid} since seq {seq}"
                             + ("" if lsn is None else f" (LSN {Lsn(lsn)})") + f", {rows} rows")
            # Open before the last run's slice: carried over by a whole run at least.
            last_lo = self.runs[-1]["lo_seq"] if self.runs else None
            old = [xid for kind, xid, seq, _, _ in self.open_transactions
                   if kind == "streamed" and last_lo is not None and seq <= last_lo]
            if old:
                lines.append(f"  streamed and open across runs: {', '.join(map(str, old))}. One that its walsender "
                             f"session left behind is never sent again: if PostgreSQL reports it aborted "
                             f"(SELECT pg_xact_status('{old[0]}'::xid8)), forget it (apply --forget-xid {old[0]}), "
                             f"or let the runs ask it and forget what it reports aborted (apply --forget-aborted "
                             f"--dsn DSN)")
        if self.mirrors:
            lines.append("mirrors:")
            width = max(len(t) for t in self.mirrors)
            for table, (path, rows) in sorted(self.mirrors.items()):
                lines.append(f"  {table:<{width}}  {rows:>9} rows  {path}")
        return "\n".join(lines)


@dataclass(frozen=True)
class ChangeFeedStatus:
    """`status` of a change-feed target (`pgoutput_spark.changefeed.run_changes`: change tables
    under ``_changes``, its runs in ``_pgoutput/runs``), which has no lease, ``_runs`` or mirrors."""

    runs: list[dict[str, Any]]  # oldest first: the last finished runs' rows asked for (lo, hi, messages, changes, at)
    run_count: int  # the finished runs
    position: int | None  # capture seq up to which runs have finished
    running: bool  # a run started after the last finished one (running, or died: the next redoes it)
    landed_after: int | None = None  # as `Status`'s, with a capture
    landed_to_seq: int | None = None

    def render(self, last: int = 10) -> str:
        lines = ["change feed (pgoutput-spark changes): its change tables are under _changes",
                 f"capture position: seq {self.position}" if self.position is not None else "capture position: start"]
        if self.landed_after is not None:
            lines.append(_landed_line(self.landed_after, self.landed_to_seq))
        if self.running:
            lines.append("a run is in progress, or the last one died: the next run redoes its slice")
        shown = self.runs[max(0, len(self.runs) - last):]
        lines.append(f"runs: {self.run_count}" + (f" (last {len(shown)})" if self.run_count > len(shown) else ""))
        for r in shown:
            after = "the start" if r["lo"] is None or r["lo"] < 0 else f"seq {r['lo']}"
            lines.append(f"  {r['at']:%Y-%m-%d %H:%M:%S}  after {after} up to seq {r['hi']}  "
                         f"messages {r['messages']}  changes {r['changes']}")
        return "\n".join(lines)


def _landed_line(after: int, to_seq: int | None) -> str:
    return (f"landed after it: {after} messages, up to seq {to_seq}" if after
            else "landed after it: nothing (the target holds the whole capture)")


def _change_feed_status(spark: SparkSession, runs_path: str, last: int | None) -> ChangeFeedStatus:
    """`ChangeFeedStatus` from a change feed's runs table (two rows a run: started, finished)."""
    frame = spark.read.format("delta").load(runs_path)
    finished, started = F.col("status") == "finished", F.col("status") == "started"
    row = one_row(frame.agg(F.count(F.when(finished, 1)), F.max_by("hi", F.when(finished, F.col("at"))),
                            F.max(F.when(finished, F.col("at"))), F.max(F.when(started, F.col("at")))))
    count, position, done_at, started_at = row
    rows = frame.where(finished).orderBy("at")
    if last is not None:
        rows = rows.orderBy(F.desc("at")).limit(last)
    shown = sorted((r.asDict() for r in rows.select("lo", "hi", "messages", "changes", "at").collect()),
                   key=lambda r: r["at"])
    running = started_at is not None and (done_at is None or started_at > done_at)
    return ChangeFeedStatus(shown, count, position, running)


def status(spark: SparkSession, target: str, pipeline: str = "default", *, last: int | None = None,
           capture: DataFrame | None = None, columns: CaptureColumns | None = None) -> Status | ChangeFeedStatus:
    """The run history of ``target`` and the LSN up to which every mirror is complete.

    ``last``: `Status.runs` holds the last ``last`` runs' rows only (`Status.run_count`
    counts them all), read by Spark without bringing the others into Python: a target
    run every few minutes holds tens of thousands of runs (50,000 rows took about 3 s to
    read whole). ``None`` (the default) reads every run's row.

    ``capture`` (with its ``columns``, as `run_apply` takes them): also count its messages
    after the target's position (`Status.landed_after`, one Spark job over its seqs).

    A change feed's target (`pgoutput_spark.changefeed.run_changes`) gives a `ChangeFeedStatus`:
    its position and finished runs.
    """
    if last is not None and last < 0:
        raise ValueError(f"last must be 0 or more, not {last}")
    ledger = Ledger(spark, target, pipeline)
    feed = f"{ledger.root}/_pgoutput/runs"
    state: Status | ChangeFeedStatus
    if not _is_delta(spark, ledger.lease_path) and not _is_delta(spark, ledger.runs_path) and _is_delta(spark, feed):
        state = _change_feed_status(spark, feed, last)
    else:
        state = _status(spark, target, pipeline, count=True, runs=last)
        if state.read_point is not None:
            state = dataclasses.replace(state, read_point_time=_commit_time(spark, target, pipeline,
                                                                           state.read_point))
    if capture is not None:
        seq = (columns or CaptureColumns()).select(capture).select("seq")
        if state.position is not None:
            seq = seq.where(F.col("seq") > state.position)
        row = one_row(seq.agg(F.count_distinct("seq"), F.max("seq")))
        state = dataclasses.replace(state, landed_after=row[0], landed_to_seq=row[1])
    return state


def _commit_time(spark: SparkSession, target: str, pipeline: str, lsn: int) -> datetime | None:
    """The source commit time of the commit at ``lsn`` that a run of ``target`` applied last
    (`_runs`' ``to_commit_ts``; None in rows from before runs recorded it)."""
    runs = Ledger(spark, target, pipeline).runs_path
    if not _is_delta(spark, runs):
        return None
    finished = spark.read.format("delta").load(runs)
    if "to_commit_ts" not in finished.columns:
        return None
    micros = one_row(finished.where((F.col("pipeline") == pipeline) & (F.col("to_lsn") == lsn)).agg(
        F.max(F.unix_micros("to_commit_ts"))))[0]
    return utc_from_micros(micros)


def _status(spark: SparkSession, target: str, pipeline: str, *, count: bool, runs: int | None = None) -> Status:
    """`status`; without ``count``, each mirror's row count is left 0 (only its path is read)
    and the runs are not counted;
    with ``runs`` a number, `Status.runs` holds that many of the last runs (0: none) and each
    mirror's path is found by Spark (a run's row each: with 50,000 runs, about 3 s of `mirror`
    went to reading them into Python)."""
    ledger = Ledger(spark, target, pipeline)
    lease = ledger.lease() if _is_delta(spark, ledger.lease_path) else None  # none before a first run
    rows: list[dict[str, Any]] = []
    mirrors: dict[str, tuple[str, int]] = {}
    run_count = None
    if _is_delta(spark, ledger.runs_path):
        finished = spark.read.format("delta").load(ledger.runs_path).where(F.col("pipeline") == pipeline)
        order = ("hi_seq", "finished_at")  # a run that only rebuilds ends where the run before it did
        if runs is None:
            rows = [r.asDict(recursive=True)
                    for r in finished.orderBy(*order).drop("new_files", "lease_end").collect()]
            for run in rows:  # the path of a table's latest run
                for t in run["tables"] or []:
                    mirrors[t["table"]] = (t["path"], 0)
        else:  # three small Spark jobs, at once: each is mostly the driver's planning
            latest = finished.orderBy(*map(F.desc, order)).limit(runs).drop("new_files", "lease_end")
            paths = finished.select("hi_seq", F.explode("tables").alias("t")).groupBy("t.table").agg(
                F.max_by("t.path", "hi_seq").alias("path"))
            with ThreadPoolExecutor(max_workers=3) as pool:
                asked = pool.submit(latest.collect) if runs else None
                counted = pool.submit(finished.count) if count else None
                for r in paths.collect():
                    mirrors[r["table"]] = (r["path"], 0)
                rows = [] if asked is None else [r.asDict(recursive=True) for r in reversed(asked.result())]
                run_count = None if counted is None else counted.result()
    if _is_delta(spark, ledger.snapshots_path):  # mirrors a snapshot made, changed by no run yet
        snapshots = spark.read.format("delta").load(ledger.snapshots_path)
        if "path" in snapshots.columns:  # recorded since the snapshot's first tables are too
            for r in snapshots.where((F.col("pipeline") == pipeline) & F.col("path").isNotNull()).select(
                    "table", "path").collect():
                mirrors.setdefault(r["table"], (r["path"], 0))
    if count:  # from each mirror's Delta log where it can (`row_count`), the others' counts at once
        def with_rows(item: tuple[str, tuple[str, int]]) -> tuple[str, tuple[str, int]]:
            table, (path, _) = item
            return table, (path, row_count(spark, path) if _is_delta(spark, path) else 0)

        with ThreadPoolExecutor(max_workers=4) as pool:
            mirrors = dict(pool.map(with_rows, list(mirrors.items())))
    if lease is None:
        return Status(rows, None, False, None, mirrors, run_count=run_count)
    return Status(rows, lease.applied_lsn, lease.status == "running", lease.lo, mirrors,
                  _open_transactions(ledger.pending(lease.lo)), run_count)


def _open_transactions(pending: DataFrame | None) -> list[tuple[str, int | None, int, int | None, int]]:
    """`Status.open_transactions` from the rows a run saved (`Ledger.pending`)."""
    if pending is None:
        return []
    kind = F.col("message_type")
    rows = pending.groupBy(F.coalesce(F.col("top_xid"), F.col("block_seq")).alias("_txn"),
                           F.col("top_xid").isNotNull().alias("_streamed")).agg(
        F.max(kind.isin("prepare", "stream_prepare")).alias("prepared"),
        F.max(F.coalesce(F.col("top_xid"), F.col("begin.xid"), F.col("prepare.xid"))).alias("xid"),
        F.min("seq").alias("seq"), F.min("lsn").alias("lsn"), F.count(F.lit(1)).alias("rows"),
    ).orderBy("seq").collect()
    return [("prepared" if r["prepared"] else "streamed" if r["_streamed"] else "block", r["xid"], r["seq"],
             r["lsn"], r["rows"]) for r in rows]


# -- reading mirrors --------------------------------------------------------------------------------


class NotReadableError(PgoutputSparkError):
    """A mirror cannot show the source at the LSN asked for."""


def mirror(spark: SparkSession, target: str, table: str, *, as_of_lsn: int | str | None = None,
           pipeline: str = "default") -> DataFrame:
    """The mirror of source table ``table`` (``schema.table``, as in the source) under ``target``.

    With ``as_of_lsn``, the mirror as the source table was at that LSN, read by
    Delta time travel: the version of the newest of the mirror's commits
    whose recorded ``to_lsn`` (the run's last applied commit, or a
    snapshot's consistent point) is at or before it. Runs apply whole
    slices, so an LSN strictly inside a run's commit range (after its first
    commit, before its last) cannot be shown and raises `NotReadableError`
    naming the nearest LSNs that can, as does an LSN past the consistent read
    point (not applied yet) or before a snapshot the mirror started from.
    """
    ledger = Ledger(spark, target, pipeline)
    state = _status(spark, target, pipeline, count=False, runs=0)  # the mirrors' paths, not their rows
    paths = {t: p for t, (p, _) in state.mirrors.items()}
    path = paths.get(table)
    if path is None:  # a mirror no run or recorded snapshot wrote: its path by the default layout
        schema, _, name = table.partition(".")
        candidate = mirror_path(ledger.root, schema, name)
        if not name or not _is_delta(spark, candidate):
            known = ", ".join(sorted(paths)) or "none"
            raise NotReadableError(f"no mirror of {table} under {target} (its mirrors: {known})")
        path = candidate
    if as_of_lsn is None:
        return spark.read.format("delta").load(path)
    commits = recorded_commits(spark, path, pipeline)
    runs = [] if not _is_delta(spark, ledger.runs_path) else spark.read.format("delta").load(ledger.runs_path) \
        .where((F.col("pipeline") == pipeline) & F.col("to_lsn").isNotNull()).select("from_lsn", "to_lsn").collect()
    readable = sorted({lsn for _, lsn in commits} | {r["to_lsn"] for r in runs})
    point = state.read_point if state.read_point is not None else max((lsn for _, lsn in commits), default=None)
    at = _applied_at(table, as_of_lsn, point)
    for run in runs:
        if run["from_lsn"] is not None and run["from_lsn"] <= at < run["to_lsn"]:
            before = max((lsn for lsn in readable if lsn < run["from_lsn"]), default=None)
            raise NotReadableError(
                f"{Lsn(at)} is inside the commits one run applied at once ({Lsn(run['from_lsn'])} .. "
                f"{Lsn(run['to_lsn'])}): {table} can be read as of "
                + (f"{Lsn(before)} or " if before is not None else "") + f"{Lsn(run['to_lsn'])}")
    version = max((v for v, lsn in commits if lsn <= at), default=None)
    if version is None:
        if commits and started_by_snapshot(spark, path):
            # The snapshot's commit records the LSN before its consistent point (`slot.snapshot`).
            raise NotReadableError(f"the mirror of {table} starts with the snapshot taken at "
                                   f"{Lsn(commits[0][1] + 1)}, after {Lsn(at)}: it can be read as of "
                                   f"{Lsn(commits[0][1])} or later")
        # No change to the table was applied up to then: the source table held no rows.
        return spark.read.format("delta").load(path).limit(0)
    return spark.read.format("delta").option("versionAsOf", version).load(path)


def history(spark: SparkSession, target: str, table: str, *, as_of_lsn: int | str | None = None,
            pipeline: str = "default", history_path: str = DEFAULT_HISTORY_PATH) -> DataFrame:
    """The history table of source table ``table`` (``schema.table``, split at its first dot) under ``target``
    (`tables.history`; ``history_path`` as the runs' ``apply.history_path``): every version of
    every row, with its validity.

    With ``as_of_lsn``, the source table as it was at that LSN: the versions valid then, with
    the table's columns only. Each version keeps its own commit, so any LSN up to the
    consistent read point can be read, also one inside a run's commit range, which `mirror`
    cannot show. An LSN past the read point, or before a history that was turned on for an
    existing mirror began (its first versions are the mirror's rows then, `_version_seq`
    NULL), raises `NotReadableError`; so does a table without a history.
    """
    from .mirroring.history import HISTORY_NAMES

    ledger = Ledger(spark, target, pipeline)
    schema, _, name = table.partition(".")
    path = mirror_path(ledger.root, schema, name, history_path)
    if not name or not _is_delta(spark, path):
        raise NotReadableError(f"no history of {table} under {target} (none at {path}): a table has one when "
                               f"tables.history names it")
    frame = spark.read.format("delta").load(path)
    if as_of_lsn is None:
        return frame
    at = _applied_at(table, as_of_lsn, _status(spark, target, pipeline, count=False, runs=0).read_point)
    first, seeded = one_row(frame.agg(F.min("_valid_from_lsn"),
                                      F.min(F.when(F.col("_version_seq").isNull(), F.col("_valid_from_lsn")))))
    if seeded is not None and seeded == first and at < first:
        raise NotReadableError(f"the history of {table} starts at {Lsn(first)} with its mirror's rows then, after "
                               f"{Lsn(at)}: it can be read as of {Lsn(first)} or later")
    valid = (F.col("_valid_from_lsn") <= at) & (F.col("_valid_to_lsn").isNull() | (F.col("_valid_to_lsn") > at))
    return frame.where(valid).select(*[F.col(quote(c)) for c in frame.columns if c not in HISTORY_NAMES])


def _applied_at(table: str, as_of_lsn: int | str, point: int | None) -> int:
    """``as_of_lsn`` as an int, checked to be at or before the read ``point`` (`NotReadableError`
    past it, or when nothing is applied)."""
    at = int(Lsn(as_of_lsn)) if isinstance(as_of_lsn, str) else int(as_of_lsn)
    if point is None or at > point:
        raise NotReadableError(f"{table} is not applied up to {Lsn(at)} yet: the consistent read point is "
                               f"{'nothing applied' if point is None else Lsn(point)}")
    return at


def started_by_snapshot(spark: SparkSession, path: str) -> bool:
    """Whether the mirror's first commit that records what it applied is a snapshot's (the
    snapshot's CREATE TABLE before it records nothing)."""
    for row in spark.sql(f"DESCRIBE HISTORY {path_table(path)}").orderBy("version").select(
            "userMetadata").collect():
        try:
            meta = json.loads(row[0] or "{}").get(METADATA_KEY)
        except ValueError:
            continue
        if meta:
            return bool(meta.get("snapshot"))
    return False
