"""A run's fixed cost: a capture applied in small slices, step by step.

    .venv/bin/python benchmarks/small_runs.py [--capture PATH] [--runs 10] [--messages 2000] [--cut-anywhere]
        [--new-jvm] [--conf KEY=VALUE ...] [--json PATH]

The capture is `benchmarks/apply.py`'s (pgbench TPC-B and a wide table,
protocol 1; that script builds it in ``benchmarks/data``). A first run applies
it up to its first Commit (the pgbench load); then RUNS runs apply about
MESSAGES messages each, every slice ending at a Commit where no streamed or
prepared transaction is open, as the slices of a capture that keeps up with
its source usually end; with ``--cut-anywhere``, every MESSAGES messages
wherever that falls, as bounded runs (``--max-messages``) and files landed
mid-transaction cut it, so that runs carry open transactions over (the
sample capture, ``examples/sample_capture``, is short: ``--runs 5
--messages 300``). One Spark session. Prints, with the machine it ran
on, the seconds of each run and, over the small runs, the mean of each step
the job logs (`pgoutput_spark.apply`'s step lines): a run of a few thousand
messages costs mostly Spark's and Delta's fixed overhead, and this says where
it goes. Each run's line also counts the processes and threads the machine
started meanwhile (``/proc/stat``), most of them the driver JVM's; ``--conf``
passes a Spark setting, e.g. Hadoop's own ``file:`` file system
(``spark.hadoop.fs.file.impl=org.apache.hadoop.fs.RawLocalFileSystem`` and
``spark.hadoop.fs.AbstractFileSystem.file.impl=org.apache.hadoop.fs.local.RawLocalFs``)
against the session's default (`pgoutput_spark.spark.localfs`). With
``--new-jvm`` each run is a process of its own with a new Spark session (a new
JVM), as a command-line, spark-submit or Airflow run is: the session's start
is timed apart from the run, and the first run's steps count too.
"""

from __future__ import annotations

import argparse
import logging
import re
import struct
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.machine import Machine, finish, format_load, load_average  # noqa: E402

CAPTURE = Path(__file__).resolve().parent / "data" / "apply-e2e-1000000" / "capture"
#: First bytes of the messages `quiet_ends` reads.
CONTROLS = ("C", "S", "A", "c", "p", "P", "K", "r")


def quiet_ends(types_and_data: list[tuple[int, bytes]]) -> list[int]:
    """Seqs of the Commits after which no streamed or prepared transaction is open."""
    streams: set[int] = set()
    prepared = 0
    out = []
    for seq, data in types_and_data:
        kind = data[:1]
        if kind == b"S":
            streams.add(struct.unpack_from(">I", data, 1)[0])
        elif kind == b"c":  # Stream Commit: xid first
            streams.discard(struct.unpack_from(">I", data, 1)[0])
        elif kind == b"p":  # Stream Prepare: flags, three int64, then the xid
            streams.discard(struct.unpack_from(">I", data, 26)[0])
        elif kind == b"A":
            xid, subxid = struct.unpack_from(">II", data, 1)
            if xid == subxid:
                streams.discard(xid)
        if kind in (b"P", b"p"):
            prepared += 1
        elif kind in (b"K", b"r"):
            prepared = max(0, prepared - 1)
        if kind == b"C" and not streams and not prepared:
            out.append(seq)
    return out


