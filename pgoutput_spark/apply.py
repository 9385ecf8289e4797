"""The ``apply`` job: capture slice -> Delta mirror tables equal to their source tables.

Layout under the target root::

    <root>/<schema>/<table>/        one mirror per source table (`mirroring.delta.mirror_path`)
    <root>/_runs/                   one row per finished run (Delta; `status` prints it)
    <root>/_pgoutput/lease/         the pipeline's position, the run holding it and the capture
                                    files the runs before it saw (one row; the holder's end is
                                    in its ``_runs`` row once it has finished)
    <root>/_pgoutput/relations/     the Relation / Type messages that changed a schema (not
                                    their repeats, one per walsender session)
    <root>/_pgoutput/pending/       rows of transactions still open at the end of a run (the
                                    last two runs' only: `save_open_rows`)
    <root>/_pgoutput/quarantine/    undecodable messages with raw bytes (on_error="quarantine")
    <root>/_pgoutput/skipped/       updates and deletes that found no row, with the reason

A run takes the capture slice ``(lo, hi]`` in seq after the previous run. It
claims the slice in the lease with a conditional Delta UPDATE (a concurrent
run conflicts on that commit, or finds the lease moved, and fails with
`ConcurrentRunError`); then, before anything is written, checks every
mirror's schema against its source; then merges each table once (tables in
parallel), each MERGE carrying ``txnAppId`` = ``<pipeline>:relation:<oid>``
and ``txnVersion`` = the run's last applied commit LSN; then saves relations
and open transactions, compacts ``_runs`` and the other tables it appends to
when they hold many files, and appends its run row, which hands the lease back
(the row records the run's end; the next claim writes it into the lease). A
run that dies before its row leaves the lease ``running`` with no row: the next
run redoes exactly that slice, and Delta skips the merges that already committed.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from .assemble.relations import RelationHistory, versions_from_rows
from .assemble.typed import change_schema
from .capture import CaptureColumns, Landed, _is_delta, landed_files, one_row_per_message, slice_end, slice_messages
from .config import TablesConfig
from .errors import ConfigError
from .ledger import RUNS_SCHEMA, ConcurrentRunError, Lease, Ledger
from .mirroring.delta import (
    DEFAULT_HISTORY_PATH,
    DEFAULT_TABLE_PATH,
    CatalogError,
    SchemaPlan,
    append,
    applied_commit,
    apply_schema,
    catalog_name,
    catalog_registered,
    compact_files,
    merge,
    mirror_path,
    plan_schema,
    quote,
    recorded_commits,
    register,
    table_spec,
    txn_append,
    user_metadata,
    vacuum_tables,
)
from .mirroring.history import TOAST_CONFLICT, history_frame, merge_history, plan_history
from .mirroring.net import TOAST_CONFLICT_REASON, TableSpec
from .mirroring.rows import (
    LOCAL_NET_ROWS,
    NET_TASK_ROWS,
    converted_net_frame,
    halved_net_frame,
    halved_tasks,
    local_converted_net,
    looked_up,
    moved_buckets,
    net_frame,
    net_tasks,
    pre_image,
)
from .reading import NotReadableError, Status, mirror, started_by_snapshot, status
from .results import ApplyResult, TableResult, utc_from_micros
from .spark.assemble import (Assembled, ForgottenStream, ScanState, assemble, forget_open_streams, save_open_rows,
                             session_end_lines, status_asker, to_forget)
from .spark.changes import CHANGE_ROW_COLUMNS, converter, relation_rows, typed_change_frame
from .spark.decode import OnError, decode, quarantined
from .spark.sessions import Sessions, find_sessions
from .spark.session import (
    copy_session,
    explains_spark_failures,
    local_frame,
    release,
    small_run,
    temporary_conf,
    warm_python_workers,
    without_codegen,
)
from .version import __version__

# The read side (`reading`) is importable from here too, as documented: apply.status, apply.mirror.
__all__ = ["ApplyResult", "ConcurrentRunError", "NotReadableError", "Status", "TableResult", "mirror",
           "run_apply", "status"]

_log = logging.getLogger(__name__)


@contextmanager
def _step(what: str) -> Iterator[None]:
    """Log how long one step of a run took (logger ``pgoutput_spark.apply``, level INFO)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        _log.info("%s: %.2f s", what, time.perf_counter() - started)


