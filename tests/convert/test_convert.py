"""Unit tests without a server: resolve, the mapping, policies, bad input, array plumbing."""

from __future__ import annotations

import contextlib
import itertools
import pickle
import struct
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgoutput_spark.convert import (
    DATE_INFINITY,
    DATE_MINUS_INFINITY,
    INTERVAL,
    TIMESTAMP_INFINITY,
    TIMESTAMP_MINUS_INFINITY,
    PgType,
    TypeConversionError,
    arrow_type,
    convert,
    resolve,
)
from pgoutput_spark.convert.pgtype import numeric_modifier
from pgoutput_spark.errors import ConfigError, PgoutputSparkError


def numeric_typmod(precision: int, scale: int) -> int:
    return ((precision << 16) | (scale & 0x7FF)) + 4


def run(values: list[bytes | None], oid: int, fmt: str = "text", modifier: int = -1, **kw: object) -> list[object]:
    t = PgType(oid, modifier, **kw)  # type: ignore[arg-type]
    return convert(pa.array(values, pa.binary()), t, format=fmt).to_pylist()  # type: ignore[arg-type]


# -- resolve and the mapping ---------------------------------------------------------


def test_resolve_builtin_domain_enum_and_missing() -> None:
    names = {16390: ("", "int4"), 16391: ("public", "mood"), 16392: ("", "_text"), 16393: ("", "point")}
    assert resolve(23, -1, names) == PgType(23)
    assert arrow_type(resolve(16390, -1, names)) == pa.int32()  # domain over int4
    assert arrow_type(resolve(16391, -1, names)) == pa.string()  # enum
    assert arrow_type(resolve(16392, -1, names)) == pa.list_(pa.string())  # domain over text[]
    assert arrow_type(resolve(16393, -1, names)) == pa.string()  # domain over an unknown built-in
    assert arrow_type(resolve(600, -1, names)) == pa.string()  # point: built in, not known here
    with pytest.raises(TypeConversionError, match="no Type message for this OID"):
        resolve(99999, -1, names)


@pytest.mark.parametrize(
    ("modifier", "expected"),
    [(numeric_typmod(10, 2), (10, 2)), (numeric_typmod(5, -2), (5, -2)), (numeric_typmod(3, 5), (3, 5)),
     (numeric_typmod(1000, -1000), (1000, -1000)), (numeric_typmod(1, 0), (1, 0))],
)  # fmt: skip
def test_numeric_modifier(modifier: int, expected: tuple[int, int]) -> None:
    assert numeric_modifier(modifier) == expected


MAPPING = [
    (16, -1, pa.bool_()), (21, -1, pa.int16()), (23, -1, pa.int32()), (20, -1, pa.int64()),
    (26, -1, pa.int64()), (700, -1, pa.float32()), (701, -1, pa.float64()),
    (1700, -1, pa.string()), (1700, numeric_typmod(10, 2), pa.decimal128(10, 2)),
    (1700, numeric_typmod(38, 38), pa.decimal128(38, 38)), (1700, numeric_typmod(39, 2), pa.string()),
    (1700, numeric_typmod(5, -2), pa.string()), (1700, numeric_typmod(3, 5), pa.string()),
    (790, -1, pa.decimal128(19, 2)), (25, -1, pa.string()), (1043, 14, pa.string()),
    (1042, 9, pa.string()), (19, -1, pa.string()), (18, -1, pa.string()), (17, -1, pa.binary()),
    (114, -1, pa.string()), (3802, -1, pa.string()), (142, -1, pa.string()), (2950, -1, pa.string()),
    (869, -1, pa.string()), (650, -1, pa.string()), (829, -1, pa.string()), (774, -1, pa.string()),
    (1560, 5, pa.string()), (1562, -1, pa.string()), (1082, -1, pa.date32()),
    (1114, 6, pa.timestamp("us")), (1184, -1, pa.timestamp("us", tz="UTC")), (1083, -1, pa.string()),
    (1266, -1, pa.string()), (1186, -1, INTERVAL), (1007, -1, pa.list_(pa.int32())),
    (1231, numeric_typmod(10, 2), pa.list_(pa.decimal128(10, 2))), (1009, -1, pa.list_(pa.string())),
    (1185, -1, pa.list_(pa.timestamp("us", tz="UTC"))), (1187, -1, pa.list_(INTERVAL)),
]  # fmt: skip


