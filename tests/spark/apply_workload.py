"""A workload that tries hard to break the apply job, with PostgreSQL's own tables as the oracle.

`setup` creates the tables and publications (before the caller creates its
slots); `drive` runs the workload step by step on one connection and, after
every commit, snapshots every published table as PostgreSQL shows it: the
published columns only, the publication's row filter applied, each value in
the Python form the mirror's Spark type reads back as (see `column_sql`).
Snapshots are keyed by the xid of the transaction that just committed (for a
prepared transaction, the xid it had when prepared), so a test can look up
the one that matches the last commit an apply run took.

pgbench traffic cannot be snapshotted transaction by transaction: each
pgbench call is a `Segment`, the WAL range it wrote and one snapshot at its
end, valid only for the last commit inside the range.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from pgoutput_spark.testing.pgcluster import PgCluster

SCHEMA = "Mixed Case/Schema"
PUBLICATIONS = ["pub_main", "pub_schema", "pub_ins", "pub_filter", "pub_cols", "pub_part"]
PGBENCH_TABLES = ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history")


def ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def qualified(schema: str, name: str) -> str:
    return f"{ident(schema)}.{ident(name)}"


def big_text(seed: str, n: int = 800) -> str:
    """SQL for n md5 digests in a row (32 n hex digits): random enough to stay large compressed."""
    return f"(SELECT string_agg(md5('{seed}' || g), '') FROM generate_series(1, {n}) g)"


def big_jsonb(seed: str, n: int = 700) -> str:
    return f"(SELECT jsonb_agg(md5('{seed}' || g)) FROM generate_series(1, {n}) g)"


def big_bytea(seed: str, n: int = 400) -> str:
    return f"decode({big_text(seed, n)}, 'hex')"


# -- values in the form the mirror reads back ------------------------------------------------------

_NATIVE = {"int2", "int4", "int8", "bool", "float8", "text", "varchar", "bpchar", "name", "bytea", "date",
           "timestamp", "timestamptz", "_int2", "_int4", "_int8", "_bool", "_float8", "_text", "_varchar",
           "_date", "_timestamp", "_timestamptz"}


def _float32(value: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


def _same(value: Any) -> Any:
    return value


def _interval(value: str | None) -> dict[str, int] | None:
    if value is None:
        return None
    months, days, us = (int(part) for part in value.split(","))
    return {"months": months, "days": days, "microseconds": us}


def _interval_sql(q: str) -> str:
    """PostgreSQL's three interval fields, computed by PostgreSQL, as 'months,days,microseconds'."""
    months = f"(extract(year from {q}) * 12 + extract(month from {q}))::int"
    days = f"extract(day from {q})::int"
    rest = f"({q} - make_interval(months => {months}, days => {days}))"
    return (f"CASE WHEN {q} IS NULL THEN NULL ELSE {months} || ',' || {days} || ',' || "
            f"(extract(epoch from {rest}) * 1000000)::int8 END")


def _output(q: str) -> str:
    """The column as its type's output function prints it: what pgoutput sends in text format.
    (Not ``::text``: casts may differ, e.g. ``text(inet)`` always adds the netmask.)"""
    return f"CASE WHEN {q} IS NULL THEN NULL ELSE format('%s', {q}) END"


def column_sql(name: str, typname: str, typmod: int) -> tuple[str, Callable[[Any], Any]]:
    """A SELECT expression for one column and the function that turns its psycopg value into
    what Spark returns for the mirror column (docs/types.md).

    Where the Spark form is PostgreSQL's text (json, jsonb, uuid, inet, enums, bit strings,
    numerics that do not fit decimal(38)), the expression is PostgreSQL's own output (`_output`);
    intervals come out as PostgreSQL's three fields; float4 goes through a 32-bit float, as
    Spark's FloatType holds it; time is printed with six fraction digits.
    """
    q = ident(name)
    if typname in _NATIVE:
        return q, _same
    if typname == "float4":
        return q, lambda v: None if v is None else _float32(v)
    if typname == "_float4":
        return q, lambda v: None if v is None else [None if x is None else _float32(x) for x in v]
    if typname == "numeric":
        precision, scale = ((typmod - 4) >> 16) & 0xFFFF, (typmod - 4) & 0x7FF
        fits = typmod >= 0 and 1 <= precision <= 38 and scale <= precision
        return (q, _same) if fits else (_output(q), _same)
    if typname == "time":
        return q, lambda v: None if v is None else v.isoformat(timespec="microseconds")
    if typname == "interval":
        return _interval_sql(q), _interval
    if typname.startswith("_"):
        raise ValueError(f"column {name}: no oracle form for array type {typname}; add one")
    return _output(q), _same


# -- snapshots --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableSnap:
    """One published table as PostgreSQL shows it: columns, rows (in mirror form) and row xmins."""

    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    xmins: tuple[int, ...]
    key: tuple[str, ...]  # primary key columns


