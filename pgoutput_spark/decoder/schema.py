"""The Arrow schema of a decoded capture (one row per message).

The Spark schema is derived from this one (`pgoutput_spark.spark.decode`), so
this module is the single definition of the decoded layout. Field names follow
the PostgreSQL docs in snake_case. LSNs, xids and OIDs are unsigned on the wire
and stored as int64 (never negative); timestamps are UTC microseconds.
"""

from __future__ import annotations

import pyarrow as pa

LSN = pa.int64()
XID = pa.int64()
OID = pa.int64()
TIMESTAMP = pa.timestamp("us", tz="UTC")
FLAGS = pa.int32()

#: One column value of a TupleData: kind is 'n' (NULL), 'u' (unchanged TOAST),
#: 't' (text) or 'b' (binary); value is NULL for 'n' and 'u'.
TUPLE_VALUE = pa.struct([("kind", pa.string()), ("value", pa.binary())])
TUPLE = pa.list_(TUPLE_VALUE)

RELATION_COLUMN = pa.struct(
    [
        ("flags", FLAGS),
        ("name", pa.string()),
        ("type_oid", OID),
        ("type_modifier", pa.int32()),
    ]
)


def _struct(*fields: tuple[str, pa.DataType]) -> pa.StructType:
    return pa.struct(list(fields))


BEGIN = _struct(("final_lsn", LSN), ("commit_ts", TIMESTAMP), ("xid", XID))
COMMIT = _struct(("flags", FLAGS), ("commit_lsn", LSN), ("end_lsn", LSN), ("commit_ts", TIMESTAMP))
ORIGIN = _struct(("commit_lsn", LSN), ("name", pa.string()))
RELATION = _struct(
    ("relation_id", OID),
    ("namespace", pa.string()),
    ("relation_name", pa.string()),
    ("replica_identity", pa.string()),
    ("columns", pa.list_(RELATION_COLUMN)),
)
TYPE = _struct(("type_id", OID), ("namespace", pa.string()), ("name", pa.string()))
MESSAGE = _struct(
    ("flags", FLAGS),
    ("transactional", pa.bool_()),
    ("lsn", LSN),
    ("prefix", pa.string()),
    ("content", pa.binary()),
)
#: Insert, Update and Delete; ``old_kind`` is 'K' (key) or 'O' (old row) when sent.
CHANGE = _struct(
    ("relation_id", OID),
    ("old_kind", pa.string()),
    ("old_tuple", TUPLE),
    ("new_tuple", TUPLE),
)
TRUNCATE = _struct(
    ("options", FLAGS),
    ("cascade", pa.bool_()),
    ("restart_identity", pa.bool_()),
    ("relation_ids", pa.list_(OID)),
)
STREAM_START = _struct(("xid", XID), ("first_segment", pa.bool_()))
STREAM_COMMIT = _struct(
    ("xid", XID), ("flags", FLAGS), ("commit_lsn", LSN), ("end_lsn", LSN), ("commit_ts", TIMESTAMP)
)
#: abort_lsn / abort_ts are only sent with protocol 4 parallel streaming.
STREAM_ABORT = _struct(("xid", XID), ("subxid", XID), ("abort_lsn", LSN), ("abort_ts", TIMESTAMP))
#: Begin Prepare, Prepare and Stream Prepare (flags is NULL for Begin Prepare).
PREPARE = _struct(
    ("flags", FLAGS),
    ("prepare_lsn", LSN),
    ("end_lsn", LSN),
    ("prepare_ts", TIMESTAMP),
    ("xid", XID),
    ("gid", pa.string()),
)
COMMIT_PREPARED = _struct(
    ("flags", FLAGS),
    ("commit_lsn", LSN),
    ("end_lsn", LSN),
    ("commit_ts", TIMESTAMP),
    ("xid", XID),
    ("gid", pa.string()),
)
ROLLBACK_PREPARED = _struct(
    ("flags", FLAGS),
    ("prepare_end_lsn", LSN),
    ("rollback_end_lsn", LSN),
    ("prepare_ts", TIMESTAMP),
    ("rollback_ts", TIMESTAMP),
    ("xid", XID),
    ("gid", pa.string()),
)

#: Struct column name -> its type, in output order.
FAMILIES: dict[str, pa.StructType] = {
    "begin": BEGIN,
    "commit": COMMIT,
    "origin": ORIGIN,
    "relation": RELATION,
    "type": TYPE,
    "message": MESSAGE,
    "change": CHANGE,
    "truncate": TRUNCATE,
    "stream_start": STREAM_START,
    "stream_commit": STREAM_COMMIT,
    "stream_abort": STREAM_ABORT,
    "prepare": PREPARE,
    "commit_prepared": COMMIT_PREPARED,
    "rollback_prepared": ROLLBACK_PREPARED,
}

#: Columns before the family structs. ``xid`` is the capture's own optional xid
#: column passed through; ``stream_xid`` is the leading xid of a data message
#: sent inside a stream block.
HEAD = [
    pa.field("seq", pa.int64(), nullable=False),
    pa.field("lsn", LSN),
    pa.field("xid", XID),
    pa.field("message_type", pa.string()),
    pa.field("in_stream", pa.bool_()),
    pa.field("stream_xid", XID),
]

#: Columns after the family structs: NULL unless the message failed to decode,
#: then the one-line reason (see `DecodeError`) and the message's raw bytes.
TAIL = [pa.field("error", pa.string()), pa.field("raw", pa.binary())]

DECODED_SCHEMA = pa.schema(HEAD + [pa.field(name, t) for name, t in FAMILIES.items()] + TAIL)