@pytest.mark.parametrize(("oid", "modifier", "expected"), MAPPING)
def test_arrow_type_mapping(oid: int, modifier: int, expected: pa.DataType) -> None:
    assert arrow_type(PgType(oid, modifier)) == expected


def test_dimensions_nest_lists() -> None:
    assert arrow_type(PgType(1007, dimensions=3)) == pa.list_(pa.list_(pa.list_(pa.int32())))
    with pytest.raises(ValueError):
        PgType(1007, dimensions=0)


# -- policies ------------------------------------------------------------------------


def test_infinity_sentinels_in_both_formats() -> None:
    def date_days(values: list[bytes], fmt: str) -> list[int]:
        return convert(pa.array(values, pa.binary()), PgType(1082), format=fmt).cast(pa.int32()).to_pylist()  # type: ignore[arg-type]

    assert date_days([b"infinity", b"-infinity"], "text") == [DATE_INFINITY, DATE_MINUS_INFINITY]
    assert date_days([struct.pack(">i", 2**31 - 1), struct.pack(">i", -(2**31))], "binary") == [
        DATE_INFINITY, DATE_MINUS_INFINITY]  # fmt: skip
    for oid in (1114, 1184):
        text = convert(pa.array([b"infinity", b"-infinity"], pa.binary()), PgType(oid), format="text")
        binary = convert(pa.array([struct.pack(">q", 2**63 - 1), struct.pack(">q", -(2**63))], pa.binary()),
                         PgType(oid), format="binary")  # fmt: skip
        assert text.cast(pa.int64()).to_pylist() == [TIMESTAMP_INFINITY, TIMESTAMP_MINUS_INFINITY]
        assert binary.equals(text)


def test_timestamp_beyond_arrow_range_is_an_error() -> None:
    # PostgreSQL allows up to 294276 AD; Arrow's int64 microseconds end in 294247
    with pytest.raises(TypeConversionError, match="outside the range of Arrow") as info:
        run([b"2000-01-01 00:00:00", b"294276-12-31 23:59:59"], 1114)
    assert info.value.index == 1
    pg_max = (294276 - 2000) * 365_2425 * 86_400_000_000 // 10_000
    with pytest.raises(TypeConversionError, match="outside the range of Arrow"):
        run([struct.pack(">q", pg_max)], 1184, "binary")
    # the last microsecond below the sentinel is kept; the sentinel itself is refused
    last = convert(pa.array([b"294247-01-10 04:00:54.775806"], pa.binary()), PgType(1114), format="text")
    assert last.cast(pa.int64()).to_pylist() == [2**63 - 2]
    with pytest.raises(TypeConversionError):
        run([b"294247-01-10 04:00:54.775807"], 1114)


def test_interval_infinity_pg17_form() -> None:
    text = run([b"infinity", b"-infinity"], 1186)
    assert text == [
        {"months": 2**31 - 1, "days": 2**31 - 1, "microseconds": 2**63 - 1},
        {"months": -(2**31), "days": -(2**31), "microseconds": -(2**63)},
    ]
    binary = struct.pack(">qii", 2**63 - 1, 2**31 - 1, 2**31 - 1)
    assert run([binary], 1186, "binary") == text[:1]


def test_numeric_nan_in_decimal_column_and_the_string_override() -> None:
    t = PgType(1700, numeric_typmod(10, 2))
    values = pa.array([b"1.50", b"NaN"], pa.binary())
    with pytest.raises(TypeConversionError, match=r"decimal\(10,2\).*type override to string") as info:
        convert(values, t, format="text")
    assert (info.value.index, info.value.value) == (1, b"NaN")
    assert convert(values, t, format="text", target=pa.string()).to_pylist() == ["1.50", "NaN"]
    nan = struct.pack(">hhHh", 0, 0, 0xC000, 0)
    one_fifty = struct.pack(">hhHhhh", 2, 0, 0, 2, 1, 5000)
    binary = pa.array([one_fifty, nan], pa.binary())
    with pytest.raises(TypeConversionError, match="NaN or Infinity"):
        convert(binary, t, format="binary")
    assert convert(binary, t, format="binary", target=pa.string()).to_pylist() == ["1.50", "NaN"]
    assert convert(pa.array([b"{1.5,NaN}"], pa.binary()), PgType(1231, t.modifier), format="text",
                   target=pa.list_(pa.string())).to_pylist() == [["1.5", "NaN"]]  # fmt: skip


