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
import logging
import weakref
from collections.abc import Callable, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .errors import CaptureError

if TYPE_CHECKING:  # Spark is imported only where a DataFrame is touched
    from pyspark.sql import Column, DataFrame, SparkSession

_log = logging.getLogger(__name__)

CaptureFormat = Literal["auto", "parquet", "delta"]


@dataclass(frozen=True)
class CaptureColumns:
    """Names of the capture's columns (``xid=None``: the capture has no xid column;
    ``session=None``: none that names each message's walsender session, see
    `pgoutput_spark.spark.sessions`)."""

    seq: str = "seq"
    lsn: str = "lsn"
    data: str = "data"
    xid: str | None = None
    session: str | None = None

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
        if self.session is not None:
            if self.session not in fields:
                raise CaptureError(f"capture has no column {self.session!r} (the session column); it has "
                                   f"{sorted(fields)}: set the capture column names to match")
            columns.append(capture[self.session].cast("string").alias("session"))  # any type: compared as text
        return capture.select(*columns)


#: How a capture error found inside a Spark task (`_from_text`) starts, so that
#: `spark.failures.spark_failure` can tell it from Spark's own errors.
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


def _is_delta(spark: SparkSession, path: str) -> bool:
    from .spark.files import child, exists

    return exists(spark, child(path, "_delta_log"))


def _landing_info(spark: SparkSession, path: str) -> dict[str, Any] | None:
    """The ``_pgoutput_capture.json`` that `pgoutput-spark capture` wrote in `path`, if any."""
    from .slot.landing import LANDING_INFO_FILE
    from .spark.files import child, read_text

    text = read_text(spark, child(path, LANDING_INFO_FILE))
    if text is None:
        return None
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


def message_counts(window: DataFrame) -> tuple[int, int]:
    """(rows, distinct seqs) of ``window``: one Spark job (`slice_end`'s)."""
    return slice_end(window)[1]


def slice_end(newer: DataFrame) -> tuple[int | None, tuple[int, int]]:
    """The last seq of ``newer`` (None when it is empty) and its `message_counts`, in one Spark
    job: a run's slice then reads the seqs up to that end, which are exactly ``newer``'s rows."""
    from pyspark.sql import functions as F

    from .spark.session import one_row

    hi, rows, messages = one_row(newer.agg(F.max("seq"), F.count(F.lit(1)), F.count_distinct("seq")))
    return hi, (rows, messages)


def slice_messages(capture: DataFrame, window: DataFrame, lo: int | None, hi: int, *,
                   seq_gaps: Literal["fail", "allow"] | None, remedy: str,
                   counts: tuple[int, int] | None = None) -> tuple[DataFrame, int, int]:
    """`one_row_per_message` of a run's slice ``window`` (the canonical rows of seqs ``(lo, hi]``
    of ``capture``), checked first for missing seqs (`check_seqs_follow`, ending with
    ``remedy``) where ``seq_gaps`` is ``"fail"``, or is None and ``capture`` is a landing of
    ``pgoutput-spark capture`` (`landed_by_capture`): (the slice with each message once, the
    rows left out as repeats, its messages). ``counts``: `message_counts` of ``window`` if
    known (`slice_end`); one Spark job when they are not and nothing is wrong, none when they are."""
    counts = counts or message_counts(window)
    landing = landed_by_capture(capture)
    if seq_gaps == "fail" or (seq_gaps is None and landing is not None):
        check_seqs_follow(window, lo, hi, counts[1], f"the capture {landing}" if landing else "the capture", remedy)
    return (*one_row_per_message(window, counts), counts[1])


def check_seqs_follow(window: DataFrame, lo: int | None, hi: int, messages: int, source: str, remedy: str) -> None:
    """`CaptureError` when ``window`` (the canonical rows of seqs ``(lo, hi]``, ``messages``
    distinct seqs among them) misses a seq: for a landing of ``pgoutput-spark capture``,
    whose seqs follow one another from 0, a file deleted or expired before a run applied it.
    Names the first missing seqs (two Spark jobs, only when some are missing); ``remedy``
    ends the error."""
    from pyspark.sql import functions as F

    from .spark.session import one_row

    start = 0 if lo is None else lo + 1
    expected = hi - start + 1
    if messages >= expected:
        return
    present = window.select("seq").distinct()
    ends = present.join(present.select((F.col("seq") - 1).alias("seq")), "seq", "left_anti")
    lowest = one_row(window.agg(F.min("seq")))[0]
    before_gap = one_row(ends.where(F.col("seq") < hi).agg(F.min("seq")))[0]
    first = start if lowest is None or lowest > start else before_gap + 1
    after = one_row(window.where(F.col("seq") > first).agg(F.min("seq")))[0]
    last = hi if after is None else after - 1  # None: every seq from there on (a redone slice's end)
    gap = f"seq {first}" if last == first else f"seqs {first} to {last}"
    raise CaptureError(
        f"{source} misses {expected - messages} of the seqs {start} to {hi} this run would apply (first: {gap}): "
        f"its seqs follow one another, so capture files were deleted or expired before a run applied "
        f"them, and the tables would miss their changes. Nothing was written. {remedy}")


