"""The relation history from real Relation / Type messages, sent again in every walsender session."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pgoutput_spark.assemble.relations import RelationHistory, RelationVersion, TypeVersion
from pgoutput_spark.decoder.batch import decode_batch
from pgoutput_spark.testing.pgcluster import PgCluster

from ..plugins.postgres import new_database

pytestmark = pytest.mark.postgres

FIRST_NORMAL_OID = 16384  # PostgreSQL's first OID for user objects


def _versions(messages) -> list[RelationVersion | TypeVersion]:
    """Relation and Type versions of captured messages, each at its capture position."""
    data = pa.array([m.data for m in messages], pa.binary())
    seq = np.array([m.seq for m in messages], np.int64)
    decoded = decode_batch(data, in_stream=np.zeros(len(messages), bool), seq=seq,
                           lsn=np.array([int(m.lsn) for m in messages], np.int64)).batch
    out: list[RelationVersion | TypeVersion] = []
    for row in decoded.to_pylist():
        if row["message_type"] == "relation":
            out.append(RelationVersion.from_row(row["seq"], row["relation"]))
        elif row["message_type"] == "type":
            t = row["type"]
            out.append(TypeVersion(row["seq"], t["type_id"], t["namespace"], t["name"]))
    return out


def _columns(pg: PgCluster, db: str) -> list[tuple[str, int, str | None]]:
    """The published table's columns as PostgreSQL has them now: name, type OID, and the type's
    name where it is not built in (the Type message names those)."""
    return [(name, oid, type_name if oid >= FIRST_NORMAL_OID else None) for name, oid, type_name in pg.query(
        "SELECT a.attname, a.atttypid::int, t.typname FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid"
        " WHERE a.attrelid = 'public.t'::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        dbname=db)]


def test_a_schema_sent_again_in_each_session_is_kept_once_and_changes_are_kept(pg15):
    """Each `get` below is a decoding session of its own, as each capture chunk is: PostgreSQL
    sends the table's Relation message and its enum column's Type message again in each. The
    history keeps one version per schema the table had (PostgreSQL's catalog at each step),
    and `add` returns only the versions it kept, those a run saves."""
    db = new_database(pg15, "relations")
    pg15.execute("CREATE TYPE mood AS ENUM ('ok', 'sad'); CREATE TABLE t (id int PRIMARY KEY, m mood);"
                 " CREATE PUBLICATION pub FOR TABLE t", dbname=db)
    pg15.create_slot("rel_slot", dbname=db)
    options = {"publications": ["pub"], "proto_version": 1, "dbname": db}
    schemas, sessions = [], []
    for step, ddl in enumerate(["", "", "ALTER TABLE t ADD COLUMN note text",
                                "ALTER TYPE mood RENAME TO feeling", "", "ALTER TABLE t DROP COLUMN note"]):
        if ddl:
            pg15.execute(ddl, dbname=db)
        pg15.execute(f"INSERT INTO t (id, m) VALUES ({step}, 'ok')", dbname=db)
        schemas.append(_columns(pg15, db))
        sessions.append(pg15.get_pgoutput("rel_slot", seq_start=100 * step, **options))
    assert [sum(m.data[:1] == b"R" for m in s) for s in sessions] == [1] * 6  # sent again in each session
    assert [sum(m.data[:1] == b"Y" for m in s) for s in sessions] == [1] * 6

    history = RelationHistory()
    kept = [history.add(_versions(s)) for s in sessions]
    (oid,) = history.relations
    versions = history.relations[oid]
    # One version per distinct schema PostgreSQL had, in order: steps 0, 2, 3 (the type's new
    # name), 5 (the column dropped: the same columns as step 0, a change all the same).
    changed = [0] + [i for i in range(1, 6) if schemas[i] != schemas[i - 1]]
    assert changed == [0, 2, 3, 5]
    assert [v.seq // 100 for v in versions] == changed
    for v in versions:
        step = v.seq // 100
        assert [(c.name, c.type_oid, history.pg_type(c, v.seq + 1).name) for c in v.columns] == schemas[step]
    assert [[v.seq // 100 for v in k if isinstance(v, RelationVersion)] for k in kept] == [[0], [], [2], [3], [], [5]]
    # The type's versions: its first name, and the rename (sent at step 3).
    (type_versions,) = history.types.values()
    assert [(v.seq // 100, v.name) for v in type_versions] == [(0, "mood"), (3, "feeling")]

    # A change anywhere converts with the schema in effect then.
    inserts = {s_i: next(m.seq for m in s if m.data[:1] == b"I") for s_i, s in enumerate(sessions)}
    assert [history.version_at(oid, inserts[i]).seq // 100 for i in range(6)] == [0, 0, 2, 3, 3, 5]

    # Loading the saved versions again, then adding the sessions again (a redone run), keeps
    # nothing new; a history loaded from a table that kept every repeat (before runs left
    # them out) comes out the same.
    again = RelationHistory()
    again.add([v for k in kept for v in k])
    assert [again.add(_versions(s)) for s in sessions] == [[]] * 6
    assert again.relations == history.relations and again.types == history.types
    every = RelationHistory()
    every.add([v for s in sessions for v in _versions(s)])
    assert every.relations == history.relations and every.types == history.types