@dataclass(frozen=True)
class Dropped:
    """A column dropped at ``xid``: rows last changed before keep ``before[key]`` in the mirror."""

    column: str
    xid: int
    key: tuple[str, ...]
    before: dict[tuple[Any, ...], Any]


@dataclass(frozen=True)
class Segment:
    """Untracked transactions (pgbench) between two WAL positions, and the tables at the end."""

    start_lsn: int
    end_lsn: int
    tables: dict[tuple[str, str], TableSnap]


@dataclass
class Workload:
    db: str
    snapshots: dict[int, dict[tuple[str, str], TableSnap]] = field(default_factory=dict)
    segments: list[Segment] = field(default_factory=list)
    dropped: dict[tuple[str, str], list[Dropped]] = field(default_factory=dict)
    commit_order: list[int] = field(default_factory=list)  # xids of the snapshots, in commit order
    prepared: dict[str, int] = field(default_factory=dict)  # gid -> xid, while prepared
    labels: dict[str, int] = field(default_factory=dict)  # xids of a few transactions tests cut inside

    def tables(self) -> set[tuple[str, str]]:
        out = {t for snap in self.snapshots.values() for t in snap}
        return out | {t for s in self.segments for t in s.tables}


class Driver:
    """Runs the workload's transactions and snapshots the published tables after each commit."""

    def __init__(self, pg: PgCluster, db: str) -> None:
        self.pg, self.workload = pg, Workload(db)
        self.conn = pg.connect(db, autocommit=False)
        self.probe = pg.connect(db, autocommit=True)
        self._cache: dict[tuple[str, str], tuple[Any, TableSnap]] = {}

    def close(self) -> None:
        self.conn.close()
        self.probe.close()

    # transactions
    @staticmethod
    def xid(conn: psycopg.Connection[Any]) -> int:
        return int(conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0])  # type: ignore[index]

    def txn(self, *statements: str, conn: psycopg.Connection[Any] | None = None, label: str = "") -> int:
        """Run ``statements`` in one transaction, commit, snapshot; return the xid."""
        conn = conn or self.conn
        for sql in statements:
            conn.execute(sql)
        xid = self.xid(conn)
        conn.commit()
        self.snapshot(xid)
        if label:
            self.workload.labels[label] = xid
        return xid

    def rollback(self, *statements: str) -> None:
        for sql in statements:
            self.conn.execute(sql)
        self.conn.rollback()

    def prepare(self, gid: str, *statements: str) -> int:
        for sql in statements:
            self.conn.execute(sql)
        xid = self.xid(self.conn)
        self.conn.execute(f"PREPARE TRANSACTION '{gid}'")
        self.conn.commit()  # psycopg's own transaction state: the server is idle already
        self.workload.prepared[gid] = xid
        self.workload.labels[f"prepared {gid}"] = xid
        return xid

    def commit_prepared(self, gid: str) -> int:
        self.probe.execute(f"COMMIT PREPARED '{gid}'")
        xid = self.workload.prepared.pop(gid)
        self.snapshot(xid)
        return xid

    def rollback_prepared(self, gid: str) -> None:
        self.probe.execute(f"ROLLBACK PREPARED '{gid}'")
        self.workload.prepared.pop(gid)

    def session(self) -> psycopg.Connection[Any]:
        return self.pg.connect(self.workload.db, autocommit=False)

    def drop_column(self, schema: str, name: str, column: str) -> int:
        """DROP COLUMN in a transaction of its own, remembering each row's value just before."""
        key = self._key(schema, name)
        typname, typmod = self.probe.execute(
            "SELECT t.typname, a.atttypmod FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid"
            " WHERE a.attrelid = %s::regclass AND a.attname = %s",
            (qualified(schema, name), column)).fetchone()  # type: ignore[misc]
        expression, post = column_sql(column, typname, typmod)
        rows = self.probe.execute(
            f"SELECT {', '.join(ident(k) for k in key)}, {expression} FROM {qualified(schema, name)}").fetchall()
        before = {tuple(r[:-1]): post(r[-1]) for r in rows}
        xid = self.txn(f"ALTER TABLE {qualified(schema, name)} DROP COLUMN {ident(column)}")
        self.workload.dropped.setdefault((schema, name), []).append(Dropped(column, xid, key, before))
        return xid

    def untracked(self, run: Callable[[], object]) -> None:
        """Run transactions we cannot see one by one (pgbench); snapshot once at the end."""
        start = self._lsn()
        run()
        end = self._lsn()
        self.workload.segments.append(Segment(start, end, self._tables()))

    def _lsn(self) -> int:
        row = self.probe.execute("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8").fetchone()
        return int(row[0])  # type: ignore[index]

    # snapshots
    def snapshot(self, xid: int) -> None:
        self.workload.snapshots[xid] = self._tables()
        self.workload.commit_order.append(xid)

    def _tables(self) -> dict[tuple[str, str], TableSnap]:
        published = self.probe.execute(
            "SELECT schemaname, tablename, attnames, rowfilter FROM pg_publication_tables"
            " WHERE pubname = ANY(%s)", (PUBLICATIONS,)).fetchall()
        seen: dict[tuple[str, str], TableSnap] = {}
        for schema, name, attnames, rowfilter in published:
            if (schema, name) in seen:
                raise AssertionError(f"{schema}.{name} is in two publications: the workload keeps one each")
            seen[(schema, name)] = self._table(schema, name, list(attnames), rowfilter)
        return seen

    def _key(self, schema: str, name: str) -> tuple[str, ...]:
        rows = self.probe.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
            " AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary"
            " ORDER BY array_position(i.indkey::int2[], a.attnum)", (qualified(schema, name),)).fetchall()
        return tuple(r[0] for r in rows)

    def _table(self, schema: str, name: str, attnames: list[str], rowfilter: str | None) -> TableSnap:
        table = qualified(schema, name)
        columns = self.probe.execute(
            "SELECT a.attname, coalesce(b.typname, t.typname),"
            " CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE a.atttypmod END,"
            " CASE WHEN t.typtype = 'd' THEN format_type(t.typbasetype, t.typtypmod) END"
            " FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid"
            " LEFT JOIN pg_type b ON t.typtype = 'd' AND b.oid = t.typbasetype"
            " WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped"
            " AND a.attgenerated = '' ORDER BY a.attnum", (table,)).fetchall()
        columns = [c for c in columns if c[0] in attnames]  # the publication's column list
        where = f" WHERE {rowfilter}" if rowfilter else ""
        signature = (tuple(columns), rowfilter, *self.probe.execute(
            f"SELECT count(*), coalesce(sum(hashtext(t::text || ' ' || t.xmin::text)::int8), 0)"
            f" FROM {table} AS t{where}").fetchone())  # type: ignore[misc]
        cached = self._cache.get((schema, name))
        if cached is not None and cached[0] == signature:
            return cached[1]
        expressions, posts = [], []
        for column, typname, typmod, domain_base in columns:
            expression, post = column_sql(column, typname, typmod)
            if domain_base is not None:  # a domain reads back as its base type
                expression = f"{expression}::{domain_base}" if expression == ident(column) else expression
            expressions.append(expression)
            posts.append(post)
        select = ", ".join(["t.xmin::text::int8", *expressions]) if expressions else "t.xmin::text::int8"
        rows = self.probe.execute(f"SELECT {select} FROM {table} AS t{where}").fetchall()
        snap = TableSnap(tuple(c[0] for c in columns),
                         tuple(tuple(post(v) for post, v in zip(posts, r[1:])) for r in rows),
                         tuple(int(r[0]) for r in rows), self._key(schema, name))
        self._cache[(schema, name)] = (signature, snap)
        return snap


