"""date -> date32, timestamp -> timestamp('us'), timestamptz -> timestamp('us', 'UTC').

Text forms must be DateStyle ISO output: ``2024-01-31``, ``0044-03-15 BC``,
``12345-01-01``, ``2024-01-31 12:34:56.123456``, timestamptz with its UTC
offset (``+00``, ``-05``, ``+05:30``, ``+00:19:32``) before any `` BC``. The
usual shape is read by byte position with NumPy (`iso`); other values are cut
out with one ``pyarrow.compute.extract_regex`` over them. The calendar
arithmetic (proleptic Gregorian, astronomical years) runs in NumPy.

``infinity`` / ``-infinity`` map to sentinels, the largest / smallest value
of the Arrow type (int32 days, int64 microseconds); no finite PostgreSQL
value can equal them. A timestamp outside Arrow's int64 microsecond range
(beyond 294247-01-10 or before 290308 BC; PostgreSQL goes to 294276 AD) is an
error. Binary forms count days / microseconds from 2000-01-01 and use the
same sentinels as PostgreSQL's own infinities.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .codec import Codec, Converter, fixed_type, to_numpy_int
from .iso import iso_fields
from .oids import BuiltinType
from .pgtype import PgType
from .raw import RawValues, ValueFailure, fail_where, primitive_array

DATE_INFINITY = np.iinfo(np.int32).max
DATE_MINUS_INFINITY = np.iinfo(np.int32).min
TIMESTAMP_INFINITY = np.iinfo(np.int64).max
TIMESTAMP_MINUS_INFINITY = np.iinfo(np.int64).min

US_PER_SECOND = 1_000_000
US_PER_DAY = 86_400 * US_PER_SECOND
PG_EPOCH_DAYS = 10_957  # 2000-01-01 - 1970-01-01
PG_EPOCH_US = PG_EPOCH_DAYS * US_PER_DAY

TIMESTAMP = pa.timestamp("us")
TIMESTAMPTZ = pa.timestamp("us", tz="UTC")

DATE_PART = r"(?P<year>[0-9]{4,})-(?P<month>[0-9]{2})-(?P<day>[0-9]{2})"
TIME_PART = r"(?P<hour>[0-9]{2}):(?P<minute>[0-9]{2}):(?P<second>[0-9]{2})(?:\.(?P<fraction>[0-9]{1,6}))?"
ZONE_PART = r"(?P<zone_sign>[-+])(?P<zone_hour>[0-9]{2})(?::(?P<zone_minute>[0-9]{2}))?(?::(?P<zone_second>[0-9]{2}))?"
_BC = r"(?P<bc> BC)?"

_DATESTYLE = (
    "not DateStyle ISO output (like 2024-01-31 12:34:56.789+00, 0044-03-15 BC or infinity):"
    " the capturing session must use DateStyle=ISO"
)


# -- parsing ---------------------------------------------------------------------


def extract_fields(
    raw: RawValues, strings: pa.Array, pattern: str, reason: str, *, specials: bool = True
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Match `pattern` (named groups) against every value; return (fields, +inf, -inf).

    Fields are int64 NumPy arrays (0 where the group did not take part);
    ``fraction`` is microseconds (right-padded to 6 digits). With `specials`,
    ``infinity`` / ``-infinity`` are accepted and flagged instead of matched.
    """
    valid = raw.valid
    if specials:
        plus = valid & np.asarray(pc.fill_null(pc.equal(strings, "infinity"), False), dtype=bool)
        minus = valid & np.asarray(pc.fill_null(pc.equal(strings, "-infinity"), False), dtype=bool)
    else:
        plus = minus = np.zeros(raw.n, dtype=bool)
    parts = pc.extract_regex(strings, pattern)
    unmatched = np.asarray(pc.is_null(parts).to_numpy(zero_copy_only=False), dtype=bool)
    fail_where(valid & unmatched & ~plus & ~minus, reason)
    fields: dict[str, np.ndarray] = {}
    for index in range(parts.type.num_fields):
        name = parts.type.field(index).name
        column = pc.fill_null(pc.struct_field(parts, name), "")
        if name == "bc":
            fields[name] = _flags(pc.not_equal(column, ""))
            continue
        if name.endswith("sign"):
            fields[name] = _flags(pc.equal(column, "-"))
            continue
        if name == "fraction":
            column = pc.utf8_rpad(column, 6, "0")
        else:  # "" (group not taken) -> 0; a leading '+' (interval fields) is not Arrow syntax
            column = pc.utf8_lpad(pc.utf8_ltrim(column, "+"), 1, "0")
        fields[name] = to_numpy_int(pc.cast(column, pa.int64()))
    return fields, plus, minus


