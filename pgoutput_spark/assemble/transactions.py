"""Outcomes of streamed and prepared transactions, following PostgreSQL's apply worker.

Plain transactions (Begin .. Commit) are resolved where their messages are: a
change belongs to the block opened by the last Begin before it and takes effect
at that block's Commit. Streamed and two-phase transactions need bookkeeping
across the stream: their changes arrive in chunks interleaved with other
transactions, and their fate (commit, abort, rollback) is decided by a later
message, possibly in a later run. That bookkeeping lives here, as a small
sequential state machine over the *control* messages only (a handful per
transaction, never the changes), mirroring ``worker.c``:

- Stream Start (first segment) opens an instance of a streamed transaction.
  If an instance of that xid is still open, its changes are void: the
  walsender sends a transaction again from its first segment after a
  reconnect, and the apply worker starts its spool file afresh
  (``stream_open_file`` with ``first_segment``). A Begin or Begin Prepare of
  that xid (the transaction sent again whole) voids it too; so does either
  after an xid wraparound, for an instance whose end never came.
- Stream Abort with ``subxid == xid`` discards the whole transaction; with a
  subtransaction xid it discards, among the changes received so far, that
  subtransaction's first change and everything after it
  (``stream_abort_internal`` truncates the spooled changes there); an abort
  for an xid never seen is ignored.
- Stream Commit makes the changes take effect at its own position.
- The first message of a walsender session (where the capture says which session sent
  each message: `pgoutput_spark.spark.sessions`) discards every streamed transaction
  still open, as the apply worker forgets them with its connection: the next session
  sends each again from its first segment if it commits, and nothing more of it if it
  aborted meanwhile.
- Prepare / Stream Prepare hold the changes under their gid; Commit Prepared
  makes them take effect at the Commit Prepared's position; Rollback Prepared
  discards them (and is ignored for a gid never prepared, as the apply worker
  does for prepares from before the slot's consistent point).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from ..decoder.protocol import MessageType
from ..errors import PgoutputSparkError


class AssemblyError(PgoutputSparkError):
    """The transaction structure of the capture is inconsistent."""


class Outcome(enum.Enum):
    OPEN = "open"  # still receiving changes, or a plain block without its Commit yet
    PREPARED = "prepared"  # prepared, waiting for Commit / Rollback Prepared
    COMMITTED = "committed"
    DISCARDED = "discarded"  # aborted stream, or prepared and rolled back


@dataclass(frozen=True)
class Control:
    """One control message: what the state machine needs of it."""

    seq: int
    kind: MessageType
    xid: int | None = None
    subxid: int | None = None
    gid: str | None = None
    first_segment: bool = False
    commit_lsn: int | None = None
    end_lsn: int | None = None
    commit_ts: object | None = None  # datetime, passed through
    block_seq: int | None = None  # for Prepare: the seq of its Begin Prepare


@dataclass(frozen=True)
class Txn:
    """A streamed transaction instance (``block_seq is None``) or a prepared block."""

    xid: int
    first_seq: int
    block_seq: int | None = None
    outcome: Outcome = Outcome.OPEN
    gid: str | None = None
    decided_seq: int | None = None  # seq of the message that decided the outcome
    last_seq: int | None = None  # where a streamed instance ends if not at decided_seq: before
    # the start of the transaction sent again
    commit_lsn: int | None = None
    end_lsn: int | None = None
    commit_ts: object | None = None

    @property
    def streamed(self) -> bool:
        return self.block_seq is None


@dataclass(frozen=True)
class Discard:
    """Changes of streamed transaction ``xid`` with ``from_seq <= seq < to_seq`` are void."""

    xid: int
    first_seq: int  # identifies the transaction instance
    from_seq: int
    to_seq: int


@dataclass
class Ledger:
    """Result of `resolve`: every streamed / prepared transaction seen, and discards."""

    txns: list[Txn] = field(default_factory=list)
    discards: list[Discard] = field(default_factory=list)
    #: Seqs of Stream Aborts for a transaction not being streamed (ignored, as the apply worker
    #: does); the assembly finds no transaction for such a row and keeps it as open.
    unmatched_aborts: list[int] = field(default_factory=list)
    #: Streamed transactions open when their walsender session ended: (xid, the seq of its
    #: first segment, the seq of the next session's first message).
    session_ends: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def leaves_open(self) -> bool:
        """Whether a streamed or prepared transaction is still open, or an unmatched abort seen."""
        return bool(self.unmatched_aborts) or any(
            t.outcome in (Outcome.OPEN, Outcome.PREPARED) for t in self.txns)


def resolve(controls: Iterable[Control],
            first_change: Mapping[tuple[int, int], list[int]],
            session_starts: Iterable[int] = ()) -> Ledger:
    """Run the state machine over control messages in seq order.

    ``first_change[(top_xid, subxid)]`` lists the seqs of the first change of
    subtransaction ``subxid`` in each streamed instance of ``top_xid`` (in seq
    order; usually one). Changes themselves are never needed here. Begin and
    Begin Prepare controls are optional: only those whose xid has a streamed
    instance open matter (`BEGIN_TYPES`).
    ``session_starts``: the seqs of the messages that begin a walsender session (see the
    module doc).
    """
    ledger = Ledger()
    streaming: dict[int, int] = {}  # top xid -> index in ledger.txns of its open instance
    prepared: dict[str, int] = {}  # gid -> index of the prepared transaction

    def decide(index: int, **changes: object) -> None:
        ledger.txns[index] = replace(ledger.txns[index], **changes)  # type: ignore[arg-type]

    sessions = sorted(session_starts, reverse=True)

    def sessions_begun(upto: float) -> None:
        while sessions and sessions[-1] <= upto:  # a session began: what it left open is forgotten
            start = sessions.pop()
            for xid, index in streaming.items():
                decide(index, outcome=Outcome.DISCARDED, decided_seq=start, last_seq=start - 1)
                ledger.session_ends.append((xid, ledger.txns[index].first_seq, start))
            streaming.clear()

    for c in sorted(controls, key=lambda c: c.seq):
        sessions_begun(c.seq)
        if c.kind in BEGIN_TYPES or (
                c.kind is MessageType.STREAM_START and c.first_segment):
            assert c.xid is not None
            earlier = streaming.pop(c.xid, None)
            if earlier is not None:  # sent again from its start: what came before is void
                decide(earlier, outcome=Outcome.DISCARDED, decided_seq=c.seq, last_seq=c.seq - 1)
        if c.kind is MessageType.STREAM_START:
            assert c.xid is not None
            if c.first_segment:
                streaming[c.xid] = len(ledger.txns)
                ledger.txns.append(Txn(c.xid, c.seq))
            elif c.xid not in streaming:
                raise AssemblyError(
                    f"Stream Start at seq {c.seq} continues transaction {c.xid}, whose "
                    f"first segment is not in the capture (the capture must start at "
                    f"the slot's start or at a run boundary)")
        elif c.kind is MessageType.STREAM_ABORT:
            assert c.xid is not None and c.subxid is not None
            index = streaming.get(c.xid)
            if index is None:  # abort of a transaction not being streamed: nothing to undo
                ledger.unmatched_aborts.append(c.seq)
                continue
            txn = ledger.txns[index]
            if c.subxid == c.xid:
                decide(index, outcome=Outcome.DISCARDED, decided_seq=c.seq)
                del streaming[c.xid]
                continue
            starts = [s for s in first_change.get((c.xid, c.subxid), ()) if txn.first_seq <= s < c.seq]
            if starts:
                ledger.discards.append(Discard(c.xid, txn.first_seq, starts[0], c.seq))
        elif c.kind is MessageType.STREAM_COMMIT:
            assert c.xid is not None
            index = streaming.pop(c.xid, None)
            if index is None:
                raise AssemblyError(
                    f"Stream Commit at seq {c.seq} for transaction {c.xid} that was never streamed")
            decide(index, outcome=Outcome.COMMITTED, decided_seq=c.seq, commit_lsn=c.commit_lsn,
                   end_lsn=c.end_lsn, commit_ts=c.commit_ts)
        elif c.kind in (MessageType.STREAM_PREPARE, MessageType.PREPARE):
            assert c.xid is not None and c.gid is not None
            if c.kind is MessageType.STREAM_PREPARE:
                index = streaming.pop(c.xid, None)
                if index is None:
                    raise AssemblyError(
                        f"Stream Prepare at seq {c.seq} for transaction {c.xid} that was never streamed")
            else:
                if c.block_seq is None:
                    raise AssemblyError(f"Prepare at seq {c.seq} outside a Begin Prepare block")
                index = len(ledger.txns)
                ledger.txns.append(Txn(c.xid, c.block_seq, block_seq=c.block_seq))
            if c.gid in prepared:
                raise AssemblyError(f"Prepare at seq {c.seq}: gid {c.gid!r} is already prepared")
            decide(index, outcome=Outcome.PREPARED, gid=c.gid)
            prepared[c.gid] = index
        elif c.kind is MessageType.COMMIT_PREPARED:
            assert c.gid is not None
            index = prepared.pop(c.gid, None)
            if index is None:
                raise AssemblyError(
                    f"Commit Prepared at seq {c.seq} for gid {c.gid!r} that was never prepared "
                    f"in the capture")
            decide(index, outcome=Outcome.COMMITTED, decided_seq=c.seq, commit_lsn=c.commit_lsn,
                   end_lsn=c.end_lsn, commit_ts=c.commit_ts)
        elif c.kind is MessageType.ROLLBACK_PREPARED:
            assert c.gid is not None
            index = prepared.pop(c.gid, None)
            if index is not None:  # else: prepared before the slot's consistent point
                decide(index, outcome=Outcome.DISCARDED, decided_seq=c.seq)
    sessions_begun(float("inf"))
    return ledger


#: Optional controls: a transaction's start, sent again whole (see `resolve`).
BEGIN_TYPES = frozenset({MessageType.BEGIN, MessageType.BEGIN_PREPARE})

#: Message types the state machine reads.
CONTROL_TYPES = frozenset({
    MessageType.STREAM_START, MessageType.STREAM_ABORT, MessageType.STREAM_COMMIT,
    MessageType.STREAM_PREPARE, MessageType.PREPARE, MessageType.COMMIT_PREPARED,
    MessageType.ROLLBACK_PREPARED,
})
