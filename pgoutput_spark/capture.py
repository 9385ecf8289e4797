"""The capture table contract, and reading captures from Parquet folders or Delta tables.

A capture holds one row per pgoutput message:

========  =========  ===========================================================
column    type       meaning
========  =========  ===========================================================
seq       BIGINT     strictly increasing position in the slot's stream (several
                     messages share an LSN, so the LSN cannot order them)
lsn       BIGINT     the LSN PostgreSQL reported for the message (or STRING as
                     PostgreSQL prints it, ``0/16B3748``)
data      BINARY     the pgoutput message, or the walsender's XLogData frame
                     (``w``, dataStart, walEnd, sendTime, message): the LSN is
                     then taken from dataStart
xid       BIGINT     optional: the xid PostgreSQL reported with the message (or
                     STRING, as PostgreSQL prints it)
========  =========  ===========================================================

Column names are configurable through `CaptureColumns`. A landing may hold a
message more than once (an at-least-once writer, a file landed twice): rows with
the same seq, LSN and bytes are one message (`one_row_per_message`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .errors import CaptureError

if TYPE_CHECKING:  # Spark is imported only where a DataFrame is touched
    from pyspark.sql import Column, DataFrame, SparkSession

CaptureFormat = Literal["auto", "parquet", "delta"]


@dataclass(frozen=True)
class CaptureColumns:
    """Names of the capture's columns (``xid=None``: the capture has no xid column)."""

    seq: str = "seq"
    lsn: str = "lsn"
    data: str = "data"
    xid: str | None = None

    def select(self, capture: DataFrame) -> DataFrame:
        """The capture's contract columns under their canonical names, type-checked."""
        from pyspark.sql import types as T

        fields = {f.name: f.dataType for f in capture.schema.fields}
        wanted = [("seq", self.seq, T.LongType), ("lsn", self.lsn, T.LongType),
                  ("data", self.data, T.BinaryType)]
        if self.xid is not None:
            wanted.append(("xid", self.xid, T.LongType))
        columns = []
        for canonical, actual, expected in wanted:
            if actual not in fields:
                raise CaptureError(
                    f"capture has no column {actual!r} (the {canonical} column); it has "
                    f"{sorted(fields)}: set the capture column names to match"
                )
            found = fields[actual]
            integral = (T.LongType, T.IntegerType, T.ShortType)
            if expected is T.LongType and isinstance(found, integral):
                columns.append(capture[actual].cast("bigint").alias(canonical))
            elif canonical in ("lsn", "xid") and isinstance(found, T.StringType):
                columns.append(_from_text(capture[actual], canonical, actual, capture[self.seq]).alias(canonical))
            elif isinstance(found, expected):
                columns.append(capture[actual].alias(canonical))
            else:
                raise CaptureError(
                    f"capture column {actual!r} (the {canonical} column) is "
                    f"{found.simpleString()}, expected {expected().simpleString()}"
                )
        return capture.select(*columns)


#: How a capture error found inside a Spark task (`_from_text`) starts, so that
#: `spark.session.spark_failure` can tell it from Spark's own errors.
TASK_CAPTURE_ERROR = "pgoutput-spark capture error: "


#: Text forms of the columns a capture may hold as PostgreSQL prints them: the pattern a value
#: must match, and what such a value is (for the error).
_TEXT_FORMS = {
    "lsn": ("^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$", "an LSN (two hexadecimal numbers, e.g. 0/16B3748)"),
    "xid": ("^[0-9]{1,10}$", "a transaction id (a decimal number)"),
}


def _from_text(text: Column, canonical: str, name: str, seq: Column) -> Column:
    """An LSN or xid column landed as PostgreSQL prints them (``0/16B3748``, ``736``: what
    ``pg_logical_slot_get_binary_changes`` returns as ``pg_lsn`` and ``xid`` and psycopg reads
    as strings), as a bigint. A value of another form fails the run naming the seq and the value."""
    from pyspark.sql import functions as F

    pattern, what = _TEXT_FORMS[canonical]
    if canonical == "lsn":
        parts = F.split(text, "/")
        value = F.conv(parts[0], 16, 10).cast("bigint") * F.lit(2**32) + F.conv(parts[1], 16, 10).cast("bigint")
    else:
        value = text.cast("bigint")
    bad = F.raise_error(F.concat(F.lit(f"{TASK_CAPTURE_ERROR}capture column {name!r} (the {canonical} column) holds '"),
                                 text, F.lit("' at seq "), seq.cast("string"), F.lit(f": not {what}")))
    return F.when(text.isNull(), F.lit(None).cast("bigint")).when(text.rlike(pattern), value).otherwise(
        bad.cast("bigint"))


def _hadoop(spark: SparkSession, path: str) -> tuple[Any, Any]:
    """``path`` as a Hadoop path, and its file system (any Spark reads)."""
    hadoop_path = spark.sparkContext._jvm.org.apache.hadoop.fs.Path(path)  # type: ignore[attr-defined]
    return hadoop_path, hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())  # type: ignore[attr-defined]


