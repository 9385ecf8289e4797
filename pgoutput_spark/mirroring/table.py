"""One table's part of an `apply` run: its schema plan and key, its net change (on the driver,
in one task, or spread over tasks, in halves), its history's versions, and its write into the
mirror (a MERGE, or an append where no mirror row can match).

`pgoutput_spark.apply` plans every table before writing any, then writes them in parallel,
each through `mirror_table`.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ..assemble.relations import RelationHistory
from ..assemble.typed import change_schema
from ..config import TablesConfig
from ..errors import ConfigError
from ..ledger import Ledger
from ..results import TableResult, timed
from ..spark.changes import converter, relation_rows, typed_change_frame
from ..spark.session import release
from .delta import append, txn_append
from .deltalog import applied_commit, recorded_commits
from .history import TOAST_CONFLICT, history_frame, merge_history, plan_history
from .merge import merge
from .names import mirror_path, quote
from .net import TOAST_CONFLICT_REASON, TableSpec
from .rows import (
    LOCAL_NET_ROWS,
    NET_TASK_ROWS,
    converted_net_frame,
    halved_net_frame,
    halved_tasks,
    local_converted_net,
    looked_up,
    moved_buckets,
    net_frame,
    net_tasks,
    pre_image,
)
from .schema import SchemaPlan, apply_schema, plan_schema, table_spec

_log = logging.getLogger(__name__)
_step = partial(timed, _log)


def schema_plan(spark: SparkSession, root: str, history: RelationHistory, oid: int,
                table_path: str, first_seq: int | None = -1) -> SchemaPlan:
    """The mirror's schema plan for a run whose first change of the table to write is at
    ``first_seq`` (None: it writes none; -1: every version's columns, as a replay from the start)."""
    first = history.relations[oid][0]  # a renamed table keeps the mirror it started with
    latest = history.latest(oid)
    return plan_schema(spark, mirror_path(root, first.namespace, first.name, table_path),
                       f"{latest.namespace}.{latest.name}", history.table_columns(oid),
                       carried=history.columns_since(oid, first_seq))


def mirror_spec(history: RelationHistory, oid: int, plan: SchemaPlan, tables: TablesConfig) -> TableSpec:
    """How the mirror's rows are identified: the replica identity, or the ``tables.keys`` override."""
    columns = [c for c, _ in plan.columns]
    spec = table_spec(history.latest(oid), columns)
    name = history.first_name(oid)
    key = tables.keys.get(name)
    if key is None:
        return spec
    if spec.mode == "keyed":
        raise ConfigError(f"tables.keys.{name}: {name} has a replica identity key ({', '.join(spec.key)}), "
                          f"which is its key; a key override is for a table without one "
                          f"(REPLICA IDENTITY FULL or NOTHING, or no primary key); nothing was written")
    missing = [c for c in key if c not in columns]
    if missing:
        raise ConfigError(f"tables.keys.{name}: no column {', '.join(missing)} in {name} "
                          f"(its columns: {', '.join(columns)}); nothing was written")
    return TableSpec("keyed", tuple(key), tuple(columns))


def history_plan(spark: SparkSession, root: str, history: RelationHistory, oid: int, plan: SchemaPlan,
                 tables: TablesConfig, template: str) -> SchemaPlan:
    """The schema plan of a table's history table; `ConfigError` for a table without a key."""
    name = history.first_name(oid)
    spec = mirror_spec(history, oid, plan, tables)
    if spec.mode != "keyed":
        raise ConfigError(f"tables.history: {name} has no key (its replica identity is the whole row), so "
                          f"its rows have no versions to follow; give it one with tables.keys; nothing was written")
    first = history.relations[oid][0]
    return plan_history(spark, mirror_path(root, first.namespace, first.name, template), name,
                        plan.columns)


def _write_history(session: SparkSession, pipeline: str, typed: DataFrame, past: SchemaPlan, plan: SchemaPlan,
                   spec: TableSpec, arrow_schema: Any, kinds: dict[str, int], app_id: str, to_lsn: int,
                   metadata: dict[str, Any], tasks: int, moved: list[tuple[int, int]],
                   halves: bool = False, name: str = "") -> tuple[int, bool]:
    """The run's versions into the history table (created, or seeded from an existing mirror, first),
    computed in ``tasks`` tasks (``moved`` and ``halves`` as for `net_frame`): their number, and
    whether the halves needed one task in the end (`history_changes`' conflicts: passes without
    the new versions of updates that found no row, as a mirror's net change in halves takes;
    one task for a key change that leaves a TOASTed column unchanged, or after `HALVES_PASSES`)."""
    seed = not past.exists and plan.exists
    apply_schema(session, past)
    if seed:  # history starts now: the mirror's rows are the current versions, from where it stands
        commits = recorded_commits(session, plan.path, pipeline)
        since = commits[-1][1] if commits else 0
        rows = session.read.format("delta").load(plan.path).select(
            *[F.col(quote(c)) for c in spec.columns],
            F.lit(since).cast("long").alias("_valid_from_lsn"), F.lit(None).cast("long").alias("_valid_to_lsn"),
            F.lit(None).cast("timestamp").alias("_valid_from_ts"), F.lit(None).cast("timestamp").alias("_valid_to_ts"),
            F.lit(True).alias("_is_current"), F.lit(None).cast("long").alias("_version_seq"))
        txn_append(rows, past.path, app_id, since)
    pre = None
    if past.exists or seed:
        if kinds.keys() & {"update", "delete", "truncate"}:
            keys = None if "truncate" in kinds else looked_up(typed, spec)  # a truncate ends every version
            pre = pre_image(session, past.path, keys, typed.schema, spec, current_only=True)

    def computed(tasks: int, skipping: np.ndarray | None = None) -> tuple[DataFrame, dict[str, int]]:
        changes = history_frame(typed, pre, spec, arrow_schema, tasks=tasks, moved=moved, halves=halves,
                                skipping=skipping).persist()
        try:
            return changes, {r["_action"]: r["n"] for r in
                             changes.groupBy("_action").agg(F.count(F.lit(1)).alias("n")).collect()}
        except BaseException:
            release(changes)
            raise

    changes, counts = computed(tasks)
    try:
        skipping = np.zeros(0, np.int64)
        passes, one_task = 1, False
        while "conflict" in counts or TOAST_CONFLICT in counts:  # in halves: see `history_changes`
            found = None if TOAST_CONFLICT in counts else np.unique(np.asarray(
                changes.where(F.col("_action") == "conflict").select("_version_seq").toArrow()
                .column(0).to_numpy(), dtype=np.int64))
            release(changes)
            if found is None or passes == HALVES_PASSES:
                _log.info("%s (history): %s, computed in %d tasks (%d passes): computed again in one", name,
                          "an update moved a row to another task's key with a TOAST column unchanged"
                          if found is None else "updates of rows not there still found", tasks, passes)
                one_task = True
                changes, counts = computed(1)
                break
            skipping = np.union1d(skipping, found)
            _log.info("%s (history): %d updates of rows not there, computed in %d tasks: computed again "
                      "without their new versions", name, found.size, tasks)
            passes += 1
            changes, counts = computed(tasks, skipping)
        merge_history(session, past.path, changes, spec, app_id=app_id, version=to_lsn, metadata=metadata)
    finally:
        release(changes)
    return counts.get("version", 0), one_task


def converted_net(session: SparkSession, committed: DataFrame, oid: int, history: RelationHistory,
                  spec: TableSpec, arrow_schema: pa.Schema, *, tuples: bool, tasks: int = 1,
                  skipping: np.ndarray | None = None) -> DataFrame:
    """A table's committed change rows converted and netted in one task (`converted_net_frame`),
    or in ``tasks`` tasks in halves (`halved_net_frame`, ``skipping`` as there); ``tuples`` as for
    `relation_rows`."""
    changes = relation_rows(committed, oid, tuples=tuples, transactions=False)
    convert = converter(session, oid, history, arrow_schema)
    if tasks > 1:
        return halved_net_frame(changes, convert, spec, arrow_schema, tasks, skipping)
    return converted_net_frame(changes, convert, spec, arrow_schema)


def mirror_table(session: SparkSession, ledger: Ledger, committed: DataFrame, history: RelationHistory,
                 oid: int, plan: SchemaPlan, kinds: dict[str, int], n_changes: int, to_lsn: int,
                 metadata: dict[str, Any], redone: bool, spec: TableSpec,
                 past: SchemaPlan | None = None, tuples: bool = False,
                 net_task_rows: int = NET_TASK_ROWS) -> TableResult:
    """Net change and write of one table: a MERGE, or an append where no mirror row can match.

    ``kinds``: the run's message types for the table (insert, update, delete, truncate), with
    their numbers of change rows;
    ``n_changes``: its number of change rows (``net_task_rows`` of them per net-change task).
    ``past``: the plan of the table's history table, if it has one: written first (a redone
    run then finds the mirror as the history's versions left it).
    ``tuples``: some change rows carry their tuples in ``change`` (see `relation_rows`).
    """
    latest = history.latest(oid)
    name = f"{latest.namespace}.{latest.name}"
    app_id = f"{ledger.pipeline}:relation:{oid}"
    history_app_id = f"{ledger.pipeline}:history:{oid}"
    # Only a redone slice can find its merge committed (a fresh slice has a new commit LSN).
    done = applied_commit(session, plan.path, app_id, to_lsn) if redone else None
    # A history's MERGE commits before its mirror's: the versions an interrupted run wrote.
    history_done = (applied_commit(session, past.path, history_app_id, to_lsn)
                    if redone and past is not None else None)
    versions = history_done["inserted"] if history_done is not None else None
    if done is not None and (past is None or history_done is not None):  # merged before the run was interrupted
        return TableResult(name, plan.path, oid, done["inserted"], done["updated"], done["deleted"],
                           status="already applied", history=versions)
    if plan.exists:  # a new mirror is created by its first append, in the same commit
        with _step(f"{name}: schema"):
            apply_schema(session, plan)
    arrow_schema = change_schema(plan.columns)
    # Only updates and deletes look rows up; a mirror this run created has none to find.
    looks_up = plan.exists and bool(kinds.keys() & {"update", "delete"})
    tasks = net_tasks(n_changes, kinds.get("update", 0), spec, net_task_rows)
    # The net change, and a history's versions, in halves (`halved_tasks`), where `net_tasks`
    # joins the buckets an update moves a row between; without a history, the rows converted
    # in the same tasks where none are looked up.
    halved = halved_tasks(n_changes, spec, arrow_schema, net_task_rows)
    tasks = max(tasks, halved)
    # No history, one task, a few rows: convert, look up and net on the driver. Otherwise
    # nothing to look up, no history, one task: convert and net in it (`converted_net_frame`).
    local = past is None and tasks == 1 and n_changes <= LOCAL_NET_ROWS
    fused = not looks_up and past is None and (tasks == 1 or halved > 1)
    typed = None if fused or local else typed_change_frame(  # read more than once
        committed, oid, history, columns=plan.columns, rows=n_changes, tuples=tuples).persist()
    try:
        moved: list[tuple[int, int]] = []
        if tasks > 1 and "update" in kinds and halved == 1:
            assert typed is not None
            with _step(f"{name}: updates that move rows between keys"):
                moved = moved_buckets(typed, spec, tasks)  # buckets joined: some tasks may get no rows
        if past is not None and history_done is None:
            assert typed is not None
            with _step(f"{name}: history"):
                versions, one_task = _write_history(session, ledger.pipeline, typed, past, plan, spec,
                                                    arrow_schema, kinds, history_app_id, to_lsn, metadata, tasks,
                                                    moved, halves=halved > 1, name=name)
            if one_task:  # the mirror's halves would need one task as well: its rows are the history's current ones
                tasks = 1
        if done is not None:
            return TableResult(name, plan.path, oid, done["inserted"], done["updated"], done["deleted"],
                               status="already applied", history=versions)
        if local:  # a few rows: on the driver, no task
            with _step(f"{name}: convert, {'pre-image, ' if looks_up else ''}net change on the driver"):
                net, summary = local_converted_net(
                    relation_rows(committed, oid, tuples=tuples, transactions=False),
                    converter(session, oid, history, arrow_schema, local=True), spec, arrow_schema,
                    look_up=((lambda keys, schema: pre_image(session, plan.path, keys, schema, spec))
                             if looks_up else None))
        else:
            def netted(tasks: int, skipping: np.ndarray | None = None) -> DataFrame:
                if fused:
                    return converted_net(session, committed, oid, history, spec, arrow_schema, tuples=tuples,
                                         tasks=tasks, skipping=skipping)
                assert typed is not None
                pre = pre_image(session, plan.path, looked_up(typed, spec), typed.schema, spec) if looks_up else None
                return net_frame(typed, pre, spec, arrow_schema, tasks=tasks, moved=moved, halves=halved > 1,
                                 skipping=skipping)

            net, summary = _summarized(name, netted(tasks))
            skipping = np.zeros(0, np.int64)
            passes = 1
            while "conflict" in summary:  # netted in halves, an update found no row
                found = _missing_rows(net)
                release(net)
                if found is None or passes == HALVES_PASSES:
                    _log.info("%s: %s, netted in %d tasks (%d passes): netted again in one", name,
                              "an update moved a row to another task's key with a TOAST column unchanged"
                              if found is None else "updates of rows not there still found", tasks, passes)
                    tasks = 1
                    net, summary = _summarized(name, netted(1))
                    break
                skipping = np.union1d(skipping, found)
                _log.info("%s: %d updates of rows not there, netted in %d tasks: netted again without their new "
                          "rows", name, found.size, tasks)
                passes += 1
                net, summary = _summarized(name, netted(tasks, skipping))
        try:
            truncated = "truncate" in summary
            n_skipped = summary["skipped"]["n"] if "skipped" in summary else 0
            if n_skipped:
                data = [F.col(quote(c)) for c in spec.columns]
                skipped = net.where(F.col("_action") == "skipped").select(
                    F.lit(name).alias("table"), F.lit(oid).cast("long").alias("relation_id"),
                    F.col("_seq").alias("seq"), F.col("_op").alias("op"), F.col("_reason").alias("reason"),
                    F.to_json(F.struct(*data)).alias("row"))
                with ledger.skipped_lock:
                    txn_append(skipped, ledger.skipped_path, f"{ledger.pipeline}:skipped:{oid}", to_lsn)
            changes = [a for a in summary if a not in ("skipped", "truncate")]
            counts = {"inserted": 0, "updated": 0, "deleted": 0}
            # Nothing to match: a new mirror (empty whatever the run did), or a multiset taking
            # only inserts. An append is one job where a MERGE is about a dozen.
            appends = not plan.exists or (spec.mode == "multiset" and not truncated
                                          and set(changes) <= {"insert"})
            if appends:
                n_rows = sum(summary[a]["n"] for a in ("upsert", "insert") if a in summary)
                if n_rows or not plan.exists:
                    source = net.where(F.col("_action").isin("upsert", "insert"))
                    with _step(f"{name}: append"):
                        append(plan.path, source, spec, app_id=app_id, version=to_lsn, metadata=metadata,
                               create=not plan.exists)
                counts = {"inserted": n_rows, "updated": 0, "deleted": 0}
            elif changes or truncated:
                source = net.where(F.col("_action").isin("upsert", "delete", "delete_all", "insert"))
                with _step(f"{name}: MERGE"):
                    counts = merge(session, plan.path, source, spec, truncated=truncated, app_id=app_id,
                                   version=to_lsn, metadata=metadata)
            if spec.mode == "multiset" and (changes or truncated):  # an update: a delete, an insert
                counts = {"inserted": sum(r["ins"] or 0 for r in summary.values()), "updated": 0,
                          "deleted": counts["deleted"] if truncated else
                          sum(r["del"] or 0 for r in summary.values())}
            return TableResult(name, plan.path, oid, counts["inserted"], counts["updated"], counts["deleted"],
                               skipped=n_skipped, truncated=truncated,
                               history=versions, tasks=tasks)
        finally:
            release(net)
    finally:
        if typed is not None:
            release(typed)


#: Passes of a table's net change in halves (and of a history's versions), each of which may
#: find more updates of rows not there (`net.net_changes`' ``skipping``: leaving their new rows
#: out can make later updates miss theirs), before the table is netted in one task.
HALVES_PASSES = 4


def _missing_rows(net: DataFrame) -> np.ndarray | None:
    """The seqs of the updates that found no row in ``net`` (a net change in halves: its
    ``conflict`` rows), ascending; None if a conflict needs the table in one task (an update that
    moved a row to another task's key with an unchanged-TOAST column)."""
    conflicts = net.where(F.col("_action") == "conflict").select("_seq", "_reason").toArrow()
    if pc.any(pc.equal(conflicts.column("_reason"), TOAST_CONFLICT_REASON)).as_py():
        return None
    return np.unique(np.asarray(conflicts.column("_seq").to_numpy(), dtype=np.int64))


def _summarized(name: str, net: DataFrame) -> tuple[DataFrame, dict[str, dict[str, int]]]:
    """``net`` persisted, and its summary by ``_action`` (the job that computes it): ``n`` rows,
    ``ins`` and ``del`` (the sums of ``_inserted`` and ``_deleted``), as `local_converted_net`'s.
    Released again if that job fails."""
    net = net.persist()
    try:
        with _step(f"{name}: convert, pre-image, net change"):
            return net, {r["_action"]: r.asDict() for r in net.groupBy("_action").agg(
                F.count(F.lit(1)).alias("n"), F.sum("_inserted").alias("ins"),
                F.sum("_deleted").alias("del")).collect()}
    except BaseException:
        release(net)
        raise
