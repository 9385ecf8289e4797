"""The rows of transactions still open at a run's end, saved for the next run (the target's
``_pgoutput/pending``, partitioned by the run that saved them), and the streamed transactions a
run forgets there (``forget_xids``, ``forget_aborted``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ..errors import ConfigError
from .assemble import Assembled, ScanState
from .session import one_row, release

_log = logging.getLogger(__name__)


def _saved_rows(spark: SparkSession, path: str) -> DataFrame | None:
    """The open-transaction rows saved at ``path``; None when there is no table or it holds no
    file (runs that leave nothing open make it so): then nothing needs reading or deleting."""
    from ..capture import _is_delta
    from ..mirroring.deltalog import file_count
    from ..mirroring.listed import read_listed

    if not _is_delta(spark, path):
        return None
    files = file_count(spark, path)  # from the checksum, no job; None without one
    if files == 0:
        return None
    table = read_listed(spark, path)  # the open rows a run caches and saves back read these
    return table if files or table.inputFiles() else None  # a listing only without a checksum


def saved_open_rows(spark: SparkSession, path: str, run_hi: int | None) -> DataFrame | None:
    """The open-transaction rows saved at ``path`` by the run that ended at seq ``run_hi``
    (the ``pending`` of the next run's `assemble`), or None when there can be none."""
    table = None if run_hi is None else _saved_rows(spark, path)
    return None if table is None else table.where(F.col("_run_hi") == F.lit(run_hi)).drop("_run_hi")


def save_open_rows(assembled: Assembled, path: str, app_id: str, lo: int | None, hi: int) -> int:
    """Save the run's open-transaction rows at ``path`` tagged with its ``hi`` (``_run_hi``), and
    delete those saved by runs that ended before its ``lo``; return how many rows were saved.

    Each run reads back only the rows of the run that ended at its ``lo``
    (`saved_open_rows`), and a re-run of an interrupted slice reads the same
    ones, so those stay until the next run has saved its own; older rows are
    never read again, and without the delete a transaction open across many
    runs would stay in the table once per run. The save carries Delta's
    transaction identifiers (``app_id``, ``hi``: a redone run writes nothing
    twice). A run that saves rows into a table holding some does both in one
    commit, an overwrite of the rows ``_run_hi < lo`` (and ``= hi``, none
    unless redone). The table is partitioned by ``_run_hi`` (`PARTITIONS`), so
    Delta finds the rows to delete, and a run the rows to read back, by the
    partition values in its log, without reading files; a table written
    without partitions (by a version from before they were) is rewritten with
    them by the first run that saves rows into it, in that run's one commit. A
    run that saves none deletes the partitions before ``lo``. Where the table's checksum lists
    its files, the overwrite and the delete remove them by their partition values in one
    transaction each, without Delta's reconstruction of the table's state
    (`mirroring.listed.delete_listed`, `txn_append`'s ``replaced``); otherwise Delta's writer
    and DELETE do, the DELETE only where a query finds rows before ``lo``.
    """
    from ..capture import _is_delta
    from ..mirroring.delta import txn_append, txn_replace
    from ..mirroring.deltalog import file_count, partition_columns
    from ..mirroring.listed import delete_listed, read_current
    from ..mirroring.names import path_table
    from .decode import raw_bytes

    spark = assembled.scanned.sparkSession
    # Most runs end with nothing open, which the driver knows: no job for them.
    rows = assembled.open_rows.withColumns({"raw": raw_bytes(assembled.open_rows), "_run_hi": F.lit(hi)}).persist() \
        if assembled.may_leave_open else None
    try:
        n_open = rows.count() if rows is not None else 0  # the save then reads the cached rows
        if rows is not None and n_open:
            replaced = None if lo is None else f"_run_hi < {int(lo)} OR _run_hi = {int(hi)}"
            if not _is_delta(spark, path):
                txn_append(rows, path, app_id, hi, partition_by=PARTITIONS)
            elif partition_columns(spark, path) != PARTITIONS:  # the rows it keeps, and this run's
                kept = read_current(spark, path)
                if replaced is not None:
                    kept = kept.where(f"NOT ({replaced})")
                txn_replace(rows.unionByName(kept, allowMissingColumns=True), path, app_id, hi,
                            partition_by=PARTITIONS)
            else:  # the table exists: whether it may hold rows is its checksum's file count (`_holds_files`)
                replace = replaced is not None and file_count(spark, path) != 0
                txn_append(rows, path, app_id, hi, replace_where=replaced if replace else None,
                           replaced=_replaced_runs(lo, hi) if replace else None)
        elif lo is not None and _holds_files(spark, path) and \
                delete_listed(spark, path, f"_run_hi < {int(lo)}", _replaced_runs(lo, None)) is None and \
                _oldest_run_hi(spark, path) < lo:  # not a table its checksum lists: Delta's DELETE
            spark.sql(f"DELETE FROM {path_table(path)} WHERE _run_hi < {int(lo)}")
    finally:
        if rows is not None:
            release(rows)
    return n_open


@dataclass(frozen=True)
class ForgottenStream:
    """A streamed transaction a run forgot (``forget_xids``, or ``forget_aborted``: ``asked``):
    its rows, saved open since its first segment, were deleted unapplied, as if PostgreSQL had
    sent its Stream Abort."""

    xid: int
    first_seq: int  # seq of its first segment's Stream Start
    rows: int  # rows of it saved in ``_pgoutput/pending``, deleted
    asked: bool = False  # forgotten because the source server reported it aborted (``forget_aborted``)

    def note(self) -> str:
        """What a run says of it (its result, progress line and log)."""
        why = "PostgreSQL reports it aborted" if self.asked else "forget_xids"
        return (f"forgotten ({why}): streamed transaction {self.xid}, open since seq {self.first_seq}, "
                f"{self.rows} rows left out unapplied")


#: Asks the source server for transactions' outcomes: xid -> ``pg_xact_status`` (None: it
#: cannot tell). `pgoutput_spark.slot.xact_status.xact_statuses` with a connection string.
AskStatus = Callable[[list[int]], dict[int, str | None]]


def status_asker(forget_aborted: str | None) -> AskStatus | None:
    """`to_forget`'s ``ask`` for a run's ``forget_aborted``, a libpq connection string (``""``:
    the PG* environment variables); None, for None: the run asks nothing."""
    if forget_aborted is None:
        return None
    from ..slot.xact_status import xact_statuses

    return lambda xids: xact_statuses(forget_aborted or None, xids)


def to_forget(spark: SparkSession, path: str, lo: int | None, scan: ScanState, xids: tuple[int, ...], *,
              redone: bool, ask: AskStatus | None = None,
              say: Callable[[str], None] | None = None) -> tuple[ForgottenStream, ...]:
    """The streamed transactions ``xids`` open in the rows saved at ``path`` by the run that
    ended at ``lo`` (a run's ``forget_xids``); `ConfigError`, naming those that are open, for
    any other, and for one whose stream block the capture is still inside at ``lo`` (``scan``:
    its next messages continue it). A run that redoes an interrupted one (``redone``) takes an
    xid that is not open as forgotten by it (the same command retried), and logs so.

    With ``ask`` (a run's ``forget_aborted``), the source server is asked about the other
    streamed transactions open there, but for one whose stream block the capture is inside:
    those it reports aborted are forgotten too; each it reports otherwise is logged and told
    to ``say`` (kept open: its end is still to come, or the server cannot tell)."""
    streams = {} if lo is None else open_streams(spark, path, lo)
    opened = ", ".join(f"{xid} (since seq {first}, {rows} rows)" for xid, (first, rows) in sorted(streams.items()))
    at = "the start" if lo is None else f"seq {lo}"
    for xid in xids:
        if xid not in streams and redone:
            _log.warning(
                "forget_xids: %s is not open at seq %s: taken as forgotten by the interrupted run this run redoes",
                xid, lo)
        elif xid not in streams:
            raise ConfigError(f"forget_xids: {xid} is not a streamed transaction open at the target's "
                              f"position ({at}); open ones: {opened or 'none'}. Nothing was written")
        elif xid == scan.last_stream_xid:
            raise ConfigError(f"forget_xids: the capture is still inside a stream block of transaction {xid} "
                              f"at the target's position ({at}): its next messages continue it. Nothing was written")
    aborted: set[int] = set()
    candidates = sorted(set(streams) - set(xids) - {scan.last_stream_xid})
    if ask is not None and candidates:
        statuses = ask(candidates)
        for xid in candidates:
            status = statuses.get(xid)
            if status == "aborted":
                aborted.add(xid)
                continue
            first, rows = streams[xid]
            line = (f"kept open (forget_aborted): streamed transaction {xid}, open since seq {first}, {rows} rows: "
                    + (f"PostgreSQL reports it {status}" if status is not None else
                       "PostgreSQL no longer knows its outcome (older than its oldest transaction status); if it "
                       "aborted, forget it with forget_xids"))
            (_log.info if status is not None else _log.warning)("%s", line)
            if say is not None:
                say(line)
    return tuple(ForgottenStream(xid, *streams[xid], asked=xid in aborted)
                 for xid in sorted(set(xids) | aborted) if xid in streams)


def open_streams(spark: SparkSession, path: str, run_hi: int | None) -> dict[int, tuple[int, int]]:
    """The streamed transactions still open in the rows saved at ``path`` by the run that ended
    at ``run_hi``: xid -> (seq of its first segment's Stream Start, rows saved). One prepared by
    a Stream Prepare is not open: its Commit or Rollback Prepared always comes."""
    saved = saved_open_rows(spark, path, run_hi)
    if saved is None:
        return {}
    streams = saved.where(F.col("top_xid").isNotNull() & F.col("block_seq").isNull()).groupBy("top_xid").agg(
        F.min("seq").alias("first"), F.count(F.lit(1)).alias("rows"),
        F.max((F.col("message_type") == "stream_prepare").cast("int")).alias("prepared"))
    return {r["top_xid"]: (r["first"], r["rows"]) for r in streams.collect() if not r["prepared"]}


def forget_open_streams(spark: SparkSession, path: str, run_hi: int, forgotten: tuple[ForgottenStream, ...],
                        say: Callable[[str], None]) -> None:
    """Delete the rows of the streamed transactions ``forgotten`` (`to_forget`) from those saved
    at ``path`` by the run that ended at ``run_hi`` (`open_streams`): the next run's assembly no
    longer holds them open. Deleting them again deletes nothing. Each is logged as a warning
    and told to ``say`` (the run's progress)."""
    from ..mirroring.names import path_table

    if not forgotten:
        return
    spark.sql(f"DELETE FROM {path_table(path)} WHERE _run_hi = {int(run_hi)} AND block_seq IS NULL "
              f"AND top_xid IN ({', '.join(str(int(f.xid)) for f in forgotten)})")
    for f in forgotten:
        _log.warning("%s", f.note())
        say(f.note())


#: The partition columns of a target's ``pending`` table (`save_open_rows`).
PARTITIONS = ("_run_hi",)


def _replaced_runs(lo: int | None, hi: int | None) -> Callable[[dict[str, str | None]], bool]:
    """`save_open_rows`'s ``_run_hi < lo OR _run_hi = hi`` (either part left out for None) as a
    test of a file's partition values."""
    def replaced(values: dict[str, str | None]) -> bool:
        run_hi = values.get("_run_hi")
        return run_hi is not None and ((lo is not None and int(run_hi) < lo) or (hi is not None and int(run_hi) == hi))
    return replaced


def _holds_files(spark: SparkSession, path: str) -> bool:
    """Whether the Delta table at ``path`` exists and may hold rows: its checksum counts its
    files (no Spark job); without a checksum, it may."""
    from ..capture import _is_delta
    from ..mirroring.deltalog import file_count

    return _is_delta(spark, path) and file_count(spark, path) != 0


def _oldest_run_hi(spark: SparkSession, path: str) -> int | float:
    """The smallest ``_run_hi`` saved at ``path`` (infinity for no table, or no row): a query,
    unless the table's checksum shows it holds no file (a run that saves rows needs none: its
    overwrite finds the rows to delete itself)."""
    from ..mirroring.names import path_table

    if not _holds_files(spark, path):
        return float("inf")
    oldest = one_row(spark.sql(f"SELECT min(_run_hi) FROM {path_table(path)}"))[0]
    return float("inf") if oldest is None else int(oldest)