# -- the workload ------------------------------------------------------------------------------------

TYPES_COLUMNS = """
    id int PRIMARY KEY, i2 int2, i4 int4, i8 int8, n_plain numeric, n_typed numeric(12, 3),
    n_wide numeric(40, 5), f4 float4, f8 float8, t text, vc varchar(20), ch char(5), b bytea,
    flag bool, d date, tm time, ts timestamp, tstz timestamptz, iv interval, u uuid, jb jsonb,
    js json, ia int[], ta text[], fa float8[], ip inet, net cidr, mac macaddr, m mood, pi posint,
    bits varbit(16), gen int GENERATED ALWAYS AS (i2 + 1) STORED"""

TYPES_NULLABLE = ("i2 i4 i8 n_plain n_typed n_wide f4 f8 t vc ch b flag d tm ts tstz iv u jb js ia ta fa ip"
                  " net mac m pi bits").split()

TYPES_ROWS = [
    "(1, 32767, 2147483647, -9223372036854775808, '123456789012345678901234567890.123456789', "
    "123456789.123, 12345678901234567890123456789012345.12345, 1.1, 0.1, "
    "E'quote''s \"double\" back\\\\slash\\ttab\\nnewline', 'varchar', 'ab', '\\x00ff10', true, "
    "'2024-02-29', '23:59:59.999999', '2024-02-29 23:59:59.999999', '2024-01-31 12:34:56.123456+05:30', "
    "'1 year 2 mons -3 days 04:05:06.789', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11', "
    "'{\"b\": [1, 2.50, null], \"a\": \"q\\\"uote\", \"ü\": \"\\u00e9\"}', '{\"z\": 1,  \"z\": 2}', "
    "'{1,NULL,-3}', '{\"a b\",\"c\\\"d\",NULL,\"NULL\"}', '{1.5,NaN,-Infinity}', '192.168.1.5/24', "
    "'10.0.0.0/8', '08:00:2b:01:02:03', 'happy', 7, B'10101')",
    "(2, -32768, -1, 0, 'NaN', -0.001, 0, -3.4028235e38, 'Infinity', '', '', 'abcde', '\\x', false, "
    "'0001-01-01', '00:00:00', '1900-06-15 12:00:00', '1970-01-01 00:00:00+00', "
    "'-1 mons +2 days -00:00:00.000001', '00000000-0000-0000-0000-000000000000', '[]', 'null', "
    "'{}', '{}', '{}', '::1', '2001:db8::/32', '00:00:00:00:00:00', 'sad', 1, B'')",
    "(3, 0, 0, 1, '-0.000001', 0.5, -1.5, 1e-45, -2.2250738585072014e-308, 'ünïcödé 🎉', 'x', 'x', "
    "decode('0001020304', 'hex'), NULL, '9999-12-31', '12:34:56.5', '2038-01-19 03:14:07', "
    "'2038-01-19 03:14:08-08', '0', '6ba7b810-9dad-11d1-80b4-00c04fd430c8', '{\"k\": {\"n\": [true]}}', "
    "'[1, 2]', '{0}', '{\"\"}', '{0}', '10.1.2.3', '10.1.0.0/16', 'ff:ff:ff:ff:ff:ff', 'ok', 3, B'1')",
    "(4, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
    "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
    "(5, 1, 2, 3, '1e-20', 1, 2, 0, 0, 't5', 'v5', 'c5', '\\xdeadbeef', true, '2000-01-01', "
    "'01:02:03', '2000-01-01 00:00:00.000001', '1999-12-31 23:59:59.999999+14', '100 years', "
    "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12', '{}', '{}', '{5}', '{five}', '{5}', '1.2.3.4', '1.2.3.4/32', "
    "'01:02:03:04:05:06', 'ok', 5, B'1111000011110000')",
]

