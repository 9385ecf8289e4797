"""Typed objects for single messages, and `decode_message` for notebooks and error reports.

`decode_message` runs the same vectorized decoder as the Spark path on a batch
of one, then turns the row into one of the dataclasses below, so both paths
agree byte for byte and error for error.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from ..lsn import Lsn
from .batch import FAMILY_OF, decode_batch
from .protocol import COLUMN_FLAG_KEY, MessageType, ReplicaIdentity, TupleKind


@dataclass(frozen=True)
class TupleValue:
    kind: TupleKind
    value: bytes | None

    def __repr__(self) -> str:
        if self.kind is TupleKind.NULL:
            return "null"
        if self.kind is TupleKind.UNCHANGED_TOAST:
            return "unchanged-toast"
        return f"{chr(self.kind)}:{self.value!r}"


@dataclass(frozen=True)
class RelationColumn:
    flags: int
    name: str
    type_oid: int
    type_modifier: int

    @property
    def is_key(self) -> bool:
        return bool(self.flags & COLUMN_FLAG_KEY)


#: The wire type of each field, as the protocol documentation names it (`Message.describe`).
_WIRE = {
    "xid": "Int32 (TransactionId)", "subxid": "Int32 (TransactionId)", "relation_id": "Int32 (Oid)",
    "type_id": "Int32 (Oid)", "flags": "Int8", "options": "Int8", "first_segment": "Int8",
    "replica_identity": "Int8", "old_kind": "Byte1", "transactional": "flags & 1",
    "cascade": "options & 1", "restart_identity": "options & 2", "content": "Int32 + Byten",
    "columns": "Int16 + columns", "relation_ids": "Int32 + Int32 (Oid)[]",
    "new_tuple": "TupleData", "old_tuple": "TupleData",
}


def _wire(name: str, value: Any) -> str:
    if name in _WIRE:
        return _WIRE[name]
    if isinstance(value, Lsn) or name.endswith("_lsn") or name == "lsn":
        return "Int64 (XLogRecPtr)"
    if isinstance(value, datetime) or name.endswith("_ts"):
        return "Int64 (TimestampTz)"
    return "String"


def _shown(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, Lsn):
        return str(value)
    if isinstance(value, enum.Enum):
        code = chr(value.value) if isinstance(value.value, int) else value.value
        return f"{value.name.lower()} ({code!r})"
    if isinstance(value, bytes) and len(value) > 60:
        return f"{value[:60]!r}... ({len(value)} bytes)"
    return repr(value)


@dataclass(frozen=True)
class Message:
    """Base of all decoded messages."""

    type: ClassVar[MessageType]

    def describe(self) -> str:
        """The message laid out like the protocol documentation: type byte, then each field.

        ``str(message)`` (and ``print``) gives this; ``repr`` stays the dataclass form.
        """
        lines = [f"{type(self).__name__}  Byte1({chr(self.type.value)!r})"]
        fields = [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)]
        width = max([len(name) for name, _ in fields] or [0])
        kinds = max([len(_wire(name, value)) for name, value in fields] or [0])
        for name, value in fields:
            if name == "xid" and value is None:
                continue  # no leading xid: the message is outside a stream block
            if name == "columns":
                lines.append(f"  {_wire(name, value):<{kinds}}  {name:<{width}}  {len(value)}")
                for c in value:
                    lines.append(f"      flags {c.flags} ({'key' if c.is_key else 'not key'})  name {c.name!r}  "
                                 f"type {c.type_oid}  typmod {c.type_modifier}")
            elif name in ("new_tuple", "old_tuple") and value is not None:
                lines.append(f"  {_wire(name, value):<{kinds}}  {name:<{width}}  {len(value)} columns")
                for i, v in enumerate(value):
                    lines.append(f"      [{i}] {v!r}")
            else:
                lines.append(f"  {_wire(name, value):<{kinds}}  {name:<{width}}  {_shown(value)}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # IPython / Jupyter display
        printer.text(self.describe())


@dataclass(frozen=True)
class Begin(Message):
    type = MessageType.BEGIN
    final_lsn: Lsn
    commit_ts: datetime
    xid: int


@dataclass(frozen=True)
class Commit(Message):
    type = MessageType.COMMIT
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_ts: datetime


@dataclass(frozen=True)
class Origin(Message):
    type = MessageType.ORIGIN
    commit_lsn: Lsn
    name: str


@dataclass(frozen=True)
class Relation(Message):
    type = MessageType.RELATION
    relation_id: int
    namespace: str
    relation_name: str
    replica_identity: ReplicaIdentity
    columns: tuple[RelationColumn, ...]
    xid: int | None = None


@dataclass(frozen=True)
class Type(Message):
    type = MessageType.TYPE
    type_id: int
    namespace: str
    name: str
    xid: int | None = None


@dataclass(frozen=True)
class LogicalMessage(Message):
    type = MessageType.MESSAGE
    flags: int
    transactional: bool
    lsn: Lsn
    prefix: str
    content: bytes
    xid: int | None = None


@dataclass(frozen=True)
class Insert(Message):
    type = MessageType.INSERT
    relation_id: int
    new_tuple: tuple[TupleValue, ...]
    xid: int | None = None


@dataclass(frozen=True)
class Update(Message):
    type = MessageType.UPDATE
    relation_id: int
    old_kind: str | None
    old_tuple: tuple[TupleValue, ...] | None
    new_tuple: tuple[TupleValue, ...]
    xid: int | None = None


@dataclass(frozen=True)
class Delete(Message):
    type = MessageType.DELETE
    relation_id: int
    old_kind: str
    old_tuple: tuple[TupleValue, ...]
    xid: int | None = None


@dataclass(frozen=True)
class Truncate(Message):
    type = MessageType.TRUNCATE
    options: int
    cascade: bool
    restart_identity: bool
    relation_ids: tuple[int, ...]
    xid: int | None = None


@dataclass(frozen=True)
class StreamStart(Message):
    type = MessageType.STREAM_START
    xid: int
    first_segment: bool


@dataclass(frozen=True)
class StreamStop(Message):
    type = MessageType.STREAM_STOP


@dataclass(frozen=True)
class StreamCommit(Message):
    type = MessageType.STREAM_COMMIT
    xid: int
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_ts: datetime


@dataclass(frozen=True)
class StreamAbort(Message):
    type = MessageType.STREAM_ABORT
    xid: int
    subxid: int
    abort_lsn: Lsn | None = None
    abort_ts: datetime | None = None


@dataclass(frozen=True)
class BeginPrepare(Message):
    type = MessageType.BEGIN_PREPARE
    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_ts: datetime
    xid: int
    gid: str


@dataclass(frozen=True)
class Prepare(Message):
    type = MessageType.PREPARE
    flags: int
    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_ts: datetime
    xid: int
    gid: str


@dataclass(frozen=True)
class StreamPrepare(Prepare):
    type = MessageType.STREAM_PREPARE


@dataclass(frozen=True)
class CommitPrepared(Message):
    type = MessageType.COMMIT_PREPARED
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_ts: datetime
    xid: int
    gid: str


@dataclass(frozen=True)
class RollbackPrepared(Message):
    type = MessageType.ROLLBACK_PREPARED
    flags: int
    prepare_end_lsn: Lsn
    rollback_end_lsn: Lsn
    prepare_ts: datetime
    rollback_ts: datetime
    xid: int
    gid: str


MESSAGE_CLASSES: dict[MessageType, type[Message]] = {
    cls.type: cls
    for cls in (Begin, Commit, Origin, Relation, Type, LogicalMessage, Insert, Update, Delete,
                Truncate, StreamStart, StreamStop, StreamCommit, StreamAbort, BeginPrepare,
                Prepare, StreamPrepare, CommitPrepared, RollbackPrepared)
}


def _tuple(values: list[dict[str, Any]] | None) -> tuple[TupleValue, ...] | None:
    if values is None:
        return None
    return tuple(TupleValue(TupleKind(ord(v["kind"])), v["value"]) for v in values)


def _field(name: str, value: Any) -> Any:
    if value is None:
        return None
    if name.endswith("_lsn") or name == "lsn":
        return Lsn(value)
    if name.endswith("_tuple"):
        return _tuple(value)
    if name == "columns":
        return tuple(RelationColumn(**c) for c in value)
    if name == "replica_identity":
        return ReplicaIdentity(value)
    if name == "relation_ids":
        return tuple(value)
    return value


def message_from_row(row: dict[str, Any]) -> Message:
    """The typed message of one decoded row (as from ``batch.to_pylist()``)."""
    kind = MessageType[row["message_type"].upper()]
    cls = MESSAGE_CLASSES[kind]
    family = FAMILY_OF.get(kind)
    values = dict(row[family]) if family else {}
    if row.get("stream_xid") is not None and "xid" not in values:
        values["xid"] = row["stream_xid"]
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: _field(k, v) for k, v in values.items() if k in names})


def decode_message(data: bytes, in_stream: bool = False, *, seq: int | None = None,
                   lsn: int | None = None) -> Message:
    """Decode one pgoutput message into a typed object.

    ``in_stream`` says whether the message sits between Stream Start and Stream
    Stop (data messages then carry a leading xid). ``seq`` / ``lsn`` only
    label a `DecodeError`. XLogData-framed payloads (``w`` ...) are unwrapped.
    """
    decoded = decode_batch(
        pa.array([bytes(data)], type=pa.binary()),
        in_stream=np.array([in_stream]),
        seq=np.array([seq if seq is not None else -1]),
        lsn=np.array([lsn if lsn is not None else 0]),
    )
    if decoded.reader.bad[0]:
        raise decoded.reader.error(0, seq, None if lsn is None else int(decoded.lsn[0]))
    return message_from_row(decoded.batch.to_pylist()[0])
