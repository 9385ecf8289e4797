"""Reading a logical replication slot over a plain SQL connection (psycopg).

The slot is read with ``pg_logical_slot_peek_binary_changes`` (which leaves it
where it is) and moved on with ``pg_replication_slot_advance`` once what was
read is safely stored: the order that makes landing exactly once. Every server
error a user can meet here becomes a `CaptureError` that says what to do; the
connection string is never part of a message (it may hold a password).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from ..errors import CaptureError
from ..lsn import Lsn
from .options import MIN_SERVER_FOR_PROTOCOL, PluginOptions, quote_ident
from .settings import RECORDED_SETTINGS, SESSION_SETTINGS

__all__ = ["SlotInfo", "SlotSource", "connect"]

_log = logging.getLogger(__name__)

_PEEK = (
    "SELECT (lsn - '0/0'::pg_lsn)::int8, xid::text::int8, data"
    " FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, %s, VARIADIC %s::text[])"
)


def connect(dsn: str | None) -> psycopg.Connection[Any]:
    """An autocommit connection from `dsn` (None: the PG* environment variables only)."""
    try:
        return psycopg.connect(dsn or "", autocommit=True)
    except psycopg.ProgrammingError as exc:  # a malformed DSN: its text may hold the password
        raise CaptureError("the connection string is not valid (not shown: it may hold a password):"
                           f" {type(exc).__name__}") from None
    except psycopg.OperationalError as exc:
        raise CaptureError(f"can't connect to PostgreSQL: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


@dataclass(frozen=True)
class SlotInfo:
    name: str
    plugin: str | None
    database: str | None
    two_phase: bool
    confirmed_flush: Lsn
    invalidated: str | None = None  # why the server invalidated it (None: it did not)
    failover: bool = False  # PostgreSQL 17+: synchronized to standbys that sync slots
    synced: bool = False  # PostgreSQL 17+: a standby's copy of a primary's failover slot


#: PostgreSQL 17's ``invalidation_reason`` values (18's ``idle_timeout`` too), said plainly.
_INVALIDATED = {
    "wal_removed": "the server removed WAL it still needed (max_slot_wal_keep_size)",
    "rows_removed": "the primary removed catalog rows it still needed (on a standby, hot_standby_feedback"
                    " keeps them, with a physical slot on the primary for the standby)",
    "wal_level_insufficient": "the primary's wal_level went below logical",
    "idle_timeout": "it went unread for longer than the server's idle_replication_slot_timeout (run the capture"
                    " more often than that, or raise the setting)",
}


class SlotSource:
    """One slot of the connected database, read with one set of pgoutput options.

    `conn` runs the checks, holds the capture's lock and advances the slot;
    each peek runs on a new connection from `dsn` (see `peek`).
    """

    def __init__(self, conn: psycopg.Connection[Any], slot: str, options: PluginOptions,
                 dsn: str | None) -> None:
        self.conn = conn
        self.slot = slot
        self.options = options
        self._dsn = dsn

    @property
    def where(self) -> str:
        info = self.conn.info
        return f"slot {self.slot!r} on {info.user}@{info.host}:{info.port}/{info.dbname}"

    def _scalar(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        row = self.conn.execute(sql, params).fetchone()
        return None if row is None else row[0]

    # -- checks ------------------------------------------------------------------------

    def check_server(self) -> None:
        """wal_level is logical; the server takes the protocol version; the publications exist."""
        wal_level = self._scalar("SHOW wal_level")
        if wal_level != "logical":
            raise CaptureError(f"wal_level is {wal_level!r} on the server of {self.where}: logical"
                               " decoding needs wal_level = logical (set it and restart the server)")
        version = int(self._scalar("SHOW server_version_num"))
        needed = MIN_SERVER_FOR_PROTOCOL[self.options.proto_version]
        if version < needed:
            raise CaptureError(f"pgoutput protocol version {self.options.proto_version} needs"
                               f" PostgreSQL {needed // 10000} or later; the server is {version}")
        found = {row[0] for row in self.conn.execute(
            "SELECT pubname FROM pg_publication WHERE pubname = ANY(%s)",
            (list(self.options.publications),))}
        missing = [p for p in self.options.publications if p not in found]
        if missing:
            raise CaptureError(f"publication {missing[0]!r} does not exist in database"
                               f" {self.conn.info.dbname!r}: create it (CREATE PUBLICATION) first")

    def slot_info(self) -> SlotInfo | None:
        # The whole row as JSON: the columns telling an invalidated slot differ by version
        # (wal_status from 13, conflicting on 16, invalidation_reason from 17).
        row = self.conn.execute(
            "SELECT plugin, database, two_phase, (confirmed_flush_lsn - '0/0'::pg_lsn)::int8, to_jsonb(s)"
            " FROM pg_replication_slots AS s WHERE slot_name = %s", (self.slot,)).fetchone()
        if row is None:
            return None
        plugin, database, two_phase, confirmed, whole = row
        invalidated = None
        if whole.get("invalidation_reason"):
            invalidated = _INVALIDATED.get(whole["invalidation_reason"], whole["invalidation_reason"])
        elif whole.get("conflicting"):
            invalidated = _INVALIDATED["rows_removed"] + ", or its wal_level went below logical"
        elif whole.get("wal_status") == "lost":
            invalidated = _INVALIDATED["wal_removed"]
        return SlotInfo(self.slot, plugin, database, bool(two_phase), Lsn(confirmed or 0), invalidated,
                        failover=bool(whole.get("failover")), synced=bool(whole.get("synced")))

    def ensure_slot(self, *, create: bool, failover: bool = False) -> SlotInfo:
        """The slot, checked (created first when missing and `create`); with `failover`, a failover
        slot (PostgreSQL 17+): created so, or made so when it is not. A slot without two_phase that
        the options want with it is made so on PostgreSQL 18 and later, refused before."""
        version = self.conn.info.server_version
        if failover and version < 170000:
            raise CaptureError(f"failover slots need PostgreSQL 17 or later; the server of {self.where} is"
                               f" PostgreSQL {version // 10000}")
        info = self.slot_info()
        standby = bool(self._scalar("SELECT pg_is_in_recovery()"))
        if info is None:
            if not create:
                raise CaptureError(f"replication slot {self.slot!r} does not exist on"
                                   f" {self.where.split(' on ')[1]}: create it, or pass --create-slot")
            self._create_slot(failover, standby)
            info = self.slot_info()
            assert info is not None
        if info.plugin != "pgoutput":
            raise CaptureError(f"{self.where} is a {'physical' if info.plugin is None else info.plugin!r}"
                               " slot: pgoutput-spark capture reads pgoutput slots only")
        if info.database != self.conn.info.dbname:
            raise CaptureError(f"{self.where} belongs to database {info.database!r}: connect to that"
                               " database")
        if self.options.two_phase and not info.two_phase and version < 180000:
            raise CaptureError(f"{self.where} was created without two_phase: two_phase decoding needs a"
                               " slot created with two_phase = true (PostgreSQL 18 and later can turn it on,"
                               f" which capture does there; the server is PostgreSQL {version // 10000})")
        if info.invalidated is not None:
            raise CaptureError(f"{self.where} is invalidated: {info.invalidated}. The changes after its"
                               f" position {info.confirmed_flush} can no longer be decoded; start the pipeline"
                               " again from a new slot: drop this one, then `pgoutput-spark snapshot` into a new"
                               " target and `capture` into a new landing")
        if info.synced and standby:
            raise CaptureError(f"{self.where} is a copy of the primary's failover slot, which this standby keeps"
                               " in step with it (sync_replication_slots): read the slot on the primary; this"
                               " copy can be read once the standby is promoted")
        if failover and not info.failover:
            self._alter("FAILOVER", "make a failover slot of")
            info = replace(info, failover=True)
            _log.info("%s was made a failover slot", self.where)
        if self.options.two_phase and not info.two_phase:
            self._alter("TWO_PHASE", "turn two_phase on for")
            info = replace(info, two_phase=True)
            _log.info("%s decodes prepared transactions at their PREPARE from now on (two_phase turned on);"
                      " those prepared before arrive whole at their COMMIT PREPARED", self.where)
        if info.failover and not standby:
            self._say_standby_slots()
        return info

    def _say_standby_slots(self) -> None:
        """A failover slot's changes wait for synchronized_standby_slots' standbys: say when there are
        none (a failover can lose what was landed), or when one is not streaming (the capture waits)."""
        names = [name.strip() for name in str(self._scalar("SHOW synchronized_standby_slots")).split(",")
                 if name.strip()]
        if not names:
            _log.warning("%s is a failover slot, but synchronized_standby_slots is empty on this primary: the"
                         " capture can land changes that no standby has received yet, which a standby promoted"
                         " after a failover never had; name the standbys' physical slots in"
                         " synchronized_standby_slots (PostgreSQL then holds changes back until they have them)",
                         self.where)
            return
        streaming = {name for (name,) in self.conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE slot_type = 'physical' AND active"
            " AND slot_name = ANY(%s)", (names,))}
        idle = [name for name in names if name not in streaming]
        if idle:
            _log.warning("%s is a failover slot: PostgreSQL hands out its changes once the standbys of"
                         " synchronized_standby_slots have received them, and no standby streams from %s: the"
                         " capture waits until one does, or until synchronized_standby_slots leaves it out",
                         self.where, ", ".join(idle))

    def say_if_standby(self, standby: bool | None = None) -> None:
        """A slot made on a standby waits for the primary's next running-transactions record,
        which an idle primary never writes: say so before making one there (`standby`: whether
        the server is one, when known; else asked)."""
        if standby if standby is not None else self._scalar("SELECT pg_is_in_recovery()"):
            _log.warning("creating slot %s on a standby: PostgreSQL waits for the primary's next running-"
                         "transactions record (every 15 s at most while the primary is busy, none while it is "
                         "idle: SELECT pg_log_standby_snapshot() on the primary writes one)", self.slot)

    def _create_slot(self, failover: bool, standby: bool) -> None:
        self.say_if_standby(standby)
        arguments = (self.slot, self.options.two_phase) + ((True,) if failover else ())
        try:
            self.conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, %s"
                              + (", %s)" if failover else ")"), arguments)
        except psycopg.Error as exc:
            raise self._error("create", exc) from None

    def _alter(self, option: str, action: str) -> None:
        """Turn a boolean option of the slot on (ALTER_REPLICATION_SLOT: FAILOVER from PostgreSQL
        17, TWO_PHASE from 18)."""
        self._replication_command(f"ALTER_REPLICATION_SLOT {quote_ident(self.slot)} ({option})", action)

    def _replication_command(self, command: str, action: str) -> tuple[Any, ...] | None:
        """Run one replication command on a ``replication=database`` connection; its row, if any."""
        try:
            with psycopg.connect(self._dsn or "", autocommit=True, replication="database") as conn:
                cursor = psycopg.ClientCursor(conn)  # the walsender takes the simple query protocol only
                cursor.execute(command)
                return cursor.fetchone() if cursor.description else None
        except psycopg.Error as exc:
            raise self._error(action, exc) from None

    # -- the session ----------------------------------------------------------------------

    def lock(self) -> None:
        """Hold a session lock for this slot: a second capture of the same slot fails at once."""
        got = self._scalar("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))",
                           (f"pgoutput_spark capture {self.slot}",))
        if not got:
            raise CaptureError(f"another pgoutput-spark capture is reading {self.where}: one capture"
                               " per slot at a time")

    def apply_settings(self, conn: psycopg.Connection[Any] | None = None) -> dict[str, str]:
        """Set `SESSION_SETTINGS` on `conn`'s session; return what the server reports for each."""
        conn = conn or self.conn
        for name, value in SESSION_SETTINGS.items():
            conn.execute(f"SET {name} = '{value}'")
        return {name: str(conn.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
                for name in RECORDED_SETTINGS}

    def system_identifier(self) -> str | None:
        """The cluster's system identifier (None when this role may not read it)."""
        try:
            return str(self._scalar("SELECT system_identifier FROM pg_control_system()"))
        except pg_errors.InsufficientPrivilege:
            return None

    def server_lsn(self) -> Lsn:
        return Lsn(self._scalar(
            "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()"
            " ELSE pg_current_wal_lsn() END - '0/0'::pg_lsn)::int8"))

    def timeline(self) -> int | None:
        """The timeline a primary writes WAL on (None on a standby, whose slot only decodes WAL it
        has: a landing read there holds nothing its promoted self lacks)."""
        timeline: int | None = self._scalar("SELECT CASE WHEN NOT pg_is_in_recovery() THEN ('x' || substr("
                                            "pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int END")
        return timeline

    def timeline_history(self, timeline: int) -> dict[int, Lsn]:
        """Where this server's history left each timeline before `timeline` (its current one; a
        promotion starts a new one): ``TIMELINE_HISTORY``, a replication command."""
        _, content = self._replication_command(  # type: ignore[misc]
            f"TIMELINE_HISTORY {timeline}", f"read timeline {timeline}'s history (to check the landing against it) on")
        text = bytes(content).decode() if isinstance(content, (bytes, memoryview)) else str(content)
        return {int(fields[0]): Lsn(fields[1]) for fields in map(str.split, text.splitlines())
                if len(fields) >= 2 and fields[0].isdigit()}

    # -- reading and advancing --------------------------------------------------------------

    def peek(self, *, limit: int, upto_lsn: Lsn | None, batch_rows: int, streaming: bool = True) -> Iterator[
            list[tuple[int, int, bytes]]]:
        """The slot's pending messages as lists of (lsn, xid, data), `batch_rows` at a time.

        Decoding stops at the first transaction (or streamed block) after
        `limit` messages, or at `upto_lsn`. The slot does not move. With
        ``streaming=False`` the landing's streaming option is left off for
        this peek (every transaction comes whole at its commit).

        Every peek runs in a new server session, so that what it decodes
        depends only on the slot's position: a session that decoded before
        keeps catalog caches, and with warm caches PostgreSQL sends more of a
        transaction that it later finds rolled back (it stops decoding such a
        transaction at its first catalog lookup). A re-run after a crash then
        lands the same bytes as an uninterrupted run.
        """
        upto = None if upto_lsn is None else str(upto_lsn)
        try:
            with connect(self._dsn) as reader:
                self.apply_settings(reader)
                with reader.transaction(), reader.cursor("pgoutput_spark_peek", binary=True) as cursor:
                    cursor.itersize = batch_rows
                    options = self.options if streaming else replace(self.options, streaming=None)
                    cursor.execute(_PEEK, (self.slot, upto, limit, options.as_list()))
                    while rows := cursor.fetchmany(batch_rows):
                        yield [(lsn, xid, bytes(data)) for lsn, xid, data in rows]
        except psycopg.Error as exc:
            raise self._error("read", exc) from None

    def aborted(self, xids: Iterable[int]) -> set[int]:
        """Those of `xids` (32-bit, recent) that the server reports aborted (`pg_xact_status`)."""
        wanted = sorted(set(xids))
        if not wanted:
            return set()
        try:  # a 32-bit xid above the next one's low half is from the epoch before
            rows = self.conn.execute(
                "SELECT x, pg_xact_status((((CASE WHEN x > (n & 4294967295) THEN (n >> 32) - 1 ELSE n >> 32 END)"
                " << 32) | x)::text::xid8) FROM unnest(%s::int8[]) AS x,"
                " (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::int8 AS n) AS now", (wanted,)).fetchall()
        except psycopg.Error as exc:
            raise self._error("check transaction status on", exc) from None
        return {int(x) for x, status in rows if status == "aborted"}

    def restart_lsn(self) -> Lsn | None:
        """Where the slot's next decoding session starts reading WAL."""
        value = self._scalar("SELECT (restart_lsn - '0/0'::pg_lsn)::int8 FROM pg_replication_slots"
                             " WHERE slot_name = %s", (self.slot,))
        return None if value is None else Lsn(value)

    def can_log_running_xacts(self) -> bool:
        """Whether this session may write a running-transactions record: PostgreSQL 16 or later, a
        primary, and EXECUTE on ``pg_log_standby_snapshot()`` (superusers, or granted)."""
        if self.conn.info.server_version < 160000:
            return False
        return bool(self._scalar("SELECT NOT pg_is_in_recovery()"
                                 " AND has_function_privilege('pg_log_standby_snapshot()', 'EXECUTE')"))

    def log_running_xacts(self) -> None:
        """Write a running-transactions record at the end of WAL (``pg_log_standby_snapshot()``).

        PostgreSQL moves a slot's ``restart_lsn``, where every decoding session starts reading,
        only at such records, which the server writes by itself after 15 seconds of activity;
        one written after each chunk lets the slot's restart point follow the capture.
        """
        try:
            self.conn.execute("SELECT pg_log_standby_snapshot()")
        except psycopg.Error as exc:
            raise CaptureError(f"can't write a running-transactions record on {self.where}:"
                               f" {_first_line(exc)}") from None

    def advance(self, lsn: Lsn) -> None:
        try:
            self.conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (self.slot, str(lsn)))
        except psycopg.Error as exc:
            raise self._error("advance", exc) from None

    def _error(self, action: str, exc: psycopg.Error) -> CaptureError:
        reason = _first_line(exc)
        if isinstance(exc, pg_errors.InsufficientPrivilege):
            hint = "the role needs the REPLICATION attribute (or superuser)"
        elif isinstance(exc, pg_errors.ObjectInUse):
            hint = "another process (a subscriber or a walsender) is using the slot"
        elif exc.sqlstate is None or exc.sqlstate.startswith(("08", "57P")):  # connection, shutdown
            hint = "the connection to the server was lost; nothing of this chunk was landed, run again"
        else:
            hint = ""
        return CaptureError(f"can't {action} {self.where}: {reason}" + (f" ({hint})" if hint else ""))
