"""Byte codes of the pgoutput logical replication protocol (versions 1 to 4).

Names follow PostgreSQL's "Logical Replication Message Formats" chapter; the
enum values are the message's first byte, so vectorized code compares
``type_bytes == MessageType.INSERT`` instead of magic numbers.
"""

from __future__ import annotations

import enum

#: Microseconds between the Unix epoch and PostgreSQL's epoch (2000-01-01 UTC).
PG_EPOCH_OFFSET_US = 946_684_800_000_000

#: The walsender's XLogData framing: Byte1('w'), Int64 dataStart, Int64 walEnd,
#: Int64 sendTime, then the pgoutput message.
XLOGDATA_TYPE = ord("w")
XLOGDATA_HEADER_SIZE = 1 + 8 + 8 + 8


class MessageType(enum.IntEnum):
    """The first byte of every pgoutput message."""

    BEGIN = ord("B")
    MESSAGE = ord("M")
    COMMIT = ord("C")
    ORIGIN = ord("O")
    RELATION = ord("R")
    TYPE = ord("Y")
    INSERT = ord("I")
    UPDATE = ord("U")
    DELETE = ord("D")
    TRUNCATE = ord("T")
    STREAM_START = ord("S")
    STREAM_STOP = ord("E")
    STREAM_COMMIT = ord("c")
    STREAM_ABORT = ord("A")
    BEGIN_PREPARE = ord("b")
    PREPARE = ord("P")
    COMMIT_PREPARED = ord("K")
    ROLLBACK_PREPARED = ord("r")
    STREAM_PREPARE = ord("p")

    @property
    def doc_name(self) -> str:
        """The name the PostgreSQL docs use, e.g. ``StreamStart`` (used in field paths)."""
        return "".join(part.capitalize() for part in self.name.split("_"))

    @property
    def column_name(self) -> str:
        """The snake_case name used in decoded DataFrames, e.g. ``stream_start``."""
        return self.name.lower()

    @property
    def has_stream_xid(self) -> bool:
        """Whether the message starts with an xid when sent inside a stream block."""
        return self in _STREAMABLE


_STREAMABLE = frozenset(
    {
        MessageType.MESSAGE,
        MessageType.RELATION,
        MessageType.TYPE,
        MessageType.INSERT,
        MessageType.UPDATE,
        MessageType.DELETE,
        MessageType.TRUNCATE,
    }
)


class TupleKind(enum.IntEnum):
    """The kind byte of each column value inside TupleData."""

    NULL = ord("n")
    UNCHANGED_TOAST = ord("u")
    TEXT = ord("t")
    BINARY = ord("b")


class TupleMarker(enum.IntEnum):
    """The byte that introduces a TupleData part in Insert / Update / Delete."""

    NEW = ord("N")
    KEY = ord("K")
    OLD = ord("O")


class ReplicaIdentity(enum.Enum):
    """``pg_class.relreplident``, as sent in the Relation message."""

    DEFAULT = "d"
    NOTHING = "n"
    FULL = "f"
    INDEX = "i"


class TruncateOption(enum.IntFlag):
    CASCADE = 1
    RESTART_IDENTITY = 2


#: Relation column flag: the column is part of the replica identity key.
COLUMN_FLAG_KEY = 1
#: Logical decoding message flag: the message is transactional.
MESSAGE_FLAG_TRANSACTIONAL = 1
