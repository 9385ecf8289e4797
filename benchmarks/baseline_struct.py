"""A plain per-message pgoutput decoder with `struct`: the benchmark's baseline.

This is how one would write a decoder in pure Python without thinking about
batches: one call per message, precompiled `struct.Struct` readers, dispatch on
the type byte through a table, TupleData walked column by column. It decodes
Begin, Commit, Relation, Insert, Update, Delete and Truncate (protocol 1, the
benchmark capture) into plain tuples; column values stay raw bytes, as in the
vectorized decoder's output. Reads are bounds-checked (``struct`` raises on a
short buffer, value lengths are checked against the message, trailing bytes are
an error), so it does the same checking work as the decoder it is compared with.

Decoded shapes (type byte first, LSNs and timestamps as ints)::

    (B, final_lsn, commit_ts, xid)
    (C, flags, commit_lsn, end_lsn, commit_ts)
    (R, relation_id, namespace, relation_name, replica_identity,
        ((flags, name, type_oid, type_modifier), ...))
    (I, relation_id, None, None, new_tuple)
    (U, relation_id, old_kind | None, old_tuple | None, new_tuple)
    (D, relation_id, old_kind, old_tuple, None)
    (T, options, (relation_id, ...))

where a tuple is ``((kind, value | None), ...)`` with kind the column's kind byte.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from typing import Any

from pgoutput_spark.decoder.protocol import MessageType, TupleKind, TupleMarker

Decoded = tuple[Any, ...]
TupleValues = tuple[tuple[int, bytes | None], ...]

_BEGIN = struct.Struct(">QqI")
_COMMIT = struct.Struct(">BQQq")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_TRUNCATE_HEAD = struct.Struct(">IB")
_COLUMN_TAIL = struct.Struct(">Ii")  # type oid, type modifier

# Plain ints: comparing bytes of `data` with them is the cheapest test there is.
_NULL, _TOAST = int(TupleKind.NULL), int(TupleKind.UNCHANGED_TOAST)
_TEXT, _BINARY = int(TupleKind.TEXT), int(TupleKind.BINARY)
_NEW, _KEY, _OLD = int(TupleMarker.NEW), int(TupleMarker.KEY), int(TupleMarker.OLD)


class BaselineDecodeError(Exception):
    """A message the baseline decoder could not decode."""


def _check_end(data: bytes, pos: int, what: str) -> None:
    if pos != len(data):
        raise BaselineDecodeError(f"{what}: {len(data) - pos} trailing bytes at offset {pos}")


def _cstring(data: bytes, pos: int) -> tuple[str, int]:
    end = data.find(b"\0", pos)  # bounded by the message: data is one message
    if end < 0:
        raise BaselineDecodeError(f"string at offset {pos} has no NUL terminator")
    return data[pos:end].decode(), end + 1


def _tuple_data(data: bytes, pos: int) -> tuple[TupleValues, int]:
    (ncols,) = _U16.unpack_from(data, pos)
    pos += 2
    size = len(data)
    values: list[tuple[int, bytes | None]] = []
    append = values.append
    for _ in range(ncols):
        kind = data[pos]
        if kind == _TEXT or kind == _BINARY:
            (length,) = _I32.unpack_from(data, pos + 1)
            start = pos + 5
            pos = start + length
            if length < 0 or pos > size:
                raise BaselineDecodeError(f"value length {length} at offset {start - 4} out of bounds")
            append((kind, data[start:pos]))
        elif kind == _NULL or kind == _TOAST:
            append((kind, None))
            pos += 1
        else:
            raise BaselineDecodeError(f"unknown tuple value kind {kind:#04x} at offset {pos}")
    return tuple(values), pos


def _begin(data: bytes) -> Decoded:
    _check_end(data, 1 + _BEGIN.size, "Begin")
    return (MessageType.BEGIN, *_BEGIN.unpack_from(data, 1))


def _commit(data: bytes) -> Decoded:
    _check_end(data, 1 + _COMMIT.size, "Commit")
    return (MessageType.COMMIT, *_COMMIT.unpack_from(data, 1))


def _relation(data: bytes) -> Decoded:
    (relation_id,) = _U32.unpack_from(data, 1)
    namespace, pos = _cstring(data, 5)
    name, pos = _cstring(data, pos)
    identity = chr(data[pos])
    (ncols,) = _U16.unpack_from(data, pos + 1)
    pos += 3
    columns = []
    for _ in range(ncols):
        flags = data[pos]
        column, pos = _cstring(data, pos + 1)
        type_oid, modifier = _COLUMN_TAIL.unpack_from(data, pos)
        pos += _COLUMN_TAIL.size
        columns.append((flags, column, type_oid, modifier))
    _check_end(data, pos, "Relation")
    return (MessageType.RELATION, relation_id, namespace, name, identity, tuple(columns))


def _insert(data: bytes) -> Decoded:
    (relation_id,) = _U32.unpack_from(data, 1)
    if data[5] != _NEW:
        raise BaselineDecodeError(f"Insert: expected 'N' at offset 5, got {data[5]:#04x}")
    new, pos = _tuple_data(data, 6)
    _check_end(data, pos, "Insert")
    return (MessageType.INSERT, relation_id, None, None, new)


def _update(data: bytes) -> Decoded:
    (relation_id,) = _U32.unpack_from(data, 1)
    marker = data[5]
    old_kind = old = None
    pos = 6
    if marker == _KEY or marker == _OLD:
        old_kind = marker
        old, pos = _tuple_data(data, 6)
        marker = data[pos]
        pos += 1
    if marker != _NEW:
        raise BaselineDecodeError(f"Update: expected 'N' at offset {pos - 1}, got {marker:#04x}")
    new, pos = _tuple_data(data, pos)
    _check_end(data, pos, "Update")
    return (MessageType.UPDATE, relation_id, old_kind, old, new)


def _delete(data: bytes) -> Decoded:
    (relation_id,) = _U32.unpack_from(data, 1)
    old_kind = data[5]
    if old_kind != _KEY and old_kind != _OLD:
        raise BaselineDecodeError(f"Delete: expected 'K' or 'O' at offset 5, got {old_kind:#04x}")
    old, pos = _tuple_data(data, 6)
    _check_end(data, pos, "Delete")
    return (MessageType.DELETE, relation_id, old_kind, old, None)


def _truncate(data: bytes) -> Decoded:
    nrelations, options = _TRUNCATE_HEAD.unpack_from(data, 1)
    end = 1 + _TRUNCATE_HEAD.size + 4 * nrelations
    _check_end(data, end, "Truncate")
    relation_ids = struct.unpack_from(f">{nrelations}I", data, 1 + _TRUNCATE_HEAD.size)
    return (MessageType.TRUNCATE, options, relation_ids)


def _unknown(data: bytes) -> Decoded:
    if not data:
        raise BaselineDecodeError("empty message")
    raise BaselineDecodeError(f"unsupported message type byte {data[0]:#04x}")


_DISPATCH: list[Callable[[bytes], Decoded]] = [_unknown] * 256
for _kind, _decoder in {
    MessageType.BEGIN: _begin,
    MessageType.COMMIT: _commit,
    MessageType.RELATION: _relation,
    MessageType.INSERT: _insert,
    MessageType.UPDATE: _update,
    MessageType.DELETE: _delete,
    MessageType.TRUNCATE: _truncate,
}.items():
    _DISPATCH[_kind] = _decoder


def decode_message(data: bytes) -> Decoded:
    """Decode one pgoutput message (see the module docstring for the shapes)."""
    try:
        return _DISPATCH[data[0]](data)
    except (struct.error, IndexError) as exc:
        raise BaselineDecodeError(f"message type {data[:1]!r} is truncated: {exc}") from exc


def decode_all(messages: Iterable[bytes]) -> list[Decoded]:
    """Decode every message, in order."""
    dispatch = _DISPATCH
    out: list[Decoded] = []
    append = out.append
    try:
        for data in messages:
            append(dispatch[data[0]](data))
    except (struct.error, IndexError) as exc:
        raise BaselineDecodeError(f"a message is truncated: {exc}") from exc
    return out
