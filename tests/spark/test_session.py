"""The session's settings: a local driver heap sized to the machine unless chosen elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgoutput_spark.spark import session
from pgoutput_spark.spark.session import default_driver_memory, machine_memory, session_settings

GIB = 2**30


@pytest.fixture
def plain_env(monkeypatch, tmp_path):
    """No driver heap chosen by environment or spark-defaults.conf; an 8 GiB machine."""
    for name in ("SPARK_DRIVER_MEMORY", "PYSPARK_SUBMIT_ARGS", "SPARK_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    monkeypatch.setattr(session, "machine_memory", lambda: 8 * GIB)
    return tmp_path


def test_default_driver_memory_is_a_quarter_of_the_machine_within_bounds():
    assert default_driver_memory(24 * GIB) == "6144m"
    assert default_driver_memory(2 * GIB) == "1024m"  # never below Spark's own default
    assert default_driver_memory(256 * GIB) == "16384m"
    assert default_driver_memory(None) == "1024m"


def test_machine_memory_reads_this_machine():
    total = machine_memory()
    assert total is not None and total > 256 * 2**20


def test_a_local_session_gets_the_sized_heap(plain_env):
    assert session_settings("local[2]", None)["spark.driver.memory"] == "2048m"
    assert session_settings("local[*]", {"spark.sql.shuffle.partitions": "8"})["spark.driver.memory"] == "2048m"


@pytest.mark.parametrize("master", [None, "yarn", "spark://head:7077", "k8s://https://api:6443"])
def test_a_cluster_session_keeps_its_own_heap_setting(plain_env, master):
    assert "spark.driver.memory" not in session_settings(master, None)


def test_a_heap_chosen_elsewhere_wins(plain_env, monkeypatch):
    assert session_settings("local[2]", {"spark.driver.memory": "3g"})["spark.driver.memory"] == "3g"
    monkeypatch.setenv("SPARK_DRIVER_MEMORY", "5g")
    assert "spark.driver.memory" not in session_settings("local[2]", None)
    monkeypatch.delenv("SPARK_DRIVER_MEMORY")
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--driver-memory 5g pyspark-shell")
    assert "spark.driver.memory" not in session_settings("local[2]", None)
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS")
    defaults = plain_env / "spark-defaults.conf"
    defaults.write_text("# spark.driver.memory 5g\nspark.executor.memory 2g\n")
    assert session_settings("local[2]", None)["spark.driver.memory"] == "2048m"  # a comment is not a setting
    defaults.write_text("spark.driver.memory   5g\n")
    assert "spark.driver.memory" not in session_settings("local[2]", None)


def test_a_job_that_runs_the_driver_out_of_memory_raises_what_happened(tmp_path):
    """The notebook API: `run_changes` in a process of its own with a small heap, on a capture
    filtered by an expression that builds a 1.6 GB array per row (the CLI's one line for the
    same: tests/test_cli.py)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = f"""
import json
from pyspark.sql import functions as F
from pgoutput_spark import read_capture
from pgoutput_spark.changefeed import run_changes
from pgoutput_spark.spark.session import build_spark_session

spark = build_spark_session(master="local[1]", conf={{"spark.driver.memory": "600m"}})
capture = read_capture(spark, "examples/sample_capture").where(F.size(F.array_repeat("seq", 200000000)) > 0)
try:
    run_changes(spark, capture, {str(tmp_path / "target")!r})
except Exception as exc:
    print(json.dumps({{"type": type(exc).__name__, "message": str(exc), "cause": type(exc.__cause__).__name__}}))
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip(), done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["type"] == "PgoutputSparkError" and report["cause"] not in ("NoneType", "PgoutputSparkError")
    assert report["message"].startswith("Spark's driver JVM ran out of memory (java.lang.OutOfMemoryError, "
                                        "spark.driver.memory 600m) and stopped"), report


def test_the_warm_up_imports_the_jobs_modules_in_the_workers_the_next_tasks_get():
    """In a new application (a process of its own, one core: one Python worker): a worker that ran
    a task before has none of the jobs' modules; after `warm_python_workers`' job the same worker
    has them all, and the next call starts nothing (once per application)."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    script = """
import json, os, sys
import pyarrow as pa
from pgoutput_spark.spark import session

spark = session.build_spark_session(master="local[1]", conf={"spark.ui.enabled": "false"})

