"""Relation state: the schema history of every relation OID, keyed by stream position.

pgoutput sends a Relation message once per walsender session, and again when
the relation's schema changes (Type messages likewise for non-built-in column
types), so the schema of a change is the last Relation message for its OID
before it in the stream, often from an earlier run. The history keeps the
messages that change something (`RelationHistory.add`), a few per relation:
it lives on the driver, is persisted by the job, and is shipped to tasks.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..convert import PgType, arrow_type, override_type, resolve, widens
from ..decoder.protocol import COLUMN_FLAG_KEY, ReplicaIdentity
from ..errors import PgoutputSparkError

if TYPE_CHECKING:
    from ..config import TablesConfig


class UnknownRelationError(PgoutputSparkError):
    """A change refers to a relation OID whose Relation message was never seen."""


@dataclass(frozen=True)
class Column:
    name: str
    type_oid: int
    type_modifier: int
    is_key: bool


@dataclass(frozen=True)
class RelationVersion:
    """One Relation message: the relation's published columns from ``seq`` on."""

    seq: int
    relation_id: int
    namespace: str
    name: str
    replica_identity: ReplicaIdentity
    columns: tuple[Column, ...]

    @property
    def key_columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.is_key)

    @classmethod
    def from_row(cls, seq: int, relation: dict[str, Any]) -> "RelationVersion":
        return cls(
            seq=seq,
            relation_id=relation["relation_id"],
            namespace=relation["namespace"],
            name=relation["relation_name"],
            replica_identity=ReplicaIdentity(relation["replica_identity"]),
            columns=tuple(Column(c["name"], c["type_oid"], c["type_modifier"],
                                 bool(c["flags"] & COLUMN_FLAG_KEY)) for c in relation["columns"]),
        )


@dataclass(frozen=True)
class TypeVersion:
    seq: int
    type_id: int
    namespace: str
    name: str


