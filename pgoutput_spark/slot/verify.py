"""`verify_mirrors`: compare each mirror with its live source table (row count and a row hash).

Both sides are reduced to the same thing: each row's published columns as
Arrow values of the mirror's types (the source through the snapshot's COPY
and the change conversion, the mirror as Delta stores it), each value turned
into a canonical text (`canonical_text`: decimals without trailing zeros,
timestamps in UTC, lists and structs spelled out, NULL distinct from any
text), the row's texts joined and hashed to 64 bits; a table's hash is the
sum of its rows' hashes modulo 2^64, so it ignores order and counts
duplicates. A hash computed in Python over Arrow values on both sides keeps
the comparison exact for every type the mirror holds.

A comparison only means something where the mirror is complete up to the
source's state. The source is read in one REPEATABLE READ snapshot at WAL
position ``W``; the target's applied position comes from its lease. If the
apply has not consumed the whole landing, or the slot holds committed changes
to a table before ``W``, that table is reported "not comparable" with the
reason instead of as drift.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ..config import TablesConfig
from ..decoder.messages import decode_message
from ..decoder.protocol import MessageType
from ..errors import CaptureError, ConfigError
from ..lsn import Lsn
from .delta_landing import DeltaLanding
from .landing import ParquetLanding
from .options import PluginOptions
from .snapshot import PublishedTable, copy_to_file, published_tables, read_copy
from .source import SlotSource, connect

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["TableCheck", "VerifyResult", "canonical_text", "row_hashes", "verify_mirrors"]

_NULL = b"\x00N"
_BLOCK = 16 << 20  # CSV text per converted batch
_SEPARATOR = b"\x1f"
_CHANGES = (MessageType.INSERT, MessageType.UPDATE, MessageType.DELETE, MessageType.TRUNCATE)


def canonical_text(array: pa.Array) -> pa.Array:
    """Each value's canonical text as ``binary`` (NULL stays NULL)."""
    t = array.type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = canonical_text(array.values)
        inner = pc.fill_null(inner, _NULL)
        rebuilt = type(array).from_arrays(array.offsets, inner, mask=array.is_null())
        return pc.binary_join_element_wise(b"[", pc.binary_join(rebuilt, b","), b"]", b"")
    if pa.types.is_struct(t):
        parts = [pc.fill_null(canonical_text(array.field(i)), _NULL) for i in range(t.num_fields)]
        joined = pc.binary_join_element_wise(b"{", *_interleave(parts, b","), b"}", b"")
        return pc.if_else(array.is_null(), pa.scalar(None, pa.binary()), joined)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return array.cast(pa.binary())
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return array.cast(pa.string()).cast(pa.binary())
    if pa.types.is_timestamp(t) and t.tz is not None:
        array = array.cast(pa.timestamp(t.unit, "UTC"))
    text = array.cast(pa.string())
    if pa.types.is_decimal(t):  # a widened decimal keeps the value, not the zeros
        text = pc.replace_substring_regex(text, r"^(-?\d+)\.(\d*?)0*$", r"\1.\2")
        text = pc.replace_substring_regex(text, r"\.$", "")
    return text.cast(pa.binary())


def _interleave(parts: list[pa.Array], separator: bytes) -> list[Any]:
    out: list[Any] = []
    for i, part in enumerate(parts):
        out += ([separator] if i else []) + [part]
    return out


def row_hashes(batch: pa.RecordBatch | pa.Table) -> np.ndarray:
    """A 64-bit hash of each row's canonical text (columns in order), as uint64."""
    if batch.num_rows == 0:
        return np.zeros(0, np.uint64)
    columns = [pc.fill_null(canonical_text(_chunk(batch.column(i))), _NULL) for i in range(batch.num_columns)]
    rows = pc.binary_join_element_wise(*columns, _SEPARATOR) if columns else pa.array([b""] * batch.num_rows)
    hashes: np.ndarray = pd.util.hash_array(np.asarray(rows.to_pylist(), dtype=object), categorize=False)
    return hashes


