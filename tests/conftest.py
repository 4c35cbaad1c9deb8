"""Test fixtures: a real PostgreSQL, one migrated template database, and a fresh clone of it per test.

PostgreSQL comes from AGENTRUN_TEST_DATABASE_URL if set, else from AGENTRUN_TEST_PG (a major version, 14
to 18: a throwaway server of that version, worker/testing/pg_versions.py, downloaded once), else a
testcontainers `postgres:16` when a Docker daemon answers, else an embedded server (pgserver, 16) in a
temporary directory.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool

from agentrun.worker.store import RunStore, migrate

# The shared helpers' asserts fail with the values compared, as a test's own do.
pytest.register_assert_rewrite("tests.support")
from tests.support import databases  # noqa: E402  (after the line above, so it is rewritten too)

# Under pytest-xdist every worker has a session of its own: its own embedded server, or its own template
# in a server they share (AGENTRUN_TEST_DATABASE_URL).
TEMPLATE = f"agentrun_template_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"


def pytest_collection_finish(session: pytest.Session) -> None:
    """mypy --strict takes over a minute cold: started now, it runs beside the suite (tests/test_static.py)."""
    if any(item.nodeid.endswith("test_static.py::test_packages_pass_mypy_strict") for item in session.items):
        from tests import test_static

        test_static.start_mypy(session.config)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist's controller: every worker shares the session's one mypy run (tests/test_static.py)."""
    from tests import test_static

    node.workerinput[test_static.MYPY_DIR_KEY] = str(test_static.mypy_dir(node.config))


def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests import test_static

    test_static.stop_mypy(session.config)


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """A test over its time limit fails with every thread's and task's stack (tests/support/hangs.py)."""
    from tests.support import hangs

    return hangs.set_timer(item, settings)


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> bool | None:
    from tests.support import hangs

    return hangs.cancel_timer(item)


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A PostgreSQL server for the whole session; the URL names its maintenance database."""
    if url := os.environ.get("AGENTRUN_TEST_DATABASE_URL"):
        yield url
    elif major := os.environ.get("AGENTRUN_TEST_PG"):
        from agentrun.worker.testing import pg_versions

        with pg_versions.server(major) as url:
            yield url
    elif _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16", driver=None) as pg:
            yield pg.get_connection_url()
    else:
        from agentrun.worker.testing import embedded_postgres

        with tempfile.TemporaryDirectory(prefix="agentrun-pg-", dir=embedded_postgres.scratch_root()) as data:
            server = embedded_postgres.start(data, what="the tests (without Docker or AGENTRUN_TEST_DATABASE_URL)")
            try:
                embedded_postgres.skip_fsync(server)
                yield server.get_uri()
            finally:
                server.cleanup()


def _admin(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


@pytest.fixture(scope="session")
def template_url(postgres_url: str) -> str:
    """A database migrated once; every test gets a copy of it."""
    with _admin(postgres_url) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(TEMPLATE)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE)))
    url = make_conninfo(postgres_url, dbname=TEMPLATE)
    asyncio.run(migrate.migrate(url))
    return url


@pytest.fixture
def database_url(postgres_url: str, template_url: str) -> Iterator[str]:
    name = f"agentrun_test_{uuid.uuid4().hex[:12]}"
    with _admin(postgres_url) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(TEMPLATE))
        )
    try:
        yield make_conninfo(postgres_url, dbname=name)
    finally:
        with _admin(postgres_url) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


# Each a function of its own: pytest-asyncio marks the function it is given with its loop scope.
@pytest_asyncio.fixture
async def pool(database_url: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    async for p in databases.pool(database_url):
        yield p


@pytest_asyncio.fixture
async def store(pool: AsyncConnectionPool[Any]) -> RunStore:
    return RunStore(pool)


@pytest_asyncio.fixture
async def db(database_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    async for conn in databases.db(database_url):
        yield conn