def test_unsupported_targets() -> None:
    with pytest.raises(ConfigError, match="unsupported target"):
        convert(pa.array([b"1"], pa.binary()), PgType(23), format="text", target=pa.int64())
    with pytest.raises(ConfigError, match="needs text format"):
        convert(pa.array([struct.pack(">i", 1)], pa.binary()), PgType(23), format="binary", target=pa.string())
    assert run([b"1"], 23) == [1]
    t = PgType(23)
    assert convert(pa.array([b"12"], pa.binary()), t, format="text", target=pa.string()).to_pylist() == ["12"]


def test_money_text_forms() -> None:
    assert run([b"$1,234.56", b"-$1.00", b"($1.00)", b"$0.00", b"-$92,233,720,368,547,758.08"], 790) == [
        Decimal("1234.56"), Decimal("-1.00"), Decimal("-1.00"), Decimal("0.00"),
        Decimal("-92233720368547758.08")]  # fmt: skip


def test_unknown_types_in_binary() -> None:
    enum = {"name": "mood", "namespace": "public"}
    assert run([b"happy", "ünï".encode(), None], 16500, "binary", **enum) == ["happy", "ünï", None]
    with pytest.raises(TypeConversionError, match="binary=false") as info:
        run([b"ok", struct.pack(">ii", 2, 0)], 16500, "binary", **enum)  # looks like a composite
    assert info.value.index == 1
    with pytest.raises(TypeConversionError, match="binary=false"):
        run([b"\x01"], 16500, "binary", **enum)  # an empty range
    with pytest.raises(TypeConversionError, match=r"binary form of type 600 is not known"):
        run([struct.pack(">dd", 0.25, 1.0)], 600, "binary")
    assert run([b"(1,2)"], 600) == ["(1,2)"]


def test_bytea_text_forms() -> None:
    assert run([b"\\x", b"\\x00FFab", b"", b"a\\\\b\\000\\377c", b"\\\\x00"], 17) == [
        b"", b"\x00\xff\xab", b"", b"a\\b\x00\xffc", b"\\x00"]  # fmt: skip


def test_input_shapes() -> None:
    values = pa.array([b"1", None, b"2", b"3", b"x"], pa.binary())
    sliced = values.slice(1, 3)
    assert convert(sliced, PgType(23), format="text").to_pylist() == [None, 2, 3]
    assert convert(values.cast(pa.large_binary()).slice(0, 4), PgType(23), format="text").to_pylist() == [
        1, None, 2, 3]  # fmt: skip
    chunked = pa.chunked_array([values.slice(0, 2), values.slice(2, 2)])
    assert convert(chunked, PgType(23), format="text").to_pylist() == [1, None, 2, 3]  # type: ignore[arg-type]
    assert convert(pa.nulls(3, pa.binary()), PgType(1186), format="binary").type == INTERVAL
    assert len(convert(pa.array([], pa.binary()), PgType(1007), format="text")) == 0
    with pytest.raises(TypeError):
        convert(pa.array(["1"]), PgType(23), format="text")
    with pytest.raises(ConfigError):
        convert(values, PgType(23), format="csv")  # type: ignore[arg-type]
    # NULL slots that still own bytes (hand-built arrays) are ignored
    hand_built = pa.BinaryArray.from_buffers(
        pa.binary(), 2, [pa.array([False, True]).buffers()[1], pa.py_buffer(struct.pack("<3i", 0, 3, 4)),
                         pa.py_buffer(b"xyz7")])  # fmt: skip
    assert convert(hand_built, PgType(23), format="text").to_pylist() == [None, 7]


# -- bad values ----------------------------------------------------------------------