def _chunk(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _mod_sum(hashes: np.ndarray) -> int:
    return int(np.sum(hashes, dtype=np.uint64))  # wraps modulo 2^64


@dataclass
class TableCheck:
    table: str
    path: str
    state: str  # equal | differs | not comparable | no source
    source_rows: int = 0
    mirror_rows: int | None = None
    source_hash: int = 0
    mirror_hash: int | None = None
    reason: str = ""
    keys: list[str] = field(default_factory=list)

    def render(self) -> str:
        mirror = "-" if self.mirror_rows is None else f"{self.mirror_rows:,}"
        line = (f"{self.table:<40} {self.state:<15} source {self.source_rows:>10,} rows {self.source_hash:016x}"
                f"  mirror {mirror:>10} rows {self.mirror_hash or 0:016x}")
        out = [line + (f"  ({self.reason})" if self.reason else "")]
        out += [f"    {key}" for key in self.keys]
        return "\n".join(out)


@dataclass
class VerifyResult:
    source_lsn: Lsn
    applied_lsn: Lsn | None
    tables: list[TableCheck]

    @property
    def differing(self) -> list[TableCheck]:
        return [t for t in self.tables if t.state == "differs"]

    def render(self) -> str:
        applied = "no change applied yet" if self.applied_lsn is None else f"applied up to {self.applied_lsn}"
        lines = [f"source at {self.source_lsn}, mirrors {applied}"]
        lines += [t.render() for t in sorted(self.tables, key=lambda t: t.table)]
        counts = {s: sum(t.state == s for t in self.tables) for s in ("equal", "differs", "not comparable")}
        orphans = sum(t.state == "no source" for t in self.tables)
        lines.append(", ".join(f"{n} {s}" for s, n in counts.items())
                     + (f", {orphans} without a source" if orphans else ""))
        return "\n".join(lines)


def verify_mirrors(spark: SparkSession, target: str, landing: str, *, dsn: str | None = None,
                   pipeline: str = "default", table_path: str | None = None, keys: bool = False,
                   selection: TablesConfig | None = None) -> VerifyResult:
    """Compare every mirror under `target` with its source table (see the module doc).

    `landing` is where `pgoutput-spark capture` lands (Parquet folder or Delta table): it names the
    slot and publications. With `keys`, a differing table also lists up to 20
    primary-key values whose rows differ. `selection` (the configuration's ``tables``): the tables
    mirrored, and the columns kept as text.
    """
    from ..capture import _is_delta
    from ..mirroring.names import DEFAULT_TABLE_PATH, mirror_path
    from ..reading import ChangeFeedStatus, status
    store = DeltaLanding(spark, landing) if _is_delta(spark, landing) else ParquetLanding(landing)
    info = store.info()
    if info is None:
        raise CaptureError(f"{landing} is not a landing of pgoutput-spark capture (no _pgoutput_capture.json"
                           " or capture commit)")
    last = store.last_chunk()
    publications = tuple(info["options"]["publications"])
    applied = status(spark, target, pipeline)
    if isinstance(applied, ChangeFeedStatus):
        raise ConfigError(f"{target} holds a change feed (pgoutput-spark changes), not mirrors: verify compares "
                          f"the mirrors of an apply target with their source tables")
    behind = last is not None and (applied.position is None or applied.position < last.last_seq)
    template = table_path or DEFAULT_TABLE_PATH
    work = Path(tempfile.mkdtemp(prefix="pgoutput-verify-"))
    try:
        conn = connect(dsn)
        with conn:
            source = SlotSource(conn, info["slot"], PluginOptions(publications, 1), dsn)
            source.apply_settings()
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            point = source.server_lsn()  # a standby's: the WAL it has replayed
            tables = published_tables(conn, publications, selection)
            key_positions = {t.oid: _key_columns(conn, t) if keys else [] for t in tables}
            sides = {t.oid: _source_side(conn, t, work, key_positions[t.oid]) for t in tables}
            conn.execute("COMMIT")
            pending = {} if behind else _pending_changes(source, point)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    checks = []
    for table in tables:
        name = f"{table.schema}.{table.name}"
        path = mirror_path(target, table.schema, table.name, template)
        rows, total, key_rows = sides[table.oid]
        check = TableCheck(name, path, "equal", rows, source_hash=total)
        mirror = _mirror_side(spark, path, table, key_positions[table.oid])
        if mirror is not None:
            check.mirror_rows, check.mirror_hash, mirror_keys = mirror
        else:
            check.mirror_rows, check.mirror_hash, mirror_keys = 0, 0, {}
            check.reason = "no mirror"
        same = (check.mirror_rows, check.mirror_hash) == (rows, total)
        if behind:
            check.state = "not comparable" if not same else "equal"
            at = ("has applied none of it" if applied.position is None
                  else f"is at capture seq {applied.position}")
            check.reason = (f"the landing holds up to seq {last.last_seq} and the apply {at}:"  # type: ignore[union-attr]
                            " run apply first")
        elif table.oid in pending and not same:
            check.state = "not comparable"
            check.reason = f"{pending[table.oid]} change(s) committed before {point} are not applied yet"
        elif not same:
            check.state = "differs"
            if keys:
                check.keys = _differing_keys(key_rows, mirror_keys)
        checks.append(check)
    compared = {c.path for c in checks}
    for name, (path, rows) in applied.mirrors.items():  # mirrors the runs wrote, by their first name
        if path not in compared and (selection is None or selection.selected(name)):
            checks.append(TableCheck(name, path, "no source", 0, mirror_rows=rows,
                                     reason="no published table of this name now (dropped, renamed or "
                                            "left the publication): the mirror keeps its last rows"))
    return VerifyResult(point, None if applied.read_point is None else Lsn(applied.read_point), checks)


def _key_columns(conn: Any, table: PublishedTable) -> list[int]:
    """Positions, among the published columns, of the primary key (or replica identity index)."""
    names = [r[0] for r in conn.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
        " AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s AND (i.indisprimary OR i.indisreplident)"
        " ORDER BY i.indisprimary DESC, a.attnum", (table.oid,))]
    published = [c[0] for c in table.columns]
    return [published.index(n) for n in dict.fromkeys(names) if n in published]