SETUP = f"""
    CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
    CREATE DOMAIN posint AS int CHECK (VALUE > 0);
    CREATE TABLE types_t ({TYPES_COLUMNS});
    CREATE TABLE toasty (id int PRIMARY KEY, small int, big_t text, big_j jsonb, big_b bytea);
    CREATE TABLE fulltoast (k int, note text, big text);
    ALTER TABLE fulltoast REPLICA IDENTITY FULL;
    CREATE TABLE keyswap (id int PRIMARY KEY, v text, n int);
    CREATE TABLE dups (k text, n int, note text, f float8);
    ALTER TABLE dups REPLICA IDENTITY FULL;
    CREATE TABLE ri_idx (a int NOT NULL, b int NOT NULL, v text, w jsonb);
    CREATE UNIQUE INDEX ri_idx_ab ON ri_idx (a, b);
    ALTER TABLE ri_idx REPLICA IDENTITY USING INDEX ri_idx_ab;
    CREATE TABLE logonly (msg text, n int, at timestamptz);
    CREATE TABLE bulk (id int PRIMARY KEY, grp int, pad text);
    CREATE TABLE parent (id int PRIMARY KEY, v text);
    CREATE TABLE child (id int PRIMARY KEY, parent_id int REFERENCES parent, v text);
    CREATE TABLE trunc_a (id int PRIMARY KEY, v text);
    CREATE TABLE trunc_b (id int PRIMARY KEY, v text);
    CREATE TABLE evolve_add (id int PRIMARY KEY, v text);
    CREATE TABLE evolve_drop (id int PRIMARY KEY, keep text, gone text, gone2 int);
    CREATE TABLE evolve_type (id int PRIMARY KEY, n int, s varchar(10), amount numeric(10, 2), ns int[]);
    CREATE TABLE ident_switch (id int PRIMARY KEY, v text, n int);
    CREATE TABLE rowfilt (id int PRIMARY KEY, grp int, v text);
    ALTER TABLE rowfilt REPLICA IDENTITY FULL;
    CREATE TABLE rowfilt_k (id int PRIMARY KEY, v text);
    CREATE TABLE collist (id int PRIMARY KEY, a text, b text, c int);
    CREATE TABLE parted (id int, region text, v text, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
    CREATE TABLE parted_a PARTITION OF parted FOR VALUES IN ('a');
    CREATE TABLE parted_b PARTITION OF parted FOR VALUES IN ('b');
    CREATE SCHEMA {ident(SCHEMA)};
    CREATE TABLE {qualified(SCHEMA, "Odd Table")} ("Id" int PRIMARY KEY, "Some Value" text, "a.b" int,
                                                  "Ünï/code" text);
    CREATE PUBLICATION pub_main FOR TABLE types_t, toasty, fulltoast, keyswap, dups, ri_idx, bulk,
        parent, child, trunc_a, trunc_b, evolve_add, evolve_drop, evolve_type, ident_switch;
    CREATE PUBLICATION pub_schema FOR TABLES IN SCHEMA {ident(SCHEMA)};
    CREATE PUBLICATION pub_ins FOR TABLE logonly WITH (publish = 'insert');
    CREATE PUBLICATION pub_filter FOR TABLE rowfilt WHERE (grp > 0), rowfilt_k WHERE (id % 3 <> 0);
    CREATE PUBLICATION pub_cols FOR TABLE collist (id, a, c);
    CREATE PUBLICATION pub_part FOR TABLE parted WITH (publish_via_partition_root = true);
    -- origins are cluster-wide: every database of a test run shares this one
    SELECT pg_replication_origin_create('apply_upstream')
        WHERE NOT EXISTS (SELECT FROM pg_replication_origin WHERE roname = 'apply_upstream');
"""

