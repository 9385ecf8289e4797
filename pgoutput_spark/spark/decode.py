"""`decode`: a capture DataFrame in, a decoded DataFrame (one row per message) out.

Two passes over the capture:

1. a cheap scan of the first byte of each message (past any XLogData frame)
   keeps only Stream Start / Stop messages; their seqs are collected and
   broadcast (`StreamEvents`: two numbers per streamed chunk);
2. ``mapInArrow`` decodes each Arrow batch with the vectorized decoder, looking
   up each row's stream state in the broadcast events, so a stream block can
   span partitions and files in any layout.

Nothing else reaches the driver, and a task holds one Arrow batch
(``spark.sql.execution.arrow.maxRecordsPerBatch`` messages) at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from ..capture import CaptureColumns
from ..decoder.batch import Framing, decode_batch
from ..decoder.protocol import XLOGDATA_HEADER_SIZE, XLOGDATA_TYPE, MessageType
from ..decoder.schema import DECODED_SCHEMA
from ..decoder.stream import StreamEvents
from ..errors import ConfigError

OnError = Literal["fail", "quarantine"]

#: The Spark schema of `decode`'s output (see `pgoutput_spark.decoder.schema`).
DECODED_SPARK_SCHEMA = from_arrow_schema(DECODED_SCHEMA)


def _type_byte(data: F.Column, framing: Framing) -> F.Column:
    """The message type byte as an int, looking past an XLogData frame when allowed."""
    first = F.conv(F.hex(F.substring(data, 1, 1)), 16, 10).cast("int")
    if framing == "none":
        return first
    inner = F.conv(F.hex(F.substring(data, XLOGDATA_HEADER_SIZE + 1, 1)), 16, 10).cast("int")
    return F.when(first == XLOGDATA_TYPE, inner).otherwise(first)


def stream_events(capture: DataFrame, *, framing: Framing = "auto",
                  initially_in_stream: bool = False) -> StreamEvents:
    """First pass: the seqs of all Stream Start / Stop messages of a canonical capture."""
    kind = _type_byte(capture["data"], framing)
    events = (
        capture.select("seq", "lsn", kind.alias("type_byte"))
        .where(F.col("type_byte").isin(int(MessageType.STREAM_START), int(MessageType.STREAM_STOP)))
        .toArrow()
    )
    return StreamEvents.from_messages(
        events.column("seq").to_numpy(), events.column("type_byte").to_numpy(),
        events.column("lsn").to_numpy(), initially_in_stream=initially_in_stream,
    )


def decode(
    capture: DataFrame,
    *,
    columns: CaptureColumns | None = None,
    on_error: OnError = "fail",
    framing: Framing = "auto",
    initially_in_stream: bool = False,
    tuples: bool = True,
) -> DataFrame:
    """Decode a capture DataFrame into one typed row per message.

    The result has the columns of `pgoutput_spark.decoder.schema.DECODED_SCHEMA`.
    ``on_error="fail"`` makes the first undecodable message fail the job with a
    `DecodeError` (seq, LSN, message type, field, offset); ``"quarantine"`` keeps
    such rows with ``error`` and ``raw`` set (select them with `quarantined`).
    ``initially_in_stream``: the capture slice starts inside a stream block
    (resuming a run that ended inside one).
    ``tuples=False`` leaves the tuples of Insert / Update / Delete NULL and keeps
    each such message in ``raw`` instead (see `decode_batch`); the per-table
    conversion (`pgoutput_spark.assemble.typed.typed_changes`) decodes them
    again where they are needed. The apply job decodes so: Spark moves one
    binary value per change instead of about 40 nested ones.
    """
    if on_error not in ("fail", "quarantine"):
        raise ConfigError(f"on_error must be 'fail' or 'quarantine', got {on_error!r}")
    if framing not in ("auto", "none", "xlogdata"):
        raise ConfigError(f"framing must be 'auto', 'none' or 'xlogdata', got {framing!r}")
    canonical = (columns or CaptureColumns()).select(capture)
    has_xid = "xid" in canonical.columns
    events = stream_events(canonical, framing=framing, initially_in_stream=initially_in_stream)
    shared = capture.sparkSession.sparkContext.broadcast((events.seq, events.is_start))
    fail = on_error == "fail"

    def decode_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        event_seq, event_is_start = shared.value
        stream = StreamEvents(event_seq, event_is_start)
        for batch in batches:
            seq = batch.column("seq").to_numpy(zero_copy_only=False)
            decoded = decode_batch(
                batch.column("data"),
                in_stream=stream.in_stream(seq),
                seq=seq,
                lsn=batch.column("lsn").fill_null(0).to_numpy(zero_copy_only=False),
                xid=batch.column("xid") if has_xid else None,
                framing=framing,
                tuples=tuples,
            )
            if fail and decoded.error_rows.size:
                rows = decoded.error_rows
                raise decoded.error(int(rows[np.argmin(seq[rows])]))
            yield decoded.batch

    return canonical.mapInArrow(decode_partition, DECODED_SPARK_SCHEMA)


def quarantined(decoded: DataFrame) -> DataFrame:
    """The rows of a decoded capture that failed: seq, lsn, message_type, error, raw."""
    return decoded.where(F.col("error").isNotNull()).select(
        "seq", "lsn", "message_type", "error", "raw")