@explains_spark_failures
def run_apply(spark: SparkSession, capture: DataFrame, target: str, *,
              columns: CaptureColumns | None = None, pipeline: str = "default",
              on_error: OnError = "fail", skip_origins: tuple[str, ...] = (),
              parallelism: int = 4, table_path: str = DEFAULT_TABLE_PATH,
              table_name: str | None = None, tables: TablesConfig | None = None,
              history_path: str = DEFAULT_HISTORY_PATH,
              until_seq: int | None = None, until_lsn: int | None = None,
              slice_where: str | None = None, max_messages: int | None = None,
              net_task_rows: int = NET_TASK_ROWS,
              progress: Callable[[str], None] | None = None,
              rebuild: tuple[str, ...] | list[str] = (),
              accept_late_files: bool = False, seq_gaps: Literal["fail", "allow"] | None = None,
              forget_xids: tuple[int, ...] | list[int] = (),
              forget_aborted: str | None = None) -> ApplyResult:
    """Apply the next slice of ``capture`` to the mirror tables under ``target``.

    ``table_path`` places each mirror (default ``{root}/{schema}/{table}``);
    ``table_name``, if given, names each in the catalog too (an external Delta
    table; e.g. ``mirrors.{schema}__{table}``). ``tables`` chooses the tables
    mirrored and their key and type overrides (the configuration's ``tables``).

    A bounded slice, for backfills, ends at ``until_seq``, at the last message
    at or before ``until_lsn``, or at the last row of ``capture`` matching the
    SQL predicate ``slice_where`` (a capture partition, e.g. ``"landed_date =
    '2026-11-01'"``); with several, the earliest end. The run applies
    everything after the target's position up to that end: a slice the target
    already holds is skipped (and says so), one whose earlier slices were not
    applied yet applies them too (and says so), so slices are safe to re-run,
    to run late and to run out of order.

    ``max_messages`` bounds a run's size: it applies the messages whose seq is
    below the next message's seq plus ``max_messages`` (at most that many; with
    gaps in ``seq``, fewer) and says when more remain: run again (or with
    ``--until-caught-up``) to continue.

    ``net_task_rows``: a table with more change rows in the run than this has its
    net change (and history) spread over ``ceil(rows / net_task_rows)`` tasks by
    key (updates that move a row between keys in halves, see `net.net_changes`;
    with a history, in joined buckets, so that some tasks may get fewer rows and
    others more); below it, one task nets the table's rows, or the driver itself
    for a table with at most `LOCAL_NET_ROWS` change rows and no history.

    ``progress`` hears one line per stage: the slice, transactions and tables
    found, each table written (the command line prints them on stderr), and one per
    streamed transaction that a walsender session left open (a capture with a ``session``
    column: `pgoutput_spark.spark.sessions`), forgotten where the next session begins.

    ``rebuild`` (``schema.table`` names, as first seen) rebuilds those mirrors
    from the start of the capture: every change of the table up to the run's
    end is replayed into a new mirror that replaces the old one in one
    commit. The capture must still hold everything from the pipeline's first
    run (a capture holding fewer messages than the runs read is refused:
    `_Rebuild.check_capture`); a table that started from a (re-)snapshot, or
    that keeps a history, cannot be rebuilt this way (re-snapshot it). With
    nothing new in the capture the run rebuilds only.

    Each run records the capture files it saw. Files that land after runs applied past
    their seqs are checked (`capture.landed_files`): rows that repeat messages the runs
    read are left out and counted; messages no run read fail the run with a `CaptureError`
    before anything is written, unless ``accept_late_files`` (after a rebuild or
    re-snapshot of the mirrors, or to let them go): the run then records those files.

    ``seq_gaps``: a seq missing from the run's slice fails it with a `CaptureError` naming
    the seqs, before anything is written (``"fail"``), or is taken as the landing's (the
    contract allows gaps: ``"allow"``). By default (None) ``"fail"`` when ``capture`` is
    `read_capture`'s frame of a landing ``pgoutput-spark capture`` wrote, whose seqs follow
    one another from 0 (a missing one is a file deleted or expired before a run applied
    it), ``"allow"`` for any other frame.

    ``forget_xids``: streamed transactions open at the target's position (`status` lists
    them) that PostgreSQL will never end, forgotten by this run before it applies anything:
    their saved rows are deleted unapplied, as a Stream Abort would discard them, and the
    run's result and ``_runs`` row record them (`ForgottenStream`). A walsender session that
    ends inside a streamed transaction leaves it so when the transaction aborts before the
    next session could send it again: the apply worker forgets it with its session; the
    capture has no session boundary. Check first that PostgreSQL reports the transaction
    aborted (``SELECT pg_xact_status(...)``): one that goes on would fail a later run (its
    next segment continues a transaction no longer open), and one that commits would be
    lost. An xid that is not a streamed transaction open at the target's position (nor
    prepared), or whose stream block the capture is still inside, fails the run with a
    `ConfigError` before anything is written, except in a run that redoes an interrupted
    one, which may have forgotten it already (the same command retried). With nothing new in
    the capture the run only forgets.

    ``forget_aborted``: a libpq connection string to the capture's source server (``""``: the
    PG* environment variables). The run asks it (``pg_xact_status``) about the streamed
    transactions open at the target's position, but for one whose stream block the capture is
    still inside, and forgets those it reports aborted, as with ``forget_xids``; it says which
    it kept open and why (in progress, committed: its end is still to come; or too old for the
    server to tell). Its one query runs only when some are open. It must be the server the
    capture came from, or a standby of it: another's answers are about other transactions.
    """
    if max_messages is not None and max_messages < 1:
        raise ValueError(f"max_messages must be at least 1, not {max_messages}")
    started = time.time()
    warm_python_workers(spark)  # meanwhile: the first run of a new JVM reads its lease
    ledger = Ledger(spark, target, pipeline)
    canonical = (columns or CaptureColumns()).select(capture)
    with _step("read the lease"), without_codegen(spark):  # a few rows: the first Delta read of a new JVM
        lease = ledger.lease()
    lo = lease.lo
    with _step("check the capture's new files"):  # before the claim: a bad landing leaves the target as it is
        landed = landed_files(capture, columns or CaptureColumns(), lo, lease.files, ledger.slices,
                              accept=accept_late_files)
    redone = lease.status == "running"
    forgotten: tuple[ForgottenStream, ...] = ()
    if forget_xids or forget_aborted is not None:
        with _step("check the transactions to forget"):  # before the claim: an error leaves the target as it is
            forgotten = to_forget(spark, ledger.pending_path, lo, lease.scan, tuple(forget_xids), redone=redone,
                                  ask=status_asker(forget_aborted), say=progress)
    counts = None  # (rows, messages) of the slice, where finding its end counted them
    note = None
    remaining = False  # max_messages ends this run before the capture (or its slice) ends
    if redone:  # the previous run died: redo exactly its slice
        assert lease.hi is not None
        hi = lease.hi
        if until_seq is not None or until_lsn is not None or slice_where is not None:
            note = f"finishing the interrupted run's slice (up to seq {hi}) first; run the slice again after it"
    else:
        newer = canonical if lo is None else canonical.where(F.col("seq") > lo)
        with _step("find the slice's end"):
            end, start = _slice_end(capture, canonical, columns or CaptureColumns(), until_seq, until_lsn,
                                    slice_where)
            if end is not None:
                newer = newer.where(F.col("seq") <= end)
            bounded = None  # the run's end by max_messages, where it ends the run before its slice
            if max_messages is not None:
                first = newer.agg(F.min("seq")).first()[0]
                if first is not None and (end is None or first + max_messages - 1 < end):
                    bounded = first + max_messages - 1
                    newer = newer.where(F.col("seq") <= bounded)
            hi, counts = slice_end(newer)
        if hi is None and (rebuild or landed.unread or forgotten) and lo is not None:
            hi = lo  # nothing new: a run that only rebuilds, forgets, or records the files it accepted
        if hi is None:
            if end is not None and lo is not None and end <= lo:
                return ApplyResult(lo, None, skipped=True, note=(
                    f"the slice ends at seq {end} and the target holds every change up to seq {lo} "
                    f"already: nothing to apply, no Delta commit"))
            return ApplyResult(lo, None, skipped=True)
        if start is not None and start > (lo if lo is not None else -1) + 1 and \
                newer.where(F.col("seq") < start).limit(1).count():
            note = (f"the target was behind this slice (it held up to "
                    f"{'nothing' if lo is None else f'seq {lo}'}; the slice starts at seq {start}): "
                    f"the rows before the slice were applied too")
        if bounded is not None:
            rest = canonical.where(F.col("seq") > hi)
            remaining = (rest if end is None else rest.where(F.col("seq") <= end)).limit(1).count() > 0
            if remaining:
                more = f"more of the capture remains after seq {hi} (max_messages {max_messages}): run again"
                note = more if note is None else f"{note}; {more}"
    # A small slice's queries run on a few rows each: without generated code (a rebuild reads
    # the capture from its start).
    with small_run(spark, hi - (-1 if lo is None or rebuild else lo)):
        window = canonical.where(F.col("seq") <= hi)
        if lo is not None:
            window = window.where(F.col("seq") > lo)
        with _step("check for repeated rows"):  # before the claim: a bad landing leaves the target as it is
            window, repeated, n_messages = slice_messages(
                capture, window, lo, hi, seq_gaps=seq_gaps, counts=counts, remedy=(
                "Put the files back; if they are gone, re-snapshot the mirrors (snapshot) and apply from there "
                "with seq_gaps='allow' (--allow-seq-gaps)"))
        run_id = uuid.uuid4().hex
        with _step("claim the slice"):
            ledger.claim(lease, run_id, hi)
        say = progress or (lambda line: None)
        say(f"slice claimed: after {'the start' if lo is None else f'seq {lo}'} up to seq {hi}"
            + (" (redoing an interrupted run)" if redone else ""))
        if forgotten:
            assert lo is not None
            with _step(f"forget {len(forgotten)} streamed transactions"):
                forget_open_streams(spark, ledger.pending_path, lo, forgotten, say)
        # Tuples deferred to the table tasks: the run caches and moves one value per change (its
        # bytes typed as a string, which Spark caches with one copy instead of three).
        sessions = find_sessions(window, lease.scan.last_session)  # None: the capture does not say
        decoded = decode(window, on_error=on_error, tuples=False, positions=lease.scan, raw_as_string=True,
                         initially_in_stream=lease.scan.last_stream_xid is not None, sessions=sessions).persist()
        # Source column names may differ only in case ("id", "Id"): resolve names exactly while
        # this run builds and merges its frames (the child sessions copy the setting).
        try:
            with temporary_conf(spark, {"spark.sql.caseSensitive": "true"}):
                result = _run(ledger, decoded, n_messages, lease, run_id, hi, skip_origins, parallelism, started,
                              redone, table_path, table_name, tables or TablesConfig(), say, history_path,
                              _Rebuild(canonical, tuple(rebuild), on_error), net_task_rows, landed, forgotten,
                              sessions)
            return dataclasses.replace(result, note=note, remaining=remaining, repeated_rows=repeated,
                                       landed=landed)
        finally:
            release(decoded)


