"""What a capture holds: message types, sizes, and its change messages split by table."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pgoutput_spark.decoder.protocol import MessageType
from pgoutput_spark.decoder.stream import StreamEvents

_CHANGES = (MessageType.INSERT, MessageType.UPDATE, MessageType.DELETE)


def _layout(data: pa.BinaryArray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, bytes) of a binary array, as NumPy views."""
    offsets = np.frombuffer(data.buffers()[1], dtype=np.int32)[data.offset: data.offset + len(data) + 1]
    return offsets, np.frombuffer(data.buffers()[2], dtype=np.uint8)


def type_bytes(table: pa.Table) -> np.ndarray:
    offsets, buf = _layout(table.column("data").combine_chunks())
    return buf[offsets[:-1]]


def describe(table: pa.Table) -> tuple[StreamEvents, str]:
    """The capture's stream events and a one-line summary of its message types."""
    offsets, buf = _layout(table.column("data").combine_chunks())
    kinds = buf[offsets[:-1]]
    events = StreamEvents.from_messages(table.column("seq").to_numpy(), kinds)
    values, counts = np.unique(kinds, return_counts=True)
    parts = [f"{MessageType(int(k)).doc_name} {c / kinds.size:.1%}" for k, c in zip(values, counts)]
    mean = (offsets[-1] - offsets[0]) / max(kinds.size, 1)
    return events, f"{', '.join(parts)}; {mean:.0f} B/message on average"


def _relation_names(table: pa.Table, kinds: np.ndarray) -> dict[int, str]:
    names = {}
    for data in table.column("data").filter(pa.array(kinds == MessageType.RELATION)).to_pylist():
        relation_id = int.from_bytes(data[1:5], "big")
        namespace_end = data.index(b"\0", 5)
        names[relation_id] = data[namespace_end + 1: data.index(b"\0", namespace_end + 1)].decode()
    return names


def changes_by_table(table: pa.Table, groups: dict[str, str]) -> dict[str, pa.Table]:
    """Insert / Update / Delete messages whose table name starts with each group's prefix.

    ``groups`` maps a label to a table-name prefix, e.g. ``{"narrow": "pgbench_"}``.
    """
    kinds = type_bytes(table)
    names = _relation_names(table, kinds)
    offsets, buf = _layout(table.column("data").combine_chunks())
    starts = offsets[:-1]
    is_change = np.isin(kinds, np.array(_CHANGES, dtype=np.uint8))
    relation = np.zeros(kinds.size, dtype=np.int64)
    for i in range(4):  # Int32 relation id right after the type byte
        relation = (relation << 8) | buf[np.minimum(starts + 1 + i, buf.size - 1)]
    out = {}
    for label, prefix in groups.items():
        ids = [rid for rid, name in names.items() if name.startswith(prefix)]
        keep = is_change & np.isin(relation, ids)
        out[label] = table.filter(pa.array(keep))
    return out
