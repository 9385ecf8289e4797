"""NumPy views of a binary Arrow array, and Arrow arrays built back from NumPy.

`RawValues` exposes the offsets, bytes and validity of a ``pa.binary()`` (or
``pa.large_binary()``) array without copying, so converters can work on the
whole batch at once. `ValueFailure` is how a converter reports a bad value it
found with a vectorized check (index + reason); `fail_where` raises it for
the first flagged value.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = [
    "RawValues",
    "ValueFailure",
    "binary_from_parts",
    "byte_ranges",
    "escaping_backslashes",
    "fail_where",
    "flag_rows",
    "gather_index",
    "primitive_array",
    "rows_of",
    "string_from_matrix",
    "string_from_parts",
]

_INT32_MAX = np.iinfo(np.int32).max


class ValueFailure(Exception):
    """The value at `index` (in the array given to the converter) is bad."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index = index
        self.reason = reason


def fail_where(bad: np.ndarray, reason: str | np.ndarray) -> None:
    """Raise `ValueFailure` for the first True in `bad`; `reason` may be per value."""
    if bad.any():
        index = int(np.argmax(bad))
        raise ValueFailure(index, reason if isinstance(reason, str) else str(reason[index]))


class RawValues:
    """The values of one column in a batch: a binary array, NULL = no value."""

    def __init__(self, array: pa.Array) -> None:
        if not (pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type)):
            raise TypeError(f"expected a binary array, got {array.type}")
        self.array = array
        self.n = len(array)
        offset_type = np.int64 if pa.types.is_large_binary(array.type) else np.int32
        _, offsets_buf, data_buf = array.buffers()
        if offsets_buf is None or self.n == 0:
            offsets = np.zeros(self.n + 1, dtype=np.int64)
        else:
            offsets = np.frombuffer(offsets_buf, dtype=offset_type)
            offsets = offsets[array.offset : array.offset + self.n + 1].astype(np.int64)
        self.data = (
            np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
        )
        if array.null_count:
            self.valid = np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        else:
            self.valid = np.ones(self.n, dtype=bool)
        # NULL slots may still own bytes in a hand-built array: ignore them.
        self.starts = offsets[:-1]
        owned = np.diff(offsets)
        self.lengths = np.where(self.valid, owned, 0)
        self._contiguous = self.n == 0 or bool((owned == self.lengths).all())

    # -- whole-array views ---------------------------------------------------------

    def compact(self) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, bytes) of the valid values packed end to end (NULLs empty)."""
        offsets = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=offsets[1:])
        if offsets[-1] == 0:
            return offsets, np.zeros(0, dtype=np.uint8)
        if self._contiguous:
            first = int(self.starts[0])
            return offsets, self.data[first : first + int(offsets[-1])]
        return offsets, self.data[gather_index(self.starts, self.lengths)]

    def fixed(self, width: int, what: str) -> np.ndarray:
        """An (n, width) uint8 matrix of values that must be exactly `width` bytes (NULL rows 0)."""
        fail_where(self.valid & (self.lengths != width), f"{what} must be {width} bytes")
        _, packed = self.compact()  # the valid values end to end, all `width` long
        rows = packed.reshape(-1, width)
        if rows.shape[0] == self.n:
            return rows
        out = np.zeros((self.n, width), dtype=np.uint8)
        out[self.valid] = rows
        return out

    def read(self, offset: int, dtype: str, rows: np.ndarray | None = None) -> np.ndarray:
        """The big-endian field at byte `offset` of each value (or of `rows`), in native order.

        Callers check lengths first; short or NULL values read garbage, never out of bounds."""
        width = np.dtype(dtype).itemsize
        rows = np.arange(self.n) if rows is None else rows
        starts = self.starts[rows] + offset
        idx = starts[:, None] + np.arange(width, dtype=np.int64)
        if self.data.size == 0:
            return np.zeros(rows.size, dtype=np.dtype(dtype).newbyteorder("="))
        raw = self.data[np.minimum(idx, self.data.size - 1)]
        return np.ascontiguousarray(raw).view(dtype).reshape(-1).astype(np.dtype(dtype).newbyteorder("="))

    def without_prefix(self, k: int) -> pa.BinaryArray:
        """The values minus their first `k` bytes (the caller checked they have them)."""
        offsets, data = self.compact()
        lengths = np.maximum(self.lengths - k, 0)
        new_offsets = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum(lengths, out=new_offsets[1:])
        return binary_from_parts(new_offsets, data[byte_ranges(data.size, offsets[:-1] + k, lengths)], self.valid)

    def as_binary(self) -> pa.Array:
        if pa.types.is_binary(self.array.type):
            return self.array
        return self.array.cast(pa.binary())

    def as_string(self) -> pa.StringArray:
        """The values as UTF-8 strings (raises pa.ArrowInvalid on invalid UTF-8)."""
        return self.as_binary().cast(pa.string())

    def mask(self) -> pa.Array | None:
        """True where NULL, for ``pa.*.from_arrays(mask=...)``; None when nothing is NULL."""
        return None if self.valid.all() else pa.array(~self.valid)


def gather_index(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Indices of ``[starts[i], starts[i] + lengths[i])`` for all i, concatenated."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    shift = np.repeat(starts - (ends - lengths), lengths)
    return np.asarray(np.arange(total, dtype=np.int64) + shift)


def rows_of(positions: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The value owning each byte position, for `offsets` from `RawValues.compact`."""
    return np.searchsorted(offsets, positions, side="right") - 1