PAD = "repeat(md5(g::text), 8)"  # 256 bytes a row: a few hundred rows pass logical_decoding_work_mem


def setup(pg: PgCluster, db: str) -> None:
    """Tables and publications; create the slots after this and before `drive`."""
    pg.execute(SETUP, dbname=db)


def drive(pg: PgCluster, db: str) -> Workload:
    d = Driver(pg, db)
    try:
        _plain_changes(d)
        _schema_changes(d)
        _filters_partitions_names(d)
        _streamed(d)
        _prepared(d)
        _truncates(d)
        _messages_and_origin(d)
        _pgbench(d, pg, db)
        d.txn("UPDATE keyswap SET n = n + 1", "INSERT INTO logonly VALUES ('the end', 0, now())")
    finally:
        d.close()
    return d.workload


def _plain_changes(d: Driver) -> None:
    d.txn(f"INSERT INTO types_t VALUES {', '.join(TYPES_ROWS)}")
    d.txn("UPDATE types_t SET f8 = 'NaN', f4 = '-Infinity', n_plain = 'Infinity', t = t || ' (updated)',"
          " tstz = tstz + interval '1 day 1 microsecond', ia = ia || 99, jb = jb || '{\"new\": true}'"
          " WHERE id = 1",
          f"UPDATE types_t SET {', '.join(f'{c} = NULL' for c in TYPES_NULLABLE)} WHERE id = 2",
          "UPDATE types_t SET id = 30 WHERE id = 3",
          "DELETE FROM types_t WHERE id = 4",
          "UPDATE types_t SET i4 = i4 + 1, iv = iv * 2, d = d + 1 WHERE id = 5")
    # TOAST: later updates leave the big values alone, so pgoutput sends them as unchanged ('u').
    rows = ", ".join(f"({i}, {i}, {big_text(f't{i}')}, {big_jsonb(f'j{i}')}, {big_bytea(f'b{i}')})"
                     for i in (1, 2, 3))
    d.txn(f"INSERT INTO toasty VALUES {rows}")
    d.txn("UPDATE toasty SET small = small + 1 WHERE id = 1")
    d.txn("UPDATE toasty SET id = 20, small = 21 WHERE id = 2")  # key change, TOAST unchanged
    d.txn("UPDATE toasty SET id = -1 WHERE id = 1", "UPDATE toasty SET id = 1 WHERE id = 3",
          "UPDATE toasty SET id = 3, small = small * 10 WHERE id = -1",
          label="toasty key swap")  # in one transaction, through a temporary key
    d.txn(f"INSERT INTO toasty VALUES (4, 4, {big_text('t4')}, {big_jsonb('j4')}, {big_bytea('b4')})",
          "UPDATE toasty SET small = 41 WHERE id = 4", "UPDATE toasty SET small = 42 WHERE id = 4",
          "UPDATE toasty SET id = 40 WHERE id = 4")
    d.txn(f"UPDATE toasty SET big_t = {big_text('new')} WHERE id = 20")
    d.txn("DELETE FROM toasty WHERE id = 3")
    # Primary keys that move: all at once, a swap through a temporary key, a cycle, delete + reinsert.
    d.txn("INSERT INTO keyswap SELECT g, 'v' || g, g FROM generate_series(1, 10) g")
    d.txn("UPDATE keyswap SET id = id + 100")
    d.txn("UPDATE keyswap SET id = -1 WHERE id = 101", "UPDATE keyswap SET id = 101 WHERE id = 102",
          "UPDATE keyswap SET id = 102, n = n * 100 WHERE id = -1")
    d.txn("DELETE FROM keyswap WHERE id = 105", "INSERT INTO keyswap VALUES (105, 'reborn', 0)",
          "INSERT INTO keyswap VALUES (200, 'short-lived', 0)", "DELETE FROM keyswap WHERE id = 200",
          "UPDATE keyswap SET id = 300 WHERE id = 106", "UPDATE keyswap SET id = 301 WHERE id = 300",
          "UPDATE keyswap SET id = 106, v = 'round trip' WHERE id = 301")
    # REPLICA IDENTITY FULL without a key: identical rows, one of them changed at a time.
    d.txn("INSERT INTO dups VALUES ('a', 1, NULL, 1.5), ('a', 1, NULL, 1.5), ('a', 1, NULL, 1.5),"
          " ('b', 2, 'x', NULL), ('b', 2, 'x', NULL), ('c', 3, 'y', 0), ('n', 0, NULL, 'NaN'),"
          " ('n', 0, NULL, 'NaN'), ('n', 0, NULL, 'NaN')")
    d.txn("UPDATE dups SET n = 1 WHERE ctid = (SELECT ctid FROM dups WHERE k = 'n' LIMIT 1)",
          "DELETE FROM dups WHERE ctid = (SELECT ctid FROM dups WHERE k = 'n' AND n = 0 LIMIT 1)")
    d.txn("UPDATE dups SET n = 10 WHERE ctid = (SELECT ctid FROM dups WHERE k = 'a' LIMIT 1)")
    d.txn("DELETE FROM dups WHERE ctid = (SELECT ctid FROM dups WHERE k = 'b' LIMIT 1)")
    d.txn("UPDATE dups SET n = 1 WHERE k = 'a' AND n = 10",
          "UPDATE dups SET note = 'z' WHERE ctid = (SELECT ctid FROM dups WHERE k = 'a' LIMIT 1)",
          "DELETE FROM dups WHERE k = 'c'", "INSERT INTO dups VALUES ('c', 3, 'y', 0), ('c', 3, 'y', 0)")
    # REPLICA IDENTITY USING INDEX: the old key is sent only when (a, b) changes.
    d.txn("INSERT INTO ri_idx VALUES (1, 1, 'x', '{\"w\": 1}'), (1, 2, 'y', NULL), (2, 1, 'z', '[]')")
    d.txn("UPDATE ri_idx SET v = 'x2' WHERE a = 1 AND b = 1", "UPDATE ri_idx SET b = 3 WHERE a = 1 AND b = 2",
          "DELETE FROM ri_idx WHERE a = 2")
    d.txn("INSERT INTO logonly VALUES ('same', 1, '2024-01-01 00:00+00'), ('same', 1, '2024-01-01 00:00+00'),"
          " (NULL, NULL, NULL)")
    # REPLICA IDENTITY FULL with TOAST: the old row is sent whole, the new one with 'u'.
    d.txn(f"INSERT INTO fulltoast VALUES (1, 'n1', {big_text('f1')}), (2, 'n2', {big_text('f2')}),"
          f" (2, 'n2', {big_text('f2')})")
    d.txn("UPDATE fulltoast SET note = 'changed' WHERE k = 1")
    d.txn("UPDATE fulltoast SET k = 3 WHERE ctid = (SELECT ctid FROM fulltoast WHERE k = 2 LIMIT 1)")
    d.txn("DELETE FROM fulltoast WHERE k = 1")


