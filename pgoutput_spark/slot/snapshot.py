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
Parquet on the driver, uploaded beside the mirrors (``_pgoutput/snapshot``;
the target may be a URI: executors read it there) and appended to the
table's new Delta mirror with the apply job's transaction identifier and the
consistent point as its version. Memory stays at one batch whatever the
table's size; the driver's disk holds the table's text and its rows.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ..config import TablesConfig
from ..convert.dispatch import arrow_type, convert, override_type
from ..convert.oids import FIRST_GENBKI_OBJECT_ID
from ..convert.pgtype import PgType, resolve
from ..errors import CaptureError, ConfigError
from ..lsn import Lsn
from ..spark.connect import require_classic
from .options import PluginOptions, quote_ident
from .source import SlotSource, connect

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["PublishedTable", "SnapshotResult", "copy_to_file", "published_tables", "read_copy", "snapshot_tables"]

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
    overrides: tuple[tuple[str, str], ...] = ()  # (column, type): the tables.types setting

    @property
    def qualified(self) -> str:
        return f"{_ident(self.schema)}.{_ident(self.name)}"

    def pg_types(self) -> list[PgType]:
        return [resolve(oid, typmod, self.type_names) for _, oid, typmod in self.columns]

    def arrow_columns(self) -> list[tuple[str, pa.DataType]]:
        """(name, Arrow type) of the published columns, as the change conversion types them."""
        return [(name, self.target(name, t)) for (name, _, _), t in zip(self.columns, self.pg_types())]

    def target(self, name: str, t: PgType) -> pa.DataType:
        chosen = dict(self.overrides).get(name)
        return arrow_type(t) if chosen is None else override_type(chosen, t, f"{self.schema}.{self.name}.{name}")

    def select(self) -> str:
        """The query COPY runs: published columns, row filter; a partitioned table with its partitions."""
        columns = ", ".join(_ident(name) for name, _, _ in self.columns)
        only = "" if self.partitioned else "ONLY "
        where = f" WHERE {self.row_filter}" if self.row_filter else ""
        return f"SELECT {columns} FROM {only}{self.qualified}{where}"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def published_tables(conn: psycopg.Connection[Any], publications: Sequence[str],
                     selection: TablesConfig | None = None) -> list[PublishedTable]:
    """The tables `publications` send, with their column lists and row filters (OR-ed across them).

    `selection` (the configuration's ``tables``) leaves out the tables the apply does not mirror
    and marks the columns kept as text.
    """
    selection = selection or TablesConfig()
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
    # PostgreSQL 18 publishes stored generated columns (publish_generated_columns = stored, or a
    # column list naming them); its attnames list exactly the published columns.
    generated = "attgenerated <> 'v'" if version >= 180000 else "attgenerated = ''"
    out = []
    for oid, entry in merged.items():
        if not selection.selected(f"{entry['schema']}.{entry['name']}"):
            continue
        columns = [(name, type_oid, typmod) for name, type_oid, typmod in conn.execute(
            "SELECT attname, atttypid, atttypmod FROM pg_attribute WHERE attrelid = %s AND attnum > 0"
            f" AND NOT attisdropped AND {generated} ORDER BY attnum", (oid,))
            if entry["all"] or name in entry["attnames"]]
        row_filter = None if entry["unfiltered"] or not entry["filters"] else \
            " OR ".join(f"({f})" for f in entry["filters"])
        overrides = tuple(sorted(selection.types.get(f"{entry['schema']}.{entry['name']}", {}).items()))
        out.append(PublishedTable(oid, entry["schema"], entry["name"], entry["partitioned"],
                                  tuple(columns), row_filter, _type_names(conn, columns), overrides))
    return out


def _type_names(conn: psycopg.Connection[Any], columns: list[tuple[str, int, int]]) -> dict[int, tuple[str, str]]:
    """What pgoutput's Type message says of each non-built-in type: its base type's namespace and name."""
    names = {}
    for _, type_oid, _ in columns:
        if type_oid < FIRST_GENBKI_OBJECT_ID or type_oid in names:
            continue
        _, _, namespace, name = base_type(conn, type_oid)
        names[type_oid] = ("" if namespace == "pg_catalog" else namespace, name)
    return names


