"""A mirror's MERGE against other writers of the same Delta table while it runs.

Users compact mirrors (a scheduled ``OPTIMIZE``, auto compaction); such a
commit rewrites files without changing rows, and a MERGE that loses to it is
retried. A commit that changes rows fails the MERGE with a clear error. The
other writer commits while the MERGE evaluates its source: a Python UDF in the
source waits there until a driver thread has committed.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pgoutput_spark.mirroring.delta import append
from pgoutput_spark.mirroring.merge import MirrorConflictError, merge
from pgoutput_spark.mirroring.net import TableSpec

from .gate import gate_keeper

pytestmark = pytest.mark.spark

SPEC = TableSpec("keyed", ("id",), ("id", "v"))


def _mirror(spark: Any, path: str) -> None:
    """A mirror of rows 1..30 in three files (something for OPTIMIZE to compact)."""
    for n in range(3):
        rows = spark.createDataFrame([(i, f"row {i}") for i in range(n * 10 + 1, n * 10 + 11)], "id int, v string")
        append(path, rows, SPEC, app_id="p:relation:1", version=n + 1, metadata={"to_lsn": n + 1},
               create=n == 0)


def _gated_source(spark: Any, gate: Path) -> Any:
    """Net rows (update 5, delete 6, insert 31) whose first evaluation waits for ``gate/done``."""
    rows = [("upsert", 5, "updated"), ("delete", 6, None), ("upsert", 31, "inserted")]
    source = spark.createDataFrame(rows, "_action string, id int, v string").repartition(1)
    return source.withColumn("id", F.udf(gate_keeper(gate), T.IntegerType())("id"))


def _while_merging(spark: Any, gate: Path, sql: str) -> threading.Thread:
    """A thread that runs ``sql`` in a session of its own once the MERGE evaluates its source."""
    def run() -> None:
        while not (gate / "started").exists():
            time.sleep(0.05)
        try:
            spark.newSession().sql(sql).collect()
        finally:
            (gate / "done").touch()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _operations(spark: Any, path: str) -> list[str]:
    return [r[0] for r in spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").select(
        "operation").collect()]


def _rows(spark: Any, path: str) -> list[tuple[int, str]]:
    return sorted(tuple(r) for r in spark.read.format("delta").load(path).collect())


def test_a_merge_that_loses_to_a_concurrent_optimize_is_retried(spark: Any, tmp_path: Path) -> None:
    path, gate = str(tmp_path / "mirror"), tmp_path / "gate"
    gate.mkdir()
    _mirror(spark, path)
    other = _while_merging(spark, gate, f"OPTIMIZE delta.`{path}`")
    counts = merge(spark, path, _gated_source(spark, gate), SPEC, truncated=False, app_id="p:relation:1",
                   version=10, metadata={"to_lsn": 10})
    other.join()
    assert counts == {"inserted": 1, "updated": 1, "deleted": 1}
    expected = [(i, f"row {i}") for i in range(1, 31) if i not in (5, 6)] + [(5, "updated"), (31, "inserted")]
    assert _rows(spark, path) == sorted(expected)
    assert _operations(spark, path)[-2:] == ["OPTIMIZE", "MERGE"]  # the retry after it


def test_a_merge_that_loses_to_a_concurrent_change_of_rows_fails_clearly(spark: Any, tmp_path: Path) -> None:
    path, gate = str(tmp_path / "mirror"), tmp_path / "gate"
    gate.mkdir()
    _mirror(spark, path)
    other = _while_merging(spark, gate, f"UPDATE delta.`{path}` SET v = 'behind its back' WHERE id = 5")
    with pytest.raises(MirrorConflictError, match=r"mirror: a concurrent UPDATE commit changed its rows or schema .* "
                                                  r"this MERGE wrote nothing. Re-run"):
        merge(spark, path, _gated_source(spark, gate), SPEC, truncated=False, app_id="p:relation:1",
              version=10, metadata={"to_lsn": 10})
    other.join()
    assert _operations(spark, path)[-1] == "UPDATE"
    assert (5, "behind its back") in _rows(spark, path) and (31, "inserted") not in _rows(spark, path)
