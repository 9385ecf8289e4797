"""Vectorized, bounds-checked reads over the messages of one batch.

A batch is one byte buffer plus ``starts`` / ``ends`` offsets per message (an
Arrow binary array seen through NumPy). A `Cursor` walks a group of messages of
the same type field by field: every read is one NumPy operation over all the
messages of the group, checked against each message's end. A message that fails
a check gets its first error recorded in the `BatchReader` and is ignored from
then on (its later reads are clipped into the buffer and their values
discarded), so decoding never raises, never reads out of bounds and never
allocates from a length it has not checked against the bytes that are there.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..errors import DecodeError
from .protocol import PG_EPOCH_OFFSET_US, TupleKind

# Spark's timestamp range, 0001-01-01 .. 9999-12-31 23:59:59.999999 UTC, in
# microseconds since PostgreSQL's epoch.
_TS_MIN = -62_135_596_800_000_000 - PG_EPOCH_OFFSET_US
_TS_MAX = 253_402_300_799_999_999 - PG_EPOCH_OFFSET_US


class ErrorCode(enum.IntEnum):
    """Why a message failed; the numbers ``a`` / ``b`` recorded with it fill the reason."""

    NEED = 1  # need a bytes, have b
    NO_NUL = 2  # string has no NUL terminator before the end of the message
    TRAILING = 3  # a bytes left after the last field
    EMPTY = 4
    NULL = 5
    UNKNOWN_TYPE = 6  # a = type byte
    BAD_MARKER = 7  # a = byte found, text = what was expected
    BAD_KIND = 8  # a = kind byte
    NEGATIVE_LENGTH = 9  # a = length
    TOO_MANY = 10  # a = count, b = bytes left
    OUT_OF_RANGE = 11  # text = what
    BAD_UTF8 = 12
    BAD_FRAME = 13  # XLogData framing shorter than its header
    STREAM_STATE = 14  # text = why
    BAD_LENGTH = 15  # a = message length, text = the lengths allowed


def _byte(value: int) -> str:
    char = chr(value)
    return f"'{char}' (0x{value:02x})" if 32 < value < 127 else f"0x{value:02x}"


def format_reason(code: int, offset: int, a: int, b: int, text: str | None) -> str:
    """Turn a recorded error into the human-readable reason of a `DecodeError`."""
    code = ErrorCode(code)
    if code is ErrorCode.NEED:
        return f"need {a} bytes at offset {offset}, have {max(b, 0)}"
    if code is ErrorCode.NO_NUL:
        return f"string at offset {offset} has no NUL terminator before the message ends at offset {b}"
    if code is ErrorCode.TRAILING:
        return f"{a} trailing bytes at offset {offset} after the last field"
    if code is ErrorCode.EMPTY:
        return "empty message: no type byte"
    if code is ErrorCode.NULL:
        return "message data is NULL"
    if code is ErrorCode.UNKNOWN_TYPE:
        return f"unknown message type byte {_byte(a)} at offset {offset}"
    if code is ErrorCode.BAD_MARKER:
        return f"expected {text} at offset {offset}, got {_byte(a)}"
    if code is ErrorCode.BAD_KIND:
        return f"unknown tuple value kind {_byte(a)} at offset {offset} (expected 'n', 'u', 't' or 'b')"
    if code is ErrorCode.NEGATIVE_LENGTH:
        return f"negative length {a} at offset {offset}"
    if code is ErrorCode.TOO_MANY:
        return f"{a} columns announced at offset {offset} but only {b} bytes follow"
    if code is ErrorCode.OUT_OF_RANGE:
        return f"value at offset {offset} out of range: {text}"
    if code is ErrorCode.BAD_UTF8:
        return f"string at offset {offset} is not valid UTF-8"
    if code is ErrorCode.BAD_FRAME:
        return f"XLogData frame needs {a} header bytes, have {b}"
    if code is ErrorCode.BAD_LENGTH:
        return f"message is {a} bytes long, expected {text}"
    return f"{text} (offset {offset})"


class BatchReader:
    """The buffer, message bounds and first error of every message of one batch."""

    def __init__(self, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        if buf.size < 8:  # keep clipped reads (up to 8 bytes wide) inside an allocation
            buf = np.concatenate([buf, np.zeros(8 - buf.size, dtype=np.uint8)])
        self.buf = buf
        self.last = buf.size - 1
        self.starts = starts.astype(np.int64, copy=False)
        self.ends = ends.astype(np.int64, copy=False)
        n = starts.size
        self.bad = np.zeros(n, dtype=bool)
        self.err_field = np.empty(n, dtype=object)
        self.err_code = np.zeros(n, dtype=np.int8)
        self.err_offset = np.zeros(n, dtype=np.int64)
        self.err_a = np.zeros(n, dtype=np.int64)
        self.err_b = np.zeros(n, dtype=np.int64)
        self.err_text = np.empty(n, dtype=object)
        self._views: dict[str, np.ndarray] = {}

    def fail(
        self,
        rows: np.ndarray,
        field: str,
        code: ErrorCode,
        pos: np.ndarray | int,
        a: np.ndarray | int = 0,
        b: np.ndarray | int = 0,
        text: str | None = None,
    ) -> None:
        """Record an error for ``rows`` (batch indices) that have none yet."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return
        fresh = ~self.bad[rows]
        if not fresh.all():
            rows = rows[fresh]
            pos = np.broadcast_to(pos, fresh.shape)[fresh]
            a = np.broadcast_to(a, fresh.shape)[fresh]
            b = np.broadcast_to(b, fresh.shape)[fresh]
        self.bad[rows] = True
        self.err_field[rows] = field
        self.err_code[rows] = code
        self.err_offset[rows] = pos - self.starts[rows]
        self.err_a[rows] = a
        self.err_b[rows] = b
        self.err_text[rows] = text

    def error(self, row: int, seq: int | None, lsn: int | None) -> DecodeError:
        """The `DecodeError` recorded for ``row``, labelled with its capture position."""
        field = self.err_field[row]
        offset = int(self.err_offset[row])
        return DecodeError(
            format_reason(self.err_code[row], offset, int(self.err_a[row]), int(self.err_b[row]),
                          self.err_text[row]),
            field=field, offset=offset, message_type=field.split(".", 1)[0], seq=seq, lsn=lsn,
        )

    def view(self, dtype: str) -> np.ndarray:
        """The buffer as overlapping big-endian integers: element i is read at byte i.

        A zero-copy strided view (one byte stride, unaligned), so one 1-D index
        reads a field at any position.
        """
        cached = self._views.get(dtype)
        if cached is None:
            width = np.dtype(dtype).itemsize
            cached = np.ndarray(shape=(self.buf.size - width + 1,), dtype=dtype, buffer=self.buf,
                                strides=(1,))
            self._views[dtype] = cached
        return cached

    def find_nul(self, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """Position of the first NUL in ``[start, end)`` per element, or ``end`` if none.

        Scans windows of bytes after each start (vectorized across elements),
        widening the window only for the elements not yet resolved; never
        reads past ``end``.
        """
        found = end.copy()
        todo = np.flatnonzero(start < end)
        width, offset = 32, 0
        while todo.size:
            base = start[todo] + offset
            index = base[:, None] + np.arange(width, dtype=np.int64)
            inside = index < end[todo][:, None]
            window = self.buf[np.minimum(index, self.last)]
            is_nul = (window == 0) & inside
            hit = is_nul.any(axis=1)
            found[todo[hit]] = base[hit] + is_nul[hit].argmax(axis=1)
            left = ~hit & inside[:, -1]
            todo = todo[left]
            offset += width
            width = min(width * 4, 1 << 16)
        return found

    def gather(self, starts: np.ndarray, lengths: np.ndarray, valid: np.ndarray) -> pa.BinaryArray:
        """The byte ranges ``[start, start + length)`` as a binary array (NULL where not valid).

        Lengths must already be checked against the message bounds. Ranges that
        follow each other in the buffer (the usual case: fields in message
        order) are cut out of the buffer by Arrow's ``take`` over a zero-copy
        view whose odd elements are the gaps between them; others are copied
        with a NumPy index.
        """
        lengths = np.where(valid, lengths, 0).astype(np.int64, copy=False)
        starts = np.where(valid, starts, 0).astype(np.int64, copy=False)
        n = starts.size
        validity = None if valid.all() else pa.array(valid)
        if n == 0:
            return pa.array([], type=pa.binary())
        if valid.any():
            # Elements without bytes sit at the previous element's end, so that a
            # sequence of ranges in buffer order stays monotonic.
            ends = starts + lengths
            carried = np.maximum.accumulate(np.where(valid, ends, 0))
            starts = np.where(valid, starts, np.concatenate([[0], carried[:-1]]))
            ends = starts + lengths
            if np.all(starts[1:] >= ends[:-1]) and ends[-1] <= self.buf.size:
                bounds = np.empty(2 * n, dtype=np.int64)
                bounds[0::2], bounds[1::2] = starts, ends
                offset_type, array_type = (np.int32, pa.binary()) if self.buf.size < _INT32_LIMIT \
                    else (np.int64, pa.large_binary())
                view = pa.Array.from_buffers(
                    array_type, 2 * n - 1,
                    [None, pa.py_buffer(bounds.astype(offset_type)), pa.py_buffer(self.buf)])
                picked = view.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int64), mask=None if
                                            validity is None else ~valid))
                return picked if picked.type == pa.binary() else picked.cast(pa.binary())
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        data = np.zeros(0, dtype=np.uint8)
        if total:
            index = np.repeat(starts - offsets[:-1], lengths)
            index += np.arange(total, dtype=np.int64)
            data = self.buf[index]
        if total >= _INT32_LIMIT:
            raise OverflowError("more than 2 GiB of values in one Arrow batch; lower "
                                "spark.sql.execution.arrow.maxRecordsPerBatch")
        return pa.Array.from_buffers(
            pa.binary(), n, [None if validity is None else validity.buffers()[1],
                             pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)],
            null_count=int(n - np.count_nonzero(valid)))


