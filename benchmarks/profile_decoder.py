"""cProfile of `decode_batch` on one 10,000-message batch of a benchmark capture.

    .venv/bin/python benchmarks/profile_decoder.py [--capture benchmarks/data/capture-1000000]
                                                   [--start 240000] [--top 15] [--repeat 20]

Takes the batch of messages ``start .. start+rows`` (compacted into its own
buffers, as a Spark task gets it), prints what it holds, the time per batch,
and the top functions by own time over `repeat` calls.
"""

from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import cProfile  # noqa: E402
import pstats  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

import mix  # noqa: E402

from pgoutput_spark.decoder.batch import decode_batch  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capture", type=Path,
                        default=Path(__file__).resolve().parent / "data" / "capture-1000000")
    parser.add_argument("--start", type=int, default=240_000, help="first message of the batch")
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--sort", default="tottime", help="pstats sort key (tottime, cumulative, ...)")
    args = parser.parse_args()
    pa.set_cpu_count(1)

    table = pq.read_table(args.capture).sort_by("seq").slice(args.start, args.rows).combine_chunks()
    batch = pa.RecordBatch.from_arrays([pa.concat_arrays(c.chunks) for c in table.columns], schema=table.schema)
    _, description = mix.describe(table)
    nbytes = pc.sum(pc.binary_length(batch.column("data"))).as_py()
    print(f"batch: messages {args.start:,}..{args.start + batch.num_rows - 1:,}, {nbytes / 1e6:.2f} MB; {description}")

    seq = batch.column("seq").to_numpy()
    lsn = batch.column("lsn").to_numpy()
    in_stream = np.zeros(seq.size, dtype=bool)

    def once() -> None:
        decode_batch(batch.column("data"), in_stream=in_stream, seq=seq, lsn=lsn)

    once()
    started = time.perf_counter()
    for _ in range(args.repeat):
        once()
    per_batch = (time.perf_counter() - started) / args.repeat
    print(f"decode_batch: {per_batch * 1000:.1f} ms per batch = {batch.num_rows / per_batch:,.0f} msg/s, "
          f"{nbytes / 1e6 / per_batch:.0f} MB/s (no profiler, mean of {args.repeat})")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.repeat):
        once()
    profiler.disable()
    pstats.Stats(profiler).strip_dirs().sort_stats(args.sort).print_stats(args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
