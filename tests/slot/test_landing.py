"""The Parquet landing: chunk files, their footer records, and what a new run finds (no server)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pgoutput_spark.errors import CaptureError
from pgoutput_spark.slot.landing import CAPTURE_SCHEMA, LANDING_INFO_FILE, ChunkRecord, ParquetLanding

INFO = {"format": 1, "slot": "s", "options": {"proto_version": 1}}


def _rows(first: int, n: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(range(first, first + n), pa.int64()),
                            pa.array([100 + i for i in range(first, first + n)], pa.int64()),
                            pa.array([7] * n, pa.int64()),
                            pa.array([b"C%d" % i for i in range(first, first + n)], pa.binary())],
                           schema=CAPTURE_SCHEMA)


def test_a_chunk_keeps_the_rows_up_to_its_boundary_and_records_itself(tmp_path: Path) -> None:
    landing = ParquetLanding(tmp_path)
    landing.open(INFO)
    assert landing.last_chunk() is None
    chunk = landing.new_chunk(0)
    for first in (0, 4, 8):
        chunk.write(_rows(first, 4))
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("part-")] == []  # not yet visible
    record = ChunkRecord(chunk=0, first_seq=0, last_seq=9, end_lsn=109, bytes=20)
    path = chunk.commit(record)
    assert pq.read_table(path).column("seq").to_pylist() == list(range(10))
    assert landing.last_chunk() == record
    assert sorted(p.name for p in tmp_path.iterdir()) == [LANDING_INFO_FILE, "part-00000000.parquet"]

    whole = landing.new_chunk(1)
    whole.write(_rows(10, 3))
    whole.commit(ChunkRecord(chunk=1, first_seq=10, last_seq=12, end_lsn=112, bytes=9))
    assert landing.last_chunk().last_seq == 12  # type: ignore[union-attr]


def test_a_discarded_or_crashed_chunk_leaves_nothing_visible(tmp_path: Path) -> None:
    landing = ParquetLanding(tmp_path)
    landing.open(INFO)
    chunk = landing.new_chunk(0)
    chunk.write(_rows(0, 4))
    chunk.discard()
    crashed = landing.new_chunk(0)
    crashed.write(_rows(0, 4))  # a crash now leaves a hidden temporary file
    assert [p.name.startswith("_") for p in tmp_path.iterdir()] == [True, True]
    ParquetLanding(tmp_path).open(INFO)  # the next run removes it
    assert sorted(p.name for p in tmp_path.iterdir()) == [LANDING_INFO_FILE]


def test_a_landing_keeps_its_options_and_refuses_foreign_files(tmp_path: Path) -> None:
    ParquetLanding(tmp_path / "a").open(INFO)
    with pytest.raises(CaptureError, match=r"was landed with options = \{'proto_version': 1\}, this run"):
        ParquetLanding(tmp_path / "a").open({**INFO, "options": {"proto_version": 2}})
    (tmp_path / "b").mkdir()
    pq.write_table(pa.Table.from_batches([_rows(0, 2)]), tmp_path / "b" / "part-00000000.parquet")
    with pytest.raises(CaptureError, match="holds capture files but no _pgoutput_capture.json"):
        ParquetLanding(tmp_path / "b").open(INFO)
    (tmp_path / "b" / LANDING_INFO_FILE).write_text("{}")
    with pytest.raises(CaptureError, match="no readable chunk record in its footer"):
        ParquetLanding(tmp_path / "b").last_chunk()
    (tmp_path / "b" / "part-00000000.parquet").rename(tmp_path / "b" / "part-00000003.parquet")
    with pytest.raises(CaptureError, match="not numbered 0..0"):
        ParquetLanding(tmp_path / "b").last_chunk()