def _source_side(conn: Any, table: PublishedTable, work: Path, key_positions: list[int]) -> tuple[
        int, int, dict[str, list[int]]]:
    """Rows, hash and (for `key_positions`) key text -> row hashes of the source table."""
    text = work / f"{table.oid}.csv"
    if copy_to_file(conn, table, text, every=_BLOCK) == 0 or not table.columns:
        return 0, 0, {}
    schema = pa.schema(table.arrow_columns())
    rows, total = 0, 0
    by_key: dict[str, list[int]] = {}
    for batch in read_copy(text, table, schema, _BLOCK):
        hashes = row_hashes(batch)
        rows += batch.num_rows
        total = (total + _mod_sum(hashes)) % (1 << 64)
        if key_positions:
            _collect_keys(by_key, batch.select(key_positions), hashes)
    return rows, total, by_key


def _collect_keys(by_key: dict[str, list[int]], key_batch: Any, hashes: np.ndarray) -> None:
    texts = [pc.fill_null(canonical_text(_chunk(key_batch.column(i))), _NULL) for i in range(key_batch.num_columns)]
    joined = pc.binary_join_element_wise(*texts, b",") if len(texts) > 1 else texts[0]
    for key, h in zip(joined.to_pylist(), hashes.tolist()):
        by_key.setdefault(key.decode(errors="replace"), []).append(h)


def _mirror_side(spark: SparkSession, path: str, table: PublishedTable, key_positions: list[int]) -> tuple[
        int, int, dict[str, list[int]]] | None:
    from pyspark.sql import functions as F

    from ..capture import _is_delta
    from ..mirroring.listed import read_current
    from ..mirroring.names import quote
    from ..mirroring.rows import arrays_without_nulls, restore_null_arrays

    if not _is_delta(spark, path):
        return None
    frame = read_current(spark, path)
    present = set(frame.columns)
    # by position: mapInArrow cannot take some column names ("a.b")
    columns = [(F.col(quote(n)) if n in present else F.lit(None)).alias(f"c{i}")
               for i, (n, _, _) in enumerate(table.columns)]
    frame = frame.select(*columns)
    safe, flags = arrays_without_nulls(frame)  # runs of NULL arrays are slow to reach Arrow

    def hashed(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows, total = 0, 0
        for batch in batches:
            rows += batch.num_rows
            data = restore_null_arrays(pa.Table.from_batches([batch]), flags)
            total = (total + _mod_sum(row_hashes(data))) % (1 << 64)
        yield pa.record_batch([pa.array([rows], pa.int64()), pa.array([str(total)], pa.string())],
                              names=["rows", "hash"])

    parts = safe.mapInArrow(hashed, "rows long, hash string").collect()
    rows = sum(r["rows"] for r in parts)
    total = sum(int(r["hash"]) for r in parts) % (1 << 64)
    by_key: dict[str, list[int]] = {}
    if key_positions and rows:  # on request only: the mirror's rows come to the driver
        data = frame.toArrow()
        _collect_keys(by_key, data.select(key_positions), row_hashes(data))
    return rows, total, by_key


def _differing_keys(source: dict[str, list[int]], mirror: dict[str, list[int]], limit: int = 20) -> list[str]:
    out = []
    for key in sorted(set(source) | set(mirror)):
        if sorted(source.get(key, [])) != sorted(mirror.get(key, [])):
            where = "source only" if key not in mirror else "mirror only" if key not in source else "values differ"
            out.append(f"key ({key}): {where}")
            if len(out) == limit:
                break
    return out


def _pending_changes(source: SlotSource, upto: Lsn) -> dict[int, int]:
    """Relation OID -> number of committed changes the slot still holds before `upto`."""
    counts: dict[int, int] = {}
    for rows in source.peek(limit=0, upto_lsn=upto, batch_rows=10_000):
        for _lsn, _xid, data in rows:
            if data and data[0] in _CHANGES:
                message = decode_message(data)
                for oid in getattr(message, "relation_ids", None) or (message.relation_id,):  # type: ignore[attr-defined]
                    counts[oid] = counts.get(oid, 0) + 1
    return counts

