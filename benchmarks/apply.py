"""Apply benchmark: capture files -> Delta mirrors, beside a real PostgreSQL subscriber.

    .venv/bin/python benchmarks/apply.py [--changes 1000000] [--sizes 100000,10000000]
                                         [--merge-changes 10000] [--reuse] [--json PATH]

Prints, with the machine it ran on:

a. end to end: `run_apply` over a capture of at least ``--changes`` changes
   (pgbench TPC-B + the 20-column ``bench_wide`` of `workload`, the pgbench
   initial load included) into fresh Delta mirrors, in changes/s, beside a
   PostgreSQL 15 subscriber: a second cluster with the same tables and
   ``CREATE SUBSCRIPTION`` on the same publication, reading a slot created at
   the same moment as the capture's, timed until it has applied the last
   commit. Also the peak memory of the Spark driver (the JVM's VmHWM) and of
   this Python process, where the run's time went (Spark jobs by the line
   that started them, Delta's MERGE metrics), and a check that the mirrors and
   the subscriber's tables hold what the publisher's tables hold;
b. ``--merge-changes`` changes (updates, inserts and deletes of random keys)
   merged into a keyed mirror of each of ``--sizes`` rows: the time of each
   run and their ratio (the cost should follow the changes, not the target).

See benchmarks/README.md ("apply.py") for what each figure means.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa

from machine import Machine, finish, format_load, load_average, peak_rss_mib
from spark_bench import _cpu_times
from workload import _SCHEMA as WIDE_SCHEMA
from workload import PROTO_VERSION, PUBLICATION, ROWS_PER_FILE, _Workload

import pgoutput_spark
from pgoutput_spark.decoder.messages import decode_message
from pgoutput_spark.mirroring.rows import NET_TASK_ROWS
from pgoutput_spark.config import TablesConfig
from pgoutput_spark.decoder.protocol import MessageType
from pgoutput_spark.testing.capture_files import CapturedMessage, write_capture_parquet
from pgoutput_spark.testing.pgcluster import PgCluster

CAPTURE_SLOT = "bench_capture"
SUBSCRIBER_SLOT = "bench_subscriber"  # created at the same moment, consumed by the subscriber
SUBSCRIPTION = "bench_sub"
_CHANGES = frozenset((MessageType.INSERT, MessageType.UPDATE, MessageType.DELETE))

#: Per table, a numeric column whose sum (with the row count) must agree between the publisher,
#: the subscriber and the Delta mirrors after the run.
E2E_CHECKS = {"pgbench_accounts": "abalance", "pgbench_branches": "bbalance", "pgbench_tellers": "tbalance",
              "pgbench_history": "delta", "bench_wide": "n_int", "bench_side": "id"}

# -- [b]: the table the merge-cost runs change ------------------------------------------------------
MERGE_TABLE = "bench_merge"
MERGE_CHECKS = {MERGE_TABLE: "balance"}
_MERGE_TXN = {"update": 50, "insert": 30, "delete": 20}  # changes per transaction
_PRIME_ROWS = 10  # a first run of 10 updates creates the target's run state, outside the timing
_EPOCH_2024 = 1_704_067_200
#: Each merge variant's capture, by its directory's suffix (the mirrors are the same: a mirror's
#: schema says nothing of its key).
_MERGE_CAPTURES = {"no-dv": "", "dv": "", "recent": "-recent", "recent-full": "-recent-full"}


def merge_schema(rows: int, full: bool = False) -> str:
    """The merge table with `rows` rows (values from the id alone, as `merge_mirror` writes them);
    `full`: no key, `REPLICA IDENTITY FULL` (its mirror a multiset), the id indexed for the workload."""
    identity = (f"CREATE INDEX ON {MERGE_TABLE} (id); ALTER TABLE {MERGE_TABLE} REPLICA IDENTITY FULL" if full
                else f"ALTER TABLE {MERGE_TABLE} ADD PRIMARY KEY (id)")
    return f"""
CREATE TABLE {MERGE_TABLE} (id bigint NOT NULL, grp integer NOT NULL, balance bigint NOT NULL,
                            note text, updated_at timestamptz);
INSERT INTO {MERGE_TABLE}
SELECT g, (g % 1000)::int, (g * 7) % 100000, 'row ' || g,
       timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second'
FROM generate_series(1, {int(rows)}::bigint) AS g;
{identity};
CREATE PUBLICATION bench_merge_pub FOR TABLE {MERGE_TABLE}
"""


SPARK_CONF = {
    # As conf/local.yaml, the job's configuration.
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.databricks.delta.snapshotPartitions": "2",
    # Keep every job of a run in the status store (the per-line breakdown reads it).
    "spark.ui.retainedJobs": "100000",
    "spark.ui.retainedStages": "100000",
    "spark.sql.ui.retainedExecutions": "100000",
}


# -- processes and memory ---------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    """Fields of /proc/<pid>/stat after the command name (field 3 is first)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2:].split()


def process_cpu_s(pid: int) -> float:
    try:
        fields = _stat(pid)
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime


