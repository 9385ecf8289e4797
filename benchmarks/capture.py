"""Capture and snapshot benchmark against a throwaway PostgreSQL 15 cluster.

    .venv/bin/python benchmarks/capture.py [--scale 5] [--transactions 4000] [--snapshot-scale 10]
                                           [--chunk-size 100000] [--json PATH]

Prints, with the machine it ran on:

a. `capture_slot`: a slot created before ``pgbench -i -s SCALE`` (its COPY
   load: SCALE x 100,000 inserts in one transaction, streamed) and a pgbench
   TPC-B run of ``--transactions`` transactions on 2 clients, landed as
   Parquet in chunks of ``--chunk-size``: messages/s and MB/s of pgoutput
   data, chunks, the peak memory of this process;
b. `snapshot_tables`: ``pgbench -i -s SNAPSHOT_SCALE`` loaded before the slot,
   copied into Delta mirrors (local Spark): rows/s and MB/s of COPY text;
c. with ``--live SECONDS``: `capture_slot` run again and again (a pause of one
   second between runs, chunks of ``--live-chunk-size``) while pgbench TPC-B
   runs on 2 clients for SECONDS, on PostgreSQL 16 (pgserver), once as a
   superuser (the capture writes a running-transactions record after each
   chunk, `pg_log_standby_snapshot`) and once as a REPLICATION role without
   EXECUTE on that function: messages landed and per second of capturing,
   when the capture had caught up (counted from the traffic's start), and how
   much WAL the last chunk decoded before its own (the slot's position minus
   its ``restart_lsn``). ``--live-only`` skips a and b.
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

from benchmarks.machine import Machine, finish, format_load, load_average, peak_rss_mib  # noqa: E402
from pgoutput_spark.slot.capture import capture_slot  # noqa: E402
from pgoutput_spark.testing.pgcluster import PgCluster  # noqa: E402

PUB = "bench_pub"


def _capture(pg: PgCluster, work: Path, scale: int, transactions: int, chunk_size: int) -> dict[str, Any]:
    db = pg.create_database("capture_bench")
    pg.run_pgbench(["-i", "-s", "1", "-I", "dt"], db)  # the tables, empty
    pg.execute(f"CREATE PUBLICATION {PUB} FOR ALL TABLES", dbname=db)
    pg.create_slot("bench", dbname=db)
    pg.run_pgbench(["-i", "-s", str(scale), "-I", "gp"], db)
    pg.run_pgbench(["-c", "2", "-t", str(transactions // 2)], db)
    started = time.perf_counter()
    result = capture_slot(str(work / "landing"), slot="bench", dsn=pg.conninfo(db), publications=[PUB],
                          proto_version=2, streaming="on", chunk_size=chunk_size)
    seconds = time.perf_counter() - started
    size = sum(c.bytes for c in result.chunks)
    return {"messages": result.messages, "chunks": len(result.chunks), "seconds": round(seconds, 2),
            "messages_per_s": round(result.messages / seconds), "mb_per_s": round(size / 1e6 / seconds, 1),
            "pgoutput_mb": round(size / 1e6, 1)}


def _snapshot(pg: PgCluster, work: Path, scale: int) -> dict[str, Any]:
    from pgoutput_spark.slot.snapshot import snapshot_tables
    from pgoutput_spark.spark.session import build_spark_session

    db = pg.create_database("snapshot_bench")
    pg.run_pgbench(["-i", "-s", str(scale)], db)
    pg.execute(f"CREATE PUBLICATION {PUB} FOR ALL TABLES", dbname=db)
    spark = build_spark_session(master="local[2]", conf={"spark.ui.enabled": "false",
                                                         "spark.sql.shuffle.partitions": "2"})
    started = time.perf_counter()
    result = snapshot_tables(spark, str(work / "mirrors"), slot="bench_snapshot", publications=[PUB],
                             dsn=pg.conninfo(db))
    seconds = time.perf_counter() - started
    rows, size = sum(t.rows for t in result.tables), sum(t.bytes for t in result.tables)
    spark.stop()
    return {"rows": rows, "tables": len(result.tables), "seconds": round(seconds, 2),
            "rows_per_s": round(rows / seconds), "text_mb_per_s": round(size / 1e6 / seconds, 1)}


def _live(pg: PgCluster, work: Path, seconds: int, chunk_size: int, *, superuser: bool) -> dict[str, Any]:
    import threading

    db = slot = f"live_{'super' if superuser else 'plain'}"  # slot names are cluster-wide
    pg.create_database(db)
    pg.run_pgbench(["-i", "-s", "2"], db)
    pg.execute(f"CREATE PUBLICATION {PUB} FOR ALL TABLES", dbname=db)
    pg.create_slot(slot, dbname=db)
    dsn = pg.conninfo(db)
    if not superuser:
        pg.execute("DO $$ BEGIN CREATE ROLE bench_capture LOGIN REPLICATION; EXCEPTION WHEN"
                   " duplicate_object THEN NULL; END $$", dbname=db)
        dsn = f"host={pg.host} port={pg.port} dbname={db} user=bench_capture"
    landing = str(work / f"live-{db}")
    traffic = threading.Thread(target=pg.run_pgbench, args=(["-n", "-c", "2", "-j", "2", "-T", str(seconds)], db))
    began = time.perf_counter()
    traffic.start()
    runs = messages = 0
    busy = 0.0
    while traffic.is_alive():
        started = time.perf_counter()
        result = capture_slot(landing, slot=slot, dsn=dsn, publications=[PUB], proto_version=2,
                              streaming="on", chunk_size=chunk_size)
        busy += time.perf_counter() - started
        runs, messages = runs + 1, messages + result.messages
        if traffic.is_alive():
            time.sleep(1)
    caught_up = time.perf_counter() - began  # the last run started before the traffic's end
    span = pg.query("SELECT confirmed_flush_lsn - restart_lsn FROM pg_replication_slots WHERE slot_name = %s",
                    (slot,), dbname=db)[0][0]
    rest = capture_slot(landing, slot=slot, dsn=dsn, chunk_size=chunk_size)
    return {"superuser": superuser, "runs": runs, "messages": messages + rest.messages, "busy_s": round(busy, 1),
            "messages_per_busy_s": round(messages / busy) if busy else None,
            "caught_up_after_s": round(caught_up, 1), "decode_span_mb": round(float(span) / 1e6, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=int, default=5)
    parser.add_argument("--transactions", type=int, default=4000)
    parser.add_argument("--snapshot-scale", type=int, default=10)
    parser.add_argument("--chunk-size", type=int, default=100_000)
    parser.add_argument("--live", type=int, default=0, metavar="SECONDS")
    parser.add_argument("--live-chunk-size", type=int, default=2000)
    parser.add_argument("--live-only", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    machine = Machine.current()
    print(f"machine: {machine.line()}; load {format_load(load_average())}")
    work = Path(tempfile.mkdtemp(prefix="capture-bench-"))
    results: dict[str, Any] = {"machine": machine.as_dict()}
    try:
        if args.live:
            results["live"] = []
            with PgCluster.pgserver() as pg:
                for superuser in (True, False):
                    live = _live(pg, work, args.live, args.live_chunk_size, superuser=superuser)
                    results["live"].append(live)
                    who = "superuser (a record after each chunk)" if live["superuser"] else "role without it"
                    print(f"live, PostgreSQL 16, {who}: {live['messages']:,} messages of {args.live} s of"
                          f" traffic in {live['runs']} runs, {live['busy_s']} s capturing:"
                          f" {live['messages_per_busy_s']:,} messages/s; caught up"
                          f" {live['caught_up_after_s']} s after the traffic began; the last chunk decoded"
                          f" {live['decode_span_mb']} MB of WAL before its own")
        if args.live_only:
            return finish({**results, "load_after": load_average()}, argv, args.json)
        with PgCluster.debian(15) as pg:
            capture = _capture(pg, work, args.scale, args.transactions, args.chunk_size)
            print(f"capture: {capture['messages']:,} messages ({capture['pgoutput_mb']} MB) in"
                  f" {capture['chunks']} chunks, {capture['seconds']} s: {capture['messages_per_s']:,}"
                  f" messages/s, {capture['mb_per_s']} MB/s; peak RSS {peak_rss_mib():.0f} MiB")
            snapshot = _snapshot(pg, work, args.snapshot_scale)
            print(f"snapshot: {snapshot['rows']:,} rows in {snapshot['tables']} tables, {snapshot['seconds']} s:"
                  f" {snapshot['rows_per_s']:,} rows/s, {snapshot['text_mb_per_s']} MB/s of COPY text")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results.update({"capture": capture, "snapshot": snapshot, "load_after": load_average()})
    return finish(results, argv, args.json)


if __name__ == "__main__":
    sys.exit(main())
