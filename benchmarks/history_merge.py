"""A history table's MERGE: a Delta transaction of our own against Delta's MERGE command.

    .venv/bin/python benchmarks/history_merge.py [--keys 1000] [--runs 6] [--json PATH]

Prints, with the machine it ran on: a history of KEYS keys (three versions each, the last
current, written in two files as runs leave a history) takes RUNS runs' MERGEs through the
job's `merge_history`, each of 60 ``close`` rows (versions ended) and 60 ``version`` rows (the
new ones, 10 of them new keys), once by `merge_listed` (the job's way where the history's
checksum lists its files) and once by Delta's MERGE command (`merge_listed` made to decline),
into two such histories, in one Spark session, each way first in turn. The first run of each
is a warm-up; the means are over the others. Both histories must end with the same rows.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.machine import Machine, finish, format_load, load_average  # noqa: E402

HISTORY = ("`id` bigint, `v` string, `_valid_from_lsn` bigint, `_valid_to_lsn` bigint, `_valid_from_ts` timestamp, "
           "`_valid_to_ts` timestamp, `_is_current` boolean, `_version_seq` bigint")


def _history(spark: Any, path: str, keys: int) -> None:
    from pgoutput_spark.mirroring.delta import append
    from pgoutput_spark.mirroring.history import HISTORY_NAMES
    from pgoutput_spark.mirroring.net import TableSpec

    at = dt.datetime(2026, 1, 1)
    rows = [(k, f"v{k}.{i}", 10 * i + 1, None if i == 2 else 10 * i + 11, at + dt.timedelta(seconds=10 * i),
             None if i == 2 else at + dt.timedelta(seconds=10 * i + 10), i == 2, k)
            for k in range(keys) for i in range(3)]
    spec = TableSpec("keyed", ("id",), ("id", "v", *HISTORY_NAMES))
    half = len(rows) // 2
    for version, part in enumerate((rows[:half], rows[half:]), start=1):
        append(path, spark.createDataFrame(part, HISTORY), spec, app_id="bench", version=version,
               metadata={}, create=version == 1)


def _run_rows(run: int, keys: int) -> list[tuple]:
    lsn, at = 1000 + run, dt.datetime(2026, 1, 2) + dt.timedelta(seconds=run)
    closed = [(run * 50 + k) % keys for k in range(50)]  # keys whose current version this run ends
    rows = [("close", k, None, None, lsn, None, at, False, None) for k in closed]
    rows += [("version", k, f"r{run}", lsn, None, at, None, True, run) for k in closed]
    rows += [("version", keys + run * 10 + k, f"new{run}", lsn, None, at, None, True, run) for k in range(10)]
    rows += [("close", keys + run * 10 + k, None, None, lsn, None, at, False, None) for k in range(10)]  # no version
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=1000, help="keys of each history")
    parser.add_argument("--runs", type=int, default=6, help="MERGEs into each history (the first one warms up)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    import pgoutput_spark.mirroring.merge as merging
    from pgoutput_spark.mirroring.history import merge_history
    from pgoutput_spark.mirroring.net import TableSpec
    from pgoutput_spark.spark.session import build_spark_session

    machine = Machine.current()
    print(f"machine: {machine.line()}; load {format_load(load_average())}")
    spark = build_spark_session(master="local[2]")
    spec = TableSpec("keyed", ("id",), ("id", "v"))
    listed = merging.merge_listed
    ways = {"ours": listed, "delta": lambda *a, **k: None}
    seconds: dict[str, list[float]] = {way: [] for way in ways}
    results: dict[str, Any] = {"machine": machine.as_dict(), "keys": args.keys, "runs": []}
    with tempfile.TemporaryDirectory(prefix="bench-history-") as tmp:
        for way in ways:
            _history(spark, f"{tmp}/{way}", args.keys)
        for run in range(args.runs):
            source = spark.createDataFrame(_run_rows(run, args.keys), f"_action string, {HISTORY}").persist()
            source.count()
            for way in (list(ways) if run % 2 else list(ways)[::-1]):  # each first in turn
                merging.merge_listed = ways[way]
                started = time.perf_counter()
                counts = merge_history(spark, f"{tmp}/{way}", source, spec, app_id="bench", version=10 + run,
                                       metadata={})
                seconds[way].append(time.perf_counter() - started)
                results["runs"].append({"way": way, "run": run, "seconds": seconds[way][-1], **counts})
            merging.merge_listed = listed
            source.unpersist()
            print(f"run {run}: " + "  ".join(f"{way} {seconds[way][-1]:.2f} s" for way in ways), flush=True)
        rows = {way: sorted(map(tuple, spark.read.format("delta").load(f"{tmp}/{way}").collect()), key=repr)
                for way in ways}
        if rows["ours"] != rows["delta"]:
            raise SystemExit("the two histories differ")
    for way in ways:
        warm = seconds[way][1:]
        print(f"{way:>5}: first MERGE {seconds[way][0]:.2f} s, mean of the others {sum(warm) / len(warm):.2f} s")
    print(f"load {format_load(load_average())}")
    spark.stop()
    return finish(results, argv, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
