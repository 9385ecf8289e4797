"""A run's rows for a mirror, in Spark: the mirror's pre-image of the keys the run looks up, and
the net change per key (`pgoutput_spark.mirroring.net`) computed in Arrow tasks, in one task or
spread over tasks by key bucket (`NET_TASK_ROWS`), or on the driver for a table with a few
change rows (`LOCAL_NET_ROWS`). `delta` writes what comes out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from ..assemble.typed import META_NAMES
from ..decoder import arrow as ab
from .deltalog import KeyRanges, key_ranges
from .keys import joined_buckets
from .listed import read_current
from .names import quote
from .net import TableSpec, can_hash_keys, in_halves, net_changes, out_schema


def _key_names(spec: TableSpec) -> list[str]:
    """Clash-free names of the looked-up keys' columns (`looked_up`, `pre_image`)."""
    return [f"__pgoutput_spark_key_{i}" for i in range(len(spec.key))]


def looked_up(typed: DataFrame, spec: TableSpec) -> DataFrame:
    """The keys a run's typed change rows look up in the mirror, one column each (`_key_names`),
    each once: a row's old key (or old row) where it carries one, and, for a keyed table, an
    update's own key where it does not. `looked_up_keys` is the same on the driver."""
    old, k = F.col("_old"), _key_names(spec)
    keys = typed.where(old.isNotNull()).select(*[old.getField(c).alias(k[i]) for i, c in enumerate(spec.key)])
    if spec.mode == "keyed":
        keys = keys.unionByName(typed.where((F.col("_op") == "update") & old.isNull()).select(
            *[F.col(quote(c)).alias(k[i]) for i, c in enumerate(spec.key)]))
    return keys.distinct()  # a run's many updates of a key: the join's smaller side


def looked_up_keys(table: pa.Table, spec: TableSpec) -> pa.Table:
    """`looked_up` of typed change rows held on the driver (schema `typed.change_schema`), a key
    as often as rows look it up: `pre_image`'s semi join takes each mirror row once anyway, and
    a few thousand keys, broadcast, need no Spark aggregate (a shuffle) to make them distinct."""
    old = table.column("_old")
    carries = pc.is_valid(old)
    with_old = old.filter(carries)
    columns = [ab.named_field(with_old, c) for c in spec.key]
    if spec.mode == "keyed":
        own = table.filter(pc.and_(pc.equal(table.column("_op"), "update"), pc.invert(carries)))
        columns = [pa.chunked_array([*a.chunks, *own.column(c).chunks], a.type) for a, c in zip(columns, spec.key)]
    return pa.Table.from_arrays(columns, names=_key_names(spec))


def pre_image(spark: SparkSession, path: str, keys: DataFrame | None, schema: T.StructType, spec: TableSpec, *,
              current_only: bool = False) -> DataFrame:
    """The mirror's rows for ``keys`` (`looked_up`, or `looked_up_keys` as a local relation), or
    all of them for None (a history table's run with a truncate), as change rows of ``schema``
    (the typed change rows').

    For a history table (`history`), ``current_only`` keeps its current versions.
    """
    k = _key_names(spec)

    def ranges(files: list[Any] | None, table: T.StructType, size: int | None) -> KeyRanges | None:
        # Only the files whose keys' statistics meet the looked-up keys' range (a multiset's
        # identity columns where no key looked up is null: nulls match nulls, which statistics
        # leave out).
        if keys is None:
            return None
        return key_ranges(files, table, spec.key, lambda: keys, k, size=size)

    target = read_current(spark, path, ranges=ranges)  # cached by the caller, and the source of the MERGE into it
    if current_only:
        target = target.where(F.col("_is_current"))
    equal = [(F.col(quote(c)).eqNullSafe(F.col(k[i])) if spec.mode == "multiset"
              else F.col(quote(c)) == F.col(k[i])) for i, c in enumerate(spec.key)]
    condition = equal[0]
    for more in equal[1:]:
        condition = condition & more
    rows = target if keys is None else target.join(keys, condition, "left_semi")
    present = set(target.columns)
    columns = []
    for field in schema.fields:
        name = field.name
        if name == "_op":
            value = F.lit("pre")
        elif name in ("_commit_seq", "_seq"):
            value = F.lit(-1).cast("long")
        elif name == "_unchanged_toast":
            value = F.array().cast(field.dataType)
        elif name in META_NAMES:
            value = F.lit(None).cast(field.dataType)
        elif name in present:
            value = F.col(quote(name)).cast(field.dataType)
        else:
            value = F.lit(None).cast(field.dataType)
        columns.append(value.alias(name))
    return rows.select(*columns)


