"""`widens`: the type changes a column may follow without losing a value (Delta's type widening)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pgoutput_spark.convert import widens


@pytest.mark.parametrize("old, new", [
    (pa.int16(), pa.int32()), (pa.int32(), pa.int64()), (pa.int8(), pa.int64()),
    (pa.float32(), pa.float64()),
    (pa.decimal128(10, 2), pa.decimal128(12, 2)), (pa.decimal128(10, 2), pa.decimal128(11, 3)),
    (pa.int32(), pa.decimal128(10, 0)), (pa.int64(), pa.decimal128(22, 2)),
    (pa.string(), pa.string()),
    (pa.list_(pa.int32()), pa.list_(pa.int64())), (pa.list_(pa.list_(pa.int16())), pa.list_(pa.list_(pa.int64()))),
])
def test_widens(old, new):
    assert widens(old, new)


@pytest.mark.parametrize("old, new", [
    (pa.int64(), pa.int32()), (pa.float64(), pa.float32()), (pa.int32(), pa.float64()),
    (pa.decimal128(10, 2), pa.decimal128(10, 3)),  # one digit fewer before the point
    (pa.decimal128(10, 2), pa.decimal128(12, 1)),  # a digit of the fraction lost
    (pa.int32(), pa.decimal128(9, 0)), (pa.int64(), pa.decimal128(20, 1)),
    (pa.int32(), pa.string()), (pa.string(), pa.int32()), (pa.date32(), pa.timestamp("us")),
    (pa.list_(pa.int64()), pa.list_(pa.int32())), (pa.list_(pa.int32()), pa.int64()),
    (pa.list_(pa.int32()), pa.list_(pa.list_(pa.int64()))),
])
def test_does_not_widen(old, new):
    assert not widens(old, new)