def _schema_changes(d: Driver) -> None:
    d.txn("INSERT INTO evolve_add VALUES (1, 'a'), (2, 'b')",
          "INSERT INTO evolve_drop VALUES (1, 'k1', 'g1', 1), (2, 'k2', 'g2', 2), (3, 'k3', 'g3', 3),"
          " (4, 'k4', NULL, 4)",
          "INSERT INTO evolve_type VALUES (1, 1, 'one', 1.50, '{1,NULL}'),"
          " (2, -2147483648, 'ten chars!', -99999999.99, '{-2147483648}'), (3, NULL, NULL, NULL, NULL)",
          "INSERT INTO ident_switch VALUES (1, 'a', 1), (2, 'b', 2), (3, 'c', 3)")
    d.txn("UPDATE evolve_drop SET gone = 'g2b' WHERE id = 2")
    d.txn("ALTER TABLE evolve_add ADD COLUMN extra bigint")
    d.txn("INSERT INTO evolve_add VALUES (3, 'c', 30)", "UPDATE evolve_add SET extra = 10 WHERE id = 1")
    d.drop_column("public", "evolve_drop", "gone")
    d.txn("UPDATE evolve_drop SET keep = 'k1b' WHERE id = 1", "INSERT INTO evolve_drop VALUES (5, 'k5', 50)")
    d.drop_column("public", "evolve_drop", "gone2")
    d.txn("DELETE FROM evolve_drop WHERE id = 3", "INSERT INTO evolve_drop VALUES (6, 'k6')")
    d.txn("ALTER TABLE evolve_type ALTER COLUMN n TYPE bigint, ALTER COLUMN s TYPE text,"
          " ALTER COLUMN amount TYPE numeric(14, 4), ALTER COLUMN ns TYPE bigint[]")
    d.txn("INSERT INTO evolve_type VALUES (4, 1099511627776, 'a string longer than ten', 12345.6789,"
          " '{1099511627776,NULL,2}')",
          "UPDATE evolve_type SET n = -8589934592 WHERE id = 1")
    d.txn("UPDATE ident_switch SET v = 'a2' WHERE id = 1")
    d.txn("ALTER TABLE ident_switch REPLICA IDENTITY FULL")
    d.txn("UPDATE ident_switch SET n = 5 WHERE id = 2", "DELETE FROM ident_switch WHERE id = 3")
    d.txn("ALTER TABLE ident_switch REPLICA IDENTITY DEFAULT")
    d.txn("UPDATE ident_switch SET id = 10 WHERE id = 1")