BAD = [
    (21, -1, "text", [b"1", b"40000"], 1, "int2"),
    (23, -1, "text", [b"12a"], 0, "digits"),
    (23, -1, "text", [b""], 0, "int4"),
    (23, -1, "binary", [struct.pack(">i", 1), b"\x00\x01"], 1, "must be 4 bytes"),
    (16, -1, "text", [b"true"], 0, "'t' or 'f'"),
    (16, -1, "binary", [b"\x02"], 0, "0 or 1"),
    (701, -1, "text", [b"1,5"], 0, "float8"),
    (1700, -1, "text", [b"1e5"], 0, "numeric text"),
    (1700, -1, "binary", [b"\x00\x01\x00\x00"], 0, "at least 8 bytes"),
    (1700, -1, "binary", [struct.pack(">hhHhh", 1, 0, 0x1234, 0, 1)], 0, "sign word"),
    (1700, -1, "binary", [struct.pack(">hhHhh", 1, 0, 0, 0, 10000)], 0, "0..9999"),
    (1700, numeric_typmod(4, 2), "text", [b"123.45"], 0, "numeric(4,2)"),
    (790, -1, "text", [b"1.234,56 \xe2\x82\xac"], 0, "lc_monetary"),
    (790, -1, "text", [b"$1.5"], 0, "2 fraction digits"),
    (25, -1, "text", [b"ok", b"\xff\xfe"], 1, "UTF8"),
    (17, -1, "text", [b"\\x123"], 0, "odd number"),
    (17, -1, "text", [b"\\xzz"], 0, "non-hex"),
    (17, -1, "text", [b"a\\9"], 0, "octal"),
    (3802, -1, "binary", [b"\x02{}"], 0, "version must be 1"),
    (2950, -1, "text", [b"not-a-uuid"], 0, "uuid"),
    (2950, -1, "binary", [b"\x00" * 15], 0, "16 bytes"),
    (869, -1, "binary", [b"\x07\x20\x00\x04abcd"], 0, "address family"),
    (869, -1, "binary", [b"\x02\x21\x00\x04abcd"], 0, "mask"),
    (1560, -1, "binary", [struct.pack(">i", 9) + b"\x00"], 0, "bit count"),
    (1082, -1, "text", [b"01/31/2024"], 0, "DateStyle=ISO"),
    (1082, -1, "text", [b"2024-02-30"], 0, "day out of range"),
    (1082, -1, "text", [b"0000-01-01"], 0, "year 0"),
    (1114, -1, "text", [b"2024-01-31T12:00:00"], 0, "DateStyle=ISO"),
    (1114, -1, "text", [b"2024-01-31 25:00:00"], 0, "hour out of range"),
    (1184, -1, "text", [b"2024-01-31 12:00:00"], 0, "DateStyle=ISO"),  # no offset
    (1083, -1, "text", [b"24:00:01"], 0, "out of range"),
    (1083, -1, "binary", [struct.pack(">q", 86_400_000_001)], 0, "out of range"),
    (1266, -1, "text", [b"12:00:00"], 0, "timetz text"),
    (1186, -1, "text", [b"P1Y2M"], 0, "IntervalStyle=postgres"),
    (1186, -1, "text", [b"1 day 00:61:00"], 0, "out of range"),
    (1186, -1, "text", [b""], 0, "IntervalStyle"),
    (1007, -1, "text", [b"{1,2"], 0, "array_out"),
    (1007, -1, "text", [b"1,2"], 0, "array_out"),
    (1007, -1, "text", [b"{1,,2}"], 0, "empty unquoted element"),
    (1007, -1, "text", [b"{1}x"], 0, "array_out"),
    (1009, -1, "text", [b'{"a}'], 0, "unbalanced quotes"),
    (1007, -1, "text", [b"{{1},2}"], 0, "different depths"),
    (1007, -1, "text", [b"[1:2][1:1]={1,2}"], 0, "bounds"),
    (1007, -1, "text", [b"{{1,2}}"], 0, "dimensions=2"),
    (1007, -1, "text", [b"{1,2}", b"{3,x}"], 1, "element 1 'x'"),
    (1007, -1, "binary", [struct.pack(">iiI", 1, 0, 25) + struct.pack(">ii", 0, 1)], 0, "another type"),
    (1007, -1, "binary", [struct.pack(">iiIiiii", 1, 0, 23, 2, 1, 4, 5)], 0, "length does not match"),
    (1009, -1, "binary", [struct.pack(">iiIiii", 1, 1, 25, 1, 1, 9) + b"ab"], 0, "ends inside an element"),
]  # fmt: skip