def net_frame(typed: DataFrame, pre: DataFrame | None, spec: TableSpec,
              arrow_schema: pa.Schema, *, tasks: int = 1, moved: list[tuple[int, int]] | None = None,
              halves: bool = False, skipping: np.ndarray | None = None) -> DataFrame:
    """The run's net rows for one table (schema `net.out_schema`), computed in one task, or
    spread over ``tasks`` tasks by key (`by_key`, with ``moved`` from `moved_buckets`, or in
    ``halves``: see `net.net_changes`, whose ``conflict`` rows then ask the caller for another
    pass with more updates ``skipping``, or for one task).

    ``pre`` is the `pre_image`, None when no row of the mirror can be looked up
    (a new mirror, or a run with inserts only).
    """
    def compute(rows: pa.Table, halved: np.ndarray | None = None) -> pa.Table:
        return net_changes(rows, spec, halves=halved, skipping=skipping)  # skipping counts only in halves

    return in_tasks(typed, pre, arrow_schema, out_schema(arrow_schema), compute,
                    spec=spec, tasks=tasks, moved=moved, halves=halves)


#: Threads that convert the batches of one net-change task (`converted`).
CONVERT_THREADS = 2


def converted(batches: Iterable[pa.RecordBatch],
              convert: Callable[[pa.RecordBatch], pa.RecordBatch]) -> list[pa.RecordBatch]:
    """``convert`` of each of ``batches``, in their order: the first in the calling thread, the
    others in `CONVERT_THREADS` threads as they arrive.

    A table's net change needs all of its rows in one task; the largest table's task is often
    the last one running, with the other cores idle. Arrow, NumPy and the compiled kernels let
    go of the GIL, so its conversion spreads over two cores (`bench_wide`'s 518,400 rows:
    3.5-4.6 s of wall clock against 5.2-8.2 s, for about a third more CPU time). A task of
    one batch (small runs) starts no thread. An error stops the task as it did in one thread.
    """
    incoming = iter(batches)
    first = next(incoming, None)
    if first is None:
        return []
    out = [convert(first)]
    second = next(incoming, None)
    if second is None:
        return out
    with ThreadPoolExecutor(CONVERT_THREADS) as pool:
        futures = [pool.submit(convert, second), *(pool.submit(convert, batch) for batch in incoming)]
        out.extend(future.result() for future in futures)
    return out


def converted_net_frame(changes: DataFrame, convert: Callable[[pa.RecordBatch], pa.RecordBatch],
                        spec: TableSpec, arrow_schema: pa.Schema) -> DataFrame:
    """`net_frame` without a pre-image, converting the table's raw change rows in the same task.

    ``changes``: the table's `relation_rows`; ``convert``: `spark.changes.converter`
    (to ``arrow_schema``). The typed rows never become Spark rows: one pass
    through a Python task where converting in tasks of their own and netting
    in another moves every typed row out of Arrow, through a shuffle and back.

    The task reads ``changes``' partitions itself (a coalesce, not a shuffle), so they
    should come from cached rows, as the committed changes of a run do: their filter
    then runs in the task, and no row is written to shuffle files.
    """
    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        table = pa.Table.from_batches(converted(batches, convert), schema=arrow_schema)
        yield from net_changes(table, spec).to_batches(max_chunksize=10_000)

    return changes.coalesce(1).mapInArrow(
        run, from_arrow_schema(out_schema(arrow_schema), prefer_timestamp_ntz=True))


