"""A Spark Connect session: the capture's reads (`read_capture`, `decode`, `changes`) and the
target's (`status`, `mirror`, `history`, `verify`) work in it; the jobs refuse it.

The Spark Connect session is a client of a local Spark Connect server that PySpark starts
(``SparkSession.builder.remote("local[1]")``), in a process of its own: a Spark Connect client
changes how PySpark builds columns in its whole process. Its results are compared with the
test session's (a classic one) on the same captures and target, its changes with what
PostgreSQL's ``test_decoding`` saw on a twin slot, and the mirror with PostgreSQL's table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pgoutput_spark import changes, decode, history, mirror, quarantined, read_capture, status
from pgoutput_spark.apply import run_apply
from pgoutput_spark.config import TablesConfig
from pgoutput_spark.slot.capture import capture_slot
from pgoutput_spark.slot.verify import verify_mirrors
from pgoutput_spark.spark.assemble import assemble

from .plugins.postgres import new_database

ROOT = Path(__file__).resolve().parents[1]

# Run in the Spark Connect client's process: the same captures decoded and their changes typed,
# each frame's rows as JSON (Spark's own rendering, the same in both sessions), and the
# refusals of what needs a classic session.
_CLIENT = r"""
import json, sys
from delta import configure_spark_with_delta_pip
from pyspark.sql import SparkSession, functions as F

args = json.loads(sys.argv[1])
builder = SparkSession.builder.remote("local[1]")
for key, value in args["conf"].items():
    builder = builder.config(key, value)
spark = configure_spark_with_delta_pip(builder).getOrCreate()

from pgoutput_spark import (CaptureError, ConfigError, changes, decode, history, mirror, quarantined, read_capture,
                            status)
from pgoutput_spark.apply import run_apply
from pgoutput_spark.changefeed import run_changes
from pgoutput_spark.slot.capture import capture_slot
from pgoutput_spark.slot.snapshot import snapshot_tables
from pgoutput_spark.slot.verify import verify_mirrors
from pgoutput_spark.spark.assemble import assemble
from pgoutput_spark.spark.connect import is_connect

def lines(frame):
    return sorted(r[0] for r in frame.select(F.to_json(F.struct(*frame.columns))).collect())

out = {"connect": is_connect(spark), "decoded": {}, "quarantined": {}, "refused": {}}
for name, path in args["captures"].items():
    decoded = decode(read_capture(spark, path), on_error="quarantine")
    out["decoded"][name] = lines(decoded)
    out["quarantined"][name] = lines(quarantined(decoded))
    if name == "landing":
        out["changes"] = {table: lines(frame) for table, frame in changes(decoded).items()}
    if name == "sample":  # its transactions placed by a window per seq bucket, not by a lookup
        out["by_window"] = lines(assemble(decoded, lookup_limit=0, rows_per_bucket=500).committed)
try:
    read_capture(spark, args["missing"])
except CaptureError as exc:
    out["missing"] = str(exc)

target = args["target"]  # a classic session's apply wrote it
state = status(spark, target)
out["status"] = [state.read_point, state.position, sorted(state.mirrors.items())]
out["mirror"] = lines(mirror(spark, target, "public.t"))
out["mirror_then"] = lines(mirror(spark, target, "public.t", as_of_lsn=state.read_point))
out["history"] = lines(history(spark, target, "public.t"))
out["history_then"] = lines(history(spark, target, "public.t", as_of_lsn=state.read_point))
out["verify"] = {name: verify_mirrors(spark, target, args["captures"][name], dsn=args["dsn"]).render()
                 for name in ("landing", "delta")}

capture, target, dsn = read_capture(spark, args["captures"]["landing"]), args["refused_target"], args["dsn"]
refusals = {
    "apply": lambda: run_apply(spark, capture, target),
    "the changes job": lambda: run_changes(spark, capture, target),
    "snapshot": lambda: snapshot_tables(spark, target, publications=["pub"], dsn=dsn),
    "a Delta landing": lambda: capture_slot(args["delta_landing"], slot=args["slot"], dsn=dsn,
                                            publications=["pub"], format="delta", spark=spark),
}
for what, call in refusals.items():
    try:
        call()
    except ConfigError as exc:
        out["refused"][what] = str(exc)
