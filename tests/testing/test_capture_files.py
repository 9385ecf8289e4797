"""write_capture_parquet: file splitting, schema and streaming checks (no server)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pgoutput_spark.testing.capture_files import (
    CAPTURE_SCHEMA,
    CapturedMessage,
    write_capture_parquet,
)


def _messages(n: int) -> list[CapturedMessage]:
    return [CapturedMessage(seq, 0x1000 + 8 * seq, 700 + seq % 3, bytes([seq % 256]) * (seq % 5)) for seq in range(n)]


def _seqs_per_file(files: list[Path]) -> list[list[int]]:
    return [pq.read_table(f).column("seq").to_pylist() for f in files]


def test_cut_points_start_files(tmp_path: Path) -> None:
    messages = _messages(10)
    files = write_capture_parquet(messages, tmp_path, cut_points=[3, 7])
    assert [f.name for f in files] == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert _seqs_per_file(files) == [[0, 1, 2], [3, 4, 5, 6], [7, 8, 9]]
    table = pq.read_table(files[1])
    assert table.schema.equals(CAPTURE_SCHEMA)
    assert table.to_pylist()[0] == {"seq": 3, "lsn": 0x1018, "xid": 700, "data": b"\x03\x03\x03"}


def test_cuts_at_start_or_past_end_make_no_empty_file(tmp_path: Path) -> None:
    files = write_capture_parquet(_messages(4), tmp_path, cut_points=[0, 4, 99])
    assert _seqs_per_file(files) == [[0, 1, 2, 3]]


def test_rows_per_file_and_cut_points_combine(tmp_path: Path) -> None:
    files = write_capture_parquet(_messages(9), tmp_path, rows_per_file=4, cut_points=[2], batch_rows=3)
    assert _seqs_per_file(files) == [[0, 1], [2, 3, 4, 5], [6, 7, 8]]


def test_streams_a_generator_in_batches(tmp_path: Path) -> None:
    consumed = 0

    def generate() -> Iterator[CapturedMessage]:
        nonlocal consumed
        for message in _messages(25):
            consumed += 1
            yield message

    files = write_capture_parquet(generate(), tmp_path, rows_per_file=10, batch_rows=4)
    assert consumed == 25
    assert [len(s) for s in _seqs_per_file(files)] == [10, 10, 5]
    assert [pq.ParquetFile(f).metadata.num_row_groups for f in files] == [3, 3, 2]


def test_empty_capture_writes_nothing(tmp_path: Path) -> None:
    assert write_capture_parquet([], tmp_path / "out") == []
    assert list((tmp_path / "out").iterdir()) == []


def test_seq_must_increase(tmp_path: Path) -> None:
    messages = _messages(3)
    with pytest.raises(ValueError, match="seq 1 follows 2"):
        write_capture_parquet([messages[0], messages[2], messages[1]], tmp_path)


def test_existing_files_need_overwrite(tmp_path: Path) -> None:
    write_capture_parquet(_messages(6), tmp_path, rows_per_file=2)
    with pytest.raises(FileExistsError, match="3 capture file"):
        write_capture_parquet(_messages(2), tmp_path)
    files = write_capture_parquet(_messages(2), tmp_path, overwrite=True)
    assert sorted(tmp_path.iterdir()) == files


def test_bad_sizes_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="rows_per_file"):
        write_capture_parquet(_messages(1), tmp_path, rows_per_file=0)
