"""History tables (slowly changing dimension, type 2): every version of every row, with its validity.

A table's history holds one row per version of each source row: the row's
columns, then

- ``_valid_from_lsn`` / ``_valid_from_ts``: the commit (LSN, time) that made
  the version;
- ``_valid_to_lsn`` / ``_valid_to_ts``: the commit that replaced or deleted it
  (a later update, a delete, a truncate, or the row moving to another key),
  NULL while it is current;
- ``_is_current``; ``_version_seq``: the capture seq of the change that made
  it (NULL for versions seeded from an existing mirror).

The source table as of an LSN ``L`` is the versions with ``_valid_from_lsn <= L
AND (_valid_to_lsn IS NULL OR L < _valid_to_lsn)``: a transaction is part of
the source at ``L`` when it committed at or before ``L``. Several changes of
one row in one transaction make one version (the row as it was at commit).

Per run, `history_changes` turns a table's change rows (and the history's
current versions of the keys they touch, ``_op = "pre"``, for unchanged TOAST
values) into ``version`` rows (the new versions, closed already when the run
replaced them too) and ``close`` rows (the key of a version from an earlier
run and when it ended). One MERGE (`merge_history`) then closes those versions
and inserts the new ones, idempotent through Delta's transaction identifiers
like the mirror's. Netted in halves (`net.in_halves`), as a mirror's net change can be, an
update between buckets is a close in its old key's task and a new version in its new key's. An
update whose row is not there then says ``conflict``: the versions are computed again without
its new version, as a mirror's net change is (`net.net_changes`' ``skipping``); a key change that
leaves a TOASTed column unchanged says `TOAST_CONFLICT`, and only one task settles it. History
needs a key: a table whose identity is the whole row (``REPLICA IDENTITY FULL`` without a
``tables.keys`` override, or no identity) is refused. A re-snapshot of the table (`slot.snapshot`) brings its
history to the new mirror's rows (`resnapshot_history`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..assemble.typed import change_schema, data_fields
from .net import NEW_HALF, OLD_HALF, TableSpec, _provenance, leave_out, prepare

if TYPE_CHECKING:
    from .schema import SchemaPlan

#: The history's own columns, after the table's columns.
HISTORY_NAMES = ("_valid_from_lsn", "_valid_to_lsn", "_valid_from_ts", "_valid_to_ts", "_is_current",
                 "_version_seq")


def history_fields(timestamp: pa.DataType) -> list[pa.Field]:
    return [pa.field("_valid_from_lsn", pa.int64()), pa.field("_valid_to_lsn", pa.int64()),
            pa.field("_valid_from_ts", timestamp), pa.field("_valid_to_ts", timestamp),
            pa.field("_is_current", pa.bool_()), pa.field("_version_seq", pa.int64())]


def plan_history(spark: Any, path: str, name: str, columns: list[tuple[str, pa.DataType]]) -> SchemaPlan:
    """The schema plan (`schema.plan_schema`) of the history table at ``path`` of the table ``name``
    whose columns are ``columns``: those, then `HISTORY_NAMES`. A type change the history cannot
    follow names the remedy: move it away (the next run starts a new one from the mirror's rows)."""
    from .schema import plan_schema

    timestamp = change_schema(columns).field("_commit_ts").type
    fields = [(f.name, f.type) for f in history_fields(timestamp)]
    return plan_schema(spark, path, f"{name} (history)", [*columns, *fields],
                       remedy="Move the history table away: the next run starts a new one from the mirror's rows")


#: The ``_action`` of `history_changes`' rows for a new half whose unchanged-TOAST values are in
#: its old half's task (``conflict``: an old half that found no row, which another pass settles).
TOAST_CONFLICT = "toast_conflict"


def history_schema(changes: pa.Schema) -> pa.Schema:
    """``_action`` (version | close, or conflict | toast_conflict in halves), the table's
    columns, then `HISTORY_NAMES`."""
    return pa.schema([pa.field("_action", pa.string()), *data_fields(changes),
                      *history_fields(changes.field("_commit_ts").type)])


def history_changes(rows: pa.Table, spec: TableSpec, *, halves: np.ndarray | None = None,
                    skipping: np.ndarray | None = None) -> pa.Table:
    """The run's new versions and the closes of earlier versions, for one keyed table (module doc).

    ``halves`` and ``skipping`` as for `net.net_changes`: an update's old half ends its row's
    version as a delete would, its new half opens the new key's version as an insert would. An
    old half that finds no row comes out as a ``conflict`` row (its seq in ``_version_seq``):
    the caller computes the versions again with it ``skipping`` (its new half left out, its old
    half ignored, as one task ignores an update of a row not there). A new half with
    unchanged-TOAST columns (their values are in the old half's task) comes out as a
    `TOAST_CONFLICT` row: the caller computes the table's history again in one task.
    """
    if spec.mode != "keyed":
        raise ValueError("history needs a keyed table")
    rows, halves, known = leave_out(rows, halves, skipping)
    p = prepare(rows, spec)
    commit_seq = p.rows.column("_commit_seq").to_numpy()
    commit_lsn = p.rows.column("_commit_lsn").to_numpy(zero_copy_only=False)
    commit_ts = p.rows.column("_commit_ts").combine_chunks()
    pre: dict[int, int] = {}  # code -> its "pre" row: the current version of an earlier run
    state: dict[int, Any] = {}  # code -> provenance of the row's values now, or None (no row)
    opened: dict[int, tuple[int, Any]] = {}  # code -> (row that opened the run's version, provenance)
    closed: dict[int, int] = {}  # code -> row that ended the earlier run's version of that key
    versions: list[tuple[Any, int, int | None]] = []  # (provenance, opening row, closing row)
    conflicts: list[int] = []  # old halves that found no row, and their new halves went on elsewhere
    toast: list[int] = []  # new halves whose unchanged-TOAST values are in their old halves' tasks
    half = halves.tolist() if halves is not None else None
    truncated = False

    def close(code: int, i: int) -> None:
        if code in opened:
            start, prov = opened.pop(code)
            if commit_seq[start] != commit_seq[i]:  # else replaced in its own transaction: no version
                versions.append((prov, start, i))
        elif not truncated and code not in closed:
            closed[code] = i  # a no-op if the key had no current version

    for i in p.order:
        op = p.ops[i]
        if op == "pre":
            pre[p.new_code[i]] = i
            continue
        if op == "truncate":
            for code in list(opened):
                close(code, i)
            for code in pre:
                if code not in closed:
                    closed[code] = i
            state.clear()
            truncated = True
            continue
        new = p.new_code[i]
        if half is not None and half[i] == NEW_HALF:  # the row its update leaves: an insert
            if p.unchanged.get(i):
                toast.append(i)
            op = "insert"
        if op == "insert":
            close(new, i)
            state[new] = i
            opened[new] = (i, i)
            continue
        src = p.old_code[i] if p.has_old[i] else new
        current = state[src] if src in state else (None if truncated else pre.get(src))
        if current is None:
            if half is not None and half[i] == OLD_HALF and not (known is not None and known[i]):
                conflicts.append(i)  # its new half went on elsewhere
            continue  # no such row: the mirror skips and records it
        close(src, i)
        state[src] = None
        if op == "delete" or (half is not None and half[i] == OLD_HALF):  # the row its update takes away
            continue
        unchanged = p.unchanged.get(i)
        prov = i if not unchanged else (i, {j: _provenance(current, j) for j in unchanged})
        if new != src:
            close(new, i)
        state[new] = prov
        opened[new] = (i, prov)
    versions += [(prov, start, None) for start, prov in opened.values()]

    schema = history_schema(rows.schema)
    ts_type = schema.field("_valid_from_ts").type
    parts = []
    if versions:
        cols = {name: p.values(name, np.array([_provenance(v[0], j) for v in versions], np.int64))
                for j, name in enumerate(p.names)}
        starts = np.array([v[1] for v in versions], dtype=np.int64)
        ends = [v[2] for v in versions]
        end_index = pa.array([e if e is not None else 0 for e in ends])
        ended = pa.array([e is not None for e in ends])
        meta = {
            "_valid_from_lsn": pa.array(commit_lsn[starts], pa.int64()),
            "_valid_to_lsn": pa.array([int(commit_lsn[e]) if e is not None else None for e in ends], pa.int64()),
            "_valid_from_ts": commit_ts.take(pa.array(starts)).cast(ts_type),
            "_valid_to_ts": pc.if_else(ended, commit_ts.take(end_index),
                                               pa.nulls(len(ends), commit_ts.type)).cast(ts_type),
            "_is_current": pa.array([e is None for e in ends], pa.bool_()),
            "_version_seq": pa.array(p.seqs[starts], pa.int64()),
        }
        parts.append(_table(schema, "version", cols, meta))
    if closed:
        rows_closing = pa.array(list(closed.values()))
        positions = pa.array(p.first_positions(np.fromiter(closed, np.int64, len(closed))))
        cols = {name: pa.nulls(len(closed), p.data[name].type) for name in p.names}
        for k, arr in zip(spec.key, p.key_arrays):
            cols[k] = arr.take(positions).combine_chunks()
        meta = {
            "_valid_from_lsn": pa.nulls(len(closed), pa.int64()),
            "_valid_to_lsn": pa.array(commit_lsn[np.asarray(rows_closing)], pa.int64()),
            "_valid_from_ts": pa.nulls(len(closed), ts_type),
            "_valid_to_ts": commit_ts.take(rows_closing).cast(ts_type),
            "_is_current": pa.array([False] * len(closed), pa.bool_()),
            "_version_seq": pa.nulls(len(closed), pa.int64()),
        }
        parts.append(_table(schema, "close", cols, meta))
    for action, found in (("conflict", conflicts), (TOAST_CONFLICT, toast)):
        if found:
            at = np.array(found, np.int64)
            cols = {name: pa.nulls(at.size, p.data[name].type) for name in p.names}
            meta = {name: pa.nulls(at.size, schema.field(name).type) for name in HISTORY_NAMES}
            meta["_version_seq"] = pa.array(p.seqs[at], pa.int64())
            parts.append(_table(schema, action, cols, meta))
    return pa.concat_tables(parts) if parts else schema.empty_table()


def _table(schema: pa.Schema, action: str, cols: dict[str, pa.Array], meta: dict[str, pa.Array]) -> pa.Table:
    m = len(next(iter(meta.values())))
    arrays = [pa.array([action] * m, pa.string())]
    for f in list(schema)[1:]:
        arrays.append((meta[f.name] if f.name in meta else cols[f.name]).cast(f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


# -- Spark ------------------------------------------------------------------------------------------


def history_frame(typed: Any, pre: Any, spec: TableSpec, arrow_schema: pa.Schema, *, tasks: int = 1,
                  moved: list[tuple[int, int]] | None = None, halves: bool = False,
                  skipping: np.ndarray | None = None) -> Any:
    """`history_changes` of a table's run in one Spark task, or in ``tasks`` by key (as
    `rows.net_frame`: a key's versions depend on its own changes and the truncates only), the
    buckets an update moves a row between joined (``moved``) or the update in ``halves``
    (then ``conflict`` rows ask for another pass with more updates ``skipping``, and a
    `TOAST_CONFLICT` row for one task, see `history_changes`)."""
    from .rows import in_tasks

    def compute(rows: pa.Table, halved: np.ndarray | None = None) -> pa.Table:
        return history_changes(rows, spec, halves=halved, skipping=skipping)

    return in_tasks(typed, pre, arrow_schema, history_schema(arrow_schema), compute, spec=spec, tasks=tasks,
                    moved=moved, halves=halves)


def merge_history(session: Any, path: str, source: Any, spec: TableSpec, *, app_id: str, version: int,
                  metadata: dict[str, Any]) -> dict[str, int]:
    """One idempotent MERGE: close the current versions of the keys of ``close`` rows, insert
    ``version`` rows. A Delta transaction of our own (`merge.merge_listed`) where the history's
    checksum lists its files, as a mirror's MERGE; otherwise Delta's MERGE."""
    from delta.tables import DeltaTable

    from pyspark.sql import functions as F

    from .merge import delta_ranges, execute_merge, merge_condition, merge_listed
    from .names import quote

    columns = [*spec.columns, *HISTORY_NAMES]

    def run() -> dict[str, int]:  # on the table as it is now (see `execute_merge`)
        counts = merge_listed(session, path, source, spec, truncated=False, app_id=app_id, version=version,
                              history=True)
        if counts is not None:
            return {"versions": counts["inserted"], "closed": counts["updated"]}
        condition = F.expr(merge_condition(spec, history=True))
        narrowed = delta_ranges(session, path, source, spec, history=True)
        result = (DeltaTable.forPath(session, path).alias("t").merge(
                      source.alias("s"), condition if narrowed is None else condition & narrowed)
                  .whenMatchedUpdate(set={"_valid_to_lsn": "s._valid_to_lsn", "_valid_to_ts": "s._valid_to_ts",
                                          "_is_current": "false"})
                  .whenNotMatchedInsert("s._action = 'version'", {quote(c): f"s.{quote(c)}" for c in columns})
                  .execute())
        row = result.first() if result is not None else None
        return {"versions": row["num_inserted_rows"] if row else 0, "closed": row["num_updated_rows"] if row else 0}

    return execute_merge(session, run, path=path, app_id=app_id, version=version, metadata=metadata)


def resnapshot_history(session: Any, path: str, mirror: str, key: tuple[str, ...], *, lsn: int, at: Any,
                       app_id: str, metadata: dict[str, Any]) -> dict[str, int]:
    """Bring the history at ``path`` to the re-snapshot just written to the mirror at ``mirror``,
    in one idempotent MERGE (`merge_history`; transaction identifier ``app_id``, version ``lsn``).

    The versions valid at ``lsn`` become the mirror's rows: a current version whose key the
    mirror lacks, or whose values differ from the mirror's row in one of the mirror's columns,
    is closed at ``lsn`` (time ``at``); the mirror's rows that no current version equals are
    new versions valid from ``lsn`` (time ``at``; ``_version_seq`` NULL: no change made them),
    NULL in the history's columns the mirror no longer has. A current version equal to its row
    stays as it is. The history's schema must hold the mirror's columns (`apply_schema` first).
    Returns the versions ``closed`` and ``opened``.
    """
    from functools import reduce

    from pyspark.sql import functions as F

    from ..spark.session import release
    from .names import quote

    history = session.read.format("delta").load(path)
    snapshot = session.read.format("delta").load(mirror)
    types = {f.name: f.dataType for f in history.schema.fields}
    data = [name for name in history.columns if name not in HISTORY_NAMES]
    shared = [name for name in snapshot.columns if name in types]

    def c(name: str) -> Any:
        return F.col(f"c.{quote(name)}")

    def s(name: str) -> Any:
        return F.col(f"s.{quote(name)}")

    joined = history.where(F.col("_is_current")).alias("c").join(
        snapshot.alias("s"), [c(k) == s(k) for k in key], "full_outer")
    had = F.col("c._is_current").isNotNull()
    has = reduce(lambda a, b: a & b, [s(k).isNotNull() for k in key])
    same = reduce(lambda a, b: a & b, [c(name).eqNullSafe(s(name).cast(types[name])) for name in shared])
    at_ts = F.lit(at).cast(types["_valid_to_ts"])
    none_lsn, none_ts = F.lit(None).cast("long"), F.lit(None).cast(types["_valid_to_ts"])
    closes = joined.where(had & (~has | ~same)).select(
        F.lit("close").alias("_action"),
        *[(c(name) if name in key else F.lit(None).cast(types[name])).alias(name) for name in data],
        none_lsn.alias("_valid_from_lsn"), F.lit(lsn).cast("long").alias("_valid_to_lsn"),
        none_ts.alias("_valid_from_ts"), at_ts.alias("_valid_to_ts"), F.lit(False).alias("_is_current"),
        none_lsn.alias("_version_seq"))
    opens = joined.where(has & (~had | ~same)).select(
        F.lit("version").alias("_action"),
        *[(s(name).cast(types[name]) if name in shared else F.lit(None).cast(types[name])).alias(name)
          for name in data],
        F.lit(lsn).cast("long").alias("_valid_from_lsn"), none_lsn.alias("_valid_to_lsn"),
        at_ts.alias("_valid_from_ts"), none_ts.alias("_valid_to_ts"), F.lit(True).alias("_is_current"),
        none_lsn.alias("_version_seq"))
    # Read once, from the versions as they are before the MERGE changes them.
    source = closes.unionByName(opens).persist()
    try:
        counts = {r["_action"]: r["n"] for r in source.groupBy("_action").agg(F.count(F.lit(1)).alias("n")).collect()}
        if counts:
            merge_history(session, path, source, TableSpec("keyed", key, tuple(data)), app_id=app_id,
                          version=lsn, metadata=metadata)
    finally:
        release(source)
    return {"closed": counts.get("close", 0), "opened": counts.get("version", 0)}