print(json.dumps(out))
"""


def _lines(frame: DataFrame) -> list[str]:
    return sorted(r[0] for r in frame.select(F.to_json(F.struct(*frame.columns))).collect())


def _kinds(lines: list[str], relation_ids: set[int]) -> Counter[str]:
    """Decoded Insert / Update / Delete messages of ``relation_ids``, by kind."""
    rows = [json.loads(line) for line in lines]
    return Counter(r["message_type"] for r in rows
                   if r["message_type"] in ("insert", "update", "delete")
                   and r["change"]["relation_id"] in relation_ids)


def _slot_position(pg: Any, db: str) -> Any:
    return pg.query("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s",
                    (f"{db}_parquet",))


@pytest.mark.spark
@pytest.mark.postgres
def test_the_notebook_reads_work_in_a_spark_connect_session_and_the_jobs_refuse_it(
        spark: Any, pg15: Any, tmp_path: Path) -> None:
    db = new_database(pg15, "connect")
    pg15.execute("CREATE TABLE t (id int PRIMARY KEY, v text, n numeric(8, 2), at timestamptz, b bytea);"
                 " CREATE PUBLICATION pub FOR TABLE t", dbname=db)
    for name in ("parquet", "delta", "oracle"):
        pg15.create_slot(f"{db}_{name}", "test_decoding" if name == "oracle" else "pgoutput", dbname=db)
    pg15.execute("INSERT INTO t SELECT i, repeat('x', i), i * 1.5, '2026-12-05 12:00+00'::timestamptz"
                 " + i * interval '1 hour', int4send(i) FROM generate_series(1, 40) i;"
                 " UPDATE t SET v = 'changed', n = NULL WHERE id % 3 = 0;"
                 " UPDATE t SET id = id + 100 WHERE id % 7 = 0;"
                 " DELETE FROM t WHERE id % 5 = 0", dbname=db)
    landing, delta_landing = tmp_path / "landing", tmp_path / "delta_landing"
    capture_slot(str(landing), slot=f"{db}_parquet", dsn=pg15.conninfo(db), publications=["pub"],
                 proto_version=2, chunk_size=20)
    capture_slot(str(delta_landing), slot=f"{db}_delta", dsn=pg15.conninfo(db), publications=["pub"],
                 proto_version=1, chunk_size=20, format="delta", spark=spark)
    bad = tmp_path / "bad"  # a Begin and an Insert cut short, between whole messages
    bad.mkdir()
    pq.write_table(pa.table({"seq": pa.array([0, 1, 2, 3], pa.int64()), "lsn": pa.array([1, 1, 2, 3], pa.int64()),
                             "data": [b"B" + bytes(20), b"B\x00\x01", b"I\x00\x00\x40\x00N\x00\x01t",
                                      b"C" + bytes(25)]}), bad / "part-0.parquet")
    captures = {"sample": str(ROOT / "examples" / "sample_capture"), "landing": str(landing),
                "delta": str(delta_landing), "bad": str(bad)}
    target, refused = tmp_path / "target", tmp_path / "refused_target"
    run_apply(spark, read_capture(spark, str(landing)), str(target), tables=TablesConfig(history=("public.t",)))
    args = {
        "captures": captures, "missing": str(tmp_path / "nothing"), "target": str(target),
        "refused_target": str(refused),
        "dsn": pg15.conninfo(db), "slot": f"{db}_parquet", "delta_landing": str(tmp_path / "refused_landing"),
        "conf": {"spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
                 "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
                 "spark.sql.session.timeZone": "UTC", "spark.sql.shuffle.partitions": "2",
                 "spark.databricks.delta.snapshotPartitions": "1", "spark.ui.enabled": "false"},
    }
    position = _slot_position(pg15, db)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", _CLIENT, json.dumps(args)], cwd=tmp_path, env=env, text=True,
                         capture_output=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["connect"] is True

    # The same rows as the classic session's: the sample capture's streamed transactions, and
    # PostgreSQL's messages as `capture` lands them in Parquet (its landing record read) and in Delta.
    for name, path in captures.items():
        decoded = decode(read_capture(spark, path), on_error="quarantine")
        assert got["decoded"][name] == _lines(decoded), name
        assert got["quarantined"][name] == _lines(quarantined(decoded)), name
        if name == "landing":
            assert got["changes"] == {table: _lines(frame) for table, frame in changes(decoded).items()}
        if name == "sample":
            assert got["by_window"] == _lines(assemble(decoded).committed)
    assert got["changes"].keys() == {"public.t"}
    assert [json.loads(line)["seq"] for line in got["quarantined"]["bad"]] == [1, 2]
    assert not any(got["quarantined"][name] for name in ("sample", "landing", "delta"))
    assert got["missing"] == f"can't read capture {str(tmp_path / 'nothing')!r}: it does not exist"

    # And the changes PostgreSQL decoded on its own slot, by kind.
    oracle = Counter(text.split(":")[1].strip() for _, _, text in pg15.peek_test_decoding(f"{db}_oracle", dbname=db)
                     if text.startswith("table public.t:"))
    relation_ids = {json.loads(line)["relation"]["relation_id"] for line in got["decoded"]["landing"]
                    if json.loads(line)["message_type"] == "relation"}
    for name in ("landing", "delta"):
        kinds = _kinds(got["decoded"][name], relation_ids)
        assert kinds == {k.lower(): n for k, n in oracle.items()} and len(kinds) == 3, name
    assert len(got["changes"]["public.t"]) == sum(oracle.values())

    # The target as the classic session reads it, and the mirror as PostgreSQL has the table.
    state = status(spark, str(target))
    assert got["status"] == json.loads(json.dumps([state.read_point, state.position, sorted(state.mirrors.items())]))
    assert got["mirror"] == got["mirror_then"] == _lines(mirror(spark, str(target), "public.t"))
    assert got["history"] == _lines(history(spark, str(target), "public.t"))
    assert got["history_then"] == _lines(history(spark, str(target), "public.t", as_of_lsn=state.read_point))
    mirrored = [json.loads(line, parse_float=Decimal) for line in got["mirror"]]  # NULLs left out
    assert sorted((r["id"], r["v"], r.get("n")) for r in mirrored) == \
        sorted(pg15.query("SELECT id, v, n FROM t", dbname=db), key=lambda r: r[0])

    # `verify` against PostgreSQL, as in the classic session, with either landing's record.
    for name in ("landing", "delta"):
        verified = verify_mirrors(spark, str(target), captures[name], dsn=pg15.conninfo(db))
        assert [t.state for t in verified.tables] == ["equal"] and got["verify"][name] == verified.render(), name

    # What needs the driver's JVM refuses the session before it reads or writes anything.
    assert sorted(got["refused"]) == sorted(["apply", "the changes job", "snapshot", "a Delta landing"])
    for what, message in got["refused"].items():
        assert message.startswith(f"{what} needs a classic Spark session: "), message
        assert "nothing was read or written" in message and "read_capture, decode" in message
    assert not refused.exists() and not (tmp_path / "refused_landing").exists()
    assert _slot_position(pg15, db) == position  # the refused capture read nothing of the slot
    for name in ("parquet", "delta", "oracle"):
        pg15.drop_slot(f"{db}_{name}", dbname=db)


def test_a_file_spark_skips_and_this_process_cannot_read_is_named(tmp_path: Path) -> None:
    """In a Spark Connect session a landing's record is read by the client's process, which may
    not reach the server's files: then the capture is not read unchecked."""
    from pgoutput_spark.errors import CaptureError
    from pgoutput_spark.spark.files import _client_text

    record = tmp_path / "_pgoutput_capture.json"
    record.write_text('{"settings": {}}', encoding="utf-8")
    assert _client_text(str(record)) == '{"settings": {}}' == _client_text(record.as_uri())
    with pytest.raises(CaptureError, match=r"_gone\.json: a Spark Connect session's Spark skips this file, and this "
                                           r"process cannot read it either \(.*No such file"):
        _client_text(str(tmp_path / "_gone.json"))