def status_mib(pid: int, key: str) -> float:
    """A ``kB`` line of /proc/<pid>/status (VmRSS, VmHWM) in MiB; 0 if the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                children.setdefault(int(_stat(int(entry.name))[1]), []).append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class MemorySampler(threading.Thread):
    """Peak RSS of the JVM and of its Python workers (summed), and the workers' CPU time,
    sampled every `interval` s."""

    def __init__(self, jvm: int, interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.jvm, self.interval = jvm, interval
        self.jvm_peak = self.workers_peak = self.python_peak = 0.0
        self._cpu: dict[int, tuple[float, float]] = {}  # worker pid -> (CPU s when first seen, last seen)
        self._stop_event = threading.Event()

    @property
    def workers_cpu_s(self) -> float:
        return sum(last - first for first, last in self._cpu.values())

    def sample(self) -> None:
        self.jvm_peak = max(self.jvm_peak, status_mib(self.jvm, "VmRSS"))
        self.python_peak = max(self.python_peak, status_mib(os.getpid(), "VmRSS"))
        workers = 0.0
        for pid in descendants(self.jvm):
            try:
                if not Path(f"/proc/{pid}/comm").read_text().startswith("python"):
                    continue
            except OSError:
                continue
            workers += status_mib(pid, "VmRSS")
            cpu = process_cpu_s(pid)
            self._cpu[pid] = (self._cpu.get(pid, (cpu, cpu))[0], cpu)
        self.workers_peak = max(self.workers_peak, workers)

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.sample()
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
        self.sample()


# -- PostgreSQL side --------------------------------------------------------------------------------


@dataclass
class Drained:
    """What the capture slot produced so far."""

    seq: int = 0  # next seq
    changes: int = 0
    truncates: int = 0
    last_commit: bytes = b""
    seconds: float = 0.0  # in pg_logical_slot_get_binary_changes + writing the capture files
    starts: list[int] = field(default_factory=list)  # first seq of each drain


def drain(pg: PgCluster, slot: str, publication: str, state: Drained) -> Iterator[CapturedMessage]:
    started = time.perf_counter()
    state.starts.append(state.seq)
    for message in pg.iter_pgoutput(slot, publications=[publication], proto_version=PROTO_VERSION,
                                    consume=True, seq_start=state.seq, chunk_rows=20_000):
        kind = message.data[0]
        if kind in _CHANGES:
            state.changes += 1
        elif kind == MessageType.COMMIT:
            state.last_commit = message.data
        elif kind == MessageType.TRUNCATE:
            state.truncates += 1
        state.seq = message.seq + 1
        yield message
    state.seconds += time.perf_counter() - started


def pg_checks(pg: PgCluster, checks: dict[str, str]) -> dict[str, list[int]]:
    """Per table: [row count, sum of its check column]."""
    return {table: [int(v) for v in pg.query(
        f"SELECT count(*), coalesce(sum({column}), 0)::bigint FROM {table}")[0]]
        for table, column in checks.items()}


def _e2e_messages(pub: PgCluster, changes: int, state: Drained) -> Iterator[CapturedMessage]:
    pub.run_pgbench(["-i", "-q", "-I", "g", "-s", "1"])  # the initial rows are changes too
    yield from drain(pub, CAPTURE_SLOT, PUBLICATION, state)
    workload = _Workload(pub)
    while workload.round == 0 or state.changes < changes:  # at least one round of the workload
        workload.run_round()
        yield from drain(pub, CAPTURE_SLOT, PUBLICATION, state)
        if workload.round % 5 == 0:
            print(f"  round {workload.round}: {state.changes:,} changes", flush=True)


def time_subscriber(pub: PgCluster, sub: PgCluster, end_lsn: int, timeout_s: float = 3600) -> dict[str, Any]:
    """CREATE SUBSCRIPTION on the waiting slot; seconds until the commit ending at `end_lsn` is applied."""
    load = load_average()
    busy0, total0 = _cpu_times()
    started = time.perf_counter()
    sub.execute(f"CREATE SUBSCRIPTION {SUBSCRIPTION} CONNECTION '{pub.conninfo()}' PUBLICATION {PUBLICATION} "
                f"WITH (copy_data = false, create_slot = false, slot_name = '{SUBSCRIBER_SLOT}')")
    first_apply = worker_up = None
    with sub.connect() as conn:  # pg_replication_origin_status.remote_lsn: the last applied commit's end
        while True:
            row = conn.execute("SELECT (SELECT coalesce(max((remote_lsn - '0/0'::pg_lsn)::int8), 0) "
                               "FROM pg_replication_origin_status), "
                               "(SELECT count(pid) FROM pg_stat_subscription)").fetchone()
            applied, workers = (int(row[0]), int(row[1])) if row else (0, 0)
            if workers and worker_up is None:
                worker_up = time.perf_counter() - started
            if applied and first_apply is None:
                first_apply = time.perf_counter() - started
            if applied >= end_lsn:
                break
            if time.perf_counter() - started > timeout_s:
                raise RuntimeError(f"the subscriber applied up to {applied}, not {end_lsn}, in {timeout_s} s")
            time.sleep(0.05)
    seconds = time.perf_counter() - started
    busy1, total1 = _cpu_times()
    walsenders = [int(r[0]) for r in pub.query("SELECT pid FROM pg_stat_replication")]
    workers = [int(r[0]) for r in sub.query("SELECT pid FROM pg_stat_subscription WHERE pid IS NOT NULL")]
    return {"seconds": seconds, "apply_worker_started_s": worker_up, "first_commit_applied_s": first_apply,
            "cpu_busy": (busy1 - busy0) / max(total1 - total0, 1),
            "walsender_cpu_s": sum(process_cpu_s(p) for p in walsenders),
            "apply_worker_cpu_s": sum(process_cpu_s(p) for p in workers), "load": load,
            "load_at_end": load_average(),
            "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def build_e2e(path: Path, changes: int) -> dict[str, Any]:
    """Capture >= `changes` changes into `path`/capture and time a subscriber applying the same ones."""
    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    started = time.perf_counter()
    with PgCluster.debian(15) as pub, PgCluster.debian(15) as sub:
        # The default, rather than PgCluster's 64kB (which makes every transaction spill to disk).
        pub.execute("ALTER SYSTEM SET logical_decoding_work_mem = '64MB'")
        pub.execute("SELECT pg_reload_conf()")
        for pg in (pub, sub):
            pg.run_pgbench(["-i", "-q", "-I", "dtp", "-s", "1"])  # tables and primary keys, no rows
            pg.execute(WIDE_SCHEMA)
        pub.execute(f"CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES")
        pub.create_slot(CAPTURE_SLOT)
        pub.create_slot(SUBSCRIBER_SLOT)
        state = Drained()
        write_capture_parquet(_e2e_messages(pub, changes, state), partial / "capture",
                              rows_per_file=ROWS_PER_FILE)
        build_s = time.perf_counter() - started
        truth = pg_checks(pub, E2E_CHECKS)
        end_lsn = int(decode_message(state.last_commit).end_lsn)  # type: ignore[attr-defined]
        print(f"  captured {state.changes:,} changes in {state.seq:,} messages ({build_s:.0f} s); "
              f"timing the subscriber ...", flush=True)
        subscriber = time_subscriber(pub, sub, end_lsn)
        subscriber["matches_publisher"] = pg_checks(sub, E2E_CHECKS) == truth
    info = {"changes": state.changes, "truncates": state.truncates, "messages": state.seq,
            "end_lsn": end_lsn, "drain_starts": state.starts, "drain_seconds": state.seconds,
            "build_seconds": build_s, "checks": truth, "subscriber": subscriber}
    (partial / "info.json").write_text(json.dumps(info, indent=2) + "\n")
    shutil.rmtree(path, ignore_errors=True)
    partial.rename(path)
    return info


def _merge_transaction(conn: Any, updates: list[int], inserts: tuple[int, int], deletes: list[int]) -> None:
    with conn.transaction():
        conn.execute(f"UPDATE {MERGE_TABLE} SET balance = balance + 1, note = note || '+', "
                     f"updated_at = now() WHERE id = ANY(%s)", (updates,))
        conn.execute(f"INSERT INTO {MERGE_TABLE} SELECT g, (g %% 1000)::int, (g * 7) %% 100000, 'new ' || g, now() "
                     f"FROM generate_series(%s::bigint, %s::bigint) AS g", inserts)
        conn.execute(f"DELETE FROM {MERGE_TABLE} WHERE id = ANY(%s)", (deletes,))


def _merge_messages(pg: PgCluster, rows: int, changes: int, recent: bool, state: Drained,
                    prime: list[int]) -> Iterator[CapturedMessage]:
    pg.execute(f"UPDATE {MERGE_TABLE} SET balance = balance + 1 WHERE id BETWEEN 1 AND {_PRIME_ROWS}")
    yield from drain(pg, CAPTURE_SLOT, "bench_merge_pub", state)
    prime.append(state.seq - 1)
    txns = max(1, changes // sum(_MERGE_TXN.values()))
    n_update, n_insert, n_delete = (_MERGE_TXN[k] for k in ("update", "insert", "delete"))
    needed = txns * (n_update + n_delete)
    low = max(_PRIME_ROWS + 1, rows + 1 - max(rows // 100, 2 * needed)) if recent else _PRIME_ROWS + 1
    picked = random.Random(rows).sample(range(low, rows + 1), needed)
    with pg.connect(autocommit=False) as conn:
        for t in range(txns):
            ids = picked[t * (n_update + n_delete): (t + 1) * (n_update + n_delete)]
            first = rows + 1 + t * n_insert
            _merge_transaction(conn, ids[:n_update], (first, first + n_insert - 1), ids[n_update:])
    yield from drain(pg, CAPTURE_SLOT, "bench_merge_pub", state)


def build_merge(path: Path, rows: int, changes: int, recent: bool, full: bool = False) -> dict[str, Any]:
    """A `rows`-row table, then a capture of 10 priming updates and `changes` changes of random keys
    (`recent`: keys among the newest 1% of the rows, or twice as many as the run updates and deletes;
    `full`: the table without a key, `REPLICA IDENTITY FULL`)."""
    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    started = time.perf_counter()
    with PgCluster.debian(15) as pg:
        pg.execute(merge_schema(rows, full))
        pg.create_slot(CAPTURE_SLOT)
        state, prime = Drained(), []
        write_capture_parquet(_merge_messages(pg, rows, changes, recent, state, prime), partial / "capture",
                              rows_per_file=ROWS_PER_FILE)
        truth = pg_checks(pg, MERGE_CHECKS)
    info = {"rows": rows, "recent": recent, "full": full, "changes": state.changes - _PRIME_ROWS,
            "prime_hi_seq": prime[0], "messages": state.seq, "build_seconds": time.perf_counter() - started,
            "checks": truth}
    (partial / "info.json").write_text(json.dumps(info, indent=2) + "\n")
    shutil.rmtree(path, ignore_errors=True)
    partial.rename(path)
    return info


def prepared(path: Path, reuse: bool, build: Any, what: str) -> dict[str, Any]:
    if reuse and (path / "info.json").is_file():
        info: dict[str, Any] = json.loads((path / "info.json").read_text())
        print(f"  reusing {path} ({what})")
        return info
    print(f"  building {path} ({what}) ...", flush=True)
    info = build(path)
    print(f"  built in {info['build_seconds']:.0f} s (information, not a benchmark figure)")
    return info


# -- Spark side -------------------------------------------------------------------------------------

MERGE_COLUMNS = [("id", pa.int64()), ("grp", pa.int32()), ("balance", pa.int64()), ("note", pa.string()),
                 ("updated_at", pa.timestamp("us", tz="UTC"))]
_MERGE_METRICS = ("numSourceRows", "numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted",
                  "numTargetRowsCopied", "numTargetFilesRemoved", "numTargetFilesAdded",
                  "numTargetDeletionVectorsAdded", "executionTimeMs", "scanTimeMs", "rewriteTimeMs")


def spark_session(driver_memory: str, local_dir: Path, extra: dict[str, str] | None = None) -> Any:
    from pgoutput_spark.spark.session import build_spark_session

    # Shuffle and spill files beside the data, not in /tmp (where other jobs clean up).
    local_dir.mkdir(parents=True, exist_ok=True)
    return build_spark_session(app_name="pgoutput-spark-apply-bench", master="local[2]",
                               conf={**SPARK_CONF, "spark.driver.memory": driver_memory,
                                     "spark.local.dir": str(local_dir), **(extra or {})})


def jvm_pid(spark: Any) -> int:
    """The driver JVM: pyspark's gateway process (spark-submit execs java)."""
    pid = int(spark.sparkContext._gateway.proc.pid)
    for candidate in [pid, *descendants(pid)]:
        if Path(f"/proc/{candidate}/comm").read_text().strip() == "java":
            return candidate
    return pid


