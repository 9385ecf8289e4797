"""`snapshot_tables`: a new slot and every published table's rows as of its consistent point.

A ``replication=database`` connection creates the pgoutput slot with
``CREATE_REPLICATION_SLOT ... LOGICAL pgoutput (SNAPSHOT 'export')`` (psycopg
sends it with the simple query protocol, which the walsender needs). While
that connection stays open, a second one reads in the exported snapshot
(``SET TRANSACTION SNAPSHOT``): it sees exactly the transactions committed
before the slot's consistent point, and the slot sends exactly the ones after.
Each published table is copied with ``COPY (SELECT <published columns> FROM
... WHERE <row filter>) TO STDOUT (FORMAT csv)``, streamed to a file, parsed by
Arrow in batches, converted by the same code as the changes, written as
Parquet next to the target and appended to the table's new Delta mirror with
the apply job's transaction identifier and the consistent point as its version.
Memory stays at one batch whatever the table's size.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ..convert.dispatch import arrow_type, convert
from ..convert.oids import FIRST_GENBKI_OBJECT_ID
from ..convert.pgtype import PgType, resolve
from ..errors import CaptureError
from ..lsn import Lsn
from .options import PluginOptions, quote_ident
from .source import SlotSource, connect

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["PublishedTable", "SnapshotResult", "published_tables", "snapshot_tables"]

_log = logging.getLogger(__name__)
_BATCH_BYTES = 16 << 20  # CSV block size: about this much text per converted batch


@dataclass(frozen=True)
class PublishedTable:
    """A table as the publications send it: columns (name, type OID, typmod) and row filter."""

    oid: int
    schema: str
    name: str
    partitioned: bool
    columns: tuple[tuple[str, int, int], ...]
    row_filter: str | None
    type_names: dict[int, tuple[str, str]] = field(default_factory=dict)

    @property
    def qualified(self) -> str:
        return f"{_ident(self.schema)}.{_ident(self.name)}"

    def pg_types(self) -> list[PgType]:
        return [resolve(oid, typmod, self.type_names) for _, oid, typmod in self.columns]

    def select(self) -> str:
        """The query COPY runs: published columns, row filter; a partitioned table with its partitions."""
        columns = ", ".join(_ident(name) for name, _, _ in self.columns)
        only = "" if self.partitioned else "ONLY "
        where = f" WHERE {self.row_filter}" if self.row_filter else ""
        return f"SELECT {columns} FROM {only}{self.qualified}{where}"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def published_tables(conn: psycopg.Connection[Any], publications: Sequence[str]) -> list[PublishedTable]:
    """The tables `publications` send, with their column lists and row filters (OR-ed across them)."""
    version = conn.info.server_version
    lists = "pt.attnames, pt.rowfilter" if version >= 150000 else "NULL::name[], NULL::text"
    rows = conn.execute(
        f"SELECT c.oid, pt.schemaname, pt.tablename, c.relkind = 'p', {lists}"
        " FROM pg_publication_tables pt"
        " JOIN pg_namespace n ON n.nspname = pt.schemaname"
        " JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename"
        " WHERE pt.pubname = ANY(%s) ORDER BY pt.schemaname, pt.tablename",
        (list(publications),)).fetchall()
    merged: dict[int, dict[str, Any]] = {}
    for oid, schema, name, partitioned, attnames, rowfilter in rows:
        entry = merged.setdefault(oid, {"schema": schema, "name": name, "partitioned": partitioned,
                                        "attnames": set(), "all": False, "filters": [], "unfiltered": False})
        if attnames is None:
            entry["all"] = True
        else:
            entry["attnames"] |= set(attnames)
        if rowfilter is None:
            entry["unfiltered"] = True
        else:
            entry["filters"].append(rowfilter)
    out = []
    for oid, entry in merged.items():
        columns = [(name, type_oid, typmod) for name, type_oid, typmod in conn.execute(
            "SELECT attname, atttypid, atttypmod FROM pg_attribute WHERE attrelid = %s AND attnum > 0"
            " AND NOT attisdropped AND attgenerated = '' ORDER BY attnum", (oid,))
            if entry["all"] or name in entry["attnames"]]
        row_filter = None if entry["unfiltered"] or not entry["filters"] else \
            " OR ".join(f"({f})" for f in entry["filters"])
        out.append(PublishedTable(oid, entry["schema"], entry["name"], entry["partitioned"],
                                  tuple(columns), row_filter, _type_names(conn, columns)))
    return out


def _type_names(conn: psycopg.Connection[Any], columns: list[tuple[str, int, int]]) -> dict[int, tuple[str, str]]:
    """What pgoutput's Type message says of each non-built-in type: its base type's namespace and name."""
    names = {}
    for _, type_oid, _ in columns:
        if type_oid < FIRST_GENBKI_OBJECT_ID or type_oid in names:
            continue
        base = type_oid
        while True:  # getBaseType: a domain over a domain over ...
            kind, base_of, namespace, name = conn.execute(
                "SELECT t.typtype, t.typbasetype, n.nspname, t.typname FROM pg_type t"
                " JOIN pg_namespace n ON n.oid = t.typnamespace WHERE t.oid = %s", (base,)).fetchone()  # type: ignore[misc]
            if kind != "d":
                break
            base = base_of
        names[type_oid] = ("" if namespace == "pg_catalog" else namespace, name)
    return names


@dataclass(frozen=True)
class TableCopy:
    table: str
    path: str
    rows: int
    bytes: int
    seconds: float

    def render(self) -> str:
        return (f"{self.table}: {self.rows:,} rows ({self.bytes / 1e6:.1f} MB of text) in"
                f" {self.seconds:.1f} s -> {self.path}")


@dataclass
class SnapshotResult:
    slot: str
    consistent_point: Lsn
    snapshot_name: str
    tables: list[TableCopy] = field(default_factory=list)

    def render(self) -> str:
        lines = [f"slot {self.slot!r} created at {self.consistent_point} (snapshot {self.snapshot_name});"
                 f" {len(self.tables)} table(s), {sum(t.rows for t in self.tables):,} rows copied"]
        lines += [f"  {t.render()}" for t in self.tables]
        lines.append(f"  next: pgoutput-spark capture --slot {self.slot} ..., then apply: changes start"
                     f" after {self.consistent_point}")
        return "\n".join(lines)


def _create_slot(dsn: str | None, slot: str, two_phase: bool) -> tuple[psycopg.Connection[Any], Lsn, str]:
    """A replication connection that created `slot` and exported its snapshot (kept open)."""
    try:
        conn = psycopg.connect(dsn or "", autocommit=True, replication="database")
    except psycopg.ProgrammingError:
        raise CaptureError("the connection string is not valid (not shown: it may hold a password)") from None
    except psycopg.OperationalError as exc:
        raise CaptureError(f"can't open a replication connection: {' '.join(str(exc).split())}") from None
    options = "(SNAPSHOT 'export'" + (", TWO_PHASE" if two_phase else "") + ")"
    if conn.info.server_version < 150000:
        if two_phase:
            raise CaptureError("two_phase slots need PostgreSQL 15 or later")
        options = "EXPORT_SNAPSHOT"
    try:
        cursor = psycopg.ClientCursor(conn)  # the walsender takes the simple query protocol only
        cursor.execute(f"CREATE_REPLICATION_SLOT {quote_ident(slot)} LOGICAL pgoutput {options}")
        _, point, snapshot, _ = cursor.fetchone()  # type: ignore[misc]
    except psycopg.Error as exc:
        conn.close()
        raise CaptureError(f"can't create replication slot {slot!r}: {' '.join(str(exc).split())}") from None
    return conn, Lsn(point), snapshot


def snapshot_tables(
    spark: SparkSession,
    target: str,
    *,
    slot: str,
    publications: Sequence[str],
    dsn: str | None = None,
    two_phase: bool = False,
    pipeline: str = "default",
    table_path: str | None = None,
    table_name: str | None = None,
    batch_bytes: int = _BATCH_BYTES,
    progress: Callable[[TableCopy], None] | None = None,
) -> SnapshotResult:
    """Create `slot` and copy every table `publications` send into a new Delta mirror under `target`.

    The mirrors are where, and typed as, the apply job writes them; their
    Delta commit carries the apply job's ``txnAppId`` and the slot's
    consistent point, so the apply continues from there. A mirror that exists
    already is an error (nothing is created then): the snapshot starts a
    pipeline.
    """
    from ..mirror.delta import DEFAULT_TABLE_PATH, apply_schema, catalog_name, mirror_path, plan_schema, register

    template = table_path or DEFAULT_TABLE_PATH
    check = connect(dsn)
    with check:
        source = SlotSource(check, slot, PluginOptions(tuple(publications), 1), dsn)
        source.check_server()
        if source.slot_info() is not None:
            raise CaptureError(f"replication slot {slot!r} exists already: a snapshot creates its slot"
                               " (drop it, or choose another name)")
        tables = published_tables(check, publications)
        plans = {}
        for table in tables:
            columns = [(name, arrow_type(t)) for (name, _, _), t in zip(table.columns, table.pg_types())]
            path = mirror_path(target, table.schema, table.name, template)
            plan = plan_schema(spark, path, f"{table.schema}.{table.name}", columns)
            if plan.exists:
                raise CaptureError(f"{table.schema}.{table.name}: a mirror exists at {path}; a snapshot"
                                   " starts a new pipeline into new mirrors")
            plans[table.oid] = plan
    replication, point, snapshot = _create_slot(dsn, slot, two_phase)
    result = SnapshotResult(slot, point, snapshot)
    try:
        reader = connect(dsn)
        with reader:
            source.apply_settings(reader)
            reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            reader.execute("SET TRANSACTION SNAPSHOT %s" % _literal(snapshot))
            for table in tables:
                started = time.monotonic()
                plan = plans[table.oid]
                apply_schema(spark, plan)
                rows, size = _copy_into(spark, reader, table, plan, target, pipeline, point, batch_bytes)
                if table_name:
                    register(spark, catalog_name(table_name, table.schema, table.name), plan.path)
                copied = TableCopy(f"{table.schema}.{table.name}", plan.path, rows, size,
                                   time.monotonic() - started)
                result.tables.append(copied)
                if progress is not None:
                    progress(copied)
            reader.execute("COMMIT")
    finally:
        replication.close()
    return result


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _copy_into(spark: SparkSession, reader: psycopg.Connection[Any], table: PublishedTable, plan: Any,
               target: str, pipeline: str, point: Lsn, batch_bytes: int) -> tuple[int, int]:
    """COPY one table into its (new, empty) mirror; return rows and bytes of text copied."""
    from ..mirror.delta import TableSpec, append
    from pyspark.sql.pandas.types import from_arrow_schema

    work = Path(target) / "_pgoutput" / "snapshot" / str(table.oid)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        text = work / "copy.csv"
        with open(text, "wb") as out, reader.cursor().copy(
                f"COPY ({table.select()}) TO STDOUT (FORMAT csv)") as copy:
            for block in copy:
                out.write(block)
        size = text.stat().st_size
        if size == 0:
            return 0, 0
        schema = pa.schema(plan.columns)
        rows = 0
        with pq.ParquetWriter(work / "rows.parquet", schema) as writer:
            for batch in _parsed(text, table, schema, batch_bytes):
                writer.write_batch(batch)
                rows += batch.num_rows
        os.remove(text)
        frame = spark.read.schema(from_arrow_schema(schema, prefer_timestamp_ntz=True)).parquet(str(work))
        spec = TableSpec("multiset", (), tuple(name for name, _ in plan.columns))
        append(plan.path, frame, spec, app_id=f"{pipeline}:relation:{table.oid}", version=int(point),
               metadata={"pipeline": pipeline, "snapshot": True, "to_lsn": int(point)})
        return rows, size
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _parsed(text: Path, table: PublishedTable, schema: pa.Schema, batch_bytes: int):  # type: ignore[no-untyped-def]
    """Converted record batches of a COPY ... (FORMAT csv) file (NULL: unquoted empty field)."""
    names = [f"c{i}" for i in range(len(table.columns))]
    reader = pacsv.open_csv(
        text,
        read_options=pacsv.ReadOptions(column_names=names, block_size=batch_bytes),
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
        convert_options=pacsv.ConvertOptions(
            column_types={n: pa.binary() for n in names}, strings_can_be_null=True,
            quoted_strings_can_be_null=False, null_values=[""]),
    )
    types = table.pg_types()
    for batch in reader:
        arrays = [convert(batch.column(i), t, format="text") for i, t in enumerate(types)]
        yield pa.record_batch(arrays, schema=schema)