def base_type(conn: psycopg.Connection[Any], oid: int, *, elements: bool = False) -> tuple[int, str, str, str]:
    """The type under ``oid``'s domains (getBaseType: a domain over a domain over ...) and, with
    ``elements``, under its arrays: (OID, pg_type.typtype, namespace, name)."""
    while True:
        kind, base, element, category, namespace, name = conn.execute(
            "SELECT t.typtype, t.typbasetype, t.typelem, t.typcategory, n.nspname, t.typname FROM pg_type t"
            " JOIN pg_namespace n ON n.oid = t.typnamespace WHERE t.oid = %s", (oid,)).fetchone()  # type: ignore[misc]
        if kind == "d":
            oid = base
        elif elements and category == "A" and element:
            oid = element
        else:
            return oid, kind, namespace, name


@dataclass(frozen=True)
class TableCopy:
    """A table's copy: finished (`done`), or in progress (`stage` copying or converting so far)."""

    table: str
    path: str
    rows: int
    bytes: int
    seconds: float
    done: bool = True
    stage: str = "copied"
    #: A re-snapshot of a table with a history table: its versions (closed, opened) at the snapshot.
    history: tuple[int, int] | None = None

    def render(self) -> str:
        if not self.done:
            return (f"{self.table}: {self.stage} ... {self.rows:,} rows, {self.bytes / 1e6:.1f} MB of text"
                    f" so far ({self.seconds:.1f} s)")
        history = "" if self.history is None else (
            f"; its history: {self.history[0]:,} version(s) closed, {self.history[1]:,} opened")
        return (f"{self.table}: {self.rows:,} rows ({self.bytes / 1e6:.1f} MB of text) in"
                f" {self.seconds:.1f} s -> {self.path}{history}")


@dataclass
class SnapshotResult:
    slot: str
    consistent_point: Lsn
    snapshot_name: str
    replaced: bool = False
    tables: list[TableCopy] = field(default_factory=list)

    def render(self) -> str:
        copied = f"{len(self.tables)} table(s), {sum(t.rows for t in self.tables):,} rows copied"
        if self.replaced:
            lines = [f"re-snapshot as of {self.consistent_point}: {copied}"]
        else:
            lines = [f"slot {self.slot!r} created at {self.consistent_point} (snapshot {self.snapshot_name});"
                     f" {copied}"]
        lines += [f"  {t.render()}" for t in self.tables]
        if self.replaced:
            lines.append(f"  the apply skips these tables' changes committed before {self.consistent_point}")
        else:
            lines.append(f"  next: pgoutput-spark capture --slot {self.slot} ..., then apply: changes start"
                         f" after {self.consistent_point}")
        return "\n".join(lines)


def _create_slot(dsn: str | None, slot: str, two_phase: bool, temporary: bool = False,
                 failover: bool = False) -> tuple[psycopg.Connection[Any], Lsn, str]:
    """A replication connection that created `slot` and exported its snapshot (kept open).

    A `temporary` slot only marks a WAL position with a snapshot of it, and
    goes away with the connection. A `failover` slot (PostgreSQL 17+) is kept
    on the standbys that synchronize slots.
    """
    try:
        conn = psycopg.connect(dsn or "", autocommit=True, replication="database")
    except psycopg.ProgrammingError:
        raise CaptureError("the connection string is not valid (not shown: it may hold a password)") from None
    except psycopg.OperationalError as exc:
        raise CaptureError(f"can't open a replication connection: {' '.join(str(exc).split())}") from None
    options = "(SNAPSHOT 'export'" + (", TWO_PHASE" if two_phase else "") + (", FAILOVER" if failover else "")
    options += ")"
    if failover and (version := conn.info.server_version) < 170000:
        conn.close()
        raise CaptureError(f"failover slots need PostgreSQL 17 or later; the server is PostgreSQL {version // 10000}")
    if conn.info.server_version < 150000:
        if two_phase:
            raise CaptureError("two_phase slots need PostgreSQL 15 or later")
        options = "EXPORT_SNAPSHOT"
    try:
        cursor = psycopg.ClientCursor(conn)  # the walsender takes the simple query protocol only
        kind = "TEMPORARY LOGICAL" if temporary else "LOGICAL"
        cursor.execute(f"CREATE_REPLICATION_SLOT {quote_ident(slot)} {kind} pgoutput {options}")
        _, point, snapshot, _ = cursor.fetchone()  # type: ignore[misc]
    except psycopg.Error as exc:
        conn.close()
        raise CaptureError(f"can't create replication slot {slot!r}: {' '.join(str(exc).split())}") from None
    return conn, Lsn(point), snapshot


