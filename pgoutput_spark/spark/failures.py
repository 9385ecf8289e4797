"""Spark's failures told plainly: a driver or task out of memory with its remedies, a capture
file Spark cannot read, an error a Python task raised (`explains_spark_failures`, around the
jobs' entry points)."""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from pyspark import SparkContext
from pyspark.sql import SparkSession

from ..errors import CaptureError, PgoutputSparkError

T = TypeVar("T")


_REMEDY = ("give the driver more memory (--conf spark.driver.memory=8g, spark.conf in --config, "
           "or spark-submit --driver-memory; on a cluster, the executors: spark.executor.memory) "
           "or bound each run (--max-messages N --until-caught-up).")

#: Spark's exit code for a JVM that ran out of memory (``SparkExitCode.OOM``).
_EXIT_OOM = 52


#: What Spark's errors say when a task ran out of memory without ending the JVM: a task could
#: not get execution memory (UNABLE_TO_ACQUIRE_MEMORY, SQLSTATE 53200), or an
#: ``OutOfMemoryError`` Spark caught.
_TASK_OUT_OF_MEMORY = ("SparkOutOfMemoryError", "UNABLE_TO_ACQUIRE_MEMORY", "java.lang.OutOfMemoryError")


def spark_failure(spark: SparkSession | None = None, *, wait: float = 10.0,
                  error: BaseException | None = None) -> PgoutputSparkError | None:
    """The error to report when Spark stopped, a Python task raised one of our errors, a task
    ran out of memory, or a capture file could not be read under a failing call (``error``,
    when given, is what the call raised); else None.

    A fatal error in a task (``java.lang.OutOfMemoryError``: the driver's heap was too small for
    the run) stops the SparkContext and ends its JVM with exit code 52; every later call then
    fails with errors about a shut-down context that say nothing of the cause. ``wait`` is how
    long to wait for the JVM to exit once the context is found stopped (its shutdown hooks run
    first), to tell an out-of-memory exit from other stops. A task that could not get memory
    (``SparkOutOfMemoryError``) fails its job with a Java trace instead, the context alive.
    """
    from py4j.protocol import Py4JError
    from pyspark import SparkContext

    sc = spark.sparkContext if spark is not None else SparkContext._active_spark_context
    if sc is None:
        return None
    try:
        stopped = bool(sc._jsc is None or sc._jsc.sc().isStopped())
    except (Py4JError, ConnectionError, AttributeError):
        stopped = True  # the gateway is gone: the JVM exited
    if not stopped:
        return None if error is None else (python_task_error(error) or task_out_of_memory(error, sc.master or "")
                                           or unreadable_file(error) or capture_error(error))
    proc = getattr(sc._gateway, "proc", None)  # None under spark-submit (the JVM is our parent)
    code = None
    if proc is not None:
        try:
            code = proc.wait(timeout=wait)
        except Exception:  # still running after `wait` (e.g. stopped by hand)
            code = None
    memory, remedy = _driver_memory_text(), _REMEDY
    if code == _EXIT_OOM:
        return PgoutputSparkError(
            f"Spark's driver JVM ran out of memory (java.lang.OutOfMemoryError, spark.driver.memory "
            f"{memory}) and stopped; the next run redoes this run's slice, as after any interrupted "
            f"run. To avoid it, {remedy}")
    how = f"its JVM exited with code {code}" if code is not None else "its SparkContext was stopped"
    return PgoutputSparkError(
        f"Spark stopped during the run ({how}; Spark's log above says why, java.lang.OutOfMemoryError "
        f"if the driver ran out of memory, spark.driver.memory {memory}); the next run redoes this "
        f"run's slice, as after any interrupted run. If memory was the cause, {remedy}")


def quiet_accumulator_server(sc: SparkContext) -> None:
    """Keep ``sc``'s accumulator server (pyspark's socket server that takes the tasks' updates
    from the JVM) from printing a traceback when the JVM's end of its connection closes: a JVM
    that stops its context under a live Python driver (out of memory, exit code 52) leaves the
    server's thread to find the end of its stream, and its ``EOFError`` trace came out around
    the one-line error the command prints (`spark_failure`). A closed connection carries no
    update; any other error of the server is still printed."""
    server = getattr(sc, "_accumulatorServer", None)
    if server is None or getattr(server, "_pgoutput_spark_quiet", False):
        return
    printed = server.handle_error

    def handle_error(request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], (EOFError, ConnectionError)):
            printed(request, client_address)

    server.handle_error = handle_error
    server._pgoutput_spark_quiet = True