@pytest.mark.parametrize(("oid", "modifier", "fmt", "values", "index", "message"), BAD)
def test_bad_values_name_type_value_and_index(
    oid: int, modifier: int, fmt: str, values: list[bytes], index: int, message: str
) -> None:
    t = PgType(oid, modifier)
    with pytest.raises(TypeConversionError) as info:
        convert(pa.array(values, pa.binary()), t, format=fmt)  # type: ignore[arg-type]
    error = info.value
    assert isinstance(error, PgoutputSparkError)
    assert message in str(error), str(error)
    assert error.index == index
    assert error.value == values[index]
    assert error.type_name.startswith(t.display_name.split("(")[0])
    assert f"at index {index}" in str(error)


@pytest.mark.parametrize(
    ("oid", "values", "index", "message"),
    [
        (23, [b"1", b"99999999999", b"x"], 1, "int32"),  # pyarrow's overflow comes before our check
        (23, [b"1", b"x", b"99999999999"], 1, "digits"),
        (1007, [b"{1}", b"{1,99999999999}", b"{x}"], 1, "element 1"),
        (1082, [b"2024-01-01", b"2024-02-30", b"x"], 1, "day out of range"),
    ],
)
def test_the_first_bad_value_is_named(oid: int, values: list[bytes], index: int, message: str) -> None:
    with pytest.raises(TypeConversionError) as info:
        run(list(values), oid)
    assert info.value.index == index and message in str(info.value)


def test_error_message_truncates_long_values_and_pickles() -> None:
    long = b"{" + b"1," * 200 + b"x}"
    with pytest.raises(TypeConversionError) as info:
        run([long], 1007)
    shown = str(info.value).split(" at index")[0]
    assert len(shown) < 120 and "..." in shown
    copy = pickle.loads(pickle.dumps(info.value))
    assert (copy.reason, copy.type_name, copy.value, copy.index) == (
        info.value.reason, info.value.type_name, info.value.value, info.value.index)  # fmt: skip


# -- the array tokenizer against a reference serializer ------------------------------


def _array_out(items: list[str | None]) -> bytes:
    """PostgreSQL's array_out quoting for a 1-D text[] (test-side reference)."""
    parts = []
    for item in items:
        if item is None:
            parts.append("NULL")
        elif item == "" or item.upper() == "NULL" or any(c in item for c in '{},"\\ \t\n\r\v\f'):
            parts.append('"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"')
        else:
            parts.append(item)
    return ("{" + ",".join(parts) + "}").encode()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.one_of(st.none(), st.text(alphabet='ab{},"\\ N\tLü', max_size=6)), max_size=5),
                min_size=1, max_size=8))  # fmt: skip
def test_text_array_tokenizer_round_trips(rows: list[list[str | None]]) -> None:
    values = pa.array([_array_out(items) for items in rows], pa.binary())
    assert convert(values, PgType(1009), format="text").to_pylist() == rows


# -- the ISO fast path: compiled and NumPy forms ---------------------------------------------------

_ISO_PIECES = st.tuples(
    st.sampled_from(["2024", "0044", "12345", "999", "20a4"]),
    st.sampled_from(["-01-31", "-12-01", "-1-31", "/01/31", "-01-3"]),
    st.sampled_from(["", " 12:34:56", " 00:00:00", " 23:59:5", " 12-34:56", "T12:34:56"]),
    st.sampled_from(["", ".", ".1", ".123456", ".1234567", ".12a"]),
    st.sampled_from(["", "+00", "-05", "+05:30", "+00:19:32", "+0", "-05:3", "+05:30:1", "~00", " BC"]),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.none() | _ISO_PIECES.map("".join) | st.text(max_size=36), min_size=1, max_size=20),
       st.sampled_from([(False, False), (True, False), (True, True)]))
def test_the_compiled_iso_fields_equal_the_numpy_ones(texts, shape):
    """Dates and timestamps of the usual shape and near misses: the same values read, the same
    fields for them (the rest goes to the regex parser either way)."""
    from pgoutput_spark.convert import iso
    from pgoutput_spark.convert.raw import RawValues

    time, zone = shape
    raw = RawValues(pa.array([b"x", *(None if t is None else t.encode() for t in texts)], pa.binary()).slice(1))
    compiled, ok = iso._compiled_fields(raw, time=time, zone=zone)
    numpy_fields, numpy_ok = iso._numpy_fields(raw, time=time, zone=zone)
    assert ok.tolist() == numpy_ok.tolist()
    assert set(compiled) == set(numpy_fields)
    for name, values in compiled.items():
        assert values[ok].tolist() == numpy_fields[name][ok].tolist(), name


