"""A target's own tables as runs accumulate: what a pipeline that runs every few minutes meets after months.

    .venv/bin/python benchmarks/ledger_growth.py [--sessions 100 1000 4000] [--files 1 50 500 3000]
        [--runs 1000 10000 50000] [--capture examples/sample_capture] [--json PATH]

1. Relations saved by real runs: the capture (``examples/sample_capture``: three
   files, each landed by a decoding session of its own, each sending the tables'
   Relation messages again) applied file by file; prints the Relation / Type
   messages the capture holds and the rows the runs saved in
   ``_pgoutput/relations``.
2. Loading the relation history (`pgoutput_spark.ledger.Ledger.history`: read the
   table, add its rows) from a table holding the rows the runs of 1. saved, then,
   for each of SESSIONS - 1 later sessions, the latest Relation / Type message of
   each OID again (what PostgreSQL sends in each, and what runs that saved every
   message kept; a pipeline capturing every few minutes meets thousands of
   sessions within weeks): the first load (which rewrites such a table, where
   this version does) and the next.
3. ``status`` on the target of 1. whose ``_runs`` holds FILES files (one per
   run, as appends leave it; copies of a run's row): its time, then, where this
   version has it, the time of `pgoutput_spark.mirroring.delta.compact_files`
   (what a run does past `LEDGER_MAX_FILES`) and of ``status`` after it.
4. `pgoutput_spark.mirror` (now, and ``as_of_lsn``) and ``status`` (every run's
   row; where this version has ``last``, the last 10 as ``pgoutput-spark status``
   prints them) on that target with RUNS rows in ``_runs`` (copies of a run's
   row), compacted.
5. A changes run (`pgoutput_spark.changefeed.run_changes`) with nothing new, on
   a change-table target of the capture whose ``_pgoutput/runs`` holds the
   rows of RUNS runs (two each: copies of its run's rows, earlier, without
   files), compacted.
6. The vacuum of the target's own tables that a run does each time it compacts
   ``_runs`` (every `LEDGER_MAX_FILES` runs), where this version has it: on the
   target of 1., each table alone, then all four at a time as the run does.

Prints, with the machine it ran on, seconds per step. Run it from a git worktree
of an older commit to measure that commit's code (the script imports the package
beside it).
"""

from __future__ import annotations

import argparse
import inspect
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.machine import Machine, finish, format_load, load_average  # noqa: E402

SAMPLE = Path(__file__).resolve().parent.parent / "examples" / "sample_capture"


