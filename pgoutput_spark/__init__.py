"""pgoutput-spark: decode and apply PostgreSQL pgoutput captures with Spark.

The notebook API: `read_capture` (a capture as a DataFrame), `decode`
(decoded messages), `changes` (typed change DataFrames per table), `mirror`
(a mirror, now or as of a source LSN), `history` (a history table, or the
source as of any LSN from it), `status` (run history and consistent
read point), `decode_message` (one message, printed like the protocol docs).
They work in a Spark Connect session too; the jobs need a classic one
(`pgoutput_spark.spark.connect`).

The decoder (`decode_message`, `pgoutput_spark.decoder`) has no Spark import;
the Spark functions are loaded lazily so that ``import pgoutput_spark`` stays
cheap where Spark is not needed.
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
    SparkStartError,
    StreamStateError,
)
from .lsn import Lsn
from .version import __version__

__all__ = [
    "CaptureColumns",
    "CaptureError",
    "ConfigError",
    "DecodeError",
    "Lsn",
    "PgoutputSparkError",
    "SparkStartError",
    "StreamStateError",
    "__version__",
    "build_spark_session",
    "changes",
    "decode",
    "decode_message",
    "history",
    "mirror",
    "quarantined",
    "read_capture",
    "status",
]


def __getattr__(name: str) -> Any:
    if name in ("decode", "quarantined"):
        from .spark import decode as module

        return getattr(module, name)
    if name == "read_capture":
        from .capture import read_capture

        return read_capture
    if name in ("mirror", "history", "status"):
        from . import reading

        return getattr(reading, name)
    if name == "changes":
        from .spark.changes import change_frames

        return change_frames
    if name == "build_spark_session":
        from .spark.session import build_spark_session

        return build_spark_session
    raise AttributeError(name)
