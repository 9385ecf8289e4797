"""The shape shared by the type-family modules: a `Codec` per built-in type.

A codec knows the Arrow type of a column and converts a batch of its values
from either wire format. Converters are vectorized over the whole batch; they
report a bad value by raising `ValueFailure` (index + reason) or by letting a
``pyarrow`` error escape, which `dispatch` then pins to the first bad value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..decoder import kernel
from ..decoder.kernel import _jit
from .pgtype import PgType
from .raw import RawValues, fail_where

Converter = Callable[[RawValues, PgType], pa.Array]

__all__ = ["Codec", "Converter", "fixed_type", "matches", "require_match", "require_number"]


@dataclass(frozen=True)
class Codec:
    arrow_type: Callable[[PgType], pa.DataType]
    text: Converter
    binary: Converter
    # PostgreSQL's text form from the binary form, for a `target=pa.string()`
    # override; None when the binary converter already returns it.
    binary_as_text: Converter | None = None


def fixed_type(type_: pa.DataType) -> Callable[[PgType], pa.DataType]:
    return lambda _t: type_


def matches(strings: pa.Array, pattern: str) -> np.ndarray:
    """A NumPy bool mask: where `strings` match the RE2 `pattern` (NULL -> True)."""
    hit = pc.fill_null(pc.match_substring_regex(strings, pattern), True)
    return np.asarray(hit.to_numpy(zero_copy_only=False), dtype=bool)


def require_match(raw: RawValues, strings: pa.Array, pattern: str, reason: str) -> None:
    """Fail on the first valid value that does not match `pattern`."""
    fail_where(raw.valid & ~matches(strings, pattern), reason)


def require_number(raw: RawValues, strings: pa.Array, pattern: str, reason: str, *, fraction: bool,
                   exponent: bool, specials: bool) -> None:
    """`require_match` for a number's text: ``-?[0-9]+``, then with ``fraction`` an optional
    ``\\.[0-9]+``, with ``exponent`` an optional ``e[-+][0-9]+``; with ``specials`` also ``NaN``
    and ``-?Infinity``. ``pattern`` says the same as a regex, which checks the values where numba
    is missing; compiled, each value's bytes are read once (RE2 costs about a tenth of a
    microsecond per value more)."""
    if kernel.numba is None:
        require_match(raw, strings, pattern, reason)
        return
    bad = np.zeros(raw.n, dtype=bool)
    _number_walk(raw.starts, raw.lengths, raw.data, raw.valid, fraction, exponent, specials, bad)
    fail_where(bad, reason)


@_jit(inline="always")
def _digits_from(data, start, length, p):  # pragma: no cover - compiled
    """The position after the digits at ``p`` (``p`` when there are none)."""
    while p < length and 48 <= data[start + p] <= 57:
        p += 1
    return p


@_jit(inline="always")
def _spelled(data, start, length, p, word):  # pragma: no cover - compiled
    """Whether the value's bytes from ``p`` to its end are ``word``."""
    if length - p != len(word):
        return False
    for k in range(len(word)):
        if data[start + p + k] != word[k]:
            return False
    return True


@_jit
def _number_walk(starts, lengths, data, valid, fraction, exponent, specials, bad):  # pragma: no cover
    """`require_number`'s check value by value: ``bad`` set where a valid value has another shape."""
    for i in range(starts.size):
        if not valid[i]:
            continue
        start, length = starts[i], lengths[i]
        p = 1 if length > 0 and data[start] == 45 else 0  # '-'
        q = _digits_from(data, start, length, p)
        if q == p:  # no digits: NaN or [-]Infinity at most
            good = specials and ((p == 0 and _spelled(data, start, length, 0, b"NaN"))
                                 or _spelled(data, start, length, p, b"Infinity"))
        else:
            good = True
            if fraction and q < length and data[start + q] == 46:  # '.'
                r = _digits_from(data, start, length, q + 1)
                good = r > q + 1
                q = r
            if good and exponent and q < length and data[start + q] == 101:  # 'e'
                sign = data[start + q + 1] if q + 1 < length else 0
                r = _digits_from(data, start, length, q + 2)
                good = (sign == 43 or sign == 45) and r > q + 2
                q = r
            good = good and q == length
        bad[i] = not good


def to_numpy_int(array: pa.Array, fill: int = 0) -> np.ndarray:
    """An integer Arrow array as int64 NumPy, NULL -> `fill`."""
    return np.asarray(pc.fill_null(array, fill).to_numpy(zero_copy_only=False), dtype=np.int64)
