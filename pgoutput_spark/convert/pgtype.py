"""What a column is: `PgType`, and `resolve` from a Relation column plus Type messages."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import TypeConversionError
from .oids import ARRAY_ELEMENT, FIRST_GENBKI_OBJECT_ID, BuiltinArrayType, BuiltinType

__all__ = ["PgType", "resolve"]

_MAX_DIMENSIONS = 6  # PostgreSQL's MAXDIM
_BUILTIN_OIDS = frozenset(int(member) for member in BuiltinType)


@dataclass(frozen=True)
class PgType:
    """A column's type as the replication stream describes it.

    `oid` and `modifier` come from the Relation message (``atttypid``,
    ``atttypmod``). For a type that is not built in, `name` and `namespace`
    come from the Type message: for a domain that is the *base* type's name
    (pgoutput sends ``getBaseType``), and the namespace is ``""`` for
    ``pg_catalog``. Built-in OIDs leave both None.

    `dimensions` is the number of array dimensions the column's values have
    (1 for ``int[]``). PostgreSQL does not enforce it and pgoutput does not
    send it, so `resolve` assumes 1; a caller that knows better (a type
    override) sets it, and `arrow_type` nests lists that deep.
    """

    oid: int
    modifier: int = -1
    name: str | None = None
    namespace: str | None = None
    dimensions: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.dimensions <= _MAX_DIMENSIONS:
            raise ValueError(f"dimensions must be 1..{_MAX_DIMENSIONS}, got {self.dimensions}")

    @property
    def builtin(self) -> BuiltinType | BuiltinArrayType | None:
        """The built-in type whose text and binary forms this column's values use.

        The OID itself when it is built in; else, for a domain over a built-in
        type (namespace ``""``), the base type by name; else None (enums,
        composites, ranges, extension types, ...).
        """
        if self.oid in ARRAY_ELEMENT:
            return BuiltinArrayType(self.oid)
        if self.oid in _BUILTIN_OIDS:
            return BuiltinType(self.oid)
        if self.namespace == "" and self.name is not None:
            return BuiltinType.by_name(self.name) or BuiltinArrayType.by_name(self.name)
        return None

    @property
    def is_array(self) -> bool:
        return isinstance(self.builtin, BuiltinArrayType)

    def element(self) -> PgType:
        """The element type of an array type (same modifier: ``numeric(10,2)[]``)."""
        builtin = self.builtin
        if not isinstance(builtin, BuiltinArrayType):
            raise TypeError(f"{self.display_name} is not an array type")
        return PgType(int(builtin.element), self.modifier)

    @property
    def display_name(self) -> str:
        """``int4``, ``numeric(10,2)``, ``int4[]``, ``public.mood`` (for error messages)."""
        builtin = self.builtin
        if isinstance(builtin, BuiltinArrayType):
            return self.element().display_name + "[]" * self.dimensions
        if builtin is BuiltinType.NUMERIC and self.modifier >= 4:
            precision, scale = numeric_modifier(self.modifier)
            base = f"numeric({precision},{scale})"
        elif builtin is not None:
            base = builtin.typname
        elif self.name is not None:
            base = f"{self.namespace}.{self.name}" if self.namespace else self.name
        else:
            base = f"type {self.oid}"
        if builtin is not None and self.oid != builtin:
            return f"{base} (domain {self.oid})"
        return base


def numeric_modifier(modifier: int) -> tuple[int, int]:
    """(precision, scale) of a numeric ``atttypmod``; scale may be negative (PG 15+)."""
    value = modifier - 4
    precision = (value >> 16) & 0xFFFF
    scale = ((value & 0x7FF) ^ 1024) - 1024  # 11-bit two's complement
    return precision, scale


def resolve(type_oid: int, modifier: int, type_names: Mapping[int, tuple[str, str]]) -> PgType:
    """The `PgType` of a Relation column.

    `type_names` maps the OIDs of the capture's Type messages to (namespace,
    name). A built-in OID needs no entry; any other OID must have one, since
    pgoutput sends a Type message before the first Relation that uses it.
    """
    if type_oid in type_names and type_oid >= FIRST_GENBKI_OBJECT_ID:
        namespace, name = type_names[type_oid]
        return PgType(type_oid, modifier, name, namespace)
    if type_oid < FIRST_GENBKI_OBJECT_ID:
        # Built in: known ones convert, the rest (point, tsvector, ...) are text.
        return PgType(type_oid, modifier)
    raise TypeConversionError(
        "no Type message for this OID in the capture (pgoutput sends one before the"
        " first Relation that uses a non-built-in type: does the capture start mid-stream?)",
        type_name=f"type {type_oid}",
    )
