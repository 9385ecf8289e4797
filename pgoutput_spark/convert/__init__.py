"""Convert column values of decoded pgoutput tuples to typed Arrow arrays.

No Spark import: pure pyarrow + NumPy, vectorized over a batch. The caller
derives Spark types from `arrow_type`. The mapping and its policies are in
``docs/types.md``::

    t = resolve(type_oid, type_modifier, type_names)     # from Relation / Type messages
    arrow_type(t)                                        # e.g. pa.decimal128(10, 2)
    convert(values, t, format="text")                    # pa.binary() -> arrow_type(t)
"""

from ..errors import TypeConversionError
from .dates import DATE_INFINITY, DATE_MINUS_INFINITY, TIMESTAMP_INFINITY, TIMESTAMP_MINUS_INFINITY
from .dispatch import arrow_type, convert, override_type, text_type, widens
from .interval import INTERVAL
from .oids import ARRAY_ELEMENT, BuiltinArrayType, BuiltinType
from .pgtype import PgType, resolve

__all__ = [
    "ARRAY_ELEMENT",
    "DATE_INFINITY",
    "DATE_MINUS_INFINITY",
    "INTERVAL",
    "TIMESTAMP_INFINITY",
    "TIMESTAMP_MINUS_INFINITY",
    "BuiltinArrayType",
    "BuiltinType",
    "PgType",
    "TypeConversionError",
    "arrow_type",
    "convert",
    "override_type",
    "resolve",
    "text_type",
    "widens",
]
