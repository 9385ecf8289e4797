"""`pgoutput-spark capture` against real PostgreSQL 15 and 16 servers.

The oracle is the server itself: a second slot created next to the captured
one sees the same transactions, and PostgreSQL's own
``pg_logical_slot_peek_binary_changes`` on it gives the expected bytes.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from pgoutput_spark import decode_message
from pgoutput_spark.cli import main
from pgoutput_spark.errors import CaptureError
from pgoutput_spark.lsn import Lsn
from pgoutput_spark.slot.capture import capture_slot
from pgoutput_spark.slot.landing import CAPTURE_SCHEMA, LANDING_INFO_FILE, ChunkFile
from pgoutput_spark.slot.settings import SESSION_SETTINGS
from pgoutput_spark.testing.pgcluster import PgCluster

from ..plugins.postgres import new_cluster, new_database, standby_snapshots, zonky_bindir
from ..plugins.s3 import Bucket

pytestmark = pytest.mark.postgres

PUB = "cap_pub"


def _setup(pg: PgCluster, *, slots: tuple[str, ...], two_phase: bool = False) -> str:
    """A database with tables t and u in publication PUB, and slots named ``<db>_<slot>``
    (slot names are cluster-wide)."""
    db = new_database(pg, "capture")
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE TABLE u (id int, w text);"
               f" CREATE PUBLICATION {PUB} FOR TABLE t, u", dbname=db)
    for slot in slots:
        pg.create_slot(f"{db}_{slot}", two_phase=two_phase, dbname=db)
    return db


def _plain_workload(pg: PgCluster, db: str, start: int) -> None:
    """Small transactions, a large one, and two transactions that interleave."""
    for i in range(start, start + 12):
        with pg.connect(db, autocommit=False) as conn:
            conn.execute("INSERT INTO t VALUES (%s, 'v')", (i,))
            conn.execute("INSERT INTO u VALUES (%s, 'w')", (i,))
    pg.execute(f"INSERT INTO u SELECT g, 'big' FROM generate_series({start}, {start + 60}) g", dbname=db)
    with pg.connect(db, autocommit=False) as one, pg.connect(db, autocommit=False) as two:
        one.execute("UPDATE t SET v = 'one' WHERE id = %s", (start,))
        two.execute("DELETE FROM t WHERE id = %s", (start + 1,))
        two.commit()
        one.execute("UPDATE t SET v = 'one again' WHERE id = %s", (start + 2,))
        one.commit()
    pg.execute("SELECT pg_logical_emit_message(true, 'marker', 'transactional')", dbname=db)


def _streamed_workload(pg: PgCluster, db: str, *, two_phase: bool) -> None:
    """Streamed transactions (over logical_decoding_work_mem = 64kB) interleaved with small
    ones, savepoint rollbacks, an aborted stream, and prepared transactions."""
    pad = "x" * 300
    with pg.connect(db, autocommit=False) as big, pg.connect(db, autocommit=False) as small:
        big.execute(f"INSERT INTO u SELECT g, '{pad}' FROM generate_series(1, 400) g")
        for i in range(3):
            small.execute("INSERT INTO t VALUES (%s, 'small')", (1000 + i,))
            small.commit()
            big.execute("SAVEPOINT s")
            big.execute(f"INSERT INTO u SELECT g, '{pad}' FROM generate_series(1, 300) g")
            if i == 1:
                big.execute("ROLLBACK TO SAVEPOINT s")
        big.commit()
    with pg.connect(db, autocommit=False) as aborted:
        aborted.execute(f"INSERT INTO u SELECT g, '{pad}' FROM generate_series(1, 500) g")
        aborted.rollback()
    if two_phase:
        for gid, finish, rows in (("commit me", "COMMIT", 400), ("roll me back", "ROLLBACK", 400),
                                  ("small", "COMMIT", 1)):
            with pg.connect(db, autocommit=False) as prepared:
                prepared.execute(f"INSERT INTO u SELECT g, '{pad}' FROM generate_series(1, {rows}) g")
                prepared.execute("INSERT INTO t VALUES (%s, %s)", (2000 + len(gid), gid))
                prepared.execute(f"PREPARE TRANSACTION '{gid}'")
            pg.execute(f"{finish} PREPARED '{gid}'", dbname=db)
    pg.execute("INSERT INTO t VALUES (3000, 'last')", dbname=db)


def _parts(where: Path | Bucket) -> list[tuple[str, Any]]:
    """A landing's chunk files in order, each with the Arrow file system to read it with."""
    if isinstance(where, Path):
        return [(str(part), None) for part in sorted(where.glob("part-*.parquet"))]
    found = where.fs.get_file_info(pafs.FileSelector(where.root))
    return [(f.path, where.fs) for f in sorted(found, key=lambda f: f.path) if f.base_name.startswith("part-")]


