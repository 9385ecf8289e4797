"""Key codes: one integer per row, equal where the rows' key values are equal (`key_codes`, for
the net change's walk), and hashes of key values equal in every process (`key_hashes`, to
spread a table's rows over tasks by key).

Values never leave Arrow: fixed-width columns are read as their bits, byte strings in their
buffers, other columns (lists, structs, maps) through codes of their values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..decoder import arrow as ab
from ..decoder import kernel
from .walk import HASH_SEED, hash_bytes, hash_words, number_hashes, same_bytes, same_words


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _hashable(v)) for k, v in value.items())
    return value


def _dense(codes: np.ndarray) -> np.ndarray:
    """Codes renumbered 0..k-1 (equal stays equal)."""
    return np.unique(codes, return_inverse=True)[1].reshape(-1).astype(np.int64)


def _validity(values: pa.Array) -> pa.Buffer | None:
    return pa.array(np.asarray(values.is_valid())).buffers()[1] if values.null_count else None


def _column_codes(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """One integer per value, equal for equal values (NULL equal to NULL), vectorized for nested types."""
    kind = values.type
    if isinstance(values, pa.ChunkedArray):
        if not (pa.types.is_nested(kind) or pa.types.is_dictionary(kind)):
            # The chunks share one dictionary: no copy of the values into one array.
            try:
                encoded = pc.dictionary_encode(values, null_encoding="encode")
                return np.concatenate([np.asarray(c.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
                                       for c in encoded.chunks] or [np.zeros(0, np.int64)])
            except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
                pass
        values = values.combine_chunks()
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        # Each list as the bytes of its elements' codes; then codes of those byte strings.
        lengths = pc.fill_null(pc.list_value_length(values), 0).to_numpy(zero_copy_only=False)
        elements = _column_codes(pc.list_flatten(values)) if lengths.sum() else np.zeros(0, np.int64)
        offsets = np.zeros(len(values) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        packed = pa.LargeBinaryArray.from_buffers(
            pa.large_binary(), len(values),
            [_validity(values), pa.py_buffer((offsets * 8).tobytes()),
             pa.py_buffer(elements.astype(np.int64).tobytes())], null_count=values.null_count)
        return _column_codes(packed)
    if pa.types.is_struct(kind):
        valid = np.asarray(values.is_valid(), dtype=np.int64)
        fields = [np.where(valid == 1, _column_codes(pc.struct_field(values, [i])), -1)
                  for i in range(kind.num_fields)]
        return key_codes_from([valid, *fields])
    try:
        encoded = pc.dictionary_encode(values, null_encoding="encode")
        return np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        # Anything else (maps, say): hash the Python form.
        seen: dict[Any, int] = {}
        return np.fromiter((seen.setdefault(_hashable(v), len(seen)) for v in values.to_pylist()),
                           dtype=np.int64, count=len(values))


def key_codes_from(codes: Sequence[np.ndarray]) -> np.ndarray:
    """Combine per-column codes into one code per row, equal where every column's code is equal."""
    out = _dense(codes[0])
    bound = int(out.max()) + 1 if out.size else 1  # every code of ``out`` is below it
    for more in codes[1:]:
        if more.size and more.min() < 0:
            more = _dense(more)
        width = int(more.max()) + 1 if more.size else 1
        if bound * width >= 2**62:
            # Renumber before the pair's code could leave int64: then both are below the row count n,
            # and n**2 is far within it.
            out = _dense(out)
            bound = int(out.max()) + 1 if out.size else 1
        out = out * width + more
        bound *= width
    return _dense(out) if len(codes) > 1 else out


def _fixed_width(kind: pa.DataType) -> bool:
    """Whether values of ``kind`` are equal exactly when their bits are (as `pc.dictionary_encode`
    finds them: bit for bit, floats too) and sit in one buffer of 1, 8, 16, 32 or k x 64 bits."""
    if pa.types.is_struct(kind):
        return all(_fixed_width(f.type) for f in kind)
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
            or pa.types.is_temporal(kind) or pa.types.is_decimal(kind) or pa.types.is_fixed_size_binary(kind)):
        return False
    return kind.bit_width in (1, 8, 16, 32) or kind.bit_width % 64 == 0