def escaping_backslashes(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Positions of the backslashes that escape the byte after them.

    In each run of consecutive backslashes within a value the 1st, 3rd, 5th
    ... escape the next byte (``\\\\`` is two escaped backslashes). Works
    on the backslash positions only, so its cost follows their number.
    """
    slashes = np.flatnonzero(data == ord("\\"))
    if slashes.size == 0:
        return slashes
    k = np.arange(slashes.size)
    continues = np.append(False, slashes[1:] - 1 == slashes[:-1])
    continues &= offsets[rows_of(slashes, offsets)] != slashes  # a value's first byte starts a run
    run_first = np.maximum.accumulate(np.where(continues, 0, k))
    return np.asarray(slashes[(k - run_first) % 2 == 0])


def byte_ranges(size: int, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """A bool mask over `size` bytes: True inside ``[starts[i], starts[i] + lengths[i])``.

    The ranges must not overlap. One int8 running sum, so about two bytes of
    work per byte of data (no per-byte int64 index arrays).
    """
    step = np.zeros(size + 1, dtype=np.int8)
    nonempty = lengths > 0
    np.add.at(step, starts[nonempty], 1)
    np.add.at(step, starts[nonempty] + lengths[nonempty], -1)
    return np.cumsum(step[:-1], dtype=np.int8).astype(bool)


def flag_rows(rows: np.ndarray, n: int) -> np.ndarray:
    """A bool per value: True for the values listed in `rows`."""
    flags = np.zeros(n, dtype=bool)
    flags[rows] = True
    return flags


def _validity_buffer(valid: np.ndarray) -> pa.Buffer | None:
    return None if valid.all() else pa.array(valid, pa.bool_()).buffers()[1]


def _offsets32(offsets: np.ndarray) -> pa.Buffer:
    if offsets.size and offsets[-1] > _INT32_MAX:
        raise OverflowError("more than 2 GiB of converted values in one Arrow batch: use smaller batches")
    return pa.py_buffer(np.ascontiguousarray(offsets, dtype=np.int32))


def primitive_array(type_: pa.DataType, values: np.ndarray, valid: np.ndarray) -> pa.Array:
    """A fixed-width Arrow array over `values` (already in the type's physical layout)."""
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(
        type_, valid.size, [_validity_buffer(valid), pa.py_buffer(values)],
        null_count=int(valid.size - np.count_nonzero(valid)),
    )  # fmt: skip


def string_from_parts(offsets: np.ndarray, data: np.ndarray, valid: np.ndarray) -> pa.StringArray:
    """A string array from offsets (n + 1) and bytes the caller knows are UTF-8."""
    return pa.StringArray.from_buffers(
        valid.size, _offsets32(offsets), pa.py_buffer(np.ascontiguousarray(data, dtype=np.uint8)),
        _validity_buffer(valid), int(valid.size - np.count_nonzero(valid)),
    )  # fmt: skip


def binary_from_parts(offsets: np.ndarray, data: np.ndarray, valid: np.ndarray) -> pa.BinaryArray:
    return pa.BinaryArray.from_buffers(
        pa.binary(), valid.size,
        [_validity_buffer(valid), _offsets32(offsets), pa.py_buffer(np.ascontiguousarray(data, dtype=np.uint8))],
        null_count=int(valid.size - np.count_nonzero(valid)),
    )  # fmt: skip


def string_from_matrix(chars: np.ndarray, valid: np.ndarray) -> pa.StringArray:
    """Fixed-width ASCII strings, one row of `chars` (n, width) each."""
    n, width = chars.shape
    offsets = np.arange(n + 1, dtype=np.int64) * width
    return string_from_parts(offsets, chars.reshape(-1), valid)
