"""Insert, Update and Delete walked by a compiled kernel (numba): one pass per batch.

The NumPy walk of `reader.Cursor.tuple_data` costs about fifteen NumPy calls
per column position, each over a few thousand messages; on 10,000-message
batches that call overhead, not the bytes, is most of the decoder's time. Here
a kernel compiled by numba walks every change message of a batch byte by byte:

1. `_walk` checks each message (relation id, markers, the column count, kind,
   length and value of every column, trailing bytes) and records per message its
   first error, or its column counts and value bytes;
2. `_fill` walks the valid messages again and writes the tuple columns straight
   into the Arrow buffers of the batch's ``change`` column, in batch order: kind
   bytes, value offsets, validity and the value bytes themselves.

It reports exactly the errors the NumPy walk reports (same field path, offset
and numbers; `tests/decoder/test_kernel.py` compares both on every message
type, every truncation and random bytes), so the NumPy walk stays the
reference and the fallback where numba is not installed
(``PGOUTPUT_SPARK_DECODER=numpy`` selects it explicitly).
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

from . import arrow as ab
from . import schema as sc
from .protocol import MessageType, TupleKind, TupleMarker
from .reader import BatchReader, ErrorCode

try:  # numba is a dependency, but a cluster may lack it: the NumPy walk then runs.
    import numba
except ImportError:  # pragma: no cover - exercised where numba is absent
    numba = None

_ENV = "PGOUTPUT_SPARK_DECODER"

# Constants the kernel compiles in (numba freezes module globals).
_INSERT, _UPDATE, _DELETE = int(MessageType.INSERT), int(MessageType.UPDATE), int(MessageType.DELETE)
_NEW, _KEY, _OLD = int(TupleMarker.NEW), int(TupleMarker.KEY), int(TupleMarker.OLD)
_TEXT, _BINARY = int(TupleKind.TEXT), int(TupleKind.BINARY)
_NULL, _TOAST = int(TupleKind.NULL), int(TupleKind.UNCHANGED_TOAST)
_NEED, _TRAILING, _BAD_MARKER = int(ErrorCode.NEED), int(ErrorCode.TRAILING), int(ErrorCode.BAD_MARKER)
_BAD_KIND, _NEGATIVE, _TOO_MANY = (int(ErrorCode.BAD_KIND), int(ErrorCode.NEGATIVE_LENGTH),
                                   int(ErrorCode.TOO_MANY))

# Field of an error, as recorded by the kernel. A tuple's fields are its base
# plus _NCOLUMNS / _KIND / _LENGTH / _VALUE.
_F_RELATION_ID, _F_MARKER, _F_NEW_MARKER, _F_END, _F_OLD, _F_NEW = 0, 1, 2, 3, 4, 8
_NCOLUMNS, _KIND, _LENGTH, _VALUE = 0, 1, 2, 3
_TUPLE_FIELDS = {_NCOLUMNS: "ncolumns", _KIND: "kind", _LENGTH: "length", _VALUE: "value"}
_MARKERS = {  # what `change.read_change` expects after the relation id
    MessageType.INSERT: "'N'",
    MessageType.UPDATE: "'K', 'O' or 'N'",
    MessageType.DELETE: "'K' or 'O'",
}


def engine() -> str:
    """The TupleData walk in use: ``"numba"`` or ``"numpy"`` (``PGOUTPUT_SPARK_DECODER``)."""
    wanted = os.environ.get(_ENV, "auto").strip().lower() or "auto"
    if wanted not in ("auto", "numba", "numpy"):
        raise ValueError(f"{_ENV}={wanted!r}: expected auto, numba or numpy")
    if wanted == "numba" and numba is None:
        raise ImportError(f"{_ENV}=numba but numba is not installed")
    return "numpy" if wanted == "numpy" or numba is None else "numba"


def _jit(function):
    if numba is None:
        return function
    try:  # compiled once per machine, cached next to this file or in the user's cache
        return numba.njit(cache=True, nogil=True)(function)
    except RuntimeError:  # no writable cache location (e.g. a read-only zip): compile per process
        return numba.njit(nogil=True)(function)


@_jit
def _tuple_walk(buf, p, end, fbase, err, i):  # pragma: no cover - compiled
    """Check one TupleData at ``p``: (position after it, columns, value bytes), or p = -1 on error.

    ``err`` rows are (code, field, column, position, a, b).
    """
    if end - p < 2:
        err[i, 0], err[i, 1], err[i, 2], err[i, 3], err[i, 4], err[i, 5] = \
            _NEED, fbase + _NCOLUMNS, -1, p, 2, end - p
        return -1, 0, 0
    ncols = (np.int64(buf[p]) << 8) | np.int64(buf[p + 1])
    p += 2
    if ncols > end - p:  # every column takes at least its kind byte
        err[i, 0], err[i, 1], err[i, 2], err[i, 3], err[i, 4], err[i, 5] = \
            _TOO_MANY, fbase + _NCOLUMNS, -1, p - 2, ncols, end - p
        return -1, 0, 0
    nbytes = np.int64(0)
    for j in range(ncols):
        if end - p < 1:
            err[i, 0], err[i, 1], err[i, 2], err[i, 3], err[i, 4], err[i, 5] = \
                _NEED, fbase + _KIND, j, p, 1, end - p
            return -1, 0, 0
        k = np.int64(buf[p])
        if k == _TEXT or k == _BINARY:
            if end - (p + 1) < 4:
                err[i, 0], err[i, 1], err[i, 2], err[i, 3], err[i, 4], err[i, 5] = \
                    _NEED, fbase + _LENGTH, j, p + 1, 4, end - (p + 1)
                return -1, 0, 0
            length = ((np.int64(buf[p + 1]) << 24) | (np.int64(buf[p + 2]) << 16)
                      | (np.int64(buf[p + 3]) << 8) | np.int64(buf[p + 4]))
            if length >= 1 << 31:
                length -= 1 << 32
                err[i, 0], err[i, 1], err[i, 2], err[i, 3], err[i, 4], err[i, 5] = \
                    _NEGATIVE, fbase + _LENGTH, j, p + 1, length, 0
                return -1, 0, 0
            if end - (p + 5) < length:
                err[i, 0], err[i, 1], err[i, 2], err[i, 3], err[i, 4], err[i, 5] = \
                    _NEED, fbase + _VALUE, j, p + 5, length, end - (p + 5)
                return -1, 0, 0
            p += 5 + length
            nbytes += length
        elif k == _NULL or k == _TOAST:
            p += 1
        else:
            err[i, 0], err[i, 1], err[i, 2], err[i, 3], err[i, 4], err[i, 5] = \
                _BAD_KIND, fbase + _KIND, j, p, k, 0
            return -1, 0, 0
    return p, ncols, nbytes


@_jit
def _walk(buf, pos, ends, types, active, relation_id, old_kind, counts, err):  # pragma: no cover
    """Check every active change message; ``counts`` rows: (old columns, old bytes, new columns, new bytes)."""
    for i in range(pos.size):
        if not active[i]:
            continue
        p, end, t = pos[i], ends[i], types[i]
        if end - p < 4:
            err[i, 0], err[i, 1], err[i, 2], err[i, 3], err[i, 4], err[i, 5] = \
                _NEED, _F_RELATION_ID, -1, p, 4, end - p
            continue
        relation_id[i] = ((np.int64(buf[p]) << 24) | (np.int64(buf[p + 1]) << 16)
                          | (np.int64(buf[p + 2]) << 8) | np.int64(buf[p + 3]))
        p += 4
        if end - p < 1:
            err[i, 0], err[i, 1], err[i, 2], err[i, 3], err[i, 4], err[i, 5] = \
                _NEED, _F_MARKER, -1, p, 1, end - p
            continue
        marker = np.int64(buf[p])
        if t == _INSERT:
            wrong = marker != _NEW
        elif t == _UPDATE:
            wrong = marker != _NEW and marker != _KEY and marker != _OLD
        else:
            wrong = marker != _KEY and marker != _OLD
        if wrong:
            err[i, 0], err[i, 1], err[i, 2], err[i, 3], err[i, 4], err[i, 5] = \
                _BAD_MARKER, _F_MARKER, -1, p, marker, 0
            continue
        p += 1
        if marker != _NEW:
            old_kind[i] = marker
            p, ncols, nbytes = _tuple_walk(buf, p, end, _F_OLD, err, i)
            if p < 0:
                continue
            counts[i, 0], counts[i, 1] = ncols, nbytes
            if t == _UPDATE:
                if end - p < 1:
                    err[i, 0], err[i, 1], err[i, 2], err[i, 3], err[i, 4], err[i, 5] = \
                        _NEED, _F_NEW_MARKER, -1, p, 1, end - p
                    continue
                if buf[p] != _NEW:
                    err[i, 0], err[i, 1], err[i, 2], err[i, 3], err[i, 4], err[i, 5] = \
                        _BAD_MARKER, _F_NEW_MARKER, -1, p, buf[p], 0
                    continue
                p += 1
        if t != _DELETE:
            p, ncols, nbytes = _tuple_walk(buf, p, end, _F_NEW, err, i)
            if p < 0:
                continue
            counts[i, 2], counts[i, 3] = ncols, nbytes
        if p < end:
            err[i, 0], err[i, 1], err[i, 2], err[i, 3], err[i, 4], err[i, 5] = \
                _TRAILING, _F_END, -1, p, end - p, 0


@_jit
def _tuple_fill(buf, p, e, kinds, bounds, valid):  # pragma: no cover - compiled
    """Record one checked TupleData at ``p`` as elements ``e`` onwards; returns (p, e).

    ``bounds[2e]`` / ``bounds[2e + 1]`` are where element e's value starts and
    ends in ``buf`` (a NULL or unchanged value is empty, at the previous end),
    so that the bounds never decrease and the gaps between values are the odd
    elements of one zero-copy view of ``buf`` (see `_values`).
    """
    ncols = (np.int64(buf[p]) << 8) | np.int64(buf[p + 1])
    p += 2
    last = bounds[2 * e - 1] if e > 0 else 0
    for _ in range(ncols):
        k = buf[p]
        kinds[e] = k
        if k == _TEXT or k == _BINARY:
            length = ((np.int64(buf[p + 1]) << 24) | (np.int64(buf[p + 2]) << 16)
                      | (np.int64(buf[p + 3]) << 8) | np.int64(buf[p + 4]))
            bounds[2 * e] = p + 5
            last = p + 5 + length
            valid[e] = True
            p = last
        else:
            bounds[2 * e] = last
            valid[e] = False
            p += 1
        bounds[2 * e + 1] = last
        e += 1
    return p, e


@_jit
def _fill(buf, pos, types, rows, old, new):  # pragma: no cover - compiled
    """Record the tuples of the valid change messages ``rows`` (batch order).

    ``old`` / ``new`` are (kinds, bounds, valid) of all elements of that part.
    """
    eo = en = 0
    for i in rows:
        p, t = pos[i] + 5, types[i]  # past the relation id and the marker
        if buf[p - 1] != _NEW:
            p, eo = _tuple_fill(buf, p, eo, old[0], old[1], old[2])
            if t == _UPDATE:
                p += 1
        if t != _DELETE:
            p, en = _tuple_fill(buf, p, en, new[0], new[1], new[2])


def _elements(columns: int, nbytes: int, buf_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Empty (kinds, bounds, valid) for ``columns`` tuple elements holding ``nbytes`` of values."""
    if nbytes >= 1 << 31:
        raise OverflowError("more than 2 GiB of values in one Arrow batch; lower "
                            "spark.sql.execution.arrow.maxRecordsPerBatch")
    bounds = np.empty(2 * columns, dtype=np.int32 if buf_size < 1 << 31 else np.int64)
    return np.empty(columns, dtype=np.uint8), bounds, np.empty(columns, dtype=np.bool_)


