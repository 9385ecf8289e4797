"""The net change of one table over one run: what a subscriber's table looks like afterwards.

Input is every typed change row of the table in the run (schema of
`pgoutput_spark.assemble.typed.change_schema`) plus the *pre-image*: the
mirror's current rows for the keys the run's updates and deletes look up
(``_op = "pre"``). The changes are applied in commit order the way
PostgreSQL's apply worker applies them (``worker.c``):

- an insert stores the row (an insert of an existing key overwrites it: an
  upsert, where the apply worker would stop on a unique violation);
- an update finds the row by its old key (sent when the key changed, or always
  with ``REPLICA IDENTITY FULL``) or else its new key, and replaces it; columns
  sent as *unchanged TOAST* keep the value the row had;
- a delete removes the row it finds;
- an update or delete that finds no row is skipped and reported (``skipped``);
- a truncate empties the table at its place in the order.

Only the outcome per key leaves this module: one ``upsert`` or ``delete`` per
touched key (keyed tables), or, for tables whose identity is the whole row
(``REPLICA IDENTITY FULL``, or no identity, insert-only), a multiset: identical
rows stay separate rows and an update or delete changes exactly one of them.

The walk over the changes (`walk`, compiled) runs once per change, on integer
key codes; values never leave Arrow: each surviving row is a *provenance*
(which input row each column comes from) and the output columns are built
with one ``take`` per column.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..assemble.typed import data_fields
from ..decoder import arrow as ab
from ..decoder import kernel
from .keys import hashed_alike, key_codes, key_hashes
from .walk import DELETE, INSERT, OPS, TRUNCATE, UPDATE, keyed_walk, multiset_walk

Mode = Literal["keyed", "multiset"]

#: Metadata columns of the output, before the table's data columns.
OUT_FIELDS = [
    pa.field("_action", pa.string()),  # upsert | delete | delete_all | insert | skipped | truncate | conflict
    pa.field("_seq", pa.int64()),  # the change that decided the row (skipped: the skipped change)
    pa.field("_op", pa.string()),  # that change's operation
    pa.field("_reason", pa.string()),  # why a change was skipped
    pa.field("_inserted", pa.int64()),  # multiset tables: net rows added / removed by this row
    pa.field("_deleted", pa.int64()),
]


@dataclass(frozen=True)
class TableSpec:
    """How rows of a table are identified."""

    mode: Mode
    key: tuple[str, ...]  # key columns (keyed) or the identity columns of the whole row (multiset)
    columns: tuple[str, ...]  # every data column of the mirror, in order


def out_schema(data: pa.Schema) -> pa.Schema:
    """Output schema: `OUT_FIELDS` then the data fields of ``data`` (the change schema)."""
    return pa.schema([*OUT_FIELDS, *data_fields(data)])


def _unchanged_pairs(lists: pa.Array, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(row, position in ``names``) of every unchanged-TOAST column, rows in input order."""
    lists = lists.fill_null([]) if lists.null_count else lists
    flat = lists.flatten()
    if len(flat) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    parents = np.asarray(pc.list_parent_indices(lists), dtype=np.int64)
    # A column the mirror does not know cannot be unchanged: index_in gives it NULL.
    positions = pc.index_in(flat, value_set=pa.array(names, pa.string()))
    known = np.asarray(positions.is_valid())
    return parents[known], np.asarray(positions.fill_null(0), dtype=np.int64)[known]


def _unchanged_positions(rows: np.ndarray, positions: np.ndarray) -> dict[int, list[int]]:
    """Row -> positions of its unchanged-TOAST columns, for the rows that have any."""
    out: dict[int, list[int]] = {}
    for row, j in zip(rows.tolist(), positions.tolist()):
        out.setdefault(row, []).append(j)
    return out


def _provenance(prov: Any, j: int) -> int:
    return prov if isinstance(prov, int) else prov[1].get(j, prov[0])