def snapshot_tables(
    spark: SparkSession,
    target: str,
    *,
    slot: str | None = None,
    publications: Sequence[str],
    tables: Sequence[str] | None = None,
    dsn: str | None = None,
    two_phase: bool = False,
    failover: bool = False,
    pipeline: str = "default",
    table_path: str | None = None,
    table_name: str | None = None,
    history_path: str | None = None,
    batch_bytes: int = _BATCH_BYTES,
    progress: Callable[[TableCopy], None] | None = None,
    selection: TablesConfig | None = None,
) -> SnapshotResult:
    """Create `slot` and copy every table `publications` send into a new Delta mirror under `target`.

    The mirrors are where, and typed as, the apply job writes them; their
    Delta commit carries the apply job's ``txnAppId`` and the slot's
    consistent point, so the apply continues from there. A mirror that exists
    already is an error (nothing is created then): the snapshot starts a
    pipeline.

    With `tables` (``schema.name``, as published) it re-snapshots those tables
    of a running pipeline instead: a temporary slot marks the WAL position
    ``S`` and exports its snapshot, each table's mirror is overwritten (rows
    and columns) with the source as of ``S``, and ``S`` is recorded in
    ``_pgoutput/snapshots`` so that the apply skips that table's changes
    committed before ``S``. The pipeline's slot, capture and other mirrors are
    not touched. For a column added with a DEFAULT, for example. A table with a history table
    (at ``history_path``, the apply's template) has its history brought to the re-snapshot in
    the same step: the versions valid at ``S`` become the mirror's rows (`resnapshot_history`).

    `selection` (the configuration's ``tables``) leaves out tables the apply does not mirror and
    keeps the columns it keeps as text, as text. With `failover` the new slot is a failover slot
    (PostgreSQL 17+), which standbys that synchronize slots keep a copy of.
    """
    from ..mirroring.history import resnapshot_history
    from ..mirroring.names import DEFAULT_HISTORY_PATH, DEFAULT_TABLE_PATH, catalog_name, mirror_path, register
    from ..mirroring.schema import apply_schema, plan_schema

    require_classic(spark, "snapshot")
    if (slot is None) == (tables is None):
        raise CaptureError("pass either slot (a new pipeline) or tables (a re-snapshot), not both")
    template = table_path or DEFAULT_TABLE_PATH
    replace = tables is not None
    slot_name = slot if slot is not None else f"pgoutput_spark_resnapshot_{os.getpid()}"
    check = connect(dsn)
    with check:
        source = SlotSource(check, slot_name, PluginOptions(tuple(publications), 1), dsn)
        source.check_server()
        if not replace and source.slot_info() is not None:
            raise CaptureError(f"replication slot {slot_name!r} exists already: a snapshot creates its slot"
                               " (drop it, or choose another name)")
        chosen = published_tables(check, publications, selection)
        if replace:
            by_name = {f"{t.schema}.{t.name}": t for t in chosen}
            missing = [name for name in tables or () if name not in by_name]
            if missing:
                raise CaptureError(f"{missing[0]} is not a table of publication(s) {', '.join(publications)}"
                                   " (name it schema.table, as published)")
            chosen = [by_name[name] for name in dict.fromkeys(tables or ())]
        plans = {}
        for table in chosen:
            path = mirror_path(target, table.schema, table.name, template)
            plan = plan_schema(spark, path, f"{table.schema}.{table.name}", table.arrow_columns(),
                               overwrite=replace)
            if plan.exists and not replace:
                raise CaptureError(f"{table.schema}.{table.name}: a mirror exists at {path}; a snapshot"
                                   " starts a new pipeline into new mirrors (re-snapshot it with tables=)")
            plans[table.oid] = plan
        # A re-snapshot's history tables: every decision before anything is written.
        planned = {table.oid: _history_plan(spark, check, table, mirror_path(
            target, table.schema, table.name, history_path or DEFAULT_HISTORY_PATH), selection)
            for table in chosen} if replace else {}
        histories = {oid: found for oid, found in planned.items() if found is not None}
        source.say_if_standby()
    replication, point, snapshot = _create_slot(dsn, slot_name, two_phase and not replace, temporary=replace,
                                                failover=failover and not replace)
    taken = datetime.now(timezone.utc)
    result = SnapshotResult(slot_name, point, snapshot, replaced=replace)
    try:
        reader = connect(dsn)
        with reader:
            source.apply_settings(reader)
            reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            reader.execute("SET TRANSACTION SNAPSHOT %s" % _literal(snapshot))
            for table in chosen:
                started = time.monotonic()
                plan = plans[table.oid]
                if not plan.exists:
                    apply_schema(spark, plan)

                def partial(stage: str, rows: int, size: int) -> None:
                    if progress is not None:
                        progress(TableCopy(f"{table.schema}.{table.name}", plan.path, rows, size,  # noqa: B023
                                           time.monotonic() - started, done=False, stage=stage))

                rows, size = _copy_into(spark, reader, table, plan, target, pipeline, point, batch_bytes,
                                        replace=plan.exists, partial=partial)
                versions = None
                if table.oid in histories:  # before the start is recorded: the apply goes on from both
                    past, key = histories[table.oid]
                    apply_schema(spark, past)
                    lsn = int(point) - 1  # as the mirror's version (`_copy_into`)
                    app_id = f"{pipeline}:history:{table.oid}"
                    counts = resnapshot_history(spark, past.path, plan.path, key, lsn=lsn, at=taken, app_id=app_id,
                                                metadata={"pipeline": pipeline, "snapshot": True, "to_lsn": lsn})
                    versions = (counts["closed"], counts["opened"])
                if replace:  # the apply skips older changes (a new pipeline's slot starts at `point`)
                    _record_start(spark, target, pipeline, [(table, plan.path)], point)
                if table_name:
                    register(spark, catalog_name(table_name, table.schema, table.name), plan.path)
                copied = TableCopy(f"{table.schema}.{table.name}", plan.path, rows, size,
                                   time.monotonic() - started, history=versions)
                result.tables.append(copied)
                if progress is not None:
                    progress(copied)
            reader.execute("COMMIT")
        if not replace and result.tables:  # what `status` lists, and what `--rebuild` refuses
            _record_start(spark, target, pipeline, [(t, plans[t.oid].path) for t in chosen], point)
    finally:
        replication.close()
    return result


