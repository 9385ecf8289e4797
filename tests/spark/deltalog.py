"""A Delta table's commits and removed files read from its log, without a Spark job."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ..plugins.spark import local_path


def commits(path: str | Path) -> int:
    """The number of commits of the Delta table at ``path``: its ``_delta_log/<version>.json``
    files. The tests never clean a log up and use no coordinated commits (whose commits wait
    in ``_delta_log/_staged_commits`` first), so this is ``DESCRIBE HISTORY``'s row count,
    read without a Spark job per table. No table at ``path`` is an error, as for ``DESCRIBE
    HISTORY``: a "no new commit" check on a path that holds none would prove nothing. A `lake`
    URI is read in its local folder."""
    log = local_path(path) / "_delta_log"
    if not log.is_dir():
        raise FileNotFoundError(f"no Delta table at {path}")
    return sum(1 for f in log.glob("*.json") if f.stem.isdigit())


def removed_before(path: str | Path, at_ms: float) -> set[str]:
    """The data files the commits of the Delta table at ``path`` made before ``at_ms`` (ms since
    the epoch, as Delta's commit timestamps) removed."""
    removed: set[str] = set()
    for log in Path(path, "_delta_log").glob("*.json"):
        actions = [json.loads(line) for line in log.read_text().splitlines()]
        if next(a["commitInfo"]["timestamp"] for a in actions if "commitInfo" in a) < at_ms:
            removed |= {a["remove"]["path"] for a in actions if "remove" in a}
    return removed


def recorded_vacuums(monkeypatch: Any, spark: Any) -> list[tuple[str, float]]:
    """The (table path, when in ms) of each `vacuum_files` call from here on, the tables created
    from here on without retention (7 days outside tests): for `check_vacuumed`. Needs the
    ``restore_spark_conf`` fixture."""
    from pgoutput_spark.mirroring import delta

    spark.conf.set("spark.databricks.delta.properties.defaults.deletedFileRetentionDuration", "interval 0 seconds")
    vacuumed: list[tuple[str, float]] = []
    real = delta.vacuum_files

    def vacuum_files(session: Any, path: str) -> int:
        vacuumed.append((path, time.time() * 1000))
        return real(session, path)

    monkeypatch.setattr(delta, "vacuum_files", vacuum_files)  # as `vacuum_tables` calls it
    return vacuumed


def check_vacuumed(spark: Any, vacuumed: list[tuple[str, float]], rewritten: set[str]) -> None:
    """Each (table path, when) of ``vacuumed`` holds none of the files its commits removed before
    then, and every file its version now reads; the tables named in ``rewritten`` (directory
    names) were vacuumed, with files to delete."""
    assert {Path(path).name for path, _ in vacuumed} >= rewritten, vacuumed
    for path, at in vacuumed:
        removed = removed_before(path, at)
        held = {f.name for f in Path(path).glob("*.parquet")}
        current = {Path(f).name for f in spark.read.format("delta").load(path).inputFiles()}
        assert (bool(removed) or Path(path).name not in rewritten, removed & held, current <= held) == \
            (True, set(), True), path