@dataclass
class Prepared:
    """A table's change rows with integer codes for their new and old keys, and their commit order.

    Rows stay where they were (sorting a wide table's values costs more than the whole walk
    over its changes), and in the chunks they came in: a ``take`` of the surviving rows from
    them costs a sixth of joining the chunks first (`bench_wide`'s 518,400 rows, ad hoc).
    ``order`` lists the row indices in commit order, and every row index below, provenances
    included, is a position in ``rows``. Codes are dense: ``0 .. n_codes - 1``.
    """

    rows: pa.Table
    data: dict[str, pa.ChunkedArray]  # the data columns as they came (`values` fills them in)
    old: pa.ChunkedArray  # the ``_old`` struct column
    names: list[str]
    op: np.ndarray  # each row's operation, as its position in `walk.OPS`
    seqs: np.ndarray
    codes: np.ndarray  # new keys' codes (rows 0..n-1), then old keys' (n..2n-1)
    has_old_rows: np.ndarray  # bool: the row carries an old key
    # (row, position in ``names``) of every unchanged-TOAST column (keyed tables), rows ascending
    unchanged_rows: np.ndarray
    unchanged_columns: np.ndarray
    key_arrays: list[pa.ChunkedArray]  # new keys (rows 0..n-1) then old keys (n..2n-1), per key column
    commit_order: np.ndarray  # row indices in commit order
    # A multiset's key columns sent as unchanged TOAST: per column, the rows whose value is their
    # old row's (bool per row). Filled in where values are taken (`values`), and in the key
    # codes by the rows' positions (`key_codes`' ``sources``), never copied whole.
    filled: dict[str, np.ndarray]

    def values(self, name: str, rows: np.ndarray) -> pa.ChunkedArray:
        """Column ``name`` at ``rows`` (positions in the table ``self.rows``), unchanged TOAST
        filled in."""
        index = pa.array(rows, pa.int64())
        values = self.data[name].take(index)
        hit = self.filled.get(name)
        at = hit[rows] if hit is not None else None
        if at is None or not at.any():
            return values
        return pc.if_else(pa.array(at), ab.named_field(self.old, name).take(index), values)

    @property
    def n_codes(self) -> int:
        return int(self.codes.max()) + 1 if self.codes.size else 0

    def first_positions(self, codes: np.ndarray) -> np.ndarray:
        """Where each of ``codes`` is first seen among the key arrays (new keys, then old keys)."""
        unique, where = np.unique(self.codes, return_index=True)
        return where[np.searchsorted(unique, codes)]

    # The same as Python lists and dicts, for the history's walk (`history.history_changes`).
    @cached_property
    def ops(self) -> list[str]:
        return [OPS[o] for o in self.op.tolist()]

    @cached_property
    def new_code(self) -> list[int]:
        codes: list[int] = self.codes[:self.rows.num_rows].tolist()
        return codes

    @cached_property
    def old_code(self) -> list[int]:
        codes: list[int] = self.codes[self.rows.num_rows:].tolist()
        return codes

    @cached_property
    def has_old(self) -> list[bool]:
        has: list[bool] = self.has_old_rows.tolist()
        return has

    @cached_property
    def order(self) -> list[int]:
        order: list[int] = self.commit_order.tolist()
        return order

    @cached_property
    def unchanged(self) -> dict[int, list[int]]:
        """Row -> positions of its unchanged-TOAST columns, for the rows that have any."""
        return _unchanged_positions(self.unchanged_rows, self.unchanged_columns)


def _op_numbers(ops: pa.ChunkedArray) -> np.ndarray:
    numbers = pc.index_in(ops, value_set=pa.array(OPS, pa.string()))
    if numbers.null_count:
        bad = ops.filter(pc.is_null(numbers))[0]
        raise ValueError(f"a change row's _op is {bad}: expected one of {', '.join(OPS)}")
    return np.asarray(numbers.to_numpy(), dtype=np.int8) if len(ops) else np.zeros(0, np.int8)


def _filled(spec: TableSpec, names: list[str], unchanged_rows: np.ndarray, unchanged_columns: np.ndarray,
            n: int) -> dict[str, np.ndarray]:
    """A multiset's key columns sent as unchanged TOAST: per column, the rows whose value is
    their old row's (the whole row is the identity)."""
    filled = {}
    for j in np.unique(unchanged_columns).tolist():
        name = names[j]
        if name in spec.key:
            hit = np.zeros(n, dtype=bool)
            hit[unchanged_rows[unchanged_columns == j]] = True
            filled[name] = hit
    return filled