# -- the compiled interval walk against the regex -------------------------------------------------

# Parts as PostgreSQL prints them (IntervalStyle postgres), then near misses the walk leaves to the regex.
_INTERVAL_PARTS = (["1 year", "-2 years", "+3 years", "178956970 years"], ["1 mon", "-11 mons", "+1 mon"],
                   ["1 day", "-1 days", "31 days"], ["00:00:00", "-01:02:03", "+838:59:59", "00:00:00.5",
                                                     "-00:00:00.000001", "12:34:56.123456"])
_PRINTED_INTERVALS = st.tuples(*(st.none() | st.sampled_from(part) for part in _INTERVAL_PARTS)).map(
    lambda parts: " ".join(p for p in parts if p is not None)).filter(bool)
_NEAR_MISSES = st.tuples(
    st.sampled_from(["", "1 year", "1 yearss", "1 yr", "-1 years ", "1 day 2 years", "1 mon 1 year", "1 year 1 year"]),
    st.sampled_from(["", " 1 mon", "2 mons", " 1 month", " 1  mon"]),
    st.sampled_from(["", " 1 day", " 99999999999999999999 days", "1 day"]),
    st.sampled_from(["", " 00:00:00", " 1:2:3", " 01:02", " 01:02:03x", " --01:00:00", " 01:02:03.1234567",
                     " 01:02:03.", " 01:02:03.12a"]),
).map("".join)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.none() | _PRINTED_INTERVALS | _NEAR_MISSES | st.text(alphabet="0123456789 :.+-adeymnors",
                                                                          max_size=30),
                min_size=1, max_size=20))
def test_the_compiled_interval_fields_equal_the_regexs(texts):
    """Intervals as PostgreSQL prints them, near misses and random text: the compiled walk reads
    every printed one, and every value it reads the regex reads to the same fields (the regex
    reads the rest), so a column converts the same with or without the walk."""
    from pgoutput_spark.convert import interval
    from pgoutput_spark.convert.dates import extract_fields
    from pgoutput_spark.convert.raw import RawValues

    raw = RawValues(pa.array([b"x", *(None if t is None else t.encode() for t in texts)], pa.binary()).slice(1))
    walked, ok = interval._interval_fields(raw)
    printed = {" ".join(filter(None, p)) for p in itertools.product(*([""] + part for part in _INTERVAL_PARTS))}
    assert all(ok[i] for i, t in enumerate(texts) if t and t in printed)
    if ok.any():
        read = RawValues(raw.as_binary().filter(pa.array(ok)))
        regex, _, _ = extract_fields(read, read.as_string(), interval._PATTERN, "bad")  # raises if one fails
        assert set(regex) == set(walked)
        for name, values in regex.items():
            assert walked[name][ok].tolist() == values.tolist(), name


# -- the compiled check of a number's text against its regex ---------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.lists(st.none() | st.text(alphabet="0123456789-+.eENaInfity x", max_size=12)
                | st.sampled_from(["NaN", "-NaN", "Infinity", "-Infinity", "+Infinity", "1e+05", "-1.5e-07",
                                   "1.e5", ".5", "1.", "-", "1e5", "1e55", "1E+05", "12", "-0", "1.25"]),
                min_size=1, max_size=12),
       st.sampled_from(["int", "numeric", "float"]))
def test_the_compiled_number_check_equals_its_regex(texts, kind):
    """int, numeric and float text: the compiled check finds a value bad exactly where the
    pattern it stands for does not match (the first one, as `require_match` reports it)."""
    from pgoutput_spark.convert import codec, numbers, numeric
    from pgoutput_spark.convert.raw import RawValues, ValueFailure

    pattern, flags = {"int": (numbers._INTEGER, (False, False, False)),
                      "numeric": (numeric._NUMERIC_TEXT, (True, False, True)),
                      "float": (numbers._FLOAT, (True, True, True))}[kind]
    raw = RawValues(pa.array([b"x", *(None if t is None else t.encode() for t in texts)], pa.binary()).slice(1))
    strings = raw.as_string()
    expected = raw.valid & ~codec.matches(strings, pattern)
    fraction, exponent, specials = flags
    with pytest.raises(ValueFailure) if expected.any() else contextlib.nullcontext() as raised:
        codec.require_number(raw, strings, pattern, "bad", fraction=fraction, exponent=exponent,
                             specials=specials)
    if expected.any():
        assert raised.value.index == int(expected.argmax())


