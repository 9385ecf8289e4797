"""Walsender sessions in a capture: where one replication connection's messages end and the
next one's begin.

A capture may say which walsender session sent each message (the optional ``session``
column of the capture contract: any value that differs from one connection to the next).
PostgreSQL's apply worker keeps nothing of a transaction still in progress when its
connection ends: the spooled changes of a streamed transaction, a plain transaction cut
off, a stream block left open. The next session sends again, from its start, every
transaction that commits after the position the subscriber confirmed, and sends nothing
more of one that aborted meanwhile (not even its Stream Abort). Prepared transactions
stay: their Commit or Rollback Prepared comes in a later session.

A run needs the seqs where sessions begin (the first message of each session but the one
the previous run ended in) and the session its last message belongs to, carried to the
next run (`pgoutput_spark.spark.assemble.ScanState`). Both come from one aggregation per
session, only for captures that have the column.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..errors import CaptureError


@dataclass(frozen=True)
class Sessions:
    """The walsender sessions of a slice of a capture (see module doc)."""

    starts: np.ndarray  # sorted seqs of the messages that begin a session
    last: str | None  # the session of the slice's last message (None: an empty slice)

    @classmethod
    def none(cls, last: str | None = None) -> "Sessions":
        return cls(np.zeros(0, dtype=np.int64), last)


def find_sessions(canonical: DataFrame, previous: str | None) -> Sessions | None:
    """The sessions of a canonical slice (`pgoutput_spark.capture.CaptureColumns.select`),
    None when it has no ``session`` column. ``previous``: the session the run before ended
    in (None for a first run, or a target whose runs read no session column: the slice's
    first session then begins nothing).

    Raises `CaptureError` for a message without a session, and for a session whose
    messages do not follow one another (another session's messages among them): the seqs
    of one session must form one range.
    """
    if "session" not in canonical.columns:
        return None
    rows = (canonical.groupBy("session")
            .agg(F.min("seq").alias("lo"), F.max("seq").alias("hi"), F.count(F.lit(1)).alias("n"))
            .orderBy("lo").collect())  # one row per session: a few per reconnect of the lander
    if not rows:
        return Sessions.none(previous)
    missing = [r for r in rows if r["session"] is None]
    if missing:
        raise CaptureError(f"the capture's session column is NULL for {missing[0]['n']} messages (first: seq "
                           f"{missing[0]['lo']}): every message must name the walsender session that sent it")
    for before, after in zip(rows, rows[1:]):
        if after["lo"] <= before["hi"]:
            raise CaptureError(
                f"the capture's walsender session {before['session']!r} (seqs {before['lo']} to {before['hi']}) "
                f"and session {after['session']!r} (seqs {after['lo']} to {after['hi']}) overlap: the messages "
                f"of one session must follow one another in seq order, each session with a value of its own")
    starts = [r["lo"] for i, r in enumerate(rows) if i > 0 or (previous is not None and r["session"] != previous)]
    return Sessions(np.asarray(starts, dtype=np.int64), rows[-1]["session"])