def _values(buf: np.ndarray, bounds: np.ndarray, valid: np.ndarray) -> pa.BinaryArray:
    """Cut the values out of ``buf``: Arrow's ``take`` of the even elements of a view of it."""
    m = valid.size
    if m == 0:
        return pa.array([], type=pa.binary())
    view_type = pa.binary() if bounds.dtype == np.int32 else pa.large_binary()
    view = pa.Array.from_buffers(view_type, 2 * m - 1,
                                 [None, pa.py_buffer(bounds), pa.py_buffer(buf)])
    even = np.arange(0, 2 * m, 2, dtype=np.int64)
    picked = view.take(pa.array(even, mask=None if valid.all() else ~valid))
    return picked if picked.type == pa.binary() else picked.cast(pa.binary())


def _tuple_list(buf: np.ndarray, counts: np.ndarray, present: np.ndarray,
                parts: tuple[np.ndarray, np.ndarray, np.ndarray]) -> pa.ListArray:
    kinds, bounds, valid = parts
    values = pa.StructArray.from_arrays(
        [ab.char_array(kinds, np.ones(kinds.size, dtype=bool)), _values(buf, bounds, valid)],
        fields=list(sc.TUPLE_VALUE),
    )
    return ab.list_array(counts, present, values, sc.TUPLE_VALUE)


