"""The ``apply`` job: capture slice -> Delta mirror tables equal to their source tables.

Layout under the target root::

    <root>/<schema>/<table>/        one mirror per source table (`mirroring.names.mirror_path`)
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
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import partial
from typing import Literal

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from .assemble.relations import RelationHistory, versions_from_rows
from .capture import CaptureColumns, Landed, _is_delta, landed_files, slice_end, slice_messages
from .config import TablesConfig
from .errors import ConfigError
from .ledger import RUNS_SCHEMA, ConcurrentRunError, Lease, Ledger
from .mirroring.delta import compact_files, txn_append, vacuum_tables
from .mirroring.names import (
    DEFAULT_HISTORY_PATH,
    DEFAULT_TABLE_PATH,
    CatalogError,
    catalog_name,
    catalog_registered,
    mirror_path,
    register,
)
from .mirroring.rows import NET_TASK_ROWS
from .mirroring.schema import SchemaPlan
from .mirroring.table import history_plan, mirror_spec, mirror_table, schema_plan
from .reading import NotReadableError, Status, mirror, started_by_snapshot, status
from .rebuild import Rebuild
from .results import ApplyResult, TableResult, timed, utc_from_micros
from .spark.assemble import Assembled, ScanState, assemble, session_end_lines
from .spark.changes import CHANGE_ROW_COLUMNS
from .spark.connect import require_classic
from .spark.decode import OnError, decode, quarantined
from .spark.failures import explains_spark_failures
from .spark.pending import ForgottenStream, forget_open_streams, save_open_rows, status_asker, to_forget
from .spark.sessions import Sessions, find_sessions
from .spark.session import (
    copy_session,
    local_frame,
    one_row,
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
_step = partial(timed, _log)


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
    `Rebuild.check_capture`); a table that started from a (re-)snapshot, or
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
    require_classic(spark, "apply")
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
    hi: int | None  # the slice's last seq
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
                first = one_row(newer.agg(F.min("seq")))[0]
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
                              Rebuild(canonical, tuple(rebuild), on_error), net_task_rows, landed, forgotten,
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
        row = one_row(canonical.where(F.col("lsn") <= until_lsn).agg(F.max("seq")))
        ends.append(row[0] if row[0] is not None else -1)
    if slice_where is not None:
        try:
            row = one_row(capture.where(F.expr(slice_where)).agg(F.max(columns.seq), F.min(columns.seq)))
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
         say: Callable[[str], None], history_path: str, rebuild: Rebuild,
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
            span = one_row(committed.agg(F.min("commit_lsn"), F.max("commit_lsn"), F.countDistinct("commit_seq"),
                                         F.unix_micros(F.max_by("commit_ts", "commit_lsn"))))
        from_lsn, to_lsn, transactions = span[0], span[1], span[2]
        to_commit_ts = utc_from_micros(span[3])
        say(f"decoded {n_messages} messages; assembled {transactions} committed transactions "
            f"touching {len(relations)} tables")
        for relation_id in relations:
            if relation_id not in history.relations:
                first = one_row(committed.where(F.col("change.relation_id") == relation_id).agg(F.min("seq")))[0]
                history.version_at(relation_id, first if first is not None else -1)

        def snapshotted(oid: int) -> bool:  # a re-snapshot, or a first snapshot (recorded or not)
            first = history.relations[oid][0]  # the mirror's name, as `schema_plan`'s path
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
            plans = {oid: schema_plan(spark, ledger.root, history, oid, table_path, first_seq.get(oid))
                     for oid in relations}
            for oid in relations:
                mirror_spec(history, oid, plans[oid], tables)  # a bad key override stops the run here
            rebuild_plans = {oid: schema_plan(spark, ledger.root, history, oid, table_path) for oid in rebuilt}
            histories = {oid: history_plan(spark, ledger.root, history, oid, plans[oid], tables, history_path)
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
                    plan = plans[oid] if i == 0 else schema_plan(session, ledger.root, history, oid, table_path,
                                                                 first_seq.get(oid))
                    past = histories.get(oid)
                    if past is not None and i > 0:
                        past = history_plan(session, ledger.root, history, oid, plan, tables, history_path)
                    # A (re-)snapshot at S holds every transaction that committed before S.
                    rows = committed if oid not in starts else committed.where(F.col("commit_lsn") >= starts[oid])
                    out.append(mirror_table(session, ledger, rows, history, oid, plan, kinds[oid],
                                            n_changes[oid], to_lsn, metadata, redone,
                                            mirror_spec(history, oid, plan, tables), past, tuples,
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


def _replaced(history: RelationHistory, oid: int, sources: dict[str, int]) -> bool:
    """Whether the mirror ``oid`` writes to started from another relation of its name: its
    latest (re-)snapshot copied another OID (``sources``: `Ledger.snapshot_sources`), or,
    never snapshotted, the capture has several OIDs first seen under its name."""
    name = history.first_name(oid)
    source = sources.get(name)
    if source is not None:
        return source != oid
    return sum(history.first_name(o) == name for o in history.relations) > 1


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
