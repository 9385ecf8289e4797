"""interval -> struct<months: int32, days: int32, microseconds: int64>.

The three fields PostgreSQL stores, kept apart (a month is not a fixed number
of days, nor a day a fixed number of microseconds across DST changes), so no
value is lost. Text must be IntervalStyle ``postgres`` output, e.g.
``1 year 2 mons 3 days 04:05:06.789``, ``-1 days +02:00:00``,
``00:00:00.000001``; fields are cut out with one ``extract_regex`` per batch.
Binary is int64 microseconds, int32 days, int32 months. PostgreSQL 17's
``infinity`` / ``-infinity`` intervals are all-max / all-min fields, as in
its binary form.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .codec import Codec, fixed_type
from .dates import US_PER_SECOND, extract_fields
from .oids import BuiltinType
from .pgtype import PgType
from .raw import RawValues, fail_where

INTERVAL = pa.struct(
    [("months", pa.int32()), ("days", pa.int32()), ("microseconds", pa.int64())]
)

_PATTERN = (
    r"^(?:(?P<years>[-+]?[0-9]+) years?)?"
    r"(?: ?(?P<months>[-+]?[0-9]+) mons?)?"
    r"(?: ?(?P<days>[-+]?[0-9]+) days?)?"
    r"(?: ?(?P<sign>[-+])?(?P<hours>[0-9]+):(?P<minutes>[0-9]{2}):(?P<seconds>[0-9]{2})"
    r"(?:\.(?P<fraction>[0-9]{1,6}))?)?$"
)
_INTERVALSTYLE = (
    "not IntervalStyle postgres output (like 1 year 2 mons -3 days +04:05:06.789):"
    " the capturing session must use IntervalStyle=postgres"
)
_I32 = np.iinfo(np.int32)
_I64 = np.iinfo(np.int64)
_US_PER_HOUR = 3600 * US_PER_SECOND


def _struct(raw: RawValues, months: np.ndarray, days: np.ndarray, us: np.ndarray) -> pa.Array:
    mask = raw.mask()
    return pa.StructArray.from_arrays(
        [pa.array(months.astype(np.int32)), pa.array(days.astype(np.int32)), pa.array(us.astype(np.int64))],
        fields=list(INTERVAL), mask=mask,
    )  # fmt: skip


def _interval_text(raw: RawValues, t: PgType) -> pa.Array:
    strings = raw.as_string()
    fail_where(raw.valid & (raw.lengths == 0), _INTERVALSTYLE)
    f, plus, minus = extract_fields(raw, strings, _PATTERN, _INTERVALSTYLE)
    live = raw.valid & ~plus & ~minus
    months = f["years"] * 12 + f["months"]
    days = f["days"]
    fail_where(live & ((months > _I32.max) | (months < _I32.min)), "interval months out of int32 range")
    fail_where(live & ((days > _I32.max) | (days < _I32.min)), "interval days out of int32 range")
    fail_where(live & ((f["minutes"] > 59) | (f["seconds"] > 59)), "interval minutes or seconds out of range")
    sign = np.where(f["sign"], -1, 1)
    hours = sign * np.where(live, f["hours"], 0)
    rest = sign * ((f["minutes"] * 60 + f["seconds"]) * US_PER_SECOND + f["fraction"])
    fits = np.abs(hours) <= _I64.max // _US_PER_HOUR
    product = np.where(fits, hours, 0) * _US_PER_HOUR
    over = ~fits | ((rest > 0) & (product > _I64.max - rest)) | ((rest < 0) & (product < _I64.min - rest))
    fail_where(live & over, "interval time part is out of int64 microsecond range")
    us = product + np.where(over, 0, rest)
    months = np.where(plus, _I32.max, np.where(minus, _I32.min, np.where(live, months, 0)))
    days = np.where(plus, _I32.max, np.where(minus, _I32.min, np.where(live, days, 0)))
    us = np.where(plus, _I64.max, np.where(minus, _I64.min, np.where(live, us, 0)))
    return _struct(raw, months, days, us)


def _interval_binary(raw: RawValues, t: PgType) -> pa.Array:
    matrix = raw.fixed(16, "interval")
    us = np.ascontiguousarray(matrix[:, :8]).view(">i8").reshape(-1)
    days = np.ascontiguousarray(matrix[:, 8:12]).view(">i4").reshape(-1)
    months = np.ascontiguousarray(matrix[:, 12:]).view(">i4").reshape(-1)
    return _struct(raw, months, days, us)


CODECS: dict[int, Codec] = {
    BuiltinType.INTERVAL: Codec(fixed_type(INTERVAL), _interval_text, _interval_binary),
}