def _slice_end(capture: DataFrame, canonical: DataFrame, columns: CaptureColumns, until_seq: int | None,
               until_lsn: int | None, slice_where: str | None) -> tuple[int | None, int | None]:
    """(last seq, first seq) of a bounded slice; (None, None) when unbounded."""
    ends: list[int] = [] if until_seq is None else [until_seq]
    start = None
    if until_lsn is not None:
        row = canonical.where(F.col("lsn") <= until_lsn).agg(F.max("seq")).first()
        ends.append(row[0] if row[0] is not None else -1)
    if slice_where is not None:
        try:
            row = capture.where(F.expr(slice_where)).agg(F.max(columns.seq), F.min(columns.seq)).first()
        except AnalysisException as exc:  # ParseException too; a failed job is not the predicate's fault
            raise ConfigError(f"--slice-where {slice_where!r} is not a predicate on the capture's columns "
                              f"({', '.join(capture.columns)}): {str(exc).splitlines()[0]}") from exc
        if row[0] is None:
            raise ConfigError(f"no capture row matches the slice {slice_where!r}: nothing to apply "
                              f"(has that partition landed?)")
        ends.append(row[0])
        start = row[1]
    return (min(ends) if ends else None), start


def _run(ledger: Ledger, decoded: DataFrame, n_messages: int, lease: Lease, run_id: str, hi: int,
         skip_origins: tuple[str, ...], parallelism: int, started: float, redone: bool,
         table_path: str, table_name: str | None, tables: TablesConfig,
         say: Callable[[str], None], history_path: str, rebuild: _Rebuild,
         net_task_rows: int = NET_TASK_ROWS, landed: Landed = Landed(),
         forgotten: tuple[ForgottenStream, ...] = (), sessions: Sessions | None = None) -> ApplyResult:
    spark, lo = ledger.spark, lease.lo
    meta = decoded.where(F.col("message_type").isin("relation", "type")).select("seq", "relation", "type")
    with _step("decode; read relations"):
        history = ledger.history()
        history.type_overrides = tables.types
        new_meta = meta.collect()  # Relation / Type messages: a few per relation and session
        # Saved: those that change a relation's schema (most repeat it, one per walsender session).
        new_versions = [v.seq for v in history.add(versions_from_rows(new_meta))]
    with _step("assemble transactions"):
        assembled = assemble(decoded, lease.scan, pending=ledger.pending(lo), skip_origins=skip_origins,
                             sessions=sessions)
    for line in session_end_lines(assembled.ledger):
        say(line)
    tuples = assembled.pending_tuples
    # Only the columns the tables read: caching the other message kinds' (null) columns
    # of a million change rows cost about a second.
    committed = assembled.committed.select(*CHANGE_ROW_COLUMNS).persist()
    saving: Future[int] | None = None
    try:
        starts = ledger.starts()  # relation -> the LSN a (re-)snapshot left its mirror at
        touched = committed.select(F.explode(F.when(
            F.col("message_type") == "truncate", F.col("truncate.relation_ids"))
            .otherwise(F.array(F.col("change.relation_id")))).alias("relation_id"), "message_type",
            "seq", "commit_lsn")
        start = None  # one flat CASE over the snapshotted relations
        for oid, lsn in starts.items():
            start = (F if start is None else start).when(F.col("relation_id") == oid, F.lit(lsn))
        written = F.col("seq") if start is None else F.when(
            start.isNull() | (F.col("commit_lsn") >= start), F.col("seq"))
        with _step("collect the touched tables"):
            kinds: dict[int, dict[str, int]] = {}  # relation -> message type -> change rows
            n_changes: dict[int, int] = {}  # change rows per relation (truncates included)
            first_seq: dict[int, int] = {}  # relation -> its first change the run writes
            for r in touched.groupBy("relation_id", "message_type").agg(
                    F.count(F.lit(1)).alias("count"), F.min(written).alias("first")).collect():
                oid = r["relation_id"]
                kinds.setdefault(oid, {})[r["message_type"]] = r["count"]
                n_changes[oid] = n_changes.get(oid, 0) + r["count"]
                if r["first"] is not None:
                    first_seq[oid] = min(first_seq.get(oid, r["first"]), r["first"])
            relations = sorted(kinds)
            span = committed.agg(F.min("commit_lsn"), F.max("commit_lsn"), F.countDistinct("commit_seq"),
                                 F.unix_micros(F.max_by("commit_ts", "commit_lsn"))).first()
        from_lsn, to_lsn, transactions = span[0], span[1], span[2]
        to_commit_ts = utc_from_micros(span[3])
        say(f"decoded {n_messages} messages; assembled {transactions} committed transactions "
            f"touching {len(relations)} tables")
        for relation_id in relations:
            if relation_id not in history.relations:
                first = committed.where(F.col("change.relation_id") == relation_id).agg(F.min("seq")).first()
                history.version_at(relation_id, first[0] if first and first[0] is not None else -1)

        def snapshotted(oid: int) -> bool:  # a re-snapshot, or a first snapshot (recorded or not)
            first = history.relations[oid][0]  # the mirror's name, as `_plan`'s path
            path = mirror_path(ledger.root, first.namespace, first.name, table_path)
            return oid in starts or (_is_delta(spark, path) and started_by_snapshot(spark, path))

        rebuilt = rebuild.relations(history, tables, snapshotted)
        if rebuilt:
            with _step("check the capture holds what the runs read"):
                rebuild.check_capture(ledger, lo, [history.first_name(oid) for oid in rebuilt])
        relations = [oid for oid in relations if oid not in rebuilt]  # the replay holds their slice too
        relations, excluded = history.selected(relations, tables)
        # Every schema decision before anything is written.
        with _step(f"plan {len(relations)} schemas"):
            plans = {oid: _plan(spark, ledger.root, history, oid, table_path, first_seq.get(oid))
                     for oid in relations}
            for oid in relations:
                _spec(history, oid, plans[oid], tables)  # a bad key override stops the run here
            rebuild_plans = {oid: _plan(spark, ledger.root, history, oid, table_path) for oid in rebuilt}
            histories = {oid: _history_plan(spark, ledger.root, history, oid, plans[oid], tables, history_path)
                         for oid in relations if tables.keeps_history(history.first_name(oid))}
        names: dict[int, tuple[str, ...]] = {}  # catalog names still to register
        if table_name:
            with _step("check catalog names"):
                names = _catalog_names(spark, table_name, history, plans)
        if new_versions:
            with _step("save relations"):
                txn_append(meta.where(F.col("seq").isin(new_versions)), ledger.relations_path,
                           f"{ledger.pipeline}:relations", hi)
        results: list[TableResult] = []
        # The open transactions' save depends on no table: it runs beside their writes (a run that
        # dies in either is redone whole, each write skipped where its transaction identifier
        # shows it done). The next run reads them back by this run's hi.
        background = ThreadPoolExecutor(max_workers=1)
        saving = background.submit(_save_open_rows, assembled, ledger, lo, hi)
        background.shutdown(wait=False)
        if relations:
            assert to_lsn is not None
            metadata = {"pipeline": ledger.pipeline, "lo_seq": lo, "hi_seq": hi,
                        "from_lsn": from_lsn, "to_lsn": to_lsn}
            by_path: dict[str, list[int]] = {}
            for oid in relations:  # relations sharing a name share the mirror, one after another
                by_path.setdefault(plans[oid].path, []).append(oid)

            def write(oids: list[int]) -> list[TableResult]:
                session = copy_session(spark)  # its own Delta transaction settings
                out = []
                for i, oid in enumerate(oids):
                    # A later relation on the same path finds the mirror as the earlier one left it.
                    plan = plans[oid] if i == 0 else _plan(session, ledger.root, history, oid, table_path,
                                                           first_seq.get(oid))
                    past = histories.get(oid)
                    if past is not None and i > 0:
                        past = _history_plan(session, ledger.root, history, oid, plan, tables, history_path)
                    # A (re-)snapshot at S holds every transaction that committed before S.
                    rows = committed if oid not in starts else committed.where(F.col("commit_lsn") >= starts[oid])
                    out.append(_mirror_table(session, ledger, rows, history, oid, plan, kinds[oid],
                                             n_changes[oid], to_lsn, metadata, redone,
                                             _spec(history, oid, plan, tables), past, tuples,
                                             net_task_rows))
                    if oid in names:
                        register(session, names[oid], plan.path)
                return out

            # The tables with the most changes first: the run ends when its largest table is
            # written, so that one must not wait for a free thread behind small ones.
            groups = sorted(by_path.values(), key=lambda oids: -sum(n_changes[oid] for oid in oids))
            with _step(f"write {len(relations)} tables"), \
                    ThreadPoolExecutor(max_workers=max(1, parallelism)) as pool:
                for done in pool.map(write, groups):
                    for t in done:
                        results.append(t)
                        say(f"table {len(results)}/{len(relations)} {t.status}: {t.table} "
                            f"+{t.inserted} ~{t.updated} -{t.deleted}"
                            + (f" skipped {t.skipped}" if t.skipped else "")
                            + (" truncated" if t.truncated else ""))
            position = {oid: i for i, oid in enumerate(relations)}
            results.sort(key=lambda t: position[t.relation_id])  # reported in OID order, as before
        if rebuilt:
            with _step(f"rebuild {len(rebuilt)} tables from the start of the capture"):
                results += rebuild.run(ledger, hi, skip_origins, history, rebuild_plans, tables, say)
        n_open = saving.result()
    finally:
        if saving is not None:
            wait([saving])  # ended before the frames it reads are released
        release(committed)
        assembled.release()
    with _step("quarantine bad messages"):
        bad = quarantined(decoded)
        # Bad messages fail the decoding unless they are quarantined (``on_error``).
        n_bad = bad.count() if rebuild.on_error == "quarantine" else 0
        if n_bad:  # kept with their raw bytes and reason
            txn_append(bad, ledger.quarantine_path, f"{ledger.pipeline}:quarantine", hi)
    sources, snapshot_names = ledger.snapshot_sources(), ledger.snapshot_names()
    replaced = tuple(sorted({history.first_name(oid) for oid in relations if _replaced(history, oid, sources)}))
    renamed = tuple(sorted({(history.first_name(oid), min(snapshot_names[oid])) for oid in relations
                            if oid in snapshot_names and history.first_name(oid) not in snapshot_names[oid]}))
    result = ApplyResult(lo, hi, from_lsn, to_lsn, n_messages, transactions, results, n_bad, n_open,
                         redone, duration_s=time.time() - started, excluded=excluded, replaced=replaced,
                         renamed=renamed, forgotten=forgotten, to_commit_ts=to_commit_ts)
    appended = tuple(path for path, written in ((ledger.relations_path, bool(new_versions)),
                                                (ledger.quarantine_path, bool(n_bad)),
                                                (ledger.skipped_path, any(t.skipped for t in results))) if written)
    with _step("save the run (hands the lease back)"):
        _finish(ledger, run_id, result, assembled.end_state, lease, started, landed, appended)
    return result