def parse_iso(raw: RawValues, pattern: str, *, time: bool, zone: bool) -> tuple[
    dict[str, np.ndarray], np.ndarray, np.ndarray
]:
    """`extract_fields` for DateStyle ISO text: the usual shape by position (`iso`), the rest by regex."""
    fields, ok = iso_fields(raw, time=time, zone=zone)
    return extract_rest(raw, fields, ok, pattern, _DATESTYLE)


def extract_rest(raw: RawValues, fields: dict[str, np.ndarray], ok: np.ndarray, pattern: str,
                 reason: str) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """`extract_fields` where a fast path gave ``fields`` for the values it read (``ok``): the
    other valid values, by regex, into the same arrays (their errors as `extract_fields` words them)."""
    plus = np.zeros(raw.n, dtype=bool)
    minus = np.zeros(raw.n, dtype=bool)
    rest = raw.valid & ~ok
    if rest.any():
        rows = np.flatnonzero(rest)
        subset = RawValues(raw.as_binary().filter(pa.array(rest)))
        try:
            slow, plus[rows], minus[rows] = extract_fields(subset, subset.as_string(), pattern, reason)
        except ValueFailure as failure:
            raise ValueFailure(int(rows[failure.index]), failure.reason) from None
        for name, values in slow.items():
            fields[name][rows] = values
    return fields, plus, minus


def _flags(mask: pa.Array) -> np.ndarray:
    return np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool)


