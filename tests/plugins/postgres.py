"""pytest plugin: throwaway PostgreSQL 15 and 16 clusters for integration tests.

Register with ``pytest_plugins = ["tests.plugins.postgres"]`` (or ``-p
tests.plugins.postgres``). ``pg15`` runs the Debian binaries, ``pg16`` the ones
in the ``pgserver`` wheel. A missing server is an error, never a skip: the
integration tests are part of the default run.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest

from pgoutput_spark.testing.pgcluster import PgCluster

_database_numbers = itertools.count(1)


def new_database(cluster: PgCluster, prefix: str = "test") -> str:
    """Create a database with a name unique in this test run; return the name."""
    return cluster.create_database(f"{prefix}_{next(_database_numbers)}")


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


@pytest.fixture
def fresh_db() -> Callable[[PgCluster], str]:
    """`new_database` as a fixture: ``dbname = fresh_db(pg15)``."""
    return new_database
