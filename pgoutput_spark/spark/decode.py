"""`decode`: a capture DataFrame in, a decoded DataFrame (one row per message) out.

Two passes over the capture:

1. a cheap scan of the first byte of each message (past any XLogData frame)
   keeps only Stream Start / Stop messages; their seqs are collected and
   broadcast (`StreamEvents`: two numbers per streamed chunk; in a Spark Connect
   session, which has no broadcasts, sent with the task's function); with
   ``positions``, also the Begin / Begin Prepare seqs and Stream Start xids
   (`Boundaries`: one number per transaction or stream segment);
2. ``mapInArrow`` decodes each Arrow batch with the vectorized decoder, looking
   up each row's stream state (and its block and stream) in those
   events, so a stream block can span partitions and files in any layout.

Nothing else reaches the driver, and a task holds one Arrow batch
(``spark.sql.execution.arrow.maxRecordsPerBatch`` messages) at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from ..capture import CaptureColumns
from ..decoder.arrow import value_offsets
from ..decoder.batch import Framing, decode_batch
from ..decoder.protocol import XLOGDATA_HEADER_SIZE, XLOGDATA_TYPE, MessageType
from ..decoder.schema import DECODED_SCHEMA
from ..decoder.stream import StreamEvents
from ..errors import ConfigError
from .assemble import IN_BLOCK_TYPES, LOOKUP_LIMIT, POSITION_COLUMNS, Boundaries, ScanState
from .connect import for_tasks
from .sessions import Sessions, find_sessions

OnError = Literal["fail", "quarantine"]

#: The Spark schema of `decode`'s output (see `pgoutput_spark.decoder.schema`).
DECODED_SPARK_SCHEMA = from_arrow_schema(DECODED_SCHEMA)


def _byte(value: int) -> Column:
    """A one-byte binary literal."""
    return F.lit(bytearray([value]))


def _message_bytes(data: Column, framing: Framing, start: int, length: int) -> Column:
    """``length`` bytes of the message from its byte ``start`` (1-based), past an XLogData
    frame when allowed."""
    plain = F.substring(data, start, length)
    if framing == "none":
        return plain
    framed = F.substring(data, XLOGDATA_HEADER_SIZE + start, length)
    # Bytes compared as bytes: reading the type byte as a number (`conv(hex(...))`) took
    # two thirds of the first pass's samples in a profile of the driver JVM.
    return F.when(F.substring(data, 1, 1) == _byte(XLOGDATA_TYPE), framed).otherwise(plain)


def _first_pass(capture: DataFrame, framing: Framing, initially_in_stream: bool,
                positions: ScanState | None,
                session_starts: np.ndarray | None = None) -> tuple[StreamEvents, Boundaries | None]:
    """The seqs of all Stream Start / Stop messages of a canonical capture; with ``positions``,
    also its Begin / Begin Prepare seqs and Stream Start xids (`Boundaries`), or None when
    there are more than `LOOKUP_LIMIT` (the scan then takes a window instead).

    Positions come from type bytes: a Begin or Stream Start that fails to decode (kept in
    quarantine) still begins its block or stream, so that the messages after it are taken
    for no other transaction's.
    """
    kind = _message_bytes(capture["data"], framing, 1, 1)
    wanted = [int(MessageType.STREAM_START), int(MessageType.STREAM_STOP)]
    columns = [F.col("seq"), F.col("lsn"), kind.alias("type_byte")]
    if positions is not None:
        wanted += [int(MessageType.BEGIN), int(MessageType.BEGIN_PREPARE)]
        columns.append(_message_bytes(capture["data"], framing, 2, 4).alias("xid_bytes"))  # after the type
    events = capture.select(*columns).where(F.col("type_byte").isin(*map(_byte, wanted))).toArrow()
    seq, type_byte = events.column("seq").to_numpy(), _first_bytes(events.column("type_byte"))
    stream = StreamEvents.from_messages(seq, type_byte, events.column("lsn").to_numpy(),
                                        initially_in_stream=initially_in_stream, session_starts=session_starts)
    if positions is None:
        return stream, None
    keep = type_byte != MessageType.STREAM_STOP
    if int(keep.sum()) > LOOKUP_LIMIT:
        return stream, None
    is_start = type_byte[keep] == MessageType.STREAM_START
    # A Stream Start's xid: a uint32 in network order (-1 for a message too short to hold one).
    xid = np.full(is_start.size, -1, dtype=np.int64)
    xid[is_start] = [int.from_bytes(v, "big") if v is not None and len(v) == 4 else -1
                     for v in events.column("xid_bytes").filter(pa.array(keep)).filter(
                         pa.array(is_start)).to_pylist()]
    return stream, Boundaries.of(seq[keep], is_start, xid, positions)


def _first_bytes(kinds: pa.ChunkedArray) -> np.ndarray:
    """The one byte of each of ``kinds`` (binary, none NULL or empty), as uint8."""
    values = kinds.combine_chunks()  # the few boundary messages of a run
    if not len(values):
        return np.empty(0, dtype=np.uint8)
    first: np.ndarray = np.frombuffer(values.buffers()[2], dtype=np.uint8)[value_offsets(values)[:-1]]
    return first


def stream_events(capture: DataFrame, *, framing: Framing = "auto",
                  initially_in_stream: bool = False, sessions: Sessions | None = None) -> StreamEvents:
    """First pass: the seqs of all Stream Start / Stop messages of a canonical capture."""
    return _first_pass(capture, framing, initially_in_stream, None, None if sessions is None else sessions.starts)[0]


def _positions(batch: pa.RecordBatch, bounds: Boundaries) -> list[pa.Array]:
    """``block_seq`` and ``top_xid`` of a decoded batch, as `pgoutput_spark.spark.assemble.scan`
    gives them: the last Begin's seq for a message inside a Begin block, the last Stream
    Start's xid for one inside a stream block, and a stream control message's own xid."""
    seq = batch.column("seq").to_numpy()
    kind = batch.column("message_type")
    in_stream = batch.column("in_stream").fill_null(False)
    non_transactional = pc.and_(pc.equal(kind, "message"),
                                pc.invert(batch.column("message").field("transactional")))
    in_block = pc.and_(pc.and_(pc.invert(in_stream), pc.is_in(kind, pa.array(IN_BLOCK_TYPES))),
                       pc.invert(non_transactional.fill_null(False)))
    begin, has_begin = bounds.last_begin(seq)
    block_seq = pa.array(begin, mask=~(np.asarray(in_block.fill_null(False)) & has_begin))
    xid, has_xid = bounds.last_start_xid(seq)
    own = pc.coalesce(batch.column("stream_start").field("xid"), batch.column("stream_commit").field("xid"),
                      batch.column("stream_abort").field("xid"),
                      pc.if_else(pc.equal(kind, "stream_prepare"), batch.column("prepare").field("xid"),
                                 pa.nulls(len(seq), pa.int64())))
    top_xid = pc.if_else(in_stream, pa.array(xid, mask=~has_xid), own)
    return [block_seq, top_xid]


def decode(
    capture: DataFrame,
    *,
    columns: CaptureColumns | None = None,
    on_error: OnError = "fail",
    framing: Framing = "auto",
    initially_in_stream: bool = False,
    tuples: bool = True,
    positions: ScanState | None = None,
    raw_as_string: bool = False,
    sessions: Sessions | None = None,
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
    ``positions``, the `ScanState` the slice starts in, adds ``block_seq`` and
    ``top_xid`` as `pgoutput_spark.spark.assemble.scan` would (then given the
    same state): the first pass collects the Begin and Stream Start positions
    with the Stream Start / Stop ones, and the scan needs no pass of its own
    (nor a second cached copy of the messages). Not for slices with more than
    `LOOKUP_LIMIT` Begin and Stream Start messages, which the scan windows.
    ``raw_as_string`` types ``raw`` as a Spark string holding the same bytes
    (never read as text; `raw_bytes` gives them back as a binary column, and
    `quarantined` does so): for frames that Spark caches and passes to Python
    again, as the apply job's. Spark's column cache copies each binary value
    three times (it takes a value's size by copying it, twice) and a string
    once; with ``tuples=False`` that is every change message.
    ``sessions``: where the slice's walsender sessions begin (`find_sessions`); a stream
    block a session left open ends where the next session begins. Without it, a capture
    with a ``session`` column (`CaptureColumns.session`) is read as one slice from the
    start of its first session.
    """
    if on_error not in ("fail", "quarantine"):
        raise ConfigError(f"on_error must be 'fail' or 'quarantine', got {on_error!r}")
    if framing not in ("auto", "none", "xlogdata"):
        raise ConfigError(f"framing must be 'auto', 'none' or 'xlogdata', got {framing!r}")
    canonical = (columns or CaptureColumns()).select(capture)
    has_xid = "xid" in canonical.columns
    if sessions is None:
        sessions = find_sessions(canonical, None)
    events, bounds = _first_pass(canonical, framing, initially_in_stream, positions,
                                 None if sessions is None else sessions.starts)
    shared = for_tasks(capture.sparkSession, (events.seq, events.is_start, bounds))
    fail = on_error == "fail"
    fields = [T.StructField("raw", T.StringType()) if f.name == "raw" and raw_as_string else f
              for f in DECODED_SPARK_SCHEMA.fields]
    if bounds is not None:
        fields += [T.StructField(c, T.LongType()) for c in POSITION_COLUMNS]
    schema = T.StructType(fields)
    at_raw = DECODED_SCHEMA.get_field_index("raw")

    def decode_partition(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        event_seq, event_is_start, bounds = shared()
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
            out = decoded.batch
            columns = out.columns
            if raw_as_string:  # the same buffers, typed as text
                columns[at_raw] = columns[at_raw].view(pa.string())
            if bounds is not None:
                columns += _positions(out, bounds)
            yield pa.RecordBatch.from_arrays(columns, names=[f.name for f in fields])

    return canonical.drop("session").mapInArrow(decode_partition, schema)  # the sessions are in `events`


def raw_bytes(frame: DataFrame) -> Column:
    """``frame``'s ``raw`` as a binary column, also where `decode`'s ``raw_as_string`` typed it
    as a string."""
    raw = frame["raw"]
    return raw.cast("binary").alias("raw") if isinstance(frame.schema["raw"].dataType, T.StringType) else raw


def quarantined(decoded: DataFrame) -> DataFrame:
    """The rows of a decoded capture that failed: seq, lsn, message_type, error, raw (binary)."""
    return decoded.where(F.col("error").isNotNull()).select(
        "seq", "lsn", "message_type", "error", raw_bytes(decoded))
