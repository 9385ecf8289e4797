"""Arrays -> (nested) Arrow lists of the element type; the text form.

PostgreSQL does not fix an array column's number of dimensions, Arrow does:
a column converts as ``PgType.dimensions`` levels of lists (1 unless a type
override says otherwise) and a value with another number of dimensions is an
error. The empty array ``{}`` is an empty list at any depth. Lower bounds
(``[2:3]={...}``) are dropped: the list holds the elements in order.

The text form (``array_out``) is tokenized for the whole batch at once with
NumPy, working on the positions of the few special bytes rather than on
every byte: runs of backslashes decide which bytes are escaped, the number
of unescaped quotes before a brace or comma decides whether it is inside
quotes, the braces and commas outside quotes are the structure, and a running
brace count gives each element its depth and its enclosing sub-array.
Quoted, escaped, nested and NULL elements all take this path; nothing is
parsed value by value. The elements (unquoted, unescaped) then go through
the element type's text converter as one array.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import TypeConversionError
from .codec import matches
from .pgtype import PgType
from .raw import (
    RawValues,
    ValueFailure,
    binary_from_parts,
    escaping_backslashes,
    fail_where,
    flag_rows,
    gather_index,
    rows_of,
)

ConvertElements = Callable[[pa.Array, PgType], pa.Array]

_OPEN, _CLOSE, _COMMA, _QUOTE = (ord(c) for c in '{},"')
_BOUNDS = r"^(\[-?[0-9]+:-?[0-9]+\])+=\{"
_NULL = np.frombuffer(b"NULL", dtype=np.uint8)


def nest(
    raw: RawValues,
    t: PgType,
    elements: pa.Array,
    counts: list[np.ndarray],
    element_rows: np.ndarray,
    convert_elements: ConvertElements,
) -> pa.Array:
    """Convert `elements` and wrap them in ``t.dimensions`` levels of lists.

    ``counts[0]`` is the number of children of each row (0 for NULL rows),
    ``counts[k]`` the number of children of each list of level k.
    """
    element_type = t.element()
    try:
        values = convert_elements(elements, element_type)
    except TypeConversionError as error:
        if error.index is None:
            raise
        row = int(element_rows[error.index])
        position = error.index - int(np.searchsorted(element_rows, row))
        raise ValueFailure(row, f"element {position} {TypeConversionError.show(error.value or b'')}:"
                                f" {error.reason}") from error  # fmt: skip
    for level in range(len(counts) - 1, -1, -1):
        offsets = np.zeros(counts[level].size + 1, dtype=np.int32)
        np.cumsum(counts[level], out=offsets[1:])
        mask = raw.mask() if level == 0 else None
        values = pa.ListArray.from_arrays(pa.array(offsets), values, mask=mask)
    return values


def check_dimensions(raw: RawValues, t: PgType, ndim: np.ndarray, nonempty: np.ndarray) -> None:
    wrong = raw.valid & nonempty & (ndim != t.dimensions)
    if wrong.any():
        row = int(np.argmax(wrong))
        raise ValueFailure(
            row,
            f"a {int(ndim[row])}-dimensional array in a column converted as {t.dimensions}-dimensional"
            f" (PgType.dimensions={t.dimensions}); convert this column with"
            f" dimensions={int(ndim[row])}",
        )


def text_arrays(raw: RawValues, t: PgType, convert_elements: ConvertElements) -> pa.Array:
    n, valid = raw.n, raw.valid
    syntax = f"not {t.display_name} text (array_out output like {{1,2}}, {{\"a b\",NULL}} or [0:1]={{1,2}})"
    fail_where(valid & (raw.lengths < 2), syntax)
    offsets, data = raw.compact()
    row_start, row_end = offsets[:-1], offsets[1:]
    clip = data.size - 1

    # [lower:upper]...= prefix
    binary = raw.as_binary()
    bounded = valid & np.asarray(
        pc.fill_null(pc.starts_with(binary, "["), False).to_numpy(zero_copy_only=False), dtype=bool
    )
    fail_where(bounded & ~matches(binary, _BOUNDS), syntax)
    body_start = row_start.copy()
    if bounded.any():
        equals = np.asarray(pc.fill_null(pc.find_substring(binary, "="), -1).to_numpy(zero_copy_only=False))
        body_start += np.where(bounded, equals + 1, 0)
    fail_where(valid & ((data[np.minimum(body_start, clip)] != _OPEN) | (data[np.maximum(row_end - 1, 0)] != _CLOSE)),
               syntax)  # fmt: skip

    # escapes, then quotes that are not escaped, then structure outside quotes
    escaping = escaping_backslashes(data, offsets)
    fail_where(valid & flag_rows(rows_of(escaping[escaping == row_end[rows_of(escaping, offsets)] - 1], offsets), n),
               syntax)  # fmt: skip
    escaped = np.zeros(data.size + 1, dtype=bool)
    escaped[escaping + 1] = True
    quotes = np.flatnonzero(data == _QUOTE)
    quotes = quotes[~escaped[quotes]]
    fail_where(valid & (np.bincount(rows_of(quotes, offsets), minlength=n) % 2 == 1),
               syntax + ": unbalanced quotes")  # fmt: skip
    marks = np.flatnonzero((data == _OPEN) | (data == _CLOSE) | (data == _COMMA))
    marks = marks[~escaped[marks]]
    marks = marks[np.searchsorted(quotes, marks) % 2 == 0]  # an even number of quotes before: outside
    mark_rows = rows_of(marks, offsets)
    char = data[marks]
    step = (char == _OPEN).astype(np.int64) - (char == _CLOSE)
    fail_where(valid & (np.bincount(mark_rows, weights=step, minlength=n) != 0), syntax + ": unbalanced braces")
    depth = np.cumsum(step)  # after each mark; every value is balanced, so this is per value
    is_last = marks == row_end[mark_rows] - 1
    fail_where(flag_rows(mark_rows[(depth <= 0) & ~is_last], n), syntax)

    opening = marks[char == _OPEN]
    opening_depth = depth[char == _OPEN]
    ndim = np.zeros(n, dtype=np.int64)
    np.maximum.at(ndim, mark_rows[char == _OPEN], opening_depth)
    prefix_dims = np.zeros(n, dtype=np.int64)
    if bounded.any():
        brackets = np.flatnonzero(data == ord("["))
        bracket_rows = rows_of(brackets, offsets)
        prefix_dims = np.bincount(bracket_rows[brackets < body_start[bracket_rows]], minlength=n)

    # segments between consecutive marks of a value; elements sit between {/, and ,/}
    left, right = marks[:-1], marks[1:]
    left_char, right_char = char[:-1], char[1:]
    same = mark_rows[:-1] == mark_rows[1:]
    gap = right - left - 1
    element = (same & ((left_char == _OPEN) | (left_char == _COMMA)) & ((right_char == _COMMA) | (right_char == _CLOSE))
               & ~((left_char == _OPEN) & (right_char == _CLOSE) & (gap == 0)))  # fmt: skip
    elem_rows = mark_rows[:-1][element]
    fail_where(flag_rows(mark_rows[:-1][same & ~element & (gap > 0)], n), syntax)
    fail_where(flag_rows(mark_rows[:-1][element & (gap == 0)], n), syntax + ": empty unquoted element")
    fail_where(flag_rows(elem_rows[depth[:-1][element] != ndim[elem_rows]], n),
               syntax + ": elements at different depths")  # fmt: skip
    nonempty = flag_rows(elem_rows, n)
    fail_where(bounded & nonempty & (prefix_dims != ndim), syntax + ": bounds do not match the dimensions")
    check_dimensions(raw, t, ndim, nonempty)

    # element bytes: strip the surrounding quotes and the escaping backslashes
    starts, ends = left[element] + 1, right[element]
    quoted = data[np.minimum(starts, clip)] == _QUOTE
    quotes_inside = np.searchsorted(quotes, ends) - np.searchsorted(quotes, starts)
    closes = quotes[np.maximum(np.searchsorted(quotes, ends) - 1, 0)] == ends - 1 if quotes.size else quoted
    fail_where(flag_rows(elem_rows[np.where(quoted, (quotes_inside != 2) | ~closes, quotes_inside != 0)], n),
               syntax + ": a quote inside an element")  # fmt: skip
    content_start = starts + quoted
    content_len = ends - quoted - content_start
    is_null = ~quoted & (content_len == 4)
    if is_null.any():
        candidates = np.flatnonzero(is_null)
        word = data[content_start[candidates, None] + np.arange(4)] & 0xDF  # ASCII upper case
        is_null[candidates] = (word == _NULL).all(axis=1)
    content_len = np.where(is_null, 0, content_len)
    index = gather_index(content_start, content_len)
    if escaping.size:
        content_len = content_len - (np.searchsorted(escaping, content_start + content_len)
                                     - np.searchsorted(escaping, content_start))  # fmt: skip
        escaping_byte = np.zeros(data.size, dtype=bool)
        escaping_byte[escaping] = True
        index = index[~escaping_byte[index]]
    element_offsets = np.zeros(content_len.size + 1, dtype=np.int64)
    np.cumsum(content_len, out=element_offsets[1:])
    elements = binary_from_parts(element_offsets, data[index], ~is_null)

    counts = _text_counts(n, t.dimensions, mark_rows[char == _OPEN], opening, opening_depth, left[element])
    return nest(raw, t, elements, counts, elem_rows, convert_elements)


def _text_counts(
    n: int, dims: int, opening_rows: np.ndarray, opening: np.ndarray, opening_depth: np.ndarray,
    element_marks: np.ndarray,
) -> list[np.ndarray]:
    """Children per list at each level: a child's parent is the last opening brace one level up."""
    counts = []
    level = [opening_depth == k for k in range(1, dims + 1)]
    for k in range(dims):
        parents = opening[level[k]]
        children = opening[level[k + 1]] if k + 1 < dims else element_marks
        per_parent = np.bincount(np.searchsorted(parents, children, side="right") - 1, minlength=parents.size)
        if k == 0:
            per_row = np.zeros(n, dtype=np.int64)
            per_row[opening_rows[level[0]]] = per_parent
            counts.append(per_row)
        else:
            counts.append(per_parent)
    return counts
