"""`arrow_type` and `convert`: pick the type family's codec and run it on a batch.

Converters are vectorized and fail as a whole; `convert` turns a failure into
a `TypeConversionError` naming the first bad value. A converter that found a
bad value itself says which (`ValueFailure`); when pyarrow raised instead (a
cast that overflowed, invalid UTF-8, ...) any value may be the culprit. Either
way the first failing value is then found by bisection over slices of the
batch, which costs about two more conversions and only happens on the error
path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import pyarrow as pa

from ..config import type_override
from ..errors import ConfigError, TypeConversionError
from . import bits, bytea, dates, interval, network, numbers, numeric, strings, times, uuid
from .array_binary import binary_arrays
from .arrays import text_arrays
from .codec import Codec
from .oids import BuiltinArrayType, BuiltinType
from .pgtype import PgType
from .raw import RawValues, ValueFailure

__all__ = ["ARROW_ERRORS", "arrow_type", "convert", "first_failure", "override_type", "text_type", "widens"]

Format = Literal["text", "binary"]
Run = Callable[[pa.Array], pa.Array]

CODECS: dict[int, Codec] = {
    **numbers.CODECS, **numeric.CODECS, **strings.CODECS, **bytea.CODECS, **uuid.CODECS,
    **network.CODECS, **bits.CODECS, **dates.CODECS, **times.CODECS, **interval.CODECS,
}  # fmt: skip

# what pyarrow raises for a value it can't cast (overflow, bad digits, invalid UTF-8, ...)
ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError)


def _codec(t: PgType) -> Codec:
    builtin = t.builtin
    if builtin is None or isinstance(builtin, BuiltinArrayType):
        return strings.UNKNOWN
    return CODECS.get(int(builtin), strings.UNKNOWN)


def arrow_type(t: PgType) -> pa.DataType:
    """The Arrow type `convert` produces for a column of type `t` (see docs/types.md)."""
    if t.is_array:
        result = arrow_type(t.element())
        for _ in range(t.dimensions):
            result = pa.list_(result)
        return result
    return _codec(t).arrow_type(t)


def text_type(t: PgType) -> pa.DataType:
    """The Arrow type of the column kept as PostgreSQL's text: string, or nested lists of it for arrays."""
    result: pa.DataType = pa.string()
    if t.is_array:
        for _ in range(t.dimensions):
            result = pa.list_(result)
    return result


_INTEGERS = [pa.int8(), pa.int16(), pa.int32(), pa.int64()]
_INTEGER_DIGITS = {pa.int8(): 3, pa.int16(): 5, pa.int32(): 10, pa.int64(): 20}


