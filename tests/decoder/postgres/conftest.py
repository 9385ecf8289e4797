"""Session fixtures: the workload of `workload.py` run once per server, captured per protocol.

PostgreSQL 15 gets four slots created at the same point before the workload:
pgoutput for protocol 1, 2 (streaming) and 3 (streaming, two-phase slot) and
one test_decoding slot. PostgreSQL 16 and 17 get one two-phase pgoutput slot
read with protocol 4 and parallel streaming; PostgreSQL 18 that one, one for
protocol 2 and a test_decoding slot (the tuples' check on the newest server).
Peeks do not consume, so a slot can be
read again with other options (binary, origin) and gives the same changes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import psycopg
import pytest

from pgoutput_spark import decode_message
from pgoutput_spark.decoder.messages import Message
from pgoutput_spark.errors import DecodeError
from pgoutput_spark.testing.pgcluster import CapturedMessage, PgCluster
from tests.plugins.postgres import new_database

from .workload import PUBLICATION, WorkloadFacts, run_workload, setup_database

#: peek_pgoutput options per protocol version (messages=True is added to all).
PEEK_OPTIONS: dict[int, dict[str, Any]] = {
    1: {"proto_version": 1},
    2: {"proto_version": 2, "streaming": "on"},
    3: {"proto_version": 3, "streaming": "on", "two_phase": True},
    4: {"proto_version": 4, "streaming": "parallel", "two_phase": True},
}

#: (server fixture, protocol version) of every capture the tests read.
CAPTURE_PARAMS = [("pg15", 1), ("pg15", 2), ("pg15", 3), ("pg16", 4), ("pg17", 4), ("pg18", 4)]


def stream_flags(messages: list[CapturedMessage]) -> list[bool]:
    """For each message, whether it sits strictly between a Stream Start and its Stream Stop.

    Written here from the protocol docs, independently of the package's
    `StreamEvents`, and strict: a nested start or a stray stop fails the test.
    """
    flags, inside = [], False
    for message in messages:
        kind = message.data[:1]
        if kind == b"S":
            assert not inside, f"Stream Start inside a stream block at seq {message.seq}"
            inside = True
            flags.append(False)
        elif kind == b"E":
            assert inside, f"Stream Stop outside a stream block at seq {message.seq}"
            inside = False
            flags.append(False)
        else:
            flags.append(inside)
    assert not inside, "the capture ends inside a stream block"
    return flags


@dataclass
class Capture:
    """One peek of a workload slot, decoded message by message with `decode_message`."""

    server: str
    proto_version: int
    binary: bool
    messages: list[CapturedMessage]
    facts: WorkloadFacts
    cluster: PgCluster

    @cached_property
    def in_stream(self) -> list[bool]:
        return stream_flags(self.messages)

    @cached_property
    def decoded(self) -> list[Message | DecodeError]:
        """Each message through `decode_message` (the error instead where it fails)."""
        out: list[Message | DecodeError] = []
        for message, in_stream in zip(self.messages, self.in_stream):
            try:
                out.append(decode_message(message.data, in_stream, seq=message.seq, lsn=message.lsn))
            except DecodeError as exc:
                out.append(exc)
        return out

    @property
    def streams_aborted(self) -> bool:
        """Whether the server streamed the workload's "aborted" transaction (rolled back after
        outgrowing logical_decoding_work_mem, before the peek decoded it). PostgreSQL 18 checks a
        transaction's status before it streams it, finds it aborted and sends nothing of it;
        earlier servers stream it and end it with a Stream Abort."""
        return self.cluster.version_num < 180000

    @property
    def label(self) -> str:
        return f"{self.server} proto {self.proto_version}{' binary' if self.binary else ''}"

    def kinds(self) -> list[str]:
        return [chr(m.data[0]) for m in self.messages]

    def items(self) -> Iterator[tuple[CapturedMessage, bool, Message]]:
        """(captured row, in_stream, decoded message); fails on a message that did not decode."""
        for message, in_stream, decoded in zip(self.messages, self.in_stream, self.decoded):
            assert not isinstance(decoded, DecodeError), f"{self.label}: {decoded}"
            yield message, in_stream, decoded

    def of_type(self, cls: type) -> list[tuple[CapturedMessage, Any]]:
        return [(m, d) for m, _, d in self.items() if type(d) is cls]

    def connect(self) -> psycopg.Connection[Any]:
        return self.cluster.connect(self.facts.db)


@dataclass
class ServerWorkload:
    """The workload run once on one server, and its slots."""

    server: str
    cluster: PgCluster
    facts: WorkloadFacts
    _captures: dict[tuple[int, bool, str | None], Capture] = field(default_factory=dict)

    def slot(self, proto_version: int) -> str:
        return f"{self.facts.db}_p{proto_version}"

    @property
    def test_decoding_slot(self) -> str:
        return f"{self.facts.db}_td"

    def capture(self, proto_version: int, *, binary: bool = False, origin: str | None = None) -> Capture:
        key = (proto_version, binary, origin)
        if key not in self._captures:
            messages = self.cluster.peek_pgoutput(
                self.slot(proto_version), publications=[PUBLICATION], messages=True, binary=binary,
                origin=origin, dbname=self.facts.db, **PEEK_OPTIONS[proto_version],
            )  # fmt: skip
            self._captures[key] = Capture(self.server, proto_version, binary, messages, self.facts,
                                          self.cluster)
        return self._captures[key]


def _run(cluster: PgCluster, server: str, protocols: list[int], test_decoding: bool) -> ServerWorkload:
    db = new_database(cluster, f"every_{server}")
    setup_database(cluster, db)
    workload = ServerWorkload(server, cluster, WorkloadFacts(db))
    for proto in protocols:
        cluster.create_slot(workload.slot(proto), two_phase=bool(PEEK_OPTIONS[proto].get("two_phase")),
                            dbname=db)
    if test_decoding:
        cluster.create_slot(workload.test_decoding_slot, "test_decoding", dbname=db)
    workload.facts = run_workload(cluster, db)
    return workload


@pytest.fixture(scope="session")
def pg15_workload(pg15: PgCluster) -> ServerWorkload:
    return _run(pg15, "pg15", [1, 2, 3], test_decoding=True)


@pytest.fixture(scope="session")
def pg16_workload(pg16: PgCluster) -> ServerWorkload:
    return _run(pg16, "pg16", [4], test_decoding=False)


@pytest.fixture(scope="session")
def pg17_workload(pg17: PgCluster) -> ServerWorkload:
    return _run(pg17, "pg17", [4], test_decoding=False)


@pytest.fixture(scope="session")
def pg18_workload(pg18: PgCluster) -> ServerWorkload:
    return _run(pg18, "pg18", [2, 4], test_decoding=True)


def capture_id(param: tuple[str, int]) -> str:
    return f"{param[0]}-proto{param[1]}"


@pytest.fixture(scope="module", params=CAPTURE_PARAMS, ids=capture_id)
def capture(request: pytest.FixtureRequest) -> Capture:
    """Each text-mode capture in turn: PG15 protocols 1-3, PG16, 17 and 18 protocol 4."""
    server, proto = request.param
    workload: ServerWorkload = request.getfixturevalue(f"{server}_workload")
    return workload.capture(proto)
