"""Every pgoutput message type, captured from real servers, decoded and checked against PostgreSQL.

One workload (see `workload.py`) runs once per server; PG15 is read with
protocol 1, 2 (streaming) and 3 (streaming + two-phase), PG16, 17 and 18 with
protocol 4 (parallel streaming + two-phase). Expected values come from the server: the
catalogs, xids and LSNs the workload's own SQL returned, commit timestamps
(track_commit_timestamp), pg_prepared_xacts, WAL positions and clock readings
around aborts. Nothing is compared with the decoder's own output.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from pgoutput_spark.decoder import messages as m
from pgoutput_spark.errors import DecodeError

from .catalog import KEY_FLAG, regclass, relation_facts, type_facts
from .conftest import Capture, ServerWorkload
from .workload import (
    GIDS,
    NTX_MESSAGE,
    ORIGIN_LSN,
    ORIGIN_NAME,
    STREAMED_MESSAGE,
    TX_MESSAGE,
)

pytestmark = pytest.mark.postgres

_BASE_TYPES = set("BCORYMIUDT")
_STREAM_TYPES = set("SEcA")
_TWO_PHASE_TYPES = set("bPKrp")
#: Message types each protocol version (with the options of PEEK_OPTIONS) must produce.
EXPECTED_TYPES = {
    1: _BASE_TYPES,
    2: _BASE_TYPES | _STREAM_TYPES,
    3: _BASE_TYPES | _STREAM_TYPES | _TWO_PHASE_TYPES,
    4: _BASE_TYPES | _STREAM_TYPES | _TWO_PHASE_TYPES,
}

#: The class each type byte must decode to (from the protocol docs' list of messages).
CLASS_OF_BYTE = {
    "B": m.Begin, "C": m.Commit, "O": m.Origin, "R": m.Relation, "Y": m.Type,
    "M": m.LogicalMessage, "I": m.Insert, "U": m.Update, "D": m.Delete, "T": m.Truncate,
    "S": m.StreamStart, "E": m.StreamStop, "c": m.StreamCommit, "A": m.StreamAbort,
    "b": m.BeginPrepare, "P": m.Prepare, "p": m.StreamPrepare, "K": m.CommitPrepared,
    "r": m.RollbackPrepared,
}
#: Messages that carry a leading xid inside a stream block.
_XID_IN_STREAM = (m.Relation, m.Type, m.LogicalMessage, m.Insert, m.Update, m.Delete, m.Truncate)

_PLAIN_TXNS = ["insert", "update", "delete", "truncate", "tx_message"]


def _expected_outline(proto: int, streams_aborted: bool) -> list[tuple[str, ...]]:
    """Transaction-level messages in order: what the workload must produce per protocol (and
    server: see `Capture.streams_aborted`)."""
    out: list[tuple[str, ...]] = []
    for name in _PLAIN_TXNS:
        out += [("Begin", name), ("Commit", name)]
    out += [("LogicalMessage", "non-transactional")]
    out += [("Begin", "origin"), ("Origin", "origin"), ("Commit", "origin")]
    if proto == 1:  # no streaming: everything arrives at commit; aborts are not sent
        for name in ("streamed", "prepared_commit", "prepared_big"):
            out += [("Begin", name), ("Commit", name)]
        return out
    out += [("StreamStart", "streamed"), ("StreamAbort", "streamed", "savepoint"),
            ("StreamCommit", "streamed")]
    if streams_aborted:
        out += [("StreamStart", "aborted"), ("StreamAbort", "aborted", "whole transaction")]
    if proto == 2:  # streaming without two-phase: prepared transactions arrive at COMMIT PREPARED
        out += [("Begin", "prepared_commit"), ("Commit", "prepared_commit"),
                ("StreamStart", "prepared_big"), ("StreamCommit", "prepared_big")]
        return out
    out += [("BeginPrepare", "prepared_commit"), ("Prepare", "prepared_commit"),
            ("CommitPrepared", "prepared_commit"),
            ("BeginPrepare", "prepared_rollback"), ("Prepare", "prepared_rollback"),
            ("RollbackPrepared", "prepared_rollback"),
            ("StreamStart", "prepared_big"), ("StreamPrepare", "prepared_big"),
            ("CommitPrepared", "prepared_big")]
    return out


def _names(capture: Capture) -> dict[int, str]:
    return {xid: name for name, xid in capture.facts.xids.items()}


def test_message_types_are_exactly_those_of_the_protocol(capture: Capture) -> None:
    assert set(capture.kinds()) == EXPECTED_TYPES[capture.proto_version]


def test_every_message_decodes_to_the_class_of_its_type_byte(capture: Capture) -> None:
    errors = [(row.seq, str(d)) for row, d in zip(capture.messages, capture.decoded)
              if isinstance(d, DecodeError)]
    assert errors == []
    wrong = [(row.seq, type(d).__name__) for row, _, d in capture.items()
             if type(d) is not CLASS_OF_BYTE[chr(row.data[0])]]
    assert wrong == []


def test_transaction_outline(capture: Capture) -> None:
    names, facts = _names(capture), capture.facts
    outline: list[tuple[str, ...]] = []
    for row, _, msg in capture.items():
        if isinstance(msg, m.Begin | m.BeginPrepare | m.Prepare | m.CommitPrepared
                      | m.RollbackPrepared | m.StreamCommit):
            outline.append((type(msg).__name__, names[msg.xid]))
        elif isinstance(msg, m.Commit | m.Origin):
            outline.append((type(msg).__name__, names[row.xid]))
        elif isinstance(msg, m.StreamStart) and msg.first_segment:
            outline.append(("StreamStart", names[msg.xid]))
        elif isinstance(msg, m.StreamAbort):
            sub = {msg.xid: "whole transaction", facts.subxid: "savepoint"}.get(msg.subxid, str(msg.subxid))
            outline.append(("StreamAbort", names[msg.xid], sub))
        elif isinstance(msg, m.LogicalMessage) and not msg.transactional:
            outline.append(("LogicalMessage", "non-transactional"))
    assert outline == _expected_outline(capture.proto_version, capture.streams_aborted)


def test_begin_and_commit_agree_with_the_server(capture: Capture) -> None:
    names, facts = _names(capture), capture.facts
    items = list(capture.items())
    begins = [i for i, (_, _, msg) in enumerate(items) if isinstance(msg, m.Begin)]
    assert len(begins) >= len(_PLAIN_TXNS) + 1
    for i in begins:
        row, _, begin = items[i]
        j = next(k for k in range(i, len(items)) if isinstance(items[k][2], m.Commit))
        commit_row, _, commit = items[j]
        name = names[begin.xid]
        assert begin.xid == row.xid
        assert {r.xid for r, _, _ in items[i:j + 1]} == {begin.xid}, name
        assert commit.commit_lsn == begin.final_lsn, name
        assert commit.end_lsn == commit_row.lsn > commit.commit_lsn, name
        assert begin.commit_ts == commit.commit_ts == facts.commit_ts[name], name
        assert commit.flags == 0
        assert not any(isinstance(msg, m.Begin) for _, _, msg in items[i + 1:j])


def test_relation_messages_match_the_catalog(capture: Capture) -> None:
    relations = capture.of_type(m.Relation)
    with capture.connect() as conn:
        for _, rel in relations:
            facts = relation_facts(conn, rel.relation_id)
            assert (rel.namespace, rel.relation_name, rel.replica_identity.value) == \
                (facts["namespace"], facts["name"], facts["replica_identity"])
            assert [(c.flags, c.name, c.type_oid, c.type_modifier) for c in rel.columns] == facts["columns"]
        tables = {name for (name,) in conn.execute(
            "SELECT relname FROM pg_class WHERE relkind = 'r' AND relnamespace = 'public'::regnamespace")}
    # Every table the workload changed is described; t_full/t_idx cover identities f and i.
    assert {rel.relation_name for _, rel in relations} == tables
    assert {rel.replica_identity.value for _, rel in relations} == {"d", "f", "i"}


def test_type_messages_precede_their_relation_and_match_pg_type(capture: Capture) -> None:
    items = [msg for _, _, msg in capture.items()]
    with capture.connect() as conn:
        user_types = {int(oid) for (oid,) in conn.execute(
            "SELECT oid::int8 FROM pg_type WHERE typname IN ('mood', 'posint')")}
        checked = 0
        for i, msg in enumerate(items):
            if not isinstance(msg, m.Relation):
                continue
            types = []
            k = i - 1
            while isinstance(items[k], m.Type):
                types.append(items[k])
                k -= 1
            # One Type message per user-defined column type, right before the Relation.
            assert sorted(t.type_id for t in types) == \
                sorted({c.type_oid for c in msg.columns if c.type_oid >= 16384}), msg.relation_name
            for t in types:
                assert (t.namespace, t.name) == type_facts(conn, t.type_id)
                assert t.xid == msg.xid
                checked += 1
    assert checked >= 4
    assert {t.type_id for t in items if isinstance(t, m.Type)} == user_types
    assert sum(isinstance(t, m.Type) for t in items) == checked


def test_logical_messages_match_emit_message(capture: Capture) -> None:
    facts = capture.facts
    found = {msg.prefix: (row, in_stream, msg) for row, in_stream, msg in capture.items()
             if isinstance(msg, m.LogicalMessage)}
    assert set(found) == {TX_MESSAGE[0], NTX_MESSAGE[0], STREAMED_MESSAGE[0]}
    for prefix, content in (TX_MESSAGE, NTX_MESSAGE, STREAMED_MESSAGE):
        _, _, msg = found[prefix]
        assert (msg.content, msg.lsn) == (content, facts.message_lsns[prefix])
    row, in_stream, tx = found[TX_MESSAGE[0]]
    assert (tx.flags, tx.transactional, tx.xid, in_stream, row.xid) == \
        (1, True, None, False, facts.xids["tx_message"])
    row, in_stream, ntx = found[NTX_MESSAGE[0]]
    assert (ntx.flags, ntx.transactional, ntx.xid, in_stream, row.xid) == (0, False, None, False, 0)
    row, in_stream, streamed = found[STREAMED_MESSAGE[0]]
    top = facts.xids["streamed"]
    assert (streamed.flags, streamed.transactional, row.xid) == (1, True, top)
    if capture.proto_version >= 2:
        assert (in_stream, streamed.xid) == (True, top)
    else:
        assert (in_stream, streamed.xid) == (False, None)


def test_truncate_options_and_relations(capture: Capture) -> None:
    truncates = capture.of_type(m.Truncate)
    assert len(truncates) == 2
    (_, both), (row, single) = truncates
    with capture.connect() as conn:
        expected = sorted(regclass(conn, name) for name in ('"Trunc A"', "trunc_b", "trunc_child"))
        single_oid = regclass(conn, "trunc_single")
    # TRUNCATE "Trunc A", trunc_b RESTART IDENTITY CASCADE: bit 1 cascade, bit 2 restart identity;
    # the cascaded trunc_child is listed too.
    assert (both.options, both.cascade, both.restart_identity) == (3, True, True)
    assert sorted(both.relation_ids) == expected and len(both.relation_ids) == 3
    assert (single.options, single.cascade, single.restart_identity) == (0, False, False)
    assert single.relation_ids == (single_oid,)
    assert single.xid == (capture.facts.xids["streamed"] if capture.proto_version >= 2 else None)


def test_old_tuples_follow_the_replica_identity(capture: Capture) -> None:
    relations: dict[int, m.Relation] = {}
    old_kinds: Counter[Any] = Counter()
    for _, _, msg in capture.items():
        if isinstance(msg, m.Relation):
            relations[msg.relation_id] = msg
        if not isinstance(msg, m.Insert | m.Update | m.Delete):
            continue
        rel = relations[msg.relation_id]
        ident = rel.replica_identity.value
        keys = [i for i, c in enumerate(rel.columns) if c.flags & KEY_FLAG]
        if not isinstance(msg, m.Delete):
            assert len(msg.new_tuple) == len(rel.columns)
            assert all(v.kind != m.TupleKind.UNCHANGED_TOAST or isinstance(msg, m.Update)
                       for v in msg.new_tuple)
        if isinstance(msg, m.Insert):
            continue
        old_kinds[(type(msg).__name__, ident, msg.old_kind)] += 1
        if msg.old_tuple is None:
            assert isinstance(msg, m.Update) and ident != "f", rel.relation_name
            continue
        assert len(msg.old_tuple) == len(rel.columns)
        if ident == "f":
            assert msg.old_kind == "O"
            assert all(v.kind != m.TupleKind.UNCHANGED_TOAST for v in msg.old_tuple)
        else:
            assert msg.old_kind == "K"
            sent = [i for i, v in enumerate(msg.old_tuple) if v.kind != m.TupleKind.NULL]
            assert sent == keys, rel.relation_name
            if isinstance(msg, m.Update):  # a key is sent only when the key changed
                assert [msg.old_tuple[i] for i in keys] != [msg.new_tuple[i] for i in keys]
    assert {k for k in old_kinds} >= {
        ("Update", "d", "K"), ("Update", "d", None), ("Update", "f", "O"), ("Update", "i", "K"),
        ("Delete", "d", "K"), ("Delete", "f", "O"), ("Delete", "i", "K"),
    }


def test_origin_message_carries_the_replication_origin(capture: Capture) -> None:
    items = list(capture.items())
    at = [i for i, (_, _, msg) in enumerate(items) if isinstance(msg, m.Origin)]
    assert len(at) == 1
    row, _, origin = items[at[0]]
    begin = items[at[0] - 1][2]
    assert isinstance(begin, m.Begin) and begin.xid == row.xid == capture.facts.xids["origin"]
    with capture.connect() as conn:
        progress = conn.execute("SELECT (pg_replication_origin_progress(%s, false) - '0/0')::int8",
                                (ORIGIN_NAME,)).fetchone()
    assert progress is not None and progress[0] == ORIGIN_LSN
    assert (origin.commit_lsn, origin.name) == (ORIGIN_LSN, ORIGIN_NAME)


def test_stream_blocks_name_the_transaction_and_its_subtransactions(capture: Capture) -> None:
    if capture.proto_version < 2:
        assert not set(capture.kinds()) & _STREAM_TYPES
        return
    facts = capture.facts
    names = ("streamed", "aborted", "prepared_big") if capture.streams_aborted else ("streamed", "prepared_big")
    streamed = {facts.xids[n] for n in names}
    seen: set[int] = set()
    inserts_by_xid: Counter[int] = Counter()
    current = None
    for row, in_stream, msg in capture.items():
        if isinstance(msg, m.StreamStart):
            assert msg.xid == row.xid and msg.first_segment == (msg.xid not in seen)
            seen.add(msg.xid)
            current = msg.xid
        elif in_stream:
            # Changes carry the xid of the (sub)transaction that made them;
            # the peek's xid column is the top-level one.
            allowed = {current}
            if current == facts.xids["streamed"]:
                allowed |= {facts.subxid, facts.next_subxid}
            assert row.xid == current and getattr(msg, "xid", None) in allowed, row.seq
            if isinstance(msg, m.Insert):
                inserts_by_xid[msg.xid] += 1
        elif isinstance(msg, _XID_IN_STREAM):
            assert msg.xid is None
    assert seen == streamed
    assert facts.subxid not in (facts.xids["streamed"], facts.next_subxid)
    # Only the savepoint's changes streamed before ROLLBACK TO are sent (the
    # exact count is checked against test_decoding's stream output on PG15).
    assert 0 < inserts_by_xid[facts.subxid] <= facts.savepoint_rows
    assert inserts_by_xid[facts.next_subxid] == 1
    assert capture.kinds().count("S") == capture.kinds().count("E") > len(streamed)


def test_stream_abort_and_stream_commit(capture: Capture) -> None:
    if capture.proto_version < 2:
        return  # checked above: no stream messages at all
    facts = capture.facts
    aborts = {msg.xid: (row, msg) for row, msg in capture.of_type(m.StreamAbort)}
    aborted = ("streamed", "aborted") if capture.streams_aborted else ("streamed",)
    assert set(aborts) == {facts.xids[name] for name in aborted}
    assert aborts[facts.xids["streamed"]][1].subxid == facts.subxid
    if capture.streams_aborted:
        assert aborts[facts.xids["aborted"]][1].subxid == facts.xids["aborted"]
    else:
        assert facts.xids["aborted"] not in {row.xid for row in capture.messages}
    for name in aborted:
        row, msg = aborts[facts.xids[name]]
        if capture.proto_version >= 4:
            # Parallel streaming adds the abort record's end LSN and time.
            assert len(row.data) == 25
            before, after = facts.wal_windows[name]
            assert before < msg.abort_lsn <= after and msg.abort_lsn == row.lsn
            start, end = facts.clock_windows[name]
            assert start <= msg.abort_ts <= end
        else:
            assert len(row.data) == 9
            assert (msg.abort_lsn, msg.abort_ts) == (None, None)
    committed = {"streamed", "prepared_big"} if capture.proto_version == 2 else {"streamed"}
    commits = capture.of_type(m.StreamCommit)
    assert {_names(capture)[msg.xid] for _, msg in commits} == committed
    for row, msg in commits:
        name = _names(capture)[msg.xid]
        assert msg.xid == row.xid and msg.flags == 0
        assert msg.commit_ts == facts.commit_ts[name]
        assert msg.end_lsn == row.lsn > msg.commit_lsn


def test_two_phase_messages(capture: Capture) -> None:
    if capture.proto_version < 3:
        assert not set(capture.kinds()) & _TWO_PHASE_TYPES
        return
    facts = capture.facts

    def by_gid(cls: type) -> dict[str, tuple[Any, Any]]:
        found = {msg.gid: (row, msg) for row, msg in capture.of_type(cls)}
        assert len(found) == len(capture.of_type(cls))
        return found

    begins, prepares = by_gid(m.BeginPrepare), by_gid(m.Prepare)
    stream_prepares, commits, rollbacks = by_gid(m.StreamPrepare), by_gid(m.CommitPrepared), \
        by_gid(m.RollbackPrepared)
    small = {GIDS["prepared_commit"], GIDS["prepared_rollback"]}
    assert set(begins) == set(prepares) == small
    assert set(stream_prepares) == {GIDS["prepared_big"]}
    assert set(commits) == {GIDS["prepared_commit"], GIDS["prepared_big"]}
    assert set(rollbacks) == {GIDS["prepared_rollback"]}
    for name, gid in GIDS.items():
        xid, prepared_at = facts.xids[name], facts.prepared_at[gid]
        if gid in small:
            _, begin = begins[gid]
            row, prepare = prepares[gid]
            assert (begin.xid, begin.prepare_ts) == (xid, prepared_at)
            assert (begin.prepare_lsn, begin.end_lsn) == (prepare.prepare_lsn, prepare.end_lsn)
        else:
            row, prepare = stream_prepares[gid]
        assert (prepare.xid, prepare.prepare_ts, prepare.flags) == (xid, prepared_at, 0)
        assert row.xid == xid and prepare.end_lsn == row.lsn > prepare.prepare_lsn
        if gid in commits:
            row, commit = commits[gid]
            assert (commit.xid, commit.flags, commit.commit_ts) == (xid, 0, facts.commit_ts[name])
            assert commit.end_lsn == row.lsn > commit.commit_lsn >= prepare.end_lsn
        else:
            row, rollback = rollbacks[gid]
            start, end = facts.clock_windows[name]
            assert (rollback.xid, rollback.flags, rollback.prepare_ts) == (xid, 0, prepared_at)
            assert rollback.prepare_end_lsn == prepare.end_lsn
            assert rollback.rollback_end_lsn == row.lsn > rollback.prepare_end_lsn
            assert start <= rollback.rollback_ts <= end


@pytest.mark.parametrize("server", ["pg16", "pg17", "pg18"])
def test_origin_option_of_16_and_later_filters_only_the_origin_transaction(request: pytest.FixtureRequest,
                                                                           server: str) -> None:
    workload: ServerWorkload = request.getfixturevalue(f"{server}_workload")
    default = workload.capture(4)
    any_origin = workload.capture(4, origin="any")
    no_origin = workload.capture(4, origin="none")
    assert [r.data for r in any_origin.messages] == [r.data for r in default.messages]
    origin_xid = workload.facts.xids["origin"]
    dropped = [r.data[:1] for r in default.messages if r.xid == origin_xid]
    assert dropped == [b"B", b"O", b"I", b"C"]
    assert [r.data for r in no_origin.messages] == \
        [r.data for r in default.messages if r.xid != origin_xid]
