"""Every type against PostgreSQL: text and binary forms from the server, psycopg as the oracle.

For each case the server stores the edge values in a table; we fetch the
column in text and in binary format (raw bytes, as pgoutput would carry
them), convert both, and check that (1) the Arrow type is the documented
one, (2) text and binary give the same array, (3) the values are what the
server says through psycopg / SQL (mapped through the documented policy),
(4) for arrays, the flattened elements equal the scalar conversion of
``unnest(v)``. PostgreSQL 15 and 18 run every case, PostgreSQL 16 and 17 the smoke
subset.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from pgoutput_spark.convert import PgType, TypeConversionError, arrow_type, convert, override_type
from pgoutput_spark.testing.pgcluster import PgCluster
from tests.plugins.postgres import new_database

from .cases import ARRAYS, SCALARS, Case
from .oracle import assert_same, binary_array, column_type, plain, raw_values

pytestmark = pytest.mark.postgres

_tables = itertools.count(1)


class TypeDb:
    """One database per cluster for all cases; each case gets its own table."""

    def __init__(self, cluster: PgCluster) -> None:
        self.cluster = cluster
        self.conn = cluster.connect(new_database(cluster, "convert"))
        self.setups: set[str] = set()

    def table(self, case: Case) -> str:
        if case.setup and case.setup not in self.setups:
            self.conn.execute(case.setup)
            self.setups.add(case.setup)
        name = f"c{next(_tables)}"
        self.conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v {case.column})")
        for i, expression in enumerate(case.values):
            self.conn.execute(f"INSERT INTO {name} VALUES ({i}, {expression})")
        return name


@pytest.fixture(scope="module")
def type_dbs() -> Iterator[dict[int, TypeDb]]:
    """The module's `TypeDb` of each cluster (by port), made when a test first asks (`_type_db`)."""
    dbs: dict[int, TypeDb] = {}
    yield dbs
    for db in dbs.values():
        db.conn.close()


def _type_db(dbs: dict[int, TypeDb], cluster: PgCluster) -> TypeDb:
    if cluster.port not in dbs:
        dbs[cluster.port] = TypeDb(cluster)
    return dbs[cluster.port]


@pytest.fixture(scope="module")
def db15(pg15: PgCluster, type_dbs: dict[int, TypeDb]) -> TypeDb:
    return _type_db(type_dbs, pg15)


def _flatten(array: Any, levels: int) -> Any:
    for _ in range(levels):
        array = pc.list_flatten(array)
    return array


def check_case(db: TypeDb, case: Case) -> None:
    conn = db.conn
    table = db.table(case)
    for statement in case.settings:
        conn.execute(statement)
    try:
        t = column_type(conn, table, dimensions=case.dimensions)
        assert arrow_type(t) == case.arrow, f"{case.id}: {t} maps to {arrow_type(t)}"
        select = f"SELECT v FROM {table} ORDER BY id"
        text = convert(binary_array(raw_values(conn, select, 0)), t, format="text")
        assert text.type == case.arrow

        if case.binary_error:
            with pytest.raises(TypeConversionError, match=case.binary_error):
                convert(binary_array(raw_values(conn, select, 1)), t, format="binary")
        else:
            binary = convert(binary_array(raw_values(conn, select, 1)), t, format="binary")
            assert binary.type == case.arrow
            assert_same(plain_list(binary), plain_list(text), f"{case.id} binary vs text")

        if case.oracle is not None:
            oracle_sql = f"SELECT v IS NULL, {case.oracle} FROM {table} ORDER BY id"
            rows = conn.cursor(binary=case.oracle_binary).execute(oracle_sql).fetchall()
            expected = [None if row[0] else case.expect(*row[1:]) for row in rows]
            actual = (plain_list(text) if case.integers else text.to_pylist())
            assert_same(actual, expected, f"{case.id} vs PostgreSQL")

        if t.is_array:
            elements = f"SELECT e FROM {table}, unnest(v) WITH ORDINALITY AS u(e, n) ORDER BY id, n"
            scalar = convert(binary_array(raw_values(conn, elements, 0)), t.element(), format="text")
            flat = plain_list(_flatten(text, case.dimensions))
            assert_same(flat, plain_list(scalar), f"{case.id} elements vs scalar conversion")
    finally:
        conn.execute("RESET ALL")


def plain_list(array: Any) -> list[Any]:
    """`to_pylist`, with temporal values (also inside lists) as their integer storage."""
    if pa.types.is_list(array.type):
        inner = plain_list(array.values)
        offsets = array.offsets.to_pylist()
        valid = array.is_valid().to_pylist()
        return [inner[offsets[i]: offsets[i + 1]] if valid[i] else None for i in range(len(array))]
    return plain(array).to_pylist()


