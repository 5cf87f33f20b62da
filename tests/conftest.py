"""Shared fixtures. ``postgres_url``: a fresh database on a throwaway PostgreSQL server started for the test session
(``agl.testing.postgres.PostgresCluster``). When PostgreSQL cannot be started, every test that needs it fails (never
skips) with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agl.testing.postgres import PostgresCluster


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """The session's PostgreSQL server (started on first use). Fails, never skips, when it cannot start."""
    cluster = PostgresCluster()
    problem = None
    try:
        cluster.start()
    except Exception as exc:
        problem = f"could not start a PostgreSQL server for the tests: {exc}"
        cluster.stop()
    if problem is not None:
        pytest.fail(problem, pytrace=False)
    yield cluster
    cluster.stop()


@pytest.fixture
def postgres_url(postgres_cluster: PostgresCluster) -> Iterator[str]:
    """URL of an empty database of its own for this test (dropped afterwards)."""
    url = postgres_cluster.new_database()
    yield url
    postgres_cluster.drop_database(url)
