"""Per-table typed change DataFrames from assembled (committed) change rows."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from ..assemble.relations import RelationHistory, versions_from_rows
from ..assemble.typed import change_schema, typed_changes
from .connect import for_tasks

if TYPE_CHECKING:
    from ..config import TablesConfig

#: Change rows per conversion task: a table with fewer is converted in one task. A Python task
#: costs about 0.1 s whatever its rows (worker round trip, garbage collection), and the
#: committed changes of a run are spread over every shuffle partition of its assembly.
ROWS_PER_TASK = 100_000

#: The columns of the assembled committed rows that the per-table frames read (``lsn``,
#: ``in_stream`` and ``raw`` for the tuples that `decode` deferred).
CHANGE_ROW_COLUMNS = ["seq", "lsn", "message_type", "in_stream", "change", "truncate", "raw", "commit_seq",
                      "commit_lsn", "commit_ts", "txn_xid", "txn_origin"]

#: What a conversion task receives of each change row: no NULL struct or array column (a
#: truncate's, an insert's missing old tuple) reaches Arrow unless needed. Spark's Arrow writer
#: spends about 9 microseconds on each NULL array: 4.5 s for the truncate column alone of
#: half a million change rows, more than everything else they carry.
TASK_COLUMNS = ["seq", "lsn", "message_type", "in_stream", "raw", "commit_seq", "commit_lsn", "commit_ts",
                "txn_xid", "txn_origin"]

#: The columns of `TASK_COLUMNS` that only describe the transaction (`typed_changes` leaves
#: them NULL where they are not sent): a mirror's net change reads none of them.
TRANSACTION_COLUMNS = ["commit_lsn", "commit_ts", "txn_xid", "txn_origin"]


def relation_rows(committed: DataFrame, relation_id: int, *, tuples: bool = True,
                  transactions: bool = True) -> DataFrame:
    """Committed changes of one relation, truncates included (one row per truncated table).

    ``tuples``: also pass the ``change`` column, needed unless every change's
    tuples were deferred (`decode` with ``tuples=False``): then `typed_changes`
    decodes them from ``raw``.
    ``transactions``: also pass `TRANSACTION_COLUMNS`. A mirror's net change
    needs none of them, and each column a Python task receives costs the JVM's
    Arrow writer time on every row (`bench_wide`'s 518,400 change rows reached its
    task in 4.6 s instead of 5.9 s: means of three warm runs of `benchmarks/apply.py`,
    timed inside the task).
    """
    is_truncate = F.col("message_type") == "truncate"
    # The OID as an array literal: Spark's generated code refers to it where it would write an
    # integer literal into the code, so every table's filter is one compiled class, not one
    # per table (each compiled by Janino, then again by the JVM's JIT compiler).
    oid = F.array(F.lit(relation_id).cast("long"))
    return committed.where(
        (~is_truncate & F.array_contains(oid, F.col("change.relation_id")))
        | (is_truncate & F.arrays_overlap(F.col("truncate.relation_ids"), oid))
    ).select(*(c for c in TASK_COLUMNS if transactions or c not in TRANSACTION_COLUMNS),
             *(["change"] if tuples else []))


def typed_change_frame(committed: DataFrame, relation_id: int, history: RelationHistory,
                       columns: list[tuple[str, pa.DataType]] | None = None,
                       rows: int | None = None, tuples: bool = True) -> DataFrame:
    """The typed change rows of one relation (schema: `change_schema`).

    ``columns`` (name, Arrow type) default to `RelationHistory.table_columns`.
    ``rows``, the relation's number of change rows if known, sets the number of
    conversion tasks (`ROWS_PER_TASK` rows each; the partitions of ``committed``
    are merged, not shuffled). ``tuples``: as for `relation_rows`.
    """
    if columns is None:
        columns = history.table_columns(relation_id)
    schema = change_schema(columns)
    convert = converter(committed.sparkSession, relation_id, history, schema)

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield convert(batch)

    changes = relation_rows(committed, relation_id, tuples=tuples)
    if rows is not None:
        changes = changes.coalesce(max(1, -(-rows // ROWS_PER_TASK)))
    # Arrow timestamps without a zone are PostgreSQL `timestamp`: Spark's TIMESTAMP_NTZ.
    return changes.mapInArrow(run, from_arrow_schema(schema, prefer_timestamp_ntz=True))


def converter(spark: SparkSession, relation_id: int, history: RelationHistory,
              schema: pa.Schema, *, local: bool = False) -> Callable[[pa.RecordBatch], pa.RecordBatch]:
    """A function for Python tasks: a batch of `relation_rows` to typed change rows (``schema``).

    ``local``: for the driver itself, which reads ``history`` where it is (no broadcast).
    Otherwise the tasks get it by `for_tasks`."""
    if local:
        return lambda batch: typed_changes(batch, relation_id, history, schema)
    shared = for_tasks(spark, history)

    def convert(batch: pa.RecordBatch) -> pa.RecordBatch:
        return typed_changes(batch, relation_id, shared(), schema)

    return convert


def history_of(decoded: DataFrame) -> RelationHistory:
    """The relation history of a decoded capture (its Relation and Type messages)."""
    history = RelationHistory()
    history.add(versions_from_rows(decoded.where(F.col("message_type").isin("relation", "type"))
                          .select("seq", "relation", "type").collect()))
    return history


def change_frames(decoded: DataFrame, *, skip_origins: tuple[str, ...] = (),
                  tables: TablesConfig | None = None) -> dict[str, DataFrame]:
    """Typed change DataFrames per table (``schema.table``) of a decoded capture, for notebooks.

    Nothing is written; transactions still open at the end of the capture are left out.
    ``tables`` (the configuration's ``tables``) chooses the tables, ``include`` / ``exclude``,
    and their columns' types, ``types``, as for the changes job.
    """
    from ..config import TablesConfig
    from .assemble import assemble

    tables = tables or TablesConfig()
    history = history_of(decoded)
    history.type_overrides = tables.types
    committed = assemble(decoded, skip_origins=skip_origins).committed
    chosen, _ = history.selected(history.relations, tables)
    frames = {}
    for oid in chosen:
        latest = history.latest(oid)
        frames[f"{latest.namespace}.{latest.name}"] = typed_change_frame(committed, oid, history)
    return frames
