"""Build Arrow arrays from the NumPy results of a `Cursor` without per-value loops; read columns
without copies (`value_offsets`, `one_array`, `named_field`)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .reader import BatchReader, ErrorCode


def is_byte_strings(kind: pa.DataType) -> bool:
    """Whether ``kind`` is (large) string or binary: offsets, then the values' bytes."""
    return bool(pa.types.is_string(kind) or pa.types.is_binary(kind) or pa.types.is_large_string(kind)
                or pa.types.is_large_binary(kind))


def value_offsets(array: pa.Array) -> np.ndarray:
    """The ``len(array) + 1`` offsets of a non-empty `is_byte_strings` array into its data buffer,
    as stored (int32, or int64 for the large types), without a copy."""
    wide = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    return np.frombuffer(array.buffers()[1], dtype=np.int64 if wide else np.int32, count=len(array) + 1,
                         offset=array.offset * (8 if wide else 4))


def one_array(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array, without a copy when it already is one chunk."""
    if column.num_chunks == 1:
        return column.chunk(0)
    return column.combine_chunks() if column.num_chunks else pa.nulls(0, column.type)


def named_field(struct: pa.ChunkedArray, name: str) -> pa.ChunkedArray:
    """One field of a struct column, chunk by chunk."""
    return pc.struct_field(struct, [struct.type.get_field_index(name)])


def mask_array(valid: np.ndarray) -> pa.Array | None:
    """An Arrow validity mask (True = NULL) or None when everything is valid."""
    return None if valid.all() else pa.array(~valid)


def binary_array(reader: BatchReader, start: np.ndarray, length: np.ndarray,
                 valid: np.ndarray) -> pa.BinaryArray:
    """Copy ``[start, start + length)`` for each valid element into a binary array."""
    return reader.gather(start, length, valid)


def string_array(reader: BatchReader, rows: np.ndarray, start: np.ndarray, length: np.ndarray,
                 valid: np.ndarray, field: str) -> pa.StringArray:
    """Like `binary_array`, as UTF-8 strings; invalid UTF-8 fails the owning message.

    ``rows`` are the batch rows owning each element (for error reports).
    """
    binary = binary_array(reader, start, length, valid)
    try:
        return binary.cast(pa.string())
    except pa.ArrowInvalid:
        pass
    # Error path only: find the offending elements one by one.
    values = binary.to_pylist()
    bad = np.zeros(valid.size, dtype=bool)
    for i, value in enumerate(values):
        if value is not None:
            try:
                value.decode("utf-8")
            except UnicodeDecodeError:
                bad[i] = True
    reader.fail(rows[bad], field, ErrorCode.BAD_UTF8, start[bad])
    return binary_array(reader, start, length, valid & ~bad).cast(pa.string())


def bitmap(valid: np.ndarray) -> pa.Buffer | None:
    """An Arrow validity bitmap, or None when everything is valid."""
    return None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))


def _counting_array(size: int) -> np.ndarray:
    array = np.arange(size, dtype=np.int32)
    array.flags.writeable = False
    return array


_COUNTING = _counting_array(1 << 16)


def _counting(size: int) -> np.ndarray:
    """0, 1, ..., size - 1 as int32 (the offsets of one-byte strings), shared read-only."""
    global _COUNTING
    if size > _COUNTING.size:
        _COUNTING = _counting_array(max(size, 2 * _COUNTING.size))
    return _COUNTING[:size]


def char_array(codes: np.ndarray, valid: np.ndarray) -> pa.StringArray:
    """One-character strings from single bytes (e.g. tuple kinds, replica identity)."""
    codes = np.asarray(codes, dtype=np.uint8)
    if not valid.all():
        codes = np.where(valid, codes, ord("?")).astype(np.uint8)
    return pa.StringArray.from_buffers(
        codes.size, pa.py_buffer(_counting(codes.size + 1)), pa.py_buffer(codes), bitmap(valid),
        null_count=int(codes.size - np.count_nonzero(valid)),
    )


def char_codes(array: pa.Array) -> np.ndarray:
    """The byte of each one-character string of ``array`` (as `char_array` builds them), 0 where a
    value is NULL or not one byte long; read from the buffers, no string compared."""
    if not len(array):
        return np.zeros(0, dtype=np.uint8)
    offsets = value_offsets(array)
    data = array.buffers()[2]
    one = np.diff(offsets) == 1
    if array.null_count:
        one &= np.asarray(array.is_valid())
    if data is None or not one.any():
        return np.zeros(len(array), dtype=np.uint8)
    first = np.frombuffer(data, dtype=np.uint8)[np.where(one, offsets[:-1], 0)]
    return np.where(one, first, 0).astype(np.uint8)


def list_array(counts: np.ndarray, valid: np.ndarray, values: pa.Array,
               value_type: pa.DataType) -> pa.ListArray:
    """A list array whose element i holds ``counts[i]`` consecutive ``values``."""
    counts = np.where(valid, counts, 0)
    offsets = np.zeros(counts.size + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.ListArray.from_buffers(
        pa.list_(value_type), counts.size, [bitmap(valid), pa.py_buffer(offsets)], children=[values],
        null_count=int(counts.size - np.count_nonzero(valid)))


def take_into(total: int, parts: list[tuple[np.ndarray, pa.Array]], type_: pa.DataType) -> pa.Array:
    """Scatter arrays of group rows into a batch-length array, NULL elsewhere.

    ``parts`` are (batch rows, array with one element per row) pairs.
    """
    parts = [(rows, array) for rows, array in parts if rows.size]
    if not parts:
        return pa.nulls(total, type=type_)
    indices = np.full(total, -1, dtype=np.int64)
    base = 0
    for rows, array in parts:
        indices[rows] = base + np.arange(rows.size, dtype=np.int64)
        base += rows.size
    combined = pa.concat_arrays([array for _, array in parts]) if len(parts) > 1 else parts[0][1]
    taken = combined.take(pa.array(indices, mask=indices < 0))
    return taken.cast(type_) if taken.type != type_ else taken


__all__ = [
    "binary_array",
    "bitmap",
    "char_array",
    "char_codes",
    "list_array",
    "mask_array",
    "string_array",
    "take_into",
]
