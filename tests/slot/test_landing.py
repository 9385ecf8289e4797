"""The Parquet landing: chunk files, their footer records, and what a new run finds (no PostgreSQL).

Each test runs on a local folder, on an S3 bucket (moto's server, `tests/plugins/s3.py`) and on a
GCS bucket (fake-gcs-server, `tests/plugins/gcs.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
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


@dataclass(frozen=True)
class Folder:
    """Where a test lands: ``path`` for `ParquetLanding`, ``fs`` and ``root`` to look inside."""

    path: str
    fs: Any
    root: str

    def sub(self, name: str) -> Folder:
        return Folder(f"{self.path}/{name}", self.fs, f"{self.root}/{name}")

    def names(self) -> list[str]:
        found = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        return sorted(f.base_name for f in found if f.type == pafs.FileType.File)

    def write(self, name: str, data: bytes) -> None:
        with self.fs.open_output_stream(f"{self.root}/{name}") as out:
            out.write(data)

    def move(self, name: str, to: str) -> None:
        self.fs.move(f"{self.root}/{name}", f"{self.root}/{to}")


@pytest.fixture(params=["local", "s3", "gcs"])
def folder(request: pytest.FixtureRequest, tmp_path: Path) -> Folder:
    if request.param == "local":
        return Folder(str(tmp_path), pafs.LocalFileSystem(), str(tmp_path))
    bucket = request.getfixturevalue(request.param)
    return Folder(bucket.uri, bucket.fs, bucket.root)


def _table_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def test_a_chunk_keeps_the_rows_up_to_its_boundary_and_records_itself(folder: Folder) -> None:
    landing = ParquetLanding(folder.path)
    landing.open(INFO)
    assert landing.last_chunk() is None
    chunk = landing.new_chunk(0)
    for first in (0, 4, 8):
        chunk.write(_rows(first, 4))
    assert [n for n in folder.names() if n.startswith("part-")] == []  # not yet visible
    record = ChunkRecord(chunk=0, first_seq=0, last_seq=9, end_lsn=109, bytes=20)
    path = chunk.commit(record)
    assert path == f"{folder.path}/part-00000000.parquet"
    table = pq.read_table(f"{folder.root}/part-00000000.parquet", filesystem=folder.fs)
    assert table.column("seq").to_pylist() == list(range(10))
    assert landing.last_chunk() == record
    assert folder.names() == [LANDING_INFO_FILE, "part-00000000.parquet"]

    whole = landing.new_chunk(1)
    whole.write(_rows(10, 3))
    whole.commit(ChunkRecord(chunk=1, first_seq=10, last_seq=12, end_lsn=112, bytes=9))
    assert ParquetLanding(folder.path).last_chunk().last_seq == 12  # type: ignore[union-attr]


def test_a_discarded_or_crashed_chunk_leaves_nothing_visible(folder: Folder) -> None:
    landing = ParquetLanding(folder.path)
    landing.open(INFO)
    chunk = landing.new_chunk(0)
    chunk.write(_rows(0, 4))
    chunk.discard()
    crashed = landing.new_chunk(0)
    crashed.write(_rows(0, 4))  # a crash now leaves a hidden file in a local landing (S3: on the driver)
    folder.write("_writing-00000000-1.parquet", b"an upload a crash cut short")
    assert [n for n in folder.names() if not n.startswith("_")] == []
    ParquetLanding(folder.path).open(INFO)  # the next run removes it
    assert folder.names() == [LANDING_INFO_FILE]


def test_a_landing_keeps_its_options_and_refuses_foreign_files(folder: Folder) -> None:
    ParquetLanding(folder.sub("a").path).open(INFO)
    with pytest.raises(CaptureError, match=r"was landed with options = \{'proto_version': 1\}, this run"):
        ParquetLanding(folder.sub("a").path).open({**INFO, "options": {"proto_version": 2}})
    b = folder.sub("b")
    folder.fs.create_dir(b.root)
    b.write("part-00000000.parquet", _table_bytes(pa.Table.from_batches([_rows(0, 2)])))
    with pytest.raises(CaptureError, match="holds capture files but no _pgoutput_capture.json"):
        ParquetLanding(b.path).open(INFO)
    b.write(LANDING_INFO_FILE, b"{}")
    with pytest.raises(CaptureError, match="no readable chunk record in its footer"):
        ParquetLanding(b.path).last_chunk()
    b.move("part-00000000.parquet", "part-00000003.parquet")
    with pytest.raises(CaptureError, match="not numbered 0..0"):
        ParquetLanding(b.path).last_chunk()
    b.write(LANDING_INFO_FILE, b"[not json")
    with pytest.raises(CaptureError, match=f"{b.path}/{LANDING_INFO_FILE} is not valid JSON"):
        ParquetLanding(b.path).info()


def test_a_uri_arrow_cannot_reach_is_named_with_the_remedy() -> None:
    with pytest.raises(CaptureError, match=r"gopher://x/landing: a Parquet landing there needs a file system"
                                           r" Arrow reaches \(.*\); land .*--landing-format delta"):
        ParquetLanding("gopher://x/landing")


def test_gs_goes_to_the_emulator_storage_emulator_host_names(monkeypatch: pytest.MonkeyPatch) -> None:
    from pgoutput_spark.slot.landing import arrow_filesystem

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:4443/storage/v1")
    with pytest.raises(CaptureError, match=r"STORAGE_EMULATOR_HOST='http://127.0.0.1:4443/storage/v1': expected"
                                           r" host:port, or http://host:port"):
        ParquetLanding("gs://bucket/landing")
    for host, scheme in (("127.0.0.1:4443", "http"), ("https://127.0.0.1:4443/", "https")):
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", host)
        found = arrow_filesystem("gs://bucket/landing/")
        assert found is not None and found[1] == "bucket/landing"
        options = found[0].__reduce__()[1][0]  # what the file system was made with
        assert isinstance(found[0], pafs.GcsFileSystem) and options["anonymous"]
        assert (options["scheme"], options["endpoint_override"]) == (scheme, "127.0.0.1:4443")


def test_a_gs_landing_retries_for_a_bounded_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from pgoutput_spark.slot.landing import GCS_RETRY_SECONDS, arrow_filesystem

    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    found = arrow_filesystem("gs://bucket/landing")  # no request yet: nothing waits on credentials
    assert found is not None and found[1] == "bucket/landing"
    options = found[0].__reduce__()[1][0]
    assert isinstance(found[0], pafs.GcsFileSystem) and not options["anonymous"]
    assert GCS_RETRY_SECONDS == 120 and options["retry_time_limit"].total_seconds() == GCS_RETRY_SECONDS


def test_object_storage_errors_name_the_landing_and_what_it_was_doing(s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from pgoutput_spark.slot import landing as module
    from pgoutput_spark.testing.pgcluster import free_port

    # S3 (moto, the `s3` fixture's endpoint): a bucket that is not there.
    with pytest.raises(CaptureError, match=r"^s3a://no-such-bucket/landing: can't create or check the landing: "
                                           r".*no-such-bucket"):
        ParquetLanding("s3a://no-such-bucket/landing").open(INFO)
    # GCS: nothing listens where STORAGE_EMULATOR_HOST points; its retries bounded (1 s here).
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setattr(module, "GCS_RETRY_SECONDS", 1)
    with pytest.raises(CaptureError, match=r"^gs://bucket/landing: can't read the landing's information: .*\S"):
        ParquetLanding("gs://bucket/landing").info()
