"""Attach each decoded change to its transaction and the transaction's outcome.

Distributed in three steps, none of which brings changes to the driver:

1. **Carry-forward scan.** Every message inside a Begin / Begin Prepare block
   gets the seq of that Begin (``block_seq``), and every message inside a stream
   block gets the top-level xid of its Stream Start (``top_xid``). The seqs of
   the run's Begin and Stream Start messages (one per transaction or stream
   segment) reach the driver and each message looks its own up by binary
   search. Runs with more of them than `LOOKUP_LIMIT` are cut into seq buckets
   instead; one aggregation gives, per bucket, its last Begin and last Stream
   Start (one row per bucket reaches the driver); a window per bucket fills
   forward, seeded with the state carried into each bucket.
2. **Bookkeeping on the driver** (`pgoutput_spark.assemble.transactions`) of
   streamed and prepared transactions from their control messages only.
3. **Joins** of changes with their block (plain Begin .. Commit) or with the
   small outcome table (streamed / prepared), and removal of the ranges that
   subtransaction aborts discard.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.functions import pandas_udf
from pyspark.sql import types as T

from ..assemble.transactions import CONTROL_TYPES, Control, Ledger, Outcome, resolve
from ..decoder.protocol import MessageType
from .connect import for_tasks, is_connect
from .session import local_frame, one_row, release
from .sessions import Sessions

#: Messages that are row changes (or take effect with a transaction).
CHANGE_TYPES = ("insert", "update", "delete", "truncate")
#: Non-streamed message types that always sit inside a Begin / Begin Prepare block.
IN_BLOCK_TYPES = ("begin", "begin_prepare", "commit", "prepare", "origin", "relation", "type",
                  "insert", "update", "delete", "truncate", "message")

#: Blocks (Begin / Begin Prepare) up to which the block table is broadcast to the changes' join:
#: otherwise every message of a block crosses a shuffle (the whole run, nested change rows
#: and all). A block row is about 100 bytes.
BROADCAST_BLOCKS = 1_000_000

#: Begin and Stream Start messages up to which a run's scan looks each message's block and
#: stream up in arrays of their seqs (8 bytes each, broadcast) instead of a window: the window
#: shuffles every message of the run, nested change rows and all (1.5 GB for a million).
LOOKUP_LIMIT = 5_000_000
#: `LOOKUP_LIMIT` in a Spark Connect session, whose tasks get the arrays with their function
#: (`for_tasks`): about 2 MB of the plan the client sends.
CONNECT_LOOKUP_LIMIT = 100_000

#: What the scan adds to each message; `pgoutput_spark.spark.decode.decode` adds them itself
#: when given the scan's start (``positions``), which spares the scan a pass and a copy.
POSITION_COLUMNS = ("block_seq", "top_xid")

#: Messages per bucket of the windowed carry-forward scan (runs above `LOOKUP_LIMIT`). Each
#: bucket's window is one sort in one task, so buckets must be small enough for every core to
#: get some: a million-message run in one bucket spent 23 s in the driver-side assembly steps,
#: in buckets of 100,000 13.6 s (benchmarks/apply.py); the driver gets one row per bucket.
ROWS_PER_BUCKET = 100_000

#: A seq after every message: where a transaction still open ends.
_NO_END = (1 << 63) - 1

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScanState:
    """What a scan carries from the end of one run into the next."""

    last_begin_seq: int | None = None  # the open Begin / Begin Prepare block, if any
    last_stream_xid: int | None = None  # top xid of the open stream block, if any
    last_session: str | None = None  # the walsender session of the last message, if the capture says


@dataclass(frozen=True)
class Boundaries:
    """Sorted seqs of a run's Begin / Begin Prepare messages and of its Stream Start messages
    (with their xids), and the state carried in: each message finds its last ones by binary
    search. Small enough to broadcast up to `LOOKUP_LIMIT` of them."""

    begins: np.ndarray
    starts: np.ndarray
    start_xids: np.ndarray
    carry: ScanState

    @classmethod
    def of(cls, seq: np.ndarray, is_start: np.ndarray, xid: np.ndarray, carry: ScanState) -> "Boundaries":
        """From the (seq, is Stream Start, its xid) of the run's Begin, Begin Prepare and Stream
        Start messages, in any order."""
        seq, is_start = np.asarray(seq, dtype=np.int64), np.asarray(is_start, dtype=bool)
        order = np.argsort(seq[is_start], kind="stable")
        return cls(np.sort(seq[~is_start]), seq[is_start][order],
                   np.asarray(xid)[is_start][order].astype(np.int64), carry)

    @staticmethod
    def _last(at: np.ndarray, keys: np.ndarray, values: np.ndarray,
              carry: int | None) -> tuple[np.ndarray, np.ndarray]:
        i = np.searchsorted(keys, at, side="right") - 1
        out = values[np.maximum(i, 0)] if keys.size else np.zeros(len(at), np.int64)
        valid = i >= 0
        if carry is not None:
            out = np.where(valid, out, carry)
            valid = np.ones(len(at), bool)
        return out, valid

    def last_begin(self, seq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The seq of the last Begin / Begin Prepare at or before each ``seq``, and where there is one."""
        return self._last(seq, self.begins, self.begins, self.carry.last_begin_seq)

    def last_start_xid(self, seq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The xid of the last Stream Start at or before each ``seq``, and where there is one."""
        return self._last(seq, self.starts, self.start_xids, self.carry.last_stream_xid)


@dataclass
class Assembled:
    """Result of `assemble`: changes with their commit position, and what stays open."""

    committed: DataFrame  # decoded change rows + commit_seq, commit_lsn, commit_ts, txn_xid, txn_origin
    open_rows: DataFrame  # every row of transactions still open (kept for the next run)
    messages: DataFrame  # logical messages that took effect (or were non-transactional)
    ledger: Ledger
    end_state: ScanState
    scanned: DataFrame  # persisted (unless `decode` added the positions): call `release` when done
    # The previous run's open rows as `assemble` was given them: persisted where ``scanned`` is not.
    pending: DataFrame | None = None
    # Some of ``pending`` hold their decoded tuples (``change``) where ``raw`` is NULL: saved by
    # versions before the deferred tuples; the tasks then need ``change`` (`relation_rows`).
    pending_tuples: bool = False

    @property
    def may_leave_open(self) -> bool:
        """False when ``open_rows`` is certainly empty, known on the driver without a job: no
        block open at the end, no streamed or prepared transaction open, no unmatched abort."""
        return self.end_state.last_begin_seq is not None or self.ledger.leaves_open

    def release(self) -> None:
        _release(self.scanned, self.pending)


def _release(scanned: DataFrame, pending: DataFrame | None) -> None:
    release(scanned)
    if pending is not None:
        release(pending)


@dataclass(frozen=True)
class _Summary:
    """One pass over a run's messages: what the scan needs to choose and seed itself."""

    lo: int
    hi: int
    n: int
    boundaries: int  # Begin / Begin Prepare and Stream Start messages
    begins: int  # Begin / Begin Prepare messages
    end: ScanState


_BOUNDARY = ("begin", "begin_prepare", "commit", "prepare")
_STREAM_EDGES = ("stream_start", "stream_stop")


def _is_begin() -> Column:
    return F.col("message_type").isin("begin", "begin_prepare")


def _is_start() -> Column:
    return F.col("message_type") == "stream_start"


def _summary(messages: DataFrame, start: ScanState, sessions: Sessions | None = None) -> _Summary:
    boundary = F.col("message_type").isin(*_BOUNDARY)
    stream = F.col("message_type").isin(*_STREAM_EDGES)
    row = one_row(messages.agg(
        F.min("seq").alias("lo"), F.max("seq").alias("hi"), F.count(F.lit(1)).alias("n"),
        F.count(F.when(_is_begin(), F.lit(1))).alias("begins"),
        F.count(F.when(_is_start(), F.lit(1))).alias("starts"),
        F.max_by(F.struct("message_type", "seq"), F.when(boundary, F.col("seq"))).alias("b"),
        F.max_by(F.struct("message_type", F.col("stream_start.xid").alias("xid"), "seq"),
                 F.when(stream, F.col("seq"))).alias("s"),
    ))
    end_begin, end_xid = start.last_begin_seq, start.last_stream_xid
    if row["b"] is not None:  # the last boundary decides whether a block is open
        end_begin = row["b"]["seq"] if row["b"]["message_type"] in ("begin", "begin_prepare") else None
    if row["s"] is not None:
        end_xid = row["s"]["xid"] if row["s"]["message_type"] == "stream_start" else None
    end_session = start.last_session if sessions is None else sessions.last
    if sessions is not None and sessions.starts.size:  # a block or stream a session left open ended with it
        last_start = int(sessions.starts[-1])
        if end_begin is not None and end_begin < last_start:
            end_begin = None
        if end_xid is not None and (row["s"]["seq"] if row["s"] is not None else -1) < last_start:
            end_xid = None
    return _Summary(row["lo"] or 0, row["hi"] or 0, row["n"], row["begins"] + row["starts"], row["begins"],
                    ScanState(end_begin, end_xid, end_session))


def _bucketed(messages: DataFrame, summary: _Summary, rows_per_bucket: int) -> DataFrame:
    buckets = max(1, -(-summary.n // rows_per_bucket))
    width = max(1, -(-(summary.hi - summary.lo + 1) // buckets))
    return messages.withColumn("_bucket", ((F.col("seq") - F.lit(summary.lo)) / F.lit(width)).cast("long"))


def _carry_in(spark: SparkSession, bucketed: DataFrame, start: ScanState) -> DataFrame:
    """Per bucket: the last Begin seq and last Stream Start xid of all earlier buckets. One pass."""
    per_bucket = (
        bucketed.groupBy("_bucket")
        .agg(F.max(F.when(_is_begin(), F.col("seq"))).alias("begin_seq"),
             F.max_by(F.when(_is_start(), F.col("stream_start.xid")),
                      F.when(_is_start(), F.col("seq"))).alias("stream_xid"))
        .orderBy("_bucket")
        .collect()
    )
    rows = []
    begin, xid = start.last_begin_seq, start.last_stream_xid
    for row in per_bucket:  # one row per bucket (ROWS_PER_BUCKET messages each)
        rows.append((row["_bucket"], begin, xid))
        if row["begin_seq"] is not None:
            begin = row["begin_seq"]
        if row["stream_xid"] is not None:
            xid = row["stream_xid"]
    return local_frame(spark, rows, "_bucket long, _carry_begin long, _carry_xid long")


def _by_window(messages: DataFrame, start: ScanState, summary: _Summary,
               rows_per_bucket: int) -> tuple[Column, Column, DataFrame]:
    """The last Begin seq and Stream Start xid at each message, by a window per seq bucket."""
    bucketed = _bucketed(messages, summary, rows_per_bucket)
    carry = _carry_in(messages.sparkSession, bucketed, start)
    window = Window.partitionBy("_bucket").orderBy("seq").rowsBetween(Window.unboundedPreceding, 0)
    local_begin = F.last(F.when(_is_begin(), F.col("seq")), ignorenulls=True).over(window)
    local_xid = F.last(F.when(_is_start(), F.col("stream_start.xid")), ignorenulls=True).over(window)
    return (F.coalesce(local_begin, F.col("_carry_begin")), F.coalesce(local_xid, F.col("_carry_xid")),
            bucketed.join(F.broadcast(carry), "_bucket", "left"))


def _by_lookup(messages: DataFrame, start: ScanState) -> tuple[Column, Column, DataFrame]:
    """The last Begin seq and Stream Start xid at each message, by a binary search of the run's
    Begin and Stream Start seqs (collected to the driver and broadcast: `for_tasks`). No shuffle: only the
    seq column goes through a Python worker."""
    found = messages.where(_is_begin() | _is_start()).select(
        "seq", _is_start().alias("is_start"), F.col("stream_start.xid").alias("xid")).toArrow()
    bounds = Boundaries.of(found.column("seq").to_numpy(),
                           found.column("is_start").to_numpy(zero_copy_only=False),
                           found.column("xid").to_numpy(zero_copy_only=False), start)
    shared = for_tasks(messages.sparkSession, bounds)

    def series(values: np.ndarray, valid: np.ndarray, index: pd.Index) -> pd.Series:
        out = pd.array(values, dtype="Int64")
        out[~valid] = pd.NA
        return pd.Series(out, index=index)

    @pandas_udf("long")  # type: ignore[call-overload, untyped-decorator]
    def last_begin(at: pd.Series) -> pd.Series:
        return series(*shared().last_begin(at.to_numpy()), at.index)

    @pandas_udf("long")  # type: ignore[call-overload, untyped-decorator]
    def last_start_xid(at: pd.Series) -> pd.Series:
        return series(*shared().last_start_xid(at.to_numpy()), at.index)

    return last_begin(F.col("seq")), last_start_xid(F.col("seq")), messages


def scan(messages: DataFrame, start: ScanState = ScanState(), *, rows_per_bucket: int = ROWS_PER_BUCKET,
         lookup_limit: int = LOOKUP_LIMIT, sessions: Sessions | None = None) -> tuple[DataFrame, ScanState, int]:
    """Add ``block_seq`` and ``top_xid`` to decoded messages (see module doc); also the
    state after the last message and the number of blocks (Begin / Begin Prepare) begun.

    Runs with up to ``lookup_limit`` Begin and Stream Start messages find each message's
    last ones by a lookup; larger runs by a window per seq bucket (``rows_per_bucket``).
    Messages that have them already (`decode` with ``positions=start``, the same ``start``)
    are returned as they are.
    """
    summary = _summary(messages, start, sessions)
    if set(POSITION_COLUMNS) <= set(messages.columns):  # `decode(positions=start)` found them
        return messages, summary.end, summary.begins
    if is_connect(messages.sparkSession):  # the arrays go with the plan there, not as a broadcast
        lookup_limit = min(lookup_limit, CONNECT_LOOKUP_LIMIT)
    if summary.boundaries <= lookup_limit:
        begin, xid, rows = _by_lookup(messages, start)
    else:
        begin, xid, rows = _by_window(messages, start, summary, rows_per_bucket)
    in_block = ~F.col("in_stream") & F.col("message_type").isin(*IN_BLOCK_TYPES) & ~(
        (F.col("message_type") == "message") & ~F.col("message.transactional"))
    scanned = (
        rows.withColumn("block_seq", F.when(in_block, begin))
        .withColumn("top_xid", F.when(F.col("in_stream"), xid)
                    .otherwise(F.coalesce(F.col("stream_start.xid"), F.col("stream_commit.xid"),
                                          F.col("stream_abort.xid"),
                                          F.when(F.col("message_type") == "stream_prepare",
                                                 F.col("prepare.xid")))))
        .drop("_bucket", "_carry_begin", "_carry_xid")
    )
    return scanned, summary.end, summary.begins


def _controls(scanned: DataFrame) -> list[Control]:
    names = [MessageType(t).column_name for t in CONTROL_TYPES]
    rows = (
        scanned.where(F.col("message_type").isin(*names))
        .select("seq", "message_type", "block_seq", "stream_start", "stream_abort", "stream_commit",
                "prepare", "commit_prepared", "rollback_prepared")
        .collect()
    )
    controls = []
    for r in rows:  # control messages only: a few per streamed / prepared transaction
        kind = MessageType[r["message_type"].upper()]
        if kind is MessageType.STREAM_START:
            controls.append(Control(r["seq"], kind, xid=r["stream_start"]["xid"],
                                    first_segment=r["stream_start"]["first_segment"]))
        elif kind is MessageType.STREAM_ABORT:
            controls.append(Control(r["seq"], kind, xid=r["stream_abort"]["xid"],
                                    subxid=r["stream_abort"]["subxid"]))
        elif kind is MessageType.STREAM_COMMIT:
            s = r["stream_commit"]
            controls.append(Control(r["seq"], kind, xid=s["xid"], commit_lsn=s["commit_lsn"],
                                    end_lsn=s["end_lsn"], commit_ts=s["commit_ts"]))
        elif kind in (MessageType.PREPARE, MessageType.STREAM_PREPARE):
            p = r["prepare"]
            controls.append(Control(r["seq"], kind, xid=p["xid"], gid=p["gid"], block_seq=r["block_seq"]))
        elif kind is MessageType.COMMIT_PREPARED:
            p = r["commit_prepared"]
            controls.append(Control(r["seq"], kind, xid=p["xid"], gid=p["gid"], commit_lsn=p["commit_lsn"],
                                    end_lsn=p["end_lsn"], commit_ts=p["commit_ts"]))
        else:
            p = r["rollback_prepared"]
            controls.append(Control(r["seq"], kind, xid=p["xid"], gid=p["gid"]))
    return controls


def _begins_of_open_streams(scanned: DataFrame, ledger: Ledger) -> list[Control]:
    """Begin / Begin Prepare controls for the xids of streamed transactions still open after
    `resolve`, past their first segment: the transaction sent again whole (see `resolve`).

    Only runs that end with a stream open look: most of them find none.
    """
    opened = {t.xid: t.first_seq for t in ledger.txns if t.streamed and t.outcome is Outcome.OPEN}
    if not opened:
        return []
    xid = F.coalesce(F.col("begin.xid"), F.col("prepare.xid"))
    rows = (scanned.where(F.col("message_type").isin("begin", "begin_prepare") & xid.isin(*opened))
            .select("seq", "message_type", xid.alias("xid")).collect())
    return [Control(r["seq"], MessageType[r["message_type"].upper()], xid=r["xid"])
            for r in rows if r["seq"] > opened[r["xid"]]]


def _first_changes(scanned: DataFrame, controls: list[Control]) -> dict[tuple[int, int], list[int]]:
    """Seq of the first streamed change of each aborted subtransaction, per instance of its
    transaction (an instance starts at a first-segment Stream Start: see `resolve`)."""
    pairs = {(c.xid, c.subxid) for c in controls
             if c.kind is MessageType.STREAM_ABORT and c.subxid != c.xid}
    if not pairs:
        return {}
    starts: dict[int, list[int]] = {}
    for c in sorted(controls, key=lambda c: c.seq):
        if c.kind is MessageType.STREAM_START and c.first_segment:
            starts.setdefault(c.xid, []).append(c.seq)  # type: ignore[arg-type]
    instances = []
    for top, sub in sorted(pairs):
        firsts = starts.get(top, [-_NO_END])  # type: ignore[arg-type]
        instances += [(top, sub, lo, hi) for lo, hi in zip(firsts, [*firsts[1:], _NO_END])]
    spark = scanned.sparkSession
    wanted = local_frame(spark, instances, "top_xid long, stream_xid long, i_lo long, i_hi long")
    rows = (
        scanned.where(F.col("in_stream") & F.col("stream_xid").isNotNull())
        .join(F.broadcast(wanted), ["top_xid", "stream_xid"])
        .where((F.col("seq") >= F.col("i_lo")) & (F.col("seq") < F.col("i_hi")))
        .groupBy("top_xid", "stream_xid", "i_lo").agg(F.min("seq").alias("first"))
        .collect()
    )
    out: dict[tuple[int, int], list[int]] = {}
    for r in rows:
        out.setdefault((r["top_xid"], r["stream_xid"]), []).append(r["first"])
    return {pair: sorted(firsts) for pair, firsts in out.items()}


_OUTCOME_SCHEMA = T.StructType([
    T.StructField("o_xid", T.LongType()),
    T.StructField("o_first_seq", T.LongType()),
    T.StructField("o_block_seq", T.LongType()),
    T.StructField("o_last_seq", T.LongType()),
    T.StructField("o_outcome", T.StringType()),
    T.StructField("o_decided_seq", T.LongType()),
    T.StructField("o_commit_lsn", T.LongType()),
    T.StructField("o_commit_ts", T.TimestampType()),
])


def _outcomes(spark: SparkSession, ledger: Ledger) -> tuple[DataFrame, DataFrame]:
    rows = [(t.xid, t.first_seq, t.block_seq,
             t.last_seq if t.last_seq is not None else t.decided_seq if t.decided_seq is not None else _NO_END,
             t.outcome.value, t.decided_seq, t.commit_lsn, t.commit_ts) for t in ledger.txns]
    discards = [(d.xid, d.from_seq, d.to_seq) for d in ledger.discards]
    return (local_frame(spark, rows, _OUTCOME_SCHEMA),
            local_frame(spark, discards, "d_xid long, d_from long, d_to long"))


def assemble(decoded: DataFrame, start: ScanState = ScanState(), *,
             pending: DataFrame | None = None,
             skip_origins: tuple[str, ...] = (),
             rows_per_bucket: int = ROWS_PER_BUCKET,
             lookup_limit: int = LOOKUP_LIMIT,
             sessions: Sessions | None = None) -> Assembled:
    """Attach commit positions to the changes of a decoded capture (good rows only).

    ``pending`` are the ``open_rows`` of the previous run (already scanned) and
    ``start`` its ``end_state``: together they carry open transactions over.
    Transactions whose origin (Origin message) is in ``skip_origins`` change
    nothing, as with a subscription's ``origin = none``. ``sessions``: where the
    capture's walsender sessions begin (`find_sessions`, given to `decode` too):
    what a session left open ends with it, as the apply worker forgets it.
    """
    spark = decoded.sparkSession
    messages = decoded.where(F.col("error").isNull())
    scanned, end, begins = scan(messages, start, rows_per_bucket=rows_per_bucket, lookup_limit=lookup_limit,
                                sessions=sessions)
    decoded_columns = [c for c in decoded.columns if c not in POSITION_COLUMNS]
    positioned = set(POSITION_COLUMNS) <= set(decoded.columns)  # then ``scanned`` reads ``decoded`` (cached)
    if pending is not None:
        if positioned:  # read once: Delta lists the table's files again for each plan that reads it
            pending = pending.persist()
        # Saved with ``raw`` binary; the run's may carry it as a string.
        scanned = scanned.unionByName(pending.select(
            *(F.col(c).cast(scanned.schema["raw"].dataType).alias(c) if c == "raw" else c for c in scanned.columns)))
    if not positioned:
        scanned = scanned.persist()
    try:
        assembled = _assembled(spark, scanned, pending, end, begins, decoded_columns, skip_origins,
                               () if sessions is None else sessions.starts.tolist())
        assembled.pending_tuples = _carries_tuples(pending)
        return assembled
    except BaseException:  # nothing cached stays behind a failed run (a notebook's session goes on)
        _release(scanned, pending)
        raise


def session_end_lines(ledger: Ledger) -> list[str]:
    """One line per streamed transaction that a walsender session left open (`resolve`)."""
    return [f"streamed transaction {xid} (since seq {first}) was open when its walsender session ended: "
            f"forgotten at seq {start}, where the next session begins (which sends it again if it commits)"
            for xid, first, start in ledger.session_ends]


def _carries_tuples(pending: DataFrame | None) -> bool:
    """Whether saved open-transaction rows hold decoded tuples (``change``) where ``raw`` is NULL
    (`Assembled.pending_tuples`): versions before `decode`'s deferred tuples saved them so."""
    return pending is not None and pending.where(
        F.col("message_type").isin("insert", "update", "delete") & F.col("raw").isNull()).limit(1).count() > 0


def _assembled(spark: SparkSession, scanned: DataFrame, pending: DataFrame | None, end: ScanState,
               begins: int, decoded_columns: list[str], skip_origins: tuple[str, ...],
               session_starts: Sequence[int] = ()) -> Assembled:
    """`assemble`'s plans on the ``scanned`` messages (the previous run's ``pending`` among them)."""
    controls = _controls(scanned)
    first_changes = _first_changes(scanned, controls)
    ledger = resolve(controls, first_changes, session_starts)
    resent = _begins_of_open_streams(scanned, ledger)
    if resent:
        ledger = resolve([*controls, *resent], first_changes, session_starts)
    for line in session_end_lines(ledger):
        _log.info("%s", line)
    outcomes, discards = _outcomes(spark, ledger)

    # Plain and prepared blocks: one row per Begin with its end and origin.
    blocks = scanned.where(F.col("block_seq").isNotNull()).groupBy(F.col("block_seq").alias("b_seq")).agg(
        F.max(F.coalesce(F.col("begin.xid"), F.col("prepare.xid"))).alias("b_xid"),
        F.max(F.when(F.col("message_type") == "commit", F.col("seq"))).alias("b_commit_seq"),
        F.max(F.col("commit.commit_lsn")).alias("b_commit_lsn"),
        F.max(F.col("commit.commit_ts")).alias("b_commit_ts"),
        F.max(F.when(F.col("message_type") == "prepare", F.col("seq"))).alias("b_prepare_seq"),
        F.max_by(F.col("origin.name"), F.when(F.col("message_type") == "origin", F.col("seq")))
        .alias("b_origin"),
    )
    streamed_origin = scanned.where((F.col("message_type") == "origin") & F.col("in_stream")).groupBy(
        F.col("top_xid").alias("s_xid")).agg(F.max_by("origin.name", "seq").alias("s_origin"))

    # Pending rows add the few blocks still open at the end of the previous run.
    block_rows = scanned.where(F.col("block_seq").isNotNull()).join(
        F.broadcast(blocks) if begins <= BROADCAST_BLOCKS else blocks, F.col("block_seq") == F.col("b_seq"), "left")
    block_rows = block_rows.join(
        F.broadcast(outcomes), F.col("block_seq") == F.col("o_block_seq"), "left")
    block_rows = block_rows.select(
        "*",
        F.when(F.col("b_commit_seq").isNotNull(), F.lit("committed"))
        .when(F.col("b_prepare_seq").isNotNull(), F.coalesce(F.col("o_outcome"), F.lit("prepared")))
        # Only the run's last block can still end: one that other messages follow was cut off
        # (its walsender session ended) and is sent again whole, as the apply worker expects.
        .when(F.col("block_seq") == F.lit(end.last_begin_seq).cast("long"), F.lit("open"))
        .otherwise(F.lit("discarded")).alias("outcome"),
        F.coalesce(F.col("b_commit_seq"), F.col("o_decided_seq")).alias("commit_seq"),
        F.coalesce(F.col("b_commit_lsn"), F.col("o_commit_lsn")).alias("commit_lsn"),
        F.coalesce(F.col("b_commit_ts"), F.col("o_commit_ts")).alias("commit_ts"),
        F.col("b_xid").alias("txn_xid"),
        F.col("b_origin").alias("txn_origin"),
    )

    stream_rows = scanned.where(F.col("top_xid").isNotNull()).join(
        F.broadcast(outcomes),
        (F.col("top_xid") == F.col("o_xid")) & F.col("o_block_seq").isNull()
        & (F.col("seq") >= F.col("o_first_seq")) & (F.col("seq") <= F.col("o_last_seq")),
        "left",
    ).join(
        F.broadcast(discards),
        (F.col("top_xid") == F.col("d_xid")) & (F.col("seq") >= F.col("d_from")) & (F.col("seq") < F.col("d_to")),
        "left_anti",
    ).join(F.broadcast(streamed_origin), F.col("top_xid") == F.col("s_xid"), "left")
    stream_rows = stream_rows.select(
        "*",
        F.coalesce(F.col("o_outcome"), F.lit("open")).alias("outcome"),
        F.col("o_decided_seq").alias("commit_seq"),
        F.col("o_commit_lsn").alias("commit_lsn"),
        F.col("o_commit_ts").alias("commit_ts"),
        F.col("top_xid").alias("txn_xid"),
        F.col("s_origin").alias("txn_origin"),
    )
    keep = [*decoded_columns, *POSITION_COLUMNS, "outcome", "commit_seq", "commit_lsn",
            "commit_ts", "txn_xid", "txn_origin"]
    rows = block_rows.select(*keep).unionByName(stream_rows.select(*keep))
    # Open transactions carry over whatever their origin: their fate is still to come.
    open_rows = rows.where(F.col("outcome").isin(Outcome.OPEN.value, Outcome.PREPARED.value)).select(
        *decoded_columns, *POSITION_COLUMNS)
    taking_effect = rows.where(F.col("outcome") == "committed")
    if skip_origins:
        taking_effect = taking_effect.where(
            F.col("txn_origin").isNull() | ~F.col("txn_origin").isin(*skip_origins))
    committed = taking_effect.where(F.col("message_type").isin(*CHANGE_TYPES))
    transactional = taking_effect.where(F.col("message_type") == "message")
    non_transactional = scanned.where(
        (F.col("message_type") == "message") & ~F.col("message.transactional"))
    messages_out = transactional.select(
        "seq", "message.*", "commit_lsn", "commit_ts").unionByName(
        non_transactional.select("seq", "message.*", F.lit(None).cast("long").alias("commit_lsn"),
                                 F.lit(None).cast("timestamp").alias("commit_ts")))
    return Assembled(committed, open_rows, messages_out, ledger, end, scanned, pending)
