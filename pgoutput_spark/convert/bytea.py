"""bytea -> Arrow binary.

The binary form is the bytes. The text form is ``bytea_output``'s: ``hex``
(``\\x`` then two hex digits per byte) or ``escape`` (printable bytes as is,
``\\\\`` for a backslash, ``\\ooo`` octal for the rest). Both decode in one
NumPy pass over the batch's bytes; each value may use either form.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..decoder import kernel
from ..decoder.kernel import _jit
from .codec import Codec, fixed_type
from .oids import BuiltinType
from .pgtype import PgType
from .raw import (
    RawValues,
    binary_from_parts,
    byte_ranges,
    escaping_backslashes,
    fail_where,
    flag_rows,
    rows_of,
)

_BACKSLASH = ord("\\")

_HEX = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
    _HEX[ord(chr(_c).upper())] = _i


def _bytea_text(raw: RawValues, t: PgType) -> pa.Array:
    offsets, data = raw.compact()
    head = np.minimum(offsets[:-1], max(data.size - 2, 0))
    hex_value = raw.valid & (raw.lengths >= 2)
    if data.size:
        hex_value &= (data[head] == _BACKSLASH) & (data[head + 1] == ord("x"))
    escape_value = raw.valid & ~hex_value
    hex_part = _hex(raw, offsets, data, hex_value) if hex_value.any() else None
    escape_part = _escape(raw, offsets, data, escape_value) if escape_value.any() else None
    if hex_part is None or escape_part is None:
        result = hex_part if hex_part is not None else escape_part
        assert result is not None  # some value is valid: convert returns early otherwise
        return result
    return pc.coalesce(hex_part, escape_part)


def _hex(raw: RawValues, offsets: np.ndarray, data: np.ndarray, rows: np.ndarray) -> pa.Array:
    """``\\x`` then two hex digits per byte, for the values in `rows`."""
    fail_where(rows & (raw.lengths % 2 == 1), "bytea hex text has an odd number of digits")
    payload_start = np.where(rows, offsets[:-1] + 2, offsets[:-1])
    payload_len = np.where(rows, raw.lengths - 2, 0)
    out_offsets = np.zeros(raw.n + 1, dtype=np.int64)
    np.cumsum(payload_len // 2, out=out_offsets[1:])
    if kernel.numba is not None:
        out = np.empty(int(out_offsets[-1]), dtype=np.uint8)
        bad = np.zeros(raw.n, dtype=bool)
        _hex_walk(data, payload_start, out_offsets, _HEX, out, bad)
        fail_where(bad, "bytea hex text has a non-hex digit")
        return binary_from_parts(out_offsets, out, rows)
    digits = _HEX[data[byte_ranges(data.size, payload_start, payload_len)]]
    if (digits == 255).any():
        bad = flag_rows(rows_of(np.flatnonzero(byte_ranges(data.size, payload_start, payload_len))[digits == 255],
                                offsets), raw.n)  # fmt: skip
        fail_where(bad, "bytea hex text has a non-hex digit")
    pairs = digits.reshape(-1, 2)
    return binary_from_parts(out_offsets, (pairs[:, 0] << 4) | pairs[:, 1], rows)


@_jit
def _hex_walk(data, starts, out_offsets, table, out, bad):  # pragma: no cover - compiled
    """`_hex` value by value: the digit pairs from ``data[starts[i]]`` into ``out`` from
    ``out_offsets[i]``; ``bad[i]`` where a value has a byte ``table`` does not map (255)."""
    for i in range(starts.size):
        p = starts[i]
        for o in range(out_offsets[i], out_offsets[i + 1]):
            high, low = table[data[p]], table[data[p + 1]]
            if high == 255 or low == 255:
                bad[i] = True
                break
            out[o] = (high << 4) | low
            p += 2


def _escape(raw: RawValues, offsets: np.ndarray, data: np.ndarray, rows: np.ndarray) -> pa.Array:
    """Printable bytes as is, ``\\\\`` for a backslash, ``\\ooo`` for any byte, for the values in `rows`."""
    bad_escape = "bytea escape text has a backslash not followed by \\ or three octal digits"
    keep = byte_ranges(data.size, offsets[:-1], np.where(rows, raw.lengths, 0))
    value = data.copy()
    escaping = escaping_backslashes(data, offsets)
    escaping = escaping[keep[escaping]]
    if escaping.size:
        owner = rows_of(escaping, offsets)
        room = offsets[owner + 1] - escaping - 1  # bytes after the backslash in its value
        nxt = data[np.minimum(escaping + 1, data.size - 1)]
        pair = (room >= 1) & (nxt == _BACKSLASH)
        octal = escaping[~pair]
        fail_where(flag_rows(owner[~pair][room[~pair] < 3], raw.n), bad_escape)
        digits = data[octal[:, None] + np.arange(1, 4)].astype(np.int64) - ord("0")
        fail_where(flag_rows(owner[~pair][((digits < 0) | (digits > 7)).any(axis=1) | (digits[:, 0] > 3)], raw.n),
                   bad_escape)  # fmt: skip
        value[octal] = digits @ np.array([64, 8, 1])
        keep[escaping[pair] + 1] = False
        for k in (1, 2, 3):
            keep[octal + k] = False
    out_len = np.bincount(rows_of(np.flatnonzero(keep), offsets), minlength=raw.n)
    out_offsets = np.zeros(raw.n + 1, dtype=np.int64)
    np.cumsum(np.where(rows, out_len, 0), out=out_offsets[1:])
    return binary_from_parts(out_offsets, value[keep], rows)


def _bytea_binary(raw: RawValues, t: PgType) -> pa.Array:
    return raw.as_binary()


CODECS: dict[int, Codec] = {
    BuiltinType.BYTEA: Codec(fixed_type(pa.binary()), _bytea_text, _bytea_binary),
}
