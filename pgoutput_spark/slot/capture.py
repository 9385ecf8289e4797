"""`capture_slot`: land a pgoutput slot's messages as capture files, exactly once.

Each chunk is read with a peek, written to the landing, committed there (a
file rename), and only then is the slot advanced to the chunk's end. A chunk
ends at a transaction boundary where no streamed transaction is open (the
rows after it are read again by the next peek, which decodes them the same
way), and the slot is advanced to that boundary's LSN. Not inside an open
streamed transaction: the next session would send it again from its start,
and PostgreSQL 16.2 was seen to leave a subtransaction's Stream Abort out of
such a resend (README, `capture`). A streamed read is read again without
streaming when streamed transactions overlap through all of it (no place to
end), and when its streamed transactions sent the changes of a
subtransaction that the server reports rolled back without its Stream Abort.
So:

- killed before the file is in place: nothing was landed, the slot did not
  move, the next run reads the same chunk again;
- killed after the file is in place, before the slot moved: the next run
  finds the file's ``end_lsn`` ahead of the slot, advances the slot, and
  goes on with the next chunk;
- ``seq`` continues from the last landed file.

A slot that is ahead of the landing (someone else consumed it) is an error:
the messages in between are gone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from ..decoder.messages import decode_message
from ..decoder.protocol import MessageType
from ..errors import CaptureError
from ..lsn import Lsn
from ..spark.connect import require_classic
from .delta_landing import DeltaLanding
from .landing import CAPTURE_SCHEMA, ChunkRecord, ParquetLanding
from .options import PluginOptions
from .source import SlotSource, connect

if TYPE_CHECKING:
    import psycopg
    from pyspark.sql import SparkSession

__all__ = ["CaptureResult", "ChunkProgress", "capture_slot"]

_log = logging.getLogger(__name__)

_ENDS = frozenset({MessageType.COMMIT, MessageType.PREPARE, MessageType.COMMIT_PREPARED,
                   MessageType.ROLLBACK_PREPARED})


#: Messages that carry the (sub)transaction's xid after their type byte inside a stream block.
_CHANGES = frozenset({MessageType.INSERT, MessageType.UPDATE, MessageType.DELETE, MessageType.TRUNCATE,
                      MessageType.MESSAGE})


class Boundaries:
    """Finds the messages after which a chunk may end: transaction ends with no stream open.

    Commit, Prepare, Commit Prepared and Rollback Prepared end a transaction;
    so do Stream Commit, Stream Prepare and a Stream Abort of the top-level
    transaction. A boundary is usable only outside a Stream Start / Stop block
    and when every streamed transaction begun so far has ended.

    It also notes, for each streamed transaction that commits or prepares, the
    subtransactions whose changes it sent and did not abort (`settled`: the
    message index of the Stream Commit / Prepare, the transaction's xid, and
    those xids), for `_read_chunk` to check with the server.
    """

    def __init__(self) -> None:
        self.in_block = False
        self.block_xid = 0
        self.open: set[int] = set()
        self.settled: list[tuple[int, int, set[int]]] = []
        self._subxacts: dict[int, set[int]] = {}  # open streamed transaction -> subtransactions seen
        self._fed = 0

    def after(self, data: bytes) -> bool:
        """Feed the next message; True if a chunk may end right after it."""
        index, self._fed = self._fed, self._fed + 1
        kind = data[0] if data else -1
        if self.in_block and kind in _CHANGES and len(data) >= 5:
            xid = int.from_bytes(data[1:5], "big")
            if xid != self.block_xid:
                self._subxacts.setdefault(self.block_xid, set()).add(xid)
            return False
        if kind == MessageType.STREAM_START:
            start = decode_message(data)
            self.in_block, self.block_xid = True, start.xid  # type: ignore[attr-defined]
            self.open.add(start.xid)  # type: ignore[attr-defined]
            if start.first_segment:  # type: ignore[attr-defined]
                self._subxacts[start.xid] = set()  # type: ignore[attr-defined]
            return False
        if kind == MessageType.STREAM_STOP:
            self.in_block = False
            return False
        if kind in (MessageType.STREAM_COMMIT, MessageType.STREAM_PREPARE):
            xid = decode_message(data).xid  # type: ignore[attr-defined]
            self.open.discard(xid)
            if subxacts := self._subxacts.pop(xid, None):
                self.settled.append((index, xid, subxacts))
        elif kind == MessageType.STREAM_ABORT:
            abort = decode_message(data)
            if abort.xid != abort.subxid:  # type: ignore[attr-defined]
                self._subxacts.get(abort.xid, set()).discard(abort.subxid)  # type: ignore[attr-defined]
                return False  # a subtransaction: the streamed transaction goes on
            self.open.discard(abort.xid)  # type: ignore[attr-defined]
            self._subxacts.pop(abort.xid, None)  # type: ignore[attr-defined]
        elif kind not in _ENDS:
            return False
        return not self.in_block and not self.open


@dataclass(frozen=True)
class ChunkProgress:
    """What a landed chunk added, for the progress line."""

    record: ChunkRecord
    server_lsn: Lsn
    seconds: float
    #: rolled-back subtransactions whose changes a streamed peek sent without their Stream Abort
    #: (the chunk was read again without streaming)
    lost_aborts: tuple[int, ...] = ()
    #: messages a streamed peek read with no transaction end outside an open streamed transaction
    #: (the chunk was read again without streaming)
    overlapping: int = 0
    #: WAL the chunk's sessions decoded before its first message: from the slot's restart_lsn
    #: to its position (see README, "Chunk size and speed")
    decoded_before: int | None = None

    def render(self) -> str:
        r = self.record
        lag = max(0, int(self.server_lsn) - r.end_lsn)
        line = (f"chunk {r.chunk}: {r.messages:,} messages ({r.bytes / 1e6:.1f} MB) seq {r.first_seq}"
                f"..{r.last_seq} in {self.seconds:.1f} s; slot at {Lsn(r.end_lsn)},"
                f" {lag / 1e6:.1f} MB behind the server")
        if self.decoded_before is not None:
            line += f", {self.decoded_before / 1e6:.1f} MB of WAL decoded before the chunk"
        if self.lost_aborts:
            line += (f"; read without streaming: the server streamed rolled-back subtransaction(s)"
                     f" {', '.join(map(str, self.lost_aborts))} without their Stream Abort")
        elif self.overlapping:
            line += (f"; read without streaming: streamed transactions overlapped through all"
                     f" {self.overlapping:,} messages read")
        return line


@dataclass
class CaptureResult:
    landing: str
    slot: str
    chunks: list[ChunkRecord] = field(default_factory=list)
    resumed_at: Lsn | None = None
    recovered: bool = False
    caught_up: bool = False

    @property
    def messages(self) -> int:
        return sum(c.messages for c in self.chunks)

    def render(self) -> str:
        lines = [f"landed {self.messages:,} messages in {len(self.chunks)} chunk(s) from slot"
                 f" {self.slot!r} into {self.landing}"]
        if self.recovered:
            lines.append(f"  recovered: the last run landed up to {self.resumed_at} without moving the"
                         " slot; the slot was advanced there")
        if self.chunks:
            lines.append(f"  seq {self.chunks[0].first_seq}..{self.chunks[-1].last_seq},"
                         f" slot at {Lsn(self.chunks[-1].end_lsn)}")
        lines.append("  caught up with the server" if self.caught_up else "  stopped before catching up")
        return "\n".join(lines)


def _batch(seq: int, rows: list[tuple[int, int, bytes]]) -> pa.RecordBatch:
    lsns, xids, data = zip(*rows)
    return pa.record_batch([
        pa.array(range(seq, seq + len(rows)), pa.int64()),
        pa.array(lsns, pa.int64()),
        pa.array(xids, pa.int64()),
        pa.array(data, pa.binary()),
    ], schema=CAPTURE_SCHEMA)


def capture_slot(
    landing: str,
    *,
    slot: str,
    publications: tuple[str, ...] | list[str] | None = None,
    dsn: str | None = None,
    proto_version: int | None = None,
    streaming: str | None = None,
    two_phase: bool | None = None,
    messages: bool | None = None,
    binary: bool | None = None,
    origin: str | None = None,
    create_slot: bool = False,
    failover: bool = False,
    chunk_size: int = 100_000,
    until_lsn: Lsn | str | None = None,
    max_messages: int | None = None,
    batch_rows: int = 10_000,
    progress: Callable[[ChunkProgress], None] | None = None,
    format: Literal["parquet", "delta"] = "parquet",
    spark: SparkSession | None = None,
) -> CaptureResult:
    """Land the slot's pending messages into `landing`; return what was landed.

    `landing` is a Parquet folder (a local path, or a URI Arrow's file systems reach:
    `landing.arrow_filesystem`), or with ``format="delta"`` a Delta table that each chunk
    appends to (through `spark`, at any path or URI it writes).

    Options left as None continue the landing's recorded ones (a new landing:
    the highest protocol version the server speaks, everything else off);
    options that differ from the recorded ones are an error. Stops when caught
    up with the server, or once `max_messages` were landed, or at the last
    transaction boundary before `until_lsn`, whichever comes first. A chunk
    holds at least `chunk_size` messages when that many are pending (it ends
    at a transaction boundary), and memory holds one batch of `batch_rows`.

    With `failover` (PostgreSQL 17+) the slot is a failover slot: created so with
    `create_slot`, made so when it is not (standbys with ``sync_replication_slots``
    keep a copy of it, which the capture continues from once one is promoted).
    With `two_phase` and a slot made without it, PostgreSQL 18 and later turn it on for the
    slot (earlier versions: an error).
    """
    if chunk_size < 1 or batch_rows < 1:
        raise CaptureError("chunk_size and batch_rows must be 1 or more")
    stop_lsn = None if until_lsn is None else Lsn(until_lsn)
    if format == "delta":
        if spark is None:
            raise CaptureError("a Delta landing needs a Spark session")
        require_classic(spark, "a Delta landing")  # its chunks are uploaded and committed through the JVM
        target: ParquetLanding | DeltaLanding = DeltaLanding(spark, landing)
    elif format == "parquet":
        target = ParquetLanding(landing)
    else:
        raise CaptureError(f"landing format must be parquet or delta, got {format!r}")
    recorded = target.info()
    conn = connect(dsn)
    with conn:
        options = _options(recorded, conn, publications=publications, proto_version=proto_version,
                           streaming=streaming, two_phase=two_phase, messages=messages,
                           binary=binary, origin=origin)
        source = SlotSource(conn, slot, options, dsn)
        source.check_server()
        if options.binary:
            _check_binary_types(conn, options.publications)
        source.lock()
        info = source.ensure_slot(create=create_slot and recorded is None, failover=failover)
        settings = source.apply_settings()
        target.open({"format": 1, "slot": slot, "database": conn.info.dbname,
                     "system_identifier": source.system_identifier(),
                     "options": options.as_dict(), "settings": settings})
        result = CaptureResult(landing=str(target.path), slot=slot)
        last = target.last_chunk()
        timeline = source.timeline()
        if last is not None and last.timeline is not None and timeline is not None:
            _check_timeline(source, landing, last, timeline)
        if last is not None:
            result.resumed_at = Lsn(last.end_lsn)
            if info.confirmed_flush < last.end_lsn:
                source.advance(Lsn(last.end_lsn))
                result.recovered = True
                _log.info("slot %s was behind the landing: advanced to %s", slot, Lsn(last.end_lsn))
            elif info.confirmed_flush > last.end_lsn:
                raise CaptureError(
                    f"{source.where} is at {info.confirmed_flush} but {landing} ends at"
                    f" {Lsn(last.end_lsn)} (chunk {last.chunk}): the messages in between were consumed"
                    " by someone else; land into a new folder (and take a new snapshot)")
        position = info.confirmed_flush if last is None else last.end_lsn
        next_chunk = 0 if last is None else last.chunk + 1
        next_seq = 0 if last is None else last.last_seq + 1
        want: int | None = None
        lost: set[int] = set()  # a streamed peek of this chunk lost these subtransactions' aborts
        overlapping = 0  # a streamed peek of this chunk found no end outside open streams in this many
        streamed = options.streaming in ("on", "parallel")
        log_xacts = source.can_log_running_xacts()  # see `_log_running_xacts`
        restart: Lsn | None = None  # the slot's restart_lsn before the chunk, for the progress line
        while max_messages is None or result.messages < max_messages:
            if want is None:
                want = chunk_size if max_messages is None else min(chunk_size, max_messages - result.messages)
                restart = source.restart_lsn() if progress is not None else None
            started = time.monotonic()
            chunk = target.new_chunk(next_chunk)
            try:
                read, record, sent = _read_chunk(source, chunk, next_seq, want, stop_lsn, batch_rows,
                                                 position, streaming=not (lost or overlapping))
                if record is not None and (aborted := _aborts_not_sent(source, sent)):
                    lost |= aborted
                    _log.warning("chunk %d: the server streamed the changes of subtransaction(s) %s, which"
                                 " it reports rolled back, without their Stream Abort: reading the chunk"
                                 " again without streaming", next_chunk, sorted(aborted))
                    chunk.discard()
                    continue
                if record is None:
                    chunk.discard()
                    if streamed and read and not (lost or overlapping) and (
                            read < want or want >= _unstreamed_after(chunk_size)):
                        # streamed transactions overlap through all of it: without streaming, every
                        # commit is a place to end, and those still open come in a later chunk
                        overlapping = read
                        _log.info("chunk %d: streamed transactions overlap through all %d messages read:"
                                  " reading it again without streaming", next_chunk, read)
                        continue
                    if read < want:  # decoding reached the end: what is left is unfinished
                        result.caught_up = _at_end(source, stop_lsn)
                        break
                    want *= 2  # a streamed transaction longer than the chunk: read further
                    _log.info("no transaction boundary in %d messages: reading %d", read, want)
                    continue
                record = replace(record, timeline=source.timeline())
                chunk.commit(record)
            except BaseException:
                chunk.discard()
                raise
            source.advance(Lsn(record.end_lsn))
            if log_xacts:
                log_xacts = _log_running_xacts(source)
            result.chunks.append(record)
            if progress is not None:
                progress(ChunkProgress(record, source.server_lsn(), time.monotonic() - started,
                                       tuple(sorted(lost)), overlapping,
                                       None if restart is None else max(0, position - int(restart))))
            lost, overlapping = set(), 0
            next_chunk, next_seq, position = next_chunk + 1, record.last_seq + 1, record.end_lsn
            if read < want or (stop_lsn is not None and record.end_lsn >= stop_lsn):
                result.caught_up = read < want and _at_end(source, stop_lsn)
                break
            want = None
    return result


def _check_timeline(source: SlotSource, landing: str, last: ChunkRecord, timeline: int) -> None:
    """Refuse a server whose history does not hold the landing: after a failover, the promoted
    standby's history must have left the landing's timeline past the landing's end."""
    if timeline == last.timeline:
        return
    read = f"{landing} ends at {Lsn(last.end_lsn)} (chunk {last.chunk}, read on timeline {last.timeline})"
    if timeline < last.timeline:  # type: ignore[operator]
        raise CaptureError(f"{read}, but {source.where} is on timeline {timeline}, an older one: it is not"
                           " the server that took over (a failover's old primary?)")
    left = source.timeline_history(timeline).get(last.timeline)  # type: ignore[arg-type]
    if left is not None and left >= last.end_lsn:
        return
    if left is None:
        why = f"timeline {last.timeline} is not in the history of {source.where} (timeline {timeline})"
    else:
        why = f"{source.where} left timeline {last.timeline} at {left}, when it was promoted (timeline {timeline})"
    raise CaptureError(
        f"{read}, but {why}: the landing, and the mirrors, hold changes this server never had (a failover"
        " before the standby received them; name its physical slot in synchronized_standby_slots). Start the"
        " pipeline again from this server: `pgoutput-spark snapshot` into a new target and `capture` into a"
        " new landing")


