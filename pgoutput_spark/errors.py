"""The exception tree of pgoutput_spark.

Every error the package raises on purpose derives from `PgoutputSparkError`, so
callers (jobs, Airflow tasks, notebooks) can catch one type.
"""

from __future__ import annotations

from typing import Any

from .lsn import Lsn


class PgoutputSparkError(Exception):
    """Base class of all errors raised by pgoutput_spark."""


class ConfigError(PgoutputSparkError):
    """A configuration value, option or argument is invalid."""


class SparkStartError(PgoutputSparkError):
    """Spark's JVM did not start: no Java, or a Java that this Spark does not run on."""


class CaptureError(PgoutputSparkError):
    """A capture table does not follow the capture contract."""


class DecodeError(PgoutputSparkError):
    """A pgoutput message could not be decoded.

    Carries where the message sits in the capture (`seq`, `lsn`), which message
    type it claimed to be, the field path that failed
    (``Insert.new_tuple[3].length``), the byte offset in the message and a
    reason. ``str()`` gives one line that names all of them::

        Insert.new_tuple[3].length at seq 1042 (lsn 0/16B3748): need 4 bytes at offset 17, have 2
    """

    def __init__(
        self,
        reason: str,
        *,
        field: str,
        offset: int,
        message_type: str | None = None,
        seq: int | None = None,
        lsn: int | None = None,
    ) -> None:
        self.reason = reason
        self.field = field
        self.offset = offset
        self.message_type = message_type
        self.seq = seq
        self.lsn = lsn
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        if self.seq is not None:
            where.append(f"seq {self.seq}")
        if self.lsn is not None:
            where.append(f"(lsn {Lsn(self.lsn)})")
        head = self.field + (f" at {' '.join(where)}" if where else "")
        return f"{head}: {self.reason}" if head else self.reason  # the whole line, recovered from a task

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:  # keep the fields when Spark pickles the error
        return (
            _rebuild_decode_error,
            (self.reason, self.field, self.offset, self.message_type, self.seq, self.lsn),
        )


def _rebuild_decode_error(reason: str, field: str, offset: int, message_type: str | None, seq: int | None,
                          lsn: int | None) -> DecodeError:
    return DecodeError(
        reason, field=field, offset=offset, message_type=message_type, seq=seq, lsn=lsn
    )


class StreamStateError(DecodeError):
    """Stream Start / Stream Stop messages do not alternate in the capture."""


class TypeConversionError(PgoutputSparkError):
    """A column value could not be converted to its Arrow type.

    Carries the PostgreSQL type (``type_name``, e.g. ``numeric(10,2)``), the
    wire format (``text`` / ``binary``), the index of the value in the array
    being converted, the raw value and a reason. ``str()`` gives one line::

        can't convert text value '2024-13-01' at index 3 to date: month 13 out of range

    ``value`` is None (and ``index`` too) when the failure concerns the type
    itself rather than one value, e.g. a type OID with no Type message. A
    caller that adds context (the table and column) may pass only a reason.
    """

    MAX_SHOWN = 80

    def __init__(
        self,
        reason: str,
        *,
        type_name: str | None = None,
        format: str | None = None,
        value: bytes | None = None,
        index: int | None = None,
    ) -> None:
        self.reason = reason
        self.type_name = type_name
        self.format = format
        self.value = value
        self.index = index
        super().__init__(self._format())

    @classmethod
    def show(cls, value: bytes) -> str:
        """`value` for a message: the text when it is UTF-8, else the bytes; truncated."""
        try:
            shown = repr(value.decode("utf-8"))
        except UnicodeDecodeError:
            shown = repr(value)
        if len(shown) > cls.MAX_SHOWN:
            shown = shown[: cls.MAX_SHOWN - 3] + "..."
        return shown

    def _format(self) -> str:
        if self.type_name is None:
            return self.reason
        if self.value is None:
            return f"can't convert {self.type_name}: {self.reason}"
        fmt = f"{self.format} " if self.format else ""
        at = f" at index {self.index}" if self.index is not None else ""
        return f"can't convert {fmt}value {self.show(self.value)}{at} to {self.type_name}: {self.reason}"

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:  # keep the fields when Spark pickles the error
        return (
            _rebuild_type_conversion_error,
            (self.reason, self.type_name, self.format, self.value, self.index),
        )


def _rebuild_type_conversion_error(reason: str, type_name: str | None, format: str | None, value: bytes | None,
                                   index: int | None) -> TypeConversionError:
    return TypeConversionError(reason, type_name=type_name, format=format, value=value, index=index)