def _filters_partitions_names(d: Driver) -> None:
    # Row filters: updates move rows into the filter (sent as inserts) and out (sent as deletes).
    d.txn("INSERT INTO rowfilt VALUES (1, 1, 'in'), (2, -1, 'out'), (3, 1, 'in')",
          "INSERT INTO rowfilt_k SELECT g, 'k' || g FROM generate_series(1, 9) g")
    d.txn("UPDATE rowfilt SET grp = 1 WHERE id = 2", "UPDATE rowfilt SET grp = -5 WHERE id = 1",
          "UPDATE rowfilt SET v = 'still in' WHERE id = 3")
    d.txn("UPDATE rowfilt_k SET id = 12 WHERE id = 1", "UPDATE rowfilt_k SET id = 13 WHERE id = 3",
          "UPDATE rowfilt_k SET v = 'x' WHERE id = 6", "DELETE FROM rowfilt_k WHERE id = 9",
          "DELETE FROM rowfilt_k WHERE id = 2", "UPDATE rowfilt SET grp = 2 WHERE id = 2",
          "UPDATE rowfilt SET grp = -1 WHERE id = 2", "UPDATE rowfilt SET grp = 3 WHERE id = 2")
    # Column list: column b is never sent.
    d.txn("INSERT INTO collist VALUES (1, 'a1', 'b1', 1), (2, 'a2', 'b2', 2)",
          "UPDATE collist SET b = 'bb' WHERE id = 1", "UPDATE collist SET a = 'aa', c = 22 WHERE id = 2")
    d.txn("DELETE FROM collist WHERE id = 1")
    # Partitions published as their root; a row moving partitions; a partition added mid-stream.
    d.txn("INSERT INTO parted VALUES (1, 'a', 'x'), (2, 'b', 'y'), (3, 'a', 'z')")
    d.txn("UPDATE parted SET region = 'b' WHERE id = 1", "UPDATE parted SET v = 'w' WHERE id = 2")
    d.txn("CREATE TABLE parted_c PARTITION OF parted FOR VALUES IN ('c')")
    d.txn("INSERT INTO parted VALUES (4, 'c', 'new')", "UPDATE parted SET region = 'c' WHERE id = 3",
          "UPDATE parted SET id = 30 WHERE id = 3")
    odd, under = qualified(SCHEMA, "Odd Table"), qualified(SCHEMA, "_Under Table")
    d.txn(f"INSERT INTO {odd} VALUES (1, 'one', 1, 'ü/1'), (2, NULL, 2, NULL)")
    d.txn(f"CREATE TABLE {under} (\"K\" int PRIMARY KEY, \"V v\" text)",
          f"INSERT INTO {under} VALUES (1, 'created and filled in one transaction')",
          f"UPDATE {odd} SET \"Some Value\" = 'two', \"Id\" = 20, \"a.b\" = 22 WHERE \"Id\" = 2")


def _streamed(d: Driver) -> None:
    """Transactions past logical_decoding_work_mem (64kB): streamed with protocol 2 and later."""
    d.txn(f"INSERT INTO bulk SELECT g, g % 10, {PAD} FROM generate_series(1, 400) g",
          "SAVEPOINT s1",
          f"INSERT INTO bulk SELECT g, 0, {PAD} FROM generate_series(1001, 1400) g",
          "UPDATE bulk SET grp = -1 WHERE id <= 50",
          "UPDATE toasty SET small = -1",
          "ROLLBACK TO s1",
          "SAVEPOINT s2",
          "UPDATE bulk SET grp = 7 WHERE id <= 10",
          "DELETE FROM bulk WHERE id BETWEEN 20 AND 30",
          "RELEASE s2",
          "SAVEPOINT s3",
          "INSERT INTO logonly VALUES ('rolled back', 3, NULL)",
          "ROLLBACK TO s3",
          "UPDATE toasty SET small = small + 100",  # unchanged TOAST inside a stream
          "UPDATE bulk SET id = id + 10000 WHERE id BETWEEN 100 AND 110",
          "INSERT INTO logonly VALUES ('kept', 4, NULL)")
    d.rollback(f"INSERT INTO bulk SELECT g, 1, {PAD} FROM generate_series(5001, 5400) g",
               "UPDATE toasty SET small = 0", "DELETE FROM keyswap")  # streamed, then aborted whole
    d.txn("ALTER TABLE evolve_add ADD COLUMN note2 text",  # a Relation message inside the stream
          f"INSERT INTO bulk SELECT g, 2, {PAD} FROM generate_series(2001, 2400) g",
          "INSERT INTO evolve_add VALUES (4, 'd', 40, 'from the stream')",
          "UPDATE evolve_add SET note2 = 'set in stream' WHERE id = 2")
    # Two streamed transactions open at once, and small commits in between.
    a, c = d.session(), d.session()
    try:
        a.execute(f"INSERT INTO bulk SELECT g, 3, {PAD} FROM generate_series(3001, 3400) g")
        c.execute(f"INSERT INTO bulk SELECT g, 4, {PAD} FROM generate_series(4001, 4400) g")
        d.txn("INSERT INTO keyswap VALUES (400, 'between streams', 1)")
        a.execute("UPDATE bulk SET grp = 33 WHERE id BETWEEN 3001 AND 3050")
        c.execute(f"INSERT INTO bulk SELECT g, 4, {PAD} FROM generate_series(4401, 4600) g")
        d.txn("UPDATE keyswap SET n = 2 WHERE id = 400")
        d.txn("DELETE FROM bulk WHERE id = 3", conn=c)
        a.execute("DELETE FROM bulk WHERE id BETWEEN 3100 AND 3150")
        d.txn("UPDATE bulk SET grp = 34 WHERE id BETWEEN 3151 AND 3160", conn=a, label="interleaved")
    finally:
        a.close()
        c.close()
    # A truncate in the middle of a streamed transaction, rows before and after it.
    d.txn(f"INSERT INTO bulk SELECT g, 5, {PAD} FROM generate_series(6001, 6400) g",
          "TRUNCATE bulk",
          f"INSERT INTO bulk SELECT g, 6, {PAD} FROM generate_series(1, 300) g",
          "UPDATE bulk SET id = -id WHERE id <= 5")


