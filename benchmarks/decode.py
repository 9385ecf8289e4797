"""Decode benchmark: vectorized decoder vs per-message Python, and the Spark path.

    .venv/bin/python benchmarks/decode.py [--messages 1000000] [--data-dir benchmarks/data]
                                          [--reuse] [--json PATH]

Builds (or with ``--reuse`` reuses) a capture of real pgoutput traffic from a
throwaway PostgreSQL 15 (see `workload`), then prints messages/s and MB/s of
message bytes for:

a. `decode_batch` alone on one core, over the whole capture in 10,000-message
   batches (best of ``--runs``);
b. the per-message `struct` baseline (`baseline_struct`) and the vectorized
   decoder on the same first ``--subset`` messages, then on the change messages
   of the narrow pgbench tables and of the 20-column table apart;
c. pypgoutput 0.0.3 on that subset, if it is installed;
d. Spark local[2]: capture -> Parquet with and without decoding (`spark_bench`).

See benchmarks/README.md for what each figure means.
"""

from __future__ import annotations

import os

# One core for the decoder figures: no BLAS / OpenMP thread pools. Must precede
# the first numpy import; Spark's Python workers inherit it.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

import baseline_struct  # noqa: E402
import mix  # noqa: E402
from machine import Machine, finish, format_load, load_average, peak_rss_mib  # noqa: E402
from peers import pypgoutput_decoder  # noqa: E402
from workload import CaptureInfo, build_capture, capture_dir, existing_capture  # noqa: E402

from pgoutput_spark.decoder.batch import decode_batch  # noqa: E402
from pgoutput_spark.decoder.protocol import MessageType  # noqa: E402
from pgoutput_spark.decoder.stream import StreamEvents  # noqa: E402

BATCH_ROWS = 10_000  # spark.sql.execution.arrow.maxRecordsPerBatch default
WARMUP_MESSAGES = 20_000
TARGET_SPEEDUP = 20.0
TABLE_GROUPS = {"narrow (pgbench_*, 3-6 cols)": "pgbench_", "wide (bench_wide, 20 cols)": "bench_wide"}


@dataclass(frozen=True)
class Rate:
    """One timed figure: `messages` of `nbytes` message bytes in `seconds` (best run)."""

    name: str
    messages: int
    nbytes: int
    seconds: float
    runs: int
    note: str = ""

    @property
    def messages_per_s(self) -> float:
        return self.messages / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / 1e6 / self.seconds

    def line(self) -> str:
        return (f"  {self.name:<38} {self.messages:>9,} msgs {self.nbytes / 1e6:>7.1f} MB "
                f"{self.seconds:>7.2f} s {self.messages_per_s:>10,.0f} msg/s {self.mb_per_s:>6.1f} MB/s"
                f"  (best of {self.runs}{'; ' + self.note if self.note else ''})")

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "messages_per_s": self.messages_per_s, "mb_per_s": self.mb_per_s}


def best_of(name: str, fn: Callable[[], object], runs: int, messages: int, nbytes: int,
            budget_s: float = 120.0) -> Rate:
    """The best of `runs` timed calls (fewer once `budget_s` is spent); notes CPU / wall."""
    best = (float("inf"), 0.0)
    done, spent = 0, 0.0
    while done < runs and (done == 0 or spent < budget_s):
        cpu0, wall0 = time.process_time(), time.perf_counter()
        fn()
        wall = time.perf_counter() - wall0
        best = min(best, (wall, time.process_time() - cpu0))
        done, spent = done + 1, spent + wall
    return Rate(name, messages, nbytes, best[0], done, f"cpu/wall {best[1] / best[0]:.2f}")


def _batches(table: pa.Table, rows: int = BATCH_ROWS) -> list[pa.RecordBatch]:
    """`rows`-message batches that own their buffers, like the batches a Spark task receives.

    A plain slice would share the whole table's data buffer, and `decode_batch`
    scans the buffer it is given for NULs when a batch has string fields.
    """
    table = table.combine_chunks()
    out = []
    for i in range(0, table.num_rows, rows):
        piece = table.slice(i, rows)
        out.append(pa.RecordBatch.from_arrays(
            [pa.concat_arrays(column.chunks) for column in piece.columns], schema=table.schema))
    return out


