"""The built-in OID tables against real servers' pg_type."""

from __future__ import annotations

import pytest

from pgoutput_spark.convert import ARRAY_ELEMENT, BuiltinArrayType, BuiltinType
from pgoutput_spark.testing.pgcluster import PgCluster

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize("cluster_name", ["pg15", "pg16", "pg17", "pg18"])
def test_oids_match_pg_type(request: pytest.FixtureRequest, cluster_name: str) -> None:
    cluster: PgCluster = request.getfixturevalue(cluster_name)
    rows = cluster.query(
        "SELECT oid::int, typname::text, typelem::int, typarray::int FROM pg_type"
        " WHERE typnamespace = 'pg_catalog'::regnamespace"
    )
    by_name = {name: (oid, elem, array) for oid, name, elem, array in rows}
    for member in BuiltinType:
        oid, elem, array = by_name[member.typname]
        assert oid == member, member
        assert elem == 0 or member in (BuiltinType.NAME,), member  # name is a fixed-length char array
        assert BuiltinArrayType(array).element is member, member
    for array_member in BuiltinArrayType:
        oid, elem, _ = by_name[array_member.typname]
        assert oid == array_member, array_member
        assert elem == array_member.element == ARRAY_ELEMENT[oid], array_member
    assert len(BuiltinArrayType) == len(BuiltinType)
