"""Regenerate the sample pgoutput capture in ``examples/sample_capture``.

    .venv/bin/python scripts/make_sample_capture.py [--out examples/sample_capture]

Starts a throwaway PostgreSQL 15 cluster (Debian binaries), creates a small
shop schema, opens a two-phase pgoutput slot on a FOR ALL TABLES publication,
runs a mixed workload (inserts, updates incl. a primary key change, deletes, a
TRUNCATE ... CASCADE, a streamed transaction with a rolled-back savepoint,
prepared transactions committed and rolled back, logical messages, an ALTER
TABLE mid-way) and writes what pgoutput produced (protocol 3, streaming,
two_phase and messages on) as three Parquet capture files whose cut points fall
inside stream blocks. Prints one summary line.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from pgoutput_spark.testing.capture_files import CapturedMessage, write_capture_parquet  # noqa: E402
from pgoutput_spark.testing.pgcluster import PgCluster  # noqa: E402

DATABASE = "shop_demo"
PUBLICATION = "shop_pub"
SLOT = "shop_slot"
MAX_BYTES = 400 * 1024

SCHEMA = """
CREATE SCHEMA shop;
CREATE TYPE shop.order_status AS ENUM ('new', 'paid', 'shipped', 'cancelled');
CREATE TABLE shop.customers (
    id integer PRIMARY KEY,
    email text NOT NULL UNIQUE,
    name text NOT NULL,
    tags text[] NOT NULL DEFAULT '{}',
    notes text,
    created_at timestamptz NOT NULL
);
CREATE TABLE shop.orders (
    id bigint PRIMARY KEY,
    customer_id integer NOT NULL REFERENCES shop.customers (id) ON UPDATE CASCADE,
    status shop.order_status NOT NULL DEFAULT 'new',
    total numeric(12, 2) NOT NULL,
    details jsonb NOT NULL,
    placed_at timestamptz NOT NULL
);
-- No primary key: every update and delete carries the whole old row.
CREATE TABLE shop.products (sku text NOT NULL, title text NOT NULL, price numeric(10, 2), stock integer);
ALTER TABLE shop.products REPLICA IDENTITY FULL;
CREATE TABLE shop.promotions (id integer PRIMARY KEY, code text NOT NULL, percent_off smallint NOT NULL);
CREATE TABLE shop.promotion_uses (
    promotion_id integer NOT NULL REFERENCES shop.promotions (id),
    order_id bigint NOT NULL,
    PRIMARY KEY (promotion_id, order_id)
);
CREATE PUBLICATION shop_pub FOR ALL TABLES;
"""


def _orders(first: int, last: int, *, customer: str = "1 + g % 5", pad: int = 40) -> str:
    """An INSERT of orders first..last with deterministic values (no random())."""
    return f"""
    INSERT INTO shop.orders
    SELECT g, {customer}, (ARRAY['new','paid','shipped']::shop.order_status[])[1 + g % 3],
           round((g * 13.37) % 500 + 0.99, 2),
           jsonb_build_object('items', jsonb_build_array(jsonb_build_object(
               'sku', 'SKU-' || (g % 6), 'qty', 1 + g % 4)), 'channel', 'web',
               'note', repeat(chr(97 + g % 26), {pad})),
           timestamptz '2024-05-01 09:00:00+00' + g * interval '7 minutes'
    FROM generate_series({first}, {last}) g;
    """


# Each entry is one round trip on the main session, or ("side", sql) on a second
# session that commits while the main one holds a transaction open. The
# comments say what each step shows in the capture.
WORKLOAD: list[str | tuple[str, str]] = [
    # Seed data: plain inserts, one customer with a TOASTed (out-of-line) note.
    """
    BEGIN;
    INSERT INTO shop.customers (id, email, name, tags, created_at)
    SELECT g, 'customer' || g || '@example.com', 'Customer ' || g,
           ARRAY['tier-' || (g % 3), 'newsletter'], timestamptz '2024-04-01 12:00:00+00' + g * interval '1 day'
    FROM generate_series(1, 8) g;
    UPDATE shop.customers SET notes = (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 120) g)
    WHERE id = 2;
    INSERT INTO shop.products VALUES ('SKU-0', 'Kettle', 29.90, 12), ('SKU-1', 'Teapot', 19.50, 30),
        ('SKU-2', 'Mug', 6.00, 200), ('SKU-3', 'Tea, green', 4.25, 80),
        ('SKU-4', 'Tea, black', 3.95, 75), ('SKU-5', 'Infuser', 7.10, NULL);
    INSERT INTO shop.promotions VALUES (1, 'SPRING10', 10), (2, 'WELCOME5', 5), (3, 'VIP20', 20);
    COMMIT;
    """,
    "BEGIN;"
    + _orders(1, 12, customer="1 + g % 7")
    + "INSERT INTO shop.promotion_uses VALUES (1, 1), (1, 4), (2, 5), (3, 9); COMMIT;",
    # Updates: the TOASTed note of customer 2 is unchanged ('u' in the new tuple).
    """
    BEGIN;
    UPDATE shop.customers SET email = 'c2@example.org', tags = tags || '{"vip"}' WHERE id = 2;
    UPDATE shop.orders SET status = 'paid' WHERE id IN (1, 2, 3);
    COMMIT;
    """,
    # Primary key change (old key 'K'), cascading to the orders of customer 7.
    "UPDATE shop.customers SET id = 107 WHERE id = 7",
    # REPLICA IDENTITY FULL: old rows ('O') on update and delete.
    (
        "BEGIN; UPDATE shop.products SET price = price * 1.10 WHERE sku IN ('SKU-0', 'SKU-2');"
        " DELETE FROM shop.products WHERE sku = 'SKU-5'; COMMIT;"
    ),
    "BEGIN; DELETE FROM shop.orders WHERE id = 12; DELETE FROM shop.customers WHERE id = 8; COMMIT;",
    # A transactional logical message with a change, then a non-transactional one.
    (
        "BEGIN; SELECT pg_logical_emit_message(true, 'shop.audit', 'price review started');"
        " UPDATE shop.products SET stock = stock - 1 WHERE sku = 'SKU-1'; COMMIT;"
    ),
    "SELECT pg_logical_emit_message(false, 'shop.heartbeat', '{\"ok\": true}')",
    # Schema change mid-way: the next customer change carries a new Relation.
    "ALTER TABLE shop.customers ADD COLUMN loyalty_points integer NOT NULL DEFAULT 0",
    (
        "BEGIN; UPDATE shop.customers SET loyalty_points = 50 WHERE id IN (1, 3);"
        " INSERT INTO shop.customers (id, email, name, created_at, loyalty_points)"
        " VALUES (9, 'late@example.com', 'Late Signup', timestamptz '2024-05-20 08:00:00+00', 5); COMMIT;"
    ),
    # A large transaction that exceeds logical_decoding_work_mem (64kB) and is
    # streamed; its rolled-back savepoint was streamed too (Stream Abort 'A').
    "BEGIN;" + _orders(1000, 1349) + "SAVEPOINT bulk;" + _orders(2000, 2299)
    + "ROLLBACK TO SAVEPOINT bulk;"
    + "UPDATE shop.orders SET status = 'shipped' WHERE id BETWEEN 1000 AND 1019;"
    + "UPDATE shop.customers SET loyalty_points = loyalty_points + 10 WHERE id = 4; COMMIT;",
    # A streamed transaction with small transactions of another session
    # committing in between: their Begin..Commit sits between stream blocks.
    "BEGIN;" + _orders(4000, 4239),
    ("side", "UPDATE shop.products SET stock = stock + 100 WHERE sku = 'SKU-2'"),
    _orders(4240, 4479),
    ("side", "BEGIN; INSERT INTO shop.promotions VALUES (5, 'FLASH30', 30); COMMIT;"),
    "COMMIT",
    # A streamed transaction that rolls back as a whole (Stream Abort of the top xid).
    "BEGIN;" + _orders(5000, 5299) + "ROLLBACK;",
    # Two-phase commit: a streamed prepared transaction (Stream Prepare 'p'),
    # then a small one committed and one rolled back.
    "BEGIN;" + _orders(6000, 6299) + "PREPARE TRANSACTION 'shop-bulk';",
    "COMMIT PREPARED 'shop-bulk'",
    "BEGIN;" + _orders(3000, 3004) + "UPDATE shop.products SET stock = stock - 5 WHERE sku = 'SKU-3';"
    " PREPARE TRANSACTION 'shop-batch-1';",
    "COMMIT PREPARED 'shop-batch-1'",
    "BEGIN;" + _orders(3100, 3102) + "PREPARE TRANSACTION 'shop-batch-2';",
    "ROLLBACK PREPARED 'shop-batch-2'",
    # TRUNCATE ... CASCADE: one Truncate message for both tables.
    "TRUNCATE shop.promotions CASCADE",
    (
        "BEGIN; INSERT INTO shop.promotions VALUES (4, 'SUMMER15', 15); INSERT INTO shop.promotion_uses"
        " VALUES (4, 3000); UPDATE shop.orders SET status = 'cancelled' WHERE id = 3001; COMMIT;"
    ),
]


def stream_cut_points(messages: list[CapturedMessage], files: int) -> list[int]:
    """`files - 1` cut seqs, each in the middle of a different stream block."""
    blocks: list[tuple[int, int]] = []
    start: int | None = None
    for message in messages:
        kind = message.data[:1]
        if kind == b"S":
            start = message.seq
        elif kind == b"E" and start is not None:
            blocks.append((start, message.seq))
            start = None
    if len(blocks) < files - 1:
        raise RuntimeError(f"need {files - 1} stream blocks to cut inside, the capture has {len(blocks)}")
    chosen = [blocks[round(i * (len(blocks) - 1) / max(files - 2, 1))] for i in range(files - 1)]
    return [(first + last) // 2 for first, last in chosen]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "examples" / "sample_capture")
    parser.add_argument("--files", type=int, default=3, help="number of capture files (default 3)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    with PgCluster.debian(15) as pg:
        pg.create_database(DATABASE)
        pg.execute(SCHEMA, dbname=DATABASE)
        pg.create_slot(SLOT, two_phase=True, dbname=DATABASE)
        with pg.connect(DATABASE) as main_session, pg.connect(DATABASE) as side_session:
            for step in WORKLOAD:
                session, sql = (main_session, step) if isinstance(step, str) else (side_session, step[1])
                session.execute(sql)
        messages = pg.peek_pgoutput(
            SLOT, publications=[PUBLICATION], proto_version=3, streaming="on",
            two_phase=True, messages=True, dbname=DATABASE,
        )  # fmt: skip

    cuts = stream_cut_points(messages, args.files)
    files = write_capture_parquet(messages, args.out, cut_points=cuts, overwrite=True)
    size = sum(f.stat().st_size for f in files)
    kinds = Counter(m.data[:1].decode("ascii") for m in messages)
    summary = " ".join(f"{k}={n}" for k, n in sorted(kinds.items()))
    print(
        f"{len(messages)} messages, {len(files)} files (cuts at seq {cuts}), {size} bytes"
        f" in {args.out} [{summary}]"
    )
    if size > MAX_BYTES:
        print(f"capture is larger than {MAX_BYTES} bytes: shrink the workload", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
