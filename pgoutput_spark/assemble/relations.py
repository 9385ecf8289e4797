"""Relation state: the schema history of every relation OID, keyed by stream position.

pgoutput sends a Relation message once per walsender session, and again when
the relation's schema changes (Type messages likewise for non-built-in column
types), so the schema of a change is the last Relation message for its OID
before it in the stream, often from an earlier run. The history is small (a
handful of messages per relation and session): it lives on the driver, is
persisted by the job, and is shipped to tasks.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any
from dataclasses import dataclass, field

from ..convert import PgType, arrow_type, resolve, text_type, widens
from ..decoder.protocol import COLUMN_FLAG_KEY, ReplicaIdentity
from ..errors import PgoutputSparkError


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
    def from_row(cls, seq: int, relation: dict) -> "RelationVersion":  # type: ignore[type-arg]
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
    #: ``schema.table`` (the relation's first name, as its mirror's) -> columns kept as
    #: PostgreSQL's text (the ``tables.types`` setting).
    text_columns: dict[str, dict[str, str]] = field(default_factory=dict)

    def keeps_text(self, relation_id: int, column: str) -> bool:
        first = self.relations[relation_id][0]
        return column in self.text_columns.get(f"{first.namespace}.{first.name}", {})

    def add(self, versions: Iterable[RelationVersion | TypeVersion]) -> None:
        for v in versions:
            if isinstance(v, RelationVersion):
                bucket: list = self.relations.setdefault(v.relation_id, [])  # type: ignore[type-arg]
            else:
                bucket = self.types.setdefault(v.type_id, [])
            if all(existing.seq != v.seq for existing in bucket):
                bucket.append(v)
                bucket.sort(key=lambda x: x.seq)

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
                now = (text_type(pg_type) if self.keeps_text(relation_id, column.name)
                       else arrow_type(pg_type))
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