class _Steps(logging.Handler):
    """Collects the job's step lines: "<step>: <seconds> s"."""

    LINE = re.compile(r"^(?P<step>.+): (?P<seconds>[0-9.]+) s$")

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.steps: dict[str, float] = defaultdict(float)

    def emit(self, record: logging.LogRecord) -> None:
        match = self.LINE.match(record.getMessage())
        if match:
            step = match["step"].split(": ")[-1] if ": " in match["step"] else match["step"]
            step = re.sub(r"\d+", "N", step)  # "write 4 tables" and "write 2 tables" alike
            self.steps[step] += float(match["seconds"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capture", type=Path, default=CAPTURE, help="an unframed capture (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=10, help="small runs after the first")
    parser.add_argument("--messages", type=int, default=2000, help="messages per small run, about")
    parser.add_argument("--cut-anywhere", action="store_true",
                        help="end each run after MESSAGES messages, inside transactions or not")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the session (repeatable)")
    parser.add_argument("--new-jvm", action="store_true",
                        help="each run in a process of its own (a new JVM), as command-line runs are")
    parser.add_argument("--one-run", nargs=2, metavar=("TARGET", "UNTIL_SEQ"), help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    conf = dict(item.split("=", 1) for item in args.conf)
    if args.one_run:
        return _one_run(args.capture, args.one_run[0], int(args.one_run[1]), conf)
    if not args.capture.exists():
        raise SystemExit(f"no capture at {args.capture}: `benchmarks/apply.py --skip-merge` builds it")

    from pyspark.sql import functions as F

    from pgoutput_spark.apply import run_apply
    from pgoutput_spark.capture import read_capture
    from pgoutput_spark.spark.session import build_spark_session
    from pgoutput_spark.testing.processes import processes_started

    machine = Machine.current()
    print(f"machine: {machine.line()}; load {format_load(load_average())}")
    spark = build_spark_session(master="local[2]", conf=conf)
    capture = read_capture(spark, str(args.capture))
    if args.cut_anywhere:
        first, last = capture.agg(F.min("seq"), F.max("seq")).first()
        ends = list(range(first + args.messages - 1, last + 1, args.messages))
    else:
        controls = (capture.where(F.substring("data", 1, 1).cast("string").isin(*CONTROLS))
                    .select("seq", F.substring("data", 1, 32).alias("head")).orderBy("seq").collect())
        ends = quiet_ends([(r["seq"], bytes(r["head"])) for r in controls])
    cuts = [ends[0]]
    for end in ends:
        if len(cuts) > args.runs:
            break
        if end >= cuts[-1] + args.messages:
            cuts.append(end)
    if len(cuts) <= args.runs:
        raise SystemExit(f"{args.capture}: too short for {args.runs} runs of {args.messages} messages")
    logger = logging.getLogger("pgoutput_spark.apply")
    logger.setLevel(logging.INFO)
    results: dict[str, Any] = {"machine": machine.as_dict(), "capture": str(args.capture), "cuts": cuts,
                               "cut_anywhere": args.cut_anywhere, "conf": conf, "new_jvm": args.new_jvm}
    if args.new_jvm:
        spark.stop()
        return _new_jvm_runs(args, cuts, results, argv)
    warm_steps: dict[str, list[float]] = defaultdict(list)
    seconds: list[float] = []
    started_processes: list[int] = []
    with tempfile.TemporaryDirectory(prefix="bench-runs-") as tmp:
        for k, cut in enumerate(cuts):
            handler = _Steps()
            logger.addHandler(handler)
            forks, started = processes_started(), time.perf_counter()
            result = run_apply(spark, capture, tmp, until_seq=cut)
            seconds.append(time.perf_counter() - started)
            started_processes.append(processes_started() - forks)
            logger.removeHandler(handler)
            assert not result.skipped and (args.cut_anywhere or result.open_rows == 0), (cut, result)
            print(f"run {k}: {result.messages} messages, {len(result.tables)} tables, "
                  f"{result.open_rows} open rows carried over, {seconds[-1]:.2f} s, "
                  f"{started_processes[-1]} processes and threads started", flush=True)
            if k:
                for step, value in handler.steps.items():
                    warm_steps[step].append(value)
    results["run_seconds"] = seconds
    results["run_processes_started"] = started_processes
    warm = seconds[1:]
    print(f"small runs: {len(warm)}, {_spread(warm)}; processes and threads started: {sum(started_processes[1:])}")
    means = _step_means("small run", warm_steps, len(warm))
    results["small_run_mean_seconds"] = sum(warm) / len(warm)
    results["small_run_step_means"] = means
    print(f"load {format_load(load_average())}")
    spark.stop()
    return finish(results, argv, args.json)


def _spread(seconds: list[float]) -> str:
    return f"mean {sum(seconds) / len(seconds):.2f} s, min {min(seconds):.2f} s, max {max(seconds):.2f} s"


def _step_means(runs: str, steps: dict[str, list[float]], count: int) -> dict[str, float]:
    """Prints and returns the mean seconds of each step over ``count`` runs."""
    print(f"mean seconds per {runs}, by step (steps of several tables summed; those a run skips count 0):")
    means = {step: sum(values) / count for step, values in steps.items()}
    for step, mean in sorted(means.items(), key=lambda kv: -kv[1]):
        print(f"  {mean:6.2f}  {step}")
    return means


def _one_run(capture_path: Path, target: str, until_seq: int, conf: dict[str, str]) -> int:
    """One run in this process (``--new-jvm``'s child): prints its figures as one JSON line."""
    import json

    started = time.perf_counter()
    from pgoutput_spark.apply import run_apply
    from pgoutput_spark.capture import read_capture
    from pgoutput_spark.spark.session import build_spark_session

    spark = build_spark_session(master="local[2]", conf=conf)
    session = time.perf_counter() - started
    logger = logging.getLogger("pgoutput_spark.apply")
    logger.setLevel(logging.INFO)
    handler = _Steps()
    logger.addHandler(handler)
    started = time.perf_counter()
    result = run_apply(spark, read_capture(spark, str(capture_path)), target, until_seq=until_seq)
    run = time.perf_counter() - started
    assert not result.skipped, result
    print("RESULT " + json.dumps({"session": session, "run": run, "messages": result.messages,
                                  "tables": len(result.tables), "open_rows": result.open_rows,
                                  "steps": handler.steps}), flush=True)
    spark.stop()
    return 0


def _new_jvm_runs(args: argparse.Namespace, cuts: list[int], results: dict[str, Any],
                  argv: list[str] | None) -> int:
    import json
    import subprocess

    conf_args = [f"--conf={item}" for item in args.conf]
    steps: dict[str, list[float]] = defaultdict(list)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-runs-") as tmp:
        for k, cut in enumerate(cuts):
            started = time.perf_counter()
            child = subprocess.run([sys.executable, __file__, "--capture", str(args.capture), *conf_args,
                                    "--one-run", tmp, str(cut)], capture_output=True, text=True)
            elapsed = time.perf_counter() - started
            lines = [line for line in child.stdout.splitlines() if line.startswith("RESULT ")]
            if child.returncode or not lines:
                raise SystemExit(f"run {k} failed ({child.returncode}):\n{child.stderr[-4000:]}")
            run = json.loads(lines[0][len("RESULT "):]) | {"process": elapsed}
            runs.append(run)
            for step, value in run["steps"].items():
                steps[step].append(value)
            print(f"run {k}: {run['messages']} messages, {run['tables']} tables, {run['open_rows']} open rows "
                  f"carried over; process {elapsed:.2f} s: session {run['session']:.2f} s, "
                  f"run {run['run']:.2f} s", flush=True)
    results["runs"] = runs
    for what in ("process", "session", "run"):  # the first run creates the mirrors
        print(f"runs after the first, {what}: {_spread([run[what] for run in runs[1:]])}")
    results["step_means"] = _step_means("run (all runs)", steps, len(runs))
    print(f"load {format_load(load_average())}")
    return finish(results, argv, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
