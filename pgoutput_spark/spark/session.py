"""`build_spark_session`: the one SparkSession builder shared by jobs, tests and notebooks."""

from __future__ import annotations

import importlib
import logging
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark import SparkConf, SparkContext
from pyspark.errors import PySparkRuntimeError
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from ..config import LOCAL_SPARK_CONF
from ..errors import ConfigError, SparkStartError
from .connect import asks_for_connect
from .failures import note_session, spark_failure
from .localfs import java_command, local_fs_settings


logger = logging.getLogger(__name__)

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
    # PySpark 4 records the Python call site of every Column operation in the JVM, for the
    # "DataFrame" context of analysis errors: some seven py4j round trips and a walk of the Python
    # stack each (`F.col("x")` 2.2 ms instead of 0.6 ms on 2 cores). The jobs build their plans
    # from hundreds of such operations a run: off, a warm small apply run made 41% fewer round trips
    # and its driver 29% less Python CPU (benchmarks/README.md). A notebook that wants the call
    # sites in its own errors sets it back to "true" in its `spark.conf`.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # Compiled query code kept for reuse (Spark's default: 100). An apply run generates about
    # 170 distinct classes for six tables; with 100, a third of its compilations were of code
    # compiled before and evicted, each then compiled again by the JVM's JIT compiler too.
    "spark.sql.codegen.cache.maxEntries": "1000",
    # The jobs cache binary messages and nested rows, which Spark's cache compression leaves
    # as they are (1.2M decoded messages: 718 MiB compressed, 737 MiB not) after spending
    # CPU on choosing a scheme per column: 4-5 of 50 JVM CPU-seconds of an apply run.
    "spark.sql.inMemoryColumnarStorage.compressed": "false",
    # Delta 4.0 keeps a small table's file list in each version's checksum file and, where the
    # JVM's or the session's time zone is not UTC, checks that list against a reconstruction of
    # the table's state after every commit (its aid for finding statistics of timestamps before
    # 1883 written differently; Delta 4.0 plans no scan from that list, and `row_count` reads only
    # its row counts): about one Spark job and 0.1 s a commit on 2 cores, several commits a run.
    # The check stays off, as on a machine in UTC (benchmarks/README.md).
    "spark.databricks.delta.allFilesInCrc.verificationMode.forceOnNonUTC.enabled": "false",
    # Local paths (file:) stay on Hadoop's LocalFileSystem here, with its ".name.crc" sidecars;
    # a session `build_spark_session` starts on a local master gets `localfs`'s instead (no
    # sidecar, no process per file). Hadoop's raw local file system in its place, as these
    # settings once had, broke the code that asks Hadoop for the local file system as a
    # LocalFileSystem (FileSystem.getLocal): S3A's upload buffers, LocalDirAllocator.
}
_FILE_SYSTEM_KEYS = ("spark.hadoop.fs.file.impl", "spark.hadoop.fs.AbstractFileSystem.file.impl")


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
    4 shuffle partitions, ...) and a driver heap sized to the machine
    (`default_driver_memory`) under ``conf`` (`session_settings`); where this
    call starts the JVM, its local paths go through a file system that starts
    no process per file (`localfs`) unless ``conf`` names one
    (``spark.hadoop.fs.file.impl``). The Delta
    connector jar is resolved from Maven through ``configure_spark_with_delta_pip``
    unless the session already has it (``spark.jars.packages`` given in ``conf``).
    A JVM this call starts that exits before Spark is up (no Java, or a Java Spark does not
    run on) raises `SparkStartError` saying which java and what to do (`jvm_start_failure`).
    Where the environment or ``conf`` asks PySpark for a Spark Connect session
    (`connect.asks_for_connect`), `ConfigError` before anything starts: the sessions built
    here are classic ones, which the jobs need.
    """
    from delta import configure_spark_with_delta_pip

    asked = asks_for_connect(conf)
    if asked is not None:
        raise ConfigError(
            f"{asked} asks PySpark for a Spark Connect session, and pgoutput-spark builds classic ones: its "
            f"jobs need the driver's JVM; nothing was started. Unset it to run them here; in a notebook on "
            f"Spark Connect, pass its own session to read_capture, decode, changes, status, mirror, history and "
            f"verify")

    if "PYSPARK_PYTHON" not in os.environ:
        # Python workers run the driver's interpreter (the project's venv), not
        # whatever ``python3`` is first on PATH.
        os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = SparkSession.builder.appName(app_name)
    under_spark_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    if master and not under_spark_submit:
        builder = builder.master(master)
    settings = session_settings(master if not under_spark_submit else None, conf)
    if "spark.hadoop.fs.file.impl" not in (conf or {}):
        if SparkContext._active_spark_context is not None:  # the running JVM keeps its file system
            for key in _FILE_SYSTEM_KEYS:
                settings.pop(key, None)
        elif not under_spark_submit:  # this call starts the JVM
            settings.update(_file_system_settings(master, settings))
    for key, value in settings.items():
        builder = builder.config(key, value)
    if "spark.jars.packages" not in settings:
        builder = configure_spark_with_delta_pip(builder)
    try:
        spark = builder.getOrCreate()
    except PySparkRuntimeError as exc:  # Spark's launcher, or its JVM, exited before the gateway was up
        if exc.getCondition() != "JAVA_GATEWAY_EXITED":
            raise
        raise SparkStartError(jvm_start_failure()) from exc
    spark.sparkContext.setLogLevel("WARN")
    note_session(spark.sparkContext)
    return spark


#: The Java versions Spark 4.0 runs on (the project is tested on 17).
SPARK_JAVA_VERSIONS = (17, 21)
_SPARK_JAVAS = "Java " + " or ".join(map(str, SPARK_JAVA_VERSIONS))


def jvm_start_failure() -> str:
    """Why Spark's JVM did not start, for a session this process launches: no Java, or a Java
    Spark does not run on (newer ones fail inside Hadoop, `Subject.getSubject`), with the
    remedy; else a pointer to the JVM's own output (on stderr, above the error)."""
    from pyspark import __version__ as spark_version

    try:
        java = java_command()
    except FileNotFoundError:
        return f"Spark's JVM did not start: no java on PATH and no JAVA_HOME; install {_SPARK_JAVAS}"
    if not Path(java).is_file():
        return f"Spark's JVM did not start: there is no {java} (JAVA_HOME={os.environ.get('JAVA_HOME')})"
    version = java_version(java)
    if version is None:
        return (f"Spark's JVM did not start: {java} did not run, or did not say its version; set JAVA_HOME "
                f"to a {_SPARK_JAVAS}")
    if version not in SPARK_JAVA_VERSIONS:
        return (f"Spark's JVM did not start: {java} is Java {version}, and Spark {spark_version} runs on "
                f"{_SPARK_JAVAS} only; set JAVA_HOME to one of those")
    modules = java_modules(java)
    if modules is not None and SPARK_JAVA_MODULE not in modules:
        return (f"Spark's JVM did not start: {java} (Java {version}) has no module {SPARK_JAVA_MODULE}, which "
                f"Spark {spark_version}'s launcher adds to every JVM it starts (a Java runtime cut down with "
                f"jlink); set JAVA_HOME to a whole JDK or JRE, or to a runtime built with that module")
    return f"Spark's JVM did not start with {java} (Java {version}): its output, above, says why"


