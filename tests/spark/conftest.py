"""A transaction-heavy workload captured once per test session, with its test_decoding oracle."""

from __future__ import annotations

import threading

import pytest

from pgoutput_spark.testing.pgcluster import PgCluster

from ..decoder.tuple_oracle import Change, Truncate, parse_line
from ..plugins.postgres import new_database

ROWS = 300  # x 400-byte pad: past logical_decoding_work_mem = 64kB, so it streams


def _workload(pg: PgCluster, db: str, *, test_decoding: bool = True) -> None:
    pg.execute("""
        CREATE TABLE a (id int PRIMARY KEY, v text);
        CREATE TABLE b (id int PRIMARY KEY, a_id int REFERENCES a, v text);
        CREATE TABLE c (k text, n int);
        ALTER TABLE c REPLICA IDENTITY FULL;
        CREATE PUBLICATION pub FOR ALL TABLES;
    """, dbname=db)
    pg.create_slot("po", "pgoutput", two_phase=True, dbname=db)
    if test_decoding:  # PostgreSQL 16 from pgserver ships no test_decoding
        pg.create_slot("td", "test_decoding", dbname=db)
    # Slots for the older protocols, without two-phase decoding.
    pg.create_slot("po1", "pgoutput", dbname=db)
    pg.create_slot("po2", "pgoutput", dbname=db)
    pad = "repeat('x', 400)"
    statements = [
        "INSERT INTO a VALUES (1, 'one'), (2, 'two')",
        "UPDATE a SET v = 'uno' WHERE id = 1",
        "UPDATE a SET id = 10 WHERE id = 2",
        "INSERT INTO c VALUES ('k', 1), ('k', 1)",
        # A transaction replayed from another node: it carries an Origin message.
        "SELECT pg_replication_origin_create('upstream')",
        """SELECT pg_replication_origin_session_setup('upstream');
           BEGIN;
           SELECT pg_replication_origin_xact_setup('0/ABC', now());
           INSERT INTO a VALUES (9000, 'from upstream');
           COMMIT;
           SELECT pg_replication_origin_session_reset()""",
        # Streamed, with a large subtransaction rolled back and a small one kept.
        f"""BEGIN;
            INSERT INTO a SELECT g, {pad} FROM generate_series(100, 100 + {ROWS}) g;
            SAVEPOINT s1;
            INSERT INTO a SELECT g, {pad} FROM generate_series(1000, 1000 + {ROWS}) g;
            ROLLBACK TO s1;
            SAVEPOINT s2;
            INSERT INTO a VALUES (5000, 'kept');
            RELEASE s2;
            DELETE FROM a WHERE id = 100;
            COMMIT""",
        # A schema change inside a streamed transaction: the Relation message
        # travels inside the stream block.
        f"""BEGIN; ALTER TABLE a ADD COLUMN extra bigint;
            INSERT INTO a SELECT g, {pad}, g * 2 FROM generate_series(3000, 3000 + {ROWS}) g;
            COMMIT""",
        # Streamed and aborted whole.
        f"BEGIN; INSERT INTO a SELECT g, {pad} FROM generate_series(2000, 2000 + {ROWS}) g; ROLLBACK",
        "BEGIN; INSERT INTO b VALUES (1, 1, 'p'); PREPARE TRANSACTION 'g-commit'",
        "BEGIN; INSERT INTO b VALUES (2, 1, 'q'); PREPARE TRANSACTION 'g-rollback'",
        "INSERT INTO a VALUES (6000, 'between prepare and commit')",
        "COMMIT PREPARED 'g-commit'",
        "ROLLBACK PREPARED 'g-rollback'",
        # Streamed and prepared, then committed.
        f"""BEGIN; INSERT INTO b SELECT g, 1, {pad} FROM generate_series(10, 10 + {ROWS}) g;
            PREPARE TRANSACTION 'g-big'""",
        "COMMIT PREPARED 'g-big'",
        "UPDATE c SET n = 2 WHERE k = 'k'",
        "DELETE FROM a WHERE id = 10",
        "TRUNCATE b, a CASCADE",
        "INSERT INTO a VALUES (7, 'after truncate')",
        "SELECT pg_logical_emit_message(false, 'nt', 'not transactional')",
        "BEGIN; SELECT pg_logical_emit_message(true, 'tx', 'transactional'); "
        "INSERT INTO c VALUES ('m', 0); COMMIT",
    ]
    for sql in statements:
        pg.execute(sql, dbname=db)
    # A streamed transaction interleaved with small commits of another session.
    started, proceed = threading.Event(), threading.Event()

    def long_txn() -> None:
        with pg.connect(db, autocommit=False) as conn:
            conn.execute(f"INSERT INTO c SELECT 'long', g FROM generate_series(1, {ROWS * 20}) g")
            started.set()
            proceed.wait(30)
            conn.execute(f"INSERT INTO c SELECT 'long2', g FROM generate_series(1, {ROWS * 20}) g")
            conn.commit()

    worker = threading.Thread(target=long_txn)
    worker.start()
    started.wait(30)
    for i in range(3):
        pg.execute(f"INSERT INTO a VALUES ({8000 + i}, 'interleaved')", dbname=db)
    proceed.set()
    worker.join()


@pytest.fixture(scope="session")
def workload_db(pg15):
    db = new_database(pg15, "assemble")
    _workload(pg15, db)
    return db


@pytest.fixture(scope="session")
def captured_by_protocol(pg15, workload_db):
    """The workload as protocol 1 (nothing streamed) and protocol 2 (streamed) send it."""
    return {
        1: pg15.peek_pgoutput("po1", publications=["pub"], proto_version=1, dbname=workload_db),
        2: pg15.peek_pgoutput("po2", publications=["pub"], proto_version=2, streaming="on",
                              messages=True, dbname=workload_db),
    }


@pytest.fixture(scope="session")
def captured(pg15, workload_db):
    db = workload_db
    messages = pg15.peek_pgoutput("po", publications=["pub"], proto_version=3, streaming="on",
                                  two_phase=True, messages=True, dbname=db)
    oracle = [parse_line(text) for _, _, text in pg15.peek_test_decoding(
        "td", options={"skip-empty-xacts": "1", "include-xids": "0"}, dbname=db)]
    kinds = {m.data[:1] for m in messages}
    assert {b"S", b"E", b"A", b"c", b"p", b"K", b"r", b"b", b"P", b"T", b"M"} <= kinds
    return messages, [o for o in oracle if isinstance(o, (Change, Truncate))]


@pytest.fixture(scope="session")
def captured_pg16(pg16):
    """The same workload on PostgreSQL 16, protocol 4 with parallel streaming, and the
    tables' final contents (the oracle)."""
    db = new_database(pg16, "assemble16")
    _workload(pg16, db, test_decoding=False)
    messages = pg16.peek_pgoutput("po", publications=["pub"], proto_version=4, streaming="parallel",
                                  two_phase=True, messages=True, dbname=db)
    assert any(m.data[:1] == b"A" and len(m.data) == 25 for m in messages)
    tables = {t: pg16.query(f"SELECT * FROM {t}", dbname=db) for t in ("a", "b", "c")}
    older = {
        1: pg16.peek_pgoutput("po1", publications=["pub"], proto_version=1, dbname=db),
        2: pg16.peek_pgoutput("po2", publications=["pub"], proto_version=2, streaming="on", dbname=db),
        3: pg16.peek_pgoutput("po", publications=["pub"], proto_version=3, streaming="on",
                              two_phase=True, dbname=db),
    }
    return messages, tables, older
