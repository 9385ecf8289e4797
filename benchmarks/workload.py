"""Build a benchmark capture from a real workload on a throwaway PostgreSQL 15.

The workload runs in rounds until the slot has produced the requested number of
messages. Each round runs, concurrently:

* pgbench TPC-B traffic (2 clients, 2 threads) on a small ``pgbench -i`` database:
  per transaction Begin, three Updates, one Insert, Commit;
* inserts, updates and deletes on ``bench_wide``, a 20-column table of mixed
  types (int, bigint, smallint, numeric, float8, real, bool, varchar, text of
  0 to 600 characters with one row in 50 TOASTed out of line, timestamptz, date,
  uuid, jsonb, bytea, text[], interval). It has ``REPLICA IDENTITY FULL``, so
  updates and deletes carry the whole old row, and updates that leave the
  TOASTed column alone send it as "unchanged TOAST";
* a TRUNCATE of a small side table.

After each round the slot is drained (``pg_logical_slot_get_binary_changes``,
protocol 1) into the capture writer, so the server never holds more than one
round of changes. The capture is written to a temporary folder and renamed into
place only when complete, so an interrupted build is never reused.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from pgoutput_spark.testing.capture_files import CapturedMessage, write_capture_parquet
from pgoutput_spark.testing.pgcluster import PgCluster

PUBLICATION = "bench_pub"
SLOT = "bench_slot"
PROTO_VERSION = 1
ROWS_PER_FILE = 250_000

_PGBENCH_SCALE = 1
_PGBENCH_TXNS_PER_CLIENT = 2_000  # per round, per client: ~24k messages
_INSERT_TXNS = 10  # per round, of _INSERT_ROWS rows each
_INSERT_ROWS = 1_000
_UPDATE_TXNS = 10  # per round, of _UPDATE_ROWS rows each
_UPDATE_ROWS = 800
_DELETE_TXNS = 6  # per round, of _DELETE_ROWS rows each
_DELETE_ROWS = 600

_SCHEMA = """
CREATE TABLE bench_wide (
    id bigint PRIMARY KEY,
    n_int integer NOT NULL,
    n_big bigint,
    n_small smallint,
    amount numeric(14, 4),
    ratio float8,
    score real,
    flag boolean,
    code varchar(32),
    title text,
    body text,
    created_at timestamptz NOT NULL,
    updated_at timestamptz,
    birthday date,
    ref uuid,
    attrs jsonb,
    payload bytea,
    tags text[],
    wait interval,
    note text
);
ALTER TABLE bench_wide REPLICA IDENTITY FULL;
-- Out-of-line without compression: the long bodies are TOASTed externally.
ALTER TABLE bench_wide ALTER COLUMN body SET STORAGE EXTERNAL;
CREATE TABLE bench_side (id integer PRIMARY KEY, label text NOT NULL);
"""

# Values derive from the row number g only, so every build is the same workload
# (``%%`` is a literal ``%`` in a statement with parameters).
_INSERT = """
INSERT INTO bench_wide
SELECT g, g %% 100000, g * 7919, (g %% 32000)::smallint, round((g * 1.37) %% 100000, 4),
       g / 7.0, (g %% 1000) / 3.0, g %% 2 = 0, 'C-' || (g %% 9973), 'title ' || md5(g::text),
       repeat(md5((g * 3)::text), (CASE WHEN g %% 50 = 0 THEN 100 ELSE g %% 20 END)::int),
       timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second', NULL,
       date '1950-01-01' + (g %% 20000)::int, md5(g::text)::uuid,
       jsonb_build_object('k', g, 'tags', jsonb_build_array('a', g %% 7), 'name', md5(g::text)),
       decode(md5(g::text) || md5((g + 1)::text), 'hex'),
       ARRAY['t' || g %% 10, 't' || g %% 13, 'tag-' || g %% 17], (g %% 1000) * interval '1 minute',
       CASE WHEN g %% 5 = 0 THEN 'note ' || g END
FROM generate_series(%s::bigint, %s::bigint) AS g
"""

# Even rounds touch the body (a new value is sent); odd rounds leave it alone,
# so its TOASTed values are sent as unchanged ('u').
_UPDATE_BODY = """
UPDATE bench_wide SET n_int = n_int + 1, updated_at = timestamptz '2024-06-01 00:00:00+00' + id * interval '1 ms',
       body = body || 'x', attrs = attrs || '{"updated": true}'
