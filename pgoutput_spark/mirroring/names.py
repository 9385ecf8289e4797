"""Where mirrors live and what they are called: paths under the target, catalog names, and the
Spark SQL quoting of both.

Each source table has its mirror at ``<root>/<schema>/<table>`` (`mirror_path`; other layouts
through ``apply.table_path``), its source names kept as they are but for the few characters a
path cannot hold, and, with ``apply.table_name``, a catalog name (`catalog_name`, `register`).
"""

from __future__ import annotations

import os
import re
from typing import Any

from pyspark.sql import SparkSession

from ..errors import PgoutputSparkError
from ..spark.files import is_uri


def _segment(name: str) -> str:
    """A path segment for a source name: kept as is but for ``%``, ``/`` and a leading ``_`` or ``.``."""
    out = name.replace("%", "%25").replace("/", "%2F")
    if out[:1] in ("_", "."):
        out = f"%{ord(out[0]):02X}{out[1:]}"
    return out or "%00"


DEFAULT_TABLE_PATH = "{root}/{schema}/{table}"
DEFAULT_HISTORY_PATH = "{root}/_history/{schema}/{table}"


def mirror_path(root: str, namespace: str, name: str, template: str = DEFAULT_TABLE_PATH) -> str:
    """Where the mirror of ``namespace.name`` lives (``template``: see `ApplyConfig.table_path`)."""
    return absolute_path(template.format(root=root.rstrip("/"), schema=_segment(namespace),
                                         table=_segment(name)))


def absolute_path(path: str) -> str:
    """A local path made absolute, a URI (``s3a://...``, ``file:/...``) as given.

    Delta's SQL on a path (``UPDATE delta.`out/demo/...```) rejects a relative
    one, so every path the jobs write to is made absolute first (relative to
    the working directory, as Spark reads it).
    """
    return path if is_uri(path) else os.path.abspath(path)


def path_table(path: str) -> str:
    """The Delta table at ``path`` as a Spark SQL table name, ``delta.`path```: a source name
    in a mirror's path may hold a backtick, doubled here as Spark SQL quotes it."""
    return f"delta.{quote(path)}"


def catalog_name(template: str, namespace: str, name: str) -> tuple[str, ...]:
    """The catalog name of a mirror, as its parts: each dot-separated part of ``template`` filled
    in with the source names, every character but letters, digits and ``_`` made ``_``, in
    lower case (what Spark's session catalog accepts and how it keeps names)."""
    schema, table = (re.sub(r"[^A-Za-z0-9_]", "_", n) for n in (namespace, name))
    return tuple(part.format(schema=schema, table=table).lower() for part in template.split("."))


def identifier(parts: tuple[str, ...]) -> str:
    """A catalog name as a Spark SQL identifier."""
    return ".".join(quote(part) for part in parts)


class CatalogError(PgoutputSparkError):
    """A mirror's catalog name is taken by a table somewhere else."""


def _location(path: str) -> str:
    path = path.rstrip("/")
    if path.startswith("file:"):
        path = "/" + path[len("file:"):].lstrip("/")
    return path


def catalog_registered(spark: SparkSession, name: tuple[str, ...], path: str) -> bool:
    """Whether ``name`` is the mirror at ``path`` already; `CatalogError` if it is another table."""
    table = identifier(name)
    if not spark.catalog.tableExists(table):
        return False
    location = spark.sql(f"DESCRIBE DETAIL {table}").select("location").first()
    where = location[0] if location is not None else None
    if where is None or _location(where) != _location(path):
        raise CatalogError(f"catalog table {table} exists at {where}, not at the mirror's location "
                           f"{path}; nothing was written. Drop it, or choose another apply.table_name")
    return True


def register(spark: SparkSession, name: tuple[str, ...], path: str) -> None:
    """Name the mirror at ``path`` in the catalog (an external Delta table), with its database."""
    if len(name) > 1:
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {identifier(name[:-1])}")
    spark.sql(f"CREATE TABLE IF NOT EXISTS {identifier(name)} USING delta LOCATION {sql_literal(path)}")


def sql_literal(value: Any) -> str:
    """A value as a Spark SQL literal: NULL, an integer, or a quoted string."""
    if value is None:
        return "NULL"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def quote(name: str) -> str:
    """A column name as a Spark SQL identifier."""
    return "`" + name.replace("`", "``") + "`"
