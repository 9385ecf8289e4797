"""The whole pipeline on object storage: snapshot, capture, apply and verify in a bucket.

One scenario (`run_pipeline`), run against each object store's server by
`tests/test_s3_pg.py` and `tests/test_gcs_pg.py`: the job runs in a child process with a
Spark session of its own that has the store's Hadoop connector as users add it. The
snapshot and the mirrors go through Spark's connector, the Parquet landing through
Arrow's client under the same URI, a Delta landing of a twin slot's stream through
Spark's. PostgreSQL is the oracle: the mirrors' rows are compared with its tables',
`verify` with its own reading of them, and the Delta landing with the messages it
decodes for a third slot.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from pgoutput_spark.testing.pgcluster import PgCluster

from .plugins.postgres import new_database
from .plugins.s3 import Bucket

ROOT = Path(__file__).resolve().parents[1]

_JOB = textwrap.dedent("""
    import json, sys
    import psycopg
    from pgoutput_spark import mirror, read_capture
    from pgoutput_spark.apply import run_apply
    from pgoutput_spark.slot.capture import capture_slot
    from pgoutput_spark.slot.snapshot import snapshot_tables
    from pgoutput_spark.slot.verify import verify_mirrors
    from pgoutput_spark.spark.session import build_spark_session

    args = json.loads(sys.argv[1])
    spark = build_spark_session(master="local[2]", conf=args["conf"])
    target, landing, dsn = args["target"], args["landing"], args["dsn"]
    snapshot = snapshot_tables(spark, target, slot=args["slot"], publications=["store_pub"], dsn=dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:  # traffic after the snapshot
        for twin in args["twins"]:  # one for a Delta landing, one PostgreSQL peeks at for the test
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (twin,))
        for statement in args["traffic"]:
            conn.execute(statement)
    captured = capture_slot(landing, slot=args["slot"], dsn=dsn, publications=["store_pub"], chunk_size=50)
    # The same traffic through a twin slot into a Delta landing in the bucket, read back.
    in_delta = capture_slot(args["delta_landing"], slot=args["twins"][0], dsn=dsn, publications=["store_pub"],
                            proto_version=1, chunk_size=50, format="delta", spark=spark)
    stream = [[r.seq, r.lsn, r.xid, r.data.hex()] for r in read_capture(spark, args["delta_landing"])
              .orderBy("seq").select("seq", "lsn", "xid", "data").collect()]
    applied = run_apply(spark, read_capture(spark, landing), target)
    again = run_apply(spark, read_capture(spark, landing), target)
    verified = verify_mirrors(spark, target, landing, dsn=dsn)
    rows = {name: sorted([list(r) for r in mirror(spark, target, name).collect()], key=repr)
            for name in ("public.keyed", "public.bag")}
    print(json.dumps({"snapshot": {t.table: t.rows for t in snapshot.tables}, "chunks": len(captured.chunks),
                      "delta_chunks": len(in_delta.chunks), "delta_stream": stream,
                      "applied": [[t.table, t.inserted, t.updated, t.deleted] for t in applied.tables],
                      "again_skipped": again.skipped, "states": {t.table: t.state for t in verified.tables},
                      "rows": rows}, default=str))  # numeric: Decimal as its text