@dataclass(frozen=True)
class SparkJob:
    job_id: int
    label: str  # "apply.py:258 collect", from the Python line that started it
    start: float
    end: float


def _label(name: str, description: str | None) -> str:
    action, _, where = name.partition(" at ")
    label = f"{where.rsplit('/', 1)[-1]} {action}" if where else name
    if description and description != name:
        label += f" [{description[:70]}]"
    return label


def spark_jobs(spark: Any) -> dict[int, SparkJob]:
    """Finished Spark jobs from the driver's status store (kept with the UI off)."""
    jobs = spark.sparkContext._jsc.sc().statusStore().jobsList(None)
    out = {}
    for i in range(jobs.size()):
        job = jobs.apply(i)
        submitted, completed, description = job.submissionTime(), job.completionTime(), job.description()
        if submitted.isDefined() and completed.isDefined():
            out[job.jobId()] = SparkJob(
                job.jobId(), _label(job.name(), description.get() if description.isDefined() else None),
                submitted.get().getTime() / 1000, completed.get().getTime() / 1000)
    return out


def job_breakdown(jobs: Sequence[SparkJob], wall: float, top: int = 8) -> dict[str, Any]:
    """Job seconds by the line that started them, and how long no job ran at all."""
    groups: dict[str, list[float]] = {}
    for job in jobs:
        groups.setdefault(job.label, []).append(job.end - job.start)
    busy, edge = 0.0, float("-inf")
    for job in sorted(jobs, key=lambda j: j.start):  # union of the job intervals
        busy += max(0.0, job.end - max(job.start, edge))
        edge = max(edge, job.end)
    ranked = sorted(groups.items(), key=lambda kv: -sum(kv[1]))
    total = sum(j.end - j.start for j in jobs)
    print(f"    {len(jobs)} Spark jobs, {total:.1f} s summed (tables merge in parallel, so they overlap); "
          f"a job was running for {busy:.1f} s of the {wall:.1f} s, none for {wall - busy:.1f} s "
          f"(driver: planning, Delta log, Python)")
    for label, seconds in ranked[:top]:
        print(f"      {sum(seconds):7.1f} s {len(seconds):4d} jobs  {label}")
    if len(ranked) > top:
        rest = [s for _, ss in ranked[top:] for s in ss]
        print(f"      {sum(rest):7.1f} s {len(rest):4d} jobs  ({len(ranked) - top} other lines)")
    first = min((j.start for j in jobs), default=0.0)
    return {"jobs": len(jobs), "summed_s": total, "busy_s": busy, "idle_s": wall - busy,
            "by_line": {label: [len(s), sum(s)] for label, s in ranked},
            "timeline": [[j.job_id, round(j.start - first, 3), round(j.end - j.start, 3), j.label]
                         for j in sorted(jobs, key=lambda j: j.start)]}


