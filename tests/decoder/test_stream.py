from __future__ import annotations

import numpy as np
import pytest

from pgoutput_spark.decoder.stream import StreamEvents
from pgoutput_spark.errors import StreamStateError

S, E, X = ord("S"), ord("E"), ord("I")


def test_state_follows_starts_and_stops_in_any_row_order():
    seq = np.array([5, 1, 3, 2, 4, 6, 7])
    kind = np.array([X, S, E, X, X, S, X])
    events = StreamEvents.from_messages(seq, kind)
    assert events.in_stream(np.arange(1, 9)).tolist() == [
        False, True, True, False, False, False, True, True]


def test_stop_without_start_names_its_seq():
    with pytest.raises(StreamStateError, match="seq 9 .*Stream Stop outside"):
        StreamEvents.from_messages(np.array([9]), np.array([E]), np.array([16]))


def test_start_inside_a_block_is_an_error():
    with pytest.raises(StreamStateError, match="seq 4"):
        StreamEvents.from_messages(np.array([1, 4]), np.array([S, S]))


def test_no_events():
    assert not StreamEvents.empty().in_stream(np.arange(3)).any()


def test_a_block_a_walsender_session_left_open_ends_where_the_next_session_begins():
    # Session 1: seqs 1-4, a block opened at 2 and never stopped; session 2: 5-9, a block 6-8;
    # session 3 from 10, which began inside session 2's second block (from 9).
    seq = np.array([2, 6, 8, 9, 11, 12])
    kind = np.array([S, S, E, S, S, E])
    events = StreamEvents.from_messages(seq, kind, session_starts=np.array([5, 10]))
    assert events.in_stream(np.arange(1, 14)).tolist() == [
        False, False, True, True, False, False, True, True, False, False, False, True, False]
    # Resuming inside a block that the slice's first message ends (a new session), and a
    # session that begins right after a Stream Start.
    events = StreamEvents.from_messages(np.array([3]), np.array([S]), initially_in_stream=True,
                                        session_starts=np.array([2, 4]))
    assert events.in_stream(np.arange(1, 6)).tolist() == [True, False, False, False, False]
    # Within a session, starts and stops must still alternate.
    with pytest.raises(StreamStateError, match="seq 7: Stream Start inside"):
        StreamEvents.from_messages(np.array([6, 7]), np.array([S, S]), session_starts=np.array([5]))
