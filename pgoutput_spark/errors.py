"""The exception tree of pgoutput_spark.

Every error the package raises on purpose derives from `PgoutputSparkError`, so
callers (jobs, Airflow tasks, notebooks) can catch one type.
"""

from __future__ import annotations

from .lsn import Lsn


class PgoutputSparkError(Exception):
    """Base class of all errors raised by pgoutput_spark."""


class ConfigError(PgoutputSparkError):
    """A configuration value, option or argument is invalid."""


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
        position = f" at {' '.join(where)}" if where else ""
        return f"{self.field}{position}: {self.reason}"

    def __reduce__(self):  # keep the fields when Spark pickles the error
        return (
            _rebuild_decode_error,
            (self.reason, self.field, self.offset, self.message_type, self.seq, self.lsn),
        )


def _rebuild_decode_error(reason, field, offset, message_type, seq, lsn):  # type: ignore[no-untyped-def]
    return DecodeError(
        reason, field=field, offset=offset, message_type=message_type, seq=seq, lsn=lsn
    )


class StreamStateError(DecodeError):
    """Stream Start / Stream Stop messages do not alternate in the capture."""