def _fixed_words(values: pa.Array, words: list[np.ndarray], valid: list[np.ndarray]) -> None:
    """Append the int64 words of a `_fixed_width` column (its bits, 0 where NULL) to ``words``
    and, if it has NULLs, its validity (0 / 1) to ``valid``; a struct's fields follow it."""
    n = len(values)
    ok = np.asarray(values.is_valid()) if values.null_count else None
    kind = values.type
    if pa.types.is_struct(kind):
        for i in range(kind.num_fields):
            more: list[np.ndarray] = []
            more_valid: list[np.ndarray] = []
            _fixed_words(values.field(i), more, more_valid)
            if ok is not None:  # a NULL struct's fields may hold anything
                more = [np.where(ok, x, 0) for x in more]
                more_valid = [np.where(ok, x, 0) for x in more_valid]
            words.extend(more)
            valid.extend(more_valid)
    elif kind.bit_width == 1:
        words.append(np.asarray(pc.fill_null(values, False).to_numpy(zero_copy_only=False), dtype=np.int64))
    else:
        size = kind.bit_width // 8
        data = values.buffers()[1]
        raw = np.frombuffer(data, dtype=np.uint8, count=n * size, offset=values.offset * size) \
            if n and data is not None else np.zeros(n * size, np.uint8)
        if size in (1, 2, 4, 8):
            column = [raw.view(f"<i{size}").astype(np.int64)]
        else:
            column = list(raw.view("<i8").reshape(n, size // 8).T)
        words.extend(column if ok is None else [np.where(ok, x, 0) for x in column])
    if ok is not None:
        valid.append(ok.astype(np.int64))


def _packed(valid: list[np.ndarray], n: int) -> list[np.ndarray]:
    """Validity columns (0 / 1) packed 62 to an int64 word."""
    out = []
    for start in range(0, len(valid), 62):
        word = np.zeros(n, np.int64)
        for bit, v in enumerate(valid[start:start + 62]):
            word |= v << bit
        out.append(word)
    return out


def _var_column(values: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """A byte-string column as each value's memory address (in its chunk's data buffer, which
    ``values`` keeps alive) and length (-1: NULL), for `walk.hash_bytes` and `walk.same_bytes`."""
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    addresses, lengths = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for chunk in chunks:
        if not len(chunk):
            continue
        offsets = ab.value_offsets(chunk)
        data = chunk.buffers()[2]
        length = np.diff(offsets).astype(np.int64)
        if chunk.null_count:
            length[~np.asarray(chunk.is_valid())] = -1
        addresses.append(offsets[:-1].astype(np.int64) + (data.address if data is not None else 0))
        lengths.append(length)
    return np.concatenate(addresses), np.concatenate(lengths)


def key_codes(columns: Sequence[pa.Array | pa.ChunkedArray], *, hash_mask: int = -1,
              sources: Sequence[np.ndarray | None] | None = None) -> np.ndarray:
    """One integer per row, equal for rows whose values are equal in every column (dense: ``0 .. k-1``).

    ``sources``: per column, None or the row whose value stands for each row's (row ``i`` has
    the value of row ``sources[i]``): a column's values filled in from other rows without
    copying them.

    Compiled (numba), in one pass per column: fixed-width columns give their bits, byte strings
    their bytes (read in their Arrow buffers), other columns their `_column_codes`; every row
    gets a 64-bit hash of them, `walk.number_hashes` numbers the rows by hash (in the order first
    seen), and every row is checked against the first row of its number, value for value.
    Without numba, or where two different rows' hashes meet (``hash_mask``: see
    `walk.number_hashes`), the columns' codes are combined pairwise (`key_codes_from`).
    On `bench_wide`'s 1,036,800 new and old rows of 20 columns: 0.64-0.68 s against 2.2-2.4 s
    pairwise.
    """
    sources = list(sources) if sources is not None else [None] * len(columns)

    def mapped(arrays: list[np.ndarray], source: np.ndarray | None) -> list[np.ndarray]:
        return arrays if source is None else [a[source] for a in arrays]

    if kernel.numba is not None:
        n = len(columns[0])
        words: list[np.ndarray] = []
        valid: list[np.ndarray] = []
        var_columns: list[tuple[np.ndarray, np.ndarray]] = []
        for column, source in zip(columns, sources):
            if _fixed_width(column.type):
                its_words: list[np.ndarray] = []
                its_valid: list[np.ndarray] = []
                _fixed_words(ab.one_array(column) if isinstance(column, pa.ChunkedArray) else column,
                             its_words, its_valid)
                words.extend(mapped(its_words, source))
                valid.extend(mapped(its_valid, source))
            elif ab.is_byte_strings(column.type):
                address, length = mapped(list(_var_column(column)), source)
                var_columns.append((address, length))
            else:
                words.extend(mapped([_column_codes(column)], source))
        words.extend(_packed(valid, n))
        words = [np.ascontiguousarray(w, dtype=np.int64) for w in words]
        hashes = np.full(n, HASH_SEED, dtype=np.uint64)
        for w in words:
            hash_words(hashes, w)
        for address, length in var_columns:
            hash_bytes(hashes, address, length)
        numbered: np.ndarray
        numbered, first = number_hashes(hashes, hash_mask)
        if (all(same_words(w, first) for w in words)
                and all(same_bytes(address, length, first) for address, length in var_columns)):
            return numbered
    codes = [mapped([_column_codes(c)], source)[0] for c, source in zip(columns, sources)]
    return codes[0] if len(codes) == 1 else key_codes_from(codes)


def joined_buckets(n: int, pairs: Sequence[tuple[int, int]]) -> list[int]:
    """For buckets 0..n-1, the bucket each goes with: the same for two buckets that a chain of
    ``pairs`` links (the smallest of them), so that rows of linked buckets meet in one task."""
    parent = list(range(n))

    def root(b: int) -> int:
        while parent[b] != b:
            parent[b] = parent[parent[b]]
            b = parent[b]
        return b

    for a, b in pairs:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return [root(b) for b in range(n)]


#: Leading bytes of a byte string that `key_hashes` reads (equal strings have equal ones): a
#: long text would cost more to read than its key is worth to spread the rows.
HASHED_PREFIX = 32


def key_hashes(columns: Sequence[pa.Array | pa.ChunkedArray],
               sources: Sequence[np.ndarray | None] | None = None) -> np.ndarray | None:
    """A 64-bit hash per row (uint64) of its values in ``columns``, the same for equal values in
    any process: made of their bits and bytes only (`walk.hash_words`, `walk.hash_bytes`), never
    of codes numbered in one process, so only the fixed-width and byte-string columns count, and
    of a byte string only its length and first `HASHED_PREFIX` bytes (which still gives equal
    keys equal hashes). ``sources`` as for `key_codes`. None without numba, or when no column is
    of those types."""
    if kernel.numba is None or not columns:
        return None
    sources = list(sources) if sources is not None else [None] * len(columns)
    hashes = np.full(len(columns[0]), HASH_SEED, dtype=np.uint64)
    used = False
    for column, source in zip(columns, sources):
        if _fixed_width(column.type):
            chunks = column.chunks if isinstance(column, pa.ChunkedArray) and source is None else \
                [ab.one_array(column) if isinstance(column, pa.ChunkedArray) else column]
            start = 0
            for chunk in chunks:  # chunk by chunk, into the chunk's rows of ``hashes``: no copy of the column
                words: list[np.ndarray] = []
                _fixed_words(chunk, words, [])
                part = hashes if source is not None else hashes[start:start + len(chunk)]
                for w in words:
                    hash_words(part, np.ascontiguousarray(w if source is None else w[source], dtype=np.int64))
                start += len(chunk)
            used = True
        elif ab.is_byte_strings(column.type):
            address, length = _var_column(column)
            if source is not None:
                address, length = address[source], length[source]
            # The length whole (equal strings, equal lengths), then a prefix of the bytes.
            hash_words(hashes, np.ascontiguousarray(length, dtype=np.int64))
            hash_bytes(hashes, np.ascontiguousarray(address), np.minimum(length, HASHED_PREFIX))
            used = True
    return hashes if used else None


def hashed_alike(kind: pa.DataType) -> bool:
    """Whether `key_hashes` hashes a column of type ``kind`` (fixed-width or byte strings)."""
    return _fixed_width(kind) or ab.is_byte_strings(kind)
