"""Real captured messages: every truncation and one extra byte are rejected; the batch path agrees.

The samples are the shortest captured message of every shape (type byte, in a
stream block or not, old-tuple marker, zero columns or not, Stream Abort length) from PG15 with
protocol 3 and PG16 and 18 with protocol 4, so every message type of the protocol is
cut at every byte position. The compiled walk of the change messages and the
NumPy one agree on all of it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pgoutput_spark import decode_message
from pgoutput_spark.decoder import messages as m
from pgoutput_spark.decoder.batch import decode_batch
from pgoutput_spark.decoder.messages import message_from_row
from pgoutput_spark.decoder.stream import StreamEvents
from pgoutput_spark.errors import DecodeError

from ..test_kernel import assert_engines_agree
from .conftest import Capture, ServerWorkload
from .test_every_message_type import EXPECTED_TYPES

pytestmark = pytest.mark.postgres

Sample = tuple[tuple[object, ...], bytes, bool]  # (shape, data, in_stream)


def _samples(capture: Capture) -> list[Sample]:
    shortest: dict[tuple[object, ...], tuple[bytes, bool]] = {}
    for row, in_stream, msg in capture.items():
        shape: tuple[object, ...] = (chr(row.data[0]), in_stream)
        if isinstance(msg, m.Insert | m.Update | m.Delete):
            tuple_ = msg.old_tuple if isinstance(msg, m.Delete) else msg.new_tuple
            shape += (getattr(msg, "old_kind", None), len(tuple_) == 0)
        if isinstance(msg, m.StreamAbort):
            shape += (len(row.data),)
        if shape not in shortest or len(row.data) < len(shortest[shape][0]):
            shortest[shape] = (row.data, in_stream)
    return [(shape, data, in_stream) for shape, (data, in_stream) in sorted(shortest.items(), key=str)]


@pytest.fixture(scope="module", params=[("pg15", 3), ("pg16", 4), ("pg18", 4)],
                ids=["pg15-proto3", "pg16-proto4", "pg18-proto4"])
def samples(request: pytest.FixtureRequest) -> tuple[int, list[Sample]]:
    server, proto = request.param
    workload: ServerWorkload = request.getfixturevalue(f"{server}_workload")
    return proto, _samples(workload.capture(proto))


def _accepts(data: bytes, in_stream: bool) -> bool:
    try:
        decode_message(data, in_stream)
    except DecodeError:
        return False
    return True


def test_samples_cover_every_message_type(samples: tuple[int, list[Sample]]) -> None:
    proto, found = samples
    assert {shape[0] for shape, _, _ in found} == EXPECTED_TYPES[proto]
    shapes = {shape for shape, _, _ in found}
    # Streamed and plain data messages, both old-tuple kinds, an Update without one, and
    # the zero-column table's Insert and Delete (shapes: type, in stream, old kind, no columns).
    assert {("I", True, None, False), ("I", False, None, False), ("I", False, None, True),
            ("U", False, "K", False), ("U", False, "O", False), ("U", False, None, False),
            ("D", False, "K", False), ("D", False, "O", False), ("D", False, "O", True),
            ("R", True), ("Y", True), ("M", True)} <= shapes
    assert ("A", False, 25 if proto == 4 else 9) in shapes


def test_every_truncation_and_one_extra_byte_are_rejected(samples: tuple[int, list[Sample]]) -> None:
    _, found = samples
    accepted = []
    for shape, data, in_stream in found:
        for k in range(len(data)):
            if shape[0] == "A" and len(data) == 25 and k == 9:
                continue  # the 9-byte form of Stream Abort, checked below
            if _accepts(data[:k], in_stream):
                accepted.append((shape, k, data[:k].hex()))
        if _accepts(data + b"\x00", in_stream):
            accepted.append((shape, len(data) + 1, (data + b"\x00").hex()))
    assert accepted == []


def test_short_form_of_a_parallel_stream_abort(samples: tuple[int, list[Sample]]) -> None:
    proto, found = samples
    if proto < 4:
        assert all(len(data) == 9 for shape, data, _ in found if shape[0] == "A")
        return
    data = next(data for shape, data, _ in found if shape[0] == "A")
    full = decode_message(data)
    assert isinstance(full, m.StreamAbort) and full.abort_lsn is not None
    assert decode_message(data[:9]) == m.StreamAbort(full.xid, full.subxid)


def test_vectorized_truncations_are_rejected_too(samples: tuple[int, list[Sample]]) -> None:
    _, found = samples
    cut = [(data[:k], in_stream) for shape, data, in_stream in found for k in range(len(data))
           if not (shape[0] == "A" and len(data) == 25 and k == 9)]
    decoded = decode_batch(pa.array([d for d, _ in cut], type=pa.binary()),
                           in_stream=np.array([s for _, s in cut]), seq=np.arange(len(cut)),
                           lsn=np.zeros(len(cut), dtype=np.int64))
    assert decoded.error_rows.tolist() == list(range(len(cut)))
    assert decoded.batch.column("raw").to_pylist() == [d for d, _ in cut]


def test_decode_batch_of_a_whole_capture_equals_decode_message(capture: Capture) -> None:
    seq = np.array([r.seq for r in capture.messages])
    lsn = np.array([r.lsn for r in capture.messages])
    type_byte = np.array([r.data[0] for r in capture.messages], dtype=np.uint8)
    flags = np.array(capture.in_stream)
    # The package's stream-state pass agrees with the flags computed here
    # (it counts a Stream Stop as inside its block; decode_batch ignores that).
    events = StreamEvents.from_messages(seq, type_byte)
    assert (events.in_stream(seq) == (flags | (type_byte == ord("E")))).all()

    decoded = decode_batch(pa.array([r.data for r in capture.messages], type=pa.binary()),
                           in_stream=events.in_stream(seq), seq=seq, lsn=lsn)
    assert decoded.error_rows.size == 0
    rows = decoded.batch.to_pylist()
    assert [r["seq"] for r in rows] == seq.tolist() and [r["lsn"] for r in rows] == lsn.tolist()
    assert [r["in_stream"] for r in rows] == flags.tolist()
    assert [message_from_row(r) for r in rows] == capture.decoded


def test_compiled_and_numpy_walks_agree_on_the_whole_capture(capture: Capture) -> None:
    assert_engines_agree([r.data for r in capture.messages], list(capture.in_stream))


def test_compiled_and_numpy_walks_agree_on_every_truncation(samples: tuple[int, list[Sample]]) -> None:
    _, found = samples
    cut = [(data[:k], in_stream) for _, data, in_stream in found for k in range(len(data) + 1)]
    cut += [(data + b"\x00", in_stream) for _, data, in_stream in found]
    decoded = assert_engines_agree([d for d, _ in cut], [s for _, s in cut])
    assert decoded.error_rows.size > len(cut) // 2