def _save_open_rows(assembled: Assembled, ledger: Ledger, lo: int | None, hi: int) -> int:
    with _step("save open transactions"):
        return save_open_rows(assembled, ledger.pending_path, f"{ledger.pipeline}:pending", lo, hi)


def _cannot_rebuild(name: str, reason: str) -> ConfigError:
    return ConfigError(f"rebuild: {name} cannot be rebuilt from the capture: {reason}; "
                       f"re-snapshot it instead (snapshot --table {name}); nothing was written")


def _plan(spark: SparkSession, root: str, history: RelationHistory, oid: int,
          table_path: str, first_seq: int | None = -1) -> SchemaPlan:
    """The mirror's schema plan for a run whose first change of the table to write is at
    ``first_seq`` (None: it writes none; -1: every version's columns, as a replay from the start)."""
    first = history.relations[oid][0]  # a renamed table keeps the mirror it started with
    latest = history.latest(oid)
    return plan_schema(spark, mirror_path(root, first.namespace, first.name, table_path),
                       f"{latest.namespace}.{latest.name}", history.table_columns(oid),  # type: ignore[arg-type]
                       carried=history.columns_since(oid, first_seq))


def _replaced(history: RelationHistory, oid: int, sources: dict[str, int]) -> bool:
    """Whether the mirror ``oid`` writes to started from another relation of its name: its
    latest (re-)snapshot copied another OID (``sources``: `Ledger.snapshot_sources`), or,
    never snapshotted, the capture has several OIDs first seen under its name."""
    name = history.first_name(oid)
    source = sources.get(name)
    if source is not None:
        return source != oid
    return sum(history.first_name(o) == name for o in history.relations) > 1