def _exists(spark: SparkSession, path: str) -> bool:
    """Whether ``path`` exists, on any file system Spark reads (Hadoop's)."""
    hadoop_path, fs = _hadoop(spark, path)
    return bool(fs.exists(hadoop_path))


def _is_delta(spark: SparkSession, path: str) -> bool:
    return _exists(spark, path.rstrip("/") + "/_delta_log")


def _landing_info(spark: SparkSession, path: str) -> dict[str, Any] | None:
    """The ``_pgoutput_capture.json`` that `pgoutput-spark capture` wrote in `path`, if any."""
    from .slot.landing import LANDING_INFO_FILE

    hadoop_path, fs = _hadoop(spark, path.rstrip("/") + "/" + LANDING_INFO_FILE)
    if not fs.exists(hadoop_path):
        return None
    stream = fs.open(hadoop_path)
    try:
        text = spark.sparkContext._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")  # type: ignore[attr-defined]
    finally:
        stream.close()
    try:
        info = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CaptureError(f"{path}/{LANDING_INFO_FILE} is not valid JSON: {exc}") from exc
    return info if isinstance(info, dict) else None


def check_landing(spark: SparkSession, path: str, format: Literal["parquet", "delta"] = "parquet",
                  ) -> dict[str, Any] | None:
    """Check the session settings a landing records against what the type conversion reads.

    Returns the landing information (None for a capture not landed by
    ``pgoutput-spark capture``); raises `CaptureError` naming the setting.
    """
    from .slot.delta_landing import landing_info
    from .slot.settings import check_session_settings

    info = _landing_info(spark, path) if format == "parquet" else landing_info(spark, path)
    if info is not None:
        check_session_settings(info.get("settings") or {}, source=path)
    return info


def one_row_per_message(window: DataFrame) -> tuple[DataFrame, int]:
    """``window`` (canonical capture rows) with each message once, and how many rows repeated one.

    Landings written at least once (a retried file, a sink that delivers again) repeat
    rows: a row with the seq, LSN and bytes of another is that message again, and is left
    out. Two rows with one seq and different LSNs or bytes break the contract (seq names one
    message of the slot's stream): a `CaptureError` naming the seq and its LSNs, before
    anything is applied. Costs one aggregation over the seqs; the repeats are dropped by a
    shuffle only when there are some.
    """
    from pyspark.sql import functions as F

    from .lsn import Lsn

    rows, messages = window.agg(F.count(F.lit(1)), F.count_distinct("seq")).first()
    if rows == messages:
        return window, 0
    clashes = (window.groupBy("seq")
               .agg(F.count_distinct("lsn", "data").alias("versions"), F.array_sort(F.collect_set("lsn")).alias("lsns"))
               .where(F.col("versions") > 1).orderBy("seq").limit(4).collect())
    if clashes:
        where = "; ".join(f"seq {r['seq']}: {r['versions']} different messages "
                          f"(lsn {', '.join(str(Lsn(x)) for x in r['lsns'])})" for r in clashes[:3])
        raise CaptureError(
            f"the capture holds different messages under one seq ({where}{'; ...' if len(clashes) > 3 else ''}): "
            f"seq must name one message of the slot's stream; rows repeated with the same lsn and "
            f"bytes are fine, these are not: fix the landing")
    return window.dropDuplicates(["seq"]), rows - messages


def repeated_note(rows: int) -> str:
    """What a run's summary says after its message count of the repeats it left out."""
    return f" ({rows} repeated rows of the capture left out: each message applied once)" if rows else ""


def read_capture(spark: SparkSession, path: str, *, format: CaptureFormat = "auto") -> DataFrame:
    """Read a capture from a Parquet folder or a Delta table (``auto``: Delta if it has a log).

    A Parquet capture is every ``*.parquet`` file under ``path`` (Hive-style
    partition folders such as ``date=2026-11-22/`` are discovered as columns).
    A landing of ``pgoutput-spark capture`` (folder or Delta table) has its
    recorded session settings checked first (`check_landing`).
    """
    if not _exists(spark, path):  # before Spark's reader, which logs a stack trace first
        raise CaptureError(f"can't read capture {path!r}: it does not exist")
    if format == "auto":
        format = "delta" if _is_delta(spark, path) else "parquet"
    if format not in ("parquet", "delta"):
        raise CaptureError(f"unknown capture format {format!r}: expected auto, parquet or delta")
    check_landing(spark, path, format)
    reader = spark.read.format(format)
    if format == "parquet":
        # Only Parquet files: a capture folder may hold a README, markers, ...
        reader = reader.option("pathGlobFilter", "*.parquet")
    try:
        return reader.load(path)
    except Exception as exc:  # AnalysisException: path missing, not Parquet, ...
        if type(exc).__name__ in ("AnalysisException", "PathNotFoundException"):
            raise CaptureError(f"can't read capture {path!r} as {format}: {exc}") from exc
        raise
