"""pgoutput-spark: decode and apply PostgreSQL pgoutput captures with Spark.

The decoder (`decode_message`, `pgoutput_spark.decoder`) has no Spark import;
`decode` and `read_capture` are loaded lazily so that ``import pgoutput_spark``
stays cheap where Spark is not needed.
"""

from __future__ import annotations

from typing import Any

from .capture import CaptureColumns
from .decoder.messages import decode_message
from .errors import (
    CaptureError,
    ConfigError,
    DecodeError,
    PgoutputSparkError,
    StreamStateError,
)
from .lsn import Lsn

__all__ = [
    "CaptureColumns",
    "CaptureError",
    "ConfigError",
    "DecodeError",
    "Lsn",
    "PgoutputSparkError",
    "StreamStateError",
    "build_spark_session",
    "decode",
    "decode_message",
    "quarantined",
    "read_capture",
]


def __getattr__(name: str) -> Any:
    if name in ("decode", "quarantined"):
        from .spark import decode as module

        return getattr(module, name)
    if name == "read_capture":
        from .capture import read_capture

        return read_capture
    if name == "build_spark_session":
        from .spark.session import build_spark_session

        return build_spark_session
    raise AttributeError(name)