NAMES = list(session.WARM_MODULES)  # by value: the task itself imports nothing of ours

def seen(batches):
    for batch in batches:
        found = [name in sys.modules for name in NAMES]
        yield pa.RecordBatch.from_pydict({"pid": [os.getpid()], "found": [sum(found)]})

def ask():
    [row] = spark.range(1, numPartitions=1).mapInArrow(seen, "pid long, found long").collect()
    return [row.pid, row.found]

before = ask()
thread = session.warm_python_workers(spark)
thread.join(120)
again = session.warm_python_workers(spark)
tracker = spark.sparkContext.statusTracker()
jobs = [tracker.getJobInfo(j).status for j in tracker.getJobIdsForGroup(session.WARM_UP_GROUP)]
print(json.dumps({"before": before, "after": ask(), "alive": thread.is_alive(), "again": again is None,
                  "jobs": jobs}))
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip(), done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["before"][1] == 0, report  # a worker's own imports: PySpark's, none of ours
    assert report["after"] == [report["before"][0], len(session.WARM_MODULES)], report  # the same worker
    assert not report["alive"] and report["again"] and report["jobs"] == ["SUCCEEDED"], report


@pytest.mark.parametrize(("setting", "reused"), [(None, True), ("true", True), ("false", False),
                                                  (" FALSE ", False)])
def test_the_warm_up_needs_workers_spark_keeps(setting, reused):
    from pyspark import SparkConf

    conf = SparkConf(loadDefaults=False)
    if setting is not None:
        conf.set("spark.python.worker.reuse", setting)
    assert session.python_workers_reused(conf) is reused


def test_a_failed_warm_up_is_logged_not_raised(monkeypatch, caplog):
    def fail(spark, tasks):
        raise RuntimeError("no Python on the executors")

    monkeypatch.setattr(session, "warm_up", fail)
    with caplog.at_level("DEBUG", logger=session.logger.name):
        session._warm_quietly(None, 2)  # type: ignore[arg-type]
    assert "warming the Python workers failed: no Python on the executors" in caplog.text


#: The error `apply` of a 4.35M-message pgbench landing raised with a 1 GiB heap (a task that
#: could not get execution memory; the context lived on), shortened.
TASK_OOM = ("An error occurred while calling o1007.collectToPython.\n: org.apache.spark.SparkException: Job "
            "aborted due to stage failure: Task 0 in stage 40.0 failed 1 times, most recent failure: Lost task "
            "0.0 in stage 40.0 (TID 43) (192.0.2.2 executor driver): org.apache.spark.memory.SparkOutOfMemoryError: "
            "[UNABLE_TO_ACQUIRE_MEMORY] Unable to acquire 262144 bytes of memory, got 15199. SQLSTATE: 53200")


def test_a_task_out_of_memory_names_the_heap_and_the_remedies(spark):
    from pgoutput_spark.spark.failures import spark_failure, task_out_of_memory

    local = spark_failure(spark, error=Exception(TASK_OOM))  # the test session: local, alive
    assert local is not None and str(local).startswith(
        "a Spark task ran out of memory (SparkOutOfMemoryError; spark.driver.memory 4g: a local session's "
        "tasks share the driver's heap); the next run redoes this run's slice")
    assert "--max-messages N --until-caught-up" in str(local)
    assert "spark.executor.memory and spark.executor.cores" in str(task_out_of_memory(Exception(TASK_OOM), "yarn"))
    assert spark_failure(spark) is None and spark_failure(spark, error=Exception("[UNRESOLVED_COLUMN] `x`")) is None


