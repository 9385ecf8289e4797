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

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..assemble.typed import data_fields
from ..decoder import arrow as ab
from ..decoder import kernel
from .walk import (DELETE, HASH_SEED, INSERT, OPS, TRUNCATE, UPDATE, hash_bytes, hash_words, keyed_walk,
                   multiset_walk, number_hashes, same_bytes, same_words)

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


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _hashable(v)) for k, v in value.items())
    return value


def _dense(codes: np.ndarray) -> np.ndarray:
    """Codes renumbered 0..k-1 (equal stays equal)."""
    return np.unique(codes, return_inverse=True)[1].reshape(-1).astype(np.int64)


def _validity(values: pa.Array) -> pa.Buffer | None:
    return pa.array(np.asarray(values.is_valid())).buffers()[1] if values.null_count else None


def _column_codes(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """One integer per value, equal for equal values (NULL equal to NULL), vectorized for nested types."""
    kind = values.type
    if isinstance(values, pa.ChunkedArray):
        if not (pa.types.is_nested(kind) or pa.types.is_dictionary(kind)):
            # The chunks share one dictionary: no copy of the values into one array.
            try:
                encoded = pc.dictionary_encode(values, null_encoding="encode")
                return np.concatenate([np.asarray(c.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
                                       for c in encoded.chunks] or [np.zeros(0, np.int64)])
            except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
                pass
        values = values.combine_chunks()
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        # Each list as the bytes of its elements' codes; then codes of those byte strings.
        lengths = pc.fill_null(pc.list_value_length(values), 0).to_numpy(zero_copy_only=False)
        elements = _column_codes(pc.list_flatten(values)) if lengths.sum() else np.zeros(0, np.int64)
        offsets = np.zeros(len(values) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        packed = pa.LargeBinaryArray.from_buffers(
            pa.large_binary(), len(values),
            [_validity(values), pa.py_buffer((offsets * 8).tobytes()),
             pa.py_buffer(elements.astype(np.int64).tobytes())], null_count=values.null_count)
        return _column_codes(packed)
    if pa.types.is_struct(kind):
        valid = np.asarray(values.is_valid(), dtype=np.int64)
        fields = [np.where(valid == 1, _column_codes(pc.struct_field(values, [i])), -1)
                  for i in range(kind.num_fields)]
        return key_codes_from([valid, *fields])
    try:
        encoded = pc.dictionary_encode(values, null_encoding="encode")
        return np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        # Anything else (maps, say): hash the Python form.
        seen: dict[Any, int] = {}
        return np.fromiter((seen.setdefault(_hashable(v), len(seen)) for v in values.to_pylist()),
                           dtype=np.int64, count=len(values))


def key_codes_from(codes: Sequence[np.ndarray]) -> np.ndarray:
    """Combine per-column codes into one code per row, equal where every column's code is equal."""
    out = _dense(codes[0])
    bound = int(out.max()) + 1 if out.size else 1  # every code of ``out`` is below it
    for more in codes[1:]:
        if more.size and more.min() < 0:
            more = _dense(more)
        width = int(more.max()) + 1 if more.size else 1
        if bound * width >= 2**62:
            # Renumber before the pair's code could leave int64: then both are below the row count n,
            # and n**2 is far within it.
            out = _dense(out)
            bound = int(out.max()) + 1 if out.size else 1
        out = out * width + more
        bound *= width
    return _dense(out) if len(codes) > 1 else out


def _fixed_width(kind: pa.DataType) -> bool:
    """Whether values of ``kind`` are equal exactly when their bits are (as `pc.dictionary_encode`
    finds them: bit for bit, floats too) and sit in one buffer of 1, 8, 16, 32 or k x 64 bits."""
    if pa.types.is_struct(kind):
        return all(_fixed_width(f.type) for f in kind)
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
            or pa.types.is_temporal(kind) or pa.types.is_decimal(kind) or pa.types.is_fixed_size_binary(kind)):
        return False
    return kind.bit_width in (1, 8, 16, 32) or kind.bit_width % 64 == 0


def _fixed_words(values: pa.Array, words: list[np.ndarray], valid: list[np.ndarray]) -> None:
    """Append the int64 words of a `_fixed_width` column (its bits, 0 where NULL) to ``words``
    and, if it has NULLs, its validity (0 / 1) to ``valid``; a struct's fields follow it."""
    n = len(values)
    ok = np.asarray(values.is_valid()) if values.null_count else None
    kind = values.type
    if pa.types.is_struct(kind):
        for i in range(kind.num_fields):
            more: list[np.ndarray] = []
            more_valid: list[np.ndarray] = []
            _fixed_words(values.field(i), more, more_valid)
            if ok is not None:  # a NULL struct's fields may hold anything
                more = [np.where(ok, x, 0) for x in more]
                more_valid = [np.where(ok, x, 0) for x in more_valid]
            words.extend(more)
            valid.extend(more_valid)
    elif kind.bit_width == 1:
        words.append(np.asarray(pc.fill_null(values, False).to_numpy(zero_copy_only=False), dtype=np.int64))
    else:
        size = kind.bit_width // 8
        data = values.buffers()[1]
        raw = np.frombuffer(data, dtype=np.uint8, count=n * size, offset=values.offset * size) \
            if n and data is not None else np.zeros(n * size, np.uint8)
        if size in (1, 2, 4, 8):
            column = [raw.view(f"<i{size}").astype(np.int64)]
        else:
            column = list(raw.view("<i8").reshape(n, size // 8).T)
        words.extend(column if ok is None else [np.where(ok, x, 0) for x in column])
    if ok is not None:
        valid.append(ok.astype(np.int64))


def _packed(valid: list[np.ndarray], n: int) -> list[np.ndarray]:
    """Validity columns (0 / 1) packed 62 to an int64 word."""
    out = []
    for start in range(0, len(valid), 62):
        word = np.zeros(n, np.int64)
        for bit, v in enumerate(valid[start:start + 62]):
            word |= v << bit
        out.append(word)
    return out


def _var_column(values: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """A byte-string column as each value's memory address (in its chunk's data buffer, which
    ``values`` keeps alive) and length (-1: NULL), for `walk.hash_bytes` and `walk.same_bytes`."""
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    addresses, lengths = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for chunk in chunks:
        if not len(chunk):
            continue
        offsets = ab.value_offsets(chunk)
        data = chunk.buffers()[2]
        length = np.diff(offsets).astype(np.int64)
        if chunk.null_count:
            length[~np.asarray(chunk.is_valid())] = -1
        addresses.append(offsets[:-1].astype(np.int64) + (data.address if data is not None else 0))
        lengths.append(length)
    return np.concatenate(addresses), np.concatenate(lengths)


def key_codes(columns: Sequence[pa.Array | pa.ChunkedArray], *, hash_mask: int = -1,
              sources: Sequence[np.ndarray | None] | None = None) -> np.ndarray:
    """One integer per row, equal for rows whose values are equal in every column (dense: ``0 .. k-1``).

    ``sources``: per column, None or the row whose value stands for each row's (row ``i`` has
    the value of row ``sources[i]``): a column's values filled in from other rows without
    copying them.

    Compiled (numba), in one pass per column: fixed-width columns give their bits, byte strings
    their bytes (read in their Arrow buffers), other columns their `_column_codes`; every row
    gets a 64-bit hash of them, `walk.number_hashes` numbers the rows by hash (in the order first
    seen), and every row is checked against the first row of its number, value for value.
    Without numba, or where two different rows' hashes meet (``hash_mask``: see
    `walk.number_hashes`), the columns' codes are combined pairwise (`key_codes_from`).
    On `bench_wide`'s 1,036,800 new and old rows of 20 columns: 0.64-0.68 s against 2.2-2.4 s
    pairwise.
    """
    sources = list(sources) if sources is not None else [None] * len(columns)

    def mapped(arrays: list[np.ndarray], source: np.ndarray | None) -> list[np.ndarray]:
        return arrays if source is None else [a[source] for a in arrays]

    if kernel.numba is not None:
        n = len(columns[0])
        words: list[np.ndarray] = []
        valid: list[np.ndarray] = []
        var_columns: list[tuple[np.ndarray, np.ndarray]] = []
        for column, source in zip(columns, sources):
            if _fixed_width(column.type):
                its_words: list[np.ndarray] = []
                its_valid: list[np.ndarray] = []
                _fixed_words(_one_array(column) if isinstance(column, pa.ChunkedArray) else column,
                             its_words, its_valid)
                words.extend(mapped(its_words, source))
                valid.extend(mapped(its_valid, source))
            elif ab.is_byte_strings(column.type):
                address, length = mapped(list(_var_column(column)), source)
                var_columns.append((address, length))
            else:
                words.extend(mapped([_column_codes(column)], source))
        words.extend(_packed(valid, n))
        words = [np.ascontiguousarray(w, dtype=np.int64) for w in words]
        hashes = np.full(n, HASH_SEED, dtype=np.uint64)
        for w in words:
            hash_words(hashes, w)
        for address, length in var_columns:
            hash_bytes(hashes, address, length)
        codes, first = number_hashes(hashes, hash_mask)
        if (all(same_words(w, first) for w in words)
                and all(same_bytes(address, length, first) for address, length in var_columns)):
            return codes
    codes = [mapped([_column_codes(c)], source)[0] for c, source in zip(columns, sources)]
    return codes[0] if len(codes) == 1 else key_codes_from(codes)


def joined_buckets(n: int, pairs: Sequence[tuple[int, int]]) -> list[int]:
    """For buckets 0..n-1, the bucket each goes with: the same for two buckets that a chain of
    ``pairs`` links (the smallest of them), so that rows of linked buckets meet in one task."""
    parent = list(range(n))

    def root(b: int) -> int:
        while parent[b] != b:
            parent[b] = parent[parent[b]]
            b = parent[b]
        return b

    for a, b in pairs:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return [root(b) for b in range(n)]


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


def _one_array(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array, without a copy when it already is one chunk."""
    if column.num_chunks == 1:
        return column.chunk(0)
    return column.combine_chunks() if column.num_chunks else pa.nulls(0, column.type)


def _field(struct: pa.ChunkedArray, name: str) -> pa.ChunkedArray:
    """One field of a struct column, chunk by chunk."""
    return pc.struct_field(struct, [struct.type.get_field_index(name)])


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
        return pc.if_else(pa.array(at), _field(self.old, name).take(index), values)

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
        return self.codes[:self.rows.num_rows].tolist()

    @cached_property
    def old_code(self) -> list[int]:
        return self.codes[self.rows.num_rows:].tolist()

    @cached_property
    def has_old(self) -> list[bool]:
        return self.has_old_rows.tolist()

    @cached_property
    def order(self) -> list[int]:
        return self.commit_order.tolist()

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
    key_arrays = [pa.chunked_array([*data[k].chunks, *_field(old, k).cast(data[k].type).chunks], data[k].type)
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
    unchanged_rows, unchanged_columns = _unchanged_pairs(_one_array(rows.column("_unchanged_toast")), names) \
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


#: Leading bytes of a byte string that `key_hashes` reads (equal strings have equal ones): a
#: long text would cost more to read than its key is worth to spread the rows.
HASHED_PREFIX = 32


def key_hashes(columns: Sequence[pa.Array | pa.ChunkedArray],
               sources: Sequence[np.ndarray | None] | None = None) -> np.ndarray | None:
    """A 64-bit hash per row (uint64) of its values in ``columns``, the same for equal values in
    any process: made of their bits and bytes only (`walk.hash_words`, `walk.hash_bytes`), never
    of codes numbered in one process, so only the fixed-width and byte-string columns count, and
    of a byte string only its length and first `HASHED_PREFIX` bytes (which still gives equal
    keys equal hashes). ``sources`` as for `key_codes`. None without numba, or when no column is
    of those types."""
    if kernel.numba is None or not columns:
        return None
    sources = list(sources) if sources is not None else [None] * len(columns)
    hashes = np.full(len(columns[0]), HASH_SEED, dtype=np.uint64)
    used = False
    for column, source in zip(columns, sources):
        if _fixed_width(column.type):
            chunks = column.chunks if isinstance(column, pa.ChunkedArray) and source is None else \
                [_one_array(column) if isinstance(column, pa.ChunkedArray) else column]
            start = 0
            for chunk in chunks:  # chunk by chunk, into the chunk's rows of ``hashes``: no copy of the column
                words: list[np.ndarray] = []
                _fixed_words(chunk, words, [])
                part = hashes if source is not None else hashes[start:start + len(chunk)]
                for w in words:
                    hash_words(part, np.ascontiguousarray(w if source is None else w[source], dtype=np.int64))
                start += len(chunk)
            used = True
        elif ab.is_byte_strings(column.type):
            address, length = _var_column(column)
            if source is not None:
                address, length = address[source], length[source]
            # The length whole (equal strings, equal lengths), then a prefix of the bytes.
            hash_words(hashes, np.ascontiguousarray(length, dtype=np.int64))
            hash_bytes(hashes, np.ascontiguousarray(address), np.minimum(length, HASHED_PREFIX))
            used = True
    return hashes if used else None


def can_hash_keys(spec: TableSpec, schema: pa.Schema) -> bool:
    """Whether `key_hashes` hashes ``spec``'s key columns of ``schema`` (numba, and a fixed-width or
    byte-string key column)."""
    return kernel.numba is not None and any(
        _fixed_width(schema.field(k).type) or ab.is_byte_strings(schema.field(k).type) for k in spec.key)


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
        filled = _filled(spec, names, *_unchanged_pairs(_one_array(rows.column("_unchanged_toast")), names), n)
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
    cols = {name: pc.if_else(is_delete, _field(p.old, name).take(index), p.values(name, rows))
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
