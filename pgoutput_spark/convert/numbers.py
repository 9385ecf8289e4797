"""bool, int2, int4, int8, oid, float4, float8.

Text forms are parsed with ``pyarrow.compute.cast`` after a regex check of the
shape PostgreSQL prints; binary forms are fixed-width big-endian values read
with one NumPy view.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .codec import Codec, fixed_type, require_match, require_number
from .oids import BuiltinType
from .pgtype import PgType
from .raw import RawValues, fail_where, primitive_array

_INTEGER = r"^-?[0-9]+$"
# float8out / float4out: shortest-exact digits (extra_float_digits >= 1), or
# %.*g with fewer digits; NaN, Infinity, -Infinity spelled out.
_FLOAT = r"^(-?[0-9]+(\.[0-9]+)?(e[-+][0-9]+)?|NaN|-?Infinity)$"


def _big_endian(raw: RawValues, dtype: str, what: str) -> np.ndarray:
    width = np.dtype(dtype).itemsize
    return raw.fixed(width, what).view(dtype).reshape(-1)


# -- bool --------------------------------------------------------------------------


def _bool_text(raw: RawValues, t: PgType) -> pa.Array:
    fail_where(raw.valid & (raw.lengths != 1), "bool text must be 't' or 'f'")
    byte = raw.fixed(1, "bool text")[:, 0]
    fail_where(raw.valid & (byte != ord("t")) & (byte != ord("f")), "bool text must be 't' or 'f'")
    return pa.array(byte == ord("t"), pa.bool_(), mask=~raw.valid)


def _bool_binary(raw: RawValues, t: PgType) -> pa.Array:
    byte = raw.fixed(1, "bool")[:, 0]
    fail_where(raw.valid & (byte > 1), "bool byte must be 0 or 1")
    return pa.array(byte == 1, pa.bool_(), mask=~raw.valid)


# -- integers ----------------------------------------------------------------------


def _integer_codec(arrow: pa.DataType, wire: str, what: str) -> Codec:
    def text(raw: RawValues, t: PgType) -> pa.Array:
        strings = raw.as_string()
        require_number(raw, strings, _INTEGER, f"{what} text must be digits with an optional '-'",
                       fraction=False, exponent=False, specials=False)
        return pc.cast(strings, arrow)  # out of range -> ArrowInvalid

    def binary(raw: RawValues, t: PgType) -> pa.Array:
        values = _big_endian(raw, wire, what)
        return primitive_array(arrow, values.astype(arrow.to_pandas_dtype()), raw.valid)

    return Codec(fixed_type(arrow), text, binary)


def _oid_text(raw: RawValues, t: PgType) -> pa.Array:
    strings = raw.as_string()
    require_match(raw, strings, r"^[0-9]{1,10}$", "oid text must be 1 to 10 digits")
    values = pc.cast(strings, pa.int64())
    too_big = np.asarray(pc.fill_null(pc.greater(values, 0xFFFFFFFF), False), dtype=bool)
    fail_where(too_big, "oid is above 4294967295")
    return values


# -- floats ------------------------------------------------------------------------


def _float_codec(arrow: pa.DataType, wire: str, what: str) -> Codec:
    def text(raw: RawValues, t: PgType) -> pa.Array:
        strings = raw.as_string()
        require_number(raw, strings, _FLOAT, f"{what} text must be a decimal number, NaN or [-]Infinity",
                       fraction=True, exponent=True, specials=True)
        return pc.cast(strings, arrow)

    def binary(raw: RawValues, t: PgType) -> pa.Array:
        values = _big_endian(raw, wire, what)
        return primitive_array(arrow, values.astype(arrow.to_pandas_dtype()), raw.valid)

    return Codec(fixed_type(arrow), text, binary)


CODECS: dict[int, Codec] = {
    BuiltinType.BOOL: Codec(fixed_type(pa.bool_()), _bool_text, _bool_binary),
    BuiltinType.INT2: _integer_codec(pa.int16(), ">i2", "int2"),
    BuiltinType.INT4: _integer_codec(pa.int32(), ">i4", "int4"),
    BuiltinType.INT8: _integer_codec(pa.int64(), ">i8", "int8"),
    BuiltinType.OID: Codec(
        fixed_type(pa.int64()), _oid_text, _integer_codec(pa.int64(), ">u4", "oid").binary
    ),
    BuiltinType.FLOAT4: _float_codec(pa.float32(), ">f4", "float4"),
    BuiltinType.FLOAT8: _float_codec(pa.float64(), ">f8", "float8"),
}
