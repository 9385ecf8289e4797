"""A mirror's shape: its key (`table_spec`) and its schema following the source's (`plan_schema`,
`apply_schema`): columns added, types widened where Delta can, otherwise an error before
anything is written.

Mirrors are created with column mapping (so source column names keep any character) and type
widening enabled (`PROPERTIES`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from ..assemble.relations import RelationVersion
from ..convert import widens as arrow_widens
from ..decoder.protocol import ReplicaIdentity
from ..errors import PgoutputSparkError
from .names import path_table, quote
from .net import TableSpec


#: Table properties of every mirror.
PROPERTIES = {
    "delta.columnMapping.mode": "name",
    "delta.enableTypeWidening": "true",
}


class SchemaChangeError(PgoutputSparkError):
    """A source column changed type in a way the mirror's Delta column cannot follow."""


def table_spec(version: RelationVersion, columns: list[str]) -> TableSpec:
    """Keyed by the replica identity's columns, or a multiset when the identity is the whole row."""
    key = version.key_columns
    if version.replica_identity is ReplicaIdentity.FULL or not key:
        identity = key if key else tuple(c.name for c in version.columns)
        return TableSpec("multiset", tuple(identity), tuple(columns))
    return TableSpec("keyed", key, tuple(columns))


def widens(old: T.DataType, new: T.DataType) -> bool:
    """Whether Delta's type widening turns a column of type ``old`` into ``new`` (`convert.widens`)."""
    if old == new:
        return True
    try:
        return arrow_widens(_arrow_of(old), _arrow_of(new))
    except TypeError:  # a type with no Arrow form (a column someone else added): not ours to widen
        return False


@dataclass(frozen=True)
class SchemaPlan:
    """What a run does to a mirror's schema before merging, decided before anything is written."""

    path: str
    exists: bool
    columns: list[tuple[str, pa.DataType]]  # the types the run's rows are converted to
    add: list[T.StructField]
    widen: list[T.StructField]

    @property
    def changes(self) -> bool:
        return not self.exists or bool(self.add or self.widen)


def plan_schema(spark: SparkSession, path: str, table: str, columns: list[tuple[str, pa.DataType]], *,
                remedy: str | None = None, overwrite: bool = False,
                carried: Collection[str] | None = None) -> SchemaPlan:
    """Compare the source's columns with the mirror's; raise `SchemaChangeError` if they cannot meet.

    A column whose source type narrowed keeps the mirror's wider type (values
    are converted to it); one that widened is widened in Delta; any other type
    change is an error naming the table, column and both types, and ``remedy``
    (default: a re-snapshot of the table). Columns of the Delta table that are
    not in ``columns`` are left alone. With ``overwrite`` (a re-snapshot that
    replaces the mirror's rows and columns) the mirror's types do not matter.
    ``carried``, if given, names the columns the run's rows can carry: another
    column of ``columns`` (dropped in the source before the run's first change)
    is planned only where the mirror has it (its values there become NULL as
    rows change), never added (a re-snapshot after the drop left it out).
    """
    from ..capture import _is_delta

    exists = _is_delta(spark, path)
    existing = ({f.name: f.dataType for f in spark.read.format("delta").load(path).schema.fields}
                if exists and not overwrite else {})
    if carried is not None:
        columns = [(name, arrow) for name, arrow in columns if name in carried or name in existing]
    wanted = from_arrow_schema(pa.schema(columns), prefer_timestamp_ntz=True)
    if not exists or overwrite:
        _check_case_collisions(table, path, [name for name, _ in columns])
        return SchemaPlan(path, exists, columns, [] if exists else list(wanted.fields), [])
    if remedy is None:
        remedy = (f"Re-snapshot the table (pgoutput-spark snapshot --table {table} ...): it overwrites the "
                  f"mirror, rows and columns, and the apply goes on from there")
    _check_case_collisions(table, path, [*existing, *(n for n, _ in columns if n not in existing)])
    add, widen, out = [], [], []
    for (name, arrow), field in zip(columns, wanted.fields):
        have = existing.get(name)
        if have is None:
            add.append(field)
        elif have != field.dataType:
            if widens(have, field.dataType):
                widen.append(field)
            elif widens(field.dataType, have):
                arrow = _arrow_of(have)
            else:
                raise SchemaChangeError(
                    f"{table}: column {name!r} changed type from {have.simpleString()} to "
                    f"{field.dataType.simpleString()}, which the Delta table at {path} cannot widen "
                    f"to; nothing was written. {remedy}")
        out.append((name, arrow))
    return SchemaPlan(path, True, out, add, widen)


def _check_case_collisions(table: str, path: str, names: list[str]) -> None:
    """Delta keeps column names case-insensitively unique; PostgreSQL does not ("id" and "Id")."""
    seen: dict[str, str] = {}
    for name in names:
        other = seen.setdefault(name.casefold(), name)
        if other != name:
            raise SchemaChangeError(
                f"{table}: columns {other!r} and {name!r} differ only in case, which a Delta table "
                f"cannot hold (Delta column names are case-insensitive); nothing was written to {path}. "
                f"Leave one out of the publication with a column list, or rename it in the source")


def _arrow_of(data_type: T.DataType) -> pa.DataType:
    from pyspark.sql.pandas.types import to_arrow_type

    return to_arrow_type(data_type)


def apply_schema(spark: SparkSession, plan: SchemaPlan) -> None:
    """Create the mirror, or add and widen its columns (each a Delta commit, idempotent in effect)."""
    from delta.tables import DeltaTable

    if not plan.exists:
        builder = DeltaTable.createIfNotExists(spark).location(plan.path).addColumns(
            T.StructType(plan.add))
        for key, value in PROPERTIES.items():
            builder = builder.property(key, value)
        builder.execute()
        return
    target = path_table(plan.path)
    if plan.add:
        columns = ", ".join(f"{quote(f.name)} {f.dataType.simpleString()}" for f in plan.add)
        spark.sql(f"ALTER TABLE {target} ADD COLUMNS ({columns})")
    for field in plan.widen:
        name, data_type = quote(field.name), field.dataType
        while isinstance(data_type, T.ArrayType):  # Delta widens an array's elements, not the array
            name, data_type = f"{name}.element", data_type.elementType
        spark.sql(f"ALTER TABLE {target} ALTER COLUMN {name} TYPE {data_type.simpleString()}")
