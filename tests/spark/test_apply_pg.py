"""The apply job end to end, with PostgreSQL as the oracle.

`apply_workload` runs a workload built to break the apply (types, TOAST, key
changes, identities, streaming, two-phase, truncates, schema changes, row
filters, column lists, partitions, odd names, pgbench) and snapshots the
published tables after every commit. Each capture is landed file by file,
cut inside transactions and stream blocks, with `run_apply` after each file;
after every run every mirror must equal, as a multiset of rows and value by
value, PostgreSQL's snapshot for the last transaction the run applied (the
commit at ``ApplyResult.to_lsn``, its xid read from the capture's Begin /
Stream Commit / Commit Prepared message). Expected values only ever come from
PostgreSQL: psycopg values mapped to the documented Spark forms, or
PostgreSQL's own text output where the Spark form is that text (see
`apply_workload.column_sql`).
"""

from __future__ import annotations

import glob
import logging
import math
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pgoutput_spark import decode, decode_message, read_capture
from pgoutput_spark import ledger as ledger_module
from pgoutput_spark.apply import ApplyResult, run_apply, status
from pgoutput_spark.capture import CaptureColumns
from pgoutput_spark.changefeed import run_changes
from pgoutput_spark.config import TablesConfig
from pgoutput_spark.lsn import Lsn
from pgoutput_spark.mirroring import delta
from pgoutput_spark.mirroring.names import mirror_path
from pgoutput_spark.mirroring.schema import SchemaChangeError
from pgoutput_spark.mirroring.history import HISTORY_NAMES
from pgoutput_spark.slot.capture import capture_slot
from pgoutput_spark.testing.capture_files import CapturedMessage, write_capture_parquet
from pgoutput_spark.testing.pgcluster import PgCluster

from ..plugins.postgres import new_database
from ..plugins.spark import local_path
from .apply_workload import PUBLICATIONS, Driver, Dropped, TableSnap, Workload, drive, setup
from .deltalog import check_vacuumed, commits, recorded_vacuums

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

Tables = dict[tuple[str, str], TableSnap]

# -- captures ---------------------------------------------------------------------------------------


def _landed(pg: PgCluster, db: str, slot: str, landing: Path, protocol: int,
            options: dict[str, Any]) -> list[CapturedMessage]:
    """The slot's messages as `pgoutput-spark capture` lands them, in chunks of about 1000."""
    capture_slot(str(landing), slot=slot, dsn=pg.conninfo(db), publications=PUBLICATIONS,
                 proto_version=protocol, chunk_size=1000, **options)
    table = pa.concat_tables(pq.read_table(part) for part in sorted(landing.glob("part-*.parquet")))
    return [CapturedMessage(**row) for row in table.to_pylist()]


def _capture(pg: PgCluster, prefix: str, protocols: dict[int, dict[str, Any]],
             landing: Path | None = None) -> Iterator[tuple[Workload, dict[int, list[CapturedMessage]]]]:
    """Run the workload; capture it with each protocol: with `landing`, the first one through
    `pgoutput-spark capture` (chunked, as it lands captures), the others with one peek."""
    db = new_database(pg, prefix)
    setup(pg, db)
    slots = {p: f"{db}_p{p}" for p in protocols}
    for p, options in protocols.items():
        pg.create_slot(slots[p], two_phase=bool(options.get("two_phase")), dbname=db)
    workload = drive(pg, db)
    captures = {p: pg.peek_pgoutput(slots[p], publications=PUBLICATIONS, proto_version=p, dbname=db, **options)
                for p, options in list(protocols.items())[landing is not None:]}
    if landing is not None:
        p, options = next(iter(protocols.items()))
        captures[p] = _landed(pg, db, slots[p], landing, p, options)
    for slot in slots.values():
        pg.drop_slot(slot, dbname=db)
    yield workload, captures


@pytest.fixture(scope="module")
def pg15_captures(pg15: PgCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        tuple[Workload, dict[int, list[CapturedMessage]]]]:
    """Protocols 2 (streamed; landed by `pgoutput-spark capture`), 1 (nothing streamed) and 3
    (streamed, two-phase) of one PostgreSQL 15 workload."""
    yield from _capture(pg15, "apply15", {
        2: {"streaming": "on", "messages": True},
        1: {"messages": True},
        3: {"streaming": "on", "two_phase": True, "messages": True},
    }, landing=tmp_path_factory.mktemp("landing15"))


@pytest.fixture(scope="module")
def pg16_capture(pg16: PgCluster) -> Iterator[tuple[Workload, dict[int, list[CapturedMessage]]]]:
    """Protocol 4 with parallel streaming and two-phase, on PostgreSQL 16."""
    yield from _capture(pg16, "apply16", {4: {"streaming": "parallel", "two_phase": True, "messages": True}})


@pytest.fixture(scope="module", params=[17, 18], ids=["pg17", "pg18"])
def newer_capture(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        tuple[Workload, list[CapturedMessage]]]:
    """Protocol 4 with parallel streaming and two-phase on PostgreSQL 17 and 18, landed by
    `pgoutput-spark capture`."""
    major = request.param
    cluster = request.getfixturevalue(f"pg{major}")
    assert cluster.version_num // 10000 == major
    for workload, captures in _capture(cluster, f"apply{major}",
                                       {4: {"streaming": "parallel", "two_phase": True, "messages": True}},
                                       landing=tmp_path_factory.mktemp(f"landing{major}")):
        yield workload, captures[4]


class CaptureIndex:
    """Commit LSN -> xid, from the capture's own commit messages; where stream blocks are."""

    def __init__(self, messages: list[CapturedMessage]) -> None:
        self.xid_at: dict[int, int] = {}
        self.in_stream: list[bool] = []
        inside = False
        for m in messages:
            kind = m.data[:1]
            if kind == b"S":
                inside = True
            elif kind == b"E":
                inside = False
            self.in_stream.append(inside)
            if kind == b"B":  # Begin's final_lsn is its Commit's commit_lsn
                begin = decode_message(m.data)
                self.xid_at[int(begin.final_lsn)] = begin.xid  # type: ignore[attr-defined]
            elif kind in (b"c", b"K"):  # Stream Commit, Commit Prepared
                commit = decode_message(m.data)
                self.xid_at[int(commit.commit_lsn)] = commit.xid  # type: ignore[attr-defined]
        self.commit_lsns = sorted(self.xid_at)


def _schema_changes(messages: list[CapturedMessage], index: CaptureIndex) -> tuple[set[int], int]:
    """The seqs of the Relation and Type messages whose bytes (past the xid of one in a stream)
    differ from the last such message for the same OID, and how many there are in all: PostgreSQL
    sends them again, the same, in each walsender session (each capture chunk)."""
    last: dict[tuple[bytes, bytes], bytes] = {}
    changed: set[int] = set()
    total = 0
    for i, m in enumerate(messages):
        kind = m.data[:1]
        if kind not in (b"R", b"Y"):
            continue
        total += 1
        body = m.data[5:] if index.in_stream[i] else m.data[1:]
        if last.get((kind, body[:4])) != body:
            changed.add(m.seq)
        last[(kind, body[:4])] = body
    return changed, total


def _expected_at(workload: Workload, index: CaptureIndex, to_lsn: int | None) -> tuple[Tables, str]:
    """PostgreSQL's tables after the commit at ``to_lsn`` (nothing committed yet: all empty)."""
    if to_lsn is None:
        return {}, "before any commit"
    xid = index.xid_at[to_lsn]
    if xid in workload.snapshots:
        return workload.snapshots[xid], f"xid {xid}"
    for segment in workload.segments:
        if segment.start_lsn < to_lsn <= segment.end_lsn:
            later = [lsn for lsn in index.commit_lsns if to_lsn < lsn <= segment.end_lsn]
            assert not later, f"the run ended inside pgbench traffic (xid {xid}): no snapshot to compare"
            return segment.tables, f"end of pgbench segment (xid {xid})"
    raise AssertionError(f"no snapshot for xid {xid} committed at {to_lsn}")


# -- mirrors against PostgreSQL -----------------------------------------------------------------------


def _canon(value: Any) -> Any:
    """A hashable, type-strict form: 1, 1.0, True and Decimal(1) stay different."""
    if value is None:
        return None
    if isinstance(value, (bytearray, memoryview)):
        value = bytes(value)
    if isinstance(value, (list, tuple)):
        return ("list", tuple(_canon(v) for v in value))
    if isinstance(value, dict):
        return ("struct", tuple(sorted((k, _canon(v)) for k, v in value.items())))
    if isinstance(value, float) and math.isnan(value):
        return ("float", "NaN")
    return (type(value).__name__, value)


def _short(row: tuple[Any, ...]) -> str:
    return "(" + ", ".join(r if len(r := repr(v)) <= 60 else f"{r[:40]}...<{len(r)} chars>" for v in row) + ")"


