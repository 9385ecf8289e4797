"""What the PostgreSQL catalogs say about a relation or type: the oracle for Relation and Type messages."""

from __future__ import annotations

from typing import Any

import psycopg

#: Relation column flag for "part of the replica identity" (protocol docs).
KEY_FLAG = 1


def regclass(conn: psycopg.Connection[Any], name: str) -> int:
    row = conn.execute("SELECT %s::regclass::oid::int8", (name,)).fetchone()
    assert row is not None
    return int(row[0])


def relation_facts(conn: psycopg.Connection[Any], relid: int) -> dict[str, Any]:
    """Namespace, name, relreplident and (flags, name, type oid, typmod) per sent column.

    Key flags follow the replica identity: every column for FULL, the columns of
    the primary key for DEFAULT, of the chosen index for USING INDEX, none for NOTHING.
    Dropped columns are not sent.
    """
    row = conn.execute(
        "SELECT n.nspname, c.relname, c.relreplident::text FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s", (relid,)
    ).fetchone()
    assert row is not None, f"no relation with oid {relid}"
    namespace, name, ident = row
    keys = {
        int(attnum)
        for (attnum,) in conn.execute(
            "SELECT unnest(indkey) FROM pg_index WHERE indrelid = %s"
            " AND CASE %s WHEN 'd' THEN indisprimary WHEN 'i' THEN indisreplident ELSE false END",
            (relid, ident),
        )
    }
    columns = [
        (KEY_FLAG if ident == "f" or attnum in keys else 0, attname, int(atttypid), int(atttypmod))
        for attnum, attname, atttypid, atttypmod in conn.execute(
            "SELECT attnum, attname, atttypid::int8, atttypmod FROM pg_attribute"
            " WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (relid,)
        )
    ]
    return {"namespace": namespace, "name": name, "replica_identity": ident, "columns": columns}


def type_facts(conn: psycopg.Connection[Any], oid: int) -> tuple[str, str]:
    """(namespace, name) as pgoutput's Type message sends them for a column type.

    pgoutput (logicalrep_write_typ) names the *base* type of a domain, and sends
    an empty namespace for pg_catalog.
    """
    row = conn.execute(
        "SELECT CASE WHEN n.nspname = 'pg_catalog' THEN '' ELSE n.nspname END, b.typname"
        " FROM pg_type t JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype"
        " ELSE t.oid END JOIN pg_namespace n ON n.oid = b.typnamespace WHERE t.oid = %s", (oid,)
    ).fetchone()
    assert row is not None, f"no type with oid {oid}"
    return row[0], row[1]


def format_type(conn: psycopg.Connection[Any], oid: int) -> str:
    row = conn.execute("SELECT format_type(%s, NULL)", (oid,)).fetchone()
    assert row is not None
    return str(row[0])