def widens(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether every value of type ``old`` is one of type ``new`` without loss, as Delta's type
    widening allows: a smaller integer to a larger one or to a decimal with room for its digits,
    float to double, a decimal to one with as many digits on each side of the point or more;
    an array to one whose elements widen."""
    if old == new:
        return True
    if pa.types.is_list(old) and pa.types.is_list(new):
        return widens(old.value_type, new.value_type)
    if old in _INTEGERS and new in _INTEGERS:
        return _INTEGERS.index(old) < _INTEGERS.index(new)
    if old == pa.float32() and new == pa.float64():
        return True
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        return bool(new.scale >= old.scale and new.precision - new.scale >= old.precision - old.scale)
    if old in _INTEGERS and pa.types.is_decimal(new):
        return bool(new.precision - new.scale >= _INTEGER_DIGITS[old])
    return False


def convert(
    values: pa.Array,
    t: PgType,
    *,
    format: Format,
    target: pa.DataType | None = None,
) -> pa.Array:
    """Convert one column's raw values (``pa.binary()``, NULL = no value) to ``arrow_type(t)``.

    `format` is the wire format of the values (pgoutput ``binary`` option).
    `target` overrides the Arrow type: ``pa.string()`` (``list<string>`` for
    arrays) keeps PostgreSQL's text form, e.g. for a ``numeric(p, s)`` column
    holding NaN; in binary format only numeric and types that already map to
    strings support it. Raises `TypeConversionError` for the first value that
    does not convert.
    """
    if format not in ("text", "binary"):
        raise ConfigError(f"format must be 'text' or 'binary', got {format!r}")
    as_text = numeric_target = False
    if target is not None and target != arrow_type(t):
        if target == text_type(t):
            as_text = True
        elif _numeric(t) and (target == pa.float64() or pa.types.is_decimal128(target)):
            numeric_target = True
        else:
            raise ConfigError(
                f"unsupported target {target} for {t.display_name}: use {arrow_type(t)}"
                f" or {text_type(t)}" + (", float64 or decimal128(p, s)" if _numeric(t) else "")
            )
    result_type = target if target is not None else arrow_type(t)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not (pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)):
        raise TypeError(f"values must be a binary array, got {values.type}")
    if values.null_count == len(values):
        return pa.nulls(len(values), result_type)
    run = _converter(t, format, as_text) if not numeric_target else (
        lambda values: numeric.numeric_as(RawValues(values), t, result_type, format))
    try:
        return run(values)
    except ValueFailure as failure:
        suspect, reason = failure.index, failure.reason
    except ARROW_ERRORS as error:
        suspect, reason = len(values) - 1, str(error)
    index, reason = first_failure(run, values, suspect, reason)
    raise _error(t, format, values, index, reason)


def _numeric(t: PgType) -> bool:
    return not t.is_array and t.builtin == BuiltinType.NUMERIC


def override_type(override: str, t: PgType, where: str) -> pa.DataType:
    """The Arrow type of a column of type ``t`` under the ``tables.types`` override ``override``
    (`config.type_override`; ``where``: the column, for the error): ``string`` keeps PostgreSQL's text (lists
    of it for arrays); ``double`` and ``decimal(p, s)`` (1 <= p <= 38, 0 <= s <= p) apply to
    ``numeric`` columns, as PostgreSQL's ``::float8`` and ``::numeric(p, s)`` convert them."""
    match = type_override(override, f"tables.types: {where}")
    if override == "string":
        return text_type(t)
    if not _numeric(t):
        raise ConfigError(f"tables.types: {where} is {t.display_name}; {override} applies to numeric columns "
                          f"only (string applies to any)")
    if override == "double":
        return pa.float64()
    return pa.decimal128(int(match["p"]), int(match["s"]))


def _converter(t: PgType, format: Format, as_text: bool) -> Run:
    if t.is_array:
        elements = _elements_converter(format, as_text)
        arrays = text_arrays if format == "text" else binary_arrays
        return lambda values: arrays(RawValues(values), t, elements)
    codec = _codec(t)
    function: Callable[[RawValues, PgType], pa.Array]
    if as_text and format == "text":
        function = _as_text
    elif as_text:
        if codec.binary_as_text is not None:
            function = codec.binary_as_text
        elif codec.arrow_type(t) == pa.string():
            function = codec.binary
        else:
            raise ConfigError(
                f"a string target for {t.display_name} needs text format (pgoutput binary=false)"
            )
    else:
        function = codec.text if format == "text" else codec.binary
    return lambda values: function(RawValues(values), t)


def _as_text(raw: RawValues, t: PgType) -> pa.Array:
    return raw.as_string()


def _elements_converter(format: Format, as_text: bool) -> Callable[[pa.Array, PgType], pa.Array]:
    def convert_elements(elements: pa.Array, element_type: PgType) -> pa.Array:
        return convert(elements, element_type, format=format, target=pa.string() if as_text else None)

    return convert_elements


def first_failure(run: Run, values: pa.Array, suspect: int, reason: str) -> tuple[int, str]:
    """The first value at or before `suspect` whose conversion fails, and its error.

    Bisects over slices of ``values[: suspect + 1]`` (every check is per
    value, so a slice fails exactly when it holds a bad value).
    """

    def fails(start: int, length: int) -> str | None:
        part = values.slice(start, length)
        if part.null_count == length:  # as `convert`, which never runs a converter on NULLs alone
            return None
        try:
            run(part)
        except ValueFailure as failure:
            return failure.reason
        except ARROW_ERRORS as error:
            return str(error)
        return None

    low, high = 0, suspect + 1  # the first failure is in [low, high)
    while high - low > 1:
        middle = (low + high) // 2
        if fails(low, middle - low) is not None:
            high = middle
        else:
            low = middle
    alone = fails(low, 1)
    return (low, alone) if alone is not None else (suspect, reason)


def _error(t: PgType, format: Format, values: pa.Array, index: int, reason: str) -> TypeConversionError:
    value = values[index].as_py()  # a NULL never fails, so this is the value's bytes
    return TypeConversionError(reason, type_name=t.display_name, format=format, value=value, index=index)

