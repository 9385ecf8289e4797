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
