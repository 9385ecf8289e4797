"""Which messages sit inside a Stream Start .. Stream Stop block.

Inside such a block, data messages carry a leading xid, so the decoder must know
the stream state of every message even when a block spans Spark partitions or
capture files. The state at any position follows from the positions (seq) of
the Stream Start and Stream Stop messages alone: a cheap first pass collects
those events (two per streamed chunk, far fewer than messages), `StreamEvents`
checks that they alternate, and each task looks its rows up with one
``searchsorted``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import StreamStateError
from .protocol import MessageType


@dataclass(frozen=True)
class StreamEvents:
    """Sorted seqs of Stream Start / Stream Stop messages and which is which."""

    seq: np.ndarray
    is_start: np.ndarray

    @classmethod
    def from_messages(cls, seq: np.ndarray, type_byte: np.ndarray,
                      lsn: np.ndarray | None = None, *,
                      initially_in_stream: bool = False,
                      session_starts: np.ndarray | None = None) -> "StreamEvents":
        """Build from the (seq, type byte) of any superset of the events, any order.

        ``initially_in_stream``: the messages continue a stream block opened
        before the first of them (a run that resumes where the last one
        stopped inside a block). ``session_starts``: the seqs of messages that
        begin a walsender session (see `pgoutput_spark.spark.sessions`); a
        block the session before left open ends there, as a Stream Stop would
        end it. Raises `StreamStateError` when starts and stops do not
        alternate within a session (a Stream Start inside a block, or a Stream
        Stop outside one).
        """
        seq = np.asarray(seq, dtype=np.int64)
        type_byte = np.asarray(type_byte)
        keep = (type_byte == MessageType.STREAM_START) | (type_byte == MessageType.STREAM_STOP)
        order = np.argsort(seq[keep], kind="stable")
        event_seq = seq[keep][order]
        is_start = (type_byte[keep] == MessageType.STREAM_START)[order]
        lsns = None if lsn is None else np.asarray(lsn, dtype=np.int64)[keep][order]
        if initially_in_stream:  # a virtual Stream Start before everything
            event_seq = np.concatenate([[np.iinfo(np.int64).min], event_seq])
            is_start = np.concatenate([[True], is_start])
            lsns = None if lsns is None else np.concatenate([[0], lsns])
        starts = np.unique(np.asarray(() if session_starts is None else session_starts, dtype=np.int64))
        bounds = [0, *np.searchsorted(event_seq, starts, side="left").tolist(), event_seq.size]
        out_seq, out_start, left_open = [], [], False
        for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
            if left_open:  # the session before ended inside a block: it stops before this session
                out_seq.append(np.array([starts[i - 1] - 1], dtype=np.int64))
                out_start.append(np.array([False]))
            _check_alternation(event_seq[lo:hi], is_start[lo:hi], None if lsns is None else lsns[lo:hi])
            out_seq.append(event_seq[lo:hi])
            out_start.append(is_start[lo:hi])
            left_open = bool(hi > lo and is_start[hi - 1])
        return cls(np.concatenate(out_seq), np.concatenate(out_start))

    @classmethod
    def empty(cls) -> "StreamEvents":
        return cls(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool))

    def in_stream(self, seq: np.ndarray) -> np.ndarray:
        """True for messages after a Stream Start and up to its Stream Stop.

        (`decode_batch` reports the Stream Stop itself as outside the block.)
        """
        seq = np.asarray(seq, dtype=np.int64)
        if self.seq.size == 0:
            return np.zeros(seq.size, dtype=bool)
        before = np.searchsorted(self.seq, seq, side="left") - 1
        starts: np.ndarray = (before >= 0) & self.is_start[np.maximum(before, 0)]
        return starts


def _check_alternation(seq: np.ndarray, is_start: np.ndarray, lsns: np.ndarray | None) -> None:
    """Starts must sit at even positions of one session's events, stops at odd ones."""
    wrong = np.flatnonzero(is_start != (np.arange(seq.size) % 2 == 0))
    if wrong.size:
        i = int(wrong[0])
        kind = MessageType.STREAM_START if is_start[i] else MessageType.STREAM_STOP
        reason = ("Stream Start inside a stream block that was never stopped"
                  if is_start[i] else "Stream Stop outside any stream block")
        raise StreamStateError(
            reason, field=kind.doc_name, offset=0, message_type=kind.doc_name,
            seq=int(seq[i]), lsn=None if lsns is None else int(lsns[i]))