def _spec(history: RelationHistory, oid: int, plan: SchemaPlan, tables: TablesConfig) -> TableSpec:
    """How the mirror's rows are identified: the replica identity, or the ``tables.keys`` override."""
    columns = [c for c, _ in plan.columns]
    spec = table_spec(history.latest(oid), columns)
    name = history.first_name(oid)
    key = tables.keys.get(name)
    if key is None:
        return spec
    if spec.mode == "keyed":
        raise ConfigError(f"tables.keys.{name}: {name} has a replica identity key ({', '.join(spec.key)}), "
                          f"which is its key; a key override is for a table without one "
                          f"(REPLICA IDENTITY FULL or NOTHING, or no primary key); nothing was written")
    missing = [c for c in key if c not in columns]
    if missing:
        raise ConfigError(f"tables.keys.{name}: no column {', '.join(missing)} in {name} "
                          f"(its columns: {', '.join(columns)}); nothing was written")
    return TableSpec("keyed", tuple(key), tuple(columns))


@dataclass(frozen=True)
class _Rebuild:
    """Tables to rebuild from the start of the capture (`run_apply`'s ``rebuild``)."""

    capture: DataFrame  # the whole capture, canonical columns
    tables: tuple[str, ...]
    on_error: OnError

    def relations(self, history: RelationHistory, tables: TablesConfig,
                  snapshotted: Callable[[int], bool]) -> list[int]:
        """The relation OIDs to rebuild; `ConfigError` for a table that cannot be rebuilt
        (``snapshotted``: whether a relation's mirror holds a snapshot's rows)."""
        out = []
        for name in dict.fromkeys(self.tables):
            oids = [oid for oid in history.relations if history.first_name(oid) == name]
            if not oids:
                known = ", ".join(sorted({history.first_name(oid) for oid in history.relations})) or "none"
                raise ConfigError(f"rebuild: no table {name} in the capture's relations (known: {known})")
            if len(oids) > 1:
                raise ConfigError(f"rebuild: several relations were named {name} (dropped and created again); "
                                  f"re-snapshot it instead")
            reason = ("it started from a snapshot, whose rows are not in the capture" if snapshotted(oids[0])
                      else "it keeps a history table, which a rebuild would not match" if
                      tables.keeps_history(name) else "tables.include / exclude leave it out" if
                      not tables.selected(name) else None)
            if reason:
                raise _cannot_rebuild(name, reason)
            out.append(oids[0])
        return out

    def check_capture(self, ledger: Ledger, lo: int | None, names: list[str]) -> None:
        """`ConfigError` when the capture holds fewer messages up to ``lo`` than the finished runs
        read there (their ``_runs`` rows): files deleted or expired from the landing, whose
        changes a replay would leave out of the rebuilt mirrors. Counts the capture's seqs up
        to ``lo``, one Spark job (a replay reads them all anyway). Rows of files accepted late
        (``accept_late_files``) count too, so they can hide as many missing ones."""
        if lo is None:
            return
        read = sum(messages or 0 for _, hi, messages in ledger.slices() if hi <= lo)
        held, first = self.capture.where(F.col("seq") <= lo).agg(F.count_distinct("seq"), F.min("seq")).first()
        if held >= read:
            return
        starts = "nothing" if first is None else f"seq {first} onwards"
        reason = (f"the capture no longer holds every message the runs read: up to seq {lo} the runs read "
                  f"{read} messages and the capture holds {held} ({starts}); {read - held} are gone "
                  f"(capture files deleted or expired from the landing?), and a replay without them would "
                  f"leave their changes out")
        tables = " ".join(f"--table {name}" for name in names)
        raise ConfigError(f"rebuild: {', '.join(names)} cannot be rebuilt from the capture: {reason}; "
                          f"re-snapshot {'it' if len(names) == 1 else 'them'} instead (snapshot {tables}); "
                          f"nothing was written")

    def run(self, ledger: Ledger, hi: int, skip_origins: tuple[str, ...], history: RelationHistory,
            plans: dict[int, SchemaPlan], tables: TablesConfig, say: Callable[[str], None]) -> list[TableResult]:
        """Replay every change of the tables up to ``hi`` and replace their mirrors, one commit each."""
        replayed, _ = one_row_per_message(self.capture.where(F.col("seq") <= hi))
        sessions = find_sessions(replayed, None)
        everything = decode(replayed, on_error=self.on_error, tuples=False, positions=ScanState(),
                            raw_as_string=True, sessions=sessions).persist()
        assembled = assemble(everything, ScanState(), skip_origins=skip_origins, sessions=sessions)
        committed = assembled.committed.select(*CHANGE_ROW_COLUMNS).persist()
        out = []
        try:
            to_lsn = committed.agg(F.max("commit_lsn")).first()[0]
            for oid, plan in plans.items():
                latest = history.latest(oid)
                name = f"{latest.namespace}.{latest.name}"
                spec = _spec(history, oid, plan, tables)
                arrow_schema = change_schema(plan.columns)
                net = _converted_net(ledger.spark, committed, oid, history, spec, arrow_schema, tuples=False)
                rows = net.where(F.col("_action").isin("upsert", "insert")).select(
                    *[F.col(quote(c)) for c in spec.columns]).persist()
                try:
                    n_rows = rows.count()
                    app_id = f"{ledger.pipeline}:rebuild:{oid}"
                    meta = {"pipeline": ledger.pipeline, "rebuild": True, "hi_seq": hi, "to_lsn": to_lsn}
                    # One commit: readers see the old mirror or the rebuilt one. A rerun rebuilds the same.
                    (rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
                     .option("userMetadata", user_metadata(meta, app_id)).save(plan.path))
                finally:
                    release(rows)
                out.append(TableResult(name, plan.path, oid, inserted=n_rows, status="rebuilt"))
                say(f"rebuilt {name}: {n_rows} rows from the start of the capture")
        finally:
            release(committed)
            assembled.release()
            release(everything)
        return out


