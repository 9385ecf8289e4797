"""Small MERGEs with and without deletion vectors: what a mirror's default should be.

    .venv/bin/python benchmarks/deletion_vectors.py [--rows 2000,2000000] [--merges 6] [--json PATH]

Prints, with the machine it ran on: for a keyed mirror of ROWS rows created as
the job creates mirrors (column mapping, type widening) with
``delta.enableDeletionVectors`` on and off, the seconds of each of MERGES
MERGEs of 60 net rows (48 upserts, a few of them new keys, and 12 deletes)
through the job's own `pgoutput_spark.mirroring.merge.merge`, and the mean of
all but the first (warm-up). The two settings alternate, twice over, so that
load drifts hit both.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.machine import Machine, finish, format_load, load_average  # noqa: E402

BATCH = 60


def _mirror(spark: Any, path: str, rows: int, deletion_vectors: bool) -> None:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from pgoutput_spark.mirroring.schema import PROPERTIES

    builder = DeltaTable.create(spark).location(path).addColumn("id", "long").addColumn("v", "string")
    for key, value in {**PROPERTIES, "delta.enableDeletionVectors": str(deletion_vectors).lower()}.items():
        builder = builder.property(key, value)
    builder.execute()
    spark.range(rows).select("id", F.col("id").cast("string").alias("v")).write.format("delta") \
        .mode("append").save(path)


def _merges(spark: Any, path: str, merges: int) -> list[float]:
    from pyspark.sql import functions as F

    from pgoutput_spark.mirroring.merge import merge
    from pgoutput_spark.mirroring.net import TableSpec

    spec = TableSpec("keyed", ("id",), ("id", "v"))
    seconds = []
    for k in range(merges):
        source = spark.range(k * 37, k * 37 + BATCH).select(
            "id", F.lit(f"run {k}").alias("v"),
            F.when(F.col("id") % 5 == 0, "delete").otherwise("upsert").alias("_action")).persist()
        source.count()
        started = time.perf_counter()
        merge(spark, path, source, spec, truncated=False, app_id="bench", version=k + 1, metadata={})
        seconds.append(time.perf_counter() - started)
        source.unpersist()
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="2000,2000000", help="mirror sizes, comma-separated")
    parser.add_argument("--merges", type=int, default=6, help="MERGEs per mirror (the first is a warm-up)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    from pgoutput_spark.spark.session import build_spark_session

    machine = Machine.current()
    print(f"machine: {machine.line()}; load {format_load(load_average())}")
    spark = build_spark_session(master="local[2]", conf={"spark.driver.memory": "4g"})
    results: dict[str, Any] = {"machine": machine.as_dict(), "runs": []}
    with tempfile.TemporaryDirectory(prefix="bench-dv-") as tmp:
        for rows in (int(r) for r in args.rows.split(",")):
            means: dict[bool, list[float]] = {True: [], False: []}
            for round_ in range(2):
                for deletion_vectors in (True, False):
                    path = f"{tmp}/mirror-{rows}-{deletion_vectors}"
                    shutil.rmtree(path, ignore_errors=True)
                    _mirror(spark, path, rows, deletion_vectors)
                    seconds = _merges(spark, path, args.merges)
                    means[deletion_vectors] += seconds[1:]
                    results["runs"].append({"rows": rows, "deletion_vectors": deletion_vectors,
                                            "round": round_, "seconds": seconds})
                    print(f"{rows:>11,} rows  deletion vectors {'on ' if deletion_vectors else 'off'}  "
                          f"MERGEs of {BATCH} rows: " + " ".join(f"{s:.2f}" for s in seconds) + " s",
                          flush=True)
            on, off = (sum(means[v]) / len(means[v]) for v in (True, False))
            print(f"{rows:>11,} rows  mean of the warm MERGEs: on {on:.2f} s, off {off:.2f} s, "
                  f"on / off {on / off:.2f}; load {format_load(load_average())}")
    spark.stop()
    return finish(results, argv, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
