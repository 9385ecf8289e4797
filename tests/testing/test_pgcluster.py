"""PgCluster against real PostgreSQL 15 (Debian) and 16 (pgserver) servers."""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psycopg
import pyarrow.parquet as pq
import pytest

from pgoutput_spark.testing import pgcluster
from pgoutput_spark.testing.capture_files import write_capture_parquet
from pgoutput_spark.testing.pgcluster import CapturedMessage, PgCluster, PgClusterError

pytestmark = pytest.mark.postgres

NewDb = Callable[[PgCluster], str]


def _kinds(messages: list[CapturedMessage]) -> list[bytes]:
    return [m.data[:1] for m in messages]


def _setup(cluster: PgCluster, new_db: NewDb, *, two_phase: bool = False) -> tuple[str, str]:
    """A fresh database with table ``t``, publication ``pub`` and a pgoutput slot."""
    db = new_db(cluster)
    cluster.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t",
        dbname=db,
    )
    slot = f"slot_{db}"
    cluster.create_slot(slot, two_phase=two_phase, dbname=db)
    return db, slot


def _insert_in_xact(cluster: PgCluster, db: str, values: list[tuple[int, str]]) -> int:
    """Insert rows in one transaction; return its xid as the server reports it."""
    with cluster.connect(db, autocommit=False) as conn:
        conn.cursor().executemany("INSERT INTO t VALUES (%s, %s)", values)
        xid = conn.execute("SELECT pg_current_xact_id()::text::int8").fetchone()
        assert xid is not None
        return int(xid[0])


@pytest.fixture(params=["pg15", "pg16"])
def cluster(request: pytest.FixtureRequest) -> PgCluster:
    return request.getfixturevalue(request.param)  # type: ignore[no-any-return]


def test_versions(pg15: PgCluster, pg16: PgCluster) -> None:
    assert pg15.version_num // 10000 == 15
    assert pg16.version_num // 10000 == 16
    assert pg15.port != pg16.port
    assert Path(pg15.host).is_dir()
    assert "dbname=postgres" in pg15.conninfo()
    assert pg15.query("SHOW wal_level") == [("logical",)]
    assert pg16.query("SHOW logical_decoding_work_mem") == [("64kB",)]


def test_peek_is_repeatable_and_get_consumes(cluster: PgCluster, fresh_db: NewDb) -> None:
    db, slot = _setup(cluster, fresh_db)
    xid = _insert_in_xact(cluster, db, [(1, "hello"), (2, "world")])

    def peek() -> list[CapturedMessage]:
        return cluster.peek_pgoutput(slot, publications=["pub"], proto_version=1, dbname=db)

    first = peek()
    assert _kinds(first) == [b"B", b"R", b"I", b"I", b"C"]
    assert [m.seq for m in first] == [0, 1, 2, 3, 4]
    assert {m.xid for m in first} == {xid}
    assert [m.lsn for m in first] == sorted(m.lsn for m in first)
    assert b"hello" in first[2].data and b"world" in first[3].data
    assert peek() == first

    chunked = list(
        cluster.iter_pgoutput(
            slot, publications=["pub"], proto_version=1, chunk_rows=2, seq_start=10, dbname=db
        )
    )
    assert [m.seq for m in chunked] == [10, 11, 12, 13, 14]
    assert [(m.lsn, m.xid, m.data) for m in chunked] == [(m.lsn, m.xid, m.data) for m in first]

    assert cluster.get_pgoutput(slot, publications=["pub"], proto_version=1, dbname=db) == first
    assert peek() == []


def test_test_decoding_on_pg15(pg15: PgCluster, fresh_db: NewDb) -> None:
    db = fresh_db(pg15)
    pg15.execute("CREATE TABLE t (id int PRIMARY KEY, v text)", dbname=db)
    pg15.create_slot(f"td_{db}", "test_decoding", dbname=db)
    pg15.execute("INSERT INTO t VALUES (7, 'seven')", dbname=db)

    rows = pg15.peek_test_decoding(
        f"td_{db}", options={"include-xids": "0", "skip-empty-xacts": "1"}, dbname=db
    )
    texts = [text for _, _, text in rows]
    assert texts[0] == "BEGIN" and texts[-1] == "COMMIT"
    assert texts[1] == "table public.t: INSERT: id[integer]:7 v[text]:'seven'"


