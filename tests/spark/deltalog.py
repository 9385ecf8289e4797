"""A Delta table's commits and removed files read from its log, without a Spark job."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

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
    then, every file its version now reads, and no partition folder left empty; the tables named
    in ``rewritten`` (directory names) were vacuumed, with files to delete. Files are compared
    by their paths in the table (``_run_hi=7/part-....parquet`` in a partitioned one)."""
    assert {Path(path).name for path, _ in vacuumed} >= rewritten, vacuumed
    for path, at in vacuumed:
        root = Path(path)
        removed = {unquote(f) for f in removed_before(path, at)}
        held = {f.relative_to(root).as_posix() for f in root.rglob("*.parquet") if "_delta_log" not in f.parts}
        current = {Path(unquote(urlparse(f).path)).relative_to(root).as_posix()
                   for f in spark.read.format("delta").load(path).inputFiles()}
        empty = [d.name for d in root.iterdir() if d.is_dir() and d.name != "_delta_log" and not any(d.iterdir())]
        assert (bool(removed) or root.name not in rewritten, removed & held, current <= held, empty) == \
            (True, set(), True, []), path