def days_from_civil(year: np.ndarray, month: np.ndarray, day: np.ndarray) -> np.ndarray:
    """Days since 1970-01-01 of proleptic Gregorian dates (astronomical years; H. Hinnant)."""
    y = year - (month <= 2)
    era = np.floor_divide(y, 400)
    yoe = y - era * 400
    doy = (153 * (month + np.where(month > 2, -3, 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return np.asarray(era * 146_097 + doe - 719_468)


def _days_in_month(year: np.ndarray, month: np.ndarray) -> np.ndarray:
    leap = ((year % 4 == 0) & (year % 100 != 0)) | (year % 400 == 0)
    table = np.array([0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])
    return np.asarray(table[np.clip(month, 0, 12)] + ((month == 2) & leap))


def calendar_days(raw: RawValues, f: dict[str, np.ndarray], live: np.ndarray) -> np.ndarray:
    """Days since 1970 of the matched date fields, checking they form a real date."""
    year = np.where(f["bc"], 1 - f["year"], f["year"])
    fail_where(live & (f["year"] == 0), "year 0 does not exist (1 BC precedes 1 AD)")
    fail_where(live & ((f["month"] < 1) | (f["month"] > 12)), "month out of range")
    fail_where(live & ((f["day"] < 1) | (f["day"] > _days_in_month(year, f["month"]))), "day out of range")
    return days_from_civil(year, f["month"], f["day"])


def time_of_day_us(raw: RawValues, f: dict[str, np.ndarray], live: np.ndarray, *, allow_24: bool) -> np.ndarray:
    hour, minute, second = f["hour"], f["minute"], f["second"]
    fail_where(live & ((minute > 59) | (second > 59)), "minute or second out of range")
    us: np.ndarray = ((hour * 60 + minute) * 60 + second) * US_PER_SECOND + f["fraction"]
    limit = US_PER_DAY if allow_24 else US_PER_DAY - 1
    fail_where(live & ((hour > 24) | (us > limit)), "hour out of range")
    return us


def zone_seconds(raw: RawValues, f: dict[str, np.ndarray], live: np.ndarray) -> np.ndarray:
    """The UTC offset in seconds east of Greenwich (as printed: +05:30 -> 19800)."""
    fail_where(live & ((f["zone_minute"] > 59) | (f["zone_second"] > 59)), "UTC offset out of range")
    seconds = (f["zone_hour"] * 60 + f["zone_minute"]) * 60 + f["zone_second"]
    return np.asarray(np.where(f["zone_sign"], -seconds, seconds))


def add_days_us(days: np.ndarray, rest: np.ndarray, live: np.ndarray) -> np.ndarray:
    """``days * US_PER_DAY + rest`` exactly in int64; fail where it leaves Arrow's range."""
    big = np.iinfo(np.int64)
    fits = np.abs(days) <= big.max // US_PER_DAY
    product = np.where(fits, days, 0) * US_PER_DAY
    over = ~fits | ((rest > 0) & (product > big.max - rest)) | ((rest < 0) & (product < big.min - rest))
    total = np.where(over, 0, product + np.where(over, 0, rest))  # no wrap-around where over
    over |= (total == TIMESTAMP_INFINITY) | (total == TIMESTAMP_MINUS_INFINITY)
    fail_where(live & over, "timestamp is outside the range of Arrow timestamp('us')"
                            " (290308 BC to 294247-01-10)")  # fmt: skip
    return total


def _with_specials(values: np.ndarray, plus: np.ndarray, minus: np.ndarray, high: int, low: int) -> np.ndarray:
    return np.where(plus, high, np.where(minus, low, values))


# -- date --------------------------------------------------------------------------


def _date_text(raw: RawValues, t: PgType) -> pa.Array:
    f, plus, minus = parse_iso(raw, f"^{DATE_PART}{_BC}$", time=False, zone=False)
    live = raw.valid & ~plus & ~minus
    days = np.where(live, calendar_days(raw, f, live), 0)
    fail_where(live & ((days >= DATE_INFINITY) | (days <= DATE_MINUS_INFINITY)), "date out of range")
    days = _with_specials(days, plus, minus, DATE_INFINITY, DATE_MINUS_INFINITY)
    return primitive_array(pa.date32(), days.astype(np.int32), raw.valid)


def _date_binary(raw: RawValues, t: PgType) -> pa.Array:
    pg_days = raw.fixed(4, "date").view(">i4").reshape(-1).astype(np.int64)
    plus, minus = pg_days == DATE_INFINITY, pg_days == DATE_MINUS_INFINITY
    days = pg_days + PG_EPOCH_DAYS
    fail_where(raw.valid & ~plus & ~minus & ((days >= DATE_INFINITY) | (days <= DATE_MINUS_INFINITY)),
               "date out of range")  # fmt: skip
    days = _with_specials(days, plus, minus, DATE_INFINITY, DATE_MINUS_INFINITY)
    return primitive_array(pa.date32(), days.astype(np.int32), raw.valid)


# -- timestamp, timestamptz --------------------------------------------------------


def _timestamp_text(with_zone: bool) -> Converter:
    zone = ZONE_PART if with_zone else ""
    pattern = f"^{DATE_PART} {TIME_PART}{zone}{_BC}$"
    arrow = TIMESTAMPTZ if with_zone else TIMESTAMP

    def convert(raw: RawValues, t: PgType) -> pa.Array:
        f, plus, minus = parse_iso(raw, pattern, time=True, zone=with_zone)
        live = raw.valid & ~plus & ~minus
        days = calendar_days(raw, f, live)
        rest = time_of_day_us(raw, f, live, allow_24=False)
        if with_zone:
            rest = rest - zone_seconds(raw, f, live) * US_PER_SECOND
        us = add_days_us(np.where(live, days, 0), np.where(live, rest, 0), live)
        us = _with_specials(us, plus, minus, TIMESTAMP_INFINITY, TIMESTAMP_MINUS_INFINITY)
        return primitive_array(arrow, us, raw.valid)

    return convert


def _timestamp_binary(arrow: pa.DataType) -> Converter:
    def convert(raw: RawValues, t: PgType) -> pa.Array:
        pg_us = raw.fixed(8, "timestamp").view(">i8").reshape(-1).astype(np.int64)
        plus, minus = pg_us == TIMESTAMP_INFINITY, pg_us == TIMESTAMP_MINUS_INFINITY
        live = raw.valid & ~plus & ~minus
        us = add_days_us(np.full(raw.n, PG_EPOCH_DAYS), np.where(live, pg_us, 0), live)
        us = _with_specials(us, plus, minus, TIMESTAMP_INFINITY, TIMESTAMP_MINUS_INFINITY)
        return primitive_array(arrow, us, raw.valid)

    return convert


CODECS: dict[int, Codec] = {
    BuiltinType.DATE: Codec(fixed_type(pa.date32()), _date_text, _date_binary),
    BuiltinType.TIMESTAMP: Codec(fixed_type(TIMESTAMP), _timestamp_text(False), _timestamp_binary(TIMESTAMP)),
    BuiltinType.TIMESTAMPTZ: Codec(
        fixed_type(TIMESTAMPTZ), _timestamp_text(True), _timestamp_binary(TIMESTAMPTZ)
    ),
}
