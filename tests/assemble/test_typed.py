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