def one_row_per_message(window: DataFrame, counts: tuple[int, int] | None = None) -> tuple[DataFrame, int]:
    """``window`` (canonical capture rows) with each message once, and how many rows repeated one.

    Landings written at least once (a retried file, a sink that delivers again) repeat
    rows: a row with the seq, LSN and bytes of another is that message again, and is left
    out. Two rows with one seq and different LSNs or bytes break the contract (seq names one
    message of the slot's stream): a `CaptureError` naming the seq and its LSNs, before
    anything is applied. Costs one aggregation over the seqs; the repeats are dropped by a
    shuffle only when there are some. ``counts``: `message_counts` of ``window``, if known.
    """
    from pyspark.sql import functions as F

    from .lsn import Lsn

    rows, messages = counts or message_counts(window)
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
    from .spark.files import exists

    if not exists(spark, path):  # before Spark's reader, which logs a stack trace first
        raise CaptureError(f"can't read capture {path!r}: it does not exist")
    if format == "auto":
        format = "delta" if _is_delta(spark, path) else "parquet"
    if format not in ("parquet", "delta"):
        raise CaptureError(f"unknown capture format {format!r}: expected auto, parquet or delta")
    info = check_landing(spark, path, format)
    reader = spark.read.format(format)
    if format == "parquet":
        # Only Parquet files: a capture folder may hold a README, markers, ...
        reader = reader.option("pathGlobFilter", "*.parquet")
    try:
        frame = reader.load(path)
    except Exception as exc:  # AnalysisException: path missing, not Parquet, ...
        if format == "parquet" and "UNABLE_TO_INFER_SCHEMA" in str(exc):  # Spark's word for no files
            raise CaptureError(f"can't read capture {path!r} as parquet: it holds no *.parquet file (in it or "
                               f"its partition folders): nothing has landed yet, or the path is not the "
                               f"landing's") from exc
        if type(exc).__name__ in ("AnalysisException", "PathNotFoundException"):
            raise CaptureError(f"can't read capture {path!r} as {format}: {exc}") from exc
        raise
    if info is not None:  # its seqs follow one another from 0 (`landed_by_capture`)
        _LANDINGS[frame] = path
    return frame


#: The frames `read_capture` returned for landings of ``pgoutput-spark capture``, with their paths.
_LANDINGS: weakref.WeakKeyDictionary[DataFrame, str] = weakref.WeakKeyDictionary()


def landed_by_capture(capture: DataFrame) -> str | None:
    """The landing's path when ``capture`` is `read_capture`'s frame of a landing that
    ``pgoutput-spark capture`` wrote (its seqs follow one another from 0); None otherwise
    (another frame, even one derived from it: its rows may be a part of the landing)."""
    return _LANDINGS.get(capture)


# -- files that land late ------------------------------------------------------------------------


@dataclass(frozen=True)
class Landed:
    """A run's look at the capture's files against those earlier runs saw (`landed_files`)."""

    # Files no earlier run saw (every file, on a first look): in the run's record, not in --json.
    new_files: tuple[str, ...] = field(default=(), metadata={"json": False})
    # Files earlier runs saw that are gone (a landing's retention, a compaction).
    gone_files: tuple[str, ...] = field(default=(), metadata={"json": False})
    late_rows: int = 0  # rows of new files at or below the position (no run reads them again)
    unread: int = 0  # messages among them no run read (only with ``accept``; else an error)


def late_note(landed: Landed) -> str:
    """What a run's summary says of capture rows that landed after runs applied past them."""
    return (f"files landed late: {landed.late_rows} rows at or below the target's position in files no "
            f"earlier run saw, not read again: "
            + (f"{landed.unread} messages among them no run read, accepted (the target misses them)"
               if landed.unread else "repeats of messages the runs read (a retried upload, a compaction)"))


def capture_files(capture: DataFrame) -> tuple[str, ...] | None:
    """The files ``capture`` reads, as listed when it was read; None for a frame not read from
    files (its file index is Spark's: a Delta capture's files of the version read)."""
    try:
        files = capture.inputFiles()
    except Exception:  # a frame Spark cannot list: nothing to compare
        return None
    # Spark spells a local file file:///x here and file:/x in a row's _metadata.file_path.
    return tuple(sorted({"file:/" + f[len("file:///"):] if f.startswith("file:///") else f for f in files})) or None


_MIRRORS_REMEDY = ("rebuild the mirrors from the capture (--rebuild SCHEMA.TABLE, replaying it) or re-snapshot "
                   "them, with --accept-late-files (accept_late_files=True) to go on")