def _history_plan(spark: SparkSession, root: str, history: RelationHistory, oid: int, plan: SchemaPlan,
                  tables: TablesConfig, template: str) -> SchemaPlan:
    """The schema plan of a table's history table; `ConfigError` for a table without a key."""
    name = history.first_name(oid)
    spec = _spec(history, oid, plan, tables)
    if spec.mode != "keyed":
        raise ConfigError(f"tables.history: {name} has no key (its replica identity is the whole row), so "
                          f"its rows have no versions to follow; give it one with tables.keys; nothing was written")
    first = history.relations[oid][0]
    return plan_history(spark, mirror_path(root, first.namespace, first.name, template), name,
                        plan.columns)  # type: ignore[arg-type]


def _write_history(session: SparkSession, pipeline: str, typed: DataFrame, past: SchemaPlan, plan: SchemaPlan,
                   spec: TableSpec, arrow_schema: Any, kinds: dict[str, int], app_id: str, to_lsn: int,
                   metadata: dict[str, Any], tasks: int, moved: list[tuple[int, int]],
                   halves: bool = False, name: str = "") -> tuple[int, bool]:
    """The run's versions into the history table (created, or seeded from an existing mirror, first),
    computed in ``tasks`` tasks (``moved`` and ``halves`` as for `net_frame`): their number, and
    whether the halves needed one task in the end (`history_changes`' conflicts: passes without
    the new versions of updates that found no row, as a mirror's net change in halves takes;
    one task for a key change that leaves a TOASTed column unchanged, or after `HALVES_PASSES`)."""
    seed = not past.exists and plan.exists
    apply_schema(session, past)
    if seed:  # history starts now: the mirror's rows are the current versions, from where it stands
        commits = recorded_commits(session, plan.path, pipeline)
        since = commits[-1][1] if commits else 0
        rows = session.read.format("delta").load(plan.path).select(
            *[F.col(quote(c)) for c in spec.columns],
            F.lit(since).cast("long").alias("_valid_from_lsn"), F.lit(None).cast("long").alias("_valid_to_lsn"),
            F.lit(None).cast("timestamp").alias("_valid_from_ts"), F.lit(None).cast("timestamp").alias("_valid_to_ts"),
            F.lit(True).alias("_is_current"), F.lit(None).cast("long").alias("_version_seq"))
        txn_append(rows, past.path, app_id, since)
    pre = None
    if past.exists or seed:
        if kinds.keys() & {"update", "delete", "truncate"}:
            keys = None if "truncate" in kinds else looked_up(typed, spec)  # a truncate ends every version
            pre = pre_image(session, past.path, keys, typed.schema, spec, current_only=True)

    def computed(tasks: int, skipping: np.ndarray | None = None) -> tuple[DataFrame, dict[str, int]]:
        changes = history_frame(typed, pre, spec, arrow_schema, tasks=tasks, moved=moved, halves=halves,
                                skipping=skipping).persist()
        try:
            return changes, {r["_action"]: r["n"] for r in
                             changes.groupBy("_action").agg(F.count(F.lit(1)).alias("n")).collect()}
        except BaseException:
            release(changes)
            raise

    changes, counts = computed(tasks)
    try:
        skipping = np.zeros(0, np.int64)
        passes, one_task = 1, False
        while "conflict" in counts or TOAST_CONFLICT in counts:  # in halves: see `history_changes`
            found = None if TOAST_CONFLICT in counts else np.unique(np.asarray(
                changes.where(F.col("_action") == "conflict").select("_version_seq").toArrow()
                .column(0).to_numpy(), dtype=np.int64))
            release(changes)
            if found is None or passes == HALVES_PASSES:
                _log.info("%s (history): %s, computed in %d tasks (%d passes): computed again in one", name,
                          "an update moved a row to another task's key with a TOAST column unchanged"
                          if found is None else "updates of rows not there still found", tasks, passes)
                one_task = True
                changes, counts = computed(1)
                break
            skipping = np.union1d(skipping, found)
            _log.info("%s (history): %d updates of rows not there, computed in %d tasks: computed again "
                      "without their new versions", name, found.size, tasks)
            passes += 1
            changes, counts = computed(tasks, skipping)
        merge_history(session, past.path, changes, spec, app_id=app_id, version=to_lsn, metadata=metadata)
    finally:
        release(changes)
    return counts.get("version", 0), one_task


def _catalog_names(spark: SparkSession, template: str, history: RelationHistory,
                   plans: dict[int, SchemaPlan]) -> dict[int, tuple[str, ...]]:
    """The catalog names the run must register; `CatalogError` for a name taken or shared."""
    taken: dict[tuple[str, ...], str] = {}
    out = {}
    for oid, plan in plans.items():
        first = history.relations[oid][0]  # named like its mirror's path: by its first name
        name = catalog_name(template, first.namespace, first.name)
        other = taken.setdefault(name, plan.path)
        if other != plan.path:
            raise CatalogError(f"the mirrors at {other} and {plan.path} would both be the catalog "
                               f"table {'.'.join(name)}; nothing was written. Choose an "
                               f"apply.table_name that tells them apart")
        if not catalog_registered(spark, name, plan.path):
            out[oid] = name
    return out


