"""Forward-only schema migrations: the `.sql` files in migrations/, applied in order under an advisory lock."""

from __future__ import annotations

import dataclasses
import importlib.resources
import re

import psycopg
from psycopg.rows import TupleRow

from agentrun.worker.store.channels import MIGRATION_LOCK_KEY, render

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclasses.dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def available() -> list[Migration]:
    """Every migration shipped with the package, oldest first."""
    found = []
    for entry in importlib.resources.files("agentrun.worker.store").joinpath("migrations").iterdir():
        m = _NAME.match(entry.name)
        if m:
            # The channel names and lock keys the triggers use are written in from store/channels.py.
            found.append(Migration(int(m.group(1)), m.group(2), render(entry.read_text(encoding="utf-8"))))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"two migrations share a version number: {versions}")
    return found


def latest_version() -> int:
    return available()[-1].version


async def migrate(conninfo: str) -> list[Migration]:
    """Apply the missing migrations; returns the ones applied. Safe to run from many processes at once."""
    applied: list[Migration] = []
    async with await psycopg.AsyncConnection.connect(conninfo) as conn:
        # Nothing to do is found out with reads alone, so a worker connecting as a runtime role with no
        # DDL rights (docs/database-role.sql) can start with migrations on, as long as they are applied.
        if {m.version for m in available()} <= await applied_versions(conn):
            return []
        async with conn.transaction():
            # Taken before anything else so that two workers starting together serialise here; the
            # loser finds everything applied. Transaction-scoped: released by COMMIT or a crash.
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
            await conn.execute(
                """CREATE TABLE IF NOT EXISTS schema_migration (
                       version    INT PRIMARY KEY,
                       name       TEXT NOT NULL,
                       applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"""
            )
            cur = await conn.execute("SELECT version FROM schema_migration")
            done = {row[0] for row in await cur.fetchall()}
            for m in available():
                if m.version in done:
                    continue
                await conn.execute(m.sql.encode())
                await conn.execute(
                    "INSERT INTO schema_migration (version, name) VALUES (%s, %s)", (m.version, m.name)
                )
                applied.append(m)
    return applied


async def applied_versions(conn: psycopg.AsyncConnection[TupleRow]) -> set[int]:
    cur = await conn.execute(
        "SELECT coalesce(array_agg(version), '{}') FROM schema_migration"
        if await _has_table(conn) else "SELECT '{}'::int[]"
    )
    row = await cur.fetchone()
    await conn.rollback()  # end the implicit read transaction before a migrating one begins
    return set(row[0]) if row else set()


async def _has_table(conn: psycopg.AsyncConnection[TupleRow]) -> bool:
    cur = await conn.execute("SELECT to_regclass('schema_migration') IS NOT NULL")
    row = await cur.fetchone()
    return bool(row and row[0])


async def current_version(conn: psycopg.AsyncConnection[TupleRow]) -> int | None:
    """The newest applied version, or None on a database never migrated."""
    cur = await conn.execute("SELECT to_regclass('schema_migration') IS NOT NULL")
    row = await cur.fetchone()
    if not row or not row[0]:
        return None
    cur = await conn.execute("SELECT max(version) FROM schema_migration")
    row = await cur.fetchone()
    return row[0] if row else None
