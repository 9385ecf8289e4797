"""`rows.converted`: a net-change task's batches converted in threads, in their order;
`rows.looked_up_keys`: the keys a table's change rows look up in its mirror, on the driver."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from pgoutput_spark.decoder import kernel
from pgoutput_spark.mirroring.net import TableSpec
from pgoutput_spark.mirroring.rows import CONVERT_THREADS, converted, looked_up_keys


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


def _changes(*chunks: list[tuple[str, dict | None, int, str | None]]) -> pa.Table:
    """Typed change rows (the columns `looked_up_keys` reads): (op, old, id, v), in ``chunks``."""
    schema = pa.schema([("_op", pa.string()), ("_old", pa.struct([("id", pa.int64()), ("v", pa.string())])),
                        ("id", pa.int64()), ("v", pa.string())])
    return pa.Table.from_batches([pa.record_batch([pa.array(c) for c in zip(*rows)], schema=schema)
                                  for rows in chunks], schema=schema)


def test_a_keyed_tables_rows_look_up_their_old_keys_and_updates_without_one_their_own():
    rows = _changes(
        [("insert", None, 1, "new"), ("update", {"id": 2, "v": None}, 20, "moved"),
         ("update", None, 3, "same key")],
        [("delete", {"id": 4, "v": None}, None, None), ("update", None, 5, None), ("insert", None, 6, "x")])
    keys = looked_up_keys(rows, TableSpec("keyed", ("id",), ("id", "v")))
    assert keys.column_names == ["__pgoutput_spark_key_0"]
    assert sorted(keys.column(0).to_pylist()) == [2, 3, 4, 5]  # not the inserts' keys, nor 20


def test_a_multisets_rows_look_up_their_old_rows_nulls_and_all():
    rows = _changes(
        [("update", {"id": 1, "v": None}, 1, "b"), ("update", None, 7, "no old row")],
        [("delete", {"id": None, "v": "a"}, None, None), ("insert", None, 2, "c")])
    keys = looked_up_keys(rows, TableSpec("multiset", ("id", "v"), ("id", "v")))
    assert keys.schema.types == [pa.int64(), pa.string()]
    assert sorted(zip(*[c.to_pylist() for c in keys.columns]), key=str) == [(1, None), (None, "a")]
    assert looked_up_keys(rows.slice(3), TableSpec("multiset", ("id", "v"), ("id", "v"))).num_rows == 0


@pytest.mark.skipif(kernel.numba is None, reason="numba is not installed: rows are not hashed, no halves")
def test_a_table_is_netted_in_halves_a_task_per_net_task_rows_whatever_its_updates_move():
    from pgoutput_spark.assemble.typed import change_schema
    from pgoutput_spark.mirroring.rows import halved_tasks, net_tasks

    schema = change_schema([("a", pa.int32()), ("m", pa.map_(pa.string(), pa.string()))])
    multiset = TableSpec("multiset", ("a", "m"), ("a", "m"))
    assert [halved_tasks(rows, multiset, schema, 1000) for rows in (0, 1000, 1001, 5500)] == [1, 1, 2, 6]
    assert net_tasks(5500, 5000, multiset, 1000) == 1  # joined buckets: one task
    assert halved_tasks(5500, TableSpec("keyed", ("a",), ("a", "m")), schema, 1000) == 6
    # Nothing to hash alike in every task (a map's codes are numbered in each): `net_tasks` decides.
    assert halved_tasks(5500, TableSpec("multiset", ("m",), ("m",)), schema, 1000) == 1
    assert halved_tasks(5500, TableSpec("keyed", ("m",), ("a", "m")), schema, 1000) == 1
