"""One workload that makes PostgreSQL send every pgoutput message type, and the facts about it.

`run_workload` runs it once in a fresh database after the caller's slots exist;
it returns `WorkloadFacts`: what the server itself reported while the workload
ran (xids from ``pg_current_xact_id()``, the subtransaction xid, the LSNs that
``pg_logical_emit_message`` returned, prepare times from ``pg_prepared_xacts``,
WAL and clock windows around aborts). Tests compare decoded messages with these
facts, never with the decoder's own output.

Sizes are chosen against ``logical_decoding_work_mem = 64kB``: 250 rows with a
500-byte pad (about 150 kB of decoded changes) spill a transaction into
several stream blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from pgoutput_spark.testing.pgcluster import PgCluster

PUBLICATION = "pub"
ORIGIN_NAME = "test_origin"
ORIGIN_LSN = 0xABCDEF  # pg_replication_origin_xact_setup('0/ABCDEF', ...)
TX_MESSAGE = ("tx-prefix", b"transactional \x00 content")
NTX_MESSAGE = ("ntx-prefix", b"\x00\xff\x01")
STREAMED_MESSAGE = ("in-stream", b"inside a streamed transaction")
GIDS = {"prepared_commit": "gid-commit", "prepared_rollback": "gid 'rollback'",
        "prepared_big": "gid-big"}

BIG_ROWS = 250
PAD = 500

SETUP_SQL = '''
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE TABLE t_pk (id int PRIMARY KEY, gone int, note varchar(20), m mood, d posint,
                   amount numeric(10, 2));
ALTER TABLE t_pk DROP COLUMN gone;
CREATE TABLE t_full (a int, b text);
ALTER TABLE t_full REPLICA IDENTITY FULL;
CREATE TABLE t_idx (a int NOT NULL, b int NOT NULL, c text);
CREATE UNIQUE INDEX t_idx_key ON t_idx (b, a);
ALTER TABLE t_idx REPLICA IDENTITY USING INDEX t_idx_key;
CREATE TABLE "Trunc A" (id serial PRIMARY KEY);
CREATE TABLE trunc_b (id serial PRIMARY KEY);
CREATE TABLE trunc_child (id int PRIMARY KEY, a_id int REFERENCES "Trunc A");
CREATE TABLE trunc_single (id int PRIMARY KEY);
CREATE TABLE big (id int PRIMARY KEY, pad text);
CREATE TABLE nocols ();
ALTER TABLE nocols REPLICA IDENTITY FULL;
CREATE TABLE t_types (
    id int PRIMARY KEY,
    i2 int2, i4 int4, i8 int8, num numeric, f4 float4, f8 float8,
    txt text, "Odd ""Name""" text, vc varchar(12), ch char(3),
    bin bytea, flag bool,
    day date, at_local timestamp, at_tz timestamptz, t_time time, span interval,
    uid uuid, doc jsonb, js json, ints int[], texts text[], addr inet,
    bits bit(4), vbits varbit, mood_v mood, dom posint,
    toasted text
);
ALTER TABLE t_types ALTER COLUMN toasted SET STORAGE EXTERNAL;
CREATE PUBLICATION pub FOR ALL TABLES;
'''

# Every literal here is parsed by PostgreSQL; the tests never compare against
# these Python strings, only against what the server reports.
TYPES_ROWS_SQL = r"""
INSERT INTO t_types VALUES
 (1, -32768, 2147483647, -9223372036854775808, 12345678901234567890.000000001, 1.5, 'NaN',
  'it''s "quoted"' || E'\nnew line\ttab \\ back', 'odd', 'varchar', 'ab',
  '\x00ff5c27', true, '2024-02-29', '2001-02-03 04:05:06.789', '1999-12-31 23:59:59.999999+05:30',
  '13:14:15', '1 year 2 mons 3 days 04:05:06.5', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
  '{"k": [1, 2.5, null, "s''q"], "é": true}', '{"raw":  "json"}', '{1,NULL,-3}',
  '{"a b","c''d","e\"f",NULL}', '192.168.0.1/24', B'1010', B'110', 'happy', 7,
  repeat('toast-', 1000)),
 (2, 0, 0, 0, 'NaN', '-Infinity', 'Infinity', 'unicode: ünï cødé ✓ 𝄞', NULL, '', '   ',
  '', false, 'infinity', '-infinity', 'epoch', '00:00', '-1 day', NULL, 'null', 'null', '{}',
  '{}', '::1', B'0000', B'', 'sad', 1, NULL),
 (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)
"""


@dataclass
class WorkloadFacts:
    """What PostgreSQL reported while the workload ran."""

    db: str
    #: Top-level xid of each named transaction (see `run_workload`).
    xids: dict[str, int] = field(default_factory=dict)
    #: xid of the subtransaction that ROLLBACK TO SAVEPOINT undid (the xmin of its first row).
    subxid: int = 0
    #: LSN returned by pg_logical_emit_message, by prefix.
    message_lsns: dict[str, int] = field(default_factory=dict)
    #: pg_prepared_xacts.prepared, by gid.
    prepared_at: dict[str, datetime] = field(default_factory=dict)
    #: pg_xact_commit_timestamp of each committed named transaction.
    commit_ts: dict[str, datetime] = field(default_factory=dict)
    #: (insert LSN before, insert LSN after) around each abort, by name.
    wal_windows: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: (clock before, clock after) around each abort, by name.
    clock_windows: dict[str, tuple[datetime, datetime]] = field(default_factory=dict)
    #: xid of the subtransaction opened by the first write after ROLLBACK TO SAVEPOINT.
    next_subxid: int = 0
    #: Rows inserted inside the rolled-back savepoint (their change messages carry subxid).
    savepoint_rows: int = 0


def _one(conn: psycopg.Connection[Any], sql: str, params: Any = None) -> Any:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def _xid(conn: psycopg.Connection[Any]) -> int:
    return int(_one(conn, "SELECT pg_current_xact_id()::text::int8"))


def _wal(conn: psycopg.Connection[Any]) -> int:
    return int(_one(conn, "SELECT (pg_current_wal_insert_lsn() - '0/0')::int8"))


def _clock(conn: psycopg.Connection[Any]) -> datetime:
    value: datetime = _one(conn, "SELECT clock_timestamp()")
    return value


def setup_database(cluster: PgCluster, db: str) -> None:
    cluster.execute(SETUP_SQL, dbname=db)


def run_workload(cluster: PgCluster, db: str) -> WorkloadFacts:
    """Run every transaction once; the slots must already exist.

    Named transactions: insert, update, delete, truncate, tx_message, origin,
    streamed (savepoint rolled back), aborted (streamed, then ROLLBACK; PostgreSQL 18 sends
    nothing of it, see `Capture.streams_aborted`),
    prepared_commit, prepared_rollback, prepared_big (streamed, committed).
    """
    facts = WorkloadFacts(db)
    big_row = f"repeat('p', {PAD}) || g"
    with cluster.connect(db, autocommit=False) as conn:
        facts.xids["insert"] = _xid(conn)
        conn.execute("INSERT INTO t_pk VALUES (1, 'one', 'happy', 5, 1.5), (2, 'two', NULL, NULL, NULL),"
                     " (3, 'three', 'sad', 3, -0.25)")
        conn.execute("INSERT INTO t_full VALUES (1, 'a'), (2, 'b')")
        conn.execute("INSERT INTO t_idx VALUES (1, 10, 'x'), (2, 20, 'y')")
        conn.execute('INSERT INTO "Trunc A" DEFAULT VALUES; INSERT INTO trunc_b DEFAULT VALUES;'
                     " INSERT INTO trunc_child VALUES (1, 1); INSERT INTO trunc_single VALUES (1)")
        conn.execute(TYPES_ROWS_SQL)
        conn.execute("INSERT INTO nocols DEFAULT VALUES")  # zero-column Relation and tuples
        conn.commit()

        facts.xids["update"] = _xid(conn)
        conn.execute("UPDATE t_pk SET id = 10 WHERE id = 1")  # key change: 'K' old key
        conn.execute("UPDATE t_pk SET note = 'deux' WHERE id = 2")  # no old tuple
        conn.execute("UPDATE t_full SET b = 'bb' WHERE a = 2")  # 'O' old row
        conn.execute("UPDATE t_idx SET b = 11 WHERE a = 1")  # index key change: 'K'
        conn.execute("UPDATE t_types SET i4 = 42 WHERE id = 1")  # toasted value unchanged: 'u'
        conn.execute("UPDATE t_types SET id = 20, txt = 'moved' WHERE id = 2")
        conn.commit()

        facts.xids["delete"] = _xid(conn)
        conn.execute("DELETE FROM t_pk WHERE id = 3")
        conn.execute("DELETE FROM t_full WHERE a = 1")
        conn.execute("DELETE FROM t_idx WHERE a = 2")
        conn.execute("DELETE FROM t_types WHERE id = 3")
        conn.execute("DELETE FROM nocols")
        conn.commit()

        facts.xids["truncate"] = _xid(conn)
        conn.execute('TRUNCATE "Trunc A", trunc_b RESTART IDENTITY CASCADE')
        conn.commit()

        facts.xids["tx_message"] = _xid(conn)
        facts.message_lsns[TX_MESSAGE[0]] = int(_one(
            conn, "SELECT (pg_logical_emit_message(true, %s, %s::bytea) - '0/0')::int8", TX_MESSAGE))
        conn.commit()

    with cluster.connect(db, autocommit=True) as conn:
        facts.message_lsns[NTX_MESSAGE[0]] = int(_one(
            conn, "SELECT (pg_logical_emit_message(false, %s, %s::bytea) - '0/0')::int8", NTX_MESSAGE))
        conn.execute("SELECT pg_replication_origin_create(%s)", (ORIGIN_NAME,))
        conn.execute("SELECT pg_replication_origin_session_setup(%s)", (ORIGIN_NAME,))
        conn.execute("BEGIN")
        facts.xids["origin"] = _xid(conn)
        conn.execute("SELECT pg_replication_origin_xact_setup('0/ABCDEF', now())")
        conn.execute("INSERT INTO t_pk VALUES (50, 'from origin', 'ok', 50, 0)")
        conn.execute("COMMIT")
        conn.execute("SELECT pg_replication_origin_session_reset()")

    with cluster.connect(db, autocommit=False) as conn:
        facts.xids["streamed"] = _xid(conn)
        conn.execute(f"INSERT INTO big SELECT g, {big_row} FROM generate_series(1, {BIG_ROWS}) g")
        conn.execute("INSERT INTO t_pk VALUES (60, 'in stream', 'happy', 60, 6)")  # R and Y in stream
        conn.execute("UPDATE t_pk SET note = 'streamed' WHERE id = 60")
        conn.execute("DELETE FROM t_pk WHERE id = 60")
        conn.execute("TRUNCATE trunc_single")
        facts.message_lsns[STREAMED_MESSAGE[0]] = int(_one(
            conn, "SELECT (pg_logical_emit_message(true, %s, %s::bytea) - '0/0')::int8", STREAMED_MESSAGE))
        conn.execute("SAVEPOINT sp")
        conn.execute("INSERT INTO big VALUES (-1, 'first in savepoint')")
        # pg_current_xact_id_if_assigned() reports the top-level xid even inside
        # a savepoint; the row's xmin is the subtransaction's own xid.
        facts.subxid = int(_one(conn, "SELECT xmin::text::int8 FROM big WHERE id = -1"))
        conn.execute(f"INSERT INTO big SELECT g, {big_row}"
                     f" FROM generate_series(1001, {1000 + BIG_ROWS}) g")
        facts.savepoint_rows = BIG_ROWS + 1
        start, before = _clock(conn), _wal(conn)
        conn.execute("ROLLBACK TO SAVEPOINT sp")
        facts.wal_windows["streamed"] = (before, _wal(conn))
        facts.clock_windows["streamed"] = (start, _clock(conn))
        conn.execute("INSERT INTO big VALUES (-2, 'after rollback to savepoint')")
        # ROLLBACK TO keeps the savepoint: the next write opens a new subtransaction.
        facts.next_subxid = int(_one(conn, "SELECT xmin::text::int8 FROM big WHERE id = -2"))
        conn.commit()

        facts.xids["aborted"] = _xid(conn)
        conn.execute(f"INSERT INTO big SELECT g, {big_row} FROM generate_series(2001, {2000 + BIG_ROWS}) g")
        start, before = _clock(conn), _wal(conn)
        conn.rollback()
        facts.wal_windows["aborted"] = (before, _wal(conn))
        facts.clock_windows["aborted"] = (start, _clock(conn))
        conn.rollback()  # the read-only transaction of the two queries above

    with cluster.connect(db, autocommit=True) as conn:
        for name, first, rows in (("prepared_commit", 3001, 1), ("prepared_rollback", 4001, 1),
                                  ("prepared_big", 5001, BIG_ROWS)):
            gid = GIDS[name]
            conn.execute("BEGIN")
            facts.xids[name] = _xid(conn)
            conn.execute(f"INSERT INTO big SELECT g, {big_row}"
                         f" FROM generate_series({first}, {first + rows - 1}) g")
            conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(gid))
            facts.prepared_at[gid] = _one(
                conn, "SELECT prepared FROM pg_prepared_xacts WHERE gid = %s", (gid,))
            if name == "prepared_rollback":
                start = _clock(conn)
                conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(gid))
                facts.clock_windows[name] = (start, _clock(conn))
            else:
                conn.execute(sql.SQL("COMMIT PREPARED {}").format(gid))

        for name, xid in facts.xids.items():
            ts = _one(conn, "SELECT pg_xact_commit_timestamp(%s::text::xid)", (str(xid),))
            if ts is not None:
                facts.commit_ts[name] = ts
    return facts
