"""Typed configuration loaded from ``conf/<env>.yaml``.

Unknown keys, wrong types and bad values raise `ConfigError` naming the file
and the key path. Relative paths are relative to the working directory.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path
import types
import typing
from typing import Any, get_args, get_origin, get_type_hints

import yaml

from .errors import ConfigError


@dataclass(frozen=True)
class CaptureConfig:
    path: str = "examples/sample_capture"
    format: str = "auto"
    framing: str = "auto"
    seq_column: str = "seq"
    lsn_column: str = "lsn"
    data_column: str = "data"
    xid_column: str | None = "xid"
    #: The walsender session of each message (optional; see the README's capture contract).
    session_column: str | None = "session"

    _choices = {"format": ("auto", "parquet", "delta"), "framing": ("auto", "none", "xlogdata")}


@dataclass(frozen=True)
class DecodeConfig:
    on_error: str = "fail"
    #: Where quarantined messages go (a Delta table) when on_error is quarantine.
    quarantine_path: str | None = None

    _choices = {"on_error": ("fail", "quarantine")}


@dataclass(frozen=True)
class ChangesConfig:
    #: Prefix of the Delta transaction identifiers (txnAppId) of this pipeline's writes.
    pipeline: str = "default"
    #: Transactions replayed from these replication origins change nothing.
    skip_origins: tuple[str, ...] = ()


@dataclass(frozen=True)
class ApplyConfig:
    #: Tables merged at once.
    parallelism: int = 4
    #: Where each mirror lives: ``{root}`` is the target, ``{schema}`` and ``{table}`` the
    #: source names as path segments (see the README on which characters are encoded).
    table_path: str = "{root}/{schema}/{table}"
    #: If set, each mirror is also a catalog table of this name (an external Delta table at
    #: its path): dot-separated parts with ``{schema}`` and ``{table}``, the source names with
    #: any character but letters, digits and ``_`` made ``_``, lower case; e.g. ``mirrors.{schema}__{table}``.
    table_name: str | None = None
    #: Where a table's history lives (``tables.history``), a template like ``table_path``.
    history_path: str = "{root}/_history/{schema}/{table}"
    #: A table with more change rows in a run has its net change spread over several tasks
    #: by key (one task holds a table's rows at once); as `mirroring.rows.NET_TASK_ROWS`.
    net_task_rows: int = 1_000_000

    def check(self, source: str) -> None:
        if self.parallelism < 1:
            raise ConfigError(f"{source}: apply.parallelism must be at least 1, got {self.parallelism}")
        if self.net_task_rows < 1:
            raise ConfigError(f"{source}: apply.net_task_rows must be at least 1, got {self.net_task_rows}")
        for key, template in (("table_path", self.table_path), ("history_path", self.history_path)):
            try:
                rendered = template.format(root="R", schema="S", table="T")
            except (KeyError, IndexError, ValueError) as exc:
                raise ConfigError(f"{source}: apply.{key} {template!r} is not a valid template "
                                  f"(fields: {{root}}, {{schema}}, {{table}}): {exc!r}") from exc
            if "T" not in rendered or "{table}" not in template:
                raise ConfigError(f"{source}: apply.{key} {template!r} must contain {{table}}")
        if self.history_path == self.table_path:
            raise ConfigError(f"{source}: apply.history_path must differ from apply.table_path")
        if self.table_name is not None:
            try:
                parts = [p.format(schema="S", table="T") for p in self.table_name.split(".")]
            except (KeyError, IndexError, ValueError) as exc:
                raise ConfigError(f"{source}: apply.table_name {self.table_name!r} is not a valid template "
                                  f"(fields: {{schema}}, {{table}}): {exc!r}") from exc
            if "{table}" not in self.table_name.split(".")[-1] or not all(parts) or len(parts) > 3:
                raise ConfigError(f"{source}: apply.table_name {self.table_name!r} must be one to three "
                                  f"dot-separated non-empty parts, the last containing {{table}}")


#: A ``tables.types`` override: PostgreSQL's text, or for a ``numeric`` column a double or a decimal.
TYPE_OVERRIDE = re.compile(r"^(?:string|double|decimal\((?P<p>[0-9]+), *(?P<s>[0-9]+)\))$")


def type_override(override: str, where: str) -> re.Match[str]:
    """``override`` matched by `TYPE_OVERRIDE`, a decimal's bounds checked; `ConfigError` naming
    ``where`` (the setting) otherwise."""
    match = TYPE_OVERRIDE.match(override)
    if match is None:
        raise ConfigError(f"{where} is {override!r}, expected string, double or decimal(p, s)")
    if match["p"] is not None and not (1 <= int(match["p"]) <= 38 and 0 <= int(match["s"]) <= int(match["p"])):
        raise ConfigError(f"{where} is {override!r}: a decimal needs 1 <= p <= 38 and 0 <= s <= p")
    return match


@dataclass(frozen=True)
class TablesConfig:
    """Which source tables the apply mirrors, and per-table overrides; tables are ``schema.table``."""

    #: Shell-style patterns (``fnmatch``, case-sensitive) on ``schema.table``: a table is mirrored
    #: when it matches an include pattern and no exclude pattern.
    include: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = ()
    #: ``schema.table`` -> key columns, for a table whose replica identity has no key (``FULL``,
    #: ``NOTHING``, or ``DEFAULT`` without a primary key): its mirror is then keyed, an insert of
    #: an existing key overwrites the row, instead of keeping identical rows apart.
    keys: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: ``schema.table`` -> {column: type} (`TYPE_OVERRIDE`): ``string`` keeps that column as
    #: PostgreSQL's text form (e.g. a ``numeric(p, s)`` column holding NaN, which a decimal cannot
    #: hold); for a ``numeric`` column, ``double`` or ``decimal(p, s)`` converts it as PostgreSQL's
    #: ``::float8`` / ``::numeric(p, s)`` would (an unconstrained ``numeric`` is a string otherwise).
    types: dict[str, dict[str, str]] = field(default_factory=dict)
    #: Patterns (as ``include``) of the tables that also get a history table (SCD type 2) at
    #: ``apply.history_path``: every version of every row with its validity (LSN and time range).
    history: tuple[str, ...] = ()

    def keeps_history(self, name: str) -> bool:
        """Whether the table ``schema.table`` also gets a history table."""
        return any(fnmatch.fnmatchcase(name, p) for p in self.history)

    def selected(self, name: str) -> bool:
        """Whether the table ``schema.table`` is mirrored."""
        return (any(fnmatch.fnmatchcase(name, p) for p in self.include)
                and not any(fnmatch.fnmatchcase(name, p) for p in self.exclude))

    def check(self, source: str) -> None:
        for table, columns in self.keys.items():
            if not columns:
                raise ConfigError(f"{source}: tables.keys.{table} must name at least one column")
            if len(set(columns)) != len(columns):
                raise ConfigError(f"{source}: tables.keys.{table} names a column twice: {list(columns)}")
        for table in (*self.keys, *self.types):
            if "." not in table:
                raise ConfigError(f"{source}: tables.keys / tables.types: {table!r} must be schema.table")
        for table, overrides in self.types.items():
            for column, override in overrides.items():
                type_override(override, f"{source}: tables.types.{table}.{column}")


#: JVM options that leave less often called code to the quick JIT compiler (see `LOCAL_SPARK_CONF`).
JIT_THRESHOLDS = "-XX:Tier4InvocationThreshold=50000 -XX:Tier4CompileThreshold=100000 -XX:Tier4BackEdgeThreshold=400000"

LOCAL_SPARK_CONF = {
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    # Delta rebuilds a table's snapshot after every commit, in 50 partitions by default: on local[2]
    # a 60-row MERGE into a small mirror takes 1.6 s with 50, 0.7-0.9 s with 1 or 2
    # (benchmarks/small_tables.py).
    "spark.databricks.delta.snapshotPartitions": "1",
    # The driver JVM's JIT compiles a method with its optimizing compiler (C2) after 50,000
    # calls, not 5,000: a run's lukewarm code (planning, Delta's log, one table's query) stays
    # with the quick compiler. An apply run of 1M changes on 2 cores spent 10-15 CPU-s in C2;
    # with this, the driver JVM used 42-43 CPU-s instead of 50-52, and the run took 35.5 s
    # instead of 37.4-39.3 s (benchmarks/apply.py). Takes effect when the session starts a JVM.
    "spark.driver.extraJavaOptions": JIT_THRESHOLDS,
}


@dataclass(frozen=True)
class SparkConfig:
    master: str | None = "local[2]"
    #: The embedded default is local: few shuffle partitions, small Delta snapshots (as conf/local.yaml).
    conf: dict[str, str] = field(default_factory=lambda: dict(LOCAL_SPARK_CONF))


@dataclass(frozen=True)
class Config:
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    changes: ChangesConfig = field(default_factory=ChangesConfig)
    apply: ApplyConfig = field(default_factory=ApplyConfig)
    tables: TablesConfig = field(default_factory=TablesConfig)
    spark: SparkConfig = field(default_factory=SparkConfig)


def _value(cls: type, key: str, hint: Any, value: Any, key_path: str, source: str) -> Any:
    """``value`` checked against the type ``hint`` (field ``key`` of dataclass ``cls``)."""
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, key_path, source)  # type: ignore[arg-type]
    is_union = get_origin(hint) in (typing.Union, types.UnionType)
    allowed = get_args(hint) if is_union else (hint,)
    origins = tuple(get_origin(a) or a for a in allowed)
    if value is None and type(None) in origins:
        return None
    if tuple in origins:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{source}: {key_path} must be a list of strings, got {value!r}")
        return tuple(value)
    if dict in origins:
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {key_path} must be a mapping, got {value!r}")
        value_hint = get_args(allowed[origins.index(dict)])[1]
        if value_hint is str and key not in getattr(cls, "_choices", {}):  # Spark's settings: any scalar
            return {str(k): str(v) for k, v in value.items()}
        return {str(k): _value(cls, key, value_hint, v, f"{key_path}.{k}", source) for k, v in value.items()}
    if int in origins and isinstance(value, int) and not isinstance(value, bool):
        return value
    if bool in origins and isinstance(value, bool):
        return value
    if str in origins and isinstance(value, str):
        choices = getattr(cls, "_choices", {}).get(key)
        if choices and value not in choices:
            raise ConfigError(f"{source}: {key_path} is {value!r}, expected one of {list(choices)}")
        return value
    expected = " or ".join(getattr(a, "__name__", str(a)) for a in origins)
    raise ConfigError(f"{source}: {key_path} must be {expected}, got {value!r}")


def _build(cls: type, data: Any, path: str, source: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: {path or 'top level'} must be a mapping, got {type(data).__name__}")
    hints = get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    values = {}
    for key, value in data.items():
        key_path = f"{path}.{key}" if path else str(key)
        if key not in known:
            raise ConfigError(f"{source}: unknown key {key_path!r} (expected one of {sorted(known)})")
        values[key] = _value(cls, key, hints[key], value, key_path, source)
    return cls(**values)


def load_config(path: str | Path | None) -> Config:
    """Load a configuration file; ``None`` gives the built-in defaults."""
    if path is None:
        return Config()
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"can't read configuration {source}: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    config: Config = _build(Config, data, "", source)
    config.apply.check(source)
    config.tables.check(source)
    return config
