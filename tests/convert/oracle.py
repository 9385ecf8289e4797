"""PostgreSQL as the oracle: raw text / binary values and psycopg's own reading of them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import pq

from pgoutput_spark.convert import PgType, resolve


def raw_values(conn: psycopg.Connection[Any], sql: str, fmt: int) -> list[bytes | None]:
    """The first column of `sql` as the server sends it (0 = text, 1 = binary)."""
    result = conn.pgconn.exec_params(sql.encode(), [], result_format=fmt)
    if result.status != pq.ExecStatus.TUPLES_OK:
        raise AssertionError(f"{sql}: {result.error_message.decode()}")
    return [result.get_value(row, 0) for row in range(result.ntuples)]


def type_names(conn: psycopg.Connection[Any]) -> dict[int, tuple[str, str]]:
    """What pgoutput's Type messages would say for every non-built-in type.

    logicalrep_write_typ sends the type's OID with its *base* type's namespace
    ("" for pg_catalog) and name.
    """
    rows = conn.execute(
        """
        SELECT t.oid, CASE WHEN n.nspname = 'pg_catalog' THEN '' ELSE n.nspname END, b.typname
        FROM pg_type t
        JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
        JOIN pg_namespace n ON n.oid = b.typnamespace
        WHERE t.oid >= 16384
        """
    ).fetchall()
    return {int(oid): (namespace, name) for oid, namespace, name in rows}


def column_type(conn: psycopg.Connection[Any], table: str, column: str = "v", dimensions: int = 1) -> PgType:
    """The PgType a Relation message for `table` would give `column`."""
    oid, modifier = conn.execute(
        "SELECT atttypid, atttypmod FROM pg_attribute WHERE attrelid = %s::regclass AND attname = %s",
        (table, column),
    ).fetchone()  # type: ignore[misc]
    t = resolve(int(oid), int(modifier), type_names(conn))
    if dimensions != 1:
        t = PgType(t.oid, t.modifier, t.name, t.namespace, dimensions)
    return t


def binary_array(values: Sequence[bytes | None]) -> pa.Array:
    return pa.array(values, pa.binary())


def plain(array: pa.Array) -> pa.Array:
    """Temporal arrays as their integer storage (Python can't hold BC / year 10000+ / sentinels)."""
    if pa.types.is_date32(array.type):
        return array.cast(pa.int32())
    if pa.types.is_timestamp(array.type):
        return array.cast(pa.int64())
    return array


def same(a: Any, b: Any) -> bool:
    """Equality where NaN equals NaN, recursing into lists and dicts."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b if a is not None and b is not None else a is b


def assert_same(actual: list[Any], expected: list[Any], what: str) -> None:
    assert len(actual) == len(expected), f"{what}: {len(actual)} values, expected {len(expected)}"
    for i, (x, y) in enumerate(zip(actual, expected)):
        assert same(x, y), f"{what}[{i}]: got {x!r}, expected {y!r}"
