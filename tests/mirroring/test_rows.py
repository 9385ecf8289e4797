"""`rows.converted`: a net-change task's batches converted in threads, in their order."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from pgoutput_spark.mirroring.rows import CONVERT_THREADS, converted


def _batch(i: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array([i])], names=["i"])


def test_batches_come_back_in_their_order_converted_in_threads():
    seen: list[str] = []

    def convert(batch: pa.RecordBatch) -> pa.RecordBatch:
        i = batch.column(0)[0].as_py()
        seen.append(threading.current_thread().name)
        time.sleep(0.02 * (i % 3))  # later batches may finish first
        return pa.record_batch([pa.array([i * 10])], names=["i"])

    out = converted((_batch(i) for i in range(9)), convert)
    assert [b.column(0)[0].as_py() for b in out] == [i * 10 for i in range(9)]
    assert seen[0] == threading.current_thread().name  # the first batch: in the task's own thread
    assert 1 < len(set(seen[1:])) <= CONVERT_THREADS


def test_one_batch_starts_no_thread_and_none_gives_nothing():
    names: list[str] = []
    out = converted([_batch(1)], lambda b: names.append(threading.current_thread().name) or b)
    assert len(out) == 1 and names == [threading.current_thread().name]
    assert converted([], lambda b: b) == []


def test_the_first_failing_batch_in_order_stops_the_task():
    def convert(batch: pa.RecordBatch) -> pa.RecordBatch:
        i = batch.column(0)[0].as_py()
        if i in (3, 6):
            time.sleep(0.05 if i == 3 else 0)  # batch 6 fails first in time
            raise ValueError(f"batch {i}")
        return batch

    with pytest.raises(ValueError, match="batch 3"):
        converted((_batch(i) for i in range(8)), convert)
