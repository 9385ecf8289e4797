"""pgoutput tuples (text mode) against test_decoding, row by row, on PostgreSQL 15 and 18.

A pgoutput slot and a test_decoding slot were created at the same point before
the workload (see conftest.py), so both see the same changes. pgoutput is read
with protocol 2 and streaming on: the streamed transactions arrive in stream
blocks, and the test applies the protocol's rules (drop what a Stream Abort
names, release the rest at Stream Commit) to get the committed changes in
commit order. test_decoding is read without streaming, so it prints every
committed transaction whole at commit: the two lists must agree change for
change, column for column, value for value.

test_decoding's streaming mode prints no tuple data, so it serves only as the
oracle for the shape of the stream blocks (test at the end).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from pgoutput_spark.decoder import messages as m
from pgoutput_spark.decoder.protocol import TupleKind
from tests.decoder.tuple_oracle import (
    Change,
    Column,
    Marker,
    StreamEvent,
    Truncate,
    TxnMessage,
    parse_line,
)

from .catalog import format_type
from .conftest import Capture, ServerWorkload

pytestmark = pytest.mark.postgres

Item = tuple[int, Any, Any]  # (top-level xid, message, relation(s) it refers to)


@pytest.fixture(scope="module", params=["pg15", "pg18"])
def workload(request: pytest.FixtureRequest) -> ServerWorkload:
    """The workload of each server that has a test_decoding slot beside its protocol 2 one."""
    return request.getfixturevalue(f"{request.param}_workload")


@pytest.fixture(scope="module")
def pgoutput(workload: ServerWorkload) -> Capture:
    return workload.capture(2)


def _test_decoding(workload: ServerWorkload, **options: str) -> list[tuple[int, int, str]]:
    return workload.cluster.peek_test_decoding(
        workload.test_decoding_slot, dbname=workload.facts.db,
        options={"include-xids": "1", "skip-empty-xacts": "1", **options},
    )  # fmt: skip


def _pgoutput_committed(capture: Capture) -> list[Item]:
    """Changes of committed transactions, in commit order, after applying Stream Aborts."""
    relations: dict[int, m.Relation] = {}
    out: list[Item] = []
    open_xid: int | None = None
    in_txn: list[Item] = []
    pending: dict[int, list[tuple[int, Item]]] = {}  # top xid -> (xid of change, item)
    streaming: int | None = None
    for _, in_stream, msg in capture.items():
        if isinstance(msg, m.Relation):
            relations[msg.relation_id] = msg
        elif isinstance(msg, m.Begin):
            open_xid, in_txn = msg.xid, []
        elif isinstance(msg, m.Commit):
            out += in_txn
            open_xid = None
        elif isinstance(msg, m.StreamStart):
            streaming = msg.xid
        elif isinstance(msg, m.StreamAbort):
            kept = [] if msg.subxid == msg.xid else \
                [(xid, item) for xid, item in pending[msg.xid] if xid != msg.subxid]
            pending[msg.xid] = kept
        elif isinstance(msg, m.StreamCommit):
            out += [item for _, item in pending.pop(msg.xid)]
        elif isinstance(msg, m.Insert | m.Update | m.Delete | m.Truncate):
            rel: Any = ([relations[r] for r in msg.relation_ids] if isinstance(msg, m.Truncate)
                        else relations[msg.relation_id])
            if in_stream:
                assert streaming is not None and msg.xid is not None
                pending.setdefault(streaming, []).append((msg.xid, (streaming, msg, rel)))
            else:
                assert open_xid is not None
                in_txn.append((open_xid, msg, rel))
    assert open_xid is None
    return out


def _test_decoding_committed(rows: list[tuple[int, int, str]]) -> list[tuple[int, Change | Truncate]]:
    out: list[tuple[int, Change | Truncate]] = []
    current: int | None = None
    for _, xid, text in rows:
        line = parse_line(text)
        if isinstance(line, Marker):
            assert line.xid == xid
            current = xid if line.kind == "BEGIN" else None
        elif isinstance(line, Change | Truncate):
            assert current == xid, text[:100]
            out.append((xid, line))
        else:
            assert isinstance(line, TxnMessage), text[:100]
    return out


def _pgoutput_value(value: m.TupleValue) -> tuple[str, str | None]:
    if value.kind is TupleKind.NULL:
        return ("null", None)
    if value.kind is TupleKind.UNCHANGED_TOAST:
        return ("unchanged-toast", None)
    assert value.kind is TupleKind.TEXT and value.value is not None
    return ("value", value.value.decode("utf-8"))


def _td_value(column: Column) -> tuple[str, str | None]:
    return (column.kind, column.text)


def test_every_committed_change_matches_test_decoding(pgoutput: Capture, workload: ServerWorkload) -> None:
    ours = _pgoutput_committed(pgoutput)
    theirs = _test_decoding_committed(_test_decoding(workload))
    assert len(ours) == len(theirs)
    type_names: dict[int, str] = {}
    compared: Counter[str] = Counter()
    with pgoutput.connect() as conn:
        for (xid, msg, rel), (td_xid, td) in zip(ours, theirs):
            where = f"xid {xid} {type(msg).__name__} {td}"[:300]
            assert xid == td_xid, where
            if isinstance(msg, m.Truncate):
                assert isinstance(td, Truncate), where
                assert [(r.namespace, r.relation_name) for r in rel] == list(td.relations)
                assert (msg.restart_identity, msg.cascade) == (td.restart_seqs, td.cascade)
                continue
            assert isinstance(td, Change) and td.action == type(msg).__name__.upper(), where
            assert (rel.namespace, rel.relation_name) == td.relation, where
            for column in rel.columns:
                if column.type_oid not in type_names:
                    type_names[column.type_oid] = format_type(conn, column.type_oid)
            names = [c.name for c in rel.columns]
            if not isinstance(msg, m.Delete):
                assert td.new is not None, where
                assert [c.name for c in td.new] == names, where
                assert [c.type_name for c in td.new] == [type_names[c.type_oid] for c in rel.columns]
                assert [_pgoutput_value(v) for v in msg.new_tuple] == [_td_value(c) for c in td.new], where
                compared.update(c.kind for c in td.new)
            old_tuple = getattr(msg, "old_tuple", None)  # Insert has none
            if old_tuple is None:
                assert td.old is None, where
            else:
                # test_decoding leaves the NULL columns out of an old tuple.
                sent = [(name, _pgoutput_value(v)) for name, v in zip(names, old_tuple)
                        if v.kind is not TupleKind.NULL]
                assert td.old is not None and sent == [(c.name, _td_value(c)) for c in td.old], where
                compared.update(c.kind for c in td.old)
    assert set(compared) == {"value", "null", "unchanged-toast"}
    # Streamed transactions (one with a rolled-back savepoint) and prepared ones took part.
    facts = pgoutput.facts
    assert {facts.xids[n] for n in ("streamed", "prepared_commit", "prepared_big")} <= {x for x, _, _ in ours}
    assert facts.xids["aborted"] not in {x for x, _, _ in ours}
    assert set(type_names.values()) >= {
        "smallint", "integer", "bigint", "numeric", "real", "double precision", "text",
        "character varying", "character", "bytea", "boolean", "date", "timestamp without time zone",
        "timestamp with time zone", "time without time zone", "interval", "uuid", "jsonb", "json",
        "integer[]", "text[]", "inet", "bit", "bit varying", "mood", "posint",
    }


def test_stream_blocks_match_test_decoding_streaming(pgoutput: Capture, workload: ServerWorkload) -> None:
    """Same blocks, same number of changes per block, same aborts and commits."""
    ours: list[tuple[str, int, int]] = []
    count = 0
    for _, in_stream, msg in pgoutput.items():
        if isinstance(msg, m.StreamStart):
            xid, count = msg.xid, 0
        elif in_stream and isinstance(msg, m.Insert | m.Update | m.Delete | m.Truncate
                                      | m.LogicalMessage):
            count += 1
        elif isinstance(msg, m.StreamStop):
            ours.append(("block", xid, count))
        elif isinstance(msg, m.StreamAbort):
            ours.append(("abort", msg.subxid, 0))
        elif isinstance(msg, m.StreamCommit):
            ours.append(("commit", msg.xid, 0))

    theirs: list[tuple[str, int, int]] = []
    for _, _, text in _test_decoding(workload, **{"stream-changes": "1"}):
        line = parse_line(text)
        if not isinstance(line, StreamEvent):
            continue
        assert line.xid is not None or line.kind == "message"
        if line.kind == "open":
            xid, count = line.xid, 0  # type: ignore[assignment]
        elif line.kind in ("change", "truncate", "message"):
            count += 1
        elif line.kind == "close":
            theirs.append(("block", xid, count))
        else:
            theirs.append((line.kind, line.xid, 0))  # type: ignore[arg-type]
    assert ours == theirs
    facts = pgoutput.facts
    assert ("abort", facts.subxid, 0) in ours
    assert (("abort", facts.xids["aborted"], 0) in ours) == pgoutput.streams_aborted