def merge_metrics(spark: Any, path: str) -> dict[str, int]:
    """operationMetrics of the mirror's last MERGE."""
    for row in spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 10").select(
            "operation", "operationMetrics").collect():
        if row["operation"] == "MERGE":
            metrics = row["operationMetrics"] or {}
            return {k: int(metrics[k]) for k in _MERGE_METRICS if k in metrics}
    return {}


def delta_checks(spark: Any, root: str, checks: dict[str, str]) -> dict[str, list[int]]:
    from pyspark.sql import functions as F

    from pgoutput_spark.mirroring.names import mirror_path

    out = {}
    for table, column in checks.items():
        path = mirror_path(root, "public", table)
        if not (Path(path) / "_delta_log").is_dir():
            out[table] = [0, 0]
            continue
        row = spark.read.format("delta").load(path).agg(
            F.count(F.lit(1)), F.coalesce(F.sum(column), F.lit(0)).cast("long")).first()
        out[table] = [int(row[0]), int(row[1])]
    return out


class PhaseClock:
    """Times the job's steps by wrapping functions `pgoutput_spark.apply` and
    `pgoutput_spark.mirroring.table` call (restored on exit).

    Spark evaluates lazily, so a step's cost shows where an action forces it: the gaps between
    the wrapped calls are phases too (see `phases`).
    """

    WRAPPED = (("apply", "decode"), ("apply", "assemble"), ("apply", "schema_plan"), ("apply", "mirror_table"),
               ("mirroring.table", "merge"), ("apply", "_finish"))

    def __init__(self) -> None:
        self.events: list[tuple[str, str, float, float]] = []  # (function, table, start, end)
        self._saved: dict[tuple[Any, str], Any] = {}

    def _wrap(self, name: str, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            out = fn(*args, **kwargs)
            table = ""
            if name == "mirror_table":
                table = out.table
            elif name == "merge":
                table = str(args[1]).rstrip("/").rsplit("/", 1)[-1]
            self.events.append((name, table, started, time.perf_counter()))
            return out
        return timed

    def __enter__(self) -> PhaseClock:
        for where, name in self.WRAPPED:
            module = importlib.import_module(f"pgoutput_spark.{where}")
            if hasattr(module, name):
                self._saved[(module, name)] = getattr(module, name)
                setattr(module, name, self._wrap(name, self._saved[(module, name)]))
        return self

    def __exit__(self, *exc: object) -> None:
        for (module, name), fn in self._saved.items():
            setattr(module, name, fn)

    def phases(self, started: float, ended: float) -> tuple[list[tuple[str, float]], list[tuple[str, float, float]]]:
        """[(phase, seconds)] in run order, and [(table, seconds, of which MERGE)]."""
        def first(name: str) -> float | None:
            return min((e[2] for e in self.events if e[0] == name), default=None)

        def last(name: str) -> float | None:
            return max((e[3] for e in self.events if e[0] == name), default=None)

        marks = [("claim the slice (lease, max seq)", started), ("decode: first pass", first("decode")),
                 ("decode every message (forced by the Relation collect), read relations", last("decode")),
                 ("assemble: driver steps", first("assemble")),
                 ("assemble: committed changes (forced by the touched-tables collect)", last("assemble")),
                 ("schema plans, relations write", first("schema_plan")),
                 ("tables: convert, pre-image, net change, MERGE (in parallel)", first("mirror_table")),
                 ("open transactions, counts", last("mirror_table")),
                 ("run row (hands the lease back)", first("_finish")), ("", ended)]
        known = [(label, t) for label, t in marks if t is not None]
        out = [(label, end - start) for (label, start), (_, end) in zip(known, known[1:])]
        merges = {e[1]: e[3] - e[2] for e in self.events if e[0] == "merge"}
        tables = [(e[1], e[3] - e[2], merges.get(e[1].split(".", 1)[-1], 0.0))
                  for e in self.events if e[0] == "mirror_table"]
        return out, sorted(tables, key=lambda t: -t[1])


def print_phases(clock: PhaseClock, run: TimedRun) -> dict[str, Any]:
    phases, tables = clock.phases(run.started, run.started + run.seconds)
    print(f"  where the {run.seconds:.1f} s went (driver wall clock per step of run_apply):")
    for label, seconds in phases:
        print(f"    {seconds:7.1f} s  {label}")
    print("    per table (threads overlap): total s = net change (convert + pre-image + net) + MERGE")
    for table, total, merge in tables:
        print(f"      {table:<24} {total:6.1f} s = {total - merge:6.1f} + {merge:5.1f}")
    return {"phases": phases, "tables": tables}


@dataclass
class TimedRun:
    result: Any  # ApplyResult
    seconds: float
    cpu_busy: float  # whole machine, /proc/stat
    jvm_cpu_s: float
    workers_cpu_s: float  # Python workers (those alive at a sample; reused across tasks)
    jvm_hwm_mib: float  # VmHWM: the JVM's peak resident memory since it started
    jvm_peak_rss_mib: float  # sampled during this run
    workers_peak_rss_mib: float  # Python workers, summed, sampled during this run
    python_peak_rss_mib: float  # this process, sampled during this run
    jobs: list[SparkJob]
    started: float  # perf_counter at the start

    def memory_line(self) -> str:
        return (f"driver JVM peak RSS {self.jvm_peak_rss_mib:,.0f} MiB during the run (VmHWM {self.jvm_hwm_mib:,.0f} "
                f"MiB since start), Python workers {self.workers_peak_rss_mib:,.0f} MiB summed, "
                f"Python driver {self.python_peak_rss_mib:,.0f} MiB (all peak RSS)")

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("result", "jobs", "started")}