def _prepared(d: Driver) -> None:
    d.prepare("p1", "INSERT INTO parent VALUES (1, 'p1'), (2, 'p2')",
              "INSERT INTO child VALUES (10, 1, 'c10'), (20, 2, 'c20')")
    d.txn("INSERT INTO parent VALUES (100, 'between prepare and commit')")
    d.commit_prepared("p1")
    d.prepare("p2", "UPDATE keyswap SET v = 'never' WHERE id = 101", "DELETE FROM keyswap WHERE id = 102")
    d.txn("UPDATE keyswap SET v = 'while p2 is prepared' WHERE id = 103")
    d.rollback_prepared("p2")
    d.prepare("p3", f"INSERT INTO bulk SELECT g, 8, {PAD} FROM generate_series(7001, 7400) g",
              "UPDATE toasty SET small = small + 1000", "UPDATE bulk SET grp = 88 WHERE id = 7001")
    d.commit_prepared("p3")  # streamed and prepared
    d.prepare("p4", f"INSERT INTO bulk SELECT g, 9, {PAD} FROM generate_series(8001, 8400) g",
              "DELETE FROM toasty")
    d.rollback_prepared("p4")


def _truncates(d: Driver) -> None:
    d.txn("INSERT INTO trunc_a VALUES (1, 'a1'), (2, 'a2'), (3, 'a3')",
          "INSERT INTO trunc_b VALUES (1, 'b1'), (2, 'b2')")
    d.txn("INSERT INTO trunc_a VALUES (100, 'before truncate')", "TRUNCATE trunc_a, trunc_b",
          "INSERT INTO trunc_a VALUES (1, 'after'), (2, 'after')", "INSERT INTO trunc_b VALUES (1, 'after')",
          "UPDATE trunc_a SET v = 'after, updated' WHERE id = 1")
    d.txn("INSERT INTO trunc_b VALUES (2, 'later')")
    d.txn("TRUNCATE parent CASCADE", "INSERT INTO parent VALUES (7, 'after cascade')",
          "INSERT INTO child VALUES (70, 7, 'after cascade')")
    d.txn("INSERT INTO parent VALUES (8, 'later')", "INSERT INTO child VALUES (80, 8, 'later')")
    d.txn("TRUNCATE toasty", f"INSERT INTO toasty VALUES (5, 5, {big_text('t5')}, {big_jsonb('j5')}, NULL)",
          "UPDATE toasty SET small = 55 WHERE id = 5")
    d.txn("TRUNCATE dups", "INSERT INTO dups VALUES ('d', 4, NULL, NULL), ('d', 4, NULL, NULL)",
          "DELETE FROM dups WHERE ctid = (SELECT ctid FROM dups LIMIT 1)")


def _messages_and_origin(d: Driver) -> None:
    d.txn("SELECT pg_logical_emit_message(false, 'nt', 'not transactional')",
          "SELECT pg_logical_emit_message(true, 'tx', 'transactional')",
          "INSERT INTO logonly VALUES ('with a message', 5, NULL)")
    # A transaction replayed from another node: it carries an Origin message.
    d.conn.execute("SELECT pg_replication_origin_session_setup('apply_upstream')")
    d.conn.commit()
    d.txn("SELECT pg_replication_origin_xact_setup('0/ABC', now())",
          "INSERT INTO keyswap VALUES (9000, 'from upstream', 0)")
    d.conn.execute("SELECT pg_replication_origin_session_reset()")
    d.conn.commit()


def _pgbench(d: Driver, pg: PgCluster, db: str) -> None:
    """pgbench's tables join the publication empty; its load (truncate + COPY, then primary keys
    added) and a short run (truncate of pgbench_history, then 400 transactions) follow."""
    pg.run_pgbench(["-i", "-s", "1", "-I", "dt"], db)
    d.txn(f"ALTER PUBLICATION pub_main ADD TABLE {', '.join(PGBENCH_TABLES)}")
    d.untracked(lambda: pg.run_pgbench(["-i", "-s", "1", "-I", "gvp"], db))
    d.untracked(lambda: pg.run_pgbench(["-c", "2", "-t", "200"], db))
