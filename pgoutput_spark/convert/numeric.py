"""numeric and money.

``numeric(p, s)`` with 1 <= p <= 38 and 0 <= s <= p becomes ``decimal128(p, s)``;
any other numeric (unconstrained, p > 38, negative scale, s > p) becomes a
string holding PostgreSQL's exact text. The binary form (base-10000 digits)
is turned into that exact text with NumPy (one pass over the output
characters, no per-value loop); decimals are then cast from it by Arrow.

``money`` is ``decimal128(19, 2)``: binary is int64 cents, text is the
``lc_monetary`` form, which must have 2 fraction digits, '.' as decimal
point and ',' as grouping (C, POSIX, en_US.UTF-8 and alike).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .codec import Codec, fixed_type, matches, require_number
from .oids import BuiltinType
from .pgtype import PgType, numeric_modifier
from .raw import RawValues, fail_where, gather_index, primitive_array, string_from_parts

_NUMERIC_TEXT = r"^(-?[0-9]+(\.[0-9]+)?|NaN|-?Infinity)$"
_SPECIAL_TEXT = r"^(NaN|-?Infinity)$"

# numeric sign words of the binary form (numeric.c)
_POS, _NEG, _NAN, _PINF, _NINF = 0x0000, 0x4000, 0xC000, 0xD000, 0xF000
_SPECIALS = {_NAN: b"NaN", _PINF: b"Infinity", _NINF: b"-Infinity"}
_POW10 = np.array([1, 10, 100, 1000], dtype=np.int64)


def decimal_type(t: PgType) -> pa.Decimal128Type | None:
    """``decimal128(p, s)`` for a numeric modifier that fits one, else None (string)."""
    if t.modifier < 4:
        return None
    precision, scale = numeric_modifier(t.modifier)
    if 1 <= precision <= 38 and 0 <= scale <= precision:
        return pa.decimal128(precision, scale)
    return None


def _numeric_arrow_type(t: PgType) -> pa.DataType:
    return decimal_type(t) or pa.string()


def _to_decimal(raw: RawValues, text: pa.Array, decimal: pa.Decimal128Type, t: PgType) -> pa.Array:
    special = raw.valid & matches(text, _SPECIAL_TEXT)
    fail_where(
        special,
        f"{t.display_name} is stored as decimal({decimal.precision},{decimal.scale}), which has no"
        " NaN or Infinity: convert this column with a type override to string"
        " (target=pa.string(); tables.types: string) or double (pa.float64(); double) to keep such values",
    )
    return pc.cast(text, decimal)  # too many digits -> ArrowInvalid


def _numeric_text(raw: RawValues, t: PgType) -> pa.Array:
    strings = raw.as_string()
    require_number(raw, strings, _NUMERIC_TEXT, "numeric text must be a decimal number, NaN or [-]Infinity",
                   fraction=True, exponent=False, specials=True)
    decimal = decimal_type(t)
    return strings if decimal is None else _to_decimal(raw, strings, decimal, t)


def _numeric_binary(raw: RawValues, t: PgType) -> pa.Array:
    text = numeric_binary_to_text(raw)
    decimal = decimal_type(t)
    return text if decimal is None else _to_decimal(raw, text, decimal, t)


def numeric_as(raw: RawValues, t: PgType, target: pa.DataType, format: str) -> pa.Array:
    """A ``numeric`` column's values as ``target`` (a `tables.types` override): ``float64``, or
    ``decimal128(p, s)``, as PostgreSQL's casts ``::float8`` and ``::numeric(p, s)`` make them.

    From the exact text: a double is its nearest value (NaN and +-Infinity kept; out of a
    double's range: an error, as ``::float8``); a decimal is rounded to ``s`` fraction digits,
    half away from zero, and a value with more integer digits than ``p - s`` is an error
    (PostgreSQL: numeric field overflow), as is NaN or Infinity, which a decimal cannot hold.
    """
    if format == "text":
        text = raw.as_string()
        require_number(raw, text, _NUMERIC_TEXT, "numeric text must be a decimal number, NaN or [-]Infinity",
                       fraction=True, exponent=False, specials=True)
    else:
        text = numeric_binary_to_text(raw)
    special = raw.valid & matches(text, _SPECIAL_TEXT)
    if pa.types.is_floating(target):
        out = pc.cast(text, target)
        fail_where(raw.valid & ~special & np.asarray(pc.fill_null(pc.is_inf(out), False)),
                   f"the value is out of range for {target} (tables.types: double)")
        return out
    precision, scale = target.precision, target.scale
    fail_where(special, f"{t.display_name} is converted to decimal({precision},{scale}) (tables.types), which has"
                        " no NaN or Infinity: use string or double for this column")  # fmt: skip
    # One fraction digit past the scale decides the rounding: cut the rest, round, check the range.
    digits = pc.replace_substring_regex(text, rf"^(-?[0-9]+\.[0-9]{{0,{scale + 1}}})[0-9]*$", r"\1")
    wide = (pa.decimal128 if precision + 2 <= 38 else pa.decimal256)(precision + 2, scale + 1)
    try:
        rounded = pc.round(pc.cast(digits, wide), ndigits=scale, round_mode="half_towards_infinity")
        return pc.cast(rounded, target)
    except pa.ArrowInvalid as error:  # bisected to the value by `convert`
        raise pa.ArrowInvalid(f"the value does not fit decimal({precision},{scale}) (tables.types; "
                              f"PostgreSQL's numeric({precision},{scale}) would overflow too): {error}") from error


def numeric_binary_to_text(raw: RawValues) -> pa.StringArray:
    """PostgreSQL's ``numeric_out`` text of binary numerics, vectorized.

    Binary layout: int16 ndigits, int16 weight, uint16 sign, int16 dscale,
    then ndigits int16 base-10000 digits; value = sum(d[i] * 10000^(weight-i)),
    printed with dscale fraction digits.
    """
    valid = raw.valid
    fail_where(valid & (raw.lengths < 8), "numeric must be at least 8 bytes")
    ndigits = np.where(valid, raw.read(0, ">i2"), 0).astype(np.int64)
    weight = raw.read(2, ">i2").astype(np.int64)
    sign = raw.read(4, ">u2").astype(np.int64)
    dscale = raw.read(6, ">i2").astype(np.int64)
    fail_where(valid & ((ndigits < 0) | (raw.lengths != 8 + 2 * ndigits)),
               "numeric length does not match its digit count")  # fmt: skip
    fail_where(valid & ~np.isin(sign, (_POS, _NEG, _NAN, _PINF, _NINF)), "numeric has an invalid sign word")
    fail_where(valid & (dscale < 0), "numeric has a negative display scale")
    special = valid & np.isin(sign, (_NAN, _PINF, _NINF))
    finite = valid & ~special
    ndigits = np.where(finite, ndigits, 0)

    group_offsets = np.zeros(raw.n + 1, dtype=np.int64)
    np.cumsum(ndigits, out=group_offsets[1:])
    group_bytes = raw.data[gather_index(raw.starts + 8, 2 * ndigits)] if group_offsets[-1] else np.zeros(0, np.uint8)
    groups = group_bytes.view(">i2").astype(np.int64)
    owner_of_group = np.repeat(np.arange(raw.n), ndigits)
    fail_where(np.bincount(owner_of_group[(groups < 0) | (groups > 9999)], minlength=raw.n) > 0,
               "numeric digit outside 0..9999")  # fmt: skip

    last = max(groups.size - 1, 0)
    first = np.where(ndigits > 0, groups[np.minimum(group_offsets[:-1], last)], 0) if groups.size else ndigits
    first_len = 1 + (first >= 10) + (first >= 100) + (first >= 1000)
    int_len = np.where((ndigits > 0) & (weight >= 0), first_len + 4 * np.maximum(weight, 0), 1)
    negative = finite & (sign == _NEG)
    finite_len = negative + int_len + np.where(dscale > 0, 1 + dscale, 0)
    special_len = np.select([sign == _NAN, sign == _PINF, sign == _NINF], [3, 8, 9], 0)
    length = np.where(finite, finite_len, np.where(special, special_len, 0))

    offsets = np.zeros(raw.n + 1, dtype=np.int64)
    np.cumsum(length, out=offsets[1:])
    owner = np.repeat(np.arange(raw.n), length)
    j = np.arange(int(offsets[-1]), dtype=np.int64) - offsets[owner]
    jj = j - negative[owner]
    il = int_len[owner]
    in_int = (jj >= 0) & (jj < il)
    exponent = np.where(in_int, il - 1 - jj, il - jj)  # fraction digit q = jj - il -> exponent -q
    gi = weight[owner] - np.floor_divide(exponent, 4)
    present = (gi >= 0) & (gi < ndigits[owner])
    if groups.size:
        group = np.where(present, groups[np.clip(group_offsets[owner] + gi, 0, last)], 0)
    else:
        group = np.zeros(owner.size, dtype=np.int64)
    digit = (group // _POW10[np.mod(exponent, 4)]) % 10
    chars = (ord("0") + digit).astype(np.uint8)
    chars[jj < 0] = ord("-")
    chars[jj == il] = ord(".")

    special_chars = special[owner]
    if special_chars.any():
        table = np.zeros((3, 9), dtype=np.uint8)
        for row, code in enumerate((_NAN, _PINF, _NINF)):
            word = np.frombuffer(_SPECIALS[code], dtype=np.uint8)
            table[row, : word.size] = word
        which = np.select([sign == _NAN, sign == _PINF], [0, 1], 2)
        chars[special_chars] = table[which[owner[special_chars]], j[special_chars]]
    return string_from_parts(offsets, chars, valid)


# -- money -------------------------------------------------------------------------

_MONEY = (
    r"^(?P<open>\()?(?P<sign1>-)?\$?(?P<sign2>-)?(?P<units>[0-9]{1,3}(?:,[0-9]{3})*)"
    r"\.(?P<cents>[0-9]{2})\$?(?P<sign3>-)?(?P<close>\))?$"
)
MONEY_TYPE = pa.decimal128(19, 2)


def _money_text(raw: RawValues, t: PgType) -> pa.Array:
    strings = pc.replace_substring(raw.as_string(), " ", "")
    parts = pc.extract_regex(strings, _MONEY)
    bad = raw.valid & np.asarray(pc.is_null(parts).to_numpy(zero_copy_only=False), dtype=bool)
    opened = _flag(parts, "open")
    bad |= raw.valid & (opened != _flag(parts, "close"))
    fail_where(bad, "money text must look like $1,234.56, -$1.00 or ($1.00): the capture's"
                    " lc_monetary must use 2 fraction digits, '.' and ',' (e.g. C or en_US.UTF-8)")  # fmt: skip
    units = pc.replace_substring(pc.struct_field(parts, "units"), ",", "")
    amount = pc.cast(pc.binary_join_element_wise(units, pc.struct_field(parts, "cents"), "."), MONEY_TYPE)
    negative = opened | _flag(parts, "sign1") | _flag(parts, "sign2") | _flag(parts, "sign3")
    return pc.if_else(pa.array(negative), pc.negate(amount), amount)


def _flag(parts: pa.StructArray, name: str) -> np.ndarray:
    field = pc.fill_null(pc.not_equal(pc.struct_field(parts, name), ""), False)
    return np.asarray(field.to_numpy(zero_copy_only=False), dtype=bool)


def cents_to_decimal(cents: np.ndarray, valid: np.ndarray, type_: pa.Decimal128Type) -> pa.Array:
    """A decimal128 array whose unscaled values are `cents` (int64), no arithmetic."""
    words = np.empty((cents.size, 2), dtype="<i8")
    words[:, 0] = cents
    words[:, 1] = cents >> 63  # sign extension to 128 bits
    return primitive_array(type_, words.reshape(-1), valid)


def _money_binary(raw: RawValues, t: PgType) -> pa.Array:
    cents = raw.fixed(8, "money").view(">i8").reshape(-1).astype(np.int64)
    return cents_to_decimal(cents, raw.valid, MONEY_TYPE)


CODECS: dict[int, Codec] = {
    BuiltinType.NUMERIC: Codec(
        _numeric_arrow_type, _numeric_text, _numeric_binary,
        binary_as_text=lambda raw, t: numeric_binary_to_text(raw),
    ),
    BuiltinType.MONEY: Codec(fixed_type(MONEY_TYPE), _money_text, _money_binary),
}
