"""A Parquet landing: the capture files a slot is landed into, and where landing resumes.

Layout of a landing folder::

    _pgoutput_capture.json      what every file was read with (slot, server,
                                pgoutput options, session settings)
    part-00000000.parquet       chunk 0: seq, lsn, xid, data (the capture contract)
    part-00000001.parquet       chunk 1, ...

Spark and the capture reader skip names starting with ``_``. A chunk file is
written under a hidden temporary name, flushed to disk and renamed into place:
the rename is the chunk's commit. Its Parquet footer records the chunk (first
and last seq, and ``end_lsn``, the LSN the slot is advanced to once the file is
in place), so the last file alone says where the next run starts.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import CaptureError

__all__ = ["CAPTURE_SCHEMA", "LANDING_INFO_FILE", "ChunkRecord", "ParquetLanding"]

CAPTURE_SCHEMA = pa.schema(
    [
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("lsn", pa.int64(), nullable=False),
        pa.field("xid", pa.int64(), nullable=False),
        pa.field("data", pa.binary(), nullable=False),
    ]
)
"""Arrow schema of a capture file: one row per pgoutput message."""

LANDING_INFO_FILE = "_pgoutput_capture.json"
_CHUNK_KEY = b"pgoutput_spark.chunk"
_PART = re.compile(r"^part-(\d{8})\.parquet$")
_TEMP_PREFIX = "_writing-"


@dataclass(frozen=True)
class ChunkRecord:
    """One landed chunk: its file's rows are seq ``first_seq..last_seq``; the slot goes to ``end_lsn``."""

    chunk: int
    first_seq: int
    last_seq: int
    end_lsn: int
    bytes: int

    @property
    def messages(self) -> int:
        return self.last_seq - self.first_seq + 1

    def as_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()


def check_same_landing(recorded: Mapping[str, Any], info: Mapping[str, Any], where: str, kind: str) -> None:
    """`CaptureError` naming the first key whose value this run would change in the landing."""
    for key in sorted(set(recorded) | set(info)):
        if recorded.get(key) != info.get(key):
            raise CaptureError(
                f"{where} was landed with {key} = {recorded.get(key)!r}, this run has {info.get(key)!r}:"
                f" one landing is read with one set of options; land into a new {kind} to change them")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


Publish = Callable[[Path, ChunkRecord], str]


class ChunkFile:
    """A chunk being written: rows go to a hidden file in `directory` until `commit` publishes it.

    `publish` makes the finished file part of the landing (a rename into
    place, or a Delta append) and returns where it went.
    """

    def __init__(self, directory: Path, chunk: int, *, compression: str, publish: Publish) -> None:
        self._directory = directory
        self._publish = publish
        self.chunk = chunk
        self._compression = compression
        self._temp = directory / f"{_TEMP_PREFIX}{chunk:08d}-{os.getpid()}.parquet"
        self._writer: pq.ParquetWriter | None = pq.ParquetWriter(
            self._temp, CAPTURE_SCHEMA, compression=compression)
        self.rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        assert self._writer is not None
        self._writer.write_batch(batch)
        self.rows += batch.num_rows

    def commit(self, record: ChunkRecord) -> str:
        """Keep the first ``record.messages`` rows (the record in the footer) and publish them."""
        assert self._writer is not None and record.chunk == self.chunk
        keep = record.messages
        if keep == self.rows:
            self._writer.add_key_value_metadata({_CHUNK_KEY: record.as_json()})
            self._writer.close()
            self._writer = None
            source = self._temp
        else:  # rows after the last transaction boundary are read again next chunk
            self._writer.close()
            self._writer = None
            source = self._temp.with_name(self._temp.stem + "-cut.parquet")
            with pq.ParquetWriter(source, CAPTURE_SCHEMA, compression=self._compression) as out:
                for batch in pq.ParquetFile(self._temp).iter_batches(batch_size=65_536):
                    if keep <= 0:
                        break
                    out.write_batch(batch.slice(0, keep))
                    keep -= min(keep, batch.num_rows)
                out.add_key_value_metadata({_CHUNK_KEY: record.as_json()})
            self._temp.unlink()
        try:
            return self._publish(source, record)
        finally:
            source.unlink(missing_ok=True)

    def discard(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        for leftover in self._directory.glob(f"{self._temp.stem}*"):
            leftover.unlink()


class ParquetLanding:
    """A landing folder on the local file system (or a mounted one)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def part_path(self, chunk: int) -> Path:
        return self.path / f"part-{chunk:08d}.parquet"

    def _parts(self) -> Iterator[tuple[int, Path]]:
        if not self.path.is_dir():
            return
        for entry in sorted(self.path.iterdir()):
            match = _PART.match(entry.name)
            if match:
                yield int(match.group(1)), entry

    # -- what was landed --------------------------------------------------------------

    def info(self) -> dict[str, Any] | None:
        """The recorded landing information, or None for a new landing."""
        try:
            text = (self.path / LANDING_INFO_FILE).read_text()
        except FileNotFoundError:
            return None
        try:
            info = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CaptureError(f"{self.path / LANDING_INFO_FILE} is not valid JSON: {exc}") from exc
        if not isinstance(info, dict):
            raise CaptureError(f"{self.path / LANDING_INFO_FILE} does not hold a JSON object")
        return info

    def last_chunk(self) -> ChunkRecord | None:
        """The newest landed chunk (from its file's footer), or None when nothing was landed."""
        parts = list(self._parts())
        if not parts:
            return None
        chunk, path = parts[-1]
        if chunk != len(parts) - 1:
            raise CaptureError(f"{self.path}: chunk files are not numbered 0..{len(parts) - 1}"
                               f" (the last is {path.name}): the landing was edited by hand")
        metadata = pq.read_metadata(path).metadata or {}
        try:
            record = ChunkRecord(**json.loads(metadata[_CHUNK_KEY]))
        except (KeyError, TypeError, ValueError) as exc:
            raise CaptureError(f"{path} has no readable chunk record in its footer"
                               f" ({_CHUNK_KEY.decode()}): not written by pgoutput-spark capture") from exc
        if record.chunk != chunk:
            raise CaptureError(f"{path} records chunk {record.chunk}: the landing was edited by hand")
        return record

    # -- landing ------------------------------------------------------------------------

    def open(self, info: Mapping[str, Any]) -> None:
        """Create the landing (or check it was landed with the same `info`); remove half-written files."""
        self.path.mkdir(parents=True, exist_ok=True)
        recorded = self.info()
        if recorded is None:
            if any(True for _ in self._parts()):
                raise CaptureError(f"{self.path} holds capture files but no {LANDING_INFO_FILE}:"
                                   " land into a new folder")
            temp = self.path / f"{_TEMP_PREFIX}info-{os.getpid()}.json"
            temp.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
            os.replace(temp, self.path / LANDING_INFO_FILE)
            _fsync_dir(self.path)
        else:
            check_same_landing(recorded, info, f"{self.path}", "folder")
        for leftover in self.path.glob(f"{_TEMP_PREFIX}*"):
            leftover.unlink()

    def new_chunk(self, chunk: int, *, compression: str = "zstd") -> ChunkFile:
        return ChunkFile(self.path, chunk, compression=compression, publish=self._publish)

    def _publish(self, source: Path, record: ChunkRecord) -> str:
        with open(source, "rb") as handle:
            os.fsync(handle.fileno())
        target = self.part_path(record.chunk)
        os.replace(source, target)
        _fsync_dir(self.path)
        return str(target)

