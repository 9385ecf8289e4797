"""The test_decoding line parser (tests/decoder/tuple_oracle.py) on literal lines.

The lines are copied from real PostgreSQL 15 test_decoding output; no server needed.
"""

from __future__ import annotations

import pytest

from tests.decoder.tuple_oracle import (
    Change,
    Column,
    Marker,
    StreamEvent,
    TestDecodingParseError,
    Truncate,
    TxnMessage,
    parse_line,
)


def test_insert_with_bare_quoted_and_null_values():
    line = ("table public.t_pk: INSERT: id[integer]:1 note[character varying]:'one'"
            " m[mood]:null d[posint]:'5' amount[numeric]:-0.25 ok[boolean]:false")
    assert parse_line(line) == Change(("public", "t_pk"), "INSERT", None, (
        Column("id", "integer", "value", "1"),
        Column("note", "character varying", "value", "one"),
        Column("m", "mood", "null"),
        Column("d", "posint", "value", "5"),
        Column("amount", "numeric", "value", "-0.25"),
        Column("ok", "boolean", "value", "false"),
    ))


def test_quoted_literal_keeps_newlines_and_undoubles_quotes_only():
    line = ("table public.t: INSERT: txt[text]:'it''s \"q\"\nnew line\ttab \\ back'"
            " \"Odd \"\"Name\"\"\"[text]:'''' arr[text[]]:'{\"a b\",\"c''d\"}'")
    change = parse_line(line)
    assert isinstance(change, Change) and change.new is not None
    assert [(c.name, c.type_name, c.text) for c in change.new] == [
        ("txt", "text", "it's \"q\"\nnew line\ttab \\ back"),
        ('Odd "Name"', "text", "'"),
        ("arr", "text[]", "{\"a b\",\"c'd\"}"),
    ]


def test_special_floats_bits_and_bool_map_back_to_output_text():
    line = ("table public.t: INSERT: f4[real]:-Infinity f8[double precision]:NaN"
            " b[bit]:B'1010' vb[bit varying]:B'' flag[boolean]:true")
    change = parse_line(line)
    assert isinstance(change, Change) and change.new is not None
    assert [c.text for c in change.new] == ["-Infinity", "NaN", "1010", "", "t"]


def test_update_with_old_key_and_unchanged_toast():
    line = ("table public.t_types: UPDATE: old-key: id[integer]:2 new-tuple: id[integer]:20"
            " toasted[text]:unchanged-toast-datum txt[text]:'null'")
    assert parse_line(line) == Change(
        ("public", "t_types"), "UPDATE",
        (Column("id", "integer", "value", "2"),),
        (Column("id", "integer", "value", "20"), Column("toasted", "text", "unchanged-toast"),
         Column("txt", "text", "value", "null")),
    )


def test_update_without_old_key_and_delete_forms():
    assert parse_line("table public.t: UPDATE: id[integer]:2") == \
        Change(("public", "t"), "UPDATE", None, (Column("id", "integer", "value", "2"),))
    assert parse_line("table public.t: DELETE: a[integer]:1 b[text]:'a'") == Change(
        ("public", "t"), "DELETE",
        (Column("a", "integer", "value", "1"), Column("b", "text", "value", "a")), None)
    assert parse_line("table public.t: DELETE: (no-tuple-data)") == \
        Change(("public", "t"), "DELETE", None, None)


def test_truncate_and_quoted_relation_names():
    assert parse_line('table public."Trunc A", public.trunc_b: TRUNCATE: restart_seqs cascade') == \
        Truncate((("public", "Trunc A"), ("public", "trunc_b")), True, True)
    assert parse_line("table public.trunc_single: TRUNCATE: (no-flags)") == \
        Truncate((("public", "trunc_single"),), False, False)


def test_markers_messages_and_stream_lines():
    assert parse_line("BEGIN 726") == Marker("BEGIN", 726)
    assert parse_line("COMMIT") == Marker("COMMIT", None)
    assert parse_line("message: transactional: 0 prefix: ntx-prefix, sz: 3 content:") == \
        TxnMessage(False, "ntx-prefix", 3)
    assert parse_line("opening a streamed block for transaction TXN 733") == StreamEvent("open", 733)
    assert parse_line("streaming change for TXN 733") == StreamEvent("change", 733)
    assert parse_line("streaming truncate for TXN 733") == StreamEvent("truncate", 733)
    assert parse_line("streaming message: transactional: 1 prefix: in-stream, sz: 29") == \
        StreamEvent("message", None)
    assert parse_line("aborting streamed (sub)transaction TXN 734") == StreamEvent("abort", 734)
    assert parse_line("committing streamed transaction TXN 733") == StreamEvent("commit", 733)


@pytest.mark.parametrize("line", [
    "table public.t: INSERT: id[integer]:'1'",  # a bare type printed quoted
    "table public.t: INSERT: v[text]:abc",  # a quoted type printed bare
    "table public.t: INSERT: v[text]:'unterminated",
    "table public.t: INSERT: flag[boolean]:t",  # test_decoding prints true/false
    "table public.t: INSERT: id[integer]:1 trailing",
    "table public.t: MERGE: id[integer]:1",
    "table public.a, public.b: INSERT: id[integer]:1",
    "table public.t: TRUNCATE:",
    "something else",
])
def test_malformed_lines_are_rejected(line):
    with pytest.raises(TestDecodingParseError):
        parse_line(line)
