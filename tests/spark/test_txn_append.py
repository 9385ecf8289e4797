"""`txn_append`: appends under Delta's transaction identifiers, checked in the table's checksum.

An append to an existing table of the same schema reads the identifier's last version from the
checksum file Delta writes beside each commit, instead of having Delta's writer reconstruct the
table's whole state for it; the commits must be the writer's: the same identifiers, seen by
Delta's writer and by later appends alike, and a concurrent commit of the same identifier fails.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pgoutput_spark.mirroring.delta import txn_append

from ..plugins.spark import jobs_run
from .deltalog import commits
from .gate import gate_keeper

pytestmark = pytest.mark.spark

APP = "p:runs"


def _rows(spark: Any, first: int, n: int = 2) -> Any:
    return spark.range(first, first + n).selectExpr("id", "CAST(id AS string) AS v")


def _writer_append(frame: Any, path: str, version: int) -> None:
    """Delta's own writer with the same transaction identifiers."""
    frame.write.format("delta").mode("append").option("txnAppId", APP).option("txnVersion", version).save(path)


def _logged_txns(path: str) -> list[tuple[int, str, int]]:
    """(commit, appId, version) of each transaction identifier in the table's log."""
    out = []
    for log in sorted(Path(path, "_delta_log").glob("*.json")):
        for line in log.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action:
                out.append((int(log.stem), action["txn"]["appId"], action["txn"]["version"]))
    return out


def test_appends_checked_in_the_checksum_commit_as_delta_s_writer_does(spark, tmp_path):
    """Appends through the checksum and through Delta's writer, in turn, on one table: each sees
    the other's identifiers; besides the first, only an append with a new column takes the writer's way."""
    path = str(tmp_path / "t")
    txn_append(_rows(spark, 0), path, APP, 1, new_table=True)  # creates the table: Delta's writer
    sessions = spark._jvm.org.apache.spark.sql.SparkSession
    active = sessions.getActiveSession()
    txn_append(_rows(spark.newSession(), 5), path, APP, 1)  # committed: nothing, in another session
    assert sessions.getActiveSession().equals(active)  # the transaction's active session put back
    checked = jobs_run(spark, "checked-append", lambda: txn_append(_rows(spark, 10), path, APP, 2))[1]
    written = jobs_run(spark, "writer-append", lambda: _writer_append(_rows(spark, 20), path, 3))[1]
    assert checked < written, (checked, written)  # no reconstruction of the table's state
    txn_append(_rows(spark, 30), path, APP, 4)  # after the writer's commit: its identifier is seen
    assert _logged_txns(path) == [(0, APP, 1), (1, APP, 2), (2, APP, 3), (3, APP, 4)]

    # Versions committed before write nothing, whichever of the two wrote or writes them.
    before = commits(path)
    txn_append(_rows(spark, 40), path, APP, 2)
    txn_append(_rows(spark, 40), path, APP, 4)
    _writer_append(_rows(spark, 40), path, 4)
    txn_append(_rows(spark, 40), path, APP, 3)
    assert commits(path) == before
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()
    assert [(r["operation"], r["operationParameters"]["mode"], r["isBlindAppend"]) for r in history] == \
        [("WRITE", "Append", True)] * 4

    # Another identifier on the same table, and a new column (the writer merges the schema).
    txn_append(_rows(spark, 50), path, "p:other", 7)
    txn_append(_rows(spark, 60).withColumn("w", F.lit(1.5)), path, APP, 5)
    txn_append(_rows(spark, 70).withColumn("w", F.lit(2.5)), path, APP, 6)
    assert _logged_txns(path)[4:] == [(4, "p:other", 7), (5, APP, 5), (6, APP, 6)]
    rows = sorted(tuple(r) for r in spark.read.format("delta").load(path).collect())
    assert rows == sorted([(i, str(i), None) for first in (0, 10, 20, 30, 50) for i in (first, first + 1)]
                          + [(60, "60", 1.5), (61, "61", 1.5), (70, "70", 2.5), (71, "71", 2.5)])


def test_a_concurrent_commit_of_the_same_identifier_fails_the_checked_append(spark, tmp_path):
    """The checked append's rows are computed while another writer commits the same identifier
    and version: Delta fails the append (the identifier was read), and the rows are there once."""
    path, gate = str(tmp_path / "t"), tmp_path / "gate"
    gate.mkdir()
    txn_append(_rows(spark, 0), path, APP, 1, new_table=True)

    def other_writer() -> None:
        while not (gate / "started").exists():
            time.sleep(0.05)
        try:
            _writer_append(_rows(spark.newSession(), 10), path, 2)
        finally:
            (gate / "done").touch()

    thread = threading.Thread(target=other_writer, daemon=True)
    thread.start()
    gated = _rows(spark, 10).repartition(1).withColumn("id", F.udf(gate_keeper(gate), T.LongType())("id"))
    with pytest.raises(Exception, match="ConcurrentTransaction"):
        txn_append(gated, path, APP, 2)
    thread.join(60)
    assert _logged_txns(path) == [(0, APP, 1), (1, APP, 2)]
    assert sorted(r["id"] for r in spark.read.format("delta").load(path).collect()) == [0, 1, 10, 11]
