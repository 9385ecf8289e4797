"""Insert, Update and Delete walked by a compiled kernel (numba): one pass per batch.

The NumPy walk of `reader.Cursor.tuple_data` costs about fifteen NumPy calls
per column position, each over a few thousand messages; on 10,000-message
batches that call overhead, not the bytes, is most of the decoder's time. Here
a kernel compiled by numba walks every change message of a batch once, byte
by byte: `_walk` checks each message (relation id, markers, the column count,
kind, length and value of every column, trailing bytes) and, if it is valid,
writes its tuples straight into the buffers of the batch's ``change`` column in
batch order (kind bytes, value offsets, validity, the value bytes); a message
that fails records its first error and leaves nothing behind.

It reports exactly the errors the NumPy walk reports (same field path, offset
and numbers; `tests/decoder/test_kernel.py` compares both on every message
type, every truncation and random bytes), so the NumPy walk stays the
reference and the fallback where numba is not installed
(``PGOUTPUT_SPARK_DECODER=numpy`` selects it explicitly).
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pyarrow as pa

from . import arrow as ab
from . import schema as sc
from .protocol import MessageType, TupleKind, TupleMarker
from .change import MARKERS, NEW_MARKER
from .reader import BatchReader, ErrorCode

try:  # numba is a dependency, but a cluster may lack it: the NumPy walk then runs.
    import numba as numba  # the other kernels' modules ask kernel.numba whether it is there
    from numba.core import cgutils
    from numba.extending import intrinsic
except ImportError:  # pragma: no cover - exercised where numba is absent
    numba = None  # type: ignore[assignment]

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


def engine() -> str:
    """The TupleData walk in use: ``"numba"`` or ``"numpy"`` (``PGOUTPUT_SPARK_DECODER``)."""
    wanted = os.environ.get(_ENV, "auto").strip().lower() or "auto"
    if wanted not in ("auto", "numba", "numpy"):
        raise ValueError(f"{_ENV}={wanted!r}: expected auto, numba or numpy")
    if wanted == "numba" and numba is None:
        raise ImportError(f"{_ENV}=numba but numba is not installed")
    return "numpy" if wanted == "numpy" or numba is None else "numba"


if numba is not None:
    @intrinsic
    def _copy(typingctx, dst, dst_at, src, src_at, length):  # pragma: no cover - compiled
        """``dst[dst_at:dst_at + length] = src[src_at:src_at + length]`` as one LLVM memcpy.

        A per-byte loop runs at about 1 GB/s, a third of memcpy's speed on
        values of tens of bytes, and numba's slice assignment is slower still.
        """
        def codegen(context, builder, signature, args):
            dst_array = context.make_array(signature.args[0])(context, builder, args[0])
            src_array = context.make_array(signature.args[2])(context, builder, args[2])
            cgutils.raw_memcpy(builder, builder.gep(dst_array.data, [args[1]]),
                               builder.gep(src_array.data, [args[3]]), args[4], 1)
            return context.get_dummy_value()

        return numba.types.void(dst, dst_at, src, src_at, length), codegen

    @intrinsic
    def _int32(typingctx, src, at):  # pragma: no cover - compiled
        """The big-endian signed Int32 at ``src[at:at + 4]``, as int64: one unaligned load.

        Four byte loads, shifts and ors lengthen the chain from one column to
        the next, which is what the walk waits on.
        """
        def codegen(context, builder, signature, args):
            from llvmlite import ir
            src_array = context.make_array(signature.args[0])(context, builder, args[0])
            pointer = builder.bitcast(builder.gep(src_array.data, [args[1]]), ir.IntType(32).as_pointer())
            value = builder.load(pointer, align=1)
            bswap = builder.module.declare_intrinsic("llvm.bswap", [ir.IntType(32)])
            return builder.sext(builder.call(bswap, [value]), ir.IntType(64))

        return numba.types.int64(src, at), codegen

    @intrinsic
    def _peek(typingctx, address, width):  # pragma: no cover - compiled
        """The ``width`` (1 or 8, a literal) bytes at memory ``address`` as int64: an unaligned load,
        zero-extended, in the machine's byte order. For walks over Arrow buffers by their
        `pyarrow.Buffer.address`, which the caller keeps alive and bounds."""
        if not isinstance(width, numba.types.IntegerLiteral) or width.literal_value not in (1, 8):
            return None
        bits = 8 * width.literal_value

        def codegen(context, builder, signature, args):
            from llvmlite import ir
            pointer = builder.inttoptr(args[0], ir.IntType(bits).as_pointer())
            value = builder.load(pointer, align=1)
            return value if bits == 64 else builder.zext(value, ir.IntType(64))

        return numba.types.int64(address, width), codegen
else:  # pragma: no cover - exercised where numba is absent
    _peek = None  # only compiled walks read memory by address (`mirroring.keys.key_codes` does without them)


def _jit(function=None, **options):
    if function is None:
        return lambda f: _jit(f, **options)
    if numba is None:
        return function
    try:  # compiled once per machine, cached next to this file or in the user's cache
        return numba.njit(cache=True, nogil=True, **options)(function)
    except RuntimeError:  # no writable cache location (e.g. a read-only zip): compile per process
        return numba.njit(nogil=True, **options)(function)


@_jit
def _fail(err, i, code, field, column, at, a, b):  # pragma: no cover - compiled
    err[i, 0], err[i, 1], err[i, 2], err[i, 3], err[i, 4], err[i, 5] = code, field, column, at, a, b


@_jit(inline='always')
def _tuple(buf, p, end, fbase, err, i, out, e, d):  # pragma: no cover - compiled
    """Check and copy one TupleData at ``p`` into element ``e`` and value byte ``d`` onwards.

    ``out`` is (kinds, offsets, valid, data). Returns (p, e, d) after the tuple,
    or p = -1 after recording the error in ``err[i]``: (code, field, column,
    position, a, b).
    """
    kinds, offsets, valid, data = out
    if end - p < 2:
        _fail(err, i, _NEED, fbase + _NCOLUMNS, -1, p, 2, end - p)
        return -1, e, d
    ncols = (np.int64(buf[p]) << 8) | np.int64(buf[p + 1])
    p += 2
    if ncols > end - p:  # every column takes at least its kind byte
        _fail(err, i, _TOO_MANY, fbase + _NCOLUMNS, -1, p - 2, ncols, end - p)
        return -1, e, d
    for j in range(ncols):
        if end - p < 1:
            _fail(err, i, _NEED, fbase + _KIND, j, p, 1, end - p)
            return -1, e, d
        k = np.int64(buf[p])
        kinds[e] = k
        offsets[e] = d
        if k == _TEXT or k == _BINARY:
            if end - (p + 1) < 4:
                _fail(err, i, _NEED, fbase + _LENGTH, j, p + 1, 4, end - (p + 1))
                return -1, e, d
            length = _int32(buf, p + 1)
            if length < 0:
                _fail(err, i, _NEGATIVE, fbase + _LENGTH, j, p + 1, length, 0)
                return -1, e, d
            if end - (p + 5) < length:
                _fail(err, i, _NEED, fbase + _VALUE, j, p + 5, length, end - (p + 5))
                return -1, e, d
            _copy(data, d, buf, p + 5, length)
            valid[e] = True
            d += length
            p += 5 + length
        elif k == _NULL or k == _TOAST:
            valid[e] = False
            p += 1
        else:
            _fail(err, i, _BAD_KIND, fbase + _KIND, j, p, k, 0)
            return -1, e, d
        e += 1
    offsets[e] = d
    return p, e, d


@_jit
def _walk(buf, pos, ends, types, active, relation_id, old_kind, counts, err, old, new):  # pragma: no cover
    """Check every active change message and copy the tuples of the valid ones, in batch order.

    ``counts[i]`` gets message i's (old columns, new columns); ``old`` / ``new``
    are (kinds, offsets, valid, data) with room for every element and byte.
    A failed message leaves nothing behind. Returns the elements and bytes used
    in ``old`` and ``new``.
    """
    eo = do = en = dn = 0
    for i in range(pos.size):
        if not active[i]:
            continue
        p, end, t = pos[i], ends[i], types[i]
        if end - p < 4:
            _fail(err, i, _NEED, _F_RELATION_ID, -1, p, 4, end - p)
            continue
        relation_id[i] = ((np.int64(buf[p]) << 24) | (np.int64(buf[p + 1]) << 16)
                          | (np.int64(buf[p + 2]) << 8) | np.int64(buf[p + 3]))
        p += 4
        if end - p < 1:
            _fail(err, i, _NEED, _F_MARKER, -1, p, 1, end - p)
            continue
        marker = np.int64(buf[p])
        if t == _INSERT:
            wrong = marker != _NEW
        elif t == _UPDATE:
            wrong = marker != _NEW and marker != _KEY and marker != _OLD
        else:
            wrong = marker != _KEY and marker != _OLD
        if wrong:
            _fail(err, i, _BAD_MARKER, _F_MARKER, -1, p, marker, 0)
            continue
        p += 1
        e0, d0 = eo, do
        if marker != _NEW:
            old_kind[i] = marker
            p, e1, d1 = _tuple(buf, p, end, _F_OLD, err, i, old, eo, do)
            if p < 0:
                continue
            if t == _UPDATE:
                if end - p < 1:
                    _fail(err, i, _NEED, _F_NEW_MARKER, -1, p, 1, end - p)
                    continue
                if buf[p] != _NEW:
                    _fail(err, i, _BAD_MARKER, _F_NEW_MARKER, -1, p, buf[p], 0)
                    continue
                p += 1
            eo, do = e1, d1  # kept only if the whole message is valid (checked below)
        e1, d1 = en, dn
        if t != _DELETE:
            p, e1, d1 = _tuple(buf, p, end, _F_NEW, err, i, new, en, dn)
            if p < 0:
                eo, do = e0, d0
                continue
        if p < end:
            _fail(err, i, _TRAILING, _F_END, -1, p, end - p, 0)
            eo, do = e0, d0
            continue
        counts[i, 0], counts[i, 1] = eo - e0, e1 - en
        en, dn = e1, d1
    return eo, do, en, dn


class _Scratch(threading.local):
    """Per-thread element arrays (kinds, offsets, valid), reused from batch to batch.

    Sized by the bytes of the messages (every column takes at least one), so
    larger than needed; the elements used are copied out. Fresh arrays of that
    size would come from new mmaps whose page faults cost three times the walk.
    """

    def __init__(self) -> None:
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def get(self, part: int, columns: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        while len(self.parts) <= part:
            self.parts.append((np.empty(0, np.uint8), np.empty(1, np.int32), np.empty(0, np.bool_)))
        if self.parts[part][0].size < columns:
            size = max(columns, 2 * self.parts[part][0].size)
            self.parts[part] = (np.empty(size, np.uint8), np.empty(size + 1, np.int32),
                                np.empty(size, np.bool_))
        return self.parts[part]


_SCRATCH = _Scratch()


def _elements(part: int, columns: int, nbytes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(kinds, offsets, valid, data) with room for ``columns`` elements and ``nbytes`` of values.

    ``data`` is a new, uninitialised array: its pages are touched only as far
    as values are written, and its used part becomes the Arrow buffer.
    """
    if nbytes >= 1 << 31:
        raise OverflowError("more than 2 GiB of values in one Arrow batch; lower "
                            "spark.sql.execution.arrow.maxRecordsPerBatch")
    return (*_SCRATCH.get(part, columns), np.empty(nbytes, dtype=np.uint8))