#: pg_type.typtype of the user types whose binary form the apply cannot read: composite,
#: range and multirange values start with counts or flag bytes, not with text.
_NOT_TEXT_KINDS = {"c": "a composite type", "r": "a range type", "m": "a multirange type"}


def _check_binary_types(conn: psycopg.Connection[Any], publications: Sequence[str]) -> None:
    """Refuse a binary capture of a column the apply cannot read from binary, before anything is landed.

    A column's type is followed through domains (pgoutput sends the base type's values) and
    arrays (the elements): a built-in type without a binary reader, or a composite, range or
    multirange type, is refused. Other user types (enums, extension types) are read as text when
    their values look like text, which only their values can tell.
    """
    from ..convert.dispatch import CODECS
    from .snapshot import base_type, published_tables

    def unreadable(type_oid: int) -> str | None:
        oid, kind, namespace, name = base_type(conn, type_oid, elements=True)
        if kind in _NOT_TEXT_KINDS:
            return f"{name}: {_NOT_TEXT_KINDS[kind]}"
        return name if namespace == "pg_catalog" and oid not in CODECS else None

    why: dict[int, str | None] = {}
    bad = []
    for table in published_tables(conn, publications):
        for column, type_oid, _ in table.columns:
            if type_oid not in why:
                why[type_oid] = unreadable(type_oid)
            if why[type_oid] is not None:
                bad.append(f"{table.schema}.{table.name}.{column} ({why[type_oid]})")
    if bad:
        raise CaptureError(
            f"binary capture: the apply cannot read these columns' values in binary form: {', '.join(bad)};"
            " capture without binary (text format), or leave these columns out of the publication"
            " (a column list)")


