"""What the source server says of transactions a capture left open: ``pg_xact_status``.

A walsender session that ends inside a streamed transaction which then aborts never sends it
again, nor its Stream Abort; a capture without a session column keeps it open. The server
that ran it can tell: `xact_statuses` asks it for the transactions' outcomes, so that a run
can forget those it reports aborted (``forget_aborted`` of `run_apply` and `run_changes`).
"""

from __future__ import annotations

from collections.abc import Iterable

import psycopg
from psycopg import errors as pg_errors

from ..errors import CaptureError
from .source import connect

__all__ = ["xact_statuses"]

_EPOCH = 1 << 32


def xact_statuses(dsn: str | None, xids: Iterable[int]) -> dict[int, str | None]:
    """``pg_xact_status`` of each 32-bit ``xid`` (as pgoutput sends them) on the server ``dsn``
    names (None: the PG* environment variables): ``"committed"``, ``"aborted"`` or ``"in
    progress"``, or None where the server no longer keeps its outcome (older than its oldest
    transaction status). Each xid is taken as the transaction with those 32 bits nearest the
    server's current snapshot (within 2^31 of it, as PostgreSQL widens xids itself): a
    capture's open transactions are that recent unless the capture is more than 2^31
    transactions old, and then the server no longer knows them. One query; no transaction id
    is consumed. `CaptureError` when the server cannot be reached, refuses the query, or has not
    assigned an xid yet (it is not the capture's source server, or a standby behind it)."""
    xids = sorted({int(x) for x in xids})
    if not xids:
        return {}
    if not all(0 < x < _EPOCH for x in xids):
        raise ValueError(f"not 32-bit transaction ids: {[x for x in xids if not 0 < x < _EPOCH]}")
    with connect(dsn) as conn:
        info = conn.info
        where = f"{info.user}@{info.host}:{info.port}/{info.dbname}"
        try:
            row = conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::int8").fetchone()
            assert row is not None
            full = {x: _full_xid(x, int(row[0])) for x in xids}
            rows = conn.execute("SELECT f, pg_xact_status(f::text::xid8) FROM unnest(%s::int8[]) AS f",
                                ([f for f in full.values() if f is not None],)).fetchall()
        except psycopg.Error as exc:
            reason = " ".join(str(exc).split())
            if isinstance(exc, pg_errors.InvalidParameterValue) and "in the future" in reason:
                raise CaptureError(f"{where} has not assigned some of the transaction ids "
                                   f"{', '.join(map(str, xids))} yet ({reason}): it is not the server the "
                                   f"capture came from, or a standby behind it") from None
            raise CaptureError(f"can't ask {where} for the status of transactions "
                               f"{', '.join(map(str, xids))}: {reason}") from None
    status = {int(f): s for f, s in rows}
    return {x: None if f is None else status.get(f) for x, f in full.items()}


def _full_xid(xid: int, near: int) -> int | None:
    """The 64-bit transaction id whose low 32 bits are ``xid`` nearest the 64-bit id ``near``
    (within 2^31 of it; None when that falls before the first transaction)."""
    full = near + ((xid - near + (_EPOCH >> 1)) % _EPOCH) - (_EPOCH >> 1)
    return full if full >= 0 else None