WHERE id BETWEEN %s AND %s
"""
_UPDATE_OTHER = """
UPDATE bench_wide SET amount = amount + 1, flag = NOT flag, tags = tags || ARRAY['upd'],
       note = coalesce(note, 'set ') || id
WHERE id BETWEEN %s AND %s
"""
_DELETE = "DELETE FROM bench_wide WHERE id BETWEEN %s AND %s"


@dataclass(frozen=True)
class CaptureInfo:
    """A capture folder and what is in it."""

    path: Path
    messages: int
    files: int
    message_bytes: int
    build_seconds: float | None = None  # None when an existing capture was reused


def capture_dir(data_dir: Path, messages: int) -> Path:
    return data_dir / f"capture-{messages}"


def existing_capture(path: Path) -> CaptureInfo | None:
    """The capture in `path`, from the Parquet footers, or None if there is none."""
    files = sorted(path.glob("part-*.parquet"))
    if not files:
        return None
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    size = sum(pc.sum(pc.binary_length(pq.read_table(f, columns=["data"]).column("data"))).as_py() or 0
               for f in files)
    return CaptureInfo(path, rows, len(files), size)


class _Workload:
    """One round of pgbench + wide-table DML at a time, on one cluster."""

    def __init__(self, pg: PgCluster) -> None:
        self.pg = pg
        self.next_id = 1  # first id not inserted yet
        self.first_live = 1  # lowest id not deleted yet
        self.round = 0

    def setup(self) -> None:
        self.pg.run_pgbench(["-i", "-q", "-s", str(_PGBENCH_SCALE)])
        self.pg.execute(_SCHEMA)
        self.pg.execute(f"CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES")
        self.pg.create_slot(SLOT)

    def _wide(self) -> None:
        pg, parity = self.pg, self.round % 2
        round_first = self.next_id
        for _ in range(_INSERT_TXNS):
            pg.execute(_INSERT, (self.next_id, self.next_id + _INSERT_ROWS - 1))
            self.next_id += _INSERT_ROWS
        update = _UPDATE_BODY if parity == 0 else _UPDATE_OTHER
        for i in range(_UPDATE_TXNS):  # update rows of this round and older live ones
            low = max(self.first_live, round_first - 4_000) + i * _UPDATE_ROWS
            pg.execute(update, (low, low + _UPDATE_ROWS - 1))
        for _ in range(_DELETE_TXNS):
            pg.execute(_DELETE, (self.first_live, self.first_live + _DELETE_ROWS - 1))
            self.first_live += _DELETE_ROWS
        pg.execute("INSERT INTO bench_side SELECT g, 'side ' || g FROM generate_series(1, 20) g")
        pg.execute("TRUNCATE bench_side")

    def run_round(self) -> None:
        """pgbench and the wide-table DML at the same time; returns when both are done."""
        with ThreadPoolExecutor(max_workers=1) as pool:
            pgbench = pool.submit(self.pg.run_pgbench, [
                "-n", "-c", "2", "-j", "2", "-t", str(_PGBENCH_TXNS_PER_CLIENT)])
            self._wide()
            pgbench.result()
        self.round += 1


def _messages(pg: PgCluster, workload: _Workload, target: int) -> Iterator[CapturedMessage]:
    seq = 0
    while seq < target:
        workload.run_round()
        for message in pg.iter_pgoutput(SLOT, publications=[PUBLICATION], proto_version=PROTO_VERSION,
                                        consume=True, seq_start=seq, chunk_rows=20_000):
            yield message
            seq = message.seq + 1


def build_capture(path: Path, messages: int) -> CaptureInfo:
    """Run the workload until the slot produced at least `messages`; write them to `path`."""
    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    started = time.perf_counter()
    with PgCluster.debian(15) as pg:
        workload = _Workload(pg)
        workload.setup()
        write_capture_parquet(_messages(pg, workload, messages), partial, rows_per_file=ROWS_PER_FILE)
    elapsed = time.perf_counter() - started
    shutil.rmtree(path, ignore_errors=True)
    partial.rename(path)
    info = existing_capture(path)
    assert info is not None
    return CaptureInfo(info.path, info.messages, info.files, info.message_bytes, elapsed)