def timed_apply(spark: Any, capture: Any, target: str, clock: PhaseClock, **options: Any) -> TimedRun:
    """One `run_apply` (``options`` its keyword arguments), timed."""
    import pgoutput_spark.apply as job

    jvm = jvm_pid(spark)
    before = set(spark_jobs(spark))
    sampler = MemorySampler(jvm)
    sampler.sample()  # CPU baseline of the workers alive now
    sampler.start()
    busy0, total0 = _cpu_times()
    cpu0, started = process_cpu_s(jvm), time.perf_counter()
    try:
        with clock:
            result = job.run_apply(spark, capture, target, **options)
    finally:
        seconds = time.perf_counter() - started
        sampler.stop()
    busy1, total1 = _cpu_times()
    jobs = [job for job_id, job in spark_jobs(spark).items() if job_id not in before]
    return TimedRun(result, seconds, (busy1 - busy0) / max(total1 - total0, 1), process_cpu_s(jvm) - cpu0,
                    sampler.workers_cpu_s, status_mib(jvm, "VmHWM"), sampler.jvm_peak, sampler.workers_peak, sampler.python_peak, jobs, started)


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def run_e2e(spark: Any, info: dict[str, Any], path: Path, out: Path, runs: int,
            **options: Any) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from pgoutput_spark import read_capture
    from pgoutput_spark.apply import run_apply
    from pgoutput_spark.mirroring.names import mirror_path

    target, warm = out / "e2e", out / "e2e-warmup"
    for folder in (target, warm):
        shutil.rmtree(folder, ignore_errors=True)
    capture = str(path / "capture")
    warm_from = info["drain_starts"][-1]  # the last workload round, into a throwaway target
    started = time.perf_counter()
    # One table at a time: its updates find no rows, and tables writing their first skipped
    # rows at the same time race to create the skipped-rows table (ProtocolChangedException).
    warm_slice = (F.col("seq") >= warm_from) & (F.col("seq") < warm_from + 10_000)
    run_apply(spark, read_capture(spark, capture).where(warm_slice), str(warm), parallelism=1)
    print(f"  warm-up: 10,000 messages from seq {warm_from:,} (the last round) into a throwaway target, "
          f"{time.perf_counter() - started:.1f} s (not counted)", flush=True)
    shutil.rmtree(warm, ignore_errors=True)
    timed = []
    for _ in range(runs):  # each into a fresh target; the best counts
        shutil.rmtree(target, ignore_errors=True)
        clock = PhaseClock()
        timed.append((timed_apply(spark, read_capture(spark, capture), str(target), clock, **options), clock))
    run, clock = min(timed, key=lambda rc: rc[0].seconds)
    print(_indent(run.result.render()))
    if runs > 1:
        print(f"  runs: {', '.join(f'{r.seconds:.1f}' for r, _ in timed)} s; the best counts")
    changes, sub = info["changes"], info["subscriber"]
    ours, theirs = changes / run.seconds, changes / sub["seconds"]
    print(f"  ours:       {changes:>9,} changes {run.seconds:8.1f} s {ours:>9,.0f} changes/s  "
          f"(machine CPU busy {run.cpu_busy:.0%}; driver JVM {run.jvm_cpu_s:.0f} CPU-s, "
          f"Python workers {run.workers_cpu_s:.0f} CPU-s)")
    print(f"  subscriber: {changes:>9,} changes {sub['seconds']:8.1f} s {theirs:>9,.0f} changes/s  "
          f"(machine CPU busy {sub['cpu_busy']:.0%}; apply worker {sub['apply_worker_cpu_s']:.0f} CPU-s, "
          f"walsender {sub['walsender_cpu_s']:.0f} CPU-s; apply worker up after "
          f"{sub.get('apply_worker_started_s') or 0:.1f} s, first commit applied after "
          f"{sub['first_commit_applied_s'] or 0:.1f} s; measured {sub['measured_at']}, "
          f"load {format_load(sub['load'])})")
    verdict = "beats" if ours > theirs else "does NOT beat"
    our_cpu, their_cpu = run.jvm_cpu_s + run.workers_cpu_s, sub["apply_worker_cpu_s"] + sub["walsender_cpu_s"]
    print(f"  -> ours / subscriber: {ours / theirs:.3f}x (ours {verdict} the subscriber); CPU-seconds "
          f"per 1M changes: ours {our_cpu / changes * 1e6:,.0f}, subscriber (apply worker + walsender) "
          f"{their_cpu / changes * 1e6:,.0f}: {our_cpu / max(their_cpu, 1e-9):.0f}x")
    print(f"  capture drain (server-side decoding + transfer + Parquet files), during the build: "
          f"{info['drain_seconds']:.1f} s; with it, ours is {changes / (run.seconds + info['drain_seconds']):,.0f} "
          f"changes/s")
    print(f"  memory: {run.memory_line()}")
    checks = delta_checks(spark, str(target), E2E_CHECKS)
    same = checks == info["checks"]
    print(f"  mirrors hold what the publisher's tables hold (count, sum per table): {same}; "
          f"subscriber's tables: {sub['matches_publisher']}")
    if not same:
        for table in E2E_CHECKS:
            print(f"    {table}: mirror {checks[table]}, publisher {info['checks'][table]}")
    print("  Delta MERGE per mirror (ms: execution / scan / rewrite; rows copied; files +/-):")
    merges = {}
    for t in sorted(run.result.tables, key=lambda t: t.table):
        m = merge_metrics(spark, mirror_path(str(target), "public", t.table.split(".", 1)[1]))
        merges[t.table] = m
        if m:
            print(f"    {t.table:<18} {m.get('executionTimeMs', 0):>7,} / {m.get('scanTimeMs', 0):>7,} / "
                  f"{m.get('rewriteTimeMs', 0):>7,}  source rows {m.get('numSourceRows', 0):>8,}  copied "
                  f"{m.get('numTargetRowsCopied', 0):>8,}  files +{m.get('numTargetFilesAdded', 0)} "
                  f"-{m.get('numTargetFilesRemoved', 0)}")
    phases = print_phases(clock, run)
    breakdown = job_breakdown(run.jobs, run.seconds)
    return {"changes": changes, "phases": phases, "ours": {**run.as_dict(), "changes_per_s": ours, "cpu_s": our_cpu},
            "subscriber": sub, "subscriber_cpu_s": their_cpu,
            "subscriber_changes_per_s": theirs, "ratio": ours / theirs, "mirrors_match": same,
            "merges": merges, "breakdown": breakdown, "all_seconds": [r.seconds for r, _ in timed]}


