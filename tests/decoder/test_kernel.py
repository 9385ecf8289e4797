"""The compiled walk of Insert / Update / Delete (numba) equals the NumPy walk, errors included.

The NumPy walk is checked against PostgreSQL elsewhere (tests/decoder/postgres);
here both engines decode the same batches and must give the same Arrow batch
and the same `DecodeError` for every failed message.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgoutput_spark.decoder import kernel
from pgoutput_spark.decoder.batch import DecodedBatch, decode_batch

from . import builders as b


def _decode(messages: list[bytes], in_stream: list[bool], engine: str,
            binary_type: pa.DataType = pa.binary()) -> DecodedBatch:
    n = len(messages)
    return decode_batch(pa.array(messages, type=binary_type), in_stream=np.array(in_stream, bool),
                        seq=np.arange(n) + 100, lsn=np.arange(n) * 8, engine=engine)


def assert_engines_agree(messages: list[bytes], in_stream: list[bool],
                         binary_type: pa.DataType = pa.binary()) -> DecodedBatch:
    compiled = _decode(messages, in_stream, "numba", binary_type)
    reference = _decode(messages, in_stream, "numpy", binary_type)
    assert compiled.error_rows.tolist() == reference.error_rows.tolist()
    for row in reference.error_rows:
        assert str(compiled.error(int(row))) == str(reference.error(int(row)))
    assert compiled.batch.equals(reference.batch), compiled.batch.to_pylist()
    return compiled


def _changes() -> list[tuple[bytes, bool]]:
    """Every builder message plus change messages of every shape (old kinds, NULL,
    unchanged TOAST, binary, empty and zero-column tuples, stream xids)."""
    row = b.tuple_data(("t", b"42"), ("n", None), ("u", None), ("b", b"\x00\x01"), ("t", b""))
    key = b.tuple_data(("t", b"7"))
    return b.every_message() + [
        (b.insert(16384, row), False),
        (b.insert(16384, b.tuple_data()), False),
        (b.insert(16384, row, xid=900), True),
        (b.update(16384, row), False),
        (b.update(16384, row, old=key, old_kind="K"), False),
        (b.update(16384, row, old=row, old_kind="O", xid=901), True),
        (b.delete(16384, key, old_kind="K"), False),
        (b.delete(16384, b.tuple_data(), old_kind="O"), False),
        (b.delete(16384, row, old_kind="O", xid=902), True),
    ]


@pytest.mark.parametrize("binary_type", [pa.binary(), pa.large_binary()])
def test_every_message_alone_and_together(binary_type: pa.DataType) -> None:
    messages = _changes()
    decoded = assert_engines_agree([m for m, _ in messages], [s for _, s in messages], binary_type)
    assert decoded.error_rows.size == 0
    for data, in_stream in messages:
        assert_engines_agree([data], [in_stream])


def test_every_truncation_and_an_extra_byte() -> None:
    cut = [(data[:k], in_stream) for data, in_stream in _changes() for k in range(len(data))]
    cut += [(data + b"\x00", in_stream) for data, in_stream in _changes()]
    # Good messages between the broken ones, so failures sit inside every group.
    rows = [r for pair in zip(cut, _changes() * (len(cut) // len(_changes()) + 1)) for r in pair]
    decoded = assert_engines_agree([d for d, _ in rows], [s for _, s in rows])
    cut_changes = {i for i in range(0, len(rows), 2) if rows[i][0][:1] in (b"I", b"U", b"D")}
    assert len(cut_changes) > 100
    assert set(decoded.error_rows.tolist()) >= cut_changes


def test_bad_markers_kinds_and_lengths_name_their_field() -> None:
    row = b.tuple_data(("t", b"42"), ("t", b"x"))
    bad_kind = bytearray(b.insert(1, row))
    bad_kind[bad_kind.index(b"t", 7)] = ord("z")
    negative = bytearray(b.insert(1, row))
    negative[9:13] = b"\xff\xff\xff\xfe"
    messages = [b.insert(1, row).replace(b"N", b"X", 1), b.update(1, row, old=row, old_kind="K")[:-1],
                b.delete(1, row, old_kind="N"), bytes(bad_kind), bytes(negative),
                b.insert(1, b"\x00\x09" + b"t"), b.update(1, row, old=row, old_kind="O") + b"!"]
    decoded = assert_engines_agree(messages, [False] * len(messages))
    fields = [decoded.error(i).field for i in range(len(messages))]
    assert fields == ["Insert.marker", "Update.new_tuple[1].value", "Delete.marker",
                      "Insert.new_tuple[0].kind", "Insert.new_tuple[0].length",
                      "Insert.new_tuple.ncolumns", "Update"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(_changes()), st.lists(st.tuples(st.integers(0, 10_000),
                                                                          st.integers(0, 255)),
                                                                max_size=3)),
                min_size=1, max_size=12))
def test_mutated_batches(rows) -> None:
    messages, in_stream = [], []
    for (data, stream), edits in rows:
        mutated = bytearray(data)
        for at, value in edits:
            mutated[at % len(mutated)] = value
        messages.append(bytes(mutated))
        in_stream.append(stream)
    assert_engines_agree(messages, in_stream)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([b"I", b"U", b"D"]), st.binary(max_size=40), st.booleans()),
                min_size=1, max_size=12))
def test_random_change_bodies(rows) -> None:
    assert_engines_agree([t + body for t, body, _ in rows], [s for _, _, s in rows])


def test_engine_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGOUTPUT_SPARK_DECODER", raising=False)
    assert kernel.engine() == "numba"
    monkeypatch.setenv("PGOUTPUT_SPARK_DECODER", "numpy")
    assert kernel.engine() == "numpy"
    monkeypatch.setenv("PGOUTPUT_SPARK_DECODER", "fortran")
    with pytest.raises(ValueError, match="PGOUTPUT_SPARK_DECODER='fortran'"):
        kernel.engine()