def _tuple_list(counts: np.ndarray, present: np.ndarray,
                parts: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
                used: int, nbytes: int) -> pa.ListArray:
    """The list column of one TupleData part from the first ``used`` elements of ``parts``."""
    kinds, offsets, valid = parts[0][:used].copy(), parts[1][:used + 1].copy(), parts[2][:used]
    if used == 0:
        offsets = np.zeros(1, dtype=np.int32)
    nulls = int(used - np.count_nonzero(valid))
    values = pa.Array.from_buffers(
        pa.binary(), used,
        [ab.bitmap(valid), pa.py_buffer(offsets), pa.py_buffer(parts[3][:nbytes])],
        null_count=nulls)
    elements = pa.StructArray.from_arrays(
        [ab.char_array(kinds, np.ones(used, dtype=bool)), values], fields=list(sc.TUPLE_VALUE))
    return ab.list_array(counts, present, elements, sc.TUPLE_VALUE)


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
                text = MARKERS[kind] if field_id == _F_MARKER else NEW_MARKER
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
    counts = np.zeros((n, 2), dtype=np.int64)
    err = np.zeros((n, 6), dtype=np.int64)
    room = int((reader.ends[active] - pos[active]).sum())
    old, new = _elements(0, room, room), _elements(1, room, room)
    eo, do, en, dn = _walk(reader.buf, pos, reader.ends, types, active, relation_id, old_kind,
                           counts, err, old, new)
    _record_errors(reader, types, err)
    valid = active & (err[:, 0] == 0)
    has_old = valid & (old_kind != 0)
    has_new = valid & (types != _DELETE)
    return pa.StructArray.from_arrays(
        [pa.array(relation_id), ab.char_array(old_kind, has_old),
         _tuple_list(counts[:, 0], has_old, old, eo, do),
         _tuple_list(counts[:, 1], has_new, new, en, dn)],
        fields=list(sc.CHANGE), mask=ab.mask_array(valid),
    )


__all__ = ["change_column", "engine"]