@pytest.mark.parametrize("case", SCALARS + ARRAYS, ids=lambda c: c.id)
@pytest.mark.parametrize("server", ["pg15", "pg18"])
def test_every_case(server: str, case: Case, type_dbs: dict[int, TypeDb], request: pytest.FixtureRequest) -> None:
    check_case(_type_db(type_dbs, request.getfixturevalue(server)), case)


@pytest.mark.parametrize("case", [c for c in SCALARS + ARRAYS if c.smoke], ids=lambda c: c.id)
@pytest.mark.parametrize("server", ["pg16", "pg17"])
def test_smoke_case(server: str, case: Case, type_dbs: dict[int, TypeDb], request: pytest.FixtureRequest) -> None:
    check_case(_type_db(type_dbs, request.getfixturevalue(server)), case)


def test_extra_float_digits_3_as_the_subscriber_uses(db15: TypeDb) -> None:
    """PostgreSQL's own subscriber asks for extra_float_digits=3: same shortest-exact output."""
    conn = db15.conn
    conn.execute("SET extra_float_digits = 3")
    try:
        sql = "SELECT v FROM unnest('{0.1,1e-45,3.4028235e38,NaN}'::float4[]) v"
        text = convert(binary_array(raw_values(conn, sql, 0)), PgType(700), format="text")
        binary = convert(binary_array(raw_values(conn, sql, 1)), PgType(700), format="binary")
        assert_same(text.to_pylist(), binary.to_pylist(), "float4 text vs binary")
    finally:
        conn.execute("RESET ALL")


@pytest.mark.parametrize(
    ("setting", "sql", "oid", "message"),
    [
        ("DateStyle = 'Postgres, MDY'", "SELECT '2024-01-31'::date", 1082, "DateStyle=ISO"),
        ("DateStyle = 'SQL, DMY'", "SELECT '2024-01-31 12:00'::timestamp", 1114, "DateStyle=ISO"),
        ("DateStyle = 'German'", "SELECT '2024-01-31 12:00+00'::timestamptz", 1184, "DateStyle=ISO"),
        ("IntervalStyle = 'iso_8601'", "SELECT '1 day 2 hours'::interval", 1186, "IntervalStyle=postgres"),
        ("IntervalStyle = 'sql_standard'", "SELECT '1 year 2 days 3:00'::interval", 1186, "IntervalStyle=postgres"),
        ("IntervalStyle = 'postgres_verbose'", "SELECT '1 day'::interval", 1186, "IntervalStyle=postgres"),
    ],
)
def test_other_session_styles_fail_clearly(db15: TypeDb, setting: str, sql: str, oid: int, message: str) -> None:
    conn = db15.conn
    conn.execute(f"SET {setting}")
    try:
        raw = raw_values(conn, sql, 0)
        with pytest.raises(TypeConversionError, match=message) as info:
            convert(binary_array(raw), PgType(oid), format="text")
        assert info.value.index == 0
        assert info.value.value == raw[0]
    finally:
        conn.execute("RESET ALL")


def test_text_and_binary_agree_on_many_random_values(db15: TypeDb) -> None:
    """A few thousand generated rows per family, so the vectorized paths see bulk data."""
    conn = db15.conn
    conn.execute("SET TimeZone = 'America/New_York'")
    try:
        for column, oid, modifier in [
            ("(random() * 1e12 - 5e11)::int8", 20, -1),
            ("(random() * 1e6 - 5e5)::numeric(12,4)", 1700, (12 << 16 | 4) + 4),
            ("(random() * 1e6)::numeric * 10::numeric ^ (g % 20 - 10)", 1700, -1),
            ("-(random() * 1e6)::numeric(20, 8) / 10::numeric ^ (g % 12)", 1700, -1),
            ("random()::float8 * 10 ^ (g % 40 - 20)", 701, -1),
            ("timestamptz '1900-01-01' + random() * interval '300 years'", 1184, -1),
            ("date '0100-01-01' + (random() * 1e6)::int", 1082, -1),
            ("make_interval(0, g % 25 - 12, 0, g % 40 - 20, 0, 0, random() * 1e5 - 5e4)", 1186, -1),
            ("(random() * 86400)::int * interval '1 second' + time '00:00'", 1083, -1),
            ("md5(g::text)::uuid", 2950, -1),
            ("('192.168.' || g % 256 || '.' || g / 256 % 256 || '/' || g % 33)::inet", 869, -1),
            ("('2001:db8::' || to_hex(g) || '/' || g % 129)::inet", 869, -1),
            ("decode(md5(g::text), 'hex')", 17, -1),
            ("array_fill(g, ARRAY[g % 5])", 1007, -1),
            ("ARRAY[md5(g::text), NULL, 'a\"b' || g]", 1009, -1),
        ]:
            conn.execute(f"CREATE TEMP TABLE bulk AS SELECT g, {column} AS v FROM generate_series(1, 3000) g")
            sql = "SELECT v FROM bulk ORDER BY g"
            t = PgType(oid, modifier)
            text = convert(binary_array(raw_values(conn, sql, 0)), t, format="text")
            binary = convert(binary_array(raw_values(conn, sql, 1)), t, format="binary")
            assert_same(plain_list(text), plain_list(binary), column)
            conn.execute("DROP TABLE bulk")
    finally:
        conn.execute("RESET ALL")