""")


def _rows(pg: PgCluster, db: str, query: str) -> list[list[Any]]:
    return sorted([list(r) for r in pg.query(query, dbname=db)], key=repr)


def run_pipeline(pg15: PgCluster, bucket: Bucket, conf: dict[str, str], tmp_path: Path) -> None:
    """Snapshot, capture (a Parquet and a Delta landing), apply twice and verify in ``bucket``,
    the job's Spark session with ``conf`` (its store's connector) and its process with the test's
    environment (where Arrow's client finds the store); checked against PostgreSQL and the bucket."""
    db = new_database(pg15, bucket.uri.split(":", 1)[0])
    pg15.execute("CREATE TABLE keyed (id int PRIMARY KEY, v text, n numeric(8, 2));"
                 " CREATE TABLE bag (v text, n int); ALTER TABLE bag REPLICA IDENTITY FULL;"
                 " INSERT INTO keyed SELECT g, 'before ' || g, g / 4.0 FROM generate_series(1, 50) g;"
                 " INSERT INTO bag SELECT 'same', 1 FROM generate_series(1, 3);"
                 " CREATE PUBLICATION store_pub FOR TABLE keyed, bag", dbname=db)
    traffic = ["UPDATE keyed SET v = 'after', n = n * 2 WHERE id % 3 = 0", "DELETE FROM keyed WHERE id > 45",
               "INSERT INTO keyed SELECT g, 'new', g FROM generate_series(100, 140) g",
               "UPDATE keyed SET id = id + 1000 WHERE id = 1",  # a key change
               "DELETE FROM bag WHERE ctid IN (SELECT ctid FROM bag LIMIT 1)", "INSERT INTO bag VALUES ('x', 2)"]
    args = {"conf": conf, "target": f"{bucket.uri}/target", "landing": f"{bucket.uri}/landing",
            "dsn": pg15.conninfo(db), "slot": f"{db}_slot", "twins": [f"{db}_twin", f"{db}_peek"],
            "delta_landing": f"{bucket.uri}/delta-landing", "traffic": traffic}
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PGOUTPUT_SPARK_CACHE": str(tmp_path / "cache")}
    run = subprocess.run([sys.executable, "-c", _JOB, json.dumps(args)], cwd=ROOT, env=env, text=True,
                         capture_output=True, timeout=900)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-5000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])

    assert result["snapshot"] == {"public.keyed": 50, "public.bag": 3} and result["chunks"] > 1
    # The Delta landing (written and read by Spark through the connector) holds the stream
    # PostgreSQL decodes for a slot made at the same point, numbered from 0. Each chunk is a
    # decoding session that sends a table's Relation message again: those are compared as a set.
    delta = result["delta_stream"]
    peeked = [[m.lsn, m.xid, m.data.hex()] for m in pg15.peek_pgoutput(f"{db}_peek", publications=["store_pub"],
                                                                       proto_version=1, dbname=db)]
    assert result["delta_chunks"] > 1 and len(delta) >= len(peeked) > 50
    assert [r[0] for r in delta] == list(range(len(delta)))
    assert [r[1:] for r in delta if not r[3].startswith("52")] == [r for r in peeked if not r[2].startswith("52")]
    assert {r[3] for r in delta if r[3].startswith("52")} == {r[2] for r in peeked if r[2].startswith("52")}
    assert result["again_skipped"]
    assert result["states"] == {"public.keyed": "equal", "public.bag": "equal"}
    keyed = [[i, v, str(n)] for i, v, n in _rows(pg15, db, "SELECT id, v, n FROM keyed")]
    assert result["rows"]["public.keyed"] == keyed
    assert result["rows"]["public.bag"] == _rows(pg15, db, "SELECT v, n FROM bag")
    # Everything the job wrote is in the bucket: the landing's chunk files, the mirrors' logs.
    names = {f.path[len(bucket.root) + 1:]
             for f in bucket.fs.get_file_info(pafs.FileSelector(bucket.root, recursive=True))}
    assert {"landing/_pgoutput_capture.json", "landing/part-00000001.parquet",
            "target/public/keyed/_delta_log/00000000000000000000.json", "target/_runs/_delta_log/"
            "00000000000000000000.json"} <= names, sorted(names)[:20]
    assert not [n for n in names if "/_writing-" in n or n.startswith("target/_pgoutput/snapshot/")]
    assert "delta-landing/_delta_log/00000000000000000000.json" in names
    assert not [n for n in names if n.startswith("delta-landing/_pgoutput_capture_work/")]
    pg15.drop_slot(f"{db}_slot", dbname=db)
    for slot in ("twin", "peek"):
        pg15.drop_slot(f"{db}_{slot}", dbname=db)
