"""Arrays in binary form (``array_send``) -> (nested) Arrow lists.

Layout: int32 ndim, int32 has-nulls flag, uint32 element type OID, then per
dimension int32 size and int32 lower bound, then per element an int32 length
(-1 for NULL) and that many bytes in the element type's binary form.

Arrays of a fixed-width element type without NULLs are located in one NumPy
step (every element sits at a computable offset). Otherwise the elements
are walked one position at a time for all values at once: the loop runs as
many NumPy steps as the longest array has elements, never once per value.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .arrays import ConvertElements, check_dimensions, nest
from .oids import BuiltinType
from .pgtype import PgType
from .raw import RawValues, ValueFailure, binary_from_parts, fail_where, gather_index

_MAX_DIMENSIONS = 6
_HEADER = 12

FIXED_WIDTH: dict[int, int] = {
    BuiltinType.BOOL: 1, BuiltinType.CHAR: 1, BuiltinType.INT2: 2, BuiltinType.INT4: 4,
    BuiltinType.INT8: 8, BuiltinType.OID: 4, BuiltinType.FLOAT4: 4, BuiltinType.FLOAT8: 8,
    BuiltinType.MONEY: 8, BuiltinType.DATE: 4, BuiltinType.TIME: 8, BuiltinType.TIMETZ: 12,
    BuiltinType.TIMESTAMP: 8, BuiltinType.TIMESTAMPTZ: 8, BuiltinType.INTERVAL: 16,
    BuiltinType.UUID: 16, BuiltinType.MACADDR: 6, BuiltinType.MACADDR8: 8,
}  # fmt: skip


def binary_arrays(raw: RawValues, t: PgType, convert_elements: ConvertElements) -> pa.Array:
    n, valid = raw.n, raw.valid
    element_type = t.element()
    what = f"{t.display_name} binary value"
    fail_where(valid & (raw.lengths < _HEADER), f"{what} is shorter than the 12-byte array header")
    ndim = np.where(valid, raw.read(0, ">i4"), 0).astype(np.int64)
    flags = raw.read(4, ">i4")
    element_oid = raw.read(8, ">u4")
    fail_where(valid & ((ndim < 0) | (ndim > _MAX_DIMENSIONS)), f"{what} has an invalid dimension count")
    fail_where(valid & ((flags != 0) & (flags != 1)), f"{what} has invalid flags")
    fail_where(valid & (element_oid != element_type.oid),
               f"{what} holds elements of another type OID (expected {element_type.oid})")  # fmt: skip
    header = _HEADER + 8 * ndim
    fail_where(valid & (raw.lengths < header), f"{what} is shorter than its dimension list")
    sizes = np.zeros((n, max(int(ndim.max(initial=0)), 1)), dtype=np.int64)
    for d in range(sizes.shape[1]):
        rows = np.flatnonzero(ndim > d)
        sizes[rows, d] = raw.read(_HEADER + 8 * d, ">i4", rows)
    fail_where(np.asarray((sizes < 0).any(axis=1)), f"{what} has a negative dimension size")
    count = np.where(valid & (ndim > 0), 1, 0)
    for d in range(sizes.shape[1]):  # each factor <= the byte length: no int64 overflow
        count = np.where(ndim > d, count * sizes[:, d], count)
        fail_where(valid & (count > raw.lengths), f"{what} claims more elements than it has bytes")
    check_dimensions(raw, t, ndim, count > 0)

    width = FIXED_WIDTH.get(element_type.oid)
    if width is not None and not (valid & (flags != 0)).any():
        starts, lengths = _fixed_elements(raw, header, count, width, what)
    else:
        starts, lengths = _walk_elements(raw, header, count, what)
    is_null = lengths < 0
    lengths = np.maximum(lengths, 0)
    element_offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=element_offsets[1:])
    element_bytes = raw.data[gather_index(starts, lengths)] if element_offsets[-1] else np.zeros(0, np.uint8)
    elements = binary_from_parts(element_offsets, element_bytes, ~is_null)

    element_rows = np.repeat(np.arange(n), count)
    counts = []
    lists = np.ones(n, dtype=np.int64)  # lists per row at the current level
    for level in range(t.dimensions):
        size = np.where(ndim > level, sizes[:, min(level, sizes.shape[1] - 1)], 0)
        counts.append(size if level == 0 else np.repeat(size, lists))
        lists = lists * size
    return nest(raw, t, elements, counts, element_rows, convert_elements)


def _fixed_elements(
    raw: RawValues, header: np.ndarray, count: np.ndarray, width: int, what: str
) -> tuple[np.ndarray, np.ndarray]:
    fail_where(raw.valid & (raw.lengths != header + count * (4 + width)),
               f"{what} length does not match its element count")  # fmt: skip
    rows = np.repeat(np.arange(raw.n), count)
    first = np.concatenate(([0], np.cumsum(count)))[:-1]
    k = np.arange(rows.size) - first[rows]
    at = raw.starts[rows] + header[rows] + k * (4 + width)
    lengths = raw.data[at[:, None] + np.arange(4)].view(">i4").reshape(-1).astype(np.int64)
    bad = lengths != width
    if bad.any():
        raise ValueFailure(int(rows[np.argmax(bad)]), f"{what} has an element of the wrong length")
    return at + 4, lengths


def _walk_elements(
    raw: RawValues, header: np.ndarray, count: np.ndarray, what: str
) -> tuple[np.ndarray, np.ndarray]:
    total = int(count.sum())
    first = np.concatenate(([0], np.cumsum(count)))[:-1]
    starts = np.zeros(total, dtype=np.int64)
    lengths = np.zeros(total, dtype=np.int64)
    end = raw.starts + raw.lengths
    at = raw.starts + header
    active = np.flatnonzero(count > 0)
    k = 0
    truncated = f"{what} ends inside an element"
    while active.size:
        here = at[active]
        _fail_rows(active[here + 4 > end[active]], truncated)
        length = raw.data[here[:, None] + np.arange(4)].view(">i4").reshape(-1).astype(np.int64)
        _fail_rows(active[length < -1], f"{what} has a negative element length")
        _fail_rows(active[here + 4 + np.maximum(length, 0) > end[active]], truncated)
        slot = first[active] + k
        starts[slot] = here + 4
        lengths[slot] = length
        at[active] = here + 4 + np.maximum(length, 0)
        k += 1
        active = active[count[active] > k]
    fail_where(raw.valid & (at != end) & (count > 0), f"{what} has bytes after its last element")
    fail_where(raw.valid & (count == 0) & (raw.lengths != header), f"{what} has bytes after its header")
    return starts, lengths


def _fail_rows(rows: np.ndarray, reason: str) -> None:
    if rows.size:
        raise ValueFailure(int(rows.min()), reason)