def _landed(where: Path | Bucket) -> pa.Table:
    table = pa.concat_tables(pq.read_table(part, filesystem=fs) for part, fs in _parts(where))
    return table.replace_schema_metadata(None).combine_chunks()


def _peeked(pg: PgCluster, db: str, slot: str, **options: Any) -> pa.Table:
    messages = pg.peek_pgoutput(slot, publications=[PUB], dbname=db, **options)
    return pa.table({"seq": [m.seq for m in messages], "lsn": [m.lsn for m in messages],
                     "xid": [m.xid for m in messages], "data": [m.data for m in messages]},
                    schema=CAPTURE_SCHEMA).combine_chunks()


def _without_relations(table: pa.Table) -> list[tuple[int, int, bytes]]:
    return [(row["lsn"], row["xid"], row["data"]) for row in table.to_pylist() if row["data"][:1] != b"R"]


def _relations(table: pa.Table) -> set[bytes]:
    return {data for data in table.column("data").to_pylist() if data[:1] == b"R"}


def _assert_each_transaction_once(table: pa.Table) -> None:
    """No streamed transaction starts twice, no transaction ends twice: nothing was landed twice."""
    from pgoutput_spark import decode_message

    started, ended = Counter(), Counter()
    for data in table.column("data").to_pylist():
        kind = data[:1]
        if kind == b"S" and data[5] == 1:  # first_segment
            started[decode_message(data).xid] += 1
        elif kind in (b"C", b"c", b"P", b"p", b"K", b"r"):
            message = decode_message(data)
            ended[(kind, getattr(message, "end_lsn", None) or message.rollback_end_lsn)] += 1
    assert started and max(started.values()) == 1, started
    assert ended and max(ended.values()) == 1, ended


def _slot_lsn(pg: PgCluster, db: str, slot: str, column: str = "confirmed_flush_lsn") -> int:
    """The slot's position (or `column`, another LSN of pg_replication_slots) as an int."""
    rows = pg.query(f"SELECT ({column} - '0/0'::pg_lsn)::int8 FROM pg_replication_slots"
                    " WHERE slot_name = %s", (slot,), dbname=db)
    return int(rows[0][0])


def _chunk_ends(where: Path | Bucket) -> list[tuple[bytes, int]]:
    """(last message type, footer end_lsn) of every chunk file, in order."""
    out = []
    for part, fs in _parts(where):
        table = pq.read_table(part, filesystem=fs)
        record = pq.read_metadata(part, filesystem=fs).metadata[b"pgoutput_spark.chunk"]
        import json
        out.append((table.column("data")[-1].as_py()[:1], json.loads(record)["end_lsn"]))
    return out


# -- landing equals what the server decodes ---------------------------------------------------------