def test_large_transaction_is_streamed_with_proto_2(pg15: PgCluster, fresh_db: NewDb) -> None:
    db, slot = _setup(pg15, fresh_db)
    # 5000 rows of 100 bytes overflow logical_decoding_work_mem (64kB) many times.
    pg15.execute("INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 5000) g", dbname=db)

    streamed = pg15.peek_pgoutput(slot, publications=["pub"], proto_version=2, streaming="on", dbname=db)
    counts = Counter(_kinds(streamed))
    assert counts[b"S"] >= 2 and counts[b"S"] == counts[b"E"]
    assert counts[b"c"] == 1 and counts[b"I"] == 5000
    assert counts[b"B"] == 0 and counts[b"C"] == 0
    assert streamed[0].data[:1] == b"S" and streamed[-1].data[:1] == b"c"

    plain = pg15.peek_pgoutput(slot, publications=["pub"], proto_version=2, dbname=db)
    assert _kinds(plain)[0] == b"B" and _kinds(plain)[-1] == b"C"
    assert b"S" not in _kinds(plain)


def test_two_phase_prepare_then_commit_prepared(cluster: PgCluster, fresh_db: NewDb) -> None:
    db, slot = _setup(cluster, fresh_db, two_phase=True)
    gid = f"gid_{db}"
    cluster.execute(f"BEGIN; INSERT INTO t VALUES (1, 'a'); PREPARE TRANSACTION '{gid}'", dbname=db)

    def peek() -> list[CapturedMessage]:
        return cluster.peek_pgoutput(slot, publications=["pub"], proto_version=3, two_phase=True, dbname=db)

    prepared = peek()
    assert _kinds(prepared) == [b"b", b"R", b"I", b"P"]
    assert gid.encode() in prepared[-1].data

    cluster.execute(f"COMMIT PREPARED '{gid}'", dbname=db)
    assert _kinds(peek()) == [b"b", b"R", b"I", b"P", b"K"]


def test_pg16_parallel_streaming_with_proto_4(pg16: PgCluster, fresh_db: NewDb) -> None:
    db, slot = _setup(pg16, fresh_db)
    pg16.execute("INSERT INTO t SELECT g, repeat('y', 100) FROM generate_series(1, 5000) g", dbname=db)

    messages = pg16.peek_pgoutput(
        slot, publications=["pub"], proto_version=4, streaming="parallel", dbname=db
    )
    counts = Counter(_kinds(messages))
    assert counts[b"S"] >= 2 and counts[b"S"] == counts[b"E"] and counts[b"c"] == 1


def test_pg15_refuses_parallel_streaming(pg15: PgCluster, fresh_db: NewDb) -> None:
    db, slot = _setup(pg15, fresh_db)
    with pytest.raises(psycopg.Error, match="streaming requires a Boolean value"):
        pg15.peek_pgoutput(slot, publications=["pub"], proto_version=4, streaming="parallel", dbname=db)


def test_pg16_accepts_origin(pg16: PgCluster, fresh_db: NewDb) -> None:
    db, slot = _setup(pg16, fresh_db)
    pg16.execute("INSERT INTO t VALUES (1, 'a')", dbname=db)
    messages = pg16.peek_pgoutput(slot, publications=["pub"], proto_version=4, origin="none", dbname=db)
    assert _kinds(messages) == [b"B", b"R", b"I", b"C"]


