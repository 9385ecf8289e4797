"""Binary-mode tuples ('b') carry the same values as text-mode ones ('t'), per psycopg's loaders.

The same slot is peeked twice, with ``binary`` off and on: the server decodes the
same WAL, so the two captures hold the same messages in the same order and
differ only in how column values are encoded. For every column value, psycopg's
binary loader for the column's type OID (from the Relation message) must give
what its text loader gives for the text value. Types psycopg has no loaders
for (bit, varbit, the enum and the domain) are only checked to arrive as 'b'.
"""

from __future__ import annotations

import math
from collections import Counter
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg.pq import Format

from pgoutput_spark.decoder import messages as m
from pgoutput_spark.decoder.protocol import TupleKind

from .conftest import Capture, ServerWorkload

pytestmark = pytest.mark.postgres

#: OIDs that must have been compared through both loaders (int2..jsonb, int4[], text[], inet).
MUST_COMPARE = {21, 23, 20, 1700, 700, 701, 25, 1043, 1042, 17, 16, 1082, 1114, 1184, 1083, 1186,
                2950, 3802, 114, 1007, 1009, 869}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, Decimal) and isinstance(b, Decimal) and a.is_nan():
        return b.is_nan()
    return type(a) is type(b) and a == b


def _load(conn: psycopg.Connection[Any], oid: int, fmt: Format, data: bytes) -> tuple[str, Any]:
    """("ok", value) or ("error", exception class name): some values (date 'infinity')
    have no Python equivalent, and both loaders must then refuse them alike."""
    loader_class = conn.adapters.get_loader(oid, fmt)
    assert loader_class is not None
    try:
        return "ok", loader_class(oid, conn).load(data)
    except psycopg.DataError as exc:
        return "error", type(exc).__name__


def _pairs(text: Capture, binary: Capture) -> list[tuple[m.RelationColumn, m.TupleValue, m.TupleValue]]:
    """(column, text value, binary value) for every tuple value of the two captures."""
    assert [(r.seq, r.lsn, r.xid, r.data[:1]) for r in text.messages] == \
        [(r.seq, r.lsn, r.xid, r.data[:1]) for r in binary.messages]
    relations: dict[int, m.Relation] = {}
    out = []
    for (_, _, t), (_, _, b) in zip(text.items(), binary.items()):
        assert type(t) is type(b)
        if isinstance(t, m.Relation):
            assert t == b
            relations[t.relation_id] = t
        if not isinstance(t, m.Insert | m.Update | m.Delete):
            continue
        assert isinstance(b, m.Insert | m.Update | m.Delete)
        assert (t.relation_id, t.xid) == (b.relation_id, b.xid)
        for part in ("old_tuple", "new_tuple"):
            t_tuple, b_tuple = getattr(t, part, None), getattr(b, part, None)
            assert (t_tuple is None) == (b_tuple is None)
            if t_tuple is None:
                continue
            columns = relations[t.relation_id].columns
            assert len(t_tuple) == len(b_tuple) == len(columns)
            out += list(zip(columns, t_tuple, b_tuple))
    return out


@pytest.mark.parametrize("server, proto", [("pg15", 2), ("pg16", 4), ("pg18", 4)], ids=["pg15", "pg16", "pg18"])
def test_binary_values_load_like_text_values(request: pytest.FixtureRequest, server: str,
                                             proto: int) -> None:
    workload: ServerWorkload = request.getfixturevalue(f"{server}_workload")
    text, binary = workload.capture(proto), workload.capture(proto, binary=True)
    compared: Counter[int] = Counter()
    kind_only: Counter[int] = Counter()
    with text.connect() as conn:
        for column, tv, bv in _pairs(text, binary):
            if tv.kind is not TupleKind.TEXT:
                assert bv == tv, column.name  # NULL and unchanged TOAST look the same in both modes
                continue
            assert bv.kind is TupleKind.BINARY, column.name
            oid = column.type_oid
            has_loaders = all(conn.adapters.get_loader(oid, fmt) for fmt in (Format.TEXT, Format.BINARY))
            if not has_loaders:
                kind_only[oid] += 1
                continue
            assert tv.value is not None and bv.value is not None
            from_text = _load(conn, oid, Format.TEXT, tv.value)
            from_binary = _load(conn, oid, Format.BINARY, bv.value)
            assert from_text[0] == from_binary[0] and _same(from_text[1], from_binary[1]), \
                (column.name, tv.value, bv.value, from_text, from_binary)
            compared[oid] += 1
        user_types = {int(oid) for (oid,) in conn.execute(
            "SELECT oid::int8 FROM pg_type WHERE typname IN ('mood', 'posint', 'bit', 'varbit')")}
    assert set(compared) >= MUST_COMPARE
    assert set(kind_only) == user_types
    assert sum(compared.values()) > 1000  # the big table's rows, plus every type of t_types