def _keys(spec: TableSpec, data: dict[str, pa.ChunkedArray], old: pa.ChunkedArray, filled: dict[str, np.ndarray],
          n: int) -> tuple[list[pa.ChunkedArray], list[np.ndarray | None]]:
    """Per key column, its new keys (rows 0..n-1) then old keys (rows n..2n-1) as one array, and
    the `key_codes` ``sources`` that code a filled new key as its old row's (row n + i)."""
    key_arrays = [pa.chunked_array([*data[k].chunks, *ab.named_field(old, k).cast(data[k].type).chunks], data[k].type)
                  for k in spec.key]
    sources: list[np.ndarray | None] = []
    for k in spec.key:
        source = None
        if k in filled:
            source = np.arange(2 * n)
            source[np.flatnonzero(filled[k])] += n
        sources.append(source)
    return key_arrays, sources


def prepare(rows: pa.Table, spec: TableSpec) -> Prepared:
    """Find the commit order of ``rows`` and code their keys (shared by the mirror and its history)."""
    n = rows.num_rows
    seqs = rows.column("_seq").to_numpy()
    order = np.lexsort((seqs, rows.column("_commit_seq").to_numpy())).astype(np.int64)
    names = list(spec.columns)
    data = {name: rows.column(name) for name in names}
    op = _op_numbers(rows.column("_op"))
    old = rows.column("_old")
    has_old = np.asarray(pc.is_valid(old)) if n else np.zeros(0, dtype=bool)
    unchanged_rows, unchanged_columns = _unchanged_pairs(ab.one_array(rows.column("_unchanged_toast")), names) \
        if n else (np.zeros(0, np.int64), np.zeros(0, np.int64))

    filled: dict[str, np.ndarray] = {}
    if spec.mode == "multiset":
        filled = _filled(spec, names, unchanged_rows, unchanged_columns, n)
        unchanged_rows, unchanged_columns = np.zeros(0, np.int64), np.zeros(0, np.int64)
    key_arrays, sources = _keys(spec, data, old, filled, n)
    codes = key_codes(key_arrays, sources=sources) if spec.key else np.zeros(2 * n, dtype=np.int64)
    return Prepared(rows, data, old, names, op, seqs, np.asarray(codes, dtype=np.int64), has_old,
                    unchanged_rows, unchanged_columns, key_arrays, order, filled)


#: `net_changes`' ``halves``: a whole change row, the old half of an update (the row it takes
#: away), its new half (the row it leaves).
WHOLE, OLD_HALF, NEW_HALF = 0, 1, 2

#: The reasons of ``conflict`` rows (`net_changes` with ``halves``): an update's old half that
#: found no row (`net_changes`' ``skipping`` settles it), a new half whose unchanged-TOAST values
#: are in its old half's task (only one task settles that).
CONFLICT_REASON = ("the row an update looks up is not there, and its new row went to another task: "
                   "the table's net change must be computed again without that new row")
TOAST_CONFLICT_REASON = ("an update moves a row to another task's key, leaving a TOAST column unchanged: "
                         "the table's net change must be computed in one task")


def net_changes(rows: pa.Table, spec: TableSpec, *, halves: np.ndarray | None = None,
                skipping: np.ndarray | None = None) -> pa.Table:
    """The net outcome of a run for one table (see module doc). ``rows`` need not be sorted.

    ``halves`` (rows spread over tasks by the key each change looks up, `in_halves`; one int8
    per row: `WHOLE`, `OLD_HALF`, `NEW_HALF`): an update whose old and new keys go to different
    tasks comes to each as a half, the old one taking a row away, the new one adding its row.
    Each task nets its halves as if every update elsewhere found its row; it holds the state of
    its own keys (a multiset's: its rows' counts), so that is true when no old half is skipped
    (by induction over the commit order: every change before one finds what it would find in
    one task). A skipped old half is
    the one case where a new half elsewhere was wrongly applied: it comes out as a ``conflict``
    row (`CONFLICT_REASON`). A keyed table's new half with unchanged-TOAST columns (whose values
    are in the old row's task) is one too (`TOAST_CONFLICT_REASON`): the caller nets that table
    again in one task.

    ``skipping``: the seqs of updates known to find no row (an earlier pass's ``conflict`` rows
    of the first kind, ascending). Their new halves are left out, their old halves come out as
    ``skipped``. Leaving rows out can only make later changes find fewer, so each pass's states
    hold every row one task's would: a pass whose old halves all find their rows (no
    ``conflict``) gives what one task gives, skipped changes included.
    """
    rows, halves, known = leave_out(rows, halves, skipping)
    p = prepare(rows, spec)
    if spec.mode == "keyed":
        return _keyed(p, spec, halves, known)
    return _multiset(p, halves, known)