def _timed(call: Any) -> float:
    """Seconds of a second ``call`` (the first reads the tables' Delta state)."""
    call()
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def _copies(row: Any, n: int) -> Any:
    """``n`` copies of the one-row frame ``row`` (a run's row of ``_runs``), each its own run_id."""
    from pyspark.sql import functions as F

    return row.crossJoin(row.sparkSession.range(n).withColumnRenamed("id", "copy")) \
        .withColumn("run_id", F.concat(F.lit("copy-"), F.col("copy").cast("string"))).drop("copy")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capture", type=Path, default=SAMPLE)
    parser.add_argument("--sessions", type=int, nargs="+", default=[100, 1000, 4000])
    parser.add_argument("--files", type=int, nargs="+", default=[1, 50, 500, 3000])
    parser.add_argument("--runs", type=int, nargs="+", default=[1000, 10000, 50000])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    from pyspark.sql import functions as F

    from pgoutput_spark.apply import mirror, run_apply, status
    from pgoutput_spark.capture import read_capture
    from pgoutput_spark.ledger import Ledger
    from pgoutput_spark.spark.session import build_spark_session

    try:
        from pgoutput_spark.mirroring.delta import compact_files
    except ImportError:  # a version from before runs compacted their tables
        compact_files = None

    machine = Machine.current()
    print(f"machine: {machine.line()}; load {format_load(load_average())}")
    spark = build_spark_session(master="local[2]")
    results: dict[str, Any] = {"machine": machine.as_dict(), "capture": str(args.capture)}
    files = sorted(p for p in args.capture.iterdir() if p.suffix == ".parquet")
    with tempfile.TemporaryDirectory(prefix="bench-ledger-") as tmp:
        # 1. Real runs, one capture file (one decoding session) each.
        target, landing = f"{tmp}/target", Path(tmp) / "landing"
        landing.mkdir()
        for f in files:
            (landing / f.name).write_bytes(f.read_bytes())
            run_apply(spark, read_capture(spark, str(landing)), target)
        capture = read_capture(spark, str(args.capture))
        sent = capture.where(F.substring("data", 1, 1).cast("string").isin("R", "Y")).count()
        relations = spark.read.format("delta").load(f"{target}/_pgoutput/relations")
        saved = relations.count()
        print(f"1. {len(files)} runs, one capture file each: the capture holds {sent} Relation / Type "
              f"messages; the runs saved {saved}")
        results["relations"] = {"runs": len(files), "sent": sent, "saved": saved}

        # 2. The history loaded from the runs' rows and then, for each later session, the
        # latest Relation / Type message of each OID again (what PostgreSQL sends).
        columns = relations.select("seq", "relation", "type")
        saved_rows = columns.collect()
        latest = {}
        for r in sorted(saved_rows, key=lambda r: r["seq"]):
            latest[("relation", r["relation"]["relation_id"]) if r["relation"] else ("type", r["type"]["type_id"])] = r
        span = max(r["seq"] for r in saved_rows) + 1
        again = spark.createDataFrame(list(latest.values()), columns.schema)
        loads = []
        for sessions in [1, *args.sessions]:
            root = f"{tmp}/history-{sessions}"
            repeated = again.crossJoin(spark.range(1, sessions).withColumnRenamed("id", "session")) \
                .withColumn("seq", F.col("seq") + F.col("session") * span).drop("session")
            table = spark.createDataFrame(saved_rows, columns.schema).unionByName(repeated)
            table.coalesce(1).write.format("delta").save(f"{root}/_pgoutput/relations")
            n_rows = len(saved_rows) + len(latest) * (sessions - 1)
            ledger = Ledger(spark, root, "default")
            spark.read.format("delta").load(f"{root}/_pgoutput/relations").count()  # its Delta state read
            started = time.perf_counter()
            ledger.history()  # where this version does, rewrites a table of many repeats
            first = time.perf_counter() - started
            started = time.perf_counter()
            history = ledger.history()
            then = time.perf_counter() - started
            versions = sum(len(v) for v in history.relations.values()) + sum(len(v) for v in history.types.values())
            held = spark.read.format("delta").load(f"{root}/_pgoutput/relations").count()
            print(f"2. history from {n_rows} rows ({sessions} sessions): {first:.2f} s, then {then:.2f} s; "
                  f"{versions} versions kept, {held} rows in the table after", flush=True)
            loads.append({"sessions": sessions, "rows": n_rows, "first_seconds": first, "then_seconds": then,
                          "versions": versions, "rows_after": held})
        results["history"] = loads

        # 3. `status` over a `_runs` of many files, then compacted.
        runs_path = f"{target}/_runs"
        row = spark.read.format("delta").load(runs_path).limit(1)
        statuses = []
        for n in sorted(args.files):
            held = spark.sql(f"DESCRIBE DETAIL delta.`{runs_path}`").first()["numFiles"]
            if n > held:  # copies of a run's row, a file each, as that many runs' appends leave them
                _copies(row, n - held).repartition(n - held).write.format("delta").mode("append").save(runs_path)
            entry: dict[str, Any] = {"files": max(n, held), "status_seconds": _timed(lambda: status(spark, target))}
            line = f"3. status with _runs in {entry['files']} files: {entry['status_seconds']:.2f} s"
            if compact_files is not None and entry["files"] > 1:
                started = time.perf_counter()
                compact_files(spark, runs_path, max_files=1)
                entry["compact_seconds"] = time.perf_counter() - started
                entry["status_after_seconds"] = _timed(lambda: status(spark, target))
                line += (f"; compact_files {entry['compact_seconds']:.2f} s, then status "
                         f"{entry['status_after_seconds']:.2f} s")
            statuses.append(entry)
            print(line, flush=True)
        results["status"] = statuses

        # 4. `mirror` (the notebook API) over a `_runs` of many rows, compacted.
        name = sorted(status(spark, target).mirrors)[0]
        point = status(spark, target).read_point
        reads = []
        for n in sorted(args.runs):
            held = spark.read.format("delta").load(runs_path).count()
            if n > held:
                _copies(row, n - held).coalesce(1).write.format("delta").mode("append").save(runs_path)
            spark.sql(f"OPTIMIZE delta.`{runs_path}`").collect()
            entry = {"runs": max(n, held), "mirror_seconds": _timed(lambda: mirror(spark, target, name)),
                     "mirror_as_of_seconds": _timed(lambda: mirror(spark, target, name, as_of_lsn=point)),
                     "status_seconds": _timed(lambda: status(spark, target))}
            line = (f"4. mirror({name!r}) with {entry['runs']} runs in _runs: {entry['mirror_seconds']:.2f} s; "
                    f"as_of_lsn: {entry['mirror_as_of_seconds']:.2f} s; status {entry['status_seconds']:.2f} s")
            if "last" in inspect.signature(status).parameters:
                entry["status_last_seconds"] = _timed(lambda: status(spark, target, last=10))
                line += f", its last 10 runs {entry['status_last_seconds']:.2f} s"
            print(line, flush=True)
            reads.append(entry)
        results["mirror"] = reads

        # 5. The changes job's start over a runs table of many runs' rows.
        from pgoutput_spark.changefeed import run_changes

        feed = f"{tmp}/feed"
        run_changes(spark, read_capture(spark, str(landing)), feed)
        feed_runs = f"{feed}/_pgoutput/runs"
        first_run = spark.read.format("delta").load(feed_runs)
        pair = spark.createDataFrame(first_run.collect(), first_run.schema)  # its two rows, held apart
        starts = []
        for n in sorted(args.runs):
            held = spark.read.format("delta").load(feed_runs).count() // 2
            if n > held:
                earlier = pair.crossJoin(spark.range(n - held).withColumnRenamed("id", "copy")).withColumn(
                    "at", F.col("at") - F.make_interval(secs=F.col("copy") + 1)).withColumn(
                    "new_files", F.lit(None).cast("array<string>")).drop("copy")
                earlier.coalesce(1).write.format("delta").mode("append").save(feed_runs)
            spark.sql(f"OPTIMIZE delta.`{feed_runs}`").collect()
            seconds = _timed(lambda: run_changes(spark, read_capture(spark, str(landing)), feed))
            assert run_changes(spark, read_capture(spark, str(landing)), feed).skipped
            starts.append({"runs": max(n, held), "seconds": seconds})
            print(f"5. a changes run with nothing new, {max(n, held)} runs' rows in its runs table: "
                  f"{seconds:.2f} s", flush=True)
        results["changes"] = starts

        # 6. The vacuum of the target's own tables (nothing to delete within 7 days' retention:
        # the listing and the state are the cost).
        try:
            from pgoutput_spark.mirroring.delta import vacuum_files, vacuum_tables
        except ImportError:  # a version from before runs vacuumed
            vacuum_files = vacuum_tables = None
        if vacuum_files is not None:
            own = Ledger(spark, target, "default").own_tables()
            alone = {path.rsplit("/", 1)[-1]: _timed(lambda: vacuum_files(spark, path)) for path in own}
            together = _timed(lambda: vacuum_tables(spark, own))
            results["vacuum"] = {"alone_seconds": alone, "together_seconds": together}
            print(f"6. vacuum of the target's {len(own)} own tables: "
                  + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in alone.items())
                  + f"; four at a time, as a run does: {together:.2f} s", flush=True)
    print(f"load {format_load(load_average())}")
    spark.stop()
    return finish(results, argv, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