@pytest.mark.spark
@pytest.mark.parametrize("zone", ["UTC", "America/New_York"])
def test_a_local_frame_holds_the_rows_create_data_frame_does_without_an_rdd(spark, zone):
    from datetime import datetime, timezone

    from pgoutput_spark.ledger import LEASE_SCHEMA, RUNS_SCHEMA
    from pgoutput_spark.spark.assemble import _OUTCOME_SCHEMA
    from pgoutput_spark.spark.session import local_frame

    at = datetime(2026, 3, 8, 2, 30, 0, 123456)  # naive: local time, as Spark hands it back
    aware = datetime(2026, 11, 1, 5, 59, 59, tzinfo=timezone.utc)
    cases = [
        (RUNS_SCHEMA, [("r1", "p", None, 9, 1, 2**62, 3, 4, 0, 0,
                        [("s.t", "/x", 16384, 1, 2, 3, 0, False, "merged"), ("s.u", "/y", 1, 0, 0, 0, 5, True, "")],
                        at, aware, 1.5, ["a", "b"], (None, 7, 2**40, ["c"], "walsender 1"), [(7, 3, 2**33)],
                        aware, "0.1.0"),
                       ("r2", "p", 9, 10, None, None, 0, 0, 0, 0, [], None, None, 0.0, [], None, None, None, None)]),
        (LEASE_SCHEMA, [("p", "", "idle", None, None, None, None, None, None, None, None),
                        ("q", "id", "running", 1, 2, 3, 4, 5, at, ["f", "g"], "7")]),
        (_OUTCOME_SCHEMA, [(7, 1, None, 2**63 - 1, "committed", 9, 2**40, aware),
                           (8, 2, 3, 4, "open", None, None, None)]),
        ("a long, b string", []),
    ]
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        for schema, rows in cases:
            frame = local_frame(spark, rows, schema)
            expected = spark.createDataFrame(rows, schema)
            assert frame.schema == expected.schema
            assert frame.collect() == expected.collect()
            assert sorted(frame.selectExpr("*", "to_json(struct(*)) AS j").select("j").collect()) == \
                sorted(expected.selectExpr("*", "to_json(struct(*)) AS j").select("j").collect())
            plan = frame._jdf.queryExecution().optimizedPlan().toString()
            assert plan.startswith("LocalRelation"), plan  # no RDD: read without a task
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)


@pytest.mark.spark
def test_local_delta_tables_get_no_hadoop_checksum_sidecars(spark, tmp_path):
    """Local paths go through Hadoop's raw local file system: a Delta table's data files and
    log have no ``.name.crc`` beside them (each one cost the driver more processes), and the
    table reads back, appended to and merged into, as with them."""
    from delta.tables import DeltaTable

    path = str(tmp_path / "t")
    spark.range(3).selectExpr("id", "'a' AS v").write.format("delta").save(path)
    spark.range(2, 5).selectExpr("id", "'b' AS v").write.format("delta").mode("append").save(path)
    (DeltaTable.forPath(spark, path).alias("t")
     .merge(spark.range(4, 6).selectExpr("id", "'c' AS v").alias("s"), "t.id = s.id")
     .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())

    files = [p.relative_to(tmp_path / "t") for p in (tmp_path / "t").rglob("*") if p.is_file()]
    assert [f for f in files if f.name.startswith(".") and f.name.endswith(".crc")] == []
    assert len([f for f in files if f.suffix == ".parquet"]) >= 3
    assert sorted(files, key=str)[:3] == [Path("_delta_log/00000000000000000000.crc"),
                                           Path("_delta_log/00000000000000000000.json"),
                                           Path("_delta_log/00000000000000000001.crc")]  # Delta's own
    rows = sorted((r["id"], r["v"]) for r in spark.read.format("delta").load(path).collect())
    assert rows == [(0, "a"), (1, "a"), (2, "a"), (2, "b"), (3, "b"), (4, "c"), (5, "c")]


def test_a_local_session_gets_the_local_file_system_after_the_class_path_chosen_elsewhere(plain_env, monkeypatch):
    monkeypatch.setenv("PGOUTPUT_SPARK_CACHE", str(plain_env / "cache"))
    ours = session._file_system_settings("local[2]", {})
    classes = ours["spark.driver.extraClassPath"]
    assert ours["spark.hadoop.fs.file.impl"] == "pgoutputspark.fs.NioLocalFileSystem"
    assert Path(classes, "pgoutputspark", "fs", "NioLocalFs.class").is_file()
    (plain_env / "spark-defaults.conf").write_text("# spark.driver.extraClassPath /not/this.jar\n"
                                                   "spark.driver.extraClassPath   /opt/jdbc.jar\n")
    assert session._file_system_settings("local", {})["spark.driver.extraClassPath"] == \
        f"/opt/jdbc.jar:{classes}"  # kept, as spark-submit would have taken it from the file
    given = {"spark.driver.extraClassPath": "/mine.jar"}
    assert session._file_system_settings("local[*]", given)["spark.driver.extraClassPath"] == f"/mine.jar:{classes}"
    for master in ("local-cluster[2,1,1024]", "yarn", "spark://h:7077", None):  # executors elsewhere
        assert session._file_system_settings(master, {}) == {}
    # spark-submit's --driver-class-path would win over the setting: no class it cannot load
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--driver-class-path /opt/x.jar pyspark-shell")
    assert session._file_system_settings("local[2]", {}) == {}


