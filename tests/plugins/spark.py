"""The one SparkSession of a test run (local[2], small shuffles, UI off)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
from pyspark.sql import SparkSession

from pgoutput_spark.spark.session import build_spark_session

T = TypeVar("T")


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    # The local file system's classes (`spark.localfs`) compiled afresh for each test run, not
    # taken from the user's cache; the jobs the tests start as processes find them here too.
    os.environ["PGOUTPUT_SPARK_CACHE"] = str(tmp_path_factory.mktemp("pgoutput-spark-cache"))
    lake = _LAKE_ROOT[LAKE] = tmp_path_factory.mktemp("lake")
    session = build_spark_session(
        app_name="pgoutput-spark-tests",
        master="local[2]",
        conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            # Queries evaluated as they are instead of generating Java code for each, compiling it
            # (Janino) and JIT-compiling that, which on a few rows costs more than it saves: warm
            # small apply runs a fifth shorter (benchmarks/README.md "Code generation in small
            # runs"). Spark's own setting for its tests; it turns whole-stage code generation off
            # too. The jobs tests start in processes of their own (spark-submit, the S3 scenario)
            # keep Spark's default, as a user's session does; a test of generated code turns it on.
            "spark.sql.codegen.factoryMode": "NO_CODEGEN",
            "spark.ui.enabled": "false",
            # One JVM runs the whole suite's Delta work; with Spark's 1 GB default heap a MERGE late in
            # the run once failed to build its broadcast table ("Not enough memory to build and broadcast").
            "spark.driver.memory": "4g",
            # The parallel collector: G1's concurrent threads compete with the tasks for the 2 cores.
            # Single runs of one end-to-end apply test: 76 s with G1 and 2 snapshot partitions, 71 s
            # with 1 partition, 67 s with the parallel collector as well.
            "spark.driver.extraJavaOptions": "-XX:+UseParallelGC",
            # Small Delta tables: rebuild their snapshots in 1 partition, not 50 (as conf/local.yaml).
            "spark.databricks.delta.snapshotPartitions": "1",
            # Small Arrow batches so tests cross batch boundaries.
            "spark.sql.execution.arrow.maxRecordsPerBatch": "64",
            # A file system that is not `file:` (see `lake`): Hadoop's view file system, its
            # mount table's one link a local folder.
            f"spark.hadoop.fs.viewfs.mounttable.{LAKE}.link./lake": lake.as_uri(),
        },
    )
    yield session
    session.stop()


LAKE = "pgoutput-tests"
_LAKE_ROOT: dict[str, Path] = {}


def jobs_run(spark: SparkSession, group: str, action: Callable[[], T]) -> tuple[T, int]:
    """``action()`` and the Spark jobs it ran, counted by a job group of its own in this thread
    (Spark's status tracker); the thread's job group and description are cleared after it."""
    context = spark.sparkContext
    context.setJobGroup(group, group)
    try:
        result = action()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        context.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]
    return result, len(context.statusTracker().getJobIdsForGroup(group))


def local_path(path: str | Path) -> Path:
    """The local folder behind a `lake` URI (a local path as it is)."""
    prefix = f"viewfs://{LAKE}/lake"
    text = str(path)
    return _LAKE_ROOT[LAKE] / text[len(prefix):].lstrip("/") if text.startswith(prefix) else Path(path)


@dataclass(frozen=True)
class Lake:
    """A folder of the `lake` fixture: ``uri`` as Spark and the package see it, ``local`` for checks."""

    uri: str
    local: Path


@pytest.fixture
def lake(spark: SparkSession, request: pytest.FixtureRequest) -> Lake:
    """A new folder behind a ``viewfs://`` URI: paths the package must reach through Spark
    (Hadoop's file systems), never as local paths, as with object storage."""
    name = request.node.name.translate({ord(c): "_" for c in "[]/ "})[:60]
    uri = f"viewfs://{LAKE}/lake/{name}"
    local = local_path(uri)
    local.mkdir()
    return Lake(uri, local)


@pytest.fixture
def restore_spark_conf(spark: SparkSession) -> Iterator[SparkSession]:
    """For tests that build sessions through package code (``getOrCreate`` applies
    its settings to the shared session): put the SQL settings back afterwards."""
    before = dict(spark.conf.getAll)
    yield spark
    for key, value in spark.conf.getAll.items():
        # A setting of the running JVM (its Java options): recorded by getOrCreate, without effect,
        # and Spark refuses to set it back. Delta's settings are not in Spark's registry, which
        # calls them not modifiable too: they are, and are put back.
        if not spark.conf.isModifiable(key) and not key.startswith("spark.databricks.delta."):
            continue
        if key not in before:
            spark.conf.unset(key)
        elif before[key] != value:
            spark.conf.set(key, before[key])
