"""uuid -> string in the canonical lower-case 8-4-4-4-12 form PostgreSQL prints."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .codec import Codec, fixed_type
from .oids import BuiltinType
from .pgtype import PgType
from .raw import RawValues, fail_where, string_from_matrix

HEX_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_UUID = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
_HEX_COLUMNS = np.r_[0:8, 9:13, 14:18, 19:23, 24:36]
_DASHES = [8, 13, 18, 23]


def hex_pairs(matrix: np.ndarray) -> np.ndarray:
    """(n, w) bytes -> (n, 2w) lower-case hex digit characters."""
    out = np.empty((matrix.shape[0], matrix.shape[1] * 2), dtype=np.uint8)
    out[:, 0::2] = HEX_DIGITS[matrix >> 4]
    out[:, 1::2] = HEX_DIGITS[matrix & 0x0F]
    return out


def _uuid_text(raw: RawValues, t: PgType) -> pa.Array:
    """The text as it is, once every value is checked to be what `_UUID` matches: by its bytes'
    positions, in a 36-byte row per value (about half the time of an RE2 match per value). The
    first bad value is the one `convert` names (it bisects for it)."""
    strings = raw.as_string()
    reason = "uuid text must be 32 lower-case hex digits as 8-4-4-4-12"
    fail_where(raw.valid & (raw.lengths != 36), reason)
    chars = raw.fixed(36, "uuid text")  # the values end to end, one row each (NULL rows zero)
    digits = chars[:, _HEX_COLUMNS]
    good = ((((digits >= 48) & (digits <= 57)) | ((digits >= 97) & (digits <= 102))).all(axis=1)
            & (chars[:, _DASHES] == 45).all(axis=1))  # 0-9, a-f; '-'
    fail_where(raw.valid & ~good, reason)
    return strings


def _uuid_binary(raw: RawValues, t: PgType) -> pa.Array:
    chars = np.full((raw.n, 36), ord("-"), dtype=np.uint8)
    chars[:, _HEX_COLUMNS] = hex_pairs(raw.fixed(16, "uuid"))
    return string_from_matrix(chars, raw.valid)


CODECS: dict[int, Codec] = {
    BuiltinType.UUID: Codec(fixed_type(pa.string()), _uuid_text, _uuid_binary),
}
