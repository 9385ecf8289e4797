"""Output plugin options for the logical decoding SQL functions.

``pg_logical_slot_{peek,get}_[binary_]changes(slot, upto_lsn, upto_nchanges,
VARIADIC options text[])`` take the plugin options as a flat name/value list.
These helpers build that list.

pgoutput option names and what each server version accepts:

==================  ===================================================
``proto_version``   1 (PG 10+), 2 streaming (14+), 3 two-phase (15+),
                    4 parallel streaming (16+)
``publication_names`` comma-separated identifiers (quoted if needed)
``binary``          boolean (14+)
``messages``        boolean (14+)
``streaming``       boolean on 14/15; ``on``/``off``/``parallel`` on 16+
``two_phase``       boolean (15+); the slot must be created with two_phase
``origin``          ``none`` / ``any`` (16+)
==================  ===================================================
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = ["PluginOptions", "StreamingMode", "flatten_options", "pgoutput_options", "quote_ident"]

StreamingMode = Literal["on", "off", "parallel"]

_PLAIN_IDENT = re.compile(r"^[a-z_][a-z0-9_$]*$")


def quote_ident(name: str) -> str:
    """`name` as PostgreSQL's identifier-list parser reads it back unchanged."""
    if _PLAIN_IDENT.match(name):
        return name
    return '"' + name.replace('"', '""') + '"'


def pgoutput_options(
    *,
    publications: Sequence[str],
    proto_version: int,
    streaming: StreamingMode | None = None,
    two_phase: bool = False,
    messages: bool = False,
    binary: bool = False,
    origin: str | None = None,
) -> list[str]:
    """The pgoutput options as the flat name/value list the SQL functions take.

    Options left at their default are not sent, so the list suits every server
    version that knows the options that are sent (see the module docstring).
    """
    if not publications:
        raise ValueError("pgoutput needs at least one publication name")
    if streaming not in (None, "on", "off", "parallel"):
        raise ValueError(f"streaming must be 'on', 'off' or 'parallel', got {streaming!r}")
    options = ["proto_version", str(int(proto_version))]
    options += ["publication_names", ",".join(quote_ident(p) for p in publications)]
    if binary:
        options += ["binary", "true"]
    if messages:
        options += ["messages", "true"]
    if streaming is not None:
        options += ["streaming", streaming]
    if two_phase:
        options += ["two_phase", "true"]
    if origin is not None:
        options += ["origin", origin]
    return options


def flatten_options(options: Mapping[str, str] | None) -> list[str]:
    """Options of any plugin (``test_decoding``'s ``{"include-xids": "0"}``) as a flat list."""
    return [part for item in (options or {}).items() for part in item]


#: The first server version (``server_version_num``) that takes each protocol version.
MIN_SERVER_FOR_PROTOCOL = {1: 100000, 2: 140000, 3: 150000, 4: 160000}


@dataclass(frozen=True)
class PluginOptions:
    """The pgoutput options of a capture: what the slot is read with, recorded with the landing."""

    publications: tuple[str, ...]
    proto_version: int
    streaming: StreamingMode | None = None
    two_phase: bool = False
    messages: bool = False
    binary: bool = False
    origin: str | None = None

    def __post_init__(self) -> None:
        if self.proto_version not in MIN_SERVER_FOR_PROTOCOL:
            raise ValueError(f"proto_version must be 1, 2, 3 or 4, got {self.proto_version!r}")
        if self.streaming not in (None, "on", "off", "parallel"):
            raise ValueError(f"streaming must be 'on', 'off' or 'parallel', got {self.streaming!r}")
        if self.streaming in ("on", "parallel") and self.proto_version < 2:
            raise ValueError("streaming needs proto_version 2 or higher")
        if self.streaming == "parallel" and self.proto_version < 4:
            raise ValueError("streaming 'parallel' needs proto_version 4")
        if self.two_phase and self.proto_version < 3:
            raise ValueError("two_phase needs proto_version 3 or higher")
        if self.origin not in (None, "any", "none"):
            raise ValueError(f"origin must be 'any' or 'none', got {self.origin!r}")
        if not self.publications:
            raise ValueError("pgoutput needs at least one publication name")

    def as_list(self) -> list[str]:
        """The flat name/value list the SQL decoding functions take."""
        return pgoutput_options(
            publications=self.publications, proto_version=self.proto_version,
            streaming=self.streaming, two_phase=self.two_phase, messages=self.messages,
            binary=self.binary, origin=self.origin,
        )  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["publications"] = list(self.publications)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PluginOptions:
        return cls(**{**data, "publications": tuple(data["publications"])})
