"""`status` of a target: each mirror's row count from its Delta log against a Spark count.

    .venv/bin/python benchmarks/status.py [--target PATH] [--repeat 5] [--json PATH]

Without ``--target``, the sample capture (``examples/sample_capture``, five
tables) is applied into a temporary target first. Then, in one Spark session,
alternately: `status` as it is (`mirroring.deltalog.row_count`: the counts from the
statistics in each mirror's checksum file where Delta keeps them there) and
`status` with every mirror counted by Spark (`spark.read...count()`, as before
`row_count`). Prints, with the machine it ran on, the first call of each and
the mean of the others, and checks that both give the same counts.
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

SAMPLE = Path(__file__).resolve().parent.parent / "examples" / "sample_capture"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", help="an apply target (default: the sample capture applied to a new one)")
    parser.add_argument("--repeat", type=int, default=5, help="calls of each kind")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    from pgoutput_spark import reading
    from pgoutput_spark.apply import run_apply
    from pgoutput_spark.capture import read_capture
    from pgoutput_spark.spark.session import build_spark_session

    machine = Machine.current()
    print(f"machine: {machine.line()}; load {format_load(load_average())}")
    spark = build_spark_session(master="local[2]")
    with tempfile.TemporaryDirectory(prefix="bench-status-") as tmp:
        target = args.target
        if target is None:
            target = tmp
            run_apply(spark, read_capture(spark, str(SAMPLE)), target)
        from_log = reading.row_count

        def spark_count(session: Any, path: str) -> int:
            return session.read.format("delta").load(path).count()

        seconds: dict[str, list[float]] = {"from the Delta log": [], "Spark counts": []}
        counts: dict[str, Any] = {}
        for _ in range(args.repeat):
            for kind, count in (("from the Delta log", from_log), ("Spark counts", spark_count)):
                reading.row_count = count  # type: ignore[assignment]
                started = time.perf_counter()
                state = reading.status(spark, target)
                seconds[kind].append(time.perf_counter() - started)
                counts[kind] = {table: rows for table, (_, rows) in state.mirrors.items()}
        reading.row_count = from_log  # type: ignore[assignment]
    assert counts["from the Delta log"] == counts["Spark counts"], counts
    print(f"target {target}: {len(counts['Spark counts'])} mirrors, "
          f"{sum(counts['Spark counts'].values()):,} rows")
    results: dict[str, Any] = {"machine": machine.as_dict(), "target": target, "mirrors": len(counts["Spark counts"])}
    for kind, values in seconds.items():
        rest = values[1:] or values
        print(f"  status, counts {kind}: first {values[0]:.2f} s, then mean {sum(rest) / len(rest):.2f} s "
              f"({min(rest):.2f}-{max(rest):.2f})")
        results[kind] = values
    print(f"load {format_load(load_average())}")
    spark.stop()
    return finish(results, argv, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
