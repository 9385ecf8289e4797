"""interval -> struct<months: int32, days: int32, microseconds: int64>.

The three fields PostgreSQL stores, kept apart (a month is not a fixed number
of days, nor a day a fixed number of microseconds across DST changes), so no
value is lost. Text must be IntervalStyle ``postgres`` output, e.g.
``1 year 2 mons 3 days 04:05:06.789``, ``-1 days +02:00:00``,
``00:00:00.000001``. With numba, a compiled walk reads the fields of the values
PostgreSQL prints (`_interval_walk`); other values, and every value without
numba, are cut out with one ``extract_regex`` over them, which also words the
errors.
Binary is int64 microseconds, int32 days, int32 months. PostgreSQL 17's
``infinity`` / ``-infinity`` intervals are all-max / all-min fields, as in
its binary form.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..decoder import kernel
from ..decoder.kernel import _jit
from .codec import Codec, fixed_type
from .dates import US_PER_SECOND, extract_rest
from .iso import _byte
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
    fail_where(raw.valid & (raw.lengths == 0), _INTERVALSTYLE)
    f, plus, minus = extract_rest(raw, *_interval_fields(raw), _PATTERN, _INTERVALSTYLE)
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


#: The fields `_interval_walk` fills, in its output's column order: the groups of `_PATTERN`.
_FIELDS = ("years", "months", "days", "sign", "hours", "minutes", "seconds", "fraction")
_UNITS = (b"year", b"mon", b"day")
_SPACE, _COLON, _DOT, _PLUS, _MINUS, _S = (ord(c) for c in " :.+-s")
_MAX_DIGITS = 18  # more are left to the regex, whose int64 cast then says the value is too big


def _interval_fields(raw: RawValues) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(fields, ok): the fields `_PATTERN` gives, for the values of the usual shape (``ok``)."""
    matrix = np.zeros((raw.n, len(_FIELDS)), dtype=np.int64)
    ok = np.zeros(raw.n, dtype=bool)
    if kernel.numba is not None:
        _interval_walk(raw.starts, raw.lengths, raw.data, raw.valid, matrix, ok)
    fields = {name: np.ascontiguousarray(matrix[:, i]) for i, name in enumerate(_FIELDS)}
    fields["sign"] = fields["sign"].astype(bool)
    return fields, ok


@_jit(inline="always")
def _digits(data, start, length, p):  # pragma: no cover - compiled
    """(value, position after) of the digits at ``p``; position -1 without any or with too many."""
    value = np.int64(0)
    q = p
    while q < length and q - p <= _MAX_DIGITS:
        d = _byte(data, start, length, q) - 48
        if not 0 <= d <= 9:
            break
        value = value * 10 + d
        q += 1
    if q == p or q - p > _MAX_DIGITS:
        return value, -1
    return value, q


@_jit(inline="always")
def _unit(data, start, length, p):  # pragma: no cover - compiled
    """(unit number in `_UNITS`, position after its word and any plural 's'), or (-1, p)."""
    for u in range(3):
        word = _UNITS[u]
        if length - p >= len(word):
            same = True
            for k in range(len(word)):
                same = same and data[start + p + k] == word[k]
            if same:
                q = p + len(word)
                if _byte(data, start, length, q) == _S:
                    q += 1
                return u, q
    return -1, p


@_jit
def _interval_walk(starts, lengths, data, rows, fields, ok):  # pragma: no cover - compiled
    """`_PATTERN`'s fields value by value, for the values PostgreSQL prints: ``[±N year[s]]
    [±N mon[s]] [±N day[s]] [±]H:MM:SS[.F]``, in that order, one space apart. ``ok`` is False
    for anything else (left to the regex), ``fields`` (values x `_FIELDS`) filled in place."""
    for i in range(starts.size):
        if not rows[i]:
            continue
        start, length = starts[i], lengths[i]
        p = 0
        next_part = 0  # years, months, days, then the time
        good = length > 0
        while good and p < length:
            if p > 0:
                good = _byte(data, start, length, p) == _SPACE
                p += 1
            sign = _byte(data, start, length, p)
            if sign == _PLUS or sign == _MINUS:
                p += 1
            value, p = _digits(data, start, length, p)
            if p < 0:
                good = False
            elif _byte(data, start, length, p) == _SPACE and next_part < 3:
                u, q = _unit(data, start, length, p + 1)
                good = u >= next_part and (q == length or _byte(data, start, length, q) == _SPACE)
                if good:
                    fields[i, u] = -value if sign == _MINUS else value
                next_part = u + 1
                p = q
            elif _byte(data, start, length, p) == _COLON:
                fields[i, 3] = sign == _MINUS
                fields[i, 4] = value
                for f, at in ((5, p + 1), (6, p + 4)):
                    tens = _byte(data, start, length, at) - 48
                    ones = _byte(data, start, length, at + 1) - 48
                    good = good and 0 <= tens <= 9 and 0 <= ones <= 9
                    fields[i, f] = tens * 10 + ones
                good = good and _byte(data, start, length, p + 3) == _COLON
                p += 6
                if _byte(data, start, length, p) == _DOT:
                    fraction, q = _digits(data, start, length, p + 1)
                    good = good and 0 < q - p - 1 <= 6
                    if good:
                        fields[i, 7] = fraction * 10 ** (6 - (q - p - 1))
                    p = q
                good = good and p == length
                break
            else:
                good = False
        ok[i] = good


def _interval_binary(raw: RawValues, t: PgType) -> pa.Array:
    matrix = raw.fixed(16, "interval")
    us = np.ascontiguousarray(matrix[:, :8]).view(">i8").reshape(-1)
    days = np.ascontiguousarray(matrix[:, 8:12]).view(">i4").reshape(-1)
    months = np.ascontiguousarray(matrix[:, 12:]).view(">i4").reshape(-1)
    return _struct(raw, months, days, us)


CODECS: dict[int, Codec] = {
    BuiltinType.INTERVAL: Codec(fixed_type(INTERVAL), _interval_text, _interval_binary),
}