#: A streamed read of a chunk that finds no transaction end outside open streamed transactions
#: in this many times ``chunk_size`` messages (and at least `_UNSTREAMED_MIN`) reads it again
#: without streaming, as it does when it reaches the server's end without one.
_UNSTREAMED_AFTER = 10
_UNSTREAMED_MIN = 100_000


def _unstreamed_after(chunk_size: int) -> int:
    return max(_UNSTREAMED_AFTER * chunk_size, _UNSTREAMED_MIN)


def _aborts_not_sent(source: SlotSource, sent: dict[int, int]) -> set[int]:
    """The subtransactions in `sent` (subxid -> its transaction) that the server reports rolled back
    while their transaction is not (a prepared transaction rolled back since is no omission)."""
    aborted = source.aborted([*sent, *sent.values()])
    return {sub for sub, top in sent.items() if sub in aborted and top not in aborted}


def _log_running_xacts(source: SlotSource) -> bool:
    """After a chunk, have the server log its running transactions; False once that failed.

    Each chunk is a new decoding session that starts at the slot's ``restart_lsn``, which
    PostgreSQL moves only at running-transactions records (written by the server after 15 s of
    activity): without one per chunk, every chunk decodes up to 15-30 s of WAL again before its
    own messages. The record is small; not being able to write it only costs that time.
    """
    try:
        source.log_running_xacts()
    except CaptureError as exc:
        _log.warning("%s; the capture goes on without writing them (each chunk then decodes from the"
                     " last one the server wrote)", exc)
        return False
    return True