def test_pgserver_wheel_unpacked_for_a_python_it_has_no_build_for_runs_postgresql_16(fresh_db: NewDb) -> None:
    """On Python 3.13 the dev extra has no pgserver: its Python 3.12 wheel's server, unpacked, serves."""
    with tempfile.TemporaryDirectory() as tmp:  # not under pytest's own, which the postgres user cannot enter
        Path(tmp).chmod(0o755)
        bindir = pgcluster.unpack_pgserver(Path(tmp) / "pgserver")
        assert not list(Path(tmp, "pgserver").glob("**/*.py"))  # the server only, none of pgserver's Python
        with PgCluster(bindir) as pg16:
            assert pg16.version_num // 10000 == 16
            db, slot = _setup(pg16, fresh_db)
            pg16.execute("INSERT INTO t VALUES (1, 'a')", dbname=db)
            messages = pg16.peek_pgoutput(slot, publications=["pub"], proto_version=4, dbname=db)
            assert _kinds(messages) == [b"B", b"R", b"I", b"C"]


def test_pgserver_binaries_neither_installed_nor_unpacked_are_an_error_naming_both(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(pgcluster, "_installed_pgserver", lambda: None)
    monkeypatch.setattr(pgcluster, "_UNPACKED", tmp_path / "pgserver-0.1.4")
    with pytest.raises(PgClusterError, match=r"PostgreSQL 16's binaries not found: the pgserver package is not "
                                             r"installed .* none were unpacked from its wheel into .*pgserver-0.1.4"):
        PgCluster.pgserver()
    bindir = tmp_path / "pgserver-0.1.4" / "pgserver" / "pginstall" / "bin"
    bindir.mkdir(parents=True)
    (bindir / "postgres").touch()
    assert pgcluster.pgserver_bindir() == bindir


def test_messages_option_and_publication_quoting(pg15: PgCluster, fresh_db: NewDb) -> None:
    db = fresh_db(pg15)
    pg15.execute(
        'CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION "Mixed Pub" FOR TABLE t', dbname=db
    )
    pg15.create_slot(f"m_{db}", dbname=db)
    pg15.execute("SELECT pg_logical_emit_message(false, 'demo', 'hi')", dbname=db)
    # A non-transactional message does not flush WAL and decoding stops at the
    # flush pointer: it becomes visible with the next (synchronous) commit.
    pg15.execute("INSERT INTO t VALUES (1)", dbname=db)
    messages = pg15.peek_pgoutput(
        f"m_{db}", publications=["Mixed Pub"], proto_version=1, messages=True, dbname=db
    )
    assert _kinds(messages) == [b"M", b"B", b"R", b"I", b"C"]
    assert messages[0].xid == 0 and messages[0].data.endswith(b"hi")


def test_run_pgbench(pg15: PgCluster, fresh_db: NewDb) -> None:
    db = fresh_db(pg15)
    pg15.run_pgbench(["-i", "-s", "1", "-q"], dbname=db)
    assert pg15.query("SELECT count(*) FROM pgbench_accounts", dbname=db) == [(100_000,)]
    out = pg15.run_pgbench(["-n", "-t", "20", "-c", "1"], dbname=db)
    assert "number of transactions actually processed: 20" in out


def test_capture_round_trips_through_parquet(pg15: PgCluster, fresh_db: NewDb, tmp_path: Path) -> None:
    db, slot = _setup(pg15, fresh_db)
    pg15.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 50) g", dbname=db)
    messages = pg15.peek_pgoutput(slot, publications=["pub"], proto_version=1, dbname=db)
    assert len(messages) == 53  # Begin, Relation, 50 Inserts, Commit

    files = write_capture_parquet(
        pg15.iter_pgoutput(slot, publications=["pub"], proto_version=1, dbname=db),
        tmp_path,
        cut_points=[2, 40],
    )
    assert [f.name for f in files] == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    tables = [pq.read_table(f) for f in files]
    assert [t.column("seq").to_pylist()[0] for t in tables] == [0, 2, 40]
    rows = [r for t in tables for r in t.to_pylist()]
    assert rows == [{"seq": m.seq, "lsn": m.lsn, "xid": m.xid, "data": m.data} for m in messages]


def test_failed_start_reports_server_log(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(pgcluster._SETTINGS, "shared_buffers", "'not a size'")
    cluster = PgCluster.debian(15)
    with pytest.raises(PgClusterError, match="(?s)server log.*shared_buffers"):
        cluster.start()
    with pytest.raises(PgClusterError, match="not started"):
        _ = cluster.port
