"""Built-in PostgreSQL type OIDs that the conversion layer knows (from ``pg_type.dat``).

`BuiltinType` members are named after ``pg_type.typname`` (upper-cased), so
``BuiltinType["INT4"]`` and ``BuiltinType.by_name("int4")`` agree with the
server; `ARRAY_ELEMENT` maps each array type to its element type
(``pg_type.typelem``). Tests check both tables against a live server.
"""

from __future__ import annotations

from enum import IntEnum


class BuiltinType(IntEnum):
    BOOL = 16
    BYTEA = 17
    CHAR = 18
    NAME = 19
    INT8 = 20
    INT2 = 21
    INT4 = 23
    TEXT = 25
    OID = 26
    JSON = 114
    XML = 142
    CIDR = 650
    FLOAT4 = 700
    FLOAT8 = 701
    MACADDR8 = 774
    MONEY = 790
    MACADDR = 829
    INET = 869
    BPCHAR = 1042
    VARCHAR = 1043
    DATE = 1082
    TIME = 1083
    TIMESTAMP = 1114
    TIMESTAMPTZ = 1184
    INTERVAL = 1186
    TIMETZ = 1266
    BIT = 1560
    VARBIT = 1562
    NUMERIC = 1700
    UUID = 2950
    JSONB = 3802

    @property
    def typname(self) -> str:
        return self.name.lower()

    @classmethod
    def by_name(cls, typname: str) -> BuiltinType | None:
        member = cls.__members__.get(typname.upper())
        return member if member is not None and member.typname == typname else None


class BuiltinArrayType(IntEnum):
    """Array types, named after their ``typname`` without the leading underscore."""

    BOOL = 1000
    BYTEA = 1001
    CHAR = 1002
    NAME = 1003
    INT2 = 1005
    INT4 = 1007
    TEXT = 1009
    BPCHAR = 1014
    VARCHAR = 1015
    INT8 = 1016
    FLOAT4 = 1021
    FLOAT8 = 1022
    OID = 1028
    MACADDR = 1040
    INET = 1041
    TIMESTAMP = 1115
    DATE = 1182
    TIME = 1183
    TIMESTAMPTZ = 1185
    INTERVAL = 1187
    NUMERIC = 1231
    TIMETZ = 1270
    BIT = 1561
    VARBIT = 1563
    UUID = 2951
    JSONB = 3807
    JSON = 199
    XML = 143
    MONEY = 791
    CIDR = 651
    MACADDR8 = 775

    @property
    def typname(self) -> str:
        return "_" + self.name.lower()

    @property
    def element(self) -> BuiltinType:
        return BuiltinType[self.name]

    @classmethod
    def by_name(cls, typname: str) -> BuiltinArrayType | None:
        if not typname.startswith("_"):
            return None
        member = cls.__members__.get(typname[1:].upper())
        return member if member is not None and member.typname == typname else None


ARRAY_ELEMENT: dict[int, BuiltinType] = {int(a): a.element for a in BuiltinArrayType}

# OIDs below this are assigned by initdb (genbki); pgoutput sends a Type
# message only for columns whose type OID is at or above it.
FIRST_GENBKI_OBJECT_ID = 10000
