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

from .pgtype import PgType
from .raw import RawValues, fail_where

Converter = Callable[[RawValues, PgType], pa.Array]

__all__ = ["Codec", "Converter", "fixed_type", "matches", "require_match"]


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


def to_numpy_int(array: pa.Array, fill: int = 0) -> np.ndarray:
    """An integer Arrow array as int64 NumPy, NULL -> `fill`."""
    return np.asarray(pc.fill_null(array, fill).to_numpy(zero_copy_only=False), dtype=np.int64)