def merge_mirror(spark: Any, base: Path, rows: int, rows_per_file: int) -> None:
    """The merge table's mirror, created as the job creates mirrors, then `rows` rows appended."""
    from pyspark.sql import functions as F

    from pgoutput_spark.mirroring.names import mirror_path
    from pgoutput_spark.mirroring.schema import apply_schema, plan_schema

    partial = base.with_name(base.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    path = mirror_path(str(partial), "public", MERGE_TABLE)
    apply_schema(spark, plan_schema(spark, path, f"public.{MERGE_TABLE}", MERGE_COLUMNS))
    rid = F.col("id")
    (spark.range(1, rows + 1, numPartitions=max(1, -(-rows // rows_per_file)))
     .select(rid, (rid % 1000).cast("int").alias("grp"), ((rid * 7) % 100000).alias("balance"),
             F.concat(F.lit("row "), rid.cast("string")).alias("note"),
             F.timestamp_seconds(rid + _EPOCH_2024).alias("updated_at"))
     .write.format("delta").mode("append").save(path))
    shutil.rmtree(base, ignore_errors=True)
    partial.rename(base)


def _files(path: Path) -> tuple[int, int]:
    return len(list(path.glob("*.parquet"))), len(list(path.glob("deletion_vector_*.bin")))


def time_merge(spark: Any, info: dict[str, Any], path: Path, base: Path, out: Path,
               variant: str) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from pgoutput_spark import read_capture
    from pgoutput_spark.apply import run_apply
    from pgoutput_spark.mirroring.names import mirror_path

    rows = info["rows"]
    target = out / f"merge-{rows}-{variant}"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(base, target)
    mirror = mirror_path(str(target), "public", MERGE_TABLE)
    deletion_vectors = "false" if variant == "no-dv" else "true"
    spark.sql(f"ALTER TABLE delta.`{mirror}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = "
              f"'{deletion_vectors}')")
    capture = str(path / "capture")
    run_apply(spark, read_capture(spark, capture).where(F.col("seq") <= info["prime_hi_seq"]), str(target))
    files_before = _files(Path(mirror))
    clock = PhaseClock()
    run = timed_apply(spark, read_capture(spark, capture), str(target), clock)
    files_after = _files(Path(mirror))
    same = delta_checks(spark, str(target), MERGE_CHECKS) == info["checks"]
    metrics = merge_metrics(spark, mirror)
    t = run.result.tables[0] if run.result.tables else None
    print(f"  {rows:>12,} rows  {variant:<11} {info['changes']:>6,} changes {run.seconds:7.1f} s  "
          f"(+{t.inserted if t else 0} ~{t.updated if t else 0} -{t.deleted if t else 0}; mirror equals the "
          f"source: {same}; MERGE {metrics.get('executionTimeMs', 0) / 1000:.1f} s, scan "
          f"{metrics.get('scanTimeMs', 0) / 1000:.1f} s, rewrite {metrics.get('rewriteTimeMs', 0) / 1000:.1f} s, "
          f"rows copied {metrics.get('numTargetRowsCopied', 0):,}, files {files_before[0]} -> {files_after[0]}, "
          f"deletion vector files {files_before[1]} -> {files_after[1]})", flush=True)
    phases = print_phases(clock, run)
    breakdown = job_breakdown(run.jobs, run.seconds, top=4)
    return {"rows": rows, "variant": variant, "changes": info["changes"], **run.as_dict(), "phases": phases,
            "mirror_matches": same, "merge_metrics": metrics, "files_before": files_before,
            "files_after": files_after, "breakdown": breakdown}


# -- the run --------------------------------------------------------------------------------------------


def header(text: str, loads: dict[str, Any]) -> None:
    load = load_average()
    loads[text.split("]")[0].strip("[")] = load
    print(f"\n{text} - load {format_load(load)}", flush=True)


def run(args: argparse.Namespace) -> dict[str, Any]:
    machine = Machine.current()
    print(f"machine: {machine.line()}")
    print(f"code: {machine.code}")
    package = Path(pgoutput_spark.__file__).resolve().parent
    if package != Path(__file__).resolve().parent.parent / "pgoutput_spark":
        print(f"package: NOT this checkout's: {package} (PYTHONPATH)")
    print(f"load average at start: {format_load(machine.load_at_start)}; "
          f"{shutil.disk_usage(args.data_dir).free / 1e9:.0f} GB free in {args.data_dir}")
    loads: dict[str, Any] = {}
    results: dict[str, Any] = {"machine": machine.as_dict(), "package": str(package), "load": loads}
    out = args.data_dir / "apply-out"
    # PostgreSQL work first: the subscriber is timed before the JVM starts.
    print("\ndata (PostgreSQL 15 clusters)", flush=True)
    e2e_path = args.data_dir / f"apply-e2e-{args.changes}"
    e2e_info = None
    if not args.skip_e2e:
        e2e_info = prepared(e2e_path, args.reuse, lambda p: build_e2e(p, args.changes),
                            f"{args.changes:,}+ changes of pgbench + bench_wide, subscriber timed")
    captures: dict[tuple[int, str], tuple[Path, dict[str, Any]]] = {}  # (rows, capture: "", -recent, -recent-full)
    if not args.skip_merge:
        for rows in args.sizes:
            for kind in sorted({_MERGE_CAPTURES[v] for v in args.merge_variants}):
                path = args.data_dir / f"apply-merge-{rows}-{args.merge_changes}{kind}"
                recent, full = kind != "", kind == "-recent-full"
                captures[rows, kind] = (path, prepared(
                    path, args.reuse, lambda p, r=rows, k=recent, f=full: build_merge(p, r, args.merge_changes, k, f),
                    f"{rows:,}-row table{' without a key' if full else ''}, {args.merge_changes:,} changes of "
                    f"{'recent' if recent else 'random'} keys"))

    spark = spark_session(args.driver_memory, out / "spark-local", dict(c.split("=", 1) for c in args.conf))
    try:
        if e2e_info is not None:
            header(f"[a] end to end: {e2e_info['changes']:,} changes ({e2e_info['messages']:,} messages) "
                   f"capture files -> Delta mirrors, vs a PostgreSQL 15 subscriber", loads)
            results["e2e"] = run_e2e(spark, e2e_info, e2e_path, out, args.e2e_runs,
                                     net_task_rows=args.net_task_rows, tables=args.tables)
        if captures:
            header(f"[b] {args.merge_changes:,} changes merged into a keyed mirror of "
                   f"{' and '.join(f'{r:,}' for r in args.sizes)} rows (best of {args.merge_runs})", loads)
            mirrors = {rows: args.data_dir / f"apply-mirror-{rows}" for rows in args.sizes}
            for rows, base in mirrors.items():
                table = base / "public" / MERGE_TABLE
                if not (args.reuse and (table / "_delta_log").is_dir()):
                    started = time.perf_counter()
                    merge_mirror(spark, base, rows, args.rows_per_file)
                    print(f"  mirror of {rows:,} rows created in {time.perf_counter() - started:.0f} s "
                          f"({_files(table)[0]} files; information)", flush=True)
            runs: dict[str, list[dict[str, Any]]] = {}
            for repeat in range(args.merge_runs):
                for rows in (args.sizes if repeat % 2 == 0 else args.sizes[::-1]):
                    for variant in args.merge_variants:
                        path, info = captures[rows, _MERGE_CAPTURES[variant]]
                        runs.setdefault(f"{rows}/{variant}", []).append(
                            time_merge(spark, info, path, mirrors[rows], out, variant))
            results["merge"] = runs
    finally:
        spark.stop()
        if not args.keep_output:
            shutil.rmtree(out, ignore_errors=True)
    results["summary"] = summary(results, args)
    results["load_at_end"] = load_average()
    print(f"\nload average at start: {format_load(machine.load_at_start)}, "
          f"at end: {format_load(results['load_at_end'])}; peak RSS of this process {peak_rss_mib():.0f} MiB")
    return results


def summary(results: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    print("\nsummary")
    out: dict[str, Any] = {}
    if "e2e" in results:
        e2e = results["e2e"]
        ours, theirs = e2e["ours"]["changes_per_s"], e2e["subscriber_changes_per_s"]
        out["e2e_ratio"] = ours / theirs
        print(f"  end to end, {e2e['changes']:,} changes: ours {ours:,.0f} changes/s, PostgreSQL subscriber "
              f"{theirs:,.0f} changes/s: {ours / theirs:.2f}x (target: beat the subscriber: "
              f"{'met' if ours > theirs else 'NOT met'})")
        o = e2e["ours"]
        print(f"  memory during it: driver JVM peak RSS {o['jvm_peak_rss_mib']:,.0f} MiB "
              f"(VmHWM {o['jvm_hwm_mib']:,.0f} MiB), Python workers {o['workers_peak_rss_mib']:,.0f} MiB, "
              f"Python driver {o['python_peak_rss_mib']:,.0f} MiB (spark.driver.memory {args.driver_memory})")
    if "merge" in results:
        best = {key: min(r["seconds"] for r in runs) for key, runs in results["merge"].items()}
        out["merge_best_s"] = best
        for variant in args.merge_variants:
            times = [(rows, best[f"{rows}/{variant}"]) for rows in args.sizes]
            line = ", ".join(f"{rows:,} rows {s:.1f} s" for rows, s in times)
            if len(times) > 1:
                ratio = times[-1][1] / times[0][1]
                out[f"merge_ratio_{variant}"] = ratio
                line += f": {ratio:.2f}x for {times[-1][0] / times[0][0]:,.0f}x the rows"
            print(f"  {args.merge_changes:,} changes merged ({variant}): {line}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=1_000_000,
                        help="[a]: capture at least this many changes (default 1,000,000)")
    parser.add_argument("--e2e-runs", type=int, default=1, help="[a]: runs; the best counts (default 1)")
    parser.add_argument("--sizes", default="100000,10000000",
                        help="[b]: mirror sizes in rows, comma-separated (default 100000,10000000)")
    parser.add_argument("--merge-changes", type=int, default=10_000, help="[b]: changes per run (default 10,000)")
    parser.add_argument("--merge-variants", default="no-dv",
                        help="[b]: comma-separated: no-dv (random keys, deletion vectors off: mirrors as "
                             "the job makes them), dv (random keys, deletion vectors on), recent (keys "
                             "among the newest 1%% of rows, deletion vectors on), recent-full (the same "
                             "changes to the table without a key, REPLICA IDENTITY FULL: a multiset) "
                             "(default no-dv)")
    parser.add_argument("--merge-runs", type=int, default=1, help="[b]: runs per size and variant; the best counts")
    parser.add_argument("--rows-per-file", type=int, default=1_000_000,
                        help="[b]: rows per Parquet file of the initial mirrors (default 1,000,000)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the session (repeatable), e.g. spark.driver.extraJavaOptions=...")
    parser.add_argument("--net-task-rows", type=int, default=NET_TASK_ROWS,
                        help=f"[a]: change rows of a table per net-change task (default {NET_TASK_ROWS:,})")
    parser.add_argument("--key", action="append", default=[], metavar="SCHEMA.TABLE=COL[,COL]",
                        help="[a]: declare a table's key (`tables.keys`; repeatable), e.g. "
                             "public.bench_wide=id: its mirror is keyed as the subscriber's table is")
    parser.add_argument("--driver-memory", default="2g", help="spark.driver.memory (default 2g)")
    parser.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parent / "data",
                        help="where captures and mirrors are kept (default: benchmarks/data, gitignored)")
    parser.add_argument("--reuse", action="store_true",
                        help="reuse captures (and their subscriber timing) and mirrors built by an earlier run")
    parser.add_argument("--skip-e2e", action="store_true", help="leave out [a]")
    parser.add_argument("--skip-merge", action="store_true", help="leave out [b]")
    parser.add_argument("--keep-output", action="store_true", help="keep the Delta targets in DATA_DIR/apply-out")
    parser.add_argument("--json", type=Path, help="also write the results as JSON to this file")
    args = parser.parse_args(argv)
    try:
        args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--sizes: expected comma-separated integers, got {args.sizes!r}")
    try:
        args.tables = TablesConfig(keys={t: tuple(c.split(",")) for t, c in (k.split("=", 1) for k in args.key)})
    except ValueError:
        parser.error(f"--key: expected SCHEMA.TABLE=COL[,COL], got {args.key}")
    args.merge_variants = [v.strip() for v in args.merge_variants.split(",") if v.strip()]
    if not set(args.merge_variants) <= set(_MERGE_CAPTURES):
        parser.error(f"--merge-variants: {', '.join(_MERGE_CAPTURES)} only, got {args.merge_variants}")
    if min(args.changes, args.e2e_runs, args.net_task_rows, args.merge_changes, args.merge_runs, args.rows_per_file, *args.sizes) < 1:
        parser.error("--changes, --e2e-runs, --sizes, --merge-changes, --merge-runs and --rows-per-file "
                     "must be at least 1")
    if min(args.sizes) <= _PRIME_ROWS + args.merge_changes:
        parser.error(f"--sizes must exceed --merge-changes + {_PRIME_ROWS}")
    args.data_dir.mkdir(parents=True, exist_ok=True)
    return finish(run(args), argv, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