@pytest.mark.parametrize("env, conf, asked", [
    ({"SPARK_REMOTE": "sc://localhost:15002"}, None, "SPARK_REMOTE=sc://localhost:15002"),
    ({"SPARK_API_MODE": "connect"}, None, "SPARK_API_MODE=connect"),
    ({}, {"spark.api.mode": "connect"}, "spark.api.mode=connect"),
    ({}, {"spark.remote": "sc://spark.example:15002"}, "spark.remote=sc://spark.example:15002"),
])
def test_a_session_asked_of_spark_connect_is_refused_before_anything_starts(monkeypatch, capsys, env, conf, asked):
    """What would make PySpark's builder return a Spark Connect session, `build_spark_session` and
    so every command refuse, naming it (the test's own session is untouched: nothing starts)."""
    from pgoutput_spark import ConfigError, build_spark_session
    from pgoutput_spark.cli import main
    from pgoutput_spark.spark.connect import asks_for_connect

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert asks_for_connect(conf) == asked
    with pytest.raises(ConfigError, match=rf"^{asked} asks PySpark for a Spark Connect session, and pgoutput-spark "
                                          r"builds classic ones: .* nothing was started"):
        build_spark_session(master="local[1]", conf=conf)
    if conf is None:
        assert main(["decode", "--capture", str(ROOT / "examples" / "sample_capture")]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"pgoutput-spark: error: {asked} asks PySpark for a Spark Connect session, and "
                       f"pgoutput-spark builds classic ones: its jobs need the driver's JVM; nothing was started. "
                       f"Unset it to run them here; in a notebook on Spark Connect, pass its own session to "
                       f"read_capture, decode, changes, status, mirror, history and verify"]


def test_a_classic_api_mode_chosen_in_conf_wins_over_the_environment(monkeypatch):
    from pgoutput_spark.spark.connect import asks_for_connect

    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    monkeypatch.delenv("SPARK_CONNECT_MODE_ENABLED", raising=False)
    monkeypatch.setenv("SPARK_API_MODE", "connect")
    assert asks_for_connect({"spark.api.mode": "classic"}) is None
    assert asks_for_connect(None) == "SPARK_API_MODE=connect"
    monkeypatch.delenv("SPARK_API_MODE")
    assert asks_for_connect({"spark.api.mode": "CLASSIC"}) is None and asks_for_connect(None) is None
