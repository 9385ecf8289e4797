"""time, timetz -> normalized strings.

``time`` becomes ``HH:MM:SS.ffffff`` (always six fraction digits, so string
order is time order; ``24:00:00.000000`` is kept). ``timetz`` becomes
``HH:MM:SS.ffffff+HH:MM``, the offset as PostgreSQL prints it (east of UTC
positive) always with minutes, and with ``:SS`` only when the offset has
seconds. Both wire formats are parsed to microseconds (and an offset) and
formatted by the same NumPy code, so they agree character for character.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .codec import Codec, fixed_type
from .dates import TIME_PART, US_PER_DAY, US_PER_SECOND, ZONE_PART, extract_fields, time_of_day_us, zone_seconds
from .oids import BuiltinType
from .pgtype import PgType
from .raw import RawValues, fail_where, string_from_matrix, string_from_parts

_TIME_TEXT = "time text must be HH:MM:SS[.ffffff]"
_MAX_ZONE = 15 * 3600 + 59 * 60 + 59  # PostgreSQL's TZDISP_LIMIT - 1


def _digits(matrix: np.ndarray, column: int, value: np.ndarray, width: int) -> None:
    """Write `value` zero-padded to `width` digits at `column` of each row."""
    for k in range(width - 1, -1, -1):
        matrix[:, column + k] = ord("0") + value % 10
        value = value // 10


def format_time(us: np.ndarray) -> np.ndarray:
    """(n, 15) characters ``HH:MM:SS.ffffff`` of microseconds since midnight."""
    chars = np.empty((us.size, 15), dtype=np.uint8)
    seconds, fraction = np.divmod(us, US_PER_SECOND)
    minutes, second = np.divmod(seconds, 60)
    hour, minute = np.divmod(minutes, 60)
    _digits(chars, 0, hour, 2)
    _digits(chars, 3, minute, 2)
    _digits(chars, 6, second, 2)
    _digits(chars, 9, fraction, 6)
    chars[:, [2, 5]] = ord(":")
    chars[:, 8] = ord(".")
    return chars


def _check_time(raw: RawValues, us: np.ndarray) -> None:
    fail_where(raw.valid & ((us < 0) | (us > US_PER_DAY)), "time of day out of range 00:00:00..24:00:00")


def _time_text(raw: RawValues, t: PgType) -> pa.Array:
    f, _, _ = extract_fields(raw, raw.as_string(), f"^{TIME_PART}$", _TIME_TEXT, specials=False)
    us = np.where(raw.valid, time_of_day_us(raw, f, raw.valid, allow_24=True), 0)
    return string_from_matrix(format_time(us), raw.valid)


def _time_binary(raw: RawValues, t: PgType) -> pa.Array:
    us = raw.fixed(8, "time").view(">i8").reshape(-1).astype(np.int64)
    _check_time(raw, us)
    return string_from_matrix(format_time(np.where(raw.valid, us, 0)), raw.valid)


def _format_timetz(raw: RawValues, us: np.ndarray, east: np.ndarray) -> pa.Array:
    fail_where(raw.valid & (np.abs(east) > _MAX_ZONE), "UTC offset out of range")
    east = np.where(raw.valid, east, 0)
    chars = np.empty((raw.n, 24), dtype=np.uint8)
    chars[:, :15] = format_time(np.where(raw.valid, us, 0))
    chars[:, 15] = np.where(east < 0, ord("-"), ord("+"))
    minutes, second = np.divmod(np.abs(east), 60)
    hour, minute = np.divmod(minutes, 60)
    _digits(chars, 16, hour, 2)
    chars[:, 18] = ord(":")
    _digits(chars, 19, minute, 2)
    chars[:, 21] = ord(":")
    _digits(chars, 22, second, 2)
    width = np.where(second != 0, 24, 21)
    keep = np.arange(24) < width[:, None]
    offsets = np.zeros(raw.n + 1, dtype=np.int64)
    np.cumsum(np.where(raw.valid, width, 0), out=offsets[1:])
    return string_from_parts(offsets, chars[keep & raw.valid[:, None]], raw.valid)


def _timetz_text(raw: RawValues, t: PgType) -> pa.Array:
    f, _, _ = extract_fields(raw, raw.as_string(), f"^{TIME_PART}{ZONE_PART}$",
                             "timetz text must be HH:MM:SS[.ffffff]+HH[:MM[:SS]]", specials=False)  # fmt: skip
    us = time_of_day_us(raw, f, raw.valid, allow_24=True)
    return _format_timetz(raw, us, zone_seconds(raw, f, raw.valid))


def _timetz_binary(raw: RawValues, t: PgType) -> pa.Array:
    matrix = raw.fixed(12, "timetz")
    us = np.ascontiguousarray(matrix[:, :8]).view(">i8").reshape(-1).astype(np.int64)
    west = np.ascontiguousarray(matrix[:, 8:]).view(">i4").reshape(-1).astype(np.int64)
    _check_time(raw, us)
    return _format_timetz(raw, us, -west)


CODECS: dict[int, Codec] = {
    BuiltinType.TIME: Codec(fixed_type(pa.string()), _time_text, _time_binary),
    BuiltinType.TIMETZ: Codec(fixed_type(pa.string()), _timetz_text, _timetz_binary),
}
