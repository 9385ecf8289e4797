"""text, varchar, bpchar, name, "char", json, jsonb, xml, and types this layer does not know.

All become Arrow strings holding PostgreSQL's text form (bpchar keeps its
blank padding). The binary forms of these types are their text, except
``jsonb`` (a version byte 1, then the text) and ``"char"`` (one raw byte).

Types not known here (enums, composites, ranges, extension types, built-ins
such as point or tsvector) are strings in their text form. Their binary form
is only read for user types (outside ``pg_catalog``) whose bytes look like
text (UTF-8 without NUL or control bytes): that is what an enum label (and
e.g. a citext value) looks like; composites, ranges, hstore and the like begin
with small int32 counts or flag bytes and are refused with advice to capture
that type in text format.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .codec import Codec, fixed_type, matches
from .oids import BuiltinType
from .pgtype import PgType
from .raw import RawValues, fail_where

_STRING = fixed_type(pa.string())
# bytes a text value of an unknown user type may not contain in binary format
_NOT_TEXT_LIKE = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"


def _as_string(raw: RawValues, t: PgType) -> pa.Array:
    return raw.as_string()


# -- "char" ------------------------------------------------------------------------


def _char_table() -> pa.StringArray:
    """charout's text for each byte: '' for 0, the byte below 128, \\ooo octal above (PG 15+)."""
    words = [""] + [chr(b) for b in range(1, 128)] + [f"\\{b:03o}" for b in range(128, 256)]
    return pa.array(words, pa.string())


_CHAR_TEXT = _char_table()


def _char_binary(raw: RawValues, t: PgType) -> pa.Array:
    byte = raw.fixed(1, '"char"')[:, 0]
    return _CHAR_TEXT.take(pa.array(byte.astype(np.int32), mask=~raw.valid))


# -- jsonb -------------------------------------------------------------------------

_JSONB_VERSION = 1


def _jsonb_binary(raw: RawValues, t: PgType) -> pa.Array:
    fail_where(raw.valid & (raw.lengths < 1), "jsonb binary value is empty")
    version = raw.read(0, "u1")
    fail_where(raw.valid & (version != _JSONB_VERSION),
               f"jsonb binary format version must be {_JSONB_VERSION}")  # fmt: skip
    return raw.without_prefix(1).cast(pa.string())


# -- unknown types -----------------------------------------------------------------


def unknown_binary(raw: RawValues, t: PgType) -> pa.Array:
    advice = (
        f"the binary form of {t.display_name} is not known; capture this type in text"
        " format (pgoutput binary=false)"
    )
    if t.namespace in (None, ""):  # built in or a domain over a built-in type
        fail_where(raw.valid, advice)
    bad = raw.valid & ((raw.lengths == 0) | matches(raw.as_binary(), _NOT_TEXT_LIKE))
    fail_where(bad, advice + " (only enum labels and other text-like values are read from binary)")
    return raw.as_string()


UNKNOWN = Codec(_STRING, _as_string, unknown_binary)

CODECS: dict[int, Codec] = {
    **{
        oid: Codec(_STRING, _as_string, _as_string)
        for oid in (
            BuiltinType.TEXT, BuiltinType.VARCHAR, BuiltinType.BPCHAR, BuiltinType.NAME,
            BuiltinType.JSON, BuiltinType.XML,
        )
    },
    BuiltinType.CHAR: Codec(_STRING, _as_string, _char_binary),
    BuiltinType.JSONB: Codec(_STRING, _as_string, _jsonb_binary),
}
