"""A small pgoutput encoder for unit tests, written from the protocol docs.

Only for crafting edge cases; the decoder's real oracle is PostgreSQL itself
(see the tests that capture from a live server).
"""

from __future__ import annotations

import struct


def cstr(value: str) -> bytes:
    return value.encode() + b"\0"


def tuple_data(*values: tuple[str, bytes | None]) -> bytes:
    out = struct.pack(">H", len(values))
    for kind, value in values:
        out += kind.encode()
        if kind in ("t", "b"):
            assert value is not None
            out += struct.pack(">i", len(value)) + value
    return out


def xid_prefix(xid: int | None) -> bytes:
    return b"" if xid is None else struct.pack(">I", xid)


def begin(final_lsn: int, ts: int, xid: int) -> bytes:
    return b"B" + struct.pack(">QqI", final_lsn, ts, xid)


def commit(commit_lsn: int, end_lsn: int, ts: int, flags: int = 0) -> bytes:
    return b"C" + struct.pack(">BQQq", flags, commit_lsn, end_lsn, ts)


def origin(lsn: int, name: str) -> bytes:
    return b"O" + struct.pack(">Q", lsn) + cstr(name)


def relation(oid: int, namespace: str, name: str, ident: str,
             columns: list[tuple[int, str, int, int]], xid: int | None = None) -> bytes:
    out = b"R" + xid_prefix(xid) + struct.pack(">I", oid) + cstr(namespace) + cstr(name)
    out += ident.encode() + struct.pack(">H", len(columns))
    for flags, col, type_oid, typmod in columns:
        out += struct.pack(">B", flags) + cstr(col) + struct.pack(">Ii", type_oid, typmod)
    return out


def type_(oid: int, namespace: str, name: str, xid: int | None = None) -> bytes:
    return b"Y" + xid_prefix(xid) + struct.pack(">I", oid) + cstr(namespace) + cstr(name)


def message(transactional: bool, lsn: int, prefix: str, content: bytes, xid: int | None = None) -> bytes:
    return (b"M" + xid_prefix(xid) + struct.pack(">BQ", int(transactional), lsn) + cstr(prefix)
            + struct.pack(">i", len(content)) + content)


def insert(oid: int, new: bytes, xid: int | None = None) -> bytes:
    return b"I" + xid_prefix(xid) + struct.pack(">I", oid) + b"N" + new


def update(oid: int, new: bytes, old: bytes | None = None, old_kind: str = "K",
           xid: int | None = None) -> bytes:
    out = b"U" + xid_prefix(xid) + struct.pack(">I", oid)
    if old is not None:
        out += old_kind.encode() + old
    return out + b"N" + new


def delete(oid: int, old: bytes, old_kind: str = "K", xid: int | None = None) -> bytes:
    return b"D" + xid_prefix(xid) + struct.pack(">I", oid) + old_kind.encode() + old


def truncate(oids: list[int], options: int = 0, xid: int | None = None) -> bytes:
    return (b"T" + xid_prefix(xid) + struct.pack(">IB", len(oids), options)
            + b"".join(struct.pack(">I", o) for o in oids))


def stream_start(xid: int, first: bool) -> bytes:
    return b"S" + struct.pack(">IB", xid, int(first))


def stream_stop() -> bytes:
    return b"E"


def stream_commit(xid: int, commit_lsn: int, end_lsn: int, ts: int) -> bytes:
    return b"c" + struct.pack(">IBQQq", xid, 0, commit_lsn, end_lsn, ts)


def stream_abort(xid: int, subxid: int, abort_lsn: int | None = None, ts: int | None = None) -> bytes:
    out = b"A" + struct.pack(">II", xid, subxid)
    if abort_lsn is not None:
        out += struct.pack(">Qq", abort_lsn, ts or 0)
    return out


def begin_prepare(prepare_lsn: int, end_lsn: int, ts: int, xid: int, gid: str) -> bytes:
    return b"b" + struct.pack(">QQqI", prepare_lsn, end_lsn, ts, xid) + cstr(gid)


def prepare(prepare_lsn: int, end_lsn: int, ts: int, xid: int, gid: str, stream: bool = False) -> bytes:
    return (b"p" if stream else b"P") + struct.pack(">BQQqI", 0, prepare_lsn, end_lsn, ts, xid) + cstr(gid)


def commit_prepared(commit_lsn: int, end_lsn: int, ts: int, xid: int, gid: str) -> bytes:
    return b"K" + struct.pack(">BQQqI", 0, commit_lsn, end_lsn, ts, xid) + cstr(gid)


def rollback_prepared(prepare_end: int, rollback_end: int, prepare_ts: int, rollback_ts: int,
                      xid: int, gid: str) -> bytes:
    return (b"r" + struct.pack(">BQQqqI", 0, prepare_end, rollback_end, prepare_ts, rollback_ts, xid)
            + cstr(gid))


def xlogdata(data_start: int, wal_end: int, send_time: int, payload: bytes) -> bytes:
    return b"w" + struct.pack(">QQq", data_start, wal_end, send_time) + payload


def every_message() -> list[tuple[bytes, bool]]:
    """One of each message type (and variant), with its in-stream flag."""
    row = tuple_data(("t", b"42"), ("n", None), ("u", None), ("b", b"\x00\x01"))
    key = tuple_data(("t", b"41"))
    return [
        (begin(0x16B3748, 123456, 4000000000), False),
        (commit(0x16B3748, 0x16B3780, 123456), False),
        (origin(0x1000, "upstream"), False),
        (relation(3000000000, "public", "Mixed Case", "d",
                  [(1, "id", 23, -1), (0, "note", 1043, 104)]), False),
        (relation(16384, "", "pg_thing", "f", []), False),
        (type_(16400, "public", "mood"), False),
        (message(True, 0x2000, "app", b"\x00payload"), False),
        (message(False, 0x2001, "", b""), False),
        (insert(16384, row), False),
        (update(16384, row), False),
        (update(16384, row, key, "K"), False),
        (update(16384, row, row, "O"), False),
        (delete(16384, key, "K"), False),
        (delete(16384, row, "O"), False),
        (truncate([16384, 16385, 4294967295], 3), False),
        (truncate([], 0), False),
        (stream_start(77, True), False),
        (insert(16384, row, xid=78), True),
        (relation(16384, "public", "t", "i", [(1, "id", 23, -1)], xid=77), True),
        (type_(16400, "public", "mood", xid=77), True),
        (message(True, 0x2002, "p", b"x", xid=77), True),
        (update(16384, row, key, xid=77), True),
        (delete(16384, key, xid=77), True),
        (truncate([16384], 1, xid=77), True),
        (stream_stop(), False),
        (stream_commit(77, 0x3000, 0x3010, 99), False),
        (stream_abort(77, 78), False),
        (stream_abort(77, 77, 0x3020, 100), False),
        (begin_prepare(0x4000, 0x4010, 5, 90, "gid-1"), False),
        (prepare(0x4000, 0x4010, 5, 90, "gid-1"), False),
        (prepare(0x4000, 0x4010, 5, 90, "gid-2", stream=True), False),
        (commit_prepared(0x5000, 0x5010, 6, 90, "gid-1"), False),
        (rollback_prepared(0x4010, 0x6010, 5, 7, 91, "gid-2"), False),
    ]
