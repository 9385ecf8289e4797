"""Transaction assembly against PostgreSQL's own test_decoding output.

A test_decoding slot without streaming or two-phase prints every committed
transaction whole, at its commit, in commit order, without rolled-back
subtransactions, aborted or rolled-back-prepared transactions: exactly the
change sequence that assembly must produce from the pgoutput stream.
"""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from pgoutput_spark import decode
from pgoutput_spark.spark.assemble import ScanState, assemble
from pgoutput_spark.testing.pgcluster import PgCluster

from ..decoder.tuple_oracle import Change, Truncate, parse_line
from ..plugins.postgres import new_database

ROWS = 300  # x 400-byte pad: past logical_decoding_work_mem = 64kB, so it streams


def _workload(pg: PgCluster, db: str) -> None:
    pg.execute("""
        CREATE TABLE a (id int PRIMARY KEY, v text);
        CREATE TABLE b (id int PRIMARY KEY, a_id int REFERENCES a, v text);
        CREATE TABLE c (k text, n int);
        ALTER TABLE c REPLICA IDENTITY FULL;
        CREATE PUBLICATION pub FOR ALL TABLES;
    """, dbname=db)
    pg.create_slot("po", "pgoutput", two_phase=True, dbname=db)
    pg.create_slot("td", "test_decoding", dbname=db)
    pad = "repeat('x', 400)"
    statements = [
        "INSERT INTO a VALUES (1, 'one'), (2, 'two')",
        "UPDATE a SET v = 'uno' WHERE id = 1",
        "UPDATE a SET id = 10 WHERE id = 2",
        "INSERT INTO c VALUES ('k', 1), ('k', 1)",
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


@pytest.fixture(scope="module")
def captured(pg15):
    db = new_database(pg15, "assemble")
    _workload(pg15, db)
    messages = pg15.peek_pgoutput("po", publications=["pub"], proto_version=3, streaming="on",
                                  two_phase=True, messages=True, dbname=db)
    oracle = [parse_line(text) for _, _, text in pg15.peek_test_decoding(
        "td", options={"skip-empty-xacts": "1", "include-xids": "0"}, dbname=db)]
    kinds = {m.data[:1] for m in messages}
    assert {b"S", b"E", b"A", b"c", b"p", b"K", b"r", b"b", b"P", b"T", b"M"} <= kinds
    return messages, [o for o in oracle if isinstance(o, (Change, Truncate))]


def _frame(spark, messages):
    table = pa.table({"seq": [m.seq for m in messages], "lsn": [m.lsn for m in messages],
                      "data": pa.array([m.data for m in messages], pa.binary())})
    return spark.createDataFrame(table.to_pandas())


def _as_oracle(spark, decoded_rows, committed):
    """Our committed changes as (relation, action, new text, old text) in commit order."""
    relations = {}
    for row in decoded_rows:
        if row["message_type"] == "relation":
            r = row["relation"]
            relations[r["relation_id"]] = (r["namespace"], r["relation_name"], r["columns"])
    out = []
    for row in committed:
        kind = row["message_type"]
        if kind == "truncate":
            names = sorted(relations[o][:2] for o in row["truncate"]["relation_ids"])
            out.append(("TRUNCATE", tuple(names), row["truncate"]["cascade"]))
            continue
        change = row["change"]
        namespace, name, columns = relations[change["relation_id"]]
        new = tuple((c["name"], v["value"].decode() if v["value"] is not None else v["kind"])
                    for c, v in zip(columns, change["new_tuple"] or []))
        old = tuple((c["name"], v["value"].decode()) for c, v in zip(columns, change["old_tuple"] or [])
                    if v["kind"] != "n")
        out.append((kind.upper(), (namespace, name), new, old))
    return out


def _oracle(changes):
    out = []
    for ch in changes:
        if isinstance(ch, Truncate):
            out.append(("TRUNCATE", tuple(sorted(ch.relations)), ch.cascade))
            continue
        new = tuple((c.name, c.text if c.kind == "value" else {"null": "n", "unchanged-toast": "u"}[c.kind])
                    for c in ch.new or ())
        old = tuple((c.name, c.text) for c in ch.old or () if c.kind == "value")
        out.append((ch.action, ch.relation, new, old))
    return out


def _committed_in_order(assembled):
    return assembled.committed.orderBy("commit_seq", "seq").collect()


def test_committed_changes_equal_test_decoding(spark, captured):
    messages, oracle = captured
    decoded = decode(_frame(spark, messages))
    assembled = assemble(decoded, rows_per_bucket=200)  # many buckets: carries cross them
    rows = decoded.orderBy("seq").collect()
    ours = _as_oracle(spark, rows, _committed_in_order(assembled))
    assert ours == _oracle(oracle)
    assert assembled.open_rows.count() == 0
    assert assembled.end_state == ScanState(None, None)
    outcomes = sorted(t.outcome.value for t in assembled.ledger.txns)
    assert outcomes == ["committed", "committed", "committed", "committed", "discarded", "discarded"]
    assert len(assembled.ledger.discards) == 1
    msgs = assembled.messages.orderBy("seq").collect()
    assert [(m["prefix"], bytes(m["content"]), m["commit_lsn"] is not None) for m in msgs] == [
        ("nt", b"not transactional", False), ("tx", b"transactional", True)]


@pytest.mark.parametrize("cuts", [[40, 90, 300, 301, 700], [5, 10, 15, 1200, 1400]])
def test_runs_cut_anywhere_carry_open_transactions(spark, captured, cuts):
    messages, oracle = captured
    bounds = [0, *[c for c in cuts if c < len(messages)], len(messages)]
    state, pending = ScanState(), None
    committed = []
    decoded_all = []
    for lo, hi in zip(bounds, bounds[1:]):
        part = _frame(spark, messages[lo:hi])
        decoded = decode(part, initially_in_stream=state.last_stream_xid is not None)
        decoded_all += decoded.collect()
        assembled = assemble(decoded, state, pending=pending, rows_per_bucket=50)
        committed += assembled.committed.collect()
        state = assembled.end_state
        pending = spark.createDataFrame(assembled.open_rows.collect(), assembled.open_rows.schema)
    assert pending.count() == 0
    committed.sort(key=lambda r: (r["commit_seq"], r["seq"]))
    decoded_all.sort(key=lambda r: r["seq"])
    assert _as_oracle(spark, decoded_all, committed) == _oracle(oracle)
    assert len({r["seq"] for r in committed}) == len(committed)


def test_committed_rows_carry_commit_metadata(spark, captured):
    messages, _ = captured
    committed = assemble(decode(_frame(spark, messages))).committed
    missing = committed.where(F.col("commit_lsn").isNull() | F.col("commit_ts").isNull()
                              | F.col("txn_xid").isNull() | F.col("commit_seq").isNull())
    assert missing.count() == 0
    # Changes take effect at or after their own position, never before.
    assert committed.where(F.col("commit_seq") < F.col("seq")).count() == 0
