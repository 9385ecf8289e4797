"""Spark local[2]: capture -> Parquet, with and without decoding.

Four jobs read the same capture:

* ``copy``: ``read_capture(...).write.parquet(...)``, Spark's own read + write;
* ``arrow``: the same with an identity ``mapInArrow`` in between, i.e. the cost of
  shipping every batch to a Python worker and back, without decoding;
* ``decode``: ``decode(read_capture(...)).write.parquet(...)``, including
  `decode`'s first pass (the Stream Start / Stop scan, timed on its own too);
* ``decode_noop``: the same decode into Spark's ``noop`` sink, so the cost of
  writing the decoded (nested) rows as Parquet shows as the difference.

Each job first runs once on a small warm-up capture (JVM, Python workers and
code paths warm), then `runs` times on the real capture in alternating order;
the best time of each counts.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from pgoutput_spark import build_spark_session, decode, read_capture

#: Job name -> what it does, in run order.
JOBS = {
    "copy": "read + write, no decode",
    "arrow": "read + mapInArrow identity + write",
    "decode": "read + decode + write",
    "decode_noop": "read + decode + noop sink",
}

_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "2g",
    # Spark's default; the decoder benchmark uses the same batch size.
    "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
}

# A job reads `src`, writes to `out` and returns the seconds of decode()'s first pass (0 if none).
Job = Callable[[str, str], float]


@dataclass(frozen=True)
class SparkJobResult:
    name: str
    seconds: float
    all_seconds: tuple[float, ...]
    first_pass_seconds: float  # decode()'s Stream Start / Stop scan, within `seconds`
    output_mib: float
    cpu_busy: float  # fraction of all cores busy during the best run (whole machine)


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


def _size_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*.parquet")) / 1024**2


def _jobs(spark: SparkSession) -> dict[str, Job]:
    # Nested functions: cloudpickle ships them by value, and the Python workers
    # cannot import this script's modules by name.
    def identity(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from batches

    def timed_decode(src: str) -> tuple[DataFrame, float]:
        started = time.perf_counter()
        decoded = decode(read_capture(spark, src))  # runs the first pass
        return decoded, time.perf_counter() - started

    def copy(src: str, out: str) -> float:
        read_capture(spark, src).write.mode("overwrite").parquet(out)
        return 0.0

    def arrow(src: str, out: str) -> float:
        df = read_capture(spark, src)
        df.mapInArrow(identity, df.schema).write.mode("overwrite").parquet(out)
        return 0.0

    def decoded(src: str, out: str) -> float:
        df, first_pass = timed_decode(src)
        df.write.mode("overwrite").parquet(out)
        return first_pass

    def decoded_noop(src: str, out: str) -> float:
        df, first_pass = timed_decode(src)
        df.write.format("noop").mode("overwrite").save()
        return first_pass

    return {"copy": copy, "arrow": arrow, "decode": decoded, "decode_noop": decoded_noop}


def run_spark(capture: Path, warmup: Path, out_dir: Path, *, runs: int = 2) -> list[SparkJobResult]:
    """Time the jobs (see the module docstring); outputs go to `out_dir` and are removed."""
    spark = build_spark_session(app_name="pgoutput-spark-bench", master="local[2]", conf=_CONF)
    times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in JOBS}
    sizes: dict[str, float] = {}
    try:
        jobs = _jobs(spark)
        for name, job in jobs.items():
            job(str(warmup), str(out_dir / f"warmup-{name}"))
        for run in range(runs):
            order = list(JOBS) if run % 2 == 0 else list(reversed(JOBS))
            for name in order:
                busy0, total0 = _cpu_times()
                started = time.perf_counter()
                first_pass = jobs[name](str(capture), str(out_dir / name))
                elapsed = time.perf_counter() - started
                busy1, total1 = _cpu_times()
                times[name].append((elapsed, first_pass, (busy1 - busy0) / max(total1 - total0, 1)))
        sizes = {name: _size_mib(out_dir / name) for name in JOBS}
    finally:
        spark.stop()
        shutil.rmtree(out_dir, ignore_errors=True)
    results = []
    for name in JOBS:
        best = min(times[name])
        results.append(SparkJobResult(name, best[0], tuple(t[0] for t in times[name]), best[1],
                                      sizes[name], best[2]))
    return results
