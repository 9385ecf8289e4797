"""`Lsn`: a PostgreSQL WAL position (XLogRecPtr) as a value type."""

from __future__ import annotations

import re

_TEXT = re.compile(r"^\s*([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})\s*$")
MAX_LSN = (1 << 64) - 1


class Lsn(int):
    """An unsigned 64-bit WAL position that prints as PostgreSQL does (``0/16B3748``).

    It is an ``int`` (so it sorts, compares and stores as one) and parses from
    either an integer or the ``XXX/XXX`` text form.
    """

    __slots__ = ()

    def __new__(cls, value: int | str) -> "Lsn":
        if isinstance(value, str):
            match = _TEXT.match(value)
            if match is None:
                raise ValueError(f"can't parse LSN {value!r}: expected 'X/X' in hexadecimal")
            number = (int(match.group(1), 16) << 32) | int(match.group(2), 16)
        else:
            number = int(value)
        if not 0 <= number <= MAX_LSN:
            raise ValueError(f"LSN {number} out of range 0..2^64-1")
        return super().__new__(cls, number)

    def __str__(self) -> str:
        return f"{int(self) >> 32:X}/{int(self) & 0xFFFFFFFF:X}"

    def __repr__(self) -> str:
        return f"Lsn('{self}')"