@dataclass
class RelationHistory:
    """All Relation and Type messages seen, in stream order."""

    relations: dict[int, list[RelationVersion]] = field(default_factory=dict)
    types: dict[int, list[TypeVersion]] = field(default_factory=dict)
    #: ``schema.table`` (the relation's first name, as its mirror's) -> {column: type}: the
    #: ``tables.types`` setting (`convert.override_type`).
    type_overrides: dict[str, dict[str, str]] = field(default_factory=dict)

    def first_name(self, relation_id: int) -> str:
        """``schema.table`` as the relation was first seen: the name ``tables`` settings and its
        mirror go by, whatever renames followed."""
        first = self.relations[relation_id][0]
        return f"{first.namespace}.{first.name}"

    def selected(self, relation_ids: Iterable[int], tables: TablesConfig) -> tuple[list[int], tuple[str, ...]]:
        """Of ``relation_ids``, those ``tables.include`` / ``exclude`` choose (by `first_name`), in
        their order, and the names of those left out, sorted."""
        chosen, excluded = [], set()
        for relation_id in relation_ids:
            name = self.first_name(relation_id)
            if tables.selected(name):
                chosen.append(relation_id)
            else:
                excluded.add(name)
        return chosen, tuple(sorted(excluded))

    def override(self, relation_id: int, column: str, pg_type: PgType) -> pa.DataType | None:
        """The Arrow type ``tables.types`` gives the column (None: its own); `ConfigError` for an
        override that does not apply to its type."""
        name = self.first_name(relation_id)
        chosen = self.type_overrides.get(name, {}).get(column)
        return None if chosen is None else override_type(chosen, pg_type, f"{name}.{column}")

    def add(self, versions: Iterable[RelationVersion | TypeVersion]) -> list[RelationVersion | TypeVersion]:
        """Add Relation / Type versions; return those of them that the history keeps, by seq.

        pgoutput sends a relation's Relation message, and Type messages for its
        columns' types, again in every walsender session (every capture chunk),
        describing the same schema: a version equal to the one in effect before it
        (names, replica identity, columns, and the columns' types as then resolved;
        for a Type, its names) changes nothing and is not kept, nor is a second
        version at a seq already held. The history, the table the runs save it in,
        and the work of adding to it grow with schema changes, not with sessions.
        """
        added_relations: dict[int, list[RelationVersion]] = {}
        added_types: dict[int, list[TypeVersion]] = {}
        for v in versions:
            if isinstance(v, RelationVersion):
                added_relations.setdefault(v.relation_id, []).append(v)
            else:
                added_types.setdefault(v.type_id, []).append(v)
        kept: list[RelationVersion | TypeVersion] = []
        # Types first: a Relation version's layout includes its columns' types as resolved then.
        for type_id, new in added_types.items():
            self.types[type_id] = _changes(self.types.get(type_id, []), new, lambda t: (t.namespace, t.name), kept)
        for relation_id, fresh in added_relations.items():
            self.relations[relation_id] = _changes(self.relations.get(relation_id, []), fresh, self.layout, kept)
        return sorted(kept, key=lambda v: v.seq)

    def layout(self, version: RelationVersion) -> tuple[Any, ...]:
        """What ``version`` says of a change: its relation's names, replica identity, columns and
        the columns' types as resolved then (equal layouts convert changes alike)."""
        return (version.namespace, version.name, version.replica_identity, version.columns,
                tuple(self.pg_type(c, version.seq + 1) for c in version.columns))

    def version_at(self, relation_id: int, seq: int) -> RelationVersion:
        """The relation's schema for a change at ``seq``."""
        versions = self.relations.get(relation_id, [])
        i = bisect.bisect_left([v.seq for v in versions], seq) - 1
        if i < 0:
            raise UnknownRelationError(
                f"change at seq {seq} refers to relation OID {relation_id}, but no Relation "
                f"message for it precedes it in the capture or in earlier runs")
        return versions[i]

    def pg_type(self, column: Column, seq: int) -> PgType:
        """The column's type as of ``seq`` (Type messages resolve non-built-in OIDs)."""
        names: dict[int, tuple[str, str]] = {}
        versions = self.types.get(column.type_oid, [])
        earlier = [v for v in versions if v.seq < seq]
        if earlier:
            names[column.type_oid] = (earlier[-1].namespace, earlier[-1].name)
        return resolve(column.type_oid, column.type_modifier, names)

    def latest(self, relation_id: int) -> RelationVersion:
        return self.relations[relation_id][-1]

    def columns_since(self, relation_id: int, seq: int | None) -> set[str]:
        """The names of the columns a change at or after ``seq`` can carry (those of the version
        in effect at ``seq`` and of later ones); with ``seq`` None, the latest version's."""
        versions = self.relations[relation_id]
        if seq is not None:
            first = max(0, bisect.bisect_left([v.seq for v in versions], seq) - 1)
            versions = versions[first:]
        else:
            versions = versions[-1:]
        return {c.name for v in versions for c in v.columns}

    def table_columns(self, relation_id: int) -> list[tuple[str, object]]:
        """(name, Arrow type) of every column any version had, in first-seen order.

        A column has the type of its latest version, or of an earlier one that the
        later ones narrowed (``bigint`` to ``int``: the wider type holds every value);
        earlier values are cast to it when converted (a cast that fails names the
        column and both types). The mirror's `plan_schema` applies the same rule to
        the types a Delta table already has.
        """
        out: dict[str, object] = {}
        for version in self.relations[relation_id]:
            for column in version.columns:
                pg_type = self.pg_type(column, version.seq + 1)
                now = self.override(relation_id, column.name, pg_type) or arrow_type(pg_type)
                before = out.get(column.name)
                out[column.name] = before if before is not None and widens(now, before) else now
        return list(out.items())


def versions_from_rows(rows: Iterable[Any]) -> list[RelationVersion | TypeVersion]:
    """Relation / Type versions from decoded rows having ``seq``, ``relation``, ``type``."""
    out: list[RelationVersion | TypeVersion] = []
    for r in rows:
        if r["relation"] is not None:
            out.append(RelationVersion.from_row(r["seq"], r["relation"].asDict(recursive=True)))
        elif r["type"] is not None:
            t = r["type"]
            out.append(TypeVersion(r["seq"], t["type_id"], t["namespace"], t["name"]))
    return out


def _changes(held: list[Any], new: list[Any], layout: Callable[[Any], Any], kept: list[Any]) -> list[Any]:
    """``held`` and ``new`` versions in seq order, leaving out a version at a seq already taken
    (the one held stays) and one whose ``layout`` equals the version's before it; those of
    ``new`` that stay are added to ``kept``."""
    out: list[Any] = []
    fresh = {id(v) for v in new}
    before = None
    for v in sorted([*held, *new], key=lambda v: (v.seq, id(v) in fresh)):
        if out and out[-1].seq == v.seq:
            continue
        now = layout(v)
        if out and now == before:
            continue
        out.append(v)
        before = now
        if id(v) in fresh:
            kept.append(v)
    return out
