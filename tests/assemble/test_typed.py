"""Typed change rows from decoded tuples, without Spark."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgoutput_spark.assemble.relations import (
    RelationHistory,
    RelationVersion,
    UnknownRelationError,
)
from pgoutput_spark.assemble.typed import _spread, change_schema, typed_changes
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


def test_rows_without_their_transactions_columns_convert_alike_with_those_left_null():
    """`relation_rows(transactions=False)` (a mirror's net change): no commit LSN, time, xid or
    origin sent; the typed rows are the same, those four columns NULL."""
    messages = [
        b.relation(1, "public", "t", "f", [(1, "id", 23, -1), (1, "note", 25, -1)]),
        b.insert(1, b.tuple_data(("t", b"1"), ("t", b"a"))),
        b.update(1, b.tuple_data(("t", b"1"), ("u", None)), b.tuple_data(("t", b"1"), ("t", b"a")), "O"),
        b.delete(1, b.tuple_data(("t", b"1"), ("t", b"a")), "O"),
        b.truncate([1]),
    ]
    decoded, batch = _rows(messages)
    history = _history(decoded)
    schema = change_schema(history.table_columns(1))
    batch = batch.filter(pa.array([False, True, True, True, True]))
    whole = typed_changes(batch, 1, history, schema)
    transactions = ["commit_lsn", "commit_ts", "txn_xid", "txn_origin"]
    thin = typed_changes(batch.drop_columns(transactions), 1, history, schema)
    left_null = ["_commit_lsn", "_commit_ts", "_xid", "_origin"]
    assert thin.schema == schema
    assert all(thin.column(name).null_count == thin.num_rows for name in left_null)
    assert whole.column("_commit_lsn").to_pylist() == [5] * 4 and whole.column("_xid").to_pylist() == [7] * 4
    assert thin.drop_columns(left_null).equals(whole.drop_columns(left_null))


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


def test_a_value_that_does_not_convert_names_table_column_change_and_value():
    rel = b.relation(1, "public", "t", "f", [(1, "id", 23, -1), (0, "d", 1082, -1)])
    good = b.tuple_data(("t", b"1"), ("t", b"2024-02-29"))
    bad = b.tuple_data(("t", b"2"), ("t", b"2023-02-29"))  # no such day
    decoded, batch = _rows([rel, b.insert(1, good), b.insert(1, good), b.update(1, bad, good, "O")])
    with_lsn = batch.append_column("lsn", pa.array([0, 0, 0, 0x2_0000_0010], pa.int64()))
    history = _history(decoded)
    with pytest.raises(TypeConversionError, match=r"public\.t\.d: the update at seq 3 \(LSN 2/10\), new_tuple: "
                                                  r"can't convert text value '2023-02-29' to date") as raised:
        typed_changes(with_lsn.slice(1), 1, history, change_schema(history.table_columns(1)))
    assert "index" not in str(raised.value)  # a position in a batch means nothing to the user


def test_a_column_narrowed_by_a_later_version_keeps_the_wider_type():
    # bigint -> int (PostgreSQL allows it once every value fits); the earlier, larger values stay.
    v1 = b.relation(1, "public", "t", "f", [(1, "id", 23, -1), (0, "n", 20, -1), (0, "x", 1700, 655366)])
    v2 = b.relation(1, "public", "t", "f", [(1, "id", 23, -1), (0, "n", 23, -1), (0, "x", 1700, 589830)])
    messages = [v1, b.insert(1, b.tuple_data(("t", b"1"), ("t", str(2**40).encode()), ("t", b"123456.78"))),
                v2, b.insert(1, b.tuple_data(("t", b"2"), ("t", b"7"), ("t", b"1234.5")))]
    decoded, batch = _rows(messages)
    history = _history(decoded)
    columns = dict(history.table_columns(1))
    assert columns["n"] == pa.int64() and columns["x"] == pa.decimal128(10, 2)  # numeric(10,2), not (9,2)
    out = typed_changes(batch.filter(pa.array([False, True, False, True])), 1, history,
                        change_schema(history.table_columns(1))).to_pylist()
    import decimal

    assert [(r["id"], r["n"], r["x"]) for r in out] == [
        (1, 2**40, decimal.Decimal("123456.78")), (2, 7, decimal.Decimal("1234.50"))]


def test_a_value_the_columns_later_type_cannot_hold_names_the_change():
    # text -> int (ALTER ... TYPE int USING ...): the column has the latest type; an earlier value
    # that is not a number cannot become one.
    v1 = b.relation(1, "public", "t", "f", [(1, "id", 23, -1), (0, "s", 25, -1)])
    v2 = b.relation(1, "public", "t", "f", [(1, "id", 23, -1), (0, "s", 23, -1)])
    messages = [v1, b.insert(1, b.tuple_data(("t", b"1"), ("t", b"12"))),
                b.insert(1, b.tuple_data(("t", b"2"), ("t", b"abc"))),
                v2, b.insert(1, b.tuple_data(("t", b"3"), ("t", b"4")))]
    decoded, batch = _rows(messages)
    history = _history(decoded)
    assert dict(history.table_columns(1))["s"] == pa.int32()
    keep = pa.array([False, True, True, False, True])
    with pytest.raises(TypeConversionError, match=r"public\.t\.s: the insert at seq 2, new_tuple: can't convert "
                                                  r"text value 'abc' to text: the column has type int32"):
        typed_changes(batch.filter(keep), 1, history, change_schema(history.table_columns(1)))
    fine = pa.array([False, True, False, False, True])
    assert [r["s"] for r in typed_changes(batch.filter(fine), 1, history,
                                          change_schema(history.table_columns(1))).to_pylist()] == [12, 4]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_values_spread_over_their_rows_equal_arrows_take(data):
    """A tuple side's typed values spread over the batch's rows (NULL where a row has no tuple):
    byte strings by new offsets into the same data buffer, equal to Arrow's ``take``."""
    arrow_type = data.draw(st.sampled_from([pa.string(), pa.binary(), pa.large_string(), pa.int64()]))
    present = np.array(data.draw(st.lists(st.booleans(), min_size=1, max_size=12)))
    skip = data.draw(st.integers(0, 2))
    texts = st.none() | st.sampled_from(["", "a", "bcd", "xyzxyzxyz"])
    values = data.draw(st.lists(texts, min_size=int(present.sum()) + skip, max_size=int(present.sum()) + skip))
    if arrow_type == pa.binary():
        values = [None if v is None else v.encode() for v in values]
    elif arrow_type == pa.int64():
        values = [None if v is None else len(v) for v in values]
    array = pa.array(values, arrow_type).slice(skip)
    spread = _spread(array, present)
    spread.validate(full=True)
    assert spread.equals(array.take(pa.array(np.cumsum(present) - 1, mask=~present)))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_tuple_values_by_column_equal_arrows_take_and_kinds_read_from_bytes(data):
    """The compiled copy of the tuples' values, column after column, equals Arrow's ``take`` of the
    same positions (text, binary, NULL and unchanged-TOAST values; some rows without a tuple; a
    sliced batch), and the kinds read from the kind column's bytes equal comparing its strings."""
    from pgoutput_spark.assemble import typed
    from pgoutput_spark.decoder import arrow as ab

    width = data.draw(st.integers(1, 4))
    value = st.sampled_from(["n", "u"]).map(lambda k: (k, None)) | st.tuples(
        st.sampled_from(["t", "b"]), st.binary(max_size=9))
    tuples = data.draw(st.lists(st.none() | st.lists(value, min_size=width, max_size=width), min_size=1,
                                max_size=10))
    messages = [b.relation(1, "public", "t", "f", [(1, f"c{j}", 17, -1) for j in range(width)])]
    messages += [b.delete(1, b.tuple_data(*t), "O") if t is not None else b.truncate([1]) for t in tuples]
    decoded, batch = _rows(messages)
    skip = data.draw(st.integers(0, len(tuples)))
    side = batch.column("change").field("old_tuple").slice(skip)
    rows = np.flatnonzero(np.asarray(side.is_valid()))
    compiled, index = typed._tuple_values(side, rows, width)
    compiled.validate(full=True)
    assert compiled.equals(side.values.field("value").take(pa.array(index)))
    kind = side.values.field("kind")
    codes = ab.char_codes(kind)
    for k in "tbun":
        assert np.array_equal(codes == ord(k), np.asarray(pc.fill_null(pc.equal(kind, k), False)))
