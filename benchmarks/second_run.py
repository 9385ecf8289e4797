"""A run into mirrors that exist: the capture applied in two runs, the second one timed.

    .venv/bin/python benchmarks/second_run.py [--capture PATH] [--first 0.5] [--runs 2]
        [--conf KEY=VALUE ...] [--json PATH]

The capture is `benchmarks/apply.py`'s (pgbench TPC-B and the 20-column
``REPLICA IDENTITY FULL`` table ``bench_wide``, protocol 1; that script builds
it in ``benchmarks/data``). A first run applies its first FIRST of messages
(not timed); then the rest is applied RUNS times, each time into a copy of the
mirrors the first run left. Unlike `apply.py`'s runs into new mirrors, the
second run's updates and deletes look their rows up in the mirrors (a
pre-image per table), as every run of a replication that keeps going does:
``bench_wide``'s hundreds of thousands of updates go through the net change
that reads rows from its mirror. One Spark session (local[2]). Prints, with the
machine it ran on, each timed run's seconds, the tasks of each table's net
change, and the steps the job logs.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.machine import Machine, finish, format_load, load_average  # noqa: E402
from benchmarks.small_runs import CAPTURE, _spread, _step_means, _Steps  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capture", type=Path, default=CAPTURE, help="an unframed capture (default: %(default)s)")
    parser.add_argument("--first", type=float, default=0.5, help="share of the messages the first run applies")
    parser.add_argument("--runs", type=int, default=2, help="timed second runs, each into a copy of the mirrors")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the session (repeatable)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not args.capture.exists():
        raise SystemExit(f"no capture at {args.capture}: `benchmarks/apply.py --skip-merge` builds it")
    conf = dict(item.split("=", 1) for item in args.conf)

    from pyspark.sql import functions as F

    from pgoutput_spark.apply import run_apply
    from pgoutput_spark.capture import read_capture
    from pgoutput_spark.spark.session import build_spark_session

    machine = Machine.current()
    print(f"machine: {machine.line()}; load {format_load(load_average())}")
    spark = build_spark_session(master="local[2]", conf=conf)
    capture = read_capture(spark, str(args.capture))
    first, last = capture.agg(F.min("seq"), F.max("seq")).first()
    cut = first + int((last - first) * args.first)
    logger = logging.getLogger("pgoutput_spark.apply")
    logger.setLevel(logging.INFO)
    results: dict[str, Any] = {"machine": machine.as_dict(), "capture": str(args.capture), "cut": cut,
                               "conf": conf, "runs": []}
    steps: dict[str, list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="bench-second-") as tmp:
        base = Path(tmp) / "first"
        started = time.perf_counter()
        result = run_apply(spark, capture, str(base), until_seq=cut)
        print(f"first run: {result.messages} messages up to seq {cut}, {time.perf_counter() - started:.1f} s "
              "(not counted)", flush=True)
        for k in range(args.runs):
            target = Path(tmp) / f"second-{k}"
            shutil.copytree(base, target)
            handler = _Steps()
            logger.addHandler(handler)
            started = time.perf_counter()
            result = run_apply(spark, capture, str(target))
            seconds = time.perf_counter() - started
            logger.removeHandler(handler)
            tables = {t.table: {"tasks": t.tasks, "inserted": t.inserted, "updated": t.updated,
                                "deleted": t.deleted, "skipped": t.skipped} for t in result.tables}
            print(f"second run {k}: {result.messages} messages, {seconds:.2f} s; net change tasks: "
                  + ", ".join(f"{name} {t['tasks']}" for name, t in sorted(tables.items())), flush=True)
            assert not any(t["skipped"] for t in tables.values()), tables
            results["runs"].append({"seconds": seconds, "messages": result.messages, "tables": tables})
            for step, value in handler.steps.items():
                steps[step].append(value)
            shutil.rmtree(target)
    print(f"second runs: {_spread([r['seconds'] for r in results['runs']])}")
    results["step_means"] = _step_means("second run", steps, args.runs)
    print(f"load {format_load(load_average())}")
    spark.stop()
    return finish(results, argv, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