@pytest.mark.usefixtures("restore_spark_conf")
def test_a_small_run_turns_generated_code_off_unless_the_session_chose(spark):
    from pyspark.sql import functions as F

    from pgoutput_spark.spark.session import SMALL_RUN_MESSAGES, small_run, without_codegen

    key = "spark.sql.codegen.factoryMode"
    spark.conf.unset(key)  # the test session's own choice (tests/plugins/spark.py)
    with small_run(spark, SMALL_RUN_MESSAGES) as interpreted:
        assert interpreted and spark.conf.get(key) == "NO_CODEGEN"
        assert spark.range(4).select((F.col("id") * 2).alias("x")).agg(F.sum("x")).first()[0] == 12
    assert spark.conf.get(key, None) is None
    with small_run(spark, SMALL_RUN_MESSAGES + 1) as interpreted:
        assert not interpreted and spark.conf.get(key, None) is None
    with pytest.raises(ZeroDivisionError), small_run(spark, 1):
        1 / 0
    assert spark.conf.get(key, None) is None  # put back after a failure too
    spark.conf.set(key, "FALLBACK")  # a session that chose a mode keeps it
    with small_run(spark, 1) as interpreted:
        assert not interpreted and spark.conf.get(key) == "FALLBACK"
    with without_codegen(spark) as interpreted:
        assert not interpreted and spark.conf.get(key) == "FALLBACK"
    spark.conf.unset(key)
    with without_codegen(spark) as interpreted:  # whatever the size
        assert interpreted and spark.conf.get(key) == "NO_CODEGEN"
    assert spark.conf.get(key, None) is None


@pytest.mark.usefixtures("restore_spark_conf")
def test_temporary_conf_puts_each_setting_back_as_it_was(spark):
    from pgoutput_spark.spark.session import temporary_conf

    spark.conf.set("spark.sql.caseSensitive", "false")
    spark.conf.unset("spark.databricks.delta.write.txnAppId")  # a Delta setting outside Spark's registry
    settings = {"spark.sql.caseSensitive": "true", "spark.databricks.delta.write.txnAppId": "p:t"}
    with temporary_conf(spark, settings):
        assert {key: spark.conf.get(key) for key in settings} == settings
    assert spark.conf.get("spark.sql.caseSensitive") == "false"
    assert spark.conf.get("spark.databricks.delta.write.txnAppId", None) is None
    with pytest.raises(ZeroDivisionError), temporary_conf(spark, {"spark.sql.caseSensitive": "true"}):
        1 / 0
    assert spark.conf.get("spark.sql.caseSensitive") == "false"  # after a failure too


@pytest.mark.spark
def test_a_commit_outside_utc_starts_no_check_of_the_checksums_file_list(spark, tmp_path):
    """Where the JVM's time zone is not UTC, Delta checks the file list of each commit's checksum
    against a reconstruction of the table's state, in Spark jobs: the session's defaults turn
    that off (`session.DEFAULTS`), and a commit then starts as many jobs as in UTC."""
    from ..plugins.spark import jobs_run

    key = "spark.databricks.delta.allFilesInCrc.verificationMode.forceOnNonUTC.enabled"
    assert spark.conf.get(key) == "false"
    path = str(tmp_path / "t")
    spark.range(3).write.format("delta").save(path)
    zones = spark._jvm.java.util.TimeZone

    def jobs_of_an_append(group: str) -> int:
        return jobs_run(spark, group, lambda: spark.range(3).write.format("delta").mode("append").save(path))[1]

    before = zones.getDefault()
    try:
        utc = jobs_of_an_append("commit-in-utc")
        zones.setDefault(zones.getTimeZone("America/New_York"))
        elsewhere = jobs_of_an_append("commit-outside-utc")
        spark.conf.set(key, "true")  # Delta's own default
        checked = jobs_of_an_append("commit-outside-utc-checked")
    finally:
        zones.setDefault(before)
        spark.conf.set(key, "false")
    assert elsewhere == utc < checked, (utc, elsewhere, checked)
    assert spark.read.format("delta").load(path).count() == 12
