"""A Delta landing: each chunk is one append to a Delta capture table, exactly once.

The same chunk loop as the Parquet landing (`capture.capture_slot`); the
chunk's rows are written to a Parquet file on the driver, uploaded to a hidden
folder of the table (``_pgoutput_capture_work``, through Hadoop's file systems:
the table may be a URI, ``s3a://...``, and executors elsewhere) and appended by
Spark in one Delta commit that carries the transaction identifier
``txnAppId`` = ``pgoutput_spark_capture:<slot>``, ``txnVersion`` = the chunk
number, and in its ``userMetadata`` the chunk record and the landing
information (slot, options, session settings). The newest such commit says
where the next run starts; `landing_info` gives the settings to `read_capture`.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CaptureError
from .landing import ChunkFile, ChunkRecord, check_same_landing

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["DeltaLanding", "landing_info"]

_KEY = "pgoutput_spark_capture"
_WORK = "_pgoutput_capture_work"


def _latest(spark: SparkSession, path: str) -> dict[str, Any] | None:
    """The newest capture commit's metadata ({"chunk": ..., "landing": ...}) of the table at `path`."""
    from ..capture import _is_delta

    if not _is_delta(spark, path):
        return None
    from ..mirroring.names import absolute_path, path_table

    rows = spark.sql(f"DESCRIBE HISTORY {path_table(absolute_path(path))} LIMIT 50").select(
        "userMetadata").collect()
    for row in rows:
        try:
            meta = json.loads(row["userMetadata"] or "{}").get(_KEY)
        except (ValueError, AttributeError):
            continue
        if meta:
            return dict(meta)
    raise CaptureError(f"{path} is a Delta table without a pgoutput-spark capture commit in its last 50:"
                       " land into a new table")


def landing_info(spark: SparkSession, path: str) -> dict[str, Any] | None:
    """The landing information recorded with a Delta capture table's newest chunk (None: not landed by us)."""
    try:
        latest = _latest(spark, path)
    except CaptureError:
        return None
    return None if latest is None else latest["landing"]


class DeltaLanding:
    """A Delta capture table at a local path or a URI (any file system Spark writes)."""

    def __init__(self, spark: SparkSession, path: str) -> None:
        from ..mirroring.names import absolute_path

        self.spark = spark
        self.path = absolute_path(str(path)).rstrip("/")
        self._info: dict[str, Any] | None = None
        self._latest = _latest(spark, self.path)
        self._local: Path | None = None  # the driver's folder for chunks being written

    def info(self) -> dict[str, Any] | None:
        return None if self._latest is None else self._latest["landing"]

    def last_chunk(self) -> ChunkRecord | None:
        return None if self._latest is None else ChunkRecord(**self._latest["chunk"])

    def open(self, info: Mapping[str, Any]) -> None:
        recorded = self.info()
        if recorded is not None:
            check_same_landing(recorded, info, f"{self.path}", "table")
        from ..spark.files import child, delete

        self._info = dict(info)
        delete(self.spark, child(self.path, _WORK))  # a killed run's upload
        if self._local is None:
            self._local = Path(tempfile.mkdtemp(prefix="pgoutput-capture-"))
            weakref.finalize(self, shutil.rmtree, self._local, ignore_errors=True)

    def new_chunk(self, chunk: int, *, compression: str = "zstd") -> ChunkFile:
        assert self._local is not None, "open() first"
        return ChunkFile(self._local, chunk, compression=compression, publish=self._publish)

    def _publish(self, source: Path, record: ChunkRecord) -> str:
        from ..spark.files import child, delete, upload

        assert self._info is not None, "open() first"
        metadata = json.dumps({_KEY: {"chunk": json.loads(record.as_json()), "landing": self._info}},
                              sort_keys=True)
        slot = self._info.get("slot")
        staged = child(self.path, _WORK, f"chunk-{record.chunk:08d}.parquet")  # Spark skips names with _
        upload(self.spark, source, staged)
        try:
            (self.spark.read.parquet(staged).write.format("delta").mode("append")
             .option("txnAppId", f"{_KEY}:{slot}").option("txnVersion", record.chunk)
             .option("userMetadata", metadata).save(self.path))
        finally:
            delete(self.spark, staged, recursive=False)
        self._latest = {"chunk": json.loads(record.as_json()), "landing": self._info}
        return self.path