def _converted_net(session: SparkSession, committed: DataFrame, oid: int, history: RelationHistory,
                   spec: TableSpec, arrow_schema: pa.Schema, *, tuples: bool, tasks: int = 1,
                   skipping: np.ndarray | None = None) -> DataFrame:
    """A table's committed change rows converted and netted in one task (`converted_net_frame`),
    or in ``tasks`` tasks in halves (`halved_net_frame`, ``skipping`` as there); ``tuples`` as for
    `relation_rows`."""
    changes = relation_rows(committed, oid, tuples=tuples, transactions=False)
    convert = converter(session, oid, history, arrow_schema)
    if tasks > 1:
        return halved_net_frame(changes, convert, spec, arrow_schema, tasks, skipping)
    return converted_net_frame(changes, convert, spec, arrow_schema)


def _mirror_table(session: SparkSession, ledger: Ledger, committed: DataFrame, history: RelationHistory,
                  oid: int, plan: SchemaPlan, kinds: dict[str, int], n_changes: int, to_lsn: int,
                  metadata: dict[str, Any], redone: bool, spec: TableSpec,
                  past: SchemaPlan | None = None, tuples: bool = False,
                  net_task_rows: int = NET_TASK_ROWS) -> TableResult:
    """Net change and write of one table: a MERGE, or an append where no mirror row can match.

    ``kinds``: the run's message types for the table (insert, update, delete, truncate), with
    their numbers of change rows;
    ``n_changes``: its number of change rows (``net_task_rows`` of them per net-change task).
    ``past``: the plan of the table's history table, if it has one: written first (a redone
    run then finds the mirror as the history's versions left it).
    ``tuples``: some change rows carry their tuples in ``change`` (see `relation_rows`).
    """
    latest = history.latest(oid)
    name = f"{latest.namespace}.{latest.name}"
    app_id = f"{ledger.pipeline}:relation:{oid}"
    history_app_id = f"{ledger.pipeline}:history:{oid}"
    # Only a redone slice can find its merge committed (a fresh slice has a new commit LSN).
    done = applied_commit(session, plan.path, app_id, to_lsn) if redone else None
    # A history's MERGE commits before its mirror's: the versions an interrupted run wrote.
    history_done = (applied_commit(session, past.path, history_app_id, to_lsn)
                    if redone and past is not None else None)
    versions = history_done["inserted"] if history_done is not None else None
    if done is not None and (past is None or history_done is not None):  # merged before the run was interrupted
        return TableResult(name, plan.path, oid, **done, status="already applied", history=versions)
    if plan.exists:  # a new mirror is created by its first append, in the same commit
        with _step(f"{name}: schema"):
            apply_schema(session, plan)
    arrow_schema = change_schema(plan.columns)
    # Only updates and deletes look rows up; a mirror this run created has none to find.
    looks_up = plan.exists and bool(kinds.keys() & {"update", "delete"})
    tasks = net_tasks(n_changes, kinds.get("update", 0), spec, net_task_rows)
    # The net change, and a history's versions, in halves (`halved_tasks`), where `net_tasks`
    # joins the buckets an update moves a row between; without a history, the rows converted
    # in the same tasks where none are looked up.
    halved = halved_tasks(n_changes, spec, arrow_schema, net_task_rows)
    tasks = max(tasks, halved)
    # No history, one task, a few rows: convert, look up and net on the driver. Otherwise
    # nothing to look up, no history, one task: convert and net in it (`converted_net_frame`).
    local = past is None and tasks == 1 and n_changes <= LOCAL_NET_ROWS
    fused = not looks_up and past is None and (tasks == 1 or halved > 1)
    typed = None if fused or local else typed_change_frame(  # read more than once
        committed, oid, history, columns=plan.columns, rows=n_changes, tuples=tuples).persist()
    try:
        moved: list[tuple[int, int]] = []
        if tasks > 1 and "update" in kinds and halved == 1:
            assert typed is not None
            with _step(f"{name}: updates that move rows between keys"):
                moved = moved_buckets(typed, spec, tasks)  # buckets joined: some tasks may get no rows
        if past is not None and history_done is None:
            assert typed is not None
            with _step(f"{name}: history"):
                versions, one_task = _write_history(session, ledger.pipeline, typed, past, plan, spec,
                                                    arrow_schema, kinds, history_app_id, to_lsn, metadata, tasks,
                                                    moved, halves=halved > 1, name=name)
            if one_task:  # the mirror's halves would need one task as well: its rows are the history's current ones
                tasks = 1
        if done is not None:
            return TableResult(name, plan.path, oid, **done, status="already applied", history=versions)
        if local:  # a few rows: on the driver, no task
            with _step(f"{name}: convert, {'pre-image, ' if looks_up else ''}net change on the driver"):
                net, summary = local_converted_net(
                    relation_rows(committed, oid, tuples=tuples, transactions=False),
                    converter(session, oid, history, arrow_schema, local=True), spec, arrow_schema,
                    look_up=((lambda keys, schema: pre_image(session, plan.path, keys, schema, spec))
                             if looks_up else None))
        else:
            def netted(tasks: int, skipping: np.ndarray | None = None) -> DataFrame:
                if fused:
                    return _converted_net(session, committed, oid, history, spec, arrow_schema, tuples=tuples,
                                          tasks=tasks, skipping=skipping)
                assert typed is not None
                pre = pre_image(session, plan.path, looked_up(typed, spec), typed.schema, spec) if looks_up else None
                return net_frame(typed, pre, spec, arrow_schema, tasks=tasks, moved=moved, halves=halved > 1,
                                 skipping=skipping)

            net, summary = _summarized(name, netted(tasks))
            skipping = np.zeros(0, np.int64)
            passes = 1
            while "conflict" in summary:  # netted in halves, an update found no row
                found = _missing_rows(net)
                release(net)
                if found is None or passes == HALVES_PASSES:
                    _log.info("%s: %s, netted in %d tasks (%d passes): netted again in one", name,
                              "an update moved a row to another task's key with a TOAST column unchanged"
                              if found is None else "updates of rows not there still found", tasks, passes)
                    tasks = 1
                    net, summary = _summarized(name, netted(1))
                    break
                skipping = np.union1d(skipping, found)
                _log.info("%s: %d updates of rows not there, netted in %d tasks: netted again without their new "
                          "rows", name, found.size, tasks)
                passes += 1
                net, summary = _summarized(name, netted(tasks, skipping))
        try:
            truncated = "truncate" in summary
            n_skipped = summary["skipped"]["n"] if "skipped" in summary else 0
            if n_skipped:
                data = [F.col(quote(c)) for c in spec.columns]
                skipped = net.where(F.col("_action") == "skipped").select(
                    F.lit(name).alias("table"), F.lit(oid).cast("long").alias("relation_id"),
                    F.col("_seq").alias("seq"), F.col("_op").alias("op"), F.col("_reason").alias("reason"),
                    F.to_json(F.struct(*data)).alias("row"))
                with ledger.skipped_lock:
                    txn_append(skipped, ledger.skipped_path, f"{ledger.pipeline}:skipped:{oid}", to_lsn)
            changes = [a for a in summary if a not in ("skipped", "truncate")]
            counts = {"inserted": 0, "updated": 0, "deleted": 0}
            # Nothing to match: a new mirror (empty whatever the run did), or a multiset taking
            # only inserts. An append is one job where a MERGE is about a dozen.
            appends = not plan.exists or (spec.mode == "multiset" and not truncated
                                          and set(changes) <= {"insert"})
            if appends:
                n_rows = sum(summary[a]["n"] for a in ("upsert", "insert") if a in summary)
                if n_rows or not plan.exists:
                    source = net.where(F.col("_action").isin("upsert", "insert"))
                    with _step(f"{name}: append"):
                        append(plan.path, source, spec, app_id=app_id, version=to_lsn, metadata=metadata,
                               create=not plan.exists)
                counts = {"inserted": n_rows, "updated": 0, "deleted": 0}
            elif changes or truncated:
                source = net.where(F.col("_action").isin("upsert", "delete", "delete_all", "insert"))
                with _step(f"{name}: MERGE"):
                    counts = merge(session, plan.path, source, spec, truncated=truncated, app_id=app_id,
                                   version=to_lsn, metadata=metadata)
            if spec.mode == "multiset" and (changes or truncated):  # an update: a delete, an insert
                counts = {"inserted": sum(r["ins"] or 0 for r in summary.values()), "updated": 0,
                          "deleted": counts["deleted"] if truncated else
                          sum(r["del"] or 0 for r in summary.values())}
            return TableResult(name, plan.path, oid, **counts, skipped=n_skipped, truncated=truncated,
                               history=versions, tasks=tasks)
        finally:
            release(net)
    finally:
        if typed is not None:
            release(typed)


