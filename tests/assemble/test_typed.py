"""Typed change rows from decoded tuples, without Spark."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pgoutput_spark.assemble.relations import (
    RelationHistory,
    RelationVersion,
    UnknownRelationError,
)
from pgoutput_spark.assemble.typed import change_schema, typed_changes
from pgoutput_spark.decoder.batch import decode_batch
from pgoutput_spark.errors import TypeConversionError

from ..decoder import builders as b


def _rows(messages):
    decoded = decode_batch(pa.array(messages, pa.binary()), in_stream=np.zeros(len(messages), bool),
                           seq=np.arange(len(messages)), lsn=np.arange(len(messages))).batch
    n = decoded.num_rows
    extra = {"commit_seq": pa.array([99] * n, pa.int64()), "commit_lsn": pa.array([5] * n, pa.int64()),
             "commit_ts": pa.array([0] * n, pa.timestamp("us", tz="UTC")),
             "txn_xid": pa.array([7] * n, pa.int64()), "txn_origin": pa.nulls(n, pa.string())}
    columns = {name: decoded.column(name) for name in ("seq", "message_type", "change", "truncate")}
    return decoded, pa.RecordBatch.from_pydict({**columns, **extra})


def _history(decoded):
    history = RelationHistory()
    for row in decoded.to_pylist():
        if row["message_type"] == "relation":
            history.add([RelationVersion.from_row(row["seq"], row["relation"])])
    return history


class _Dict(dict):
    def asDict(self, recursive=False):  # noqa: N802 - mimics pyspark Row
        return self


def test_versions_typed_values_unchanged_toast_and_old_key():
    v1 = b.relation(1, "public", "t", "d", [(1, "id", 23, -1), (0, "note", 25, -1)])
    v2 = b.relation(1, "public", "t", "d", [(1, "id", 23, -1), (0, "note", 25, -1), (0, "n", 20, -1)])
    messages = [
        v1,
        b.insert(1, b.tuple_data(("t", b"1"), ("t", b"a"))),
        v2,
        b.update(1, b.tuple_data(("t", b"2"), ("u", None), ("t", b"-5")), b.tuple_data(("t", b"1"), ("n", None),
                                                                                         ("n", None)), "K"),
        b.truncate([1, 2]),
    ]
    decoded, batch = _rows(messages)
    history = _history(decoded)
    schema = change_schema(history.table_columns(1))
    keep = pa.array(np.isin(np.arange(len(messages)), [1, 3, 4]))
    out = typed_changes(batch.filter(keep), 1, history, schema).to_pylist()
    assert [(r["_op"], r["id"], r["note"], r["n"], r["_unchanged_toast"]) for r in out] == [
        ("insert", 1, "a", None, []), ("update", 2, None, -5, ["note"]), ("truncate", None, None, None, None)]
    assert out[1]["_old"] == {"id": 1, "note": None, "n": None} and out[1]["_old_kind"] == "K"
    assert schema.field("n").type == pa.int64()


def test_change_before_any_relation_message_names_oid_and_seq():
    decoded, batch = _rows([b.insert(77, b.tuple_data(("t", b"1")))])
    history = RelationHistory()
    history.add([RelationVersion.from_row(5, _Dict(relation_id=77, namespace="s", relation_name="t",
                                                   replica_identity="d", columns=[]))])
    with pytest.raises(UnknownRelationError, match="seq 0 refers to relation OID 77"):
        typed_changes(batch, 77, history, change_schema([]))


def test_metadata_name_clash_is_an_error():
    with pytest.raises(TypeConversionError, match="_op"):
        change_schema([("_op", pa.string())])


def test_a_batch_converts_as_its_rows_do_one_by_one():
    """Rows with and without old / new tuples, text and binary values, a Relation message sent
    again with the same columns, a schema change and truncates between them: converting the
    batch at once gives each row what converting it alone gives."""
    cols = [(1, "id", 23, -1), (0, "note", 25, -1), (0, "raw", 17, -1)]
    v1 = b.relation(1, "public", "t", "f", cols)
    v2 = b.relation(1, "public", "t", "f", cols + [(0, "n", 20, -1)])

    def row(*values):
        return b.tuple_data(*values)

    messages = [
        v1,
        b.insert(1, row(("t", b"1"), ("t", b"a"), ("t", b"\\x00ff"))),
        b.insert(1, row(("b", b"\x00\x00\x00\x07"), ("n", None), ("b", b"\x01\x02"))),
        v1,  # the same columns again (a new walsender session)
        b.update(1, row(("t", b"2"), ("u", None), ("t", b"\\x")),
                 row(("t", b"1"), ("t", b"a"), ("t", b"\\x00ff")), "O"),
        b.truncate([1]),
        b.delete(1, row(("b", b"\x00\x00\x00\x07"), ("n", None), ("b", b"\x01\x02")), "O"),
        b.update(1, row(("t", b"3"), ("t", b"c"), ("n", None))),
        v2,
        b.insert(1, row(("t", b"4"), ("t", b"d"), ("n", None), ("b", b"\x00" * 7 + b"\x09"))),
        b.update(1, row(("t", b"5"), ("u", None), ("u", None), ("t", b"-1")),
                 row(("t", b"4"), ("t", b"d"), ("n", None), ("t", b"9")), "O"),
        b.delete(1, row(("t", b"5"), ("t", b"e"), ("n", None), ("n", None)), "O"),
    ]
    decoded, batch = _rows(messages)
    history = _history(decoded)
    schema = change_schema(history.table_columns(1))
    changes = batch.filter(pa.array([t != "relation" for t in batch.column("message_type").to_pylist()]))
    together = typed_changes(changes, 1, history, schema).to_pylist()
    alone = [typed_changes(changes.slice(i, 1), 1, history, schema).to_pylist()[0]
             for i in range(changes.num_rows)]
    assert together == alone
    assert [(r["_op"], r["id"], r["raw"], r["n"]) for r in together] == [
        ("insert", 1, b"\x00\xff", None), ("insert", 7, b"\x01\x02", None), ("update", 2, b"", None),
        ("truncate", None, None, None), ("delete", None, None, None), ("update", 3, None, None),
        ("insert", 4, None, 9), ("update", 5, None, -1), ("delete", None, None, None)]
    assert [r["_old"] and r["_old"]["id"] for r in together] == [None, None, 1, None, 7, None, None, 4, 5]
    assert [r["_unchanged_toast"] for r in together] == [[], [], ["note"], None, [], [], [], ["note", "raw"], []]


@pytest.mark.parametrize("side", ["new_tuple", "old_tuple"])
def test_a_tuple_with_another_column_count_than_its_relation_is_an_error(side):
    rel = b.relation(1, "public", "t", "f", [(1, "id", 23, -1), (0, "note", 25, -1), (0, "n", 20, -1)])
    good = b.tuple_data(("t", b"1"), ("t", b"a"), ("t", b"5"))
    short = b.tuple_data(("t", b"2"), ("t", b"b"))
    changed = b.update(1, short, good, "O") if side == "new_tuple" else b.update(1, good, short, "O")
    decoded, batch = _rows([rel, b.insert(1, good), changed, b.insert(1, good)])
    history = _history(decoded)
    with pytest.raises(TypeConversionError, match=rf"public\.t: the update at seq 2 has 2 columns in its "
                                                  rf"{side}, but its Relation message \(seq 0\) has 3"):
        typed_changes(batch.slice(1), 1, history, change_schema(history.table_columns(1)))
    with_lsn = batch.append_column("lsn", pa.array([0, 0, 0x1_0000_0020, 0], pa.int64()))
    with pytest.raises(TypeConversionError, match=r"the update at seq 2 \(LSN 1/20\) has 2 columns"):
        typed_changes(with_lsn.slice(1), 1, history, change_schema(history.table_columns(1)))