def _nbytes(batches: Sequence[pa.RecordBatch]) -> int:
    return sum(pc.sum(pc.binary_length(b.column("data"))).as_py() or 0 for b in batches)


def _decode_all(batches: Sequence[pa.RecordBatch], events: StreamEvents) -> list[pa.RecordBatch]:
    """What a Spark task does per Arrow batch (see `pgoutput_spark.spark.decode`)."""
    out = []
    for batch in batches:
        seq = batch.column("seq").to_numpy(zero_copy_only=False)
        decoded = decode_batch(batch.column("data"), in_stream=events.in_stream(seq), seq=seq,
                               lsn=batch.column("lsn").to_numpy(zero_copy_only=False))
        if decoded.error_rows.size:
            raise decoded.error(int(decoded.error_rows[0]))
        out.append(decoded.batch)
    return out


def _messages(batches: Sequence[pa.RecordBatch]) -> list[bytes]:
    return [m for b in batches for m in b.column("data").to_pylist()]


def _tuple_totals_decoded(batches: Sequence[pa.RecordBatch]) -> tuple[int, int]:
    """(column values with bytes, their total length) in the decoder's change tuples."""
    count = size = 0
    for batch in batches:
        _, _, old, new = batch.column("change").flatten()
        for tuples in (old, new):
            values = tuples.flatten().field("value")
            count += len(values) - values.null_count
            size += pc.sum(pc.binary_length(values)).as_py() or 0
    return count, size


def _tuple_totals_baseline(decoded: Sequence[tuple[Any, ...]]) -> tuple[int, int]:
    count = size = 0
    for message in decoded:
        if message[0] in (MessageType.INSERT, MessageType.UPDATE, MessageType.DELETE):
            for values in (message[3], message[4]):
                for _, value in values or ():
                    if value is not None:
                        count += 1
                        size += len(value)
    return count, size


def prepare_capture(args: argparse.Namespace) -> CaptureInfo:
    path = capture_dir(args.data_dir, args.messages)
    found = existing_capture(path) if args.reuse else None
    if found is not None and found.messages >= args.messages:
        print(f"capture: reusing {path} ({found.messages:,} messages in {found.files} files)")
        return found
    print(f"capture: building {args.messages:,}+ messages from pgbench + wide-table traffic "
          "on PostgreSQL 15 ...", flush=True)
    info = build_capture(path, args.messages)
    print(f"capture: {info.messages:,} messages, {info.message_bytes / 1e6:.1f} MB in {info.files} files, "
          f"built in {info.build_seconds:.1f} s (info, not a benchmark figure)")
    return info


