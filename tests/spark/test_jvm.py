"""Round trips to the JVM: whole-name class lookups (`spark.jvm.jvm_class`) and column expressions
built without PySpark's call-site recording (`session.DEFAULTS`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from py4j.java_gateway import JavaClass, JavaPackage
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pgoutput_spark.spark.jvm import jvm_class


def _round_trips(spark: SparkSession, action: Callable[[], Any]) -> tuple[Any, int]:
    """``action()`` and the py4j commands this thread sent to the JVM meanwhile (py4j's release
    of Python's proxies of JVM objects goes from a thread of its own and does not count)."""
    client = spark.sparkContext._gateway._gateway_client  # type: ignore[union-attr]
    send, me, sent = client.send_command, threading.get_ident(), [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == me:
            sent[0] += 1
        return send(*args, **kwargs)

    client.send_command = counted
    try:
        return action(), sent[0]
    finally:
        del client.send_command  # the class's method again


def test_a_jvm_class_is_one_round_trip_where_its_dotted_parts_are_one_each(spark):
    jvm = spark.sparkContext._jvm
    name = "org.apache.spark.sql.delta.util.DeltaFileOperations"
    found, trips = _round_trips(spark, lambda: jvm_class(jvm, name))
    chained, chained_trips = _round_trips(spark, lambda: jvm.org.apache.spark.sql.delta.util.DeltaFileOperations)
    assert isinstance(found, JavaClass) and isinstance(chained, JavaClass)
    assert found._fqn == chained._fqn == name
    assert (trips, chained_trips) == (1, 7)
    # A nested class by its binary name, as the checked appends take Delta's operations.
    write = jvm_class(jvm, "org.apache.spark.sql.delta.DeltaOperations$Write")
    assert isinstance(write, JavaClass) and write._fqn == "org.apache.spark.sql.delta.DeltaOperations$Write"
    # A class the JVM does not have is a package to py4j, not a class (and not an error): the
    # checked appends fall back to Delta's writer on it.
    missing = jvm_class(jvm, "org.apache.spark.sql.delta.DeltaOperations$NoSuchOperation")
    assert isinstance(missing, JavaPackage) and not isinstance(missing, JavaClass)


def test_column_expressions_send_no_call_site_to_the_jvm(spark):
    """PySpark's DataFrame debugging is off in the sessions `build_spark_session` builds: a column
    expression costs the JVM calls that build it, not some seven more an operation recording the
    Python line that made it."""
    assert spark.conf.get("spark.python.sql.dataFrameDebugging.enabled") == "false"
    column, trips = _round_trips(spark, lambda: (F.col("a") + F.lit(1)).alias("b"))
    assert str(column) == "Column<'+(a, 1) AS b'>"
    # PySpark 4.0.1 in a new session: 14 round trips the first time, 8 after, with the debugging
    # off; 44 and 38 with Spark's default (on).
    assert trips <= 14


def test_a_sessions_copy_has_its_settings_and_database_as_they_are_made_in_the_jvm(spark):
    """`copy_session` (each table's writing thread of an apply run, the vacuum's listing): a session
    whose settings are the run's as they are when it is made (here a code generation mode other
    than the test session's, a Delta table property and a file system setting, set for the run
    alone), its current database too, and its own afterwards; Spark copies them in the JVM."""
    from pgoutput_spark.spark.session import copy_session, temporary_conf

    run = {"spark.sql.codegen.factoryMode": "FALLBACK",
           "spark.databricks.delta.properties.defaults.enableDeletionVectors": "false",
           "fs.pgoutput-test.marker": "copied"}  # as a notebook sets storage keys: spark.conf.set
    before = {key: spark.conf.get(key, None) for key in run}
    assert all(before[key] != value for key, value in run.items())  # so the copy has them from the run
    spark.sql("CREATE DATABASE IF NOT EXISTS copied_db")
    try:
        with temporary_conf(spark, run):
            spark.sql("USE copied_db")
            copy, trips = _round_trips(spark, lambda: copy_session(spark))
            spark.sql("USE default")
        assert {key: copy.conf.get(key, None) for key in run} == run
        assert {key: spark.conf.get(key, None) for key in run} == before  # the run's put back
        assert copy.catalog.currentDatabase() == "copied_db" and spark.catalog.currentDatabase() == "default"
    finally:
        spark.sql("USE default")
        spark.sql("DROP DATABASE IF EXISTS copied_db")
    assert copy.conf.get("spark.sql.session.timeZone") == "UTC"  # `session.DEFAULTS`
    copy.conf.set("spark.databricks.delta.write.txnAppId", "thread-1")
    assert spark.conf.get("spark.databricks.delta.write.txnAppId", None) is None
    assert copy.sparkContext is spark.sparkContext and copy.range(3).count() == 3
    # The clone, the Python session around it (the constructor's own calls) and the current
    # database taken: 9 with PySpark 4.0.1. A new session given the settings from Python took 195:
    # PySpark reads `conf.getAll` a round trip an entry, and each setting is one more.
    assert trips <= 12, trips
