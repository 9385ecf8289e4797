"""The canonical text and row hash `verify` computes on both sides (no server, no Spark)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa

from pgoutput_spark.slot.verify import canonical_text, row_hashes


def _text(values: list, type_: pa.DataType) -> list:
    return canonical_text(pa.array(values, type_)).to_pylist()


def test_widened_types_keep_their_text() -> None:
    assert _text([5, None], pa.int32()) == _text([5, None], pa.int64()) == [b"5", None]
    assert _text([Decimal("1.50"), Decimal("-2.00"), Decimal("100")], pa.decimal128(10, 2)) == \
        _text([Decimal("1.500"), Decimal("-2.000"), Decimal("100.000")], pa.decimal128(14, 3)) == \
        [b"1.5", b"-2", b"100"]
    moment = dt.datetime(2026, 11, 23, 1, 2, 3, 456789, tzinfo=dt.timezone.utc)
    assert _text([moment], pa.timestamp("us", "UTC")) == _text([moment], pa.timestamp("us", "Europe/Amsterdam"))


def test_nested_values_and_null_are_spelled_out() -> None:
    assert _text([[1, None, 3], None, []], pa.list_(pa.int32())) == [b"[1,\x00N,3]", None, b"[]"]
    struct = pa.struct([("months", pa.int32()), ("days", pa.int32())])
    assert _text([{"months": 1, "days": None}, None], struct) == [b"{1,\x00N}", None]
    assert _text([[["a"], None]], pa.list_(pa.list_(pa.string()))) == [b"[[a],\x00N]"]


def test_row_hashes_tell_null_from_empty_and_columns_apart() -> None:
    table = pa.table({"a": pa.array(["", None, "x", "x"]), "b": pa.array(["y", "y", "", None])})
    hashes = row_hashes(table).tolist()
    assert len(set(hashes)) == 4
    swapped = pa.table({"a": pa.array(["y"]), "b": pa.array([""])})  # same texts, other columns
    assert row_hashes(swapped)[0] not in hashes
    assert row_hashes(table).tolist() == row_hashes(table.slice(0, 4)).tolist()  # deterministic
