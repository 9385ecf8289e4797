"""A small table's fixed cost: a new mirror's first append and a small MERGE, by snapshot partitions.

    .venv/bin/python benchmarks/small_tables.py [--partitions 1,2] [--tables 4] [--json PATH]

Prints, with the machine it ran on: for each value of Delta's
``spark.databricks.delta.snapshotPartitions`` (the partitions Delta rebuilds a
table's snapshot in after each commit), the seconds of creating TABLES new
keyed mirrors of 100 rows through the job's own `append` (``create=True``, as
a run creates a mirror) and of one MERGE of 60 net rows (48 upserts, 12
deletes) into each through the job's `merge`, and their means over all but the
first table (warm-up). The settings alternate, twice over, so that load drifts
hit each.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.machine import Machine, finish, format_load, load_average  # noqa: E402

SETTING = "spark.databricks.delta.snapshotPartitions"


def _one_table(spark: Any, path: str) -> tuple[float, float]:
    from pyspark.sql import functions as F

    from pgoutput_spark.mirroring.delta import append
    from pgoutput_spark.mirroring.merge import merge
    from pgoutput_spark.mirroring.net import TableSpec

    spec = TableSpec("keyed", ("id",), ("id", "v"))
    rows = spark.range(100).select("id", F.col("id").cast("string").alias("v")).persist()
    changes = spark.range(50, 110).select(
        "id", F.lit("changed").alias("v"),
        F.when(F.col("id") % 5 == 0, "delete").otherwise("upsert").alias("_action")).persist()
    rows.count(), changes.count()
    started = time.perf_counter()
    append(path, rows, spec, app_id="bench", version=1, metadata={}, create=True)
    appended = time.perf_counter()
    merge(spark, path, changes, spec, truncated=False, app_id="bench", version=2, metadata={})
    merged = time.perf_counter()
    rows.unpersist(), changes.unpersist()
    return appended - started, merged - appended


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", default="1,2", help="snapshot partitions to compare, comma-separated")
    parser.add_argument("--tables", type=int, default=4, help="new mirrors per setting and round")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    from pgoutput_spark.spark.session import build_spark_session

    machine = Machine.current()
    print(f"machine: {machine.line()}; load {format_load(load_average())}")
    spark = build_spark_session(master="local[2]")
    settings = [p.strip() for p in args.partitions.split(",")]
    results: dict[str, Any] = {"machine": machine.as_dict(), "runs": []}
    warm: dict[str, list[tuple[float, float]]] = {p: [] for p in settings}
    with tempfile.TemporaryDirectory(prefix="bench-small-") as tmp:
        for round_ in range(2):
            for partitions in settings:
                spark.conf.set(SETTING, partitions)
                seconds = [_one_table(spark, f"{tmp}/r{round_}-p{partitions}-t{t}") for t in range(args.tables)]
                warm[partitions] += seconds[1:]
                results["runs"].append({"snapshot_partitions": int(partitions), "round": round_,
                                        "append_merge_seconds": seconds})
                print(f"snapshot partitions {partitions:>3}  append / MERGE per table: "
                      + "  ".join(f"{a:.2f}/{m:.2f}" for a, m in seconds) + " s", flush=True)
    for partitions in settings:
        appends, merges = zip(*warm[partitions])
        print(f"snapshot partitions {partitions:>3}  mean of the warm tables: first append "
              f"{sum(appends) / len(appends):.2f} s, MERGE of 60 rows {sum(merges) / len(merges):.2f} s")
    print(f"load {format_load(load_average())}")
    spark.stop()
    return finish(results, argv, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
