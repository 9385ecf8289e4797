"""Write captured pgoutput messages as Parquet capture files.

A capture is a sequence of `CapturedMessage` rows (``seq``, ``lsn``, ``xid``,
``data``) numbered 0, 1, 2, ... in the order the server produced them. This
module writes such a sequence to ``part-00000.parquet``, ``part-00001.parquet``,
... streaming: it holds at most one row batch in memory, never the whole
capture, so a capture of millions of messages can be written from a generator.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ..slot.landing import CAPTURE_SCHEMA

__all__ = ["CAPTURE_SCHEMA", "CapturedMessage", "write_capture_parquet"]

_log = logging.getLogger(__name__)

_PART_GLOB = "part-*.parquet"


@dataclass(frozen=True, slots=True)
class CapturedMessage:
    """One pgoutput message as returned by ``pg_logical_slot_*_binary_changes``.

    ``seq`` is the position in the capture (0-based, gap-free), ``lsn`` the WAL
    position the server reported for the row, ``xid`` the transaction id it
    reported (0 for non-transactional messages) and ``data`` the raw message.
    """

    seq: int
    lsn: int
    xid: int
    data: bytes


def _part_path(directory: Path, index: int) -> Path:
    return directory / f"part-{index:05d}.parquet"


class _BatchBuffer:
    """Column lists for the rows not yet handed to the Parquet writer."""

    __slots__ = ("data", "lsn", "seq", "xid")

    def __init__(self) -> None:
        self.seq: list[int] = []
        self.lsn: list[int] = []
        self.xid: list[int] = []
        self.data: list[bytes] = []

    def __len__(self) -> int:
        return len(self.seq)

    def append(self, message: CapturedMessage) -> None:
        self.seq.append(message.seq)
        self.lsn.append(message.lsn)
        self.xid.append(message.xid)
        self.data.append(message.data)

    def take(self) -> pa.RecordBatch:
        batch = pa.record_batch(
            [
                pa.array(self.seq, pa.int64()),
                pa.array(self.lsn, pa.int64()),
                pa.array(self.xid, pa.int64()),
                pa.array(self.data, pa.binary()),
            ],
            schema=CAPTURE_SCHEMA,
        )
        self.seq, self.lsn, self.xid, self.data = [], [], [], []
        return batch


def write_capture_parquet(
    messages: Iterable[CapturedMessage],
    directory: str | Path,
    *,
    rows_per_file: int = 1_000_000,
    cut_points: Iterable[int] | None = None,
    batch_rows: int = 65_536,
    compression: str = "snappy",
    overwrite: bool = False,
) -> list[Path]:
    """Write `messages` to ``directory/part-NNNNN.parquet`` files; return their paths.

    A new file starts when the current one holds `rows_per_file` rows, and at
    every message whose ``seq`` is in `cut_points` (a cut at the first message
    or past the last one makes no empty file). Rows reach the writer in row
    groups of at most `batch_rows`, so memory stays bounded by one batch.

    ``seq`` must increase strictly (``ValueError`` otherwise). Existing part
    files in `directory` are an error unless `overwrite` is true, in which case
    they are deleted first. An empty `messages` writes no file.
    """
    if rows_per_file < 1:
        raise ValueError(f"rows_per_file must be >= 1, got {rows_per_file}")
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    existing = sorted(out.glob(_PART_GLOB))
    if existing:
        if not overwrite:
            raise FileExistsError(
                f"{out} already holds {len(existing)} capture file(s) ({existing[0].name}, ...);"
                " pass overwrite=True to replace them"
            )
        for path in existing:
            path.unlink()
    cuts = frozenset(cut_points or ())

    files: list[Path] = []
    writer: pq.ParquetWriter | None = None
    buffer = _BatchBuffer()
    rows_in_file = 0
    previous_seq: int | None = None

    def flush() -> None:
        if writer is not None and len(buffer):
            writer.write_batch(buffer.take())

    try:
        for message in messages:
            if previous_seq is not None and message.seq <= previous_seq:
                raise ValueError(
                    f"capture seq must increase strictly: seq {message.seq} follows {previous_seq}"
                )
            previous_seq = message.seq
            if writer is None or rows_in_file >= rows_per_file or (
                message.seq in cuts and rows_in_file > 0
            ):
                flush()
                if writer is not None:
                    writer.close()
                path = _part_path(out, len(files))
                writer = pq.ParquetWriter(path, CAPTURE_SCHEMA, compression=compression)
                files.append(path)
                rows_in_file = 0
                _log.debug("capture file %s starts at seq %d", path.name, message.seq)
            buffer.append(message)
            rows_in_file += 1
            if len(buffer) >= batch_rows:
                flush()
        flush()
    finally:
        if writer is not None:
            writer.close()
    _log.info("wrote %d capture file(s) to %s", len(files), out)
    return files
