"""Where a chunk may end, the session settings check and the pgoutput options (no server)."""

from __future__ import annotations

import pytest

from pgoutput_spark.errors import CaptureError
from pgoutput_spark.slot.capture import Boundaries
from pgoutput_spark.slot.options import PluginOptions
from pgoutput_spark.slot.settings import SESSION_SETTINGS, check_session_settings

from ..decoder import builders as b

ROW = b.tuple_data(("t", b"1"))


def _ends(messages: list[bytes]) -> list[int]:
    tracker = Boundaries()
    return [i for i, m in enumerate(messages) if tracker.after(m)]


def test_plain_and_two_phase_transactions_end_at_their_last_message() -> None:
    messages = [
        b.begin(100, 0, 7), b.insert(1, ROW), b.commit(100, 120, 0),              # 0..2
        b.begin_prepare(200, 220, 0, 8, "g"), b.insert(1, ROW), b.prepare(200, 220, 0, 8, "g"),  # 3..5
        b.commit_prepared(300, 320, 0, 8, "g"),                                    # 6
        b.rollback_prepared(220, 420, 0, 0, 9, "h"),                               # 7
        b.message(False, 500, "p", b"x"),                                          # 8: not an end
    ]
    assert _ends(messages) == [2, 5, 6, 7]


def test_no_end_while_a_streamed_transaction_is_open() -> None:
    messages = [
        b.stream_start(10, True), b.insert(1, ROW, xid=10), b.stream_stop(),          # 0..2
        b.begin(100, 0, 11), b.insert(1, ROW), b.commit(100, 120, 0),                 # 3..5: 10 open
        b.stream_start(10, False), b.insert(1, ROW, xid=12), b.stream_stop(),         # 6..8
        b.stream_abort(10, 12),                                                       # 9: subxact only
        b.stream_commit(10, 200, 220, 0),                                             # 10
        b.begin(300, 0, 13), b.commit(300, 320, 0),                                   # 11..12
        b.stream_start(14, True), b.insert(1, ROW, xid=14), b.stream_stop(),          # 13..15
        b.stream_abort(14, 14, 400, 0),                                               # 16: top level
        b.stream_start(15, True), b.stream_stop(),                                    # 17..18
        b.prepare(500, 520, 0, 15, "g", stream=True),                                 # 19: stream prepare
    ]
    assert _ends(messages) == [10, 12, 16, 19]


def test_streamed_transactions_settle_with_the_subtransactions_they_sent_and_kept() -> None:
    messages = [
        b.stream_start(10, True), b.insert(1, ROW, xid=10), b.insert(1, ROW, xid=11),   # 0..2
        b.insert(1, ROW, xid=12), b.stream_stop(),                                      # 3..4
        b.stream_abort(10, 12),                                                          # 5
        b.stream_start(20, True), b.insert(1, ROW, xid=21), b.stream_stop(),            # 6..8
        b.stream_start(10, False), b.insert(1, ROW, xid=13), b.stream_stop(),           # 9..11
        b.stream_commit(10, 200, 220, 0),                                                # 12: 11 and 13 kept
        b.stream_abort(20, 20, 300, 0),                                                  # 13: all of 20 gone
        b.stream_start(30, True), b.insert(1, ROW, xid=30), b.stream_stop(),            # 14..16
        b.prepare(500, 520, 0, 30, "g", stream=True),                                    # 17: top level only
    ]
    tracker = Boundaries()
    for m in messages:
        tracker.after(m)
    assert tracker.settled == [(12, 10, {11, 13})]


def test_session_settings_we_set_are_readable() -> None:
    check_session_settings(SESSION_SETTINGS, source="here")
    check_session_settings({"DateStyle": "ISO, MDY", "bytea_output": "escape", "extra_float_digits": "1",
                            "lc_monetary": "en_US.UTF-8"}, source="here")


@pytest.mark.parametrize(("name", "value"), [
    ("DateStyle", "German, DMY"), ("IntervalStyle", "iso_8601"), ("extra_float_digits", "0"),
    ("bytea_output", "base64"), ("client_encoding", "LATIN1"), ("lc_monetary", "de_DE.UTF-8"),
])
def test_session_settings_that_break_the_conversion_are_named(name: str, value: str) -> None:
    with pytest.raises(CaptureError, match=f"landing/x: the capture was read with {name} = '{value}'"):
        check_session_settings({**SESSION_SETTINGS, name: value}, source="landing/x")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"proto_version": 5}, "proto_version must be 1, 2, 3 or 4"),
    ({"proto_version": 1, "streaming": "on"}, "streaming needs proto_version 2"),
    ({"proto_version": 3, "streaming": "parallel"}, "'parallel' needs proto_version 4"),
    ({"proto_version": 2, "two_phase": True}, "two_phase needs proto_version 3"),
    ({"proto_version": 4, "origin": "some"}, "origin must be 'any' or 'none'"),
    ({"proto_version": 4, "publications": ()}, "at least one publication"),
])
def test_plugin_options_refuse_what_pgoutput_refuses(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PluginOptions(**{"publications": ("p",), **kwargs})


def test_plugin_options_round_trip_through_the_landing_record() -> None:
    options = PluginOptions(("p", "Odd Pub"), 4, streaming="parallel", two_phase=True, messages=True)
    assert PluginOptions.from_dict(options.as_dict()) == options
    assert options.as_list() == ["proto_version", "4", "publication_names", 'p,"Odd Pub"',
                                 "messages", "true", "streaming", "parallel", "two_phase", "true"]