# -- every compiled path against the NumPy / regex one it stands in for ---------------------------

_TYPES = {"int4": PgType(23), "float8": PgType(701), "numeric": PgType(1700),
          "numeric(10,2)": PgType(1700, (10 << 16 | 2) + 4), "interval": PgType(1186), "bytea": PgType(17)}
_TEXTS = {
    "int4": st.sampled_from(["0", "-2147483648", "2147483647", "2147483648", "12", "+1", "1.0", "", "x"]),
    "float8": st.sampled_from(["1.5", "-0", "1e+300", "NaN", "-Infinity", "1e5", "1.", "inf"]),
    "numeric": st.sampled_from(["1.25", "-3", "NaN", "Infinity", "1e5", "12345678901234567890.1", "."]),
    "numeric(10,2)": st.sampled_from(["1.25", "-3", "NaN", "12345678.9", "123456789.1", "0.005", "-"]),
    "interval": st.sampled_from(["1 year 2 mons", "-1 days +02:00:00", "00:00:00.5", "infinity", "1 yr",
                                 "3 days -01:02:03.1234567", "2 mons  1 day"]),
    "bytea": st.sampled_from(["\\x", "\\x00ff", "\\xDEADbeef", "\\x0g", "\\x123", "plain", "a\\\\b", "\\001"]),
}


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(_TEXTS)).flatmap(lambda name: st.tuples(
    st.just(name), st.lists(st.none() | _TEXTS[name], min_size=1, max_size=10))))
def test_compiled_conversions_give_what_numpy_and_regex_give(case):
    """A column converts to the same values, or fails on the same value for the same reason, with
    numba's compiled walks and without them (NumPy and RE2 only, as where numba is missing)."""
    from pgoutput_spark.decoder import kernel

    name, texts = case
    t = _TYPES[name]
    values = pa.array([None if v is None else v.encode() for v in texts], pa.binary())

    def outcome():
        try:
            return repr(convert(values, t, format="text").to_pylist())  # repr: NaN equals NaN
        except TypeConversionError as error:
            return ("error", error.index, error.reason)

    compiled = outcome()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernel, "numba", None)
        assert outcome() == compiled


def test_a_bad_value_after_nulls_is_named_not_an_assertion():
    """Finding the first bad value bisects the column; a part of NULLs alone is not converted
    (bytea's converter has nothing to return for it)."""
    values = pa.array([None, None, b"\\x00", None, b"\\x0g"], pa.binary())
    with pytest.raises(TypeConversionError) as raised:
        convert(values, PgType(17), format="text")
    assert (raised.value.index, raised.value.reason) == (4, "bytea hex text has a non-hex digit")


_UUIDS = ["123e4567-e89b-12d3-a456-426614174000", "123E4567-e89b-12d3-a456-426614174000",
          "123e4567e89b-12d3-a456-426614174000-", "123e4567-e89b-12d3-a456-42661417400",
          "123e4567-e89b-12d3-a456-4266141740000", "{123e4567-e89b-12d3-a456-42661417400}",
          "123e4567-e89b-12d3-a456-42661417400g", "123e4567-e89b-12d3-a456_426614174000"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.none() | st.sampled_from(_UUIDS) | st.text(alphabet="0123456789abcdefg-", min_size=34, max_size=37),
                min_size=1, max_size=8))
def test_uuid_text_is_checked_as_its_pattern_says(texts):
    """uuid text, checked by its bytes' positions: bad exactly where `_UUID` does not match, the
    first such value named."""
    from pgoutput_spark.convert import codec
    from pgoutput_spark.convert import uuid as uuid_codec
    from pgoutput_spark.convert.raw import RawValues

    values = pa.array([None if t is None else t.encode() for t in texts], pa.binary())
    raw = RawValues(values)
    bad = raw.valid & ~codec.matches(raw.as_string(), uuid_codec._UUID)
    with pytest.raises(TypeConversionError) if bad.any() else contextlib.nullcontext() as raised:
        assert convert(values, PgType(2950), format="text").to_pylist() == texts
    if bad.any():
        assert raised.value.index == int(bad.argmax())
