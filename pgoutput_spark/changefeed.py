"""The ``changes`` job: capture slice -> typed, committed change rows in Delta, run after run.

Layout under the target root::

    <target>/_changes/<schema>/<table>/   one Delta change table per source table (names as in
                                         the mirrors' default layout, `mirror_path`)
    <target>/_messages/                  logical decoding messages (Delta)
    <target>/_pgoutput/runs/             one row per run start and finish (Delta)
    <target>/_pgoutput/relations/        every Relation / Type message seen (Delta)
    <target>/_pgoutput/pending/          rows of transactions still open, per run (Delta)
    <target>/_pgoutput/quarantine/       undecodable messages with raw bytes and reason
                                         (with on_error="quarantine"; otherwise the run fails)

Exactly once: a run first records the capture slice it takes, ``(lo, hi]`` in
seq; every Delta write of the run carries the transaction identifier
(``txnAppId`` = pipeline + table, ``txnVersion`` = ``hi``), so re-running an
interrupted run repeats the same slice and Delta skips what was already
written. Open transactions of a run are kept in ``pending`` tagged with ``hi``
and read back by the next run only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from .assemble.relations import RelationHistory, versions_from_rows
from .capture import CaptureColumns, Landed, landed_files, late_note, repeated_note, slice_end, slice_messages
from .config import TablesConfig
from .ledger import FORGOTTEN, saved_history
from .mirroring.delta import append_rows, compact_files, txn_append, vacuum_tables
from .mirroring.listed import read_listed
from .mirroring.names import absolute_path, mirror_path, path_table
from .mirroring.schema import plan_schema
from .spark.assemble import ScanState, assemble, session_end_lines
from .spark.changes import CHANGE_ROW_COLUMNS, typed_change_frame
from .spark.connect import require_classic
from .spark.decode import OnError, decode, quarantined
from .spark.failures import explains_spark_failures
from .spark.pending import (ForgottenStream, forget_open_streams, save_open_rows, saved_open_rows, status_asker,
                            to_forget)
from .spark.sessions import Sessions, find_sessions
from .spark.session import (
    local_frame,
    one_row,
    release,
    small_run,
    warm_python_workers,
    without_codegen,
)
from .version import __version__

RUNS_SCHEMA = ("status string, lo long, hi long, begin_seq long, stream_xid long, "
               f"messages long, changes long, at timestamp, new_files array<string>, forgotten {FORGOTTEN}, "
               "session string, version string")


@dataclass(frozen=True)
class ChangesResult:
    lo: int | None
    hi: int | None
    messages: int = 0
    changes: dict[str, int] = field(default_factory=dict)
    open_rows: int = 0
    quarantined: int = 0
    skipped: bool = False
    redone: bool = False  # this run redid an interrupted run's slice
    remaining: bool = False  # ``max_messages`` ended the run before the capture's end
    repeated_rows: int = 0  # capture rows left out as repeats of a message (`one_row_per_message`)
    # Capture files no earlier run saw, and their rows at or below the position (`capture.Landed`).
    landed: Landed = field(default_factory=Landed)
    # Tables with changes in the slice that ``tables.include`` / ``exclude`` leave out (first names).
    excluded: tuple[str, ...] = ()
    forgotten: tuple[ForgottenStream, ...] = ()  # streamed transactions forgotten (``forget_xids``)

    def render(self) -> str:
        if self.skipped:
            return f"nothing new after seq {self.lo}: no Delta commit" + (
                f"\n{late_note(self.landed)}" if self.landed.unread else "")
        start = "the start" if self.lo is None else f"seq {self.lo}"
        lines = [f"capture slice: after {start} up to seq {self.hi}"
                 + (" (redoing an interrupted run)" if self.redone else ""),
                 f"messages: {self.messages}{repeated_note(self.repeated_rows)}",
                 f"quarantined messages: {self.quarantined}",
                 f"rows of open transactions carried over: {self.open_rows}", "changes per table:"]
        lines += [f"  {name}: {count}" for name, count in sorted(self.changes.items())]
        if self.excluded:
            lines.append(f"not written (tables.include / exclude): {', '.join(self.excluded)}")
        if self.landed.late_rows:
            lines.append(late_note(self.landed))
        lines += [f.note() for f in self.forgotten]
        if self.remaining:
            lines.append(f"more of the capture remains after seq {self.hi}: run again")
        return "\n".join(lines)


def _exists(spark: SparkSession, path: str) -> bool:
    from .capture import _is_delta

    return _is_delta(spark, path)


class _State:
    def __init__(self, spark: SparkSession, target: str, pipeline: str) -> None:
        self.spark, self.target, self.pipeline = spark, absolute_path(target.rstrip("/")), pipeline
        self.runs = f"{self.target}/_pgoutput/runs"
        self.relations_path = f"{self.target}/_pgoutput/relations"
        self.pending_path = f"{self.target}/_pgoutput/pending"
        self.quarantine_path = f"{self.target}/_pgoutput/quarantine"

    def position(self) -> tuple[Any | None, Any | None, set[str] | None]:
        """The last finished run's row, the last started run's row (an interrupted run's where it
        ends after the finished one) and the capture files the finished runs saw (None before any
        recorded them): one Spark job that brings no other run's row into Python (two rows a run;
        reading them whole took seconds once runs were counted in tens of thousands)."""
        if not _exists(self.spark, self.runs):
            return None, None, None
        frame = read_listed(self.spark, self.runs)
        if "new_files" not in frame.columns:  # a runs table of before the runs recorded their files
            frame = frame.withColumn("new_files", F.lit(None).cast("array<string>"))
        if "session" not in frame.columns:  # nor the walsender session of their last message
            frame = frame.withColumn("session", F.lit(None).cast("string"))
        row = F.struct("lo", "hi", "begin_seq", "stream_xid", "messages", "session")
        finished, started = F.col("status") == "finished", F.col("status") == "started"
        seen = F.when(finished, F.col("new_files"))
        last, interrupted, files, recorded = one_row(frame.agg(
            F.max_by(row, F.when(finished, F.col("at"))), F.max_by(row, F.when(started, F.col("at"))),
            F.array_distinct(F.flatten(F.collect_list(seen))), F.count(seen)))
        return last, interrupted, set(files) if recorded else None

    def slices(self) -> list[tuple[int, int, int]]:
        """(lo, hi, messages) of each finished run: for the check of files landed late."""
        return [tuple(r) for r in read_listed(self.spark, self.runs)
                .where(F.col("status") == "finished").select("lo", "hi", "messages").collect()]

    def record(self, status: str, lo: int, hi: int, scan: ScanState, messages: int = 0,
               changes: int = 0, new_files: tuple[str, ...] | None = None,
               forgotten: tuple[ForgottenStream, ...] = ()) -> None:
        row = [(status, lo, hi, scan.last_begin_seq, scan.last_stream_xid, messages, changes, None,
                None if new_files is None else list(new_files),
                [(f.xid, f.first_seq, f.rows) for f in forgotten] or None, scan.last_session, __version__)]
        frame = local_frame(self.spark, row, RUNS_SCHEMA).withColumn("at", F.current_timestamp())
        append_rows(frame, self.runs)
        if compact_files(self.spark, self.runs):  # a file or two per run; compacted every 25 runs or so:
            vacuum_tables(self.spark, [path for path in (self.runs, self.relations_path, self.pending_path,
                                                         self.quarantine_path)
                                       if _exists(self.spark, path)])  # what rewrites and compactions left

    def history(self) -> RelationHistory:
        return saved_history(self.spark, self.relations_path)

    def pending(self, hi: int | None) -> DataFrame | None:
        return saved_open_rows(self.spark, self.pending_path, hi)


@explains_spark_failures
def run_changes(spark: SparkSession, capture: DataFrame, target: str, *,
                columns: CaptureColumns | None = None, pipeline: str = "default",
                on_error: OnError = "fail", skip_origins: tuple[str, ...] = (),
                max_messages: int | None = None,
                progress: Callable[[str], None] | None = None,
                accept_late_files: bool = False, seq_gaps: Literal["fail", "allow"] | None = None,
                tables: TablesConfig | None = None, forget_xids: tuple[int, ...] | list[int] = (),
                forget_aborted: str | None = None) -> ChangesResult:
    """Apply the next slice of ``capture`` to the change tables under ``target``.

    ``max_messages`` bounds a run's size as for `pgoutput_spark.apply.run_apply`: the
    run takes the messages whose seq is below the next message's seq plus
    ``max_messages`` and says (``remaining``) when more remain.
    ``progress`` hears one line for the slice, one per change table written and one per
    streamed transaction a walsender session left open, forgotten (as by `run_apply`).

    Capture files that land after runs wrote past their seqs are checked as by
    `pgoutput_spark.apply.run_apply` (`capture.landed_files`): messages no run read fail
    the run, unless ``accept_late_files`` (the change tables then go on without them).
    A slice missing seqs fails the run as in `run_apply` (``seq_gaps``: by default only for
    `read_capture`'s frame of a landing ``pgoutput-spark capture`` wrote).

    ``tables`` (the configuration's ``tables``) chooses the tables written, ``include`` /
    ``exclude``, and their columns' types, ``types``, as for the mirrors (by the name a table had
    when the pipeline first saw it); ``keys`` and ``history`` are the mirrors' own.

    ``forget_xids`` forgets streamed transactions open at the target's position that
    PostgreSQL will never end, as `run_apply`'s does (their saved rows deleted unwritten,
    recorded in the run's row of ``_pgoutput/runs`` and in ``forgotten``); ``forget_aborted``
    (a connection string to the capture's source server) forgets those it reports aborted, as
    `run_apply`'s does.
    """
    require_classic(spark, "the changes job")
    if max_messages is not None and max_messages < 1:
        raise ValueError(f"max_messages must be at least 1, not {max_messages}")
    warm_python_workers(spark)  # meanwhile: the first run of a new JVM reads its position
    state = _State(spark, target, pipeline)
    canonical = (columns or CaptureColumns()).select(capture)
    with without_codegen(spark):  # one aggregate over the runs' rows: the first Delta read of a new JVM
        last, interrupted, files = state.position()
    scan_in = ScanState(last["begin_seq"], last["stream_xid"], last["session"]) if last else ScanState()
    lo = last["hi"] if last else None
    started = interrupted is not None and (lo is None or interrupted["hi"] > lo)
    landed = landed_files(capture, columns or CaptureColumns(), lo, files, state.slices, accept=accept_late_files,
                          remedy="start the change tables over in a new target, or run with "
                                 "--accept-late-files (accept_late_files=True) to go on without them")
    forgotten: tuple[ForgottenStream, ...] = ()
    if forget_xids or forget_aborted is not None:  # checked before anything is written
        forgotten = to_forget(spark, state.pending_path, lo, scan_in, tuple(forget_xids), redone=started,
                              ask=status_asker(forget_aborted), say=progress)
    say = progress or (lambda line: None)
    remaining = False
    counts = None  # (rows, messages) of the slice, where finding its end counted them
    if started:  # an interrupted run: redo exactly its slice
        assert interrupted is not None
        hi = interrupted["hi"]
    else:
        newer = canonical if lo is None else canonical.where(F.col("seq") > lo)
        if max_messages is not None:
            first = one_row(newer.agg(F.min("seq")))[0]
            if first is not None:
                newer = newer.where(F.col("seq") <= first + max_messages - 1)
        hi, counts = slice_end(newer)
        if hi is None:
            if forgotten:  # nothing new: a run that only forgets
                assert lo is not None
                forget_open_streams(spark, state.pending_path, lo, forgotten, say)
            if (landed.unread or forgotten) and lo is not None:  # recorded, so that the next run goes on
                state.record("finished", lo, lo, scan_in, new_files=landed.new_files, forgotten=forgotten)
            if forgotten:
                return ChangesResult(lo, lo, landed=landed, forgotten=forgotten)
            return ChangesResult(lo, None, skipped=True, landed=landed)
        if max_messages is not None:
            remaining = canonical.where(F.col("seq") > hi).limit(1).count() > 0
    with small_run(spark, hi - (lo if lo is not None else -1)):  # without generated code (`small_run`)
        window = canonical.where(F.col("seq") <= hi)
        if lo is not None:
            window = window.where(F.col("seq") > lo)
        # Checked before the run is recorded: a bad landing changes nothing.
        window, repeated, n_messages = slice_messages(
            capture, window, lo, hi, seq_gaps=seq_gaps, counts=counts, remedy=(
            "Put the files back; if they are gone, start the change tables over in a new target, or run with "
            "--allow-seq-gaps (seq_gaps='allow') to go on without them"))
        if not started:
            state.record("started", lo if lo is not None else -1, hi, scan_in)
        if forgotten:
            assert lo is not None
            forget_open_streams(spark, state.pending_path, lo, forgotten, say)
        sessions = find_sessions(window, scan_in.last_session)  # None: the capture does not say
        decoded = decode(window, on_error=on_error, tuples=False, raw_as_string=True,  # decoded in the table tasks
                         positions=scan_in, initially_in_stream=scan_in.last_stream_xid is not None,
                         sessions=sessions).persist()
        say(f"slice: after {'the start' if lo is None else f'seq {lo}'} up to seq {hi}"
            + (" (redoing an interrupted run)" if started else ""))
        try:
            result = _apply(spark, state, decoded, n_messages, scan_in, lo, hi, skip_origins, say, landed.new_files,
                            tables or TablesConfig(), on_error, forgotten, sessions)
            return dataclasses.replace(result, redone=bool(started), remaining=remaining, repeated_rows=repeated,
                                       landed=landed)
        finally:
            release(decoded)


def _apply(spark: SparkSession, state: _State, decoded: DataFrame, n_messages: int, scan_in: ScanState,
           lo: int | None, hi: int, skip_origins: tuple[str, ...], say: Callable[[str], None],
           new_files: tuple[str, ...], tables: TablesConfig, on_error: OnError,
           forgotten: tuple[ForgottenStream, ...] = (), sessions: Sessions | None = None) -> ChangesResult:
    meta = decoded.where(F.col("message_type").isin("relation", "type")).select("seq", "relation", "type")
    history = state.history()
    history.type_overrides = tables.types
    new_meta = meta.collect()  # Relation / Type messages: a few per relation and session
    new_versions = [v.seq for v in history.add(versions_from_rows(new_meta))]  # those changing a schema
    if new_versions:
        txn_append(meta.where(F.col("seq").isin(new_versions)), state.relations_path,
                   f"{state.pipeline}:relations", hi)
    assembled = assemble(decoded, scan_in, pending=state.pending(lo), skip_origins=skip_origins, sessions=sessions)
    for line in session_end_lines(assembled.ledger):
        say(line)
    tuples = assembled.pending_tuples
    committed = assembled.committed.select(*CHANGE_ROW_COLUMNS).persist()
    counts: dict[str, int] = {}
    try:
        # One row per (change, relation it touches): a truncate touches each of its relations.
        touched = committed.select(F.explode(F.when(
            F.col("message_type") == "truncate", F.col("truncate.relation_ids"))
            .otherwise(F.array(F.col("change.relation_id")))).alias("relation_id"))
        per_relation = {r["relation_id"]: r["count"]
                        for r in touched.groupBy("relation_id").count().collect()}
        for relation_id in sorted(per_relation):
            if relation_id not in history.relations:
                first = one_row(committed.where(F.col("change.relation_id") == relation_id).agg(F.min("seq")))[0]
                seq = first if first is not None else -1
                history.version_at(relation_id, seq)  # raises UnknownRelationError (OID, seq)
        chosen, excluded = history.selected(sorted(per_relation), tables)
        plans = {}  # every table's schema checked before anything is written
        for relation_id in chosen:
            latest = history.latest(relation_id)
            plans[relation_id] = plan_schema(
                spark, mirror_path(f"{state.target}/_changes", latest.namespace, latest.name),
                f"{latest.namespace}.{latest.name}", history.table_columns(relation_id),
                remedy="Move the change table away to start a new one from this run on")
        for relation_id, plan in plans.items():
            latest = history.latest(relation_id)
            if plan.widen:  # the append widens them (and their `_old` fields) once this is on
                spark.sql(f"ALTER TABLE {path_table(plan.path)} SET TBLPROPERTIES "
                          f"('delta.enableTypeWidening' = 'true')")
            frame = typed_change_frame(committed, relation_id, history, plan.columns,
                                       rows=per_relation[relation_id], tuples=tuples)
            txn_append(frame, plan.path, f"{state.pipeline}:changes:{relation_id}", hi,
                       new_table=not plan.exists)
            counts[f"{latest.namespace}.{latest.name}"] = per_relation[relation_id]
            say(f"table {len(counts)}/{len(plans)} written: {latest.namespace}.{latest.name} "
                f"{per_relation[relation_id]} changes")
        messages = assembled.messages
        txn_append(messages, f"{state.target}/_messages", f"{state.pipeline}:messages", hi)
        release(committed)  # before the save, as apply's (a cache reading the pending table is planned again)
        # The next run reads them back by this run's hi.
        n_open = save_open_rows(assembled, state.pending_path, f"{state.pipeline}:pending", lo, hi)
    finally:
        release(committed)
        assembled.release()
    bad = quarantined(decoded)
    n_bad = bad.count() if on_error == "quarantine" else 0  # a bad message fails the decoding otherwise
    if n_bad:  # kept with their raw bytes and reason
        txn_append(bad, state.quarantine_path, f"{state.pipeline}:quarantine", hi)
    state.record("finished", lo if lo is not None else -1, hi, assembled.end_state, n_messages,
                 sum(counts.values()), new_files, forgotten)
    return ChangesResult(lo, hi, n_messages, counts, n_open, n_bad, excluded=excluded, forgotten=forgotten)