def _history_plan(spark: SparkSession, conn: psycopg.Connection[Any], table: PublishedTable, path: str,
                  selection: TablesConfig | None) -> tuple[Any, tuple[str, ...]] | None:
    """The schema plan and key of the history table at ``path`` that a re-snapshot of ``table``
    brings to its rows, None without one; `ConfigError` for a table without a key, `SchemaChangeError`
    for a history whose columns cannot take the table's."""
    from ..capture import _is_delta
    from ..mirroring.history import plan_history

    if not _is_delta(spark, path):
        return None
    name = f"{table.schema}.{table.name}"
    published = [c[0] for c in table.columns]
    key = tuple((selection or TablesConfig()).keys.get(name, ())) or identity_key(conn, table.oid)
    if not key or any(k not in published for k in key):
        raise ConfigError(f"{name} has a history table at {path} but no key among its published columns "
                          f"(its replica identity is the whole row, or tables.keys names other columns): give "
                          f"it one with tables.keys; nothing was written")
    return plan_history(spark, path, name, table.arrow_columns()), key


def identity_key(conn: psycopg.Connection[Any], oid: int) -> tuple[str, ...]:
    """The columns of the table's replica identity key, as its Relation messages flag them:
    the primary key (``DEFAULT``) or the index of ``USING INDEX``; none for ``FULL`` and ``NOTHING``."""
    rows = conn.execute(
        "SELECT a.attname FROM pg_class c JOIN pg_index i ON i.indrelid = c.oid"
        " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = ANY(i.indkey)"
        " WHERE c.oid = %s AND CASE c.relreplident WHEN 'd' THEN i.indisprimary"
        " WHEN 'i' THEN i.indisreplident ELSE false END ORDER BY a.attnum", (oid,)).fetchall()
    return tuple(r[0] for r in rows)


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _record_start(spark: SparkSession, target: str, pipeline: str, tables: list[tuple[PublishedTable, str]],
                  point: Lsn) -> None:
    """Note in ``_pgoutput/snapshots`` that each table's mirror (at its path) holds the source as
    of `point`, in one commit."""
    from pyspark.sql import functions as F

    from ..mirroring.delta import append_rows
    from ..spark.session import local_frame

    rows = [(pipeline, table.oid, f"{table.schema}.{table.name}", int(point), path) for table, path in tables]
    append_rows(local_frame(spark, rows, "pipeline string, relation_id long, table string, lsn long, path string")
                .withColumn("snapshot_at", F.current_timestamp()), snapshots_path(target))


