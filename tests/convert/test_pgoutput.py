"""End to end with real pgoutput messages: Relation + Type messages -> resolve -> convert.

This is where the Type-message semantics matter: a domain column arrives with
the domain's OID and the base type's name, an enum with its own name, and
values in text or binary form depending on the ``binary`` option.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from pgoutput_spark import decode_message
from pgoutput_spark.convert import PgType, arrow_type, convert, resolve
from pgoutput_spark.decoder.messages import Insert, Relation, Type, Update
from pgoutput_spark.decoder.protocol import TupleKind
from pgoutput_spark.testing.pgcluster import PgCluster
from tests.plugins.postgres import new_database

pytestmark = pytest.mark.postgres

_SCHEMA = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN posint AS int4 CHECK (VALUE > 0);
CREATE DOMAIN price AS numeric(10,2);
CREATE TABLE t (
    id int PRIMARY KEY,
    m mood,
    p posint,
    pr price,
    amount numeric(12,3),
    tags text[],
    grid int4[],
    at timestamptz,
    big text
);
ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL;  -- stored out of line, uncompressed
CREATE PUBLICATION pub FOR TABLE t;
"""

_ROWS = """
INSERT INTO t VALUES
  (1, 'happy', 7, 12.34, 123456789.125, '{a,"b c",NULL}', '{{1,2},{3,4}}', '2024-01-31 12:00:00+05:30', repeat('x', 5000)),
  (2, NULL, NULL, NULL, NULL, NULL, NULL, 'infinity', NULL);
UPDATE t SET id = 3 WHERE id = 1;
"""

_EXPECTED: dict[str, tuple[pa.DataType, list[Any]]] = {
    "id": (pa.int32(), [1, 2, 3]),
    "m": (pa.string(), ["happy", None, "happy"]),
    "p": (pa.int32(), [7, None, 7]),
    "pr": (pa.string(), ["12.34", None, "12.34"]),  # a domain's typmod is not in the stream
    "amount": (pa.decimal128(12, 3), [Decimal("123456789.125"), None, Decimal("123456789.125")]),
    "tags": (pa.list_(pa.string()), [["a", "b c", None], None, ["a", "b c", None]]),
    "grid": (pa.list_(pa.list_(pa.int32())), [[[1, 2], [3, 4]], None, [[1, 2], [3, 4]]]),
}


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
@pytest.mark.parametrize("cluster_name", ["pg15", "pg16", "pg17", "pg18"])
def test_relation_type_and_tuples(request: pytest.FixtureRequest, cluster_name: str, binary: bool) -> None:
    cluster: PgCluster = request.getfixturevalue(cluster_name)
    db = new_database(cluster, "convert_pgoutput")
    cluster.execute(_SCHEMA, dbname=db)
    slot = f"slot_{db}"
    cluster.create_slot(slot, dbname=db)
    cluster.execute(_ROWS, dbname=db)
    messages = [decode_message(m.data) for m in cluster.peek_pgoutput(
        slot, publications=["pub"], proto_version=1, binary=binary, dbname=db)]  # fmt: skip

    type_names = {m.type_id: (m.namespace, m.name) for m in messages if isinstance(m, Type)}
    relation = next(m for m in messages if isinstance(m, Relation))
    rows = [m.new_tuple for m in messages if isinstance(m, (Insert, Update))]
    assert len(rows) == 3

    kinds = {TupleKind.BINARY if binary else TupleKind.TEXT, TupleKind.NULL, TupleKind.UNCHANGED_TOAST}
    assert {v.kind for row in rows for v in row} <= kinds
    # the domain's Type message names its base type; the enum names itself
    oid_of = {c.name: c.type_oid for c in relation.columns}
    assert type_names[oid_of["p"]] == ("", "int4")
    assert type_names[oid_of["pr"]] == ("", "numeric")
    assert type_names[oid_of["m"]] == ("public", "mood")

    fmt = "binary" if binary else "text"
    for index, column in enumerate(relation.columns):
        t = resolve(column.type_oid, column.type_modifier, type_names)
        if column.name == "grid":
            t = PgType(t.oid, t.modifier, t.name, t.namespace, dimensions=2)
        values = [row[index].value if row[index].kind in (TupleKind.TEXT, TupleKind.BINARY) else None
                  for row in rows]  # fmt: skip
        result = convert(pa.array(values, pa.binary()), t, format=fmt)
        assert result.type == arrow_type(t)
        if column.name in _EXPECTED:
            expected_type, expected = _EXPECTED[column.name]
            assert result.type == expected_type, column.name
            assert result.to_pylist() == expected, column.name
        elif column.name == "at":
            assert result.cast(pa.int64()).to_pylist() == [1706682600000000, 2**63 - 1, 1706682600000000]
        elif column.name == "big":
            # the UPDATE did not touch the TOASTed value: pgoutput sends 'u', the caller passes NULL
            assert rows[2][index].kind == TupleKind.UNCHANGED_TOAST
            assert result.to_pylist() == ["x" * 5000, None, None]