def test_chunked_landing_is_the_slot_stream_and_seq_continues_across_runs(
        pg15: PgCluster, s3: Bucket, capsys: pytest.CaptureFixture[str]) -> None:
    """Landed in an S3 bucket (moto's server), named as Spark's connector names it (``s3a://``)."""
    db = _setup(pg15, slots=("landed", "twin"))
    landing = s3.uri
    _plain_workload(pg15, db, 0)
    args = ["capture", "--landing", landing, "--slot", f"{db}_landed", "--publication", PUB,
            "--dsn", pg15.conninfo(db), "--proto-version", "1", "--messages", "--binary", "--chunk-size", "7"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "chunk 0: " in out and "MB behind the server" in out and "caught up with the server" in out
    assert "MB of WAL decoded before the chunk" in out
    assert f"into {landing}" in out
    first_run = _landed(s3).num_rows
    _plain_workload(pg15, db, 100)
    result = capture_slot(landing, slot=f"{db}_landed", dsn=pg15.conninfo(db), chunk_size=7)
    assert result.caught_up and result.chunks[0].first_seq == first_run

    # Each chunk is a new decoding session, and pgoutput sends a table's Relation message
    # again before its first change in a session (as to a subscriber that reconnects).
    # Everything else is the twin slot's stream, message for message.
    landed, expected = _landed(s3), _peeked(pg15, db, f"{db}_twin", proto_version=1, messages=True,
                                           binary=True)
    assert landed.column("seq").to_pylist() == list(range(landed.num_rows))
    assert _without_relations(landed) == _without_relations(expected)
    assert _relations(landed) == _relations(expected)
    assert landed.num_rows > expected.num_rows  # the Relation messages sent again
    ends = _chunk_ends(s3)
    assert len(ends) > 10
    assert all(kind == b"C" for kind, _ in ends)  # every chunk ends with a Commit
    assert _slot_lsn(pg15, db, f"{db}_landed") == ends[-1][1]
    again = capture_slot(landing, slot=f"{db}_landed", dsn=pg15.conninfo(db))
    assert again.messages == 0 and again.caught_up
    names = [f.base_name for f in s3.fs.get_file_info(pafs.FileSelector(s3.root))]
    assert not [n for n in names if n.startswith("_") and n != LANDING_INFO_FILE]  # no upload left behind


def test_stop_after_some_messages_or_at_an_lsn(pg15: PgCluster, tmp_path: Path) -> None:
    db = _setup(pg15, slots=("landed", "twin"))
    _plain_workload(pg15, db, 0)
    middle = int(pg15.query("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8", dbname=db)[0][0])
    _plain_workload(pg15, db, 100)
    landing, common = str(tmp_path), {"slot": f"{db}_landed", "dsn": pg15.conninfo(db)}
    first = capture_slot(landing, publications=[PUB], proto_version=1, chunk_size=7, max_messages=20, **common)
    assert 20 <= first.messages < 40 and not first.caught_up  # whole transactions, then stop
    second = capture_slot(landing, chunk_size=7, until_lsn=Lsn(middle), **common)
    third = capture_slot(landing, chunk_size=7, **common)
    assert not second.caught_up and third.caught_up
    assert second.chunks[-1].end_lsn <= middle < third.chunks[0].end_lsn  # up to the last commit before
    assert third.chunks[0].first_seq == second.chunks[-1].last_seq + 1
    landed, expected = _landed(Path(landing)), _peeked(pg15, db, f"{db}_twin", proto_version=1)
    assert _without_relations(landed) == _without_relations(expected)


_KILL_AT_SECOND_ADVANCE = textwrap.dedent("""
    import os, signal, sys
    from pgoutput_spark.slot import source
    from pgoutput_spark.slot.capture import capture_slot
    advance, calls = source.SlotSource.advance, []
    def killing_advance(self, lsn):
        calls.append(lsn)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGKILL)  # the chunk file is in place, the slot not moved
        advance(self, lsn)
    source.SlotSource.advance = killing_advance
    capture_slot(sys.argv[1], slot=sys.argv[2], dsn=sys.argv[3], chunk_size=40,
                 publications=[sys.argv[4]], **eval(sys.argv[5]))
""")


@pytest.mark.parametrize("server", ["pg15", "pg16", "pg17", "pg18"])
def test_killed_between_landing_a_chunk_and_advancing_the_slot(
        server: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    pg: PgCluster = request.getfixturevalue(server)
    options: dict[str, Any] = ({"proto_version": 3, "streaming": "on", "two_phase": True} if server == "pg15"
                               else {"proto_version": 4, "streaming": "parallel", "two_phase": True,
                                     "origin": "any"})
    db = _setup(pg, slots=("landed", "twin"), two_phase=True)
    _streamed_workload(pg, db, two_phase=True)
    killed, whole = tmp_path / "killed", tmp_path / "whole"

    run = subprocess.run([sys.executable, "-c", _KILL_AT_SECOND_ADVANCE, str(killed), f"{db}_landed",
                          pg.conninfo(db), PUB, repr(options)], capture_output=True, text=True)
    assert run.returncode == -signal.SIGKILL, run.stderr
    ends = _chunk_ends(killed)
    assert len(ends) == 2 and _slot_lsn(pg, db, f"{db}_landed") == ends[0][1]

    resumed = capture_slot(str(killed), slot=f"{db}_landed", dsn=pg.conninfo(db), chunk_size=40)
    assert resumed.recovered and resumed.resumed_at == Lsn(ends[1][1]) and resumed.caught_up
    capture_slot(str(whole), slot=f"{db}_twin", dsn=pg.conninfo(db), publications=[PUB], chunk_size=40, **options)

    landed = _landed(killed)
    assert landed.equals(_landed(whole))
    assert landed.column("seq").to_pylist() == list(range(landed.num_rows))
    _assert_each_transaction_once(landed)
    kinds = {d[:1] for d in landed.column("data").to_pylist()}
    assert {b"S", b"E", b"c", b"A", b"b", b"P", b"p", b"K", b"r"} <= kinds  # streams, aborts, two-phase
    # The resumed capture went on past the chunk it recovered (PostgreSQL 18 leaves out the stream
    # of the transaction rolled back before the capture decodes it: fewer chunks there).
    assert len(_chunk_ends(killed)) > 2


@pytest.mark.parametrize("server", ["pg15", "pg18"])
def test_a_lost_connection_mid_chunk_lands_nothing_of_that_chunk(
        server: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pg: PgCluster = request.getfixturevalue(server)
    db = _setup(pg, slots=("landed", "twin"))
    _plain_workload(pg, db, 0)
    landing, whole = tmp_path / "landing", tmp_path / "whole"
    write = ChunkFile.write

    def write_then_lose_the_server(self: ChunkFile, batch: pa.RecordBatch) -> None:
        write(self, batch)
        if self.chunk == 1:
            pg.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                       " WHERE query LIKE '%%pgoutput_spark_peek%%' AND pid <> pg_backend_pid()", dbname=db)

    monkeypatch.setattr(ChunkFile, "write", write_then_lose_the_server)
    with pytest.raises(CaptureError, match="connection to the server was lost; nothing of this chunk"):
        capture_slot(str(landing), slot=f"{db}_landed", dsn=pg.conninfo(db), publications=[PUB],
                     proto_version=1, chunk_size=20, batch_rows=3)
    monkeypatch.undo()
    assert sorted(p.name for p in landing.iterdir()) == [LANDING_INFO_FILE, "part-00000000.parquet"]

    capture_slot(str(landing), slot=f"{db}_landed", dsn=pg.conninfo(db), chunk_size=20)
    capture_slot(str(whole), slot=f"{db}_twin", dsn=pg.conninfo(db), publications=[PUB], proto_version=1,
                 chunk_size=20)
    assert _landed(landing).equals(_landed(whole))


def test_a_rolled_back_subtransaction_streamed_without_its_abort_is_read_again_unstreamed(
        pg15: PgCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL can stream a rolled-back subtransaction's changes and leave out its Stream
    Abort when a transaction spans decoding sessions (README, Status). Played here by taking
    the Stream Aborts of subtransactions out of what a streamed peek returns: the capture asks
    the server about the subtransactions it was sent, finds one rolled back, and lands that
    chunk from a peek without streaming. A savepoint released (committed) is no reason to, nor
    is a streamed prepared transaction rolled back before the capture."""
    from pgoutput_spark.slot import source
    from pgoutput_spark.slot.capture import ChunkProgress

    db = _setup(pg15, slots=("landed", "twin"), two_phase=True)
    pad = "x" * 300
    with pg15.connect(db, autocommit=False) as conn:
        conn.execute(f"INSERT INTO u SELECT g, 'prepared {pad}' FROM generate_series(1, 300) g")
        conn.execute("SAVEPOINT p")
        conn.execute(f"INSERT INTO u SELECT g, 'prepared {pad}' FROM generate_series(301, 400) g")
        conn.execute("RELEASE SAVEPOINT p")
        conn.execute("PREPARE TRANSACTION 'undone'")
    pg15.execute("ROLLBACK PREPARED 'undone'", dbname=db)
    with pg15.connect(db, autocommit=False) as conn:
        conn.execute(f"INSERT INTO u SELECT g, '{pad}' FROM generate_series(1, 300) g")  # streamed
        conn.execute("SAVEPOINT kept")
        conn.execute(f"INSERT INTO u SELECT g, 'kept {pad}' FROM generate_series(301, 600) g")
        conn.execute("RELEASE SAVEPOINT kept")
        conn.execute("SAVEPOINT gone")
        conn.execute(f"INSERT INTO u SELECT g, 'gone {pad}' FROM generate_series(601, 900) g")
        conn.execute("ROLLBACK TO SAVEPOINT gone")
        conn.execute("INSERT INTO t VALUES (1, 'after')")
    pg15.execute("INSERT INTO t VALUES (2, 'next')", dbname=db)
    options: dict[str, Any] = {"publications": [PUB], "proto_version": 3, "streaming": "on", "two_phase": True,
                               "chunk_size": 5}

    honest = capture_slot(str(tmp_path / "twin"), slot=f"{db}_twin", dsn=pg15.conninfo(db), **options)
    twin = _landed(tmp_path / "twin").column("data").to_pylist()
    assert b"S" in {d[:1] for d in twin} and b"A" in {d[:1] for d in twin}  # streamed, with its abort
    assert honest.chunks

    peek, streamed_peeks = source.SlotSource.peek, []

    def losing_subtransaction_aborts(self, **kwargs):  # type: ignore[no-untyped-def]
        streamed_peeks.append(kwargs.get("streaming", True))
        for rows in peek(self, **kwargs):
            yield [row for row in rows if not (row[2][:1] == b"A" and row[2][1:5] != row[2][5:9])]

    monkeypatch.setattr(source.SlotSource, "peek", losing_subtransaction_aborts)
    progress: list[ChunkProgress] = []
    result = capture_slot(str(tmp_path / "landed"), slot=f"{db}_landed", dsn=pg15.conninfo(db),
                          progress=progress.append, **options)
    # The prepared transaction (streamed, then Rollback Prepared) lands as streamed; the chunk
    # holding the savepoints, read again without streaming, holds its transactions whole.
    assert streamed_peeks[-2:] == [True, False] and len(result.chunks) == len(progress) == 3
    assert [bool(p.lost_aborts) for p in progress] == [False, False, True]
    assert "read without streaming: the server streamed rolled-back subtransaction(s)" in progress[2].render()
    last = pq.read_table(tmp_path / "landed" / "part-00000002.parquet").column("data").to_pylist()
    kinds = [d[:1] for d in last]
    assert b"S" not in kinds and kinds.count(b"B") == kinds.count(b"C") == 2
    assert sum(b"kept " in d for d in last) == 300 and not any(b"gone " in d for d in last)
    assert b"S" in {d[:1] for d in pq.read_table(tmp_path / "landed" / "part-00000000.parquet")
                    .column("data").to_pylist()}

    pg15.execute(f"INSERT INTO u SELECT g, '{pad}' FROM generate_series(1, 300) g", dbname=db)
    capture_slot(str(tmp_path / "landed"), slot=f"{db}_landed", dsn=pg15.conninfo(db),
                 progress=progress.append, **options)
    assert streamed_peeks[-1] is True and not progress[-1].lost_aborts  # the next chunk streams again
    assert b"S" in {d[:1] for d in pq.read_table(tmp_path / "landed" / "part-00000003.parquet")
                    .column("data").to_pylist()}


@pytest.mark.parametrize("server", ["pg16", "pg18"])
def test_the_landing_records_options_and_session_settings(server: str, request: pytest.FixtureRequest,
                                                          tmp_path: Path) -> None:
    import json

    pg: PgCluster = request.getfixturevalue(server)
    db = _setup(pg, slots=())
    result = capture_slot(str(tmp_path), slot=f"{db}_new_slot", dsn=pg.conninfo(db), publications=[PUB],
                          create_slot=True)
    assert result.messages == 0
    info = json.loads((tmp_path / LANDING_INFO_FILE).read_text())
    assert info["options"] == {"publications": [PUB], "proto_version": 4, "streaming": None,
                               "two_phase": False, "messages": False, "binary": False, "origin": None}
    assert info["slot"] == f"{db}_new_slot" and info["database"] == db
    assert info["system_identifier"] == str(pg.query("SELECT system_identifier FROM pg_control_system()")[0][0])
    assert info["settings"] == {"client_encoding": "UTF8", "DateStyle": "ISO, YMD", "IntervalStyle": "postgres",
                                "TimeZone": "UTC", "extra_float_digits": "3", "bytea_output": "hex",
                                "lc_monetary": "C", "server_encoding": "UTF8"}
    assert set(SESSION_SETTINGS) < set(info["settings"])
    with pytest.raises(CaptureError, match="was landed with options = .* land into a new folder"):
        capture_slot(str(tmp_path), slot=f"{db}_new_slot", dsn=pg.conninfo(db), proto_version=2)


@pytest.mark.parametrize("server", ["pg16", "pg17", "pg18"])
def test_on_16_and_later_each_chunk_leaves_a_restart_point_for_the_next_ones(
        server: str, request: pytest.FixtureRequest, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """PostgreSQL moves a slot's restart_lsn, where every chunk's decoding starts, only at
    running-transactions records, which the server writes by itself after 15 s of activity:
    the capture has one written after each chunk (when the role may)."""
    pg: PgCluster = request.getfixturevalue(server)
    db = _setup(pg, slots=("s",))
    slot = f"{db}_s"
    created = _slot_lsn(pg, db, slot, "restart_lsn")
    _plain_workload(pg, db, 0)
    first = capture_slot(str(tmp_path / "a"), slot=slot, dsn=pg.conninfo(db), publications=[PUB],
                         chunk_size=20)
    assert len(first.chunks) > 2
    _plain_workload(pg, db, 100)
    lines: list[Any] = []
    capture_slot(str(tmp_path / "a"), slot=slot, dsn=pg.conninfo(db), chunk_size=20, progress=lines.append)
    # The records written after the first capture's chunks lie past its last chunk: the second
    # capture passed them, and the slot's restart point followed.
    assert _slot_lsn(pg, db, slot, "restart_lsn") >= first.chunks[-1].end_lsn > created
    # The progress line says how much WAL each chunk decoded before its own: after the second
    # capture's first chunk, only what came after the first capture's end.
    assert len(lines) > 1 and all(line.decoded_before is not None for line in lines)
    for earlier, line in zip(lines, lines[1:]):
        assert 0 <= line.decoded_before <= earlier.record.end_lsn - first.chunks[-1].end_lsn

    # A role that may not write them (EXECUTE on pg_log_standby_snapshot is for superusers
    # unless granted) captures all the same, without a warning.
    pg.execute("DO $$ BEGIN CREATE ROLE capture_plain LOGIN REPLICATION; EXCEPTION WHEN"
               " duplicate_object THEN NULL; END $$", dbname=db)
    pg.create_slot(f"{db}_plain", dbname=db)
    _plain_workload(pg, db, 200)
    dsn = f"host={pg.host} port={pg.port} dbname={db} user=capture_plain"
    plain = capture_slot(str(tmp_path / "b"), slot=f"{db}_plain", dsn=dsn, publications=[PUB], chunk_size=20)
    assert plain.messages > 0 and plain.caught_up
    assert "running-transactions" not in caplog.text


# -- bad situations ---------------------------------------------------------------------------------


def _capture_error(pg: PgCluster, db: str, landing: Path, **kwargs: Any) -> str:
    kwargs = {"slot": f"{db}_s", "dsn": pg.conninfo(db), "publications": [PUB], **kwargs}
    with pytest.raises(CaptureError) as info:
        capture_slot(str(landing), **kwargs)
    return str(info.value)


@pytest.mark.parametrize("server", ["pg15", "pg18"])
def test_slot_and_publication_problems_are_named(server: str, request: pytest.FixtureRequest,
                                                 tmp_path: Path) -> None:
    pg: PgCluster = request.getfixturevalue(server)
    db = _setup(pg, slots=())
    assert f"replication slot '{db}_missing' does not exist" in _capture_error(
        pg, db, tmp_path / "a", slot=f"{db}_missing")
    pg.create_slot(f"{db}_td", plugin="test_decoding", dbname=db)
    assert "is a 'test_decoding' slot" in _capture_error(pg, db, tmp_path / "b", slot=f"{db}_td")
    assert "publication 'nope' does not exist" in _capture_error(
        pg, db, tmp_path / "c", publications=[PUB, "nope"], create_slot=True)
    pg.create_slot(f"{db}_plain", dbname=db)
    if pg.version_num < 180000:  # 18 turns two_phase on: test_two_phase_turned_on_for_a_slot_without_it_on_18
        assert "created without two_phase: two_phase decoding needs a slot created with two_phase = true" \
            " (PostgreSQL 18 and later can turn it on, which capture does there; the server is PostgreSQL 15)" \
            in _capture_error(pg, db, tmp_path / "d", slot=f"{db}_plain", proto_version=3, two_phase=True)
    if pg.version_num < 160000:
        assert "protocol version 4 needs PostgreSQL 16" in _capture_error(
            pg, db, tmp_path / "e", slot=f"{db}_plain", proto_version=4)
    assert "a new landing needs its publications" in _capture_error(
        pg, db, tmp_path / "f", slot=f"{db}_plain", publications=None)
    assert not (tmp_path / "a").exists() and not (tmp_path / "f").exists()
    # Binary values the apply cannot read, through domains and arrays; before any slot is made.
    pg.execute("CREATE TYPE pair AS (a int, b text); CREATE TYPE mood AS ENUM ('ok');"
               " CREATE DOMAIN spans AS int4range[]; CREATE DOMAIN small AS int;"
               " CREATE TABLE b (id small, p pair, s spans, pt point, m mood, ok int[], t tsvector);"
               " CREATE PUBLICATION binpub FOR TABLE b", dbname=db)
    message = _capture_error(pg, db, tmp_path / "g", slot=f"{db}_binary", publications=["binpub"],
                             proto_version=2, binary=True, create_slot=True)
    assert message.startswith("binary capture: the apply cannot read these columns' values in binary form: "
                              "public.b.p (pair: a composite type), public.b.s (int4range: a range type), "
                              "public.b.pt (point), public.b.t (tsvector); capture without binary"), message
    assert pg.query("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (f"{db}_binary",),
                    dbname=db) == [(0,)]


@pytest.mark.parametrize("server", ["pg15", "pg18"])
def test_a_slot_moved_on_by_someone_else_is_refused(server: str, request: pytest.FixtureRequest,
                                                    tmp_path: Path) -> None:
    pg: PgCluster = request.getfixturevalue(server)
    db = _setup(pg, slots=("s",))
    _plain_workload(pg, db, 0)
    capture_slot(str(tmp_path), slot=f"{db}_s", dsn=pg.conninfo(db), publications=[PUB], proto_version=1)
    _plain_workload(pg, db, 100)
    pg.get_pgoutput(f"{db}_s", publications=[PUB], proto_version=1, dbname=db)
    assert "the messages in between were consumed by someone else" in _capture_error(pg, db, tmp_path)


def test_one_capture_per_slot_at_a_time(pg15: PgCluster, tmp_path: Path) -> None:
    db = _setup(pg15, slots=("s",))
    with pg15.connect(db) as other:
        other.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (f"pgoutput_spark capture {db}_s",))
        assert f"another pgoutput-spark capture is reading slot '{db}_s'" in _capture_error(pg15, db, tmp_path)


@pytest.mark.parametrize("server", ["pg15", "pg18"])
def test_a_role_without_replication_is_told_what_it_lacks(server: str, request: pytest.FixtureRequest,
                                                          tmp_path: Path) -> None:
    pg: PgCluster = request.getfixturevalue(server)
    db = _setup(pg, slots=("s",))
    pg.execute("DO $$ BEGIN CREATE ROLE capture_weak LOGIN; EXCEPTION WHEN duplicate_object THEN NULL;"
               " END $$", dbname=db)
    dsn = f"host={pg.host} port={pg.port} dbname={db} user=capture_weak"
    message = _capture_error(pg, db, tmp_path, dsn=dsn, proto_version=1)
    assert "the role needs the REPLICATION attribute" in message


def test_the_connection_string_never_shows_its_password(
        pg15: PgCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for dsn in (f"host={pg15.host} port=1 user=u password=hunter2 dbname=x", "password=hunter2 broken"):
        code = main(["capture", "--landing", str(tmp_path), "--slot", "s", "--publication", PUB,
                     "--dsn", dsn])
        captured = capsys.readouterr()
        assert code == 1 and "hunter2" not in captured.out + captured.err
        assert captured.err.startswith("pgoutput-spark: error: ")


@pytest.mark.parametrize("major", [15, 18])  # wal_status 'lost' on 15; invalidation_reason from 17
def test_an_invalidated_slot_is_named_with_why_and_what_to_do(major: int, tmp_path: Path) -> None:
    settings = {"max_slot_wal_keep_size": "'1MB'"}
    with new_cluster(major, settings) as pg:
        pg.execute(f"CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION {PUB} FOR TABLE t")
        landing = str(tmp_path / "landing")
        capture_slot(landing, slot="s", dsn=pg.conninfo(), publications=[PUB], create_slot=True)
        for i in range(4):  # more WAL than the slot may keep, then a checkpoint: PostgreSQL invalidates it
            pg.execute(f"INSERT INTO t VALUES ({i})")
            pg.execute("SELECT pg_switch_wal()")
        pg.execute("CHECKPOINT")
        assert pg.query("SELECT wal_status FROM pg_replication_slots") == [("lost",)]
        if major >= 17:
            assert pg.query("SELECT invalidation_reason FROM pg_replication_slots") == [("wal_removed",)]
        with pytest.raises(CaptureError, match=r"slot 's' on .* is invalidated: the server removed WAL it still "
                                               r"needed \(max_slot_wal_keep_size\)\. The changes after its position "
                                               r"0/[0-9A-F]+ can no longer be decoded; start the pipeline again "
                                               r"from a new slot: drop this one, then `pgoutput-spark snapshot`"):
            capture_slot(landing, slot="s", dsn=pg.conninfo(), publications=[PUB])


def test_a_slot_left_unread_past_idle_replication_slot_timeout_is_named(tmp_path: Path) -> None:
    """PostgreSQL 18 invalidates a slot nobody read for idle_replication_slot_timeout (at a checkpoint):
    between two runs of a batch capture the slot is unread."""
    with PgCluster(zonky_bindir(18), settings={"idle_replication_slot_timeout": "'1s'"}) as pg:
        pg.execute(f"CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION {PUB} FOR TABLE t")
        landing = str(tmp_path / "landing")
        capture_slot(landing, slot="s", dsn=pg.conninfo(), publications=[PUB], create_slot=True)
        time.sleep(2.5)
        pg.execute("INSERT INTO t VALUES (1)")
        pg.execute("CHECKPOINT")
        assert pg.query("SELECT invalidation_reason FROM pg_replication_slots") == [("idle_timeout",)]
        with pytest.raises(CaptureError, match=r"slot 's' on .* is invalidated: it went unread for longer than the"
                                               r" server's idle_replication_slot_timeout \(run the capture more often"
                                               r" than that, or raise the setting\)\. The changes after its position"):
            capture_slot(landing, slot="s", dsn=pg.conninfo(), publications=[PUB])


@pytest.mark.parametrize("major", [16, 17])  # conflicting on 16; invalidation_reason from 17
def test_a_standby_slot_whose_catalog_rows_the_primary_removed_is_named(major: int, tmp_path: Path) -> None:
    """A slot on a standby without hot_standby_feedback: the primary vacuums catalog rows the slot
    still needs, the standby's replay conflicts with the slot, and PostgreSQL invalidates it."""
    with new_cluster(major) as primary, primary.standby({"hot_standby_feedback": "off"}) as standby:
        primary.execute(f"CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION {PUB} FOR TABLE t")
        standby.wait_replayed()
        landing = str(tmp_path / "landing")
        with standby_snapshots(primary):
            capture_slot(landing, slot="s", dsn=standby.conninfo(), publications=[PUB], create_slot=True)
        for statement in ("INSERT INTO t VALUES (1)", "CREATE TABLE conflict (x int)", "DROP TABLE conflict",
                          "VACUUM pg_class"):  # each its own transaction: rows deleted by another one
            primary.execute(statement)
        standby.wait_replayed()
        column = "conflicting::text" if major == 16 else "invalidation_reason"
        assert standby.query(f"SELECT {column} FROM pg_replication_slots") == [
            ("true",) if major == 16 else ("rows_removed",)]
        with pytest.raises(CaptureError, match=r"slot 's' on .* is invalidated: the primary removed catalog rows it"
                                               r" still needed \(on a standby, hot_standby_feedback keeps them, with a"
                                               r" physical slot on the primary for the standby\).* The changes after"):
            capture_slot(landing, slot="s", dsn=standby.conninfo(), publications=[PUB])


@pytest.fixture(scope="module")
def replica_level() -> Callable[[], PgCluster]:
    with PgCluster.debian(15, settings={"wal_level": "replica"}) as cluster:
        yield lambda: cluster


def test_wal_level_below_logical_is_named(replica_level: Callable[[], PgCluster], tmp_path: Path) -> None:
    pg = replica_level()
    pg.execute(f"CREATE TABLE t (id int); CREATE PUBLICATION {PUB} FOR TABLE t")
    assert "wal_level is 'replica'" in _capture_error(pg, "postgres", tmp_path, create_slot=True)


def test_psycopg_is_only_imported_by_the_capture() -> None:
    code = ("import sys, pgoutput_spark, pgoutput_spark.capture, pgoutput_spark.slot.landing;"
            " sys.exit('psycopg' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], env={**os.environ}).returncode == 0


def test_capture_makes_a_slot_a_failover_slot_and_refuses_one_before_17(
        pg15: PgCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with PgCluster(zonky_bindir(17)) as pg17:
        for pg in (pg17, pg15):
            db = new_database(pg)
            pg.execute(f"CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION {PUB} FOR TABLE t", dbname=db)
            pg.execute("SELECT pg_create_logical_replication_slot('plain', 'pgoutput')", dbname=db)
            argv = ["capture", "--landing", str(tmp_path / str(pg.port)), "--slot", "plain", "--publication", PUB,
                    "--failover", "--quiet", "--dsn", pg.conninfo(db)]
            if pg is pg17:
                failover = "SELECT failover FROM pg_replication_slots WHERE slot_name = 'plain'"
                assert pg.query(failover) == [(False,)]
                assert main(argv) == 0
                assert pg.query(failover) == [(True,)]
            else:
                assert main(argv) == 1
                assert "failover slots need PostgreSQL 17 or later; the server of slot 'plain' on" in \
                    capsys.readouterr().err
                pg.drop_slot("plain", dbname=db)


def test_two_phase_turned_on_for_a_slot_without_it_on_18(pg18: PgCluster, tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """A new landing with two_phase from a slot made without it (by hand, or by a `snapshot`
    without --two-phase): PostgreSQL 18 turns it on (ALTER_REPLICATION_SLOT ... (TWO_PHASE)). A
    transaction prepared before arrives whole at its COMMIT PREPARED; one prepared after, at
    its PREPARE. Nothing of either is lost."""
    db = _setup(pg18, slots=("s",))
    slot = f"{db}_s"

    def prepare(gid: str, key: int) -> int:
        with pg18.connect(db, autocommit=False) as conn:
            conn.execute("INSERT INTO t VALUES (%s, %s)", (key, gid))
            xid = int(conn.execute("SELECT pg_current_xact_id()::text::int8").fetchone()[0])  # type: ignore[index]
            conn.execute(f"PREPARE TRANSACTION '{gid}'")
        return xid

    xids = {"before": prepare("before", 1)}
    two_phase = "SELECT two_phase FROM pg_replication_slots WHERE slot_name = %s"
    assert pg18.query(two_phase, (slot,)) == [(False,)]
    with caplog.at_level(logging.INFO, logger="pgoutput_spark"):
        capture_slot(str(tmp_path), slot=slot, dsn=pg18.conninfo(db), publications=[PUB], proto_version=3,
                     two_phase=True)
    assert pg18.query(two_phase, (slot,)) == [(True,)]
    assert "decodes prepared transactions at their PREPARE from now on (two_phase turned on)" in caplog.text
    pg18.execute("COMMIT PREPARED 'before'", dbname=db)
    xids["after"] = prepare("after", 2)
    capture_slot(str(tmp_path), slot=slot, dsn=pg18.conninfo(db))

    landed = _landed(tmp_path)
    outline: dict[str, list[str]] = {}
    for data, xid in zip(landed.column("data").to_pylist(), landed.column("xid").to_pylist()):
        message = decode_message(data)
        gid = getattr(message, "gid", None)
        if gid is not None:
            assert xid == xids[gid]
            outline.setdefault(gid, []).append(type(message).__name__)
    assert outline == {"before": ["BeginPrepare", "Prepare", "CommitPrepared"],
                       "after": ["BeginPrepare", "Prepare"]}
    inserted = [decode_message(d) for d in landed.column("data").to_pylist() if d[:1] == b"I"]
    assert sorted(i.new_tuple[1].value for i in inserted) == [b"after", b"before"]  # type: ignore[attr-defined]
    assert pg18.query("SELECT gid FROM pg_prepared_xacts", dbname=db) == [("after",)]
    pg18.execute("ROLLBACK PREPARED 'after'", dbname=db)
