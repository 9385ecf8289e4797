"""A parser for the text lines of PostgreSQL's ``test_decoding`` output plugin.

test_decoding is the oracle the pgoutput tuple tests compare against: it turns
each change into one line such as::

    table public.t: INSERT: id[integer]:1 note[text]:'it''s' flag[boolean]:true
    table public.t: UPDATE: old-key: id[integer]:1 new-tuple: id[integer]:2 note[text]:null
    table public."Trunc A", public.b: TRUNCATE: restart_seqs cascade

The format, from ``contrib/test_decoding/test_decoding.c`` (PostgreSQL 15):

- relation and column names go through ``quote_identifier`` (``"a ""b"" c"``);
- the type is ``format_type_be`` of the column type, without typmod;
- values of int2/int4/int8/oid/float4/float8/numeric are printed bare, bool as
  ``true``/``false``, bit/varbit as ``B'0101'``, everything else as a quoted
  literal with ``'`` doubled (and nothing else escaped: a newline stays a newline);
- ``null`` for NULL and ``unchanged-toast-datum`` for an unchanged TOASTed value;
- an old tuple (``old-key:`` in an UPDATE, the whole tuple of a DELETE) omits
  its NULL columns.

Streaming output (option ``stream-changes``) prints one line per change
without tuple data; those lines parse to `StreamEvent`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "BARE_TYPES",
    "Change",
    "Column",
    "Marker",
    "StreamEvent",
    "TestDecodingParseError",
    "Truncate",
    "TxnMessage",
    "parse_line",
]

#: Types whose values test_decoding prints without quotes (print_literal).
BARE_TYPES = frozenset(
    {"smallint", "integer", "bigint", "oid", "real", "double precision", "numeric"}
)
_BIT_TYPES = frozenset({"bit", "bit varying"})

ColumnKind = Literal["value", "null", "unchanged-toast"]


class TestDecodingParseError(ValueError):
    """A test_decoding line does not follow the format; names the offset."""

    __test__ = False  # not a pytest test class

    def __init__(self, line: str, pos: int, reason: str) -> None:
        self.line, self.pos, self.reason = line, pos, reason
        super().__init__(f"{reason} at offset {pos} of {line[:200]!r}")


@dataclass(frozen=True)
class Column:
    """One ``name[type]:value`` item."""

    name: str
    type_name: str
    kind: ColumnKind
    #: The value with test_decoding's quoting removed (None unless kind is "value").
    literal: str | None = None

    @property
    def text(self) -> str | None:
        """The value as the type's output function printed it (what pgoutput sends as 't').

        test_decoding rewrites two types: bool (``t`` -> ``true``) and bit
        strings (``0101`` -> ``B'0101'``); the bit prefix is already gone from
        `literal`, the bool is mapped back here.
        """
        if self.kind != "value":
            return None
        if self.type_name == "boolean":
            return {"true": "t", "false": "f"}[self.literal or ""]
        return self.literal


@dataclass(frozen=True)
class Change:
    """An INSERT, UPDATE or DELETE line."""

    relation: tuple[str, str]
    action: Literal["INSERT", "UPDATE", "DELETE"]
    #: UPDATE's ``old-key:`` part or DELETE's tuple (NULL columns omitted); None when absent.
    old: tuple[Column, ...] | None
    #: INSERT / UPDATE new tuple; None for DELETE or ``(no-tuple-data)``.
    new: tuple[Column, ...] | None


@dataclass(frozen=True)
class Truncate:
    relations: tuple[tuple[str, str], ...]
    restart_seqs: bool
    cascade: bool


@dataclass(frozen=True)
class Marker:
    """``BEGIN [xid]`` or ``COMMIT [xid]``."""

    kind: Literal["BEGIN", "COMMIT"]
    xid: int | None


@dataclass(frozen=True)
class TxnMessage:
    """A ``message:`` line (logical decoding message); the content is not parsed."""

    transactional: bool
    prefix: str
    size: int


@dataclass(frozen=True)
class StreamEvent:
    """A line of streaming mode: open / close / change / truncate / message / abort / commit."""

    kind: Literal["open", "close", "change", "truncate", "message", "abort", "commit"]
    xid: int | None


_MARKER = re.compile(r"^(BEGIN|COMMIT)(?: (\d+))?$")
_MESSAGE = re.compile(r"^message: transactional: ([01]) prefix: (.*), sz: (\d+) content:", re.S)
_STREAM = [
    (re.compile(r"^opening a streamed block for transaction(?: TXN (\d+))?$"), "open"),
    (re.compile(r"^closing a streamed block for transaction(?: TXN (\d+))?$"), "close"),
    (re.compile(r"^streaming change for (?:TXN (\d+)|transaction)$"), "change"),
    (re.compile(r"^streaming truncate for (?:TXN (\d+)|transaction)$"), "truncate"),
    (re.compile(r"^streaming message: transactional: [01] prefix: .*, sz: \d+$"), "message"),
    (re.compile(r"^aborting streamed (?:\(sub\))?transaction(?: TXN (\d+))?$"), "abort"),
    (re.compile(r"^committing streamed transaction(?: TXN (\d+))?$"), "commit"),
]
_PLAIN_IDENT = re.compile(r"[a-z_][a-z0-9_$]*")
_BARE_NUMBER = re.compile(r"(?:-?(?:\d+(?:\.\d*)?(?:e[-+]?\d+)?|Infinity)|NaN)(?= |$)")
_BARE_BOOL = re.compile(r"(?:true|false)(?= |$)")


class _Reader:
    def __init__(self, line: str) -> None:
        self.line = line
        self.pos = 0

    def fail(self, reason: str) -> TestDecodingParseError:
        return TestDecodingParseError(self.line, self.pos, reason)

    def at(self, text: str) -> bool:
        return self.line.startswith(text, self.pos)

    def expect(self, text: str) -> None:
        if not self.at(text):
            raise self.fail(f"expected {text!r}")
        self.pos += len(text)

    def done(self) -> bool:
        return self.pos >= len(self.line)

    def ident(self) -> str:
        """A name as quote_identifier prints it."""
        if self.at('"'):
            return self.quoted('"')
        match = _PLAIN_IDENT.match(self.line, self.pos)
        if match is None:
            raise self.fail("expected an identifier")
        self.pos = match.end()
        return match.group()

    def quoted(self, quote: str) -> str:
        """A literal between `quote`s with the quote doubled inside."""
        self.expect(quote)
        out = []
        while True:
            end = self.line.find(quote, self.pos)
            if end < 0:
                raise self.fail(f"unterminated {quote}-quoted text")
            out.append(self.line[self.pos:end])
            self.pos = end + 1
            if self.at(quote):
                out.append(quote)
                self.pos += 1
            else:
                return "".join(out)

    def relation(self) -> tuple[str, str]:
        namespace = self.ident()
        self.expect(".")
        return namespace, self.ident()

    def column(self) -> Column:
        name = self.ident()
        self.expect("[")
        end = self.line.find("]:", self.pos)
        if end < 0:
            raise self.fail("expected ']:' after the type name")
        type_name = self.line[self.pos:end]
        self.pos = end + 2
        for word, kind in (("null", "null"), ("unchanged-toast-datum", "unchanged-toast")):
            if self.at(word) and self.line[self.pos + len(word):self.pos + len(word) + 1] in ("", " "):
                self.pos += len(word)
                return Column(name, type_name, kind)  # type: ignore[arg-type]
        if type_name in _BIT_TYPES:
            self.expect("B")
            return Column(name, type_name, "value", self.quoted("'"))
        if type_name in BARE_TYPES or type_name == "boolean":
            pattern = _BARE_BOOL if type_name == "boolean" else _BARE_NUMBER
            match = pattern.match(self.line, self.pos)
            if match is None:
                raise self.fail(f"expected a bare {type_name} value")
            self.pos = match.end()
            return Column(name, type_name, "value", match.group())
        if not self.at("'"):
            raise self.fail(f"expected a quoted {type_name} literal")
        return Column(name, type_name, "value", self.quoted("'"))

    def tuple(self, stop: str | None = None) -> tuple[Column, ...]:
        """Columns, each introduced by a space, up to the end or to `stop`."""
        columns = []
        while not self.done() and not (stop and self.at(stop)):
            self.expect(" ")
            columns.append(self.column())
        return tuple(columns)


def _change(reader: _Reader, relation: tuple[str, str], action: str) -> Change:
    if action == "INSERT":
        if reader.at(" (no-tuple-data)"):
            reader.expect(" (no-tuple-data)")
            return Change(relation, "INSERT", None, None)
        return Change(relation, "INSERT", None, reader.tuple())
    if action == "UPDATE":
        old = None
        if reader.at(" old-key:"):
            reader.expect(" old-key:")
            old = reader.tuple(stop=" new-tuple:")
            reader.expect(" new-tuple:")
        if reader.at(" (no-tuple-data)"):
            reader.expect(" (no-tuple-data)")
            return Change(relation, "UPDATE", old, None)
        return Change(relation, "UPDATE", old, reader.tuple())
    if reader.at(" (no-tuple-data)"):
        reader.expect(" (no-tuple-data)")
        return Change(relation, "DELETE", None, None)
    return Change(relation, "DELETE", reader.tuple(), None)


def parse_line(line: str) -> Change | Truncate | Marker | TxnMessage | StreamEvent:
    """Parse one line of test_decoding output; raise `TestDecodingParseError` if it is malformed."""
    match = _MARKER.match(line)
    if match:
        xid = int(match.group(2)) if match.group(2) else None
        return Marker(match.group(1), xid)  # type: ignore[arg-type]
    match = _MESSAGE.match(line)
    if match:
        return TxnMessage(match.group(1) == "1", match.group(2), int(match.group(3)))
    for pattern, kind in _STREAM:
        match = pattern.match(line)
        if match:
            xid = match.group(1) if match.groups() else None
            return StreamEvent(kind, int(xid) if xid else None)  # type: ignore[arg-type]
    reader = _Reader(line)
    reader.expect("table ")
    relations = [reader.relation()]
    while reader.at(", "):
        reader.expect(", ")
        relations.append(reader.relation())
    reader.expect(": ")
    for action in ("INSERT", "UPDATE", "DELETE", "TRUNCATE"):
        if reader.at(action + ":"):
            reader.expect(action + ":")
            break
    else:
        raise reader.fail("expected INSERT, UPDATE, DELETE or TRUNCATE")
    if action == "TRUNCATE":
        if reader.at(" (no-flags)"):
            reader.expect(" (no-flags)")
            restart = cascade = False
        else:
            restart = reader.at(" restart_seqs")
            if restart:
                reader.expect(" restart_seqs")
            cascade = reader.at(" cascade")
            if cascade:
                reader.expect(" cascade")
            if not (restart or cascade):
                raise reader.fail("expected TRUNCATE flags")
        result: Change | Truncate = Truncate(tuple(relations), restart, cascade)
    else:
        if len(relations) != 1:
            raise reader.fail(f"{action} names {len(relations)} relations")
        result = _change(reader, relations[0], action)
    if not reader.done():
        raise reader.fail("trailing text")
    return result
