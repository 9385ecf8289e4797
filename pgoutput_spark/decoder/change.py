"""Insert, Update and Delete: their TupleData parts, decoded per group, merged per batch.

Each group (all Inserts of a batch, all Updates, all Deletes) is read with
`read_change`; `change_column` then merges the groups' tuple elements into
batch order with NumPy, so the value bytes are cut out of the buffer once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from . import arrow as ab
from . import schema as sc
from .protocol import MessageType, TupleMarker
from .reader import BatchReader, Cursor, TupleColumns


#: What each change message allows after its relation id, and an Update after its old
#: tuple, as their errors say.
NEW_MARKER = "'N'"
MARKERS = {
    MessageType.INSERT: NEW_MARKER,
    MessageType.UPDATE: "'K', 'O' or 'N'",
    MessageType.DELETE: "'K' or 'O'",
}


@dataclass
class ChangePart:
    """What `_change` read from one group (Insert, Update or Delete) of a batch."""

    rows: np.ndarray
    relation_id: np.ndarray
    old_kind: np.ndarray
    has_old: np.ndarray
    old: TupleColumns | None  # over rows[has_old]
    new: TupleColumns | None  # over rows


def read_change(cur: Cursor, kind: MessageType) -> ChangePart:
    """Insert, Update and Delete: relation id, optional old key/row, new row."""
    relation_id = cur.uint(4, "relation_id")
    if kind is MessageType.INSERT:
        cur.expect((TupleMarker.NEW,), "marker", MARKERS[kind])
        old_kind, has_old = np.zeros(len(cur), dtype=np.uint8), np.zeros(len(cur), dtype=bool)
    elif kind is MessageType.UPDATE:
        old_kind = cur.peek_byte()
        has_old = (old_kind == TupleMarker.KEY) | (old_kind == TupleMarker.OLD)
        cur.expect((TupleMarker.KEY, TupleMarker.OLD, TupleMarker.NEW), "marker", MARKERS[kind])
    else:
        old_kind = cur.peek_byte()
        has_old = np.ones(len(cur), dtype=bool)
        cur.expect((TupleMarker.KEY, TupleMarker.OLD), "marker", MARKERS[kind])
    old = None
    if has_old.any():
        sub = cur.where(has_old)
        old = sub.tuple_data("old_tuple")
        if kind is MessageType.UPDATE:
            sub.expect((TupleMarker.NEW,), "new_marker", NEW_MARKER)
        cur.pos[has_old] = sub.pos
    new = None
    if kind is not MessageType.DELETE:
        new = cur.tuple_data("new_tuple")
    cur.expect_end()
    return ChangePart(cur.rows, relation_id, old_kind, has_old, old, new)


def _merged_tuples(reader: BatchReader, n: int,
                   pieces: list[tuple[np.ndarray, TupleColumns, np.ndarray]]) -> pa.ListArray:
    """One batch-length TupleData column from the tuples of several groups.

    ``pieces`` are (batch row of each tuple, its columns, tuple valid). The
    elements are put in batch order with NumPy, so the value bytes are cut out
    of the buffer once, in buffer order, and never copied again.
    """
    counts_full = np.zeros(n, dtype=np.int64)
    valid_full = np.zeros(n, dtype=bool)
    element_rows, kinds, starts, lengths = [], [], [], []
    for rows, columns, valid in pieces:
        counts = np.diff(columns.offsets)
        keep = valid & columns.present
        counts_full[rows[keep]] = counts[keep]
        valid_full[rows[keep]] = True
        elements = np.repeat(keep, counts)
        element_rows.append(np.repeat(rows, counts)[elements])
        kinds.append(columns.kind[elements])
        starts.append(columns.value_start[elements])
        lengths.append(columns.value_length[elements])
    order = np.argsort(np.concatenate(element_rows), kind="stable") if len(pieces) > 1 else None
    kind, start, length = (np.concatenate(a) for a in (kinds, starts, lengths))
    if order is not None:
        kind, start, length = kind[order], start[order], length[order]
    values = pa.StructArray.from_arrays(
        [ab.char_array(kind, np.ones(kind.size, dtype=bool)),
         ab.binary_array(reader, start, length, length >= 0)],
        fields=list(sc.TUPLE_VALUE),
    )
    return ab.list_array(counts_full, valid_full, values, sc.TUPLE_VALUE)


def change_column(reader: BatchReader, n: int, parts: list[ChangePart]) -> pa.Array:
    """The batch-length ``change`` struct column of all Insert / Update / Delete groups."""
    if not parts:
        return pa.nulls(n, type=sc.CHANGE)
    relation_id = np.zeros(n, dtype=np.int64)
    old_kind = np.zeros(n, dtype=np.uint8)
    has_old = np.zeros(n, dtype=bool)
    valid = np.zeros(n, dtype=bool)
    old_pieces, new_pieces = [], []
    for p in parts:
        ok = ~reader.bad[p.rows]
        relation_id[p.rows] = p.relation_id
        old_kind[p.rows] = p.old_kind
        has_old[p.rows] = p.has_old & ok
        valid[p.rows] = ok
        if p.old is not None:
            old_pieces.append((p.rows[p.has_old], p.old, ok[p.has_old]))
        if p.new is not None:
            new_pieces.append((p.rows, p.new, ok))
    empty = pa.nulls(n, type=sc.TUPLE)
    return pa.StructArray.from_arrays(
        [pa.array(relation_id), ab.char_array(old_kind, has_old),
         _merged_tuples(reader, n, old_pieces) if old_pieces else empty,
         _merged_tuples(reader, n, new_pieces) if new_pieces else empty],
        fields=list(sc.CHANGE), mask=ab.mask_array(valid),
    )
