"""Edge values per type, and how PostgreSQL itself says they should come out.

Each `Case` is a column type, SQL expressions for its values, an oracle
select-list the server evaluates on the same rows (read with psycopg's
normal loaders), and `expect`, which maps an oracle row through the
documented policy (sentinels for infinity, normalized time strings, interval
fields, ...) to the Python value the converted Arrow array must hold.
Expected values never come from the converter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from uuid import UUID

import numpy as np
import pyarrow as pa

from pgoutput_spark.convert import (
    DATE_INFINITY,
    DATE_MINUS_INFINITY,
    INTERVAL,
    TIMESTAMP_INFINITY,
    TIMESTAMP_MINUS_INFINITY,
)

US = 1_000_000


def _same(v: Any) -> Any:
    return v


def _float4(v: float) -> float:
    return float(np.float32(v))


def _us(seconds: Decimal) -> int:
    return int(seconds * US)


def _date(finite: bool, days: int, positive: bool) -> int:
    return days if finite else (DATE_INFINITY if positive else DATE_MINUS_INFINITY)


def _timestamp(finite: bool, us: int | None, positive: bool) -> int:
    return int(us) if finite else (TIMESTAMP_INFINITY if positive else TIMESTAMP_MINUS_INFINITY)  # type: ignore[arg-type]


def format_time(us: int) -> str:
    seconds, fraction = divmod(us, US)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return f"{hour:02}:{minute:02}:{second:02}.{fraction:06}"


def format_timetz(seconds: Decimal, east: int) -> str:
    sign = "-" if east < 0 else "+"
    minutes, second = divmod(abs(east), 60)
    hour, minute = divmod(minutes, 60)
    zone = f"{sign}{hour:02}:{minute:02}" + (f":{second:02}" if second else "")
    return format_time(_us(seconds)) + zone


def _interval(months: int, days: int, us: int) -> dict[str, int]:
    return {"months": months, "days": days, "microseconds": us}


def _uuids(values: list[UUID | None]) -> list[str | None]:
    return [None if v is None else str(v) for v in values]


# the type's output function (inet::text is network_show, which always adds the mask)
_OUT = "format('%s', v)"
_OUT_ELEMENTS = "ARRAY(SELECT CASE WHEN e IS NOT NULL THEN format('%s', e) END FROM unnest(v) e)"


@dataclass(frozen=True)
class Case:
    id: str
    column: str  # the SQL type of column v
    values: tuple[str, ...]  # SQL expressions, one row each
    arrow: pa.DataType
    oracle: str | None = "v"  # select-list over the same rows, read by psycopg (None: no oracle)
    expect: Callable[..., Any] = _same  # oracle row -> expected output value
    dimensions: int = 1
    settings: tuple[str, ...] = ()  # SET statements of the fetching session
    setup: str = ""  # DDL the column type needs
    min_version: int = 0
    smoke: bool = False  # part of the PG16 and PG17 subset
    oracle_binary: bool = False  # read the oracle with psycopg's binary loaders
    integers: bool = False  # compare temporal values as their int32 days / int64 microseconds
    binary_error: str | None = None  # the binary form must fail with this in the message


def _lit(*texts: str) -> tuple[str, ...]:
    """SQL string literals (standard_conforming_strings: backslashes as is), plus NULL."""
    return tuple("'" + t.replace("'", "''") + "'" for t in texts) + ("NULL",)


_TZ_VALUES = _lit(
    "2024-01-31 12:34:56.123456+00", "1900-01-01 12:00:00+00", "2024-06-30 23:59:59.999999+00",
    "0044-03-15 12:00:00+00 BC", "4713-11-24 00:00:00+00 BC", "12345-06-07 08:09:10+00",
    "294246-12-31 23:59:59.999999+00", "1969-12-31 23:59:59.999999+00", "infinity", "-infinity",
)  # fmt: skip
_TZ_ORACLE = "isfinite(v), CASE WHEN isfinite(v) THEN (extract(epoch from v) * 1000000)::int8 END, v > 'epoch'"
_TIMESTAMPTZ = pa.timestamp("us", tz="UTC")


def _timestamptz_case(zone: str) -> Case:
    return Case(
        f"timestamptz-{zone}", "timestamptz", _TZ_VALUES, _TIMESTAMPTZ, _TZ_ORACLE, _timestamp,
        settings=(f"SET TimeZone = '{zone}'",), smoke=zone == "Asia/Kolkata", integers=True,
    )  # fmt: skip


SCALARS: list[Case] = [
    Case("bool", "bool", _lit("t", "f"), pa.bool_(), smoke=True),
    Case("int2", "int2", _lit("0", "-32768", "32767", "-1"), pa.int16()),
    Case("int4", "int4", _lit("0", "-2147483648", "2147483647", "42"), pa.int32(), smoke=True),
    Case("int8", "int8", _lit("-9223372036854775808", "9223372036854775807", "0"), pa.int64()),
    Case("oid", "oid", _lit("0", "4294967295", "16384"), pa.int64()),
    Case("float4", "float4",
         _lit("NaN", "Infinity", "-Infinity", "0", "-0", "1.4e-45", "3.4028235e38", "0.1", "1.1754944e-38",
              "123456.79", "-2.5e-7"),
         pa.float32(), expect=_float4),
    Case("float8", "float8",
         _lit("NaN", "Infinity", "-Infinity", "-0", "5e-324", "1.7976931348623157e308", "0.1",
              "0.30000000000000004", "-1.5e-07", "1e+300", "2.2250738585072014e-308"),
         pa.float64(), smoke=True),
    Case("numeric", "numeric",
         _lit("0", "-0.000100", "123456789012345678901234567890.123456789012345678901234567890", "NaN",
              "Infinity", "-Infinity", "1e-300", "-99999", "0.5", "10000", "1e100", "0.00000001",
              "9999.9999", "-1"),
         pa.string(), oracle="v::text", smoke=True),
    Case("numeric-10-2", "numeric(10,2)", _lit("0", "-12345678.90", "99999999.99", "0.01", "-0.01", "1"),
         pa.decimal128(10, 2), smoke=True),
    Case("numeric-38-10", "numeric(38,10)",
         _lit("9999999999999999999999999999.9999999999", "-0.0000000001", "1", "-1234.5"),
         pa.decimal128(38, 10)),
    Case("numeric-38-0", "numeric(38,0)", _lit("99999999999999999999999999999999999999", "-1", "0"),
         pa.decimal128(38, 0)),
    Case("numeric-5-neg2", "numeric(5,-2)", _lit("12345", "-9994949", "0", "50"), pa.string(),
         oracle="v::text"),
    Case("numeric-3-5", "numeric(3,5)", _lit("0.00123", "-0.00999", "0"), pa.string(), oracle="v::text"),
    Case("numeric-39-2", "numeric(39,2)", _lit("1234.5", "-999999999999999999999999999999999999.99"),
         pa.string(), oracle="v::text"),
    Case("money", "money",
         _lit("0", "-1234.56", "92233720368547758.07", "-92233720368547758.08", "0.01", "1000000"),
         pa.decimal128(19, 2), oracle="v::numeric", smoke=True),
    Case("text", "text",
         _lit("", "plain", "ünïcødé 😀 日本", "quote ' \" and \\ backslash", "tab\tnewline\nend", "NULL",
              " padded ", "{braces,commas}"),
         pa.string(), smoke=True),
    Case("varchar", "varchar(10)", _lit("", "abc", "ü"), pa.string()),
    Case("bpchar", "char(5)", _lit("a", "abcde", "", "ü"), pa.string()),
    Case("name", "name", _lit("pg_catalog", "x" * 63, "ünï"), pa.string()),
    Case("char", '"char"', ("'a'", "''", "'\\200'", "'\\377'", "' '", "NULL"), pa.string(),
         oracle="v::text"),
    Case("bytea-hex", "bytea",
         ("'\\x'", "decode('00ff5c22', 'hex')", "convert_to('ünï \\ \" x', 'UTF8')", "decode(repeat('00', 10), 'hex')",
          "'\\x5c78'::bytea", "decode('5c5c5c', 'hex')", "NULL"),
         pa.binary(), smoke=True),
    Case("bytea-escape", "bytea",
         ("'\\x'", "decode('00ff5c22', 'hex')", "convert_to('ünï \\ \" x', 'UTF8')", "decode(repeat('00', 10), 'hex')",
          "'\\x5c78'::bytea", "decode('5c5c5c5c30', 'hex')", "decode('5c303132', 'hex')", "NULL"),
         pa.binary(), settings=("SET bytea_output = 'escape'",), smoke=True),
    Case("json", "json", _lit('{"a": "q\\"uote", "b": [1, 2.50, null]}', '"str"', "[]", '  {"sp" : 1}  '),
         pa.string(), oracle="v::text"),
    Case("jsonb", "jsonb", _lit('{"a": "q\\"uote", "b": [1, 2.50, null]}', '"str"', "[]", '{"ü": "\\u00e9"}'),
         pa.string(), oracle="v::text", smoke=True),
    Case("xml", "xml", _lit('<a x="1">t &amp; u</a>', "", "plain ü"), pa.string(), oracle="v::text"),
    Case("uuid", "uuid",
         _lit("00000000-0000-0000-0000-000000000000", "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
              "ffffffff-ffff-ffff-ffff-ffffffffffff"),
         pa.string(), expect=str, smoke=True),
    Case("inet", "inet",
         _lit("10.1.2.3", "10.1.2.3/8", "0.0.0.0/0", "255.255.255.255", "::1", "::", "::ffff:1.2.3.4",
              "::1.2.3.4", "2001:db8::1/64", "2001:db8:0:0:1:0:0:1", "1:0:0:0:0:0:0:0", "1::",
              "1:2:3:4:5:6:7:8", "0:0:0:0:0:1:0:0", "::ffff:0:1.2.3.4", "::0.0.0.1", "::1:0:0:0",
              "1:0:0:2:0:0:0:3", "1:0:0:2:0:0:3:4", "fe80::/10", "::ffff:1.2.3.4/100", "::abcd:1.2.3.4"),
         pa.string(), oracle=_OUT, smoke=True),
    Case("cidr", "cidr",
         _lit("10.0.0.0/8", "192.168.1.1/32", "::/0", "2001:db8::/32", "::ffff:1.2.3.0/120", "::1/128", "0.0.0.0/0"),
         pa.string(), oracle=_OUT),
    Case("macaddr", "macaddr", _lit("08:00:2b:01:02:03", "FF:FF:FF:FF:FF:FF", "00:00:00:00:00:00"),
         pa.string(), oracle="v::text"),
    Case("macaddr8", "macaddr8", _lit("08:00:2b:01:02:03:04:05", "00:00:00:00:00:00:00:00"),
         pa.string(), oracle="v::text"),
    Case("bit", "bit(5)", _lit("10101", "00000", "11111"), pa.string(), oracle="v::text"),
    Case("varbit", "varbit", _lit("", "1", "101010101010101010", "00000000", "111111111"), pa.string(),
         oracle="v::text"),
    Case("date", "date",
         _lit("2024-01-31", "0044-03-15 BC", "4713-11-24 BC", "12345-01-01", "5874897-12-31", "infinity",
              "-infinity", "2000-02-29", "1970-01-01", "0001-01-01", "0001-12-31 BC", "1900-03-01"),
         pa.date32(), oracle="isfinite(v), CASE WHEN isfinite(v) THEN v - DATE '1970-01-01' END, v > DATE '1970-01-01'", expect=_date,
         smoke=True, integers=True),
    Case("date-python", "date", _lit("2024-01-31", "0001-01-01", "9999-12-31"), pa.date32()),
    Case("timestamp", "timestamp",
         _lit("2024-01-31 12:34:56.123456", "0044-03-15 12:00:00 BC", "4713-11-24 00:00:00 BC",
              "12345-01-01 00:00:00", "294246-12-31 23:59:59.999999", "infinity", "-infinity",
              "2000-01-01 00:00:00", "1969-12-31 23:59:59.999999", "2024-02-29 00:00:00.5"),
         pa.timestamp("us"), oracle=_TZ_ORACLE, expect=_timestamp, smoke=True, integers=True),
    Case("timestamp-python", "timestamp", _lit("2024-01-31 12:34:56.123456", "0001-01-01 00:00:00"),
         pa.timestamp("us")),
    *[_timestamptz_case(zone) for zone in
      ("UTC", "Asia/Kolkata", "America/New_York", "Europe/Amsterdam", "Asia/Kathmandu", "America/St_Johns")],
    Case("timestamptz-python", "timestamptz", _lit("2024-01-31 12:34:56.123456+05:30", "2001-02-03 04:05:06-08"),
         _TIMESTAMPTZ, settings=("SET TimeZone = 'America/Los_Angeles'",)),
    Case("time", "time",
         _lit("00:00:00", "23:59:59.999999", "24:00:00", "12:34:56.5", "01:02:03.000001"),
         pa.string(), oracle="extract(epoch from v)", expect=lambda s: format_time(_us(s)), smoke=True),
    Case("timetz", "timetz",
         _lit("00:00:00+00", "23:59:59.999999-15:59", "24:00:00+00", "12:00:00+05:30", "12:00:00-05:30:15",
              "12:34:56.789+14", "01:00:00+15:59:59"),
         pa.string(), oracle="extract(epoch from v::time), extract(timezone from v)::int",
         expect=format_timetz, smoke=True),
    Case("interval", "interval",
         _lit("0", "1 year 2 mons 3 days 04:05:06.789", "-1 days +02:00:00", "00:00:00.000001",
              "-178000000 years", "178000000 years", "2147483647 days", "-2147483648 days",
              "2562047788:00:54.775807", "-2562047788:00:54.775807", "1 mon -1 day", "-00:00:00.5",
              "1 year -2 mons +3 days -04:05:06", "@ 3 minutes ago", "-1 year"),
         INTERVAL,
         oracle="(extract(year from v) * 12 + extract(month from v))::int, extract(day from v)::int,"
                " (extract(hour from v) * 3600000000 + extract(minute from v) * 60000000"
                " + extract(microseconds from v))::int8",
         expect=_interval, smoke=True),
    Case("enum", "mood", _lit("sad", "happy", "ok with space", "ünï"), pa.string(),
         setup="CREATE TYPE mood AS ENUM ('sad', 'happy', 'ok with space', 'ünï')", smoke=True),
    Case("domain-int4", "posint", _lit("1", "2147483647"), pa.int32(),
         setup="CREATE DOMAIN posint AS int4 CHECK (VALUE > 0)", smoke=True),
    # A domain column's atttypmod is -1: the (10,2) lives on the domain, which
    # pgoutput does not describe, so the values stay exact text.
    Case("domain-numeric", "price", _lit("12.34", "-0.01", "99999999.99"), pa.string(), oracle="v::text",
         setup="CREATE DOMAIN price AS numeric(10,2)", smoke=True),
    Case("domain-int4-array", "intarr", ("'{1,NULL,3}'", "'{}'", "NULL"), pa.list_(pa.int32()),
         setup="CREATE DOMAIN intarr AS int4[]"),
]


def _arr(*items: str) -> tuple[str, ...]:
    return tuple(items) + ("NULL",)


_ARRAY_OF_ARRAYS = pa.list_(pa.list_(pa.int32()))

ARRAYS: list[Case] = [
    Case("int4[]", "int4[]", _arr("'{}'", "'{1,NULL,-2147483648}'", "'[2:3]={1,2}'", "'{NULL}'", "'[-5:-5]={7}'"),
         pa.list_(pa.int32()), smoke=True),
    Case("int4[][]", "int4[][]",
         _arr("'{{1,2},{3,4}}'", "'{{NULL,1}}'", "'[0:1][5:5]={{1},{2}}'", "'{}'", "'{{1},{2},{3}}'"),
         _ARRAY_OF_ARRAYS, dimensions=2, smoke=True),
    Case("int4[][][]", "int4[]", _arr("'{{{1,2}},{{3,NULL}}}'", "'{}'"),
         pa.list_(_ARRAY_OF_ARRAYS), dimensions=3),
    Case("text[]", "text[]",
         _arr("ARRAY['', 'NULL', NULL, 'a,b', 'q\"uote', 'back\\slash', '{braces}', ' sp ', 'ünï', 'x\"y\\z', "
              "'null', '\\\\\"\"', 'tab\t']",
              "'{}'", "'{plain}'", "ARRAY[NULL]::text[]"),
         pa.list_(pa.string()), smoke=True),
    Case("text[][]", "text[]", _arr("ARRAY[ARRAY['a b', NULL], ARRAY['c\"d', 'NULL'], ARRAY['{', '}']]"),
         pa.list_(pa.list_(pa.string())), dimensions=2),
    Case("varchar[]", "varchar(5)[]", _arr("ARRAY['a', '', 'b c']"), pa.list_(pa.string())),
    Case("bpchar[]", "char(3)[]", _arr("ARRAY['a', '', 'abc']"), pa.list_(pa.string())),
    Case("name[]", "name[]", _arr("ARRAY['a', 'b c']::name[]"), pa.list_(pa.string())),
    Case("char[]", '"char"[]', _arr("ARRAY['a', '\\200', '']::\"char\"[]"), pa.list_(pa.string()),
         oracle="v::text[]"),
    Case("bool[]", "bool[]", _arr("'{t,f,NULL}'"), pa.list_(pa.bool_())),
    Case("int2[]", "int2[]", _arr("'{-32768,32767}'"), pa.list_(pa.int16())),
    Case("int8[]", "int8[]", _arr("'{-9223372036854775808,NULL,9223372036854775807}'"), pa.list_(pa.int64())),
    Case("oid[]", "oid[]", _arr("'{0,4294967295}'"), pa.list_(pa.int64())),
    Case("float4[]", "float4[]", _arr("'{NaN,-Infinity,0.1,1.4e-45}'"), pa.list_(pa.float32()),
         expect=lambda v: [None if x is None else _float4(x) for x in v]),
    Case("float8[]", "float8[]", _arr("'{NaN,Infinity,0.1,NULL,-0}'"), pa.list_(pa.float64())),
    Case("numeric[]", "numeric[]", _arr("'{1.50,NaN,-Infinity,NULL,123456789012345678901234567890.1}'"),
         pa.list_(pa.string()), oracle="v::text[]", smoke=True),
    Case("numeric(10,2)[]", "numeric(10,2)[]", _arr("'{{1.5,NULL},{-0.01,99999999.99}}'", "'{{1,2},{3,4}}'"),
         pa.list_(pa.list_(pa.decimal128(10, 2))), dimensions=2),
    Case("money[]", "money[]", _arr("'{1.5,-1234.56}'"), pa.list_(pa.decimal128(19, 2)),
         oracle="v::numeric[]"),
    Case("bytea[]", "bytea[]", _arr("ARRAY['\\x00ff'::bytea, NULL, ''::bytea, '\\x5c22'::bytea]"),
         pa.list_(pa.binary()), smoke=True),
    Case("bytea[]-escape", "bytea[]", _arr("ARRAY['\\x00ff'::bytea, NULL, ''::bytea, '\\x5c22'::bytea]"),
         pa.list_(pa.binary()), settings=("SET bytea_output = 'escape'",),
         oracle_binary=True),  # psycopg's text bytea[] loader misreads escape format
    Case("json[]", "json[]", _arr("ARRAY['{\"a\": \"b,c\"}', '[1, 2]', NULL]::json[]"), pa.list_(pa.string()),
         oracle="v::text[]"),
    Case("jsonb[]", "jsonb[]", _arr("ARRAY['{\"a\": \"b\\\"c\"}', 'null']::jsonb[]"), pa.list_(pa.string()),
         oracle="v::text[]"),
    Case("xml[]", "xml[]", _arr("ARRAY['<a/>', 'x, y']::xml[]"), pa.list_(pa.string()), oracle="v::text[]"),
    Case("uuid[]", "uuid[]", _arr("ARRAY['a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid, NULL]"),
         pa.list_(pa.string()), expect=_uuids),
    Case("inet[]", "inet[]", _arr("'{10.0.0.1/8,::ffff:1.2.3.4,NULL}'"), pa.list_(pa.string()),
         oracle=_OUT_ELEMENTS),
    Case("cidr[]", "cidr[]", _arr("'{10.0.0.0/8,::/0}'"), pa.list_(pa.string()), oracle=_OUT_ELEMENTS),
    Case("macaddr[]", "macaddr[]", _arr("'{08:00:2b:01:02:03}'"), pa.list_(pa.string()), oracle="v::text[]"),
    Case("macaddr8[]", "macaddr8[]", _arr("'{08:00:2b:01:02:03:04:05}'"), pa.list_(pa.string()),
         oracle="v::text[]"),
    Case("bit[]", "bit(3)[]", _arr("'{101,000}'"), pa.list_(pa.string()), oracle="v::text[]"),
    Case("varbit[]", "varbit[]", _arr("'{\"\",1,10101010101}'"), pa.list_(pa.string()), oracle="v::text[]"),
    Case("date[]", "date[]", _arr("'{2024-01-31,NULL}'"), pa.list_(pa.date32())),
    Case("timestamp[]", "timestamp[]", _arr("'{\"2024-01-31 12:00:00\",NULL}'"), pa.list_(pa.timestamp("us"))),
    Case("timestamptz[]", "timestamptz[]", _arr("'{\"2024-01-31 12:00:00+05:30\"}'"), pa.list_(_TIMESTAMPTZ),
         settings=("SET TimeZone = 'Asia/Kolkata'",)),
    # Element types whose Python form psycopg can't give exactly: the array
    # path must agree with the (oracle-tested) scalar path, element by element.
    Case("date[]-special", "date[]", _arr("'{infinity,\"0044-03-15 BC\",-infinity,12345-01-01}'"),
         pa.list_(pa.date32()), oracle=None),
    Case("timestamptz[]-special", "timestamptz[]",
         _arr("'{infinity,\"0044-03-15 12:00:00+00 BC\",\"1900-01-01 00:00:00+00\"}'"),
         pa.list_(_TIMESTAMPTZ), oracle=None, settings=("SET TimeZone = 'Europe/Amsterdam'",)),
    Case("time[]", "time[]", _arr("'{24:00:00,00:00:00.5}'"), pa.list_(pa.string()), oracle=None),
    Case("timetz[]", "timetz[]", _arr("'{24:00:00+00,01:02:03-05:30:15}'"), pa.list_(pa.string()),
         oracle=None),
    Case("interval[]", "interval[]", _arr("'{\"1 year -2 days +03:00:00\",NULL,00:00:00.000001}'"),
         pa.list_(INTERVAL), oracle=None, smoke=True),
    Case("mood[]", "mood[]", _arr("'{sad,\"ok with space\"}'"), pa.string(), oracle="v::text",
         setup="CREATE TYPE mood AS ENUM ('sad', 'happy', 'ok with space', 'ünï')",
         binary_error="capture this type in text format"),
]