#: Passes of a table's net change in halves (and of a history's versions), each of which may
#: find more updates of rows not there (`net.net_changes`' ``skipping``: leaving their new rows
#: out can make later updates miss theirs), before the table is netted in one task.
HALVES_PASSES = 4


def _missing_rows(net: DataFrame) -> np.ndarray | None:
    """The seqs of the updates that found no row in ``net`` (a net change in halves: its
    ``conflict`` rows), ascending; None if a conflict needs the table in one task (an update that
    moved a row to another task's key with an unchanged-TOAST column)."""
    conflicts = net.where(F.col("_action") == "conflict").select("_seq", "_reason").toArrow()
    if pc.any(pc.equal(conflicts.column("_reason"), TOAST_CONFLICT_REASON)).as_py():
        return None
    return np.unique(np.asarray(conflicts.column("_seq").to_numpy(), dtype=np.int64))


def _summarized(name: str, net: DataFrame) -> tuple[DataFrame, dict[str, dict[str, int]]]:
    """``net`` persisted, and its summary by ``_action`` (the job that computes it): ``n`` rows,
    ``ins`` and ``del`` (the sums of ``_inserted`` and ``_deleted``), as `local_converted_net`'s.
    Released again if that job fails."""
    net = net.persist()
    try:
        with _step(f"{name}: convert, pre-image, net change"):
            return net, {r["_action"]: r.asDict() for r in net.groupBy("_action").agg(
                F.count(F.lit(1)).alias("n"), F.sum("_inserted").alias("ins"),
                F.sum("_deleted").alias("del")).collect()}
    except BaseException:
        release(net)
        raise


def _finish(ledger: Ledger, run_id: str, result: ApplyResult, end: ScanState, lease: Lease,
            started: float, landed: Landed, appended: tuple[str, ...]) -> None:
    """Append the run's row to ``_runs``, which hands the lease back (`Ledger.lease`). Before
    it, while the run holds the lease: compact ``_runs`` and the other tables of the target's
    own the run ``appended`` to when they hold many files (`compact_files`: each run adds one)
    and, when ``_runs`` was compacted (every `LEDGER_MAX_FILES` runs), vacuum the target's own
    tables (`vacuum_tables`). A run that redid an interrupted one also releases the lease by an
    UPDATE: its row may be the interrupted run's own, recorded before rows handed the lease
    back, and Delta skips the append."""
    spark = ledger.spark
    for path in appended:
        compact_files(spark, path)
    if compact_files(spark, ledger.runs_path, adding=1):  # the files the runs' rewrites and compactions left
        vacuum_tables(spark, ledger.own_tables())
    tables = [(t.table, t.path, t.relation_id, t.inserted, t.updated, t.deleted, t.skipped, t.truncated,
               t.status) for t in result.tables]
    applied = result.to_lsn if result.to_lsn is not None else lease.applied_lsn
    lease_end = (end.last_begin_seq, end.last_stream_xid, applied, list(landed.gone_files), end.last_session)
    row = [(run_id, ledger.pipeline, result.lo, result.hi, result.from_lsn, result.to_lsn, result.messages,
            result.transactions, result.quarantined_messages, sum(t.skipped for t in result.tables),
            tables, None, None, result.duration_s, list(landed.new_files), lease_end,
            [(f.xid, f.first_seq, f.rows) for f in result.forgotten] or None, result.to_commit_ts, __version__)]
    frame = local_frame(spark, row, RUNS_SCHEMA).withColumn(
        "started_at", F.lit(started).cast("timestamp")).withColumn("finished_at", F.current_timestamp())
    assert result.hi is not None
    if result.hi == result.lo:  # a run that only rebuilt tables: its own row, once
        txn_append(frame, ledger.runs_path, f"{ledger.pipeline}:runs:rebuild:{run_id}", 0)
    else:
        txn_append(frame, ledger.runs_path, f"{ledger.pipeline}:runs", result.hi)
    if result.redone:
        ledger.release(run_id, result.hi, end, applied, (landed.new_files, landed.gone_files))