def _at_end(source: SlotSource, stop_lsn: Lsn | None) -> bool:
    """Whether a peek that returned less than asked reached the server's end (not `stop_lsn`)."""
    return stop_lsn is None or source.server_lsn() <= stop_lsn


def _read_chunk(source: SlotSource, chunk: Any, seq: int, limit: int, stop_lsn: Lsn | None,
                batch_rows: int, start_lsn: int, *, streaming: bool = True,
                ) -> tuple[int, ChunkRecord | None, dict[int, int]]:
    """Peek up to the chunk's limit into `chunk`; return messages read, the record to commit, and
    the subtransactions whose changes the chunk's streamed transactions sent and did not abort
    (each with its transaction's xid).

    The chunk ends at the last boundary past `start_lsn` (the slot's position).
    A session that starts decoding again can stream a transaction that ended
    before that position (it was aborted, or committed and is then aborted
    for the client): its Stream Abort has an older LSN and is no place to end,
    or the slot would never move and each chunk would repeat it.

    A session that starts decoding again can also stream a transaction whose
    subtransaction it later finds rolled back without sending that Stream
    Abort (PostgreSQL 16.2 did, for a transaction open across sessions whose
    earlier changes it had spilled to disk): the caller asks the server
    about the subtransactions returned, and reads the chunk again without
    streaming if one was rolled back.
    """
    boundaries = Boundaries()
    read = 0
    kept = 0
    kept_bytes = 0
    size = 0
    end_lsn = start_lsn
    for rows in source.peek(limit=limit, upto_lsn=stop_lsn, batch_rows=batch_rows, streaming=streaming):
        chunk.write(_batch(seq + read, rows))
        for i, (lsn, _xid, data) in enumerate(rows):
            size += len(data)
            if boundaries.after(data) and lsn > end_lsn:
                kept, kept_bytes, end_lsn = read + i + 1, size, lsn
        read += len(rows)
    _log.debug("chunk %d: peeked %d messages (limit %d), %d up to the last boundary",
               chunk.chunk, read, limit, kept)
    if kept == 0:
        return read, None, {}
    sent = {sub: xid for index, xid, subxacts in boundaries.settled if index < kept for sub in subxacts}
    return read, ChunkRecord(chunk=chunk.chunk, first_seq=seq, last_seq=seq + kept - 1,
                             end_lsn=end_lsn, bytes=kept_bytes), sent


def _options(recorded: dict[str, Any] | None, conn: Any, **given: Any) -> PluginOptions:
    """The pgoutput options: the given ones over the landing's recorded ones over the defaults."""
    if recorded is not None:
        base = dict(recorded["options"])
    else:
        version = conn.info.server_version
        base = {"publications": (), "proto_version": 4 if version >= 160000 else 3 if version >= 150000
                else 2 if version >= 140000 else 1}
    for name, value in given.items():
        if value is not None:
            base[name] = tuple(value) if name == "publications" else value
    if not base["publications"]:
        raise CaptureError("a new landing needs its publications: name them with --publication "
                           "(publications=...); later captures into it reuse the ones it records")
    try:
        return PluginOptions.from_dict(base)
    except ValueError as exc:
        raise CaptureError(f"pgoutput options: {exc}") from None