#: Bytes of one Arrow IPC value passed from a converting task to a netting task (`halved_net_frame`),
#: about: a Spark binary value holds under 2 GB.
BLOB_BYTES = 32 << 20


def halved_tasks(rows: int, spec: TableSpec, arrow_schema: pa.Schema, net_task_rows: int) -> int:
    """Tasks of a table's net change in halves (`halved_net_frame`, `by_key` with ``halves``) for
    its ``rows`` change rows: ``ceil(rows / net_task_rows)``, whatever its updates' moves between
    buckets (which `net_tasks` joins into one task). 1 (no halves: `net_tasks` decides) without
    numba, or where no key column can be hashed alike in every task (`keys.key_hashes`:
    fixed-width and byte-string columns).

    Not more tasks where cores are idle: on 2 cores, `bench_wide`'s 518,400 rows in two
    tasks took as long as in one, the tables' other tasks using the cores meanwhile, and the
    halves costing CPU of their own (`benchmarks/README.md`, 2026-12-03)."""
    if not can_hash_keys(spec, arrow_schema):
        return 1
    return max(1, -(-rows // net_task_rows))


def spark_partition_values(tasks: int) -> list[int]:
    """Per partition ``p`` of ``repartition(tasks, column)``, an int that Spark sends there: Spark
    sends a row to ``pmod(hash(column), tasks)``, `spark_hash_int` for an int column."""
    out: dict[int, int] = {}
    value = 0
    while len(out) < tasks:
        out.setdefault(spark_hash_int(value) % tasks, value)
        value += 1
    return [out[p] for p in range(tasks)]


def spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark's ``hash`` of an int (Murmur3 x86 32-bit of its four bytes, seed 42), signed."""
    mask = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    k = rotl((value & mask) * 0xCC9E2D51 & mask, 15) * 0x1B873593 & mask
    h = (rotl(seed ^ k, 13) * 5 + 0xE6546B64) & mask
    h ^= 4
    h = (h ^ (h >> 16)) * 0x85EBCA6B & mask
    h = (h ^ (h >> 13)) * 0xC2B2AE35 & mask
    h ^= h >> 16
    return h - (1 << 32) if h >= 1 << 31 else h


def _blob(batch: pa.RecordBatch) -> pa.Array:
    """``batch`` as one Arrow IPC stream, a binary array of one value (no copy of the stream)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=pa.ipc.IpcWriteOptions(compression="lz4")) as writer:
        writer.write_batch(batch)
    data = sink.getvalue()
    offsets = pa.py_buffer(np.array([0, data.size], np.int32).tobytes())
    return pa.Array.from_buffers(pa.binary(), 1, [None, offsets, data])


def halved_net_frame(changes: DataFrame, convert: Callable[[pa.RecordBatch], pa.RecordBatch],
                     spec: TableSpec, arrow_schema: pa.Schema, tasks: int,
                     skipping: np.ndarray | None = None) -> DataFrame:
    """`converted_net_frame` over ``tasks`` tasks (`halved_tasks`): a task per
    partition of ``changes`` (cached rows: no shuffle before it) converts its raw change rows and
    sends each row to the task of its bucket (`net.in_halves`: an update whose new row is in
    another bucket goes to both as halves), as Arrow IPC values (LZ4) of about `BLOB_BYTES`
    each; then ``tasks`` tasks net a bucket each (`net_changes` with halves).

    The typed rows never become Spark rows: the shuffle moves a few binary values, and both the
    conversion and the net change are spread over tasks, where one task did both for the whole
    table and had to hold all of its rows.
    A bucket whose update finds no row cannot know whether another bucket applied its new row
    (see `net_changes`): it says ``conflict``, and the caller nets the table again with those
    updates ``skipping``.
    """
    partition = spark_partition_values(tasks)
    halved_schema = arrow_schema.append(pa.field(_HALF, pa.int8()))

    def split(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        table = pa.Table.from_batches(converted(batches, convert), schema=arrow_schema)
        parts = in_halves(table, spec, tasks)
        if parts is None:  # the driver found the key hashable (`halved_tasks`): this worker must too
            raise RuntimeError("a table's keys cannot be hashed in this Python worker (is numba installed?)")
        for (part, halves), value in zip(parts, partition):
            part = part.append_column(_HALF, pa.array(halves, pa.int8())).combine_chunks()
            rows = max(1, int(BLOB_BYTES * part.num_rows / max(part.nbytes, 1)))
            for batch in part.to_batches(max_chunksize=rows):
                yield pa.RecordBatch.from_arrays([pa.array([value], pa.int32()), _blob(batch)],
                                                 names=[_PARTITION, _BLOBS])

    def net(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        parts = [pa.ipc.open_stream(blob.as_buffer()).read_all()
                 for batch in batches for blob in batch.column(_BLOBS)]
        table = pa.concat_tables(parts) if parts else halved_schema.empty_table()
        halves = np.asarray(table.column(_HALF).to_numpy(), dtype=np.int8)
        rows = pa.Table.from_arrays(table.columns[:-1], schema=arrow_schema)
        yield from net_changes(rows, spec, halves=halves, skipping=skipping).to_batches(max_chunksize=10_000)

    blobs = changes.mapInArrow(split, f"{_PARTITION} int, {_BLOBS} binary")
    return blobs.repartition(tasks, _PARTITION).mapInArrow(
        net, from_arrow_schema(out_schema(arrow_schema), prefer_timestamp_ntz=True))


_HALF = "__pgoutput_spark_half"
_SPLIT = "__pgoutput_spark_split"
_POSITION = "__pgoutput_spark_position"
_PARTITION = "__pgoutput_spark_partition"
_BLOBS = "__pgoutput_spark_rows"


#: Change rows of a table's run up to which `local_converted_net` converts and nets them on the
#: driver (a run with no history of the table to write and one net-change task: most tables of
#: a small run, whether they look rows up in their mirror or not).
LOCAL_NET_ROWS = 10_000


def local_converted_net(changes: DataFrame, convert: Callable[[pa.RecordBatch], pa.RecordBatch],
                        spec: TableSpec, arrow_schema: pa.Schema, *,
                        look_up: Callable[[DataFrame, T.StructType], DataFrame] | None = None,
                        ) -> tuple[DataFrame, dict[str, dict[str, int]]]:
    """`converted_net_frame` on the driver, for a table with a few change rows: one collect of
    ``changes`` (cached rows) as Arrow, the same conversion and net change here, and the result
    as a local relation that the JVM holds (its write reads it without a task). A small run
    writing many tables saves each a Python task and the job that counted its net change.

    ``look_up``: for a table whose updates and deletes look rows up in its mirror, the
    function from the keys they look up (`looked_up_keys`, as a local relation) and the typed
    rows' Spark schema to those rows (`pre_image`); they are collected in one job, and netted
    with the change rows as `net_frame` nets them in a task.

    Returns the frame and its summary by ``_action``: ``n`` rows, ``ins`` and ``del`` (the
    sums of ``_inserted`` and ``_deleted``), as the caller's aggregate of the task's frame.
    """
    spark = changes.sparkSession
    table = pa.Table.from_batches(converted(changes.toArrow().to_batches(), convert), schema=arrow_schema)
    if look_up is not None:  # only the looked-up keys go to the JVM, not the rows' other values
        keys = looked_up_keys(table, spec)
        keys = spark.createDataFrame(keys, from_arrow_schema(keys.schema, prefer_timestamp_ntz=True))
        rows = look_up(keys, from_arrow_schema(arrow_schema, prefer_timestamp_ntz=True))
        # Positional names: "a.b" is a column name here, not a field.
        pre = rows.toDF(*_positional(arrow_schema).names).toArrow()
        table = pa.concat_tables([table, pa.Table.from_arrays(pre.columns, schema=arrow_schema)])
    net = net_changes(table, spec)
    summary = {r["_action"]: {"n": r["_action_count"], "ins": r["_inserted_sum"], "del": r["_deleted_sum"]}
               for r in net.group_by("_action").aggregate(
                   [("_action", "count"), ("_inserted", "sum"), ("_deleted", "sum")]).to_pylist()}
    # One partition, as the task's: a local relation is spread over the default parallelism,
    # which would write a few rows into as many files.
    frame = spark.createDataFrame(
        net, from_arrow_schema(out_schema(arrow_schema), prefer_timestamp_ntz=True)).coalesce(1)
    return frame, summary


def in_tasks(typed: DataFrame, pre: DataFrame | None, arrow_schema: pa.Schema, result_schema: pa.Schema,
             compute: Callable[..., pa.Table], *, spec: TableSpec | None = None, tasks: int = 1,
             moved: list[tuple[int, int]] | None = None, halves: bool = False) -> DataFrame:
    """``compute`` over all of a table's change rows (and ``pre``) at once, in one Spark task;
    or, with ``tasks`` > 1, over each of ``tasks`` partitions of them by key (`by_key` with
    ``spec`` and ``moved``, or ``halves``: then ``compute`` also gets each row's half)."""
    rows = typed if pre is None else typed.unionByName(pre)
    spread = tasks > 1
    halves = halves and spread
    extra = []
    if spread:
        assert spec is not None
        rows = by_key(rows, spec, tasks, moved or [], halves=halves)
        extra = [_BUCKET, _HALF] if halves else [_BUCKET]
    # mapInArrow resolves its input columns by name, and reads "a.b" as a nested field:
    # hand it positional names and give the batches their real names back inside.
    rows, flags = arrays_without_nulls(rows.toDF(*_positional(arrow_schema).names, *extra))
    rows = rows.repartition(tasks, _BUCKET).drop(_BUCKET) if spread else rows.repartition(1)
    schema = pa.schema([*_positional(arrow_schema), *([pa.field(_HALF, pa.int8())] if halves else []),
                        *[pa.field(f, pa.bool_()) for f in flags]])

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        received = list(batches)  # the flags arrive NOT NULL: take the batches' own schema
        table = pa.Table.from_batches(received) if received else schema.empty_table()
        table = restore_null_arrays(table, flags)
        if halves:
            halved = np.asarray(table.column(_HALF).to_numpy(), dtype=np.int8)
            table = table.drop_columns([_HALF])
            out = compute(pa.Table.from_arrays(table.columns, schema=arrow_schema), halved)
        else:
            out = compute(pa.Table.from_arrays(table.columns, schema=arrow_schema))
        yield from out.to_batches(max_chunksize=10_000)

    return rows.mapInArrow(run, from_arrow_schema(result_schema, prefer_timestamp_ntz=True))


#: Change rows of a table's run per net-change task, by default (`net_frame`'s ``tasks``): a
#: task holds them all at once (the benchmark's Python workers, whose largest task holds
#: `bench_wide`'s 518,400 rows of 20 columns, peak at 2.3-2.8 GB summed).
NET_TASK_ROWS = 1_000_000

#: Key buckets per task when a table's net change is spread over tasks (`by_key`): rows go to
#: tasks by bucket, which Spark hashes again, so many buckets give tasks about as many keys each.
BUCKETS_PER_TASK = 16
_BUCKET = "__pgoutput_spark_bucket"


def _identity(rows: DataFrame, spec: TableSpec, which: str) -> list[Column]:
    """The identity (key) columns of each change row: ``old``, the row it looks up (its old
    key or row where it has one, else its own), or ``new``, the row it leaves (a multiset's
    unchanged TOAST values taken from its old row, as `net.prepare` does)."""
    old, types = F.col("_old"), {f.name: f.dataType for f in rows.schema.fields}
    out = []
    for k in spec.key:
        before, after = old.getField(k).cast(types[k]), F.col(quote(k))
        if which == "old":
            out.append(F.when(old.isNotNull(), before).otherwise(after))
        elif spec.mode == "multiset":
            out.append(F.when(F.array_contains(F.col("_unchanged_toast"), k), before).otherwise(after))
        else:
            out.append(after)
    return out


def _buckets(tasks: int) -> int:
    """Key buckets of a net change spread over ``tasks`` tasks: `moved_buckets`' pairs are
    buckets of this many, so `by_key` must use the same number."""
    return tasks * BUCKETS_PER_TASK


def _bucket(columns: list[Column], buckets: int) -> Column:
    return F.pmod(F.hash(*columns), F.lit(buckets))


def net_tasks(rows: int, updates: int, spec: TableSpec, net_task_rows: int) -> int:
    """Tasks for a table's net change of ``rows`` change rows, ``updates`` of them updates:
    ``ceil(rows / net_task_rows)``, but one for a multiset whose updates would join all its
    buckets anyway (every update of a multiset moves its row to a random bucket, and a random
    graph on B buckets is one group beyond about B ln B / 2 edges): spread, it would still be
    one task, after a conversion of its rows in tasks of their own."""
    tasks = max(1, -(-rows // net_task_rows))
    buckets = _buckets(tasks)
    if tasks > 1 and spec.mode == "multiset" and updates > buckets * math.log(buckets) / 2:
        return 1
    return tasks


def moved_buckets(typed: DataFrame, spec: TableSpec, tasks: int) -> list[tuple[int, int]]:
    """The (from, to) key buckets of `by_key` of the run's updates that move a row to a key
    in another bucket (a key change; for a multiset, any update)."""
    buckets = _buckets(tasks)
    pairs = typed.where((F.col("_op") == "update") & F.col("_old").isNotNull()).select(
        _bucket(_identity(typed, spec, "old"), buckets).alias("a"),
        _bucket(_identity(typed, spec, "new"), buckets).alias("b"))
    return [(r["a"], r["b"]) for r in pairs.where(F.col("a") != F.col("b")).distinct().collect()]


def by_key(rows: DataFrame, spec: TableSpec, tasks: int, moved: list[tuple[int, int]], *,
           halves: bool = False) -> DataFrame:
    """``rows`` (change rows and pre-image) with a bucket (column `_BUCKET`) such that the rows
    of one bucket hold every row of their keys, and a copy of every truncate in every bucket.

    A row goes by the bucket of the key it looks up (`_identity`); buckets that an update
    joins (``moved``, from `moved_buckets`) are one, so that a row's changes before and
    after its key changed meet in one task (`keys.joined_buckets`). Rows in ``halves`` join
    no buckets: an update whose new key is in another bucket goes to both, as its old half in
    its own and its new half in the other (column `_HALF`, `net.in_halves`' rule, by Spark's
    hash).
    """
    buckets = _buckets(tasks)
    every = F.sequence(F.lit(0), F.lit(buckets - 1))
    looks_up = _bucket(_identity(rows, spec, "old"), buckets)
    if halves:
        leaves = _bucket(_identity(rows, spec, "new"), buckets)
        split = (F.col("_op") == "update") & F.col("_old").isNotNull() & (looks_up != leaves)
        bucket = F.when(F.col("_op") == "truncate", every).when(split, F.array(looks_up, leaves)).otherwise(
            F.array(looks_up))
        rows = rows.select("*", split.alias(_SPLIT), F.posexplode(bucket).alias(_POSITION, _BUCKET))
        half = F.when(F.col(_SPLIT), F.col(_POSITION) + 1).otherwise(0).cast("byte")
        return rows.withColumn(_HALF, half).drop(_SPLIT, _POSITION)
    joined = joined_buckets(buckets, moved)
    bucket = F.when(F.col("_op") == "truncate", every).otherwise(F.array(looks_up))
    rows = rows.select("*", F.explode(bucket).alias(_BUCKET))
    if any(b != i for i, b in enumerate(joined)):
        rows = rows.withColumn(_BUCKET, F.element_at(F.array(*[F.lit(b) for b in joined]), F.col(_BUCKET) + 1))
    return rows


#: Names of `arrays_without_nulls`' flag columns: the column, and the field of a struct column.
_FLAG = "__pgoutput_spark_null_{}"


def arrays_without_nulls(frame: DataFrame) -> tuple[DataFrame, dict[str, tuple[str, str | None]]]:
    """``frame`` with each NULL array (top level, or a field of a top-level struct) sent as an
    empty one beside a boolean flag column; a struct with array fields is never NULL either.

    Spark's Arrow writer (Spark 4.0, Arrow Java 18) spends time quadratic in a run of NULL
    array values within an Arrow batch: a NULL ``array<bigint>`` for 500,000 rows costs 3.5 s
    at 10,000 rows per batch, 0.2 s if every other one is NULL (`benchmarks/README.md`).
    Change rows have such runs: the old row of every insert, an array column of every
    delete. Returns the frame and its flags (flag column -> (column, field or None)) for
    `restore_null_arrays`.
    """
    columns: list[Column] = []
    flags: dict[str, tuple[str, str | None]] = {}
    extra: list[Column] = []
    for i, field in enumerate(frame.schema.fields):
        column, t = F.col(f"`{field.name}`"), field.dataType
        if isinstance(t, T.ArrayType):
            flag = _FLAG.format(i)
            flags[flag] = (field.name, None)
            extra.append(column.isNull().alias(flag))
            column = F.coalesce(column, F.array().cast(t))
        elif isinstance(t, T.StructType) and any(isinstance(f.dataType, T.ArrayType) for f in t.fields):
            flag = _FLAG.format(i)
            flags[flag] = (field.name, None)
            extra.append(column.isNull().alias(flag))
            parts = []
            for j, f in enumerate(t.fields):
                value = column.getField(f.name)
                if isinstance(f.dataType, T.ArrayType):
                    inner = _FLAG.format(f"{i}_{j}")
                    flags[inner] = (field.name, f.name)
                    extra.append(value.isNull().alias(inner))
                    value = F.coalesce(value, F.array().cast(f.dataType))
                parts.append(value.alias(f.name))
            column = F.struct(*parts)
        columns.append(column.alias(field.name))
    return (frame.select(*columns, *extra) if flags else frame), flags


def _with_nulls(array: pa.Array, null: pa.Array) -> pa.Array:
    """``array`` (a list or struct array) with NULL where ``null`` is true."""
    if not pc.any(null).as_py():
        return array
    mask = pc.or_(null, array.is_null())
    if isinstance(array, (pa.ListArray, pa.LargeListArray)):
        return type(array).from_arrays(array.offsets, array.values, type=array.type, mask=mask)
    return pa.StructArray.from_arrays(array.flatten(), fields=list(array.type), mask=mask)


def restore_null_arrays(table: pa.Table, flags: dict[str, tuple[str, str | None]]) -> pa.Table:
    """The inverse of `arrays_without_nulls` on the Arrow side: NULLs back, flag columns gone."""
    if not flags:
        return table

    def whole(name: str) -> pa.Array:
        return ab.one_array(table.column(name))

    columns = {name: whole(name) for name in {name for name, _ in flags.values()}}
    for flag, (name, field) in flags.items():  # fields of a struct first, then the struct
        if field is not None:
            struct = columns[name]
            at = struct.type.get_field_index(field)
            children = struct.flatten()
            children[at] = _with_nulls(children[at], whole(flag))
            columns[name] = pa.StructArray.from_arrays(children, fields=list(struct.type))
    for flag, (name, field) in flags.items():
        if field is None:
            columns[name] = _with_nulls(columns[name], whole(flag))
    for name, array in columns.items():
        at = table.schema.get_field_index(name)
        table = table.set_column(at, table.schema.field(at), array)
    return table.drop_columns(list(flags))


def _positional(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_name(f"c{i}") for i, f in enumerate(schema)])
