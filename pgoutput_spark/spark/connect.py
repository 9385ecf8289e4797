"""Spark Connect sessions: what works in them, and a clear refusal for the rest.

A Spark Connect session (``SparkSession.builder.remote(...)``, ``SPARK_REMOTE``,
``spark.api.mode=connect``, notebooks on compute that offers only Spark Connect)
is a client of a Spark driver elsewhere: it sends plans, and has no driver JVM
to call and no ``sparkContext``. The notebook API's reads work in it: a capture
(`pgoutput_spark.capture.read_capture`), decoded (`pgoutput_spark.spark.decode.decode`,
`quarantined`), its typed changes (`pgoutput_spark.spark.changes.change_frames`, the
notebook's ``changes``), and a target (`pgoutput_spark.reading.status`, `mirror`,
`history`; `pgoutput_spark.slot.verify.verify_mirrors`). What their
tasks share goes with the task's function there (`for_tasks`), `pgoutput_spark.spark.files`
asks Spark's readers whether a file is there, and the target's tables are read and counted
by Delta's reader (`mirroring.listed.read_listed`, `read_current`,
`mirroring.deltalog.row_count`), a Delta landing's record by SQL. The jobs (`run_apply`,
`run_changes`, `snapshot_tables`, `capture_slot` into a Delta landing) work with Delta's log
and the file system through the driver's JVM: given such a session they raise `ConfigError`
before they read or write anything (`require_classic`), instead of failing on PySpark's
refusal of ``sparkContext`` somewhere inside; `build_spark_session` refuses to build one
(`asks_for_connect`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ..errors import ConfigError

__all__ = ["asks_for_connect", "for_tasks", "is_connect", "require_classic"]

T = TypeVar("T")


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (by its class: PySpark's Spark Connect
    client is imported only where one was made)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def asks_for_connect(conf: Mapping[str, str] | None = None) -> str | None:
    """What would make PySpark's session builder return a Spark Connect session (``name=value``),
    given the builder's ``conf`` and this process's environment; None for a classic one."""
    settings = conf or {}
    if "spark.remote" in settings:
        return f"spark.remote={settings['spark.remote']}"
    if settings.get("spark.api.mode", "").lower() == "connect":
        return "spark.api.mode=connect"
    for name in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED"):  # the second: a client made here
        if name in os.environ:
            return f"{name}={os.environ[name]}"
    if os.environ.get("SPARK_API_MODE", "").lower() == "connect" and "spark.api.mode" not in settings:
        return "SPARK_API_MODE=connect"
    return None


def require_classic(spark: Any, what: str) -> None:
    """`ConfigError` where ``spark`` is a Spark Connect session, naming ``what`` needs a classic one."""
    if is_connect(spark):
        raise ConfigError(
            f"{what} needs a classic Spark session: it works with Delta's log and the file system through "
            f"the driver's JVM, which a Spark Connect session has no access to; nothing was read or "
            f"written. Run it with spark-submit or the pgoutput-spark command, or in a classic session "
            f"(SparkSession.builder without remote(), SPARK_REMOTE unset, spark.api.mode classic). "
            f"read_capture, decode, quarantined, changes, status, mirror, history and verify work in a Spark "
            f"Connect session")


def for_tasks(spark: Any, value: T) -> Callable[[], T]:
    """``value`` for the functions Spark's tasks run (called in the task): a broadcast in a
    classic session, sent once to each executor; in a Spark Connect session, which has no
    broadcasts, pickled with the function itself (keep it small there)."""
    if is_connect(spark):
        return lambda: value
    held = spark.sparkContext.broadcast(value)
    return lambda: held.value
