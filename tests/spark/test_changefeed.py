"""The changes job, run file by file as captures land, against test_decoding."""

from __future__ import annotations

from pyspark.sql import types as T

from pgoutput_spark import read_capture
from pgoutput_spark.changefeed import run_changes
from pgoutput_spark.testing.capture_files import CapturedMessage, write_capture_parquet

from ..decoder.tuple_oracle import Change, Truncate

TABLES = {"a": ("id", "v"), "b": ("id", "a_id", "v"), "c": ("k", "n")}
INTS = {"id", "a_id", "n"}


def _typed(name, text):
    return int(text) if name in INTS and text is not None else text


def _oracle_by_table(oracle):
    out = {t: [] for t in TABLES}
    for change in oracle:
        if isinstance(change, Truncate):
            for _, table in change.relations:
                out[table].append(("truncate", None))
            continue
        table = change.relation[1]
        values = change.new if change.new is not None else None
        row = tuple(_typed(c.name, c.text) for c in values) if values else None
        out[table].append((change.action.lower(), row))
    return out


def _ours(spark, target, table):
    frame = spark.read.format("delta").load(f"{target}/_changes/public/{table}")
    rows = frame.orderBy("_commit_seq", "_seq").collect()
    return frame.schema, [(r["_op"], tuple(r[c] for c in TABLES[table]) if r["_op"] in ("insert", "update")
                           else None) for r in rows]


def _versions(spark, path):
    return spark.sql(f"DESCRIBE HISTORY delta.`{path}`").count()


def test_file_by_file_runs_equal_test_decoding_and_rerun_is_a_no_op(spark, captured, tmp_path):
    messages, oracle = captured
    landing = tmp_path / "landing"
    target = str(tmp_path / "target")
    cuts = [0, 181, 900, len(messages)]  # inside a stream block, mid-workload
    for k, (lo, hi) in enumerate(zip(cuts, cuts[1:])):
        part = [CapturedMessage(m.seq, m.lsn, m.xid, m.data) for m in messages[lo:hi]]
        for path in write_capture_parquet(part, tmp_path / f"chunk{k:02d}"):
            landing.mkdir(exist_ok=True)
            path.rename(landing / f"{k:02d}-{path.name}")  # files land one by one
        result = run_changes(spark, read_capture(spark, str(landing)), target)
        assert not result.skipped and result.hi == messages[hi - 1].seq
    expected = _oracle_by_table(oracle)
    for table in TABLES:
        schema, rows = _ours(spark, target, table)
        assert rows == expected[table], table
    schema, _ = _ours(spark, target, "a")
    assert schema["id"].dataType == T.IntegerType() and schema["v"].dataType == T.StringType()
    assert schema["_commit_ts"].dataType == T.TimestampType()

    before = {t: _versions(spark, f"{target}/_changes/public/{t}") for t in TABLES}
    again = run_changes(spark, read_capture(spark, str(landing)), target)
    assert again.skipped
    assert {t: _versions(spark, f"{target}/_changes/public/{t}") for t in TABLES} == before