def snapshots_path(target: str) -> str:
    from ..mirroring.names import absolute_path

    return absolute_path(f"{target.rstrip('/')}/_pgoutput/snapshots")


def _copy_into(spark: SparkSession, reader: psycopg.Connection[Any], table: PublishedTable, plan: Any,
               target: str, pipeline: str, point: Lsn, batch_bytes: int, *, replace: bool,
               partial: Callable[[str, int, int], None]) -> tuple[int, int]:
    """COPY one table into its mirror (new and empty, or to `replace`); return rows and bytes copied.

    `partial` hears of every `batch_bytes` of text received and every block converted.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    from ..mirroring.delta import append
    from ..mirroring.deltalog import user_metadata
    from ..mirroring.names import absolute_path
    from ..mirroring.net import TableSpec
    from ..spark.files import child, delete, local_folder, upload

    # The text and its rows on the driver, beside a local target (its disk has room for
    # the mirrors), else in the temporary folder; the rows then uploaded beside the mirrors
    # (executors elsewhere) for Spark to read.
    local = local_folder(target)
    if local is not None:
        work = local / "_pgoutput" / "snapshot-work" / str(table.oid)
        shutil.rmtree(work, ignore_errors=True)  # a killed run's
        work.mkdir(parents=True)
    else:
        work = Path(tempfile.mkdtemp(prefix="pgoutput-snapshot-"))
    staged = child(absolute_path(target), "_pgoutput", "snapshot", str(table.oid))
    try:
        text = work / "copy.csv"
        size = copy_to_file(reader, table, text, every=batch_bytes,
                            received=lambda n: partial("copying", 0, n))
        if size == 0 and not replace:
            return 0, 0
        schema = pa.schema(plan.columns if not replace else table.arrow_columns())
        rows = 0
        with pq.ParquetWriter(work / "rows.parquet", schema) as writer:
            if size:
                for batch in read_copy(text, table, schema, batch_bytes):
                    writer.write_batch(batch)
                    rows += batch.num_rows
                    partial("converting", rows, size)
        os.remove(text)
        delete(spark, staged)  # a killed run's
        upload(spark, work / "rows.parquet", child(staged, "rows.parquet"))
        frame = spark.read.schema(from_arrow_schema(schema, prefer_timestamp_ntz=True)).parquet(staged)
        # The mirror holds every transaction that committed before `point` (a commit record can
        # start at `point`): it is applied up to point - 1, the version the apply's MERGE must pass.
        version = int(point) - 1
        app_id, metadata = f"{pipeline}:relation:{table.oid}", {"pipeline": pipeline, "snapshot": True,
                                                                "to_lsn": version}
        if replace:  # one commit: readers see the old rows or the new ones
            (frame.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
             .option("txnAppId", app_id).option("txnVersion", version)
             .option("userMetadata", user_metadata(metadata, app_id))
             .save(plan.path))
        else:
            spec = TableSpec("multiset", (), tuple(name for name, _ in plan.columns))
            append(plan.path, frame, spec, app_id=app_id, version=version, metadata=metadata)
        delete(spark, staged)
        return rows, size
    finally:
        shutil.rmtree(work, ignore_errors=True)


def copy_to_file(conn: psycopg.Connection[Any], table: PublishedTable, path: Path, *, every: int,
                 received: Callable[[int], None] | None = None) -> int:
    """COPY the table's published rows (``table.select()``) as CSV into `path`; return its size.

    `received` hears of the bytes received so far every `every` bytes.
    """
    size = reported = 0
    with open(path, "wb") as out, conn.cursor().copy(f"COPY ({table.select()}) TO STDOUT (FORMAT csv)") as copy:
        for block in copy:
            out.write(block)
            size += len(block)
            if received is not None and size - reported >= every:
                received(size)
                reported = size
    return size


def read_copy(text: Path, table: PublishedTable, schema: pa.Schema, batch_bytes: int) -> Iterator[pa.RecordBatch]:
    """Converted record batches of a `copy_to_file` file (NULL: an unquoted empty field)."""
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
        arrays = [convert(batch.column(i), t, format="text", target=table.target(name, t))
                  for i, ((name, _, _), t) in enumerate(zip(table.columns, types))]
        yield pa.record_batch(arrays, schema=schema)

