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

The folder may be a URI of a file system Arrow reaches (``s3://``, with
``s3a://`` and ``s3n://`` read as ``s3://``, ``gs://``, ``abfs://``,
``hdfs://``; credentials and endpoints as Arrow takes them, e.g. ``AWS_*``
environment variables, and a GCS emulator as Google's libraries take it,
``STORAGE_EMULATOR_HOST``): a chunk is written on the local disk, uploaded under a
hidden name, then moved into place (on object storage a server-side copy, whose
object appears whole or not at all).
"""

from __future__ import annotations

import builtins
import functools
import json
import os
import re
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ..errors import CaptureError
from ..spark.files import is_uri, local_folder

__all__ = ["CAPTURE_SCHEMA", "LANDING_INFO_FILE", "ChunkRecord", "ParquetLanding", "arrow_filesystem"]

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
    """One landed chunk: its file's rows are seq ``first_seq..last_seq``; the slot goes to ``end_lsn``.

    `timeline`: the primary's WAL timeline the chunk was read on (None: read on a standby, or
    landed before it was recorded), which tells a failover's promoted server from its primary.
    """

    chunk: int
    first_seq: int
    last_seq: int
    end_lsn: int
    bytes: int
    timeline: int | None = None

    @property
    def messages(self) -> int:
        return self.last_seq - self.first_seq + 1

    def as_json(self) -> builtins.bytes:  # the field ``bytes`` shadows the type here
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


def arrow_filesystem(path: str) -> tuple[pafs.FileSystem, str] | None:
    """Arrow's file system and the path in it for a URI other than ``file:``; None for a local path.

    Spark's S3 connector spells S3 ``s3a://`` (and once ``s3n://``): the same buckets are
    ``s3://`` to Arrow, so the command line takes the URI the apply job reads. A ``gs://`` URI
    goes to the GCS emulator that ``STORAGE_EMULATOR_HOST`` names, when it is set, as Google's
    own client libraries do (`gcs_emulator`); Arrow's GCS client does not read that variable.
    """
    if not is_uri(path) or path.startswith("file:"):
        return None
    try:
        if path.startswith("gs://") and os.environ.get(STORAGE_EMULATOR_HOST):
            return gcs_emulator(os.environ[STORAGE_EMULATOR_HOST]), path[len("gs://"):].rstrip("/")
        found: tuple[Any, str]
        if path.startswith("gs://") and "?" not in path:
            found = pafs.FileSystem.from_uri(f"{path}?retry_limit_seconds={GCS_RETRY_SECONDS}")
        else:
            found = pafs.FileSystem.from_uri(re.sub(r"^s3[an]://", "s3://", path))
        return found
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__  # libhdfs lists every path tried
        raise CaptureError(f"{path}: a Parquet landing there needs a file system Arrow reaches ({reason}); land"
                           " into a local or mounted folder, or into a Delta table (--landing-format delta: Spark's"
                           " file systems)") from exc


GCS_RETRY_SECONDS = 120
"""How long Arrow's GCS client retries a request of a ``gs://`` landing before it fails. With
its own default (Google's client library's), a machine without Google's credentials and no
metadata server to ask them of still waited on the landing's first listing after 5 minutes;
with this, such a capture fails within 3 (the client's last wait between retries may pass the
limit: 2:48 against a server that refused every connection), and a capture that fails is run
again where it stopped."""

STORAGE_EMULATOR_HOST = "STORAGE_EMULATOR_HOST"
"""The environment variable that sends Google's client libraries to a GCS emulator."""


def gcs_emulator(host: str) -> pafs.GcsFileSystem:
    """Arrow's GCS client for an emulator at ``host`` (``http://127.0.0.1:4443``; without a scheme,
    plain HTTP), without credentials: an emulator takes anonymous requests, and Arrow would
    otherwise look for Google's default credentials, which a machine outside Google Cloud waits on."""
    scheme, _, endpoint = host.rpartition("://")
    if not endpoint or "/" in endpoint.rstrip("/"):
        raise CaptureError(f"{STORAGE_EMULATOR_HOST}={host!r}: expected host:port, or http://host:port")
    return pafs.GcsFileSystem(anonymous=True, scheme=scheme or "http", endpoint_override=endpoint.rstrip("/"),
                              retry_time_limit=timedelta(seconds=GCS_RETRY_SECONDS))


_F = TypeVar("_F", bound=Callable[..., Any])