#: The module Spark's launcher asks every JVM for (``--add-modules``, `JavaModuleOptions`):
#: a runtime without it exits at once ("Module jdk.incubator.vector not found").
SPARK_JAVA_MODULE = "jdk.incubator.vector"


def java_modules(java: str) -> set[str] | None:
    """The modules ``java --list-modules`` names; None where it does not run."""
    done = _ask_java(java, "--list-modules")
    if done is None:
        return None
    return {line.split("@")[0].strip() for line in done.stdout.splitlines() if line.strip()}


def java_version(java: str) -> int | None:
    """The major version ``java -version`` prints (8 for "1.8.0_392"); None where it does not run
    or says none."""
    done = _ask_java(java, "-version")
    found = None if done is None else re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if found is None:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def _ask_java(java: str, option: str) -> subprocess.CompletedProcess[str] | None:
    """``java option`` run to its end (its output as text); None where it did not run or failed."""
    try:
        done = subprocess.run([java, option], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return done if done.returncode == 0 else None


def session_settings(master: str | None, conf: Mapping[str, str] | None) -> dict[str, str]:
    """The settings `build_spark_session` gives a new session: `DEFAULTS`, then for a local
    ``master`` `config.LOCAL_SPARK_CONF` and a driver heap sized to the machine
    (`default_driver_memory`) unless one is chosen elsewhere, then ``conf``."""
    local = master is not None and master.startswith("local")
    # A local session (a notebook, the demo) gets few shuffle partitions unless told otherwise.
    settings = {**DEFAULTS, **(LOCAL_SPARK_CONF if local else {}), **(conf or {})}
    if local and not _driver_memory_chosen(settings):
        settings["spark.driver.memory"] = default_driver_memory(machine_memory())
    return settings


#: Bounds of a local session's default driver heap (`default_driver_memory`).
DRIVER_MEMORY_MIN_MIB = 1024
DRIVER_MEMORY_MAX_MIB = 16 * 1024


def default_driver_memory(machine_bytes: int | None) -> str:
    """``spark.driver.memory`` of a local session nobody chose it for: a quarter of the
    machine's memory, 1 to 16 GiB.

    A local session's tasks run in the driver JVM, and Spark's own default heap (1 GiB) is too
    small for a run of any size: `apply` of 1M changes (1.2M messages, 150 MB of Parquet) fails
    with ``OutOfMemoryError`` in it and succeeds in 2 GiB (README, Configuration, "Memory").
    A quarter leaves the rest to the Python workers (about 3 GiB in that run) and the machine.
    """
    if machine_bytes is None:
        return f"{DRIVER_MEMORY_MIN_MIB}m"
    mib = min(max(machine_bytes // 4 // 2**20, DRIVER_MEMORY_MIN_MIB), DRIVER_MEMORY_MAX_MIB)
    return f"{mib}m"


def machine_memory() -> int | None:
    """Bytes of memory this process may use: the physical memory, or the container's (cgroup)
    limit when lower; None when neither can be read."""
    try:
        total: int | None = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = None
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():  # "max" (cgroup v2) means no limit
            total = int(text) if total is None else min(total, int(text))
    return total


def _file_system_settings(master: str | None, settings: Mapping[str, str]) -> dict[str, str]:
    """For a session started on a ``local`` master (executors in the driver's JVM): local paths
    without a process per file (`localfs`), its classes after the driver's class path chosen in
    ``settings`` or ``spark-defaults.conf``; none where ``--driver-class-path`` is in
    ``PYSPARK_SUBMIT_ARGS`` (spark-submit would take that class path instead)."""
    if not master or not (master == "local" or master.startswith("local[")):
        return {}
    if "--driver-class-path" in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        return {}
    return local_fs_settings(settings.get("spark.driver.extraClassPath")
                             or _spark_default("spark.driver.extraClassPath"))


def _spark_default(key: str) -> str | None:
    """``key``'s value in ``spark-defaults.conf`` (in ``SPARK_CONF_DIR``, else ``SPARK_HOME/conf``),
    None where it is not set there."""
    conf_dir = os.environ.get("SPARK_CONF_DIR") or (
        os.path.join(os.environ["SPARK_HOME"], "conf") if os.environ.get("SPARK_HOME") else None)
    if not conf_dir:
        return None
    try:
        lines = Path(conf_dir, "spark-defaults.conf").read_text().splitlines()
    except OSError:
        return None
    values = [parts[1].strip() if len(parts) > 1 else "" for parts in (line.split(None, 1) for line in lines)
              if parts[:1] == [key]]
    return values[-1] if values else None


def _driver_memory_chosen(settings: Mapping[str, str]) -> bool:
    """Whether the driver's heap is set by the caller or Spark's usual places: this session's
    settings, ``SPARK_DRIVER_MEMORY``, ``--driver-memory`` in ``PYSPARK_SUBMIT_ARGS``, or
    ``spark-defaults.conf``."""
    if "spark.driver.memory" in settings or os.environ.get("SPARK_DRIVER_MEMORY"):
        return True
    if "--driver-memory" in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        return True
    return _spark_default("spark.driver.memory") is not None


#: The modules whose functions the jobs' Python tasks run (decoding, the transactions' scan, the
#: tables' conversion and net change), imported by `warm_python_workers` ahead of those tasks.
WARM_MODULES = ("pgoutput_spark.spark.decode", "pgoutput_spark.spark.assemble", "pgoutput_spark.spark.changes",
                "pgoutput_spark.mirroring.rows")
#: The Spark job group of `warm_python_workers`' job (Spark's UI shows it by this name).
WARM_UP_GROUP = "pgoutput-spark-warm-up"
#: Tasks of that job at most (one per core of the application, a local master's cores but one,
#: up to this many).
WARM_UP_TASKS = 64

_warm_applications: set[str] = set()
_warm_lock = threading.Lock()


def warm_python_workers(spark: SparkSession) -> threading.Thread | None:
    """Start, once per Spark application, a job in a thread of its own that starts the
    application's Python workers and imports `WARM_MODULES` in them; the thread (a daemon),
    or None where this application's was started before. `run_apply` and `run_changes` call it
    first thing.

    A new JVM's first Python task costs seconds before it runs a line of ours: Spark starts its
    Python worker daemon, the worker imports PySpark, then the job's modules (0.35 s for the
    decoder alone), and the JVM loads and compiles its side of the Arrow exchange. A run does
    other things first (its lease, the slice's end: Delta and Spark's first queries, mostly
    one core's work): the warm-up does that meanwhile, on the other cores (a local master's
    cores but one: one task on 2 cores), and Spark keeps the workers for the run's tasks
    (``spark.python.worker.reuse``). Runs of 300 messages, each in a new JVM on 2 cores: the
    decoding step 0.9-1.0 s instead of 1.8, the lease's read 1.8-2.1 s instead of 1.6-1.7, the
    runs 0.6 s shorter on average, within their spread (`benchmarks/README.md`, "A warmed
    Python worker"). A second run in the same application finds the workers started and
    warms nothing.

    Nothing is started where Spark does not keep its workers (`python_workers_reused`). The
    job reads no table and writes nothing (one row per task, made by Spark), in the job
    group `WARM_UP_GROUP`. Its failure is not the run's: it is logged (debug) and the run's
    own tasks start their workers as they would have (and fail as they would have, if they
    cannot).
    """
    context = spark.sparkContext
    if not python_workers_reused(context.getConf()):
        return None  # each task would start a worker of its own anyway
    application = context.applicationId
    with _warm_lock:
        if application in _warm_applications:
            return None
        _warm_applications.add(application)
    cores = context.defaultParallelism
    if (context.master or "").startswith("local"):  # the driver's cores: one left for the run itself
        cores -= 1
    tasks = max(1, min(cores, WARM_UP_TASKS))
    thread = threading.Thread(target=_warm_quietly, args=(spark, tasks), name=WARM_UP_GROUP, daemon=True)
    thread.start()
    return thread


def python_workers_reused(conf: SparkConf) -> bool:
    """Whether Spark keeps a Python worker for the next task (``spark.python.worker.reuse``,
    Spark's default true), which `warm_python_workers` needs."""
    return (conf.get("spark.python.worker.reuse", "true") or "true").strip().lower() != "false"


def _warm_quietly(spark: SparkSession, tasks: int) -> None:
    try:
        warm_up(spark, tasks)
    except Exception as exc:  # the run's tasks start their own workers
        logger.debug("warming the Python workers failed: %s", exc)


def warm_up(spark: SparkSession, tasks: int) -> list[int]:
    """`warm_python_workers`' job, in this thread: ``tasks`` Python tasks import `WARM_MODULES`;
    the process ids of the workers that ran them."""
    context = spark.sparkContext
    context.setJobGroup(WARM_UP_GROUP, "pgoutput-spark: start the Python workers, import the jobs' modules")
    try:
        rows = spark.range(tasks, numPartitions=tasks).mapInArrow(_import_modules, "pid long").collect()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        context.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]
    return [row.pid for row in rows]


def _import_modules(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A warm-up task (`warm_up`): imports `WARM_MODULES` in its Python worker."""
    for name in WARM_MODULES:
        importlib.import_module(name)
    for batch in batches:  # one row per task
        yield pa.RecordBatch.from_pydict({"pid": pa.array([os.getpid()] * batch.num_rows, pa.int64())})


#: Runs of at most this many messages evaluate their queries without generated code (`small_run`).
SMALL_RUN_MESSAGES = 5_000
_CODEGEN_MODE = "spark.sql.codegen.factoryMode"


def copy_session(spark: SparkSession) -> SparkSession:
    """A session of its own (for settings one thread or one call changes) with a copy of all of
    ``spark``'s session settings as they are now (a small run's, `small_run`, among them; storage
    settings a notebook made with ``spark.conf.set`` too), its current database, temporary views
    and functions.

    Spark's ``cloneSession`` (``private[sql]`` in Scala, public to the JVM) copies them in the
    JVM: 9 round trips with the database's, 7-27 ms on 2 cores beside a test run. A new session
    given them from Python, ``conf.set`` for each of ``conf.getAll``, took 195 round trips and
    50-180 ms (PySpark reads that map one round trip an entry), and a new session alone has none
    of them: Spark's defaults and the ``default`` database, where a catalog name of one part
    (`register`) would then go though the run checked it in the session's current database.
    """
    copy = SparkSession(spark.sparkContext, spark._jsparkSession.cloneSession())
    # The clone takes the current database when it first uses its catalog: now, with the settings.
    copy._jsparkSession.sessionState().catalogManager().currentNamespace()
    return copy


@contextmanager
def temporary_conf(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    """Within it, the session's SQL ``settings``; afterwards each is put back as it was
    (unset where it was not set), whatever happened within. A session made meanwhile
    by `copy_session` has SQL settings of its own (copied from this session's when it is made)."""
    before: dict[str, str | None] = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, old in before.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)


@contextmanager
def without_codegen(spark: SparkSession) -> Iterator[bool]:
    """Within it, Spark evaluates the session's queries without generating Java code for
    each (Spark's ``spark.sql.codegen.factoryMode`` ``NO_CODEGEN``, which turns whole-stage
    code generation off too), unless the session set ``spark.sql.codegen.factoryMode``
    itself; yields whether it does. The setting is put back afterwards (the run's child
    sessions copy it when they are made). Another run in the same session at the same
    time finds it set and leaves it to the first.

    For queries on a few rows: their code is compiled (Janino, then the JVM's JIT) even
    when they ran before with other literals, as each run's positions are, which costs
    more than it saves; most of all in a new JVM (a command-line run's first read of its
    target, the lease: 9.5-9.7 s instead of 11.4-12.0 s on 2 cores, `benchmarks/README.md`,
    "A run in a new JVM")."""
    if spark.conf.get(_CODEGEN_MODE, None) is not None:
        yield False
        return
    with temporary_conf(spark, {_CODEGEN_MODE: "NO_CODEGEN"}):
        yield True


@contextmanager
def small_run(spark: SparkSession, messages: int) -> Iterator[bool]:
    """`without_codegen` for a run of at most `SMALL_RUN_MESSAGES` ``messages``; yields
    whether it applies. Warm apply runs of 300 messages on 2 cores: 19.0 s instead of
    20.8-21.5 s; none at 20,000 (`benchmarks/README.md`, "Code generation in small
    runs"). Larger runs keep the session's setting."""
    if messages > SMALL_RUN_MESSAGES:
        yield False
        return
    with without_codegen(spark) as interpreted:
        yield interpreted


def one_row(frame: DataFrame) -> Row:
    """The row of ``frame``, an aggregate without grouping: `DataFrame.first`, typed as possibly
    None, which such a query never is."""
    row = frame.first()
    assert row is not None, "an aggregate without grouping has one row"
    return row


def release(frame: DataFrame) -> None:
    """``frame.unpersist()`` in a ``finally``: when Spark has stopped under the failing call,
    there is nothing to release, and the failure of this call would hide the error that
    stopped it."""
    try:
        frame.unpersist()
    except Exception:
        if spark_failure(frame.sparkSession, wait=0) is None:
            raise


def local_frame(spark: SparkSession, rows: Iterable[Sequence[Any]], schema: str | StructType) -> DataFrame:
    """A small table built on the driver as a DataFrame that the JVM holds (a local relation).

    ``createDataFrame`` of a Python list makes an RDD of pickled rows: every job
    that reads it (each broadcast of a join's small side, each write) runs
    Python tasks to unpickle them: 0.4-1.4 s a job on 2 cores for a handful
    of rows (`benchmarks/README.md`). Spark keeps an Arrow table under
    ``spark.sql.execution.arrow.localRelationThreshold`` (48 MiB) in the JVM
    instead, read without a task. ``rows`` hold values as ``createDataFrame``
    takes them (``datetime`` for timestamps, tuples for structs).
    """
    struct = schema if isinstance(schema, StructType) else StructType.fromDDL(schema)
    assert isinstance(struct, StructType), f"not a row schema: {schema!r}"
    internal = [struct.toInternal(tuple(row)) for row in rows]  # timestamps as microseconds, as Arrow's
    arrow = to_arrow_schema(struct)
    columns = [pa.array([row[i] for row in internal], type=field.type) for i, field in enumerate(arrow)]
    return spark.createDataFrame(pa.Table.from_arrays(columns, schema=arrow), struct)
