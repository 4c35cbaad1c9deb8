"""The connection pool every part of the worker shares, and the start-up gate that waits, without
blocking anything else, until the database answers and has every migration this code ships."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from typing import Any

import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from agentrun.worker.store import migrate

log = logging.getLogger("agentrun.worker.store.pool")


async def open_pool(
    conninfo: str, max_size: int = 10, min_size: int = 1, timeout: float = 30.0
) -> AsyncConnectionPool[Any]:
    """Autocommit connections: every write of the store is a single statement, atomic by itself (group
    commit, groupcommit.py, puts a batch of them in a transaction of its own).

    Each connection is checked as it leaves the pool (`check`): after a restart, a failover or an idle
    timeout the pool discards the dead ones and hands out a live one, instead of an error per checkout.
    """
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        conninfo,
        min_size=min_size,
        max_size=max_size,
        open=False,
        kwargs={"autocommit": True},
        timeout=timeout,
        check=AsyncConnectionPool.check_connection,
        name="agentrun",
    )
    await pool.open(wait=True, timeout=timeout)
    return pool


# -- the start-up gate ------------------------------------------------------------------------------


async def schema_problem(conn: psycopg.AsyncConnection[TupleRow]) -> str | None:
    """Why this database is not migrated for this code (the migrations it lacks), or None if it is."""
    missing = sorted({m.version for m in migrate.available()} - await migrate.applied_versions(conn))
    if not missing:
        return None
    return "not migrated: missing migration " + ", ".join(f"{v:04d}" for v in missing)


@dataclasses.dataclass
class Readiness:
    """What /readyz answers while the worker waits for its database: why it cannot use it yet."""

    reason: str = "starting: the database has not been reached yet"


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Full-jitter exponential backoff between two attempts to reach the database."""

    base: float = 0.25
    """The first wait: a database that is merely slow to start is found within a second."""
    cap: float = 5.0
    """The longest wait (AGENTRUN_DATABASE_RETRY_MAX_SECONDS): a worker notices a recovered database within
    seconds, and a fleet of workers retrying against a down one costs it one connection attempt per worker
    every few seconds."""

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0.5, 1.0) * min(self.cap, self.base * 2.0 ** min(attempt, 30))


async def wait_until_usable(
    conninfo: str,
    readiness: Readiness,
    stopping: asyncio.Event,
    *,
    migrate_first: bool,
    connect_timeout: float = 5.0,
    backoff: Backoff = Backoff(),  # noqa: B008 - frozen
    rng: random.Random | None = None,
) -> bool:
    """Retry until the database answers and has every migration (applying them if `migrate_first`).

    Returns True once it does, False if `stopping` was set first. Each change of state (unreachable,
    not migrated, a failed migration, ready) is logged once, not every attempt.
    """
    rng = rng or random.Random()
    attempt, logged = 0, ""
    while not stopping.is_set():
        state, reason, detail = await _probe(conninfo, migrate_first, connect_timeout)
        readiness.reason = reason
        if state != logged:
            if state == "ready":
                log.info("database ready%s", " after waiting for it" if logged else "")
            else:
                log.warning("%s: %s; retrying (backoff up to %gs) until it is usable", reason, detail, backoff.cap)
            logged = state
        if state == "ready":
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(backoff.delay(attempt, rng)):
                await stopping.wait()
        attempt += 1
    return False


async def _probe(conninfo: str, migrate_first: bool, connect_timeout: float) -> tuple[str, str, str]:
    """One attempt: (state, reason, detail). The reason is short and safe to show on the open /readyz;
    the detail (the server's own words, which name hosts and roles) goes to the log only."""
    try:
        async with asyncio.timeout(connect_timeout):
            conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
    except (psycopg.Error, TimeoutError) as e:
        return f"unreachable:{type(e).__name__}", f"database unreachable ({type(e).__name__})", _first_line(e)
    try:
        async with conn:
            problem = await schema_problem(conn)
            if problem and migrate_first:
                await migrate.migrate(conninfo)
                problem = await schema_problem(conn)
    except psycopg.OperationalError as e:
        return f"unreachable:{type(e).__name__}", f"database unreachable ({type(e).__name__})", _first_line(e)
    except psycopg.Error as e:  # e.g. a role without the rights to migrate
        return f"migration-failed:{type(e).__name__}", f"database migration failed ({type(e).__name__})", _first_line(e)
    if problem:
        return "unmigrated", f"database {problem}", "apply them with `agentrun migrate`"
    return "ready", "ok", ""


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:200]