def _landing_errors(action: str) -> Callable[[_F], _F]:
    """A `ParquetLanding` method whose file system errors (object storage refusing or unreachable,
    a local folder that cannot be created) become a `CaptureError` naming the landing and what it
    was doing. A chunk's rows written on the local disk before they are published are not wrapped."""
    def wrap(method: _F) -> _F:
        @functools.wraps(method)
        def reported(self: ParquetLanding, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except OSError as exc:  # Arrow's errors too (ArrowIOError is one)
                reason = " ".join(str(exc).split()) or type(exc).__name__
                raise CaptureError(f"{self.path}: can't {action}: {reason}") from exc
        return reported  # type: ignore[return-value]
    return wrap


class ParquetLanding:
    """A landing folder: a local (or mounted) path, or a URI Arrow reaches (`arrow_filesystem`).

    Read through Arrow's file system either way; written locally with a flush and a rename
    into place, elsewhere by an upload and a move (see the module doc).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        remote = arrow_filesystem(self.path)
        #: the local folder, None for a URI
        self._dir = local_folder(self.path) if remote is None else None
        self._fs, root = (pafs.LocalFileSystem(), str(self._dir)) if remote is None else remote
        self._root = root.rstrip("/")
        self._work: Path | None = self._dir  # where chunks are written before they are published

    def _name(self, name: str) -> str:
        """``name`` in the landing, as the file system spells it."""
        return f"{self._root}/{name}"

    def _uri(self, name: str) -> str:
        """``name`` in the landing, as the user spelled the landing."""
        return str(self._dir / name) if self._dir is not None else f"{self.path.rstrip('/')}/{name}"

    def part_path(self, chunk: int) -> str:
        return self._uri(f"part-{chunk:08d}.parquet")

    def _names(self) -> list[str]:
        found = self._fs.get_file_info(pafs.FileSelector(self._root, allow_not_found=True))
        return sorted(f.base_name for f in found if f.type == pafs.FileType.File)

    def _parts(self) -> Iterator[tuple[int, str]]:
        for name in self._names():
            match = _PART.match(name)
            if match:
                yield int(match.group(1)), name

    # -- what was landed --------------------------------------------------------------

    @_landing_errors("read the landing's information")
    def info(self) -> dict[str, Any] | None:
        """The recorded landing information, or None for a new landing."""
        where = self._name(LANDING_INFO_FILE)
        if self._fs.get_file_info(where).type == pafs.FileType.NotFound:
            return None
        with self._fs.open_input_stream(where) as stream:
            text = bytes(stream.read()).decode()
        try:
            info = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CaptureError(f"{self._uri(LANDING_INFO_FILE)} is not valid JSON: {exc}") from exc
        if not isinstance(info, dict):
            raise CaptureError(f"{self._uri(LANDING_INFO_FILE)} does not hold a JSON object")
        return info

    @_landing_errors("read the last chunk's record")
    def last_chunk(self) -> ChunkRecord | None:
        """The newest landed chunk (from its file's footer), or None when nothing was landed."""
        parts = list(self._parts())
        if not parts:
            return None
        chunk, name = parts[-1]
        if chunk != len(parts) - 1:
            raise CaptureError(f"{self.path}: chunk files are not numbered 0..{len(parts) - 1}"
                               f" (the last is {name}): the landing was edited by hand")
        metadata = pq.read_metadata(self._name(name), filesystem=self._fs).metadata or {}
        where = self._uri(name)
        try:
            record = ChunkRecord(**json.loads(metadata[_CHUNK_KEY]))
        except (KeyError, TypeError, ValueError) as exc:
            raise CaptureError(f"{where} has no readable chunk record in its footer"
                               f" ({_CHUNK_KEY.decode()}): not written by pgoutput-spark capture") from exc
        if record.chunk != chunk:
            raise CaptureError(f"{where} records chunk {record.chunk}: the landing was edited by hand")
        return record

    # -- landing ------------------------------------------------------------------------

    @_landing_errors("create or check the landing")
    def open(self, info: Mapping[str, Any]) -> None:
        """Create the landing (or check it was landed with the same `info`); remove half-written files."""
        self._fs.create_dir(self._root, recursive=True)
        if self._work is None:
            self._work = Path(tempfile.mkdtemp(prefix="pgoutput-capture-"))
            weakref.finalize(self, shutil.rmtree, self._work, ignore_errors=True)
        recorded = self.info()
        if recorded is None:
            if any(True for _ in self._parts()):
                raise CaptureError(f"{self.path} holds capture files but no {LANDING_INFO_FILE}:"
                                   " land into a new folder")
            temp = self._name(f"{_TEMP_PREFIX}info-{os.getpid()}.json")
            with self._fs.open_output_stream(temp) as out:
                out.write((json.dumps(info, indent=2, sort_keys=True) + "\n").encode())
            self._fs.move(temp, self._name(LANDING_INFO_FILE))
            if self._dir is not None:
                _fsync_dir(self._dir)
        else:
            check_same_landing(recorded, info, f"{self.path}", "folder")
        for name in self._names():
            if name.startswith(_TEMP_PREFIX):
                self._fs.delete_file(self._name(name))

    def new_chunk(self, chunk: int, *, compression: str = "zstd") -> ChunkFile:
        assert self._work is not None, "open() first"
        return ChunkFile(self._work, chunk, compression=compression, publish=self._publish)

    @_landing_errors("publish a chunk file")
    def _publish(self, source: Path, record: ChunkRecord) -> str:
        target = self._name(f"part-{record.chunk:08d}.parquet")
        if self._dir is not None:
            with open(source, "rb") as handle:
                os.fsync(handle.fileno())
            os.replace(source, target)
            _fsync_dir(self._dir)
        else:
            upload = self._name(f"{_TEMP_PREFIX}{record.chunk:08d}-{os.getpid()}.parquet")
            pafs.copy_files(str(source), upload, source_filesystem=pafs.LocalFileSystem(),
                            destination_filesystem=self._fs)
            self._fs.move(upload, target)
        return self.part_path(record.chunk)
