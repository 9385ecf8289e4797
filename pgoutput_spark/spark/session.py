"""`build_spark_session`: the one SparkSession builder shared by jobs, tests and notebooks."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from ..config import LOCAL_SPARK_CONF

#: Settings every session gets unless the caller overrides them.
DEFAULTS: dict[str, str] = {
    # Decoded timestamps are UTC instants; keep Spark's rendering in UTC too.
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # A task's memory is bounded by this many messages per Arrow batch.
    "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
    "spark.ui.showConsoleProgress": "false",
    # Compiled query code kept for reuse (Spark's default: 100). An apply run generates about
    # 170 distinct classes for six tables; with 100, a third of its compilations were of code
    # compiled before and evicted, each then compiled again by the JVM's JIT compiler too.
    "spark.sql.codegen.cache.maxEntries": "1000",
    # The jobs cache binary messages and nested rows, which Spark's cache compression leaves
    # as they are (1.2M decoded messages: 718 MiB compressed, 737 MiB not) after spending
    # CPU on choosing a scheme per column: 4-5 of 50 JVM CPU-seconds of an apply run.
    "spark.sql.inMemoryColumnarStorage.compressed": "false",
}


def build_spark_session(
    *,
    app_name: str = "pgoutput-spark",
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Get or create a SparkSession with Delta Lake configured.

    ``master`` is only set when given and when the process was not launched by
    spark-submit (whose ``--master`` wins); a ``local[...]`` master also gets
    the embedded default's small-machine settings (`config.LOCAL_SPARK_CONF`:
    4 shuffle partitions, ...) under ``conf``. The Delta
    connector jar is resolved from Maven through ``configure_spark_with_delta_pip``
    unless the session already has it (``spark.jars.packages`` given in ``conf``).
    """
    from delta import configure_spark_with_delta_pip

    if "PYSPARK_PYTHON" not in os.environ:
        # Python workers run the driver's interpreter (the project's venv), not
        # whatever ``python3`` is first on PATH.
        os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = SparkSession.builder.appName(app_name)
    under_spark_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    if master and not under_spark_submit:
        builder = builder.master(master)
    local = master is not None and master.startswith("local") and not under_spark_submit
    # A local session (a notebook, the demo) gets few shuffle partitions unless told otherwise.
    settings = {**DEFAULTS, **(LOCAL_SPARK_CONF if local else {}), **(conf or {})}
    for key, value in settings.items():
        builder = builder.config(key, value)
    if "spark.jars.packages" not in settings:
        builder = configure_spark_with_delta_pip(builder)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