class Bench:
    """The measurements of one run; `rates` and `extra` become the JSON results."""

    def __init__(self, args: argparse.Namespace, table: pa.Table, events: StreamEvents) -> None:
        self.args = args
        self.table = table
        self.events = events
        self.batches = _batches(table)
        self.total_bytes = _nbytes(self.batches)
        self.rates: dict[str, Rate] = {}
        self.extra: dict[str, Any] = {"load": {}}

    def record(self, key: str, rate: Rate) -> Rate:
        self.rates[key] = rate
        print(rate.line(), flush=True)
        return rate

    def header(self, text: str) -> None:
        print(f"\n{text} - load {format_load(load_average())}", flush=True)
        self.extra["load"][text.split("]")[0].strip("[")] = load_average()

    def decoder_alone(self) -> None:
        self.header(f"[a] decoder alone, one core ({BATCH_ROWS:,}-message batches)")
        _decode_all(self.batches[:2], self.events)  # warm caches and lazy imports
        self.record("decoder", best_of("decode_batch, whole capture", lambda: _decode_all(self.batches, self.events),
                                       self.args.runs, self.table.num_rows, self.total_bytes))

    def versus_baseline(self, label: str, key: str, batches: Sequence[pa.RecordBatch]) -> list[bytes]:
        """Decoder and struct baseline on the same messages; returns them as bytes."""
        n, nbytes = sum(b.num_rows for b in batches), _nbytes(batches)
        messages = _messages(batches)
        decoded = _decode_all(batches, self.events)
        agree = _tuple_totals_baseline(baseline_struct.decode_all(messages)) == _tuple_totals_decoded(decoded)
        del decoded
        runs = self.args.runs
        dec = self.record(f"{key}_decoder", best_of(f"decode_batch, {label}",
                                                    lambda: _decode_all(batches, self.events), runs, n, nbytes))
        base = self.record(f"{key}_baseline", best_of(f"struct baseline, {label}",
                                                      lambda: baseline_struct.decode_all(messages), runs, n, nbytes))
        print(f"  -> decoder is {base.seconds / dec.seconds:.1f}x the baseline; "
              f"both decode the same tuple values: {agree}")
        self.extra[f"{key}_agree"] = agree
        return messages

    def per_message(self) -> None:
        pa.set_cpu_count(1)
        count = min(self.args.subset, self.table.num_rows)
        subset = self.batches[: -(-count // BATCH_ROWS)]
        self.header(f"[b] per-message struct baseline vs decoder, one core ({BATCH_ROWS:,}-message batches)")
        messages = self.versus_baseline(f"first {sum(b.num_rows for b in subset):,}", "subset", subset)
        for label, table in mix.changes_by_table(self.table.slice(0, count), TABLE_GROUPS).items():
            if table.num_rows:
                self.versus_baseline(label.split(" ")[0] + " changes", label.split(" ")[0], _batches(table))
        print(f"  (tables: {', '.join(TABLE_GROUPS)})")
        pa.set_cpu_count(os.cpu_count() or 1)

        self.header("[c] pypgoutput on the same first messages")
        pypgoutput, version = pypgoutput_decoder()
        if pypgoutput is None:
            print(f"  pypgoutput: not available: {version}")
            self.extra["pypgoutput"] = f"not available: {version}"
            return
        sub = self.rates["subset_decoder"]
        self.record("pypgoutput", best_of(f"pypgoutput {version}, first {sub.messages:,}",
                                          lambda: pypgoutput(messages), self.args.runs, sub.messages, sub.nbytes))

    def spark(self, capture: Path) -> None:
        from spark_bench import JOBS, run_spark

        warmup = self.args.data_dir / "warmup-capture"
        shutil.rmtree(warmup, ignore_errors=True)
        warmup.mkdir(parents=True)
        pq.write_table(self.table.slice(0, WARMUP_MESSAGES), warmup / "part-00000.parquet")
        self.header(f"[d] Spark local[2], whole capture (best of {self.args.spark_runs})")
        try:
            results = run_spark(capture, warmup, self.args.data_dir / "spark-out", runs=self.args.spark_runs)
        finally:
            shutil.rmtree(warmup, ignore_errors=True)
        for job in results:
            first = f"; first pass {job.first_pass_seconds:.1f} s" if job.first_pass_seconds else ""
            self.record(f"spark_{job.name}", Rate(
                f"spark {JOBS[job.name]}", self.table.num_rows, self.total_bytes, job.seconds,
                len(job.all_seconds), f"machine CPU busy {job.cpu_busy:.0%}{first}"))
            print(f"    runs: {', '.join(f'{s:.1f}' for s in job.all_seconds)} s; "
                  f"output {job.output_mib:.1f} MiB")
        self.extra["spark"] = [asdict(job) for job in results]

    def summary(self) -> dict[str, float]:
        rates, ratios = self.rates, {}
        print("\nsummary")
        speedup = rates["subset_baseline"].seconds / rates["subset_decoder"].seconds
        ratios["decoder_vs_baseline"] = speedup
        verdict = "met" if speedup >= TARGET_SPEEDUP else "NOT met"
        print(f"  decoder vs struct baseline: {speedup:.1f}x (same messages; target {TARGET_SPEEDUP:.0f}x: {verdict})")
        for label in TABLE_GROUPS:
            key = label.split(" ")[0]
            if f"{key}_decoder" in rates:
                ratios[f"decoder_vs_baseline_{key}"] = (rates[f"{key}_baseline"].seconds
                                                        / rates[f"{key}_decoder"].seconds)
                print(f"    on {label} changes only: {ratios[f'decoder_vs_baseline_{key}']:.1f}x")
        if "pypgoutput" in rates:
            ratios["decoder_vs_pypgoutput"] = rates["pypgoutput"].seconds / rates["subset_decoder"].seconds
            print(f"  decoder vs pypgoutput: {ratios['decoder_vs_pypgoutput']:.1f}x")
        if "spark_decode" in rates:
            copy, arrow = rates["spark_copy"], rates["spark_arrow"]
            dec, noop = rates["spark_decode"], rates["spark_decode_noop"]
            ratios["spark_decode_vs_copy"] = dec.seconds / copy.seconds
            ratios["spark_decode_vs_arrow"] = dec.seconds / arrow.seconds
            # The decoder's CPU time for the capture, as a share of 2 cores x the job's wall time.
            ratios["decode_share_of_spark_job"] = rates["decoder"].seconds / (2 * dec.seconds)
            print(f"  Spark decode -> Parquet takes {ratios['spark_decode_vs_copy']:.2f}x the time of the plain "
                  f"copy ({dec.messages_per_s:,.0f} vs {copy.messages_per_s:,.0f} msg/s), "
                  f"{ratios['spark_decode_vs_arrow']:.2f}x the identity mapInArrow")
            print(f"  decode -> noop sink: {noop.seconds:.1f} s, so the decoded Parquet write is "
                  f"~{dec.seconds - noop.seconds:.1f} s of the {dec.seconds:.1f} s")
            print(f"  decode_batch itself needs {rates['decoder'].seconds:.1f} core-seconds = "
                  f"{ratios['decode_share_of_spark_job']:.0%} of the decode job's 2 cores x wall time")
        return ratios


def run(args: argparse.Namespace) -> dict[str, Any]:
    machine = Machine.current()
    print(f"machine: {machine.line()}")
    print(f"code: {machine.code}")
    print(f"load average at start: {format_load(machine.load_at_start)}")
    info = prepare_capture(args)
    table = pq.read_table(info.path).sort_by("seq")
    events, description = mix.describe(table)
    print(f"capture mix: {description}")
    bench = Bench(args, table, events)
    bench.decoder_alone()
    bench.per_message()
    if not args.skip_spark:
        bench.spark(info.path)
    ratios = bench.summary()
    load_end = load_average()
    print(f"\nload average at start: {format_load(machine.load_at_start)}, at end: {format_load(load_end)}; "
          f"peak RSS of this process {peak_rss_mib():.0f} MiB")
    return {
        "machine": machine.as_dict(),
        "capture": {"path": str(info.path), "messages": table.num_rows, "message_bytes": bench.total_bytes,
                    "mix": description, "build_seconds": info.build_seconds},
        "rates": {key: rate.as_dict() for key, rate in bench.rates.items()},
        "ratios": ratios,
        **bench.extra,
        "load_at_end": load_end,
        "peak_rss_mib": peak_rss_mib(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000, help="capture at least this many messages")
    parser.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parent / "data",
                        help="where captures are kept (default: benchmarks/data, gitignored)")
    parser.add_argument("--reuse", action="store_true",
                        help="reuse DATA_DIR/capture-N if it exists with at least N messages")
    parser.add_argument("--subset", type=int, default=200_000,
                        help="messages for the per-message decoders (default 200,000)")
    parser.add_argument("--runs", type=int, default=3, help="runs per decoder figure; the best counts")
    parser.add_argument("--spark-runs", type=int, default=2, help="runs per Spark job; the best counts")
    parser.add_argument("--skip-spark", action="store_true", help="leave out the Spark figures")
    parser.add_argument("--json", type=Path, help="also write the results as JSON to this file")
    args = parser.parse_args(argv)
    if min(args.messages, args.subset, args.runs, args.spark_runs) < 1:
        parser.error("--messages, --subset, --runs and --spark-runs must be at least 1")
    return finish(run(args), argv, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