_INT32_LIMIT = 1 << 31


@dataclass
class TupleColumns:
    """One TupleData part for each message of a cursor, flattened column-major-free.

    ``offsets[i]:offsets[i+1]`` are message i's columns in ``kind`` /
    ``value_start`` / ``value_length``; ``present[i]`` says whether message i has
    this tuple at all.
    """

    present: np.ndarray
    offsets: np.ndarray
    kind: np.ndarray
    value_start: np.ndarray
    value_length: np.ndarray


class Cursor:
    """Reads the same field from a group of messages at once."""

    def __init__(self, reader: BatchReader, rows: np.ndarray, pos: np.ndarray, name: str) -> None:
        self.r = reader
        self.rows = rows
        self.pos = pos.astype(np.int64, copy=True)
        self.name = name

    def __len__(self) -> int:
        return self.rows.size

    @property
    def ok(self) -> np.ndarray:
        good: np.ndarray = ~self.r.bad[self.rows]
        return good

    def where(self, mask: np.ndarray) -> "Cursor":
        """A cursor over the messages selected by ``mask`` (positions copied)."""
        return Cursor(self.r, self.rows[mask], self.pos[mask], self.name)

    def _need(self, rows: np.ndarray, pos: np.ndarray, n: np.ndarray | int, field: str) -> None:
        have = self.r.ends[rows] - pos
        short = have < n
        if short.any():
            self.r.fail(rows[short], f"{self.name}.{field}", ErrorCode.NEED, pos[short],
                        np.broadcast_to(n, short.shape)[short], have[short])

    def _read(self, rows: np.ndarray, pos: np.ndarray, nbytes: int, dtype: str, field: str) -> np.ndarray:
        self._need(rows, pos, nbytes, field)
        values: np.ndarray = self.r.view(dtype)[np.minimum(pos, self.r.buf.size - nbytes)]
        return values

    def uint(self, nbytes: int, field: str) -> np.ndarray:
        """An unsigned big-endian integer of 1, 2 or 4 bytes, as int64."""
        dtype = {1: "u1", 2: ">u2", 4: ">u4"}[nbytes]
        value = self._read(self.rows, self.pos, nbytes, dtype, field).astype(np.int64)
        self.pos += nbytes
        return value

    def int32(self, field: str) -> np.ndarray:
        value = self._read(self.rows, self.pos, 4, ">i4", field).astype(np.int32)
        self.pos += 4
        return value

    def lsn(self, field: str) -> np.ndarray:
        """An XLogRecPtr: unsigned 64 bits, stored as int64 (above 2^63-1 is an error)."""
        value = self._read(self.rows, self.pos, 8, ">u8", field)
        high = value > np.uint64(np.iinfo(np.int64).max)
        if high.any():
            self.r.fail(self.rows[high], f"{self.name}.{field}", ErrorCode.OUT_OF_RANGE,
                        self.pos[high], text="LSN above 2^63-1")
        self.pos += 8
        return value.astype(np.int64)

    def timestamp(self, field: str) -> np.ndarray:
        """A TimestampTz (microseconds since 2000-01-01) as microseconds since 1970.

        These are server clock readings (commit, prepare, abort times); values
        outside Spark's timestamp range, years 0001 to 9999, are errors.
        """
        value = self._read(self.rows, self.pos, 8, ">i8", field).astype(np.int64)
        outside = (value < _TS_MIN) | (value > _TS_MAX)
        if outside.any():
            self.r.fail(self.rows[outside], f"{self.name}.{field}", ErrorCode.OUT_OF_RANGE,
                        self.pos[outside], text="timestamp outside years 0001..9999")
        self.pos += 8
        return np.where(outside, 0, value) + PG_EPOCH_OFFSET_US

    def cstring(self, field: str) -> tuple[np.ndarray, np.ndarray]:
        """A NUL-terminated string: (start, length) of its bytes, NUL excluded."""
        start = self.pos
        ends = self.r.ends[self.rows]
        at = self.r.find_nul(start, ends)
        missing = (at >= ends) & self.ok
        if missing.any():
            self.r.fail(self.rows[missing], f"{self.name}.{field}", ErrorCode.NO_NUL,
                        start[missing], b=(ends - self.r.starts[self.rows])[missing])
        at = np.where(at >= ends, start, at)
        self.pos = at + 1
        return start, at - start

    def expect(self, allowed: tuple[int, ...], field: str, expected: str) -> np.ndarray:
        """A one-byte marker that must be one of ``allowed``; returns the byte."""
        value = self._read(self.rows, self.pos, 1, "u1", field)
        wrong = ~np.isin(value, np.asarray(allowed, dtype=np.uint8))
        has_byte = self.r.ends[self.rows] > self.pos
        wrong &= has_byte
        if wrong.any():
            self.r.fail(self.rows[wrong], f"{self.name}.{field}", ErrorCode.BAD_MARKER,
                        self.pos[wrong], a=value[wrong].astype(np.int64), text=expected)
        self.pos += 1
        return value

    def peek_byte(self) -> np.ndarray:
        """The next byte without consuming it (0 where the message has ended)."""
        inside = self.pos < self.r.ends[self.rows]
        return np.where(inside, self.r.buf[np.minimum(self.pos, self.r.last)], 0)

    def tuple_data(self, field: str) -> TupleColumns:
        """A TupleData part: Int16 column count, then kind [+ Int32 length + bytes] per column."""
        ncols = self.uint(2, f"{field}.ncolumns")
        ends = self.r.ends[self.rows]
        left = ends - self.pos
        too_many = ncols > left  # every column takes at least its kind byte
        if too_many.any():
            self.r.fail(self.rows[too_many], f"{self.name}.{field}.ncolumns", ErrorCode.TOO_MANY,
                        self.pos[too_many] - 2, a=ncols[too_many], b=left[too_many])
        counts = np.where(self.ok, ncols, 0)
        offsets = np.zeros(counts.size + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        total = int(offsets[-1])
        kind = np.zeros(total, dtype=np.uint8)
        value_start = np.zeros(total, dtype=np.int64)
        value_length = np.full(total, -1, dtype=np.int64)
        active = np.flatnonzero(counts > 0)
        j = 0
        while active.size:
            rows = self.rows[active]
            pos = self.pos[active]
            path = f"{field}[{j}]"
            self._need(rows, pos, 1, f"{path}.kind")
            k = self.r.buf[np.minimum(pos, self.r.last)]
            sized = (k == TupleKind.TEXT) | (k == TupleKind.BINARY)
            unknown = ~sized & (k != TupleKind.NULL) & (k != TupleKind.UNCHANGED_TOAST)
            if unknown.any():
                self.r.fail(rows[unknown], f"{self.name}.{path}.kind", ErrorCode.BAD_KIND,
                            pos[unknown], a=k[unknown].astype(np.int64))
            step = np.ones(active.size, dtype=np.int64)
            length = np.full(active.size, -1, dtype=np.int64)
            s = np.flatnonzero(sized)
            if s.size:
                srows, spos = rows[s], pos[s] + 1
                slen = self._read(srows, spos, 4, ">i4", f"{path}.length").astype(np.int64)
                negative = slen < 0
                if negative.any():
                    self.r.fail(srows[negative], f"{self.name}.{path}.length",
                                ErrorCode.NEGATIVE_LENGTH, spos[negative], a=slen[negative])
                slen = np.maximum(slen, 0)
                self._need(srows, spos + 4, slen, f"{path}.value")
                length[s] = slen
                step[s] += 4 + slen
            element = offsets[active] + j
            kind[element] = k
            value_start[element] = pos + 5
            value_length[element] = length
            self.pos[active] = pos + step
            j += 1
            keep = ~self.r.bad[rows] & (counts[active] > j)
            active = active[keep]
        return TupleColumns(self.ok.copy(), offsets, kind, value_start, value_length)

    def expect_end(self) -> None:
        """Fail messages that have bytes left after their last field."""
        ends = self.r.ends[self.rows]
        extra = (self.pos < ends) & self.ok
        if extra.any():
            self.r.fail(self.rows[extra], f"{self.name}", ErrorCode.TRAILING, self.pos[extra],
                        a=(ends - self.pos)[extra])
