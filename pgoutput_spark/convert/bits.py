"""bit, varbit -> strings of '0' and '1' as PostgreSQL prints them.

Binary form: int32 bit count, then the bits packed most significant first,
padded to whole bytes. Decoded with ``numpy.unpackbits`` over the batch.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .codec import Codec, fixed_type, require_match
from .oids import BuiltinType
from .pgtype import PgType
from .raw import RawValues, fail_where, gather_index, string_from_parts


def _bits_text(raw: RawValues, t: PgType) -> pa.Array:
    strings = raw.as_string()
    require_match(raw, strings, r"^[01]*$", f"{t.display_name} text must be 0s and 1s")
    return strings


def _bits_binary(raw: RawValues, t: PgType) -> pa.Array:
    valid = raw.valid
    fail_where(valid & (raw.lengths < 4), "bit string is shorter than its 4-byte length")
    nbits = np.where(valid, raw.read(0, ">i4"), 0).astype(np.int64)
    fail_where(nbits < 0, "bit string has a negative length")
    nbytes = (nbits + 7) // 8
    fail_where(valid & (raw.lengths != 4 + nbytes), "bit string length does not match its bit count")
    payload = raw.data[gather_index(raw.starts + 4, nbytes)] if nbytes.sum() else np.zeros(0, np.uint8)
    bits = np.unpackbits(payload)
    owner = np.repeat(np.arange(raw.n), nbytes * 8)
    in_value = np.arange(bits.size) - np.repeat(np.cumsum(nbytes * 8) - nbytes * 8, nbytes * 8)
    keep = in_value < nbits[owner]
    offsets = np.zeros(raw.n + 1, dtype=np.int64)
    np.cumsum(nbits, out=offsets[1:])
    return string_from_parts(offsets, bits[keep] + ord("0"), valid)


CODECS: dict[int, Codec] = {
    oid: Codec(fixed_type(pa.string()), _bits_text, _bits_binary)
    for oid in (BuiltinType.BIT, BuiltinType.VARBIT)
}