def landed_files(capture: DataFrame, columns: CaptureColumns, position: int | None,
                 seen: Set[str] | None, slices: Callable[[], list[tuple[int, int, int]]], *,
                 accept: bool = False, remedy: str = _MIRRORS_REMEDY) -> Landed:
    """Check the capture's files that no earlier run saw for rows at or below ``position``.

    A run reads the seqs after the target's position; a file that lands after runs applied
    past its seqs (an upload retried after the next file landed, two writers landing out of
    order) is never read. Its rows are harmless when they repeat messages the runs read (a
    retried upload, a compaction of the landing), and lost otherwise: each run that took
    part of their seqs (``slices()``: its slice ``(lo, hi]`` and the messages it read, called
    only then) is compared with the messages its slice holds now. More now raises `CaptureError` naming
    the files and slices, unless ``accept`` (the user rebuilt or re-snapshotted the
    mirrors, or lets them go): then they are counted in `Landed.unread`. ``remedy`` ends the
    error: what to do when the files belong to the capture.

    ``seen``: the files earlier runs saw (None: no run recorded them; every file is new and
    nothing is checked). Reads only the new files' seqs.
    """
    from pyspark.sql import functions as F

    files = capture_files(capture)
    if files is None:
        return Landed()
    new = tuple(f for f in files if seen is None or f not in seen)
    gone = () if seen is None else tuple(sorted(set(seen).difference(files)))
    if seen is None or position is None or not new:
        return Landed(new, gone)
    late = _late_file_seqs(capture, columns, new, position)
    if not late:
        return Landed(new, gone)
    rows = sum(n for _, _, _, n in late)
    spans = [(first, last) for _, first, last, _ in late]
    touched = [(lo, hi, read) for lo, hi, read in slices()
               if hi > lo and any(first <= hi and last > lo for first, last in spans)]
    canonical = columns.select(capture)
    held: dict[int, int] = {}
    if touched:
        insides = [(F.col("seq") > lo) & (F.col("seq") <= hi) for lo, hi, _ in touched]
        which, anywhere = F.when(insides[0], F.lit(0)), insides[0]
        for i, inside in enumerate(insides[1:], 1):
            which, anywhere = which.when(inside, F.lit(i)), anywhere | inside
        # The slices' bounds prune the capture's files by their seq statistics.
        for r in canonical.where(anywhere).groupBy(which.alias("run")).agg(F.count_distinct("seq")).collect():
            held[r[0]] = r[1]
    short = [(lo, hi, read, held.get(i, 0)) for i, (lo, hi, read) in enumerate(touched) if held.get(i, 0) > read]
    unread = sum(now - read for _, _, read, now in short)
    # Rows of a file no recorded run's slice covers (the runs' records lost): none of them read.
    unread += sum(n for _, first, last, n in late if not any(first <= hi and last > lo for lo, hi, _ in touched))
    if unread and not accept:
        names = "; ".join(f"{f} (seqs {first} to {last}, {n} rows)" for f, first, last, n in late[:3])
        counted = "; ".join(f"the run of seqs {'up to' if lo < 0 else f'{lo + 1} to'} {hi} read {read} messages, "
                            f"the capture holds {now} there now" for lo, hi, read, now in short[:3])
        raise CaptureError(
            f"capture files landed after the target applied past their seqs (position: seq {position}), "
            f"with {unread} messages no run read: {names}{'; ...' if len(late) > 3 else ''}"
            f"{': ' + counted if counted else ''}. The target misses those messages. If the files do not "
            f"belong to this capture, remove them; if they do, {remedy}")
    return Landed(new, gone, rows, unread)


def _late_file_seqs(capture: DataFrame, columns: CaptureColumns, files: tuple[str, ...],
                    position: int) -> list[tuple[str, int, int, int]]:
    """(file, first seq, last seq, rows) of the rows of ``files`` at or below ``position``.

    Reads those files alone: as Parquet (a Parquet capture's files, a Delta capture's data
    files), else through the capture filtered on each row's file (Spark lists only those
    files for a Parquet folder; a Delta capture, with column mapping, is scanned).
    """
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    spark = capture.sparkSession
    try:
        frame = spark.read.parquet(*files).select(F.col("_metadata.file_path").alias("file"),
                                                  F.col(columns.seq).cast("bigint").alias("seq"))
    except AnalysisException:  # not Parquet, or the seq column under another physical name
        try:
            frame = capture.select(F.col("_metadata.file_path").alias("file"), F.col(columns.seq).cast("bigint")
                                   .alias("seq")).where(F.col("file").isin(list(files)))
        except AnalysisException:  # a frame made from the files' rows: they cannot be told apart
            _log.warning("can't tell the rows of the capture's new files apart: files landed late are "
                         "not checked in this run")
            return []
    rows = (frame.where(F.col("seq") <= position).groupBy("file")
            .agg(F.min("seq"), F.max("seq"), F.count(F.lit(1))).orderBy(F.min("seq")).collect())
    return [(r[0], r[1], r[2], r[3]) for r in rows]
