"""A NumPy fast path for the usual shape of DateStyle ISO date and timestamp text.

``YYYY-MM-DD``, ``YYYY-MM-DD HH:MM:SS[.f{1,6}]`` and, for timestamptz, a
``±HH[:MM[:SS]]`` offset after it, with a four-digit year and no `` BC``: that
is nearly every value PostgreSQL prints, and it is read by position, one
byte column at a time over the whole batch (no regex). Values of any other
shape (``infinity``, BC, five-digit years, garbage) are left to the regex
parser of `dates`, which also words the errors.
"""

from __future__ import annotations

import numpy as np

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


def iso_fields(raw: RawValues, *, time: bool, zone: bool) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(fields, ok): the fields `dates.extract_fields` would give, valid where `ok`."""
    width = 35 if zone else 26 if time else 10
    rows = raw.valid & (raw.lengths >= 10) & (raw.lengths <= width)
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