def _record_errors(reader: BatchReader, types: np.ndarray, err: np.ndarray) -> None:
    """Record the kernel's errors in ``reader`` (error path only: one call per failed message)."""
    for i in np.flatnonzero(err[:, 0]):
        code, field_id, column, pos, a, b = (int(v) for v in err[i])
        kind = MessageType(int(types[i]))
        text = None
        if field_id == _F_END:
            field = kind.doc_name
        elif field_id == _F_RELATION_ID:
            field = f"{kind.doc_name}.relation_id"
        elif field_id in (_F_MARKER, _F_NEW_MARKER):
            field = f"{kind.doc_name}.{'marker' if field_id == _F_MARKER else 'new_marker'}"
            if code == ErrorCode.BAD_MARKER:
                text = _MARKERS[kind] if field_id == _F_MARKER else "'N'"
        else:
            part = "old_tuple" if field_id < _F_NEW else "new_tuple"
            what = _TUPLE_FIELDS[(field_id - _F_OLD) % 4]
            field = f"{kind.doc_name}.{part}" + (f".{what}" if column < 0 else f"[{column}].{what}")
        reader.fail(np.array([i]), field, ErrorCode(code), pos, a, b, text)


def change_column(reader: BatchReader, types: np.ndarray, pos: np.ndarray,
                  active: np.ndarray) -> pa.Array:
    """The batch-length ``change`` struct column; ``active`` marks the change messages to read.

    ``pos[i]`` is where message i's relation id starts (after the type byte and,
    in a stream block, the xid). Failed messages are recorded in ``reader``.
    """
    n = pos.size
    if not active.any():
        return pa.nulls(n, type=sc.CHANGE)
    active = active & ~reader.bad
    relation_id = np.zeros(n, dtype=np.int64)
    old_kind = np.zeros(n, dtype=np.uint8)
    counts = np.zeros((n, 4), dtype=np.int64)
    err = np.zeros((n, 6), dtype=np.int64)
    _walk(reader.buf, pos, reader.ends, types, active, relation_id, old_kind, counts, err)
    _record_errors(reader, types, err)
    valid = active & (err[:, 0] == 0)
    has_old = valid & (old_kind != 0)
    has_new = valid & (types != _DELETE)
    counts[~valid] = 0
    buf = reader.buf
    old = _elements(int(counts[:, 0].sum()), int(counts[:, 1].sum()), buf.size)
    new = _elements(int(counts[:, 2].sum()), int(counts[:, 3].sum()), buf.size)
    _fill(buf, pos, types, np.flatnonzero(valid), old, new)
    return pa.StructArray.from_arrays(
        [pa.array(relation_id), ab.char_array(old_kind, has_old),
         _tuple_list(buf, counts[:, 0], has_old, old), _tuple_list(buf, counts[:, 2], has_new, new)],
        fields=list(sc.CHANGE), mask=ab.mask_array(valid),
    )


__all__ = ["change_column", "engine"]
