"""A wide table's conversion without Spark: `typed_changes` over `bench_wide`'s change rows.

    .venv/bin/python benchmarks/convert_wide.py [--capture DIR] [--files 5] [--runs 3] [--json PATH]

Reads the capture `apply.py` builds (its first ``--files`` Parquet files;
run ``apply.py --skip-merge`` once to build it), decodes it, and converts the
change rows of ``bench_wide`` (20 columns, ``REPLICA IDENTITY FULL``: an update
or delete carries its old row too) in batches of `ROWS_PER_TASK` rows, as a
table task of the apply job does, but in this process alone: no JVM, no Arrow
transfer, nothing else on the cores. Prints, with the machine it ran on:

- the best and every one of ``--runs`` passes over all batches;
- per source column, the seconds of converting its new and old values
  (`convert`, once over all batches), slowest first;
- the seconds of gathering the tuples' values column by column
  (`_tuple_values`), which comes before any column's conversion.

Compare two versions of the code by running it from each (``PYTHONPATH=`` a
git worktree), alternated: this is where the Python side of ``bench_wide``'s
task goes, and the machine's drift is smaller than over a whole `apply.py` run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.machine import Machine, finish, format_load, load_average  # noqa: E402

DEFAULT_CAPTURE = Path(__file__).resolve().parent / "data" / "apply-e2e-1000000" / "capture"
TABLE = "bench_wide"


def _rows(capture: Path, files: int) -> tuple[list[pa.RecordBatch], Any, int, pa.Schema]:
    """``TABLE``'s change rows as a table task gets them (batches of `ROWS_PER_TASK`), the
    relation history, the table's OID and its change schema."""
    from pgoutput_spark.assemble.relations import RelationHistory, RelationVersion
    from pgoutput_spark.assemble.typed import change_schema
    from pgoutput_spark.decoder.batch import decode_batch
    from pgoutput_spark.spark.changes import ROWS_PER_TASK

    parts = sorted(capture.glob("*.parquet"))[:files]
    if not parts:
        raise SystemExit(f"no capture in {capture}: run benchmarks/apply.py --skip-merge once to build it")
    table = pa.concat_tables([pq.read_table(p) for p in parts]).combine_chunks()
    n = table.num_rows
    decoded = decode_batch(table.column("data").chunk(0), in_stream=np.zeros(n, bool),
                           seq=table.column("seq").to_numpy(), lsn=table.column("lsn").to_numpy()).batch
    history = RelationHistory()
    oid = None
    relations = np.flatnonzero(np.asarray(pc.equal(decoded.column("message_type"), "relation")))
    for row in decoded.take(pa.array(relations)).to_pylist():
        history.add([RelationVersion.from_row(row["seq"], row["relation"])])
        if row["relation"]["relation_name"] == TABLE:
            oid = row["relation"]["relation_id"]
    if oid is None:
        raise SystemExit(f"{TABLE} has no Relation message in the first {files} capture files")
    ours = decoded.filter(pc.fill_null(pc.equal(pc.struct_field(decoded.column("change"), "relation_id"), oid),
                                       False))
    m = ours.num_rows
    columns = {name: ours.column(name) for name in ("seq", "lsn", "message_type", "change")}
    columns |= {"commit_seq": pa.array(np.arange(m), pa.int64()), "commit_lsn": pa.array(np.arange(m), pa.int64()),
                "commit_ts": pa.array(np.zeros(m, np.int64), pa.timestamp("us", tz="UTC")),
                "txn_xid": pa.array(np.zeros(m, np.int64)), "txn_origin": pa.nulls(m, pa.string())}
    rows = pa.RecordBatch.from_pydict(columns)
    # Each batch owns its buffers, as a batch from the JVM does (a slice would share all of them).
    batches = [rows.take(pa.array(np.arange(i, min(i + ROWS_PER_TASK, m)))) for i in range(0, m, ROWS_PER_TASK)]
    return batches, history, oid, change_schema(history.table_columns(oid))


def _per_column(batches: list[pa.RecordBatch], history: Any, oid: int, schema: pa.Schema) -> dict[str, Any]:
    """Seconds per source column of converting its values (new and old tuples), and of gathering
    the values column by column first."""
    from pgoutput_spark.assemble import typed

    version = history.relations[oid][-1]
    width = len(version.columns)
    seconds = dict.fromkeys((c.name for c in version.columns), 0.0)
    gather = 0.0
    for batch in batches:
        change = batch.column("change")
        for side in ("new_tuple", "old_tuple"):
            tuples = change.field(side)
            have = np.flatnonzero(np.asarray(tuples.is_valid()))
            if not have.size:
                continue
            kinds = typed._kinds(tuples)
            started = time.perf_counter()
            values, index = typed._tuple_values(tuples, have, width)
            gather += time.perf_counter() - started
            m = have.size
            text, binary = kinds["t"][index], kinds["b"][index]  # once, as `_typed_tuple` does
            for j, column in enumerate(version.columns):
                part = slice(j * m, (j + 1) * m)
                started = time.perf_counter()
                typed._convert_values(values.slice(j * m, m), text[part], binary[part], version, history, j,
                                      schema.field(column.name).type)
                seconds[column.name] += time.perf_counter() - started
    return {"gather_s": gather, "columns_s": dict(sorted(seconds.items(), key=lambda kv: -kv[1]))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capture", type=Path, default=DEFAULT_CAPTURE, help="apply.py's capture directory")
    parser.add_argument("--files", type=int, default=5, help="capture files to read (default 5, all of 1M changes)")
    parser.add_argument("--runs", type=int, default=3, help="passes over all batches; the best counts")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    from pgoutput_spark.assemble.typed import typed_changes

    machine = Machine.current()
    print(f"machine: {machine.line()}\ncode: {machine.code}\n")
    batches, history, oid, schema = _rows(args.capture, args.files)
    rows = sum(b.num_rows for b in batches)
    ops = dict(zip(*np.unique(np.concatenate([np.asarray(b.column("message_type")) for b in batches]),
                              return_counts=True)))
    print(f"{TABLE}: {rows:,} change rows in {len(batches)} batches "
          f"({', '.join(f'{int(v):,} {k}s' for k, v in ops.items())}) - load {format_load(load_average())}")
    for batch in batches[:1]:  # compiled kernels loaded, memory touched once
        typed_changes(batch, oid, history, schema)
    passes = []
    for _ in range(args.runs):
        started = time.perf_counter()
        for batch in batches:
            typed_changes(batch, oid, history, schema)
        passes.append(time.perf_counter() - started)
    best = min(passes)
    print(f"  typed_changes: best {best:.2f} s, {rows / best:,.0f} rows/s "
          f"(passes: {', '.join(f'{s:.2f}' for s in passes)} s)")
    detail = _per_column(batches, history, oid, schema)
    print(f"  values gathered column by column: {detail['gather_s']:.2f} s")
    print("  per column (new and old values):")
    for name, seconds in detail["columns_s"].items():
        print(f"    {seconds:6.3f} s  {name}")
    print(f"\nload average at end: {format_load(load_average())}")
    results = {"machine": machine.as_dict(), "rows": rows, "passes_s": passes, "best_s": best, **detail}
    return finish(results, argv, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
