"""What a capture's ``session`` column costs a run: finding where its walsender sessions begin.

    .venv/bin/python benchmarks/sessions.py [--capture PATH] [--sessions 1,100] [--repeat 5] [--json PATH]

The capture is `benchmarks/apply.py`'s (1M changes of pgbench and a wide table;
that script builds it in ``benchmarks/data``). Its rows are written once more
to a temporary Parquet folder with a ``session`` column, SESSIONS sessions of
equal length (a string, as a lander's connection id would be). Then, in one
local Spark session on 2 cores, the best of REPEAT timings of:

- `find_sessions` on the whole capture: the aggregation a run of a capture
  with the column adds (one per run);
- `message_counts` on it: the aggregation every run makes anyway (rows and
  distinct seqs, for repeated rows and missing seqs), for scale.

Prints the machine, the capture's size and both times per SESSIONS.
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

CAPTURE = Path(__file__).resolve().parent / "data" / "apply-e2e-1000000" / "capture"


def best(repeat: int, fn: Any) -> tuple[float, Any]:
    """The shortest of ``repeat`` timings of ``fn()`` (after one untimed call) and its result."""
    result = fn()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return min(times), result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capture", type=Path, default=CAPTURE)
    parser.add_argument("--sessions", default="1,100", help="sessions to cut the capture into (default 1,100)")
    parser.add_argument("--repeat", type=int, default=5, help="timings of each; the best counts (default 5)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON to this file")
    args = parser.parse_args(argv)
    if not args.capture.exists():
        raise SystemExit(f"no capture at {args.capture}: `benchmarks/apply.py --skip-merge` builds it")

    from pyspark.sql import functions as F

    from pgoutput_spark.capture import CaptureColumns, message_counts, read_capture
    from pgoutput_spark.spark.session import build_spark_session
    from pgoutput_spark.spark.sessions import find_sessions

    machine = Machine.current()
    print(f"machine: {machine.line()}; load {format_load(load_average())}")
    spark = build_spark_session(master="local[2]")
    capture = read_capture(spark, str(args.capture))
    lo, hi, n = capture.agg(F.min("seq"), F.max("seq"), F.count(F.lit(1))).first()
    print(f"capture: {args.capture}, {n:,} messages (seqs {lo} to {hi})")
    results: dict[str, Any] = {"machine": machine.as_dict(), "messages": n, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        for sessions in [int(s) for s in args.sessions.split(",")]:
            width = -(-(hi - lo + 1) // sessions)
            path = f"{tmp}/sessions-{sessions}"
            (capture.withColumn("session", F.concat(F.lit("walsender-"), ((F.col("seq") - lo) / width)
                                                    .cast("long").cast("string")))
             .write.parquet(path))
            canonical = CaptureColumns(session="session").select(spark.read.parquet(path))
            found_s, found = best(args.repeat, lambda: find_sessions(canonical, None))
            counts_s, _ = best(args.repeat, lambda: message_counts(canonical))
            assert len(found.starts) == sessions - 1, found
            print(f"{sessions} sessions: find_sessions {found_s:.3f} s; message_counts {counts_s:.3f} s "
                  f"(best of {args.repeat})")
            results["runs"].append({"sessions": sessions, "find_sessions_s": round(found_s, 3),
                                    "message_counts_s": round(counts_s, 3)})
    spark.stop()
    return finish(results, argv, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
