"""The changes job follows the configuration's ``tables``: which tables, and their columns' types.

PostgreSQL is the oracle: a trigger journals every row version of the source
table in PostgreSQL's own casts (``::numeric(12,2)``, ``::float8``, ``::text``),
which the change table's rows must equal, change for change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pgoutput_spark import decode, read_capture
from pgoutput_spark.changefeed import run_changes
from pgoutput_spark.config import TablesConfig
from pgoutput_spark.errors import ConfigError
from pgoutput_spark.slot.capture import capture_slot
from pgoutput_spark.spark.changes import change_frames
from pgoutput_spark.testing.pgcluster import PgCluster

from ..plugins.postgres import new_database
from .deltalog import commits

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

TYPES = {"public.m": {"amount": "decimal(12, 2)", "rate": "double", "note": "string"}}


def _rows(values: list[Any]) -> list[tuple[Any, ...]]:  # NaN as text: NaN != NaN
    return [tuple("NaN" if v != v else v for v in row) for row in values]


def test_changes_follow_tables_include_exclude_and_types(spark: Any, pg15: PgCluster, tmp_path: Path) -> None:
    """``tables.exclude`` leaves a table's change table unwritten (a truncate of it and of an
    included table writes the included one's row only) and the run names it; ``tables.types``
    converts each change's values as PostgreSQL's casts do; ``change_frames`` follows both; an
    override the column's type cannot take stops the run before a change table is written."""
    db = new_database(pg15, "changes_tables")
    pg15.execute(
        "CREATE TABLE m (id int PRIMARY KEY, amount numeric, rate numeric, note numeric(6,2));"
        " CREATE TABLE secret (id int PRIMARY KEY, v text);"
        " CREATE TABLE journal (n serial PRIMARY KEY, id int, amount numeric(12,2), rate float8, note text);"
        " CREATE FUNCTION keep() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        "   INSERT INTO journal (id, amount, rate, note) VALUES (NEW.id, NEW.amount, NEW.rate, NEW.note::text);"
        "   RETURN NEW; END $$;"
        " CREATE TRIGGER keep AFTER INSERT OR UPDATE ON m FOR EACH ROW EXECUTE FUNCTION keep();"
        " CREATE PUBLICATION pub FOR TABLE m, secret", dbname=db)
    slot, landing, target = f"{db}_slot", str(tmp_path / "landing"), str(tmp_path / "target")
    dsn = pg15.conninfo(db)
    pg15.create_slot(slot, dbname=db)
    pg15.execute("INSERT INTO m SELECT g, g / 7.0, (g / 3.0) * 10::numeric ^ (g % 5 - 2), g / 8.0"
                 "   FROM generate_series(1, 30) g;"
                 " INSERT INTO m VALUES (31, 0.125, 'NaN', NULL), (32, -0.125, 'Infinity', 1.5);"
                 " INSERT INTO secret SELECT g, md5(g::text) FROM generate_series(1, 10) g;"
                 " UPDATE m SET amount = amount * 3.33333, rate = rate / 7 WHERE id % 4 = 0;"
                 " UPDATE secret SET v = 'x' WHERE id < 4;"
                 " TRUNCATE m, secret;"
                 " INSERT INTO m VALUES (43, 2.675, 0.00001, 2.25), (44, -2.675, '-Infinity', NULL);"
                 " INSERT INTO secret VALUES (1, 'after')", dbname=db)
    capture_slot(landing, slot=slot, dsn=dsn, publications=["pub"], proto_version=1)
    tables = TablesConfig(exclude=("public.secret",), types=TYPES)

    result = run_changes(spark, read_capture(spark, landing), target, tables=tables)
    assert result.excluded == ("public.secret",) and set(result.changes) == {"public.m"}
    assert "not written (tables.include / exclude): public.secret" in result.render()
    assert not (tmp_path / "target" / "_changes" / "public" / "secret").exists()
    path = f"{target}/_changes/public/m"
    frame = spark.read.format("delta").load(path)
    assert {f.name: f.dataType.simpleString() for f in frame.schema if not f.name.startswith("_")} == \
        {"id": "int", "amount": "decimal(12,2)", "rate": "double", "note": "string"}
    ours = frame.orderBy("_commit_seq", "_seq").collect()
    assert [r["_op"] for r in ours].count("truncate") == 1
    expected = pg15.query("SELECT id, amount, rate, note FROM journal ORDER BY n", dbname=db)
    assert _rows([(r["id"], r["amount"], r["rate"], r["note"]) for r in ours if r["_op"] != "truncate"]) == \
        _rows(expected)

    frames = change_frames(decode(read_capture(spark, landing)), tables=tables)
    assert list(frames) == ["public.m"]
    assert [f.dataType.simpleString() for f in frames["public.m"].schema if f.name in TYPES["public.m"]] == \
        ["decimal(12,2)", "double", "string"]

    before = commits(path)
    pg15.execute("UPDATE m SET rate = 1 WHERE id = 43", dbname=db)
    capture_slot(landing, slot=slot, dsn=dsn)
    with pytest.raises(ConfigError, match=r"tables\.types: public\.m\.id is int4; double applies to numeric "
                                          r"columns only"):
        run_changes(spark, read_capture(spark, landing), target,
                    tables=TablesConfig(types={"public.m": {**TYPES["public.m"], "id": "double"}}))
    assert commits(path) == before
    pg15.drop_slot(slot, dbname=db)