def test_escape_bytea_random(db15: TypeDb) -> None:
    conn = db15.conn
    conn.execute("SET bytea_output = 'escape'")
    try:
        sql = "SELECT decode(md5(g::text) || md5((g * 7)::text), 'hex') FROM generate_series(1, 2000) g"
        text = convert(binary_array(raw_values(conn, sql, 0)), PgType(17), format="text")
        binary = convert(binary_array(raw_values(conn, sql, 1)), PgType(17), format="binary")
        assert text.equals(binary)
    finally:
        conn.execute("RESET ALL")


@pytest.mark.parametrize("override", ["decimal(10,2)", "decimal(38,0)", "decimal(5,5)", "decimal(38,20)", "double"])
def test_numeric_overrides_convert_as_postgresql_casts(db15: TypeDb, override: str) -> None:
    """``tables.types``' double and decimal(p, s) for a numeric column: each value, from text and
    from binary, is what PostgreSQL's ``::float8`` / ``::numeric(p, s)`` makes of it (rounding half
    away from zero); a value that cast rejects (too many integer digits) fails naming it, as do
    NaN and Infinity, which a decimal cannot hold (PostgreSQL's numeric(p, s) can)."""
    conn = db15.conn
    edges = ["0", "1.005", "-1.005", "0.125", "-0.125", "2.5", "-2.5", "0.0049", "-0.0049", "0.000005",
             "-0.000005", "0.99999", "123.456789", "99999999.994", "99999999.995", "-99999999.995",
             "12345678901234567890.123456789012345678901", "1e30", "1e-30", "NaN", "Infinity", "-Infinity"]
    conn.execute("CREATE TEMP TABLE nums AS SELECT row_number() OVER () AS g, v::numeric AS v FROM unnest(%s::text[]) v"
                 " UNION ALL SELECT 100 + g, round((random() * 1e6)::numeric * 10::numeric ^ (g %% 30 - 15), g %% 25)"
                 " * (g %% 2 * 2 - 1) FROM generate_series(1, 500) g", (edges,))
    cast = "float8" if override == "double" else override.replace("decimal", "numeric")
    conn.execute(f"""CREATE OR REPLACE FUNCTION pg_temp.cast_or_null(v numeric) RETURNS text AS $$
        BEGIN RETURN (v::{cast})::text; EXCEPTION WHEN numeric_value_out_of_range THEN RETURN NULL; END
        $$ LANGUAGE plpgsql""")
    try:
        rows = conn.execute("SELECT g, v::text, pg_temp.cast_or_null(v) FROM nums ORDER BY g").fetchall()
        t = PgType(1700)
        target = override_type(override, t, "nums.v")
        decimal = override != "double"
        fails = {g for g, v, out in rows if out is None or decimal and out in ("NaN", "Infinity", "-Infinity")}
        assert (len(fails) >= 3 if decimal else not fails) and len(rows) - len(fails) > 100
        kept = "SELECT v FROM nums WHERE g <> ALL(%s) ORDER BY g" % ("'{" + ",".join(map(str, fails)) + "}'")
        text = convert(binary_array(raw_values(conn, kept, 0)), t, format="text", target=target)
        binary = convert(binary_array(raw_values(conn, kept, 1)), t, format="binary", target=target)
        assert text.type == binary.type == target
        expected = [float(out) if not decimal else Decimal(out) for g, _, out in rows if g not in fails]
        assert_same(text.to_pylist(), expected, f"{override} from text vs PostgreSQL")
        assert_same(binary.to_pylist(), expected, f"{override} from binary vs PostgreSQL")
        for g, v, _ in rows:
            if g in fails and (g < 100 or g in sorted(fails)[-10:]):  # the edges, some random values
                one = f"SELECT v FROM nums WHERE g = {g}"
                for fmt, name in ((0, "text"), (1, "binary")):
                    with pytest.raises(TypeConversionError, match=r"fit decimal|no NaN or Infinity|out of range") \
                            as info:
                        convert(binary_array(raw_values(conn, one, fmt)), t, format=name, target=target)
                    assert info.value.index == 0, v
    finally:
        conn.execute("DROP TABLE nums")
