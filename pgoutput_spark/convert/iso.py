"""A NumPy fast path for the usual shape of DateStyle ISO date and timestamp text.

``YYYY-MM-DD``, ``YYYY-MM-DD HH:MM:SS[.f{1,6}]`` and, for timestamptz, a
``±HH[:MM[:SS]]`` offset after it, with a four-digit year and no `` BC``: that
is nearly every value PostgreSQL prints, and it is read by position, one
byte column at a time over the whole batch (no regex), or, with numba, by a
compiled loop over the values' bytes (`_iso_walk`: the same fields in a
fourth to an eighth of the time). Values of any other shape (``infinity``,
BC, five-digit years, garbage) are left to the regex parser of `dates`, which
also words the errors.
"""

from __future__ import annotations

import numpy as np

from ..decoder import kernel
from ..decoder.kernel import _jit
from .raw import RawValues

_DIGIT0 = ord("0")


class _Columns:
    """The first `width` bytes of every value as columns (0 past a value's end)."""

    def __init__(self, raw: RawValues, width: int, rows: np.ndarray) -> None:
        offsets, data = raw.compact()
        self.n = raw.n
        self.width = width
        padded = np.concatenate((data, np.zeros(width, dtype=np.uint8)))
        windows = np.lib.stride_tricks.sliding_window_view(padded, width)  # no copy
        lengths = np.where(rows, raw.lengths, 0)
        matrix = np.where(np.arange(width) < lengths[:, None], windows[offsets[:-1]], 0)
        self.columns = np.ascontiguousarray(matrix.T, dtype=np.uint8)

    def at(self, position: int | np.ndarray) -> np.ndarray:
        """Byte `position` of each value (a per-value array is allowed)."""
        if isinstance(position, int):
            return np.asarray(self.columns[position])
        return np.asarray(self.columns[np.minimum(position, self.width - 1), np.arange(self.n)])

    def digit(self, position: int | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(is a digit, its value) at `position`."""
        byte = self.at(position).astype(np.int64) - _DIGIT0
        return (byte >= 0) & (byte <= 9), byte

    def number(self, *positions: int | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ok = np.ones(self.n, dtype=bool)
        value = np.zeros(self.n, dtype=np.int64)
        for position in positions:
            is_digit, d = self.digit(position)
            ok &= is_digit
            value = value * 10 + d
        return ok, value

    def char(self, position: int | np.ndarray, c: str) -> np.ndarray:
        return np.asarray(self.at(position) == ord(c))


#: The fields `_iso_walk` fills, in its output's column order.
_FIELDS = ("year", "month", "day", "hour", "minute", "second", "fraction", "zone_sign", "zone_hour",
           "zone_minute", "zone_second")


@_jit(inline="always")
def _byte(data, start, length, p):  # pragma: no cover - compiled
    return np.int64(data[start + p]) if p < length else np.int64(0)


@_jit(inline="always")
def _number(data, start, length, p, count):  # pragma: no cover - compiled
    """(all digits, their value) of the ``count`` bytes at ``p``."""
    good = True
    value = np.int64(0)
    for q in range(p, p + count):
        d = _byte(data, start, length, q) - _DIGIT0
        good = good and 0 <= d <= 9
        value = value * 10 + d
    return good, value


@_jit
def _iso_walk(starts, lengths, data, rows, time, zone, fields, ok):  # pragma: no cover - compiled
    """`iso_fields` value by value: ``fields`` (values x `_FIELDS`) and ``ok`` filled in place."""
    for i in range(starts.size):
        if not rows[i]:
            ok[i] = False
            continue
        start, length = starts[i], lengths[i]
        good = _byte(data, start, length, 4) == 45 and _byte(data, start, length, 7) == 45  # '-'
        g, fields[i, 0] = _number(data, start, length, 0, 4)
        good = good and g
        g, fields[i, 1] = _number(data, start, length, 5, 2)
        good = good and g
        g, fields[i, 2] = _number(data, start, length, 8, 2)
        good = good and g
        end = 10
        if time:
            good = (good and _byte(data, start, length, 10) == 32 and _byte(data, start, length, 13) == 58
                    and _byte(data, start, length, 16) == 58)  # ' ', ':', ':'
            for f, p in ((3, 11), (4, 14), (5, 17)):
                g, fields[i, f] = _number(data, start, length, p, 2)
                good = good and g
            fraction = np.int64(0)
            digits = 0
            if _byte(data, start, length, 19) == 46:  # '.'
                while digits < 6:
                    d = _byte(data, start, length, 20 + digits) - _DIGIT0
                    if not 0 <= d <= 9:
                        break
                    fraction = fraction * 10 + d
                    digits += 1
                good = good and digits > 0
                end = 20 + digits
            else:
                end = 19
            fields[i, 6] = fraction * 10 ** (6 - digits)
        if zone:
            sign = _byte(data, start, length, end)
            g, fields[i, 8] = _number(data, start, length, end + 1, 2)
            good = good and (sign == 43 or sign == 45) and g  # '+', '-'
            fields[i, 7] = sign == 45
            fields[i, 9] = 0
            fields[i, 10] = 0
            if _byte(data, start, length, end + 3) == 58:
                g, fields[i, 9] = _number(data, start, length, end + 4, 2)
                good = good and g
                if _byte(data, start, length, end + 6) == 58:
                    g, fields[i, 10] = _number(data, start, length, end + 7, 2)
                    good = good and g
                    end += 3
                end += 3
            end += 3
        ok[i] = good and end == length


def iso_fields(raw: RawValues, *, time: bool, zone: bool) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(fields, ok): the fields `dates.extract_fields` would give, valid where `ok`."""
    if kernel.numba is not None:
        return _compiled_fields(raw, time=time, zone=zone)
    return _numpy_fields(raw, time=time, zone=zone)


def _candidates(raw: RawValues, *, time: bool, zone: bool) -> tuple[int, np.ndarray]:
    """The longest usual shape, and the values whose length fits one."""
    width = 35 if zone else 26 if time else 10
    return width, raw.valid & (raw.lengths >= 10) & (raw.lengths <= width)


def _compiled_fields(raw: RawValues, *, time: bool, zone: bool) -> tuple[dict[str, np.ndarray], np.ndarray]:
    _, rows = _candidates(raw, time=time, zone=zone)
    matrix = np.zeros((raw.n, len(_FIELDS)), dtype=np.int64)
    ok = np.zeros(raw.n, dtype=bool)
    _iso_walk(raw.starts, raw.lengths, raw.data, rows, time, zone, matrix, ok)
    fields = {"bc": np.zeros(raw.n, dtype=bool)}
    used = _FIELDS[:3] + (_FIELDS[3:7] if time else ()) + (_FIELDS[7:] if zone else ())
    for name in used:
        column = np.ascontiguousarray(matrix[:, _FIELDS.index(name)])
        fields[name] = column.astype(bool) if name == "zone_sign" else column
    return fields, ok


def _numpy_fields(raw: RawValues, *, time: bool, zone: bool) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """`iso_fields` by byte columns over the whole batch (where numba is missing)."""
    width, rows = _candidates(raw, time=time, zone=zone)
    c = _Columns(raw, width, rows)
    ok = rows & c.char(4, "-") & c.char(7, "-")
    fields: dict[str, np.ndarray] = {"bc": np.zeros(raw.n, dtype=bool)}
    for name, positions in (("year", (0, 1, 2, 3)), ("month", (5, 6)), ("day", (8, 9))):
        good, fields[name] = c.number(*positions)
        ok &= good
    end: np.ndarray = np.full(raw.n, 10)
    if time:
        ok &= c.char(10, " ") & c.char(13, ":") & c.char(16, ":")
        for name, positions in (("hour", (11, 12)), ("minute", (14, 15)), ("second", (17, 18))):
            good, fields[name] = c.number(*positions)
            ok &= good
        has_fraction = c.char(19, ".")
        running = has_fraction.copy()
        fraction = np.zeros(raw.n, dtype=np.int64)
        digits = np.zeros(raw.n, dtype=np.int64)
        for k in range(20, 26):
            is_digit, d = c.digit(k)
            running &= is_digit
            fraction = np.where(running, fraction * 10 + d, fraction)
            digits += running
        ok &= ~has_fraction | (digits > 0)
        fields["fraction"] = fraction * 10 ** (6 - digits)
        end = np.where(has_fraction, 20 + digits, 19)
    if zone:
        plus, minus = c.char(end, "+"), c.char(end, "-")
        good, fields["zone_hour"] = c.number(end + 1, end + 2)
        ok &= (plus | minus) & good
        fields["zone_sign"] = minus
        has_minute = c.char(end + 3, ":")
        has_second = has_minute & c.char(end + 6, ":")
        good, minute = c.number(end + 4, end + 5)
        ok &= ~has_minute | good
        fields["zone_minute"] = np.where(has_minute, minute, 0)
        good, second = c.number(end + 7, end + 8)
        ok &= ~has_second | good
        fields["zone_second"] = np.where(has_second, second, 0)
        end = end + 3 + 3 * has_minute + 3 * has_second
    return fields, ok & (end == raw.lengths)