#: Spark's error for a file it could not read, and the first cause under it.
_FAILED_READ = re.compile(r"\[FAILED_READ_FILE[.\w]*\] Encountered error while reading file (?P<file>\S+)\.\s")
_CAUSE = re.compile(r"Caused by: [\w.$]+: (?P<why>[^\n]+)")


def unreadable_file(error: BaseException) -> CaptureError | None:
    """The error to report for ``error`` when Spark could not read one of the capture's files
    (cut short, not Parquet): the file and why, instead of a Java trace."""
    text = str(error)
    found = _FAILED_READ.search(text)
    if found is None:
        return None
    cause = _CAUSE.search(text, found.end())
    why = cause["why"].strip().rstrip(".") if cause else "see Spark's log above"
    return CaptureError(
        f"can't read capture file {found['file']}: {why}. A file cut short or not a capture file "
        f"in the landing (an upload that failed, a copy still in progress)? Move it out of the "
        f"landing, or land it again, and re-run; the next run redoes this run's slice, as after "
        f"any interrupted run")


#: One of our errors as a Python task's traceback names it: ``pgoutput_spark.errors.DecodeError: ...``.
_PYTHON_TASK_ERROR = re.compile(r"\b(pgoutput_spark(?:\.\w+)*)\.(\w+): (.*)")


def python_task_error(error: BaseException) -> PgoutputSparkError | None:
    """The pgoutput_spark error a Python task raised (a decode, a conversion), recovered with
    its class and message from the ``PythonException`` Spark raises on the driver."""
    import importlib

    from ..errors import DecodeError

    matches = _PYTHON_TASK_ERROR.findall(str(error))
    if not matches:
        return None
    module, name, message = matches[-1]
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        cls = PgoutputSparkError
    if not (isinstance(cls, type) and issubclass(cls, PgoutputSparkError)):
        return None
    try:
        if issubclass(cls, DecodeError):  # its fields are gone: the message carries them
            return cls(message, field="", offset=-1)
        return cls(message)
    except TypeError:  # a class that needs more than its message
        return PgoutputSparkError(message)


def capture_error(error: BaseException) -> CaptureError | None:
    """The `CaptureError` a Spark expression raised in a task (``capture.TASK_CAPTURE_ERROR``)."""
    from ..capture import TASK_CAPTURE_ERROR

    found = re.search(re.escape(TASK_CAPTURE_ERROR) + r"(?P<message>[^\n]*?)\s*(?:SQLSTATE|\n|$)", str(error))
    return None if found is None else CaptureError(found["message"])


def task_out_of_memory(error: BaseException, master: str) -> PgoutputSparkError | None:
    """The error to report for ``error`` when it is a Spark task that ran out of memory."""
    text = str(error)
    marker = next((m for m in _TASK_OUT_OF_MEMORY if m in text), None)
    if marker is None:
        return None
    heap = (f"spark.driver.memory {_driver_memory_text()}: a local session's tasks share the driver's heap"
            if master.startswith("local") else "spark.executor.memory and spark.executor.cores decide a task's share")
    return PgoutputSparkError(
        f"a Spark task ran out of memory ({marker}; {heap}); the next run redoes this run's slice, "
        f"as after any interrupted run. To avoid it, {_REMEDY}")


#: The driver heap setting of the session `build_spark_session` last returned (`note_session`).
_driver_memory: list[str | None] = [None]


def note_session(sc: SparkContext) -> None:
    """Called by `build_spark_session` on the session it returns: its driver heap kept for
    `spark_failure`, which may have to name it after the JVM is gone, and its accumulator
    server quieted (`quiet_accumulator_server`)."""
    _driver_memory[0] = sc.getConf().get("spark.driver.memory", None)
    quiet_accumulator_server(sc)


def _driver_memory_text() -> str:
    return _driver_memory[0] or os.environ.get("SPARK_DRIVER_MEMORY") or "1g (Spark's default)"


def explains_spark_failures(func: Callable[..., T]) -> Callable[..., T]:
    """A job function (``spark`` first) whose failures that `spark_failure` explains (Spark
    stopped, our error raised in a Python task, a task out of memory, an unreadable capture
    file) raise its error, Spark's chained as the cause, instead of a Python worker's or Java
    trace or the error of whichever call found Spark gone: what a notebook or a scheduler's
    Python task then shows."""

    @functools.wraps(func)
    def job(spark: SparkSession, *args: Any, **kwargs: Any) -> T:
        try:
            return func(spark, *args, **kwargs)
        except PgoutputSparkError:
            raise
        except Exception as exc:
            explained = spark_failure(spark, error=exc)
            if explained is None:
                raise
            raise explained from exc

    return job
