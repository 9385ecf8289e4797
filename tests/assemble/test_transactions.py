"""The streamed / prepared transaction state machine, case by case (worker.c semantics)."""

from __future__ import annotations

import pytest

from pgoutput_spark.assemble.transactions import AssemblyError, Control, Discard, Outcome, resolve
from pgoutput_spark.decoder.protocol import MessageType as M


def start(seq, xid, first=True):
    return Control(seq, M.STREAM_START, xid=xid, first_segment=first)


def test_subtransaction_abort_discards_from_its_first_change_to_the_abort():
    ledger = resolve([start(1, 10), Control(9, M.STREAM_ABORT, xid=10, subxid=11), start(12, 10, False),
                      Control(20, M.STREAM_COMMIT, xid=10, commit_lsn=99)], {(10, 11): [4]})
    assert [t.outcome for t in ledger.txns] == [Outcome.COMMITTED]
    assert ledger.txns[0].decided_seq == 20 and ledger.txns[0].commit_lsn == 99
    assert ledger.discards == [Discard(10, 1, 4, 9)]


def test_abort_of_a_subtransaction_without_streamed_changes_discards_nothing():
    ledger = resolve([start(1, 10), Control(5, M.STREAM_ABORT, xid=10, subxid=11)], {})
    assert ledger.discards == [] and ledger.txns[0].outcome is Outcome.OPEN


def test_top_level_abort_discards_the_transaction_and_unknown_aborts_are_ignored():
    ledger = resolve([Control(1, M.STREAM_ABORT, xid=7, subxid=7), start(2, 10),
                      Control(5, M.STREAM_ABORT, xid=10, subxid=10)], {})
    assert [(t.xid, t.outcome) for t in ledger.txns] == [(10, Outcome.DISCARDED)]
    # The ignored abort's row has no transaction to go with: the assembly keeps it as open.
    assert ledger.unmatched_aborts == [1] and ledger.leaves_open


def test_leaves_open_while_a_streamed_or_prepared_transaction_waits_for_its_end():
    assert not resolve([], {}).leaves_open
    assert resolve([start(1, 10)], {}).leaves_open
    assert not resolve([start(1, 10), Control(5, M.STREAM_COMMIT, xid=10, commit_lsn=9)], {}).leaves_open
    assert not resolve([start(1, 10), Control(5, M.STREAM_ABORT, xid=10, subxid=10)], {}).leaves_open
    prepared = [Control(3, M.PREPARE, xid=5, gid="a", block_seq=1)]
    assert resolve(prepared, {}).leaves_open
    assert not resolve([*prepared, Control(9, M.COMMIT_PREPARED, xid=5, gid="a", commit_lsn=7)],
                       {}).leaves_open


def test_prepared_then_committed_or_rolled_back():
    ledger = resolve([
        Control(3, M.PREPARE, xid=5, gid="a", block_seq=1),
        start(4, 6), Control(8, M.STREAM_PREPARE, xid=6, gid="b"),
        Control(9, M.ROLLBACK_PREPARED, xid=5, gid="a"),
        Control(12, M.COMMIT_PREPARED, xid=6, gid="b", commit_lsn=77),
        Control(13, M.ROLLBACK_PREPARED, xid=1, gid="never prepared here"),
    ], {})
    assert [(t.xid, t.block_seq, t.outcome, t.decided_seq) for t in ledger.txns] == [
        (5, 1, Outcome.DISCARDED, 9), (6, None, Outcome.COMMITTED, 12)]


def test_prepared_and_not_yet_decided_stays_prepared():
    ledger = resolve([Control(3, M.PREPARE, xid=5, gid="a", block_seq=1)], {})
    assert ledger.txns[0].outcome is Outcome.PREPARED


@pytest.mark.parametrize("controls, message", [
    ([start(1, 10, first=False)], "first segment is not in the capture"),
    ([Control(2, M.STREAM_COMMIT, xid=10)], "never streamed"),
    ([Control(2, M.COMMIT_PREPARED, xid=10, gid="g")], "never prepared"),
])
def test_inconsistent_streams_are_errors_naming_the_seq(controls, message):
    with pytest.raises(AssemblyError, match=message):
        resolve(controls, {})


def test_a_transaction_sent_again_from_its_first_segment_voids_what_came_before():
    """After a reconnect the walsender streams an unfinished transaction again from its
    first segment; the apply worker starts its spool afresh (worker.c, stream_open_file)."""
    ledger = resolve([start(1, 10), start(3, 11), Control(4, M.STREAM_ABORT, xid=10, subxid=12),
                      start(6, 10), start(8, 10, False), Control(9, M.STREAM_ABORT, xid=10, subxid=12),
                      Control(12, M.STREAM_COMMIT, xid=10, commit_lsn=99)], {(10, 12): [2, 7]})
    assert [(t.xid, t.first_seq, t.outcome, t.decided_seq, t.last_seq) for t in ledger.txns] == [
        (10, 1, Outcome.DISCARDED, 6, 5), (11, 3, Outcome.OPEN, None, None), (10, 6, Outcome.COMMITTED, 12, None)]
    # Each subtransaction abort cuts its own instance's changes only.
    assert ledger.discards == [Discard(10, 1, 2, 4), Discard(10, 6, 7, 9)]


@pytest.mark.parametrize("kind", [M.BEGIN, M.BEGIN_PREPARE])
def test_a_transaction_sent_again_whole_voids_its_open_stream(kind):
    ledger = resolve([Control(1, kind, xid=10), start(2, 10), start(3, 11),
                      Control(5, M.STREAM_COMMIT, xid=11), Control(6, kind, xid=11), Control(7, kind, xid=10)], {})
    assert [(t.xid, t.outcome, t.decided_seq) for t in ledger.txns] == [
        (10, Outcome.DISCARDED, 7), (11, Outcome.COMMITTED, 5)]


def test_a_walsender_session_forgets_the_streamed_transactions_the_one_before_left_open():
    """The apply worker keeps nothing of a streamed transaction when its connection ends; the
    next session sends it again from its first segment if it commits, else nothing of it.
    Prepared transactions outlive the session."""
    ledger = resolve([start(1, 10), start(3, 11), Control(4, M.PREPARE, xid=12, gid="g", block_seq=2),
                      start(9, 11), Control(11, M.STREAM_COMMIT, xid=11, commit_lsn=70),
                      Control(12, M.COMMIT_PREPARED, xid=12, gid="g", commit_lsn=80), start(20, 13)],
                     {}, session_starts=[7, 15, 25])
    assert [(t.xid, t.first_seq, t.outcome, t.decided_seq, t.last_seq) for t in ledger.txns] == [
        (10, 1, Outcome.DISCARDED, 7, 6), (11, 3, Outcome.DISCARDED, 7, 6),
        (12, 2, Outcome.COMMITTED, 12, None), (11, 9, Outcome.COMMITTED, 11, None),
        (13, 20, Outcome.DISCARDED, 25, 24)]
    assert ledger.session_ends == [(10, 1, 7), (11, 3, 7), (13, 20, 25)] and not ledger.leaves_open
    # A session that begins with nothing open forgets nothing; a later segment of a forgotten
    # transaction has no first segment to continue.
    assert resolve([start(1, 10), Control(2, M.STREAM_COMMIT, xid=10)], {}, session_starts=[3]).session_ends == []
    with pytest.raises(AssemblyError, match="Stream Start at seq 8 continues transaction 10"):
        resolve([start(1, 10), start(8, 10, first=False)], {}, session_starts=[5])
