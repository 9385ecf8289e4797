"""Reading a folder landed by `pgoutput-spark capture`: its recorded session settings are checked."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from pgoutput_spark import read_capture
from pgoutput_spark.errors import CaptureError
from pgoutput_spark.slot.landing import CAPTURE_SCHEMA, ChunkRecord, ParquetLanding
from pgoutput_spark.slot.settings import SESSION_SETTINGS

pytestmark = pytest.mark.spark


def _land(path: Path, settings: dict[str, str]) -> str:
    landing = ParquetLanding(path)
    landing.open({"format": 1, "settings": settings})
    chunk = landing.new_chunk(0)
    chunk.write(pa.record_batch([pa.array([0], pa.int64()), pa.array([1], pa.int64()),
                                 pa.array([0], pa.int64()), pa.array([b"E"], pa.binary())],
                                schema=CAPTURE_SCHEMA))
    chunk.commit(ChunkRecord(chunk=0, first_seq=0, last_seq=0, end_lsn=1, bytes=1))
    return str(path)


def test_a_landing_read_with_the_capture_settings_reads(spark: SparkSession, tmp_path: Path) -> None:
    capture = read_capture(spark, _land(tmp_path, dict(SESSION_SETTINGS)))
    assert capture.count() == 1 and capture.columns == ["seq", "lsn", "xid", "data"]


def test_a_landing_read_with_settings_the_conversion_cannot_read_is_refused(
        spark: SparkSession, tmp_path: Path) -> None:
    path = _land(tmp_path, {**SESSION_SETTINGS, "IntervalStyle": "iso_8601"})
    with pytest.raises(CaptureError, match=f"{path}: the capture was read with IntervalStyle = 'iso_8601'"):
        read_capture(spark, path)
