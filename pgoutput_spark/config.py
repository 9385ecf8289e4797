"""Typed configuration loaded from ``conf/<env>.yaml``.

Unknown keys, wrong types and bad values raise `ConfigError` naming the file
and the key path. Relative paths are relative to the working directory.
"""

from __future__ import annotations

import dataclasses
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

    def check(self, source: str) -> None:
        if self.parallelism < 1:
            raise ConfigError(f"{source}: apply.parallelism must be at least 1, got {self.parallelism}")
        try:
            rendered = self.table_path.format(root="R", schema="S", table="T")
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(f"{source}: apply.table_path {self.table_path!r} is not a valid template "
                              f"(fields: {{root}}, {{schema}}, {{table}}): {exc!r}") from exc
        if "T" not in rendered or "{table}" not in self.table_path:
            raise ConfigError(f"{source}: apply.table_path {self.table_path!r} must contain {{table}}")
        if self.table_name is not None:
            try:
                parts = [p.format(schema="S", table="T") for p in self.table_name.split(".")]
            except (KeyError, IndexError, ValueError) as exc:
                raise ConfigError(f"{source}: apply.table_name {self.table_name!r} is not a valid template "
                                  f"(fields: {{schema}}, {{table}}): {exc!r}") from exc
            if "{table}" not in self.table_name.split(".")[-1] or not all(parts) or len(parts) > 3:
                raise ConfigError(f"{source}: apply.table_name {self.table_name!r} must be one to three "
                                  f"dot-separated non-empty parts, the last containing {{table}}")


LOCAL_SPARK_CONF = {
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.databricks.delta.snapshotPartitions": "2",
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
    spark: SparkConfig = field(default_factory=SparkConfig)


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
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            values[key] = _build(hint, value, key_path, source)
            continue
        is_union = get_origin(hint) in (typing.Union, types.UnionType)
        allowed = get_args(hint) if is_union else (hint,)
        origins = tuple(get_origin(a) or a for a in allowed)
        if value is None and type(None) in origins:
            values[key] = None
        elif tuple in origins:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{source}: {key_path} must be a list of strings, got {value!r}")
            values[key] = tuple(value)
        elif dict in origins:
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: {key_path} must be a mapping")
            values[key] = {str(k): str(v) for k, v in value.items()}
        elif int in origins and isinstance(value, int) and not isinstance(value, bool):
            values[key] = value
        elif str in origins and isinstance(value, str):
            choices = getattr(cls, "_choices", {}).get(key)
            if choices and value not in choices:
                raise ConfigError(f"{source}: {key_path} is {value!r}, expected one of {list(choices)}")
            values[key] = value
        else:
            expected = " or ".join(getattr(a, "__name__", str(a)) for a in origins)
            raise ConfigError(f"{source}: {key_path} must be {expected}, got {value!r}")
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
    return config
