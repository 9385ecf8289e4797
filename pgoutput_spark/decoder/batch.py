"""Decode a whole batch of pgoutput messages into the Arrow layout of `schema`.

Messages are grouped by type byte; each group is decoded field by field with
one vectorized `Cursor` read per field (and per column position for Relation
and TupleData parts), so the work per batch is a fixed number of NumPy calls
per message type and column position, never a Python step per message or value.
Insert, Update and Delete, most of a capture, are walked by the compiled
kernel of `kernel` instead where numba is installed; their NumPy walk
(`change`) is the reference it is tested against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import DecodeError
from . import arrow as ab
from . import kernel
from . import schema as sc
from .protocol import (
    MESSAGE_FLAG_TRANSACTIONAL,
    XLOGDATA_HEADER_SIZE,
    XLOGDATA_TYPE,
    MessageType,
    ReplicaIdentity,
    TruncateOption,
)
from .change import ChangePart, change_column, read_change
from .reader import BatchReader, Cursor, ErrorCode

Framing = Literal["auto", "none", "xlogdata"]
Engine = Literal["numba", "numpy"]

_REPLICA_IDENTITY = tuple(ord(r.value) for r in ReplicaIdentity)
_TYPE_NAMES = pa.array([t.column_name for t in MessageType])
_TYPE_INDEX = np.full(256, -1, dtype=np.int8)
for _i, _t in enumerate(MessageType):
    _TYPE_INDEX[_t] = _i

# Fixed layouts: (field, reader) in wire order. Readers: u8/u32 unsigned ints,
# i32, lsn, ts (TimestampTz), str (NUL-terminated), bool (Int8 as boolean).
_LAYOUTS: dict[MessageType, tuple[tuple[str, str], ...]] = {
    MessageType.BEGIN: (("final_lsn", "lsn"), ("commit_ts", "ts"), ("xid", "u32")),
    MessageType.COMMIT: (("flags", "u8"), ("commit_lsn", "lsn"), ("end_lsn", "lsn"), ("commit_ts", "ts")),
    MessageType.ORIGIN: (("commit_lsn", "lsn"), ("name", "str")),
    MessageType.TYPE: (("type_id", "u32"), ("namespace", "str"), ("name", "str")),
    MessageType.STREAM_START: (("xid", "u32"), ("first_segment", "bool")),
    MessageType.STREAM_STOP: (),
    MessageType.STREAM_COMMIT: (
        ("xid", "u32"), ("flags", "u8"), ("commit_lsn", "lsn"), ("end_lsn", "lsn"), ("commit_ts", "ts"),
    ),
    MessageType.BEGIN_PREPARE: (
        ("prepare_lsn", "lsn"), ("end_lsn", "lsn"), ("prepare_ts", "ts"), ("xid", "u32"), ("gid", "str"),
    ),
    MessageType.PREPARE: (
        ("flags", "u8"), ("prepare_lsn", "lsn"), ("end_lsn", "lsn"), ("prepare_ts", "ts"),
        ("xid", "u32"), ("gid", "str"),
    ),
    MessageType.COMMIT_PREPARED: (
        ("flags", "u8"), ("commit_lsn", "lsn"), ("end_lsn", "lsn"), ("commit_ts", "ts"),
        ("xid", "u32"), ("gid", "str"),
    ),
    MessageType.ROLLBACK_PREPARED: (
        ("flags", "u8"), ("prepare_end_lsn", "lsn"), ("rollback_end_lsn", "lsn"),
        ("prepare_ts", "ts"), ("rollback_ts", "ts"), ("xid", "u32"), ("gid", "str"),
    ),
}
_LAYOUTS[MessageType.STREAM_PREPARE] = _LAYOUTS[MessageType.PREPARE]

#: Which struct column each message type fills.
FAMILY_OF: dict[MessageType, str] = {
    MessageType.BEGIN: "begin",
    MessageType.COMMIT: "commit",
    MessageType.ORIGIN: "origin",
    MessageType.RELATION: "relation",
    MessageType.TYPE: "type",
    MessageType.MESSAGE: "message",
    MessageType.INSERT: "change",
    MessageType.UPDATE: "change",
    MessageType.DELETE: "change",
    MessageType.TRUNCATE: "truncate",
    MessageType.STREAM_START: "stream_start",
    MessageType.STREAM_COMMIT: "stream_commit",
    MessageType.STREAM_ABORT: "stream_abort",
    MessageType.BEGIN_PREPARE: "prepare",
    MessageType.PREPARE: "prepare",
    MessageType.STREAM_PREPARE: "prepare",
    MessageType.COMMIT_PREPARED: "commit_prepared",
    MessageType.ROLLBACK_PREPARED: "rollback_prepared",
}


@dataclass
class DecodedBatch:
    """A decoded batch and the error details of the messages that failed."""

    batch: pa.RecordBatch
    reader: BatchReader
    seq: np.ndarray
    lsn: np.ndarray

    @property
    def error_rows(self) -> np.ndarray:
        return np.flatnonzero(self.reader.bad)

    def error(self, row: int) -> DecodeError:
        """The `DecodeError` of one failed row of this batch."""
        return self.reader.error(row, int(self.seq[row]), int(self.lsn[row]))


class _Values:
    """Raw field values of one group, turned into Arrow once all checks ran."""

    def __init__(self, cur: Cursor) -> None:
        self.cur = cur
        self.raw: dict[str, tuple[str, Any]] = {}  # (kind, NumPy array, or (start, length) of strings)

    def read(self, layout: tuple[tuple[str, str], ...]) -> None:
        cur = self.cur
        for name, kind in layout:
            if kind == "lsn":
                self.raw[name] = ("int", cur.lsn(name))
            elif kind == "ts":
                self.raw[name] = ("ts", cur.timestamp(name))
            elif kind == "u32":
                self.raw[name] = ("int", cur.uint(4, name))
            elif kind == "u8":
                self.raw[name] = ("int", cur.uint(1, name))
            elif kind == "i32":
                self.raw[name] = ("int", cur.int32(name))
            elif kind == "bool":
                self.raw[name] = ("bool", cur.uint(1, name) != 0)
            elif kind == "str":
                self.raw[name] = ("str", cur.cstring(name))
            else:  # pragma: no cover - layouts are static
                raise AssertionError(kind)

    def struct(self, type_: pa.StructType, extra: dict[str, pa.Array] | None = None) -> pa.StructArray:
        """The group's struct array; call after the group's last check."""
        cur = self.cur
        strings = {}
        for name, (kind, value) in self.raw.items():
            if kind == "str":
                start, length = value
                strings[name] = ab.string_array(cur.r, cur.rows, start, length, cur.ok,
                                                f"{cur.name}.{name}")
        ok = cur.ok
        children = []
        for field in type_:
            if extra and field.name in extra:
                children.append(extra[field.name])
                continue
            if field.name not in self.raw:
                children.append(pa.nulls(len(cur), type=field.type))
                continue
            kind, value = self.raw[field.name]
            if kind == "str":
                children.append(strings[field.name])
            else:
                children.append(pa.array(value, type=field.type))
        return pa.StructArray.from_arrays(children, fields=list(type_), mask=ab.mask_array(ok))


def _unframe(reader: BatchReader, starts: np.ndarray, ends: np.ndarray, lsn: np.ndarray,
             framing: Framing) -> None:
    """Strip XLogData headers in place: message start moves past it, LSN = dataStart."""
    if framing == "none":
        return
    length = ends - starts
    first = np.where(length > 0, reader.buf[np.minimum(starts, reader.last)], 0)
    framed = np.flatnonzero((first == XLOGDATA_TYPE) & (length > 0))
    if framing == "xlogdata":
        wrong = np.flatnonzero((first != XLOGDATA_TYPE) & (length > 0))
        reader.fail(wrong, "XLogData.type", ErrorCode.BAD_MARKER, starts[wrong],
                    a=first[wrong].astype(np.int64), text="'w'")
    if framed.size == 0:
        return
    cur = Cursor(reader, framed, starts[framed] + 1, "XLogData")
    data_start = cur.lsn("data_start")
    cur.lsn("wal_end")
    cur.timestamp("send_time")
    good = cur.ok
    lsn[framed[good]] = data_start[good]
    starts[framed[good]] = starts[framed[good]] + XLOGDATA_HEADER_SIZE
    reader.starts = starts


def _stream_xid(cur: Cursor, in_stream: np.ndarray, stream_xid: np.ndarray) -> None:
    """Read the leading xid of messages sent inside a stream block."""
    inside = in_stream[cur.rows]
    if not inside.any():
        return
    sub = cur.where(inside)
    xid = sub.uint(4, "xid")
    cur.pos[inside] = sub.pos
    stream_xid[sub.rows] = xid


def _relation(cur: Cursor) -> pa.StructArray:
    values = _Values(cur)
    values.read((("relation_id", "u32"), ("namespace", "str"), ("relation_name", "str")))
    ident = cur.expect(_REPLICA_IDENTITY, "replica_identity", "'d', 'n', 'f' or 'i'")
    ncols = cur.uint(2, "ncolumns")
    left = cur.r.ends[cur.rows] - cur.pos
    too_many = ncols * 10 > left  # flags + NUL + type oid + modifier at least
    cur.r.fail(cur.rows[too_many], "Relation.ncolumns", ErrorCode.TOO_MANY, cur.pos[too_many] - 2,
               a=ncols[too_many], b=left[too_many])
    counts = np.where(cur.ok, ncols, 0)
    offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    total = int(offsets[-1])
    owner = np.repeat(cur.rows, counts)
    flags = np.zeros(total, dtype=np.int64)
    name_start = np.zeros(total, dtype=np.int64)
    name_length = np.zeros(total, dtype=np.int64)
    type_oid = np.zeros(total, dtype=np.int64)
    modifier = np.zeros(total, dtype=np.int32)
    j = 0
    active = counts > j
    while active.any():
        sub = cur.where(active)
        element = offsets[:-1][active] + j
        path = f"columns[{j}]"
        flags[element] = sub.uint(1, f"{path}.flags")
        name_start[element], name_length[element] = sub.cstring(f"{path}.name")
        type_oid[element] = sub.uint(4, f"{path}.type_oid")
        modifier[element] = sub.int32(f"{path}.type_modifier")
        cur.pos[active] = sub.pos
        j += 1
        active = cur.ok & (counts > j)
    cur.expect_end()
    element_ok = ~cur.r.bad[owner]
    names = ab.string_array(cur.r, owner, name_start, name_length, element_ok, "Relation.columns.name")
    element_ok = ~cur.r.bad[owner]
    columns = pa.StructArray.from_arrays(
        [pa.array(flags, type=sc.FLAGS), names, pa.array(type_oid), pa.array(modifier)],
        fields=list(sc.RELATION_COLUMN),
    )
    keep = pa.array(element_ok)
    column_list = ab.list_array(counts, cur.ok, columns.filter(keep), sc.RELATION_COLUMN)
    return values.struct(sc.RELATION, {
        "replica_identity": ab.char_array(ident, cur.ok),
        "columns": column_list,
    })


def _message(cur: Cursor) -> pa.StructArray:
    values = _Values(cur)
    values.read((("flags", "u8"), ("lsn", "lsn"), ("prefix", "str")))
    length = cur.int32("content.length").astype(np.int64)
    negative = length < 0
    cur.r.fail(cur.rows[negative], "Message.content.length", ErrorCode.NEGATIVE_LENGTH,
               cur.pos[negative] - 4, a=length[negative])
    length = np.maximum(length, 0)
    start = cur.pos.copy()
    cur._need(cur.rows, start, length, "content")
    cur.pos = start + length
    cur.expect_end()
    flags = values.raw["flags"][1]
    content = ab.binary_array(cur.r, start, length, cur.ok)
    return values.struct(sc.MESSAGE, {
        "transactional": pa.array((flags & MESSAGE_FLAG_TRANSACTIONAL) != 0),
        "content": content,
    })


def _truncate(cur: Cursor) -> pa.StructArray:
    values = _Values(cur)
    nrels = cur.uint(4, "nrelations")
    values.read((("options", "u8"),))
    left = cur.r.ends[cur.rows] - cur.pos
    too_many = nrels * 4 > left
    cur.r.fail(cur.rows[too_many], "Truncate.nrelations", ErrorCode.TOO_MANY, cur.pos[too_many] - 5,
               a=nrels[too_many], b=left[too_many])
    counts = np.where(cur.ok, nrels, 0)
    base = np.repeat(cur.pos, counts)
    offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    within = np.arange(base.size, dtype=np.int64) - np.repeat(offsets[:-1], counts)
    at = base + 4 * within
    oids = cur.r.view(">u4")[np.minimum(at, cur.r.buf.size - 4)].astype(np.int64)
    cur.pos = cur.pos + 4 * counts
    cur.expect_end()
    ok = cur.ok
    keep = np.repeat(ok, counts)
    options = values.raw["options"][1]
    return values.struct(sc.TRUNCATE, {
        "cascade": pa.array((options & TruncateOption.CASCADE) != 0),
        "restart_identity": pa.array((options & TruncateOption.RESTART_IDENTITY) != 0),
        "relation_ids": ab.list_array(counts, ok, pa.array(oids[keep]), sc.OID),
    })


def _stream_abort(cur: Cursor) -> pa.StructArray:
    values = _Values(cur)
    values.read((("xid", "u32"), ("subxid", "u32")))
    # Protocol 4 with parallel streaming adds the abort LSN and timestamp:
    # the message is 25 bytes long instead of 9.
    left = cur.r.ends[cur.rows] - cur.pos
    wrong = cur.ok & (left != 0) & (left != 16)
    if wrong.any():
        starts = cur.r.starts[cur.rows[wrong]]
        cur.r.fail(cur.rows[wrong], "StreamAbort", ErrorCode.BAD_LENGTH, starts,
                   a=(cur.r.ends[cur.rows[wrong]] - starts),
                   text="9, or 25 with protocol 4 parallel streaming")
    extended = cur.ok & (left == 16)
    lsn = np.zeros(len(cur), dtype=np.int64)
    ts = np.zeros(len(cur), dtype=np.int64)
    if extended.any():
        sub = cur.where(extended)
        lsn[extended] = sub.lsn("abort_lsn")
        ts[extended] = sub.timestamp("abort_ts")
        cur.pos[extended] = sub.pos
    cur.expect_end()
    return values.struct(sc.STREAM_ABORT, {
        "abort_lsn": pa.array(lsn, mask=~extended),
        "abort_ts": pa.array(ts, type=sc.TIMESTAMP, mask=~extended),
    })


def _fixed(cur: Cursor, kind: MessageType) -> pa.StructArray | None:
    values = _Values(cur)
    values.read(_LAYOUTS[kind])
    cur.expect_end()
    if kind is MessageType.STREAM_STOP:
        return None
    return values.struct(sc.FAMILIES[FAMILY_OF[kind]])


#: Where the ``change`` column sits in a decoded batch.
_CHANGE_AT = len(sc.HEAD) + list(sc.FAMILIES).index("change")


def _without_tuples(change: pa.StructArray) -> pa.StructArray:
    """``change`` with its tuples NULL (`decode_batch`'s ``tuples=False``)."""
    n = len(change)
    return pa.StructArray.from_arrays(
        [change.field("relation_id"), change.field("old_kind"), pa.nulls(n, sc.TUPLE), pa.nulls(n, sc.TUPLE)],
        fields=list(sc.CHANGE), mask=ab.mask_array(np.asarray(change.is_valid())))


_CHANGE_TYPES = pa.array([MessageType.INSERT.column_name, MessageType.UPDATE.column_name,
                          MessageType.DELETE.column_name])


def restore_tuples(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Decode the deferred tuples of ``batch`` (rows of `decode_batch` with ``tuples=False``).

    ``batch`` needs ``seq``, ``message_type``, ``in_stream`` and ``raw``
    (binary, or the same bytes typed as a string), and ``lsn``, ``error`` and
    ``change`` if present. Good change rows with ``raw`` get their ``change``
    decoded from it; other rows (those decoded with their tuples, truncates,
    failed messages) keep theirs, or NULL without a ``change`` column, which is
    then added. ``raw`` is left as it is.
    """
    names = batch.schema.names
    raw = batch.column("raw")
    if pa.types.is_string(raw.type):  # the bytes carried as text (`decode`'s ``raw_as_string``)
        raw = raw.view(pa.binary())
    if raw.null_count == len(raw) and "change" in names:
        return batch
    n = batch.num_rows
    is_change = pc.fill_null(pc.is_in(batch.column("message_type"), _CHANGE_TYPES), False)
    deferred = np.asarray(pc.and_(is_change, raw.is_valid()))
    if "error" in names:  # a failed message keeps its bytes in `raw` too
        deferred &= np.asarray(batch.column("error").is_null())
    rows = np.flatnonzero(deferred)
    seq = batch.column("seq").to_numpy(zero_copy_only=False)[rows]
    lsn = (batch.column("lsn").fill_null(0).to_numpy(zero_copy_only=False)[rows] if "lsn" in names
           else np.zeros(rows.size, np.int64))
    picked = raw.take(pa.array(rows)) if rows.size < n else raw
    decoded = decode_batch(picked, in_stream=batch.column("in_stream").to_numpy(zero_copy_only=False)[rows],
                           seq=seq, lsn=lsn, framing="none")
    if decoded.error_rows.size:  # the bytes were checked by the decode that deferred them
        raise decoded.error(int(decoded.error_rows[0]))
    change = decoded.batch.column("change")
    if rows.size < n:
        kept = np.flatnonzero(~deferred)
        parts = [(rows, change)]
        if "change" in names:
            parts.append((kept, batch.column("change").take(pa.array(kept)).cast(sc.CHANGE)))
        change = ab.take_into(n, parts, sc.CHANGE)
    if "change" not in names:
        return batch.append_column("change", change)
    at = names.index("change")
    return batch.set_column(at, batch.schema.field(at).with_type(change.type), change)


def decode_batch(
    data: pa.Array,
    *,
    in_stream: np.ndarray,
    seq: np.ndarray,
    lsn: np.ndarray,
    xid: pa.Array | None = None,
    framing: Framing = "auto",
    engine: Engine | None = None,
    tuples: bool = True,
) -> DecodedBatch:
    """Decode every message of ``data`` (an Arrow binary array).

    ``in_stream[i]`` says whether message i sits between Stream Start and Stream
    Stop (its leading xid is then present). Failed messages get NULL structs,
    their ``error`` and their ``raw`` bytes; see `DecodedBatch.error`.
    ``engine`` picks the walk of Insert / Update / Delete (default: `kernel.engine`):
    ``"numba"``, compiled, or ``"numpy"``; both give the same result.
    ``tuples=False`` defers the TupleData of Insert / Update / Delete: they are
    still read and checked, but their ``change`` keeps only ``relation_id`` and
    ``old_kind`` (tuples NULL) and ``raw`` holds the message (past any XLogData
    frame) for `restore_tuples`. A tuple is about 40 values where the
    message is one: far cheaper for Spark to cache and to shuffle.
    """
    if isinstance(data, pa.ChunkedArray):
        data = data.combine_chunks()
    offset_type: type[np.signedinteger[Any]]
    if pa.types.is_large_binary(data.type):
        offset_type = np.int64
    elif pa.types.is_binary(data.type):
        offset_type = np.int32
    else:
        raise TypeError(f"expected a binary array, got {data.type}")
    n = len(data)
    validity, offsets_buf, data_buf = data.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=offset_type)[data.offset: data.offset + n + 1]
    buf = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    starts = offsets[:-1].astype(np.int64)
    ends = offsets[1:].astype(np.int64)
    lsn = np.array(lsn, dtype=np.int64, copy=True)
    seq = np.asarray(seq, dtype=np.int64)
    in_stream = np.asarray(in_stream, dtype=bool)
    reader = BatchReader(buf, starts.copy(), ends)
    is_null = np.asarray(data.is_null()) if data.null_count else np.zeros(n, dtype=bool)
    reader.fail(np.flatnonzero(is_null), "message", ErrorCode.NULL, starts[is_null])
    _unframe(reader, reader.starts, ends, lsn, framing)
    starts = reader.starts
    empty = (ends <= starts) & ~reader.bad
    reader.fail(np.flatnonzero(empty), "message.type", ErrorCode.EMPTY, starts[empty])
    type_byte = np.where(reader.bad, 0, reader.buf[np.minimum(starts, reader.last)])
    type_index = _TYPE_INDEX[type_byte]
    unknown = (type_index < 0) & ~reader.bad
    reader.fail(np.flatnonzero(unknown), "message.type", ErrorCode.UNKNOWN_TYPE, starts[unknown],
                a=type_byte[unknown].astype(np.int64))

    in_stream = in_stream & (type_byte != MessageType.STREAM_STOP)
    stream_xid = np.full(n, -1, dtype=np.int64)
    families: dict[str, list[tuple[np.ndarray, pa.Array]]] = {name: [] for name in sc.FAMILIES}
    change_parts: list[ChangePart] = []
    compiled = (engine or kernel.engine()) == "numba"
    change_pos = np.zeros(n, dtype=np.int64)
    change_rows = np.zeros(n, dtype=bool)
    present = np.bincount(np.where(reader.bad, 0, type_byte), minlength=256)
    for kind in MessageType:
        if not present[kind]:
            continue
        rows = np.flatnonzero((type_byte == kind) & ~reader.bad)
        cur = Cursor(reader, rows, starts[rows] + 1, kind.doc_name)
        if kind.has_stream_xid:
            _stream_xid(cur, in_stream, stream_xid)
        if kind in (MessageType.INSERT, MessageType.UPDATE, MessageType.DELETE):
            if compiled:
                change_pos[rows] = cur.pos
                change_rows[rows] = True
            else:
                change_parts.append(read_change(cur, kind))
            continue
        elif kind is MessageType.RELATION:
            struct = _relation(cur)
        elif kind is MessageType.MESSAGE:
            struct = _message(cur)
        elif kind is MessageType.TRUNCATE:
            struct = _truncate(cur)
        elif kind is MessageType.STREAM_ABORT:
            struct = _stream_abort(cur)
        else:
            struct = _fixed(cur, kind)
        if struct is not None:
            families[FAMILY_OF[kind]].append((rows, struct))

    change = (kernel.change_column(reader, type_byte, change_pos, change_rows) if compiled
              else change_column(reader, n, change_parts))
    bad = reader.bad
    columns: list[pa.Array] = [
        pa.array(seq),
        pa.array(lsn),
        xid if xid is not None else pa.nulls(n, type=sc.XID),
        pa.DictionaryArray.from_arrays(
            pa.array(type_index, mask=type_index < 0), _TYPE_NAMES).cast(pa.string()),
        pa.array(in_stream),
        pa.array(stream_xid, mask=(stream_xid < 0) | bad),
    ]
    for name, type_ in sc.FAMILIES.items():
        if name == "change":
            columns.append(change)
            continue
        parts = [(rows, struct) if not bad[rows].any() else
                 (rows[~bad[rows]], struct.filter(pa.array(~bad[rows])))
                 for rows, struct in families[name]]
        columns.append(ab.take_into(n, parts, type_))
    error_rows = np.flatnonzero(bad)
    if error_rows.size:
        messages = np.empty(n, dtype=object)
        for row in error_rows:  # error path only
            messages[row] = str(reader.error(int(row), int(seq[row]), int(lsn[row])))
        columns.append(pa.array(messages, type=pa.string(), from_pandas=True))
    else:
        columns.append(pa.nulls(n, type=pa.string()))
    raw = [(error_rows, data.filter(pa.array(bad)))] if error_rows.size else []
    if not tuples and change.null_count < n:
        rows = np.flatnonzero(np.asarray(change.is_valid()) & ~bad)
        raw.append((rows, reader.gather(starts[rows], ends[rows] - starts[rows], np.ones(rows.size, bool))))
        columns[_CHANGE_AT] = _without_tuples(change)
    columns.append(ab.take_into(n, raw, pa.binary()))
    return DecodedBatch(pa.RecordBatch.from_arrays(columns, schema=sc.DECODED_SCHEMA), reader, seq, lsn)