class Mirrors:
    """Reads the mirrors under a target, re-reading a mirror only when it has a new Delta version."""

    def __init__(self, spark: Any, target: str, workload: Workload) -> None:
        self.spark, self.target, self.workload = spark, target, workload
        self._cache: dict[str, tuple[int, list[str], list[tuple[Any, ...]]]] = {}

    def paths(self) -> set[str]:
        found = set()
        for schema_dir in local_path(self.target).iterdir():  # a `lake` URI's folder
            if schema_dir.name in ("_pgoutput", "_runs") or not schema_dir.is_dir():
                continue
            found |= {f"{self.target.rstrip('/')}/{schema_dir.name}/{t.name}"
                      for t in schema_dir.iterdir() if (t / "_delta_log").is_dir()}
        return found

    def read(self, path: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        version = commits(path)  # read again after each new commit
        cached = self._cache.get(path)
        if cached is None or cached[0] != version:
            table = self.spark.read.format("delta").load(path).toArrow()
            rows = list(zip(*(c.to_pylist() for c in table.columns))) if table.num_columns else []
            cached = (version, table.column_names, rows)
            self._cache[path] = cached
        return cached[1], cached[2]

    def schema(self, schema: str, name: str) -> T.StructType:
        return self.spark.read.format("delta").load(mirror_path(self.target, schema, name)).schema

    def assert_equal(self, expected: Tables, what: str) -> None:
        known = {mirror_path(self.target, s, n): (s, n) for s, n in self.workload.tables()}
        present = self.paths()
        with ThreadPoolExecutor(4) as pool:  # the mirrors' Spark reads at once, as the apply merges them
            list(pool.map(self.read, sorted(present & known.keys())))
        problems = [f"a mirror no published table maps to: {p}" for p in sorted(present - known.keys())]
        for path, table in sorted(known.items(), key=lambda kv: kv[1]):
            snap = expected.get(table)
            if path not in present:
                if snap is not None and snap.rows:
                    problems.append(f"{table}: no mirror, PostgreSQL has {len(snap.rows)} rows")
                continue
            columns, rows = self.read(path)
            problems += _compare(table, columns, rows, snap, self.workload.dropped.get(table, []))
        assert not problems, f"mirrors differ from PostgreSQL at {what}:\n" + "\n".join(problems)


def _dropped_value(drop: Dropped, snap: TableSnap, row: tuple[Any, ...], xmin: int) -> Any:
    """A dropped column keeps its value in the mirror unless the row changed after the drop."""
    if xmin > drop.xid:
        return None
    key = tuple(row[snap.columns.index(k)] for k in drop.key)
    return drop.before.get(key)


def _compare(table: tuple[str, str], columns: list[str], rows: list[tuple[Any, ...]],
             snap: TableSnap | None, dropped: list[Dropped]) -> list[str]:
    snap = snap or TableSnap((), (), (), ())
    drops = [d for d in dropped if d.column not in snap.columns]
    expected_columns = [*snap.columns, *(d.column for d in drops)]
    expected_rows = [(*row, *(_dropped_value(d, snap, row, xmin) for d in drops))
                     for row, xmin in zip(snap.rows, snap.xmins)]
    problems = [f"{table}: mirror column {c!r} is neither published nor dropped"
                for c in columns if c not in expected_columns]
    for j, c in enumerate(expected_columns):
        if c not in columns and any(r[j] is not None for r in expected_rows):
            problems.append(f"{table}: mirror lacks column {c!r}, which PostgreSQL has values in")
    if problems:
        return problems
    order = [expected_columns.index(c) for c in columns]
    want = Counter(tuple(_canon(r[i]) for i in order) for r in expected_rows)
    got = Counter(tuple(_canon(v) for v in r) for r in rows)
    if want == got:
        return []
    raw = {tuple(_canon(v) for v in r): r for r in rows}
    raw.update({tuple(_canon(r[i]) for i in order): tuple(r[i] for i in order) for r in expected_rows})
    missing, extra = want - got, got - want
    lines = [f"{table}: {len(rows)} rows, PostgreSQL {len(expected_rows)}; columns {columns}"]
    lines += [f"    missing x{n}: {_short(raw[k])}" for k, n in list(missing.items())[:6]]
    lines += [f"    extra   x{n}: {_short(raw[k])}" for k, n in list(extra.items())[:6]]
    return lines


# -- landing and running ----------------------------------------------------------------------------


def _land(messages: list[CapturedMessage], tmp: Path, landing: Path, k: int | str) -> None:
    name = f"{k:02d}" if isinstance(k, int) else k
    for path in write_capture_parquet(messages, tmp / f"chunk{name}"):
        landing.mkdir(exist_ok=True)
        path.rename(landing / f"{name}-{path.name}")  # files land one by one


def _saved_open_rows(spark: Any, target: str) -> set[int]:
    """The runs (by hi) whose open-transaction rows ``_pgoutput/pending`` still holds."""
    path = Path(target) / "_pgoutput" / "pending"
    if not path.exists():
        return set()
    return {r[0] for r in spark.read.format("delta").load(str(path)).select("_run_hi").distinct().collect()}


def _apply_and_compare(spark: Any, messages: list[CapturedMessage], workload: Workload, tmp_path: Path,
                       cuts: list[int], run_after: set[int], *, retries: bool = False,
                       **options: Any) -> tuple[Mirrors, list[ApplyResult]]:
    """Land ``messages`` in files cut at ``cuts``; run after the files in ``run_after``; compare.
    With ``retries``, an at-least-once writer lands each file after the first again in part,
    beside it: its last half and the next file's first third, under another name. ``options``
    go to `run_apply`."""
    landing, target = tmp_path / "landing", str(tmp_path / "target")
    index, mirrors = CaptureIndex(messages), Mirrors(spark, target, workload)
    results: list[ApplyResult] = []
    previous_hi, previous_lsn = None, None
    bounds = [0, *cuts, len(messages)]
    landed: Counter[int] = Counter()  # seq -> rows landed
    for k, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        _land(messages[lo:hi], tmp_path, landing, k)
        landed.update(m.seq for m in messages[lo:hi])
        if retries and k > 0:
            before = bounds[k - 1]
            again = messages[lo - (lo - before) // 2:lo + (hi - lo) // 3]
            _land(again, tmp_path, landing, f"{k:02d}-retry")
            landed.update(m.seq for m in again)
        if k not in run_after and hi != len(messages):
            continue
        result = run_apply(spark, read_capture(spark, str(landing)), target, **options)
        print(f"run {len(results) + 1} (capture up to seq {messages[hi - 1].seq}):\n{result.render()}")
        assert not result.skipped and result.lo == previous_hi and result.hi == messages[hi - 1].seq
        repeated = sum(n - 1 for seq, n in landed.items() if (previous_hi is None or seq > previous_hi)
                       and seq <= result.hi)
        assert result.repeated_rows == repeated and (repeated > 0) == (retries and k > 0)
        assert result.from_lsn is None or previous_lsn is None or result.from_lsn > previous_lsn
        applied = result.to_lsn if result.to_lsn is not None else previous_lsn
        assert {t.path for t in result.tables} <= {mirror_path(target, s, n) for s, n in workload.tables()}
        state = status(spark, target)
        assert (state.read_point, state.position, state.running) == (applied, result.hi, False)
        expected, what = _expected_at(workload, index, applied)
        mirrors.assert_equal(expected, f"run {len(results) + 1}, after {what}")
        # `status` counts each mirror's rows from its Delta log: as many as were read.
        assert {path: rows for path, rows in state.mirrors.values()} == \
            {path: len(mirrors.read(path)[1]) for path in mirrors.paths()}, f"run {len(results) + 1}"
        # Open-transaction rows: only this run's and those it read (the previous run's) are kept.
        assert _saved_open_rows(spark, target) <= {result.lo, result.hi}, f"run {len(results) + 1}"
        previous_hi, previous_lsn = result.hi, applied
        results.append(result)

    # The runs saved the Relation / Type messages that changed a schema, not their repeats.
    changed, total = _schema_changes(messages, index)
    saved = [r[0] for r in spark.read.format("delta").load(f"{target}/_pgoutput/relations").select("seq").collect()]
    assert sorted(saved) == sorted(changed) and (len(saved) < total) == (total > len(changed))

    # Nothing new: no Delta commit anywhere.
    paths = sorted(mirrors.paths()) + [f"{target}/_runs"]
    before = {p: commits(p) for p in paths}
    again = run_apply(spark, read_capture(spark, str(landing)), target, **options)
    assert again.skipped and again.lo == messages[-1].seq
    assert {p: commits(p) for p in paths} == before
    return mirrors, results


def _cuts(messages: list[CapturedMessage], workload: Workload) -> dict[str, int]:
    """Named cut positions (a file ends just before each):

    - "toasty key swap": after the middle update of a key swap of TOASTed rows (a plain
      transaction; 'u' values on both sides of the cut);
    - "interleaved": inside two streamed transactions open at once;
    - "p1 prepared": after the Prepare of a two-phase transaction, before its Commit Prepared;
    - "p3 stream": inside the stream of a streamed two-phase transaction;
    - "pgbench load": inside pgbench's load, a streamed transaction of 100,000 inserts.
    """
    labels, load = workload.labels, workload.segments[0]

    def middle(picked: list[int]) -> int:
        assert picked
        return picked[len(picked) // 2] + 1

    def of(label: str, kinds: bytes) -> list[int]:
        return [i for i, m in enumerate(messages) if m.xid == labels[label] and m.data[:1] in kinds]

    cuts = {
        "toasty key swap": middle(of("toasty key swap", b"U")),
        "interleaved": middle(of("interleaved", b"IUD")),
        "p3 stream": middle(of("prepared p3", b"IUD")),
        "pgbench load": middle([i for i, m in enumerate(messages)
                                if load.start_lsn < m.lsn <= load.end_lsn and m.data[:1] == b"I"]),
    }
    prepares = of("prepared p1", b"P")  # only protocol 3 and later send Prepare
    if prepares:
        cuts["p1 prepared"] = prepares[0] + 1
    return cuts


def _check_types(mirrors: Mirrors) -> None:
    """The mirror column types docs/types.md gives for the source types."""
    interval = T.StructType([T.StructField("months", T.IntegerType()), T.StructField("days", T.IntegerType()),
                             T.StructField("microseconds", T.LongType())])
    want = {
        "id": T.IntegerType(), "i2": T.ShortType(), "i4": T.IntegerType(), "i8": T.LongType(),
        "n_plain": T.StringType(), "n_typed": T.DecimalType(12, 3), "n_wide": T.StringType(), "f4": T.FloatType(), "f8": T.DoubleType(),
        "t": T.StringType(), "vc": T.StringType(), "ch": T.StringType(), "b": T.BinaryType(),
        "flag": T.BooleanType(), "d": T.DateType(), "tm": T.StringType(), "ts": T.TimestampNTZType(),
        "tstz": T.TimestampType(), "iv": interval, "u": T.StringType(), "jb": T.StringType(),
        "js": T.StringType(), "ia": T.ArrayType(T.IntegerType()), "ta": T.ArrayType(T.StringType()),
        "fa": T.ArrayType(T.DoubleType()), "ip": T.StringType(), "net": T.StringType(), "mac": T.StringType(),
        "m": T.StringType(), "pi": T.IntegerType(), "bits": T.StringType(),
    }
    got = {f.name: f.dataType for f in mirrors.schema("public", "types_t").fields}
    assert {c: _plain_type(t) for c, t in got.items()} == {c: _plain_type(t) for c, t in want.items()}
    evolved = {f.name: f.dataType for f in mirrors.schema("public", "evolve_type").fields}
    assert evolved == {"id": T.IntegerType(), "n": T.LongType(), "s": T.StringType(),
                       "amount": T.DecimalType(14, 4), "ns": T.ArrayType(T.LongType())}


def _plain_type(t: T.DataType) -> str:
    return t.simpleString()  # nullability aside


# -- tests --------------------------------------------------------------------------------------------


def test_pg15_protocol_2_whole_capture_in_one_run(spark, pg15_captures, tmp_path):
    """Landed by `pgoutput-spark capture` (chunks of about 1000 messages, each read in a
    new decoding session), re-cut into several files, applied in one run (streamed
    transactions whole within it). Landed at least once: each file after the first lands
    again in part beside it (`_apply_and_compare`'s ``retries``), so the run reads many
    messages twice, streamed and plain, and applies each once. (Repeats of rows an earlier
    run applied: tests/spark/test_changefeed.py, whose runs share the same check.)"""
    workload, captures = pg15_captures
    messages = captures[2]
    cuts = sorted(_cuts(messages, workload).values())
    mirrors, results = _apply_and_compare(spark, messages, workload, tmp_path, cuts, run_after=set(),
                                          retries=True)
    assert len(results) == 1
    _check_types(mirrors)


def test_pg15_protocol_1_in_two_runs(spark, pg15_captures, tmp_path):
    """Protocol 1 streams nothing: large, prepared (sent at COMMIT PREPARED) and aborted-
    subtransaction transactions come as plain Begin .. Commit blocks, without stream xids.
    Two runs, the first ending inside pgbench's load of 100,000 inserts. A table with more
    than 20,000 change rows in a run has its net change spread over tasks by key. Every table
    with a key all along also has a history table, compared with PostgreSQL at every commit."""
    workload, captures = pg15_captures
    messages = captures[1]
    assert not any(m.data[:1] in b"SEcAp" for m in messages)  # no stream or two-phase messages
    cuts = _cuts(messages, workload)
    ordered = sorted(cuts.values())
    run_after = {ordered.index(cuts["pgbench load"])}
    keyed = _keyed_all_along(workload)
    mirrors, results = _apply_and_compare(spark, messages, workload, tmp_path, ordered, run_after,
                                          net_task_rows=20_000, tables=TablesConfig(history=tuple(
                                              glob.escape(f"{s}.{n}") for s, n in keyed)))
    assert len(results) == 2 and results[0].open_rows > 0  # the load's rows carried over
    # The load commits in the second run: 100,000 rows and pgbench's updates, in several tasks.
    assert [{t.table for t in r.tables if t.tasks > 1} for r in results] == [set(), {"public.pgbench_accounts"}]
    _check_types(mirrors)
    # The keyed tables' histories, at every commit: equal to PostgreSQL's tables then.
    assert {t.table for r in results for t in r.tables if t.history is not None} == {f"{s}.{n}" for s, n in keyed}
    _assert_histories(spark, str(tmp_path / "target"), workload, CaptureIndex(messages), keyed)


def _keyed_all_along(workload: Workload) -> list[tuple[str, str]]:
    """The workload's tables with a primary key in every snapshot, but those whose replica
    identity is FULL for a while (a history needs a key: `tables.keys` is for tables with none)."""
    snaps = [*workload.snapshots.values(), *(s.tables for s in workload.segments)]
    full = {("public", "rowfilt"), ("public", "ident_switch")}
    return sorted(t for t in workload.tables()
                  if t not in full and all(snap[t].key for snap in snaps if t in snap))


def _assert_histories(spark: Any, target: str, workload: Workload, index: CaptureIndex,
                      tables: list[tuple[str, str]]) -> None:
    """Each history's versions valid at the commit of each snapshot (and at the last commit of
    each pgbench segment) equal PostgreSQL's table then, compared as the mirrors are. A column
    the history has and the table had not yet (added later) is NULL in every version then."""
    lsn_of = {xid: lsn for lsn, xid in index.xid_at.items()}
    points = [(lsn_of[xid], workload.snapshots[xid], f"xid {xid}") for xid in workload.commit_order if xid in lsn_of]
    for segment in workload.segments:
        inside = [lsn for lsn in index.commit_lsns if segment.start_lsn < lsn <= segment.end_lsn]
        points += [(inside[-1], segment.tables, "the end of a pgbench segment")] if inside else []
    points.sort(key=lambda p: p[0])
    problems: list[str] = []
    for table in tables:
        versions = spark.read.format("delta").load(
            mirror_path(target, *table, "{root}/_history/{schema}/{table}")).toArrow()
        names = versions.column_names
        data = [j for j, c in enumerate(names) if c not in HISTORY_NAMES]
        rows = list(zip(*(c.to_pylist() for c in versions.columns)))
        since, until = names.index("_valid_from_lsn"), names.index("_valid_to_lsn")
        dropped = workload.dropped.get(table, [])
        compared = 0
        last = None
        for lsn, snaps, what in points:
            snap = snaps.get(table)
            if snap is not None and snap is last:
                continue  # the same rows as at the point before (the workload's snapshots are cached)
            last = snap
            valid = [r for r in rows if r[since] <= lsn and (r[until] is None or lsn < r[until])]
            known = {*(snap.columns if snap else ()), *(d.column for d in dropped)}
            keep = [j for j in data if names[j] in known or any(r[j] is not None for r in valid)]
            problems += [f"{what}: {p}" for p in _compare(table, [names[j] for j in keep],
                                                          [tuple(r[j] for j in keep) for r in valid], snap, dropped)]
            compared += 1
        assert compared > 1, table
    assert not problems, "histories differ from PostgreSQL:\n" + "\n".join(problems[:40])


def _file_by_file(spark, messages: list[CapturedMessage], workload: Workload, tmp_path: Path,
                  names: list[str], in_stream: set[str]) -> None:
    cuts = _cuts(messages, workload)
    index = CaptureIndex(messages)
    assert {n for n in names if index.in_stream[cuts[n] - 1]} == in_stream
    ordered = sorted(cuts[n] for n in names)
    mirrors, results = _apply_and_compare(spark, messages, workload, tmp_path, ordered,
                                          run_after=set(range(len(ordered) + 1)))
    assert len(results) == len(names) + 1
    _check_types(mirrors)


def test_pg15_protocol_3_two_runs_cut_between_prepare_and_commit_prepared(spark, pg15_captures, tmp_path):
    """Two-phase across runs: the first run ends after a Prepare, the second holds its Commit
    Prepared. (PostgreSQL 16's protocol 4 test cuts inside stream blocks.)"""
    workload, captures = pg15_captures
    _file_by_file(spark, captures[3], workload, tmp_path, ["p1 prepared"], in_stream=set())


def test_pg16_protocol_4_parallel_file_by_file(spark, pg16_capture, tmp_path, monkeypatch, restore_spark_conf):
    """Four runs, `_runs` compacted whenever it holds more than 2 files (50 outside tests), and
    then the target's own tables vacuumed: with no retention (7 days outside tests), the files
    the lease's and `pending`'s rewrites left behind are gone, and the next run reads them."""
    workload, captures = pg16_capture
    messages = captures[4]
    assert any(m.data[:1] == b"A" and len(m.data) == 25 for m in messages)  # Stream Abort with abort_lsn
    names = ["interleaved", "p3 stream", "pgbench load"]
    monkeypatch.setattr(delta, "LEDGER_MAX_FILES", 2)
    vacuumed = recorded_vacuums(monkeypatch, spark)
    _file_by_file(spark, messages, workload, tmp_path, names, in_stream=set(names))
    runs = f"delta.`{tmp_path}/target/_runs`"
    (files,) = spark.sql(f"DESCRIBE DETAIL {runs}").select("numFiles").first()
    operations = [r[0] for r in spark.sql(f"DESCRIBE HISTORY {runs}").select("operation").collect()]
    assert files <= 2 and "OPTIMIZE" in operations  # the third run's append made 3
    assert spark.read.format("delta").load(f"{tmp_path}/target/_runs").count() == len(names) + 1
    # The third run (whose append made `_runs` 3 files) vacuumed the target's own tables: the
    # files their commits removed before it are gone, the current ones there (the fourth run
    # read them).
    check_vacuumed(spark, vacuumed, {"lease", "pending", "_runs"})


def test_newer_postgresql_protocol_4_in_two_runs_cut_inside_a_stream(spark, newer_capture, tmp_path):
    """The same workload on PostgreSQL 17 and 18 (protocol 4 is still the highest): two runs, the
    first ending inside a streamed transaction's block, every mirror equal to the source's rows."""
    workload, messages = newer_capture
    assert any(m.data[:1] == b"A" and len(m.data) == 25 for m in messages)  # Stream Abort with abort_lsn
    _file_by_file(spark, messages, workload, tmp_path, ["p3 stream"], in_stream={"p3 stream"})


def _small_case(spark, pg: PgCluster, tmp_path: Path, create: str, *steps: tuple[str, ...],
                publish: str = "ALL TABLES", runs_before: tuple[int, ...] = (),
                **options: Any) -> tuple[Mirrors, list[ApplyResult]]:
    """A one-table workload in a database of its own, protocol 1, compared with PostgreSQL: one
    run, or a run before each step (a transaction) numbered in ``runs_before`` too; ``options``
    go to `run_apply`."""
    db = new_database(pg, "apply_case")
    pg.execute(f"{create}; CREATE PUBLICATION pub_main FOR {publish}", dbname=db)
    slot = f"{db}_p1"
    pg.create_slot(slot, dbname=db)
    d = Driver(pg, db)
    try:
        for statements in steps:
            d.txn(*statements)
    finally:
        d.close()
    messages = pg.peek_pgoutput(slot, publications=["pub_main"], proto_version=1, dbname=db)
    pg.drop_slot(slot, dbname=db)
    begins = [i for i, m in enumerate(messages) if m.data[:1] == b"B"]
    cuts = [begins[k] for k in runs_before]
    return _apply_and_compare(spark, messages, d.workload, tmp_path, cuts, run_after=set(range(len(cuts))),
                              **options)


def test_a_landing_written_from_sql_with_text_lsns_and_xids(spark, pg15, tmp_path):
    """A landing as a user's own script writes it: `pg_logical_slot_get_binary_changes`
    read with psycopg, whose ``pg_lsn`` and ``xid`` are the text PostgreSQL prints
    (``0/16B3748``, ``736``), a seq numbered by the script. The mirror equals the table; a value that is not an LSN stops
    the run naming its seq."""
    from pgoutput_spark.errors import CaptureError

    db = new_database(pg15, "text_lsn")
    pg15.execute("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t", dbname=db)
    pg15.create_slot("s", dbname=db)
    for statement in ("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 50) g",
                      "UPDATE t SET v = 'new' WHERE id % 7 = 0", "DELETE FROM t WHERE id % 10 = 0",
                      "UPDATE t SET id = 100 WHERE id = 1"):
        pg15.execute(statement, dbname=db)
    rows = pg15.query("SELECT lsn, xid, data FROM pg_logical_slot_get_binary_changes('s', NULL, NULL, "
                      "'proto_version', '1', 'publication_names', 'pub')", dbname=db)
    assert all(isinstance(lsn, str) and "/" in lsn and isinstance(xid, str) for lsn, xid, _ in rows)

    def land(path: Path, lsns: list[str]) -> str:
        path.mkdir()
        pq.write_table(pa.table({"seq": pa.array(range(len(rows)), pa.int64()), "lsn": lsns,
                                 "xid": [x for _, x, _ in rows],
                                 "data": pa.array([bytes(d) for _, _, d in rows], pa.binary())}), path / "0.parquet")
        return str(path)

    lsns = [lsn for lsn, _, _ in rows]
    bad = land(tmp_path / "bad", [*lsns[:5], "16B3748", *lsns[6:]])
    with pytest.raises(CaptureError, match=r"capture column 'lsn' \(the lsn column\) holds '16B3748' at seq 5: "
                                           r"not an LSN"):
        run_apply(spark, read_capture(spark, bad), str(tmp_path / "bad-target"))
    target = str(tmp_path / "target")
    landing = land(tmp_path / "landing", lsns)
    assert read_capture(spark, landing).schema["xid"].dataType == T.StringType()
    result = run_apply(spark, read_capture(spark, landing), target, columns=CaptureColumns(xid="xid"))
    assert (result.hi, result.transactions) == (len(rows) - 1, 4)
    assert Lsn(lsns[0]) <= result.from_lsn < result.to_lsn <= Lsn(lsns[-1])  # as PostgreSQL printed them
    mirror = sorted(tuple(r) for r in spark.read.format("delta").load(mirror_path(target, "public", "t")).collect())
    assert mirror == sorted(pg15.query("SELECT id, v FROM t", dbname=db))


@pytest.mark.parametrize("landing", ["parquet", "delta"])
def test_files_landed_after_runs_applied_past_them(spark, pg15, tmp_path, landing):
    """A landing whose files arrive out of order: the runs apply files 1, 3 and 4 of a
    capture, the second run beside a retried upload of file 1, then file 2 lands. Its
    messages were never read: the run fails naming the file, writing nothing. The retried
    upload's rows repeat messages read: counted, no error. Rebuilding the mirrors with
    ``accept_late_files`` replays file 2 in its place: the mirrors equal PostgreSQL's
    tables, and later runs go on without the error."""
    from pgoutput_spark.errors import CaptureError

    db = new_database(pg15, f"late_{landing}")
    pg15.execute("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE TABLE f (a int, b text);"
                 " ALTER TABLE f REPLICA IDENTITY FULL; CREATE PUBLICATION pub FOR TABLE t, f", dbname=db)
    slot = f"{db}_slot"  # slots are the cluster's: one of its own
    pg15.create_slot(slot, dbname=db)
    for statement in ("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 40) g;"
                      " INSERT INTO f SELECT g % 4, 'f' FROM generate_series(1, 12) g",
                      "UPDATE t SET v = 'late' WHERE id % 3 = 0; DELETE FROM t WHERE id % 7 = 0;"
                      " DELETE FROM f WHERE a = 1",
                      "INSERT INTO t SELECT g, 'v' || g FROM generate_series(41, 60) g",
                      "UPDATE t SET v = 'four' WHERE id % 5 = 0; UPDATE f SET b = 'g' WHERE a = 2"):
        pg15.execute(statement, dbname=db)
    messages = pg15.peek_pgoutput(slot, publications=["pub"], proto_version=1, dbname=db)
    pg15.drop_slot(slot, dbname=db)
    begins = [i for i, m in enumerate(messages) if m.data[:1] == b"B"]
    assert len(begins) == 4
    files = [messages[i:j] for i, j in zip(begins, [*begins[1:], len(messages)])]
    target, staged = str(tmp_path / "target"), tmp_path / "staged"
    path = str(tmp_path / "landing")

    def land(part: list[CapturedMessage], name: str) -> None:
        (written,) = write_capture_parquet(part, staged / name)
        if landing == "parquet":
            Path(path).mkdir(exist_ok=True)
            written.rename(Path(path) / f"{name}.parquet")
        else:  # one append (one commit, new data files) per file landed
            spark.read.parquet(str(written)).write.format("delta").mode("append").save(path)

    def run(**options: Any) -> ApplyResult:
        return run_apply(spark, read_capture(spark, path), target, **options)

    def rows(table: str) -> tuple[list[tuple], list[tuple]]:
        mirror = spark.read.format("delta").load(mirror_path(target, "public", table)).collect()
        return sorted(tuple(r) for r in mirror), sorted(pg15.query(f"SELECT * FROM {table}", dbname=db))

    land(files[0], "1")
    land(files[2], "3")
    first = run()
    assert first.hi == files[2][-1].seq and first.landed.late_rows == 0
    land(files[3], "4")
    land(files[0], "1-retry")  # lands after the first run read file 1: its rows repeat messages read
    second = run()
    assert (second.lo, second.hi) == (first.hi, files[3][-1].seq)
    assert (second.landed.late_rows, second.landed.unread) == (len(files[0]), 0)
    assert "files landed late: " in second.render()
    assert rows("t")[0] != rows("t")[1]  # the mirrors miss file 2, not landed yet

    land(files[1], "2")
    versions = commits(f"{target}/_runs")
    with pytest.raises(CaptureError, match=rf"capture files landed after the target applied past their seqs "
                                           rf"\(position: seq {second.hi}\), with {len(files[1])} messages "
                                           rf"no run read: \S+ \(seqs {files[1][0].seq} to {files[1][-1].seq}, "
                                           rf"{len(files[1])} rows\)"):
        run()
    assert commits(f"{target}/_runs") == versions and status(spark, target).running is False

    rebuilt = run(rebuild=("public.t", "public.f"), accept_late_files=True)
    assert rebuilt.landed.unread == len(files[1]) and rebuilt.hi == second.hi
    for table in ("t", "f"):
        mirror, source = rows(table)
        assert mirror == source, table
    assert run().skipped  # the late file is recorded: no error, nothing new


def test_a_relations_table_holding_every_sessions_repeats_is_rewritten_once(spark, pg15, tmp_path, monkeypatch):
    """Runs from before they left out the Relation / Type messages PostgreSQL sends again in
    each walsender session saved every one (here: the table as they wrote it, from four
    sessions). The next run rewrites it with the versions that change a schema (PostgreSQL's
    bytes say which), once; the mirror equals the source table. A changes run likewise."""
    db = new_database(pg15, "repeats")
    pg15.execute("CREATE TYPE mood AS ENUM ('ok', 'sad'); CREATE TABLE t (id int PRIMARY KEY, m mood, n int);"
                 " CREATE PUBLICATION pub FOR TABLE t", dbname=db)
    pg15.create_slot("repeats_slot", dbname=db)
    messages: list[CapturedMessage] = []
    for step in range(4):
        if step == 2:
            pg15.execute("ALTER TABLE t ADD COLUMN note text", dbname=db)
        pg15.execute(f"INSERT INTO t VALUES ({step}, 'ok', {step}); UPDATE t SET n = n + 1", dbname=db)
        messages += pg15.get_pgoutput("repeats_slot", publications=["pub"], proto_version=1,
                                      seq_start=len(messages), dbname=db)
    landing, target = tmp_path / "landing", str(tmp_path / "target")
    write_capture_parquet(messages, landing)
    capture = read_capture(spark, str(landing))
    relations = f"{target}/_pgoutput/relations"
    every = decode(capture).where(F.col("message_type").isin("relation", "type")).select("seq", "relation", "type")
    every.write.format("delta").save(relations)
    assert spark.read.format("delta").load(relations).count() == 8  # a Relation and a Type per session

    monkeypatch.setattr(ledger_module, "REPEATS_REWRITTEN", 3)
    run_apply(spark, capture, target)
    changed, total = _schema_changes(messages, CaptureIndex(messages))
    assert (len(changed), total) == (3, 8)  # the type, the table, the table with its new column
    saved = sorted(r[0] for r in spark.read.format("delta").load(relations).select("seq").collect())
    assert saved == sorted(changed)
    mirror = sorted(tuple(r) for r in spark.read.format("delta").load(f"{target}/public/t").collect())
    assert mirror == sorted(pg15.query("SELECT id, m::text, n, note FROM t", dbname=db))
    assert run_apply(spark, capture, target).skipped and commits(relations) == 2  # written, rewritten

    # The changes job loads its relation history the same way.
    changes_target = str(tmp_path / "changes")
    every.write.format("delta").save(f"{changes_target}/_pgoutput/relations")
    run_changes(spark, capture, changes_target)
    assert sorted(r[0] for r in spark.read.format("delta").load(f"{changes_target}/_pgoutput/relations")
                  .select("seq").collect()) == sorted(changed)


def test_timestamp_without_time_zone(spark, pg15, tmp_path):
    """A small case of its own: a table whose type or names once broke every run touching it."""
    mirrors, _ = _small_case(
        spark, pg15, tmp_path, "CREATE TABLE stamps (id int PRIMARY KEY, ts timestamp, tss timestamp[])",
        ("INSERT INTO stamps VALUES (1, '2024-02-29 23:59:59.999999', '{\"1900-06-15 12:00\",NULL}'),"
         " (2, '2038-01-19 03:14:07', NULL), (3, NULL, '{}')",),
        ("UPDATE stamps SET ts = ts + interval '1 microsecond' WHERE id = 1", "DELETE FROM stamps WHERE id = 3"))
    assert mirrors.schema("public", "stamps")["ts"].dataType == T.TimestampNTZType()


def test_column_name_with_a_dot(spark, pg15, tmp_path):
    """A small case of its own: a table whose type or names once broke every run touching it."""
    _small_case(spark, pg15, tmp_path, 'CREATE TABLE dotted (id int PRIMARY KEY, "a.b" int, "x.y.z" text)',
                ("INSERT INTO dotted VALUES (1, 1, 'one'), (2, NULL, 'two')",),
                ('UPDATE dotted SET "a.b" = 5 WHERE id = 2', "DELETE FROM dotted WHERE id = 1"))


def test_column_names_differing_only_in_case(spark, pg15, tmp_path):
    """PostgreSQL keeps "Id" and "id" apart; a Delta table cannot: a clear error, nothing written.

    The remedy the error names (a publication column list leaving one out) then works.
    """
    create = 'CREATE TABLE cased (id int PRIMARY KEY, "Name" text, "NAME" int)'
    steps = (("INSERT INTO cased VALUES (1, 'one', 10), (2, 'two', 20)",),
             ('UPDATE cased SET "Name" = \'uno\', "NAME" = 11 WHERE id = 1', "DELETE FROM cased WHERE id = 2"))
    with pytest.raises(SchemaChangeError, match=r"public\.cased: columns 'Name' and 'NAME' differ only in case"):
        _small_case(spark, pg15, tmp_path / "all", create, *steps)
    assert not (tmp_path / "all" / "target" / "public" / "cased").exists()
    mirrors, _ = _small_case(spark, pg15, tmp_path / "listed", create, *steps,
                          publish='TABLE cased (id, "Name")')
    assert mirrors.schema("public", "cased").fieldNames() == ["id", "Name"]


def test_a_multiset_netted_in_halves_equals_the_table(spark, pg15, tmp_path):
    """A FULL-identity table without a key, its net change in tasks of 40 change rows
    (`apply.net_task_rows`; one task before halves, its updates joining every bucket), the
    rows of each update in the task of its old row and, where its new row's bucket is another,
    in both: identical rows, updates with a TOASTed column unchanged (sent as 'u', its value in
    the old row), rows updated twice, deletes, a truncate and rows after it. Three runs: the
    first into a new mirror (the rows converted where they are cached and passed on as Arrow
    IPC values), the others looking rows up in it."""
    big = "repeat(md5(g::text), 100)"  # 3,200 bytes, stored EXTERNAL: TOASTed, not compressed
    _, results = _small_case(
        spark, pg15, tmp_path, "CREATE TABLE ms (a int, b text, big text); ALTER TABLE ms REPLICA IDENTITY FULL;"
        " ALTER TABLE ms ALTER COLUMN big SET STORAGE EXTERNAL",
        (f"INSERT INTO ms SELECT g % 7, 'b', {big} FROM generate_series(1, 40) g",
         "INSERT INTO ms SELECT g % 7, 'b', 'small' FROM generate_series(1, 40) g"),
        ("UPDATE ms SET b = 'c' || a WHERE a < 4",),
        ("UPDATE ms SET a = a + 10 WHERE b LIKE 'c%'", "DELETE FROM ms WHERE a = 5"),
        ("TRUNCATE ms",),
        (f"INSERT INTO ms SELECT g % 5, 'd', {big} FROM generate_series(1, 30) g",),
        ("UPDATE ms SET b = 'e' || a WHERE a % 2 = 0", "UPDATE ms SET a = -a WHERE b LIKE 'e%'"),
        ("DELETE FROM ms WHERE a = 3",), runs_before=(1, 4), net_task_rows=40)
    assert [[(t.table, t.tasks > 1, t.skipped) for t in r.tables] for r in results] == [[("public.ms", True, 0)]] * 3


def test_a_keyed_table_whose_keys_change_netted_in_halves_equals_the_table(spark, pg15, tmp_path, monkeypatch):
    """A keyed table in tasks of 40 change rows: key changes and a swap through a third key in
    one transaction move rows between the tasks' buckets, each update in both as halves (before
    halves, those buckets joined into one task). A key change that leaves a TOASTed column
    unchanged cannot be halved (its value is in the old key's task): that run is netted again
    in one task. Three runs: into a new mirror, then two looking rows up in it, reading only
    the files whose keys' statistics meet the keys looked up (`deltalog.PRUNE_MIN_BYTES` 0)."""
    from pgoutput_spark.mirroring import deltalog

    monkeypatch.setattr(deltalog, "PRUNE_MIN_BYTES", 0)
    big = "repeat(md5(g::text), 100)"  # 3,200 bytes, stored EXTERNAL: TOASTed, not compressed
    _, results = _small_case(
        spark, pg15, tmp_path, "CREATE TABLE kt (id int PRIMARY KEY, v text, big text);"
        " ALTER TABLE kt ALTER COLUMN big SET STORAGE EXTERNAL",
        (f"INSERT INTO kt SELECT g, 'v', CASE WHEN g > 90 THEN {big} ELSE 'small' END"
         " FROM generate_series(1, 100) g",),
        ("UPDATE kt SET id = id + 1000, v = 'moved' WHERE id % 3 = 0 AND id <= 90",
         "UPDATE kt SET id = -1 WHERE id = 1", "UPDATE kt SET id = 1 WHERE id = 2",
         "UPDATE kt SET id = 2 WHERE id = -1", "DELETE FROM kt WHERE id % 7 = 0"),
        ("UPDATE kt SET id = id + 2000 WHERE id > 95 AND id <= 100",  # big left unchanged: sent as 'u'
         "UPDATE kt SET v = 'w' WHERE id < 1100"),
        runs_before=(1, 2), net_task_rows=40)
    assert [[(t.table, t.tasks > 1, t.skipped) for t in r.tables] for r in results] == \
        [[("public.kt", True, 0)], [("public.kt", True, 0)], [("public.kt", False, 0)]]


def test_mirrors_keyed_by_times_and_text_and_multisets_are_read_by_statistics_and_equal_the_tables(
        spark, pg15, tmp_path, monkeypatch):
    """Files read by their statistics at any size (`deltalog.PRUNE_MIN_BYTES` 0) for a table
    keyed by a timestamptz and a text, and a FULL-identity table without a key (a multiset:
    its identity's columns without nulls, here a timestamp, a date, a numeric and a text).
    Three runs: new mirrors; inserts of later rows with an update and a delete of earlier ones
    (a second file each); changes to the later rows only, whose reads (pre-images and MERGEs)
    skip the first files. After each run the mirrors equal the tables."""
    import pgoutput_spark.mirroring.listed as listed
    import pgoutput_spark.mirroring.merge as merging
    from pgoutput_spark.mirroring import deltalog

    monkeypatch.setattr(deltalog, "PRUNE_MIN_BYTES", 0)
    kept: list[tuple[int, int]] = []  # (files listed, files kept) of each read by statistics

    def recorded(files: list[Any], ranges: Any) -> list[Any]:
        out = deltalog.files_in_ranges(files, ranges)
        kept.append((len(files), len(out)))
        return out

    monkeypatch.setattr(listed, "files_in_ranges", recorded)
    monkeypatch.setattr(merging, "files_in_ranges", recorded)
    at = "timestamptz '2024-06-01 00:00:00.000500+00' + g * interval '1 hour'"
    rows = (f"INSERT INTO ev SELECT {at}, 'code-' || lpad(g::text, 4, '0') || repeat('x', 40), g"
            " FROM generate_series({lo}, {hi}) g",
            f"INSERT INTO fm SELECT ({at})::timestamp, date '2024-01-01' + g, g * 1.000001, 'n' || g"
            " FROM generate_series({lo}, {hi}) g, generate_series(1, 2)")  # each row twice
    _, results = _small_case(
        spark, pg15, tmp_path, "CREATE TABLE ev (at timestamptz, code text, n int, PRIMARY KEY (at, code));"
        " CREATE TABLE fm (at timestamp, d date, amount numeric, note text);"
        " ALTER TABLE fm REPLICA IDENTITY FULL",
        tuple(r.format(lo=1, hi=50) for r in rows),
        (*(r.format(lo=101, hi=150) for r in rows),
         "UPDATE ev SET n = -n WHERE n = 7", "DELETE FROM ev WHERE n = 8",
         "DELETE FROM fm WHERE ctid = (SELECT min(ctid) FROM fm WHERE note = 'n9')"),
        ("UPDATE ev SET n = n * 10 WHERE n BETWEEN 120 AND 130",
         "UPDATE ev SET code = code || 'y' WHERE n = 140", "DELETE FROM ev WHERE n = 145",
         "UPDATE fm SET note = 'changed' WHERE ctid = (SELECT min(ctid) FROM fm WHERE note = 'n120')",
         "DELETE FROM fm WHERE d = date '2024-01-01' + 130"),
        runs_before=(1, 2))
    assert len(results) == 3
    # The third run's reads: two files listed, the first skipped, by both tables.
    assert kept and kept[-4:] == [(2, 1)] * 4, kept


def test_mirrors_with_deletion_vectors_on_mark_the_rows_runs_change_and_equal_the_table(spark, pg15, tmp_path,
                                                                                      monkeypatch):
    """Deletion vectors on (the session's Delta default), files of any size kept
    (`merge.MARK_MIN_FILE_BYTES` 0): the runs' MERGEs mark the rows they update or delete deleted
    in the mirror's files, and write the updated rows anew, a TOASTed value left unchanged by an
    update taken from the row marked; a file whose rows a run mostly changes is rewritten. Three
    runs: into a new mirror, then two into its files and their vectors; after each the mirror
    equals the table. Files read by their keys' statistics at any size too
    (`deltalog.PRUNE_MIN_BYTES` 0): the pre-images' and the MERGEs' reads."""
    import pgoutput_spark.mirroring.merge as merging
    from pgoutput_spark.mirroring import deltalog

    monkeypatch.setattr(merging, "MARK_MIN_FILE_BYTES", 0)
    monkeypatch.setattr(deltalog, "PRUNE_MIN_BYTES", 0)
    default = "spark.databricks.delta.properties.defaults.enableDeletionVectors"
    big = "repeat(md5(g::text), 100)"  # TOASTed, not compressed
    spark.conf.set(default, "true")
    try:
        _small_case(
            spark, pg15, tmp_path, "CREATE TABLE dv (id int PRIMARY KEY, v text, big text);"
            " ALTER TABLE dv ALTER COLUMN big SET STORAGE EXTERNAL",
            (f"INSERT INTO dv SELECT g, 'v', CASE WHEN g % 10 = 0 THEN {big} ELSE 'small' END"
             " FROM generate_series(1, 200) g",),
            ("UPDATE dv SET v = 'w' WHERE id % 10 = 0", "DELETE FROM dv WHERE id % 17 = 0",
             "UPDATE dv SET id = id + 1000 WHERE id % 23 = 0"),
            ("UPDATE dv SET v = 'x' WHERE id % 10 = 0 OR id > 1000", "DELETE FROM dv WHERE id % 13 = 0",
             "INSERT INTO dv VALUES (5000, 'new', 'n')"),
            runs_before=(1, 2))
    finally:
        spark.conf.unset(default)
    path = mirror_path(str(tmp_path / "target"), "public", "dv")
    merges = [r["operationMetrics"] for r in spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()
              if r["operation"] == "MERGE"]
    assert [(m["numTargetDeletionVectorsAdded"] != "0", m["numTargetFilesRemoved"]) for m in merges] == \
        [(True, "0"), (True, "1")]
    assert merges[1]["numTargetDeletionVectorsUpdated"] == "1"


def test_a_table_keyed_by_an_array_joins_the_buckets_its_key_changes_move_rows_between(spark, pg15, tmp_path,
                                                                                         caplog):
    """Keys that cannot be hashed alike in every task (an array: `keys.key_hashes` reads only
    fixed-width and byte-string columns) are not netted in halves: the buckets an update moves
    a row between are joined into one task (`rows.moved_buckets`). Tasks of 40 change rows; key
    changes, a swap through a third key, deletes and updates of moved rows, in a run after the
    one that filled the mirror."""
    with caplog.at_level(logging.INFO, logger="pgoutput_spark"):
        _, results = _small_case(
            spark, pg15, tmp_path, "CREATE TABLE ak (id int[] PRIMARY KEY, v text)",
            ("INSERT INTO ak SELECT ARRAY[g, g % 3], 'v' FROM generate_series(1, 100) g",),
            ("UPDATE ak SET id = ARRAY[id[1] + 1000], v = 'moved' WHERE id[1] % 3 = 0",
             "UPDATE ak SET id = '{-1}' WHERE id = ARRAY[1, 1]", "UPDATE ak SET id = ARRAY[1, 1] WHERE id = '{2, 2}'",
             "UPDATE ak SET id = '{2, 2}' WHERE id = '{-1}'", "DELETE FROM ak WHERE id[1] % 7 = 0",
             "UPDATE ak SET v = 'w' WHERE id[1] < 1050"),
            runs_before=(1,), net_task_rows=40)
    assert [[(t.table, t.tasks > 1, t.skipped) for t in r.tables] for r in results] == [[("public.ak", True, 0)]] * 2
    # Looked for in the run with updates, where the other tables' keys are netted in halves.
    assert sum("public.ak: updates that move rows between keys" in r.getMessage() for r in caplog.records) == 1


def test_a_multiset_update_of_a_row_the_mirror_never_had_is_netted_again_without_its_new_row(spark, pg15, tmp_path,
                                                                                             caplog):
    """Netted in halves, an update of a row the mirror does not have cannot be told apart from
    one whose row another task's bucket would have had: its bucket says so, and the table is
    netted again in as many tasks with that update skipped, its new row left out where it went;
    a second update of that new row then misses it too, and a third pass skips both. The
    subscriber's result comes out. The oracle is a twin table, not published, that took the
    same statements from empty, as a subscriber's table from an empty start does. Two runs:
    into a new mirror (netted as its rows are converted), then looking rows up in it. Tasks of
    20 change rows (`apply.net_task_rows`)."""
    db = new_database(pg15, "halves_missing")
    pg15.execute("CREATE TABLE ms (a int, b text); ALTER TABLE ms REPLICA IDENTITY FULL;"
                 " CREATE TABLE twin (a int, b text);"
                 " INSERT INTO ms SELECT g % 5, 'before ' || g FROM generate_series(1, 20) g;"
                 " CREATE PUBLICATION pub FOR TABLE ms", dbname=db)
    slot = f"{db}_slot"
    pg15.create_slot(slot, dbname=db)
    runs = [("INSERT INTO {} SELECT g % 5, 'x' FROM generate_series(1, 40) g",
             "UPDATE {} SET b = 'moved' || b WHERE b LIKE 'before%' AND a < 3",  # rows never captured
             "UPDATE {} SET b = b || '?' WHERE b LIKE 'moved%'"),  # their new rows, moved on
            ("UPDATE {} SET a = a + 5 WHERE b = 'x' AND a = 1",
             "UPDATE {} SET b = b || '!' WHERE b LIKE 'moved%'",
             "DELETE FROM {} WHERE a = 2")]
    twins = []
    for statements in runs:
        for statement in statements:
            for table in ("ms", "twin"):
                pg15.execute(statement.format(table), dbname=db)
        twins.append(Counter(pg15.query("SELECT a, b FROM twin", dbname=db)))
    messages = pg15.peek_pgoutput(slot, publications=["pub"], proto_version=1, dbname=db)
    pg15.drop_slot(slot, dbname=db)
    cut = [i for i, m in enumerate(messages) if m.data[:1] == b"B"][len(runs[0])]
    target = str(tmp_path / "target")
    # Skipped: the 12 updates of 'before' rows (a < 3 of 20) and the 12 of their new rows; then
    # those 12 updated again, and the 4 deletes of those with a = 2. Passes: three, then two.
    for k, (part, twin, skipped, passes) in enumerate(zip((messages[:cut], messages[cut:]), twins, (24, 16),
                                                          (3, 2))):
        _land(part, tmp_path, tmp_path / "landing", k)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="pgoutput_spark"):
            result = run_apply(spark, read_capture(spark, str(tmp_path / "landing")), target, net_task_rows=20)
        (table,) = result.tables
        assert (table.tasks > 1, table.skipped) == (True, skipped)
        again = [r.getMessage() for r in caplog.records if "netted again" in r.getMessage()]
        assert len(again) == passes - 1 and all("without their new rows" in m for m in again), again
        mirror = spark.read.format("delta").load(mirror_path(target, "public", "ms")).collect()
        assert Counter(tuple(r) for r in mirror) == twin


def _big_and_side(pg: PgCluster, prefix: str) -> tuple[str, str, dict[str, Any]]:
    """A database with tables ``big`` and ``side`` published, a slot, and the peek options that
    stream with protocol 2: (database, slot, options)."""
    db = new_database(pg, prefix)
    pg.execute("CREATE TABLE big (id int PRIMARY KEY, pad text); CREATE TABLE side (id int PRIMARY KEY, v text);"
               " CREATE PUBLICATION pub_main FOR ALL TABLES", dbname=db)
    slot = f"{db}_slot"
    pg.create_slot(slot, dbname=db)
    return db, slot, {"publications": ["pub_main"], "proto_version": 2, "streaming": "on", "dbname": db}


def _two_orphans(pg: PgCluster, prefix: str) -> tuple[str, str, dict[str, Any], Driver, list[CapturedMessage]]:
    """Two streamed transactions, unfinished, between committed ones, as a peek of the slot
    sees them; then both roll back and three more transactions commit. Returns `_big_and_side`'s
    (database, slot, peek options), the driver (its workload) and the peek's messages."""
    db, slot, streaming = _big_and_side(pg, prefix)
    d = Driver(pg, db)
    try:
        d.txn("INSERT INTO side VALUES (1, 'before')")
        orphans = [d.session(), d.session()]
        pad = "repeat(md5(g::text), 8)"  # 400 rows of it pass logical_decoding_work_mem (64kB)
        for i, orphan in enumerate(orphans):
            orphan.execute(f"INSERT INTO big SELECT g, {pad} FROM generate_series({i * 1000}, {i * 1000 + 399}) g")
        d.txn("INSERT INTO side VALUES (2, 'beside')")
        first = pg.peek_pgoutput(slot, **streaming)
        for orphan in orphans:
            orphan.rollback()
            orphan.close()
        d.txn("UPDATE side SET v = 'after' WHERE id = 1")
        d.txn("INSERT INTO big VALUES (5000, 'committed')")
        d.txn("UPDATE side SET v = 'last' WHERE id = 2")
    finally:
        d.close()
    return db, slot, streaming, d, first


@pytest.mark.parametrize("resent, runs", [("streamed", 1), ("streamed", 2), ("whole", 2)])
def test_transactions_sent_again_after_a_reconnect_are_applied_once(spark, pg15, tmp_path, resent, runs):
    """A landing that keeps what a walsender sent before a reconnect as well as after it.

    The first session sends a transaction's first stream segments and part of a plain
    transaction, then ends; the consumer had confirmed only the transaction before them. The
    second session (a peek after `pg_replication_slot_advance` to that point) sends the plain
    one again whole, and streams the unfinished one again from its first segment, or sends it
    whole at its commit (that session without streaming). The apply worker drops what it had
    spooled of both; so must the mirrors, in one run or two, and nothing of them stays open.
    """
    db, slot, streaming = _big_and_side(pg15, "apply_resent")
    d = Driver(pg15, db)
    try:
        d.txn("INSERT INTO side VALUES (1, 'confirmed')")
        streamed = d.session()
        pad = "repeat(md5(g::text), 8)"  # 400 rows of it pass logical_decoding_work_mem (64kB)
        streamed.execute(f"INSERT INTO big SELECT g, {pad} FROM generate_series(1, 400) g")
        streamed.execute("SAVEPOINT s")
        streamed.execute(f"INSERT INTO big SELECT g, {pad} FROM generate_series(1000, 1400) g")
        d.txn("INSERT INTO side VALUES (2, 'cut off'), (3, 'cut off'), (4, 'cut off')")
        first = pg15.peek_pgoutput(slot, **streaming)
        streamed.execute("ROLLBACK TO s")
        streamed.execute("UPDATE big SET pad = 'changed' WHERE id <= 10")
        d.txn("DELETE FROM big WHERE id > 390", conn=streamed)
        streamed.close()
        d.txn("UPDATE side SET v = 'after' WHERE id IN (1, 2)")
    finally:
        d.close()
    kinds = [m.data[:1] for m in first]
    begins = [i for i, k in enumerate(kinds) if k == b"B"]
    assert b"S" in kinds and b"c" not in kinds and len(begins) == 2  # the stream is unfinished
    confirmed = decode_message(first[kinds.index(b"C")].data).end_lsn  # type: ignore[attr-defined]
    cut = begins[1] + 3  # the second plain transaction's Begin and two of its three inserts
    pg15.query("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (slot, str(Lsn(confirmed))), dbname=db)
    options = streaming if resent == "streamed" else {**streaming, "proto_version": 1, "streaming": None}
    again = pg15.peek_pgoutput(slot, seq_start=cut, **options)
    pg15.drop_slot(slot, dbname=db)
    xid = decode_message(first[kinds.index(b"S")].data).xid  # type: ignore[attr-defined]
    starts = [decode_message(m.data) for m in again if m.data[:1] == (b"S" if resent == "streamed" else b"B")]
    # Sent again from its start: one first segment (or one Begin) of it.
    assert [s.xid for s in starts if getattr(s, "first_segment", True)].count(xid) == 1  # type: ignore[attr-defined]
    _, results = _apply_and_compare(spark, first[:cut] + again, d.workload, tmp_path, [cut],
                                    run_after={0} if runs == 2 else set())
    assert [r.open_rows > 0 for r in results] == [True] * (runs - 1) + [False]


def test_streamed_transactions_a_session_left_open_are_forgotten_on_request(spark, pg15, tmp_path):
    """A walsender session ends inside two streamed transactions, which then abort. The next
    session (a peek after `pg_replication_slot_advance` to the last commit the first sent)
    sends neither again, nor their Stream Aborts: the apply worker forgot them with its
    session, but a capture has no session boundary, so they stay open in ``pending`` run after
    run, as `status` shows. PostgreSQL reports them aborted; ``forget_xids`` then deletes their
    rows: one in a run with nothing new, the other in a run that applies the rest. An xid that
    is not open fails the run before anything is written. The mirrors equal the source tables;
    the change tables of the `changes` job, which forgets them too, hold the committed changes.
    """
    from pgoutput_spark.errors import ConfigError
    from pgoutput_spark.spark.pending import ForgottenStream

    db, slot, streaming, d, first = _two_orphans(pg15, "apply_orphans")
    kinds = [m.data[:1] for m in first]
    xids = sorted({decode_message(m.data).xid for m in first if m.data[:1] == b"S"})  # type: ignore[attr-defined]
    assert len(xids) == 2 and b"c" not in kinds and b"A" not in kinds  # both streamed, neither ended
    confirmed = decode_message(first[len(kinds) - 1 - kinds[::-1].index(b"C")].data).end_lsn  # type: ignore[attr-defined]
    pg15.query("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (slot, str(Lsn(confirmed))), dbname=db)
    second = pg15.peek_pgoutput(slot, seq_start=len(first), **streaming)
    pg15.drop_slot(slot, dbname=db)
    assert not [m for m in second if m.data[:1] in (b"S", b"A")]  # never sent again, nor aborted
    assert [r[0] for r in pg15.query("SELECT pg_xact_status(x::text::xid8) FROM unnest(%s::bigint[]) x",
                                     (xids,), dbname=db)] == ["aborted", "aborted"]
    cut = len(first) + [m.data[:1] for m in second].index(b"C") + 1  # the second session's first commit
    messages = first + second
    _, results = _apply_and_compare(spark, messages[:cut], d.workload, tmp_path, [len(first)], run_after={0})
    assert [r.open_rows > 0 for r in results] == [True, True]
    target, landing = str(tmp_path / "target"), tmp_path / "landing"
    opened = status(spark, target).open_transactions
    assert [(kind, xid) for kind, xid, *_ in opened] == [("streamed", xid) for xid in xids], opened
    firsts = {xid: (seq, rows) for _, xid, seq, _, rows in opened}
    assert (f"streamed and open across runs: {xids[0]}, {xids[1]}. One that its walsender session left behind "
            f"is never sent again: if PostgreSQL reports it aborted (SELECT pg_xact_status('{xids[0]}'::xid8)), "
            f"forget it (apply --forget-xid {xids[0]}), or let the runs ask it and forget what it reports aborted "
            f"(apply --forget-aborted --dsn DSN)") in status(spark, target).render()
    feed = str(tmp_path / "feed")

    def apply(*forget: int) -> ApplyResult:
        return run_apply(spark, read_capture(spark, str(landing)), target, forget_xids=forget)

    def changes(*forget: int) -> Any:
        return run_changes(spark, read_capture(spark, str(landing)), feed, forget_xids=forget)

    assert changes().open_rows == sum(rows for _, rows in firsts.values())

    with pytest.raises(ConfigError, match=rf"forget_xids: {xids[1] + 1} is not a streamed transaction open at "
                                          rf"the target's position \(seq {results[-1].hi}\); open ones: {xids[0]} "):
        apply(xids[0], xids[1] + 1)
    assert status(spark, target).open_transactions == opened  # nothing forgotten, the lease handed back
    alone = apply(xids[0])  # nothing new in the capture: a run that only forgets
    assert (alone.lo, alone.hi, alone.tables) == (results[-1].hi, results[-1].hi, [])
    assert alone.forgotten == (ForgottenStream(xids[0], *firsts[xids[0]]),)
    assert f"forgotten (forget_xids): streamed transaction {xids[0]}" in alone.render()
    state = status(spark, target)
    assert [xid for _, xid, *_ in state.open_transactions] == [xids[1]] and not state.running
    assert state.runs[-1]["forgotten"] == [{"xid": xids[0], "first_seq": firsts[xids[0]][0],
                                            "rows": firsts[xids[0]][1]}]
    assert f"forgot streamed transaction {xids[0]}" in state.render()
    fed = changes(xids[0])
    assert (fed.lo, fed.hi, fed.forgotten, fed.open_rows) == (alone.lo, alone.lo, alone.forgotten, 0)
    _land(messages[cut:], tmp_path, landing, 2)
    fed = changes(xids[1])
    assert fed.forgotten == (ForgottenStream(xids[1], *firsts[xids[1]]),) and fed.open_rows == 0
    assert fed.changes == {"public.big": 1, "public.side": 1}  # the rest: the statements committed after the cut
    assert [tuple(r) for r in spark.read.format("delta").load(f"{feed}/_changes/public/big")
            .select("_op", "id").collect()] == [("insert", 5000)]
    rest = apply(xids[1])
    assert rest.forgotten == (ForgottenStream(xids[1], *firsts[xids[1]]),) and rest.open_rows == 0
    assert rest.hi == messages[-1].seq and {t.table for t in rest.tables} == {"public.big", "public.side"}
    assert status(spark, target).open_transactions == [] and _saved_open_rows(spark, target) == set()
    with pytest.raises(ConfigError, match=r"open ones: none"):
        apply(xids[1])
    assert apply().skipped
    for table, columns in (("big", "id, pad"), ("side", "id, v")):
        mirror = spark.read.format("delta").load(mirror_path(target, "public", table)).collect()
        assert sorted(tuple(r) for r in mirror) == sorted(pg15.query(f"SELECT {columns} FROM {table}", dbname=db))


def test_runs_that_ask_postgresql_forget_the_streamed_transactions_it_reports_aborted(spark, pg15, tmp_path):
    """``forget_aborted``: the runs ask the source server about the streamed transactions open
    at the target's position. Two transactions stream in a walsender session that then ends;
    one aborts, the other goes on. The next session sends neither (the first aborted, the
    second has sent nothing new). A run that asks forgets the aborted one and keeps the other,
    which PostgreSQL reports in progress, saying so; the `changes` job likewise. That one then
    commits: a third session sends it (whole, or streamed again from its first segment), a run
    that asks hears PostgreSQL report it committed and keeps it to apply its commit, and the
    mirrors hold its rows, equal to PostgreSQL's tables after every run; nothing stays open."""
    from pgoutput_spark.spark.pending import ForgottenStream

    db, slot, streaming = _big_and_side(pg15, "apply_ask")
    dsn = pg15.conninfo(db)
    d = Driver(pg15, db)
    try:
        d.txn("INSERT INTO side VALUES (1, 'before')")
        aborts, goes_on = d.session(), d.session()
        pad = "repeat(md5(g::text), 8)"  # 400 rows of it pass logical_decoding_work_mem (64kB)
        for i, orphan in enumerate((aborts, goes_on)):
            orphan.execute(f"INSERT INTO big SELECT g, {pad} FROM generate_series({i * 1000}, {i * 1000 + 399}) g")
        d.txn("INSERT INTO side VALUES (2, 'beside')")
        first = pg15.peek_pgoutput(slot, **streaming)
        aborts.rollback()
        aborts.close()
        d.txn("UPDATE side SET v = 'after' WHERE id = 1")
        xids = [decode_message(m.data).xid for m in first if m.data[:1] == b"S"]  # type: ignore[attr-defined]
        assert len(set(xids)) == 2 and not [m for m in first if m.data[:1] in (b"c", b"A")]
        aborted, open_xid = sorted(set(xids), key=xids.index)  # streamed in that order
        kinds = [m.data[:1] for m in first]
        confirmed = decode_message(first[len(kinds) - 1 - kinds[::-1].index(b"C")].data).end_lsn  # type: ignore[attr-defined]
        pg15.query("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (slot, str(Lsn(confirmed))), dbname=db)
        second = pg15.peek_pgoutput(slot, seq_start=len(first), **streaming)
        assert not [m for m in second if m.data[:1] in (b"S", b"A")]  # neither sent again, nor aborted
        messages = first + second
        _, results = _apply_and_compare(spark, messages, d.workload, tmp_path, [len(first)], run_after={0})
        target, landing, feed = str(tmp_path / "target"), tmp_path / "landing", str(tmp_path / "feed")
        firsts = {xid: (seq, rows) for _, xid, seq, _, rows in status(spark, target).open_transactions}
        assert sorted(firsts) == sorted(set(xids))

        said: list[str] = []
        asked = run_apply(spark, read_capture(spark, str(landing)), target, forget_aborted=dsn, progress=said.append)
        assert (asked.lo, asked.hi, asked.tables) == (results[-1].hi, results[-1].hi, [])  # nothing new: forgets only
        assert asked.forgotten == (ForgottenStream(aborted, *firsts[aborted], asked=True),)
        assert f"forgotten (PostgreSQL reports it aborted): streamed transaction {aborted}" in asked.render()
        assert f"kept open (forget_aborted): streamed transaction {open_xid}, open since seq " \
               f"{firsts[open_xid][0]}, {firsts[open_xid][1]} rows: PostgreSQL reports it in progress" in said
        assert [xid for _, xid, *_ in status(spark, target).open_transactions] == [open_xid]
        assert run_changes(spark, read_capture(spark, str(landing)), feed).open_rows == sum(
            rows for _, rows in firsts.values())
        fed = run_changes(spark, read_capture(spark, str(landing)), feed, forget_aborted=dsn)
        assert fed.forgotten == asked.forgotten and fed.hi == asked.hi  # nothing new: forgets only

        d.txn(conn=goes_on)  # its 400 rows commit
        goes_on.close()
        pg15.query("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)",
                   (slot, str(Lsn(decode_message(second[-1].data).end_lsn))), dbname=db)  # type: ignore[attr-defined]
        third = pg15.peek_pgoutput(slot, seq_start=messages[-1].seq + 1, **streaming)
        pg15.drop_slot(slot, dbname=db)
    finally:
        d.close()
    assert open_xid in {decode_message(m.data).xid for m in third if m.data[:1] in (b"B", b"c")}  # type: ignore[attr-defined]
    _land(third, tmp_path, landing, 2)
    said.clear()
    rest = run_apply(spark, read_capture(spark, str(landing)), target, forget_aborted=dsn, progress=said.append)
    assert rest.forgotten == () and rest.open_rows == 0 and rest.hi == third[-1].seq
    assert [line for line in said if "kept open" in line] == [  # asked before the run reads its commit
        f"kept open (forget_aborted): streamed transaction {open_xid}, open since seq {firsts[open_xid][0]}, "
        f"{firsts[open_xid][1]} rows: PostgreSQL reports it committed"]
    assert status(spark, target).open_transactions == []
    fed = run_changes(spark, read_capture(spark, str(landing)), feed, forget_aborted=dsn)
    assert fed.forgotten == () and fed.open_rows == 0 and fed.changes == {"public.big": 400}
    expected, what = _expected_at(d.workload, CaptureIndex(messages + third), rest.to_lsn)
    Mirrors(spark, target, d.workload).assert_equal(expected, f"the last run, after {what}")
    for table, columns in (("big", "id, pad"), ("side", "id, v")):
        mirror = spark.read.format("delta").load(mirror_path(target, "public", table)).collect()
        assert sorted(tuple(r) for r in mirror) == sorted(pg15.query(f"SELECT {columns} FROM {table}", dbname=db))


@pytest.mark.parametrize("cut, runs", [("inside-a-block", 2), ("between-blocks", 1)])
def test_a_capture_naming_its_walsender_sessions_forgets_what_a_session_left_open(spark, pg15, tmp_path, cut, runs):
    """A landing that records which walsender session sent each message (its ``session``
    column). The first session streams two transactions and ends, inside the last stream
    block (the consumer had confirmed the commit before them) or after it (the one after
    them); both then abort. The second (a peek after `pg_replication_slot_advance` to that
    commit) sends again what committed after it: in the first case the two transactions too,
    from their first segment, and their Stream Aborts; in the second, neither. The apply
    worker forgets what the first session left open (a block cut off, the two transactions)
    with the session; so do the runs, where the session changes (between two runs, which
    then carry the session in the lease, or inside a run), with nothing asked of them: the
    mirrors equal PostgreSQL's tables after each run, nothing stays open, and the `changes`
    job agrees. (A session that begins inside a run's slice and inside a stream block:
    `test_decode.py`.)
    """
    db, slot, streaming, d, first = _two_orphans(pg15, "apply_sessions")
    kinds = [m.data[:1] for m in first]
    last_block = len(kinds) - 1 - kinds[::-1].index(b"S")
    ended = last_block + 3 if cut == "inside-a-block" else len(first)  # two changes into the block, or all
    assert (b"E" in kinds[last_block:ended]) == (cut == "between-blocks") and b"c" not in kinds
    confirmed = [decode_message(m.data).end_lsn for m in first[:ended] if m.data[:1] == b"C"][-1]  # type: ignore[attr-defined]
    pg15.query("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (slot, str(Lsn(confirmed))), dbname=db)
    second = pg15.peek_pgoutput(slot, seq_start=ended, **streaming)
    pg15.drop_slot(slot, dbname=db)
    again = {decode_message(m.data).xid for m in second if m.data[:1] in (b"S", b"A")}  # type: ignore[attr-defined]
    streamed = {decode_message(m.data).xid for m in first if m.data[:1] == b"S"}  # type: ignore[attr-defined]
    # Confirmed before the two began, the second session streams them again and aborts them;
    # after them, it sends neither, nor their Stream Aborts.
    assert len(streamed) == 2 and again == (streamed if cut == "inside-a-block" else set())
    messages = first[:ended] + second
    landing, target, feed = tmp_path / "landing", str(tmp_path / "target"), str(tmp_path / "feed")
    landing.mkdir()
    # Files cut where the session changes (two runs), or inside the second session (one run).
    cuts = [0, ended, len(messages)] if runs == 2 else [0, ended + len(second) // 2, len(messages)]
    index, mirrors, columns = CaptureIndex(messages), Mirrors(spark, target, d.workload), CaptureColumns(
        session="session_id")
    results: list[ApplyResult] = []
    for k, (lo, hi) in enumerate(zip(cuts, cuts[1:])):
        part = messages[lo:hi]
        pq.write_table(pa.table({
            "seq": [m.seq for m in part], "lsn": [m.lsn for m in part], "data": [m.data for m in part],
            "session_id": [f"walsender-{1 if m.seq < ended else 2}" for m in part]}), landing / f"part-{k}.parquet")
        if runs == 1 and hi != len(messages):
            continue
        said: list[str] = []
        result = run_apply(spark, read_capture(spark, str(landing)), target, columns=columns, progress=said.append)
        results.append(result)
        applied = [r.to_lsn for r in results if r.to_lsn is not None][-1]
        mirrors.assert_equal(*_expected_at(d.workload, index, applied))
        forgotten = sorted(int(line.split()[2]) for line in said if "was open when its walsender session ended" in line)
        assert forgotten == (sorted(streamed) if hi == len(messages) else []), said  # the run where session 2 begins
    assert [r.open_rows > 0 for r in results] == [True] * (runs - 1) + [False]
    state = status(spark, target)
    # Nothing open; the rows the first of two runs saved stay until a run saves its own.
    assert state.open_transactions == [] and _saved_open_rows(spark, target) <= {results[-1].lo}
    assert (state.read_point, state.position) == (results[-1].to_lsn, messages[-1].seq)
    for table, names in (("big", "id, pad"), ("side", "id, v")):
        mirror = spark.read.format("delta").load(mirror_path(target, "public", table)).collect()
        assert sorted(tuple(r) for r in mirror) == sorted(pg15.query(f"SELECT {names} FROM {table}", dbname=db))
    assert run_apply(spark, read_capture(spark, str(landing)), target, columns=columns).skipped
    said = []
    fed = run_changes(spark, read_capture(spark, str(landing)), feed, columns=columns, progress=said.append)
    assert sorted(int(line.split()[2]) for line in said if "walsender session ended" in line) == sorted(streamed)
    assert fed.open_rows == 0 and fed.changes == {"public.big": 1, "public.side": 4}  # each statement's rows once
    assert [tuple(r) for r in spark.read.format("delta").load(f"{feed}/_changes/public/big")
            .select("_op", "id").collect()] == [("insert", 5000)]


@pytest.mark.parametrize("server", ["pg15", "pg16"])
def test_capture_lands_transactions_between_streamed_ones_that_stay_open(spark, server, request, tmp_path,
                                                                           monkeypatch):
    """Streamed transactions that overlap without a pause, landed by `capture_slot`.

    Two transactions are streamed and stay open while small ones commit, so a streamed read
    finds no end outside an open stream: the capture reads the chunk again without streaming
    and lands the small ones (before, it landed nothing until no stream was open). On
    PostgreSQL 15 it does so on reaching the server's end; on 16 the read window is made small
    enough to be exhausted first. Then one of the two aborts, the other rolls back a savepoint
    and commits; both come in a later chunk, streamed. The mirrors equal PostgreSQL's tables
    after each capture's run, and nothing stays open.
    """
    from pgoutput_spark.slot import capture as capture_module

    pg: PgCluster = request.getfixturevalue(server)
    options: dict[str, Any] = ({"proto_version": 2, "streaming": "on"} if server == "pg15"
                               else {"proto_version": 4, "streaming": "parallel"})
    if server == "pg16":
        monkeypatch.setattr(capture_module, "_UNSTREAMED_MIN", 0)  # 10 chunks of 4 messages
    db = new_database(pg, "capture_open")
    pg.execute("CREATE TABLE big (id int PRIMARY KEY, pad text); CREATE TABLE side (id int PRIMARY KEY, v text);"
               " CREATE PUBLICATION pub_main FOR ALL TABLES", dbname=db)
    slot, landing, progress = f"{db}_slot", tmp_path / "landing", []
    pg.create_slot(slot, dbname=db)

    def capture() -> Any:
        return capture_slot(str(landing), slot=slot, dsn=pg.conninfo(db), publications=["pub_main"],
                            chunk_size=4, progress=progress.append, **options)

    d = Driver(pg, db)
    try:
        pad = "repeat(md5(g::text), 8)"  # 400 rows of it pass logical_decoding_work_mem (64kB)
        kept, aborted = d.session(), d.session()
        for i in range(8):  # both streamed from the third round or so, small ones in between
            kept.execute(f"INSERT INTO big SELECT g, {pad} FROM generate_series({i * 100}, {i * 100 + 59}) g")
            aborted.execute(f"INSERT INTO big SELECT g, {pad} FROM generate_series({i * 100 + 60}, {i * 100 + 99}) g")
            d.txn(f"INSERT INTO side VALUES ({i}, 'small')")
        first = capture()
        aborted.rollback()
        aborted.close()
        kept.execute("SAVEPOINT s")
        kept.execute(f"INSERT INTO big SELECT g, {pad} FROM generate_series(2000, 2400) g")
        kept.execute("ROLLBACK TO s")
        kept.execute("UPDATE big SET pad = 'changed' WHERE id <= 10")
        d.txn("INSERT INTO side VALUES (100, 'after')")
        d.txn("DELETE FROM big WHERE id % 7 = 0", conn=kept)
        kept.close()
        d.txn("UPDATE side SET v = 'last' WHERE id < 3")
        second = capture()
    finally:
        d.close()
    pg.drop_slot(slot, dbname=db)

    assert first.caught_up and second.caught_up and first.chunks
    unstreamed = [p for p in progress[:len(first.chunks)] if p.overlapping]
    most = max(p.overlapping for p in unstreamed)
    assert 40 <= most < 300 if server == "pg16" else most > 300  # the window, or all there was
    assert f"; read without streaming: streamed transactions overlapped through all {most:,} messages read" \
        in max(unstreamed, key=lambda p: p.overlapping).render()
    landed = pa.concat_tables(pq.read_table(part) for part in sorted(landing.glob("part-*.parquet")))
    messages = [CapturedMessage(**row) for row in landed.to_pylist()]
    assert [m.seq for m in messages] == list(range(len(messages)))
    kinds = [m.data[:1] for m in messages]
    in_first = kinds[:first.chunks[-1].last_seq + 1]
    assert b"S" not in in_first and in_first.count(b"C") == 8  # the small ones; the open ones later
    if server == "pg15":  # streamed again once no stream overlaps (on 16 the window stays too small)
        assert b"S" in kinds[first.chunks[-1].last_seq + 1:]
    chunks = first.chunks + second.chunks
    _, results = _apply_and_compare(spark, messages, d.workload, tmp_path / "apply",
                                    [c.first_seq for c in chunks[1:]], run_after={len(first.chunks) - 1})
    assert len(results) == 2 and results[-1].open_rows == 0


def test_a_capture_landing_missing_a_file_fails_the_run_naming_its_seqs(spark, pg15, tmp_path, capsys):
    """A landing of ``pgoutput-spark capture`` numbers its messages one after another from 0: a
    chunk file deleted (or expired) before a run applied it is a gap, and the mirrors would miss
    its transactions. The run fails naming the seqs, before anything is written; with
    ``--allow-seq-gaps`` it applies the rest, as the apply of any other landing does. The
    changes job checks too."""
    from pgoutput_spark.cli import main
    from pgoutput_spark.errors import CaptureError

    db = new_database(pg15, "gaps")
    pg15.execute("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t", dbname=db)
    slot = f"{db}_slot"
    pg15.create_slot(slot, dbname=db)
    for i in range(4):
        pg15.execute(f"INSERT INTO t SELECT g, 'v' FROM generate_series({10 * i + 1}, {10 * i + 10}) g", dbname=db)
    landing, target = str(tmp_path / "landing"), str(tmp_path / "target")
    capture_slot(landing, slot=slot, dsn=pg15.conninfo(db), publications=["pub"], chunk_size=5)
    pg15.drop_slot(slot, dbname=db)
    parts = sorted(Path(landing).glob("part-*.parquet"))
    assert len(parts) >= 3
    seqs = pq.read_table(parts[1], columns=["seq"]).column("seq").to_pylist()
    ids = {r[0] for r in pg15.query("SELECT id FROM t", dbname=db)}
    gone = {int(decode_message(m).new_tuple[0].value) for m in pq.read_table(parts[1]).column("data").to_pylist()
            if m[:1] == b"I"}
    parts[1].unlink()
    last = max(pq.read_table(parts[-1], columns=["seq"]).column("seq").to_pylist())
    with pytest.raises(CaptureError, match=rf"the capture {landing} misses {len(seqs)} of the seqs 0 to {last} "
                                           rf"this run would apply \(first: seqs {seqs[0]} to {seqs[-1]}\)"):
        run_apply(spark, read_capture(spark, landing), target)
    assert status(spark, target).runs == [] and not Path(mirror_path(target, "public", "t")).exists()
    # A frame derived from the landing's is any frame: gaps allowed unless asked for.
    assert run_apply(spark, read_capture(spark, landing).where("seq >= 0"), str(tmp_path / "other")).hi == last
    args = ["apply", "--capture", landing, "--target", target, "--master", "local[2]"]
    assert main(args) == 1
    assert f"misses {len(seqs)} of the seqs" in capsys.readouterr().err
    assert main([*args, "--allow-seq-gaps"]) == 0
    mirror = {r[0] for r in spark.read.format("delta").load(mirror_path(target, "public", "t")).collect()}
    assert gone and mirror == ids - gone
    # The changes job checks the same way, before it records its run.
    changes = str(tmp_path / "changes")
    with pytest.raises(CaptureError, match=rf"misses {len(seqs)} of the seqs 0 to {last} .* start the change "
                                           r"tables over in a new target, or run with --allow-seq-gaps"):
        run_changes(spark, read_capture(spark, landing), changes)
    assert not Path(changes).exists()
    assert run_changes(spark, read_capture(spark, landing), changes, seq_gaps="allow").hi == last


def test_a_runs_last_commit_time_is_the_one_postgresql_prints_and_status_shows_it(spark, pg15, tmp_path, capsys):
    """`ApplyResult.to_commit_ts`, `_runs`' ``to_commit_ts`` and `status`'s read point time are the
    source commit time of the run's last commit: test_decoding's ``include-timestamp`` on a slot
    created beside the capture's prints it for each transaction."""
    from pgoutput_spark.cli import main

    db = new_database(pg15, "commit_time")
    pg15.execute("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t", dbname=db)
    pg15.create_slot(f"{db}_p", dbname=db)
    pg15.create_slot(f"{db}_td", plugin="test_decoding", dbname=db)
    for k in range(3):  # three transactions, a little apart
        pg15.execute(f"INSERT INTO t VALUES ({k}, 'v{k}'); UPDATE t SET v = v || '!'; SELECT pg_sleep(0.05)",
                     dbname=db)
    messages = pg15.peek_pgoutput(f"{db}_p", publications=["pub"], proto_version=1, dbname=db)
    printed = [text for _, _, text in pg15.peek_test_decoding(
        f"{db}_td", options={"include-timestamp": "1", "skip-empty-xacts": "1"}, dbname=db)
        if text.startswith("COMMIT")]
    times = [datetime.fromisoformat(text.split(" (at ", 1)[1].rstrip(")")) for text in printed]
    assert len(times) == 3 and times == sorted(times) and len(set(times)) == 3
    for name in (f"{db}_p", f"{db}_td"):
        pg15.drop_slot(name, dbname=db)

    landing, target = tmp_path / "landing", str(tmp_path / "target")
    begins = [i for i, m in enumerate(messages) if m.data[:1] == b"B"]
    _land(messages[:begins[2]], tmp_path, landing, 0)  # the first two transactions
    first = run_apply(spark, read_capture(spark, str(landing)), target)
    assert first.to_commit_ts == times[1]
    assert status(spark, target).read_point_time == times[1]
    _land(messages[begins[2]:], tmp_path, landing, 1)
    second = run_apply(spark, read_capture(spark, str(landing)), target)
    assert second.to_commit_ts == times[2] and status(spark, target).read_point_time == times[2]
    assert run_apply(spark, read_capture(spark, str(landing)), target).skipped
    assert status(spark, target).read_point_time == times[2]  # a run with nothing new keeps it
    recorded = spark.read.format("delta").load(f"{target}/_runs").orderBy("hi_seq") \
        .select(F.unix_micros("to_commit_ts")).collect()
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    assert [r[0] for r in recorded] == [(t - epoch) // timedelta(microseconds=1) for t in times[1:]]

    assert main(["status", "--target", target]) == 0
    at = times[2].astimezone(timezone.utc)
    assert f"consistent read point: {Lsn(second.to_lsn)} (committed {at:%Y-%m-%d %H:%M:%S.%f} UTC)\n" \
        in capsys.readouterr().out
    assert f"(the last committed {at:%Y-%m-%d %H:%M:%S.%f} UTC)" in second.render()