def leave_out(rows: pa.Table, halves: np.ndarray | None,
              skipping: np.ndarray | None) -> tuple[pa.Table, np.ndarray | None, np.ndarray | None]:
    """``rows`` and their ``halves`` without the new halves of the updates ``skipping`` (seqs,
    ascending: updates known to find no row, see `net_changes`), and which of the rows left are
    those updates' old halves and whole rows (None when ``skipping`` is empty or there are no
    halves)."""
    if halves is None or skipping is None or not skipping.size or not rows.num_rows:
        return rows, halves, None
    known = np.isin(np.asarray(rows.column("_seq").to_numpy(), dtype=np.int64), skipping)
    keep = ~(known & (halves == NEW_HALF))
    if keep.all():
        return rows, halves, known
    return rows.filter(pa.array(keep)), halves[keep], known[keep]


def _walk_ops(op: np.ndarray, halves: np.ndarray | None) -> np.ndarray:
    """The operations the walk applies: an old half deletes, a new half inserts."""
    if halves is None or not halves.any():
        return op
    op = op.copy()
    op[halves == OLD_HALF] = DELETE
    op[halves == NEW_HALF] = INSERT
    return op


def _conflicts(skipped: np.ndarray, halves: np.ndarray | None,
               known: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The walk's ``skipped`` changes as (conflicts: the skipped old halves not ``known`` to be
    skipped, the others)."""
    if halves is None or not skipped.size:
        return skipped[:0], skipped
    split = halves[skipped] == OLD_HALF
    if known is not None:
        split &= ~known[skipped]
    return skipped[split], skipped[~split]


def _conflict_frame(schema: pa.Schema, p: Prepared, conflicts: np.ndarray, reason: str) -> pa.Table:
    cols = {name: pa.nulls(conflicts.size, p.data[name].type) for name in p.names}
    return _frame(schema, "conflict", p, conflicts, [reason] * conflicts.size, cols)


def can_hash_keys(spec: TableSpec, schema: pa.Schema) -> bool:
    """Whether `key_hashes` hashes ``spec``'s key columns of ``schema`` (numba, and a fixed-width or
    byte-string key column)."""
    return kernel.numba is not None and any(hashed_alike(schema.field(k).type) for k in spec.key)


def in_halves(rows: pa.Table, spec: TableSpec, buckets: int) -> list[tuple[pa.Table, np.ndarray]] | None:
    """A table's change rows spread over ``buckets`` for `net_changes` with ``halves``: per
    bucket, its rows and their halves. A row goes to the bucket of the key it looks up (its old
    key or row where it carries one, else its own: `rows.by_key`'s rule); an update whose new
    key (a multiset's whole row, unchanged TOAST filled in from the old row) hashes to another
    bucket also goes there, as its `NEW_HALF`, and is an `OLD_HALF` in its own; every truncate
    goes to every bucket.

    Buckets come from `key_hashes`, equal in every task for equal rows. None where there is
    nothing to hash them by (see `key_hashes`): the caller keeps the rows in one task.
    """
    n = rows.num_rows
    names = list(spec.columns)
    data = {name: rows.column(name) for name in names}
    old = rows.column("_old")
    filled = {}
    if spec.mode == "multiset" and n:
        filled = _filled(spec, names, *_unchanged_pairs(ab.one_array(rows.column("_unchanged_toast")), names), n)
    key_arrays, sources = _keys(spec, data, old, filled, n)
    hashes = key_hashes(key_arrays, sources)
    if hashes is None:
        return None
    of = ((hashes >> np.uint64(32)) % np.uint64(buckets)).astype(np.int64)
    op = _op_numbers(rows.column("_op"))
    has_old = np.asarray(pc.is_valid(old)) if n else np.zeros(0, dtype=bool)
    looks_up = np.where(has_old, of[n:], of[:n])
    new = of[:n]
    split = (op == UPDATE) & has_old & (new != looks_up)
    truncates = np.flatnonzero(op == TRUNCATE)
    out = []
    for b in range(buckets):
        whole = np.flatnonzero((looks_up == b) & (op != TRUNCATE))
        added = np.flatnonzero(split & (new == b))
        index = np.concatenate([whole, added, truncates])
        halves = np.concatenate([np.where(split[whole], OLD_HALF, WHOLE), np.full(added.size, NEW_HALF),
                                 np.full(truncates.size, WHOLE)]).astype(np.int8)
        out.append((rows.take(pa.array(index, pa.int64())), halves))
    return out


def _skipped_reason(op: str, unchanged: bool) -> str:
    what = "update" if op == "update" else "delete"
    reason = f"{what} of a row that does not exist (skipped, as PostgreSQL's apply worker does)"
    if unchanged:
        reason += "; its unchanged TOAST values are nowhere to be found"
    return reason


def _keyed(p: Prepared, spec: TableSpec, halves: np.ndarray | None = None,
           known: np.ndarray | None = None) -> pa.Table:
    n = p.rows.num_rows
    slot = np.full(n, -1, dtype=np.int64)
    toasted_rows = np.unique(p.unchanged_rows)  # the rows with unchanged-TOAST columns, ascending
    slot[toasted_rows] = np.arange(toasted_rows.size)
    # unchanged_rows is ascending: each row's pairs (row, column) are one run of them.
    toast_starts = np.append(np.searchsorted(p.unchanged_rows, toasted_rows, side="left"),
                             p.unchanged_rows.size).astype(np.int64)
    pair_columns = p.unchanged_columns.astype(np.int64)
    sources = p.unchanged_rows.astype(np.int64)  # per pair: its own row, until the walk says otherwise
    state, last, listed, skipped, truncated_at = keyed_walk(
        p.commit_order, _walk_ops(p.op, halves), p.codes[:n], p.codes[n:], p.has_old_rows, p.n_codes, slot,
        toast_starts, pair_columns, sources)
    conflicts, skipped = _conflicts(skipped, halves, known)
    # A new half's unchanged TOAST values are in its old half's task.
    toast_conflicts = toasted_rows[halves[toasted_rows] == NEW_HALF] if halves is not None else toasted_rows[:0]
    truncated_at = int(truncated_at)

    now = state[listed]
    upserts = listed[now >= 0]  # a row now: an upsert (it is a change's row, never a "pre" one)
    deletes = listed[now < 0] if truncated_at < 0 else listed[:0]  # after a truncate, it is gone anyway

    parts: list[pa.Table] = []
    schema = out_schema(p.rows.schema)
    if upserts.size:
        rows = state[upserts]
        # The pairs of the upserts' rows: (upsert, column, the row its value comes from).
        first = slot[rows]
        has = np.flatnonzero(first >= 0)
        starts = toast_starts[first[has]]
        sizes = toast_starts[first[has] + 1] - starts
        owner = np.repeat(has, sizes)
        pairs = np.repeat(starts, sizes) + (np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes))
        cols = {}
        for j, name in enumerate(p.names):
            take = rows.copy()
            mine = pair_columns[pairs] == j
            take[owner[mine]] = sources[pairs[mine]]
            cols[name] = p.values(name, take)
        parts.append(_frame(schema, "upsert", p, last[upserts], None, cols))
    if deletes.size:
        positions = pa.array(p.first_positions(deletes))
        cols = {name: pa.nulls(deletes.size, p.data[name].type) for name in p.names}
        for k, arr in zip(spec.key, p.key_arrays):
            cols[k] = arr.take(positions).combine_chunks()
        parts.append(_frame(schema, "delete", p, last[deletes], None, cols))
    if conflicts.size:
        parts.append(_conflict_frame(schema, p, conflicts, CONFLICT_REASON))
    if toast_conflicts.size:
        parts.append(_conflict_frame(schema, p, toast_conflicts, TOAST_CONFLICT_REASON))
    return _ending(parts, schema, p, skipped, slot[skipped] >= 0, truncated_at)


def _ending(parts: list[pa.Table], schema: pa.Schema, p: Prepared, skipped: np.ndarray,
            skipped_toast: np.ndarray | None, truncated_at: int) -> pa.Table:
    """``parts`` with the skipped changes (``skipped_toast``: which have unchanged-TOAST columns)
    and the truncate (if any) added, as one table."""
    if skipped.size:
        parts.append(_skipped_frame(schema, p, skipped, skipped_toast))
    if truncated_at >= 0:
        cols = {name: pa.nulls(1, p.data[name].type) for name in p.names}
        parts.append(_frame(schema, "truncate", p, np.array([truncated_at], np.int64), None, cols))
    return pa.concat_tables(parts) if parts else schema.empty_table()


def _skipped_frame(schema: pa.Schema, p: Prepared, rows: np.ndarray, toast: np.ndarray | None) -> pa.Table:
    """The skipped changes, each with the row it looked for (a delete's old key, an update's new row)."""
    index = pa.array(rows)
    deleting = p.op[rows] == DELETE
    is_delete = pa.array(deleting)
    toasted = np.zeros(rows.size, dtype=bool) if toast is None else toast
    reasons = [_skipped_reason("delete" if d else "update", bool(t))
               for d, t in zip(deleting.tolist(), toasted.tolist())]
    cols = {name: pc.if_else(is_delete, ab.named_field(p.old, name).take(index), p.values(name, rows))
            for name in p.names}
    return _frame(schema, "skipped", p, rows, reasons, cols)


def _multiset(p: Prepared, halves: np.ndarray | None = None, known: np.ndarray | None = None) -> pa.Table:
    n = p.rows.num_rows
    pre, count, rep, last, listed, skipped, truncated_at = multiset_walk(
        p.commit_order, _walk_ops(p.op, halves), p.codes[:n], p.codes[n:], p.has_old_rows, p.n_codes)
    truncated_at = int(truncated_at)
    conflicts, skipped = _conflicts(skipped, halves, known)

    # Per code now holding a count: rows to insert (more than before), or all of the
    # mirror's copies deleted and the ones left inserted again (fewer than before).
    before = np.zeros(listed.size, np.int64) if truncated_at >= 0 else pre[listed]
    final = count[listed]
    changed = final != before
    codes, before, final = listed[changed], before[changed], final[changed]
    grows = final > before
    lines = np.where(grows, final - before, 1 + final)  # output rows per code
    of = np.repeat(np.arange(codes.size), lines)
    starts = np.cumsum(lines) - lines
    first = np.arange(of.size) - starts[of] == 0
    delete_all = first & ~grows[of]
    schema = out_schema(p.rows.schema)
    parts: list[pa.Table] = []
    if of.size:
        index = rep[codes][of]
        cols = {name: p.values(name, index) for name in p.names}
        parts.append(_frame(schema, "", p, last[codes][of], None, cols,
                            actions=np.where(delete_all, 1, 0).astype(np.int32),
                            inserted=grows[of].astype(np.int64),
                            deleted=np.where(delete_all, (before - final)[of], 0).astype(np.int64)))
    if conflicts.size:
        parts.append(_conflict_frame(schema, p, conflicts, CONFLICT_REASON))
    return _ending(parts, schema, p, skipped, None, truncated_at)


def _frame(schema: pa.Schema, action: str, p: Prepared, deciding: np.ndarray, reasons: list[str] | None,
           cols: dict[str, pa.Array], *, actions: np.ndarray | None = None,
           inserted: np.ndarray | None = None, deleted: np.ndarray | None = None) -> pa.Table:
    """Output rows: ``action`` for each (or ``actions``: 0 insert, 1 delete_all), the change that
    decided each (``deciding``: rows of ``p``) and its operation, and ``cols``."""
    m = len(deciding)
    deciding = np.asarray(deciding, dtype=np.int64)
    if actions is not None:
        kind = pa.DictionaryArray.from_arrays(pa.array(actions, pa.int32()), pa.array(["insert", "delete_all"]))
        action_column = kind.cast(pa.string())
    else:
        action_column = pa.array([action] * m, pa.string())
    op_column = pa.DictionaryArray.from_arrays(pa.array(p.op[deciding].astype(np.int32)),
                                               pa.array(OPS, pa.string())).cast(pa.string())
    meta = [
        action_column,
        pa.array(p.seqs[deciding] if m else np.zeros(0, np.int64), pa.int64()),
        op_column,
        pa.array(reasons, pa.string()) if reasons is not None else pa.nulls(m, pa.string()),
        pa.array(inserted if inserted is not None else np.zeros(m, np.int64), pa.int64()),
        pa.array(deleted if deleted is not None else np.zeros(m, np.int64), pa.int64()),
    ]
    data = [cols[f.name].cast(f.type) for f in list(schema)[len(OUT_FIELDS):]]
    return pa.Table.from_arrays([*meta, *data], schema=schema)
